"""Where grading memory is tight (a container, a small machine), the notebooks graded at once fit in it
together: no notebook can take memory from a classmate's.

Each notebook has a memory cap of its own, but nothing made the caps of the notebooks graded at once add
up to what the machine has. Out of memory, Linux kills the largest process; a notebook that spread its
memory over many small processes made a classmate's kernel that process. A run now fits its workers and
caps to the memory it may take (``executors.fit_memory``), and says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from grader.classroom import boundary, executors
from tests import attacks
from tests import test_seal as _seal
from tests.nbtools import ROOT, filled, grading_work, solution_sources, submit
from tests.test_seal import needs_seal

gradebook = _seal.gradebook

GIB = 1 << 30
LESSON = "01_projection"

# memory no process owns (a file where the notebook works), then many small processes: in the checks'
# process and again in the kernel
_SPREAD = (
    attacks.FORK_EXEC
    + """
import time as _t
_shell("head -c 1000M /dev/zero > big.bin; "
       "for i in $(seq 1 60); do python3 -I -S -c 'import time; a = bytearray(40 << 20); time.sleep(60)' & "
       "sleep 0.02; done")
_t.sleep(8)
"""
)


def test_workers_and_caps_are_fitted_to_the_memory_there_is():
    """The rule, on numbers: enough memory changes nothing; too little lowers the cap first, down to
    1 GiB a notebook process, then takes workers away; a cap below that is said to be one. What is
    left always holds every notebook graded at once, at its caps, beside the run."""
    assert executors.fit_memory(2, 4 * GIB, 23 * GIB) == (2, 4 * GIB, "")
    assert executors.fit_memory(4, None, 2 * GIB) == (4, None, "")  # no cap asked: nothing to fit
    assert executors.fit_memory(4, 4 * GIB, None) == (4, 4 * GIB, "")  # Linux does not say
    workers, cap, note = executors.fit_memory(2, 4 * GIB, 8 * GIB)  # two workers still fit, with less each
    assert (workers, cap) == (2, 1.25 * GIB), (
        note
    )  # in steps of 256 MiB, so that the lesson's proof holds again
    assert "2 workers and a cap of 1.25 GiB per notebook process (not 4.00)" in note, note
    workers, cap, note = executors.fit_memory(8, 4 * GIB, 16 * GIB)  # a laptop: 8 cores, 16 GiB free
    assert workers == 5 and cap >= executors.MEMORY_FLOOR, (workers, cap, note)
    assert "5 workers (not 8)" in note and "may run out" not in note, note
    # every notebook graded at once, its kernel and its checks' process at their caps, and the run: all fit
    assert 2 * workers * cap + executors.RUN_RESERVE + workers * executors.WORKER_RESERVE <= 16 * GIB
    workers, cap, note = executors.fit_memory(2, 4 * GIB, int(2.4 * GIB))  # a container of 2.5 GiB
    assert workers == 1 and cap < executors.MEMORY_FLOOR, (workers, cap, note)
    assert "1 worker (not 2)" in note and "below 1 GiB a notebook may run out" in note, note


def _ends_its_worker(job: str) -> str:
    """A job of the executor's test: "hog" ends the worker that runs it (as the OOM killer would); the
    others take half a second, so that they are in flight beside it."""
    if job == "hog":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    return job


def test_a_job_that_ends_its_worker_fails_alone():
    """A worker that dies (a notebook that ran it out of memory) took every job in flight beside it: each
    counted a death, and a classmate in flight at the attacker's three tries was "the worker process died
    twice" too. Which job it was cannot be told beside others, so they run again alone: only the job that
    ends its worker alone fails, and every other one keeps its result."""
    with executors.LocalExecutor(2) as ex:
        outcomes = dict(ex.run(_ends_its_worker, ["hog", "ann", "ben", "cy", "dee", "eve"]))
    assert isinstance(outcomes.pop("hog"), RuntimeError)
    assert outcomes == {name: name for name in ("ann", "ben", "cy", "dee", "eve")}, outcomes


def _memory_cgroup_parent() -> str | None:
    """A memory cgroup folder of this process where a child cgroup with a limit can be made, if any."""
    if os.geteuid() != 0:
        return None
    for folder, held in boundary._cgroup_parents():
        if "memory" in held and os.access(folder, os.W_OK):
            return folder
    return None


@needs_seal
@pytest.mark.slow
@pytest.mark.skipif(
    _memory_cgroup_parent() is None, reason="no memory cgroup to stand in for a container here"
)
def test_a_notebook_cannot_take_a_classmates_memory_where_grading_memory_is_tight(tmp_path):
    """A class graded in a container of 3 GiB (a memory cgroup here), its first student spreading its
    memory over many small processes: before, Linux killed a classmate's kernel (or the lesson's own
    solution beside it, and nothing was graded); now the run fits its workers and caps to what it has,
    says so, and every classmate keeps full marks, graded."""
    work = tmp_path / "work"
    classmates = [f"mate{i}" for i in range(1, 5)]
    with grading_work(work, [LESSON]):
        answers = solution_sources(LESSON)
        release = ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb"
        attacker = filled(release, answers)
        attacker.cells.insert(1, nbformat.v4.new_code_cell(_SPREAD))
        submit(attacker, LESSON, "hog")
        for mate in classmates:
            submit(filled(release, answers), LESSON, mate)
    container = f"{_memory_cgroup_parent()}/grading-{uuid.uuid4().hex[:8]}"
    os.mkdir(container)
    try:
        for name in ("memory.max", "memory.limit_in_bytes"):
            if os.path.exists(f"{container}/{name}"):
                Path(container, name).write_text(str(3 * GIB))
                break
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(ATTENTION_COURSE_WORK=str(work), XDG_CACHE_HOME=str(tmp_path / "cache"))
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        inside = 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"'
        argv = [sys.executable, "-m", "grader", "grade", LESSON, "--workers", "2", "--quiet"]
        run = subprocess.run(
            ["sh", "-c", inside, "sh", container, *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        for _ in range(50):  # its processes are gone a moment after the run
            try:
                os.rmdir(container)
                break
            except OSError:
                time.sleep(0.1)
    assert run.returncode in (0, 1), (run.returncode, run.stdout, run.stderr[-3000:])
    assert "Nothing was graded" not in run.stdout + run.stderr
    for mate in classmates:  # each classmate's record, as the run wrote it
        record = json.loads((work / "classroom" / "results" / LESSON / f"{mate}.json").read_text())
        assert (record["status"], record["score"], record["max_score"]) == ("graded", 7.0, 7.0), record
    assert "Memory: " in run.stdout and "GiB free, so 1 worker (not 2)" in run.stdout, run.stdout


# a right answer that first writes 800 MB into a file in memory of its own (``memfd``): memory that counts
# against its process's cap, not its address space, and that goes with the process
_FILLS_ITS_MEMORY = """
import os
def project(X, W_q, W_k, W_v):
    fd = os.memfd_create("fill")
    for i in range(8):
        os.write(fd, b"x" * (100 << 20))
    return X @ W_q, X @ W_k, X @ W_v
"""


@needs_seal
@pytest.mark.slow
@pytest.mark.skipif(_memory_cgroup_parent() is None, reason="no memory cgroup for a notebook here")
def test_a_check_whose_process_ran_out_of_memory_says_so(gradebook, monkeypatch):
    """A check whose process Linux ended at its memory cap said "the student's code ended its process",
    as if the student's code had ended it: it now names the cap among the causes."""
    from grader.classroom.autograde import Job, Options, grade_job

    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)  # nbgrader leaves it set where a step raises
    _, template = gradebook
    nb = filled(ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", {"ex01_project": _FILLS_ITS_MEMORY})
    result = grade_job(
        Job(
            "full_fred",
            LESSON,
            nbformat.writes(nb).encode(),
            template,
            options=Options(timeout=30, memory=512 << 20),
        )
    )
    assert result.error is None, result.error
    hidden = [c for c in result.cells if c.grade_id.endswith("hidden")]
    assert hidden and all(c.score == 0 for c in hidden), result.cells
    assert all("ended its process or ran out of memory or CPU time" in c.message for c in hidden), (
        result.cells
    )
