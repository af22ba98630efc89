"""The trusted side's stand-ins for the student's code (``grader.classroom.trusted``).

``Sandbox`` is the handle on the sandbox process; a ``Proxy`` stands in for one student function,
each call sent to the sandbox as data and answered with data (``wire.load``),
serving the callbacks to the reference meanwhile; what comes back that is not data becomes an
``Opaque`` that says where it came from, and a student's error is rebuilt by name and message.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

from grader.classroom.wire import MAX_MESSAGE, dump, load, plain, receive, send, tensors


class SandboxGone(RuntimeError):
    """The student's code stopped answering (time limit, crash, os._exit)."""


class Unverifiable(BaseException):
    """A check's inputs cannot leave this process (e.g. objects that watch how they are used).

    A BaseException, so the harness does not mistake it for the student's error: the check is then
    decided in the notebook only, and the submission is flagged for review. Only the lesson's own
    inputs can get here: a value of the student's that is not data fails the check (``Opaque``).
    """


def _portable(x: Any) -> Any:
    """Inputs as plain data: tensor subclasses become plain tensors (same values, same storage).

    A watched tensor (lesson 11) travels with its rule, so the sandbox watches the same work.
    """
    import torch

    from attention_course.watch import Watched

    if isinstance(x, Watched):
        rule = getattr(x, "_rule", None)
        return {
            "__watched__": x.as_subclass(torch.Tensor),
            "rule": None
            if rule is None
            else [rule.kind, rule.T_q, rule.T_k, rule.N, rule.block, list(rule.free)],
        }
    if isinstance(x, torch.Tensor):
        return x.as_subclass(torch.Tensor) if type(x) is not torch.Tensor else x
    if isinstance(x, tuple):
        return tuple(_portable(v) for v in x)
    if isinstance(x, list):
        return [_portable(v) for v in x]
    if isinstance(x, dict):
        return {k: _portable(v) for k, v in x.items()}
    return x


