"""The graded functions of the solution notebooks, loaded without running the lessons.

``solution_functions("07_one_head")`` executes, in notebook order, every solution cell and the
definitions of the other code cells (imports, functions, classes and UPPER_CASE constants), never a
test cell or the Colab cell, and returns the namespace's callables by name.
"""

from __future__ import annotations

import ast
import re
import time
from collections.abc import Callable
from functools import cache

import nbformat

from tests.nbtools import ROOT, run_and_read

_MARKERS = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$", re.M)


def _upper(target: ast.expr) -> bool:
    """Whether an assignment target names only UPPER_CASE constants (``N``, ``D_K, D_V``)."""
    if isinstance(target, ast.Tuple):
        return all(_upper(t) for t in target.elts)
    return isinstance(target, ast.Name) and target.id.isupper()


def _run_definitions(source: str, label: str, namespace: dict) -> None:
    """Run a cell's top-level imports, and those functions, classes and UPPER_CASE constants that run alone."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics: not a definition
        return
    for node in tree.body:
        code = compile(ast.Module(body=[node], type_ignores=[]), label, "exec")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            exec(code, namespace)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) or (
            isinstance(node, ast.Assign) and all(_upper(t) for t in node.targets)
        ):
            try:
                exec(code, namespace)
            except Exception:  # noqa: BLE001 - built from the lesson's data (a default, a constant): not needed
                pass


@cache
def solution_namespace(lesson: str) -> dict:
    """The namespace a lesson's solution notebook defines (see the module docstring)."""
    nb = nbformat.read(ROOT / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    namespace: dict = {"__name__": f"solution_{lesson}"}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or meta.get("grade") or "# @title Run me first" in cell.source:
            continue
        label = f"{lesson}:{meta.get('grade_id', 'cell')}"
        if meta.get("solution"):
            exec(compile(_MARKERS.sub("", cell.source), label, "exec"), namespace)
        else:
            _run_definitions(cell.source, label, namespace)
    return namespace


def solution_functions(lesson: str) -> dict:
    """The callables a lesson's solution cells define, by name."""
    nb = nbformat.read(ROOT / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    namespace = solution_namespace(lesson)
    names = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            names |= set(re.findall(r"^def (\w+)", cell.source, re.M))
    return {name: namespace[name] for name in names}


def read_solution(
    lesson: str, table: str, record_property: Callable[[str, object], None] | None = None
) -> dict:
    """Run a lesson's solution notebook in a real kernel and read back the ``name = expression`` lines of ``table``.

    With pytest's ``record_property``, the run's seconds (kernel start included) are recorded as
    ``lesson_seconds`` and printed.
    """
    expressions = dict(line.split(" = ", 1) for line in table.strip().splitlines())
    start = time.perf_counter()
    values = run_and_read(ROOT / "solutions" / lesson / f"{lesson}.ipynb", expressions)
    if record_property is not None:
        seconds = time.perf_counter() - start
        record_property("lesson_seconds", seconds)
        print(f"\nlesson {lesson[:2]} ran in {seconds:.1f} s (kernel start included)")
    return values
