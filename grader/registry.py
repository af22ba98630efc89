"""Every graded exercise of the course, by function name."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from grader.harness import Exercise


@cache
def exercises() -> dict[str, Exercise]:
    """Lessons 01-07 from grader.exercises, plus every module of grader.beyond."""
    from grader import beyond
    from grader.exercises import EXERCISES

    found = dict(EXERCISES)
    for info in sorted(pkgutil.iter_modules(beyond.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"grader.beyond.{info.name}")
        for name, ex in getattr(module, "EXERCISES", {}).items():
            if name in found:
                raise RuntimeError(f"exercise {name!r} is defined twice (grader.beyond.{info.name})")
            found[name] = ex
    return found
