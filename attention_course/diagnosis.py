"""Naming a mistake in the visible checks, before a notebook is handed in.

``diagnosed(name, fn)`` wraps a visible check. When the check fails, the
student's function is run on the lesson's own visible inputs (``visible_calls``)
and compared with what each known mistake produces on those same inputs
(``mistakes.json``, generated from the grader's traps by ``python -m
grader.mistakes``). A mistake is named only when it reproduces every one of those
outputs. A shape error raised inside the check is put into words, naming both
shapes. The right answers are already printed in the visible checks; the stored
outputs are only those of the mistakes.

While a notebook is graded (``graded()``) a failing check raises, so that it loses
its points. In a student's session it reports and goes on: the failure is printed
in a box, the cells below still run, and ``CHECKS`` keeps every check's outcome for
"Where you stand". There the exercise's stated rules are watched as well
(``RuleWatch``, the forbidden functions and the rules' words read from
``mistakes.json``, which carries the lessons' own ``Exercise.forbidden``).

Also here, because the hidden checks use them as well (data flows from this
package to the grader, never back): ``substituted``, which lets one exercise be
checked on top of correct versions of the earlier ones, and ``watch_shapes`` /
``explain_shape_error``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import json
import linecache
import math
import os
import re
import sys
import textwrap
import types
import warnings
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from attention_course.watch import CallWatch, Watched

MISTAKES = Path(__file__).with_name("mistakes.json")

# ------------------------------------------------------------------ shape errors


class _ShapeWatch(TorchFunctionMode):
    """Remembers, on a RuntimeError, which torch function failed and the shapes it was given."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        try:
            return func(*args, **kwargs)
        except RuntimeError as e:
            if not hasattr(e, "course_shapes"):
                shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
                shapes += [tuple(a.shape) for a in kwargs.values() if isinstance(a, torch.Tensor)]
                try:
                    e.course_shapes = (getattr(func, "__name__", str(func)), shapes)
                except AttributeError:
                    pass
            raise


@contextlib.contextmanager
def watch_shapes() -> Iterator[None]:
    """While active, a RuntimeError raised by a torch function records the shapes it was given."""
    with _ShapeWatch():
        yield


_MATMUL = re.compile(r"shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")
_BROADCAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")
_BATCH = re.compile(
    r"Expected size for first two dimensions of batch2 tensor to be: \[(.*?)\] but got: \[(.*?)\]"
)
_RANK = re.compile(r"must be a matrix|must be a 3D tensor|expected 2D tensors|expected 3D tensors")
_EINSUM = re.compile(r"einsum\(\): subscript (\w) has size (\d+)")


def _shape(s: tuple) -> str:
    return "(" + ", ".join(map(str, s)) + ")"


def explain_shape_error(error: BaseException) -> str | None:
    """One sentence naming both shapes of a failed matrix product or broadcast, and the likely cause."""
    text = str(error)
    op, shapes = getattr(error, "course_shapes", ("", []))
    both = " and ".join(_shape(s) for s in shapes[:2]) if len(shapes) >= 2 else ""
    if _RANK.search(text):  # torch.mm or torch.bmm given another number of dimensions: no shape is wrong
        given = f" (it was given shapes {both})" if both else ""
        only = "3-D batches of" if "3D" in text or op == "bmm" else "2-D"
        return (
            f"torch.{'bmm' if only != '2-D' else 'mm'} multiplies {only} matrices only{given}. Use A @ B "
            "(torch.matmul), which takes a matrix or any batch of them."
        )
    if _MATMUL.search(text) or _BATCH.search(text) or op in ("matmul", "__matmul__", "mm", "bmm") and both:
        if not both:
            m = _MATMUL.search(text)
            both = f"({m[1]}, {m[2]}) and ({m[3]}, {m[4]})" if m else "two shapes that do not fit"
        return (
            f"A matrix product A @ B was given shapes {both}: the last dimension of A must equal the "
            "second-to-last of B. Likely a tensor on the wrong side (W @ X instead of X @ W), a missing or "
            "extra transpose, or .T / transpose(0, 1) on a batched tensor (use .transpose(-2, -1))."
        )
    if _BROADCAST.search(text) or _EINSUM.search(text):
        m = _BROADCAST.search(text)
        sizes = f" (sizes {m[1]} and {m[2]} meet on one axis)" if m else ""
        # (which operation is known only where the call could be watched: a product's batch axes say the same)
        what = f"`{op}` was given shapes {both}" if both else "Two tensors were combined"
        return (
            f"{what}{sizes}, which do not broadcast: on each axis the sizes must be equal or 1. Likely a "
            "reduction without keepdim=True, a mask without its query dimension (B, 1, T), or "
            "dimensions swapped by a transpose (.T or transpose(0, 1) on a batched tensor)."
        )
    return None


