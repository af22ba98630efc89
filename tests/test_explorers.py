"""The explorers: their pure computation against the brief's numbers, their wiring, their fallbacks.

Fast tests drive the widgets from Python (no browser); the slow ones run the fixture
notebook in a real kernel, as a student would and as the grader would.
"""

from __future__ import annotations

import io
import math
import re
import subprocess
import sys

import pytest
import torch

from attention_course.explorers import backend, compute
from tests.nbtools import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "explorers_demo.ipynb"


def stub(*args, **kwargs):
    raise NotImplementedError()


# working versions a student might write: the explorers themselves ship none


def scaled_scores(Q, K):
    return Q @ K.mT / math.sqrt(Q.shape[-1])


def attention(Q, K, V, mask=None):
    S = scaled_scores(Q, K)
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    A = torch.softmax(S, dim=-1).nan_to_num(nan=0.0)
    return A @ V, A


def soft_lookup(query, keys, values, sharpness):
    scores = {
        n: sharpness * sum(q * k for q, k in zip(query, key)) / math.sqrt(len(query))
        for n, key in keys.items()
    }
    top = max(scores.values())
    exps = {n: math.exp(x - top) for n, x in scores.items()}
    weights = {n: e / sum(exps.values()) for n, e in exps.items()}
    width = len(next(iter(values.values())))
    return weights, [sum(weights[n] * values[n][c] for n in keys) for c in range(width)]


# --------------------------------------------------------------------- entropy


def test_entropy_is_zero_for_one_hot_and_ln_n_for_uniform():
    w = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    H = compute.entropy(w)
    assert H.shape == (2,)
    assert H[0].item() == 0.0, "a one-hot row has entropy 0"
    assert H[1].item() == pytest.approx(math.log(4)), "a uniform row over 4 keys has entropy ln 4"


def test_entropy_ignores_masked_zeros_and_keeps_batch_shape():
    w = torch.softmax(torch.tensor([[[1.0, 2.0, float("-inf")]]]), dim=-1)  # (1, 1, 3)
    H = compute.entropy(w)
    assert H.shape == (1, 1) and torch.isfinite(H).all()
    p = w[0, 0, :2]
    assert H.item() == pytest.approx(-(p * p.log()).sum().item())


def test_fmt_writes_numbers_as_the_lessons_do():
    assert compute.fmt(12.0) == "12"
    assert compute.fmt(6.9282) == "6.93"
    assert compute.fmt(-0.001) == "0.00"
    assert compute.fmt(float("-inf")) == "-inf"
    assert compute.fmt_list([0.0099, 1.0, 0.3151], 3) == "[0.010, 1, 0.315]"


# -------------------------------------------------------------- head dimension


def test_default_sample_saturates_at_64_unscaled_and_not_when_scaled():
    Q, K = compute.draw_head_vectors(compute.HEAD_SEED)
    raw = compute.head_view(Q, K, 64, scale=False)
    scaled = compute.head_view(Q, K, 64, scale=True)
    assert raw.saturated and raw.row_entropy < 0.05, f"entropy at d_k = 64 unscaled is {raw.row_entropy:.3f}"
    assert max(raw.row_weights) > 0.99
    assert not scaled.saturated and scaled.row_entropy > 1.0, f"scaled entropy is {scaled.row_entropy:.3f}"
    assert "Turn on scaling" in raw.summary()


def test_at_d_k_1_scaling_changes_nothing():
    Q, K = compute.draw_head_vectors(compute.HEAD_SEED)
    a, b = compute.head_view(Q, K, 1, scale=False), compute.head_view(Q, K, 1, scale=True)
    assert torch.allclose(a.raw, a.scaled)
    assert a.row_weights == pytest.approx(b.row_weights)
    assert "scaling changes nothing" in a.summary()


def test_entropy_falls_with_d_k_unscaled_and_stays_up_scaled():
    d_values = [1, 4, 16, 64, 128]
    unscaled, scaled = compute.expected_entropy(d_values)
    assert all(x > y for x, y in zip(unscaled, unscaled[1:])), f"unscaled entropy should fall: {unscaled}"
    assert unscaled[3] < 0.5 and min(scaled) > 1.5, (unscaled, scaled)


