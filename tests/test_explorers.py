"""The explorers: their pure computation against the brief's numbers, their wiring, their fallbacks.

Fast tests drive the widgets from Python (no browser); the slow ones run the fixture
notebook in a real kernel, as a student would and as the grader would.
"""

from __future__ import annotations

import importlib
import io
import math
import pkgutil
import re
import subprocess
import sys

import pytest
import torch

from attention_course.explorers import choosing, head_dimension, numeric, stages, stepper
from attention_course.explorers import sharpness as colour_lookup
from tests.nbtools import ROOT
from tests.solutions import solution_functions

FIXTURE = ROOT / "tests" / "fixtures" / "explorers_demo.ipynb"


def stub(*args, **kwargs):
    raise NotImplementedError()


# the solution notebooks' own functions, as a student who has done the lessons passes them
# (the course keeps one reference per graded function; the explorers ship none)
scaled_scores = solution_functions("03_scaling")["scaled_scores"]
attention = solution_functions("07_one_head")["attention"]
soft_lookup = solution_functions("05_softmax")["soft_lookup"]


# --------------------------------------------------------------------- entropy


def test_entropy_is_zero_for_one_hot_and_ln_n_for_uniform():
    w = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    H = numeric.entropy(w)
    assert H.shape == (2,)
    assert H[0].item() == 0.0, "a one-hot row has entropy 0"
    assert H[1].item() == pytest.approx(math.log(4)), "a uniform row over 4 keys has entropy ln 4"


def test_entropy_ignores_masked_zeros_and_keeps_batch_shape():
    w = torch.softmax(torch.tensor([[[1.0, 2.0, float("-inf")]]]), dim=-1)  # (1, 1, 3)
    H = numeric.entropy(w)
    assert H.shape == (1, 1) and torch.isfinite(H).all()
    p = w[0, 0, :2]
    assert H.item() == pytest.approx(-(p * p.log()).sum().item())


def test_fmt_writes_numbers_as_the_lessons_do():
    assert numeric.fmt(12.0) == "12"
    assert numeric.fmt(6.9282) == "6.93"
    assert numeric.fmt(-0.001) == "0.00"
    assert numeric.fmt(float("-inf")) == "-inf"
    assert numeric.fmt_list([0.0099, 1.0, 0.3151], 3) == "[0.010, 1, 0.315]"


# -------------------------------------------------------------- head dimension


def test_default_sample_saturates_at_64_unscaled_and_not_when_scaled():
    Q, K = head_dimension.draw_head_vectors(head_dimension.HEAD_SEED)
    raw = head_dimension.head_view(Q, K, 64, scale=False)
    scaled = head_dimension.head_view(Q, K, 64, scale=True)
    assert raw.saturated and raw.row_entropy < 0.05, f"entropy at d_k = 64 unscaled is {raw.row_entropy:.3f}"
    assert max(raw.row_weights) > 0.99
    assert not scaled.saturated and scaled.row_entropy > 1.0, f"scaled entropy is {scaled.row_entropy:.3f}"
    assert "Turn on scaling" in raw.summary()


def test_at_d_k_1_scaling_changes_nothing():
    Q, K = head_dimension.draw_head_vectors(head_dimension.HEAD_SEED)
    a, b = head_dimension.head_view(Q, K, 1, scale=False), head_dimension.head_view(Q, K, 1, scale=True)
    assert torch.allclose(a.raw, a.scaled)
    assert a.row_weights == pytest.approx(b.row_weights)
    assert "scaling changes nothing" in a.summary()


def test_entropy_falls_with_d_k_unscaled_and_stays_up_scaled():
    d_values = [1, 4, 16, 64, 128]
    unscaled, scaled = head_dimension.expected_entropy(d_values)
    assert all(x > y for x, y in zip(unscaled, unscaled[1:])), f"unscaled entropy should fall: {unscaled}"
    assert unscaled[3] < 0.5 and min(scaled) > 1.5, (unscaled, scaled)


def test_spread_grows_like_sqrt_d_k_and_scaling_keeps_it_near_1():
    Q, K = head_dimension.draw_head_vectors(0)
    for d in (16, 64, 128):
        v = head_dimension.head_view(Q, K, d, scale=False)
        assert 0.6 * math.sqrt(d) < v.raw_std < 1.5 * math.sqrt(d)
        assert 0.6 < v.scaled_std < 1.5


def test_head_view_runs_the_function_it_is_given():
    calls = []

    def halved(Q, K):  # a wrong scaling, on purpose
        calls.append(Q.shape)
        return Q @ K.T / Q.shape[-1]

    Q, K = head_dimension.draw_head_vectors(0)
    v = head_dimension.head_view(Q, K, 16, scale=True, scaled_scores=halved)
    assert calls == [(8, 16)]
    assert torch.allclose(v.scaled, v.raw / 16)


# -------------------------------------------------------------------- choices


