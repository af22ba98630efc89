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
import inspect
import io
import json
import os
import pickle
import re
import select
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

from grader import course
from grader.classroom import lessons

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

HELPERS = "attention_course"
CALL_TIMEOUT = 20.0  # seconds one call into the bundle may take before it counts as a failure
WORKER_MEMORY = 4 << 30  # bytes of memory the bundle's process may use


def _bundle_worker() -> None:  # pragma: no cover - runs in the bundle's own process
    """Import the unpacked bundle's helpers with the grading package out of reach, then run calls.

    Reads length-prefixed pickles on the original stdin and answers on the original stdout
    in ``torch.save`` form (plain values and tensors only); everything the bundle prints
    goes nowhere. Uses the standard library and PyTorch only (its source is sent
    to ``python -I -c``), so nothing of the grading package is loaded here.
    """
    import functools
    import importlib
    import importlib.util
    import inspect
    import os
    import pickle
    import struct
    import sys
    import types
    from pathlib import Path

    rd, wr = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sys.stdin, sys.stdout, sys.stderr = open(os.devnull), open(os.devnull, "w"), open(os.devnull, "w")

    def recv():
        head = rd.read(8)
        if len(head) < 8:
            raise SystemExit(0)
        return pickle.loads(rd.read(struct.unpack("<Q", head)[0]))

    job = recv()
    spec = importlib.util.spec_from_file_location("_bundle_guard", job["guard"])
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    import io

    import torch

    def send(obj) -> None:  # in a form the other side reads with torch.load(weights_only=True)
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
        wr.write(struct.pack("<Q", len(data)) + data)
        wr.flush()

    for name in ("numpy", "matplotlib", "matplotlib.backends.backend_agg", "matplotlib.figure", "ipywidgets"):
        try:  # what the helpers use, loaded before the guard (which refuses native code loading)
            importlib.import_module(name)
        except ImportError:
            pass

    guard.limit_memory(job["memory"])  # a call with arguments it never expected may ask for a lot
    guard.forget_modules(("grader", job["package"]))
    sys.meta_path.insert(0, guard.BlockImports(("grader",)))
    guard.install(job["policy"])
    sys.path.insert(0, job["root"])
    package = job["package"]
    problems, found, seen = [], {}, set()

    modules = []
    for path in sorted((Path(job["root"]) / package).rglob("*.py")):
        parts = path.relative_to(job["root"]).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        try:
            modules.append(importlib.import_module(name))
        except BaseException as e:  # noqa: BLE001 - reported, never raised
            problems.append(f"{name} cannot be imported without the grading package: {type(e).__name__}: {e}")

    def ours(obj) -> bool:
        mod = getattr(obj, "__module__", None) or ""
        return mod == package or mod.startswith(package + ".")

    def add(label: str, obj) -> None:
        if callable(obj) and id(obj) not in found:
            found[id(obj)] = (label, obj)

    def nested(label: str, fn) -> None:
        """Functions defined inside fn that need no enclosing variables (a student could rebuild them)."""
        stack = [c for c in fn.__code__.co_consts if isinstance(c, types.CodeType)]
        while stack:
            code = stack.pop()
            stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
            if code.co_freevars or (code.co_name.startswith("<") and code.co_name != "<lambda>"):
                continue
            add(f"{label}.<locals>.{code.co_name}", types.FunctionType(code, fn.__globals__, code.co_name))

    def visit(label: str, obj, depth: int = 0, stored: bool = False) -> None:
        if depth > 8 or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, types.ModuleType):
            if obj.__name__.split(".")[0] == package:
                for k, v in list(vars(obj).items()):
                    if not (k.startswith("__") and k.endswith("__")):
                        visit(f"{obj.__name__}.{k}", v, depth + 1)
        elif isinstance(obj, type):
            if ours(obj):
                add(label, obj)
                for k, v in list(vars(obj).items()):
                    if isinstance(v, (staticmethod, classmethod)):
                        add(f"{label}.{k}", getattr(obj, k))
                        visit(f"{label}.{k}", v.__func__, depth + 1)
                    elif isinstance(v, property):
                        for part in (v.fget, v.fset, v.fdel):
                            if part is not None:
                                visit(f"{label}.{k}", part, depth + 1)
                    elif not (k.startswith("__") and k.endswith("__")) or isinstance(v, types.FunctionType):
                        visit(f"{label}.{k}", v, depth + 1)
        elif isinstance(obj, functools.partial):
            add(label, obj)
            visit(f"{label}.func", obj.func, depth + 1, stored=True)
            for i, a in enumerate(obj.args):
                visit(f"{label}.args[{i}]", a, depth + 1, stored=True)
            for k, a in obj.keywords.items():
                visit(f"{label}.keywords[{k!r}]", a, depth + 1, stored=True)
        elif isinstance(obj, types.FunctionType):
            if ours(obj) or stored:
                add(label, obj)
                nested(label, obj)
                for i, d in enumerate(obj.__defaults__ or ()):
                    visit(f"{label}.__defaults__[{i}]", d, depth + 1, stored=True)
                for k, d in (obj.__kwdefaults__ or {}).items():
                    visit(f"{label}.__kwdefaults__[{k!r}]", d, depth + 1, stored=True)
                for i, cell in enumerate(obj.__closure__ or ()):
                    try:
                        visit(f"{label}.__closure__[{i}]", cell.cell_contents, depth + 1, stored=True)
                    except ValueError:
                        pass
                if hasattr(obj, "__wrapped__"):
                    visit(f"{label}.__wrapped__", obj.__wrapped__, depth + 1, stored=True)
        elif isinstance(obj, dict):
            for k, v in list(obj.items()):
                visit(f"{label}[{k!r}]", v, depth + 1, stored=True)
                visit(f"{label}.key", k, depth + 1, stored=True)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for i, v in enumerate(list(obj)):
                visit(f"{label}[{i}]", v, depth + 1, stored=True)
        elif isinstance(obj, (types.MethodType, types.BuiltinFunctionType)):
            if stored or ours(getattr(obj, "__func__", None)):
                add(label, obj)
        elif ours(type(obj)):  # an instance of one of the bundle's classes
            add(label, obj)
            for k in dir(type(obj)):
                if isinstance(getattr(type(obj), k, None), types.FunctionType) and not k.startswith("__"):
                    add(f"{label}.{k}", getattr(obj, k))
            for k, v in list(getattr(obj, "__dict__", {}).items()):
                visit(f"{label}.{k}", v, depth + 1, stored=True)
        elif stored and callable(obj) and not isinstance(obj, type):
            add(label, obj)

    for module in modules:
        visit(module.__name__, module)
    table = list(found.values())
    send({"problems": problems, "labels": [label for label, _ in table]})

    def plain(x, depth: int = 0):
        """What a call returned, as values the grading side can read (anything else: a description)."""
        if isinstance(x, torch.Tensor):
            return x.detach().as_subclass(torch.Tensor)
        if x is None:
            return x
        for kind in (bool, int, float, str):
            if isinstance(x, kind):
                return kind(x)
        if depth < 6 and isinstance(x, dict):
            return {plain(k, depth + 1): plain(v, depth + 1) for k, v in x.items()}
        if depth < 6 and isinstance(x, (list, tuple)):
            items = [plain(v, depth + 1) for v in x]
            return items if isinstance(x, list) else tuple(items)
        return f"<{type(x).__name__} object>"

    answers = (tuple, list, dict, int, float, complex, str, bytes, torch.Tensor, torch.Generator)

    def makes_plain_instances(obj) -> bool:
        """A class whose call can only return an instance of itself, which is no tensor, number or container."""
        return (
            type(obj) is type
            and not issubclass(obj, answers)
            and all("__new__" not in vars(k) for k in obj.__mro__[:-1])
        )

    def run(obj, args, kwargs) -> dict:
        try:
            inspect.signature(obj).bind(*args, **kwargs)
        except TypeError as e:
            return {"error": ("TypeError", str(e))}
        except ValueError:  # no signature to read: just call it
            pass
        if isinstance(obj, type) and makes_plain_instances(obj):
            return {"value": f"<{obj.__name__} object>"}  # what the call would return, without its cost
        try:
            return {"value": plain(obj(*args, **kwargs))}
        except BaseException as e:  # noqa: BLE001 - the bundle's error is the answer, not a crash
            return {"error": (type(e).__name__, str(e)[:500])}

    def portable(reply: dict) -> dict:
        try:
            torch.save(reply, io.BytesIO())
            return reply
        except Exception as e:  # noqa: BLE001 - a result that cannot travel is not an answer
            return {"error": (type(e).__name__, "the result could not be read")}

    while True:
        request = recv()
        _, obj = table[request["index"]]
        if "batch" in request:
            send([portable(run(obj, args, kwargs)) for args, kwargs in request["batch"]])
        else:
            send(portable(run(obj, request["args"], request["kwargs"])))


