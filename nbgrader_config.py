"""nbgrader configuration: the repository root is the course.

Instructor sources live in solutions/, student versions in notebooks/ (both in
git). Everything a grading run writes -- submissions, autograded copies,
feedback and the gradebook -- goes to one git-ignored folder, _grading/
(or $ATTENTION_COURSE_WORK), so grading never dirties the tree.
"""

import os

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

ROOT = os.path.dirname(os.path.abspath(__file__))
WORK = os.environ.get("ATTENTION_COURSE_WORK", os.path.join(ROOT, "_grading"))
os.makedirs(WORK, exist_ok=True)
work = os.path.relpath(WORK, ROOT)

c.CourseDirectory.root = ROOT
c.CourseDirectory.course_id = "attention-step-by-step"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
c.CourseDirectory.submitted_directory = os.path.join(work, "submitted")
c.CourseDirectory.autograded_directory = os.path.join(work, "autograded")
c.CourseDirectory.feedback_directory = os.path.join(work, "feedback")
c.CourseDirectory.solution_directory = os.path.join(work, "solution")
c.CourseDirectory.source_with_tests_directory = os.path.join(work, "source_with_tests")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(WORK, "gradebook.db")
c.NbGrader.logfile = os.path.join(WORK, "nbgrader.log")

# Lessons run in seconds; a cell that takes a minute is a runaway loop.
c.Execute.timeout = 60
# Hidden tests must never appear in what students get back: ClearHiddenTests strips them
# from the sources, ScrubTracebacks from error outputs; ResultsSummary puts every check's
# result and diagnosis at the top (grader/classroom/feedback.py).
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    "nbgrader.preprocessors.ClearHiddenTests",
    "grader.classroom.feedback.ScrubTracebacks",
    "grader.classroom.feedback.ResultsSummary",
]
# A deleted test cell is put back, not left for manual grading (RestoreCells: nbgrader's
# OverwriteCells, fixed for a test cell deleted right after a locked markdown cell).
c.OverwriteCells.add_missing_cells = True
c.Autograde.sanitize_preprocessors = [
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "grader.classroom.cells.RestoreCells",
    "nbgrader.preprocessors.CheckCellMetadata",
]
