"""Lesson 11, what attention costs: hidden reference, seeded cases and known mistakes.

Plain attention forms the ``(T_q, T_k)`` score matrix; online softmax and tiling, the idea
behind FlashAttention, walk through the keys one block at a time with a running max ``m``
and a running sum ``l`` and never form it.

"Never forms the full matrix" is checked by watching, not by timing: the hidden cases hand the
student's function :class:`Watched` tensors, a ``torch.Tensor`` subclass that lets every torch
operation run as usual and notes, on each result computed from the inputs, whether any step on
the way saw too much at once:

- ``tiled_attention``: some operation *produced* a tensor holding a full score matrix, i.e. with
  dimensions of sizes ``T_q`` and ``T_k`` (or ``T_q * T_k``), or scores of more than ``block_size``
  keys for ``T_q`` queries, or called ``scaled_dot_product_attention`` (or a fused kernel by any name)
  instead of doing the work;
- ``online_softmax_stats``: some operation other than taking a block, a view or a copy *received*
  a tensor holding whole rows of ``Z`` (a dimension of size ``N``) or more than ``block_size`` entries
  of a row.

The note travels with the data (every result of an operation inherits its inputs' note), so a
full matrix that feeds the output is seen however it was made. Around the student's call, a
``CallWatch`` sees every torch operation, on plain tensors too: a whole input taken out of torch
(numpy, ``tolist``) counts as read at once, a plain copy is judged by the same shapes, and a result
made without the inputs ever being read through torch fails the check. It sees every aten operation
at the dispatcher too (torch functions switched off, which fails the check, TorchScript, private
names), following the storages computed from the inputs; a result computed outside torch from values
taken out of them (blocks in numpy: honest, or glued back together) is flagged for review, not failed.
The checks only run where ``block_size`` is smaller than the number of keys. The case sizes are all different from one
another, so a block, a head dimension or a batch size never looks like ``T_q``, ``T_k`` or ``N``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attention_course.watch import Rule, Watched, note_of, watched  # noqa: F401 - the checks use them
from grader.harness import Case, Exercise, Trap, compare_outputs, compare_tensor
from grader.lessons._common import randn

NEG_INF = float("-inf")

# ------------------------------------------------------------------- reference


def plain_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Lesson 07's attention: the full (T_q, T_k) score matrix, softmax, A V.

    Shapes: Q (..., T_q, d_k), K (..., T_k, d_k), V (..., T_k, d_v) -> O (..., T_q, d_v).
    """
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., T_q, T_k): the whole matrix
    if causal:
        T_q, T_k = S.shape[-2:]
        allowed = torch.ones(T_q, T_k, dtype=torch.bool, device=S.device).tril()
        S = S.masked_fill(~allowed, NEG_INF)
    return torch.softmax(S, dim=-1) @ V


