"""The sandbox: runs a student's code, outside the kernel, for the trusted process to call.

It is forked (from the zygote, through the trusted process) before anything
from the grading package is loaded, then, before the first line of student
code, it caps its memory and CPU time, forgets and refuses the ``grader``
package, and installs the guard's audit hook: it can read only the Python
installation, the student helpers and data, and its own scratch folder.

The trusted process sends requests (pickled: they come from trusted code) over
a pipe; the sandbox answers with ``torch.save`` payloads that the trusted side
reads with ``weights_only=True``, so nothing the student made can run there:

- ``("run", [(label, source), ...])``: execute cells in order, errors tolerated;
- ``("names", [name, ...])``: which names exist, and which are callable;
- ``("get", name)``: the value of a name (tensors, numbers, strings, containers);
- ``("call", name, args, kwargs)``: call a function; answers its result (or the
  exception's type, module and message) and its arguments after the call.
"""

from __future__ import annotations

import builtins
import io
import os
import pickle
import signal
import struct
import sys
from typing import Any

MAX_MESSAGE = 256 << 20  # bytes: a bigger answer is refused by the trusted side

# the built-ins this module relies on, bound now: a student who patches ``builtins`` later
# must not be able to change how the answers are made
isinstance = builtins.isinstance  # noqa: A001
type = builtins.type  # noqa: A001
callable = builtins.callable  # noqa: A001
getattr = builtins.getattr  # noqa: A001
hasattr = builtins.hasattr  # noqa: A001

# ------------------------------------------------------------------ framing


def send(fd: int, payload: bytes) -> None:
    data = struct.pack("<Q", len(payload)) + payload
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the pipe")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, limit: int = MAX_MESSAGE) -> bytes:
    (n,) = struct.unpack("<Q", _read_exact(fd, 8))
    if n > limit:
        raise ValueError(f"message of {n} bytes is over the limit of {limit}")
    return _read_exact(fd, n)


# ------------------------------------------------------------------ values


def plain(x: Any, depth: int = 0) -> Any:
    """A copy of x made only of what ``torch.load(weights_only=True)`` accepts.

    Anything else becomes ``{"__opaque__": type name}`` so that the checks can
    still say what the student returned.
    """
    import torch

    if depth > 32:
        return {"__opaque__": "deeply nested value"}
    if isinstance(x, torch.Tensor):
        t = x.detach()
        return t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t
    if x is None or type(x) in (bool, int, float, str):
        return x
    if isinstance(x, (torch.dtype, torch.device)):
        return x
    if isinstance(x, torch.Size):
        return tuple(int(v) for v in x)
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str(x)
    if type(x).__module__ == "numpy" and hasattr(x, "item") and getattr(x, "ndim", None) == 0:
        return plain(x.item(), depth + 1)
    if isinstance(x, tuple):
        return tuple(plain(v, depth + 1) for v in x)
    if isinstance(x, list):
        return [plain(v, depth + 1) for v in x]
    if isinstance(x, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in x.items()}
    return {"__opaque__": type(x).__name__}


def dump(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# ------------------------------------------------------------------ running cells


class _Shell:
    """Stands in for ``get_ipython()``: magics and shell commands do nothing here."""

    def run_line_magic(self, *args: Any, **kwargs: Any) -> None:
        return None

    def run_cell_magic(self, *args: Any, **kwargs: Any) -> None:
        return None

    def system(self, *args: Any, **kwargs: Any) -> None:
        return None

    getoutput = system

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


SHELL = _Shell()


def python_source(source: str) -> str:
    """IPython syntax (magics, !commands) turned into plain Python calls on get_ipython()."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - plain Python then
        return source


class CellTimeout(BaseException):
    """Raised inside a cell that ran past the time limit."""


def _alarm(*_: Any) -> None:
    raise CellTimeout("the cell ran past its time limit")


def run_cell(source: str, label: str, namespace: dict, timeout: float) -> str | None:
    """Execute one cell in namespace; return 'Type: message' of its error, or None."""
    signal.signal(signal.SIGALRM, _alarm)
    try:
        code = compile(python_source(source), label, "exec")
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            exec(code, namespace)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as e:  # noqa: BLE001 - a student's error is data here
        return f"{type(e).__name__}: {_safe_str(e)}"
    return None


def _safe_str(e: BaseException) -> str:
    try:
        return str(e)[:4000]
    except BaseException:  # noqa: BLE001
        return "(the error message could not be read)"


# ------------------------------------------------------------------ the server


def serve(rfd: int, wfd: int, cfg: dict) -> None:
    """Lock this process down, then answer requests until the pipe closes."""
    from grader.classroom import guard

    os.chdir(cfg["scratch"])
    os.environ["MPLBACKEND"] = "Agg"
    os.environ["TMPDIR"] = cfg["scratch"]
    import tempfile

    tempfile.tempdir = None
    os.environ.pop("ATTENTION_COURSE_WORK", None)
    sys.dont_write_bytecode = True
    guard.limit_memory(cfg.get("memory"))
    guard.limit_cpu(cfg.get("cpu_seconds"))
    guard.forget_modules(("grader",))
    sys.meta_path.insert(0, guard.BlockImports(("grader",)))
    guard.install(cfg["guard"])
    timeout = float(cfg.get("cell_timeout", 60))
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    namespace: dict[str, Any] = {
        "__name__": "__main__",
        "__builtins__": builtins,
        "get_ipython": lambda: SHELL,
    }
    while True:
        try:
            request = pickle.loads(receive(rfd))
        except EOFError:
            return
        try:
            answer = handle(request, namespace, timeout)
            payload = dump(answer)
        except BaseException as e:  # noqa: BLE001 - the answer itself could not be made
            payload = dump(
                {"error": {"type": type(e).__name__, "module": "builtins", "message": _safe_str(e)}}
            )
        send(wfd, payload)


def handle(request: tuple, namespace: dict, timeout: float) -> dict:
    op = request[0]
    if op == "run":
        errors = [run_cell(src, label, namespace, timeout) for label, src in request[1]]
        return {"errors": [e for e in errors if e]}
    if op == "names":
        out = {}
        for name in request[1]:
            if name not in namespace:
                out[name] = "missing"
            elif callable(namespace[name]):
                out[name] = "callable"
            else:
                out[name] = type(namespace[name]).__name__
        return {"names": out}
    if op == "get":
        return {"value": plain(namespace.get(request[1]))}
    if op == "call":
        _, name, args, kwargs = request
        fn = namespace.get(name)
        signal.signal(signal.SIGALRM, _alarm)
        try:
            if fn is None:
                raise NameError(f"name {name!r} is not defined")
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                value = fn(*args, **kwargs)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            return {"value": plain(value), "args": plain(tuple(args))}
        except BaseException as e:  # noqa: BLE001 - the student's error goes back as data
            kind = "TimeoutError" if isinstance(e, CellTimeout) else type(e).__name__
            module = "builtins" if isinstance(e, CellTimeout) else type(e).__module__
            return {
                "error": {"type": kind, "module": str(module), "message": _safe_str(e)},
                "args": plain(tuple(args)),
            }
    return {"error": {"type": "ValueError", "module": "builtins", "message": f"unknown request {op!r}"}}
