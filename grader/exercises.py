"""Seeded cases and known mistakes ("traps") for every graded function.

Sizes are all different on purpose, so that T_q, T_k, d_model, d_k, d_v, batch
and heads can't be confused: a function that mixes two of them up gets a wrong
shape or an error, never a lucky pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grader import reference as ref
from grader.harness import Case, Exercise, Property, Trap, compare_tensor

# T_q, T_k, d_model, d_k, d_v, batch, heads
TQ, TK, DM, DK, DV, B, H = 5, 7, 9, 8, 4, 2, 3
NEG_INF = float("-inf")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, device: torch.device, dtype=torch.float32) -> torch.Tensor:
    """Seeded standard normal draw, made on the CPU then moved (same numbers everywhere)."""
    return torch.randn(*shape, generator=_gen(seed), dtype=torch.float64).to(device, dtype)


def _batches() -> list[tuple[str, tuple[int, ...]]]:
    return [("2-D", ()), ("batched 3-D", (B,)), ("batched 4-D (batch, heads)", (B, H))]


def _label(kind: str, dtype: torch.dtype, device: torch.device) -> str:
    return f"{kind}, {str(dtype).replace('torch.', '')} on {device.type}"


def _dtypes(batch: tuple[int, ...]) -> list[torch.dtype]:
    return [torch.float32] if batch == (B,) else [torch.float32, torch.float64]


# ----------------------------------------------------------------- 01 projection


def _project_cases(device: torch.device) -> list[Case]:
    cases = []
    for i, (kind, batch) in enumerate(_batches()):
        for dtype in _dtypes(batch):
            X = randn(*batch, TQ, DM, seed=10 + i, device=device, dtype=dtype)
            W_q = randn(DM, DK, seed=20 + i, device=device, dtype=dtype)
            W_k = randn(DM, DK, seed=30 + i, device=device, dtype=dtype)
            W_v = randn(DM, DV, seed=40 + i, device=device, dtype=dtype)
            cases.append(Case(_label(kind, dtype, device), (X, W_q, W_k, W_v)))
    return cases


PROJECT = Exercise(
    name="project",
    signature="X, W_q, W_k, W_v",
    reference=ref.project,
    cases=_project_cases,
    output_names=("Q", "K", "V"),
    traps=[
        Trap(
            "Q was computed with W_k",
            "Each role has its own matrix: Q = X @ W_q, K = X @ W_k, V = X @ W_v.",
            lambda X, W_q, W_k, W_v: (X @ W_k, X @ W_k, X @ W_v),
        ),
        Trap(
            "Q and K are swapped",
            "Q = X @ W_q is what a token looks for; K = X @ W_k is how it advertises itself.",
            lambda X, W_q, W_k, W_v: (X @ W_k, X @ W_q, X @ W_v),
        ),
        Trap(
            "the matrices multiply from the wrong side",
            "Tokens are rows: X (T, d_model) @ W (d_model, d_k) gives (T, d_k).",
            lambda X, W_q, W_k, W_v: (W_q.mT @ X, W_k.mT @ X, W_v.mT @ X),
            example="Q = W_q.T @ X",
        ),
        Trap(
            "X was transposed to make the shapes fit (X.T @ W)",
            "Never transpose the data: tokens are rows, and X (..., T, d_model) @ W (d_model, d_k) already fits.",
            lambda X, W_q, W_k, W_v: (X.T @ W_q, X.T @ W_k, X.T @ W_v),
            example="Q = X.T @ W_q",
        ),
    ],
)

# ------------------------------------------------------------------- 02 scoring


def _qk_cases(device: torch.device, seed: int = 100) -> list[Case]:
    cases = []
    for i, (kind, batch) in enumerate(_batches()):
        for dtype in _dtypes(batch):
            Q = randn(*batch, TQ, DK, seed=seed + i, device=device, dtype=dtype)
            K = randn(*batch, TK, DK, seed=seed + 10 + i, device=device, dtype=dtype)
            cases.append(Case(_label(kind + ", T_q != T_k", dtype, device), (Q, K)))
    return cases


SCORES = Exercise(
    name="scores",
    signature="Q, K",
    reference=ref.scores,
    cases=_qk_cases,
    traps=[
        Trap(
            "K Q^T instead of Q K^T",
            "S[i, j] is query i against key j: rows are queries, so S = Q @ K^T, shape (T_q, T_k).",
            lambda Q, K: K @ Q.transpose(-2, -1),
        ),
        Trap(
            "Q^T K instead of Q K^T",
            "Q^T K pairs up feature dimensions, not tokens; S = Q @ K^T is tokens x tokens.",
            lambda Q, K: Q.transpose(-2, -1) @ K,
        ),
        Trap(
            "K was not transposed",
            "S = Q @ K.transpose(-2, -1): each query row meets each key row.",
            lambda Q, K: Q @ K,
        ),
        Trap(
            ".T on a batched tensor",
            "On more than 2 dimensions .T reverses all of them; use K.transpose(-2, -1) or K.mT.",
            lambda Q, K: Q @ K.T,
        ),
        Trap(
            "transpose(0, 1) on a batched tensor",
            "Dimension 1 is only the last-but-one on 2-D tensors; transpose(-2, -1) works for any batch.",
            lambda Q, K: Q @ K.transpose(0, 1),
        ),
    ],
)

# ------------------------------------------------------------------- 03 scaling


def _divided(Q: torch.Tensor, K: torch.Tensor, by: float) -> torch.Tensor:
    return ref.scores(Q, K) / by


SCALED_SCORES = Exercise(
    name="scaled_scores",
    signature="Q, K",
    reference=ref.scaled_scores,
    cases=lambda device: _qk_cases(device, seed=200),
    traps=[
        Trap(
            "no scaling at all",
            "Divide the scores by sqrt(d_k) so their variance stays near 1 whatever d_k is.",
            lambda Q, K: ref.scores(Q, K),
        ),
        Trap(
            "divided by d_k instead of sqrt(d_k)",
            "The dot product's standard deviation grows like sqrt(d_k), so divide by its root.",
            lambda Q, K: _divided(Q, K, Q.shape[-1]),
        ),
        Trap(
            "d_k read with shape[1] instead of shape[-1]",
            "shape[1] is d_k only for 2-D inputs; on batches it is a token or head count. Use Q.shape[-1].",
            lambda Q, K: _divided(Q, K, math.sqrt(Q.shape[1])),
        ),
        Trap(
            "divided by sqrt of the number of tokens",
            "d_k is the size of the last dimension of Q and K (Q.shape[-1]), not the token count.",
            lambda Q, K: _divided(Q, K, math.sqrt(Q.shape[-2])),
        ),
        Trap(
            "K Q^T instead of Q K^T",
            "S[i, j] is query i against key j: S = Q @ K^T / sqrt(d_k).",
            lambda Q, K: (K @ Q.transpose(-2, -1)) / math.sqrt(Q.shape[-1]),
        ),
        Trap(
            "a hard-coded divisor (sqrt(3), the d_k of 'I love cats')",
            "Read d_k from the inputs (Q.shape[-1]) so the function works for every head size.",
            lambda Q, K: _divided(Q, K, math.sqrt(3)),
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


def _same_state_same_answer(fn) -> str | None:
    one = _spreads(fn, 16, 3000, torch.Generator().manual_seed(2718))
    two = _spreads(fn, 16, 3000, torch.Generator().manual_seed(2718))
    if one is None or one != two:
        return (
            f"two generators in the same state gave {one} and {two}: draw every random number with "
            "generator=generator, so that the same generator state gives the same answer."
        )
    return None


def _other_seed_other_answer(fn) -> str | None:
    one = _spreads(fn, 16, 3000, torch.Generator().manual_seed(31415))
    two = _spreads(fn, 16, 3000, torch.Generator().manual_seed(27182))
    if one is not None and one == two:
        return (
            f"two generators with different seeds gave the same answer {one}: the spreads must be "
            "measured on random draws made with the generator."
        )
    return None


def _state_is_used(fn) -> str | None:
    fresh = torch.Generator().manual_seed(1618)
    used = torch.Generator().manual_seed(1618)
    torch.randn(7, generator=used)  # same seed, later state
    one, two = _spreads(fn, 16, 3000, fresh), _spreads(fn, 16, 3000, used)
    if one is not None and one == two:
        return (
            "a generator that had already drawn numbers gave the same answer as a fresh one with the "
            "same seed: draw from the generator as it is (generator=generator), do not re-seed it."
        )
    return None


def _spread_scaled_by(divisor) -> callable:
    def trap(d_k: int, n: int, generator: torch.Generator) -> tuple[float, float]:
        raw, _ = ref.score_spread(d_k, n, generator)
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
    name="score_spread",
    signature="d_k, n, generator",
    reference=ref.score_spread,
    expected=_spread_population,
    cases=lambda device: [
        Case(f"d_k = {d}, n = {n}, a fresh generator", (d, n, _gen(seed))) for d, n, seed in _SPREAD_SPEC
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

# ------------------------------------------------------------------- 04 masking


# Device-following is checked where every correct mask can be built: on the device of the
# cases (CUDA when there is one). The 'meta' device is not used: a correct mask built with a
# Python loop (int(lengths[b]), .item(), printing it) cannot run there, so a 'meta' case
# would score correct code as wrong. On a CPU-only machine a mask made on the wrong device
# therefore cannot be told apart (Trap.needs = "cuda").


def _causal_cases(device: torch.device) -> list[Case]:
    cases = [Case(f"T = {T}, device={device.type}", (T,), {"device": device}) for T in (4, 7, 1)]
    cases.append(Case(f"T = 3, device='{device.type}' given as a string", (3,), {"device": device.type}))
    cases.append(Case("T = 6, device not given (CPU)", (6,)))
    return cases


CAUSAL_MASK = Exercise(
    name="causal_mask",
    signature="T, device=None",
    reference=ref.causal_mask,
    cases=_causal_cases,
    traps=[
        Trap(
            "the mask polarity is inverted (True = blocked)",
            "In this course True means 'may look', as in scaled_dot_product_attention: "
            "allowed where j <= i, i.e. torch.tril.",
            lambda T, device=None: ~ref.causal_mask(T, device),
            example="return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)",
        ),
        Trap(
            "the upper triangle instead of the lower one (j >= i)",
            "Row i is the query: it may look at keys j <= i, the past and itself (torch.tril).",
            lambda T, device=None: ref.causal_mask(T, device).T.contiguous(),
            example="return torch.ones(T, T, dtype=torch.bool, device=device).triu()",
        ),
        Trap(
            "a token may not look at itself",
            "The diagonal (j == i) is allowed: use torch.tril without an offset.",
            lambda T, device=None: torch.ones(T, T, dtype=torch.bool, device=device).tril(-1),
            example="return torch.ones(T, T, dtype=torch.bool, device=device).tril(-1)",
        ),
        Trap(
            "the mask was made on the wrong device",
            "Pass device= when you create the tensor: torch.ones(T, T, dtype=torch.bool, device=device).",
            lambda T, device=None: ref.causal_mask(T),
            example="return torch.ones(T, T, dtype=torch.bool).tril()",
            needs="cuda",
        ),
        Trap(
            "a numeric mask instead of a boolean one",
            "Return dtype torch.bool: True where looking is allowed.",
            lambda T, device=None: ref.causal_mask(T, device).float(),
            example="return torch.ones(T, T, device=device).tril()",
        ),
    ],
)


def _padding_cases(device: torch.device) -> list[Case]:
    spec = [([3, 5, 1], 5), ([2, 6], 7), ([4], 4), ([0, 2, 3, 1], 3), ([0, 0], 2)]
    return [
        Case(f"lengths {lengths}, T = {T}, on {device.type}", (torch.tensor(lengths, device=device), T))
        for lengths, T in spec
    ]


def _padding_fn(compare, *, device_of_lengths: bool = True, layout: str = "B1T"):
    def padding_mask(lengths, T):
        positions = torch.arange(T, device=lengths.device if device_of_lengths else None)
        real = compare(positions[None, :], lengths[:, None])  # (B, T)
        return {"B1T": real[:, None, :], "BT": real, "BT1": real[:, :, None]}[layout]

    return padding_mask


PADDING_MASK = Exercise(
    name="padding_mask",
    signature="lengths, T",
    reference=ref.padding_mask,
    cases=_padding_cases,
    traps=[
        Trap(
            "the mask polarity is inverted (True = padding)",
            "True means 'may look': True for the real tokens (position < length).",
            _padding_fn(lambda p, n: p >= n),
            example="return (torch.arange(T, device=lengths.device) >= lengths[:, None])[:, None, :]",
        ),
        Trap(
            "the mask has no query dimension: (B, T) instead of (B, 1, T)",
            "Add a dimension of size 1 so the mask broadcasts over every query row: mask[:, None, :].",
            _padding_fn(lambda p, n: p < n, layout="BT"),
            example="return torch.arange(T, device=lengths.device) < lengths[:, None]",
        ),
        Trap(
            "the padding is on the query side: (B, T, 1) instead of (B, 1, T)",
            "Padding hides keys, the last axis of the scores: the size-1 axis goes in the middle, (B, 1, T), "
            "so the mask broadcasts over the query rows.",
            _padding_fn(lambda p, n: p < n, layout="BT1"),
            example="return (torch.arange(T, device=lengths.device) < lengths[:, None])[:, :, None]",
        ),
        Trap(
            "one position too many is real (<= instead of <)",
            "Positions are counted from 0: a sequence of length L has real tokens 0 .. L-1.",
            _padding_fn(lambda p, n: p <= n),
            example="return (torch.arange(T, device=lengths.device) <= lengths[:, None])[:, None, :]",
        ),
        Trap(
            "the mask was made on the wrong device",
            "Create positions on lengths.device: torch.arange(T, device=lengths.device).",
            _padding_fn(lambda p, n: p < n.cpu(), device_of_lengths=False),
            example="return (torch.arange(T) < lengths.cpu()[:, None])[:, None, :]",
            needs="cuda",
        ),
    ],
)


def _mask_cases(device: torch.device) -> list[Case]:
    S2 = randn(TQ, TK, seed=400, device=device)
    allowed2 = torch.rand(TQ, TK, generator=_gen(401)).to(device) > 0.4
    allowed2[:, 0] = True
    S3 = randn(B, TQ, TQ, seed=402, device=device, dtype=torch.float64)
    S4 = randn(B, H, TQ, TK, seed=403, device=device)
    pad = ref.padding_mask(torch.tensor([TK, 3], device=device), TK)[:, None]  # (B, 1, 1, TK)
    # scores a causal mask already hid, then a padding mask on top (masks applied one after the other)
    twice = ref.apply_mask(randn(B, TK, TK, seed=404, device=device), ref.causal_mask(TK, device))
    pad3 = ref.padding_mask(torch.tensor([4, TK], device=device), TK)  # (B, 1, TK)
    return [
        Case(_label("2-D scores, random mask", torch.float32, device), (S2, allowed2)),
        Case(
            _label("batched 3-D scores, causal mask (T, T)", torch.float64, device),
            (S3, ref.causal_mask(TQ, device)),
        ),
        Case(_label("4-D scores, padding mask (B, 1, 1, T_k)", torch.float32, device), (S4, pad)),
        Case(
            _label("scores already holding -inf, then a padding mask (B, 1, T)", torch.float32, device),
            (twice, pad3),
        ),
    ]


APPLY_MASK = Exercise(
    name="apply_mask",
    signature="S, allowed",
    reference=ref.apply_mask,
    cases=_mask_cases,
    traps=[
        Trap(
            "the mask polarity is inverted (-inf where looking IS allowed)",
            "True means 'may look': put -inf where allowed is False, e.g. S.masked_fill(~allowed, -inf).",
            lambda S, allowed: S.masked_fill(allowed, NEG_INF),
            example='return S.masked_fill(allowed, float("-inf"))',
        ),
        Trap(
            "the scores were multiplied by the mask",
            "Multiplying by 0 gives a score of 0, which softmax still weights (and -inf * 0 is NaN); "
            "fill with -inf instead.",
            lambda S, allowed: S * allowed,
            example="return S * allowed",
        ),
        Trap(
            "the blocked scores were filled with 0 instead of -inf",
            "A score of 0 still gets weight after softmax (e^0 = 1): fill with float('-inf').",
            lambda S, allowed: S.masked_fill(~allowed, 0.0),
            example="return S.masked_fill(~allowed, 0)",
        ),
        Trap(
            "0 * -inf = NaN",
            "Adding (~allowed) * -inf puts 0 * -inf = NaN on the allowed cells; use masked_fill or torch.where.",
            lambda S, allowed: S + (~allowed).to(S.dtype) * NEG_INF,
            example='return S + (~allowed).float() * float("-inf")',
        ),
        Trap(
            "a large finite number (-1e9) instead of -inf",
            "apply_mask must put exactly -inf, so softmax gives exactly 0 whatever the scores.",
            lambda S, allowed: S.masked_fill(~allowed, -1e9),
            example="return S.masked_fill(~allowed, -1e9)",
        ),
        Trap(
            "a large finite number (-1e9) instead of -inf",
            "apply_mask must put exactly -inf, so softmax gives exactly 0 whatever the scores.",
            lambda S, allowed: S + (~allowed).to(S.dtype) * -1e9,
            example="return S + (1 - allowed.float()) * -1e9",
        ),
        Trap(
            "(1 - mask) * -1e9 with the opposite polarity",
            "That idiom comes from code where 1 = blocked; here True = may look, and the fill is -inf.",
            lambda S, allowed: S + allowed.to(S.dtype) * -1e9,
            example="return S + allowed.float() * -1e9",
        ),
    ],
)

# ------------------------------------------------------------------- 05 softmax


def _softmax_cases(device: torch.device) -> list[Case]:
    cases = []
    for i, (kind, batch) in enumerate(_batches()):
        for dtype in _dtypes(batch):
            Z = randn(*batch, TQ, TK, seed=500 + i, device=device, dtype=dtype) * 3
            cases.append(Case(_label(kind, dtype, device), (Z,)))
    Z = randn(TQ, TK, seed=510, device=device)
    cases.append(Case(_label("dim=-2 given explicitly", torch.float32, device), (Z,), {"dim": -2}))
    big = randn(B, TQ, TK, seed=511, device=device) + 1000
    cases.append(Case(_label("scores near 1000 (overflow test)", torch.float32, device), (big,)))
    levels = randn(TQ, TK, seed=512, device=device)
    levels[0] += 1000  # one row far above the others
    cases.append(Case(_label("rows at very different levels", torch.float32, device), (levels,)))
    masked = ref.apply_mask(randn(B, TQ, TQ, seed=513, device=device), ref.causal_mask(TQ, device))
    cases.append(
        Case(_label("causally masked scores (-inf above the diagonal)", torch.float32, device), (masked,))
    )
    dead = randn(TQ, TK, seed=514, device=device)
    dead[1] = NEG_INF
    dead[3, 2:] = NEG_INF
    cases.append(Case(_label("a row that is all -inf", torch.float32, device), (dead,)))
    Z3 = randn(B, TQ, TK, seed=515, device=device, dtype=torch.float64)
    cases.append(
        Case(_label("batched 3-D, dim=1 given explicitly", torch.float64, device), (Z3,), {"dim": 1})
    )
    cols = randn(B, TK, TK, seed=516, device=device)
    cols[:, :, 2] = NEG_INF  # along dim -2, column 2 has nothing to look at
    cases.append(
        Case(_label("dim=-2 with a column that is all -inf", torch.float32, device), (cols,), {"dim": -2})
    )
    return cases


def _naive_softmax(Z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    e = torch.exp(Z)
    return e / e.sum(dim=dim, keepdim=True)


def _softmax_no_guard(Z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    e = torch.exp(Z - Z.amax(dim=dim, keepdim=True))  # an all -inf row: -inf - (-inf) = NaN
    return e / e.sum(dim=dim, keepdim=True)


def _softmax_no_keepdim(Z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    e = torch.exp(Z - Z.amax(dim=dim))  # (..., T) lines up with the last axis, not with dim
    return e / e.sum(dim=dim, keepdim=True)


SOFTMAX_RULE = (
    "Do not call torch.softmax (nor torch.nn.functional.softmax, Tensor.softmax, torch.special.softmax "
    "or log_softmax): the point of this exercise is to build it from torch.exp."
)
SOFTMAX_FAMILY = [
    "torch.softmax",
    "torch.Tensor.softmax",
    "torch.nn.functional.softmax",
    "torch.special.softmax",
    "torch.log_softmax",
    "torch.Tensor.log_softmax",
    "torch.nn.functional.log_softmax",
    "torch.special.log_softmax",
]

SOFTMAX = Exercise(
    name="softmax",
    signature="Z, dim=-1",
    reference=ref.softmax,
    cases=_softmax_cases,
    forbidden={name: SOFTMAX_RULE for name in SOFTMAX_FAMILY},
    traps=[
        Trap(
            "softmax over dim -2 (the queries) instead of the keys",
            "Each query's weights over the keys must sum to 1: normalise along dim (default -1).",
            lambda Z, dim=-1: ref.softmax(Z, dim=-2),
            example="m = Z.amax(dim=-2, keepdim=True)  # ... and sum(dim=-2)",
        ),
        Trap(
            "softmax over dim -2 (the queries) instead of the keys",
            "Each query's weights over the keys must sum to 1: normalise along dim (default -1).",
            lambda Z, dim=-1: _softmax_no_guard(Z, dim=-2),  # and no guard for an all -inf column
            example="m = Z.amax(dim=-2, keepdim=True)  # ... and sum(dim=-2)",
        ),
        Trap(
            "the dim argument is ignored (always the last axis)",
            "Use the dim you are given in amax and sum: softmax(Z, dim=-2) must normalise along dim -2.",
            lambda Z, dim=-1: ref.softmax(Z, dim=-1),
            example="m = Z.amax(dim=-1, keepdim=True)  # whatever dim says",
        ),
        Trap(
            "the dim argument is ignored (always the last axis)",
            "Use the dim you are given in amax and sum: softmax(Z, dim=-2) must normalise along dim -2.",
            lambda Z, dim=-1: _softmax_no_guard(Z, dim=-1),  # and no guard for an all -inf row
            example="m = Z.amax(dim=-1, keepdim=True)  # whatever dim says",
        ),
        Trap(
            "a fully masked row gives NaN",
            "When every entry of a row is -inf, max is -inf and -inf - (-inf) = NaN; "
            "such a row must give all zeros (replace a -inf max by 0, or the sum 0 by 1).",
            _softmax_no_guard,
            example="e = torch.exp(Z - Z.amax(dim=dim, keepdim=True))\nreturn e / e.sum(dim=dim, keepdim=True)",
        ),
        Trap(
            "naive softmax that overflows",
            "exp(1000) is inf and inf / inf is NaN: subtract each row's max before exp "
            "(it changes nothing mathematically).",
            _naive_softmax,
            example="e = torch.exp(Z)\nreturn e / e.sum(dim=dim, keepdim=True)",
        ),
        Trap(
            "the global max was subtracted instead of each row's max",
            "A row far below the global max underflows to 0 / 0 = NaN: use Z.amax(dim, keepdim=True).",
            lambda Z, dim=-1: _naive_softmax(Z - Z.max(), dim),
            example="e = torch.exp(Z - Z.max())",
        ),
        Trap(
            "the max was subtracted without keepdim",
            "Z.amax(dim) drops the dimension and broadcasts against the wrong axis; use keepdim=True.",
            _softmax_no_keepdim,
            example="e = torch.exp(Z - Z.amax(dim=dim))",
        ),
    ],
)


def _colour_cases(device: torch.device) -> list[Case]:
    keys = {"red": [1.0, 0.0], "green": [0.0, 1.0], "orange": [0.8, 0.6]}
    values = {"red": [255.0, 0.0], "green": [0.0, 255.0], "orange": [255.0, 165.0]}
    long_orange = dict(keys, orange=[1.6, 1.2])
    three = {"a": [0.5, -1.0, 2.0], "b": [1.0, 0.0, 0.0], "c": [-0.3, 0.3, 0.9], "d": [0.0, 0.0, 0.0]}
    three_v = {"a": [1.0], "b": [2.0], "c": [4.0], "d": [8.0]}
    cases = [
        Case(f"colours, query [1.0, 0.1], sharpness {s}", ([1.0, 0.1], keys, values, s))
        for s in (1.0, 5.0, 25.0)
    ]
    cases += [
        Case("colours, query [0.0, 1.0], sharpness 5", ([0.0, 1.0], keys, values, 5.0)),
        Case("colours, orange's key doubled, sharpness 5", ([1.0, 0.1], long_orange, values, 5.0)),
        Case("colours, sharpness 2000 (overflow test)", ([1.0, 0.1], keys, values, 2000.0)),
        Case("3-D keys, 1-D values, sharpness 2", ([0.2, 0.4, -1.0], three, three_v, 2.0)),
    ]
    return cases


def _compare_lookup(expected, got, label: str) -> str | None:
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        return "soft_lookup should return two things: (weights, output)."
    (w_exp, o_exp), (w_got, o_got) = expected, got
    if not isinstance(w_got, dict):
        return f"weights should be a dict name -> float, got {type(w_got).__name__}."
    if set(w_got) != set(w_exp):
        return f"weights should have the keys {sorted(w_exp)}, got {sorted(w_got)}."
    for name in w_exp:
        try:
            value = float(w_got[name])
        except (TypeError, ValueError):
            return f"weights[{name!r}] should be a number, got {w_got[name]!r}."
        if not math.isclose(value, w_exp[name], rel_tol=1e-6, abs_tol=1e-9):
            return f"weights[{name!r}] is {fmt(value)}, expected {fmt(w_exp[name])}."
    try:
        o_list = [float(v) for v in o_got]
    except (TypeError, ValueError):
        return f"output should be a list of numbers, got {o_got!r}."
    if len(o_list) != len(o_exp):
        return f"output should have {len(o_exp)} numbers (one per value entry), got {len(o_list)}."
    for i, (g, e) in enumerate(zip(o_list, o_exp)):
        if not math.isclose(g, e, rel_tol=1e-6, abs_tol=1e-6):
            return f"output[{i}] is {fmt(g)}, expected {fmt(e)}."
    return None


def fmt(x: float) -> str:
    return f"{x:.6g}"


def _lookup_variant(scale, stable: bool = True):
    def lookup(query, keys, values, sharpness):
        raw = {
            n: scale(sharpness, len(query)) * sum(q * k for q, k in zip(query, key))
            for n, key in keys.items()
        }
        top = max(raw.values()) if stable else 0.0
        exps = {n: math.exp(s - top) for n, s in raw.items()}
        total = sum(exps.values())
        w = {n: e / total for n, e in exps.items()}
        width = len(next(iter(values.values())))
        return w, [sum(w[n] * values[n][i] for n in keys) for i in range(width)]

    return lookup


LOOKUP_RULE = "soft_lookup is plain Python: lists, dicts and math (math.exp), no torch."

SOFT_LOOKUP = Exercise(
    name="soft_lookup",
    signature="query, keys, values, sharpness",
    reference=ref.soft_lookup,
    cases=_colour_cases,
    forbidden={
        name: LOOKUP_RULE for name in [*SOFTMAX_FAMILY, "torch.tensor", "torch.as_tensor", "torch.exp"]
    },
    compare=_compare_lookup,
    traps=[
        Trap(
            "the scores were not divided by sqrt(d)",
            "score = sharpness * (query . key) / sqrt(len(query)).",
            _lookup_variant(lambda s, d: s),
        ),
        Trap(
            "sharpness divides instead of multiplies",
            "Higher sharpness must make the weights more peaked: multiply the scores by it.",
            _lookup_variant(lambda s, d: 1 / (s * math.sqrt(d))),
        ),
        Trap(
            "naive softmax that overflows",
            "math.exp of a large score overflows: subtract the largest score before exp.",
            _lookup_variant(lambda s, d: s / math.sqrt(d), stable=False),
        ),
    ],
)

# -------------------------------------------------------------------- 06 mixing


def _mix_cases(device: torch.device) -> list[Case]:
    cases = []
    for i, (kind, batch) in enumerate(_batches()):
        for dtype in _dtypes(batch):
            A = torch.softmax(randn(*batch, TQ, TK, seed=600 + i, device=device, dtype=dtype), -1)
            V = randn(*batch, TK, DV, seed=610 + i, device=device, dtype=dtype)
            cases.append(Case(_label(kind + ", T_q != T_k", dtype, device), (A, V)))
    return cases


MIX = Exercise(
    name="mix",
    signature="A, V",
    reference=ref.mix,
    cases=_mix_cases,
    traps=[
        Trap(
            "the weights were returned instead of A V",
            "The weights say how much of each value row to take; the output is the blend: A @ V.",
            lambda A, V: A,
        ),
        Trap(
            "the values were returned unmixed",
            "Each output row is a weighted average of value rows: O = A @ V.",
            lambda A, V: V,
        ),
        Trap(
            "A^T V instead of A V",
            "Rows of A belong to queries: O = A @ V has one row per query.",
            lambda A, V: A.transpose(-2, -1) @ V,
            example="return A.mT @ V",
        ),
        Trap(
            "V @ A instead of A @ V",
            "Rows of A are queries and rows of V are keys' values: O = A @ V, (T_q, T_k) @ (T_k, d_v).",
            lambda A, V: V @ A,
            example="return V @ A",
        ),
    ],
)

# --------------------------------------------------------- 07 one attention head


def _attention_cases(device: torch.device) -> list[Case]:
    Q2 = randn(TQ, DK, seed=700, device=device)
    K2 = randn(TK, DK, seed=701, device=device)
    V2 = randn(TK, DV, seed=702, device=device)
    Q3 = randn(B, TQ, DK, seed=703, device=device, dtype=torch.float64)
    K3 = randn(B, TQ, DK, seed=704, device=device, dtype=torch.float64)
    V3 = randn(B, TQ, DV, seed=705, device=device, dtype=torch.float64)
    Q4 = randn(B, H, TQ, DK, seed=706, device=device)
    K4 = randn(B, H, TK, DK, seed=707, device=device)
    V4 = randn(B, H, TK, DV, seed=708, device=device)
    pad = ref.padding_mask(torch.tensor([TK, 3], device=device), TK)[:, None]  # (B, 1, 1, TK)
    Q5 = randn(B, TQ, DK, seed=709, device=device)
    K5 = randn(B, TK, DK, seed=710, device=device)
    V5 = randn(B, TK, DV, seed=711, device=device)
    empty = ref.padding_mask(torch.tensor([0, 4], device=device), TK)  # (B, 1, TK): sequence 0 is empty
    holes = torch.rand(TQ, TK, generator=_gen(712)).to(device) > 0.5
    holes[:, 0] = True
    holes[2] = False  # query 2 may look at no key
    return [
        Case(_label("2-D, no mask, T_q != T_k", torch.float32, device), (Q2, K2, V2)),
        Case(
            _label("batched 3-D, causal mask", torch.float64, device),
            (Q3, K3, V3),
            {"mask": ref.causal_mask(TQ, device)},
        ),
        Case(_label("4-D (batch, heads), padding mask", torch.float32, device), (Q4, K4, V4), {"mask": pad}),
        Case(
            _label(
                "batched 3-D, padding mask with an empty sequence (no key allowed)", torch.float32, device
            ),
            (Q5, K5, V5),
            {"mask": empty},
        ),
        Case(
            _label("2-D, random mask, one query with no allowed key", torch.float32, device),
            (Q2, K2, V2),
            {"mask": holes},
        ),
    ]


def _nan_softmax(S: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.softmax(S, dim=dim)  # a row with no allowed key: NaN


def _attention_via(
    S_fn,
    *,
    dim=-1,
    mask_fill=NEG_INF,
    invert=False,
    out="OA",
    soft=ref.softmax,
    after=False,
    transposed=False,
):
    def attention(Q, K, V, mask=None):
        S = S_fn(Q, K)
        if mask is not None and transposed:
            mask = mask.transpose(-2, -1)
        if mask is not None and not after:
            S = S.masked_fill(mask if invert else ~mask, mask_fill)
        A = soft(S, dim=dim)
        if mask is not None and after:
            A = A.masked_fill(~mask, 0.0)  # weights of the allowed keys no longer sum to 1
        O = A @ V  # K Q^T with T_q != T_k fails here, exactly as a student's version does
        return {"OA": (O, A), "AO": (A, O), "AA": (A, A)}[out]

    return attention


def _scaled_kq(Q, K):
    return (K @ Q.transpose(-2, -1)) / math.sqrt(Q.shape[-1])


# (name, hint, how, example): each mistake made with the course's softmax and with torch.softmax,
# which gives NaN for a query with no allowed key
_ATTENTION_TRAPS = [
    (
        "the scores are not scaled",
        "Divide Q K^T by sqrt(d_k) before the mask and the softmax.",
        dict(S_fn=ref.scores),
        "S = Q @ K.mT",
    ),
    (
        "the scores are divided by d_k instead of sqrt(d_k)",
        "The spread of a dot product grows like sqrt(d_k): divide by math.sqrt(Q.shape[-1]).",
        dict(S_fn=lambda Q, K: ref.scores(Q, K) / Q.shape[-1]),
        "S = Q @ K.mT / Q.shape[-1]",
    ),
    (
        "the softmax runs over dim -2",
        "Each query's weights over the keys sum to 1: softmax over the last dimension.",
        dict(S_fn=ref.scaled_scores, dim=-2),
        "A = torch.softmax(S, dim=-2)",
    ),
    (
        "the mask polarity is inverted",
        "True means 'may look': fill -inf where the mask is False.",
        dict(S_fn=ref.scaled_scores, invert=True),
        'S = S.masked_fill(mask, float("-inf"))',
    ),
    (
        "the mask polarity is inverted",
        "True means 'may look': fill -inf where the mask is False.",
        dict(S_fn=ref.scaled_scores, invert=True, mask_fill=-1e9),
        "S = S.masked_fill(mask, -1e9)",
    ),
    (
        "the mask was applied after the softmax",
        "Mask the scores (-inf) before the softmax: zeroing weights afterwards leaves rows that no longer "
        "sum to 1.",
        dict(S_fn=ref.scaled_scores, after=True),
        "A = torch.softmax(S, dim=-1).masked_fill(~mask, 0)",
    ),
    (
        "the mask was transposed (padding on the query side)",
        "mask[..., i, j] says whether query i may look at key j: use it as given, without a transpose.",
        dict(S_fn=ref.scaled_scores, transposed=True),
        'S = S.masked_fill(~mask.mT, float("-inf"))',
    ),
    (
        "the result is returned as (A, O)",
        "attention returns (O, A): the output first, then the weights.",
        dict(S_fn=ref.scaled_scores, out="AO"),
        "return A, O",
    ),
    (
        "the weights were returned instead of A V",
        "The output is the blend of value rows: O = A @ V.",
        dict(S_fn=ref.scaled_scores, out="AA"),
        "return A, A",
    ),
    (
        "K Q^T instead of Q K^T",
        "Rows of S are queries: S = Q @ K^T / sqrt(d_k).",
        dict(S_fn=_scaled_kq),
        "S = K @ Q.mT / math.sqrt(Q.shape[-1])",
    ),
]

SDPA_RULE = (
    "Do not call torch.nn.functional.scaled_dot_product_attention: build the head from its moves "
    "(the visible check compares yours with it)."
)

ATTENTION = Exercise(
    name="attention",
    signature="Q, K, V, mask=None",
    reference=ref.attention,
    cases=_attention_cases,
    output_names=("O", "A"),
    forbidden={"torch.nn.functional.scaled_dot_product_attention": SDPA_RULE},
    traps=[
        Trap(
            "a query with no allowed key gives NaN",
            "torch.softmax of a row that is all -inf is NaN; such a query must get all-zero weights and an "
            "all-zero output (use lesson 05's softmax, or torch.nan_to_num on the weights).",
            _attention_via(ref.scaled_scores, soft=_nan_softmax),
            example="A = torch.softmax(S, dim=-1)  # NaN where a row is all -inf",
        ),
        *[
            Trap(name, hint, _attention_via(**how, soft=soft), example=example)
            for name, hint, how, example in _ATTENTION_TRAPS
            for soft in (ref.softmax, _nan_softmax)
        ],
    ],
)


def _self_cases(device: torch.device) -> list[Case]:
    X3 = randn(B, TQ, DM, seed=720, device=device)
    X2 = randn(TK, DM, seed=721, device=device, dtype=torch.float64)
    W = [randn(DM, d, seed=722 + i, device=device) for i, d in enumerate((DK, DK, DV))]
    W64 = [w.double() for w in W]
    return [
        Case(_label("batched 3-D, causal (default)", torch.float32, device), (X3, *W)),
        Case(_label("2-D, causal=False", torch.float64, device), (X2, *W64), {"causal": False}),
        Case(_label("2-D, causal=True", torch.float64, device), (X2, *W64), {"causal": True}),
    ]


def _self_variant(*, scale=None, causal_flip=False, invert=False, soft=ref.softmax, flag=None):
    def self_attention(X, W_q, W_k, W_v, causal=True):
        Q, K, V = X @ W_q, X @ W_k, X @ W_v
        S = ref.scores(Q, K) / (scale(X, Q) if scale else math.sqrt(Q.shape[-1]))
        if (causal != causal_flip) if flag is None else flag:
            allowed = ref.causal_mask(X.shape[-2], X.device)
            S = S.masked_fill(allowed if invert else ~allowed, NEG_INF)
        return soft(S, dim=-1) @ V

    return self_attention


SELF_ATTENTION = Exercise(
    name="self_attention",
    signature="X, W_q, W_k, W_v, causal=True",
    reference=ref.self_attention,
    cases=_self_cases,
    uses={"attention": ref.attention},
    forbidden={"torch.nn.functional.scaled_dot_product_attention": SDPA_RULE},
    traps=[
        Trap(
            "the scores are divided by sqrt(d_model)",
            "The scale belongs to the head: divide by sqrt(d_k), the width of Q and K, not of X.",
            _self_variant(scale=lambda X, Q: math.sqrt(X.shape[-1])),
        ),
        Trap(
            "the causal flag is ignored or reversed",
            "With causal=True each token sees only itself and earlier tokens; with causal=False, all.",
            _self_variant(causal_flip=True),
            example="mask = causal_mask(T) if not causal else None",
        ),
        Trap(
            "the causal flag is ignored or reversed",
            "With causal=True each token sees only itself and earlier tokens; with causal=False, all.",
            _self_variant(flag=False),
            example="return attention(Q, K, V)[0]  # never masked",
        ),
        Trap(
            "the causal flag is ignored or reversed",
            "With causal=True each token sees only itself and earlier tokens; with causal=False, all.",
            _self_variant(flag=True),
            example="return attention(Q, K, V, causal_mask(T))[0]  # always masked",
        ),
        Trap(
            "the causal mask polarity is inverted",
            "True means 'may look': token i may look at j <= i.",
            _self_variant(invert=True),
        ),
        Trap(
            "the causal mask polarity is inverted",
            "True means 'may look': token i may look at j <= i.",
            _self_variant(invert=True, soft=torch.softmax),  # the last token sees nothing: NaN
        ),
        Trap(
            "the scores are not scaled",
            "Divide Q K^T by sqrt(d_k) before the softmax.",
            _self_variant(scale=lambda X, Q: 1.0),
        ),
    ],
)


def _cross_cases(device: torch.device) -> list[Case]:
    Xd = randn(B, TQ, DM, seed=740, device=device)
    Xe = randn(B, TK, DM, seed=741, device=device)
    W = [randn(DM, d, seed=742 + i, device=device) for i, d in enumerate((DK, DK, DV))]
    Xd2 = randn(TQ, DM, seed=745, device=device, dtype=torch.float64)
    Xe2 = randn(TK - 3, DM, seed=746, device=device, dtype=torch.float64)
    return [
        Case(_label("batched 3-D, 5 decoder and 7 encoder tokens", torch.float32, device), (Xd, Xe, *W)),
        Case(
            _label("2-D, 5 decoder and 4 encoder tokens", torch.float64, device),
            (Xd2, Xe2, *[w.double() for w in W]),
        ),
    ]


CROSS_ATTENTION = Exercise(
    name="cross_attention",
    signature="X_dec, X_enc, W_q, W_k, W_v",
    reference=ref.cross_attention,
    cases=_cross_cases,
    uses={"attention": ref.attention},
    forbidden={"torch.nn.functional.scaled_dot_product_attention": SDPA_RULE},
    traps=[
        Trap(
            "queries and keys/values come from the wrong sequences",
            "Queries come from the decoder (X_dec); keys and values from the encoder (X_enc).",
            lambda Xd, Xe, W_q, W_k, W_v: ref.cross_attention(Xe, Xd, W_q, W_k, W_v),
        ),
        Trap(
            "a causal mask was applied",
            "Cross-attention has no causal mask: every decoder token may look at every encoder token.",
            lambda Xd, Xe, W_q, W_k, W_v: ref.attention(
                Xd @ W_q,
                Xe @ W_k,
                Xe @ W_v,
                torch.ones(Xd.shape[-2], Xe.shape[-2], dtype=torch.bool, device=Xd.device).tril(),
            )[0],
        ),
        Trap(
            "the scores are not scaled",
            "Divide Q K^T by sqrt(d_k) before the softmax.",
            lambda Xd, Xe, W_q, W_k, W_v: ref.softmax(ref.scores(Xd @ W_q, Xe @ W_k)) @ (Xe @ W_v),
        ),
    ],
)

# the line of student code that makes each mistake (docs/mistakes.md), where not given above
_EXAMPLES = {
    ("project", "Q was computed with W_k"): "Q = X @ W_k",
    ("project", "Q and K are swapped"): "Q, K = X @ W_k, X @ W_q",
    ("scores", "K Q^T instead of Q K^T"): "return K @ Q.transpose(-2, -1)",
    ("scores", "Q^T K instead of Q K^T"): "return Q.transpose(-2, -1) @ K",
    ("scores", "K was not transposed"): "return Q @ K",
    ("scores", ".T on a batched tensor"): "return Q @ K.T",
    ("scores", "transpose(0, 1) on a batched tensor"): "return Q @ K.transpose(0, 1)",
    ("scaled_scores", "no scaling at all"): "return Q @ K.mT",
    ("scaled_scores", "divided by d_k instead of sqrt(d_k)"): "return Q @ K.mT / Q.shape[-1]",
    (
        "scaled_scores",
        "d_k read with shape[1] instead of shape[-1]",
    ): "return Q @ K.mT / math.sqrt(Q.shape[1])",
    ("scaled_scores", "divided by sqrt of the number of tokens"): "return Q @ K.mT / math.sqrt(Q.shape[-2])",
    ("scaled_scores", "K Q^T instead of Q K^T"): "return K @ Q.mT / math.sqrt(Q.shape[-1])",
    (
        "scaled_scores",
        "a hard-coded divisor (sqrt(3), the d_k of 'I love cats')",
    ): "return Q @ K.mT / math.sqrt(3)",
    ("soft_lookup", "the scores were not divided by sqrt(d)"): "score = sharpness * dot",
    ("soft_lookup", "sharpness divides instead of multiplies"): "score = dot / (sharpness * math.sqrt(d))",
    ("soft_lookup", "naive softmax that overflows"): "exps = {n: math.exp(s) for n, s in scores.items()}",
    ("mix", "the weights were returned instead of A V"): "return A",
    ("mix", "the values were returned unmixed"): "return V",
    ("self_attention", "the scores are divided by sqrt(d_model)"): "S = Q @ K.mT / math.sqrt(X.shape[-1])",
    ("self_attention", "the causal mask polarity is inverted"): 'S = S.masked_fill(mask, float("-inf"))',
    ("self_attention", "the scores are not scaled"): "S = Q @ K.mT",
    (
        "cross_attention",
        "queries and keys/values come from the wrong sequences",
    ): "Q, K, V = X_enc @ W_q, X_dec @ W_k, X_dec @ W_v",
    ("cross_attention", "a causal mask was applied"): "return attention(Q, K, V, causal_mask(T))[0]",
    ("cross_attention", "the scores are not scaled"): "A = softmax(Q @ K.mT)",
}


def _fill_examples(exercises) -> None:
    for ex in exercises:
        for trap in ex.traps:
            if not trap.example:
                trap.example = _EXAMPLES.get((ex.name, trap.name), "")


EXERCISES: dict[str, Exercise] = {
    ex.name: ex
    for ex in (
        PROJECT,
        SCORES,
        SCALED_SCORES,
        SCORE_SPREAD,
        CAUSAL_MASK,
        PADDING_MASK,
        APPLY_MASK,
        SOFTMAX,
        SOFT_LOOKUP,
        MIX,
        ATTENTION,
        SELF_ATTENTION,
        CROSS_ATTENTION,
    )
}

_fill_examples(EXERCISES.values())

__all__ = ["EXERCISES", "compare_tensor", "spread_standard_error"]
