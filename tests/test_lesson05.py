"""Lesson 05 computes the brief's numbers, and grading names every softmax mistake."""

from __future__ import annotations

import math
import textwrap

import pytest

from tests import wrong_versions
from tests.nbtools import ROOT, run_and_read

pytestmark = pytest.mark.slow

LESSON = "05_softmax"
NOTEBOOK = ROOT / "solutions" / LESSON / f"{LESSON}.ipynb"
COLOURS = {  # sharpness: (weights, output) for the query [1.0, 0.1], from the course brief
    1.0: ({"red": 0.41, "green": 0.22, "orange": 0.37}, [200, 117]),
    5.0: ({"red": 0.61, "green": 0.03, "orange": 0.37}, [249, 67]),
    25.0: ({"red": 0.92, "green": 0.00, "orange": 0.08}, [255, 13]),
}


def _close(got, want, places):
    return all(abs(g - w) <= 0.5 * 10**-places + 1e-9 for g, w in zip(got, want, strict=True))


def test_softmax_numbers_from_the_brief():
    v = run_and_read(
        NOTEBOOK,
        {
            "S": "S",
            "exps_I": "exps_I",
            "total_I": "total_I",
            "weights_I": "weights_I",
            "row_cats": "row_cats",
            "top": "top",
            "shifted_cats": "shifted_cats",
            "exps_cats": "exps_cats",
            "total_cats": "total_cats",
            "weights_cats": "weights_cats",
            "output_cats": "output_cats",
            "A": "A",
            "A_mine": "softmax(S)",
            "naive_big": "torch.exp(big) / torch.exp(big).sum()",
            "stable_big": "torch.exp(shifted) / torch.exp(shifted).sum()",
            "mine_big": "softmax(big + torch.zeros(2, 1))",
            "torch_dead": "torch.softmax(dead, dim=-1)",
            "mine_dead": "softmax(dead)",
            "levels": "[softmax(torch.tensor(z)).tolist() for z in ([1.0, 2.0, 3.0], [101.0, 102.0, 103.0])]",
            "stretched": "softmax(torch.tensor([10.0, 20.0, 30.0]))",
            "sd_weights": "sd_weights",
            "sd_output": "sd_output",
            "table": "{s: list(r) for s, r in table.items()}",
            "towards_green": "{s: list(r) for s, r in towards_green.items()}",
            "exactly_orange": "{s: list(r) for s, r in exactly_orange.items()}",
            "long_orange": "{s: list(r) for s, r in long_orange.items()}",
        },
    )
    # row "I" by hand
    assert _close(v["S"][0], [1.15, 2.31, 2.31], 2)
    assert _close(v["exps_I"], [3.17, 10.07, 10.07], 2)
    assert round(v["total_I"], 2) == 23.31
    assert _close(v["weights_I"], [0.136, 0.432, 0.432], 3)
    # row "cats" with the stability trick
    assert _close(v["row_cats"], [2.31, 6.93, 5.77], 2) and round(v["top"], 2) == 6.93
    assert _close(v["shifted_cats"], [-4.62, 0.0, -1.15], 2) and v["shifted_cats"][1] == 0.0
    assert _close(v["exps_cats"], [0.010, 1.0, 0.315], 3)
    assert round(v["total_cats"], 3) == 1.325
    assert _close(v["weights_cats"], [0.007, 0.755, 0.238], 3)
    assert _close(v["output_cats"], [1.99, 7.48, 0.74], 2)
    # the whole matrix, with torch.softmax and with the lesson's own softmax
    want_A = [[0.14, 0.43, 0.43], [0.00, 0.91, 0.09], [0.01, 0.75, 0.24]]
    for A in (v["A"], v["A_mine"]):
        for row, want in zip(A, want_A, strict=True):
            assert _close(row, want, 2) and sum(row) == pytest.approx(1.0, abs=1e-6)
    # near 1000: naive exp gives NaN, the stable one works (and gives softmax([0, 1, 2]))
    assert all(math.isnan(x) for x in v["naive_big"])
    assert _close(v["stable_big"], [0.090, 0.245, 0.665], 3)
    for row in v["mine_big"]:
        assert _close(row, [0.090, 0.245, 0.665], 3)
    # a row that is all -inf: torch.softmax gives NaN, ours gives zeros
    assert all(math.isnan(x) for x in v["torch_dead"][1])
    assert v["mine_dead"][1] == [0.0, 0.0, 0.0] and v["mine_dead"][0][1] == 0.0
    # sharpness: gaps, not levels
    assert v["levels"][0] == pytest.approx(v["levels"][1], abs=1e-6)
    assert v["stretched"][2] > 0.999
    # the colour soft dictionary by hand, sharpness 1
    assert _close([v["sd_weights"][n] for n in ("red", "green", "orange")], [0.41, 0.22, 0.37], 2)
    assert [round(x) for x in v["sd_output"]] == [200, 117]
    # the explorer (the lesson's soft_lookup) at sharpness 1, 5 and 25
    table = {float(s): r for s, r in v["table"].items()}
    assert sorted(table) == sorted(COLOURS)
    for s, (want_w, want_out) in COLOURS.items():
        weights, output = table[s]
        assert _close([weights[n] for n in want_w], list(want_w.values()), 2), (s, weights)
        assert [round(x) for x in output] == want_out, (s, output)
    # follow-ups: a query at green makes green win; a query equal to orange's key makes orange win,
    # more clearly with more sharpness; doubling orange's key gives it more weight at every sharpness
    green = {float(s): r for s, r in v["towards_green"].items()}
    orange = {float(s): r for s, r in v["exactly_orange"].items()}
    long = {float(s): r for s, r in v["long_orange"].items()}
    for s in COLOURS:
        assert max(green[s][0], key=green[s][0].get) == "green"
        assert max(orange[s][0], key=orange[s][0].get) == "orange"
        assert long[s][0]["orange"] > table[s][0]["orange"]
    assert orange[1.0][0]["orange"] < 0.5 < orange[25.0][0]["orange"]
    assert max(long[5.0][0], key=long[5.0][0].get) == "orange"  # it now beats red


