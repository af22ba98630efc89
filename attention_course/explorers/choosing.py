"""Which function an explorer runs: the student's own, or the course's built-in version.

An explorer is handed the student's functions. Each one is tried once on a small
fixed example: for a stub (still raising ``NotImplementedError``) or a function that
fails, the explorer works that step out inside its own computation and says so next
to its controls. No function here, or anywhere in the explorers, takes an exercise's
arguments and returns its answer: the course's helpers are never an answer key.
Nothing here draws or needs a widget.
"""

from __future__ import annotations

import copy
import functools
import html
import math
import re
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@contextmanager
def one_thread():
    """Run tiny tensor work without PyTorch's thread pool, then restore its size.

    On explorer-sized tensors, waking worker threads costs more than the arithmetic,
    and far more when other programs keep the CPUs busy.
    """
    n = torch.get_num_threads()
    if n <= 1:
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_num_threads(1)
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.set_num_threads(n)


# ------------------------------------------------------- probes: tiny examples


def _probe(name: str) -> tuple[tuple, dict, object]:
    """A fixed tiny example for ``name``: its arguments and the result the lesson expects there.

    The inputs are fixed here (seeded draws), so the expected results are worked out
    for them alone: nothing in this module takes a student's arguments and returns
    the answer of an exercise.
    """
    g = torch.Generator().manual_seed(7)
    Q, K, V = torch.randn(3, 2, generator=g), torch.randn(4, 2, generator=g), torch.randn(4, 5, generator=g)
    if name == "project":
        X = torch.randn(3, 4, generator=g)
        W = [torch.randn(4, 2, generator=g), torch.randn(4, 2, generator=g), torch.randn(4, 5, generator=g)]
        return (X, *W), {}, tuple(X @ w for w in W)
    if name in ("scores", "scaled_scores"):
        S = Q @ K.mT  # (3, 4): every query row against every key row
        return (Q, K), {}, S if name == "scores" else S / math.sqrt(2)
    if name == "score_spread":
        return (4, 64, torch.Generator().manual_seed(0)), {}, None  # random numbers: nothing to compare
    if name == "causal_mask":
        return (4,), {}, torch.ones(4, 4).tril().bool()
    if name == "padding_mask":
        lengths = torch.tensor([3, 1, 0])
        return (lengths, 4), {}, (torch.arange(4)[None, :] < lengths[:, None])[:, None, :]
    if name == "apply_mask":
        S, allowed = torch.randn(4, 4, generator=g), torch.ones(4, 4).tril().bool()
        return (S, allowed), {}, torch.where(allowed, S, float("-inf"))
    if name == "softmax":
        Z = torch.randn(3, 4, generator=g)
        e = (Z - Z.amax(-1, keepdim=True)).exp()
        return (Z,), {"dim": -1}, e / e.sum(-1, keepdim=True)
    if name == "mix":
        A = torch.randn(3, 4, generator=g).exp()
        A = A / A.sum(-1, keepdim=True)
        return (A, V), {}, A @ V
    if name == "attention":
        e = (Q @ K.mT / math.sqrt(2)).exp()
        A = e / e.sum(-1, keepdim=True)
        return (Q, K, V), {}, (A @ V, A)
    if name == "soft_lookup":
        a, b = math.exp(1.0 / math.sqrt(2)), math.exp(0.1 / math.sqrt(2))
        weights = {"a": a / (a + b), "b": b / (a + b)}
        args = ([1.0, 0.1], {"a": [1.0, 0.0], "b": [0.0, 1.0]}, {"a": [1.0], "b": [0.0]}, 1.0)
        return args, {}, (weights, [weights["a"]])
    raise KeyError(name)


def _difference(a, b) -> float:
    """Largest absolute difference between two results of the same function."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return math.inf
        if a.dtype == torch.bool or b.dtype == torch.bool:
            return float((a.bool() != b.bool()).any())
        diff = (a.detach().double() - b.detach().double()).abs()
        same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
        diff = torch.where(same_inf, 0.0, diff).nan_to_num(nan=math.inf, posinf=math.inf)
        return float(diff.max()) if diff.numel() else 0.0
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return math.inf
        return max((_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return math.inf
        return max((_difference(x, y) for x, y in zip(a, b)), default=0.0)
    try:
        return abs(float(a) - float(b))
    except (TypeError, ValueError):
        return math.inf


# ------------------------------------------------------------------ the choice


class StudentFunctionError(Exception):
    """The student's function raised while an explorer was running it."""

    def __init__(self, name: str, error: Exception):
        super().__init__(f"your `{name}` raised {type(error).__name__}: {error}")
        self.name, self.error = name, error


