"""Small helpers the tests share: fill a student notebook, submit it, read outputs."""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent


def solution_sources(lesson: str) -> dict[str, str]:
    """Solution cell sources of a lesson (markers removed), keyed by grade id."""
    nb = nbformat.read(ROOT / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    out = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            out[meta["grade_id"]] = re.sub(r"^\s*### (BEGIN|END) SOLUTION\n", "", cell.source, flags=re.M)
    return out


def filled(student_nb: Path, answers: dict[str, str]) -> nbformat.NotebookNode:
    """The student notebook with some solution cells replaced by ``answers``."""
    nb = nbformat.read(student_nb, as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nb


def submit(nb: nbformat.NotebookNode | Path, lesson: str, student: str) -> Path:
    """Place a notebook where nbgrader looks for a student's submission."""
    from grader import course

    dest = course.submission_path(lesson, student)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(nb, Path):
        shutil.copy(nb, dest)
    else:
        nbformat.write(nb, dest)
    return dest


def cell_error(nb_path: Path, grade_id: str) -> str:
    """The error text a test cell produced in an executed notebook ('' if none)."""
    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            texts = []
            for out in cell.get("outputs", []):
                if out.output_type == "error":
                    texts.append(f"{out.ename}: {out.evalue}")
                elif out.output_type == "stream" and out.name == "stderr":
                    texts.append(out.text)
            return "\n".join(texts)
    raise KeyError(grade_id)


def run_in_kernel(
    nb: nbformat.NotebookNode, cwd: Path, timeout: int = 120, allow_errors: bool = False
) -> None:
    """Execute ``nb`` in place in a fresh python3 kernel working in ``cwd``.

    The kernel talks over IPC sockets in a private folder, not TCP ports: kernels that several
    test processes start at once cannot pick the same port. The client is the grading kernels'
    (``GuardedKernelClient``): after a cell with an Output widget, nbclient's own client could
    sleep through the cell's reply until the cell's timeout (120 s here). After each cell's reply the client
    waits up to 60 s (not nbclient's 4 s) for the cell's last outputs, which a loaded machine can
    deliver late: otherwise they would be dropped without a word. The kernel keeps its input history
    in memory: the kernels of all test processes would otherwise share, and wait on, one SQLite file
    (~/.ipython/profile_default/history.sqlite).
    """
    import tempfile

    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    from grader.classroom.kernels import GuardedKernelClient

    started = datetime.datetime.now(datetime.UTC)
    with tempfile.TemporaryDirectory(prefix="kernel-") as sockets:
        km = AsyncKernelManager(
            kernel_name="python3",
            transport="ipc",
            ip=str(Path(sockets) / "ipc"),
            client_factory=GuardedKernelClient,  # never asleep on a reply that has come
        )
        km.connection_file = str(Path(sockets) / "kernel.json")
        client = NotebookClient(
            nb,
            km=km,
            timeout=timeout,
            iopub_timeout=60,
            extra_arguments=["--HistoryManager.hist_file=:memory:"],
            raise_on_iopub_timeout=True,
            allow_errors=allow_errors,
            shutdown_kernel="immediate",
            resources={"metadata": {"path": str(cwd)}},
        )
        client.owns_km = True  # end the kernel when the run ends (nbclient keeps a given manager's kernel)
        client.execute()
    _warn_if_stalled(nb, cwd, started)


class KernelStallWarning(UserWarning):
    """A notebook run took far longer than its cells did: where the time went, for the run's log."""


STALL_SECONDS = 45


def _warn_if_stalled(nb: nbformat.NotebookNode, cwd: Path, started: datetime.datetime) -> None:
    """Name every step of a slow run that took over 5 s: kernel start, a cell, the wait for a cell's
    last outputs, the time between cells, shutdown. (This is how runs of a few seconds that took
    60 or 120 s were traced to the client sleeping through a widget cell's reply.)"""
    ended = datetime.datetime.now(datetime.UTC)
    if (ended - started).total_seconds() < STALL_SECONDS:
        return

    def at(stamp: str) -> datetime.datetime:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    steps, previous, label = [], started, "kernel start"
    for i, cell in enumerate(nb.cells):
        timing = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" not in timing or "shell.execute_reply" not in timing:
            continue
        steps.append((label, at(timing["iopub.execute_input"]) - previous))
        steps.append((f"cell {i}", at(timing["shell.execute_reply"]) - at(timing["iopub.execute_input"])))
        if "iopub.status.idle" in timing:
            steps.append(
                (f"cell {i} outputs", at(timing["iopub.status.idle"]) - at(timing["shell.execute_reply"]))
            )
        previous, label = (
            at(timing.get("iopub.status.idle", timing["shell.execute_reply"])),
            f"after cell {i}",
        )
    steps.append(("shutdown", ended - previous))
    slow = [f"{name} {delta.total_seconds():.0f} s" for name, delta in steps if delta.total_seconds() > 5]
    warnings.warn(
        f"{cwd.name}: the kernel run took {(ended - started).total_seconds():.0f} s; over 5 s: "
        + (", ".join(slow) or "no single step"),
        KernelStallWarning,
        stacklevel=3,
    )


def execute(path: Path, timeout: int = 120) -> nbformat.NotebookNode:
    """Run a notebook top to bottom in a real kernel, with its own folder as cwd."""
    nb = nbformat.read(path, as_version=4)
    run_in_kernel(nb, path.parent, timeout)
    return nb


def run_and_read(path: Path, expressions: dict[str, str], timeout: int = 120) -> dict:
    """Run a notebook in a real kernel, then evaluate expressions in that same kernel.

    Returns ``{name: value}`` where each expression's value is converted with
    ``.tolist()`` if it has one (tensors, arrays), so tests can compare the numbers a
    lesson really computed with the numbers of the course brief.
    """
    import json

    nb = nbformat.read(path, as_version=4)
    probe = (
        "import json as _json\n"
        "def _plain(v):\n"
        "    v = v.tolist() if hasattr(v, 'tolist') else v\n"
        "    return v\n"
        f"print('@@VALUES@@' + _json.dumps({{k: _plain(eval(e)) for k, e in {expressions!r}.items()}}))"
    )
    nb.cells.append(nbformat.v4.new_code_cell(probe))
    run_in_kernel(nb, path.parent, timeout)
    for out in nb.cells[-1].outputs:
        if out.output_type == "stream" and "@@VALUES@@" in out.text:
            return json.loads(out.text.split("@@VALUES@@", 1)[1])
    raise AssertionError(f"could not read values from {path.name}: {nb.cells[-1].outputs}")


@contextlib.contextmanager
def grading_work(work: Path, lessons: list[str]) -> Iterator[bytes]:
    """``work`` as the grading work folder (``ATTENTION_COURSE_WORK``), with a gradebook that knows
    ``lessons``; yields the gradebook template graded jobs start from."""
    from grader.classroom import grading

    old = os.environ.get("ATTENTION_COURSE_WORK")
    os.environ["ATTENTION_COURSE_WORK"] = str(work)
    try:
        grading.ensure_gradebook(lessons)
        yield grading.template()
    finally:
        if old is None:
            os.environ.pop("ATTENTION_COURSE_WORK", None)
        else:
            os.environ["ATTENTION_COURSE_WORK"] = old
