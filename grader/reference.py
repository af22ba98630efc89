"""Hidden reference for every graded function of the course (lessons 01-07).

Device-agnostic: every result lives on the device, and keeps the dtype, of its
inputs. Any leading batch dimensions are accepted: ``(..., T, d)``.
Never shipped to students.
"""

from __future__ import annotations

import math

import torch

# ----------------------------------------------------------------- 01 projection


def project(
    X: torch.Tensor, W_q: torch.Tensor, W_k: torch.Tensor, W_v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Project tokens into queries, keys and values.

    Shapes: X (..., T, d_model), W_q and W_k (d_model, d_k), W_v (d_model, d_v)
    -> Q, K (..., T, d_k), V (..., T, d_v).
    """
    return X @ W_q, X @ W_k, X @ W_v


# ------------------------------------------------------------------- 02 scoring


def scores(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Dot product of every query with every key.

    Shapes: Q (..., T_q, d_k), K (..., T_k, d_k) -> S (..., T_q, T_k).
    """
    return Q @ K.transpose(-2, -1)


# ------------------------------------------------------------------- 03 scaling


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


# ------------------------------------------------------------------- 04 masking


def causal_mask(T: int, device: torch.device | str | None = None) -> torch.Tensor:
    """True where query i may look at key j, i.e. j <= i.

    Shapes: -> (T, T) bool.
    """
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def padding_mask(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """True for real tokens, False for padding, ready to broadcast over queries.

    Shapes: lengths (B,) integer -> (B, 1, T) bool.
    """
    positions = torch.arange(T, device=lengths.device)  # (T,)
    return (positions[None, :] < lengths[:, None])[:, None, :]


def apply_mask(S: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Put -inf wherever looking is not allowed.

    Shapes: S (..., T_q, T_k), allowed broadcastable to S -> (..., T_q, T_k).
    """
    return S.masked_fill(~allowed, float("-inf"))


# ------------------------------------------------------------------- 05 softmax


def softmax(Z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax; a row that is all -inf becomes all zeros.

    Shapes: Z (...) -> same shape, entries along ``dim`` sum to 1 (or are all 0).
    """
    if Z.shape[dim] == 0:  # no keys at all: nothing to weigh (and amax of nothing is undefined)
        return torch.zeros_like(Z)
    m = Z.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all -inf rows
    e = torch.exp(Z - m)  # exp(x - max) <= 1: never overflows
    total = e.sum(dim=dim, keepdim=True)
    return torch.where(total > 0, e / torch.where(total > 0, total, 1), 0)


def soft_lookup(
    query: list[float],
    keys: dict[str, list[float]],
    values: dict[str, list[float]],
    sharpness: float,
) -> tuple[dict[str, float], list[float]]:
    """A soft dictionary look-up in plain Python.

    score(name) = sharpness * (query . key) / sqrt(len(query)); weights are the
    softmax of the scores; output is the weighted sum of the values.
    """
    d = len(query)
    raw = {
        name: sharpness * sum(q * k for q, k in zip(query, key)) / math.sqrt(d) for name, key in keys.items()
    }
    top = max(raw.values())
    exps = {name: math.exp(s - top) for name, s in raw.items()}
    total = sum(exps.values())
    weights = {name: e / total for name, e in exps.items()}
    width = len(next(iter(values.values())))
    output = [sum(weights[name] * values[name][i] for name in keys) for i in range(width)]
    return weights, output


# -------------------------------------------------------------------- 06 mixing


def mix(A: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Each output row is the A-weighted average of the value rows.

    Shapes: A (..., T_q, T_k), V (..., T_k, d_v) -> O (..., T_q, d_v).
    """
    return A @ V


# --------------------------------------------------------- 07 one attention head


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
    Q, K, V = project(X, W_q, W_k, W_v)
    mask = causal_mask(X.shape[-2], device=X.device) if causal else None
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


GRADED = {
    "project": project,
    "scores": scores,
    "scaled_scores": scaled_scores,
    "score_spread": score_spread,
    "causal_mask": causal_mask,
    "padding_mask": padding_mask,
    "apply_mask": apply_mask,
    "softmax": softmax,
    "soft_lookup": soft_lookup,
    "mix": mix,
    "attention": attention,
    "self_attention": self_attention,
    "cross_attention": cross_attention,
}
