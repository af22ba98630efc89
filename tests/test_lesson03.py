"""Lesson 03 (scaling): the brief's numbers are computed in the notebook, and grading names the traps."""

from __future__ import annotations

import math

import pytest
import torch

import grader
from grader import course
from tests import wrong_versions
from tests.nbtools import ROOT, cell_error, solution_sources
from tests.solutions import read_solution
from tests.tensors import rounded

pytestmark = pytest.mark.slow
LESSON = "03_scaling"
SCALED = "return Q @ K.transpose(-2, -1) / math.sqrt(d_k)"
SPREAD = "return dots.std().item(), (dots / math.sqrt(d_k)).std().item()"


# `name = expression` lines: each expression is read back from the solution notebook once it has run
NOTEBOOK_VALUES = """
d_k = d_k
S = S
by_hand = S[1, 1].item() / math.sqrt(3)
S_scaled = S_scaled
S_fn = scaled_scores(Q, K)
love_raw = weights_raw
love_scaled = weights_scaled
spreads = {str(d): list(v) for d, v in spreads.items()}
saturation = {str(d): v for d, v in saturation.items()}
entropy_raw = entropy_raw
entropy_scaled = entropy_scaled
head_sizes = head_sizes
"""


def test_scaling_numbers_from_the_brief():
    values = read_solution(LESSON, NOTEBOOK_VALUES)
    assert values["d_k"] == 3
    assert values["S"] == [[2, 4, 4], [4, 16, 12], [4, 12, 10]]
    assert round(values["by_hand"], 2) == 9.24
    scaled = [[1.15, 2.31, 2.31], [2.31, 9.24, 6.93], [2.31, 6.93, 5.77]]
    assert rounded(values["S_scaled"]) == scaled
    assert rounded(values["S_fn"]) == scaled
    # the "love" row: about [0.00, 0.98, 0.02] without scaling, [0.00, 0.91, 0.09] with it
    assert [round(w, 2) for w in values["love_raw"]] == [0.00, 0.98, 0.02]
    assert [round(w, 2) for w in values["love_scaled"]] == [0.00, 0.91, 0.09]

    # spread: raw near sqrt(d_k), scaled near 1; d_k = 64 about 8 times d_k = 1
    spreads = values["spreads"]
    for d, (raw, scaled_std) in spreads.items():
        assert raw == pytest.approx(math.sqrt(int(d)), rel=0.05), (d, raw)
        assert scaled_std == pytest.approx(1.0, rel=0.05), (d, scaled_std)
    assert spreads["64"][0] / spreads["1"][0] == pytest.approx(8.0, rel=0.05)
    for d, (raw, scaled_std) in spreads.items():  # scaling divides the spread by sqrt(d_k), no more, no less
        assert raw / scaled_std == pytest.approx(math.sqrt(int(d)), rel=1e-6), (d, raw, scaled_std)

    # unscaled rows saturate as d_k grows (entropy towards 0, top weight towards 1, gradient shrinks);
    # scaled rows stay as at d_k = 1
    saturation = values["saturation"]
    # what scaling changes grows with d_k: nothing at d_k = 1, more and more after that
    gaps = [saturation[d][1][1] - saturation[d][0][1] for d in ("1", "4", "16", "64", "128")]
    assert abs(gaps[0]) < 1e-9 and gaps == sorted(gaps) and gaps[1] > 0.1, gaps
    # scaled, every d_k looks like d_k = 1 (top weight and entropy within sampling noise)
    top1, h1, _ = saturation["1"][1]
    for d in ("4", "16", "64", "128"):
        top_s, h_s, _ = saturation[d][1]
        assert abs(top_s - top1) < 0.1 and abs(h_s - h1) < 0.25, (d, saturation[d][1], saturation["1"][1])
    (top64, h64, g64), (top64s, h64s, g64s) = values["saturation"]["64"]
    assert top64 > 0.8 and top64s < 0.3
    assert h64 < 0.5 < 2.0 < h64s
    assert g64 < 0.3 * g64s
    assert values["saturation"]["128"][0][1] < h64  # and worse still at 128
    entropy_raw, entropy_scaled = values["entropy_raw"], values["entropy_scaled"]
    assert values["head_sizes"][0] == 1 and values["head_sizes"][-1] == 256
    assert entropy_raw[0] == pytest.approx(entropy_scaled[0])
    assert entropy_raw == sorted(entropy_raw, reverse=True) and entropy_raw[-1] < 0.3
    assert min(entropy_scaled) > 2.0  # log 16 = 2.77 is uniform


@pytest.mark.parametrize(
    "implementation",
    [
        lambda Q, K: Q @ K.mT * Q.shape[-1] ** -0.5,
        lambda Q, K: (Q / math.sqrt(Q.size(-1))) @ K.swapaxes(-1, -2),
        lambda Q, K: torch.einsum("...qd,...kd->...qk", Q, K) / math.sqrt(K.shape[-1]),
        lambda Q, K: Q @ K.transpose(-2, -1) / torch.sqrt(torch.tensor(Q.shape[-1])),
    ],
    ids=["pow", "scale-Q-first", "einsum", "tensor-sqrt"],
)
def test_other_correct_scaled_scores_pass_the_hidden_check(implementation):
    grader.check("scaled_scores", implementation)


