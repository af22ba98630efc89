"""Check a lesson's sources against the course's rules, in seconds, without running a kernel.

``python -m grader check-sources`` lists every broken rule (exit 1), each as
``<lesson>: <cell or file>: <what is wrong and what to do>``, or says the sources are fine.
CONTRIBUTING.md states the same rules for people; each has a test in tests/test_sources.py.

The files of a lesson NN_topic:

- its notebook is ``solutions/NN_topic/NN_topic.ipynb`` (folder and file named alike, two digits
  first, one lesson per number); anything else in solutions/ is skipped by every tool;
- ``grader/lessons/lNN_topic.py`` holds its graded functions' ``EXERCISES`` and imports only
  ``grader.harness``, ``grader.lessons._common`` and earlier lessons;
- ``notebooks/NN_topic/NN_topic.ipynb``, the student version, has the solution's cells in the same
  order, its plain cells unchanged (``python -m grader build`` after every change);
- docs/mistakes.md and attention_course/mistakes.json are what ``python -m grader.mistakes`` writes.

The solution notebook:

- the first cell is the lesson's title with the current badges and its total points
  (``**Points: N**``); the first code cell is the current Colab setup cell
  (``python -m grader.platforms apply`` writes both); no cell keeps outputs;
- every nbgrader cell has its grade id as cell id, unique in the lesson;
- an answer cell (*Autograded answer*) is ``exNN_<function>`` for a graded function of lesson NN,
  defines that function and no other, its model solution between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION``;
- a test cell (*Autograded tests*) is ``testNN_<function>_<aspect>`` (a check across the lesson,
  ``test07_capstone``, names its function in ``diagnosed`` alone), carries whole points above 0,
  opens with ``\"\"\"Check that ...\"\"\"``, and runs every visible line inside
  ``with diagnosed("<function>", <function>):`` (``diagnosed`` imported by a code cell above);
- a ``### BEGIN HIDDEN TESTS`` block is only in the cell ``testNN_<function>_hidden``, once, and holds
  ``import grader`` and ``grader.check("<function>", <function>)``; nothing else names ``grader``;
- every graded function of the lesson has an answer cell, a visible check and one hidden check;
- each heading that states points (``## 5. Exercise: `mix` (7 points)``) states the sum of the test
  cells in its section, and every test cell lies in such a section;
- the last cell, ``where-you-stand``, calls ``where_you_stand(...)`` with every graded function of the
  lesson in the order of their answer cells;
- every other code cell (but the Colab and setup cells) uses the lesson's graded functions only inside
  ``with demo(...)`` (or a function decorated ``@demo(...)``) naming each one it runs (``grader.demo_rule``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat

from grader import course
from grader.demo_rule import outside_demo

COLAB_MARK = "# @title Run me first on Google Colab"
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
HIDDEN_BLOCK = re.compile(r"### BEGIN HIDDEN TESTS\n.*?### END HIDDEN TESTS\n?", re.S)
POINTS = re.compile(r"\((\d+) points?\)")
HEADING = re.compile(r"^(#+) ", re.M)
LESSON_ID = re.compile(r"\d\d_\w+")
IMPORTS_GRADER = re.compile(r"^\s*(import\s+grader\b|from\s+grader\b)", re.M)
SUMMARY_ID = "where-you-stand"
BUILD = "run `python -m grader build` and commit notebooks/"


def _graded_functions(number: str) -> list[str]:
    """The graded functions whose reference lives in grader/lessons/l<number>_*.py."""
    from grader.registry import exercises, lesson_of

    return [name for name in exercises() if lesson_of(name) == number]


def _nbgrader(cell: nbformat.NotebookNode) -> dict:
    return cell.metadata.get("nbgrader", {}) or {}


def _points(cell: nbformat.NotebookNode) -> float:
    meta = _nbgrader(cell)
    return (meta.get("points", 0) or 0) if meta.get("grade") else 0


def _sections(nb: nbformat.NotebookNode) -> list[tuple[str, int, list[int]]]:
    """Each heading that states points: (heading, points stated, indices of the cells in its section)."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            level, stated = HEADING.match(line), POINTS.search(line)
            if not (level and stated):
                continue
            depth, inside = len(level.group(1)), []
            for j in range(i + 1, len(nb.cells)):
                later = nb.cells[j]
                heads = HEADING.findall(later.source) if later.cell_type == "markdown" else []
                if any(len(h) <= depth for h in heads):
                    break
                inside.append(j)
            found.append((line.strip(), int(stated.group(1)), inside))
    return found


