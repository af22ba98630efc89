"""The instructor's tools that grade nothing: collect an LMS export, release the student bundle,
write feedback pages and the class report. They run no student code and sit above the engine
(``grader.classroom``), which never imports them."""
