"""Visible self-checks: small assertions whose messages a student can act on.

These compare against the numbers printed in the lessons; the hidden tests go
further (random, batched inputs on every device). In a student's session a failed
check reports and goes on (``diagnosed``); ``where_you_stand`` sums up what ran.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attention_course.diagnosis import CHECKS, diagnosed, graded

__all__ = ["diagnosed", "expect_shape", "expect_values", "is_implemented", "where_you_stand"]


def expect_shape(t: object, shape: Sequence[int], what: str) -> None:
    """Assert that ``t`` is a tensor of the given shape; say which shape it had."""
    assert isinstance(t, torch.Tensor), f"{what} should be a torch.Tensor, but it is {type(t).__name__}."
    assert tuple(t.shape) == tuple(shape), f"{what} has shape {tuple(t.shape)}, expected {tuple(shape)}." + (
        " Its last two dimensions are swapped: is something transposed?"
        if t.dim() >= 2 and tuple(t.shape[:-2]) + (t.shape[-1], t.shape[-2]) == tuple(shape)
        else ""
    )


def expect_values(t: object, expected: Sequence, what: str, decimals: int = 2) -> None:
    """Assert that ``t`` rounds to ``expected`` at ``decimals`` places; show the first difference."""
    want = torch.tensor(expected, dtype=torch.float64)
    expect_shape(t, want.shape, what)
    got = t.detach().to("cpu", torch.float64)
    assert not torch.isnan(got).any(), f"{what} contains NaN:\n{got}"
    tol = 0.5 * 10 ** (-decimals) + 1e-9
    bad = (got - want).abs() > tol
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0].tolist())
        raise AssertionError(
            f"{what} is not what the lesson computes by hand. First difference at {list(index)}: "
            f"expected {want[index].item():.{decimals}f}, got {got[index].item():.{decimals}f}.\n"
            f"Expected (to {decimals} places):\n{want.numpy().round(decimals)}\nGot:\n{got.numpy().round(decimals)}"
        )


def is_implemented(fn, *args, **kwargs) -> bool:
    """True unless calling fn still raises NotImplementedError (the exercise is a stub)."""
    try:
        fn(*args, **kwargs)
    except NotImplementedError:
        return False
    return True


def where_you_stand(*exercises: str) -> None:
    """Print how this lesson's visible checks went in this session, exercise by exercise (not while graded).

    It says only what it knows: which visible checks ran and passed here. The hidden checks (other
    sizes, batches, dtypes, devices, the lesson's rules) run only when the notebook is graded.
    """
    if graded():
        return
    results = list(CHECKS.values())
    passed = sum(outcome == "pass" for _, outcome, _ in results)
    lines = [
        f"Where you stand: {passed} of {len(results)} visible checks pass.",
        "(The visible checks you ran in this session, on the lesson's own examples.)",
    ]
    todo = []
    for exercise in exercises:
        mine = [(outcome, detail) for name, outcome, detail in results if name == exercise]
        ok = sum(outcome == "pass" for outcome, _ in mine)
        stubs = sorted({detail for outcome, detail in mine if outcome == "stub"})
        failures = [detail for outcome, detail in mine if outcome == "fail"]
        if not mine:
            state = "no check has run yet: run its check cells"
        elif ok == len(mine):
            state = f"its visible checks pass ({ok} of {len(mine)})"
        elif exercise in stubs:
            state = f"not done yet: still a stub ({len(mine) - ok} of {len(mine)} checks wait for it)"
            others = [f"`{s}`" for s in stubs if s != exercise]
            state += f"; its checks also need {', '.join(others)}" if others else ""
        elif stubs:
            state = f"{ok} of {len(mine)} checks pass; waiting for " + ", ".join(f"`{s}`" for s in stubs)
        else:
            first = next((f for f in failures if f), "")
            state = (
                f"FAILED: {ok} of {len(mine)} checks pass; the first failure says: {first}"
                if first
                else f"FAILED: {ok} of {len(mine)} checks pass; run the failing check to see its message"
            )
        mark = "[x]" if mine and ok == len(mine) else "[ ]"
        lines.append(f"  {mark} `{exercise}`: {state}")
        if not (mine and ok == len(mine)):
            todo.append(f"`{exercise}`")
    lines.append(
        "Still to do: " + ", ".join(todo) + "." if todo else "Every exercise passes its visible checks."
    )
    lines.append(
        "This is not a grade. When the notebook is graded, hidden checks also try your functions on other "
        "sizes, batches, dtypes and devices, and hold them to the lesson's rules; the visible checks cannot "
        "promise those points."
    )
    print("\n".join(lines))
