"""A simulated class graded end to end through the tool and real nbgrader, then fed back and reported.

Every submission of tests/class_sim is graded by ``grader.classroom.grading``
(the session's ``graded_class`` fixture, tests/conftest.py: two runs, the endless
loops with a short cell timeout, then the rest) and
compared with what the spec says it must get: the score of every test cell,
the status, the diagnosis each hidden check names, and the tampering flags.
Then: feedback for every submission, none showing hidden test code; the grades
CSV and the class report; and plain nbgrader, which the same tampering no longer fools.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from grader import course
from grader.classroom import grading, lessons
from grader.instructor import feedback, release, report
from tests.class_sim import spec

pytestmark = pytest.mark.slow
TIMINGS: dict[str, float] = {}


def test_the_class_is_big_enough(graded_class):
    cases, _, _ = graded_class
    assert len(cases) >= 60
    assert {c.lesson for c in cases} == set(course.lessons())
    assert len({(c.student, c.lesson) for c in cases}) == len(cases)


def test_every_submission_was_graded_in_one_pass(graded_class):
    cases, records, (quick, rest) = graded_class
    assert not quick.failed and not rest.failed, (quick.failed, rest.failed)
    assert quick.graded == len([c for c in cases if c.short_timeout])
    assert quick.graded + rest.graded == len(cases)
    missing = [(c.student, c.lesson) for c in cases if (c.student, c.lesson) not in records]
    assert not missing


KEYS = [(c.student, c.lesson) for c in spec.cases(Path("."))]


@pytest.mark.parametrize("key", KEYS, ids=[f"{s}-{lesson}" for s, lesson in KEYS])
def test_submission_gets_the_expected_grade(graded_class, key):
    cases, records, _ = graded_class
    case = next(c for c in cases if (c.student, c.lesson) == key)
    rec = records[(case.student, case.lesson)]
    who = f"{case.student} ({case.what})"
    assert rec["status"] == case.status or rec["status"] in case.also, (
        f"{who}: status {rec['status']!r}, notes {rec['notes']}"
    )
    cells = {c["grade_id"]: c for c in rec["cells"]}
    les = lessons.lesson(case.lesson)
    for test in les.tests:
        want = 0.0 if test.grade_id in case.failing() else test.points
        got = cells[test.grade_id]["score"]
        assert got == want, (
            f"{who}: {test.grade_id} scored {got}, expected {want}: {cells[test.grade_id]['message']!r}"
        )
    assert rec["score"] == case.expected_score(), who
    if case.score is not None:
        assert rec["score"] == case.score, who
    for gid, trap in case.diagnoses.items():
        assert cells[gid]["diagnosis"] == trap, (
            f"{who}: {gid} named {cells[gid]['diagnosis']!r}, expected {trap!r}"
        )
    if case.flags:
        for sign in case.flags:
            assert any(sign in f for f in rec["flags"]), f"{who}: no flag mentions {sign!r}: {rec['flags']}"
    else:
        assert rec["flags"] == [], f"{who}: unexpected flags {rec['flags']}"
    for note in case.notes:
        assert any(note in n for n in rec["notes"]), f"{who}: no note mentions {note!r}: {rec['notes']}"
    # the gradebook (nbgrader's) holds the same scores
    gb = course.gradebook_scores(case.lesson, case.student)
    assert gb["score"] == rec["score"], who
    for gid, (score, _) in gb["grades"].items():
        assert score == cells[gid]["score"], f"{who}: gradebook has {score} for {gid}"


def test_a_right_answer_that_warns_passed_in_the_notebook_as_well(graded_class):
    """What the cells wrote to stderr is a note in the graded notebook, never a failure: the record says the
    kernel's checks passed too (it said they failed, and a check failing outside it was then not flagged)."""
    _, records, _ = graded_class
    record = records[("f01_noisy", spec.L1)]
    assert record["score"] == 7 and all(c["kernel_passed"] for c in record["cells"]), record["cells"]


def test_no_submission_wrote_to_the_gradebook(graded_class):
    db = course.work_dir() / "gradebook.db"
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM grade WHERE manual_score IS NOT NULL").fetchone()[0] == 0


