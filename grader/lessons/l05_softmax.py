"""Lesson 05, softmax: ``softmax`` and ``soft_lookup``: hidden reference, seeded cases, known mistakes.

Device-agnostic: every tensor result lives on the device, and keeps the dtype, of its inputs; any
leading batch dimensions are accepted, ``(..., T, d)``.
"""

from __future__ import annotations

import math

import torch

from grader.harness import Case, Exercise, Trap
from grader.lessons._common import (
    NEG_INF,
    TK,
    TQ,
    B,
    batches,
    dtypes,
    gen,
    label,
    randn,
    same_mistake,
    uniform,
)
from grader.lessons.l04_masking import apply_mask, causal_mask


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


# ----------------------------------------------------------------- seeded cases and mistakes


def _softmax_cases(device: torch.device) -> list[Case]:
    cases = []
    for i, (kind, batch) in enumerate(batches()):
        for dtype in dtypes(batch):
            Z = randn(*batch, TQ, TK, seed=500 + i, device=device, dtype=dtype) * 3
            cases.append(Case(label(kind, dtype, device), (Z,)))
    Z = randn(TQ, TK, seed=510, device=device)
    cases.append(Case(label("dim=-2 given explicitly", torch.float32, device), (Z,), {"dim": -2}))
    big = randn(B, TQ, TK, seed=511, device=device) + 1000
    cases.append(Case(label("scores near 1000 (overflow test)", torch.float32, device), (big,)))
    levels = randn(TQ, TK, seed=512, device=device)
    levels[0] += 1000  # one row far above the others
    cases.append(Case(label("rows at very different levels", torch.float32, device), (levels,)))
    masked = apply_mask(randn(B, TQ, TQ, seed=513, device=device), causal_mask(TQ, device))
    cases.append(
        Case(label("causally masked scores (-inf above the diagonal)", torch.float32, device), (masked,))
    )
    dead = randn(TQ, TK, seed=514, device=device)
    dead[1] = NEG_INF
    dead[3, 2:] = NEG_INF
    cases.append(Case(label("a row that is all -inf", torch.float32, device), (dead,)))
    Z3 = randn(B, TQ, TK, seed=515, device=device, dtype=torch.float64)
    cases.append(Case(label("batched 3-D, dim=1 given explicitly", torch.float64, device), (Z3,), {"dim": 1}))
    cols = randn(B, TK, TK, seed=516, device=device)
    cols[:, :, 2] = NEG_INF  # along dim -2, column 2 has nothing to look at
    cases.append(
        Case(label("dim=-2 with a column that is all -inf", torch.float32, device), (cols,), {"dim": -2})
    )
    return cases


