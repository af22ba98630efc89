"""Check solutions/ against the course's rules for a lesson's source notebook.

``python -m grader check-sources`` lists every problem (exit 1) or says the sources are fine:

- the first cell is the lesson's title and shows its total points (``**Points: N**``); the first
  code cell is the Colab setup cell;
- every nbgrader cell has a grade id equal to its cell id, unique in the lesson; an answer cell is
  ``exNN_<function>`` for a graded function of lesson NN (grader/lessons/lNN_*.py) and defines it;
  a test cell is ``testNN_<what>_<aspect>``, carries whole points above 0 and opens with
  ``\"\"\"Check that ...\"\"\"``;
- each heading that states points (``## 5. Exercise: `mix` (7 points)``) states the sum of the
  test cells in its section;
- every graded function of the lesson has an answer cell, at least one visible check, and one
  hidden check: a test cell whose ``### BEGIN HIDDEN TESTS`` block calls
  ``grader.check("<function>", <function>)``.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

from grader import course

COLAB_MARK = "# @title Run me first on Google Colab"
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
POINTS = re.compile(r"\((\d+) points?\)")
HEADING = re.compile(r"^(#+) ", re.M)


def _graded_functions(number: str) -> list[str]:
    """The graded functions whose reference lives in grader/lessons/l<number>_*.py."""
    from grader.registry import exercises, lesson_of

    return [name for name in exercises() if lesson_of(name) == number]


def _section_points(nb: nbformat.NotebookNode) -> list[tuple[str, int, int]]:
    """Each heading that states points: (heading, points stated, points of the test cells under it)."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            level, stated = HEADING.match(line), POINTS.search(line)
            if not (level and stated):
                continue
            depth, total = len(level.group(1)), 0
            for later in nb.cells[i + 1 :]:
                heads = HEADING.findall(later.source) if later.cell_type == "markdown" else []
                if any(len(h) <= depth for h in heads):
                    break
                total += later.metadata.get("nbgrader", {}).get("points", 0) or 0
            found.append((line.strip(), int(stated.group(1)), total))
    return found


def check_lesson(path: Path) -> list[str]:
    """The rules a solution notebook breaks (empty: none)."""
    lesson = path.stem
    number = lesson[:2]
    nb = nbformat.read(path, as_version=4)
    problems: list[str] = []

    def problem(where: str, what: str) -> None:
        problems.append(f"{lesson}: {where}: {what}")

    total = sum(c.metadata.get("nbgrader", {}).get("points", 0) or 0 for c in nb.cells)
    if (
        not nb.cells
        or nb.cells[0].cell_type != "markdown"
        or f"**Points: {total}**" not in nb.cells[0].source
    ):
        problem("first cell", f"should be the title, showing '**Points: {total}**'")
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not code or COLAB_MARK not in code[0].source:
        problem("first code cell", "should be the Colab setup cell (python -m grader.platforms apply)")

    functions = _graded_functions(number)
    seen: set[str] = set()
    answered, visible, hidden = set(), set(), set()
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if not meta or not (meta.get("solution") or meta.get("grade")):
            continue
        gid = str(meta.get("grade_id", ""))
        if gid in seen:
            problem(gid, "grade id used twice")
        seen.add(gid)
        if cell.get("id") != gid:
            problem(gid, f"cell id {cell.get('id')!r} differs from the grade id")
        if meta.get("solution"):
            name = gid.removeprefix(f"ex{number}_")
            if not gid.startswith(f"ex{number}_") or name not in functions:
                problem(gid, f"an answer cell's id should be ex{number}_<function>, one of {functions}")
            elif not re.search(rf"^def {name}\(", cell.source, re.M):
                problem(gid, f"does not define {name}()")
            answered.add(name)
            continue
        if not re.fullmatch(rf"test{number}_\w+", gid):
            problem(gid, f"a test cell's id should start with test{number}_")
        points = meta.get("points")
        if (
            not (isinstance(points, int) or (isinstance(points, float) and points.is_integer()))
            or points <= 0
        ):
            problem(gid, f"should carry whole points above 0, not {points!r}")
        if not cell.source.startswith('"""Check that'):
            problem(gid, 'should open with a """Check that ...""" docstring')
        name = max((f for f in functions if gid.startswith(f"test{number}_{f}_")), key=len, default=None)
        if name is None:
            continue
        block = HIDDEN.search(cell.source)
        if block and re.search(rf"grader\.check\(\s*[\"']{name}[\"']\s*,\s*{name}\s*\)", block.group(1)):
            hidden.add(name)
        elif not block:
            visible.add(name)
    for name in functions:
        if name not in answered:
            problem(name, f"no answer cell ex{number}_{name}")
        if name not in visible:
            problem(name, f"no visible check (a test{number}_{name}_* cell without hidden tests)")
        if name not in hidden:
            problem(name, f'no hidden check calling grader.check("{name}", {name})')
    for heading, stated, counted in _section_points(nb):
        if stated != counted:
            problem(heading, f"states {stated} points, its test cells carry {counted}")
    return problems


def check_sources(root: Path = course.ROOT) -> list[str]:
    """Every rule broken by any lesson in ``root``/solutions, and lessons without a grader module."""
    problems = []
    for lesson in course.lessons(root):
        problems += check_lesson(root / "solutions" / lesson / f"{lesson}.ipynb")
        if not (course.ROOT / "grader" / "lessons" / f"l{lesson}.py").exists():
            problems.append(f"{lesson}: no grader/lessons/l{lesson}.py (its reference, cases and mistakes)")
    return problems


def fix_cell_ids(root: Path = course.ROOT) -> list[str]:
    """Give every nbgrader cell of solutions/ its grade id as cell id (JupyterLab cannot edit cell ids)."""
    changed = []
    for lesson in course.lessons(root):
        path = root / "solutions" / lesson / f"{lesson}.ipynb"
        nb = nbformat.read(path, as_version=4)
        fixed = 0
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid and cell.get("id") != gid and not any(c.get("id") == gid for c in nb.cells):
                cell.id = gid
                fixed += 1
        if fixed:
            nbformat.write(nb, path)
            changed.append(f"{lesson}: {fixed} cell ids set to their grade ids")
    return changed
