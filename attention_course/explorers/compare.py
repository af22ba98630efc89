"""Where what an explorer shows departs from the lesson's arithmetic, in words a student can use.

Every explorer compares each matrix it shows with what the lesson's arithmetic gives
from the matrices shown before it, and says so in plain words: which stage, which
cells, and how ("-inf where a finite score was expected", "every score 8 times
smaller"). It also words a row of weights from the weights themselves: what it sums
to, which key it looks at most, or that it has no key at all. No widgets, no plots.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .numeric import fmt

FIRST = "First difference from the lesson"  # how every explorer's "differs" line begins
REL, ABS = 1e-4, 1e-6  # two numbers agree within these: the explorers' float64 against the student's float32


def same(got: float, want: float) -> bool:
    """Whether two shown numbers are the same number (infinities of one sign alike, NaN never)."""
    if math.isnan(got) or math.isnan(want):
        return False
    if math.isinf(got) or math.isinf(want):
        return got == want
    return math.isclose(got, want, rel_tol=REL, abs_tol=ABS)


def _close(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Cell by cell: the same number (see :func:`same`). Shapes: got and want alike -> bool, alike."""
    g, w = got.double(), want.double()
    both_inf = torch.isinf(g) & torch.isinf(w) & (torch.sign(g) == torch.sign(w))
    finite = torch.isfinite(g) & torch.isfinite(w) & ((g - w).abs() <= ABS + REL * w.abs())
    return both_inf | finite


def differing(got: torch.Tensor, want: torch.Tensor) -> list[tuple[int, ...]]:
    """The cells where ``got`` is not ``want`` (every cell when the shapes differ)."""
    if got.shape != want.shape:
        return [tuple(ix) for ix in torch.ones(want.shape).nonzero().tolist()]
    if got.dtype == torch.bool or want.dtype == torch.bool:
        bad = got.bool() != want.bool()
    else:
        bad = ~_close(got, want)
    return [tuple(ix) for ix in bad.nonzero().tolist()]


def cell_words(got: float, want: float, what: str = "score") -> str:
    """One cell's difference: "-inf where a finite score (2.31) was expected", "0 where -inf was expected"."""
    if math.isnan(got):
        return f"NaN where {fmt(want)} was expected"
    if math.isinf(got) and not math.isinf(want):
        return f"{fmt(got)} where a finite {what} ({fmt(want)}) was expected"
    if math.isinf(want) and not math.isinf(got):
        return f"{fmt(got)} where {fmt(want)} was expected"
    if f"{got:.3f}" == f"{want:.3f}":  # too close for 3 places: as many as tell them apart
        return f"{got:.6g} where {want:.6g} was expected"
    return f"{fmt(got, 3)} where {fmt(want, 3)} was expected"


def ratio_words(got: torch.Tensor, want: torch.Tensor, hints: dict[float, str] | None = None) -> str:
    """When every finite cell of ``got`` is one multiple of ``want``: "every value is 8 times smaller"."""
    g, w = got.double().flatten(), want.double().flatten()
    ok = torch.isfinite(g) & torch.isfinite(w) & (w.abs() > 1e-9)
    if int(ok.sum()) < 2:
        return ""
    r = g[ok] / w[ok]
    ratio = r.median().item()
    if ratio == 0:  # every value 0 where the lesson's is not: no "times smaller"
        return ""
    if not torch.allclose(r, torch.full_like(r, ratio), rtol=1e-3, atol=1e-9) or abs(ratio - 1) < 1e-3:
        return ""
    if ratio < 0:
        words = f"every value is {fmt(-ratio, 3)} times the lesson's with its sign flipped"
    elif ratio < 1:
        words = f"every value is {fmt(1 / ratio, 3)} times smaller than the lesson's"
    else:
        words = f"every value is {fmt(ratio, 3)} times larger than the lesson's"
    for value, hint in (hints or {}).items():
        if math.isclose(ratio, value, rel_tol=1e-3):
            return f"{words} ({hint})"
    return words


def size_words(got: torch.Tensor, want: torch.Tensor, what: str = "score", hints=None) -> str:
    """How ``got`` departs from ``want`` over their differing cells, in words."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} where {tuple(want.shape)} was expected"
    cells = differing(got, want)
    g, w = got.double(), want.double()
    kinds: dict[str, int] = {}
    finite_gaps = []
    for ix in cells:
        a, b = g[ix].item(), w[ix].item()
        if math.isnan(a):
            kind = "NaN where a number was expected"
        elif math.isinf(a) and math.isfinite(b):
            kind = f"{fmt(a)} where a finite {what} was expected"
        elif math.isinf(b) and math.isfinite(a):
            kind = f"{'0' if a == 0 else 'a finite ' + what} where {fmt(b)} was expected"
        elif math.isinf(a) and math.isinf(b):
            kind = f"{fmt(a)} where {fmt(b)} was expected"
        else:
            finite_gaps.append(abs(a - b))
            continue
        kinds[kind] = kinds.get(kind, 0) + 1
    parts = [f"{kind} ({n} cell{'s' if n != 1 else ''})" for kind, n in kinds.items()]
    if finite_gaps:
        ratio = ratio_words(got, want, hints)
        gap = max(finite_gaps)
        parts.append(ratio or f"off by up to {fmt(gap, 3) if gap >= 5e-4 else f'{gap:.2g}'}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Difference:
    """How one shown stage departs from the lesson's arithmetic on the stage before it."""

    stage: str  # the key of the stage ("scaled", "A", ...)
    title: str  # how the explorer names the stage ("stage 2, scaled")
    maker: str  # the function that made it ("scaled_scores"), or "" for the explorer's own arithmetic
    yours: bool  # whether the student's function made it
    cells: tuple[tuple[int, ...], ...]
    total: int  # how many cells the stage has
    words: str  # how it differs
    example: str = ""  # one cell, named, in words

    @property
    def by(self) -> str:
        if not self.maker:
            return ""
        return f" (your `{self.maker}`)" if self.yours else f" (the course's `{self.maker}`)"

    def line(self) -> str:
        """The plain line an explorer shows: where it first differs, which cells, and how."""
        n = len(self.cells)
        where = f"{n} of {self.total} cells differ" if n < self.total else f"all {self.total} cells differ"
        example = f", e.g. {self.example}" if self.example else ""
        return f"{FIRST} at {self.title}{self.by}: {where}{example}: {self.words}."


