"""Release: regenerate the student notebooks, pack the student bundle, and prove it clean.

The bundle is a zip with the student notebooks, ``data/``, the student helpers
(``attention_course/``), ``environment.yml``, a minimal ``pyproject.toml`` (so
``pip install -e .`` makes the helpers importable) and a student README. Before
it is kept, every file in it is checked: no solution code, no hidden test, no
reference code, no import of the grading package, nothing from ``grader/`` or
``solutions/``. Then it is checked by what it does: its helpers are imported on their
own (the grading package out of reach) and every callable in them is tried against
every hidden check; none may pass. A bundle that fails either check is not written.
"""

from __future__ import annotations

import ast
import io
import json
import pickle
import re
import tempfile
import time
import zipfile
from pathlib import Path

from grader import course
from grader.classroom import lessons
from grader.instructor.bundle_process import HELPERS, Bundle, Stand

BUNDLE_NAME = "attention-step-by-step"
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
GRADER_IMPORT = re.compile(
    r"(^|\n|;)\s*(import\s+grader\b|from\s+grader\b)|\bgrader\.(check|reference|harness|exercises|registry)\b"
)

STUDENT_PYPROJECT = """\
# The course helpers, installable with `pip install --no-deps -e .` (the lessons import them).
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "attention-course-helpers"
version = "{version}"
requires-python = ">=3.11"

[tool.setuptools.packages.find]
include = ["attention_course*"]
"""


def _version() -> str:
    text = (course.ROOT / "pyproject.toml").read_text()
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    return m.group(1) if m else "0"


def student_readme(notebooks_dir: Path) -> str:
    template = (Path(__file__).parent / "STUDENT_README.md").read_text()
    rows = []
    for lesson_id in course.lessons():
        path = notebooks_dir / lesson_id / f"{lesson_id}.ipynb"
        if not path.exists():
            continue
        num, topic = lesson_id.split("_", 1)
        points = lessons.lesson(lesson_id).max_score
        rows.append(
            f"| {num} | [{topic.replace('_', ' ')}](notebooks/{lesson_id}/{lesson_id}.ipynb) | {points:g} |"
        )
    return template.format(title="Attention, step by step", lessons="\n".join(rows))


