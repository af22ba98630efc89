"""Grading survives being killed: rerun, it finishes the rest and the gradebook is the same.

A small class is graded twice from the same start: once without interruption,
once by ``python -m grader grade`` killed (SIGKILL, the whole process group)
after a few submissions and then run again. Every grade of every test cell of
every student, every comment and every submission time must be identical.
Also: the same class on a Dask cluster (the executor seam) gives the same grades.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nbformat.reader import NotJSONError

from grader import course
from grader.classroom import executors, grading
from grader.classroom.autograde import Options
from tests.class_sim import spec

pytestmark = pytest.mark.slow
STUDENTS = [
    "c01_reference",
    "c01_trap_wk",
    "c01_blank",
    "c01_syntax",
    "c01_os_exit",
    "t01_tensor_any",
    "c01_invalid_json",
    "c01_dtype",
]


@pytest.fixture(scope="module")
def small_class(tmp_path_factory):
    """A work folder with lesson 01 in its gradebook and eight submissions, nothing graded."""
    base = tmp_path_factory.mktemp("resume") / "base"
    old = os.environ.get("ATTENTION_COURSE_WORK")
    os.environ["ATTENTION_COURSE_WORK"] = str(base)
    try:
        course.build_notebooks(release_dir=base / "release", only=[spec.L1])
        cases = [c for c in spec.cases(base) if c.student in STUDENTS]
        spec.materialize(cases, base / "release")
    finally:
        if old is None:
            del os.environ["ATTENTION_COURSE_WORK"]
        else:
            os.environ["ATTENTION_COURSE_WORK"] = old
    yield base, cases


def _copy(base: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    shutil.copy(base / "gradebook.db", dest / "gradebook.db")
    shutil.copytree(base / "submitted", dest / "submitted")
    return dest


def snapshot(work: Path) -> dict:
    """Every grade, comment and submission time in a gradebook, keyed by student and cell."""
    with sqlite3.connect(work / "gradebook.db") as db:
        grades = db.execute(
            "SELECT sa.student_id, a.name, b.name, g.auto_score, g.manual_score, g.needs_manual_grade "
            "FROM grade g JOIN submitted_notebook sn ON g.notebook_id = sn.id "
            "JOIN submitted_assignment sa ON sn.assignment_id = sa.id JOIN assignment a ON sa.assignment_id = a.id "
            "JOIN base_cell b ON g.cell_id = b.id"
        ).fetchall()
        comments = db.execute(
            "SELECT sa.student_id, b.name, c.auto_comment FROM comment c "
            "JOIN submitted_notebook sn ON c.notebook_id = sn.id JOIN submitted_assignment sa ON sn.assignment_id = sa.id "
            "JOIN base_cell b ON c.cell_id = b.id"
        ).fetchall()
        times = db.execute("SELECT student_id, timestamp FROM submitted_assignment").fetchall()
    return {
        "grades": {(s, a, c): (auto, manual, bool(needs)) for s, a, c, auto, manual, needs in grades},
        "comments": {(s, c): text for s, c, text in comments},
        "times": dict(times),
    }


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["ATTENTION_COURSE_WORK"] = str(work)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


# ``python -m grader ARGS`` that then says which of nbgrader and PyTorch the coordinator loaded
_GRADE_AND_SAY_WHAT_LOADED = (
    "import runpy, sys\n"
    "try:\n"
    "    runpy.run_module('grader', run_name='__main__', alter_sys=True)\n"
    "finally:\n"
    "    print('coordinator loaded', sorted(m for m in ('nbgrader', 'torch') if m in sys.modules))\n"
)


def _grade_cmd() -> list[str]:
    return [
        sys.executable, "-c", _GRADE_AND_SAY_WHAT_LOADED,
        "grade", spec.L1, "--workers", "2", "--timeout", "20", "--quiet",
    ]  # fmt: skip


def test_killed_and_rerun_gives_the_gradebook_of_an_uninterrupted_run(small_class, tmp_path):
    base, cases = small_class
    straight = _copy(base, tmp_path / "straight")
    done = subprocess.run(
        _grade_cmd(), cwd=course.ROOT, env=_env(straight), capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # its workers and a helper forked beside them wrote the gradebook: the coordinator never loads nbgrader
    assert "coordinator loaded []" in done.stdout, done.stdout
    expected = snapshot(straight)
    assert len({k[0] for k in expected["grades"]}) == len(cases)

    broken = _copy(base, tmp_path / "broken")
    results = broken / "classroom" / "results" / spec.L1
    proc = subprocess.Popen(
        _grade_cmd(),
        cwd=course.ROOT,
        env=_env(broken),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and len(list(results.glob("*.json"))) < 3:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the coordinator and its workers, mid-run
    proc.wait()
    graded_before = len(list(results.glob("*.json")))
    assert 3 <= graded_before < len(cases), graded_before

    again = subprocess.run(
        _grade_cmd(), cwd=course.ROOT, env=_env(broken), capture_output=True, text=True, timeout=1200
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{graded_before} already graded" in again.stdout or "already graded" in again.stdout, again.stdout
    assert snapshot(broken) == expected
    # and a third run has nothing left to do
    third = subprocess.run(
        _grade_cmd(), cwd=course.ROOT, env=_env(broken), capture_output=True, text=True, timeout=600
    )
    assert f"Graded 0 submissions; {len(cases)} already graded" in third.stdout, third.stdout


def _finished_notebooks(base: Path) -> list[tuple[str, str, str | None, bytes]]:
    """Three students' final notebooks of lesson 01, failing none, one and two of its test cells."""
    nb = json.loads((base / "release" / spec.L1 / f"{spec.L1}.ipynb").read_text())
    tests = [
        i
        for i, c in enumerate(nb["cells"])
        if c["metadata"].get("nbgrader", {}).get("grade") and c["cell_type"] == "code"
    ]
    assert len(tests) >= 2
    error = {"output_type": "error", "ename": "AssertionError", "evalue": "wrong", "traceback": []}
    entries = []
    for failing, (student, timestamp) in enumerate(
        [("ann", None), ("ben", "2026-01-05 10:00:00 UTC"), ("cy", "2026-01-07 23:59:00.5 UTC")]
    ):
        copy = json.loads(json.dumps(nb))
        for i in tests[:failing]:
            copy["cells"][i]["outputs"] = [error]
        entries.append((spec.L1, student, timestamp, json.dumps(copy).encode()))
    return entries