def _naive_softmax(Z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    e = torch.exp(Z)
    return e / e.sum(dim=dim, keepdim=True)


_OVERFLOW_HINT = "exp(1000) is inf and inf / inf is NaN: subtract each row's max before exp (it changes nothing mathematically)."


def _naive_softmax_guarded(Z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    e = torch.exp(Z)
    total = e.sum(dim=dim, keepdim=True)
    return torch.where(total > 0, e / total, 0)  # fully masked rows give 0; rows near 1000 still NaN


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
    # the same functions by other names (``attention_course.watch.CallWatch`` sees the C binding and the
    # aten operator as these, and fused attention kernels under private names as the last): private
    # aliases, softmin (a softmax of -Z), and attention, whose softmax of a mask is softmax(Z) @ I
    "torch._softmax",
    "torch._log_softmax",
    "torch.nn.functional.softmin",
    "torch.nn.functional.scaled_dot_product_attention",
    "torch._native_multi_head_attention",
    "torch._masked_softmax",
]


def _on_fixed_dim(fixed: int, name: str, hint: str, example: str) -> list[Trap]:
    """A softmax over dim ``fixed`` whatever dim says: with the guard for an all -inf row, and without."""
    return same_mistake(
        name,
        hint,
        (lambda Z, dim=-1: softmax(Z, dim=fixed), example),
        (lambda Z, dim=-1: _softmax_no_guard(Z, dim=fixed), example),
    )


SOFTMAX = Exercise(
    reference=softmax,
    cases=_softmax_cases,
    forbidden={name: SOFTMAX_RULE for name in SOFTMAX_FAMILY},
    traps=[
        *_on_fixed_dim(
            -2,
            "softmax over dim -2 (the queries) instead of the keys",
            "Each query's weights over the keys must sum to 1: normalise along dim (default -1).",
            example="m = Z.amax(dim=-2, keepdim=True)  # ... and sum(dim=-2)",
        ),
        *_on_fixed_dim(
            -1,
            "the dim argument is ignored (always the last axis)",
            "Use the dim you are given in amax and sum: softmax(Z, dim=-2) must normalise along dim -2.",
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
            _OVERFLOW_HINT,
            _naive_softmax,
            example="e = torch.exp(Z)\nreturn e / e.sum(dim=dim, keepdim=True)",
        ),
        Trap(  # the same, with fully masked rows guarded
            "naive softmax that overflows",
            _OVERFLOW_HINT,
            _naive_softmax_guarded,
            example="e = torch.exp(Z)\ns = e.sum(dim=dim, keepdim=True)\nreturn torch.where(s > 0, e / s, 0)",
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


def _at(angle: float, length: float) -> list[float]:
    """A 2-D key or query: ``length`` along ``angle`` (radians from the first axis), to 3 decimals."""
    return [round(length * math.cos(angle), 3) + 0.0, round(length * math.sin(angle), 3) + 0.0]  # no -0.0


def _colours(g: torch.Generator) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """The lesson's soft dictionary of colours, its numbers drawn with g but its meaning kept: red's key
    points along the first axis, green's along the second, orange's between them (as [0.8, 0.6] does),
    each about unit length; the values are (red, green) channels, 0 .. 255, of each colour."""
    orange = math.atan2(0.6, 0.8)
    keys = {
        name: _at(angle + uniform(g, -0.1, 0.1), uniform(g, 0.85, 1.15))
        for name, angle in (("red", 0.0), ("green", math.pi / 2), ("orange", orange))
    }
    channels = {
        "red": ((200, 255), (0, 40)),
        "green": ((0, 40), (200, 255)),
        "orange": ((220, 255), (130, 190)),
    }
    values = {name: [float(round(uniform(g, lo, hi))) for lo, hi in both] for name, both in channels.items()}
    return keys, values


def _colour_cases(device: torch.device) -> list[Case]:
    # every number is drawn (afresh for each submission while graded, see _common.salted): no table of
    # answers learnt from one attempt fits the next. Each case keeps its purpose: three levels of
    # sharpness, a query near green, orange's key doubled, a sharpness that overflows a naive math.exp.
    g = gen(517)
    keys, values = _colours(g)
    near_red = _at(uniform(g, 0.0, 0.2), uniform(g, 0.9, 1.1))  # as [1.0, 0.1]
    near_green = _at(math.pi / 2 + uniform(g, -0.1, 0.1), uniform(g, 0.9, 1.1))
    long_orange = dict(keys, orange=[2 * x for x in keys["orange"]])
    sharp = [round(uniform(g, lo, hi), 2) for lo, hi in ((0.5, 2.0), (3.0, 8.0), (15.0, 40.0))]
    middle = [round(uniform(g, 3.0, 8.0), 2) for _ in range(2)]
    # red's score is at least 0.7 / sqrt(2) of this (both about unit length, at most 0.3 rad apart):
    # above 1200, far past the 709.8 where math.exp overflows
    overflow = float(round(uniform(g, 2500.0, 6000.0)))
    # 3-D keys with one key of zeros (a score of 0 whatever the query), 1-D values
    draw = torch.randn(5, 3, generator=g, dtype=torch.float64)
    rows = [[round(float(x), 3) for x in row] for row in draw.tolist()]
    three = {"a": rows[0], "b": rows[1], "c": rows[2], "d": [0.0, 0.0, 0.0]}
    three_v = {name: [round(uniform(g, 0.0, 10.0), 2)] for name in three}
    three_sharp = round(uniform(g, 1.0, 3.0), 2)
    cases = [
        Case(f"colours, a query near red {near_red}, sharpness {s:g}", (near_red, keys, values, s))
        for s in sharp
    ]
    cases += [
        Case(
            f"colours, a query near green {near_green}, sharpness {middle[0]:g}",
            (near_green, keys, values, middle[0]),
        ),
        Case(
            f"colours, orange's key doubled, sharpness {middle[1]:g}",
            (near_red, long_orange, values, middle[1]),
        ),
        Case(f"colours, sharpness {overflow:g} (overflow test)", (near_red, keys, values, overflow)),
        Case(
            f"3-D keys (one of zeros), 1-D values, sharpness {three_sharp:g}",
            (rows[3], three, three_v, three_sharp),
        ),
    ]
    # drawn afresh for each submission while graded (see _common.salted): no table of answers fits
    for i, (d, n, width, sharpness) in enumerate([(4, 5, 3, 3.0), (6, 3, 2, 0.5)]):
        draw = torch.randn(1 + 2 * n, max(d, width), generator=gen(520 + i), dtype=torch.float64)
        rows = [[round(float(x), 3) for x in row] for row in draw.tolist()]
        names = [f"item{j}" for j in range(n)]
        cases.append(
            Case(
                f"{d}-D random keys, {n} items, sharpness {sharpness:g}",
                (
                    rows[0][:d],
                    {name: rows[1 + j][:d] for j, name in enumerate(names)},
                    {name: rows[1 + n + j][:width] for j, name in enumerate(names)},
                    sharpness,
                ),
            )
        )
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
    reference=soft_lookup,
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
            example="score = sharpness * dot",
        ),
        Trap(
            "sharpness divides instead of multiplies",
            "Higher sharpness must make the weights more peaked: multiply the scores by it.",
            _lookup_variant(lambda s, d: 1 / (s * math.sqrt(d))),
            example="score = dot / (sharpness * math.sqrt(d))",
        ),
        Trap(
            "naive softmax that overflows",
            "math.exp of a large score overflows: subtract the largest score before exp.",
            _lookup_variant(lambda s, d: s / math.sqrt(d), stable=False),
            example="exps = {n: math.exp(s) for n, s in scores.items()}",
        ),
    ],
)


EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (SOFTMAX, SOFT_LOOKUP)}