def test_spread_grows_like_sqrt_d_k_and_scaling_keeps_it_near_1():
    Q, K = compute.draw_head_vectors(0)
    for d in (16, 64, 128):
        v = compute.head_view(Q, K, d, scale=False)
        assert 0.6 * math.sqrt(d) < v.raw_std < 1.5 * math.sqrt(d)
        assert 0.6 < v.scaled_std < 1.5


def test_head_view_runs_the_function_it_is_given():
    calls = []

    def halved(Q, K):  # a wrong scaling, on purpose
        calls.append(Q.shape)
        return Q @ K.T / Q.shape[-1]

    Q, K = compute.draw_head_vectors(0)
    v = compute.head_view(Q, K, 16, scale=True, scaled_scores=halved)
    assert calls == [(8, 16)]
    assert torch.allclose(v.scaled, v.raw / 16)


# -------------------------------------------------------------------- choices


def test_a_stub_is_replaced_by_the_built_in_and_labelled():
    c = backend.choose("scaled_scores", stub)
    assert c.source == "stub" and c.fn is None, "the explorer works the step out itself"
    assert "implement `scaled_scores` above" in c.note
    assert "stub" in backend.banner_html([c]) and "<code>scaled_scores</code>" in backend.banner_html([c])


def test_a_failing_function_is_named_and_replaced():
    def broken(Q, K):
        return Q.T @ K  # shapes do not fit

    c = backend.choose("scaled_scores", broken)
    assert c.source == "error" and "RuntimeError" in c.note


def test_a_working_function_is_used_and_a_difference_is_pointed_out():
    good = backend.choose("softmax", lambda Z, dim=-1: torch.softmax(Z, dim))
    assert good.source == "yours" and "differs" not in good.note
    wrong = backend.choose("softmax", lambda Z, dim=-1: torch.softmax(Z, dim=0))
    assert wrong.source == "yours" and "differs from the built-in version" in wrong.note


def test_passing_a_result_instead_of_the_function_says_so():
    with pytest.raises(TypeError, match=r"scaled_scores= takes your function itself"):
        backend.choose("scaled_scores", torch.zeros(3, 3))


def test_without_a_function_the_built_in_says_where_yours_will_come_from():
    c = backend.choose("softmax", None, lesson="lesson 05")
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
    for module in (backend, compute):
        names = [n for n in vars(module) if n.startswith("builtin") or n.upper() == "BUILTINS"]
        assert names == [], f"{module.__name__} has {names}"


def test_one_thread_restores_the_thread_count():
    before = torch.get_num_threads()
    with backend.one_thread():
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
    v = compute.colour_view(d.query, d.keys, d.values, sharpness)
    assert [round(v.weights[n], 2) for n in ("red", "green", "orange")] == list(weights)
    assert v.rgb[:2] == pytest.approx(output, abs=1)
    assert f"[{v.output[0]:.0f}, {v.output[1]:.0f}]" in v.summary()


def test_colour_follow_ups():
    from attention_course import data

    d = data.colours()
    green = compute.colour_view([0.0, 1.0], d.keys, d.values, 5)
    assert max(green.weights, key=green.weights.get) == "green"
    on_orange = compute.colour_view(d.keys["orange"], d.keys, d.values, 5)
    assert max(on_orange.weights, key=on_orange.weights.get) == "orange"
    longer = dict(d.keys, orange=[1.6, 1.2])
    base = compute.colour_view(d.query, d.keys, d.values, 5)
    doubled = compute.colour_view(d.query, longer, d.values, 5)
    assert doubled.weights["orange"] > base.weights["orange"], "a longer key wins more weight"


def test_colour_curves_follow_the_function():
    from attention_course import data

    d = data.colours()
    curves = compute.colour_curves(d.query, d.keys, d.values, [0.0, 1.0, 25.0])
    assert curves["red"][0] == pytest.approx(1 / 3)
    assert curves["red"][1] == pytest.approx(0.41, abs=0.005)
    assert curves["red"][2] == pytest.approx(0.92, abs=0.005)