def test_grades_written_in_one_batch_are_those_written_one_at_a_time(small_class, tmp_path):
    """A grading run records finished jobs a few at a time, in one transaction: the gradebook then holds
    exactly what recording each on its own gives (nbgrader's steps, one by one), and a batch that
    fails part-way leaves the gradebook as it was, none of the batch in it."""
    base, _ = small_class
    entries = _finished_notebooks(base)
    course_id = grading.course_config().CourseDirectory.get("course_id", "")
    one, batch = _copy(base, tmp_path / "one"), _copy(base, tmp_path / "batch")
    for entry in entries:
        grading.write_grades(f"sqlite:///{one / 'gradebook.db'}", course_id, [entry])
    held = grading.write_grades(f"sqlite:///{batch / 'gradebook.db'}", course_id, entries)
    expected = snapshot(one)
    assert snapshot(batch) == expected
    scores = {s: 0.0 for s in ("ann", "ben", "cy")}
    for (student, _, _), (auto, _, _) in expected["grades"].items():
        scores[student] += auto or 0
    assert scores["ann"] > scores["ben"] > scores["cy"], scores
    assert held[0]["timestamp"] is None and expected["times"]["ann"] is None
    assert held[1]["timestamp"].startswith("2026-01-05 10:00:00")
    assert held[2]["timestamp"].startswith("2026-01-07 23:59:00.5")

    broken = [(spec.L1, "dora", None, entries[1][3]), (spec.L1, "eve", None, b"{not a notebook")]
    with pytest.raises(NotJSONError):  # the second notebook, after the first was recorded
        grading.write_grades(f"sqlite:///{batch / 'gradebook.db'}", course_id, broken)
    assert snapshot(batch) == expected
    with sqlite3.connect(batch / "gradebook.db") as db:
        assert {s for (s,) in db.execute("SELECT id FROM student")} == {"ann", "ben", "cy"}


def test_a_run_whose_gradebook_helper_dies_still_records_every_job(small_class, tmp_path, monkeypatch):
    """The helper process that writes a local run's batches into the gradebook dies (killed): the
    coordinator writes them itself, and every job gets its grades, its autograded folder and its record."""
    from grader.classroom import servers
    from grader.classroom.jobs import JobResult

    base, _ = small_class
    work = _copy(base, tmp_path / "work")
    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(work))
    entries = _finished_notebooks(base)
    summary = grading.RunSummary()
    with executors.LocalExecutor(2, preload=servers.WORKER_MODULES) as ex:
        helper = ex.helper()
        assert helper is not None, "two workers and a forkserver, but no helper"
        os.kill(helper.submit(os.getpid).result(), signal.SIGKILL)
        writer = grading.GradebookWriter(ex, summary, {spec.L1: "digest"})
        for lesson, student, timestamp, notebook in entries:
            folder = work / "submitted" / student / lesson
            folder.mkdir(parents=True)
            (folder / f"{lesson}.ipynb").write_bytes(notebook)
            if timestamp:
                (folder / "timestamp.txt").write_text(timestamp)
            result = JobResult(student, lesson, "digest", "graded", notebook=notebook)
            writer.add(result, grading.Submission(student, lesson, folder / f"{lesson}.ipynb"))
        writer.step(final=True)
    assert summary.graded == len(entries) and summary.by_status == {"graded": len(entries)}
    records = {r["student"]: r for r in grading.load_records([spec.L1])}
    assert set(records) == {"ann", "ben", "cy"}
    assert records["ben"]["timestamp"].startswith("2026-01-05 10:00:00")
    assert {s for (s, _, _) in snapshot(work)["grades"]} == {"ann", "ben", "cy"}
    assert all(course.autograded_path(spec.L1, s).exists() for s in ("ann", "ben", "cy"))


def test_dask_cluster_grades_like_the_local_pool(small_class, tmp_path, monkeypatch):
    base, cases = small_class
    work = _copy(base, tmp_path / "dask")
    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(work))
    summary = grading.grade(
        [spec.L1], options=Options(timeout=20), executor="dask", workers=2, progress=False
    )
    assert summary.executor == "dask" and summary.graded == len(cases) and not summary.failed
    records = {r["student"]: r for r in grading.load_records([spec.L1])}
    for case in cases:
        assert records[case.student]["score"] == case.expected_score(), case.student
        assert records[case.student]["status"] == case.status, case.student


def test_executors_share_one_interface():
    with executors.LocalExecutor(2) as local:
        assert sorted(r for _, r in local.run(abs, [-1, -2, 3])) == [1, 2, 3]
    failing = list(executors.LocalExecutor(1).run(int, ["7", "x"]))
    assert any(isinstance(r, ValueError) for _, r in failing)
    with executors.DaskExecutor(workers=1) as dask:
        assert sorted(r for _, r in dask.run(abs, [-4, 5])) == [4, 5]