class _Bundle:
    """The unpacked bundle's helpers, imported in a process of their own, called through a pipe."""

    def __init__(self, root: Path, scratch: Path) -> None:
        self.root, self.scratch = root, scratch
        self.proc: subprocess.Popen | None = None
        self.labels: list[str] = []
        self.problems: list[str] = []
        self.restarts = 0

    def start(self) -> None:
        from grader.classroom import guard

        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "NBGRADER", "ATTENTION_COURSE"))
        }
        env.update(
            HOME=str(self.scratch),
            MPLCONFIGDIR=str(self.scratch / "matplotlib"),
            MPLBACKEND="Agg",
            OMP_NUM_THREADS="1",
        )
        code = textwrap.dedent(inspect.getsource(_bundle_worker)) + "\n_bundle_worker()\n"
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self.scratch,
            env=env,
        )
        policy = guard.policy(
            deny=[str(course.ROOT / "grader"), str(course.ROOT / "solutions"), str(course.work_dir())],
            write_only_in=[str(self.scratch), os.devnull],
            deny_imports=("grader",),
            strict=True,
        )
        self._send(
            {
                "guard": guard.__file__,
                "policy": policy,
                "root": str(self.root),
                "package": HELPERS,
                "memory": WORKER_MEMORY,
            }
        )
        hello = self._recv(timeout=120.0)
        self.labels, self.problems = hello["labels"], hello["problems"]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def _send(self, obj: object) -> None:
        data = pickle.dumps(obj)
        self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
        self.proc.stdin.flush()

    def _read(self, n: int, deadline: float) -> bytes:
        out = b""
        fd = self.proc.stdout.fileno()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("no answer in time")
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise EOFError("the bundle's process stopped")
            out += chunk
        return out

    def _recv(self, timeout: float) -> dict:
        """One reply: plain values and tensors only (nothing else is unpickled here)."""
        import torch

        deadline = time.monotonic() + timeout
        (n,) = struct.unpack("<Q", self._read(8, deadline))
        return torch.load(io.BytesIO(self._read(n, deadline)), weights_only=True)

    def _ask(self, index: int, request: dict, timeout: float) -> object:
        try:
            self._send({"index": index, **request})
            return self._recv(timeout)
        except (TimeoutError, EOFError, OSError, pickle.PickleError, RuntimeError) as e:
            self.close()  # a call that hangs or kills the process: start afresh for the next one
            self.restarts += 1
            self.start()
            raise RuntimeError(f"{self.labels[index]} did not answer: {e}") from None

    def batch(self, index: int, calls: list[tuple[tuple, dict]]) -> list[dict]:
        """Call the bundle's callable number ``index`` once per (args, kwargs); its replies, in order."""
        request = {"batch": [(_portable(a), _portable(k)) for a, k in calls]}
        return self._ask(index, request, CALL_TIMEOUT * len(calls))

    def call(self, index: int, args: tuple, kwargs: dict) -> object:
        """Call the bundle's callable number ``index``; its exception comes back as a RuntimeError."""
        reply = self._ask(index, {"args": _portable(args), "kwargs": _portable(kwargs)}, CALL_TIMEOUT)
        return _value(reply)


def _value(reply: dict) -> object:
    """The value of a reply from the bundle, or its error raised here."""
    if "error" in reply:
        kind, message = reply["error"]
        if kind == "NotImplementedError":
            raise NotImplementedError(message)
        raise RuntimeError(f"{kind}: {message}")
    return reply["value"]


class _Stand:
    """Stands for one callable of the bundle where a hidden check expects a student's function."""

    def __init__(self, bundle: _Bundle, index: int) -> None:
        self.bundle, self.index = bundle, index

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self.bundle.call(self.index, args, kwargs)


def _portable(x: object) -> object:
    """Arguments as plain tensors and containers (the grader's watched tensors lose their watch)."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().as_subclass(torch.Tensor)
    if isinstance(x, dict):
        return {k: _portable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        items = [_portable(v) for v in x]
        return items if isinstance(x, list) else tuple(items)
    return x


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
        bundle = _Bundle(root, scratch)
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
                        check_exercise(checks[name], _Stand(bundle, index), on=["cpu"])
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
