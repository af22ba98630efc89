"""Lesson 03, scaling: ``scaled_scores`` and ``score_spread``: hidden reference, seeded cases, known mistakes.

Device-agnostic: every tensor result lives on the device, and keeps the dtype, of its inputs; any
leading batch dimensions are accepted, ``(..., T, d)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grader.harness import Case, Exercise, Property, Trap
from grader.lessons._common import TK, TQ, B, gen, label, randn
from grader.lessons.l02_scoring import qk_cases, scores


def scaled_scores(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Scores divided by sqrt(d_k), d_k read from the inputs.

    Shapes: Q (..., T_q, d_k), K (..., T_k, d_k) -> (..., T_q, T_k).
    """
    d_k = Q.shape[-1]
    return scores(Q, K) / math.sqrt(d_k)


def score_spread(d_k: int, n: int, generator: torch.Generator) -> tuple[float, float]:
    """Std of raw and of scaled dot products of n pairs of unit-variance vectors.

    Shapes: draws q, k (n, d_k) -> dots (n,) -> two floats.
    """
    q = torch.randn(n, d_k, generator=generator)
    k = torch.randn(n, d_k, generator=generator)
    dots = (q * k).sum(dim=-1)
    raw = dots.std().item()
    return raw, raw / math.sqrt(d_k)


# ----------------------------------------------------------------- seeded cases and mistakes


def _divided(Q: torch.Tensor, K: torch.Tensor, by: float) -> torch.Tensor:
    return scores(Q, K) / by


OTHER_DK = 16  # a head size besides the cases' usual 8: a divisor fixed at sqrt(8) fails it


def _scaled_cases(device: torch.device) -> list[Case]:
    Q = randn(B, TQ, OTHER_DK, seed=290, device=device)
    K = randn(B, TK, OTHER_DK, seed=291, device=device)
    other = Case(label(f"batched 3-D, d_k = {OTHER_DK}", torch.float32, device), (Q, K))
    return qk_cases(device, seed=200) + [other]


SCALED_SCORES = Exercise(
    reference=scaled_scores,
    cases=_scaled_cases,
    traps=[
        Trap(
            "no scaling at all",
            "Divide the scores by sqrt(d_k) so their variance stays near 1 whatever d_k is.",
            lambda Q, K: scores(Q, K),
            example="return Q @ K.mT",
        ),
        Trap(
            "divided by d_k instead of sqrt(d_k)",
            "The dot product's standard deviation grows like sqrt(d_k), so divide by its root.",
            lambda Q, K: _divided(Q, K, Q.shape[-1]),
            example="return Q @ K.mT / Q.shape[-1]",
        ),
        Trap(
            "d_k read with shape[1] instead of shape[-1]",
            "shape[1] is d_k only for 2-D inputs; on batches it is a token or head count. Use Q.shape[-1].",
            lambda Q, K: _divided(Q, K, math.sqrt(Q.shape[1])),
            example="return Q @ K.mT / math.sqrt(Q.shape[1])",
        ),
        Trap(
            "divided by sqrt of the number of tokens",
            "d_k is the size of the last dimension of Q and K (Q.shape[-1]), not the token count.",
            lambda Q, K: _divided(Q, K, math.sqrt(Q.shape[-2])),
            example="return Q @ K.mT / math.sqrt(Q.shape[-2])",
        ),
        Trap(
            "K Q^T instead of Q K^T",
            "S[i, j] is query i against key j: S = Q @ K^T / sqrt(d_k).",
            lambda Q, K: (K @ Q.transpose(-2, -1)) / math.sqrt(Q.shape[-1]),
            example="return K @ Q.mT / math.sqrt(Q.shape[-1])",
        ),
        Trap(
            "a hard-coded divisor (sqrt(3), the d_k of 'I love cats')",
            "Read d_k from the inputs (Q.shape[-1]) so the function works for every head size.",
            lambda Q, K: _divided(Q, K, math.sqrt(3)),
            example="return Q @ K.mT / math.sqrt(3)",
        ),
    ],
)