def compare(
    stage: str,
    title: str,
    got: torch.Tensor,
    want: torch.Tensor,
    maker: str = "",
    yours: bool = False,
    name: Callable[[tuple[int, ...]], str] | None = None,
    what: str = "score",
    hints: dict[float, str] | None = None,
) -> Difference | None:
    """The :class:`Difference` between a shown stage and the lesson's, or None where they agree."""
    got, want = got.detach().cpu(), want.detach().cpu()
    cells = differing(got, want)
    if not cells:
        return None
    example = ""
    if got.shape == want.shape and name is not None:
        ix = cells[0]
        if got.dtype == torch.bool:
            example = f"{name(ix)} is {'allowed' if bool(got[ix]) else 'hidden'} where the lesson's mask " + (
                "hides it" if bool(got[ix]) else "allows it"
            )
        else:
            example = f"{name(ix)} is {cell_words(got[ix].item(), want[ix].item(), what)}"
    words = mask_words(got, want) if got.dtype == torch.bool else size_words(got, want, what, hints)
    return Difference(stage, title, maker, yours, tuple(cells), max(want.numel(), 1), words, example)


# ------------------------------------------------------------------------ masks


def mask_pattern(allowed: torch.Tensor) -> tuple[str, str]:
    """What a (T, T) mask lets query i see, and where the cells it hides sit, both in words."""
    T = allowed.shape[-1]
    m = allowed.bool().cpu()
    ones = torch.ones(T, T, dtype=torch.bool)
    patterns = (
        (ones.tril(), "query i may look at keys 0 .. i (itself and earlier tokens)"),
        (ones.tril(-1), "query i may look at keys 0 .. i-1 (earlier tokens, not itself)"),
        (ones.triu(), "query i may look at keys i .. T-1 (itself and later tokens)"),
        (ones.triu(1), "query i may look at keys i+1 .. T-1 (later tokens only)"),
        (ones, "every query may look at every key"),
        (~ones, "no query may look at any key"),
    )
    what = next((words for p, words in patterns if torch.equal(m, p)), "an uneven pattern of allowed keys")
    places = (
        (ones.triu(1), "above the diagonal (later tokens)"),
        (ones.triu(), "on and above the diagonal (each token itself and later ones)"),
        (ones.tril(-1), "below the diagonal (earlier tokens)"),
        (ones.tril(), "on and below the diagonal (each token itself and earlier ones)"),
    )
    where = next((words for p, words in places if torch.equal(~m, p)), "")
    return what, where


def mask_words(got: torch.Tensor, want: torch.Tensor) -> str:
    """How a boolean mask departs from the lesson's: which cells it allows or hides that it should not."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} where {tuple(want.shape)} was expected"
    g, w = got.bool(), want.bool()
    extra, missing = int((g & ~w).sum()), int((~g & w).sum())
    parts = []
    if extra:
        parts.append(f"it allows {extra} cell{'s' if extra != 1 else ''} the lesson's mask hides")
    if missing:
        parts.append(f"it hides {missing} cell{'s' if missing != 1 else ''} the lesson's mask allows")
    if torch.equal(g, ~w):
        parts.append("True and False are swapped (True must mean 'may look')")
    return "; ".join(parts)


# ---------------------------------------------------------------- rows of weights


def is_empty(row: Sequence[float]) -> bool:
    """A row of weights that is all zeros: a query with no key it may look at."""
    return all(x == 0 for x in row)


def sum_words(row: Sequence[float]) -> str:
    """ "sums to 1", "sums to 0.76, not 1", or "all 0" for a query with no allowed key."""
    if is_empty(row):
        return "all 0: no key is allowed"
    total = sum(row)
    if math.isnan(total):
        return "holds NaN"
    return "sums to 1" if math.isclose(total, 1.0, abs_tol=1e-4) else f"sums to {fmt(total, 3)}, not 1"


def looks_words(name: str, row: Sequence[float], labels: Sequence[str]) -> str:
    """Which key a query's row of weights looks at most, read from the row itself."""
    if is_empty(row):
        return f"'{name}' may look at no key: all its weights are 0, so its output is 0 too"
    finite = [j for j, x in enumerate(row) if math.isfinite(x)]
    if not finite:
        return f"'{name}' has no usable weight (NaN)"
    best = max(finite, key=lambda j: row[j])
    return f"'{name}' looks most at '{labels[best]}' ({row[best]:.2f})"


def weight_guesses(candidates: dict[str, torch.Tensor], got: torch.Tensor) -> str:
    """The first of several usual mistakes whose weights are exactly the ones shown, named ("" if none)."""
    for words, want in candidates.items():
        if want.shape == got.shape and not differing(got, want):
            return words
    return ""
