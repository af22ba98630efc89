"""The check harness behind every hidden test.

``check(name, student_fn)`` runs a student's function on seeded cases (all
different sizes, 2-D to 4-D, float32 and float64, on CPU and on CUDA when there
is one), compares each result with the hidden reference on the same inputs and
device, and on the first disagreement raises an ``AssertionError`` whose message
says what differs and, when the result matches a known mistake, names it.

It writes nothing to stdout or stderr: warnings raised by student code are
captured, so nbgrader never zeroes a cell because of them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# ------------------------------------------------------------------ data types


@dataclass
class Case:
    """One call of a graded function: its arguments and a readable label."""

    label: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


@dataclass
class Trap:
    """A known mistake: what it computes, its name, and the idea to revisit."""

    name: str
    hint: str
    fn: Callable[..., Any]


@dataclass
class Outcome:
    """What a call produced: a value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None
    inputs: tuple = ()  # the copies of the arguments the call received

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass
class Exercise:
    """Everything the harness needs to grade one function."""

    name: str
    signature: str
    reference: Callable[..., Any]
    cases: Callable[[torch.device], list[Case]]
    traps: Sequence[Trap] = ()
    output_names: Sequence[str] | None = None  # names of the parts of a tuple result
    compare: Callable[[Any, Any, str], str | None] | None = None  # custom comparison
    runs_on_meta: bool = False


# ------------------------------------------------------------------ tolerances

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    # dtype: (rtol, atol)
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) used to compare results of this dtype."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def devices() -> list[torch.device]:
    """CPU always, plus the first CUDA device when one is present."""
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found.append(torch.device("cuda"))
    return found


# ------------------------------------------------------------------ describing


def describe_value(x: Any) -> str:
    """A short description of an argument or result, e.g. ``(2, 5, 7) float32 on cpu``."""
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)} {str(x.dtype).replace('torch.', '')} on {x.device}"
    if isinstance(x, torch.Generator):
        return "a torch.Generator"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in x.items()) + "}"
    return repr(x)


def describe_call(ex: Exercise, case: Case) -> str:
    names = [p.strip().split("=")[0] for p in ex.signature.split(",")]
    parts = []
    for i, a in enumerate(case.args):
        label = names[i] if i < len(names) else f"arg{i}"
        parts.append(f"{label} {describe_value(a)}")
    parts += [f"{k}={describe_value(v)}" for k, v in case.kwargs.items()]
    return "; ".join(parts)


def fmt_number(x: float) -> str:
    if isinstance(x, bool):
        return str(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return f"{x:.6g}"


# ------------------------------------------------------------------ running


def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, torch.Generator):
        g = torch.Generator(device=x.device)
        g.set_state(x.get_state())
        return g
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clone(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_clone(v) for v in x)
    return x


def run(fn: Callable[..., Any], case: Case) -> Outcome:
    """Call fn on a fresh copy of the case's inputs; never lets warnings through."""
    args, kwargs = _clone(case.args), _clone(case.kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return Outcome(value=fn(*args, **kwargs), inputs=args)
        except Exception as e:  # noqa: BLE001 - the student's error is reported, not raised
            return Outcome(error=e, inputs=args)


# ------------------------------------------------------------------ comparing


def compare_tensor(expected: Any, got: Any, what: str) -> str | None:
    """None if got matches expected; else one sentence saying what differs."""
    if not isinstance(got, torch.Tensor):
        return f"{what} should be a torch.Tensor, but it is {type(got).__name__}."
    if got.device != expected.device:
        return (
            f"{what} is on {got.device}, but the inputs were on {expected.device}: "
            "keep every tensor on the device of the inputs (no .cpu(), no torch.tensor(...) "
            "without device=)."
        )
    if got.dtype != expected.dtype:
        return (
            f"{what} has dtype {str(got.dtype).replace('torch.', '')}, expected "
            f"{str(expected.dtype).replace('torch.', '')} (the dtype of the inputs)."
        )
    if got.shape != expected.shape:
        msg = f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}."
        if got.dim() >= 2 and got.shape == expected.transpose(-2, -1).shape:
            msg += " Its last two dimensions are swapped: is something transposed?"
        return msg
    if expected.device.type == "meta":
        return None
    if expected.dtype == torch.bool:
        bad = got != expected
    else:
        rtol, atol = tolerance(expected.dtype)
        close = torch.isclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)
        bad = ~close
    if not bool(bad.any()):
        return None
    index = tuple(int(i) for i in bad.nonzero()[0].tolist())
    e, g = expected[index].item(), got[index].item()
    where = "[" + ", ".join(map(str, index)) + "]"
    msg = (
        f"{what}: {int(bad.sum())} of {bad.numel()} entries differ; "
        f"the first at {where}: expected {fmt_number(e)}, got {fmt_number(g)}."
    )
    if expected.is_floating_point():
        if bool(torch.isnan(got).any()) and not bool(torch.isnan(expected).any()):
            msg += " Your result contains NaN."
    return msg


