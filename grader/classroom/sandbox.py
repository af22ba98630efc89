"""The sandbox: runs a student's code, outside the kernel, for the trusted process to call.

It is forked before anything from the grading package is loaded: from the
sealed fork server, inside bubblewrap, where the grading package does not exist and
the trusted process outside reaches it through two named pipes
(``grader.classroom.seal``); or, not sealed, by the trusted process itself,
from the plain fork server. Then, before the first line of student
code, it caps its memory and CPU time, forgets and refuses the ``grader``
package, and installs the guard's audit hook: it can read only the Python
installation, the student helpers and data, and its own scratch folder.

The trusted process sends requests over a pipe; the sandbox answers with data
(``wire``), so nothing the student made can run there:

- ``("run", [(label, source), ...])``: execute cells in order, errors tolerated;
- ``("names", [name, ...])``: which names exist, and which are callable;
- ``("get", name)``: the value of a name (tensors, numbers, strings, containers);
- ``("call", name, args, kwargs)``: call a function; answers its result (or the
  exception's type, module and message) and its arguments after the call;
- ``("call", name, args, kwargs, [other, ...])``: the same, with each named
  function rebound in the student's namespace, for this call only, to a stub
  that asks the trusted side: the stub sends ``{"callback": other, "args",
  "kwargs"}`` (plain data, like any answer) and returns the ``{"value"}`` the
  trusted side sends back (or raises its ``{"error"}``). Where arguments
  require a gradient, it also sends ``"needs_grad"`` (their positions among
  the arguments' tensors) and gets a ``"key"``; the value's backward pass
  sends ``{"backward": key, "grads"}`` and gets the arguments' gradients. No
  code crosses the pipe, only values;
- ``("call", name, args, kwargs, [other, ...], [forbidden, ...])``: the same,
  with each forbidden function (a dotted name such as ``torch.softmax``)
  wrapped for this call only, so that the answer's ``"called"`` lists those
  the student's code called (by any name: every torch operation of the call is
  also seen by ``attention_course.watch.CallWatch``);
- ``("call", name, args, kwargs, [other, ...], [forbidden, ...], True)``: the same,
  and the answer's ``"largest"`` gives the shape and dtype of the largest tensor
  the call made, for a cell of the trusted side that measures it.
"""

from __future__ import annotations

import builtins
import contextlib
import linecache
import os
import re
import signal
import sys
import types
from typing import Any

from . import wire
from .wire import dump, load, plain, receive, send, tensors, with_tensors

# the built-ins this module relies on, bound now: a student who patches ``builtins`` later
# must not be able to change how the answers are made
isinstance = builtins.isinstance  # noqa: A001
type = builtins.type  # noqa: A001
callable = builtins.callable  # noqa: A001
getattr = builtins.getattr  # noqa: A001
hasattr = builtins.hasattr  # noqa: A001

# ------------------------------------------------------------------ running cells


class _Shell:
    """Stands in for ``get_ipython()`` in one namespace. The magics that run their code in the notebook's
    namespace (``%%time``, ``%%capture``, ``%%prun`` and ``%time``'s line) run it here too, so what they
    define is defined; every other magic and shell command does nothing."""

    RUN_HERE = ("time", "capture", "prun")

    def __init__(self, namespace: dict[str, Any]) -> None:
        self._namespace = namespace

    def run_cell_magic(self, name: str, line: str, cell: str) -> None:
        if name in self.RUN_HERE:
            exec(compile_cell(cell, f"<%%{name} cell>"), self._namespace)

    def run_line_magic(self, name: str, line: str, *_: Any) -> None:
        if name in self.RUN_HERE and line.strip():
            exec(compile_cell(line, f"<%{name} line>"), self._namespace)

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def new_namespace() -> dict[str, Any]:
    """A fresh ``__main__`` namespace, as a notebook's cells run in: ``get_ipython`` a stand-in, and
    ``display``, which IPython gives every cell, showing nothing."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    shell = _Shell(namespace)
    namespace.update(get_ipython=lambda: shell, display=lambda *a, **k: None)
    return namespace


def python_source(source: str) -> str:
    """IPython syntax (magics, !commands) turned into plain Python calls on get_ipython()."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - plain Python then
        return source


