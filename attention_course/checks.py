"""Visible self-checks: small assertions whose messages a student can act on.

These compare against the numbers printed in the lessons; the hidden tests go
further (random, batched inputs on every device). In a student's session a failed
check reports and goes on (``diagnosed``), and so does a lesson's example cell that
runs the student's functions (``demo``); ``where_you_stand`` sums up what ran.
``expect_dtype_follows``, ``expect_device_follows`` and ``expect_inputs_unchanged``
check, on the lesson's own inputs, the rules the hidden checks hold every function
to: results keep the inputs' dtype and device, and inputs are never changed in place.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from attention_course.diagnosis import (
    BOX_WIDTH,
    CHECKS,
    DeviceNotFollowed,
    _codes,
    _name,
    _where_raised,
    _wrapped,
    call_keeping_inputs,
    diagnosed,
    graded,
    stub_name,
)
from attention_course.speed import count_flops_without_compiler_imports, meta_without_compiler_imports

count_flops_without_compiler_imports()  # lesson 09's FlopCounterMode: a second quicker, the same counts

__all__ = [
    "demo",
    "diagnosed",
    "expect_block_by_block",
    "expect_device_follows",
    "expect_dtype_follows",
    "expect_inputs_unchanged",
    "expect_shape",
    "expect_values",
    "is_implemented",
    "where_you_stand",
]


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


def _tensors(x: Any) -> list[torch.Tensor]:
    """Every tensor in x (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    return []


def _each_tensor(x: Any, change: Callable[[torch.Tensor], Any]) -> Any:
    """x with ``change`` applied to every tensor in it (tuples, lists and dicts rebuilt; other values kept)."""
    if isinstance(x, torch.Tensor):
        return change(x)
    if isinstance(x, dict):
        return {k: _each_tensor(v, change) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_each_tensor(v, change) for v in x)
    return x


def _as_float64(x: Any) -> Any:
    """x with every floating tensor in it turned to float64 (other values left as they are)."""
    return _each_tensor(x, lambda t: t.detach().double() if t.is_floating_point() else t)


def expect_dtype_follows(fn: Callable, *args: Any, **kwargs: Any) -> None:
    """Assert that fn's floating results have the dtype of its floating inputs: as given, then in float64."""
    for inputs, kw in ((args, kwargs), (_as_float64(args), _as_float64(kwargs))):
        given = {t.dtype for t in _tensors([inputs, kw]) if t.is_floating_point()}
        if len(given) != 1:
            continue
        dtype = given.pop()
        for t in _tensors(fn(*inputs, **kw)):
            if t.is_floating_point() and t.dtype != dtype:
                want, got = str(dtype)[6:], str(t.dtype)[6:]
                raise AssertionError(
                    f"{_name(fn)} returned a {got} tensor for {want} inputs: results keep the dtype of the "
                    f"inputs (no .double() or .float(), no new tensor without dtype=)."
                )


def expect_block_by_block(fn: Callable, *args: Any, **kwargs: Any) -> None:
    """In a student's session: lesson 11's rule, watched as the hidden checks watch it.

    ``fn(Z, block_size)`` must read ``Z`` at most ``block_size`` entries of a row at a time;
    ``fn(Q, K, V, block_size, ...)`` must form scores for at most ``block_size`` keys at a time, never
    the ``(T_q, T_k)`` matrix, and call no fused attention kernel. The inputs are handed over as watched
    tensors (``attention_course.watch``), every torch operation of the call is seen, and a broken rule
    fails with what was seen. While a notebook is graded this does nothing: the hidden check watches the
    same, and only it takes the points.
    """
    if graded():
        return
    from attention_course.watch import CallWatch, Rule, watched

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    block = next(a for a in args if isinstance(a, int) and not isinstance(a, bool))
    if len(tensors) == 1:
        rule = Rule.rows(tensors[0], block)
        how = "read Z[..., start:start + block_size] one block at a time"
    else:
        rule = Rule.scores(*tensors[:3], block)
        how = "compute the scores of one block of keys at a time, (..., T_q, block_size)"
    if rule is None or rule.kind == "free":  # one block holds it all
        return
    watched_args = tuple(watched(a, rule) if isinstance(a, torch.Tensor) else a for a in args)
    with CallWatch((), (watched_args, kwargs)) as seen:
        value = fn(*watched_args, **kwargs)
    note = seen.verdict(value)
    call = _call_words(fn, args, kwargs)
    assert note is None, f"{call} gives a result, but {note[1]}: {how}."
    if seen.review:
        print(f"Note: {call} {seen.review}. Graded, this is flagged for your instructor to read.")


def to_meta(x: Any) -> Any:
    """x with every tensor in it moved to PyTorch's 'meta' device (shapes and dtypes, no data)."""
    return _each_tensor(x, lambda t: t.detach().to("meta"))


# PyTorch's words when one operation gets tensors of two devices (on 'meta', and on a GPU)
MIXED = ("is not on the expected device", "Expected all tensors to be on the same device")


def warm_meta() -> None:
    """Run a few operations on PyTorch's 'meta' device, as the hidden checks' device pass does: their first
    use in a process imports sympy (0.3 s of CPU), and TorchDynamo too unless skipped, as here and in a
    student's session (``meta_without_compiler_imports``: 0.7 s less). A fork server calls this once, so
    that no notebook graded from it pays that again."""
    import tempfile

    before = tempfile.tempdir
    try:
        meta_without_compiler_imports()
        x = torch.ones(2, 3, device="meta")
        s = (x @ x.mT) / 2.0
        s.masked_fill(torch.ones(2, 2, dtype=torch.bool, device="meta"), float("-inf")).softmax(-1)
    finally:  # what loading that code read of this process's TMPDIR: a child works in a folder of its own
        tempfile.tempdir = before


def expect_device_follows(fn: Callable, *args: Any, **kwargs: Any) -> None:
    """In a student's session: fn's results must be on the device of its inputs (or the ``device=`` it is
    given), tried on PyTorch's 'meta' device so that it shows on a machine with no GPU.

    Every tensor argument is moved to 'meta' and a ``device=`` argument becomes 'meta'; a result on the
    CPU, or PyTorch refusing to mix the two devices, fails with DeviceNotFollowed. A function that cannot
    run on 'meta' for another reason (``.item()``, ``int(t)``, printing values: 'meta' holds no data) is
    not judged here. While a notebook is graded this does nothing: the hidden check tries the same on
    'meta' (and on the grader's GPU where it has one), and only it takes the points.
    """
    if graded():
        return
    meta_without_compiler_imports()  # a second quicker: no compiler is loaded to run on 'meta'
    margs, mkwargs = to_meta(args), to_meta(kwargs)
    if "device" in mkwargs:
        mkwargs["device"] = "meta"
    call = _call_words(fn, margs, mkwargs)
    quiet = io.StringIO()  # what it prints of 'meta' tensors ("tensor(..., device='meta')") is not shown
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = fn(*margs, **mkwargs)
    except RuntimeError as error:  # NotImplementedError too: 'meta' cannot give a value out
        said = str(error).splitlines()[0] if str(error) else ""
        if any(words in said for words in MIXED):
            raise DeviceNotFollowed(
                f"{call}, with its inputs on the 'meta' device, mixed two devices: PyTorch says "
                f'"{said}". A tensor made inside it without device= lives on the CPU. Make new tensors on '
                "the device of the inputs (device=X.device, torch.zeros_like(X)) or on the device= given."
            ) from None
        return
    except Exception:  # noqa: BLE001 - any other failure on 'meta' is not a device mistake
        return
    for t in _tensors(result):
        if t.device.type != "meta":
            raise DeviceNotFollowed(
                f"{call}, with its inputs on the 'meta' device, returned a tensor on "
                f"{t.device.type}: the result was made on the wrong device. Make new tensors on the device "
                "of the inputs (device=X.device, torch.zeros_like(X)) or on the device= given."
            )


def _call_words(fn: Callable, args: tuple, kwargs: dict) -> str:
    """ "causal_mask(3, device='meta')": a call in words, each tensor shown by its shape and device."""

    def word(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return f"<{tuple(v.shape)} tensor on {v.device.type}>"
        return "..." if isinstance(v, (dict, list, tuple)) else repr(v)

    given = [word(a) for a in args] + [f"{k}={word(v)}" for k, v in kwargs.items()]
    return f"{_name(fn)}({', '.join(given)})"


def expect_inputs_unchanged(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call fn(*args, **kwargs), assert it changed none of its tensor arguments in place; return its result."""
    result, changed = call_keeping_inputs(fn, args, kwargs)
    assert changed is None, changed
    return result


# ------------------------------------------------------------------ the lessons' example cells


def _box(head: str, body: list[str], foot: list[str]) -> str:
    lines = [head, *body, *foot]
    width = max(len(line) for line in lines) + 2
    strong, thin = "+" + "=" * width + "+", "+" + "-" * width + "+"

    def rows(part: list[str]) -> list[str]:
        return [f"| {line:<{width - 2}} |" for line in part]

    middle = [*rows(body), thin] if body else []
    return "\n".join([strong, *rows([head]), thin, *middle, *rows(foot), strong])


def _raised_in(error: BaseException, functions: Sequence[Callable]) -> str | None:
    """The name of the innermost of ``functions`` whose code the error was raised through, or None."""
    found = None
    tb = error.__traceback__
    while tb is not None:
        for fn in functions:
            if tb.tb_frame.f_code in _codes(fn):
                found = _name(fn)
        tb = tb.tb_next
    return found


def _failing(names: list[str]) -> list[str]:
    """Those of ``names`` whose visible checks, run in this session, did not all pass."""
    return [n for n in names if any(name == n and outcome != "pass" for name, outcome, _ in CHECKS.values())]


def demo_box(functions: Sequence[Callable], error: BaseException) -> str:
    """What a lesson's example cell shows when it fails: which function, the error, and that the rest runs."""
    names = [_name(fn) for fn in functions]
    stub = stub_name(error)
    if stub is not None:
        return _box(
            f"not done yet: `{stub}` is still a stub.",
            [],
            _wrapped(
                f"This cell runs your `{stub}`: implement it, then run this cell again. The cells below still run."
            ),
        )
    culprit = _raised_in(error, functions)
    failing = _failing(names)
    if culprit in failing or (culprit and not failing):
        blamed = [culprit]
    else:  # raised in code of the cell's, or in a function whose checks pass, on what a failing one returned
        culprit, blamed = None, failing or names
    which = " or ".join(f"`{n}`" for n in blamed)
    head = (
        f"EXAMPLE STOPPED: your {which} raised an error"
        if culprit
        else f"EXAMPLE STOPPED: this cell could not use what your {which} returned"
    )
    first = str(error).splitlines()[0] if str(error) else ""
    body = _wrapped(f"{type(error).__name__}: {first}"[: 4 * BOX_WIDTH])
    where = _where_raised(error)
    if where:
        body += _wrapped(where)
    if isinstance(error, NameError):
        body += _wrapped("(A cell above that runs your functions stopped before it defined this name.)")
    foot = _wrapped(
        f"This cell will work once {which} is fixed; its checks say what is wrong. The cells below still run."
    )
    return _box(head, body, foot)


@contextlib.contextmanager
def demo(*functions: Callable) -> Iterator[None]:
    """Run a lesson's example that uses your ``functions``; if it fails, say which one, and go on.

    In a student's session an error inside the block is shown in a short box that names the function
    (the one it was raised in, or the one whose result the cell could not use), and the cells below
    still run. While a notebook is graded the error is raised, as it always was. Also a decorator:
    ``@demo(kv_cache_step)`` reports every call of a slider's function the same way.
    """
    try:
        yield
    except Exception as error:
        if graded():
            raise
        print(demo_box(functions, error))


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
