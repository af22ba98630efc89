"""The check harness behind every hidden test.

``check(name, student_fn)`` runs a student's function on seeded cases (all
different sizes, 2-D to 4-D, float32 and float64, on CPU and on CUDA when there
is one), compares each result with the hidden reference on the same inputs and
device, and on the first disagreement raises an ``AssertionError`` whose message
says what differs. A known mistake (a ``Trap``) is named only when it reproduces
what the student's function did on every case checked, not just the failing one.

Rules a lesson states are graded: a call to a forbidden function
(``Exercise.forbidden``) fails the check with the rule's own words. An exercise
that builds on earlier ones is checked on top of the reference versions of those
(``Exercise.uses``), so one mistake costs one exercise.

Every tensor a student returns must stay on the device, and keep the floating
dtype, of the inputs. Cases in float16 or bfloat16 (see ``low_precision_cases``)
are compared with the reference computed in float32 and rounded to the case's
dtype, within that dtype's tolerance (``TOLERANCES``, or an exercise's own
``tolerances`` where it composes many rounding steps).

It writes nothing to stdout or stderr: warnings and prints of student code are
captured, so nbgrader never zeroes a cell because of them.

Cases, tolerances and the comparison of one result with the reference's are in
``grader.cases``; every public name of it is importable from here too.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attention_course.diagnosis import explain_shape_error, substituted, watch_shapes
from attention_course.watch import CallWatch, Watched, all_tensors, mark
from grader.cases import (  # noqa: F401 - re-exported: lessons import them from the harness
    LOW_PRECISION,
    TOLERANCES,
    Case,
    _cast_floating,
    _wrong_device,
    _wrong_dtype,
    compare_outputs,
    compare_tensor,
    describe_value,
    devices,
    fmt_number,
    input_placement,
    kind_of_call,
    low_precision_cases,
    meta_problem,
    on_meta,
    tolerance,
)
from grader.classroom.sandbox import _resolve  # the one resolver: the sandbox cannot import grader

# ------------------------------------------------------------------ data types


@dataclass
class Trap:
    """A known mistake: what it computes, its name, and the idea to revisit.

    ``example`` is the line of student code that makes it (for docs/mistakes.md).
    """

    name: str
    hint: str
    fn: Callable[..., Any]
    example: str = ""


@dataclass
class Property:
    """A check across several calls (e.g. that a random result depends on its generator).

    ``check(fn)`` calls fn as it needs and returns None when the property holds, else
    one sentence saying what is wrong.
    """

    label: str
    check: Callable[[Callable[..., Any]], str | None]


@dataclass
class Outcome:
    """What a call produced: a value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None
    inputs: tuple = ()  # the copies of the arguments the call received

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass(kw_only=True)
class Exercise:
    """Everything the harness needs to grade one function.

    ``name`` and ``signature`` (``"Q, K, V, mask=None"``) default to the reference's own.
    """

    reference: Callable[..., Any]
    cases: Callable[[torch.device], list[Case]]
    name: str = ""
    signature: str = ""
    traps: Sequence[Trap] = ()
    output_names: Sequence[str] | None = None  # names of the parts of a tuple result
    compare: Callable[[Any, Any, str], str | None] | None = None  # custom comparison
    # per-dtype (rtol, atol) that replace TOLERANCES for this exercise, e.g. a looser
    # bfloat16 tolerance for a function that rounds after every one of several steps
    tolerances: dict[torch.dtype, tuple[float, float]] = field(default_factory=dict)
    # qualified name -> the rule the lesson states, e.g. {"torch.softmax": "Do not call torch.softmax ..."}
    forbidden: dict[str, str] = field(default_factory=dict)
    # names in the student's namespace replaced by the reference while the check runs
    uses: dict[str, Callable[..., Any]] = field(default_factory=dict)
    properties: Sequence[Property] = ()
    # whether two outcomes agree, for naming a mistake (default: the comparison of results)
    same: Callable[[Any, Any, Case], bool] | None = None
    # what a result is compared with (default: the reference's result on the same inputs), e.g. the
    # population a random estimate must come close to
    expected: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        self.name = self.name or self.reference.__name__
        if not self.signature:
            params = inspect.signature(self.reference).parameters.values()
            self.signature = ", ".join(
                p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in params
            )