def test_a_stub_is_replaced_by_the_built_in_and_labelled():
    c = choosing.choose("scaled_scores", stub)
    assert c.source == "stub" and c.fn is None, "the explorer works the step out itself"
    assert "implement `scaled_scores` above" in c.note
    assert "stub" in choosing.banner_html([c]) and "<code>scaled_scores</code>" in choosing.banner_html([c])


def test_a_failing_function_is_named_and_replaced():
    def broken(Q, K):
        return Q.T @ K  # shapes do not fit

    c = choosing.choose("scaled_scores", broken)
    assert c.source == "error" and "RuntimeError" in c.note


def test_a_working_function_is_used_and_a_difference_is_pointed_out():
    good = choosing.choose("softmax", lambda Z, dim=-1: torch.softmax(Z, dim))
    assert good.source == "yours" and "differs" not in good.note
    wrong = choosing.choose("softmax", lambda Z, dim=-1: torch.softmax(Z, dim=0))
    assert wrong.source == "yours" and "differs from the built-in version" in wrong.note


def test_passing_a_result_instead_of_the_function_says_so():
    with pytest.raises(TypeError, match=r"scaled_scores= takes your function itself"):
        choosing.choose("scaled_scores", torch.zeros(3, 3))


def test_without_a_function_the_built_in_says_where_yours_will_come_from():
    c = choosing.choose("softmax", None, lesson="lesson 05")
    assert c.source == "built-in" and "lesson 05" in c.note


def test_with_the_exercises_still_stubs_the_explorers_show_the_briefs_numbers():
    from attention_course import explorers

    stepper = explorers.stage_stepper(attention=stub)  # lesson 07
    assert (
        stepper.choices["attention"].source == "stub" and "still a stub" in stepper.widget.children[0].value
    )
    assert stepper.st.A.round(decimals=2).tolist() == [
        [0.14, 0.43, 0.43],
        [0.00, 0.91, 0.09],
        [0.01, 0.75, 0.24],
    ]
    assert stepper.st.O.round(decimals=2).tolist() == [
        [1.86, 6.32, 1.70],
        [2.00, 7.81, 0.27],
        [1.99, 7.48, 0.74],
    ]
    explainer = explorers.cell_explainer(causal_mask=stub, apply_mask=stub)  # lesson 04
    assert 0.45 <= explainer.st.A[4, 1].item() <= 0.55 and torch.isinf(explainer.st.masked[1, 2])
    colours = explorers.sharpness_explorer(soft_lookup=stub)  # lesson 05
    assert colours.state.rgb[:2] == pytest.approx((200, 117), abs=1)
    colours.controls["sharpness"].value = 25.0
    assert colours.state.rgb[:2] == pytest.approx((255, 13), abs=1)
    heads = explorers.head_dimension_explorer(scaled_scores=stub, score_spread=stub)  # lesson 03
    assert heads.state.saturated and "the built-in score_spread(64, n=2000): raw std" in heads.readout.value


def test_the_explorers_hold_no_stand_alone_version_of_an_exercise():
    package = importlib.import_module("attention_course.explorers")
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        names = [n for n in vars(module) if n.startswith("builtin") or n.upper() == "BUILTINS"]
        assert names == [], f"{module.__name__} has {names}"


def test_one_thread_restores_the_thread_count():
    before = torch.get_num_threads()
    with choosing.one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


# --------------------------------------------------------- colour dictionary


@pytest.mark.parametrize(
    "sharpness, weights, output",
    [
        (1, (0.41, 0.22, 0.37), (200, 117)),
        (5, (0.61, 0.03, 0.37), (249, 67)),
        (25, (0.92, 0.00, 0.08), (255, 13)),
    ],
)
def test_colour_weights_and_blend_match_the_brief(sharpness, weights, output):
    from attention_course import data

    d = data.colours()
    v = colour_lookup.colour_view(d.query, d.keys, d.values, sharpness)
    assert [round(v.weights[n], 2) for n in ("red", "green", "orange")] == list(weights)
    assert v.rgb[:2] == pytest.approx(output, abs=1)
    assert f"[{v.output[0]:.0f}, {v.output[1]:.0f}]" in v.summary()


def test_colour_follow_ups():
    from attention_course import data

    d = data.colours()
    green = colour_lookup.colour_view([0.0, 1.0], d.keys, d.values, 5)
    assert max(green.weights, key=green.weights.get) == "green"
    on_orange = colour_lookup.colour_view(d.keys["orange"], d.keys, d.values, 5)
    assert max(on_orange.weights, key=on_orange.weights.get) == "orange"
    longer = dict(d.keys, orange=[1.6, 1.2])
    base = colour_lookup.colour_view(d.query, d.keys, d.values, 5)
    doubled = colour_lookup.colour_view(d.query, longer, d.values, 5)
    assert doubled.weights["orange"] > base.weights["orange"], "a longer key wins more weight"


def test_colour_curves_follow_the_function():
    from attention_course import data

    d = data.colours()
    curves = colour_lookup.colour_curves(d.query, d.keys, d.values, [0.0, 1.0, 25.0])
    assert curves["red"][0] == pytest.approx(1 / 3)
    assert curves["red"][1] == pytest.approx(0.41, abs=0.005)
    assert curves["red"][2] == pytest.approx(0.92, abs=0.005)


