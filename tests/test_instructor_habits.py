"""An instructor's own nbgrader habits work on this course.

A class is graded in a private work folder: one notebook placed by hand as the README says, one placed
by ``python -m grader collect`` from a Canvas export, one as ``nbgrader collect`` leaves it (with the
timestamp and the secret ``nbgrader submit`` wrote). The tests then run nbgrader's own command line
on it, with a private exchange folder, and check what an instructor would see: the pages released,
the numbers in the exported CSV.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from grader import course
from grader.classroom import grading
from grader.classroom.jobs import Options
from grader.instructor import collect, feedback, report
from tests.nbtools import ROOT, filled, grading_work, solution_sources

pytestmark = pytest.mark.slow

L1, L2 = "01_projection", "02_scoring"
COURSE_ID = "attention-step-by-step"
HAND, LMS, EXCHANGE = "habits_hand", "habitslms", "habits_exchange"
SECRET = "ab12" * 32  # what `nbgrader submit` writes: 128 hex digits
COMMENT = "Right shapes; the hidden check wanted float64 kept: see lesson 01, section 4."


def _notebook() -> bytes:
    nb = filled(ROOT / "notebooks" / L1 / f"{L1}.ipynb", solution_sources(L1))
    return nbformat.writes(nb).encode()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Three submissions of lesson 01 graded by the course's tool; lesson 02 known, submitted by nobody."""
    work = tmp_path_factory.mktemp("habits-work")
    with grading_work(work, [L1, L2]):
        data = _notebook()
        # placed by hand: the notebook alone
        dest = course.submission_path(L1, HAND)
        dest.parent.mkdir(parents=True)
        dest.write_bytes(data)
        # placed by collect from a Canvas export (the zip entry's time becomes timestamp.txt)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr(
                zipfile.ZipInfo(f"{LMS}_12345_901_{L1}.ipynb", date_time=(2026, 11, 1, 9, 0, 0)), data
            )
        export = work / "canvas.zip"
        export.write_bytes(buf.getvalue())
        rep = collect.collect(export, lesson_ids=[L1])
        assert [o.student for o in rep.outcomes if o.action == "placed"] == [LMS], rep.format()
        assert (course.submission_path(L1, LMS).parent / "timestamp.txt").exists()
        # as `nbgrader collect` leaves a submission from the exchange
        placed = course.submission_path(L1, EXCHANGE)
        placed.parent.mkdir(parents=True)
        placed.write_bytes(data)
        (placed.parent / "timestamp.txt").write_text("2026-11-02 10:00:00.000000 UTC")
        (placed.parent / "submission_secret.txt").write_text(SECRET)
        summary = grading.grade([L1], options=Options(timeout=60), workers=2, progress=False)
        assert summary.graded == 3 and not summary.failed, grading.format_summary(summary)
        yield work


@contextlib.contextmanager
def _in_work(work: Path) -> Iterator[None]:
    """ATTENTION_COURSE_WORK set to ``work`` while the block runs (as the course's commands read it)."""
    old = os.environ.get("ATTENTION_COURSE_WORK")
    os.environ["ATTENTION_COURSE_WORK"] = str(work)
    try:
        yield
    finally:
        if old is None:
            del os.environ["ATTENTION_COURSE_WORK"]
        else:
            os.environ["ATTENTION_COURSE_WORK"] = old


