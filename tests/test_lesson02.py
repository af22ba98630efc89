"""Lesson 02 (scoring): the brief's numbers are computed in the notebook, and grading names the traps."""

from __future__ import annotations

import pytest
import torch

import grader
from grader import course
from tests import wrong_versions
from tests.nbtools import cell_error, solution_sources
from tests.solutions import read_solution

pytestmark = pytest.mark.slow
LESSON = "02_scoring"
SOLUTION = "return Q @ K.transpose(-2, -1)"


# `name = expression` lines: each expression is read back from the solution notebook once it has run
NOTEBOOK_VALUES = """
by_hand = score_love_cats
S = S
S_fn = scores(Q, K)
S_heat_map = S_cats
demo = [d_k, list(Q_demo.shape), list(K_demo.shape), list((Q_demo @ K_demo.T).shape)]
milk_tokens = milk.tokens
milk_dtype = str(S_tied.dtype)
gap_tied = float(gap_tied)
gap_separate = float(gap_separate)
tied = [float(S_tied[i_milk, i_poured]), float(S_tied[i_poured, i_milk])]
separate = [float(S_separate[i_milk, i_poured]), float(S_separate[i_poured, i_milk])]
gap_float32 = (S_t - S_t.T).abs().max().item()
milk_heat_map = list(S_milk.shape)
tied_weights = [float(A_tied[i_milk, i_poured]), float(A_tied[i_poured, i_milk])]
tied_weights_gap = float(np.abs(A_tied - A_tied.T).max())
tied_weights_rows = A_tied.sum(axis=1)
"""


def test_scoring_numbers_from_the_brief():
    values = read_solution(LESSON, NOTEBOOK_VALUES)
    S = [[2, 4, 4], [4, 16, 12], [4, 12, 10]]
    assert values["by_hand"] == 12  # "love" asking, "cats" answering, by hand
    assert values["S"] == S
    assert values["S_fn"] == S
    assert values["S_heat_map"] == S  # the explore section drew the student's own scores
    # S is tokens x tokens whatever d_k is, and T_q may differ from T_k
    assert values["demo"] == [512, [2, 512], [5, 512], [2, 5]]
    # tied W_q = W_k: exactly symmetric in NumPy float64; separate matrices: clearly not
    assert values["milk_tokens"] == ["i", "poured", "milk", "into", "the", "cup"]
    assert values["milk_dtype"] == "float64"
    assert values["gap_tied"] == 0.0
    assert values["gap_separate"] == pytest.approx(2.899, abs=1e-3)
    milk_to_poured, poured_to_milk = values["tied"]
    assert milk_to_poured == poured_to_milk
    milk_to_poured, poured_to_milk = values["separate"]
    assert milk_to_poured == pytest.approx(-0.5995, abs=1e-4)
    assert poured_to_milk == pytest.approx(-3.4985, abs=1e-4)
    # float32 rounding only: tiny but shown honestly
    assert 0 <= values["gap_float32"] < 1e-5
    assert values["milk_heat_map"] == [6, 6]
    # tied scores are symmetric, the weights are not: each row is normalised on its own
    assert values["tied_weights_rows"] == pytest.approx([1.0] * 6)
    milk_to_poured, poured_to_milk = values["tied_weights"]
    assert poured_to_milk > 100 * milk_to_poured > 0
    assert values["tied_weights_gap"] > 0.5


@pytest.mark.parametrize(
    "implementation",
    [
        lambda Q, K: Q @ K.mT,
        lambda Q, K: torch.matmul(Q, K.swapaxes(-1, -2)),
        lambda Q, K: torch.einsum("...qd,...kd->...qk", Q, K),
        lambda Q, K: (Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(dim=-1),
    ],
    ids=["mT", "swapaxes", "einsum", "broadcast-sum"],
)
def test_other_correct_implementations_pass_the_hidden_check(implementation):
    grader.check("scores", implementation)


# (what the student wrote, visible points expected (shapes, values), diagnosis the feedback names)
TRAPS = {
    "K_Q_T": ("return K @ Q.transpose(-2, -1)", (0, 0), "K Q^T instead of Q K^T"),
    "Q_T_K": ("return Q.transpose(-2, -1) @ K", (0, 0), "Q^T K instead of Q K^T"),
    "dot_T": ("return Q @ K.T", (0, 2), ".T on a batched tensor"),
}


@pytest.mark.parametrize("trap", list(TRAPS))
def test_trap_loses_hidden_points_and_is_named(trap, built_course):
    """A known mistake loses the hidden points and the feedback names it.

    The "I love cats" S happens to be symmetric, so only the checks with T_q != T_k catch K Q^T
    visibly; .T passes both 2-D value checks and fails on the batch.
    """
    line, (shapes, values), diagnosis = TRAPS[trap]
    right = solution_sources(LESSON)["ex02_scores"]
    wrong = right.replace(SOLUTION, line)
    assert wrong != right
    student = f"trap_{trap}"
    grades = wrong_versions.grade(
        LESSON, student, {"ex02_scores": wrong}, built_course, with_solutions=False
    )["grades"]
    assert grades["test02_scores_shapes"] == (shapes, 1)
    assert grades["test02_scores_values"] == (values, 2)
    assert grades["test02_scores_hidden"] == (0, 4)
    message = cell_error(course.autograded_path(LESSON, student), "test02_scores_hidden")
    assert f"Diagnosis: {diagnosis}." in message, message


def test_einsum_gets_full_marks(built_course):
    right = solution_sources(LESSON)["ex02_scores"]
    other = right.replace(SOLUTION, 'return torch.einsum("...id,...jd->...ij", Q, K)')
    assert other != right
    result = wrong_versions.assert_full_marks(LESSON, "einsum", {"ex02_scores": other}, built_course)
    assert result["max_score"] == 7


def test_the_heat_map_text_says_what_the_random_milk_scores_show():
    """The explore cell prints each milk query's best-scoring key and where "milk" ranks for "poured",
    as S_milk has them; the text no longer claims the random matrices know that "poured" asks for "milk"."""
    from tests.test_lesson07 import run_showing, stdout_of

    nb, values = run_showing(LESSON, {"S": "S_milk", "tokens": "milk.tokens"})
    S, tokens = values["S"], values["tokens"]
    shown = stdout_of(nb, "code-24")
    best = [tokens[max(range(6), key=row.__getitem__)] for row in S]
    line = "milk sentence, each query's best key: " + ", ".join(f"{q} -> {k}" for q, k in zip(tokens, best))
    assert line in shown, shown
    poured = S[tokens.index("poured")]
    to_milk = poured[tokens.index("milk")]
    rank = 1 + sum(s > to_milk for s in poured)
    assert f'"poured" scores "milk" {to_milk:.2f}: rank {rank} of 6 in its row' in shown, shown
    assert rank > 1, "the random scores do not make 'poured' look for 'milk' (the text says so)"
    text = next(c for c in nb.cells if c.get("id") == "md-20").source
    assert "the\nmilk sentence's matrices are random, not trained" in text, text
