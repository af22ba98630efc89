"""Lesson 07, one attention head: ``attention``, ``self_attention``, ``cross_attention``: reference, cases, mistakes.

Device-agnostic: every tensor result lives on the device, and keeps the dtype, of its inputs; any
leading batch dimensions are accepted, ``(..., T, d)``.
"""

from __future__ import annotations

import math

import torch

from grader.harness import Case, Exercise, Trap
from grader.lessons._common import DK, DM, DV, NEG_INF, TK, TQ, B, H, gen, label, randn, same_mistake
from grader.lessons.l01_projection import project
from grader.lessons.l02_scoring import scores
from grader.lessons.l03_scaling import OTHER_DK, scaled_scores
from grader.lessons.l04_masking import apply_mask, causal_mask, padding_mask
from grader.lessons.l05_softmax import softmax
from grader.lessons.l06_mixing import mix


def attention(
    Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention; mask True means "may look".

    Shapes: Q (..., T_q, d_k), K (..., T_k, d_k), V (..., T_k, d_v),
    mask broadcastable to (..., T_q, T_k) -> O (..., T_q, d_v), A (..., T_q, T_k).
    """
    S = scaled_scores(Q, K)
    if mask is not None:
        S = apply_mask(S, mask)
    A = softmax(S, dim=-1)
    return mix(A, V), A


def self_attention(
    X: torch.Tensor,
    W_q: torch.Tensor,
    W_k: torch.Tensor,
    W_v: torch.Tensor,
    causal: bool = True,
) -> torch.Tensor:
    """One head of self-attention: queries, keys and values all come from X.

    Shapes: X (..., T, d_model) -> O (..., T, d_v).
    """
    return attend(*project(X, W_q, W_k, W_v), causal)


def attend(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, causal: bool) -> torch.Tensor:
    """attention's output, with a causal mask made on Q's device when ``causal``."""
    mask = causal_mask(Q.shape[-2], device=Q.device) if causal else None
    return attention(Q, K, V, mask)[0]


def cross_attention(
    X_dec: torch.Tensor,
    X_enc: torch.Tensor,
    W_q: torch.Tensor,
    W_k: torch.Tensor,
    W_v: torch.Tensor,
) -> torch.Tensor:
    """Queries from one sequence, keys and values from another; no mask.

    Shapes: X_dec (..., T_q, d_model), X_enc (..., T_k, d_model) -> O (..., T_q, d_v).
    """
    Q = X_dec @ W_q
    K = X_enc @ W_k
    V = X_enc @ W_v
    return attention(Q, K, V)[0]


# ----------------------------------------------------------------- seeded cases and mistakes


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
    pad = padding_mask(torch.tensor([TK, 3], device=device), TK)[:, None]  # (B, 1, 1, TK)
    Q5 = randn(B, TQ, DK, seed=709, device=device)
    K5 = randn(B, TK, DK, seed=710, device=device)
    V5 = randn(B, TK, DV, seed=711, device=device)
    empty = padding_mask(torch.tensor([0, 4], device=device), TK)  # (B, 1, TK): sequence 0 is empty
    holes = torch.rand(TQ, TK, generator=gen(712)).to(device) > 0.5
    holes[:, 0] = True
    holes[2] = False  # query 2 may look at no key
    return [
        Case(label("2-D, no mask, T_q != T_k", torch.float32, device), (Q2, K2, V2)),
        Case(
            label("batched 3-D, causal mask", torch.float64, device),
            (Q3, K3, V3),
            {"mask": causal_mask(TQ, device)},
        ),
        Case(label("4-D (batch, heads), padding mask", torch.float32, device), (Q4, K4, V4), {"mask": pad}),
        Case(
            label("batched 3-D, padding mask with an empty sequence (no key allowed)", torch.float32, device),
            (Q5, K5, V5),
            {"mask": empty},
        ),
        Case(
            label("2-D, random mask, one query with no allowed key", torch.float32, device),
            (Q2, K2, V2),
            {"mask": holes},
        ),
        Case(
            label(f"batched 3-D, causal mask, d_k = {OTHER_DK}", torch.float32, device),
            tuple(
                randn(B, TQ, d, seed=713 + i, device=device) for i, d in enumerate((OTHER_DK, OTHER_DK, DV))
            ),
            {"mask": causal_mask(TQ, device)},
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
    soft=softmax,
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


def _scaled_by_dv(soft):
    """attention with the scores divided by sqrt(d_v), the width of V, instead of sqrt(d_k)."""

    def attention(Q, K, V, mask=None):
        return _attention_via(lambda Q, K: scores(Q, K) / math.sqrt(V.shape[-1]), soft=soft)(Q, K, V, mask)

    return attention


SCALED_BY_DV = "the scores are divided by sqrt(d_v) instead of sqrt(d_k)"
SCALED_BY_DV_HINT = (
    "The scale is the width of the queries and keys, d_k = Q.shape[-1]; the width of the values, d_v, "
    "plays no part in the scores."
)


# (name, hint, how, example): each mistake made with the course's softmax and with torch.softmax,
# which gives NaN for a query with no allowed key
_ATTENTION_TRAPS = [
    (
        "the scores are not scaled",
        "Divide Q K^T by sqrt(d_k) before the mask and the softmax.",
        dict(S_fn=scores),
        "S = Q @ K.mT",
    ),
    (
        "the scores are divided by d_k instead of sqrt(d_k)",
        "The spread of a dot product grows like sqrt(d_k): divide by math.sqrt(Q.shape[-1]).",
        dict(S_fn=lambda Q, K: scores(Q, K) / Q.shape[-1]),
        "S = Q @ K.mT / Q.shape[-1]",
    ),
    (
        "the softmax runs over dim -2",
        "Each query's weights over the keys sum to 1: softmax over the last dimension.",
        dict(S_fn=scaled_scores, dim=-2),
        "A = torch.softmax(S, dim=-2)",
    ),
    (
        "the mask polarity is inverted",
        "True means 'may look': fill -inf where the mask is False.",
        dict(S_fn=scaled_scores, invert=True),
        'S = S.masked_fill(mask, float("-inf"))',
    ),
    (
        "the mask polarity is inverted",
        "True means 'may look': fill -inf where the mask is False.",
        dict(S_fn=scaled_scores, invert=True, mask_fill=-1e9),
        "S = S.masked_fill(mask, -1e9)",
    ),
    (
        "the mask was applied after the softmax",
        "Mask the scores (-inf) before the softmax: zeroing weights afterwards leaves rows that no longer "
        "sum to 1.",
        dict(S_fn=scaled_scores, after=True),
        "A = torch.softmax(S, dim=-1).masked_fill(~mask, 0)",
    ),
    (
        "the mask was transposed (padding on the query side)",
        "mask[..., i, j] says whether query i may look at key j: use it as given, without a transpose.",
        dict(S_fn=scaled_scores, transposed=True),
        'S = S.masked_fill(~mask.mT, float("-inf"))',
    ),
    (
        "the result is returned as (A, O)",
        "attention returns (O, A): the output first, then the weights.",
        dict(S_fn=scaled_scores, out="AO"),
        "return A, O",
    ),
    (
        "the weights were returned instead of A V",
        "The output is the blend of value rows: O = A @ V.",
        dict(S_fn=scaled_scores, out="AA"),
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
    "Do not call torch.nn.functional.scaled_dot_product_attention, or PyTorch's multi-head attention "
    "(nn.MultiheadAttention, F.multi_head_attention_forward): build the head from its moves "
    "(the visible check compares yours with it)."
)
NO_SDPA = {
    name: SDPA_RULE
    for name in (
        "torch.nn.functional.scaled_dot_product_attention",
        "torch.nn.functional.multi_head_attention_forward",
        "torch._native_multi_head_attention",
        "torch._transformer_encoder_layer_fwd",  # a Transformer layer's fast path: attention inside
    )
}

ATTENTION = Exercise(
    reference=attention,
    cases=_attention_cases,
    output_names=("O", "A"),
    forbidden=NO_SDPA,
    traps=[
        Trap(
            "a query with no allowed key gives NaN",
            "torch.softmax of a row that is all -inf is NaN; such a query must get all-zero weights and an "
            "all-zero output (use lesson 05's softmax, or torch.nan_to_num on the weights).",
            _attention_via(scaled_scores, soft=_nan_softmax),
            example="A = torch.softmax(S, dim=-1)  # NaN where a row is all -inf",
        ),
        *[
            Trap(name, hint, _attention_via(**how, soft=soft), example=example)
            for name, hint, how, example in _ATTENTION_TRAPS
            for soft in (softmax, _nan_softmax)
        ],
        *[
            Trap(
                SCALED_BY_DV,
                SCALED_BY_DV_HINT,
                _scaled_by_dv(soft),
                example="S = Q @ K.mT / math.sqrt(V.shape[-1])",
            )
            for soft in (softmax, _nan_softmax)
        ],
    ],
)


def _self_cases(device: torch.device) -> list[Case]:
    X3 = randn(B, TQ, DM, seed=720, device=device)
    X2 = randn(TK, DM, seed=721, device=device, dtype=torch.float64)
    W = [randn(DM, d, seed=722 + i, device=device) for i, d in enumerate((DK, DK, DV))]
    W64 = [w.double() for w in W]
    return [
        Case(label("batched 3-D, causal (default)", torch.float32, device), (X3, *W)),
        Case(label("2-D, causal=False", torch.float64, device), (X2, *W64), {"causal": False}),
        Case(label("2-D, causal=True", torch.float64, device), (X2, *W64), {"causal": True}),
        Case(
            label(f"batched 3-D, causal (default), d_k = {OTHER_DK}", torch.float32, device),
            (
                X3,
                *[randn(DM, d, seed=726 + i, device=device) for i, d in enumerate((OTHER_DK, OTHER_DK, DV))],
            ),
        ),
    ]


def _self_variant(*, scale=None, causal_flip=False, invert=False, soft=softmax, flag=None):
    """self_attention with one mistake; ``scale(X, Q, V)`` is what the scores are divided by."""

    def self_attention(X, W_q, W_k, W_v, causal=True):
        Q, K, V = X @ W_q, X @ W_k, X @ W_v
        S = scores(Q, K) / (scale(X, Q, V) if scale else math.sqrt(Q.shape[-1]))
        if (causal != causal_flip) if flag is None else flag:
            allowed = causal_mask(X.shape[-2], X.device)
            S = S.masked_fill(allowed if invert else ~allowed, NEG_INF)
        return soft(S, dim=-1) @ V

    return self_attention


# self- and cross-attention are built on the graded attention, and may not call SDPA either
_BUILT_ON_ATTENTION = {"uses": {"attention": attention}, "forbidden": NO_SDPA}

SELF_ATTENTION = Exercise(
    reference=self_attention,
    cases=_self_cases,
    **_BUILT_ON_ATTENTION,
    traps=[
        Trap(
            "the scores are divided by sqrt(d_model)",
            "The scale belongs to the head: divide by sqrt(d_k), the width of Q and K, not of X.",
            _self_variant(scale=lambda X, Q, V: math.sqrt(X.shape[-1])),
            example="S = Q @ K.mT / math.sqrt(X.shape[-1])",
        ),
        *same_mistake(
            "the causal flag is ignored or reversed",
            "With causal=True each token sees only itself and earlier tokens; with causal=False, all.",
            (_self_variant(causal_flip=True), "mask = causal_mask(T) if not causal else None"),
            (_self_variant(flag=False), "return attention(Q, K, V)[0]  # never masked"),
            (_self_variant(flag=True), "return attention(Q, K, V, causal_mask(T))[0]  # always masked"),
        ),
        *same_mistake(
            "the causal mask polarity is inverted",
            "True means 'may look': token i may look at j <= i.",
            (_self_variant(invert=True), 'S = S.masked_fill(mask, float("-inf"))'),
            # the last token sees nothing: NaN
            (_self_variant(invert=True, soft=torch.softmax), 'S = S.masked_fill(mask, float("-inf"))'),
        ),
        Trap(
            "the scores are not scaled",
            "Divide Q K^T by sqrt(d_k) before the softmax.",
            _self_variant(scale=lambda X, Q, V: 1.0),
            example="S = Q @ K.mT",
        ),
        Trap(
            SCALED_BY_DV,
            SCALED_BY_DV_HINT,
            _self_variant(scale=lambda X, Q, V: math.sqrt(V.shape[-1])),
            example="S = Q @ K.mT / math.sqrt(V.shape[-1])",
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
        Case(label("batched 3-D, 5 decoder and 7 encoder tokens", torch.float32, device), (Xd, Xe, *W)),
        Case(
            label("2-D, 5 decoder and 4 encoder tokens", torch.float64, device),
            (Xd2, Xe2, *[w.double() for w in W]),
        ),
        Case(
            label(f"batched 3-D, d_k = {OTHER_DK}", torch.float32, device),
            (
                Xd,
                Xe,
                *[randn(DM, d, seed=748 + i, device=device) for i, d in enumerate((OTHER_DK, OTHER_DK, DV))],
            ),
        ),
    ]


CROSS_ATTENTION = Exercise(
    reference=cross_attention,
    cases=_cross_cases,
    **_BUILT_ON_ATTENTION,
    traps=[
        Trap(
            "queries and keys/values come from the wrong sequences",
            "Queries come from the decoder (X_dec); keys and values from the encoder (X_enc).",
            lambda Xd, Xe, W_q, W_k, W_v: cross_attention(Xe, Xd, W_q, W_k, W_v),
            example="Q, K, V = X_enc @ W_q, X_dec @ W_k, X_dec @ W_v",
        ),
        Trap(
            "a causal mask was applied",
            "Cross-attention has no causal mask: every decoder token may look at every encoder token.",
            lambda Xd, Xe, W_q, W_k, W_v: attention(
                Xd @ W_q,
                Xe @ W_k,
                Xe @ W_v,
                torch.ones(Xd.shape[-2], Xe.shape[-2], dtype=torch.bool, device=Xd.device).tril(),
            )[0],
            example="return attention(Q, K, V, causal_mask(T))[0]",
        ),
        Trap(
            "the scores are not scaled",
            "Divide Q K^T by sqrt(d_k) before the softmax.",
            lambda Xd, Xe, W_q, W_k, W_v: softmax(scores(Xd @ W_q, Xe @ W_k)) @ (Xe @ W_v),
            example="A = softmax(Q @ K.mT)",
        ),
        Trap(
            SCALED_BY_DV,
            SCALED_BY_DV_HINT,
            lambda Xd, Xe, W_q, W_k, W_v: (
                softmax(scores(Xd @ W_q, Xe @ W_k) / math.sqrt(W_v.shape[-1])) @ (Xe @ W_v)
            ),
            example="S = Q @ K.mT / math.sqrt(V.shape[-1])",
        ),
    ],
)


EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (ATTENTION, SELF_ATTENTION, CROSS_ATTENTION)}