def _nbgrader(work: Path, *args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    env = dict(os.environ, PATH=path, ATTENTION_COURSE_WORK=str(work))
    return subprocess.run(["nbgrader", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _release(work: Path, exchange: Path) -> tuple[subprocess.CompletedProcess, set[str]]:
    exchange.mkdir(exist_ok=True)
    run = _nbgrader(work, "release_feedback", L1, f"--Exchange.root={exchange}")
    released = exchange / COURSE_ID / "feedback"
    return run, {p.name for p in released.glob("*.html")} if released.is_dir() else set()


def _hash(secret: str) -> str:
    from nbgrader.utils import notebook_hash

    return notebook_hash(secret=secret, notebook_id=L1) + ".html"


def test_release_feedback_releases_every_page_after_plain_generate_feedback(graded, tmp_path):
    shutil.rmtree(graded / "feedback", ignore_errors=True)
    made = _nbgrader(graded, "generate_feedback", L1)
    assert made.returncode == 0, made.stderr[-3000:]
    for student in (HAND, LMS, EXCHANGE):
        assert (graded / "feedback" / student / L1 / f"{L1}.html").exists(), student
    run, released = _release(graded, tmp_path / "exchange")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert len(released) == 3, (released, run.stderr[-3000:])
    # the exchange student's page lies where `nbgrader fetch_feedback` looks for it
    assert _hash(SECRET) in released


def test_release_feedback_releases_every_page_made_by_the_course_tool(graded, tmp_path):
    shutil.rmtree(graded / "feedback", ignore_errors=True)
    with _in_work(graded):
        pages = feedback.generate([L1], workers=1, progress=False)
    assert sorted(p["student"] for p in pages if "path" in p) == sorted([HAND, LMS, EXCHANGE]), pages
    run, released = _release(graded, tmp_path / "exchange")
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(released) == 3 and _hash(SECRET) in released, (released, run.stderr[-3000:])
    # a regeneration releases the same pages again, not new ones beside them
    shutil.rmtree(graded / "feedback")
    assert _nbgrader(graded, "generate_feedback", L1).returncode == 0
    again, released_again = _release(graded, tmp_path / "exchange")
    assert again.returncode == 0 and released_again == released, again.stderr[-3000:]


def _export(work: Path, out: Path) -> dict[tuple[str, str], dict]:
    with _in_work(work):
        paths = report.export(out)
    return {(r["assignment"], r["student_id"]): r for r in csv.DictReader(paths["grades"].open())}


def test_a_lesson_never_submitted_is_blank_in_the_export(graded, tmp_path):
    rows = _export(graded, tmp_path / "report")
    for student in (HAND, LMS, EXCHANGE):
        submitted, never = rows[(L1, student)], rows[(L2, student)]
        assert float(submitted["score"]) == float(submitted["max_score"]) > 0, submitted
        assert (never["raw_score"], never["late_submission_penalty"], never["score"]) == ("", "", ""), never
        assert float(never["max_score"]) > 0 and never["gradebook_check"] == "", never


def test_the_exchange_round_trip_from_release_to_fetched_feedback(tmp_path):
    """nbgrader's exchange end to end on the course as laid out: the instructor releases, a student
    fetches, answers and submits, the instructor collects, grades with the course's tool, makes and
    releases feedback, and the student fetches the page."""
    work, exchange, home = tmp_path / "work", tmp_path / "exchange", tmp_path / "student"
    for folder in (work, exchange, home):
        folder.mkdir()
    root = f"--Exchange.root={exchange}"

    def student(*args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "ATTENTION_COURSE_WORK"}
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
        run = subprocess.run(
            ["nbgrader", *args, f"--course={COURSE_ID}", root],
            cwd=home,
            env=env,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, (args, run.stderr[-3000:])
        return run

    def instructor(*args: str) -> None:
        run = _nbgrader(work, *args)
        assert run.returncode == 0, (args, run.stderr[-3000:])

    instructor("release_assignment", L1, root)
    student("fetch_assignment", L1)
    fetched = home / L1 / f"{L1}.ipynb"
    nbformat.write(filled(fetched, solution_sources(L1)), fetched)
    student("submit", L1)
    instructor("collect", L1, root)
    (who,) = [p.name for p in (work / "submitted").iterdir()]
    assert (work / "submitted" / who / L1 / "timestamp.txt").exists()
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    graded = subprocess.run(
        [sys.executable, "-m", "grader", "grade", L1, "--quiet"],
        cwd=ROOT,
        env=dict(os.environ, PATH=path, ATTENTION_COURSE_WORK=str(work)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert graded.returncode == 0 and "graded: 1" in graded.stdout, (graded.stdout, graded.stderr[-3000:])
    instructor("generate_feedback", L1)
    instructor("release_feedback", L1, root)
    student("fetch_feedback", L1)
    (page,) = list((home / L1 / "feedback").rglob(f"{L1}.html"))
    text = feedback.page_text(page.read_text())
    assert "Your results: 7 / 7 points" in text, text[:2000]


def test_a_score_and_a_late_penalty_set_by_hand_are_what_every_export_and_the_feedback_report(
    graded, tmp_path
):
    """The formgrader's way, through nbgrader's API: 1.5 of 4 on a hidden check that earned 4, and a late
    penalty of 2, and a comment on the answer. grades.csv, nbgrader's own export, the LMS files, the
    per-check table and the feedback page all report them; the report says "changed by hand" and what
    changed."""
    from nbgrader.api import Gradebook

    from grader.classroom.grades import gradebook_url

    hidden = "test01_project_hidden"
    with _in_work(graded):
        url = gradebook_url()
    with Gradebook(url) as gb:
        grade = gb.find_grade(hidden, L1, L1, HAND)
        assert (grade.auto_score, grade.manual_score) == (4.0, None)
        grade.manual_score = 1.5
        gb.find_comment("ex01_project", L1, L1, HAND).manual_comment = COMMENT
        gb.find_submission_notebook(L1, L1, HAND).late_submission_penalty = 2.0
        gb.db.commit()
    try:
        rows = _export(graded, tmp_path / "report")
        mine = rows[(L1, HAND)]
        assert (mine["raw_score"], mine["late_submission_penalty"], mine["score"]) == ("4.5", "2.0", "2.5"), (
            mine
        )
        assert (
            mine["gradebook_check"] == f"changed by hand: {hidden}: 1.5 (tool: 4); late penalty 2 (tool: 0)"
        )
        for other in (LMS, EXCHANGE):
            assert (rows[(L1, other)]["score"], rows[(L1, other)]["gradebook_check"]) == ("7.0", "")
        out = tmp_path / "report"
        report_md = (out / "class_report.md").read_text()
        assert (
            f"| {HAND} | {L1} | changed by hand: {hidden}: 1.5 (tool: 4); late penalty 2 (tool: 0) |"
            in report_md
        )
        canvas = {r["Student"] or r["ID"]: r for r in csv.DictReader((out / "canvas_import.csv").open())}
        moodle = {r["Username"]: r for r in csv.DictReader((out / "moodle_import.csv").open())}
        assert moodle[HAND][L1] == "2.5" and moodle[LMS][L1] == "7", moodle
        assert any(r[L1] == "2.5" for r in canvas.values()), canvas
        checks = {
            (r["student"], r["check"]): r["score"]
            for r in csv.DictReader((out / "exercise_scores.csv").open())
        }
        assert checks[(HAND, hidden)] == "1.5" and checks[(LMS, hidden)] == "4.0", checks
        subs = {r["student"]: r for r in csv.DictReader((out / "submissions.csv").open())}
        assert float(subs[HAND]["score"]) == 4.5 and "changed by hand: " in subs[HAND]["notes"], subs[HAND]
        assert "changed by hand" not in subs[LMS]["notes"], subs[LMS]
        # nbgrader's own export says the same
        theirs = tmp_path / "nbgrader_grades.csv"
        run = _nbgrader(graded, "export", f"--to={theirs}")
        assert run.returncode == 0, run.stderr[-3000:]
        plain = {(r["assignment"], r["student_id"]): r for r in csv.DictReader(theirs.open())}
        assert float(plain[(L1, HAND)]["raw_score"]) == 4.5 and float(plain[(L1, HAND)]["score"]) == 2.5
        # the course tool's feedback page
        shutil.rmtree(graded / "feedback", ignore_errors=True)
        with _in_work(graded):
            pages = feedback.generate([L1], [HAND], workers=1, progress=False)
        assert [p["student"] for p in pages if "path" in p] == [HAND], pages
        text = " ".join(
            feedback.page_text((graded / "feedback" / HAND / L1 / f"{L1}.html").read_text()).split()
        )
        assert "Your results: 4.5 / 7 points" in text, text[:2000]
        assert "Late penalty: 2 points off, for a score of 2.5." in text, text[:2000]
        assert f"{hidden} 1.5 / 4 (set by your instructor) not yet" in text, text[:2000]
        assert COMMENT in text, text
    finally:
        with Gradebook(url) as gb:
            gb.find_grade(hidden, L1, L1, HAND).manual_score = None
            gb.find_comment("ex01_project", L1, L1, HAND).manual_comment = None
            gb.find_submission_notebook(L1, L1, HAND).late_submission_penalty = None
            gb.db.commit()
        shutil.rmtree(graded / "feedback", ignore_errors=True)