# ------------------------------------------------------------------ describing


def describe_call(ex: Exercise, case: Case) -> str:
    names = [p.strip().split("=")[0] for p in ex.signature.split(",")]
    parts = []
    for i, a in enumerate(case.args):
        label = names[i] if i < len(names) else f"arg{i}"
        parts.append(f"{label} {describe_value(a)}")
    parts += [f"{k}={describe_value(v)}" for k, v in case.kwargs.items()]
    return "; ".join(parts)


# ------------------------------------------------------------------ running


def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clone(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_clone(v) for v in x)
    if isinstance(x, torch.Generator):  # a copy in the same state
        g = torch.Generator(device=x.device)
        g.set_state(x.get_state())
        return g
    return x


def run(fn: Callable[..., Any], case: Case) -> Outcome:
    """Call fn on a fresh copy of the case's inputs; never lets warnings or prints through."""
    args, kwargs = _clone(case.args), _clone(case.kwargs)
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        try:
            return Outcome(value=fn(*args, **kwargs), inputs=args)
        except Exception as e:  # noqa: BLE001 - the student's error is reported, not raised
            return Outcome(error=e, inputs=args)


# ------------------------------------------------------------------ comparing


def _same_outcome(ex: Exercise, a: Outcome, b: Outcome, case: Case) -> bool:
    if a.failed or b.failed:
        if not (a.failed and b.failed and type(a.error) is type(b.error)):
            return False
        # an overflow is an overflow however it is worded (math.exp vs math.e ** x)
        return isinstance(a.error, ArithmeticError) or str(a.error) == str(b.error)
    if ex.same is not None:
        return ex.same(a.value, b.value, case)
    return _comparer(ex)(a.value, b.value, case.label) is None


def _comparer(ex: Exercise) -> Callable[[Any, Any, str], str | None]:
    return ex.compare or (lambda e, g, w: compare_outputs(e, g, ex.name, ex.output_names, ex.tolerances))


@dataclass
class Record:
    """One case of a check: the inputs, the reference's outcome and the student's."""

    case: Case
    expected: Outcome
    student: Outcome
    problem: str | None = None  # what is wrong with the student's outcome (None: right)


def reproduces(
    ex: Exercise, trap: Trap, records: Sequence[Record], properties: dict[str, str | None] | None = None
) -> bool:
    """Whether trap.fn does what the student's function did on every case (and property) checked."""
    # the failing cases first: most traps differ there, so the search stops early
    for record in sorted(records, key=lambda r: r.problem is None):
        if not _same_outcome(ex, run(trap.fn, record.case), record.student, record.case):
            return False
    for prop in ex.properties:
        if properties is not None and prop.label in properties:
            with _quiet():
                held = prop.check(trap.fn) is None
            if held != (properties[prop.label] is None):
                return False
    return True


def diagnose(
    ex: Exercise, records: Sequence[Record], properties: dict[str, str | None] | None = None
) -> Trap | None:
    """The first known mistake that reproduces the student's outcome on every case checked."""
    for trap in ex.traps:
        if reproduces(ex, trap, records, properties):
            return trap
    return None


# ------------------------------------------------------------------ rules and substitutes


