"""Seeded cases and known mistakes ("traps") for every graded function.

Sizes are all different on purpose, so that T_q, T_k, d_model, d_k, d_v, batch
and heads can't be confused: a function that mixes two of them up gets a wrong
shape or an error, never a lucky pass.
"""

from __future__ import annotations

import math

import torch

from grader import reference as ref
from grader.harness import Case, Exercise, Trap, compare_tensor

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


def _spread_cases(device: torch.device) -> list[Case]:
    return [Case(f"d_k = {d}, n = 20000", (d, 20000, _gen(300 + d))) for d in (1, 16, 64)]


def _compare_spread(expected, got, label: str) -> str | None:
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        return f"score_spread should return two numbers (raw_std, scaled_std), got {got!r}."
    try:
        raw, scaled = float(got[0]), float(got[1])
    except (TypeError, ValueError, RuntimeError):
        return f"score_spread should return two numbers, got {got!r}."
    want_raw, want_scaled = expected
    # 5 % is about five standard errors of a std estimated from 20000 samples
    if not math.isclose(raw, want_raw, rel_tol=0.05):
        return (
            f"raw_std is {raw:.4g}; for unit-variance vectors it should be near {want_raw:.4g} = sqrt(d_k)."
        )
    if not math.isclose(scaled, want_scaled, rel_tol=0.05):
        return f"scaled_std is {scaled:.4g}; after dividing by sqrt(d_k) it should be near {want_scaled:.4g}."
    return None


def _spread_unsummed(d_k: int, n: int, generator: torch.Generator) -> tuple[float, float]:
    p = torch.randn(n, d_k, generator=generator) * torch.randn(n, d_k, generator=generator)
    return p.std().item(), (p / math.sqrt(d_k)).std().item()


def _spread_scaled_by(divisor) -> callable:
    def trap(d_k: int, n: int, generator: torch.Generator) -> tuple[float, float]:
        raw, _ = ref.score_spread(d_k, n, generator)
        return raw, raw / divisor(d_k)

    return trap


SCORE_SPREAD = Exercise(
    name="score_spread",
    signature="d_k, n, generator",
    reference=lambda d_k, n, generator: (math.sqrt(d_k), 1.0),
    cases=_spread_cases,
    compare=_compare_spread,
    traps=[
        Trap(
            "the scaled std divides by d_k instead of sqrt(d_k)",
            "The std of a dot product of unit-variance vectors is sqrt(d_k); divide by that.",
            _spread_scaled_by(lambda d: d),
        ),
        Trap(
            "the scaled std is not scaled",
            "scaled_std is the std of (q . k) / sqrt(d_k).",
            _spread_scaled_by(lambda d: 1.0),
        ),
        Trap(
            "the products q * k were not summed into dot products",
            "Sum over the last dimension: (q * k).sum(dim=-1) gives the n dot products.",
            _spread_unsummed,
        ),
        Trap(
            "uniform draws (torch.rand) instead of unit-variance normal draws",
            "torch.rand has variance 1/12; use torch.randn(..., generator=generator).",
            lambda d_k, n, g: (lambda q, k: ((q * k).sum(-1).std().item(),) * 2)(
                torch.rand(n, d_k, generator=g), torch.rand(n, d_k, generator=g)
            ),
        ),
    ],
)

# ------------------------------------------------------------------- 04 masking


def _causal_cases(device: torch.device) -> list[Case]:
    cases = [Case(f"T = {T}, device={device.type}", (T,), {"device": device}) for T in (4, 7, 1)]
    cases.append(Case("T = 6, device not given (CPU)", (6,)))
    cases.append(Case("T = 5 on the 'meta' device (checks that device= is used)", (5,), {"device": "meta"}))
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
        ),
        Trap(
            "the upper triangle instead of the lower one (j >= i)",
            "Row i is the query: it may look at keys j <= i, the past and itself (torch.tril).",
            lambda T, device=None: ref.causal_mask(T, device).T.contiguous(),
        ),
        Trap(
            "a token may not look at itself",
            "The diagonal (j == i) is allowed: use torch.tril without an offset.",
            lambda T, device=None: torch.ones(T, T, dtype=torch.bool, device=device).tril(-1),
        ),
        Trap(
            "the mask was made on the wrong device",
            "Pass device= when you create the tensor: torch.ones(T, T, dtype=torch.bool, device=device).",
            lambda T, device=None: ref.causal_mask(T),
        ),
        Trap(
            "a numeric mask instead of a boolean one",
            "Return dtype torch.bool: True where looking is allowed.",
            lambda T, device=None: ref.causal_mask(T, device).float(),
        ),
    ],
)