def online_softmax_stats(Z: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row max m and sum l = sum(exp(Z - m)) over the last dimension, reading block_size entries at a time.

    Shapes: Z (..., N) -> m (...), l (...).
    """
    m = torch.full(Z.shape[:-1], NEG_INF, dtype=Z.dtype, device=Z.device)  # running max
    l = torch.zeros(Z.shape[:-1], dtype=Z.dtype, device=Z.device)  # running sum of exp(z - m)
    for start in range(0, Z.shape[-1], block_size):
        block = Z[..., start : start + block_size]  # (..., <= block_size)
        m_new = torch.maximum(m, block.amax(dim=-1))
        # what was summed against the old max is rescaled to the new one: exp(z - m) = exp(z - m_new) * exp(m_new - m)
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new[..., None]).sum(dim=-1)
        m = m_new
    return m, l


def tiled_attention(
    Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, block_size: int, causal: bool = False
) -> torch.Tensor:
    """Attention computed block_size keys at a time with online softmax; never forms (T_q, T_k).

    Shapes: Q (..., T_q, d_k), K (..., T_k, d_k), V (..., T_k, d_v) -> O (..., T_q, d_v).
    causal=True lets query i see keys j <= i, as scaled_dot_product_attention(is_causal=True).
    """
    T_q, T_k = Q.shape[-2], K.shape[-2]
    scale = 1 / math.sqrt(Q.shape[-1])
    m = torch.full((*Q.shape[:-1], 1), NEG_INF, dtype=Q.dtype, device=Q.device)  # (..., T_q, 1)
    l = torch.zeros((*Q.shape[:-1], 1), dtype=Q.dtype, device=Q.device)  # (..., T_q, 1)
    acc = torch.zeros((*Q.shape[:-1], V.shape[-1]), dtype=Q.dtype, device=Q.device)  # (..., T_q, d_v)
    rows = torch.arange(T_q, device=Q.device)[:, None]  # (T_q, 1): query positions
    for start in range(0, T_k, block_size):
        K_b = K[..., start : start + block_size, :]  # (..., b, d_k)
        V_b = V[..., start : start + block_size, :]  # (..., b, d_v)
        S_b = (Q @ K_b.transpose(-2, -1)) * scale  # (..., T_q, b): one block of scores
        if causal:
            cols = torch.arange(start, start + K_b.shape[-2], device=Q.device)[
                None, :
            ]  # global key positions
            S_b = S_b.masked_fill(cols > rows, NEG_INF)
        m_new = torch.maximum(m, S_b.amax(dim=-1, keepdim=True))
        alpha = torch.exp(m - m_new)  # rescales everything summed against the old max
        P = torch.exp(S_b - m_new)  # (..., T_q, b)
        l = alpha * l + P.sum(dim=-1, keepdim=True)
        acc = alpha * acc + P @ V_b
        m = m_new
    return acc / l  # divide once, at the end


# ------------------------------------------------------------ watching the work


def _plain(x):
    """Results as ordinary tensors (the comparison itself is not watched)."""
    if isinstance(x, torch.Tensor):
        return x.as_subclass(torch.Tensor)
    if isinstance(x, (tuple, list)):
        return type(x)(_plain(v) for v in x) if not hasattr(x, "_fields") else tuple(_plain(v) for v in x)
    return x


_HOW = {
    "full": "it formed the full score matrix",
    "sdpa": "it called scaled_dot_product_attention",
    "row": "it computed on whole rows instead of one block at a time",
    "wide": "it worked on more than block_size entries at once instead of one block at a time",
    "off": "keep torch functions switched on, so the work can be followed",
    "opaque": "use torch's own operations on ordinary tensors, so the work can be followed",
    "whole": "it read a whole input at once instead of one block at a time",
    "unseen": "read the inputs with torch operations, one block at a time, so the work can be followed",
}


def _in_float64(fn):
    """fn computed in float64 for float32 inputs and rounded back: the exact answer float32 work is held to.

    Near +1000, float32 rounds the scores themselves (spacing 6e-5 there); a float32 reference would hold
    an implementation that works in float64 inside to the reference's own rounding.
    """

    def expected(*args, **kwargs):
        floating = [t.dtype for t in args if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not floating or floating[0] != torch.float32:
            return fn(*args, **kwargs)
        wide = tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        out = fn(*wide, **kwargs)
        if isinstance(out, tuple):
            return tuple(o.to(torch.float32) for o in out)
        return out.to(torch.float32)

    return expected


# float32 near +-1000: the scores carry float32 rounding however they are computed, compared with the exact answer
_NEAR_1000 = {torch.float32: (1e-3, 1e-4)}


def _tolerances(label: str) -> dict | None:
    return _NEAR_1000 if "near +1000" in label or "near -1000" in label else None


def _notes_differ(expected, got, fn: str) -> str | None:
    want, seen = note_of(expected), note_of(got)
    if (want and want[0]) == (seen and seen[0]):
        return None
    if seen is None:
        return f"{fn}'s result does not carry the same work pattern as the known mistake."
    return f"{fn} gives the right numbers, but {seen[1]}. {_HOW[seen[0]].capitalize()}."


# ------------------------------------------------------- online_softmax_stats check


def _compare_stats(expected, got, label: str) -> str | None:
    problem = compare_outputs(
        _plain(expected), _plain(got), "online_softmax_stats", ("m", "l"), _tolerances(label)
    )
    return problem or _notes_differ(expected, got, "online_softmax_stats")


def _stats_cases(device: torch.device) -> list[Case]:
    spec = [
        ("1-D row, N = 10, block_size 4 (last block partial)", (10,), 4, 0.0, torch.float32),
        ("2-D, N = 11, block_size 3", (5, 11), 3, 0.0, torch.float64),
        ("3-D, N = 16, block_size 4 (blocks fit exactly)", (2, 3, 16), 4, 0.0, torch.float32),
        ("scores near +1000 (overflow test), block_size 4", (4, 9), 4, 1000.0, torch.float32),
        ("scores near -1000 (all very negative), block_size 2", (4, 9), 2, -1000.0, torch.float64),
        ("block_size 1", (3, 7), 1, 0.0, torch.float32),
        ("block_size larger than the row (one block)", (3, 6), 8, 0.0, torch.float32),
    ]
    cases = []
    for i, (kind, shape, b, shift, dtype) in enumerate(spec):
        Z = randn(*shape, seed=1200 + i, device=device, dtype=dtype) * 3 + shift
        rule = Rule.rows(Z, b)
        label = f"{kind}, {str(dtype).replace('torch.', '')} on {device.type}"
        cases.append(Case(label, (watched(Z, rule), b)))
    return cases


def _stats_variant(*, rescale=True, subtract=True, start=NEG_INF, drop_last=False, inverted=False):
    def stats(Z, block_size):
        batch = Z.shape[:-1]
        m = torch.full(batch, start, dtype=Z.dtype, device=Z.device)
        l = torch.zeros(batch, dtype=Z.dtype, device=Z.device)
        N = Z.shape[-1]
        stop = (N // block_size) * block_size if drop_last else N
        for s in range(0, stop, block_size):
            block = Z[..., s : s + block_size]
            m_new = torch.maximum(m, block.amax(dim=-1))
            if not subtract:
                l = l + torch.exp(block).sum(dim=-1)
            else:
                factor = torch.exp(m_new - m) if inverted else torch.exp(m - m_new)
                l = (l * factor if rescale else l) + torch.exp(block - m_new[..., None]).sum(dim=-1)
            m = m_new
        return m, l

    return stats


ONLINE_SOFTMAX_STATS = Exercise(
    reference=online_softmax_stats,
    expected=_in_float64(online_softmax_stats),
    cases=_stats_cases,
    compare=_compare_stats,
    traps=[
        Trap(
            "the running sum is not rescaled when the max changes",
            "What l holds was summed as exp(z - m_old); against the new max it is worth "
            "l * exp(m_old - m_new). Rescale l before adding the new block.",
            _stats_variant(rescale=False),
        ),
        Trap(
            "the rescale factor is upside down",
            "The max only grows, so the factor exp(m_old - m_new) is at most 1: it shrinks the old sum.",
            _stats_variant(inverted=True),
        ),
        Trap(
            "the running max is not subtracted (overflow)",
            "exp(1000) is inf in float32: add exp(z - m_new), never exp(z), and keep l as a sum against the max.",
            _stats_variant(subtract=False),
        ),
        Trap(
            "the running max started at 0 instead of -inf",
            "Rows whose entries are all below 0 never raise a max that starts at 0, and exp(-1000 - 0) "
            "underflows to 0: start m at -inf (torch.full(..., float('-inf'))).",
            _stats_variant(start=0.0),
        ),
        Trap(
            "the last partial block is dropped",
            "range(0, N, block_size) visits every block, the last one shorter when N is not a multiple; "
            "N // block_size blocks leave the tail out.",
            _stats_variant(drop_last=True),
        ),
        Trap(
            "the whole row was read at once",
            "The point is to read Z one block at a time (Z[..., start:start + block_size]), as if the rest "
            "had not arrived yet: no amax, exp or sum over whole rows.",
            lambda Z, block_size: (lambda m: (m, torch.exp(Z - m[..., None]).sum(dim=-1)))(Z.amax(dim=-1)),
        ),
    ],
)

# ------------------------------------------------------------ tiled_attention check


def _compare_tiled(expected, got, label: str) -> str | None:
    problem = compare_tensor(_plain(expected), _plain(got), "O", _tolerances(label))
    return problem or _notes_differ(expected, got, "tiled_attention")


def _near_1000(Q: torch.Tensor, K: torch.Tensor, shift: float = 1000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Append one feature that adds ``shift`` to every score: S = (q.k + shift sqrt(d)) / sqrt(d)."""
    d = Q.shape[-1] + 1
    ones = torch.ones(*Q.shape[:-1], 1, dtype=Q.dtype, device=Q.device)
    lift = torch.full((*K.shape[:-1], 1), shift * math.sqrt(d), dtype=K.dtype, device=K.device)
    return torch.cat([Q, ones], -1), torch.cat([K, lift], -1)


def _tiled_cases(device: torch.device) -> list[Case]:
    # label, batch, T_q, T_k, d_k, d_v, block_size, causal, dtype
    spec = [
        (
            "2-D, T_q = 6, T_k = 11, block_size 4 (last block partial)",
            (),
            6,
            11,
            4,
            3,
            4,
            False,
            torch.float32,
        ),
        ("3-D causal self-attention, T = 13, block_size 5", (2,), 13, 13, 4, 3, 5, True, torch.float64),
        ("4-D (batch, heads), T_q = 7, T_k = 16, block_size 4", (2, 3), 7, 16, 5, 6, 4, False, torch.float32),
        ("4-D causal, T = 12, block_size 5", (2, 3), 12, 12, 5, 7, 5, True, torch.float32),
        ("3-D, every score near +1000 (overflow test)", (2,), 6, 9, 4, 3, 3, False, torch.float32),
        ("3-D, block_size 1", (2,), 5, 7, 4, 3, 1, False, torch.float64),
        ("3-D, block_size larger than T_k (one block)", (2,), 5, 6, 4, 3, 8, False, torch.float32),
        # every score about -1000: exp(s - m) underflows to 0 unless m is a score of the row
        ("3-D, every score near -1000 (underflow test)", (2,), 7, 10, 4, 3, 4, False, torch.float32),
        ("4-D causal, every score near -1000 (underflow test)", (2, 3), 9, 9, 4, 6, 4, True, torch.float64),
    ]
    cases = []
    for i, (kind, batch, T_q, T_k, d_k, d_v, b, causal, dtype) in enumerate(spec):
        Q = randn(*batch, T_q, d_k, seed=1300 + i, device=device, dtype=dtype)
        K = randn(*batch, T_k, d_k, seed=1310 + i, device=device, dtype=dtype)
        V = randn(*batch, T_k, d_v, seed=1320 + i, device=device, dtype=dtype)
        if "near +1000" in kind:
            Q, K = _near_1000(Q, K)
        elif "near -1000" in kind:
            Q, K = _near_1000(Q, K, shift=-1000.0)
        rule = Rule.scores(Q, K, V, b)
        args = tuple(watched(t, rule) for t in (Q, K, V)) + (b,)
        label = f"{kind}, {str(dtype).replace('torch.', '')} on {device.type}"
        cases.append(Case(label, args, {"causal": True} if causal else {}))
    return cases


def _tiled_variant(
    *,
    rescale=True,
    subtract=True,
    divide_inside=False,
    drop_last=False,
    local=False,
    scale=True,
    m_start=NEG_INF,
):
    def attention(Q, K, V, block_size, causal=False):
        T_q, T_k = Q.shape[-2], K.shape[-2]
        m = torch.full((*Q.shape[:-1], 1), m_start, dtype=Q.dtype, device=Q.device)
        l = torch.zeros((*Q.shape[:-1], 1), dtype=Q.dtype, device=Q.device)
        acc = torch.zeros((*Q.shape[:-1], V.shape[-1]), dtype=Q.dtype, device=Q.device)
        rows = torch.arange(T_q, device=Q.device)[:, None]
        stop = (T_k // block_size) * block_size if drop_last else T_k
        for start in range(0, stop, block_size):
            K_b, V_b = K[..., start : start + block_size, :], V[..., start : start + block_size, :]
            S_b = Q @ K_b.transpose(-2, -1) / (math.sqrt(Q.shape[-1]) if scale else 1.0)
            if causal:
                first = 0 if local else start
                cols = torch.arange(first, first + K_b.shape[-2], device=Q.device)[None, :]
                S_b = S_b.masked_fill(cols > rows, NEG_INF)
            m_new = torch.maximum(m, S_b.amax(dim=-1, keepdim=True))
            if subtract:
                alpha, P = torch.exp(m - m_new), torch.exp(S_b - m_new)
            else:
                alpha, P = torch.ones_like(m), torch.exp(S_b)
            if not rescale:
                alpha = torch.ones_like(m)
            l = alpha * l + P.sum(dim=-1, keepdim=True)
            acc = alpha * acc + P @ V_b
            if divide_inside:  # acc becomes an average, yet the next block treats it as a sum again
                acc = acc / l
            m = m_new
        return acc if divide_inside else acc / l

    return attention


TILED_ATTENTION = Exercise(
    reference=tiled_attention,
    expected=_in_float64(tiled_attention),
    cases=_tiled_cases,
    compare=_compare_tiled,
    traps=[
        Trap(
            "the running sum and output are not rescaled when the max changes",
            "When the running max grows from m to m_new, everything summed so far (l and the output "
            "accumulator) was weighted by exp(s - m): multiply both by exp(m - m_new) before adding the block.",
            _tiled_variant(rescale=False),
        ),
        Trap(
            "the running max is not subtracted (overflow)",
            "exp of a score near 1000 is inf in float32: weight a block by exp(S_b - m_new), "
            "and rescale what came before by exp(m - m_new).",
            _tiled_variant(subtract=False),
        ),
        Trap(
            "the running max started at 0 instead of -inf",
            "When every score of a row is below 0 (say -1000), a max that starts at 0 never moves, "
            "exp(-1000 - 0) underflows to 0 and acc / l is 0 / 0: start m at -inf "
            "(torch.full(..., float('-inf'))).",
            _tiled_variant(m_start=0.0),
        ),
        Trap(
            "the output was divided by the sum inside the loop",
            "Once divided, acc is an average, not a sum, and the next block adds unnormalised terms to it: "
            "keep acc a sum and divide once, at the end (acc / l).",
            _tiled_variant(divide_inside=True),
        ),
        Trap(
            "the last partial block is dropped",
            "range(0, T_k, block_size) visits every block, the last one shorter when T_k is not a multiple "
            "of block_size; T_k // block_size blocks leave the last keys out.",
            _tiled_variant(drop_last=True),
        ),
        Trap(
            "the causal mask uses positions inside the block",
            "Key j of the block starting at `start` is key start + j of the sequence: compare query "
            "positions with torch.arange(start, start + block length).",
            _tiled_variant(local=True),
        ),
        Trap(
            "the scores are not scaled",
            "Divide Q K_b^T by sqrt(d_k) (Q.shape[-1]), in every block.",
            _tiled_variant(scale=False),
        ),
        Trap(
            "the full score matrix was formed",
            "Compute the scores one block of keys at a time, (..., T_q, block_size), so memory grows "
            "like T, not T^2. Never compute Q @ K^T for all keys at once.",
            lambda Q, K, V, block_size, causal=False: plain_attention(Q, K, V, causal),
        ),
        Trap(
            "scaled_dot_product_attention was called",
            "The exercise is to write the loop yourself; compare with scaled_dot_product_attention "
            "afterwards, in the lesson's explore section.",
            lambda Q, K, V, block_size, causal=False: F.scaled_dot_product_attention(
                Q, K, V, is_causal=causal
            ),
        ),
    ],
)

EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (ONLINE_SOFTMAX_STATS, TILED_ATTENTION)}