class _Watch:
    """Records calls of forbidden functions made while the student's code runs."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.active = False
        self.forbidden: list[str] = []
        self.remote = False  # the student's code runs elsewhere, which watches it there

    def around(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """fn run under a ``CallWatch``: a forbidden function called by any alias, and how lesson 11's
        watched inputs were read (noted on the result), are seen at the level of every torch operation."""
        if self.remote:
            return fn
        watch = self

        def call(*args: Any, **kwargs: Any) -> Any:
            if not watch.forbidden and not any(isinstance(t, Watched) for t in all_tensors((args, kwargs))):
                return fn(*args, **kwargs)  # no rule to hold it to: a watch would see nothing (and slow it)
            with CallWatch(watch.forbidden, (args, kwargs)) as seen:
                try:
                    value = fn(*args, **kwargs)
                finally:
                    watch.calls += [n for n in seen.calls if n not in watch.calls]
            return mark(value, CallWatch.verdict(seen, value))  # the class's, whatever the call set on seen

        return call

    def wrap(self, original: Callable, name: str) -> Callable:
        watch = self

        @functools.wraps(original)
        def watched(*args: Any, **kwargs: Any) -> Any:
            if watch.active and name not in watch.calls:
                watch.calls.append(name)
            return original(*args, **kwargs)

        return watched


@contextlib.contextmanager
def watching(student_fn: Any, forbidden: dict[str, str]) -> Iterator[_Watch]:
    """Patch every forbidden function with a wrapper that records the call and still computes.

    A stand-in that runs elsewhere provides its own ``forbidding(names)``, a context manager
    whose value is the list of the names called. Names bound in a plain function's module
    (``from torch import softmax``) are patched there too. Everything is restored afterwards.
    """
    watch = _Watch()
    own = getattr(student_fn, "forbidding", None)
    watch.forbidden = list(forbidden)
    watch.remote = callable(own) and not hasattr(student_fn, "__globals__")
    if not forbidden:
        yield watch
        return
    if watch.remote:
        with own(list(forbidden)) as calls:
            watch.calls = calls
            watch.active = True
            yield watch
        return
    with contextlib.ExitStack() as undo:  # undoes every patch, last first
        for name in forbidden:
            owner, attr = _resolve(name)
            original = getattr(owner, attr)
            wrapper = watch.wrap(original, name)
            if attr in vars(owner):
                undo.callback(setattr, owner, attr, original)
            else:  # inherited: removing the patch uncovers the original again
                undo.callback(delattr, owner, attr)
            setattr(owner, attr, wrapper)
            space = getattr(student_fn, "__globals__", None)
            if isinstance(space, dict):
                for key, value in list(space.items()):
                    if value is original:
                        undo.callback(space.__setitem__, key, original)
                        space[key] = wrapper
        yield watch


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        yield


def outcomes(
    ex: Exercise, fn: Callable[..., Any], on: Sequence[torch.device | str] | None = None
) -> tuple[list[Record], dict[str, str | None]]:
    """What fn does on every case and property of an exercise (no rules, no substitutes)."""
    records = []
    for device in devices() if on is None else [torch.device(d) for d in on]:
        for case in ex.cases(device):
            records.append(Record(case, run_reference(ex, case), run(fn, case)))
    with _quiet():
        properties = {prop.label: prop.check(fn) for prop in ex.properties}
    return records, properties


# ------------------------------------------------------- devices and dtypes


def placement_problem(ex: Exercise, case: Case, expected: Any, got: Any) -> str | None:
    """None unless a tensor result left the inputs' device or floating dtype where the reference kept it."""
    if ex.compare is not None:
        return None
    device, dtype = input_placement(case)
    if ex.output_names is None:
        parts = [(f"The result of {ex.name}", expected, got)]
    elif isinstance(got, (tuple, list)) and len(got) == len(expected):
        parts = list(zip(ex.output_names, expected, got))
    else:
        return None  # compare_outputs says what is wrong with the result's structure
    for what, e, g in parts:
        if not (isinstance(e, torch.Tensor) and isinstance(g, torch.Tensor)):
            continue
        if device is not None and e.device == device and g.device != device:
            return _wrong_device(what, g.device, device)
        floating = e.is_floating_point() and g.is_floating_point()
        if dtype is not None and floating and e.dtype == dtype and g.dtype != dtype:
            return _wrong_dtype(what, g.dtype, dtype)
    return None


