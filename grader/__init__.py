"""Hidden reference, checks and instructor tooling. Never shipped to students.

Hidden tests call ``grader.check("project", project)``.
"""

from __future__ import annotations

from typing import Any


def check(name: str, student_fn: Any) -> None:
    """Grade one exercise: raise AssertionError with a diagnosis unless it is right."""
    from grader.harness import check_exercise
    from grader.registry import exercises

    known = exercises()
    if name not in known:
        raise KeyError(f"no exercise called {name!r}; known: {sorted(known)}")
    check_exercise(known[name], student_fn)


__all__ = ["check"]
