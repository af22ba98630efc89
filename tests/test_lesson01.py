"""Lesson 01 computes the brief's numbers in front of the student."""

from __future__ import annotations

import re

import pytest

from tests.nbtools import ROOT, execute, run_and_read

pytestmark = pytest.mark.slow
NOTEBOOK = ROOT / "solutions" / "01_projection" / "01_projection.ipynb"


def test_projection_numbers_from_the_brief():
    values = run_and_read(
        NOTEBOOK,
        {
            "q_I": "q_I",
            "Q_proj": "project(X, W_q, W_k, W_v)[0]",
            "K": "project(X, W_q, W_k, W_v)[1]",
            "V": "project(X, W_q, W_k, W_v)[2]",
            "big": "tuple((Q_big @ K_big.T).shape)",
            "big_tied": "bool((Q_big == K_big).all())",
            "sat_q_the": "Q_s[4]",
        },
    )
    assert values["q_I"] == [1, 0, 2]
    assert values["Q_proj"] == [[1, 0, 2], [2, 2, 2], [2, 1, 3]]
    assert values["K"] == [[0, 1, 1], [4, 4, 0], [2, 3, 1]]
    assert values["V"] == [[1, 2, 3], [2, 8, 0], [2, 6, 3]]
    assert values["big"] == [10, 10]
    assert not values["big_tied"], "the shape demo should project Q and K with two different matrices"
    assert values["sat_q_the"] == [2, 0]  # a small word asks along query dimension 0


def _printed_matrix(text: str, name: str) -> list[list[float]]:
    """The rows of a tensor the notebook printed after '<name> (3, 3):'."""
    block = text.split(f"{name} (3, 3):", 1)[1].split("])", 1)[0]
    return [[float(x) for x in re.findall(r"-?\d+\.?\d*", row)] for row in block.split("]")[:3]]


def test_the_worked_example_prints_the_brief_s_Q_K_V():
    """The "all tokens at once" cell shows the student the Q, K and V of the course brief."""
    nb = execute(NOTEBOOK)
    cell = next(c for c in nb.cells if c.get("id") == "code-09")
    text = "".join(out.get("text", "") for out in cell.outputs)
    assert _printed_matrix(text, "Q") == [[1, 0, 2], [2, 2, 2], [2, 1, 3]]
    assert _printed_matrix(text, "K") == [[0, 1, 1], [4, 4, 0], [2, 3, 1]]
    assert _printed_matrix(text, "V") == [[1, 2, 3], [2, 8, 0], [2, 6, 3]]