def run_reference(ex: Exercise, case: Case) -> Outcome:
    """The reference's outcome; for float16/bfloat16 inputs, computed in float32 and rounded back."""
    if ex.expected is not None:
        return run(ex.expected, case)
    _, dtype = input_placement(case)
    if dtype not in LOW_PRECISION:
        return run(ex.reference, case)
    wide = Case(
        case.label,
        _cast_floating(case.args, torch.float32, LOW_PRECISION),
        _cast_floating(case.kwargs, torch.float32, LOW_PRECISION),
    )
    outcome = run(ex.reference, wide)
    if not outcome.failed:
        outcome.value = _cast_floating(outcome.value, dtype, (torch.float32,))
    return outcome


# ------------------------------------------------------------------ the check


def _fail(ex: Exercise, case: Case | str | None, problem: str, trap: Trap | None) -> AssertionError:
    lines = [f"{ex.name}({ex.signature}) is not right yet."]
    if isinstance(case, Case):
        lines += [f"  Case: {case.label}", f"  Inputs: {describe_call(ex, case)}"]
    elif case:
        lines.append(f"  Case: {case}")
    lines.append(f"  What differs: {_cut(problem, MAX_PROBLEM)}")
    if trap is not None:
        lines.append(f"  Diagnosis: {trap.name}. {trap.hint}")
    error = AssertionError("\n".join(lines))
    error.mistake = (
        trap.name if trap is not None else None
    )  # what a grader records (never read from the text)
    return error


# Feedback says what differs on the first failing case, never more: a message of the student's own
# (an error's text, the repr of what was returned) is cut, so no feedback page lists the hidden inputs.
MAX_PROBLEM = 600
MAX_STUDENT_TEXT = 240


def _cut(text: str, limit: int) -> str:
    text = " ".join(str(text).split()) if len(text) > limit else text
    return text if len(text) <= limit else text[: limit - 1] + "\u2026 (cut)"


def _inputs_changed(original: tuple, after: tuple) -> str | None:
    for i, (a, b) in enumerate(zip(original, after)):
        if isinstance(a, torch.Tensor) and a.device.type != "meta":
            if a.shape != b.shape or not torch.equal(a, b):
                return (
                    f"your function changed its input number {i + 1} in place "
                    "(e.g. masked_fill_ or +=): work on a new tensor instead."
                )
    return None


def is_stub(err: BaseException) -> bool:
    """Whether an error is an exercise's bare ``raise NotImplementedError()`` (not written yet).

    A NotImplementedError with a message (the student's own "only float32 here", or PyTorch's) is an
    error like any other: the check reports it on its case.
    """
    return isinstance(err, NotImplementedError) and not str(err)


def _raised(fn: Any, case: Case, err: BaseException) -> str:
    """What a raised error means, with a shape error put into words (naming both shapes)."""
    problem = f"it raised {type(err).__name__}: {_cut(_text(err), MAX_STUDENT_TEXT)}"
    if isinstance(err, RuntimeError):
        if hasattr(fn, "__globals__"):  # run it again, watching which shapes met
            with watch_shapes():
                again = run(fn, case)
            if again.failed and type(again.error) is type(err):
                err = again.error
        words = explain_shape_error(err)
        if words:
            problem += " " + words
    return problem


def _text(err: BaseException) -> str:
    try:
        return str(err)
    except Exception:  # noqa: BLE001 - a student's exception whose __str__ fails
        return ""


def _forbidden_message(ex: Exercise, calls: Sequence[str]) -> str:
    rules = dict.fromkeys(ex.forbidden[c] for c in calls if c in ex.forbidden)
    names = ", ".join(calls)
    return f"{ex.name} calls {names}, which this exercise rules out. The rule: " + " ".join(rules)


def course_helper(fn: Any) -> str | None:
    """The qualified name of the student-package callable that fn is, or wraps; None if it is the student's own."""
    import attention_course

    package = str(Path(attention_course.__file__).resolve().parent)
    seen: set[int] = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        module = str(getattr(fn, "__module__", "") or "")
        code = getattr(fn, "__code__", None)
        filename = str(Path(code.co_filename).resolve()) if code is not None else ""
        if module.split(".")[0] == "attention_course" or filename.startswith(package):
            return f"{module}.{getattr(fn, '__qualname__', type(fn).__name__)}"
        fn = getattr(fn, "func", None) or getattr(fn, "__wrapped__", None)
    return None