# (d_k, n, seed): sample sizes and seeds the lesson never shows
_SPREAD_SPEC = [(1, 24000, 7919), (16, 18000, 104729), (64, 30000, 1299709), (5, 16000, 15485863)]


@dataclass(frozen=True)
class _Population:
    """What score_spread estimates: the std of q . k is sqrt(d_k), of (q . k) / sqrt(d_k) it is 1."""

    d_k: int
    n: int


def _spread_population(d_k: int, n: int, generator: torch.Generator) -> _Population:
    return _Population(d_k, n)


def spread_standard_error(d_k: int, n: int) -> float:
    """Relative standard error of the std of n dot products of d_k pairs of unit-normal entries.

    A product of two independent N(0, 1) has variance 1 and fourth moment E[q^4] E[k^4] = 9; a
    sum of d_k of them has variance d_k and kurtosis 3 + 6 / d_k. The sample std s of n draws
    then has sd(s) ~ sigma * sqrt((kurtosis - 1) / (4 n)).
    """
    kurtosis = 3.0 + 6.0 / d_k
    return math.sqrt((kurtosis - 1.0) / (4.0 * n))


def _two_floats(x) -> tuple[float, float] | None:
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        return None
    try:
        a, b = float(x[0]), float(x[1])
    except (TypeError, ValueError, RuntimeError):
        return None
    return (a, b) if math.isfinite(a) and math.isfinite(b) else None


def _compare_spread(expected, got, label: str) -> str | None:
    pair = _two_floats(got)
    if pair is None:
        return f"score_spread should return two finite numbers (raw_std, scaled_std), got {got!r}."
    raw, scaled = pair
    root = math.sqrt(expected.d_k)
    # exact: both stds come from the same dot products, one set divided by sqrt(d_k)
    if scaled == 0 or not math.isclose(raw / scaled, root, rel_tol=1e-4):
        ratio = "infinite" if scaled == 0 else f"{raw / scaled:.6g}"
        return (
            f"raw_std / scaled_std is {ratio}; it should be exactly sqrt(d_k) = {root:.6g}: "
            "scaled_std is the std of the same dot products divided by sqrt(d_k)."
        )
    # about five standard errors of a std estimated from n samples
    tolerance = 5 * spread_standard_error(expected.d_k, expected.n)
    if abs(raw / root - 1) > tolerance:
        return (
            f"raw_std is {raw:.4g}; for unit-variance vectors it should be sqrt(d_k) = {root:.4g} "
            f"give or take {100 * tolerance:.1f} % with {expected.n} samples."
        )
    return None


def _same_spread(a, b, case: Case) -> bool:
    """Two spreads agree when they differ by less than random sampling explains (or are equally invalid)."""
    pa, pb = _two_floats(a), _two_floats(b)
    if pa is None or pb is None:
        return pa is None and pb is None
    d_k, n = case.args[0], case.args[1]
    tolerance = 6 * math.sqrt(2) * spread_standard_error(d_k, n)
    return all(abs(x - y) <= tolerance * max(abs(x), abs(y)) + 1e-12 for x, y in zip(pa, pb))


def _spreads(fn, d_k: int, n: int, generator: torch.Generator):
    try:
        return _two_floats(fn(d_k, n, generator))
    except Exception:  # noqa: BLE001 - a property that cannot run does not hold
        return None


# The properties' generators come from ``gen`` like the cases' ones: seeded with the lesson's seeds
# outside grading, with seeds drawn from the submission's salt while graded (see _common.salted), so
# answers memorised for one attempt's generators are of no use to the next.
# How far the "used" generator is run first: ten times the 2 * 3000 * 16 numbers one answer draws.
SPREAD_PROPERTY_ADVANCE = 10 * 2 * 3000 * 16 + 7


def _same_state_same_answer(fn) -> str | None:
    one = _spreads(fn, 16, 3000, gen(2718))
    two = _spreads(fn, 16, 3000, gen(2718))
    if one is None or one != two:
        return (
            f"two generators in the same state gave {one} and {two}: draw every random number with "
            "generator=generator, so that the same generator state gives the same answer."
        )
    return None


