"""Lesson 06, mixing: the hidden reference of ``mix``, its seeded cases and known mistakes.

Device-agnostic: every tensor result lives on the device, and keeps the dtype, of its inputs; any
leading batch dimensions are accepted, ``(..., T, d)``.
"""

from __future__ import annotations

import torch

from grader.harness import Case, Exercise, Trap
from grader.lessons._common import DV, TK, TQ, batches, dtypes, label, randn


def mix(A: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Each output row is the A-weighted average of the value rows.

    Shapes: A (..., T_q, T_k), V (..., T_k, d_v) -> O (..., T_q, d_v).
    """
    return A @ V


# ----------------------------------------------------------------- seeded cases and mistakes


def _mix_cases(device: torch.device) -> list[Case]:
    cases = []
    for i, (kind, batch) in enumerate(batches()):
        for dtype in dtypes(batch):
            A = torch.softmax(randn(*batch, TQ, TK, seed=600 + i, device=device, dtype=dtype), -1)
            V = randn(*batch, TK, DV, seed=610 + i, device=device, dtype=dtype)
            cases.append(Case(label(kind + ", T_q != T_k", dtype, device), (A, V)))
    return cases


MIX = Exercise(
    reference=mix,
    cases=_mix_cases,
    traps=[
        Trap(
            "the weights were returned instead of A V",
            "The weights say how much of each value row to take; the output is the blend: A @ V.",
            lambda A, V: A,
            example="return A",
        ),
        Trap(
            "the values were returned unmixed",
            "Each output row is a weighted average of value rows: O = A @ V.",
            lambda A, V: V,
            example="return V",
        ),
        Trap(
            "A^T V instead of A V",
            "Rows of A belong to queries: O = A @ V has one row per query.",
            lambda A, V: A.transpose(-2, -1) @ V,
            example="return A.mT @ V",
        ),
        Trap(
            "V @ A instead of A @ V",
            "Rows of A are queries and rows of V are keys' values: O = A @ V, (T_q, T_k) @ (T_k, d_v).",
            lambda A, V: V @ A,
            example="return V @ A",
        ),
    ],
)


EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (MIX,)}
