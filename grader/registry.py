"""Every graded exercise of the course, by function name."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from types import SimpleNamespace

from grader.harness import Exercise


@cache
def exercises() -> dict[str, Exercise]:
    """The ``EXERCISES`` of every module of grader.lessons (``l01_projection``, ...), in lesson order."""
    from grader import lessons

    found: dict[str, Exercise] = {}
    for info in sorted(pkgutil.iter_modules(lessons.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"grader.lessons.{info.name}")
        for name, ex in getattr(module, "EXERCISES", {}).items():
            if name in found:
                raise RuntimeError(f"exercise {name!r} is defined twice (grader.lessons.{info.name})")
            found[name] = ex
    return found


def lesson_of(name: str) -> str:
    """The two-digit lesson (``"07"``) whose module defines the exercise called ``name``."""
    module = exercises()[name].reference.__module__
    return module.rsplit(".", 1)[-1][1:3]


def references() -> SimpleNamespace:
    """Every graded function's one reference, by name: ``references().attention``."""
    return SimpleNamespace(**{name: ex.reference for name, ex in exercises().items()})


def core() -> dict[str, Exercise]:
    """The exercises of lessons 01-07, the one attention head."""
    return {name: ex for name, ex in exercises().items() if lesson_of(name) <= "07"}