def _section_points(nb: nbformat.NotebookNode) -> list[tuple[str, int, int]]:
    """Each heading that states points: (heading, points stated, points of the test cells under it)."""
    return [
        (heading, stated, int(sum(_points(nb.cells[j]) for j in inside)))
        for heading, stated, inside in _sections(nb)
    ]


def _parse(source: str) -> ast.Module | None:
    """A code cell's Python (IPython magics and shell lines blanked: lines keep their numbers), or None."""
    lines = ["" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _names_grader(source: str) -> bool:
    """Whether code imports or uses ``grader`` (by its imports and names, not its comments or strings)."""
    tree = _parse(source)
    if tree is None:
        return bool(IMPORTS_GRADER.search(source))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "grader" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "grader":
            return True
        if isinstance(node, ast.Name) and node.id == "grader":
            return True
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", "")) in ("__import__", "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).split(".")[0] == "grader"
        ):
            return True
    return False


def _diagnosed_name(statement: ast.stmt) -> tuple[str, str] | None:
    """``("mix", "mix")`` for ``with diagnosed("mix", mix):``, else None."""
    if not (isinstance(statement, ast.With) and len(statement.items) == 1):
        return None
    call = statement.items[0].context_expr
    if not (
        isinstance(call, ast.Call) and getattr(call.func, "id", None) == "diagnosed" and len(call.args) == 2
    ):
        return None
    first, second = call.args
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and isinstance(second, ast.Name):
        return first.value, second.id
    return None


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def _visible_lines(gid: str, name: str, source: str) -> list[str]:
    """What is wrong with how a test cell's visible lines run (empty: all inside ``diagnosed``)."""
    tree = _parse(HIDDEN_BLOCK.sub("", source))
    if tree is None:
        return ["its visible lines are not valid Python"]
    body = tree.body[1:] if tree.body and _is_docstring(tree.body[0]) else tree.body
    wrong = []
    block = f'`with diagnosed("{name}", {name}):`'
    for statement in body:
        found = _diagnosed_name(statement)
        if found is None:
            wrong.append(
                f"line {statement.lineno} runs outside {block}: put every visible check of {name} inside "
                "that block, so that a student's session reports the failure, names the mistake and runs on"
            )
        elif found != (name, name):
            wrong.append(
                f'diagnosed("{found[0]}", {found[1]}) should be diagnosed("{name}", {name}): '
                f"the cell checks {name}"
            )
    return wrong


def _example_cells(nb: nbformat.NotebookNode) -> list[tuple[str, ast.Module]]:
    """The code cells that are not answer, test, Colab or setup cells (the first importing the checks), parsed."""
    found, setup = [], False
    for cell in nb.cells:
        meta = _nbgrader(cell)
        if cell.cell_type != "code" or meta.get("solution") or meta.get("grade") or COLAB_MARK in cell.source:
            continue
        if not setup and "from attention_course.checks import" in cell.source:
            setup = True
        elif (tree := _parse(cell.source)) is not None:
            found.append((str(cell.get("id", "?")), tree))
    return found


def _hidden_calls(block: str) -> list[tuple[str, str]]:
    """The ``grader.check("<name>", <fn>)`` calls of a hidden block."""
    return re.findall(r"grader\.check\(\s*[\"'](\w+)[\"']\s*,\s*(\w+)\s*\)", block)


