"""Jobs for executor tests (they import nothing when they load): what the worker process that runs
one looks like; one that says it runs, then sleeps; where a worker keeps its private gradebook."""

from __future__ import annotations

import os
import sys
import time


def facts(variable: str) -> dict:
    return {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "variable": os.environ.get(variable),
        "folder": os.getcwd(),
        "nbgrader loaded": "nbgrader" in sys.modules,
        "umask": _umask(),
    }


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def say_then_sleep(folder: str) -> None:
    with open(os.path.join(folder, str(os.getpid())), "w"):
        pass
    time.sleep(120)


def private_gradebook(_: object) -> str:
    """Where the worker keeps its private gradebook (grader's own choice, in the worker)."""
    from grader.classroom import autograde

    return str(autograde._private_gradebook())
