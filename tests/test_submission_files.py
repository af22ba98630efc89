"""What a student can put in the submitted folder, or make their kernel send, is not followed or kept.

A submitted notebook that is a link (to the lesson's solution, say) or a named pipe is not read: on the
tool's path it could not be graded (no score, the run goes on), on plain nbgrader's it is set aside and
nbgrader reports it failed. Links and special files beside a notebook are set aside before nbgrader copies
the folder as root, so the kernel never sees what they point to. A cell that floods its output keeps a
few megabytes in the grading worker, not gigabytes. Classmates graded in the same run keep full marks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grader import course
from tests.nbtools import ROOT, filled, grading_work, solution_sources

pytestmark = pytest.mark.slow

L1 = "01_projection"
FLOOD = (  # 320 MB of output offered, then 320 MB of errors sent as the kernel's own messages (each one
    # under kernels.MESSAGE_BYTES, so that the worker takes them)
    "\n_big = 'A' * (8 << 20)\nfor _i in range(40):\n"
    "    get_ipython().display_pub.publish({'text/plain': _big})\n"
    "_k = get_ipython().kernel\nfor _i in range(40):\n"
    "    _k.session.send(_k.iopub_socket, 'error', {'ename': 'E', 'evalue': _big[4:], 'traceback': []},"
    " parent=_k.get_parent('shell'))\ndel _big, _k\n"
)
REFERENCE = ROOT / "grader" / "lessons" / "l01_projection.py"


def _class(work: Path) -> None:
    """Five students: a notebook linked to the solution, a named pipe, a correct answer that floods its
    output and errors, a correct one with links beside it (to the reference and to /dev/zero), a correct one."""
    sols = solution_sources(L1)
    exercise = next(iter(sols))
    student_nb = ROOT / "notebooks" / L1 / f"{L1}.ipynb"
    for student in ("linked", "piped", "flood", "beside", "right"):
        folder = work / "submitted" / student / L1
        folder.mkdir(parents=True)
        answers = {**sols, exercise: sols[exercise] + FLOOD} if student == "flood" else sols
        (folder / f"{L1}.ipynb").write_text(json.dumps(filled(student_nb, answers)))
    linked = work / "submitted" / "linked" / L1 / f"{L1}.ipynb"
    linked.unlink()
    linked.symlink_to(ROOT / "solutions" / L1 / f"{L1}.ipynb")
    piped = work / "submitted" / "piped" / L1 / f"{L1}.ipynb"
    piped.unlink()
    os.mkfifo(piped)
    (work / "submitted" / "beside" / L1 / "leak.py").symlink_to(REFERENCE)
    (work / "submitted" / "beside" / L1 / "zero.bin").symlink_to("/dev/zero")


def _run(work: Path, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ATTENTION_COURSE_WORK=str(work), XDG_CACHE_HOME=str(work / "cache"))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def _small_with_note(work: Path) -> None:
    graded = course.autograded_path(L1, "flood")
    assert graded.exists() and graded.stat().st_size < 1_000_000, graded.stat().st_size
    assert " and more not shown; a cell keeps at most " in graded.read_text()  # cut as it came, in the worker
    errors = [
        o
        for c in json.loads(graded.read_text())["cells"]
        for o in c.get("outputs", [])
        if o["output_type"] == "error"
    ]
    assert len(errors) <= 1 and all(len(e["evalue"]) <= 4096 for e in errors), [
        len(e["evalue"]) for e in errors
    ]


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(tmp_path))
    with grading_work(tmp_path, [L1]):
        _class(tmp_path)
    return tmp_path


def test_the_tool_reads_no_link_or_pipe_and_keeps_no_flood(work):
    run = _run(work, sys.executable, "-m", "grader", "grade", L1, "--timeout", "20")
    assert run.returncode == 1, run.stderr[-3000:]  # some could not be graded: the run says so, and ends
    records = {
        s: json.loads((work / "classroom" / "results" / L1 / f"{s}.json").read_text())
        for s in ("linked", "piped", "flood", "beside", "right")
    }
    assert "a link, not a file" in records["linked"]["error"], records["linked"]
    assert "not a regular file" in records["piped"]["error"], records["piped"]
    for student in ("linked", "piped"):
        assert records[student]["status"] == "grading failed"
        assert f"{student} / {L1}: could not be graded" in run.stdout + run.stderr
        assert not course.autograded_path(L1, student).exists()
    for student in ("flood", "beside", "right"):
        assert (records[student]["status"], records[student]["score"]) == ("graded", 7.0), records[student]
        assert course.gradebook_scores(L1, student)["score"] == 7.0
    _small_with_note(work)
    assert os.path.islink(work / "submitted" / "linked" / L1 / f"{L1}.ipynb")  # nothing of it was moved


def test_plain_nbgrader_sets_links_and_pipes_aside_and_keeps_no_flood(work):
    run = _run(work, "nbgrader", "autograde", L1, "--force")
    aside = {p.name.split("-", 1)[1]: p for p in (work / "classroom" / "set_aside").glob("*/*")}
    for student, name in (("linked", f"{L1}.ipynb"), ("piped", f"{L1}.ipynb"), ("beside", "leak.py")):
        assert f"{student}/{L1}/{name}: a link, a special file" in run.stderr, run.stderr[-3000:]
    assert {"leak.py", "zero.bin", f"{L1}.ipynb"} <= set(aside), sorted(aside)
    assert os.path.islink(aside["leak.py"]) and os.readlink(aside["leak.py"]) == str(REFERENCE)  # as it was
    for student in ("linked", "piped"):
        assert not course.autograded_path(L1, student).exists()
    beside = course.autograded_path(L1, "beside").parent
    assert sorted(p.name for p in beside.iterdir()) == [f"{L1}.ipynb"]  # no copy of the reference, no zeros
    assert REFERENCE.read_text()[:200] not in (beside / f"{L1}.ipynb").read_text()
    for student in ("flood", "beside", "right"):
        assert course.gradebook_scores(L1, student)["score"] == 7.0, student
    _small_with_note(work)


def test_plain_nbgrader_sets_a_crowd_of_files_beside_a_notebook_aside_and_grades_it(tmp_path, monkeypatch):
    """nbgrader lists a submission's folder again for each file it copies from it (a time that grows with
    the square of their number: 8,000 empty files stalled a run 3 minutes before that notebook started, and
    no time limit covers it). Beyond ``recording.ENTRIES_CAP`` entries, all but the notebook is set aside,
    as it is, and said so; the notebook and the classmate graded after it keep full marks."""
    from grader.classroom import recording

    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(tmp_path))
    sols = solution_sources(L1)
    with grading_work(tmp_path, [L1]):
        for student in ("crowd", "right"):
            folder = tmp_path / "submitted" / student / L1
            folder.mkdir(parents=True)
            (folder / f"{L1}.ipynb").write_text(
                json.dumps(filled(ROOT / "notebooks" / L1 / f"{L1}.ipynb", sols))
            )
    crowd = tmp_path / "submitted" / "crowd" / L1
    (crowd / "deep").mkdir()
    for i in range(3 * recording.ENTRIES_CAP):
        (crowd / ("deep" if i % 3 else "") / f"f{i}.txt").write_text("")
    run = _run(tmp_path, "nbgrader", "autograde", L1, "--force")
    assert f"one of over {recording.ENTRIES_CAP} files" in run.stderr, run.stderr[-3000:]
    moved = list((tmp_path / "classroom" / "set_aside").glob("*/*"))
    assert len(moved) == recording.ENTRIES_CAP + 1, len(moved)  # the files at the top, and the folder
    assert sorted(p.name for p in crowd.iterdir()) == [f"{L1}.ipynb"]
    graded = course.autograded_path(L1, "crowd").parent
    assert sorted(p.name for p in graded.iterdir()) == [f"{L1}.ipynb"]  # no copy of any of them either
    for student in ("crowd", "right"):
        assert course.gradebook_scores(L1, student)["score"] == 7.0, student


def test_the_tools_summary_shows_what_a_student_named_on_that_students_own_line(tmp_path, monkeypatch):
    """A flag quotes the student's code (a name it patches), which may hold a carriage return and a
    terminal's erase-line sequence: printed as they were, they wiped the flag's line from the instructor's
    console, leaving "Flagged for review" over an empty line. They are shown escaped, on that line."""
    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(tmp_path))
    sols = solution_sources(L1)
    exercise = next(iter(sols))
    cloak = '\nimport torch as _t\nsetattr(_t, "softmax\\r\\x1b[2K", None)\n'
    with grading_work(tmp_path, [L1]):
        for student in ("cloak", "right"):
            folder = tmp_path / "submitted" / student / L1
            folder.mkdir(parents=True)
            answers = {**sols, exercise: sols[exercise] + cloak} if student == "cloak" else sols
            (folder / f"{L1}.ipynb").write_text(
                json.dumps(filled(ROOT / "notebooks" / L1 / f"{L1}.ipynb", answers))
            )
    run = _run(tmp_path, sys.executable, "-m", "grader", "grade", L1, "--quiet")
    assert run.returncode == 0, run.stderr[-3000:]
    shown = run.stdout + run.stderr
    assert f"  cloak / {L1}: patches torch.softmax\\r\\x1b[2K" in shown.splitlines(), shown
    assert "\r" not in shown and "\x1b" not in shown, shown
    for student in ("cloak", "right"):
        assert course.gradebook_scores(L1, student)["score"] == 7.0, student


def test_a_pipe_for_a_timestamp_stops_no_later_plain_nbgrader_run(work):
    """Without --force, nbgrader reads a graded submission's timestamp.txt before anything of the course
    runs for it: a named pipe put there after the first run kept the next one waiting for ever."""
    first = _run(work, "nbgrader", "autograde", L1, "--force")
    assert course.gradebook_scores(L1, "right")["score"] == 7.0, first.stderr[-3000:]
    os.mkfifo(work / "submitted" / "right" / L1 / "timestamp.txt")
    late = work / "submitted" / "late" / L1
    late.mkdir(parents=True)
    (late / f"{L1}.ipynb").write_text(
        json.dumps(filled(ROOT / "notebooks" / L1 / f"{L1}.ipynb", solution_sources(L1)))
    )
    again = _run(work, "timeout", "180", "nbgrader", "autograde", L1)
    assert again.returncode != 124, "nbgrader waited on the pipe"
    assert f"right/{L1}/timestamp.txt: a link, a special file" in again.stderr, again.stderr[-3000:]
    assert course.gradebook_scores(L1, "late")["score"] == 7.0, again.stderr[-3000:]