# ------------------------------------------------------------------- stages


def test_love_cats_stages_match_the_brief():
    st = stages.example_stages("love_cats")
    assert [s.title for s in st.stages()] == ["raw dot products", "scaled", "weights", "output"]
    assert torch.allclose(st.S, torch.tensor([[2, 4, 4], [4, 16, 12], [4, 12, 10]], dtype=torch.float64))
    want_scaled = [[1.15, 2.31, 2.31], [2.31, 9.24, 6.93], [2.31, 6.93, 5.77]]
    assert st.scaled.round(decimals=2).tolist() == want_scaled
    assert st.A.round(decimals=2).tolist() == [[0.14, 0.43, 0.43], [0.00, 0.91, 0.09], [0.01, 0.75, 0.24]]
    assert st.O.round(decimals=2).tolist() == [[1.86, 6.32, 1.70], [2.00, 7.81, 0.27], [1.99, 7.48, 0.74]]


def test_cat_sat_last_the_gives_cat_about_half_and_reads_thing():
    st = stages.example_stages("cat_sat")
    assert st.causal and len(st.stages()) == 5
    w = st.A[4].tolist()
    assert 0.45 <= w[1] <= 0.55 and w[1] == max(w)
    assert st.value_names[int(st.O[4].abs().argmax())] == "thing"
    assert torch.isinf(st.masked[1, 2]) and st.A[1, 2].item() == 0.0


def test_stages_use_the_students_attention():
    calls = []

    def spied(Q, K, V, mask=None):
        calls.append(mask is None)
        return attention(Q, K, V, mask)

    choices = {"attention": choosing.choose("attention", spied)}
    st = stages.example_stages("cat_sat", choices=choices)
    assert calls[-1] is False, "the causal mask is handed to attention"
    assert st.made_by["A"] == "attention" and 0.45 <= st.A[4, 1].item() <= 0.55


def test_stage_row_lines_show_the_arithmetic():
    st = stages.example_stages("love_cats")
    s1, s2, s3, s4 = st.stages()
    assert "q_cats . k_love = 2*4 + 1*4 + 3*0 = 12" in "\n".join(stepper.stage_row_lines(st, s1, 2))
    assert "[4, 12, 10] / 1.732 = [2.31, 6.93, 5.77]" in "\n".join(stepper.stage_row_lines(st, s2, 2))
    assert "[0.007, 0.755, 0.238]" in "\n".join(stepper.stage_row_lines(st, s3, 2))
    assert "= [1.99, 7.48, 0.74]" in "\n".join(stepper.stage_row_lines(st, s4, 2))


# -------------------------------------------------------------- explanations


def test_explainer_row_cats_matches_the_brief():
    st = stages.example_stages("love_cats")
    text = stages.explain_cell(st, "A", 2, 1).text
    for piece in (
        "[2.31, 6.93, 5.77]",
        "minus the row max 6.93: [-4.62, 0, -1.15]",
        "exp(x - max): [0.010, 1, 0.315]",
        "= 1.325",
        "A[cats, love] = 1 / 1.325 = 0.755",
        "[0.007, 0.755, 0.238]",
    ):
        assert piece in text, f"{piece!r} missing from:\n{text}"
    out = stages.explain_cell(st, "O", 2, 1).text
    assert "[1.99, 7.48, 0.74]" in out and "0.007*2 + 0.755*8 + 0.238*6" in out


def test_explainer_row_i_matches_the_brief():
    st = stages.example_stages("love_cats")
    text = stages.explain_cell(st, "A", 0, 1).text
    assert "[1.15, 2.31, 2.31]" in text and "[0.136, 0.432, 0.432]" in text


def test_explainer_score_cell_goes_term_by_term():
    st = stages.example_stages("love_cats")
    ex = stages.explain_cell(st, "S", 2, 1)
    assert "q_cats . k_love = 2*4 + 1*4 + 3*0 = 12" in ex.text
    assert "12 / sqrt(3) = 12 / 1.732 = 6.93" in ex.text
    assert "no mask" in ex.text
    assert ("Q", 2, 0) in ex.inputs and ("K", 1, 2) in ex.inputs
    q = stages.explain_cell(st, "Q", 2, 0)
    assert "1*1 + 1*1 + 1*0 + 1*0 = 2" in q.text


def test_explainer_shows_the_mask_on_cat_sat():
    st = stages.example_stages("cat_sat")
    masked = stages.explain_cell(st, "S", 1, 2)
    assert masked.value == -math.inf and "comes after 'cat'" in masked.text and "-inf" in masked.text
    weight = stages.explain_cell(st, "A", 1, 2)
    assert weight.value == 0.0 and "exp(-inf) = 0" in weight.text
    last = stages.explain_cell(st, "A", 4, 1)
    assert 0.45 <= last.value <= 0.55
    story = "\n".join(stages.explain_row(st, 4))
    assert "looks most at 'cat'" in story and "largest along 'thing'" in story


