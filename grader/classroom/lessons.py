"""What the tools need to know about a lesson, read from its instructor source notebook."""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from grader import course

CHECK_CALL = re.compile(r"grader\.check\(\s*[\"'](\w+)[\"']\s*,\s*(\w+)\s*\)")
# the block and the newline after it, as nbgrader removes it (so a student view matches exactly)
HIDDEN_BLOCK = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS\n?", re.S)
SOLUTION_BLOCK = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)


@dataclass
class Cell:
    id: str
    kind: str  # "context", "solution" or "test"
    source: str
    grade_id: str | None = None
    points: float = 0.0


@dataclass
class ReleaseCell:
    """A cell the release gives an nbgrader role (test, answer, locked text), as the gradebook records it."""

    name: str  # its grade id
    cell_type: str
    source: str
    grade: bool = False
    solution: bool = False
    locked: bool = False
    task: bool = False
    points: float = 0.0

    @property
    def is_test(self) -> bool:
        return self.grade and not self.solution

    @property
    def student_source(self) -> str:
        """The source as students receive it (hidden blocks removed)."""
        return HIDDEN_BLOCK.sub("", self.source)

    def metadata(self) -> dict:
        """The cell's nbgrader metadata as released."""
        meta = {
            "cell_type": self.cell_type,
            "grade": self.grade,
            "grade_id": self.name,
            "locked": self.locked,
            "schema_version": 3,
            "solution": self.solution,
            "task": self.task,
        }
        if self.grade or self.task:
            meta["points"] = self.points
        return meta


@dataclass
class Lesson:
    """A lesson's source cells, graded names, test cells and hidden lines."""

    id: str
    path: Path
    cells: list[Cell]
    graded_names: list[str]
    digest: str
    checks: dict[str, str] = field(default_factory=dict)  # test grade id -> exercise it checks
    release: list[ReleaseCell] = field(default_factory=list)  # every cell with an nbgrader role, in order
    kernel: str = "python3"  # the kernel it asks for (its kernelspec's name)
    imports: tuple[str, ...] = ()  # the modules its code cells import at their top level

    @property
    def tests(self) -> list[Cell]:
        return [c for c in self.cells if c.kind == "test"]

    @property
    def max_score(self) -> float:
        return sum(c.points for c in self.tests)

    def hidden_lines(self) -> list[str]:
        """Every non-blank line of every hidden-test block (what must never reach a student)."""
        lines = []
        for cell in self.tests:
            for block in HIDDEN_BLOCK.findall(cell.source):
                lines += [ln.strip() for ln in block.splitlines() if ln.strip()]
        return lines

    def exercise_of(self, grade_id: str) -> str:
        """The function a test cell is about (``test01_project_values`` -> ``project``)."""
        if grade_id in self.checks:
            return self.checks[grade_id]
        m = re.match(r"test\d+_(\w+)$", grade_id)
        stem = m.group(1) if m else grade_id
        for name in sorted(self.graded_names, key=len, reverse=True):
            if stem == name or stem.startswith(name + "_"):
                return name
        return stem.rsplit("_", 1)[0] if "_" in stem else stem


def _top_level_names(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return re.findall(r"^def (\w+)", source, re.M)
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    names.append(t.id)
    return names


def _imports(source: str) -> list[str]:
    """The modules a cell imports at its top level (``import a.b``, ``from a.b import c``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython syntax: the lesson's plain cells say enough
        return []
    found = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
    return found


def _read(path: Path) -> Lesson:
    import nbformat  # here: a grading run's coordinator starts its workers before it reads a lesson

    raw = path.read_bytes()
    nb = nbformat.reads(raw.decode(), as_version=4)
    cells, names, checks, release, imports = [], [], {}, [], []
    for i, c in enumerate(nb.cells):
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade_id") and (meta.get("grade") or meta.get("solution") or meta.get("locked")):
            release.append(
                ReleaseCell(
                    name=meta["grade_id"],
                    cell_type=c.cell_type,
                    source=c.source,
                    grade=bool(meta.get("grade")),
                    solution=bool(meta.get("solution")),
                    locked=bool(meta.get("locked")),
                    task=bool(meta.get("task")),
                    points=float(meta.get("points", 0) or 0),
                )
            )
        if c.cell_type != "code":
            continue
        imports += [m for m in _imports(HIDDEN_BLOCK.sub("", c.source)) if m not in imports]
        if meta.get("solution"):
            kind = "solution"
            names += [n for n in _top_level_names(c.source) if n not in names]
        elif meta.get("grade"):
            kind = "test"
        else:
            kind = "context"
        cell = Cell(
            id=c.get("id") or f"cell-{i}",
            kind=kind,
            source=c.source,
            grade_id=meta.get("grade_id"),
            points=float(meta.get("points", 0) or 0),
        )
        cells.append(cell)
        if kind == "test":
            m = CHECK_CALL.search(c.source)
            if m:
                checks[cell.grade_id] = m.group(2)
    kernel = (nb.metadata.get("kernelspec") or {}).get("name") or "python3"
    return Lesson(
        path.parent.name, path, cells, names, _digest_of(raw), checks, release, kernel, tuple(imports)
    )


@cache
def _cached(path: str, mtime: float) -> Lesson:
    return _read(Path(path))


def _path(lesson_id: str, root: Path) -> Path:
    return root / "solutions" / lesson_id / f"{lesson_id}.ipynb"


def lesson(lesson_id: str, root: Path = course.ROOT) -> Lesson:
    """The lesson ``lesson_id`` as its solutions/ notebook has it now."""
    path = _path(lesson_id, root)
    return _cached(str(path), path.stat().st_mtime)


def _digest_of(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:16]


def digest(lesson_id: str, root: Path = course.ROOT) -> str:
    """``lesson(lesson_id).digest`` without parsing the notebook."""
    return _digest_of(_path(lesson_id, root).read_bytes())


def all_lessons(root: Path = course.ROOT) -> list[Lesson]:
    return [lesson(name, root) for name in course.lessons(root)]


def lesson_of_grade_ids(grade_ids: set[str], root: Path = course.ROOT) -> str | None:
    """The lesson whose grade ids a notebook carries most of (to recognise a renamed file)."""
    best, best_n = None, 0
    for les in all_lessons(root):
        ids = {c.grade_id for c in les.cells if c.grade_id}
        n = len(ids & grade_ids)
        if n > best_n:
            best, best_n = les.id, n
    return best


def answered(lesson_id: str, root: Path = course.ROOT) -> bytes:
    """The student notebook of a lesson with every answer cell holding the lesson's own solution:
    what a grading run first grades, to prove it can grade (``grading.prove``)."""
    import nbformat

    les = lesson(lesson_id, root)
    markers = re.compile(r"^\s*### (BEGIN|END) SOLUTION\n?", re.M)
    answers = {c.grade_id: markers.sub("", c.source) for c in les.cells if c.kind == "solution"}
    nb = nbformat.read(root / "notebooks" / lesson_id / f"{lesson_id}.ipynb", as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nbformat.writes(nb).encode()