def test_tampering_is_flagged_in_the_summary(graded_class):
    cases, _, (_, rest) = graded_class
    flagged = {f["student"] for f in rest.flagged}
    assert {c.student for c in cases if c.student.startswith("t01_")} <= flagged
    text = grading.format_summary(rest)
    assert "Flagged for review" in text and "t01_tensor_any" in text


PLAIN_TWINS = ("t01_tensor_any", "t01_read_reference", "t01_fake_grader", "t01_torch_isclose")


def _graded_by_plain_nbgrader(case: spec.Case, records: dict) -> tuple[dict, str]:
    """A copy of the case's submission autograded by plain nbgrader; asserts each cell scores as the tool's."""
    twin = f"plain_{case.student}"
    dest = course.submission_path(case.lesson, twin)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(course.submission_path(case.lesson, case.student), dest)
    plain = course.autograde(case.lesson, twin)
    tool = {c["grade_id"]: c["score"] for c in records[(case.student, case.lesson)]["cells"]}
    assert {gid: score for gid, (score, _) in plain["grades"].items()} == tool, case.student
    return plain, twin


def test_plain_nbgrader_is_not_fooled_by_the_same_tampering(graded_class):
    """Plain nbgrader autograde (the formgrader's button) gives every test cell the tool's score."""
    cases, records, _ = graded_class
    for case in [c for c in cases if c.student in PLAIN_TWINS]:
        plain, _ = _graded_by_plain_nbgrader(case, records)
        assert plain["score"] == records[(case.student, case.lesson)]["score"] == 1, case.student


def test_plain_nbgrader_grades_fairly_as_the_tool_does(graded_class):
    """Correct variants, mistakes, helper answers and red-team code: the same score per cell, the same names."""
    import nbformat

    from tests.class_sim import fair, redteam

    cases, records, _ = graded_class
    chosen = {c.student for c in fair.cases() + redteam.cases()} | {"c05_trap_dim"}
    for case in [c for c in cases if c.student in chosen]:
        plain, twin = _graded_by_plain_nbgrader(case, records)
        assert plain["score"] == case.expected_score(), case.student
        nb = nbformat.read(course.autograded_path(case.lesson, twin), as_version=4)
        errors = {
            c.metadata["nbgrader"]["grade_id"]: " ".join(o.get("evalue", "") for o in c.outputs)
            for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade")
        }
        for gid, trap in case.diagnoses.items():
            assert f"Diagnosis: {trap}" in errors[gid], (case.student, gid, errors[gid][-500:])
        graded_stderr = [
            o
            for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade")
            for o in c.outputs
            if o.get("name") == "stderr"
        ]
        assert not graded_stderr, (case.student, graded_stderr)  # a note on stdout instead


def _instructor_code_lines() -> set[str]:
    """Every line of code in grader/ and every solution and hidden-test line in solutions/ (long enough to tell)."""
    import nbformat

    lines = set()
    for path in (course.ROOT / "grader").rglob("*.py"):
        lines.update(ln.strip() for ln in path.read_text().splitlines())
    for path in (course.ROOT / "solutions").glob("*/*.ipynb"):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                lines.update(ln.strip() for ln in cell.source.splitlines())
    return {ln for ln in lines if len(ln) >= 24 and not ln.startswith(("#", '"', "'", 'f"', "f'"))}


def test_feedback_shows_diagnoses_and_never_hidden_tests(graded_class):
    cases, records, _ = graded_class
    students = sorted({c.student for c in cases})
    start = time.perf_counter()
    results = feedback.generate(only_students=students, workers=2, progress=False)
    TIMINGS["feedback"] = time.perf_counter() - start
    assert not [r for r in results if "error" in r], [r for r in results if "error" in r][:3]
    assert len(results) == len(cases)
    for case in cases:
        page = feedback.feedback_path(case.lesson, case.student).read_text()
        found = feedback.leaks(page, case.lesson, feedback.student_code(case.lesson, case.student))
        assert not found, f"{case.student}/{case.lesson} shows hidden test code: {found}"
        text = feedback.page_text(page)
        assert "Your results" in text
        for trap in case.diagnoses.values():
            if trap:
                assert f"Diagnosis: {trap}" in text, f"{case.student}: diagnosis missing from the feedback"
        if case.status == "kernel died":
            assert "kernel stopped" in text
    # no page shows a line of the instructor's code (grader/, or solutions/ beyond what students get)
    instructor = _instructor_code_lines()
    for case in cases:
        text = feedback.page_text(feedback.feedback_path(case.lesson, case.student).read_text())
        own = feedback.student_code(case.lesson, case.student)
        released = (course.ROOT / "notebooks" / case.lesson / f"{case.lesson}.ipynb").read_text()
        shown = {ln.strip() for ln in text.splitlines()} & instructor
        leaked = [ln for ln in shown if ln not in own and json.dumps(ln)[1:-1] not in released]
        assert not leaked, f"{case.student}/{case.lesson} shows instructor code: {leaked[:5]}"
    # the leak check itself catches a page that shows a hidden line
    les = lessons.lesson(spec.L1)
    hidden = [ln for ln in les.hidden_lines() if "grader.check" in ln][0]
    assert feedback.leaks(f"<pre>{hidden}</pre>", spec.L1)