def test_explainer_checks_the_students_number():
    def softmax_cols(Z, dim=-1):
        return torch.nan_to_num(torch.softmax(Z, dim=-2))  # the classic wrong axis

    choices = {"softmax": choosing.choose("softmax", softmax_cols)}
    st = stages.example_stages("love_cats", choices=choices)
    ex = stages.explain_cell(st, "A", 2, 1)
    assert "your `softmax` gave" in ex.check and "but the arithmetic above gives 0.755" in ex.check
    good = stages.example_stages(
        "love_cats", choices={"softmax": choosing.choose("softmax", lambda Z, dim=-1: torch.softmax(Z, dim))}
    )
    assert "it matches" in stages.explain_cell(good, "A", 2, 1).check


# ------------------------------------------------------------------- figures


def test_png_bytes_is_a_valid_png_of_the_canvas():
    import numpy as np
    from PIL import Image

    from attention_course.explorers.drawing import png_bytes

    rgba = np.random.default_rng(0).integers(0, 256, (7, 5, 4), dtype=np.uint8)
    decoded = np.asarray(Image.open(io.BytesIO(png_bytes(rgba))).convert("RGBA"))
    assert (decoded == rgba).all()


def test_figures_update_in_place_without_full_redraws():
    from attention_course.explorers import head_dimension_explorer

    ex = head_dimension_explorer()
    ff = ex.figure.ff
    first = ex.image.value
    draws = ff.full_draws
    for d in (1, 8, 32, 128):
        ex.controls["d_k"].value = d
    assert ff.full_draws == draws, "moving d_k redraws only what changes"
    assert ex.image.value != first


# -------------------------------------------------------------------- widgets


def _png_size(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).size


def test_head_dimension_explorer_drives_from_its_controls():
    from attention_course.explorers import head_dimension_explorer

    ex = head_dimension_explorer(scaled_scores=scaled_scores)
    c = ex.controls
    assert c["d_k"].min == 1 and c["d_k"].max == 128 and c["d_k"].value == 64
    saturated = ex.state.row_entropy
    c["scale"].value = True
    assert ex.state.row_entropy > saturated + 1.0
    assert "entropy" in ex.readout.value
    c["scale"].value = False
    c["d_k"].value = 1
    assert ex.state.row_entropy > saturated + 1.0, "entropy is higher at d_k = 1"
    seed, png = ex.seed, ex.image.value
    c["resample"].click()
    assert ex.seed == seed + 1 and ex.image.value != png
    c["row"].value = 0
    assert ex.state.row == 0
    assert _png_size(ex.image.value)[0] > 500


def test_head_dimension_explorer_labels_a_stub():
    from attention_course.explorers import head_dimension_explorer

    ex = head_dimension_explorer(scaled_scores=stub)
    banner = ex.widget.children[0].value
    assert "still a stub" in banner and "scaled_scores" in banner
    assert ex.state is not None, "it still runs, on the built-in version"


def test_a_function_that_fails_mid_drag_is_swapped_for_the_built_in_and_named():
    from attention_course.explorers import head_dimension_explorer, stage_stepper

    def fails_at_5(Q, K):
        if Q.shape[-1] == 5:
            raise ValueError("boom at d_k = 5")
        return scaled_scores(Q, K)

    ex = head_dimension_explorer(scaled_scores=fails_at_5)
    assert ex.choices[0].source == "yours"
    ex.controls["d_k"].value = 5
    assert ex.state.d_k == 5 and ex.choices[0].source == "error"
    assert "boom at d_k = 5" in ex.banner.value

    def renamed(Q, K, V, allowed=None):  # a parameter name the course does not use
        return attention(Q, K, V, allowed)

    st = stage_stepper(attention=renamed)
    assert st.choices["attention"].source == "error" and "TypeError" in st.choices["attention"].note


def test_batch_warnings_from_the_students_function_stay_out_of_the_lesson(recwarn):
    from attention_course.explorers import head_dimension_explorer

    def with_dot_T(Q, K):  # `.T` warns on batches: fine in 2-D, where the explorer calls it
        return Q @ K.T / math.sqrt(Q.shape[-1])

    ex = head_dimension_explorer(scaled_scores=with_dot_T)
    assert ex.choices[0].source == "yours"
    assert not [w for w in recwarn if "x.T" in str(w.message)]


def test_sharpness_explorer_changes_the_swatch_and_the_presets_are_one_click():
    from attention_course.explorers import sharpness_explorer

    spy = []

    def spied(*args):
        spy.append(args[-1])
        return soft_lookup(*args)

    ex = sharpness_explorer(soft_lookup=spied)
    c = ex.controls
    assert ex.state.rgb[:2] == pytest.approx((200, 117), abs=1)
    c["sharpness"].value = 25.0
    assert ex.state.rgb[:2] == pytest.approx((255, 13), abs=1) and "#ff0d00" in ex.readout.value
    assert 25.0 in spy, "the student's soft_lookup did the look-up"
    labels = [b.description for b in c["presets"]]
    c["presets"][labels.index("query [0.0, 1.0]")].click()
    assert ex.state.query == (0.0, 1.0) and max(ex.state.weights, key=ex.state.weights.get) == "green"
    c["presets"][labels.index("orange's key doubled")].click()
    assert ex.state.keys["orange"] == (1.6, 1.2)
    c["presets"][0].click()
    assert ex.state.query == (1.0, 0.1) and ex.state.keys["orange"] == (0.8, 0.6)


