"""The trusted side of a verdict: the lesson's own code and tests, the student's functions at arm's length.

nbgrader runs the student's code and the hidden tests in one kernel, so a
verdict reached there can be faked (patch ``torch.isclose``, plant a fake
``grader`` module, swallow exceptions ...). Here every test cell is decided
again in a process the student's code never ran in:

- the lesson's context cells (worked examples, data) and its test cells run
  from the instructor's source notebook, in notebook order;
- every function the student writes is a *proxy*: calling it sends the
  arguments to the sandbox, which runs the student's own cells (in step with
  the notebook, so each test sees the code written above it) and sends back
  only data (tensors, numbers, strings, containers) that is read with
  ``torch.load(weights_only=True)``;
- ``grader.check`` and the reference run here, untouched; a rule such as "do
  not call torch.softmax" is watched in the sandbox (``proxy.forbidding``);
- while a check holds ``proxy.substituted({"attention": reference})``, the
  student's code that calls ``attention`` calls back here instead: the
  sandbox sends the arguments, this process runs the reference and answers
  with the value (plain data again), so one mistake costs one exercise.

A verdict records whether the failure came from a hidden-test block (which
only this process runs) or from the part of the cell the kernel runs too.

Entry point: ``main(job_path, to_sandbox, from_sandbox, sandbox_pid)``, called
by the fork server in a freshly forked process. The answer is written as JSON to
the job's ``result_path``.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import pickle
import re
import select
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from grader.classroom.sandbox import MAX_MESSAGE, SHELL, plain, python_source, receive, send, tensors


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
            "rule": None if rule is None else [rule.kind, rule.T_q, rule.T_k, rule.N],
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

    def __init__(self, wfd: int, rfd: int, pid: int):
        self.wfd, self.rfd, self.pid = wfd, rfd, pid
        self.gone: str | None = None
        # what the student's functions changed in place among the arguments a check passed them
        self.changed: list[str] = []

    def request(
        self, message: tuple, timeout: float, callbacks: dict[str, Callable[..., Any]] | None = None
    ) -> dict:
        """Send one request and return its answer, serving the callbacks it makes meanwhile."""
        if self.gone:
            raise SandboxGone(self.gone)
        self._send(pickle.dumps(message))
        graphs: dict[int, tuple[list, list]] = {}  # what a callback's backward pass needs, by key
        while True:
            answer = self._receive(timeout)
            if callbacks is None or not (
                isinstance(answer, dict) and ("callback" in answer or "backward" in answer)
            ):
                return answer
            self._call_back(answer, callbacks, graphs)

    def _send(self, payload: bytes) -> None:
        try:
            send(self.wfd, payload)
        except (BrokenPipeError, OSError) as e:
            self.kill(f"the student's code ended its process ({type(e).__name__})")
            raise SandboxGone(self.gone) from None

    def _receive(self, timeout: float) -> Any:
        import torch

        try:
            ready, _, _ = select.select([self.rfd], [], [], timeout)
            if not ready:
                self.kill(f"the student's code did not finish within {timeout:.0f} s")
                raise SandboxGone(self.gone)
            payload = receive(self.rfd, MAX_MESSAGE)
        except (EOFError, BrokenPipeError, OSError) as e:
            self.kill(f"the student's code ended its process ({type(e).__name__})")
            raise SandboxGone(self.gone) from None
        except ValueError as e:  # over the size limit
            self.kill(f"the student's code sent back too much data ({e})")
            raise SandboxGone(self.gone) from None
        try:
            return torch.load(io.BytesIO(payload), weights_only=True)
        except Exception as e:  # noqa: BLE001 - an answer that is not plain data
            return {
                "error": {"type": "TypeError", "module": "builtins", "message": f"unreadable result: {e}"}
            }

    def _call_back(self, request: dict, callbacks: dict[str, Callable[..., Any]], graphs: dict) -> None:
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
        self._send(pickle.dumps(reply))

    def kill(self, why: str) -> None:
        self.gone = self.gone or why
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass


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


def decode(x: Any, said: str = "your code gave") -> Any:
    """A value from the sandbox; what is not data becomes an ``Opaque`` that says where it came from."""
    if isinstance(x, dict):
        if set(x) == {"__opaque__"}:
            return _opaque(x["__opaque__"], said)
        return {k: decode(v, said) for k, v in x.items()}
    if isinstance(x, list):
        return [decode(v, said) for v in x]
    if isinstance(x, tuple):
        return tuple(decode(v, said) for v in x)
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
    name, module, message = str(info.get("type")), str(info.get("module")), str(info.get("message"))
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
        b = new.detach().to(a.device)
        same = a.shape == b.shape and a.dtype == b.dtype
        if same and not torch.equal(a, b):
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
            try:
                if new.shape == orig.shape and new.dtype == orig.dtype:
                    orig.copy_(new.to(orig.device))
                else:
                    orig.data = new.to(orig.device)
            except Exception:  # noqa: BLE001 - best effort only
                pass


class Proxy:
    """Stands in for one student function; each call runs in the sandbox."""

    def __init__(self, sandbox: Sandbox, name: str, timeout: float):
        self._sandbox, self.__name__, self._timeout = sandbox, name, timeout
        self.__qualname__ = name
        self._substitutes: dict[str, Callable[..., Any]] = {}
        self._forbidden: list[str] = []
        self._called: list[str] = []

    def substituted(self, mapping: dict[str, Callable[..., Any]]) -> contextlib.AbstractContextManager:
        """While active, the names in ``mapping`` that the student's code calls run ``mapping[name]`` here."""

        @contextlib.contextmanager
        def active() -> Iterator[Proxy]:
            before = self._substitutes
            self._substitutes = {**before, **mapping}
            try:
                yield self
            finally:
                self._substitutes = before

        return active()

    def forbidding(self, names: list[str]) -> contextlib.AbstractContextManager:
        """While active, the student's code runs with these functions watched; the value is the list of
        those it called."""

        @contextlib.contextmanager
        def active() -> Iterator[list[str]]:
            before, calls = (self._forbidden, self._called), []
            self._forbidden, self._called = [str(n) for n in names], calls
            try:
                yield calls
            finally:
                self._forbidden, self._called = before

        return active()

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
            pickle.dumps(message)
        except Exception as e:  # noqa: BLE001 - inputs that only make sense in this process
            raise Unverifiable(
                f"its inputs cannot be sent outside the notebook ({type(e).__name__})"
            ) from None
        answer = self._sandbox.request(message, self._timeout + 5, callbacks=dict(self._substitutes))
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


