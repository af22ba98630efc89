"""A check's cases, and how a result on one is compared with the reference's (``grader.harness``).

A ``Case`` is one call of a graded function; cases run on every device of ``devices()``, in the
dtypes their inputs have (float16 and bfloat16 copies from ``low_precision_cases``), and a result
is compared within its dtype's tolerance (``TOLERANCES``), with one sentence that says what differs.
The harness re-exports every public name here: a lesson imports them from ``grader.harness``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attention_course.checks import MIXED, to_meta
from attention_course.watch import all_tensors


@dataclass
class Case:
    """One call of a graded function: its arguments and a readable label."""

    label: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


# ------------------------------------------------------------------ tolerances

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    # dtype: (rtol, atol)
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}


LOW_PRECISION = (torch.float16, torch.bfloat16)


def tolerance(
    dtype: torch.dtype, overrides: dict[torch.dtype, tuple[float, float]] | None = None
) -> tuple[float, float]:
    """(rtol, atol) used to compare results of this dtype (an exercise's overrides first)."""
    if overrides and dtype in overrides:
        return overrides[dtype]
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
    if isinstance(
        x, dict
    ):  # a tensor inside is described as one too, never printed (its values are hidden inputs)
        return "{" + ", ".join(f"{k}: {describe_value(v)}" for k, v in x.items()) + "}"
    if isinstance(x, list | tuple) and any(isinstance(v, torch.Tensor | dict | list | tuple) for v in x):
        inner = ", ".join(describe_value(v) for v in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner}{',' if len(x) == 1 else ''})"
    return repr(x)


