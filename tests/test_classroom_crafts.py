"""Crafted submissions (tests/class_sim/crafts.py) graded end to end, as part of the simulated class.

The class tool and plain ``nbgrader autograde`` both grade every one of them
(none stops a run), from the release's test cells and points; the tool's
record says "repaired" with the lesson's maximum; a 5 MB print leaves a small
autograded notebook and feedback page; export reports the tool's grades and
flags a gradebook row someone changed. They are read from the session's graded
simulated class (the ``graded_class`` fixture), which holds them, rather than graded again.
"""

from __future__ import annotations

import csv
import shutil
import sqlite3

import pytest

from grader import course
from grader.classroom import grading, lessons
from grader.instructor import feedback, report
from tests.class_sim import crafts, spec

pytestmark = pytest.mark.slow
CASES = crafts.cases()


@pytest.fixture(scope="module")
def crafted(graded_class):
    """The crafted submissions as the tool graded them in the class: their records by student, and the
    summary of the run that graded them."""
    cases, records, (_, rest) = graded_class
    assert {c.student for c in CASES} <= {c.student for c in cases if not c.short_timeout}
    assert not rest.failed, rest.failed
    yield {c.student: records[(c.student, c.lesson)] for c in CASES}, rest


@pytest.mark.parametrize("case", CASES, ids=[c.student for c in CASES])
def test_crafted_submission_is_graded_on_the_release(crafted, case):
    records, summary = crafted
    rec = records[case.student]
    who = f"{case.student} ({case.what})"
    les = lessons.lesson(case.lesson)
    assert rec["status"] == case.status, f"{who}: {rec['status']}, notes {rec['notes']}"
    assert rec["max_score"] == les.max_score == 7
    assert rec["score"] == case.score == case.expected_score(), who
    scores = {c["grade_id"]: c["score"] for c in rec["cells"]}
    assert scores == {t.grade_id: (0.0 if t.grade_id in case.failing() else t.points) for t in les.tests}
    for note in case.notes:
        assert any(note in n for n in rec["notes"]), f"{who}: no note mentions {note!r}: {rec['notes']}"
    gb = course.gradebook_scores(case.lesson, case.student)
    assert (gb["score"], gb["max_score"]) == (rec["score"], 7.0), who


def test_the_run_summary_counts_repaired_submissions(crafted, graded_class):
    _, summary = crafted
    ran = [c for c in graded_class[0] if not c.short_timeout]  # the run that graded the crafted ones
    repaired = sum(1 for c in ran if c.status == "repaired")
    assert repaired >= sum(1 for c in CASES if c.status == "repaired") > 0
    assert summary.graded == len(ran) == sum(summary.by_status.values())
    assert summary.by_status["repaired"] == repaired
    assert summary.by_status["graded"] == sum(1 for c in ran if c.status == "graded")
    assert f"repaired: {repaired}" in grading.format_summary(summary)


def test_plain_nbgrader_grades_every_crafted_notebook(crafted):
    """Plain `nbgrader autograde` (RestoreCells in its sanitize step) gives the same scores."""
    for case in CASES:
        twin = f"plain_{case.student}"
        dest = course.submission_path(case.lesson, twin)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(course.submission_path(case.lesson, case.student), dest)
        got = course.autograde(case.lesson, twin)  # raises if nbgrader stopped
        assert (got["score"], got["max_score"]) == (case.score, 7.0), (case.student, got["grades"])


def test_a_huge_print_leaves_a_small_notebook_and_feedback_page(crafted):
    student = "x01_big_print"
    graded = course.autograded_path(spec.L1, student)
    assert graded.stat().st_size < 150_000 < crafts.BIG_PRINT
    assert "[output cut: 4.7 MB not shown; a cell keeps at most 64.0 KB]" in graded.read_text()
    page = feedback.feedback_job((spec.L1, student))
    assert "error" not in page, page
    path = feedback.feedback_path(spec.L1, student)
    assert path.stat().st_size < 600_000
    assert "output cut: 4.7 MB not shown" in feedback.page_text(path.read_text())


def test_export_reports_and_names_a_gradebook_row_changed_by_hand(crafted, tmp_path):
    student = "x01_test_to_answer"
    db = course.work_dir() / "gradebook.db"
    hidden = (
        "cell_id IN (SELECT id FROM base_cell WHERE name = 'test01_project_hidden') AND notebook_id IN "
        "(SELECT sn.id FROM submitted_notebook sn JOIN submitted_assignment sa ON sn.assignment_id = sa.id "
        "JOIN assignment a ON sa.assignment_id = a.id WHERE sa.student_id = ? AND a.name = ?)"
    )
    with sqlite3.connect(db) as con:
        con.execute(f"UPDATE grade SET manual_score = 4 WHERE {hidden}", (student, spec.L1))
    try:
        paths = report.export(tmp_path / "report", [spec.L1])
    finally:
        with sqlite3.connect(db) as con:
            con.execute(f"UPDATE grade SET manual_score = NULL WHERE {hidden}", (student, spec.L1))
    rep = paths.pop("report_data")
    rows = {r["student_id"]: r for r in csv.DictReader(paths["grades"].open())}
    assert rows[student]["raw_score"] == "5.0"  # the gradebook's: the instructor decides there
    assert rows[student]["gradebook_check"] == "changed by hand: test01_project_hidden: 4 (tool: 0)"
    assert any(p["student"] == student for p in rep.gradebook)
    assert f"| {student} | {spec.L1} | changed by hand" in paths["report"].read_text()
    for case in CASES:
        if case.student != student:
            assert rows[case.student]["gradebook_check"] == "", rows[case.student]
    subs = {r["student"]: r for r in csv.DictReader(paths["submissions"].open())}
    for case in CASES:
        assert (subs[case.student]["status"], subs[case.student]["max_score"]) == (case.status, "7.0")


def test_test_cells_pasted_above_the_answer_cost_nothing_on_plain_nbgrader_either(crafted):
    """The same submission autograded by plain nbgrader (the formgrader's button): 7 of 7, cell by cell
    as the tool gave (it was 0 of 7 on both paths)."""
    records, _ = crafted
    student, twin = "x01_tests_pasted_above", "plain_x01_tests_pasted_above"
    dest = course.submission_path(spec.L1, twin)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(course.submission_path(spec.L1, student), dest)
    plain = course.autograde(spec.L1, twin)
    assert plain["score"] == records[student]["score"] == 7.0
    assert {gid: score for gid, (score, _) in plain["grades"].items()} == {
        c["grade_id"]: c["score"] for c in records[student]["cells"]
    }