# ------------------------------------------------------------------ using correct earlier functions


@contextlib.contextmanager
def substituted(fn: Any, mapping: dict[str, Callable]) -> Iterator[None]:
    """While active, the names in ``mapping`` that fn's module defines are replaced by the given functions.

    A stand-in that runs elsewhere provides its own ``substituted(mapping)``; a plain Python
    function has its globals patched and restored afterwards. Anything else is left alone.
    """
    if not mapping:
        yield
        return
    own = getattr(fn, "substituted", None)
    if callable(own) and not isinstance(fn, types.FunctionType):
        with own(mapping):
            yield
        return
    target = fn.__globals__ if isinstance(fn, types.FunctionType) else None
    if target is None:
        yield
        return
    saved = {name: target[name] for name in mapping if name in target and target[name] is not fn}
    try:
        target.update({name: mapping[name] for name in saved})
        yield
    finally:
        target.update(saved)


# ------------------------------------------------------------------ the visible inputs


def _visible_inputs() -> dict[str, list[tuple[str, tuple, dict]]]:
    """Every exercise's visible-check inputs (lessons 01-07): (label, args, kwargs)."""
    from attention_course import data

    cats, sat, col, milk = data.love_cats(), data.cat_sat(), data.colours(), data.milk()
    X, W_q, W_k, W_v = cats.X, cats.W_q, cats.W_k, cats.W_v
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    g = torch.Generator().manual_seed(1)
    Q_b, K_b = torch.randn(2, 4, 5, generator=g), torch.randn(2, 6, 5, generator=g)
    S_cats = Q @ K.mT / math.sqrt(3)
    A_cats = torch.softmax(S_cats, dim=-1)
    S_sat = (sat.X @ sat.W_q) @ (sat.X @ sat.W_k).mT / math.sqrt(2)
    causal5 = torch.ones(5, 5, dtype=torch.bool).tril()
    inf = float("inf")
    g6 = torch.Generator().manual_seed(6)
    A_small = torch.softmax(torch.randn(2, 3, generator=g6), dim=-1)
    V_small = torch.randn(3, 5, generator=g6)
    one_hot = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    g7 = torch.Generator().manual_seed(7)
    Q_2, K_5, V_5 = (
        torch.randn(2, 4, generator=g7),
        torch.randn(5, 4, generator=g7),
        torch.randn(5, 3, generator=g7),
    )
    g70 = torch.Generator().manual_seed(70)
    Q_r, K_r, V_r = (torch.randn(2, 3, 6, d, generator=g70) for d in (8, 8, 4))
    X_enc = data.milk_source().X
    return {
        "project": [
            ("'I love cats'", (X, W_q, W_k, W_v), {}),
            ("a batch of two copies", (X.expand(2, 3, 4), W_q, W_k, W_v), {}),
            ("'The cat sat on the'", (sat.X, sat.W_q, sat.W_k, sat.W_v), {}),
        ],
        "scores": [
            ("'I love cats'", (Q, K), {}),
            ("2 queries against 3 keys", (Q[:2], K), {}),
            ("a batch (2, 4, 5) against (2, 6, 5)", (Q_b, K_b), {}),
        ],
        "scaled_scores": [
            ("'I love cats'", (Q, K), {}),
            ("2 queries against 3 keys", (Q[:2], K), {}),
            ("[1, 1, 1, 1] with itself", (torch.ones(1, 4), torch.ones(1, 4)), {}),
            ("a batch (2, 4, 5) against (2, 6, 5)", (Q_b, K_b), {}),
        ],
        "score_spread": [("d_k = 64, n = 20000, seed 64", (64, 20000, 64), {})],
        "causal_mask": [("T = 5", (5,), {}), ("T = 3 on the CPU", (3,), {"device": "cpu"})],
        "padding_mask": [
            ("lengths [5, 3], T = 5", (torch.tensor([5, 3]), 5), {}),
            ("lengths [5, 3, 1], T = 5", (torch.tensor([5, 3, 1]), 5), {}),
            ("lengths [2, 1], T = 3", (torch.tensor([2, 1]), 3), {}),
        ],
        "apply_mask": [
            ("'The cat sat on the', causal", (S_sat, causal5), {}),
            (
                "zeros (2, 5, 5), padding (2, 1, 5)",
                (torch.zeros(2, 5, 5), torch.ones(2, 1, 5, dtype=torch.bool)),
                {},
            ),
        ],
        "softmax": [
            ("'I love cats'", (S_cats,), {}),
            ("scores near 1000", (torch.tensor([[1000.0, 1001.0, 1002.0], [0.0, 1.0, 2.0]]),), {}),
            ("a row that is all -inf", (torch.tensor([[0.0, -inf, 0.0], [-inf, -inf, -inf]]),), {}),
            ("a batch of zeros (2, 3, 4)", (torch.zeros(2, 3, 4),), {}),
        ],
        "soft_lookup": [
            (f"colours, sharpness {s:g}", (col.query, col.keys, col.values, s), {})
            for s in (1.0, 5.0, 25.0, 2000.0)
        ],
        "mix": [
            ("A (2, 3), V (3, 5)", (A_small, V_small), {}),
            ("'I love cats'", (A_cats, V), {}),
            ("one-hot rows", (one_hot, V), {}),
        ],
        "attention": [
            ("T_q = 2, T_k = 5", (Q_2, K_5, V_5), {}),
            ("'I love cats'", (Q, K, V), {}),
            (
                "(2, 3, 6, 8) with a causal mask",
                (Q_r, K_r, V_r, torch.ones(6, 6, dtype=torch.bool).tril()),
                {},
            ),
        ],
        "self_attention": [
            ("'I love cats', causal=False", (X, W_q, W_k, W_v), {"causal": False}),
            ("'I love cats', causal", (X, W_q, W_k, W_v), {}),
            ("'The cat sat on the', causal", (sat.X, sat.W_q, sat.W_k, sat.W_v), {}),
        ],
        "cross_attention": [
            ("6 decoder rows, 4 encoder rows", (milk.X, X_enc, milk.W_q, milk.W_k, milk.W_v), {}),
            (
                "a batch of 2, d_v = 2",
                (milk.X.expand(2, 6, 6), X_enc.expand(2, 4, 6), milk.W_q, milk.W_k, milk.W_v[:, :2]),
                {},
            ),
        ],
    }