def compare_outputs(expected: Any, got: Any, name: str, output_names: Sequence[str] | None) -> str | None:
    """Compare a tensor or a tuple of tensors, part by part."""
    if output_names is None:
        return compare_tensor(expected, got, f"The result of {name}")
    if not isinstance(got, (tuple, list)) or len(got) != len(expected):
        return (
            f"{name} should return {len(expected)} things ({', '.join(output_names)}), "
            f"but it returned {describe_value(got) if not isinstance(got, (tuple, list)) else f'{len(got)} things'}."
        )
    for part, e, g in zip(output_names, expected, got):
        problem = compare_tensor(e, g, part)
        if problem:
            return problem
    return None


def _same_outcome(ex: Exercise, a: Outcome, b: Outcome, case: Case) -> bool:
    if a.failed or b.failed:
        return a.failed and b.failed and type(a.error) is type(b.error) and str(a.error) == str(b.error)
    compare = ex.compare or (lambda e, g, w: compare_outputs(e, g, ex.name, ex.output_names))
    return compare(a.value, b.value, case.label) is None


def diagnose(ex: Exercise, case: Case, student: Outcome) -> Trap | None:
    """The first known mistake that produces exactly what the student produced."""
    for trap in ex.traps:
        if _same_outcome(ex, run(trap.fn, case), student, case):
            return trap
    return None


# ------------------------------------------------------------------ the check


def _fail(ex: Exercise, case: Case, problem: str, trap: Trap | None) -> AssertionError:
    lines = [
        f"{ex.name}({ex.signature}) is not right yet.",
        f"  Case: {case.label}",
        f"  Inputs: {describe_call(ex, case)}",
        f"  What differs: {problem}",
    ]
    if trap is not None:
        lines.append(f"  Diagnosis: {trap.name}. {trap.hint}")
    return AssertionError("\n".join(lines))


def _inputs_changed(original: tuple, after: tuple) -> str | None:
    for i, (a, b) in enumerate(zip(original, after)):
        if isinstance(a, torch.Tensor) and a.device.type != "meta":
            if a.shape != b.shape or not torch.equal(a, b):
                return (
                    f"your function changed its input number {i + 1} in place "
                    "(e.g. masked_fill_ or +=): work on a new tensor instead."
                )
    return None


def check_exercise(ex: Exercise, student_fn: Any) -> None:
    """Raise AssertionError with an actionable message unless student_fn is right."""
    if not callable(student_fn):
        raise AssertionError(f"{ex.name} should be a function, but it is {type(student_fn).__name__}.")
    for device in devices():
        for case in ex.cases(device):
            expected = run(ex.reference, case)
            if expected.failed:  # a harness bug, never the student's fault
                raise RuntimeError(f"reference failed on {case.label}: {expected.error!r}")
            student = run(student_fn, case)
            changed = _inputs_changed(case.args, student.inputs)
            if student.failed:
                err = student.error
                if isinstance(err, NotImplementedError):
                    raise AssertionError(
                        f"{ex.name} is not implemented yet: replace `raise NotImplementedError()` "
                        "with your code, then run this cell again."
                    )
                problem = f"it raised {type(err).__name__}: {err}"
                raise _fail(ex, case, problem, diagnose(ex, case, student))
            compare = ex.compare or (lambda e, g, w: compare_outputs(e, g, ex.name, ex.output_names))
            problem = compare(expected.value, student.value, case.label)
            if problem:
                raise _fail(ex, case, problem, diagnose(ex, case, student))
            if changed:
                raise _fail(ex, case, changed, None)
