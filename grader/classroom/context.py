"""The notebook being graded, as each step of its grading sees it (``grader.classroom.autograde``).

One notebook at a time per process: ``_CONTEXT`` holds its lesson, options, private folders, flags,
notes and verdicts, shared by the preprocessors and the job; the statuses and the cells that carry
a grade are read from its outputs here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from nbformat import NotebookNode

from grader.classroom.jobs import Options

# ------------------------------------------------------------------ per-worker state

_CONTEXT: dict[str, Any] = {}  # the job being graded (read by the preprocessors)


# ------------------------------------------------------------------ statuses

SYNTAX = ("SyntaxError", "IndentationError", "TabError")
SEVERITY = (
    "invalid notebook|kernel died|timed out|out of memory|exited|not verified|syntax error|not attempted|"
    "repaired|graded"
).split("|")


def _is_memory_error(ename: str, evalue: str) -> bool:
    text = f"{ename} {evalue}".lower()
    return (
        ename in ("MemoryError", "OutOfMemoryError")
        or "can't allocate memory" in text
        or "out of memory" in text
    )


def run_status(nb: Any) -> set[str]:
    """What happened while the kernel ran, read from the outputs of every code cell."""
    found = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") != "error":
                continue
            ename, evalue = out.get("ename", ""), str(out.get("evalue", ""))
            if ename in SYNTAX:
                found.add("syntax error")
            elif ename in ("CellTimeoutError", "NotebookTimeout"):
                found.add("timed out")
            elif _is_memory_error(ename, evalue):
                found.add("out of memory")
            elif ename == "SystemExit":
                found.add("exited")
            elif ename == "KernelDied":
                found.add("kernel died")
    return found


def worst(statuses: set[str]) -> str:
    for s in SEVERITY:
        if s in statuses:
            return s
    return "graded"


def _error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _grade_cells(nb: Any) -> list[Any]:
    return [c for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")]


# ------------------------------------------------------------------ plain nbgrader: a context per notebook


def _new_context(root: Path, lesson: Any, opts: Options, deny: list, **who: Any) -> None:
    """A fresh context for one notebook: its private folders, what it may not touch, empty records."""
    for name in ("trusted", "scratch", "tmp"):
        (root / name).mkdir()
    _CONTEXT.clear()
    _CONTEXT.update(
        lesson=lesson,
        options=opts,
        root=root,
        deny=deny,
        flags=[],
        notes=[],
        cells=[],
        phases={},
        deadline=time.monotonic() + opts.notebook_timeout,
        **who,
    )


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


class CouldNotGrade(RuntimeError):
    """The notebook failed before any of the student's code ran (the course package could not be
    imported, a setup cell of the lesson's own failed): no score, the reason instead."""