# ------------------------------------------------------------------- stages


def test_love_cats_stages_match_the_brief():
    st = compute.example_stages("love_cats")
    assert [s.title for s in st.stages()] == ["raw dot products", "scaled", "weights", "output"]
    assert torch.allclose(st.S, torch.tensor([[2, 4, 4], [4, 16, 12], [4, 12, 10]], dtype=torch.float64))
    want_scaled = [[1.15, 2.31, 2.31], [2.31, 9.24, 6.93], [2.31, 6.93, 5.77]]
    assert st.scaled.round(decimals=2).tolist() == want_scaled
    assert st.A.round(decimals=2).tolist() == [[0.14, 0.43, 0.43], [0.00, 0.91, 0.09], [0.01, 0.75, 0.24]]
    assert st.O.round(decimals=2).tolist() == [[1.86, 6.32, 1.70], [2.00, 7.81, 0.27], [1.99, 7.48, 0.74]]


def test_cat_sat_last_the_gives_cat_about_half_and_reads_thing():
    st = compute.example_stages("cat_sat")
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

    choices = {"attention": backend.choose("attention", spied)}
    st = compute.example_stages("cat_sat", choices=choices)
    assert calls[-1] is False, "the causal mask is handed to attention"
    assert st.made_by["A"] == "attention" and 0.45 <= st.A[4, 1].item() <= 0.55


def test_stage_row_lines_show_the_arithmetic():
    st = compute.example_stages("love_cats")
    s1, s2, s3, s4 = st.stages()
    assert "q_cats . k_love = 2*4 + 1*4 + 3*0 = 12" in "\n".join(compute.stage_row_lines(st, s1, 2))
    assert "[4, 12, 10] / 1.732 = [2.31, 6.93, 5.77]" in "\n".join(compute.stage_row_lines(st, s2, 2))
    assert "[0.007, 0.755, 0.238]" in "\n".join(compute.stage_row_lines(st, s3, 2))
    assert "= [1.99, 7.48, 0.74]" in "\n".join(compute.stage_row_lines(st, s4, 2))


# -------------------------------------------------------------- explanations


def test_explainer_row_cats_matches_the_brief():
    st = compute.example_stages("love_cats")
    text = compute.explain_cell(st, "A", 2, 1).text
    for piece in (
        "[2.31, 6.93, 5.77]",
        "minus the row max 6.93: [-4.62, 0, -1.15]",
        "exp(x - max): [0.010, 1, 0.315]",
        "= 1.325",
        "A[cats, love] = 1 / 1.325 = 0.755",
        "[0.007, 0.755, 0.238]",
    ):
        assert piece in text, f"{piece!r} missing from:\n{text}"
    out = compute.explain_cell(st, "O", 2, 1).text
    assert "[1.99, 7.48, 0.74]" in out and "0.007*2 + 0.755*8 + 0.238*6" in out


def test_explainer_row_i_matches_the_brief():
    st = compute.example_stages("love_cats")
    text = compute.explain_cell(st, "A", 0, 1).text
    assert "[1.15, 2.31, 2.31]" in text and "[0.136, 0.432, 0.432]" in text


def test_explainer_score_cell_goes_term_by_term():
    st = compute.example_stages("love_cats")
    ex = compute.explain_cell(st, "S", 2, 1)
    assert "q_cats . k_love = 2*4 + 1*4 + 3*0 = 12" in ex.text
    assert "12 / sqrt(3) = 12 / 1.732 = 6.93" in ex.text
    assert "no mask" in ex.text
    assert ("Q", 2, 0) in ex.inputs and ("K", 1, 2) in ex.inputs
    q = compute.explain_cell(st, "Q", 2, 0)
    assert "1*1 + 1*1 + 1*0 + 1*0 = 2" in q.text


def test_explainer_shows_the_mask_on_cat_sat():
    st = compute.example_stages("cat_sat")
    masked = compute.explain_cell(st, "S", 1, 2)
    assert masked.value == -math.inf and "comes after 'cat'" in masked.text and "-inf" in masked.text
    weight = compute.explain_cell(st, "A", 1, 2)
    assert weight.value == 0.0 and "exp(-inf) = 0" in weight.text
    last = compute.explain_cell(st, "A", 4, 1)
    assert 0.45 <= last.value <= 0.55
    story = "\n".join(compute.explain_row(st, 4))
    assert "looks most at 'cat'" in story and "largest along 'thing'" in story


