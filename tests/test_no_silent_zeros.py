"""No silent zeros: a run that cannot grade says so, and a failure before student code is never a score.

The situation tried: the course folder copied for a new term, graded with the environment installed
from the old copy. Its kernels then cannot import the course package (the seal shows them only the
new folder), so every notebook's setup cell fails before any of the student's code runs.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from grader.classroom import grading
from tests.nbtools import ROOT, filled, solution_sources
from tests.test_seal import needs_seal

pytestmark = [pytest.mark.slow, needs_seal]

LESSON = "01_projection"
STUDENTS = ("ada", "bob")


@pytest.fixture(scope="module")
def new_term(tmp_path_factory) -> Path:
    """A copy of the course's files (as a clone has them), with two correct submissions in its work folder."""
    copy = tmp_path_factory.mktemp("new-term") / "course"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in tracked.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    for student in STUDENTS:
        nb = filled(ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", solution_sources(LESSON))
        folder = copy / "_grading" / "submitted" / student / LESSON
        folder.mkdir(parents=True)
        (folder / f"{LESSON}.ipynb").write_text(json.dumps(nb))
    return copy


def _run(copy: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in __import__("os").environ.items() if k not in ("ATTENTION_COURSE_WORK", "PYTHONPATH")
    }
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return subprocess.run(args, cwd=copy, env=env, capture_output=True, text=True, timeout=600)


def _scores(copy: Path) -> list[tuple]:
    return _scores_in(copy / "_grading")


def test_a_run_whose_kernels_cannot_import_the_course_stops_and_says_why(new_term):
    run = _run(new_term, sys.executable, "-m", "grader", "grade", LESSON, "--quiet")
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr[-3000:])
    assert "Nothing was graded" in run.stderr, run.stderr
    assert f"{LESSON}:" in run.stderr and "before any of the student's code ran" in run.stderr, run.stderr
    assert "attention_course" in run.stderr, run.stderr  # the cause: the course package did not import
    assert "Graded" not in run.stdout and "Traceback" not in run.stderr
    assert _scores(new_term) == []  # no score for anyone
    assert not list((new_term / "_grading" / "classroom" / "results").rglob("*.json"))
    assert not (new_term / "_grading" / "autograded").exists() or not any(
        (new_term / "_grading" / "autograded").rglob("*.ipynb")
    )


def test_a_notebook_that_fails_before_student_code_is_not_a_score(new_term):
    """The same environment, one notebook straight through a worker's grading: no score, the reason."""
    script = (
        "import json, sys\n"
        "from grader.classroom import grading\n"
        "from grader.classroom.autograde import Job, Options, grade_job\n"
        f"grading.ensure_gradebook([{LESSON!r}])\n"
        f"nb = open('_grading/submitted/ada/{LESSON}/{LESSON}.ipynb', 'rb').read()\n"
        f"r = grade_job(Job('ada', {LESSON!r}, nb, grading.template(), options=Options(timeout=30)))\n"
        "print('RESULT ' + json.dumps({'status': r.status, 'error': r.error, 'score': r.score}))\n"
    )
    run = _run(new_term, sys.executable, "-c", script)
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, (run.stdout, run.stderr[-3000:])
    result = json.loads(line[7:])
    assert result["status"] == "could not be graded", result
    assert result["error"].startswith("could not be graded: the lesson's own setup cell"), result
    assert "attention_course" in result["error"], result


def test_plain_nbgrader_reports_the_notebook_as_failed_not_graded(new_term):
    nbgrader = str(Path(sys.executable).parent / "nbgrader")
    run = _run(new_term, nbgrader, "autograde", LESSON, "--student=bob", "--force")
    assert run.returncode != 0, run.stderr[-3000:]
    assert "Could not be graded: bob/01_projection: the lesson's own setup cell" in run.stderr, run.stderr[
        -3000:
    ]
    assert not (new_term / "_grading" / "autograded" / "bob" / LESSON / f"{LESSON}.ipynb").exists()


def test_the_lessons_own_solution_earns_full_marks_where_the_course_can_grade(tmp_path, monkeypatch):
    """The proof a run makes first: here, in this course's own environment, every lesson passes it."""
    from grader.classroom import lessons
    from grader.classroom.autograde import Job, Options, grade_job

    # a work folder of its own: the course's gradebook (whatever lessons it holds) is neither read nor written
    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(tmp_path))
    grading.ensure_gradebook([LESSON])
    template = grading.template()
    nb = lessons.answered(LESSON)
    result = grade_job(Job(grading.PROOF_STUDENT, LESSON, nb, template, options=Options(timeout=60)))
    assert grading.proof_problem(result) is None, (
        result.error,
        [(c.grade_id, c.message) for c in result.cells],
    )
    assert result.score == result.max_score > 0


# ------------------------------------------------------------------ sealed, or unsealed on purpose