def _guard(name: str, fn: Callable) -> Callable:
    """The student's function, raising StudentFunctionError (naming it) when it fails."""

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            raise StudentFunctionError(name, error) from error

    return guarded


@dataclass(frozen=True)
class Choice:
    """The function an explorer runs for one step, and how to say where it came from.

    ``source`` is one of "yours", "stub", "error", "built-in". ``fn`` is the student's
    function when it is "yours", else None: the explorer then works the step out itself.
    """

    name: str
    fn: Callable | None
    source: str
    note: str

    @property
    def yours(self) -> bool:
        return self.source == "yours"


def choose(name: str, student: Callable | None, lesson: str | None = None, compare: bool = True) -> Choice:
    """Try the student's function on a tiny example; the explorer's own arithmetic stands in if it cannot run.

    ``lesson`` names where the student writes the function when it is not part of
    the current lesson (e.g. "lesson 05"), for the label.
    """
    if student is None:
        where = f" (you write your own in {lesson})" if lesson else ""
        return Choice(name, None, "built-in", f"`{name}`: the course's built-in version{where}")
    if not callable(student):
        raise TypeError(
            f"{name}= takes your function itself (e.g. {name}={name}), not a {type(student).__name__}"
        )
    args, kwargs, expected = _probe(name)
    try:  # on copies of the inputs: the expected result never shares a tensor the function could change
        got = student(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    except NotImplementedError:
        return Choice(
            name,
            None,
            "stub",
            f"`{name}` is still a stub: implement `{name}` above to see your own version here. "
            "Until then this shows the course's built-in version.",
        )
    except Exception as exc:  # any failure of student code: show it, keep the explorer alive
        return Choice(
            name,
            None,
            "error",
            f"your `{name}` raised {type(exc).__name__}: {exc}. Showing the course's built-in version "
            "until it runs.",
        )
    note = f"`{name}`: yours"
    if compare and expected is not None:
        diff = _difference(got, expected)
        if diff > 1e-4:
            note += (
                " (on a small test it differs from the built-in version"
                + _how(got, expected, diff)
                + ", so what you see here is your version's answer)"
            )
    return Choice(name, _guard(name, student), "yours", note)


def _how(got, expected, diff: float) -> str:
    """How a probe's result departs from the expected one, in words (no clamped floats for -inf)."""
    from .compare import mask_words, size_words

    if isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor) and got.shape == expected.shape:
        if got.dtype == torch.bool or expected.dtype == torch.bool:
            return ": " + mask_words(got.bool(), expected.bool())
        return ": " + size_words(got.detach().cpu().double(), expected.double())
    return f" by up to {diff:.3g}" if math.isfinite(diff) else ": other shape or keys"


def fallback(error: StudentFunctionError) -> Choice:
    """The built-in stand-in for a student's function that failed while an explorer ran it."""
    return Choice(
        error.name,
        None,
        "error",
        f"{error}. Showing the course's built-in version until it runs.",
    )


def banner_html(choices: list[Choice], more: Sequence[str] = (), lead: str = "") -> str:
    """Whose version of each function the explorer runs, one item per function, side by side where they fit.

    ``more``: further items (HTML), e.g. the functions the explorer works out itself; ``lead``: an item
    before them all (HTML), e.g. the example's name.
    """
    marks = {
        "yours": "&#10004; yours",
        "built-in": "built-in",
        "stub": "&#9888; stub",
        "error": "&#9888; error",
    }
    rows = []
    for c in choices:
        text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(c.note))
        rows.append(
            f"<div class='ac-source ac-source-{c.source.replace('-', '')}'><b>[{marks[c.source]}]</b> {text}</div>"
        )
    rows += list(more)
    if lead:
        rows.insert(0, f"<div class='ac-lead' style='font-size:111%'>{lead}</div>")
    if not rows:
        return ""
    return (
        "<div class='ac-sources' style='display:flex;flex-wrap:wrap;column-gap:18px;font-size:0.9em;"
        "line-height:1.35'>" + "".join(rows) + "</div>"
    )


def banner_text(choices: list[Choice]) -> str:
    return "\n".join(f"[{c.source}] {c.note}" for c in choices)