def _code(src: str) -> str:
    return textwrap.dedent(src).strip("\n")


SOFTMAX_DIM_M2 = _code("""
    def softmax(Z, dim=-1):
        m = Z.amax(dim=-2, keepdim=True)
        e = torch.exp(Z - m)
        return e / e.sum(dim=-2, keepdim=True)
""")
SOFTMAX_NAIVE = _code("""
    def softmax(Z, dim=-1):
        e = torch.exp(Z)
        return e / e.sum(dim=dim, keepdim=True)
""")
SOFTMAX_DEAD_ROW_NAN = _code("""
    def softmax(Z, dim=-1):
        e = torch.exp(Z - Z.amax(dim=dim, keepdim=True))
        return e / e.sum(dim=dim, keepdim=True)
""")
SOFTMAX_GLOBAL_MAX = _code("""
    def softmax(Z, dim=-1):
        e = torch.exp(Z - Z.max())
        return e / e.sum(dim=dim, keepdim=True)
""")


def _soft_lookup(*exps: str) -> str:
    """A student's soft_lookup whose lines ``exps`` compute ``exps``; the rest normalises and mixes."""
    body = [
        *exps,
        "total = sum(exps.values())",
        "weights = {n: e / total for n, e in exps.items()}",
        "m = len(next(iter(values.values())))",
        "return weights, [sum(weights[n] * values[n][c] for n in keys) for c in range(m)]",
    ]
    return "\n".join(["def soft_lookup(query, keys, values, sharpness):", *(f"    {line}" for line in body)])


# scores less their max, then exp
_STABLE = ("top = max(scores.values())", "exps = {n: math.exp(s - top) for n, s in scores.items()}")
LOOKUP_NO_SQRT = _soft_lookup(
    "scores = {n: sharpness * sum(q * k for q, k in zip(query, key)) for n, key in keys.items()}", *_STABLE
)
LOOKUP_NAIVE = _soft_lookup(
    "d = len(query)",
    "exps = {n: math.exp(sharpness * sum(q * k for q, k in zip(query, key)) / math.sqrt(d)) for n, key in keys.items()}",
)
LOOKUP_SHARPNESS_DIVIDES = _soft_lookup(
    "d = len(query)",
    "scores = {n: sum(q * k for q, k in zip(query, key)) / (sharpness * math.sqrt(d)) for n, key in keys.items()}",
    *_STABLE,
)

