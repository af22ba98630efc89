"""The stage stepper's picture, the mask explorer (lesson 04) and the linked pipeline view (lesson 07).

Driven from Python, without a browser: what a student sees is asserted through the
figure's colour scales and texts, the mask explorer's cells and words, and the
pipeline's lit cells and arithmetic.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from attention_course.explorers import choosing, drawing
from tests.solutions import solution_functions
from tests.test_explorer_readouts import attention_by_d_k, attention_mask_after_softmax


def stub(*args, **kwargs):
    raise NotImplementedError()


# the solution notebooks' own functions (one reference per graded function)
_MASKING = solution_functions("04_masking")
causal_mask, padding_mask, apply_mask = (
    _MASKING["causal_mask"],
    _MASKING["padding_mask"],
    _MASKING["apply_mask"],
)
attention = solution_functions("07_one_head")["attention"]


# --------------------------------------------------------------- stage stepper


def test_raw_and_scaled_scores_share_one_colour_scale_so_scaling_shows():
    from attention_course.explorers import stage_stepper

    ex = stage_stepper(example="love_cats")
    fig = ex.figure
    image = fig.panels["now"]["image"]
    seen = {}
    for k in (1, 2, 3):
        ex.controls["stage"].value = k
        fig.show(k - 1, 2)
        seen[k] = (image.norm.vmin, image.norm.vmax, fig.cb_name.get_text())
    assert seen[1] == seen[2], "raw and scaled scores are drawn on the same colour scale"
    assert seen[1][:2] == pytest.approx((2 / math.sqrt(3), 16.0)) and seen[1][2] == "score", (
        "the scale runs from the smallest scaled score to the largest raw one"
    )
    assert seen[3] == (0.0, 1.0, "weight"), "weights run from 0 to 1"
    assert ex.st.scaled.abs().max() < ex.st.S.abs().max() / 1.7, "the scaled stage's values are smaller"
    ex.controls["stage"].value = 2
    fig.show(1, 2)
    labels = [t.get_text() for t in fig.cb_labels if t.get_visible()]
    assert len(labels) >= 3 and all(re.fullmatch(r"-?\d+(\.\d+)?", t) for t in labels), labels
    assert "scaling: ON (/ sqrt(3) = 1.73)" in ex.stage_name.value
    ex.controls["stage"].value = 1
    assert "scaling: OFF" in ex.stage_name.value


def test_stage_stepper_shows_the_stage_before_faintly_and_marks_the_query():
    from attention_course.explorers import stage_stepper

    ex = stage_stepper(example="cat_sat")
    fig = ex.figure
    ex.controls["stage"].value = 3
    fig.show(2, 4)
    prev = fig.panels["prev"]
    assert prev["image"].get_alpha() < 0.6 and prev["image"].get_visible()
    assert prev["title"].get_text() == "before: 2. scaled"
    assert "mask: ON" in fig.state_words(2) and "softmax: OFF" in fig.state_words(2)
    ex.controls["query"].value = 2  # not drawn before: drawn now
    rows = fig.panels["now"]["rows"]
    assert rows[2].get_text() == "\u25b6 sat" and rows[2]._color == drawing.BLUE, (
        "the query is marked in colour"
    )
    assert rows[1]._color == "black"
    assert fig.row_box.get_y() == pytest.approx(1.5), "the chosen row is outlined"
    assert fig.row_title._va == fig.row_token._va == "baseline" and fig.row_title._y == fig.row_token._y
    ex.controls["stage"].value = 1
    fig.show(0, 2)
    assert not prev["image"].get_visible() and "first stage" in fig.prev_note.get_text()


def test_stage_stepper_text_is_large_enough_and_nothing_is_cut_off():
    from attention_course.explorers import stage_stepper

    for example in ("love_cats", "cat_sat"):
        ex = stage_stepper(example=example)
        fig = ex.figure
        for k in range(1, ex.controls["stage"].max + 1):
            for q in (0, ex.st.T - 1):
                with ex.batch():
                    ex.controls["stage"].value = k
                    ex.controls["query"].value = q
                fig.show(k - 1, q)
                assert drawing.min_text_px(fig.ff.fig) >= drawing.MIN_TEXT_PX
                outside = [
                    b[0]
                    for b in fig.text_boxes()
                    if b[1] < 0 or b[2] < 0 or b[3] > fig.W_PX or b[4] > fig.H_PX
                ]
                assert outside == [], f"{example} stage {k}: cut off {outside}"
        assert drawing.texts_outside(fig.ff.fig) == []


def test_stage_stepper_steps_without_full_redraws_and_keeps_each_picture():
    from attention_course.explorers import stage_stepper

    ex = stage_stepper(example="cat_sat")
    ff = ex.figure.ff
    draws = ff.full_draws
    pictures = {}
    for q in (4, 0):
        for k in range(1, 6):
            with ex.batch():
                ex.controls["stage"].value = k
                ex.controls["query"].value = q
            pictures[(k, q)] = ex.image.value
    assert ff.full_draws == draws, "a stage seen for the first time needs no full redraw"
    assert len(set(pictures.values())) == 10
    ex.controls["stage"].value = 2
    assert ex.image.value == pictures[(2, 0)]


# ----------------------------------------------------------------- mask explorer


def _hidden_keys(view, b):
    """Keys hidden from every query of sequence b."""
    return [j for j in range(view.T) if all(not bool(view.combined[b, i, j]) for i in range(view.T))]


def test_mask_explorer_shows_the_padding_each_length_hides():
    from attention_course.explorers import mask_explorer

    ex = mask_explorer()
    v = ex.state
    assert v.lengths == (5, 3, 2) and int(v.causal.sum()) == 15, "15 of 25 cells of a causal mask are allowed"
    assert _hidden_keys(v, 1) == [3, 4] and _hidden_keys(v, 2) == [2, 3, 4]
    assert "sequence 2 (b = 1) has length 3: keys 3 and 4 are padding, hidden from every query" in (
        ex.readout.value
    )
    ex.controls["length_2"].value = 1  # the brief's lengths [5, 3, 1]
    v = ex.state
    assert v.padding.tolist() == [[[True] * 5], [[True] * 3 + [False] * 2], [[True] + [False] * 4]]
    assert _hidden_keys(v, 2) == [1, 2, 3, 4]
    assert "keys 1, 2, 3 and 4 are padding" in ex.readout.value
    assert torch.isinf(v.masked[2, 4, 1]) and v.hidden_by(2, 4, 1) == "padding"
    assert v.hidden_by(2, 0, 4) == "both" and v.hidden_by(0, 1, 3) == "causal"
    assert v.weights[2, 4].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0], "only 'The' is left to look at"
    picture = ex.picture.value
    sequence3 = picture[picture.index("ac-sequence-2") :]
    assert len(re.findall(r"ac-score ac-hidden", sequence3)) == 25 - 5, "sequence 3 keeps 5 scores"
    ex.controls["length_2"].value = 0
    assert "see nothing at all" in ex.readout.value and ex.state.weights[2].sum() == 0


def test_mask_explorer_t_slider_keeps_lengths_in_range():
    from attention_course.explorers import mask_explorer

    ex = mask_explorer()
    ex.controls["T"].value = 3
    assert ex.state.T == 3 and ex.state.lengths == (3, 3, 2)
    assert ex.controls["length_0"].max == 3 and "causal mask (T = 3)" in ex.readout.value


def test_mask_explorer_uses_the_students_functions_and_labels_a_stub():
    from attention_course.explorers import mask_explorer

    calls = []

    def spied(lengths, T):
        calls.append((lengths.tolist(), T))
        return padding_mask(lengths, T)

    ex = mask_explorer(causal_mask, spied, apply_mask)
    assert ([5, 3, 2], 5) in calls
    assert {c.source for c in ex.choices.values()} == {"yours"} and ex.state.wrong_cells() == []
    stubbed = mask_explorer(causal_mask=stub, padding_mask=padding_mask, apply_mask=stub)
    assert stubbed.choices["causal_mask"].source == "stub"
    assert "implement <code>causal_mask</code> above" in stubbed.banner.value
    assert stubbed.state.padding.tolist() == ex.state.padding.tolist()

    def inverted(S, allowed):  # a trap of lesson 04: True taken as "blocked"
        return S.masked_fill(allowed, float("-inf"))

    wrong = mask_explorer(apply_mask=inverted)
    assert wrong.state.wrong_cells(), "cells the mask hides but the scores keep are found"
    assert "not -inf" in wrong.readout.value and "outline" in wrong.picture.value


def test_mask_explorer_shows_the_weights_hidden_scores_become_zero():
    from attention_course.explorers import mask_explorer

    ex = mask_explorer(lengths=(5, 3, 1))
    ex.controls["show"].value = "weights"
    picture = ex.picture.value
    sequence3 = picture[picture.index("ac-sequence-2") :]
    last_row = re.findall(r"data-q='4' data-k='\d'[^>]*>([^<]*)<", sequence3)
    assert last_row == ["1", "0", "0", "0", "0"], last_row
    assert "becomes exactly 0 after softmax" in ex.readout.value


def test_mask_explorer_names_a_mask_of_the_wrong_shape_and_keeps_going():
    from attention_course.explorers import mask_explorer

    def flat(lengths, T):  # forgot the query dimension: (B, T) instead of (B, 1, T)
        return torch.arange(T)[None, :] < lengths[:, None]

    ex = mask_explorer(padding_mask=flat)
    assert ex.choices["padding_mask"].source == "error"
    assert "(3, 5)" in ex.banner.value and "(3, 1, 5)" in ex.banner.value
    assert _hidden_keys(ex.state, 1) == [3, 4], "the built-in version stands in"


def test_mask_explorer_legend_names_every_mark():
    from attention_course.explorers import mask_explorer

    picture = mask_explorer().picture.value
    for words in ("allowed", "hidden by the causal mask", "hidden by the padding mask", "hidden by both"):
        assert words in picture
    sizes = [float(x) for x in re.findall(r"font-size:(\d+(?:\.\d+)?)px", picture)]
    assert sizes and min(sizes) >= 11


# ----------------------------------------------------------------- pipeline view


def test_pipeline_click_on_a_weight_lights_exactly_the_cells_it_came_from():
    from attention_course.explorers import pipeline_view

    ex = pipeline_view()  # "The cat sat on the", causal
    ex.controls["query"].value = 2
    ex.controls["earlier"].value = True  # the earlier sources are lit on request (see the test below)
    ex.cells[("A", 2, 1)].click()  # A[sat, cat]
    lit = ex.lit
    seen = range(3)  # "sat" sees The, cat, sat
    direct = {("masked", 2, j) for j in seen}
    earlier = (
        {("scaled", 2, j) for j in seen}
        | {("S", 2, j) for j in seen}
        | {("Q", 2, c) for c in range(2)}
        | {("K", r, c) for r in seen for c in range(2)}
        | {("X", r, f) for r in seen for f in range(4)}
    )
    assert {c for c, v in lit.items() if v == "chosen"} == {("A", 2, 1)}
    assert {c for c, v in lit.items() if v == "direct"} == direct
    assert {c for c, v in lit.items() if v == "earlier"} == earlier
    assert "solid" in ex.grid.border(ex.cells[("masked", 2, 0)])
    st = ex.st
    text = ex.explanation.value
    assert f"= {st.A[2, 1].item():.3f}" in text
    row = re.findall(r"row 'sat' of the masked scores: \[(.*?)\]", text)
    assert row == [", ".join(_fmt(x) for x in st.masked[2].tolist())]


def _fmt(x):
    from attention_course.explorers.numeric import fmt

    return fmt(x)


def test_pipeline_arithmetic_matches_every_cell():
    from attention_course.explorers import pipeline, pipeline_view

    ex = pipeline_view()
    st = ex.st
    for (stage, i, j), _button in ex.cells.items():
        step = pipeline.explain(st, (stage, i, j))
        want = pipeline.matrix(st, stage)[i, j].item()
        if math.isinf(want):
            assert step.value == want
        else:
            assert step.value == pytest.approx(want, abs=1e-9), (stage, i, j)


def test_pipeline_follows_the_query_and_uses_the_students_attention():
    from attention_course.explorers import pipeline_view

    ex = pipeline_view(attention, query=4)  # the last query (the view starts on one the mask hides keys from)
    assert ex.st.made_by["A"] == "attention"
    ex.cells[("O", 4, 0)].click()
    assert "your <code>attention</code>" in ex.explanation.value or "your `attention`" in ex.explanation.value
    assert "matches" in ex.explanation.value
    ex.controls["query"].value = 0
    assert ("O", 0, 0) in ex.cells and ex.state.cell == ("O", 0, 0)
    assert ex.cells[("S", 0, 1)].description == "-inf" or ex.cells[("masked", 0, 1)].description == "-inf"
    ex.cells[("masked", 0, 1)].click()
    assert not any(v in ("direct", "earlier") for v in ex.lit.values()), "a masked score comes from the mask"
    stubbed = pipeline_view(stub)
    assert stubbed.choices["attention"].source == "stub"


def test_pipeline_and_mask_explorer_display_and_stay_quiet_while_grading(monkeypatch):
    from attention_course import explorers

    for make in (explorers.mask_explorer, explorers.pipeline_view):
        bundle = make()._repr_mimebundle_()
        assert "model_id" in bundle["application/vnd.jupyter.widget-view+json"]
        assert bundle["text/html"]
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    for make in (explorers.mask_explorer, explorers.pipeline_view):
        ex = make()
        assert ex.widget is None and "graded" in ex.text
        assert set(ex._repr_mimebundle_()) == {"text/plain"}


def test_new_explorers_hold_no_exercise():
    """The mask explorer and the pipeline view keep no version of an exercise (their ipywidgets 7 check is
    test_explorers.py's, which reads every module of the package)."""
    from attention_course.explorers import masks, pipeline

    for module in (masks, pipeline):
        names = [n for n in vars(module) if n.startswith("builtin") or n in ("causal_mask", "padding_mask")]
        assert names == [], f"{module.__name__} has {names}"


def test_padding_mask_probe_tells_a_working_function_from_a_stub():
    assert choosing.choose("padding_mask", padding_mask).source == "yours"
    assert "differs" not in choosing.choose("padding_mask", padding_mask).note
    assert choosing.choose("padding_mask", stub).source == "stub"


# ------------------------------------------- where a click's sources, the mask and a difference show


def test_pipeline_starts_on_a_query_whose_row_the_mask_hides_keys_from():
    from attention_course.explorers import pipeline_view

    ex = pipeline_view()  # "The cat sat on the", causal
    st = ex.st
    masked_row = [ex.cells[("masked", ex.query, j)].description for j in range(st.T)]
    assert "-inf" in masked_row and any(d != "-inf" for d in masked_row), (
        f"the first picture shows the mask at work: {masked_row}"
    )
    assert ex.query != st.T - 1, "the last query sees every key: the mask would look like a no-op there"
    assert ex.controls["query"].value == ex.query and ex.state.cell[1] == ex.query
    assert "-inf" in ex.static_html, "the saved copy shows the hidden keys too"
    # with nothing hidden there is no such row: the last query, as before
    assert pipeline_view(example="love_cats").query == 2
    assert pipeline_view(causal=False).query == 4


def test_pipeline_lights_the_direct_sources_and_the_earlier_ones_only_on_request():
    from attention_course.explorers import pipeline_view

    ex = pipeline_view(query=4)  # the last "the": it sees all five keys
    ex.cells[("A", 4, 1)].click()  # A[the(4), cat]
    lit = ex.lit
    assert set(lit.values()) == {"chosen", "direct"}, "no earlier source is lit before it is asked for"
    assert {c for c, v in lit.items() if v == "direct"} == {("masked", 4, j) for j in range(5)}
    assert len(lit) == 6, f"a weight lights its five masked scores, not {len(lit) - 1} cells"
    assert not ex.grid.border(ex.cells[("X", 0, 0)]), "X is not lit"
    assert "solid" in ex.grid.border(ex.cells[("masked", 4, 0)])
    text = ex.explanation.value
    assert "fed directly by 5 cells; 42 earlier cells feed those, not lit" in text, text
    toggle = ex.controls["earlier"]
    assert toggle.description == "earlier sources: HIDDEN" and "ac-off" in toggle._dom_classes
    toggle.value = True
    assert toggle.description == "earlier sources: SHOWN" and "ac-on" in toggle._dom_classes
    assert sum(v == "earlier" for v in ex.lit.values()) == 42
    assert "dashed" in ex.grid.border(ex.cells[("X", 0, 0)])
    assert "42 earlier cells feed those" in ex.explanation.value and "not lit" not in ex.explanation.value
    ex.cells[("O", 4, 0)].click()  # the choice stays on for the next click
    assert "earlier" in ex.lit.values()
    toggle.value = False
    assert "earlier" not in ex.lit.values() and not ex.grid.border(ex.cells[("X", 0, 0)])
    assert all("solid" in ex.grid.border(ex.cells[("V", r, 0)]) for r in range(5)), (
        "O[the(4)] reads every value row"
    )
    ex.controls["query"].value = 0  # O[The(0), thing] reads one value row: the other four go dark
    assert [bool(ex.grid.border(ex.cells[("V", r, 0)])) for r in range(5)] == [
        True,
        False,
        False,
        False,
        False,
    ]


class _Tables(__import__("html.parser").parser.HTMLParser):
    """Every table of a saved copy: its caption, column headers, row headers and cells, as text."""

    def __init__(self, text: str):
        super().__init__()
        self.tables, self._cell, self._caption = [], None, ""
        self._last_bold = ""
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and "class" in a and a["class"].startswith("ac-static-"):
            self._caption = a["class"].removeprefix("ac-static-")
        if tag == "table":
            self.tables.append({"name": self._caption, "cols": [], "rows": [], "cells": []})
        if tag in ("th", "td"):
            self._cell = (tag, a.get("scope", ""), [])
        if tag == "tr" and self.tables:
            self.tables[-1]["cells"].append([])

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[2].append(data)

    def handle_endtag(self, tag):
        if tag in ("th", "td") and self._cell is not None:
            kind, scope, text = self._cell
            text = "".join(text).strip()
            t = self.tables[-1]
            if kind == "th" and scope == "col":
                t["cols"].append(text)
            elif kind == "th" and scope == "row":
                t["rows"].append(text)
            elif kind == "td":
                t["cells"][-1].append(text)
            self._cell = None


def _saved_tables(ex) -> dict:
    tables = _Tables(ex.static_html).tables
    return {t["name"]: {**t, "cells": [row for row in t["cells"] if row]} for t in tables}


def test_the_saved_copies_name_every_row_and_column_and_show_what_they_say():
    from attention_course.explorers import cell_explainer, pipeline_view
    from attention_course.explorers.numeric import fmt

    tokens = ["The(0)", "cat(1)", "sat(2)", "on(3)", "the(4)"]
    features = ["thing", "action", "small word", "first token"]
    pipe = pipeline_view()
    st, q = pipe.st, pipe.query
    tables = _saved_tables(pipe)
    assert set(tables) == {"X", "K", "V", "Q", "row-stages", "O"}, sorted(tables)
    assert tables["X"]["rows"] == tokens and tables["X"]["cols"] == features, (
        "X is there, rows and columns named"
    )
    assert tables["X"]["cells"] == [[fmt(x) for x in row] for row in st.X.tolist()]
    assert tables["K"]["cols"] == ["d0", "d1"] and tables["V"]["cols"] == features
    assert tables["Q"]["rows"] == [tokens[q]] and tables["O"]["rows"] == [tokens[q]]
    stages = tables["row-stages"]
    assert stages["rows"] == ["raw S", "scaled", "masked", "weights A"] and stages["cols"] == tokens
    for name, M in zip(stages["rows"], (st.S, st.scaled, st.masked, st.A)):
        assert stages["cells"][stages["rows"].index(name)] == [fmt(x) for x in M[q].tolist()], name
    assert "-inf" not in stages["cells"][0], "raw S holds the raw scores, not the masked ones"
    assert "raw S: the raw scores q . k" in pipe.static_html
    assert "masked: the scaled scores, -inf where the mask hides the key" in pipe.static_html

    explainer = cell_explainer()
    tables = _saved_tables(explainer)
    assert set(tables) == {"X", "Q", "K", "V", "S", "A", "O"}, sorted(tables)
    for name, t in tables.items():
        assert t["rows"] == tokens, name
        assert t["cols"], f"{name} has no column headers"
    assert tables["S"]["cols"] == tokens and tables["A"]["cols"] == tokens and tables["O"]["cols"] == features
    assert tables["S"]["cells"] == [[fmt(x) for x in row] for row in explainer.st.masked.tolist()]
    assert "scaled, masked scores: S / sqrt(d_k), -inf where the mask hides the key" in explainer.static_html


def _vermillion_share(png: bytes, ax) -> float:
    """The share of pixels along the line just above ``ax`` that are vermillion (#D55E00)."""
    import io

    import numpy as np
    from matplotlib.image import imread

    pixels = (imread(io.BytesIO(png))[..., :3] * 255).round()
    box = ax.get_window_extent()
    row = pixels.shape[0] - round(box.y1 + 0.012 * box.height)
    xs = range(round(box.x0 + 0.1 * box.width), round(box.x1 - 0.1 * box.width))
    line = np.array([pixels[r, x] for r in (row - 1, row, row + 1) for x in xs])
    return float((np.abs(line - [0xD5, 0x5E, 0x00]).max(axis=1) < 40).mean())


def test_the_first_stage_that_departs_from_the_lesson_is_framed_in_the_picture():
    from attention_course import explorers

    stepper = explorers.stage_stepper(attention=attention_mask_after_softmax, example="cat_sat")
    assert stepper.departs == 3, "the weights (stage 4) are where this attention first departs"
    for k in range(1, 6):
        stepper.controls["stage"].value = k
        share = _vermillion_share(stepper.image.value, stepper.figure.ax_now)
        if k == 4:
            assert share > 0.9, f"stage 4 is not framed in vermillion ({share:.0%} of its top edge)"
            assert "first differs from the lesson here" in stepper.stage_name.value
        else:
            assert share < 0.05, f"stage {k} is framed though it is not where the difference starts"
    right = explorers.stage_stepper(attention=attention, example="cat_sat")
    right.controls["stage"].value = 4
    assert _vermillion_share(right.image.value, right.figure.ax_now) < 0.05

    def framed(widget) -> list[str]:
        out, todo = [], [widget]
        while todo:
            w = todo.pop()
            if "ac-departs" in getattr(w, "_dom_classes", ()):
                assert "#D55E00" in (w.layout.border or ""), "a framed stage has a vermillion border"
                out += [c.removeprefix("ac-grid-") for c in w._dom_classes if c.startswith("ac-grid-")]
            todo += list(getattr(w, "children", ()))
        return out

    pipe = explorers.pipeline_view(attention_by_d_k)
    assert framed(pipe.widget) == ["A"], "the weights row of the pipeline is framed, and only it"
    assert "first differs from the lesson: softmax: A" in pipe._titles["table"].value
    assert framed(explorers.pipeline_view(attention).widget) == []
    explainer = explorers.cell_explainer(scaled_scores=lambda Q, K: Q @ K.mT / Q.shape[-1])
    assert framed(explainer.widget) == ["S"], "the explainer frames its (scaled, masked) S"
    assert "first differs from the lesson here" in _all_html(explainer.widget)
    assert framed(explorers.cell_explainer(attention=attention).widget) == []

    def zero(S, allowed):  # hidden scores set to 0 instead of -inf
        return S.masked_fill(~allowed, 0.0)

    masks = explorers.mask_explorer(apply_mask=zero).picture.value
    assert masks.count("ac-scores ac-departs") == 3 and "ac-causal-panel ac-departs" not in masks
    inverted = explorers.mask_explorer(causal_mask=lambda T: torch.ones(T, T).triu().bool()).picture.value
    assert "ac-causal-panel ac-departs" in inverted and "ac-scores ac-departs" not in inverted
    assert "first differs from the lesson here" in inverted
    fine = explorers.mask_explorer(causal_mask, padding_mask, apply_mask).picture.value
    assert "ac-departs" not in fine and "first differs" not in fine


def _all_html(widget) -> str:
    out, todo = [], [widget]
    while todo:
        w = todo.pop()
        if isinstance(getattr(w, "value", None), str):
            out.append(w.value)
        todo += list(getattr(w, "children", ()))
    return "\n".join(out)


# ------------------------------------------------ a front end that falls behind


def test_lesson_07s_explorers_reach_a_front_end_that_falls_behind(tmp_path):
    """A kernel's IOPub socket drops messages for a reader more than ZeroMQ's high-water marks behind
    (1,000 messages each side, neither set by Jupyter): a loaded laptop's front end then showed an
    explorer cell with no output at all. Lesson 07's three explorers, run three times while nobody reads
    (Run All pressed again on a busy machine), must all arrive: each cell's picture, live widget and end."""
    import time

    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(tmp_path / "ipc"))
    km.connection_file = str(tmp_path / "kernel.json")
    km.start_kernel(extra_arguments=["--HistoryManager.hist_file=:memory:"])
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        reply = kc.execute_interactive(
            "from attention_course.explorers import cell_explainer, pipeline_view, stage_stepper", timeout=60
        )
        assert reply["content"]["status"] == "ok"
        cells = ["display(stage_stepper())", "display(cell_explainer())", "display(pipeline_view())"] * 3
        sent = {kc.execute(code): code for code in cells}
        time.sleep(12)  # the front end is busy: nothing is read while every cell runs
        seen: dict[str, list[str]] = {msg_id: [] for msg_id in sent}
        idle = 0
        deadline = time.monotonic() + 60
        while idle < len(sent) and time.monotonic() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=5)
            except Exception:  # noqa: BLE001 - queue.Empty: whatever was dropped will never come
                break
            parent = msg["parent_header"].get("msg_id")
            if parent in seen:
                seen[parent].append(msg["msg_type"])
                idle += msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
        lost = [
            f"{sent[m]}: {sorted(set(types))} ({len(types)} messages)"
            for m, types in seen.items()
            if "display_data" not in types or types[-1] != "status"
        ]
        assert not lost, "cells whose outputs never arrived:\n" + "\n".join(lost)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
