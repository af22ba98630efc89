"""Lesson 04 computes the brief's numbers, and grading names every masking mistake."""

from __future__ import annotations

import math
import textwrap

import pytest

from tests import wrong_versions
from tests.nbtools import ROOT, run_and_read

pytestmark = pytest.mark.slow

LESSON = "04_masking"
NOTEBOOK = ROOT / "solutions" / LESSON / f"{LESSON}.ipynb"
TRIL5 = [[j <= i for j in range(5)] for i in range(5)]


def test_masking_numbers_from_the_brief():
    v = run_and_read(
        NOTEBOOK,
        {
            "tokens": "tokens",
            "S": "S",
            "allowed": "allowed",
            "S_masked": "S_masked",
            "A": "A",
            "A_peek_first": "A_peek[0]",
            "exp_neg_inf": "torch.exp(torch.tensor(float('-inf'))).item()",
            "times_mask_weights": "torch.softmax(times_mask, dim=-1)",
            "filled_weights": "torch.softmax(filled, dim=-1)",
            "added": "row + blocked * float('-inf')",
            "pad_shape": "tuple(pad.shape)",
            "both_shape": "tuple(both.shape)",
            "A_short": "A_batch[1]",
            "mask_device": "str(allowed_there.device)",
            "true_cells": "int(allowed.sum())",
            "first_row_random": "torch.softmax(torch.where(allowed, S_random, float('-inf')), dim=-1)[0]",
            "causal": "causal_mask(5)",
            "padding": "padding_mask(torch.tensor([5, 3]), 5)",
            "A_explore": "A_explore",
            "A_explore_short": "A_explore_batch[1]",
            "order_gap_free": "order_gap_free",
            "order_gap_causal": "order_gap_causal",
            "shuffled_outputs_differ": "(head_output(sat.X[perm]) - head_output(sat.X)).abs().max().item()",
        },
    )
    assert v["tokens"] == ["The", "cat", "sat", "on", "the"]
    # the last "the" gets its largest raw score from "cat" ...
    last = v["S"][4]
    assert max(range(5), key=last.__getitem__) == 1
    assert last[1] == pytest.approx(2 / math.sqrt(2), abs=1e-5)
    # ... and after scale, causal mask and softmax gives "cat" about half its attention
    assert 0.45 <= v["A"][4][1] <= 0.55
    assert v["A"][4][1] == pytest.approx(0.507, abs=1e-3)
    # the causal mask is the lower triangle; -inf above the diagonal becomes exactly 0
    assert v["allowed"] == TRIL5
    for i in range(5):
        for j in range(5):
            if j > i:
                assert v["S_masked"][i][j] == -math.inf
                assert v["A"][i][j] == 0.0
            else:
                assert v["S_masked"][i][j] == v["S"][i][j]
        assert sum(v["A"][i]) == pytest.approx(1.0, abs=1e-6)
    assert v["exp_neg_inf"] == 0.0
    # without the mask the first "The" would look ahead at "cat"; with it, only at itself
    assert max(range(5), key=v["A_peek_first"].__getitem__) == 1
    assert v["A"][0] == [1.0, 0.0, 0.0, 0.0, 0.0]
    # multiplying by the mask still gives the future weight; filling with -inf does not; 0 * -inf is NaN
    assert v["times_mask_weights"][3] > 0.1 and v["times_mask_weights"][4] > 0.1
    assert v["filled_weights"][3:] == [0.0, 0.0]
    assert all(math.isnan(x) for x in v["added"][:3]) and v["added"][3:] == [-math.inf, -math.inf]
    # padding: (B, 1, T) broadcasts over the queries; padded keys get exactly 0
    assert v["pad_shape"] == [2, 1, 5] and v["both_shape"] == [2, 5, 5]
    for row in v["A_short"]:
        assert row[3:] == [0.0, 0.0]
        assert sum(row) == pytest.approx(1.0, abs=1e-6)
    assert v["mask_device"] == "meta"
    # pause and predict: 15 True cells; the first token's row is [1, 0, 0, 0, 0] whatever the scores
    assert v["true_cells"] == 15
    assert v["first_row_random"] == [1.0, 0.0, 0.0, 0.0, 0.0]
    # the graded functions and the explorer reproduce the worked example
    assert v["causal"] == TRIL5
    assert v["padding"] == [[[True] * 5], [[True] * 3 + [False] * 2]]
    for mine, worked in ((v["A_explore"], v["A"]), (v["A_explore_short"], v["A_short"])):
        for row_mine, row_worked in zip(mine, worked, strict=True):
            assert row_mine == pytest.approx(row_worked, abs=1e-6)
    # attention alone ignores order: shuffling the tokens shuffles the outputs (and changes them row by row),
    # while the causal mask, built from positions, does not commute with the shuffle
    assert v["shuffled_outputs_differ"] > 0.1
    assert v["order_gap_free"] < 1e-5
    assert v["order_gap_causal"] > 0.1


def _code(src: str) -> str:
    return textwrap.dedent(src).strip("\n")


