"""Hidden reference, checks and instructor tooling. Never shipped to students.

Hidden tests call ``grader.check("project", project)``.
"""

from __future__ import annotations

import sys
from typing import Any

# jsonschema, which nbformat imports, loads rfc3987_syntax when it is installed (Jupyter's server
# packages pull it in): an Earley parser for IRIs, built at import, about 0.9 s of CPU in every
# process that reads a notebook -- each grading worker and coordinator included -- for the "iri"
# format check, which no notebook schema uses. Marked absent here, jsonschema leaves that check out.
# (Where jsonschema is already loaded, as in a Jupyter server, this changes nothing.)
sys.modules.setdefault("rfc3987_syntax", None)


def check(name: str, student_fn: Any) -> None:
    """Grade one exercise: raise AssertionError with a diagnosis unless it is right."""
    from grader.harness import check_exercise
    from grader.registry import exercises

    known = exercises()
    if name not in known:
        raise KeyError(f"no exercise called {name!r}; known: {sorted(known)}")
    check_exercise(known[name], student_fn)


__all__ = ["check"]