def check_lesson(path: Path) -> list[str]:
    """The rules a solution notebook breaks (empty: none)."""
    lesson = path.stem
    number = lesson[:2]
    nb = nbformat.read(path, as_version=4)
    problems: list[str] = []

    def problem(where: str, what: str) -> None:
        problems.append(f"{lesson}: {where}: {what}")

    try:
        functions = _graded_functions(number)
    except Exception as error:  # a lesson module that does not import, or a function defined twice
        problem("grader/lessons", f"the lesson modules do not load ({error}): fix them first")
        functions = []

    total = sum(_points(c) for c in nb.cells)
    total = int(total) if float(total).is_integer() else total
    if (
        not nb.cells
        or nb.cells[0].cell_type != "markdown"
        or f"**Points: {total}**" not in nb.cells[0].source
    ):
        problem(
            "first cell", f"should be the title, showing '**Points: {total}**' (the sum of the test cells)"
        )
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not code or COLAB_MARK not in code[0].source:
        problem(
            "first code cell",
            "should be the Colab setup cell: run `python -m grader.platforms apply`, which writes it",
        )
    for cell in code:
        if cell.get("outputs") or cell.get("execution_count") is not None:
            problem(
                cell.get("id", "?"), "has outputs: clear them (Edit > Clear Outputs of All Cells) and save"
            )

    seen: set[str] = set()
    answered: list[str] = []
    visible: set[str] = set()
    hidden: dict[str, list[str]] = {}
    diagnosed_above = False
    for cell in nb.cells:
        meta = _nbgrader(cell)
        cid = str(cell.get("id", "?"))
        source = cell.source
        if cell.cell_type == "code":
            outside = HIDDEN_BLOCK.sub("", source)
            if _names_grader(outside):
                problem(
                    cid, "names grader outside a hidden test block: only `grader.check` in a hidden block may"
                )
        if "### BEGIN HIDDEN TESTS" in source or "### END HIDDEN TESTS" in source:
            if not meta.get("grade") or meta.get("solution"):
                problem(cid, "holds a hidden test block: only a test cell (Autograded tests) may")
        if ("### BEGIN SOLUTION" in source or "### END SOLUTION" in source) and not meta.get("solution"):
            problem(cid, "holds a solution block: only an answer cell (Autograded answer) may")
        if (
            cell.cell_type == "code"
            and "from attention_course.checks import" in source
            and "diagnosed" in source
        ):
            diagnosed_above = True
        if not meta:
            continue
        gid = str(meta.get("grade_id", ""))
        if gid in seen:
            problem(gid, "grade id used twice: give each nbgrader cell an id of its own")
        seen.add(gid)
        if cid != gid:
            problem(
                gid,
                f"cell id {cid!r} differs from the grade id: run `python -m grader check-sources --fix-ids`",
            )
        if not (meta.get("solution") or meta.get("grade")):
            continue
        if meta.get("solution"):
            name = gid.removeprefix(f"ex{number}_")
            if meta.get("grade") or meta.get("locked"):
                problem(gid, "should be an 'Autograded answer' cell (nbgrader's Create Assignment panel)")
            if not functions:
                problem(
                    gid,
                    f"lesson {number} has no graded function yet: write grader/lessons/l{lesson}.py "
                    "with its EXERCISES first (CONTRIBUTING.md, step 2)",
                )
                continue
            if not gid.startswith(f"ex{number}_") or name not in functions:
                problem(gid, f"an answer cell's id should be ex{number}_<function>, one of {functions}")
                continue
            defined = re.findall(r"^def (\w+)\(", source, re.M)
            if name not in defined:
                problem(gid, f"does not define {name}()")
            for other in defined:
                if other != name:
                    problem(gid, f"defines {other}() too: an answer cell defines its graded function alone")
            if not re.search(r"### BEGIN SOLUTION\n.*### END SOLUTION", source, re.S):
                problem(gid, "should hold the model solution between ### BEGIN SOLUTION and ### END SOLUTION")
            answered.append(name)
            continue
        if meta.get("solution") or not meta.get("locked"):
            problem(gid, "should be an 'Autograded tests' cell (nbgrader's Create Assignment panel)")
        points = meta.get("points")
        if (
            not (isinstance(points, int) or (isinstance(points, float) and points.is_integer()))
            or points <= 0
        ):
            problem(gid, f"should carry whole points above 0, not {points!r}")
        if not source.startswith('"""Check that'):
            problem(gid, 'should open with a """Check that ...""" docstring')
        if not re.fullmatch(rf"test{number}_\w+", gid):
            problem(
                gid, f"a test cell's id should start with test{number}_ (test{number}_<function>_<aspect>)"
            )
            continue
        if not functions:  # said at the answer cell: no grader module yet
            continue
        name = max((f for f in functions if gid.startswith(f"test{number}_{f}_")), key=len, default=None)
        tree = _parse(HIDDEN_BLOCK.sub("", source))
        blocks_named = [found for s in (tree.body if tree else []) if (found := _diagnosed_name(s))]
        if name is None:  # a check across the lesson (test07_capstone): the function its diagnosed names
            named = {found[0] for found in blocks_named}
            name = named.pop() if len(named) == 1 and named <= set(functions) else None
        if name is None:
            problem(
                gid,
                f"a test cell's id should be test{number}_<function>_<aspect>, <function> one of {functions} "
                "(or its visible lines run inside `with diagnosed(...)` of one of them)",
            )
            continue
        if not diagnosed_above:
            problem(
                gid,
                "uses diagnosed before any cell imports it: `from attention_course.checks import diagnosed`",
            )
            diagnosed_above = True  # said once
        for what in _visible_lines(gid, name, source):
            problem(gid, what)
        if blocks_named:
            visible.add(name)
        blocks = HIDDEN.findall(source)
        if source.count("### BEGIN HIDDEN TESTS") != len(blocks) or source.count(
            "### END HIDDEN TESTS"
        ) != len(blocks):
            problem(gid, "a ### BEGIN HIDDEN TESTS without its ### END HIDDEN TESTS (or the other way round)")
        if not blocks:
            continue
        if gid != f"test{number}_{name}_hidden" or len(blocks) > 1:
            problem(gid, f"the hidden check of {name} is one block, in the cell test{number}_{name}_hidden")
        calls = [c for block in blocks for c in _hidden_calls(block)]
        if (name, name) in calls:
            hidden.setdefault(name, []).append(gid)
        else:
            problem(
                gid, f'its hidden block should call grader.check("{name}", {name}) (after `import grader`)'
            )
        for called in calls:
            if called != (name, name):
                problem(gid, f'grader.check("{called[0]}", {called[1]}) in the hidden check of {name}')
    for name in functions:
        if name not in answered:
            problem(name, f"no answer cell ex{number}_{name}")
        if name not in visible:
            problem(
                name, f"no visible check (a test{number}_{name}_* cell with a `with diagnosed(...)` block)"
            )
        if name not in hidden:
            problem(name, f'no hidden check calling grader.check("{name}", {name})')
        elif len(hidden[name]) > 1:
            problem(name, f"hidden checks in {hidden[name]}: keep one, test{number}_{name}_hidden")

    for cell_id, what in outside_demo(_example_cells(nb), functions):
        problem(cell_id, what)

    covered = {j for _, _, inside in _sections(nb) for j in inside}
    for heading, stated, counted in _section_points(nb):
        if stated != counted:
            problem(heading, f"states {stated} points, its test cells carry {counted}: make them agree")
    for j, cell in enumerate(nb.cells):
        if _nbgrader(cell).get("grade") and j not in covered:
            problem(
                cell.get("id", "?"),
                "lies under no heading that states points: put it in its exercise's section, "
                "whose heading says `(N points)`",
            )

    last = nb.cells[-1] if nb.cells else None
    wanted = ", ".join(f'"{name}"' for name in answered)
    if last is None or last.get("id") != SUMMARY_ID or last.cell_type != "code":
        problem(
            "last cell",
            f"should be the code cell {SUMMARY_ID!r}: `from attention_course.checks import where_you_stand` "
            f"and `where_you_stand({wanted})` (copy it from another lesson)",
        )
    else:
        tree = _parse(last.source)
        calls = [
            node
            for node in ast.walk(tree or ast.Module(body=[], type_ignores=[]))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "where_you_stand"
        ]
        listed = [a.value for a in calls[0].args if isinstance(a, ast.Constant)] if calls else None
        if functions and listed != answered:
            problem(
                SUMMARY_ID,
                f"should call where_you_stand({wanted}): every graded function, in the order of the answer cells",
            )
    return problems