# what makes IPython change plain Python: a blank or indented first line (dedent), a line of blanks, a
# prompt it strips (on the first two lines; ">>>" anywhere), a cell magic; the rest it changes is not Python
_IPYTHON_CHANGES = re.compile(r"\A(?:\s|%|(?:.*\n)?[^\S\n]*(?:\.\.\.|(?:\[\w+\] )?In \[))|>>>|^[ \t]+$", re.M)


def compile_cell(source: str, label: str) -> Any:
    """``compile(python_source(source))``, without IPython's transforms (0.4 ms a cell) where they change nothing.
    The source is kept where ``inspect`` looks, as IPython keeps a cell's (``torch.jit.script`` reads it)."""
    code = None
    if source and not _IPYTHON_CHANGES.search(source):
        with contextlib.suppress(SyntaxError):
            code = compile(source, label, "exec")
    if code is None:
        source = python_source(source)
        code = compile(source, label, "exec")
    linecache.cache[label] = (len(source), None, source.splitlines(True), label)
    return code


class CellTimeout(BaseException):
    """Raised inside a cell that ran past the time limit."""


def _alarm(*_: Any) -> None:
    raise CellTimeout("the cell ran past its time limit")


def run_cell(source: str, label: str, namespace: dict, timeout: float) -> str | None:
    """Execute one cell in namespace; return 'Type: message' of its error, or None."""
    signal.signal(signal.SIGALRM, _alarm)
    try:
        code = compile_cell(source, label)
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
    from . import guard  # relative: inside the seal this package is course_runtime

    os.chdir(cfg["scratch"])
    os.environ["MPLBACKEND"] = "Agg"
    os.environ["TMPDIR"] = cfg["scratch"]
    import tempfile

    tempfile.tempdir = None
    os.environ.pop("ATTENTION_COURSE_WORK", None)
    sys.dont_write_bytecode = True
    guard.first_to_go()
    guard.limit_memory(cfg.get("memory"), beyond_now=True)
    guard.limit_cpu(cfg.get("cpu_seconds"))
    guard.forget_modules(("grader",))
    sys.meta_path.insert(0, guard.BlockImports(("grader",)))
    guard.install(cfg["guard"])
    timeout = float(cfg.get("cell_timeout", 60))
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    namespace = new_namespace()
    _keep_watch()
    # held here, before any student code: what that code rebinds or recodes in this module never answers
    kept, check, code = tuple(_WATCH_AS_LOADED), _put_watch_back, _put_watch_back.__code__
    answer_to, pack, post, take, read = handle, dump, send, receive, load
    while True:
        check.__code__, _WATCH_AS_LOADED[:] = code, kept
        check()  # this module and the watch as loaded (a change noted, for the trusted side to flag)
        try:
            request = read(take(rfd), True)
        except EOFError:
            return
        try:
            payload = pack(answer_to(request, namespace, timeout, (rfd, wfd)))
        except BaseException as e:  # noqa: BLE001 - the answer itself could not be made
            payload = pack(
                {"error": {"type": type(e).__name__, "module": "builtins", "message": _safe_str(e)}}
            )
        post(wfd, payload)


def _ask(channel: tuple[int, int], message: dict) -> dict:
    rfd, wfd = channel
    send(wfd, dump(message))
    reply = load(receive(rfd), True)
    if "error" in reply:
        info = reply["error"]
        cls = getattr(builtins, str(info.get("type")), None)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            cls = RuntimeError
        raise cls(str(info.get("message")))
    return reply


def _callback_stub(name: str, channel: tuple[int, int]) -> Any:
    """A function that asks the trusted side to run ``name`` on these arguments and returns its value.

    When arguments require a gradient, the value is tied to them by an autograd function whose
    backward asks the trusted side for the gradient too, so the student's training loop still works.
    """
    import torch

    class Remote(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, call: dict, *inputs: Any) -> Any:
            reply = _ask(channel, call)
            ctx.key = reply["key"]
            call["value"] = reply.get("value")
            outs = tensors(call["value"])
            ctx.mark_non_differentiable(*[t for t in outs if not t.is_floating_point()])
            return tuple(outs)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            reply = _ask(channel, {"backward": ctx.key, "grads": plain(list(grads))})
            return (None, *reply.get("value"))

    def stub(*args: Any, **kwargs: Any) -> Any:
        call = {"callback": name, "args": plain(tuple(args)), "kwargs": plain(dict(kwargs))}
        inputs = tensors((args, kwargs))
        wanted = [i for i, t in enumerate(inputs) if t.requires_grad] if torch.is_grad_enabled() else []
        if not wanted:
            return _ask(channel, call).get("value")
        call["needs_grad"] = wanted
        outs = Remote.apply(call, *[inputs[i] for i in wanted])
        return with_tensors(call["value"], iter(outs))

    stub.__name__ = stub.__qualname__ = name
    return stub


