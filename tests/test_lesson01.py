"""Lesson 01 computes the brief's numbers in front of the student."""

from __future__ import annotations

import pytest

from tests.nbtools import ROOT, run_and_read

pytestmark = pytest.mark.slow


def test_projection_numbers_from_the_brief():
    values = run_and_read(
        ROOT / "solutions" / "01_projection" / "01_projection.ipynb",
        {
            "Q": "X @ W_q",
            "q_I": "q_I",
            "Q_proj": "project(X, W_q, W_k, W_v)[0]",
            "K": "project(X, W_q, W_k, W_v)[1]",
            "V": "project(X, W_q, W_k, W_v)[2]",
            "big": "tuple((Q_big @ K_big.T).shape)",
            "sat_q_the": "Q_s[4]",
        },
    )
    assert values["q_I"] == [1, 0, 2]
    assert values["Q"] == [[1, 0, 2], [2, 2, 2], [2, 1, 3]]  # the worked example's own X @ W_q
    assert values["Q_proj"] == [[1, 0, 2], [2, 2, 2], [2, 1, 3]]
    assert values["K"] == [[0, 1, 1], [4, 4, 0], [2, 3, 1]]
    assert values["V"] == [[1, 2, 3], [2, 8, 0], [2, 6, 3]]
    assert values["big"] == [10, 10]
    assert values["sat_q_the"] == [2, 0]  # a small word asks along query dimension 0