# student -> (answers, {hidden test: expected diagnosis}); functions left out keep the solution
TRAPS = {
    "softmax_dim_m2": (
        {"ex05_softmax": SOFTMAX_DIM_M2, "ex05_soft_lookup": LOOKUP_NO_SQRT},
        {
            "test05_softmax_hidden": "softmax over dim -2 (the queries) instead of the keys",
            "test05_soft_lookup_hidden": "the scores were not divided by sqrt(d)",
        },
    ),
    "naive_overflow": (
        {"ex05_softmax": SOFTMAX_NAIVE, "ex05_soft_lookup": LOOKUP_NAIVE},
        {
            "test05_softmax_hidden": "naive softmax that overflows",
            "test05_soft_lookup_hidden": "naive softmax that overflows",
        },
    ),
    "dead_row_nan": (
        {"ex05_softmax": SOFTMAX_DEAD_ROW_NAN, "ex05_soft_lookup": LOOKUP_SHARPNESS_DIVIDES},
        {
            "test05_softmax_hidden": "a fully masked row gives NaN",
            "test05_soft_lookup_hidden": "sharpness divides instead of multiplies",
        },
    ),
    "global_max": (
        {"ex05_softmax": SOFTMAX_GLOBAL_MAX},
        {"test05_softmax_hidden": "the global max was subtracted instead of each row's max"},
    ),
}
HIDDEN = {"test05_softmax_hidden": 4, "test05_soft_lookup_hidden": 4}
# the visible check each trap fails, with a phrase of its message
VISIBLE = {
    "softmax_dim_m2": {"test05_softmax_values": "Your columns sum to 1"},
    "naive_overflow": {"test05_softmax_overflow": "subtract each row's"},
    "dead_row_nan": {"test05_softmax_masked_row": "replace a -inf max by 0"},
    "global_max": {"test05_softmax_overflow": "subtract each row's"},
}


test_each_softmax_trap_loses_its_hidden_points_and_is_named = wrong_versions.named_traps_test(
    LESSON, TRAPS, HIDDEN, VISIBLE
)


# correct but different versions of every exercise
RIGHT = {
    "ex05_softmax": _code("""
        def softmax(Z, dim=-1):  # torch.softmax is ruled out; logsumexp is not
            return torch.exp(Z - torch.logsumexp(Z, dim=dim, keepdim=True)).nan_to_num(0.0)
    """),
    "ex05_soft_lookup": _code("""
        def soft_lookup(query, keys, values, sharpness):
            names = list(keys)
            scale = sharpness / len(query) ** 0.5
            scores = [scale * sum(q * k for q, k in zip(query, keys[n])) for n in names]
            top = max(scores)
            log_total = top + math.log(math.fsum(math.exp(s - top) for s in scores))
            weights = {n: math.exp(s - log_total) for n, s in zip(names, scores)}
            width = len(values[names[0]])
            return weights, [math.fsum(weights[n] * values[n][c] for n in names) for c in range(width)]
    """),
}


(
    test_correct_but_different_softmax_and_lookup_get_full_marks,
    test_correct_but_different_softmax_and_lookup_pass_the_harness,
) = wrong_versions.alternative_tests(LESSON, RIGHT, max_score=16)


@pytest.mark.parametrize(
    "source",
    [
        _code("""
            def softmax(Z, dim=-1):
                m = Z.amax(dim=dim, keepdim=True).clamp(min=torch.finfo(Z.dtype).min)
                e = (Z - m).exp()
                return e / e.sum(dim=dim, keepdim=True).clamp(min=torch.finfo(Z.dtype).tiny)
        """),
        _code("""
            def softmax(Z, dim=-1):
                e = torch.exp(Z - Z.amax(dim=dim, keepdim=True))
                return torch.where(torch.isnan(e), 0.0, e) / torch.where(torch.isnan(e), 0.0, e).sum(dim, keepdim=True).clamp_min(1e-30)
        """),
    ],
    ids=["clamped", "nan_replaced"],
)
def test_other_ways_through_the_all_minus_inf_row_pass_the_hidden_check(source):
    """Clamping the max and the sum, or replacing NaN after exp, is as right as torch.where."""
    import torch

    import grader

    namespace = {"torch": torch}
    exec(source, namespace)
    grader.check("softmax", namespace["softmax"])


def test_the_predictions_are_asked_before_any_section_answers_them():
    """The questions (in md-07) come before the overflow demo, the -inf row and the sharpness table."""
    import nbformat

    cells = nbformat.read(NOTEBOOK, as_version=4).cells
    ids = [c.get("id") for c in cells]
    asked = ids.index("md-07")
    assert "Pause and predict" in cells[asked].source
    for reveal in ("code-08", "code-14", "code-16", "code-18"):
        assert asked < ids.index(reveal), reveal


# torch.softmax by other names: the rule holds whatever the route to a softmax kernel
AROUND_THE_RULE = {
    "torch._softmax": "return torch._softmax(Z, dim, False).nan_to_num(0.0)",
    "the C binding of torch.softmax": "return torch._C._VariableFunctions.softmax(Z, dim).nan_to_num(0.0)",
    "the aten operator": "return torch.ops.aten._softmax.default(Z, dim, False).nan_to_num(0.0)",
    "softmin of -Z": "return torch.nn.functional.softmin(-Z, dim).nan_to_num(0.0)",
    "torch.special.softmax": "return torch.special.softmax(Z, dim).nan_to_num(0.0)",
}


