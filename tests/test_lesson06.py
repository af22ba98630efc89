"""Lesson 06 computes the brief's numbers in front of the student, and grades `mix` through nbgrader."""

from __future__ import annotations

import pytest

from grader import course
from tests import wrong_versions
from tests.nbtools import cell_error
from tests.solutions import read_solution
from tests.tensors import BRIEF_A, BRIEF_O, rounded

pytestmark = pytest.mark.slow

LESSON = "06_mixing"


# `name = expression` lines: each expression is read back from the solution notebook once it has run
NOTEBOOK_VALUES = """
A = A
V = V
O = O
O_mix = mix(A, V)
weights_cats = weights_cats
o_cats = o_cats
one_hot = A_one_hot @ V
inside = inside
second_range = [second_min, second_max]
unnormalised_max = O_unnormalised.max()
shapes = {f'{k[0]},{k[1]}': v for k, v in shapes.items()}
weights_change = weights_change
tied_is_blend_of_keys = tied_is_blend_of_keys
output_change = output_change
values_differ = (E @ milk.W_v - E @ milk.W_k).abs().max()
tied_output = O_tied
keys = K_m
"""


def test_mixing_numbers_from_the_brief():
    values = read_solution(LESSON, NOTEBOOK_VALUES)
    assert rounded(values["A"]) == BRIEF_A
    assert rounded(values["O"]) == BRIEF_O
    assert rounded(values["O_mix"]) == BRIEF_O
    # the row of "cats" by hand: weights [0.007, 0.755, 0.238], output [1.99, 7.48, 0.74]
    assert [round(w, 3) for w in values["weights_cats"]] == [0.007, 0.755, 0.238]
    assert [round(o, 2) for o in values["o_cats"]] == [1.99, 7.48, 0.74]
    # a one-hot row copies one value row
    assert values["one_hot"] == [[2, 8, 0], [2, 8, 0], [1, 2, 3]]
    # every output lies inside its column's range; column 2 holds 2, 8, 6: never 9
    assert values["V"] == [[1, 2, 3], [2, 8, 0], [2, 6, 3]]
    assert values["inside"] is True
    low, high = values["second_range"]
    assert 2 <= low and high <= 8 < 9
    assert values["unnormalised_max"] > 8  # without the softmax, outputs escape the range
    # (d_k, d_v) of (6,6), (2,6), (6,2): scores 6x6, outputs 6x6, 6x6, 6x2
    assert values["shapes"] == {
        "6,6": [[6, 6], [6, 6]],
        "2,6": [[6, 6], [6, 6]],
        "6,2": [[6, 6], [6, 2]],
    }
    # tying K and V: the same head run with two different value matrices gives the same weights
    # (the weights never see V), an output made of keys, and a different output
    assert values["values_differ"] > 0.1
    assert values["weights_change"] == 0
    for c, column in enumerate(zip(*values["keys"])):  # each output column stays within the keys' column
        assert all(min(column) - 1e-6 <= row[c] <= max(column) + 1e-6 for row in values["tied_output"])
    assert values["tied_is_blend_of_keys"] == 0
    assert values["output_change"] > 0.1


WRONG_MIX = {
    "the weights were returned instead of A V": "def mix(A, V):\n    return A\n",
    "the values were returned unmixed": "def mix(A, V):\n    return V\n",
    "A^T V instead of A V": "def mix(A, V):\n    return A.mT @ V\n",
}


@pytest.mark.parametrize("diagnosis", sorted(WRONG_MIX))
def test_wrong_mix_loses_hidden_points_and_is_named(diagnosis, built_course):
    student = "mix_" + "".join(c for c in diagnosis if c.isalnum())[:24]
    answers = {"ex06_mix": WRONG_MIX[diagnosis]}
    grades = wrong_versions.grade(LESSON, student, answers, built_course, with_solutions=False)["grades"]
    assert grades["test06_mix_hidden"] == (0, 4), grades
    assert grades["test06_mix_values"][0] == 0, grades
    message = cell_error(course.autograded_path(LESSON, student), "test06_mix_hidden")
    assert f"Diagnosis: {diagnosis}." in message, message
    if diagnosis.startswith("the weights"):
        visible = cell_error(course.autograded_path(LESSON, student), "test06_mix_values")
        assert "mix returned the weights themselves" in visible, visible


def test_mix_with_einsum_gets_full_marks(built_course):
    answer = 'def mix(A, V):\n    return torch.einsum("...qk,...kd->...qd", A, V)\n'
    wrong_versions.assert_full_marks(LESSON, "mix_einsum", {"ex06_mix": answer}, built_course)