def _other_seed_other_answer(fn) -> str | None:
    one = _spreads(fn, 16, 3000, gen(31415))
    two = _spreads(fn, 16, 3000, gen(27182))
    if one is not None and one == two:
        return (
            f"two generators with different seeds gave the same answer {one}: the spreads must be "
            "measured on random draws made with the generator."
        )
    return None


def _state_is_used(fn) -> str | None:
    fresh = gen(1618)
    used = gen(1618)
    # same seed, later state: far enough on that the answer's draws share none of the fresh one's. After
    # a few numbers only (randn(7)), PyTorch's stream is the fresh one a block later, so all but a few
    # dot products are the same and a float32 std is now and then the same to the last bit.
    torch.randn(SPREAD_PROPERTY_ADVANCE, generator=used)
    one, two = _spreads(fn, 16, 3000, fresh), _spreads(fn, 16, 3000, used)
    if one is not None and one == two:
        return (
            "a generator that had already drawn numbers gave the same answer as a fresh one with the "
            "same seed: draw from the generator as it is (generator=generator), do not re-seed it."
        )
    return None


def _spread_scaled_by(divisor) -> callable:
    def trap(d_k: int, n: int, generator: torch.Generator) -> tuple[float, float]:
        raw, _ = score_spread(d_k, n, generator)
        return raw, raw / divisor(d_k)

    return trap


def _spread_unsummed(d_k: int, n: int, generator: torch.Generator) -> tuple[float, float]:
    p = torch.randn(n, d_k, generator=generator) * torch.randn(n, d_k, generator=generator)
    return p.std().item(), (p / math.sqrt(d_k)).std().item()


def _spread_uniform(d_k: int, n: int, generator: torch.Generator) -> tuple[float, float]:
    dots = (torch.rand(n, d_k, generator=generator) * torch.rand(n, d_k, generator=generator)).sum(-1)
    return dots.std().item(), (dots / math.sqrt(d_k)).std().item()


def _spread_global(d_k: int, n: int, generator: torch.Generator) -> tuple[float, float]:
    dots = (torch.randn(n, d_k) * torch.randn(n, d_k)).sum(-1)
    return dots.std().item(), (dots / math.sqrt(d_k)).std().item()


SCORE_SPREAD = Exercise(
    reference=score_spread,
    expected=_spread_population,
    cases=lambda device: [
        Case(f"d_k = {d}, n = {n}, a fresh generator", (d, n, gen(seed))) for d, n, seed in _SPREAD_SPEC
    ],
    compare=_compare_spread,
    same=_same_spread,
    properties=[
        Property("the same generator state, twice", _same_state_same_answer),
        Property("two generators with different seeds", _other_seed_other_answer),
        Property("a generator that has already been used", _state_is_used),
    ],
    traps=[
        Trap(
            "the scaled std divides by d_k instead of sqrt(d_k)",
            "The std of a dot product of unit-variance vectors is sqrt(d_k); divide by that.",
            _spread_scaled_by(lambda d: d),
            example="return dots.std().item(), (dots / d_k).std().item()",
        ),
        Trap(
            "the scaled std is not scaled",
            "scaled_std is the std of (q . k) / sqrt(d_k).",
            _spread_scaled_by(lambda d: 1.0),
            example="return dots.std().item(), dots.std().item()",
        ),
        Trap(
            "the products q * k were not summed into dot products",
            "Sum over the last dimension: (q * k).sum(dim=-1) gives the n dot products.",
            _spread_unsummed,
            example="dots = q * k  # (n, d_k): products, not dot products",
        ),
        Trap(
            "uniform draws (torch.rand) instead of unit-variance normal draws",
            "torch.rand has variance 1/12; use torch.randn(..., generator=generator).",
            _spread_uniform,
            example="q = torch.rand(n, d_k, generator=generator)",
        ),
        Trap(
            "the generator was not used (torch.randn without generator=)",
            "Pass generator=generator to every torch.randn, so that the same generator gives the same "
            "answer and another seed another one.",
            _spread_global,
            example="q = torch.randn(n, d_k)",
        ),
    ],
)


EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (SCALED_SCORES, SCORE_SPREAD)}
