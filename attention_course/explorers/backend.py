"""Which function an explorer runs: the student's own, or the course's built-in version.

An explorer is handed the student's functions. Each one is tried once on a small
example: a stub (still raising ``NotImplementedError``) or a function that fails
is replaced by a built-in version made of PyTorch one-liners, and the explorer
says so next to its controls. Nothing here draws or needs a widget.
"""

from __future__ import annotations

import functools
import html
import math
import re
import warnings
from collections.abc import Callable
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


# ------------------------------------------------------------ built-in versions


def builtin_project(X: torch.Tensor, W_q: torch.Tensor, W_k: torch.Tensor, W_v: torch.Tensor):
    """Shapes: X (..., T, d_model) -> Q, K (..., T, d_k), V (..., T, d_v)."""
    return X @ W_q, X @ W_k, X @ W_v


def builtin_scores(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Shapes: Q (..., T_q, d_k), K (..., T_k, d_k) -> (..., T_q, T_k)."""
    return torch.matmul(Q, K.transpose(-2, -1))


def builtin_scaled_scores(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Shapes: Q (..., T_q, d_k), K (..., T_k, d_k) -> (..., T_q, T_k)."""
    return builtin_scores(Q, K) / math.sqrt(Q.shape[-1])


def builtin_score_spread(d_k: int, n: int, generator: torch.Generator) -> tuple[float, float]:
    """Std of raw and scaled dot products of n pairs of unit-variance vectors."""
    q = torch.randn(n, d_k, generator=generator)
    k = torch.randn(n, d_k, generator=generator)
    raw = torch.linalg.vecdot(q, k).std().item()
    return raw, raw / math.sqrt(d_k)


def builtin_causal_mask(T: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Shapes: -> (T, T) bool, True where j <= i."""
    return torch.tril(torch.ones(T, T, dtype=torch.bool, device=device))


def builtin_apply_mask(S: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Shapes: S (..., T_q, T_k), allowed broadcastable -> (..., T_q, T_k)."""
    return S.masked_fill(~allowed, float("-inf"))


def builtin_softmax(Z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """PyTorch's softmax; a row that is all -inf gives zeros."""
    return torch.nan_to_num(torch.softmax(Z, dim=dim), nan=0.0)


def builtin_mix(A: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Shapes: A (..., T_q, T_k), V (..., T_k, d_v) -> (..., T_q, d_v)."""
    return A @ V


def builtin_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None = None):
    """Shapes: Q (..., T_q, d_k), K (..., T_k, d_k), V (..., T_k, d_v) -> O (..., T_q, d_v), A."""
    S = builtin_scaled_scores(Q, K)
    if mask is not None:
        S = builtin_apply_mask(S, mask)
    A = builtin_softmax(S)
    return A @ V, A


def builtin_soft_lookup(query, keys, values, sharpness):
    """The soft dictionary through PyTorch: weights dict name -> float, output list."""
    names = list(keys)
    k = torch.tensor([keys[n] for n in names], dtype=torch.float64)  # (n_keys, d)
    v = torch.tensor([values[n] for n in names], dtype=torch.float64)  # (n_keys, width)
    q = torch.tensor(query, dtype=torch.float64)  # (d,)
    w = torch.softmax(sharpness * (k @ q) / math.sqrt(len(query)), dim=0)
    return dict(zip(names, w.tolist())), (w @ v).tolist()


BUILTINS: dict[str, Callable] = {
    "project": builtin_project,
    "scores": builtin_scores,
    "scaled_scores": builtin_scaled_scores,
    "score_spread": builtin_score_spread,
    "causal_mask": builtin_causal_mask,
    "apply_mask": builtin_apply_mask,
    "softmax": builtin_softmax,
    "mix": builtin_mix,
    "attention": builtin_attention,
    "soft_lookup": builtin_soft_lookup,
}


# -------------------------------------------------------- probes: tiny examples


def _probe_inputs(name: str) -> tuple[tuple, dict]:
    g = torch.Generator().manual_seed(7)
    Q, K, V = (torch.randn(3, 2, generator=g), torch.randn(4, 2, generator=g), torch.randn(4, 5, generator=g))
    return {
        "project": (
            (torch.randn(3, 4, generator=g), torch.randn(4, 2), torch.randn(4, 2), torch.randn(4, 5)),
            {},
        ),
        "scores": ((Q, K), {}),
        "scaled_scores": ((Q, K), {}),
        "score_spread": ((4, 64, torch.Generator().manual_seed(0)), {}),
        "causal_mask": ((4,), {}),
        "apply_mask": ((torch.randn(4, 4, generator=g), builtin_causal_mask(4)), {}),
        "softmax": ((torch.randn(3, 4, generator=g),), {"dim": -1}),
        "mix": ((torch.softmax(torch.randn(3, 4, generator=g), -1), V), {}),
        "attention": ((Q, K, V), {}),
        "soft_lookup": (([1.0, 0.1], {"a": [1.0, 0.0], "b": [0.0, 1.0]}, {"a": [1.0], "b": [0.0]}, 1.0), {}),
    }[name]


def _difference(a, b) -> float:
    """Largest absolute difference between two results of the same function."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return math.inf
        if a.dtype == torch.bool or b.dtype == torch.bool:
            return float((a.bool() != b.bool()).any())
        diff = (a.detach().double() - b.detach().double()).abs()
        same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
        return float(torch.where(same_inf, 0.0, diff).nan_to_num(nan=math.inf).max()) if diff.numel() else 0.0
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

    ``source`` is one of "yours", "stub", "error", "built-in".
    """

    name: str
    fn: Callable
    source: str
    note: str

    @property
    def yours(self) -> bool:
        return self.source == "yours"


def choose(name: str, student: Callable | None, lesson: str | None = None, compare: bool = True) -> Choice:
    """Try the student's function on a tiny example; fall back to the built-in one if it cannot run.

    ``lesson`` names where the student writes the function when it is not part of
    the current lesson (e.g. "lesson 05"), for the label.
    """
    builtin = BUILTINS[name]
    if student is None:
        where = f" (you write your own in {lesson})" if lesson else ""
        return Choice(name, builtin, "built-in", f"`{name}`: the course's built-in version{where}")
    args, kwargs = _probe_inputs(name)
    try:
        got = student(*args, **kwargs)
    except NotImplementedError:
        return Choice(
            name,
            builtin,
            "stub",
            f"`{name}` is still a stub: implement `{name}` above to see your own version here. "
            "Until then this shows the course's built-in version.",
        )
    except Exception as exc:  # any failure of student code: show it, keep the explorer alive
        return Choice(
            name,
            builtin,
            "error",
            f"your `{name}` raised {type(exc).__name__}: {exc}. Showing the course's built-in version "
            "until it runs.",
        )
    note = f"`{name}`: yours"
    if compare:
        diff = _difference(got, builtin(*args, **kwargs))
        if diff > 1e-4:
            note += (
                " (on a small test it differs from the built-in version"
                + (f" by up to {diff:.3g}" if math.isfinite(diff) else ": other shape or keys")
                + ", so what you see here is your version's answer)"
            )
    return Choice(name, _guard(name, student), "yours", note)


def fallback(error: StudentFunctionError) -> Choice:
    """The built-in stand-in for a student's function that failed while an explorer ran it."""
    return Choice(
        error.name,
        BUILTINS[error.name],
        "error",
        f"{error}. Showing the course's built-in version until it runs.",
    )


def banner_html(choices: list[Choice]) -> str:
    """One line per function: whose version the explorer is running."""
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
    return "<div style='font-size:0.9em;line-height:1.35'>" + "".join(rows) + "</div>"


def banner_text(choices: list[Choice]) -> str:
    return "\n".join(f"[{c.source}] {c.note}" for c in choices)