def _on_meta(ex: Exercise, fn: Callable[..., Any], case: Case) -> tuple[Case, str | None]:
    """The case tried again on 'meta' (``grader.cases.on_meta``), and what fn got wrong there (None: right,
    or not judged). Every reference keeps each tensor of its result there (tests/test_devices.py checks it),
    so it need not run: 'meta' runs every operation in Python, and its first use loads about 1 s of code."""
    moved = on_meta(case)
    if moved is None:
        return case, None
    got = run(fn, moved)
    error = None if got.error is None else (got.error, _cut(_text(got.error), MAX_STUDENT_TEXT))
    return moved, meta_problem(got.value, error, ex.output_names, ex.name)


def check_exercise(ex: Exercise, student_fn: Any, on: Sequence[torch.device | str] | None = None) -> None:
    """Raise AssertionError with an actionable message unless student_fn is right.

    ``on`` limits the devices checked (default: every device of ``devices()``).
    """
    if not callable(student_fn):
        raise AssertionError(f"{ex.name} should be a function, but it is {type(student_fn).__name__}.")
    helper = course_helper(student_fn)
    if helper:
        raise AssertionError(
            f"{ex.name} is the course's helper code ({helper}), not your own: write the function yourself."
        )
    records: list[Record] = []
    properties: dict[str, str | None] = {}
    with substituted(student_fn, ex.uses), watching(student_fn, ex.forbidden) as watch:
        for device in devices() if on is None else [torch.device(d) for d in on]:
            for case in ex.cases(device):
                expected = run_reference(ex, case)
                if expected.failed:  # a harness bug, never the student's fault
                    raise RuntimeError(f"reference failed on {case.label}: {expected.error!r}")
                watch.active = True
                try:
                    student = run(watch.around(student_fn), case)
                finally:
                    watch.active = False
                if student.failed and is_stub(student.error):
                    raise AssertionError(
                        f"{ex.name} is not implemented yet: replace `raise NotImplementedError()` "
                        "with your code, then run this cell again."
                    )
                records.append(Record(case, expected, student))
        # properties count for naming a mistake even when a case already failed
        for prop in ex.properties:
            watch.active = True
            try:
                with _quiet():
                    properties[prop.label] = prop.check(student_fn)
            finally:
                watch.active = False
        calls = list(watch.calls)
        if calls:
            raise _fail(ex, None, _forbidden_message(ex, calls), None)
        for record in records:
            case, student = record.case, record.student
            if student.failed:
                record.problem = _raised(student_fn, case, student.error)
            else:
                record.problem = placement_problem(
                    ex, case, record.expected.value, student.value
                ) or _comparer(ex)(record.expected.value, student.value, case.label)
        for record in records:
            if record.problem:
                raise _fail(ex, record.case, record.problem, diagnose(ex, records, properties))
            changed = _inputs_changed(record.case.args, record.student.inputs)
            if changed:
                raise _fail(ex, record.case, changed, None)
        for label, problem in properties.items():
            if problem:
                raise _fail(ex, label, problem, diagnose(ex, records, properties))
        # right on every device tried: on the CPU's cases, the results must also follow a GPU's inputs
        # (one case of each kind of call: 'meta' runs every operation in Python, not fast)
        kinds = set()
        for record in records:
            if kind_of_call(record.case) not in kinds:
                kinds.add(kind_of_call(record.case))
                case, problem = _on_meta(ex, student_fn, record.case)
                if problem:  # a known mistake it does is one that is right here and wrong on 'meta' too
                    traps = (t for t in ex.traps if _on_meta(ex, t.fn, record.case)[1])
                    raise _fail(
                        ex, case, problem, next((t for t in traps if reproduces(ex, t, records)), None)
                    )