def test_stage_stepper_steps_and_chooses_the_query():
    from attention_course.explorers import stage_stepper

    ex = stage_stepper()
    c = ex.controls
    assert c["stage"].max == 4 and ex.state == ("S", 2)
    seen = set()
    for k in (1, 2, 3, 4):
        c["stage"].value = k
        seen.add(ex.image.value)
        assert ex.stage_name.value
    assert len(seen) == 4
    c["query"].value = 0
    assert ex.state == ("O", 0) and "O[I]" in ex.readout.value
    masked = stage_stepper(example="cat_sat")
    assert masked.controls["stage"].max == 5


def test_cell_explainer_click_and_follow():
    from attention_course.explorers import cell_explainer

    ex = cell_explainer(example="love_cats")
    cells = ex.controls["cells"]
    assert len(cells) == 3 * 3 * 6
    cells[("A", 2, 1)].click()
    assert "1 / 1.325 = 0.755" in ex.explanation.value
    assert "solid" in ex.grid.border(cells[("A", 2, 1)]), "the clicked cell is outlined"
    assert "[0.010, 1, 0.315]" in cells[("A", 2, 1)].tooltip, "pointing at a cell shows its arithmetic"
    ex.controls["follow"].value = 0
    assert "Following 'I'" in ex.row_story.value
    cells[("O", 2, 0)].click()
    assert "[1.99, 7.48, 0.74]" in ex.explanation.value


def test_explorers_leave_their_picture_and_readout_as_plain_outputs_before_the_widget():
    import base64

    from attention_course import explorers

    for make in (explorers.head_dimension_explorer, explorers.sharpness_explorer, explorers.stage_stepper):
        ex = make()
        outputs = ex.static_outputs()
        assert [sorted(o) for o in outputs] == [
            ["text/html", "text/plain"],
            ["image/png", "text/plain"],
            ["text/html", "text/plain"],
        ], "a label, the picture as a plain PNG (GitHub shows it), the readout as HTML"
        assert "Picture of the starting setting, saved with the notebook" in outputs[0]["text/html"]
        w, h = _png_size(base64.b64decode(outputs[1]["image/png"]))
        assert w > 500 and h > 250
        assert (
            f"ac-static-{ex.uid}" in outputs[0]["text/html"]
            and f"ac-static-{ex.uid}" in outputs[2]["text/html"]
        )
        assert "data:image" not in outputs[2]["text/html"], "sanitising viewers drop data: pictures in HTML"
        style = ex.widget.children[-1].value
        assert f".ac-static-{ex.uid}{{display:none" in style, "the live widget hides its own saved outputs"
        assert "ac-static-label" in style and ":has(" in style, "and the saved picture between them"
    ex = explorers.cell_explainer()
    outputs = ex.static_outputs()
    assert [sorted(o) for o in outputs] == [["text/html", "text/plain"], ["text/html", "text/plain"]]
    assert "<table>" in outputs[1]["text/html"] and "looks most at 'cat'" in outputs[1]["text/plain"]


def test_displaying_an_explorer_sends_the_saved_outputs_then_the_widget():
    from IPython.core.interactiveshell import InteractiveShell

    from attention_course import explorers

    shell = InteractiveShell.instance()
    sent = []
    original = shell.display_pub.publish
    shell.display_pub.publish = lambda data, *args, **kwargs: sent.append(sorted(data))
    try:
        ex = explorers.sharpness_explorer()
        shell.display_formatter.format(ex)  # what the last line of a cell does
    finally:
        shell.display_pub.publish = original
    assert sent == [
        ["text/html", "text/plain"],
        ["image/png", "text/plain"],
        ["text/html", "text/plain"],
        ["application/vnd.jupyter.widget-view+json", "text/plain"],
    ]


def test_nothing_happens_while_grading(monkeypatch):
    from attention_course import explorers

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    for make in (
        explorers.head_dimension_explorer,
        explorers.sharpness_explorer,
        explorers.stage_stepper,
        explorers.cell_explainer,
    ):
        ex = make()
        assert ex.widget is None
        assert set(ex._repr_mimebundle_()) == {"text/plain"} and "graded" in ex.text
        assert ex.static_outputs() == [{"text/plain": ex.text}]


