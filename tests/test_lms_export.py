"""Exports an LMS imports as they are: Canvas's gradebook import, Moodle's CSV import, and a table of
every student's every check (grader/instructor/lms_export.py), from a class really graded."""

from __future__ import annotations

import csv
import datetime
import json
from pathlib import Path

import pytest

from grader.classroom import grading
from grader.classroom.jobs import Options
from grader.instructor import lms_export, report
from tests.nbtools import ROOT, filled, grading_work, solution_sources

pytestmark = pytest.mark.slow

L1, L2 = "01_projection", "02_scoring"

# Canvas's own gradebook export, as an instructor downloads it (and as `collect --roster` takes it)
ROSTER = """Student,ID,SIS User ID,SIS Login ID,Section,01_projection (5501),Current Score
    Points Possible,,,,,7,
"Lovelace, Ada",101,S-0001,alovelace,Section A,,
"Boole, George",102,S-0002,gboole,Section B,,
"Curie, Marie",103,S-0003,mcurie,Section A,,
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Ada's lesson 01 right, George's wrong, Marie's nothing; lesson 02 due yesterday, 01 next week."""
    work = tmp_path_factory.mktemp("lms-work")
    with grading_work(work, [L1, L2]):
        sols = solution_sources(L1)
        answers = {
            "101": sols,
            "102": {**sols, "ex01_project": sols["ex01_project"].replace("X @ W_q", "X @ W_k")},
        }
        for sid, ans in answers.items():
            folder = work / "submitted" / sid / L1
            folder.mkdir(parents=True)
            (folder / f"{L1}.ipynb").write_text(
                json.dumps(filled(ROOT / "notebooks" / L1 / f"{L1}.ipynb", ans))
            )
        from nbgrader.api import Gradebook

        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        with Gradebook(f"sqlite:///{work / 'gradebook.db'}", "attention-step-by-step") as gb:
            gb.update_or_create_assignment(L2, duedate=now - datetime.timedelta(days=1))
            gb.update_or_create_assignment(L1, duedate=now + datetime.timedelta(days=7))
        summary = grading.grade([L1], options=Options(timeout=60), workers=1, progress=False)
        assert summary.graded == 2 and not summary.failed, summary
        roster = work / "roster.csv"
        roster.write_text(ROSTER)
        paths = report.export(work / "report", roster=roster)
        yield paths


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


def test_the_canvas_file_has_canvas_import_columns_and_every_student_of_the_roster(exported):
    rows = _rows(exported["canvas"])
    lessons = rows[0][5:]
    assert rows[0][:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    assert lessons[:2] == [L1, L2] and len(lessons) == len(set(lessons))
    assert rows[1][0].strip() == "Points Possible" and rows[1][5] == "7"
    body = {r[1]: dict(zip(rows[0], r)) for r in rows[2:]}
    assert list(body) == ["101", "102", "103"]  # the roster's order, its own ids
    ada, george, marie = body["101"], body["102"], body["103"]
    assert (ada["Student"], ada["SIS User ID"], ada["SIS Login ID"], ada["Section"]) == (
        "Lovelace, Ada",
        "S-0001",
        "alovelace",
        "Section A",
    )
    assert ada[L1] == "7"
    assert george[L1] not in ("", "7") and float(george[L1]) < 7
    assert marie[L1] == ""  # not submitted, not due yet: Canvas keeps what it has
    assert ada[L2] == george[L2] == marie[L2] == "0"  # due yesterday, nothing handed in
    assert ada[lessons[2]] == ""  # no due date, nothing handed in


def test_the_moodle_file_and_the_per_exercise_table(exported):
    moodle = _rows(exported["moodle"])
    assert moodle[0][:4] == lms_export.MOODLE_IDENTITY and moodle[0][4:6] == [L1, L2]
    assert [r[1] for r in moodle[1:]] == ["101", "102", "103"]
    assert moodle[1][4] == "7"
    table = [
        dict(zip(_rows(exported["exercise_scores"])[0], r)) for r in _rows(exported["exercise_scores"])[1:]
    ]
    george = [r for r in table if r["student"] == "102"]
    assert {r["check"] for r in george} == {r["check"] for r in table if r["student"] == "101"}
    lost = [r for r in george if float(r["score"]) < float(r["points"])]
    assert lost and all(r["exercise"] == "project" for r in lost)
    assert any("W_k" in r["diagnosis"] for r in lost), lost
    assert all(float(r["score"]) == float(r["points"]) for r in table if r["student"] == "101")