def bundle_files(notebooks_dir: Path) -> dict[str, bytes]:
    """Every file of the student bundle: path inside the zip -> bytes."""
    root = course.ROOT
    files: dict[str, bytes] = {}
    for lesson_id in course.lessons():
        nb = notebooks_dir / lesson_id / f"{lesson_id}.ipynb"
        if nb.exists():
            for path in sorted(nb.parent.rglob("*")):
                if path.is_file() and ".ipynb_checkpoints" not in path.parts:
                    files[f"notebooks/{lesson_id}/{path.relative_to(nb.parent).as_posix()}"] = (
                        path.read_bytes()
                    )
    for folder in ("data", "attention_course"):
        for path in sorted((root / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
                continue
            if ".ipynb_checkpoints" in path.parts:
                continue
            files[f"{folder}/{path.relative_to(root / folder).as_posix()}"] = path.read_bytes()
    files["environment.yml"] = (root / "environment.yml").read_bytes()
    files["pyproject.toml"] = STUDENT_PYPROJECT.format(version=_version()).encode()
    files["README.md"] = student_readme(notebooks_dir).encode()
    return {f"{BUNDLE_NAME}/{k}": v for k, v in files.items()}


# ------------------------------------------------------------------ proving it clean


def _reference_functions() -> dict[str, list[str]]:
    """Each reference function's body lines (no docstring, comments or blanks)."""
    out: dict[str, list[str]] = {}
    for path in sorted((course.ROOT / "grader" / "lessons").glob("l*.py")):
        out.update(_functions_of(path))
    return out


def _functions_of(path: Path) -> dict[str, list[str]]:
    src = path.read_text()
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return {}
    out = {}
    lines = src.splitlines()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
            ):
                body = body[1:]
            if not body:
                continue
            text = lines[body[0].lineno - 1 : node.end_lineno]
            kept = [ln.strip() for ln in text if ln.strip() and not ln.strip().startswith("#")]
            if kept:
                out[f"{path.stem}.{node.name}"] = kept
    return out


def _text(name: str, data: bytes) -> str:
    """What a reader of the file would see: every cell source and output of a notebook."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    if name.endswith(".ipynb"):
        try:
            nb = json.loads(text)
        except ValueError:
            return text
        parts = []
        for cell in nb.get("cells", []):
            src = cell.get("source", "")
            parts.append("".join(src) if isinstance(src, list) else src)
            for out in cell.get("outputs", []):
                parts.append(json.dumps(out))
        return "\n".join(parts)
    return text


def check_bundle(files: dict[str, bytes]) -> list[str]:
    """Problems that make a bundle unfit for students (empty: it is clean)."""
    problems = []
    for name in files:
        parts = name.split("/")
        if "grader" in parts or "solutions" in parts or "_grading" in parts:
            problems.append(f"{name}: comes from an instructor-only folder")
        if "gradebook" in name.lower() or name.endswith((".pyc", ".db")):
            problems.append(f"{name}: instructor or build file")
    reference = _reference_functions()
    texts = {name: _text(name, data) for name, data in files.items()}
    for name, text in texts.items():
        for marker in MARKERS:
            if marker in text:
                problems.append(f"{name}: contains {marker!r}")
        if GRADER_IMPORT.search(text):
            problems.append(f"{name}: imports or calls the grading package")
        code_lines = {ln.strip() for ln in text.splitlines()}
        for fn, body in reference.items():
            if len(body) >= 2 and all(line in code_lines for line in body):
                problems.append(f"{name}: contains the reference code of {fn}")
    for les in lessons.all_lessons():
        hidden = set(les.hidden_lines())
        sols = {c.grade_id: c for c in les.cells if c.kind == "solution"}
        nb_name = next((n for n in files if n.endswith(f"notebooks/{les.id}/{les.id}.ipynb")), None)
        if nb_name is None:
            continue
        nb = json.loads(files[nb_name])
        student_lines = set()
        for cell in nb.get("cells", []):
            src = cell.get("source", "")
            src = "".join(src) if isinstance(src, list) else src
            student_lines.update(ln.strip() for ln in src.splitlines())
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid in sols:
                for block in lessons.SOLUTION_BLOCK.findall(sols[gid].source):
                    for line in block.splitlines():
                        s = line.strip()
                        if s and not s.startswith("#") and s in {ln.strip() for ln in src.splitlines()}:
                            problems.append(f"{nb_name}: solution line {s!r} of {gid}")
        visible = set()
        for c in les.tests:
            visible.update(ln.strip() for ln in lessons.HIDDEN_BLOCK.sub("", c.source).splitlines())
        for line in hidden - visible:
            if line in student_lines:
                problems.append(f"{nb_name}: hidden test line {line!r}")
    return problems


def make_bundle(
    notebooks_dir: Path, out: Path, timings: dict[str, float] | None = None
) -> tuple[Path | None, list[str]]:
    """Write the bundle to ``out`` if it is clean; return (path or None, problems).

    Clean: its files pass :func:`check_bundle`, and no callable of its helpers passes a
    hidden check (:func:`answers_in`).
    """
    files = bundle_files(notebooks_dir)
    problems = check_bundle(files)
    problems += answers_in(files, timings)
    if problems:
        return None, problems
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, files[name])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(buf.getvalue())
    return out, []


def release(
    out: Path | None = None, notebooks_dir: Path | None = None, build: bool = True
) -> tuple[Path | None, list[str], list[Path]]:
    """Regenerate the student notebooks (unless ``build`` is False), then pack and check the bundle.

    Returns (bundle path or None, problems, notebooks written).
    """
    notebooks_dir = notebooks_dir or course.ROOT / "notebooks"
    written: list[Path] = []
    if build:
        release_dir = None if notebooks_dir == course.ROOT / "notebooks" else notebooks_dir
        written = course.build_notebooks(release_dir=release_dir)
    out = out or course.work_dir() / "release" / f"{BUNDLE_NAME}.zip"
    path, problems = make_bundle(notebooks_dir, out)
    return path, problems, written


# ------------------------------------------------------------------ proving it holds no answer


def _fingerprint(x: object) -> object:
    """A hashable summary of a case's arguments, to run each reference once per case."""
    import torch

    if isinstance(x, torch.Tensor):
        t = x.detach().as_subclass(torch.Tensor)
        body = (
            t.cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            if t.device.type != "meta"
            else b""
        )
        return ("tensor", tuple(t.shape), str(t.dtype), str(t.device), hash(body))
    if isinstance(x, torch.Generator):
        return ("generator", hash(x.get_state().numpy().tobytes()))
    if isinstance(x, dict):
        return ("dict", tuple((k, _fingerprint(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_fingerprint(v) for v in x))
    return ("value", repr(x))


def _remembered(ex):
    """The exercise with its cases made once and its reference run once per case."""
    import dataclasses

    import torch

    made: dict[str, list] = {}
    results: dict[object, object] = {}
    reference = ex.reference

    def cases(device):
        key = str(device)
        if key not in made:
            made[key] = ex.cases(torch.device(device))
        return made[key]

    def remember(fn):
        if fn is None:
            return None

        def remembered(*args, **kwargs):
            key = (id(fn), _fingerprint((args, kwargs)))
            if key not in results:
                results[key] = fn(*args, **kwargs)
            return results[key]

        return remembered

    # no traps: a callable that fails is no answer, whatever its mistake is called
    return dataclasses.replace(
        ex, cases=cases, reference=remember(reference), expected=remember(ex.expected), traps=()
    )


def _first_case_passes(ex, reply: dict) -> bool:
    """Whether a callable's reply on the exercise's first CPU case is what the reference gives there."""
    from grader.harness import compare_outputs, placement_problem, run_reference

    if "error" in reply:
        return False
    case = ex.cases("cpu")[0]
    expected = run_reference(ex, case)
    if expected.failed:
        return True  # cannot tell here: the full check decides
    compare = ex.compare or (lambda e, g, w: compare_outputs(e, g, ex.name, ex.output_names, ex.tolerances))
    try:
        value = reply["value"]
        return not (
            placement_problem(ex, case, expected.value, value) or compare(expected.value, value, case.label)
        )
    except Exception:  # noqa: BLE001 - a comparison that breaks on this value: not the answer
        return False


def unpack(files: dict[str, bytes], into: Path) -> Path:
    """Write the bundle's files under ``into``; return the bundle's root folder."""
    for name, data in files.items():
        path = into / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return into / BUNDLE_NAME


def answers_in(files: dict[str, bytes], timings: dict[str, float] | None = None) -> list[str]:
    """Every callable of the bundle's helpers that passes a hidden check (empty: none does).

    The bundle is unpacked to a temporary folder and its helpers imported in a process
    where the grading package cannot be imported; every callable reachable from them
    (module functions, classes and their methods, partials, functions kept in dicts,
    lists or defaults, nested functions) is tried against the hidden check of every
    graded exercise, on the CPU.
    """
    from grader.harness import check_exercise
    from grader.registry import exercises

    start = time.perf_counter()
    checks = {name: _remembered(ex) for name, ex in exercises().items()}
    with tempfile.TemporaryDirectory(prefix="bundle-proof-") as tmp:
        root = unpack(files, Path(tmp) / "unpacked")
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        bundle = Bundle(root, scratch)
        try:
            try:
                bundle.start()
            except (TimeoutError, EOFError, OSError, pickle.PickleError) as e:
                return [
                    f"{HELPERS}: the bundle's helpers could not be loaded on their own ({type(e).__name__}: {e})"
                ]
            problems = list(bundle.problems)
            if not bundle.labels:
                problems.append(f"{HELPERS}: no callable found in the bundle's helpers (was it packed?)")
            names = [n for n, ex in checks.items() if ex.cases("cpu")]
            firsts = [(checks[n].cases("cpu")[0].args, checks[n].cases("cpu")[0].kwargs) for n in names]
            for index, label in enumerate(list(bundle.labels)):
                # one round trip per callable: every exercise's first case; the full check only
                # for an exercise whose first case it gets right (an answer must pass every case)
                try:
                    replies = bundle.batch(index, firsts)
                    suspects = [n for n, r in zip(names, replies) if _first_case_passes(checks[n], r)]
                except RuntimeError:
                    suspects = names
                for name in suspects:
                    try:
                        check_exercise(checks[name], Stand(bundle, index), on=["cpu"])
                    except Exception:  # noqa: BLE001 - any failure: not an answer
                        continue
                    problems.append(
                        f"{label} passes the hidden check of {name}: the student helpers must hold no answer"
                    )
        finally:
            bundle.close()
    if timings is not None:
        timings.update(
            seconds=time.perf_counter() - start,
            callables=len(bundle.labels),
            checks=len(checks),
            restarts=bundle.restarts,
        )
    return problems