class Sandbox:
    """The trusted side's handle on the sandbox process."""

    def __init__(self, wfd: int, rfd: int, pid: int, seconds: float = float("inf")):
        self.wfd, self.rfd, self.pid = wfd, rfd, pid
        os.set_blocking(wfd, False)  # a sandbox that stops reading cannot hold a request past its deadline
        # every answer must come by its request's deadline and by the end of all the checks' time
        self.until = time.monotonic() + seconds
        self.gone: str | None = None
        # what the student's functions changed in place among the arguments a check passed them
        self.changed: list[str] = []

    def request(
        self, message: tuple | bytes, timeout: float, callbacks: dict[str, Callable[..., Any]] | None = None
    ) -> dict:
        """Send one request (or its ``dump``) and return its answer, serving the callbacks it makes meanwhile."""
        if self.gone:
            raise SandboxGone(self.gone)
        self._send(message if isinstance(message, bytes) else dump(message, copy=False), timeout)
        graphs: dict[int, tuple[list, list]] = {}  # what a callback's backward pass needs, by key
        while True:
            answer = self._receive(timeout)
            if callbacks is None or not (
                isinstance(answer, dict) and ("callback" in answer or "backward" in answer)
            ):
                return answer
            self._call_back(answer, callbacks, graphs, timeout)

    def _limit(self, timeout: float) -> tuple[float, str]:
        """When one message must have gone across, each way, and how to say it did not."""
        left = self.until - time.monotonic()
        late = f"{timeout:.0f} s" if timeout <= left else "the time all the checks of this notebook may take"
        return time.monotonic() + max(0.0, min(timeout, left)), late

    def _send(self, payload: bytes, timeout: float) -> None:
        deadline, late = self._limit(timeout)
        try:
            send(self.wfd, payload, deadline)
        except TimeoutError:  # it stopped reading
            self.kill(f"the student's code did not finish within {late}")
            raise SandboxGone(self.gone) from None
        except (BrokenPipeError, OSError) as e:
            self.kill(
                f"the student's code ended its process or ran out of memory or CPU time ({type(e).__name__})"
            )
            raise SandboxGone(self.gone) from None

    def _receive(self, timeout: float) -> Any:
        deadline, late = self._limit(timeout)
        try:  # all of the answer by then (none, or half of one, is as late)
            payload = receive(self.rfd, MAX_MESSAGE, deadline)
        except TimeoutError:
            self.kill(f"the student's code did not finish within {late}")
            raise SandboxGone(self.gone) from None
        except (EOFError, BrokenPipeError, OSError) as e:
            self.kill(
                f"the student's code ended its process or ran out of memory or CPU time ({type(e).__name__})"
            )
            raise SandboxGone(self.gone) from None
        except ValueError as e:  # over the size limit
            self.kill(f"the student's code sent back too much data ({e})")
            raise SandboxGone(self.gone) from None
        try:
            answer = load(payload)
            said = "" if isinstance(answer, dict) else f"an answer of type {type(answer).__name__}"
        except Exception as e:  # noqa: BLE001 - an answer that is not plain data
            said = f"unreadable result: {e}"
        if said:  # the student's code may send anything at all
            return {"error": {"type": "TypeError", "module": "builtins", "message": said}}
        return answer

    def _call_back(
        self, request: dict, callbacks: dict[str, Callable[..., Any]], graphs: dict, timeout: float
    ) -> None:
        """Run the trusted function the student's code called by name (or its backward pass); answer
        with the value as data."""
        import torch

        try:
            if "backward" in request:
                inputs, outputs = graphs.pop(request["backward"])
                grads = request.get("grads") or []
                pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
                found = (
                    torch.autograd.grad(
                        [o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True
                    )
                    if pairs
                    else [None] * len(inputs)
                )
                reply = {"value": plain(list(found))}
            else:
                fn = callbacks[str(request.get("callback"))]
                args = decode(request.get("args") or ())
                kwargs = decode(request.get("kwargs") or {})
                wanted = list(request.get("needs_grad") or [])
                if not wanted:
                    reply = {"value": plain(_portable(fn(*args, **kwargs)))}
                else:
                    found = tensors((args, kwargs))
                    inputs = [found[i].requires_grad_(True) for i in wanted]
                    with torch.enable_grad():
                        value = fn(*args, **kwargs)
                    key = len(graphs) + 1
                    while key in graphs:
                        key += 1
                    graphs[key] = (inputs, tensors(value))
                    reply = {"value": plain(_portable(value)), "key": key}
        except Exception as e:  # noqa: BLE001 - the error goes back as data
            reply = {"error": {"type": type(e).__name__, "message": _message(e)}}
        self._send(dump(reply, copy=False), timeout)

    def kill(self, why: str) -> None:
        self.gone = self.gone or why
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)


# ------------------------------------------------------------------ values from the sandbox


class Opaque:
    """Stands in for a value of the student's that is not data (an object of their own class).

    It keeps the student's type name (so a check can say what came back) and where it came from
    (``said``: "split_heads returned"), so that handing it to another of the student's functions fails
    the check with those words.
    """

    said = "your code gave"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} object>"


def _opaque(name: str, said: str) -> Opaque:
    cls = type(str(name), (Opaque,), {"said": said})
    return cls()


def decode(x: Any, said: str = "your code gave", depth: int = 0) -> Any:
    """A value from the sandbox; what is not data (or nests deeper than a sandbox sends, or holds itself)
    becomes an ``Opaque`` that says where it came from; a tensor comes without the attributes it was sent."""
    import torch

    if depth > 40:
        return _opaque("deeply nested value", said)
    if isinstance(x, torch.Tensor) and vars(x):
        return x.detach()  # the same data
    if isinstance(x, dict):
        if set(x) == {"__opaque__"}:
            return _opaque(x["__opaque__"], said)
        return {k: decode(v, said, depth + 1) for k, v in x.items()}
    if isinstance(x, list):
        return [decode(v, said, depth + 1) for v in x]
    if isinstance(x, tuple):
        return tuple(decode(v, said, depth + 1) for v in x)
    return x