def _padding_cases(device: torch.device) -> list[Case]:
    spec = [([3, 5, 1], 5), ([2, 6], 7), ([4], 4), ([0, 2, 3, 1], 3)]
    cases = [
        Case(f"lengths {lengths}, T = {T}, on {device.type}", (torch.tensor(lengths, device=device), T))
        for lengths, T in spec
    ]
    cases.append(
        Case(
            "lengths on the 'meta' device (checks that the mask follows lengths.device)",
            (torch.tensor([3, 1], device="meta"), 4),
        )
    )
    return cases


PADDING_MASK = Exercise(
    name="padding_mask",
    signature="lengths, T",
    reference=ref.padding_mask,
    cases=_padding_cases,
    traps=[
        Trap(
            "the mask polarity is inverted (True = padding)",
            "True means 'may look': True for the real tokens (position < length).",
            lambda lengths, T: ~ref.padding_mask(lengths, T),
        ),
        Trap(
            "the mask has no query dimension: (B, T) instead of (B, 1, T)",
            "Add a dimension of size 1 so the mask broadcasts over every query row: mask[:, None, :].",
            lambda lengths, T: ref.padding_mask(lengths, T)[:, 0, :],
        ),
        Trap(
            "one position too many is real (<= instead of <)",
            "Positions are counted from 0: a sequence of length L has real tokens 0 .. L-1.",
            lambda lengths, T: (torch.arange(T, device=lengths.device)[None, :] <= lengths[:, None])[
                :, None, :
            ],
        ),
        Trap(
            "the mask was made on the wrong device",
            "Create positions on lengths.device: torch.arange(T, device=lengths.device).",
            lambda lengths, T: (torch.arange(T)[None, :] < lengths[:, None])[:, None, :],
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
    return [
        Case(_label("2-D scores, random mask", torch.float32, device), (S2, allowed2)),
        Case(
            _label("batched 3-D scores, causal mask (T, T)", torch.float64, device),
            (S3, ref.causal_mask(TQ, device)),
        ),
        Case(_label("4-D scores, padding mask (B, 1, 1, T_k)", torch.float32, device), (S4, pad)),
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
        ),
        Trap(
            "the scores were multiplied by the mask",
            "Multiplying by 0 gives a score of 0, which softmax still weights; fill with -inf instead.",
            lambda S, allowed: S * allowed,
        ),
        Trap(
            "0 * -inf = NaN",
            "Adding (~allowed) * -inf puts 0 * -inf = NaN on the allowed cells; use masked_fill or torch.where.",
            lambda S, allowed: S + (~allowed).to(S.dtype) * NEG_INF,
        ),
        Trap(
            "a large finite number (-1e9) instead of -inf",
            "apply_mask must put exactly -inf, so softmax gives exactly 0 whatever the scores.",
            lambda S, allowed: S.masked_fill(~allowed, -1e9),
        ),
        Trap(
            "(1 - mask) * -1e9 with the opposite polarity",
            "That idiom comes from code where 1 = blocked; here True = may look, and the fill is -inf.",
            lambda S, allowed: S + allowed.to(S.dtype) * -1e9,
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
    return cases


def _naive_softmax(Z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    e = torch.exp(Z)
    return e / e.sum(dim=dim, keepdim=True)


SOFTMAX = Exercise(
    name="softmax",
    signature="Z, dim=-1",
    reference=ref.softmax,
    cases=_softmax_cases,
    traps=[
        Trap(
            "softmax over dim -2 (the queries) instead of the keys",
            "Each query's weights over the keys must sum to 1: normalise along dim (default -1).",
            lambda Z, dim=-1: ref.softmax(Z, dim=-2 if dim == -1 else -1),
        ),
        Trap(
            "a fully masked row gives NaN",
            "When every entry of a row is -inf, max is -inf and -inf - (-inf) = NaN; "
            "such a row must give all zeros (replace a -inf max by 0, or the sum 0 by 1).",
            lambda Z, dim=-1: torch.softmax(Z, dim=dim),
        ),
        Trap(
            "naive softmax that overflows",
            "exp(1000) is inf and inf / inf is NaN: subtract each row's max before exp "
            "(it changes nothing mathematically).",
            _naive_softmax,
        ),
        Trap(
            "the global max was subtracted instead of each row's max",
            "A row far below the global max underflows to 0 / 0 = NaN: use Z.amax(dim, keepdim=True).",
            lambda Z, dim=-1: _naive_softmax(Z - Z.max(), dim),
        ),
        Trap(
            "the max was subtracted without keepdim",
            "Z.amax(dim) drops the dimension and broadcasts against the wrong axis; use keepdim=True.",
            lambda Z, dim=-1: (
                ref.softmax(Z - Z.amax(dim=dim), dim)
                if Z.shape[-1] == Z.shape[-2]
                else _naive_softmax(Z - Z.amax(dim=dim), dim)
            ),
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


SOFT_LOOKUP = Exercise(
    name="soft_lookup",
    signature="query, keys, values, sharpness",
    reference=ref.soft_lookup,
    cases=_colour_cases,
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
    return [
        Case(_label("2-D, no mask, T_q != T_k", torch.float32, device), (Q2, K2, V2)),
        Case(
            _label("batched 3-D, causal mask", torch.float64, device),
            (Q3, K3, V3),
            {"mask": ref.causal_mask(TQ, device)},
        ),
        Case(_label("4-D (batch, heads), padding mask", torch.float32, device), (Q4, K4, V4), {"mask": pad}),
    ]


def _attention_via(S_fn, *, dim=-1, mask_fill=NEG_INF, invert=False, out="OA", soft=ref.softmax):
    def attention(Q, K, V, mask=None):
        S = S_fn(Q, K)
        if mask is not None:
            S = S.masked_fill(mask if invert else ~mask, mask_fill)
        A = soft(S, dim=dim)
        O = A @ V  # K Q^T with T_q != T_k fails here, exactly as a student's version does
        return {"OA": (O, A), "AO": (A, O), "AA": (A, A)}[out]

    return attention


ATTENTION = Exercise(
    name="attention",
    signature="Q, K, V, mask=None",
    reference=ref.attention,
    cases=_attention_cases,
    output_names=("O", "A"),
    traps=[
        Trap(
            "the scores are not scaled",
            "Divide Q K^T by sqrt(d_k) before the mask and the softmax.",
            _attention_via(ref.scores),
        ),
        Trap(
            "the scores are divided by d_k instead of sqrt(d_k)",
            "The spread of a dot product grows like sqrt(d_k): divide by math.sqrt(Q.shape[-1]).",
            _attention_via(lambda Q, K: ref.scores(Q, K) / Q.shape[-1]),
        ),
        Trap(
            "the softmax runs over dim -2",
            "Each query's weights over the keys sum to 1: softmax over the last dimension.",
            _attention_via(ref.scaled_scores, dim=-2),
        ),
        Trap(
            "the mask polarity is inverted",
            "True means 'may look': fill -inf where the mask is False.",
            _attention_via(ref.scaled_scores, invert=True),
        ),
        Trap(
            "the mask polarity is inverted",
            "True means 'may look': fill -inf where the mask is False.",
            _attention_via(ref.scaled_scores, invert=True, soft=torch.softmax),  # rows with no key: NaN
        ),
        Trap(
            "the mask polarity is inverted",
            "True means 'may look': fill -inf where the mask is False.",
            _attention_via(ref.scaled_scores, invert=True, mask_fill=-1e9, soft=torch.softmax),
        ),
        Trap(
            "the result is returned as (A, O)",
            "attention returns (O, A): the output first, then the weights.",
            _attention_via(ref.scaled_scores, out="AO"),
        ),
        Trap(
            "the weights were returned instead of A V",
            "The output is the blend of value rows: O = A @ V.",
            _attention_via(ref.scaled_scores, out="AA"),
        ),
        Trap(
            "K Q^T instead of Q K^T",
            "Rows of S are queries: S = Q @ K^T / sqrt(d_k).",
            _attention_via(lambda Q, K: (K @ Q.transpose(-2, -1)) / math.sqrt(Q.shape[-1])),
        ),
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


def _self_variant(*, scale=None, causal_flip=False, invert=False, soft=ref.softmax):
    def self_attention(X, W_q, W_k, W_v, causal=True):
        Q, K, V = X @ W_q, X @ W_k, X @ W_v
        S = ref.scores(Q, K) / (scale(X, Q) if scale else math.sqrt(Q.shape[-1]))
        if causal != causal_flip:
            allowed = ref.causal_mask(X.shape[-2], X.device)
            S = S.masked_fill(allowed if invert else ~allowed, NEG_INF)
        return soft(S, dim=-1) @ V

    return self_attention


SELF_ATTENTION = Exercise(
    name="self_attention",
    signature="X, W_q, W_k, W_v, causal=True",
    reference=ref.self_attention,
    cases=_self_cases,
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

__all__ = ["EXERCISES", "compare_tensor"]