def visible_calls(name: str) -> list[tuple[str, tuple, dict]]:
    """Fresh copies of one exercise's visible inputs (a seed stands in for a torch.Generator)."""
    calls = []
    for label, args, kwargs in _visible_inputs().get(name, []):
        if name == "score_spread":
            args = (args[0], args[1], torch.Generator().manual_seed(args[2]))
        else:
            args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        calls.append((label, args, dict(kwargs)))
    return calls


# ------------------------------------------------------------------ outputs as plain data


def encode(x: Any) -> Any:
    """A result as JSON-ready data: tensors become {shape, dtype, values}, exceptions {error}."""
    if isinstance(x, ArithmeticError):  # an overflow is an overflow however it is worded
        return {"error": "ArithmeticError"}
    if isinstance(x, BaseException):
        return {"error": type(x).__name__, "message": str(x)}
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type == "meta":
            return {"shape": list(t.shape), "dtype": str(t.dtype)[6:], "values": None}
        values = t.cpu().tolist() if t.dtype == torch.bool else t.cpu().double().tolist()
        return {"shape": list(t.shape), "dtype": str(t.dtype)[6:], "values": _plain(values)}
    if isinstance(x, (tuple, list)):
        return [encode(v) for v in x]
    if isinstance(x, dict):
        return {"dict": {str(k): encode(v) for k, v in x.items()}}
    if isinstance(x, bool) or x is None:
        return x
    if isinstance(x, (int, float)):
        return _plain(float(x))
    return {"other": type(x).__name__}


