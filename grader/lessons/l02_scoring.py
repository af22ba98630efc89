"""Lesson 02, scoring: the hidden reference of ``scores``, its seeded cases and known mistakes.

Device-agnostic: every tensor result lives on the device, and keeps the dtype, of its inputs; any
leading batch dimensions are accepted, ``(..., T, d)``.
"""

from __future__ import annotations

import torch

from grader.harness import Case, Exercise, Trap
from grader.lessons._common import DK, TK, TQ, batches, dtypes, label, randn


def scores(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Dot product of every query with every key.

    Shapes: Q (..., T_q, d_k), K (..., T_k, d_k) -> S (..., T_q, T_k).
    """
    return Q @ K.transpose(-2, -1)


# ----------------------------------------------------------------- seeded cases and mistakes


def qk_cases(device: torch.device, seed: int = 100) -> list[Case]:
    cases = []
    for i, (kind, batch) in enumerate(batches()):
        for dtype in dtypes(batch):
            Q = randn(*batch, TQ, DK, seed=seed + i, device=device, dtype=dtype)
            K = randn(*batch, TK, DK, seed=seed + 10 + i, device=device, dtype=dtype)
            cases.append(Case(label(kind + ", T_q != T_k", dtype, device), (Q, K)))
    return cases


SCORES = Exercise(
    reference=scores,
    cases=qk_cases,
    traps=[
        Trap(
            "K Q^T instead of Q K^T",
            "S[i, j] is query i against key j: rows are queries, so S = Q @ K^T, shape (T_q, T_k).",
            lambda Q, K: K @ Q.transpose(-2, -1),
            example="return K @ Q.transpose(-2, -1)",
        ),
        Trap(
            "Q^T K instead of Q K^T",
            "Q^T K pairs up feature dimensions, not tokens; S = Q @ K^T is tokens x tokens.",
            lambda Q, K: Q.transpose(-2, -1) @ K,
            example="return Q.transpose(-2, -1) @ K",
        ),
        Trap(
            "K was not transposed",
            "S = Q @ K.transpose(-2, -1): each query row meets each key row.",
            lambda Q, K: Q @ K,
            example="return Q @ K",
        ),
        Trap(
            ".T on a batched tensor",
            "On more than 2 dimensions .T reverses all of them; use K.transpose(-2, -1) or K.mT.",
            lambda Q, K: Q @ K.T,
            example="return Q @ K.T",
        ),
        Trap(
            "transpose(0, 1) on a batched tensor",
            "Dimension 1 is only the last-but-one on 2-D tensors; transpose(-2, -1) works for any batch.",
            lambda Q, K: Q @ K.transpose(0, 1),
            example="return Q @ K.transpose(0, 1)",
        ),
    ],
)


EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (SCORES,)}
