"""Helpers for writing solution notebooks with nbgrader metadata.

A lesson is written as a list of cells and saved to ``solutions/NN_topic/NN_topic.ipynb``::

    from grader.authoring import md, code, solution, test, save
    save("01_projection", [md("# ..."), solution("ex01_project", "def project(...): ...")])

Cell ids follow the course's convention: solutions ``exNN_function``, tests
``testNN_function_aspect``; the grade id equals the cell id.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
_counter = {"n": 0}


def _clean(src: str) -> str:
    return textwrap.dedent(src).strip("\n")


def _id(prefix: str) -> str:
    _counter["n"] += 1
    return f"{prefix}-{_counter['n']:02d}"


def md(src: str, locked: bool = False) -> nbformat.NotebookNode:
    """A markdown cell (``locked`` makes it read-only for students)."""
    cell = nbformat.v4.new_markdown_cell(_clean(src), id=_id("md"))
    if locked:
        cell.metadata["nbgrader"] = _meta(cell.id, locked=True)
    return cell


def code(src: str) -> nbformat.NotebookNode:
    """An ordinary code cell."""
    return nbformat.v4.new_code_cell(_clean(src), id=_id("code"))


def _meta(grade_id: str, *, grade=False, solution=False, locked=False, points=None) -> dict:
    meta = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": locked,
        "schema_version": 3,
        "solution": solution,
        "task": False,
    }
    if points is not None:
        meta["points"] = points
    return meta


def solution(grade_id: str, src: str) -> nbformat.NotebookNode:
    """An exercise cell; wrap the answer in ### BEGIN SOLUTION / ### END SOLUTION."""
    assert re.fullmatch(r"ex\d\d_\w+", grade_id), grade_id
    cell = nbformat.v4.new_code_cell(_clean(src), id=grade_id)
    cell.metadata["nbgrader"] = _meta(grade_id, solution=True)
    return cell


def test(grade_id: str, points: int, src: str) -> nbformat.NotebookNode:
    """A graded, locked test cell; it must open with a ``\"\"\"Check that ...\"\"\"`` docstring."""
    assert re.fullmatch(r"test\d\d_\w+", grade_id), grade_id
    body = _clean(src)
    assert body.startswith('"""Check that'), f"{grade_id}: test cells open with a 'Check that' docstring"
    cell = nbformat.v4.new_code_cell(body, id=grade_id)
    cell.metadata["nbgrader"] = _meta(grade_id, grade=True, locked=True, points=points)
    return cell


def total_points(cells) -> int:
    return sum(c.metadata.get("nbgrader", {}).get("points", 0) for c in cells)


def save(lesson: str, cells) -> Path:
    """Write solutions/<lesson>/<lesson>.ipynb with no outputs."""
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    out = ROOT / "solutions" / lesson / f"{lesson}.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    from grader import platforms  # badges and the Colab setup cell, from the one repository setting

    platforms.apply_to_notebook(nb, lesson, platforms.settings())
    nbformat.validate(nb)
    nbformat.write(nb, out)
    return out