def test_explainer_checks_the_students_number():
    def softmax_cols(Z, dim=-1):
        return torch.nan_to_num(torch.softmax(Z, dim=-2))  # the classic wrong axis

    choices = {"softmax": backend.choose("softmax", softmax_cols)}
    st = compute.example_stages("love_cats", choices=choices)
    ex = compute.explain_cell(st, "A", 2, 1)
    assert "your `softmax` gave" in ex.check and "but the arithmetic above gives 0.755" in ex.check
    good = compute.example_stages(
        "love_cats", choices={"softmax": backend.choose("softmax", lambda Z, dim=-1: torch.softmax(Z, dim))}
    )
    assert "it matches" in compute.explain_cell(good, "A", 2, 1).check


# ------------------------------------------------------------------- figures


def test_png_bytes_is_a_valid_png_of_the_canvas():
    import numpy as np
    from PIL import Image

    from attention_course.explorers.figures import png_bytes

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
    layout = cells[("A", 2, 1)].layout
    assert "solid" in (layout.border or getattr(layout, "border_top", "") or ""), (
        "the clicked cell is outlined"
    )
    assert "[0.010, 1, 0.315]" in cells[("A", 2, 1)].tooltip, "pointing at a cell shows its arithmetic"
    ex.controls["follow"].value = 0
    assert "Following 'I'" in ex.row_story.value
    cells[("O", 2, 0)].click()
    assert "[1.99, 7.48, 0.74]" in ex.explanation.value


def test_explorers_display_as_widgets_with_a_static_fallback():
    from attention_course import explorers

    for make in (explorers.head_dimension_explorer, explorers.sharpness_explorer, explorers.stage_stepper):
        bundle = make()._repr_mimebundle_()
        assert "model_id" in bundle["application/vnd.jupyter.widget-view+json"]
        import base64

        w, h = _png_size(base64.b64decode(bundle["image/png"]))
        assert w > 500 and h > 250
        assert "data:image/png;base64," in bundle["text/html"]
    bundle = explorers.cell_explainer()._repr_mimebundle_()
    assert "<table>" in bundle["text/html"] and "looks most at 'cat'" in bundle["text/plain"]


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
    text = (ROOT / "attention_course" / "explorers" / "widgets.py").read_text()
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


# ------------------------------------------------------ the fixture, in a kernel


def _outputs(nb):
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            yield cell, out


@pytest.mark.slow
def test_fixture_notebook_runs_cleanly_with_widgets_and_fallbacks():
    from tests.nbtools import execute

    nb = execute(FIXTURE)
    mimes = []
    for _cell, out in _outputs(nb):
        assert out.output_type != "error", f"{out.get('ename')}: {out.get('evalue')}"
        assert not (out.output_type == "stream" and out.name == "stderr"), out.text
        if out.output_type == "execute_result":
            mimes.append(set(out.data))
    assert len(mimes) == 4
    for m in mimes:
        assert "application/vnd.jupyter.widget-view+json" in m and "text/html" in m
    assert sum("image/png" in m for m in mimes) == 3


@pytest.mark.slow
def test_fixture_notebook_under_grading_is_quiet(monkeypatch):
    from tests.nbtools import execute

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    nb = execute(FIXTURE)
    for _cell, out in _outputs(nb):
        assert out.output_type != "error" and out.get("name") != "stderr"
        if out.output_type == "execute_result":
            assert set(out.data) == {"text/plain"}


@pytest.mark.slow
def test_benchmark_script_runs_and_reports_every_explorer():
    out = subprocess.run(
        [sys.executable, "benchmarks/explorers.py", "--events", "6", "--naive-events", "1", "--no-fail"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    for name in ("head dimension", "sharpness", "stage stepper", "cell explainer"):
        assert re.search(name + r".*\d+\.\dms", out.stdout), out.stdout
