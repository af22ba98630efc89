"""nbgrader configuration: the repository root is the course.

Instructor sources live in solutions/, student versions in notebooks/ (both in
git). Everything a grading run writes -- submissions, autograded copies,
feedback and the gradebook -- goes to one git-ignored folder, _grading/
(or $ATTENTION_COURSE_WORK), so grading never dirties the tree.
"""

import os
import warnings

from sqlalchemy.exc import SAWarning

from grader.classroom.recording import record_before_autograde, record_lessons

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
# After a cell's reply, nbgrader waits for the rest of its outputs (a figure, an explorer's picture) and
# fails the cell if they take longer than 4 s, which a fully loaded machine can exceed: wait up to 60 s.
c.Execute.iopub_timeout = 60
# Hidden tests must never appear in what students get back: ClearHiddenTests strips them
# from the sources, ScrubTracebacks from error outputs; ResultsSummary puts every check's
# result and diagnosis at the top (grader/instructor/feedback.py).
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    "nbgrader.preprocessors.ClearHiddenTests",
    "grader.instructor.feedback.ScrubTracebacks",
    "grader.instructor.feedback.ResultsSummary",
    "grader.classroom.cells.CapOutputs",
]
# `nbgrader release_feedback` reads a timestamp.txt and a submission_secret.txt beside every page and
# stops the whole release at the first folder without them (a notebook placed by hand has neither):
# each feedback folder gets them once its page is written (grader/instructor/feedback.py).
c.GenerateFeedback.post_convert_hook = "grader.instructor.feedback.after_feedback"
# A deleted test cell is put back, not left for manual grading. RestoreCells matches every cell
# to the release (grade id, cell id, source) and repairs crafted structure -- test cells turned
# into answers, renamed or duplicated grade ids, changed points, removed metadata -- before
# nbgrader's OverwriteCells; it replaces DeduplicateIds, whose emptied metadata stops a whole run.
c.OverwriteCells.add_missing_cells = True
c.Autograde.sanitize_preprocessors = [
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "grader.classroom.cells.RestoreCells",
    "nbgrader.preprocessors.CheckCellMetadata",
]
# nbgrader 0.9.6's gradebook code makes SQLAlchemy warn three times per submission about its
# autoflush ("Object of type <SubmittedAssignment> not in session, add operation along
# 'Assignment.submissions' will not proceed ..."): harmless, and noise in every grading log.
warnings.filterwarnings(
    "ignore",
    message=r"Object of type <Submitted(Assignment|Notebook)> not in session, add operation along "
    r"'(Assignment|Student|Notebook)\.submissions' will not proceed",
    category=SAWarning,
)
# Plain `nbgrader autograde` needs no build step first: it records in the gradebook, from
# solutions/, the lessons the gradebook lacks or whose cells changed (grader/classroom/recording.py).
record_lessons()
# ... and so does the formgrader's Autograde button, inside the Lab server: before each submission,
# its lesson is recorded where the gradebook lacks it or its cells changed in solutions/
c.Autograde.pre_convert_hook = record_before_autograde
# `nbgrader export` writes its CSV to the work folder, not to the repository
c.ExportPlugin.to = os.path.join(WORK, "grades.csv")
# ... with every text cell a spreadsheet would run as a formula (=, +, -, @) quoted
c.ExportApp.plugin_class = "grader.instructor.report.SafeCsvExport"
# what the formgrader shows of a graded notebook: the student's HTML, scripts and Markdown as text
c.HTMLExporter.preprocessors = ["grader.instructor.feedback.EscapeStudentContent"]
# Every kernel nbgrader starts runs the student's code sealed in bubblewrap where it can (no grader/,
# solutions/, gradebook or other submissions in sight, no network), else under the guard alone
# (grader/classroom/kernels.py, grader/classroom/seal.py).
c.Execute.kernel_manager_class = "grader.classroom.kernels.GuardedKernelManager"
# Plain `nbgrader autograde` (and the formgrader's Autograde button) grade as the class grading
# tool does (grader/classroom/autograde.py): every test cell's verdict comes from a process the
# student's code never ran in; the kernel runs the notebook without the hidden-test blocks; what a
# test cell writes to stderr becomes a note, never a zero.
c.Autograde.autograde_preprocessors = [
    "grader.classroom.autograde.IndependentChecks",
    "grader.classroom.autograde.GuardedExecute",
    "grader.classroom.verdicts.ApplyVerdicts",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "grader.classroom.cells.CapOutputs",  # at most 64 KB of output per cell, with a note
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