def _first_opaque(x: Any, depth: int = 0) -> Opaque | None:
    if isinstance(x, Opaque):
        return x
    if depth > 40:
        return None
    if isinstance(x, (tuple, list)):
        items: Any = x
    elif isinstance(x, dict):
        items = list(x.keys()) + list(x.values())
    else:
        return None
    for v in items:
        found = _first_opaque(v, depth + 1)
        if found is not None:
            return found
    return None


def _not_data(fn: str, value: Opaque) -> AssertionError:
    """The failure of a check that hands one of the student's non-data values to a student function."""
    return AssertionError(
        f"{value.said} a {type(value).__name__} object; the check needs a tensor (or plain numbers) "
        f"to pass to {fn}: return tensors, not objects of your own."
    )


def _measuring() -> bool:
    """Whether a torch function mode of the cell (such as a notebook's ``LargestTensor``) is watching now."""
    import torch

    return torch._C._len_torch_function_stack() > 0


def _replay_largest(largest: Any) -> None:
    """Show the cell's active torch function modes the largest tensor the student's call made in the sandbox.

    An empty tensor of the same shape and dtype, on the meta device (no memory), is made here, where the
    cell's mode sees it as it would have seen the student's own.
    """
    import torch

    if not isinstance(largest, dict):
        return
    try:
        shape = [int(n) for n in largest.get("shape", [])]
        dtype = largest.get("dtype")
        if isinstance(dtype, torch.dtype):
            torch.empty(shape, dtype=dtype, device="meta")
    except Exception:  # noqa: BLE001 - a measurement that cannot be replayed changes nothing
        pass


def _noted(value: Any, note: Any) -> Any:
    """The result with the sandbox's note on how it was computed put back on its first tensor."""
    import torch

    from attention_course.watch import watched

    if not note:
        return value
    if isinstance(value, torch.Tensor):
        value = watched(value, None)
        value._note = (str(note[0]), str(note[1]))
        return value
    if isinstance(value, (tuple, list)) and value:
        return type(value)([_noted(value[0], note), *value[1:]])
    return value


def rebuild_error(info: dict) -> BaseException:
    """An exception of the same type name and message as the student's."""
    name, module, message = (
        str(info.get("type"))[:100],
        str(info.get("module"))[:100],
        str(info.get("message")),
    )
    cls = getattr(builtins, name, None) if module == "builtins" else None
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        if module.startswith("torch"):
            import torch

            cls = getattr(torch, name, None)
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                cls = RuntimeError
        else:
            cls = type(name, (Exception,), {"__module__": module})
    try:
        return cls(message)
    except Exception:  # noqa: BLE001 - an exception type with an odd constructor
        return RuntimeError(f"{name}: {message}")


def _changed_inputs(name: str, args: tuple, after: Any) -> str | None:
    """What a call changed in place among its tensor arguments (the hidden checks' rule: nothing), or None."""
    import torch

    if not isinstance(after, (tuple, list)):
        return None
    names: list[str] = []
    try:
        from grader.registry import exercises

        known = exercises().get(name)
        if known is not None:
            names = [p.strip().split("=")[0].strip() for p in known.signature.split(",")]
    except Exception:  # noqa: BLE001 - positions then
        names = []
    for i, (orig, new) in enumerate(zip(args, after)):
        if not (isinstance(orig, torch.Tensor) and isinstance(new, torch.Tensor)):
            continue
        if orig.device.type == "meta":
            continue
        # a watched input (lesson 11) is compared as a plain tensor, so that comparing it reads nothing
        a = (orig.as_subclass(torch.Tensor) if type(orig) is not torch.Tensor else orig).detach()
        same = a.shape == new.shape and a.dtype == new.dtype  # first: moved, an expanded answer is made whole
        if same and not torch.equal(a, b := new.detach().to(a.device)):
            same = a.is_floating_point() and bool(((a == b) | (a.isnan() & b.isnan())).all())
        if not same:
            what = f"its argument `{names[i]}`" if i < len(names) and names[i] else f"its input {i + 1}"
            return (
                f"{name} changed {what} in place (e.g. masked_fill_, fill_ or +=): "
                "work on a new tensor instead."
            )
    return None