CAUSAL_INVERTED = _code('''
    def causal_mask(T, device=None):
        """True = blocked (the convention of some other code)."""
        return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)
''')
CAUSAL_NO_DEVICE = _code("""
    def causal_mask(T, device=None):
        return torch.tril(torch.ones(T, T, dtype=torch.bool))
""")
CAUSAL_FLOAT = _code("""
    def causal_mask(T, device=None):
        return torch.ones(T, T, device=device).tril()
""")
PADDING_FLAT = _code("""
    def padding_mask(lengths, T):
        return torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]
""")
PADDING_INVERTED = _code("""
    def padding_mask(lengths, T):
        return (torch.arange(T, device=lengths.device)[None, :] >= lengths[:, None])[:, None, :]
""")
PADDING_NO_DEVICE = _code("""
    def padding_mask(lengths, T):
        return (torch.arange(T)[None, :] < lengths[:, None])[:, None, :]
""")
PADDING_OFF_BY_ONE = _code("""
    def padding_mask(lengths, T):
        return (torch.arange(T, device=lengths.device)[None, :] <= lengths[:, None])[:, None, :]
""")
APPLY_INVERTED = _code("""
    def apply_mask(S, allowed):
        return S.masked_fill(allowed, float("-inf"))
""")
APPLY_MULTIPLY = _code("""
    def apply_mask(S, allowed):
        return S * allowed
""")
APPLY_NAN = _code("""
    def apply_mask(S, allowed):
        return S + (~allowed).float() * float("-inf")
""")
APPLY_MINUS_1E9 = _code("""
    def apply_mask(S, allowed):
        return S + (1 - allowed.to(S.dtype)) * -1e9
""")


# student -> (answers, {hidden test: expected diagnosis}); functions left out keep the solution
TRAPS = {
    "inverted_polarity": (
        {
            "ex04_causal_mask": CAUSAL_INVERTED,
            "ex04_padding_mask": PADDING_FLAT,
            "ex04_apply_mask": APPLY_INVERTED,
        },
        {
            "test04_causal_mask_hidden": "the mask polarity is inverted (True = blocked)",
            "test04_padding_mask_hidden": "the mask has no query dimension: (B, T) instead of (B, 1, T)",
            "test04_apply_mask_hidden": "the mask polarity is inverted (-inf where looking IS allowed)",
        },
    ),
    "device_and_multiply": (
        {
            "ex04_causal_mask": CAUSAL_NO_DEVICE,
            "ex04_padding_mask": PADDING_INVERTED,
            "ex04_apply_mask": APPLY_MULTIPLY,
        },
        {
            # on every machine: the hidden check tries the CPU's cases on 'meta', which stands in for a GPU
            "test04_causal_mask_hidden": "the mask was made on the wrong device",
            "test04_padding_mask_hidden": "the mask polarity is inverted (True = padding)",
            "test04_apply_mask_hidden": "the scores were multiplied by the mask",
        },
    ),
    "zero_times_inf": (
        {"ex04_padding_mask": PADDING_NO_DEVICE, "ex04_apply_mask": APPLY_NAN},
        {
            "test04_padding_mask_hidden": "the mask was made on the wrong device",
            "test04_apply_mask_hidden": "0 * -inf = NaN",
        },
    ),
    "minus_1e9": (
        {
            "ex04_causal_mask": CAUSAL_FLOAT,
            "ex04_padding_mask": PADDING_OFF_BY_ONE,
            "ex04_apply_mask": APPLY_MINUS_1E9,
        },
        {
            "test04_causal_mask_hidden": "a numeric mask instead of a boolean one",
            "test04_padding_mask_hidden": "one position too many is real (<= instead of <)",
            "test04_apply_mask_hidden": "a large finite number (-1e9) instead of -inf",
        },
    ),
}
HIDDEN = {"test04_causal_mask_hidden": 3, "test04_padding_mask_hidden": 3, "test04_apply_mask_hidden": 3}
# visible checks each submission fails, with a phrase of their message
VISIBLE = {
    "inverted_polarity": {
        "test04_causal_mask_values": "True means 'may look'",
        "test04_padding_mask_shape": "expected (2, 1, 5)",
        "test04_apply_mask_values": "the polarity is inverted",
    },
    "device_and_multiply": {
        "test04_padding_mask_values": "j < lengths[b]",
        "test04_apply_mask_values": "must be exactly -inf",
    },
    "zero_times_inf": {"test04_apply_mask_values": "0 * -inf is NaN"},
    "minus_1e9": {
        "test04_causal_mask_shape": "dtype torch.bool",
        "test04_padding_mask_values": "j < lengths[b]",
        "test04_apply_mask_values": "-1e9 is not -inf",
    },
}


test_each_masking_trap_loses_its_hidden_points_and_is_named = wrong_versions.named_traps_test(
    LESSON, TRAPS, HIDDEN, VISIBLE
)


# correct but different versions of every exercise
RIGHT = {
    "ex04_causal_mask": _code("""
        def causal_mask(T, device=None):
            i = torch.arange(T, device=device)
            return i[:, None] >= i[None, :]
    """),
    "ex04_padding_mask": _code("""
        def padding_mask(lengths, T):
            positions = torch.arange(T, device=lengths.device).expand(len(lengths), T)
            return (positions < lengths.unsqueeze(-1)).unsqueeze(1)
    """),
    "ex04_apply_mask": _code("""
        def apply_mask(S, allowed):
            blocked = torch.tensor(float("-inf"), dtype=S.dtype, device=S.device)
            return torch.where(allowed, S, blocked)
    """),
}


(
    test_correct_but_different_masks_get_full_marks,
    test_correct_but_different_masks_pass_the_harness,
) = wrong_versions.alternative_tests(LESSON, RIGHT, max_score=16)


def test_the_predictions_are_asked_before_the_worked_example_answers_them():
    """Section 1 asks; the mask (code-07) and the first token's masked row (code-10) come after."""
    import nbformat

    ids = [c.get("id") for c in nbformat.read(NOTEBOOK, as_version=4).cells]
    asked = ids.index("predict04-0")
    assert asked < ids.index("code-07") and asked < ids.index("code-10") and asked < ids.index("code-24")
