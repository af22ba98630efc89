"""The student bundle's helpers in a process of their own, where the grading package cannot be imported.

``release.answers_in`` proves a bundle holds no answer by calling every callable of its helpers
through this process: ``Bundle`` starts ``python -I`` on the unpacked bundle with the audit-hook
guard in strict mode (``grader/``, ``solutions/`` and the work folder denied, writes only in a
scratch folder, a memory limit), and calls go to it as length-prefixed pickles, answers come back
in ``torch.save`` form (plain values and tensors only). A call that hangs or kills the process
restarts it; ``Stand`` puts one of the bundle's callables where a hidden check expects a
student's function.
"""

from __future__ import annotations

import inspect
import io
import os
import pickle
import select
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from grader import course

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


class Bundle:
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


class Stand:
    """Stands for one callable of the bundle where a hidden check expects a student's function."""

    def __init__(self, bundle: Bundle, index: int) -> None:
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