@pytest.fixture(scope="module")
def one_submission(tmp_path_factory) -> Path:
    """A work folder of this course with one correct submission."""
    work = tmp_path_factory.mktemp("isolation-work")
    folder = work / "submitted" / "ada" / LESSON
    folder.mkdir(parents=True)
    nb = filled(ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", solution_sources(LESSON))
    (folder / f"{LESSON}.ipynb").write_text(json.dumps(nb))
    return work


def _in_course(
    work: Path, *args: str, without_bwrap: bool = False, **extra: str
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in __import__("os").environ.items() if k != "ATTENTION_COURSE_NO_SEAL"}
    env.update(ATTENTION_COURSE_WORK=str(work), **extra)
    # a machine without bubblewrap: only the environment's own programs on PATH
    env["PATH"] = str(Path(sys.executable).parent) + ("" if without_bwrap else f":{env.get('PATH', '')}")
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_without_bubblewrap_grading_stops_unless_asked_to_go_unsealed(one_submission):
    run = _in_course(
        one_submission, sys.executable, "-m", "grader", "grade", LESSON, "--quiet", without_bwrap=True
    )
    assert run.returncode == 2, (run.stdout, run.stderr[-2000:])
    assert "NOT SEALED" in run.stderr and "ATTENTION_COURSE_NO_SEAL=1" in run.stderr, run.stderr
    assert _scores_in(one_submission) == []
    asked = _in_course(
        one_submission,
        sys.executable,
        "-m",
        "grader",
        "grade",
        LESSON,
        "--quiet",
        without_bwrap=True,
        ATTENTION_COURSE_NO_SEAL="1",
    )
    assert asked.returncode == 0, asked.stderr[-3000:]
    assert asked.stderr.startswith("NOT SEALED (turned off by ATTENTION_COURSE_NO_SEAL)"), asked.stderr[:500]
    assert "NOT SEALED" in asked.stdout  # and again in the summary
    assert _scores_in(one_submission) and all(score is not None for _, score in _scores_in(one_submission))


def test_plain_nbgrader_says_sealed_for_each_notebook_and_refuses_to_grade_unsealed_unasked(one_submission):
    nbgrader = str(Path(sys.executable).parent / "nbgrader")
    sealed = _in_course(one_submission, nbgrader, "autograde", LESSON, "--student=ada", "--force")
    assert sealed.returncode == 0, sealed.stderr[-3000:]
    assert f"Isolation: ada/{LESSON}: sealed" in sealed.stderr, sealed.stderr[-3000:]
    bare = _in_course(
        one_submission, nbgrader, "autograde", LESSON, "--student=ada", "--force", without_bwrap=True
    )
    assert bare.returncode != 0
    assert "Could not be graded: NOT SEALED" in bare.stderr, bare.stderr[-3000:]
    assert not (one_submission / "autograded" / "ada" / LESSON / f"{LESSON}.ipynb").exists()


def _scores_in(work: Path) -> list[tuple]:
    db = work / "gradebook.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as con:
        return con.execute(
            "SELECT s.student_id, g.auto_score FROM grade g JOIN submitted_notebook n ON g.notebook_id = n.id "
            "JOIN submitted_assignment s ON n.assignment_id = s.id"
        ).fetchall()


def test_a_proof_is_remembered_until_what_it_holds_for_changes(tmp_path, monkeypatch):
    from grader.classroom import lessons
    from grader.classroom.jobs import Options

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    digests = {LESSON: lessons.digest(LESSON)}
    first = grading._unproven([LESSON], digests, Options(timeout=60))
    assert list(first) == [LESSON]
    grading._proven(first[LESSON])
    assert grading._unproven([LESSON], digests, Options(timeout=60)) == {}
    assert list(grading._unproven([LESSON], digests, Options(timeout=5))) == [LESSON]  # other settings
    assert list(grading._unproven([LESSON], {LESSON: "changed"}, Options(timeout=60))) == [LESSON]


def test_a_notebook_whose_setup_cell_was_removed_or_moved_is_scored_not_excused(tmp_path):
    """Only the lesson's leading cells, all there and in order, make a failure 'before student code':
    a student who removes or moves the setup cell gets the score their notebook earns."""
    import nbformat

    from grader.classroom.autograde import Job, Options, grade_job
    from tests.nbtools import grading_work

    sols = solution_sources(LESSON)
    sols["ex01_project"] = sols["ex01_project"].replace("X @ W_q", "X @ W_k")
    with grading_work(tmp_path, [LESSON]) as template:
        for change in ("removed", "moved"):
            nb = filled(ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", sols)
            code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
            setup = nb.cells.pop(code[1])  # the setup cell, after the Colab cell
            if change == "moved":
                nb.cells.insert(code[2], setup)  # after the cell that needs it
            result = grade_job(
                Job("eve", LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=30))
            )
            assert result.error is None and result.status != "could not be graded", (change, result.error)
            assert result.score < result.max_score, (change, result.score)