def test_student_bundle_is_clean(built_course, tmp_path):
    path, problems = release.make_bundle(built_course, tmp_path / "bundle.zip")
    assert problems == [] and path is not None
    import zipfile

    names = zipfile.ZipFile(path).namelist()
    root = release.BUNDLE_NAME
    assert f"{root}/README.md" in names and f"{root}/environment.yml" in names
    assert f"{root}/attention_course/checks.py" in names and f"{root}/data/love_cats.json" in names
    for lesson in course.lessons():
        assert f"{root}/notebooks/{lesson}/{lesson}.ipynb" in names
    assert not [n for n in names if "/grader/" in n or "/solutions/" in n or n.endswith(".pyc")]
    # the check finds a solution notebook slipped in by mistake
    files = release.bundle_files(built_course)
    files[f"{root}/notebooks/01_projection/01_projection.ipynb"] = (
        course.ROOT / "solutions" / "01_projection" / "01_projection.ipynb"
    ).read_bytes()
    found = release.check_bundle(files)
    assert any("BEGIN SOLUTION" in p for p in found) and any("hidden test line" in p for p in found)
    assert any("grading package" in p for p in found)


def test_export_writes_grades_and_a_class_report(graded_class, tmp_path):
    cases, records, (quick, rest) = graded_class
    paths = report.export(tmp_path / "report")
    rep = paths.pop("report_data")
    grades = (tmp_path / "report" / "grades.csv").read_text().splitlines()
    assert grades[0].startswith("assignment,duedate,timestamp,student_id")
    assert len(grades) - 1 >= len(cases)
    md = paths["report"].read_text()
    assert "Pass rate per exercise" in md and "Most frequent misconceptions" in md and "t01_tensor_any" in md
    trap_wk = sum(
        1
        for r in records.values()
        if any(c.get("diagnosis") == "Q was computed with W_k" for c in r["cells"])
    )
    assert ("project", "Q was computed with W_k", trap_wk) in rep.misconceptions
    assert rep.misconceptions[0][2] == trap_wk  # W_k is the class's most frequent mistake
    project = next(s for s in rep.exercises if s.exercise == "project")
    lesson01 = [r for r in records.values() if r["lesson"] == spec.L1]
    assert project.submissions == len(lesson01)
    assert project.passed == sum(1 for r in lesson01 if r["score"] == r["max_score"])
    from PIL import Image

    with Image.open(paths["chart"]) as img:
        assert img.size == (1600, 900)
    subs = json.dumps(rep.problems)
    assert "kernel died" in subs and "timed out" in subs and "invalid notebook" in subs
    TIMINGS["grade"] = quick.seconds + rest.seconds
    print("timings (s):", {k: round(v, 1) for k, v in TIMINGS.items()})


def test_autograded_notebooks_open_in_nbgrader(graded_class):
    """The formgrader reads autograded/ and the gradebook: both are where nbgrader puts them."""
    cases, _, _ = graded_class
    api = course.api()
    for lesson in {c.lesson for c in cases}:
        subs = api.get_submissions(lesson)
        mine = {s["student"] for s in subs if s["autograded"]}
        assert {c.student for c in cases if c.lesson == lesson} <= mine
    assert Path(course.autograded_path(spec.L1, "c01_reference")).exists()