# ------------------------------------------------------------------ the evaluation


def plan(source_cells: list[dict], student_cells: list[dict]) -> list[tuple[dict, list[dict]]]:
    """Pair each source cell with the student cells the sandbox must run before it.

    Student cells are matched to source cells by cell id; a source cell the
    student deleted inherits the position of the source cell before it. Test
    cells never run in the sandbox.
    """
    position = {c["id"]: i for i, c in enumerate(student_cells) if c.get("id")}
    done = 0
    last = 0
    steps = []
    for cell in source_cells:
        if cell["kind"] == "solution":
            continue
        here = position.get(cell["id"], None)
        upto = last if here is None else max(here + 1, last)
        batch = [c for c in student_cells[done:upto] if c["kind"] != "test"]
        done = max(done, upto)
        last = upto
        steps.append((cell, batch))
    rest = [c for c in student_cells[done:] if c["kind"] != "test"]
    if rest:
        steps.append(({"kind": "end", "id": None, "source": ""}, rest))
    return steps


def diagnosis(message: str) -> str | None:
    """The name of the known mistake a check's message names, if any."""
    from grader.registry import exercises

    if "Diagnosis: " not in message:
        return None
    text = message.split("Diagnosis: ", 1)[1]
    best = None
    for ex in exercises().values():
        for trap in ex.traps:
            if text.startswith(trap.name) and (best is None or len(trap.name) > len(best)):
                best = trap.name
    return best or text.split(". ")[0].strip()


def _exec(source: str, label: str, namespace: dict) -> BaseException | None:
    try:
        code = compile(python_source(source), label, "exec")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(code, namespace)
    except BaseException as e:  # noqa: BLE001 - recorded as the verdict
        return e
    return None


_DIAGNOSED = re.compile(r"diagnosed\(\s*[\"'](\w+)[\"']")


def checked_exercise(cell: dict, known: dict) -> str | None:
    """The exercise a test cell checks: named by its grade id, else by the cell's ``diagnosed("name", ...)``."""
    if cell.get("kind") != "test":
        return None
    gid = str(cell.get("grade_id") or "")
    name = max((n for n in known if gid.split("_", 1)[-1].startswith(n + "_")), key=len, default=None)
    if name is None:
        found = _DIAGNOSED.search(str(cell.get("source") or ""))
        name = found.group(1) if found and found.group(1) in known else None
    return name


@contextlib.contextmanager
def _own_exercise_alone(cell: dict, namespace: dict, graded: list[str]) -> Iterator[None]:
    """While a test cell of exercise E runs, every other graded function is the reference.

    Inside E's proxy calls, the functions E uses call the reference (``Exercise.uses``); in the cell
    itself, and in the lesson's helpers it calls (lesson 10's ``read_pattern`` calls ``head_forward``),
    the names E uses and the lesson's other exercises are the reference versions. One mistake costs
    one exercise in the visible checks too: ``merge_heads``' round trip runs on the reference
    ``split_heads``, ``train_head``'s pattern is read with the reference ``head_forward``.
    """
    from grader.registry import exercises

    known = exercises()
    name = checked_exercise(cell, known)
    proxy = namespace.get(name) if name else None
    if name is None or not isinstance(proxy, Proxy):
        yield
        return
    swapped: dict[str, Any] = {n: known[n].reference for n in graded if n != name and n in known}
    swapped.update({n: fn for n, fn in known[name].uses.items() if n != name})
    missing = object()
    saved = {n: namespace.get(n, missing) for n in swapped}
    namespace.update(swapped)
    try:
        with proxy.substituted(known[name].uses) if known[name].uses else contextlib.nullcontext():
            yield
    finally:
        for n, before in saved.items():
            if namespace.get(n, missing) is swapped[n]:
                if before is missing:
                    namespace.pop(n, None)
                else:
                    namespace[n] = before