def _spread_with(dot_products):
    def score_spread(d_k, n, generator):
        q = torch.randn(n, d_k, generator=generator)
        k = torch.randn(n, d_k, generator=generator)
        dots = dot_products(q, k)
        return dots.std().item(), (dots / math.sqrt(d_k)).std().item()

    return score_spread


@pytest.mark.parametrize(
    "dot_products",
    [torch.linalg.vecdot, lambda q, k: torch.einsum("nd,nd->n", q, k)],
    ids=["vecdot", "einsum"],
)
def test_other_correct_score_spreads_pass_the_hidden_check(dot_products):
    grader.check("score_spread", _spread_with(dot_products))


# Each submission pairs a scaled_scores and a score_spread (right or wrong) to keep the nbgrader runs few.
# name: (scaled_scores line, its visible points (shapes, values), its diagnosis or None,
#        score_spread line, its visible points, its diagnosis or None)
SUBMISSIONS = {
    "by_d_k": (
        "return Q @ K.transpose(-2, -1) / d_k",
        (1, 0),
        "divided by d_k instead of sqrt(d_k)",
        SPREAD,
        2,
        None,
    ),
    "shape_1": (
        "return Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[1])",
        (1, 2),
        "d_k read with shape[1] instead of shape[-1]",
        "return dots.std().item(), (dots / d_k).std().item()",
        0,
        "the scaled std divides by d_k instead of sqrt(d_k)",
    ),
    "sqrt_3": (
        "return Q @ K.transpose(-2, -1) / math.sqrt(3)",
        (1, 0),
        "a hard-coded divisor (sqrt(3), the d_k of 'I love cats')",
        "return dots.std().item(), dots.std().item()",
        0,
        "the scaled std is not scaled",
    ),
    "unscaled": (
        "return Q @ K.transpose(-2, -1)",
        (1, 0),
        "no scaling at all",
        SPREAD.replace("dots.std()", "torch.std(dots)"),
        2,
        None,
    ),
}


@pytest.mark.parametrize("name", list(SUBMISSIONS))
def test_traps_lose_hidden_points_and_are_named(name, built_course):
    scaled_line, (shapes, values), scaled_diagnosis, spread_line, spread_visible, spread_diagnosis = (
        SUBMISSIONS[name]
    )
    sources = solution_sources(LESSON)
    answers = {
        "ex03_scaled_scores": sources["ex03_scaled_scores"].replace(SCALED, scaled_line),
        "ex03_score_spread": sources["ex03_score_spread"].replace(SPREAD, spread_line),
    }
    assert answers["ex03_scaled_scores"] != sources["ex03_scaled_scores"]
    assert SPREAD in sources["ex03_score_spread"]
    student = f"trap_{name}"
    grades = wrong_versions.grade(LESSON, student, answers, built_course, with_solutions=False)["grades"]
    graded = course.autograded_path(LESSON, student)

    assert grades["test03_scaled_scores_shapes"] == (shapes, 1)
    assert grades["test03_scaled_scores_values"] == (values, 2)
    assert grades["test03_scaled_scores_hidden"] == (0, 4)
    message = cell_error(graded, "test03_scaled_scores_hidden")
    assert f"Diagnosis: {scaled_diagnosis}." in message, message

    assert grades["test03_score_spread_d64"] == (spread_visible, 2)
    if spread_diagnosis is None:
        assert grades["test03_score_spread_hidden"] == (3, 3)
    else:
        assert grades["test03_score_spread_hidden"] == (0, 3)
        message = cell_error(graded, "test03_score_spread_hidden")
        assert f"Diagnosis: {spread_diagnosis}." in message, message


def test_different_correct_implementations_get_full_marks(built_course):
    sources = solution_sources(LESSON)
    answers = {
        "ex03_scaled_scores": sources["ex03_scaled_scores"].replace(
            SCALED, "return torch.matmul(Q / d_k**0.5, K.swapaxes(-1, -2))"
        ),
        "ex03_score_spread": sources["ex03_score_spread"].replace(
            SPREAD, "return float(torch.linalg.vecdot(q, k).std()), float((dots * d_k**-0.5).std())"
        ),
    }
    assert all(answers[k] != sources[k] for k in answers)
    result = wrong_versions.assert_full_marks(LESSON, "different", answers, built_course)
    assert result["max_score"] == 12


def test_score_spread_is_defined_above_every_check():
    """The explorer needs score_spread: its definition sits above every check cell that could stop Run All."""
    import nbformat

    cells = nbformat.read(ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", as_version=4).cells
    ids = [c.get("id") for c in cells]
    checks = [i for i, c in enumerate(cells) if c.metadata.get("nbgrader", {}).get("grade")]
    assert ids.index("ex03_score_spread") < min(checks) < ids.index("explore03-1")