def _write_back(args: tuple, after: Any) -> None:
    """Make in-place changes the student's function made visible to the checks."""
    import torch

    if not isinstance(after, (tuple, list)):
        return
    for orig, new in zip(args, after):
        if isinstance(orig, torch.Tensor) and isinstance(new, torch.Tensor) and orig.device.type != "meta":
            with contextlib.suppress(Exception):  # best effort only
                if new.shape == orig.shape and new.dtype == orig.dtype:
                    orig.copy_(new.to(orig.device))
                elif new.device == orig.device or new.numel() <= orig.numel():  # moved, it is made whole
                    orig.data = new.to(orig.device)


class Proxy:
    """Stands in for one student function; each call runs in the sandbox."""

    def __init__(self, sandbox: Sandbox, name: str, timeout: float):
        self._sandbox, self.__name__, self._timeout = sandbox, name, timeout
        self.__qualname__ = name
        self._substitutes: dict[str, Callable[..., Any]] = {}
        self._forbidden: list[str] = []
        self._called: list[str] = []

    @contextlib.contextmanager
    def substituted(self, mapping: dict[str, Callable[..., Any]]) -> Iterator[Proxy]:
        """While active, the names in ``mapping`` that the student's code calls run ``mapping[name]`` here."""
        before = self._substitutes
        self._substitutes = {**before, **mapping}
        try:
            yield self
        finally:
            self._substitutes = before

    @contextlib.contextmanager
    def forbidding(self, names: list[str]) -> Iterator[list[str]]:
        """While active, the student's code runs with these functions watched; the value is the list of
        those it called."""
        before, calls = (self._forbidden, self._called), []
        self._forbidden, self._called = [str(n) for n in names], calls
        try:
            yield calls
        finally:
            self._forbidden, self._called = before

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        opaque = _first_opaque((args, kwargs))
        if opaque is not None:  # a value of the student's that is not data: the check fails, here
            raise _not_data(self.__name__, opaque)
        message: tuple = ("call", self.__name__, _portable(args), _portable(kwargs))
        measure = _measuring()
        if self._substitutes or self._forbidden or measure:
            message += (sorted(self._substitutes), list(self._forbidden))
        if measure:  # a cell measures the work (e.g. the largest tensor made): measure it where it runs
            message += (True,)
        try:
            payload = dump(message, copy=False)
        except Exception as e:  # noqa: BLE001 - inputs that only make sense in this process
            raise Unverifiable(
                f"its inputs cannot be sent outside the notebook ({type(e).__name__})"
            ) from None
        answer = self._sandbox.request(payload, self._timeout + 5, callbacks=dict(self._substitutes))
        for name in answer.get("called") or []:
            if name in self._forbidden and name not in self._called:
                self._called.append(name)
        changed = _changed_inputs(self.__name__, args, answer.get("args"))
        if changed and changed not in self._sandbox.changed:
            self._sandbox.changed.append(changed)
        _write_back(args, answer.get("args"))
        if measure:
            _replay_largest(answer.get("largest"))
        if "error" in answer:
            raise rebuild_error(answer["error"])
        return _noted(decode(answer.get("value"), f"{self.__name__} returned"), answer.get("note"))

    def __repr__(self) -> str:
        return f"<function {self.__name__}>"


def _message(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # noqa: BLE001
        text = ""
    if isinstance(error, NameError) and not text:
        text = "a name is not defined"
    return text[:4000]