def evaluate(job: dict, sandbox: Sandbox) -> dict:
    """Run the plan; return the verdict of every test cell."""
    timeout = float(job.get("cell_timeout", 60))
    names = list(job.get("graded_names", []))
    namespace: dict[str, Any] = {
        "__name__": "__main__",
        "__builtins__": builtins,
        "get_ipython": lambda: SHELL,
    }
    verdicts: dict[str, dict] = {}
    sandbox_errors: list[str] = []

    def sync_names() -> None:
        try:
            kinds = sandbox.request(("names", names), timeout + 5).get("names", {})
        except SandboxGone:
            kinds = {n: "callable" for n in names}  # calls will fail with the reason
        for name in names:
            kind = kinds.get(name, "missing")
            if kind == "callable":
                namespace[name] = Proxy(sandbox, name, timeout)
            elif kind == "missing":
                namespace.pop(name, None)
            else:
                try:
                    value = sandbox.request(("get", name), timeout + 5).get("value")
                    namespace[name] = decode(value, f"`{name}` is")
                except SandboxGone:
                    namespace.pop(name, None)

    timings: dict[str, float] = {"sandbox": 0.0, "trusted cells": 0.0}
    for cell, batch in plan(job["source_cells"], job["student_cells"]):
        if batch:
            cells = [(f"<student cell {c.get('id') or '?'}>", c["source"]) for c in batch]
            t = time.perf_counter()
            try:
                answer = sandbox.request(("run", cells), timeout * len(cells) + 5)
                sandbox_errors += [str(e) for e in answer.get("errors", [])]
            except SandboxGone as e:
                sandbox_errors.append(str(e))
            timings["sandbox"] += time.perf_counter() - t
        if cell["kind"] == "end":
            break
        sync_names()
        label = f"<{cell.get('grade_id') or cell['id']}>"
        t = time.perf_counter()
        sandbox.changed = []
        with _own_exercise_alone(cell, namespace, names):
            error = _exec(cell["source"], label, namespace)
        timings["trusted cells"] += time.perf_counter() - t
        if cell["kind"] == "test":
            if error is None and sandbox.changed:
                # a check passes only on the inputs it gave: an answer that changed them in place fails it
                verdicts[cell["grade_id"]] = {
                    "passed": False,
                    "ename": "AssertionError",
                    "message": sandbox.changed[0],
                    "diagnosis": None,
                    "hidden": False,
                }
            elif error is None:
                verdicts[cell["grade_id"]] = {"passed": True}
            elif isinstance(error, Unverifiable):
                verdicts[cell["grade_id"]] = {"passed": None, "message": str(error)}
            else:
                message = _message(error)
                verdicts[cell["grade_id"]] = {
                    "passed": False,
                    "ename": type(error).__name__,
                    "message": message,
                    "diagnosis": diagnosis(message) if isinstance(error, AssertionError) else None,
                    "hidden": _failed_line(error, label) in _hidden_lines(cell["source"]),
                }
    return {
        "verdicts": verdicts,
        "sandbox_errors": sandbox_errors[:50],
        "sandbox_gone": sandbox.gone,
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }


def _hidden_lines(source: str) -> set[int]:
    """Line numbers (from 1) of a test cell's hidden-test blocks, markers included."""
    lines, inside = set(), False
    for number, line in enumerate(source.splitlines(), 1):
        if line.strip() == "### BEGIN HIDDEN TESTS":
            inside = True
        if inside:
            lines.add(number)
        if line.strip() == "### END HIDDEN TESTS":
            inside = False
    return lines


def _failed_line(error: BaseException, label: str) -> int | None:
    """The line of the cell where the error left the cell's own code."""
    tb = error.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == label:
            line = tb.tb_lineno
            break
        tb = tb.tb_next
    return line


def _message(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # noqa: BLE001
        text = ""
    if isinstance(error, NameError) and not text:
        text = "a name is not defined"
    return text[:4000]


def main(job_path: str, to_sandbox: int, from_sandbox: int, sandbox_pid: int) -> None:
    start = time.perf_counter()
    # the lesson's visible checks decide here as they do while graded: a failure raises, never a note
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    with open(job_path) as f:
        job = json.load(f)
    sandbox = Sandbox(to_sandbox, from_sandbox, sandbox_pid)
    from grader.lessons._common import salted

    try:
        with salted(int(job.get("salt") or 0)):  # this submission's own hidden inputs
            result = evaluate(job, sandbox)
    finally:
        sandbox.kill("finished")
    result["seconds"] = round(time.perf_counter() - start, 3)
    tmp = job["result_path"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, job["result_path"])
