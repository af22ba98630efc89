"""Lesson 04, masking: ``causal_mask``, ``padding_mask``, ``apply_mask``: reference, cases, known mistakes.

Device-agnostic: every tensor result lives on the device, and keeps the dtype, of its inputs; any
leading batch dimensions are accepted, ``(..., T, d)``.
"""

from __future__ import annotations

import torch

from grader.harness import Case, Exercise, Trap
from grader.lessons._common import NEG_INF, TK, TQ, B, H, gen, integer, label, randn, shuffled


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


# ----------------------------------------------------------------- seeded cases and mistakes

# Device-following is checked on the device of the cases (CUDA when there is one) and, for the
# CPU's cases, again on PyTorch's 'meta' device, which stands in for a GPU on every machine
# (grader.harness._on_meta): a mask made on the wrong device loses the same points wherever it
# is graded. A correct mask built with a Python loop (int(lengths[b]), .item(), printing it)
# cannot run on 'meta' and is not judged there.


def _causal_cases(device: torch.device) -> list[Case]:
    # the sizes are drawn (afresh for each submission while graded, see _common.salted): no table of
    # masks learnt from one attempt fits the next. T = 1, a single token, stays: the edge case every
    # mask must get right, and a table of that one mask passes none of the drawn ones.
    g = gen(405)
    two, three, given_as_string, not_given = (integer(g, 2, 32) for _ in range(4))
    cases = [Case(f"T = {T}, device={device.type}", (T,), {"device": device}) for T in (two, three, 1)]
    cases.append(
        Case(
            f"T = {given_as_string}, device='{device.type}' given as a string",
            (given_as_string,),
            {"device": device.type},
        )
    )
    cases.append(Case(f"T = {not_given}, device not given (CPU)", (not_given,)))
    return cases


CAUSAL_MASK = Exercise(
    reference=causal_mask,
    cases=_causal_cases,
    traps=[
        Trap(
            "the mask polarity is inverted (True = blocked)",
            "In this course True means 'may look', as in scaled_dot_product_attention: "
            "allowed where j <= i, i.e. torch.tril.",
            lambda T, device=None: ~causal_mask(T, device),
            example="return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)",
        ),
        Trap(
            "the upper triangle instead of the lower one (j >= i)",
            "Row i is the query: it may look at keys j <= i, the past and itself (torch.tril).",
            lambda T, device=None: causal_mask(T, device).T.contiguous(),
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
            lambda T, device=None: causal_mask(T),
            example="return torch.ones(T, T, dtype=torch.bool).tril()",
        ),
        Trap(
            "a numeric mask instead of a boolean one",
            "Return dtype torch.bool: True where looking is allowed.",
            lambda T, device=None: causal_mask(T, device).float(),
            example="return torch.ones(T, T, device=device).tril()",
        ),
    ],
)


def _padding_spec(g: torch.Generator) -> list[tuple[list[int], int]]:
    """(lengths, T) of each case: each keeps its structure (which sequences are full, partly padded,
    empty), its sizes, lengths and order drawn with g."""
    mixed, short, single, empty, none = (
        integer(g, lo, hi) for lo, hi in ((4, 9), (5, 10), (2, 9), (3, 8), (2, 12))
    )
    return [
        # one full sequence, one partly padded, one of a single token
        (shuffled(g, [integer(g, 2, mixed - 1), mixed, 1]), mixed),
        # every sequence partly padded, none full
        ([integer(g, 1, short - 1) for _ in range(2)], short),
        # one sequence, no padding at all
        ([single], single),
        # an empty sequence next to a full one and two partly padded ones
        (shuffled(g, [0, empty, integer(g, 1, empty - 1), integer(g, 1, empty - 1)]), empty),
        # nothing but padding (every length 0): the edge case whose structure is its point; its sizes drawn
        ([0] * integer(g, 2, 4), none),
    ]


def _padding_cases(device: torch.device) -> list[Case]:
    spec = _padding_spec(gen(406))
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
    reference=padding_mask,
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
            _padding_fn(lambda p, n: p < n, device_of_lengths=False),
            example="return (torch.arange(T) < lengths[:, None])[:, None, :]",
        ),
    ],
)


def _mask_cases(device: torch.device) -> list[Case]:
    S2 = randn(TQ, TK, seed=400, device=device)
    allowed2 = torch.rand(TQ, TK, generator=gen(401)).to(device) > 0.4
    allowed2[:, 0] = True
    S3 = randn(B, TQ, TQ, seed=402, device=device, dtype=torch.float64)
    S4 = randn(B, H, TQ, TK, seed=403, device=device)
    # padding masks of a full sequence and a partly padded one, the length and the order drawn; the
    # causal masks' structure is their point and their size is the scores' (fixed), their scores drawn
    g = gen(407)
    lengths = [shuffled(g, [TK, integer(g, 1, TK - 1)]) for _ in range(2)]
    pad = padding_mask(torch.tensor(lengths[0], device=device), TK)[:, None]  # (B, 1, 1, TK)
    # scores a causal mask already hid, then a padding mask on top (masks applied one after the other)
    twice = apply_mask(randn(B, TK, TK, seed=404, device=device), causal_mask(TK, device))
    pad3 = padding_mask(torch.tensor(lengths[1], device=device), TK)  # (B, 1, TK)
    return [
        Case(label("2-D scores, random mask", torch.float32, device), (S2, allowed2)),
        Case(
            label("batched 3-D scores, causal mask (T, T)", torch.float64, device),
            (S3, causal_mask(TQ, device)),
        ),
        Case(label("4-D scores, padding mask (B, 1, 1, T_k)", torch.float32, device), (S4, pad)),
        Case(
            label("scores already holding -inf, then a padding mask (B, 1, T)", torch.float32, device),
            (twice, pad3),
        ),
    ]


APPLY_MASK = Exercise(
    reference=apply_mask,
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
            "the mask polarity is inverted, and the fill is -1e9 instead of -inf",
            "True means 'may look': fill where allowed is False, and with -inf (the idiom (1 - mask) * -1e9 "
            "comes from code where 1 = blocked).",
            lambda S, allowed: S + allowed.to(S.dtype) * -1e9,
            example="return S + allowed.float() * -1e9",
        ),
    ],
)


EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (CAUSAL_MASK, PADDING_MASK, APPLY_MASK)}
