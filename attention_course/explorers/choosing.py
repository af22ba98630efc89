"""Which function an explorer runs: the student's own, or the course's built-in version.

An explorer is handed the student's functions. Each one is tried once on a small
fixed example: for a stub (still raising ``NotImplementedError``) or a function that
fails, the explorer works that step out inside its own computation and says so next
to its controls. Wherever the explorer runs a student's function, a result whose form
the lesson's API rules out (a wrong shape, a missing key) is named the same way, with
the shape it had and the one expected (``wrong_result``). No function here, or anywhere in the explorers, takes an exercise's
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
    """The student's function raised, or returned what the lesson's API rules out, while an explorer ran it.

    ``returned``: what it returned and what was expected, in words (from :func:`wrong_result`);
    None when it raised ``error``. ``where``: on what it ran ("on a small test"), for the message.
    """

    def __init__(
        self,
        name: str,
        error: Exception | None = None,
        returned: tuple[str, str] | None = None,
        where: str = "",
    ):
        if returned is None:
            super().__init__(f"your `{name}` raised {type(error).__name__}: {error}")
        else:
            got, want = returned
            super().__init__(f"your `{name}` returned {got}{where}, where {want} was expected")
        self.name, self.error, self.returned = name, error, returned


def _shape_words(shape) -> str:
    return "(" + ", ".join(str(int(n)) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def _tensor_words(got, want: tuple[int, ...], what: str = "") -> tuple[str, str] | None:
    """What is wrong with one returned tensor ``got`` that should have shape ``want``, or None."""
    if not isinstance(got, torch.Tensor):
        return f"{what}a {type(got).__name__}", f"a tensor of shape {_shape_words(want)}"
    if tuple(got.shape) != tuple(want):
        return f"{what}shape {_shape_words(got.shape)}", _shape_words(want)
    return None


def _expected_shapes(name: str, args: tuple, kwargs: dict):
    """The shape(s) the lesson's API promises for ``name`` on these arguments, or None where it
    promises none here (a function the explorers do not check, or arguments it cannot read)."""

    def arg(i: int, key: str):
        return _arg(args, kwargs, i, key)

    try:
        if name in ("scores", "scaled_scores"):
            Q, K = arg(0, "Q"), arg(1, "K")
            return (*torch.broadcast_shapes(Q.shape[:-2], K.shape[:-2]), Q.shape[-2], K.shape[-2])
        if name == "causal_mask":
            return (int(arg(0, "T")), int(arg(0, "T")))
        if name == "padding_mask":
            return (len(arg(0, "lengths")), 1, int(arg(1, "T")))
        if name == "apply_mask":
            return tuple(torch.broadcast_shapes(arg(0, "S").shape, arg(1, "allowed").shape))
        if name == "softmax":
            return tuple(arg(0, "Z").shape)
        if name == "mix":
            A, V = arg(0, "A"), arg(1, "V")
            return (*torch.broadcast_shapes(A.shape[:-2], V.shape[:-2]), A.shape[-2], V.shape[-1])
        if name == "attention":
            Q, K, V = arg(0, "Q"), arg(1, "K"), arg(2, "V")
            batch = torch.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
            mask = arg(3, "mask")
            if isinstance(mask, torch.Tensor) and mask.dim() > 2:
                batch = torch.broadcast_shapes(batch, mask.shape[:-2])
            return ((*batch, Q.shape[-2], V.shape[-1]), (*batch, Q.shape[-2], K.shape[-2]))
        if name == "project":
            X = arg(0, "X")
            return tuple((*X.shape[:-1], W.shape[-1]) for W in (arg(1, "W_q"), arg(2, "W_k"), arg(3, "W_v")))
    except (AttributeError, IndexError, TypeError, ValueError, RuntimeError):
        return None
    return None


def wrong_result(name: str, got, args: tuple, kwargs: dict) -> tuple[str, str] | None:
    """What the student's ``name`` returned that the lesson's API rules out on these arguments, and
    what was expected, in words (("shape (5, 6)", "(5, 5)")); None when it has the promised form.

    Only the form is checked (types, shapes, keys, lengths): wrong values are the explorers' to show.
    """
    if name == "soft_lookup":
        keys, values = _arg(args, kwargs, 1, "keys"), _arg(args, kwargs, 2, "values")
        if not (isinstance(got, tuple | list) and len(got) == 2):
            return f"a {type(got).__name__}{_len_words(got)}", "(weights, output)"
        weights, output = got
        if not isinstance(weights, dict) or set(weights) != set(keys):
            return f"weights {_keys_words(weights)}", f"a dict with the keys {_keys_words(keys)}"
        width = len(next(iter(values.values()), []))
        if not isinstance(output, Sequence | torch.Tensor) or len(output) != width:
            n = len(output) if hasattr(output, "__len__") else type(output).__name__
            return f"an output of length {n}", f"one of length {width} (as long as each value)"
        return None
    if name == "score_spread":
        if not (isinstance(got, tuple | list) and len(got) == 2 and all(_is_number(x) for x in got)):
            what = (
                ", ".join(_value_words(x) for x in got)
                if isinstance(got, tuple | list)
                else type(got).__name__
            )
            return f"({what})" if isinstance(
                got, tuple | list
            ) else f"a {what}", "a pair of numbers (raw_std, scaled_std)"
        return None
    want = _expected_shapes(name, args, kwargs)
    if want is None:
        return None
    if name in ("attention", "project"):
        parts = ("O", "A") if name == "attention" else ("Q", "K", "V")
        if not (isinstance(got, tuple | list) and len(got) == len(parts)):
            form = "(" + ", ".join(parts) + ")"
            return f"a {type(got).__name__}{_len_words(got)}", form
        for part, tensor, shape in zip(parts, got, want):
            words = _tensor_words(tensor, shape, what=f"{part} of ")
            if words:
                return words
        return None
    return _tensor_words(got, want)


def _is_number(x) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, torch.Tensor):
        return x.numel() == 1 and not x.is_complex()
    try:
        float(x)
    except (TypeError, ValueError):
        return False
    return True


def _value_words(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {_shape_words(x.shape)}"
    return repr(x) if _is_number(x) else f"a {type(x).__name__}"


def _arg(args: tuple, kwargs: dict, i: int, key: str):
    """Argument ``i`` of a call, or the one passed by the name ``key``."""
    return args[i] if len(args) > i else kwargs.get(key)


def _keys_words(d) -> str:
    if not isinstance(d, dict):
        return f"as a {type(d).__name__}"
    return "{" + ", ".join(repr(k) for k in d) + "}"


def _len_words(got) -> str:
    return f" of {len(got)} items" if isinstance(got, tuple | list) else ""


def _guard(name: str, fn: Callable) -> Callable:
    """The student's function, raising StudentFunctionError (naming it) when it fails or returns
    what the lesson's API rules out (a shape the explorer cannot draw)."""

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        try:
            got = fn(*args, **kwargs)
        except Exception as error:
            raise StudentFunctionError(name, error) from error
        wrong = wrong_result(name, got, args, kwargs)
        if wrong:
            raise StudentFunctionError(name, returned=wrong, where=" here")
        return got

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
    # a result of the wrong form is named where the explorer runs it, in the shapes on screen
    if compare and expected is not None and not wrong_result(name, got, args, kwargs):
        if _difference(got, expected) > 1e-4:  # how it differs is said on screen, in the explorer's numbers
            note += " (on a small test it differs from the built-in version)"
    return Choice(name, _guard(name, student), "yours", note)


def fallback(error: StudentFunctionError) -> Choice:
    """The built-in stand-in for a student's function that failed while an explorer ran it."""
    until = "it runs" if error.returned is None else "yours returns what was expected"
    return Choice(error.name, None, "error", f"{error}. Showing the course's built-in version until {until}.")


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