def test_importing_the_explorers_draws_nothing_and_loads_no_plotting():
    code = (
        "import sys, attention_course.explorers\n"
        "print('matplotlib' in sys.modules, 'ipywidgets' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_widget_code_avoids_ipywidgets_8_only_api():
    """Colab ships ipywidgets 7: none of these exist there."""
    text = "\n".join(p.read_text() for p in (ROOT / "attention_course" / "explorers").glob("*.py"))
    for name in (
        "TagsInput",
        "Stack(",
        "description_allow_html",
        "text_color",
        "font_size",
        "ColorsInput",
        "_repr_mimebundle_()[",
    ):
        assert name not in text, f"{name} is ipywidgets 8 only"
    assert not re.search(r"W\.\w+\([^)]*\btooltip=", text.replace("W.Button(", "")), (
        "tooltip= only on Button in 7"
    )


# ------------------------------------------------------------ readable on a projector


def _figure_explorers():
    from attention_course import explorers

    return {
        "head dimension": explorers.head_dimension_explorer(scaled_scores=stub),
        "sharpness": explorers.sharpness_explorer(soft_lookup=stub),
    }


def test_figure_text_is_at_least_11_px_and_nothing_is_cut_off():
    from attention_course.explorers import drawing

    for name, ex in _figure_explorers().items():
        fig = ex.figure.ff.fig
        smallest = drawing.min_text_px(fig)
        assert smallest >= drawing.MIN_TEXT_PX, f"{name}: text of {smallest:.1f} px in the figure"
        assert drawing.texts_outside(fig) == [], f"{name}: text cut at the figure's edge"
        assert fig.bbox.width <= 800, (
            f"{name}: {fig.bbox.width:.0f} px wide would be shrunk on a 1280-px page"
        )


def test_head_dimension_marks_its_sample_row_inside_the_plot_and_in_the_legend():
    ex = _figure_explorers()["head dimension"]
    ax = ex.figure.d_point.axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("one sample" in t for t in legend) and any("average" in t for t in legend), legend
    radius = ex.figure.d_point.get_markersize() / 2 * ex.figure.ff.fig.dpi / 72
    box = ax.get_window_extent()
    for d in (1, 128):
        ex.controls["d_k"].value = d
        x, _ = ax.transData.transform((d, ex.state.row_entropy))
        assert box.x0 + radius <= x <= box.x1 - radius, f"the marker at d_k = {d} is cut by the axes"


def test_sharpness_0_line_stays_off_the_axis_and_the_stacked_bar_fits():
    ex = _figure_explorers()["sharpness"]
    ex.controls["sharpness"].value = 0.0
    line = ex.figure.s_line
    x, _ = line.axes.transData.transform((0.0, 0.5))
    assert x - line.axes.get_window_extent().x0 >= 4, "at sharpness 0 the line hides on the axis"
    assert "your sharpness" in [t.get_text() for t in line.axes.get_legend().get_texts()]
    right = max(seg.get_window_extent().x1 for seg in ex.figure.segments)
    assert right <= ex.figure.ff.fig.bbox.x1 - 2, "the stacked bar of weight shares is cut at the right"


def test_the_scaling_toggle_says_on_or_off_in_words_and_colour():
    from attention_course.explorers import head_dimension_explorer

    ex = head_dimension_explorer()
    toggle = ex.controls["scale"]
    assert toggle.description.endswith("OFF") and "ac-off" in toggle._dom_classes
    toggle.value = True
    assert toggle.description.endswith("ON") and toggle.button_style == "success"
    assert "ac-on" in toggle._dom_classes and "ac-off" not in toggle._dom_classes


def test_the_followed_row_is_outlined_not_only_bold():
    from attention_course.explorers import cell_explainer

    ex = cell_explainer(example="love_cats", follow=0)
    cells = ex.controls["cells"]
    assert "#0072B2" in ex.grid.border(cells[("A", 0, 2)]), "the followed row has a coloured outline"
    assert not ex.grid.border(cells[("A", 1, 2)])
    assert "box-shadow:inset 0 0 0 2px #0072B2" in ex.static_html


# ------------------------------------------------------- never a false "differs"


def _model_solutions() -> dict:
    from tests.nbtools import solution_sources

    ns: dict = {"math": math, "torch": torch}
    exec("import torch.nn.functional as F\nfrom typing import Optional", ns)
    for lesson in ("03_scaling", "04_masking", "05_softmax", "06_mixing", "07_one_head"):
        for source in solution_sources(lesson).values():
            exec(source, ns)
    return ns


def _everything_shown(ex) -> str:
    """Every text an explorer shows: its widgets' HTML, labels and tooltips, its saved outputs."""
    seen, parts = set(), [ex.text, ex.static_html]
    stack = [ex.widget]
    while stack:
        w = stack.pop()
        if w is None or id(w) in seen:
            continue
        seen.add(id(w))
        for attr in ("value", "tooltip", "description"):
            v = getattr(w, attr, None)
            if isinstance(v, str):
                parts.append(v)
        stack.extend(getattr(w, "children", ()))
    for ex_ in getattr(ex, "explanations", {}).values():
        parts.append(ex_.text)
    return "\n".join(parts)


def _drive(ex) -> str:
    """Move each control of an explorer over a few settings; everything it showed on the way."""
    shown = [_everything_shown(ex)]
    c = ex.controls
    if "d_k" in c:
        for d in (1, 3, 16, 64, 128):
            for on in (False, True):
                with ex.batch():
                    c["d_k"].value, c["scale"].value = d, on
                shown.append(_everything_shown(ex))
        c["resample"].click()
        shown.append(_everything_shown(ex))
    if "sharpness" in c:
        for sharp in (0.0, 5.0, 30.0):
            c["sharpness"].value = sharp
            shown.append(_everything_shown(ex))
        for button in c["presets"]:
            button.click()
            shown.append(_everything_shown(ex))
    if "stage" in c:
        for k in range(1, c["stage"].max + 1):
            c["stage"].value = k
            shown.append(_everything_shown(ex))
    return "\n".join(shown)


def _explorers_with(fns: dict) -> dict:
    """Every explorer of the package, each handed the functions its signature takes."""
    import inspect

    from attention_course import explorers

    made = {}
    for name in explorers.__all__:
        make = getattr(explorers, name)
        if name == "row_follower":
            continue
        params = inspect.signature(make).parameters
        kwargs = {k: v for k, v in fns.items() if k in params}
        if "example" in params:
            for example in ("love_cats", "cat_sat"):
                made[f"{name}({example})"] = make(example=example, **kwargs)
        else:
            made[name] = make(**kwargs)
    return made


def test_the_model_solutions_never_read_as_differing_from_the_built_in():
    ns = _model_solutions()
    fns = {
        k: ns[k]
        for k in (
            "scaled_scores",
            "score_spread",
            "softmax",
            "soft_lookup",
            "causal_mask",
            "apply_mask",
            "mix",
            "attention",
            "padding_mask",
        )
        if k in ns
    }
    assert len(fns) >= 8, sorted(fns)
    made = _explorers_with(fns)
    assert {"head_dimension_explorer", "sharpness_explorer", "stage_stepper(cat_sat)"} <= set(made)
    for name, ex in made.items():
        text = _drive(ex)
        assert "yours" in text, f"{name} did not run the solutions"
        for phrase in ("differs", "but the arithmetic above gives", "other shape"):
            assert phrase not in text, f"{name} says {phrase!r} about a model solution:\n" + next(
                line for line in text.splitlines() if phrase in line
            )


def test_a_wrong_function_is_called_out_wherever_it_shows():
    from attention_course import explorers

    def unscaled_spread(d_k, n, generator):  # forgets to divide by sqrt(d_k)
        q, k = torch.randn(n, d_k, generator=generator), torch.randn(n, d_k, generator=generator)
        dots = (q * k).sum(-1)
        return dots.std().item(), dots.std().item()

    heads = explorers.head_dimension_explorer(scaled_scores=scaled_scores, score_spread=unscaled_spread)
    assert "differs from what d_k = 64 gives" in heads.readout.value
    heads.controls["d_k"].value = 1
    assert "differs" not in heads.readout.value, "at d_k = 1 not scaling is right"

    def columns_softmax(Z, dim=-1):
        return torch.softmax(Z, dim=-2).nan_to_num(nan=0.0)

    explainer = explorers.cell_explainer(softmax=columns_softmax)
    assert "differs from the built-in version" in explainer.widget.children[0].value
    assert "but the arithmetic above gives" in _everything_shown(explainer)


def _one_short(fn):
    """``fn`` with its result's last column cut: the wrong shape, as a slip in an index gives."""
    return lambda *args, **kwargs: fn(*args, **kwargs)[..., :-1]


def _o_one_short(Q, K, V, mask=None):
    O, A = attention(Q, K, V, mask)
    return O[..., :-1], A


WRONG_SHAPES = {  # an explorer, the function it is given, and the shapes the student must read
    "head_dimension": (
        lambda e, f: e.head_dimension_explorer(scaled_scores=f),
        _one_short(scaled_scores),
        "scaled_scores",
        "shape (8, 7)",
        "(8, 8)",
    ),
    "stage_stepper": (
        lambda e, f: e.stage_stepper(attention=f),
        _o_one_short,
        "attention",
        "O of shape (3, 2)",
        "(3, 3)",
    ),
    "cell_explainer": (
        lambda e, f: e.cell_explainer(softmax=f),
        _one_short(lambda Z, dim=-1: torch.softmax(Z, dim)),
        "softmax",
        "shape (5, 4)",
        "(5, 5)",
    ),
    "mask_explorer": (
        lambda e, f: e.mask_explorer(causal_mask=f),
        lambda T, device=None: torch.ones(T, T + 1, dtype=torch.bool).tril(),
        "causal_mask",
        "shape (5, 6)",
        "(5, 5)",
    ),
    "pipeline_view": (
        lambda e, f: e.pipeline_view(mix=f),
        _one_short(lambda A, V: A @ V),
        "mix",
        "shape (5, 3)",
        "(5, 4)",
    ),
    "sharpness": (
        lambda e, f: e.sharpness_explorer(f),
        lambda q, keys, values, sharpness: (soft_lookup(q, keys, values, sharpness)[0], [0.0]),
        "soft_lookup",
        "an output of length 1",
        "one of length 2 (as long as each value)",
    ),
}


@pytest.mark.parametrize("kind", list(WRONG_SHAPES))
def test_a_function_of_the_wrong_shape_is_named_with_both_shapes_and_the_explorer_still_draws(kind):
    from attention_course import explorers

    make, wrong, name, got, want = WRONG_SHAPES[kind]
    ex = make(explorers, wrong)
    shown = _everything_shown(ex)
    assert f"your `{name}` returned {got} here, where {want} was expected" in re.sub(
        r"</?code>", "`", shown
    ), shown[:2000]
    assert "raised" not in shown, "it raised nothing: the diagnosis must not say it did"
    assert "built-in version" in shown
    pictures = ex.static_png or ex.static_html
    assert pictures, "the explorer draws the built-in version, not an error box"
    with_right_shape = make(
        explorers, {"scaled_scores": scaled_scores, "attention": attention}.get(name) or None
    )
    assert "was expected" not in _everything_shown(with_right_shape)


def test_a_function_that_changes_its_inputs_in_place_is_judged_on_what_it_returns():
    from attention_course.explorers import head_dimension_explorer

    def scaled_in_place(Q, K):  # right answer, but it divides Q in place
        Q /= math.sqrt(Q.shape[-1])
        return Q @ K.mT

    ex = head_dimension_explorer(scaled_scores=scaled_in_place)
    assert "differs" not in ex.banner.value
    std = ex.state.raw_std
    ex.controls["scale"].value = True
    ex.controls["scale"].value = False
    assert ex.state.raw_std == pytest.approx(std), "the explorer's own vectors are unchanged"


# ------------------------------------------------------ the fixture, in a kernel


def _outputs(nb):
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            yield cell, out


@pytest.mark.slow
def test_fixture_notebook_runs_cleanly_with_widgets_and_fallbacks():
    from tests.nbtools import execute

    nb = execute(FIXTURE)
    per_cell = []
    for cell in nb.cells:
        outs = cell.get("outputs", [])
        for out in outs:
            assert out.output_type != "error", f"{out.get('ename')}: {out.get('evalue')}"
            assert not (out.output_type == "stream" and out.name == "stderr"), out.text
        kinds = [sorted(o.data) for o in outs if o.output_type in ("display_data", "execute_result")]
        if kinds:
            per_cell.append(kinds)
    # on failure: every code cell, with what it showed (a missing display is then seen in its place)
    shown = [
        (c.source.splitlines()[0][:60] if c.source else "", [o.output_type for o in c.get("outputs", [])])
        for c in nb.cells
        if c.cell_type == "code"
    ]
    assert len(per_cell) == 4, (per_cell, shown)
    widget = ["application/vnd.jupyter.widget-view+json", "text/plain"]
    label = html = ["text/html", "text/plain"]
    picture = ["image/png", "text/plain"]
    assert per_cell.count([label, picture, html, widget]) == 3, per_cell  # the three with a figure
    assert per_cell.count([label, html, widget]) == 1, per_cell  # the cell explainer: tables


@pytest.mark.slow
def test_fixture_notebook_under_grading_is_quiet(monkeypatch):
    from tests.nbtools import execute

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    nb = execute(FIXTURE)
    shown = 0
    for _cell, out in _outputs(nb):
        assert out.output_type != "error" and out.get("name") != "stderr"
        if out.output_type in ("display_data", "execute_result"):
            assert set(out.data) == {"text/plain"} and "graded" in out.data["text/plain"]
            shown += 1
    assert shown == 4


@pytest.mark.slow
def test_benchmark_script_runs_and_reports_every_explorer():
    out = subprocess.run(
        [sys.executable, "benchmarks/explorers.py", "--events", "3", "--naive-events", "1", "--no-fail"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    for name in ("head dimension", "sharpness", "stage stepper", "cell explainer"):
        for phase in ("first", "repeat"):
            assert re.search(name + r".*" + phase + r".*\d+\.\dms", out.stdout), out.stdout
    assert re.search(r"head dimension.*first\s+scale.*\d+ms", out.stdout), (
        "toggles are timed against the naive"
    )


@pytest.mark.slow
def test_benchmark_times_the_pipeline_views_clicks_first_click_included():
    out = subprocess.run(
        [
            *(sys.executable, "benchmarks/explorers.py", "--events", "3", "--naive-events", "1"),
            *("--no-fail", "--only", "pipeline"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    for phase in ("first", "repeat"):
        for control in ("1st click", "cell", "query", "earlier"):
            line = re.search(rf"pipeline view.*{phase}\s+{control}\s+\d+ \|\s+([\d.]+)ms", out.stdout)
            assert line, f"no {phase} {control} line:\n{out.stdout}"
            assert float(line.group(1)) < 100, (
                f"{phase} {control}: median {line.group(1)} ms, not under 100 ms"
            )
