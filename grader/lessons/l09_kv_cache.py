"""Lesson 09, the KV cache: hidden reference, seeded cases and known mistakes.

A cache is a pair of tensors, keys ``(..., t, d_k)`` and values ``(..., t, d_v)``,
one row per token seen so far; an empty cache has ``t = 0`` rows. A step takes
the newest token as a one-row sequence ``(..., 1, d_model)``, appends its key and
value along the token dimension (-2) and lets its query attend to the whole
cache, itself included; no mask is needed, since the cache holds only the past.
"""

from __future__ import annotations

import math
import numbers

import torch

from grader.harness import Case, Exercise, Trap
from grader.lessons._common import label, randn
from grader.lessons.l05_softmax import softmax
from grader.lessons.l07_one_head import attention, self_attention

# d_model, d_k, d_v, batch, heads, cached tokens: all different
DM, DK, DV, B, H, TC = 9, 8, 4, 2, 3, 6


# ------------------------------------------------------------------- reference


def kv_cache_step(
    x_t: torch.Tensor,
    K_cache: torch.Tensor,
    V_cache: torch.Tensor,
    W_q: torch.Tensor,
    W_k: torch.Tensor,
    W_v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of cached decoding: append the new token's key and value, attend with its query.

    Shapes: x_t (..., 1, d_model), K_cache (..., t, d_k), V_cache (..., t, d_v)
    -> o_t (..., 1, d_v), K_cache (..., t + 1, d_k), V_cache (..., t + 1, d_v).
    """
    q, k, v = x_t @ W_q, x_t @ W_k, x_t @ W_v  # (..., 1, d_k), (..., 1, d_k), (..., 1, d_v)
    K = torch.cat([K_cache, k], dim=-2)  # (..., t + 1, d_k)
    V = torch.cat([V_cache, v], dim=-2)  # (..., t + 1, d_v)
    o_t, _ = attention(q, K, V)  # the cache holds only the past: no mask
    return o_t, K, V


def empty_cache(X: torch.Tensor, width: int) -> torch.Tensor:
    """A cache with no tokens yet, on the device and dtype of X. Shapes: -> (..., 0, width)."""
    return X.new_zeros(*X.shape[:-2], 0, width)


def decode_with_cache(
    X: torch.Tensor, W_q: torch.Tensor, W_k: torch.Tensor, W_v: torch.Tensor
) -> torch.Tensor:
    """Feed the tokens of X one at a time through kv_cache_step; collect the outputs.

    Equal, row by row, to causal self-attention on the whole of X.
    Shapes: X (..., T, d_model) -> O (..., T, d_v).
    """
    K, V = empty_cache(X, W_k.shape[-1]), empty_cache(X, W_v.shape[-1])
    outputs = []
    for t in range(X.shape[-2]):
        o_t, K, V = kv_cache_step(X[..., t : t + 1, :], K, V, W_q, W_k, W_v)
        outputs.append(o_t)  # (..., 1, d_v)
    return torch.cat(outputs, dim=-2)  # (..., T, d_v)


def kv_cache_bytes(
    n_layers: int, n_kv_heads: int, d_head: int, n_tokens: int, batch: int = 1, bytes_per_value: int = 2
) -> int:
    """Memory of a KV cache: two tensors (keys and values) per layer, one row per token.

    bytes = 2 * n_layers * n_kv_heads * d_head * n_tokens * batch * bytes_per_value.
    """
    return 2 * n_layers * n_kv_heads * d_head * n_tokens * batch * bytes_per_value


# ------------------------------------------------------------------- kv_cache_step


def _step_cases(device: torch.device) -> list[Case]:
    spec = [  # (kind, leading dims, cached tokens, dtype)
        ("2-D, 6 tokens cached", (), TC, torch.float64),
        ("batched 3-D, 6 tokens cached", (B,), TC, torch.float32),
        ("batched 3-D, empty cache (the first token)", (B,), 0, torch.float32),
        ("batched 4-D (batch, heads), 1 token cached", (B, H), 1, torch.float64),
    ]
    cases = []
    for i, (kind, lead, t, dtype) in enumerate(spec):
        x = randn(*lead, 1, DM, seed=900 + 10 * i, device=device, dtype=dtype)
        K = randn(*lead, t, DK, seed=901 + 10 * i, device=device, dtype=dtype)
        V = randn(*lead, t, DV, seed=902 + 10 * i, device=device, dtype=dtype)
        W = [
            randn(DM, d, seed=903 + 10 * i + j, device=device, dtype=dtype) / math.sqrt(DM)
            for j, d in enumerate((DK, DK, DV))
        ]
        cases.append(Case(label(kind, dtype, device), (x, K, V, *W)))
    return cases


def _step_variant(
    *, cat=lambda old, new: torch.cat([old, new], dim=-2), own_key=True, scale=None, order="okv"
):
    def step(x_t, K_cache, V_cache, W_q, W_k, W_v):
        q, k, v = x_t @ W_q, x_t @ W_k, x_t @ W_v
        K, V = cat(K_cache, k), cat(V_cache, v)
        keys, values = (K, V) if own_key else (K_cache, V_cache)
        if scale is not None:
            q = q * math.sqrt(q.shape[-1]) / scale(x_t, q)
        o_t = attention(q, keys, values)[0]
        return {"okv": (o_t, K, V), "ovk": (o_t, V, K)}[order]

    return step


def _scaled_by_dv(x_t, K_cache, V_cache, W_q, W_k, W_v):
    q, k, v = x_t @ W_q, x_t @ W_k, x_t @ W_v
    K, V = torch.cat([K_cache, k], dim=-2), torch.cat([V_cache, v], dim=-2)
    A = softmax(q @ K.transpose(-2, -1) / math.sqrt(v.shape[-1]))
    return A @ V, K, V


SCALED_BY_DV = "the scores were scaled by sqrt(d_v) instead of sqrt(d_k)"


def _scaled_by_cache_length(x_t, K_cache, V_cache, W_q, W_k, W_v):
    q, k, v = x_t @ W_q, x_t @ W_k, x_t @ W_v
    K, V = torch.cat([K_cache, k], dim=-2), torch.cat([V_cache, v], dim=-2)
    A = softmax(q @ K.transpose(-2, -1) / math.sqrt(K.shape[-2]))
    return A @ V, K, V


KV_CACHE_STEP = Exercise(
    reference=kv_cache_step,
    cases=_step_cases,
    output_names=("o_t", "K_cache", "V_cache"),
    traps=[
        Trap(
            "the cache grew along the feature dimension (dim=-1) instead of the token dimension (dim=-2)",
            "Each token adds one ROW to the cache: torch.cat([K_cache, k], dim=-2).",
            _step_variant(cat=lambda old, new: torch.cat([old, new], dim=-1)),
        ),
        Trap(
            "the cache grew along dim 0 instead of the token dimension (dim=-2)",
            "dim=0 is the token axis only for 2-D tensors; with a batch it is the batch. Use dim=-2.",
            _step_variant(cat=lambda old, new: torch.cat([old, new], dim=0)),
        ),
        Trap(
            "the new key and value went in front of the cache",
            "Append at the end, torch.cat([K_cache, k], dim=-2), so row i of the cache is token i.",
            _step_variant(cat=lambda old, new: torch.cat([new, old], dim=-2)),
        ),
        Trap(
            "the query did not look at its own key (attended before appending)",
            "A token may look at itself (j <= i): append k and v to the cache first, then attend.",
            _step_variant(own_key=False),
        ),
        Trap(
            "the caches were returned in the wrong order",
            "Return (o_t, K_cache, V_cache): the output, then the keys, then the values.",
            _step_variant(order="ovk"),
        ),
        Trap(
            "the scores were scaled by sqrt(d_model) instead of sqrt(d_k)",
            "Divide q K^T by sqrt(d_k), the width of the query and the keys, not of x_t.",
            _step_variant(scale=lambda x, q: math.sqrt(x.shape[-1])),
        ),
        Trap(
            "the scores were scaled by sqrt(number of keys) instead of sqrt(d_k)",
            "The scale depends on d_k (the last dimension, q.shape[-1]), never on how many tokens are cached.",
            _scaled_by_cache_length,
        ),
        Trap(
            SCALED_BY_DV,
            "Divide q K^T by sqrt(d_k), the width of the query and the keys (q.shape[-1]); the values' width "
            "d_v plays no part in the scores.",
            _scaled_by_dv,
            example="S = q @ K.transpose(-2, -1) / math.sqrt(v.shape[-1])",
        ),
    ],
)


# ------------------------------------------------------------------- decode_with_cache


def _decode_cases(device: torch.device) -> list[Case]:
    spec = [  # (kind, leading dims, T, dtype)
        ("2-D, 7 tokens", (), 7, torch.float64),
        ("batched 3-D, 5 tokens", (B,), 5, torch.float32),
        ("batched 4-D (batch, heads), 6 tokens", (B, H), 6, torch.float32),
        ("batched 3-D, a single token", (B,), 1, torch.float64),
    ]
    cases = []
    for i, (kind, lead, T, dtype) in enumerate(spec):
        X = randn(*lead, T, DM, seed=950 + 10 * i, device=device, dtype=dtype)
        W = [
            randn(DM, d, seed=951 + 10 * i + j, device=device, dtype=dtype) / math.sqrt(DM)
            for j, d in enumerate((DK, DK, DV))
        ]
        cases.append(Case(label(kind, dtype, device), (X, *W)))
    return cases


def _decode_joined_on_dim0(X, W_q, W_k, W_v):
    K, V = empty_cache(X, W_k.shape[-1]), empty_cache(X, W_v.shape[-1])
    outputs = []
    for t in range(X.shape[-2]):
        o_t, K, V = kv_cache_step(X[..., t : t + 1, :], K, V, W_q, W_k, W_v)
        outputs.append(o_t)
    return torch.cat(outputs, dim=0)


DECODE_WITH_CACHE = Exercise(
    reference=decode_with_cache,
    cases=_decode_cases,
    uses={"kv_cache_step": kv_cache_step},  # graded on its own
    traps=[
        Trap(
            "the causal limit was forgotten: every token saw the whole sequence",
            "At step t only tokens 0..t exist: the cache must hold the tokens seen so far, never the future.",
            lambda X, W_q, W_k, W_v: self_attention(X, W_q, W_k, W_v, causal=False),
        ),
        Trap(
            "the cache was not carried from step to step (each token saw only itself)",
            "Pass the K_cache and V_cache returned by one step into the next; start empty only once.",
            lambda X, W_q, W_k, W_v: X @ W_v,
        ),
        Trap(
            "the step outputs were joined along dim 0 instead of the token dimension (dim=-2)",
            "Each o_t is (..., 1, d_v): torch.cat(outputs, dim=-2) puts them one token after another.",
            _decode_joined_on_dim0,
        ),
        Trap(
            "only the last step's output was returned",
            "Keep every o_t: the result has one row per token, (..., T, d_v).",
            lambda X, W_q, W_k, W_v: decode_with_cache(X, W_q, W_k, W_v)[..., -1:, :],
        ),
        Trap(
            "the scores were scaled by sqrt(d_model) instead of sqrt(d_k)",
            "Divide q K^T by sqrt(d_k), the width of the queries and keys.",
            lambda X, W_q, W_k, W_v: self_attention(
                X, W_q * math.sqrt(W_q.shape[-1]) / math.sqrt(X.shape[-1]), W_k, W_v
            ),
        ),
        Trap(
            SCALED_BY_DV,
            "Divide q K^T by sqrt(d_k), the width of the queries and keys; the values' width d_v plays no part "
            "in the scores.",
            lambda X, W_q, W_k, W_v: self_attention(
                X, W_q * math.sqrt(W_q.shape[-1]) / math.sqrt(W_v.shape[-1]), W_k, W_v
            ),
            example="S = q @ K.transpose(-2, -1) / math.sqrt(V.shape[-1])",
        ),
    ],
)

# ------------------------------------------------------------------- kv_cache_bytes


def _bytes_cases(device: torch.device) -> list[Case]:
    # the first case has batch, bytes_per_value and n_layers all different from 1, 2 and each
    # other, so each forgotten factor gives its own wrong answer
    spec = [
        (
            "12 layers, 12 heads of 64, 1024 tokens, batch 8, float32",
            (12, 12, 64, 1024),
            {"batch": 8, "bytes_per_value": 4},
        ),
        ("32 layers, 32 K/V heads of 128, 4096 tokens, 2-byte values", (32, 32, 128, 4096), {}),
        ("32 layers, 8 K/V heads of 128 (grouped queries), 4096 tokens", (32, 8, 128, 4096), {}),
        (
            "1 layer, 1 head of 3, 3 tokens, float32 ('I love cats')",
            (1, 1, 3, 3),
            {"batch": 1, "bytes_per_value": 4},
        ),
        ("48 layers, 1 K/V head of 96 (multi-query), 1000 tokens, batch 5", (48, 1, 96, 1000), {"batch": 5}),
    ]
    return [Case(label, args, kwargs) for label, args, kwargs in spec]


def _type_name(x: object) -> str:
    """What a student returned, in words: ``a float (2147483648.0)``, ``a torch.Tensor of dtype int64``."""
    if isinstance(x, torch.Tensor):
        return f"a torch.Tensor of dtype {str(x.dtype).replace('torch.', '')}"
    kind = type(x).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    return f"{article} {kind} ({x!r})" if isinstance(x, numbers.Number) else f"{article} {kind}"


def _compare_bytes(expected: int, got, label: str) -> str | None:
    # a count of bytes is a whole number: a float (from / or math.pow), a bool or a tensor is not one, even
    # when it compares equal; numpy's integers are ints (numbers.Integral), a bool is not
    if isinstance(got, bool) or not isinstance(got, numbers.Integral):
        return (
            f"kv_cache_bytes should return an int (a whole number of bytes), but it returned "
            f"{_type_name(got)}. Multiply ints with * (no /, no float), or wrap the result in int(...)."
        )
    if got != expected:
        ratio = got / expected
        return f"got {got:,} bytes, expected {expected:,} (yours is {ratio:.4g} times the right size)."
    return None


def _bytes_without(*names: str):
    def count(n_layers, n_kv_heads, d_head, n_tokens, batch=1, bytes_per_value=2):
        given = dict(n_layers=n_layers, batch=batch, bytes_per_value=bytes_per_value, two=2)
        for name in names:
            given[name] = 1
        return (
            given["two"]
            * given["n_layers"]
            * n_kv_heads
            * d_head
            * n_tokens
            * given["batch"]
            * given["bytes_per_value"]
        )

    return count


KV_CACHE_BYTES = Exercise(
    reference=kv_cache_bytes,
    cases=_bytes_cases,
    compare=_compare_bytes,
    traps=[
        Trap(
            "only the keys were counted",
            "The cache holds two tensors per layer, keys AND values: multiply by 2.",
            _bytes_without("two"),
        ),
        Trap(
            "bytes_per_value was ignored (numbers counted, not bytes)",
            "Each stored number takes bytes_per_value bytes (2 for float16/bfloat16, 4 for float32).",
            _bytes_without("bytes_per_value"),
        ),
        Trap(
            "the batch was ignored",
            "Every sequence in the batch has its own cache: multiply by batch.",
            _bytes_without("batch"),
        ),
        Trap(
            "only one layer was counted",
            "Every layer keeps its own keys and values: multiply by n_layers.",
            _bytes_without("n_layers"),
        ),
    ],
)

EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (KV_CACHE_STEP, DECODE_WITH_CACHE, KV_CACHE_BYTES)}

__all__ = ["EXERCISES", "decode_with_cache", "empty_cache", "kv_cache_bytes", "kv_cache_step"]
