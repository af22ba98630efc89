"""Lesson 01, projection: the hidden reference of ``project``, its seeded cases and known mistakes.

Device-agnostic: every tensor result lives on the device, and keeps the dtype, of its inputs; any
leading batch dimensions are accepted, ``(..., T, d)``.
"""

from __future__ import annotations

import torch

from grader.harness import Case, Exercise, Trap
from grader.lessons._common import DK, DM, DV, TQ, batches, dtypes, label, randn


def project(
    X: torch.Tensor, W_q: torch.Tensor, W_k: torch.Tensor, W_v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Project tokens into queries, keys and values.

    Shapes: X (..., T, d_model), W_q and W_k (d_model, d_k), W_v (d_model, d_v)
    -> Q, K (..., T, d_k), V (..., T, d_v).
    """
    return X @ W_q, X @ W_k, X @ W_v


# ----------------------------------------------------------------- seeded cases and mistakes


def _project_cases(device: torch.device) -> list[Case]:
    cases = []
    for i, (kind, batch) in enumerate(batches()):
        for dtype in dtypes(batch):
            X = randn(*batch, TQ, DM, seed=10 + i, device=device, dtype=dtype)
            W_q = randn(DM, DK, seed=20 + i, device=device, dtype=dtype)
            W_k = randn(DM, DK, seed=30 + i, device=device, dtype=dtype)
            W_v = randn(DM, DV, seed=40 + i, device=device, dtype=dtype)
            cases.append(Case(label(kind, dtype, device), (X, W_q, W_k, W_v)))
    return cases


PROJECT = Exercise(
    reference=project,
    cases=_project_cases,
    output_names=("Q", "K", "V"),
    traps=[
        Trap(
            "Q was computed with W_k",
            "Each role has its own matrix: Q = X @ W_q, K = X @ W_k, V = X @ W_v.",
            lambda X, W_q, W_k, W_v: (X @ W_k, X @ W_k, X @ W_v),
            example="Q = X @ W_k",
        ),
        Trap(
            "Q and K are swapped",
            "Q = X @ W_q is what a token looks for; K = X @ W_k is how it advertises itself.",
            lambda X, W_q, W_k, W_v: (X @ W_k, X @ W_q, X @ W_v),
            example="Q, K = X @ W_k, X @ W_q",
        ),
        Trap(
            "the matrices multiply from the wrong side",
            "Tokens are rows: X (T, d_model) @ W (d_model, d_k) gives (T, d_k).",
            lambda X, W_q, W_k, W_v: (W_q.mT @ X, W_k.mT @ X, W_v.mT @ X),
            example="Q = W_q.T @ X",
        ),
        Trap(
            "X was transposed to make the shapes fit (X.T @ W)",
            "Never transpose the data: tokens are rows, and X (..., T, d_model) @ W (d_model, d_k) already fits.",
            lambda X, W_q, W_k, W_v: (X.T @ W_q, X.T @ W_k, X.T @ W_v),
            example="Q = X.T @ W_q",
        ),
    ],
)


EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (PROJECT,)}