@pytest.mark.parametrize("route", list(AROUND_THE_RULE))
def test_softmax_by_another_name_fails_with_the_rule(route):
    import torch

    import grader

    namespace = {"torch": torch}
    exec(f"def softmax(Z, dim=-1):\n    {AROUND_THE_RULE[route]}", namespace)
    with pytest.raises(AssertionError) as failed:
        grader.check("softmax", namespace["softmax"])
    message = str(failed.value)
    assert "which this exercise rules out. The rule: Do not call torch.softmax" in message
    assert "build it from torch.exp" in message


SOFTMAX_BY_ATTENTION = """
def softmax(Z, dim=-1):
    Zt = Z.movedim(dim, -1)
    n = Zt.shape[-1]
    rows = Zt.reshape(1, 1, -1, n).double()
    zeros_q = torch.zeros(1, 1, rows.shape[-2], 1, dtype=torch.float64, device=Z.device)
    zeros_k = torch.zeros(1, 1, n, 1, dtype=torch.float64, device=Z.device)
    eye = torch.eye(n, dtype=torch.float64, device=Z.device).reshape(1, 1, n, n)
    A = torch.nn.functional.scaled_dot_product_attention(zeros_q, zeros_k, eye, attn_mask=rows)  # softmax(Z) @ I
    return torch.nan_to_num(A, nan=0.0).reshape(Zt.shape).to(Z.dtype).movedim(-1, dim)
"""


def test_softmax_through_attention_fails_with_the_rule():
    """Attention with zero queries and keys, the identity as values and Z as its mask is softmax(Z): it
    earned full marks; it is ruled out with the softmax family."""
    import torch

    import grader

    namespace = {"torch": torch}
    exec(SOFTMAX_BY_ATTENTION, namespace)
    with pytest.raises(AssertionError) as failed:
        grader.check("softmax", namespace["softmax"])
    assert "which this exercise rules out. The rule: Do not call torch.softmax" in str(failed.value)


def test_softmax_with_torch_functions_switched_off_fails_with_the_rule_and_the_visible_check_says_so(capsys):
    """torch.softmax kept as a default argument and called with torch functions switched off (by a name
    built from strings) earned full marks: the watch saw torch functions only. It now sees the aten
    operator at the dispatcher, in the hidden check and in the visible one before hand-in."""
    import grader
    from attention_course.diagnosis import diagnosed
    from tests import attacks, wrong_versions

    softmax = wrong_versions.answer_function(attacks.L05_QUIET_SOFTMAX, "softmax")
    with pytest.raises(AssertionError) as failed:
        grader.check("softmax", softmax)
    assert "which this exercise rules out. The rule: Do not call torch.softmax" in str(failed.value)
    import torch

    with diagnosed("softmax", softmax):
        softmax(torch.randn(2, 3))
    assert "softmax calls torch._softmax, which this exercise rules out" in capsys.readouterr().out


def test_torch_inside_soft_lookup_fails_with_the_rule_by_any_name():
    import torch

    import grader

    def soft_lookup(query, keys, values, sharpness):
        scores = {
            n: sharpness * sum(q * k for q, k in zip(query, key)) / math.sqrt(len(query))
            for n, key in keys.items()
        }
        top = max(scores.values())
        exps = {
            n: torch._C._VariableFunctions.exp(torch.zeros(()) + (s - top)).item() for n, s in scores.items()
        }
        total = sum(exps.values())
        weights = {n: e / total for n, e in exps.items()}
        width = len(next(iter(values.values())))
        return weights, [sum(weights[n] * values[n][c] for n in keys) for c in range(width)]

    with pytest.raises(AssertionError) as failed:
        grader.check("soft_lookup", soft_lookup)
    assert "soft_lookup is plain Python" in str(failed.value)


def test_a_softmax_that_empties_its_watchs_forbidden_names_is_flagged_for_review():
    """The call's watch, reached through the dispatcher's mode stack, told to forbid nothing: aten's
    _softmax then went unrecorded and earned full marks unflagged. The watch now sees it was changed."""
    import torch

    from attention_course.watch import CallWatch
    from grader.lessons.l05_softmax import SOFTMAX_FAMILY
    from tests import attacks, wrong_versions

    softmax = wrong_versions.answer_function(attacks.L05_GRAB_WATCH, "softmax")
    Z = torch.randn(3, 4)
    with CallWatch(SOFTMAX_FAMILY, ((Z,), {})) as seen:
        value = softmax(Z)
    assert seen.verdict(value) is None and seen.calls == []
    assert seen.review == "changed the rules' watch while it ran (its rule, forbidden names or records)"
    with CallWatch(SOFTMAX_FAMILY, ((Z,), {})) as honest:
        value = (Z - Z.amax(-1, keepdim=True)).exp()
    assert honest.verdict(value) is None and honest.review is None