def _lesson_module_problems(lesson: str, module: Path) -> list[str]:
    """A lesson module's imports of grader: only the harness, _common and earlier lessons."""
    number = lesson[:2]
    problems = []
    tree = ast.parse(module.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            if not (name == "grader" or name.startswith("grader.")):
                continue
            earlier = re.fullmatch(r"grader\.lessons\.l(\d\d)_\w+", name)
            if name in ("grader.harness", "grader.lessons._common") or (
                earlier and earlier.group(1) < number
            ):
                continue
            problems.append(
                f"{lesson}: grader/lessons/{module.name}: imports {name}; a lesson module imports only "
                "grader.harness, grader.lessons._common and earlier lessons"
            )
    return problems


def _student_version_problems(root: Path, lesson: str, solution: Path) -> list[str]:
    """The student version exists and has the solution's cells, in order, its plain cells unchanged."""
    path = root / "notebooks" / lesson / f"{lesson}.ipynb"
    if not path.is_file():
        return [f"{lesson}: notebooks/{lesson}/{lesson}.ipynb: missing: {BUILD}"]
    student = nbformat.read(path, as_version=4)
    mine = nbformat.read(solution, as_version=4)
    if [c.get("id") for c in student.cells] != [c.get("id") for c in mine.cells]:
        return [f"{lesson}: notebooks/{lesson}/{lesson}.ipynb: its cells are not the solution's: {BUILD}"]
    for theirs, ours in zip(student.cells, mine.cells):
        if not _nbgrader(ours) and (theirs.source != ours.source or theirs.cell_type != ours.cell_type):
            return [f"{lesson}: notebooks/{lesson}/{lesson}.ipynb: cell {ours.get('id')} is stale: {BUILD}"]
    return []


def _platform_problems(root: Path, lesson: str, solution: Path) -> list[str]:
    """The title carries the current badges, the first code cell is the current Colab setup cell."""
    from grader import platforms

    try:
        s = platforms.settings(root)
    except (OSError, KeyError):  # a folder without the course's pyproject.toml: the course's own setting
        s = platforms.settings()
    nb = nbformat.read(solution, as_version=4)
    title = nb.cells[0].source if nb.cells and nb.cells[0].cell_type == "markdown" else ""
    first_code = next((c for c in nb.cells if c.cell_type == "code"), None)
    fix = "run `python -m grader.platforms apply`"
    found = []
    if platforms.badges(s, lesson) not in title:
        found.append(f"{lesson}: first cell: lacks the current Colab and Binder badges: {fix}")
    if (
        first_code is not None
        and COLAB_MARK in first_code.source
        and first_code.source != platforms.setup_cell_source(s)
    ):
        found.append(f"{lesson}: first code cell: is not the current Colab setup cell: {fix}")
    return found


def _mistakes_problems(root: Path) -> list[str]:
    """docs/mistakes.md and attention_course/mistakes.json (where root has them) are current."""
    from grader import mistakes

    files = {
        root / "docs" / "mistakes.md": mistakes.markdown,
        root / "attention_course" / "mistakes.json": mistakes.json_text,
    }
    found = []
    for path, make in files.items():
        if path.exists() and not mistakes.current(path.read_text(), make()):
            found.append(
                f"course: {path.relative_to(root).as_posix()}: out of date: run `python -m grader.mistakes`"
            )
    return found


def _misplaced(root: Path) -> list[str]:
    """Notebooks in solutions/ that no tool sees as a lesson, and lesson numbers used twice."""
    found = []
    for path in sorted((root / "solutions").glob("*/*.ipynb")):
        folder = path.parent.name
        if path.stem != folder or not LESSON_ID.fullmatch(folder):
            found.append(
                f"{folder}: solutions/{folder}/{path.name}: a lesson is solutions/NN_topic/NN_topic.ipynb "
                "(two digits, folder and file named alike): every tool skips this notebook"
            )
    numbers: dict[str, list[str]] = {}
    for lesson in course.lessons(root):
        numbers.setdefault(lesson[:2], []).append(lesson)
    for number, lessons in numbers.items():
        if len(lessons) > 1:
            found.append(
                f"{lessons[1]}: folder: lesson number {number} is used by {lessons}: one lesson per number"
            )
    return found


def check_sources(root: Path = course.ROOT, only: list[str] | None = None) -> list[str]:
    """Every rule broken by any lesson in ``root`` (or only the lessons ``only``), and by the course's generated files."""
    problems = _misplaced(root)
    modules = root / "grader" / "lessons"
    modules = modules if modules.is_dir() else course.ROOT / "grader" / "lessons"
    for lesson in course.lessons(root):
        if only and lesson not in only:
            continue
        solution = root / "solutions" / lesson / f"{lesson}.ipynb"
        module = modules / f"l{lesson}.py"
        if not module.exists():
            problems.append(
                f"{lesson}: grader/lessons/l{lesson}.py: missing: it holds the lesson's reference, cases, "
                "mistakes and EXERCISES (CONTRIBUTING.md, step 2)"
            )
        else:
            problems += _lesson_module_problems(lesson, module)
            if "EXERCISES" not in module.read_text():
                problems.append(
                    f"{lesson}: grader/lessons/l{lesson}.py: defines no EXERCISES: "
                    "end it with `EXERCISES = {ex.name: ex for ex in (...)}`"
                )
        problems += check_lesson(solution)
        problems += _platform_problems(root, lesson, solution)
        problems += _student_version_problems(root, lesson, solution)
    try:
        problems += _mistakes_problems(root)
    except Exception as error:  # the lesson modules do not load: check_lesson said so
        problems.append(f"course: docs/mistakes.md: could not be compared ({type(error).__name__}: {error})")
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