def _resolve(qualified: str) -> tuple[Any, str]:
    """The object holding a dotted name's last part: 'torch.Tensor.softmax' -> (torch.Tensor, 'softmax')."""
    import importlib

    parts = qualified.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:-1]:
            owner = getattr(owner, part)
        return owner, parts[-1]
    raise ValueError(f"cannot resolve {qualified!r}")


def _watch(names: list[str], namespace: dict, called: list[str]) -> list[tuple[Any, str, Any, bool]]:
    """Wrap each named function so that a call is recorded in ``called`` (and still computes); return
    what to put back afterwards."""
    restore: list[tuple[Any, str, Any, bool]] = []
    for name in names:
        try:
            owner, attr = _resolve(name)
            original = getattr(owner, attr)
        except (ValueError, AttributeError):
            continue

        def watched(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            if _name not in called:
                called.append(_name)
            return _original(*args, **kwargs)

        try:
            restore.append((owner, attr, original, attr in vars(owner)))
            setattr(owner, attr, watched)
        except (AttributeError, TypeError):
            restore.pop()
            continue
        for key, value in list(namespace.items()):
            if value is original:  # ``from torch import softmax`` in the student's code
                restore.append((namespace, key, original, True))
                namespace[key] = watched
    return restore


_WATCH: Any = None  # attention_course.watch, kept as loaded before any student code ran (``_keep_watch``)
_WATCH_AS_LOADED: list[tuple[Any, dict]] = []
_WATCH_CHANGED: dict[str, tuple] = {}  # what student code changed in it, put back before every call
_REVIEW: set[str] = set()  # what the watch could not decide about a call (lesson 11), for a person
_RULED: list[bool] = []  # [True] once a watched input (lesson 11) has arrived: every later call is watched
_GONE = object()
_THIS = sys.modules[__name__]  # this module: an unsealed sandbox drops it from sys.modules with grader
CANARY = "__course_canary__"  # the trusted side's call after the student's, which the watch must see


def _keep_watch() -> None:
    """Note the rules' watch (``attention_course.watch``, its classes, PyTorch's ``TorchFunctionMode``), this
    module and ``wire``, which make the answers, as loaded, before the student's code runs: each call puts back what that
    code changed in them, functions' code included."""
    global _WATCH
    from torch.overrides import TorchFunctionMode

    from attention_course import watch

    _WATCH, module = watch, _THIS
    owners = [watch, module, wire, TorchFunctionMode] + [
        v
        for v in vars(watch).values()
        if getattr(v, "__module__", "") == watch.__name__ and isinstance(v, type)
    ]
    _WATCH_AS_LOADED[:] = [  # the modules' own names, each class's all; the watch's containers by content
        (
            o,
            types.MappingProxyType(
                {
                    k: _as_loaded(v, o is not module)
                    for k, v in vars(o).items()
                    if not (k[:2] == "__" and isinstance(o, types.ModuleType))
                }
            ),
        )
        for o in owners
    ]


def _as_loaded(value: Any, by_content: bool) -> tuple:
    """A name's value; its content (a container of the watch's); its function (a class's static or class
    method's), whose code and defaults can change in place, with them."""
    f = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    f = f if isinstance(f, types.FunctionType) else None
    copy = value.copy() if by_content and isinstance(value, (set, dict, list)) else None
    return value, copy, f, f and (f.__code__, f.__defaults__, f.__kwdefaults__)


def _put_watch_back() -> None:
    for owner, kept in _WATCH_AS_LOADED:
        now = vars(owner)
        added = [n for n in now.keys() - kept.keys() if n[:2] != "__"]  # not set as it runs (warnings)
        for name in added + list(kept):
            value, copy, f, parts = kept.get(name, (_GONE, None, None, None))
            same = f is None or (f.__code__, f.__defaults__, f.__kwdefaults__) == parts
            if same and now.get(name, _GONE) is value and (copy is None or value == copy):
                continue
            where = f"{getattr(owner, '__name__', owner)}.{name}"
            _WATCH_CHANGED[where] = (owner, name, now.get(name, _GONE))
            _set(owner, name, value)
            if not same:
                f.__code__, f.__defaults__, f.__kwdefaults__ = parts
            if copy is not None and value != copy:  # changed in place: its content as loaded again
                value.clear()
                value.update(copy) if not isinstance(value, list) else value.extend(copy)


def _set(owner: Any, name: str, value: Any) -> None:
    if value is not _GONE:
        setattr(owner, name, value)
    elif name in vars(owner):
        delattr(owner, name)


def _rewatched(x: Any) -> Any:
    """Inputs sent with a watch rule (lesson 11) as watched tensors again."""
    if isinstance(x, dict) and set(x) == {"__watched__", "rule"}:
        _RULED[:], rule = [True], x["rule"]
        return _WATCH.watched(x["__watched__"], None if rule is None else _WATCH.Rule(*rule))
    if isinstance(x, tuple):
        return tuple(_rewatched(v) for v in x)
    if isinstance(x, list):
        return [_rewatched(v) for v in x]
    if isinstance(x, dict):
        return {k: _rewatched(v) for k, v in x.items()}
    return x


def handle(request: tuple, namespace: dict, timeout: float, channel: tuple[int, int] | None = None) -> dict:
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
    if op == "watch changed":  # a request of the trusted side's, after the student's calls
        _put_watch_back()
        return {"value": sorted(_WATCH_CHANGED), "review": sorted(_REVIEW)[:6]}
    if op == "call":
        name, args, kwargs = request[1:4]
        check, code = _put_watch_back, _put_watch_back.__code__  # as serve left them, whatever the call does
        if name == CANARY:  # the canary sees the watch as the student's code left it
            for owner, attr, value in _WATCH_CHANGED.values():
                _set(owner, attr, value)
        substitutes = list(request[4]) if len(request) > 4 and channel is not None else []
        forbidden = [str(n) for n in request[5]] if len(request) > 5 else []
        measure = bool(request[6]) if len(request) > 6 else False
        fn = namespace.get(name)
        args, kwargs = _rewatched(args), _rewatched(kwargs)
        saved = {n: namespace[n] for n in substitutes if n in namespace}
        for n in substitutes:
            namespace[n] = _callback_stub(n, channel)
        called: list[str] = []
        restore = _watch(forbidden, namespace, called)
        signal.signal(signal.SIGALRM, _alarm)
        try:
            if fn is None:
                raise NameError(f"name {name!r} is not defined")
            seen = None
            if forbidden or measure or _RULED:  # every torch operation of the call, watched
                seen = _WATCH.CallWatch(forbidden, (args, kwargs))
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                if seen is None:
                    value = fn(*args, **kwargs)
                else:
                    with seen:
                        value = fn(*args, **kwargs)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                if seen is not None:
                    called += [n for n in seen.calls if n not in called]
                check.__code__ = code
                check()  # what the call changed in the watch or this module, put back before the answer is made
            answer = {"value": plain(value), "args": plain(tuple(args)), "called": list(called)}
            note = _WATCH.CallWatch.verdict(seen, value) if seen is not None else None  # not the instance's
            if seen is not None and seen.review:
                _REVIEW.add(f"{name} {seen.review}")
            if note is not None:
                answer["note"] = list(note)  # how the result was computed (lesson 11)
            if measure and seen is not None and seen.largest is not None:
                size, shape, dtype = seen.largest
                answer["largest"] = {"shape": list(shape), "dtype": dtype}  # the largest tensor it made
            return answer
        except BaseException as e:  # noqa: BLE001 - the student's error goes back as data
            kind = "TimeoutError" if isinstance(e, CellTimeout) else type(e).__name__
            module = "builtins" if isinstance(e, CellTimeout) else type(e).__module__
            return {
                "error": {"type": kind, "module": str(module), "message": _safe_str(e)},
                "args": plain(tuple(args)),
                "called": list(called),
            }
        finally:
            for owner, attr, original, own in reversed(restore):
                if isinstance(owner, dict):
                    owner[attr] = original
                elif own:
                    setattr(owner, attr, original)
                else:
                    delattr(owner, attr)
            for n in substitutes:
                if n in saved:
                    namespace[n] = saved[n]
                else:
                    namespace.pop(n, None)
    return {"error": {"type": "ValueError", "module": "builtins", "message": f"unknown request {op!r}"}}