def _plain(v: Any) -> Any:
    if isinstance(v, list):
        return [_plain(u) for u in v]
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= atol + rtol * abs(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rtol, atol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_close(a[k], b[k], rtol, atol) for k in a)
    return a == b


def same_output(a: Any, b: Any, rtol: float = 1e-4, atol: float = 1e-5) -> bool:
    """Whether two encoded outputs agree (same shapes and dtypes, values within tolerance)."""
    return _close(a, b, rtol, atol)


@cache
def _stored() -> dict:
    try:
        return json.loads(MISTAKES.read_text())
    except (OSError, ValueError):
        return {}


_stored()  # read on import: a grading server imports this module once, before it forks kernels and checks


def run_quietly(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """fn(*args, **kwargs), or the exception it raised; prints and warnings are swallowed."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - an error is an outcome like any other
                return e


def diagnose(name: str, fn: Callable) -> tuple[str, str] | None:
    """(mistake, hint) when fn reproduces exactly one known mistake on every visible input of the exercise."""
    stored = _stored().get(name)
    if not stored or "traps" not in stored or not callable(fn):
        return None
    got = [encode(run_quietly(fn, args, kwargs)) for _, args, kwargs in visible_calls(name)]
    rtol, atol = stored.get("tolerance", [1e-4, 1e-5])
    found = {
        trap["name"]: trap["hint"]
        for trap in stored["traps"]
        if len(trap["outputs"]) == len(got)
        and all(same_output(g, t, rtol, atol) for g, t in zip(got, trap["outputs"]))
    }
    # two different mistakes that look alike on these inputs: name neither
    return next(iter(found.items())) if len(found) == 1 else None


def _stub_box(name: str, stub: str) -> str:
    waits = "" if stub == name else f" (this check of `{name}` needs it)"
    lines = [
        f"not done yet: `{stub}` is still a stub{waits}.",
        "This check fails until you implement it; the cells below still run.",
    ]
    width = max(map(len, lines)) + 2
    return "\n".join(
        ["+" + "-" * width + "+", *(f"| {line:<{width - 2}} |" for line in lines), "+" + "-" * width + "+"]
    )


BOX_WIDTH = 96  # the widest line of text inside a failure box


def _wrapped(text: str) -> list[str]:
    """text's lines, each longer line broken at BOX_WIDTH (continuations indented)."""
    lines = []
    for line in text.splitlines() or [""]:
        line = line.rstrip().expandtabs()
        if len(line) <= BOX_WIDTH:
            lines.append(line)
        else:
            lines += textwrap.wrap(line, BOX_WIDTH, subsequent_indent="    ", break_on_hyphens=False)
    return lines


def failure_box(name: str, message: str, graded_says: str) -> str:
    """A failed visible check as a framed box: a heading, the check's message, what grading would say."""
    head = f"FAILED: this check of `{name}`"
    body = _wrapped(message)
    foot = _wrapped(
        f"{graded_says} The cells below still run: fix `{name}`, run its cell, then run this check again."
    )
    width = max(len(line) for line in [head, *body, *foot]) + 2
    strong, thin = "+" + "=" * width + "+", "+" + "-" * width + "+"

    def rows(lines: list[str]) -> list[str]:
        return [f"| {line:<{width - 2}} |" for line in lines]

    return "\n".join([strong, *rows([head]), thin, *rows(body), thin, *rows(foot), strong])


# ------------------------------------------------------------------ the stated rules, watched


def stated_rules(name: str) -> tuple[dict[str, str], list[str]]:
    """An exercise's forbidden functions (qualified name -> the rule's words) and the earlier exercises
    it uses, as the lessons state them (``Exercise.forbidden``, carried here by mistakes.json)."""
    entry = _stored().get(name) or {}
    return dict(entry.get("forbidden") or {}), list(entry.get("uses") or [])


def rule_message(name: str, calls: list[str], forbidden: dict[str, str]) -> str:
    """What a call the exercise rules out fails with: the names called and the rule's own words."""
    rules = dict.fromkeys(forbidden[c] for c in calls if c in forbidden)
    return f"{name} calls {', '.join(calls)}, which this exercise rules out. The rule: " + " ".join(rules)


def _codes(fn: Any) -> set[types.CodeType]:
    """The code objects of fn and of what it wraps (decorators, functools.partial, bound methods)."""
    codes: set[types.CodeType] = set()
    seen: set[int] = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        if isinstance(code, types.CodeType):
            codes.add(code)
        fn = getattr(fn, "__wrapped__", None) or getattr(fn, "func", None) or getattr(fn, "__func__", None)
    return codes


class RuleWatch(CallWatch):
    """A CallWatch over one visible check: a forbidden function counts only when the student's function
    calls it, by any alias and through any helper of theirs.

    The check's own code may call it (lesson 07's check compares with scaled_dot_product_attention), and
    a call made inside an earlier exercise the function uses is left to that exercise's own check, as the
    hidden checks do by putting the reference in its place. ``calls``: the forbidden names called.
    """

    def __init__(self, forbidden: list[str], fn: Any, used: list[Any] = ()) -> None:
        super().__init__(forbidden)
        self._own = _codes(fn)
        self._theirs = set().union(*(_codes(u) for u in used)) - self._own
        for f in [
            fn,
            getattr(fn, "func", None),
        ]:  # the function *is* a forbidden one (softmax = torch.softmax)
            called = self._objects.get(id(f)) if f is not None else None
            if called is not None and called not in self.calls:
                self.calls.append(called)

    def _by_student(self, frame: types.FrameType | None) -> bool:
        while frame is not None:
            code = frame.f_code
            if code in self._theirs:
                return False
            if code in self._own:
                return True
            if not self._own and frame.f_globals.get("__name__") == "__main__" and code.co_name != "<module>":
                return True  # not a plain function: any function of the notebook's
            frame = frame.f_back
        return False

    def _forbidden_call(self, called: str | None, frame: types.FrameType | None) -> None:
        if called is not None and called not in self.calls and self._by_student(frame):
            self.calls.append(called)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        return self._run(func, args, kwargs or {}, sys._getframe(1))


def _name(fn: object) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _tensor_arguments(fn: Callable, args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """The tensor arguments of a call, each with its parameter's name (or its position)."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = {f"input {i + 1}": a for i, a in enumerate(args)} | kwargs
    return [(name, value) for name, value in bound.items() if isinstance(value, torch.Tensor)]


def call_keeping_inputs(fn: Callable, args: tuple, kwargs: dict) -> tuple[Any, str | None]:
    """Call fn(*args, **kwargs); return its result, and what it changed in place among its tensor
    arguments (None if nothing): the hidden checks fail a check whose calls changed what it gave them."""
    # lesson 11's watched tensors are left to its own watch: copying and comparing them would read them whole
    tensors = [(n, v) for n, v in _tensor_arguments(fn, args, kwargs) if not isinstance(v, Watched)]
    before = [(n, v, v.detach().clone()) for n, v in tensors if not v.is_meta]
    result = fn(*args, **kwargs)
    for name, value, copy in before:
        if not (value.shape == copy.shape and bool(((value == copy) | (value.isnan() & copy.isnan())).all())):
            return result, (
                f"{_name(fn)} changed its argument `{name}` in place (masked_fill_, fill_, += ...): "
                "return a new tensor and leave the inputs as they were."
            )
    return result, None


@contextlib.contextmanager
def inputs_watched(cell: types.FrameType, name: str, fn: Callable, changed: list[str]) -> Iterator[None]:
    """While active, the notebook's ``name`` (when it is ``fn``, a function of its own) notes in ``changed``
    what a call by the check changes in place among its tensor arguments, as the hidden checks see it (a
    call by another of the notebook's functions passes what that function made: it is not looked at)."""
    space, own = cell.f_globals, cell.f_code.co_filename
    if not isinstance(fn, types.FunctionType) or space.get(name) is not fn:
        yield
        return

    @functools.wraps(fn)
    def watched(*args: Any, **kwargs: Any) -> Any:
        by = sys._getframe(1)
        if by.f_globals is space and by.f_code.co_filename != own:
            return fn(*args, **kwargs)
        result, what = call_keeping_inputs(fn, args, kwargs)
        if what is not None and not changed:
            changed.append(what)
        return result

    space[name] = watched
    try:
        yield
    finally:
        if space.get(name) is watched:
            space[name] = fn


# ------------------------------------------------------------------ where the visible checks stand

# One entry per visible check run in this kernel, keyed by where the check sits in its cell (running a
# cell again replaces its entry): (exercise, outcome, detail) with outcome "pass", "stub" or "fail".
CHECKS: dict[tuple[str, int], tuple[str, str, str]] = {}


class DeviceNotFollowed(AssertionError):
    """A result made on another device than its inputs, seen on PyTorch's 'meta' device in a student's
    session (``checks.expect_device_follows``). Graded, the hidden checks try the grader's GPU."""


def graded() -> bool:
    """True while a notebook is being graded (nbgrader, or the course's grading tool, sets NBGRADER_EXECUTION)."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def stub_name(error: BaseException) -> str | None:
    """The notebook function whose ``raise NotImplementedError()`` this is, or None for any other error.

    Only a bare ``raise NotImplementedError()`` in a function defined in the notebook itself counts
    (an exercise not written yet): a NotImplementedError from PyTorch (which always says what it
    cannot do) or from a helper is an ordinary error.
    """
    if not isinstance(error, NotImplementedError) or error.args:
        return None
    tb = error.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    if frame.f_globals.get("__name__") != "__main__" or frame.f_code.co_name == "<module>":
        return None
    return frame.f_code.co_name


def _where_raised(error: BaseException) -> str:
    """'line N of `fn`: <code>' for the innermost frame of a notebook function the error passed through."""
    found = None
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if tb.tb_frame.f_globals.get("__name__") == "__main__" and code.co_name != "<module>":
            found = (code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    if found is None:
        return ""
    filename, line, function = found
    text = linecache.getline(filename, line).strip()
    return f"Raised in `{function}`" + (f", at: {text}" if text else "") + "."


def _explained(name: str, fn: Callable, error: Exception, known: bool) -> tuple[str, str, Exception | None]:
    """(the line a summary shows, the mistake named or '', the AssertionError a check raises in error's
    place or None to raise error itself).

    An AssertionError gains the name of the mistake when one fits; a shape error raised inside the check
    is put into words, naming both shapes. Any other error stays as it is.
    """
    first = str(error).splitlines()[0] if str(error) else ""
    if isinstance(error, AssertionError):
        found = diagnose(name, fn) if known else None
        if found is None:
            return first, "", None
        named = AssertionError(f"{error}\nDiagnosis: {found[0]}. {found[1]}")
        named.mistake = found[0]  # what a grader records: the name this check chose, not text in the message
        return first, found[0], named
    detail = f"{type(error).__name__}: {first}"
    if isinstance(error, RuntimeError) and not isinstance(error, NotImplementedError):
        words = explain_shape_error(error) if known else None
        if words is None:
            return detail, "", None
        found = diagnose(name, fn)
        note = f"\nDiagnosis: {found[0]}. {found[1]}" if found else ""
        named = AssertionError(f"{name} raised RuntimeError: {error}\n{words}{note}")
        named.mistake = found[0] if found else None
        return detail, found[0] if found else "", named
    return detail, "", None


@contextlib.contextmanager
def diagnosed(name: str, fn: Callable) -> Iterator[None]:
    """Run a visible check; if it fails, add the name of the mistake (when one fits) and explain shape errors.

    While a notebook is graded a failing check raises, so that it loses its points. In a student's
    session it reports and goes on: the failure is printed as a box (a stub says "not done yet") and
    the cells below still run; ``where_you_stand`` lists it. There, too, the exercise's stated rules
    are watched (``RuleWatch``): a call the exercise rules out fails the check with the rule's words,
    as the hidden check fails it when the notebook is graded; and so does a call of the function that
    changes the check's own tensors in place (``inputs_watched``), as the checks outside the kernel do.
    """
    caller = sys._getframe(2)  # the cell that holds the with-statement (past contextlib's __enter__)
    where = (caller.f_code.co_filename, caller.f_lineno)
    CHECKS[where] = (name, "fail", "")
    known = "traps" in (_stored().get(name) or {})  # lessons 01-07: named mistakes and explained shapes
    forbidden, uses = stated_rules(name)
    rules = None
    if forbidden and not graded():
        rules = RuleWatch(list(forbidden), fn, [caller.f_globals.get(u) for u in uses])
    changed: list[
        str
    ] = []  # what the check's calls of fn changed in place (graded: the checks outside see it)
    try:
        with contextlib.ExitStack() as watches:
            if known:
                watches.enter_context(watch_shapes())
            if rules is not None:
                watches.enter_context(rules)
            if not graded():
                watches.enter_context(inputs_watched(caller, name, fn, changed))
            yield
    except Exception as e:
        stub = stub_name(e)
        if stub is not None and not graded():
            CHECKS[where] = (name, "stub", stub)
            print(_stub_box(name, stub))
            return
        if isinstance(e, DeviceNotFollowed):  # no mistake is named: on the CPU its numbers are right
            CHECKS[where] = (name, "fail", "the result was made on the wrong device (tried on 'meta')")
            gpu = f"Graded, the hidden check of `{name}` fails on this too, on any machine."
            print(failure_box(name, str(e), gpu))
            return
        detail, mistake, replacement = _explained(name, fn, e, known)
        CHECKS[where] = (name, "fail", detail)
        if graded():
            if replacement is None:
                raise
            raise replacement from None
        if rules is None or not rules.calls:  # a call the exercise rules out is reported first, below
            if replacement is not None:
                message = str(replacement)
            elif isinstance(e, AssertionError):
                message = str(e) or "The check failed (its assert carries no message)."
            else:
                message = f"{type(e).__name__}: {e}\n{_where_raised(e)}".strip()
            if changed:  # the likely cause: the check's own inputs were changed by an earlier call
                message = message if changed[0] in message else f"{changed[0]}\n{message}"
                detail = changed[0]
                CHECKS[where] = (name, "fail", detail)
            if mistake:
                CHECKS[where] = (name, "fail", f"{detail} (diagnosis: {mistake})")
            print(failure_box(name, message, "Graded as it is, this check fails."))
            return
    if rules is not None and rules.calls:
        message = rule_message(name, rules.calls, forbidden)
        CHECKS[where] = (name, "fail", message)
        print(
            failure_box(name, message, f"Graded as it is, the hidden check of `{name}` fails on this call.")
        )
        return
    if changed:
        CHECKS[where] = (name, "fail", changed[0])
        print(failure_box(name, changed[0], "Graded as it is, this check fails."))
        return
    CHECKS[where] = (name, "pass", "")