def fmt_number(x: float) -> str:
    if isinstance(x, bool):
        return str(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return f"{x:.6g}"


# ------------------------------------------------------------------ comparing


def compare_tensor(
    expected: Any,
    got: Any,
    what: str,
    tolerances: dict[torch.dtype, tuple[float, float]] | None = None,
) -> str | None:
    """None if got matches expected; else one sentence saying what differs."""
    if not isinstance(got, torch.Tensor):
        return f"{what} should be a torch.Tensor, but it is {type(got).__name__}."
    if got.device != expected.device:
        return _wrong_device(what, got.device, expected.device)
    if got.dtype != expected.dtype:
        return _wrong_dtype(what, got.dtype, expected.dtype)
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
        rtol, atol = tolerance(expected.dtype, tolerances)
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


def _wrong_device(what: str, got: torch.device, want: torch.device) -> str:
    return (
        f"{what} is on {got}, but the inputs were on {want}: "
        "keep every tensor on the device of the inputs (no .cpu(), no torch.tensor(...) "
        "without device=)."
    )


def _wrong_dtype(what: str, got: torch.dtype, want: torch.dtype) -> str:
    why = (
        "a mask is boolean: True where looking is allowed"
        if want == torch.bool
        else "the dtype of the inputs"
    )
    return (
        f"{what} has dtype {str(got).replace('torch.', '')}, expected "
        f"{str(want).replace('torch.', '')} ({why})."
    )


def compare_outputs(
    expected: Any,
    got: Any,
    name: str,
    output_names: Sequence[str] | None,
    tolerances: dict[torch.dtype, tuple[float, float]] | None = None,
) -> str | None:
    """Compare a tensor or a tuple of tensors, part by part."""
    if output_names is None:
        return compare_tensor(expected, got, f"The result of {name}", tolerances)
    if not isinstance(got, (tuple, list)) or len(got) != len(expected):
        return (
            f"{name} should return {len(expected)} things ({', '.join(output_names)}), "
            f"but it returned {describe_value(got) if not isinstance(got, (tuple, list)) else f'{len(got)} things'}."
        )
    for part, e, g in zip(output_names, expected, got):
        problem = compare_tensor(e, g, part, tolerances)
        if problem:
            return problem
    return None


# ------------------------------------------------------- devices and dtypes


def input_placement(case: Case) -> tuple[torch.device | None, torch.dtype | None]:
    """The device of a case's tensor inputs and the dtype of its floating ones (None if not shared)."""
    tensors = all_tensors(case.args) + all_tensors(case.kwargs)
    placed = {t.device for t in tensors}
    floating = {t.dtype for t in tensors if t.is_floating_point()}
    return (
        placed.pop() if len(placed) == 1 else None,
        floating.pop() if len(floating) == 1 else None,
    )


def _cast_floating(x: Any, dtype: torch.dtype, only: Sequence[torch.dtype] | None = None) -> Any:
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() and (only is None or x.dtype in only):
            return x.to(dtype)
        return x
    if isinstance(x, dict):
        return {k: _cast_floating(v, dtype, only) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_cast_floating(v, dtype, only) for v in x)
    return x


def low_precision_cases(cases: Sequence[Case], dtypes: Sequence[torch.dtype] = LOW_PRECISION) -> list[Case]:
    """Copies of cases with every floating tensor input in float16 / bfloat16 (one per label).

    An exercise opts in with e.g. ``cases=lambda d: _qk_cases(d) + low_precision_cases(_qk_cases(d))``.
    """
    made: dict[str, Case] = {}
    for case in cases:
        _, dtype = input_placement(case)
        if dtype is None:
            continue
        for low in dtypes:
            name = str(low).replace("torch.", "")
            label, n = re.subn(r"\bfloat(16|32|64)\b|\bbfloat16\b", name, case.label)
            if not n:
                label = f"{case.label}, {name}"
            made.setdefault(
                label, Case(label, _cast_floating(case.args, low), _cast_floating(case.kwargs, low))
            )
    return list(made.values())


# ------------------------------------------------------- 'meta': a GPU's stand-in on any machine

CPU, META = torch.device("cpu"), torch.device("meta")


def on_meta(case: Case) -> Case | None:
    """A CPU case with its tensors, and its ``device=``, on PyTorch's 'meta' device, which stands in for a
    GPU on any machine (no data: only shapes, dtypes and devices); None for a case that is not the CPU's
    or has nothing to move (its result is where a CPU-only machine makes it)."""
    given = case.kwargs.get("device")
    placed = {
        input_placement(case)[0],
        torch.device(given) if isinstance(given, (str, torch.device)) else None,
    }
    if not placed <= {None, CPU} or placed == {None}:
        return None
    kwargs = to_meta(case.kwargs)
    if isinstance(given, (str, torch.device)):
        kwargs["device"] = "meta" if isinstance(given, str) else META
    return Case(
        f"{case.label.replace('cpu', 'meta')} ('meta' stands in for a GPU)", to_meta(case.args), kwargs
    )


def kind_of_call(case: Case) -> tuple:
    """What tells two calls apart for the 'meta' pass: each argument's type, a tensor's rank and dtype."""

    def kind(v: Any) -> Any:
        return ("tensor", v.dim(), v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__

    return tuple(kind(a) for a in case.args) + tuple((k, kind(v)) for k, v in sorted(case.kwargs.items()))


def meta_problem(
    got: Any, error: tuple[BaseException, str] | None, names: Sequence[str] | None, name: str
) -> str | None:
    """What a function did wrong on a case moved to 'meta' (``on_meta``), given its result there (or its
    error and the error's text): a tensor of the result not on 'meta', or PyTorch refusing to mix the two
    devices. Any other error is not judged: 'meta' holds no values to read (``.item()``, ``int(t)``,
    printing), and correct code is never failed for that."""
    fix = "Make new tensors on the device of the inputs (device=X.device, torch.zeros_like(X)) or on the device= given."
    if error is not None:
        said = error[1].splitlines()[0] if error[1] else ""
        if isinstance(error[0], RuntimeError) and any(words in said for words in MIXED):
            return f'it mixed two devices: PyTorch says "{said}". A tensor made inside it without device= lives on the CPU. {fix}'
        return None
    made = all_tensors(got)
    for i, g in enumerate(made):
        if g.device != META:
            what = f"`{names[i]}`" if names and len(names) == len(made) else f"The result of {name}"
            return f"{what} came back on {g.device.type}: the result was made on the wrong device. {fix}"
    return None
