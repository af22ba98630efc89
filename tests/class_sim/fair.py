"""Fair grades in the simulated class: correct code written other ways, and mistakes with their names.

Every correct variant must earn the lesson's full marks with no diagnosis; every mistake loses exactly
the checks of its own exercise (one mistake costs one exercise) and is named, or left unnamed, as said.
"""

from __future__ import annotations

from tests.class_sim.spec import ALL, Case
from tests.nbtools import solution_sources


def _with(lesson: str, **answers: str) -> dict[str, str]:
    """The model solution of a lesson with some exercises replaced."""
    return {**solution_sources(lesson), **answers}


def _tests(lesson: str, exercise: str) -> set[str]:
    from grader.classroom import lessons

    return {
        c.grade_id
        for c in lessons.lesson(lesson).tests
        if lessons.lesson(lesson).exercise_of(c.grade_id) == exercise
    }


NOISY_PROJECT = """import sys
import warnings

import torch


def project(X, W_q, W_k, W_v):
    print("debug: shapes", tuple(X.shape), file=sys.stderr)
    warnings.warn("a warning from the student's own code")
    return X @ W_q, X @ W_k, X @ W_v
"""

LOOP_PADDING = """import torch


def padding_mask(lengths, T):
    rows = []
    for b in range(lengths.shape[0]):
        n = int(lengths[b])
        rows.append([t < n for t in range(T)])
    return torch.tensor(rows, dtype=torch.bool, device=lengths.device)[:, None, :]
"""

ITEM_APPLY_MASK = """import torch


def apply_mask(S, allowed):
    out = S.clone()
    out[~allowed.expand_as(S)] = float("-inf")
    return out
"""

FLOAT64_SOFTMAX = """import torch


def softmax(Z, dim=-1):
    Z64 = Z.double()
    m = Z64.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = (Z64 - m).exp()
    s = e.sum(dim=dim, keepdim=True)
    return (e / s.clamp_min(1e-300)).to(Z.dtype)
"""

EINSUM_MIX = """import torch


def mix(A, V):
    return torch.einsum("...qk,...kd->...qd", A, V)
"""

CONSTANT_SPREAD = """import math


def score_spread(d_k, n, generator):
    return math.sqrt(d_k), 1.0
"""

TORCH_SOFTMAX = """import torch


def softmax(Z, dim=-1):
    return torch.softmax(Z, dim=dim).nan_to_num(0.0)
"""

UNSCALED_ATTENTION = """import torch


def attention(Q, K, V, mask=None):
    S = Q @ K.mT
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    A = torch.softmax(S, dim=-1).nan_to_num(0.0)
    return A @ V, A
"""

WRONG_LOSS = """import torch.nn.functional as F


def prev_token_loss(logits, tokens):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
"""


def cases() -> list[Case]:
    out = [
        Case(
            "f01_noisy",
            "01_projection",
            "correct, prints to stderr and warns",
            {"ex01_project": NOISY_PROJECT},
            score=7,
        ),
        Case(
            "f04_loop_padding",
            "04_masking",
            "padding_mask with a Python loop over lengths",
            _with("04_masking", ex04_padding_mask=LOOP_PADDING),
        ),
        Case(
            "f04_index_mask",
            "04_masking",
            "apply_mask by boolean indexing on a copy",
            _with("04_masking", ex04_apply_mask=ITEM_APPLY_MASK),
        ),
        Case(
            "f05_float64",
            "05_softmax",
            "softmax computed in float64 inside",
            _with("05_softmax", ex05_softmax=FLOAT64_SOFTMAX),
        ),
        Case("f06_einsum", "06_mixing", "mix with einsum", _with("06_mixing", ex06_mix=EINSUM_MIX)),
        Case(
            "f03_constant_spread",
            "03_scaling",
            "score_spread returns the textbook constants",
            _with("03_scaling", ex03_score_spread=CONSTANT_SPREAD),
            fails={"test03_score_spread_hidden"},
        ),
        Case(
            "f05_torch_softmax",
            "05_softmax",
            "softmax that calls torch.softmax",
            _with("05_softmax", ex05_softmax=TORCH_SOFTMAX),
            fails={"test05_softmax_hidden"},
        ),
        Case(
            "f07_wrong_attention",
            "07_one_head",
            "unscaled attention, the rest built on it correctly",
            _with("07_one_head", ex07_attention=UNSCALED_ATTENTION),
            # attention's own checks (its shapes are right) and the capstone, which checks your attention's
            # numbers on "The cat sat on the"; self_attention and cross_attention keep their points
            fails={
                "test07_attention_values",
                "test07_attention_sdpa",
                "test07_attention_hidden",
                "test07_capstone",
            },
            diagnoses={"test07_attention_hidden": "the scores are not scaled"},
        ),
        Case(
            "f10_wrong_loss",
            "10_learning",
            "a wrong loss, a correct training loop",
            _with("10_learning", ex10_prev_token_loss=WRONG_LOSS),
            fails=None,
        ),
    ]
    # what the student package ships is never an answer (the explorers' stand-ins are not callable as one)
    out.append(
        Case(
            "s01_helper_answer",
            "01_projection",
            "imports a former explorer built-in as its answer",
            {"ex01_project": "from attention_course.explorers.backend import builtin_project as project\n"},
            fails=ALL,
            flags=("uses the course's helper code as an answer",),
        )
    )
    for case in out:
        if case.fails is None:  # exactly the checks of the exercise that is wrong
            case.fails = _tests(case.lesson, {"f10_wrong_loss": "prev_token_loss"}[case.student])
    return out


__all__ = ["ALL", "cases"]
