"""Lesson 08, multi-head attention: hidden reference, seeded cases and known mistakes.

Conventions (the same as ``torch.nn.MultiheadAttention``): the columns of a
projection hold the heads one after another, so head ``h`` owns columns
``h * d_head`` to ``(h + 1) * d_head``; grouped-query attention gives query head
``h`` the key/value head ``h // (n_heads // n_kv_heads)`` (consecutive query
heads share, as ``repeat_interleave`` and ``scaled_dot_product_attention(...,
enable_gqa=True)`` do).
"""

from __future__ import annotations

import math

import torch

from grader.harness import Case, Exercise, Trap
from grader.lessons._common import label, randn
from grader.lessons.l07_one_head import attend

# T, d_model, batch, an extra leading dimension: all different from every head size below
T, DM, B, E = 5, 10, 2, 7


# ------------------------------------------------------------------- reference


def split_heads(X: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Cut the last dimension into n_heads blocks and move the heads in front of the tokens.

    Shapes: X (..., T, n_heads * d_head) -> (..., n_heads, T, d_head).
    """
    *batch, T_, D = X.shape
    return X.reshape(*batch, T_, n_heads, D // n_heads).transpose(-3, -2)


def merge_heads(X: torch.Tensor) -> torch.Tensor:
    """Undo split_heads: concatenate the heads side by side, head 0 first.

    Shapes: X (..., n_heads, T, d_head) -> (..., T, n_heads * d_head).
    """
    *batch, H, T_, d = X.shape
    return X.transpose(-3, -2).reshape(*batch, T_, H * d)


def multi_head_attention(
    X: torch.Tensor,
    W_q: torch.Tensor,
    W_k: torch.Tensor,
    W_v: torch.Tensor,
    W_o: torch.Tensor,
    n_heads: int,
    causal: bool = False,
) -> torch.Tensor:
    """n_heads heads of self-attention side by side, concatenated, then projected by W_o.

    Shapes: X (..., T, d_model), W_q and W_k (d_model, n_heads * d_k), W_v (d_model, n_heads * d_v),
    W_o (n_heads * d_v, d_out) -> (..., T, d_out).
    """
    Q = split_heads(X @ W_q, n_heads)  # (..., H, T, d_k)
    K = split_heads(X @ W_k, n_heads)  # (..., H, T, d_k)
    V = split_heads(X @ W_v, n_heads)  # (..., H, T, d_v)
    O = attend(Q, K, V, causal)  # (..., H, T, d_v)
    return merge_heads(O) @ W_o  # (..., T, H * d_v) @ (H * d_v, d_out)


def grouped_query_attention(
    X: torch.Tensor,
    W_q: torch.Tensor,
    W_k: torch.Tensor,  # n_kv_heads key heads, not n_heads
    W_v: torch.Tensor,  # n_kv_heads value heads
    W_o: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
    causal: bool = False,
) -> torch.Tensor:
    """Multi-head attention whose n_heads query heads share n_kv_heads key/value heads.

    Shapes: X (..., T, d_model), W_q (d_model, n_heads * d_k), W_k (d_model, n_kv_heads * d_k),
    W_v (d_model, n_kv_heads * d_v), W_o (n_heads * d_v, d_out) -> (..., T, d_out).
    """
    group = n_heads // n_kv_heads
    Q = split_heads(X @ W_q, n_heads)  # (..., H, T, d_k)
    K = split_heads(X @ W_k, n_kv_heads).repeat_interleave(group, dim=-3)  # (..., H, T, d_k)
    V = split_heads(X @ W_v, n_kv_heads).repeat_interleave(group, dim=-3)  # (..., H, T, d_v)
    return merge_heads(attend(Q, K, V, causal)) @ W_o


# ----------------------------------------------------------- mistaken variants


def _split_no_transpose_view(X, H):
    *batch, T_, D = X.shape
    return X.reshape(*batch, H, T_, D // H)


def _split_interleaved(X, H):
    *batch, T_, D = X.shape
    return X.reshape(*batch, T_, D // H, H).transpose(-1, -2).transpose(-3, -2)


def _merge_no_transpose(X):
    *batch, H, T_, d = X.shape
    return X.reshape(*batch, T_, H * d)


def _merge_interleaved(X):
    *batch, H, T_, d = X.shape
    return X.permute(*range(len(batch)), -2, -1, -3).reshape(*batch, T_, H * d)


def _attention_variant(
    *,
    split=split_heads,
    merge=merge_heads,
    scale=None,
    project_out=True,
    one_head=False,
    flip_causal=False,
    fixed_causal=None,
    tile_kv=False,
):
    """Grouped-query attention (multi-head when n_kv_heads == n_heads) with one thing changed."""

    def gqa(X, W_q, W_k, W_v, W_o, n_heads, n_kv_heads, causal=False):
        causal = causal != flip_causal if fixed_causal is None else fixed_causal
        if one_head:
            Q, K, V = X @ W_q, X @ W_k, X @ W_v
            O = attend(Q, K, V, causal)
            return O @ W_o if project_out else O
        group = n_heads // n_kv_heads
        Q = split(X @ W_q, n_heads)
        K, V = split(X @ W_k, n_kv_heads), split(X @ W_v, n_kv_heads)
        if tile_kv:
            reps = [1] * (K.dim() - 3) + [group, 1, 1]
            K, V = K.repeat(*reps), V.repeat(*reps)
        else:
            K, V = K.repeat_interleave(group, dim=-3), V.repeat_interleave(group, dim=-3)
        if scale is not None:  # undo the reference's sqrt(d_head), apply the wrong one
            Q = Q * math.sqrt(Q.shape[-1]) / scale(X, W_q, Q)
        O = merge(attend(Q, K, V, causal))
        return O @ W_o if project_out else O

    return gqa


def _as_mha(gqa):
    return lambda X, W_q, W_k, W_v, W_o, n_heads, causal=False: gqa(
        X, W_q, W_k, W_v, W_o, n_heads, n_heads, causal
    )


# ------------------------------------------------------------------- split / merge


# (leading dims, n_heads, d_head, dtype, split_heads' case, merge_heads' case or None)
_HEAD_SHAPES = [
    ((), 3, 4, torch.float32, "2-D, 3 heads of 4", "3-D (heads, T, d_head), 3 heads of 4"),
    ((B,), 4, 3, torch.float64, "batched 3-D, 4 heads of 3", "batched 4-D, 4 heads of 3"),
    ((B, E), 6, 2, torch.float32, "batched 4-D, 6 heads of 2", "batched 5-D, 6 heads of 2"),
    ((), 1, 12, torch.float64, "2-D, 1 head of 12", None),
]


def _heads_cases(device: torch.device, split: bool) -> list[Case]:
    """split_heads' cases (X, n_heads) with the heads side by side, else merge_heads' (X,) with them in front."""
    cases = []
    for i, (lead, H, d, dtype, split_kind, merge_kind) in enumerate(_HEAD_SHAPES):
        if split:
            X = randn(*lead, T, H * d, seed=800 + i, device=device, dtype=dtype)
            cases.append(Case(label(split_kind, dtype, device), (X, H)))
        elif merge_kind is not None:
            X = randn(*lead, H, T, d, seed=820 + i, device=device, dtype=dtype)
            cases.append(Case(label(merge_kind, dtype, device), (X,)))
    return cases


def _split_cases(device: torch.device) -> list[Case]:
    return _heads_cases(device, split=True)


def _merge_cases(device: torch.device) -> list[Case]:
    return _heads_cases(device, split=False)


SPLIT_HEADS = Exercise(
    reference=split_heads,
    cases=_split_cases,
    traps=[
        Trap(
            "reshaped straight to (n_heads, T, d_head) without a transpose",
            "A view keeps the memory order, so view(H, T, d_head) cuts tokens apart. First view (T, H, d_head), "
            "which cuts each row into heads, then move the heads in front: .transpose(-3, -2).",
            _split_no_transpose_view,
        ),
        Trap(
            "the heads axis was not moved in front of the tokens",
            "After view(..., T, n_heads, d_head) the heads sit behind the tokens; "
            "attention needs (..., n_heads, T, d_head): .transpose(-3, -2).",
            lambda X, H: X.reshape(*X.shape[:-1], H, X.shape[-1] // H),
        ),
        Trap(
            "n_heads was used as the size of a head",
            "n_heads is how many blocks the last dimension is cut into; each block has d_head = d_model // n_heads.",
            lambda X, H: X.reshape(*X.shape[:-1], X.shape[-1] // H, H).transpose(-3, -2),
        ),
        Trap(
            "heads were made of interleaved columns (d_head, n_heads) instead of blocks",
            "Head h owns the block of columns h * d_head .. (h + 1) * d_head - 1: view (..., T, n_heads, d_head), "
            "not (..., T, d_head, n_heads).",
            _split_interleaved,
        ),
        Trap(
            "transpose(0, 1) instead of transpose(-3, -2)",
            "Count axes from the end so batches keep working: the heads and tokens are axes -3 and -2.",
            lambda X, H: X.reshape(*X.shape[:-1], H, X.shape[-1] // H).transpose(0, 1),
        ),
    ],
)


MERGE_HEADS = Exercise(
    reference=merge_heads,
    cases=_merge_cases,
    uses={"split_heads": split_heads},  # its round trip splits with the reference: graded on its own
    traps=[
        Trap(
            ".view after a transpose",
            "A transposed tensor is not contiguous, so .view cannot merge its axes: use .reshape "
            "(or .contiguous().view).",
            lambda X: X.transpose(-3, -2).view(*X.shape[:-3], X.shape[-2], X.shape[-3] * X.shape[-1]),
        ),
        Trap(
            "reshaped straight back without moving the heads behind the tokens",
            "(..., H, T, d_head) must become (..., T, H, d_head) before the last two axes merge: "
            ".transpose(-3, -2) first, then reshape.",
            _merge_no_transpose,
        ),
        Trap(
            "the heads were interleaved (d_head, n_heads) instead of concatenated",
            "Concatenate head 0's columns, then head 1's, ...: (..., T, H, d_head) -> (..., T, H * d_head).",
            _merge_interleaved,
        ),
        Trap(
            "the heads were summed instead of concatenated",
            "Each head keeps its own columns side by side; only W_o mixes them afterwards.",
            lambda X: X.sum(dim=-3),
        ),
        Trap(
            "the heads were averaged instead of concatenated",
            "Each head keeps its own columns side by side; only W_o mixes them afterwards.",
            lambda X: X.mean(dim=-3),
        ),
    ],
)

# ------------------------------------------------------------ multi-head attention


def _weights(device, dtype, seed, H, G, d_k, d_v, d_out=DM):
    shapes = [(DM, H * d_k), (DM, G * d_k), (DM, G * d_v), (H * d_v, d_out)]
    return [
        randn(*s, seed=seed + j, device=device, dtype=dtype) / math.sqrt(s[0]) for j, s in enumerate(shapes)
    ]


def _mha_cases(device: torch.device) -> list[Case]:
    spec = [  # (kind, leading dims, H, d_k, d_v, causal, dtype)
        ("2-D, 3 heads, d_k 4 != d_v 2", (), 3, 4, 2, False, torch.float64),
        ("batched 3-D, 3 heads, d_k 4 != d_v 2, causal", (B,), 3, 4, 2, True, torch.float32),
        ("batched 4-D, 4 heads, d_k 3 != d_v 6", (B, E), 4, 3, 6, False, torch.float32),
        ("batched 3-D, 1 head (lesson 07), causal", (B,), 1, 4, 6, True, torch.float64),
    ]
    cases = []
    for i, (kind, lead, H, d_k, d_v, causal, dtype) in enumerate(spec):
        X = randn(*lead, T, DM, seed=840 + 10 * i, device=device, dtype=dtype)
        W = _weights(device, dtype, 841 + 10 * i, H, H, d_k, d_v)
        cases.append(Case(label(kind, dtype, device), (X, *W, H), {"causal": causal}))
    return cases


_CAUSAL_HINT = (
    "With causal=True each token sees only itself and earlier tokens; with causal=False, all tokens."
)
_MHA_TRAPS = [
    (
        "the output projection W_o was left out",
        "After concatenating the heads, multiply by W_o: it mixes what the heads found and maps it to d_out.",
        dict(project_out=False),
    ),
    (
        "the heads were never split (one big head)",
        "Cut Q, K and V into n_heads blocks with split_heads and attend within each head separately.",
        dict(one_head=True),
    ),
    (
        "the scores were scaled by sqrt(n_heads * d_head) instead of sqrt(d_head)",
        "Each head is a lesson-07 head of width d_head: divide its scores by sqrt(d_head), "
        "the last dimension after split_heads.",
        dict(scale=lambda X, W_q, Q: math.sqrt(W_q.shape[-1])),
    ),
    (
        "the scores were scaled by sqrt(d_model) instead of sqrt(d_head)",
        "The scale belongs to the head: divide by sqrt(d_head), the width of one head's queries and keys.",
        dict(scale=lambda X, W_q, Q: math.sqrt(X.shape[-1])),
    ),
    (
        "the scores were not scaled",
        "Divide each head's Q K^T by sqrt(d_head) before the softmax.",
        dict(scale=lambda X, W_q, Q: 1.0),
    ),
    (
        "heads split with a reshape straight to (n_heads, T, d_head)",
        "view (..., T, n_heads, d_head), then transpose(-3, -2): a direct view cuts tokens apart.",
        dict(split=_split_no_transpose_view),
    ),
    (
        "heads merged with a reshape straight back, without the transpose",
        "Move the heads behind the tokens (transpose(-3, -2)) before reshaping to (..., T, n_heads * d_v).",
        dict(merge=_merge_no_transpose),
    ),
    (
        "heads made of interleaved columns instead of blocks",
        "Head h owns columns h * d_head .. (h + 1) * d_head - 1 of W_q, W_k, W_v and the matching rows of W_o.",
        dict(split=_split_interleaved, merge=_merge_interleaved),
    ),
    ("the causal flag is ignored or reversed", _CAUSAL_HINT, dict(flip_causal=True)),
    ("the causal flag is ignored: every call masks the future", _CAUSAL_HINT, dict(fixed_causal=True)),
    ("the causal flag is ignored: no call masks it", _CAUSAL_HINT, dict(fixed_causal=False)),
]

MULTI_HEAD_ATTENTION = Exercise(
    reference=multi_head_attention,
    cases=_mha_cases,
    uses={"split_heads": split_heads, "merge_heads": merge_heads},  # graded on their own
    traps=[Trap(name, hint, _as_mha(_attention_variant(**how))) for name, hint, how in _MHA_TRAPS],
)


def _gqa_cases(device: torch.device) -> list[Case]:
    spec = [  # (kind, leading dims, H, G, d_k, d_v, causal, dtype)
        ("2-D, 6 query heads share 2 K/V heads, d_k 4 != d_v 2", (), 6, 2, 4, 2, False, torch.float64),
        ("batched 3-D, 6 query heads share 3 K/V heads, causal", (B,), 6, 3, 4, 2, True, torch.float32),
        ("batched 4-D, 4 query heads share 2 K/V heads", (B, E), 4, 2, 3, 6, False, torch.float32),
        ("batched 3-D, multi-query: 6 heads share 1 K/V head", (B,), 6, 1, 4, 2, True, torch.float64),
        (
            "batched 3-D, 3 K/V heads for 3 query heads (plain multi-head)",
            (B,),
            3,
            3,
            4,
            2,
            False,
            torch.float32,
        ),
    ]
    cases = []
    for i, (kind, lead, H, G, d_k, d_v, causal, dtype) in enumerate(spec):
        X = randn(*lead, T, DM, seed=870 + 10 * i, device=device, dtype=dtype)
        W = _weights(device, dtype, 871 + 10 * i, H, G, d_k, d_v)
        cases.append(Case(label(kind, dtype, device), (X, *W, H, G), {"causal": causal}))
    return cases


GROUPED_QUERY_ATTENTION = Exercise(
    reference=grouped_query_attention,
    cases=_gqa_cases,
    # graded on their own, multi_head_attention too (a GQA may be written as one with K/V heads repeated)
    uses={
        "split_heads": split_heads,
        "merge_heads": merge_heads,
        "multi_head_attention": multi_head_attention,
    },
    traps=[
        Trap(
            "K/V heads were tiled (repeat) instead of grouped (repeat_interleave)",
            "Consecutive query heads share a K/V head: query head h uses K/V head h // (n_heads // n_kv_heads). "
            "repeat gives h % n_kv_heads; use repeat_interleave(group, dim=-3).",
            _attention_variant(tile_kv=True),
        ),
        *[
            Trap(name, hint, _attention_variant(**how))
            for name, hint, how in _MHA_TRAPS
            if "one big head" not in name and "interleaved" not in name
        ],
    ],
)

EXERCISES: dict[str, Exercise] = {
    ex.name: ex for ex in (SPLIT_HEADS, MERGE_HEADS, MULTI_HEAD_ATTENTION, GROUPED_QUERY_ATTENTION)
}

__all__ = ["EXERCISES", "grouped_query_attention", "merge_heads", "multi_head_attention", "split_heads"]
