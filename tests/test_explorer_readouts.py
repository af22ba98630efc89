"""Every sentence an explorer shows agrees with the tensors it shows, for right and for wrong functions.

Students' usual mistakes in lessons 03-07, written as students write them, are handed to
each explorer that runs them; the explorers are driven from Python (as in
tests/test_explorers.py) and every readout sentence is read back against the matrices
on screen: counts, sums, ranges and "looks most at". A wrong function gets one plain
"First difference from the lesson" line naming the first stage that departs; the
model solutions get none.
"""

from __future__ import annotations

import html
import math
import re

import pytest
import torch

from attention_course import explorers
from attention_course.explorers.compare import FIRST
from tests.test_explorers import _everything_shown, _model_solutions

# ------------------------------------------------------------- students' mistakes


def causal_mask_inverted(T, device=None):
    return torch.triu(torch.ones(T, T, dtype=torch.bool, device=device))


def causal_mask_off_by_one(T, device=None):
    return torch.tril(torch.ones(T, T, device=device), diagonal=-1).bool()


def scaled_scores_by_d_k(Q, K):
    return Q @ K.transpose(-2, -1) / Q.shape[-1]


def softmax_wrong_dim(Z, dim=-1):
    e = torch.exp(Z - Z.amax(dim=0, keepdim=True))
    return torch.nan_to_num(e / e.sum(dim=0, keepdim=True))


def apply_mask_zero(S, allowed):
    return S.masked_fill(~allowed, 0)


def apply_mask_inverted(S, allowed):
    return S.masked_fill(allowed, float("-inf"))


def attention_by_d_k(Q, K, V, mask=None):
    S = Q @ K.transpose(-2, -1) / Q.shape[-1]
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    A = torch.softmax(S, dim=-1)
    return A @ V, A


def attention_mask_after_softmax(Q, K, V, mask=None):
    A = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1)
    if mask is not None:
        A = A.masked_fill(~mask, 0.0)
    return A @ V, A


def attention_wrong_dim(Q, K, V, mask=None):
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    A = torch.softmax(S, dim=-2).nan_to_num(0.0)
    return A @ V, A


# (function name, the mistake, {explorer: the stage its "differs" line must name})
def _at(stage: str, **others: str) -> dict[str, str]:
    """The stage the stage stepper and the cell explainer must name, and the other explorers' ones."""
    return {"stepper": stage, "explainer": stage, **others}


MISTAKES = [
    ("causal_mask", causal_mask_inverted, _at("stage 3, masked", mask="the causal mask")),
    ("causal_mask", causal_mask_off_by_one, _at("stage 3, masked", mask="the causal mask")),
    ("scaled_scores", scaled_scores_by_d_k, _at("stage 2, scaled", head="the scaled scores")),
    ("softmax", softmax_wrong_dim, _at("weights", head="the weights")),
    ("apply_mask", apply_mask_zero, _at("stage 3, masked", mask="the masked scores")),
    ("apply_mask", apply_mask_inverted, _at("stage 3, masked", mask="the masked scores")),
    ("attention", attention_by_d_k, _at("weights")),
    ("attention", attention_mask_after_softmax, _at("stage 4, weights")),
    ("attention", attention_wrong_dim, _at("weights")),
]
IDS = [f"{name}-{fn.__name__}" for name, fn, _ in MISTAKES]


# ------------------------------------------------------------------ driving


def _plain(text: str) -> str:
    """Shown HTML as the words a student reads: `code` for <code>, tags dropped, entities decoded."""
    text = re.sub(r"<code>(.*?)</code>", r"`\1`", text)
    return html.unescape(re.sub(r"<br\s*/?>|</div>|</pre>", "\n", text).replace("<", "\n<")).replace(
        "\n\n", "\n"
    )


def _stage_texts(ex) -> list[str]:
    """Everything a stage explorer shows, for every stage and every query (or followed token)."""
    c = ex.controls
    shown = []
    for i in range(ex.st.T):
        if "stage" in c:
            c["query"].value = i
            for k in range(1, c["stage"].max + 1):
                c["stage"].value = k
                shown.append(_plain(_everything_shown(ex)))
        elif "follow" in c:
            c["follow"].value = i
            shown.append(_plain(_everything_shown(ex)))
        else:
            c["query"].value = i
            shown.append(_plain(_everything_shown(ex)))
    return shown


def _stage_explorers(name, fn):
    """The lesson 04-07 explorers that take ``name``, on both examples where it runs there."""
    made = {}
    for example in ("love_cats", "cat_sat"):
        if "mask" in fn.__name__ and example == "love_cats":
            continue  # no mask in "I love cats"
        made[f"stepper({example})"] = explorers.stage_stepper(example=example, **{name: fn})
        made[f"explainer({example})"] = explorers.cell_explainer(example=example, **{name: fn})
        made[f"pipeline({example})"] = explorers.pipeline_view(example=example, **{name: fn})
    return made


# ------------------------------------------------------------ reading sentences


LIST = r"\[([^\[\]]*)\]"


def _numbers(text: str) -> list[float]:
    return [float(x) for x in text.split(", ")] if text.strip() else []


def _check_sums(text: str) -> None:
    """Every "[w, ...] (sums to ...)" or "(all 0 ...)" agrees with the numbers in the list."""
    for body, words in re.findall(LIST + r" \((sums to [^)]*|all 0[^)]*)\)", text):
        xs = _numbers(body)
        if words.startswith("all 0"):
            assert all(x == 0 for x in xs), f"{body} is said to be all 0"
        elif words == "sums to 1":
            assert sum(xs) == pytest.approx(1, abs=0.02) and any(xs), f"[{body}] is said to sum to 1"
        else:
            said = float(re.match(r"sums to (-?[\d.]+)", words).group(1))
            assert sum(xs) == pytest.approx(said, abs=0.02) and abs(said - 1) > 1e-3, (body, words)


def _check_looks(text: str, st) -> None:
    """Every "'q' looks most at 'k' (w)" names the largest weight of q's row as shown."""
    index = {st.label(i): i for i in range(st.T)}
    found = re.findall(r"'([^']+)' looks most at '([^']+)' \((-?[\d.]+)\)", text)
    for query, key, w in found:
        row = st.A[index[query]]
        assert row.abs().sum() > 0, f"'{query}' has no weight at all, yet looks most at '{key}'"
        assert row[index[key]].item() == pytest.approx(row.max().item(), abs=5e-3), (query, key, row)
        assert float(w) == pytest.approx(row.max().item(), abs=5e-3), (query, w, row)
    for i in range(st.T):
        if not st.A[i].abs().sum():
            assert f"'{st.label(i)}' looks most at" not in text, f"an empty row looks at something:\n{text}"


def _check_common(text: str) -> None:
    assert "e+308" not in text and "e+307" not in text, "a clamped float stands in for -inf"
    assert "-inf, not -inf" not in text and "-inf where -inf" not in text, text
    assert not re.search(r"\[0(, 0)*\] \(sums to 1\)", text), "an all-zero row is said to sum to 1"


def _first_lines(text: str) -> set[str]:
    return {line[line.index(FIRST) :] for line in text.splitlines() if FIRST in line}


# ------------------------------------------------------------------- the tests


@pytest.mark.parametrize("name, fn, where", MISTAKES, ids=IDS)
def test_a_wrong_function_reads_as_what_its_tensors_show(name, fn, where):
    for label, ex in _stage_explorers(name, fn).items():
        texts = _stage_texts(ex)
        st = ex.st
        want = where["stepper" if label.startswith("stepper") else "explainer"]
        firsts = set().union(*(_first_lines(t) for t in texts))
        assert firsts, f"{label}: no line says where {fn.__name__} first departs from the lesson"
        for line in firsts:
            assert f"{FIRST} at " in line and want in line.split(":")[0], f"{label}: {line}"
            assert f"`{name}`" in line, f"{label} does not name `{name}`: {line}"
        for text in texts:
            _check_common(text)
            _check_sums(text)
            _check_looks(text, st)


@pytest.mark.parametrize(
    "name, fn, where",
    [m for m in MISTAKES if "mask" in m[2]],
    ids=[i for i, m in zip(IDS, MISTAKES) if "mask" in m[2]],
)
def test_the_mask_explorer_counts_what_its_masks_show(name, fn, where):
    ex = explorers.mask_explorer(**{name: fn})
    for T, lengths in ((5, (5, 3, 2)), (4, (4, 1, 0)), (2, (2, 1, 2))):
        with ex.batch():
            ex.controls["T"].value = T
            for b, n in enumerate(lengths):
                ex.controls[f"length_{b}"].value = n
        for show in ("scores", "weights"):
            ex.controls["show"].value = show
            v, text = ex.state, ex.readout.value
            _check_common(text)
            T = v.T
            allowed = int(v.causal.sum())
            assert f"{allowed} of {T * T} cells allowed" in text
            ones = torch.ones(T, T, dtype=torch.bool)
            if "query i may look at keys 0 .. i " in text:
                assert torch.equal(v.causal, ones.tril()), text
            if "above the diagonal (later tokens) are hidden" in text:
                assert torch.equal(~v.causal, ones.triu(1)), text
            for b in range(v.B):
                assert (
                    f"with the causal mask too, {int(v.combined[b].sum())} of {T * T} scores are allowed"
                    in text
                )
            if "becomes exactly 0 after softmax" in text:
                hidden = ~v.combined
                assert (v.weights[hidden] == 0).all(), "hidden cells are said to get no weight"
            firsts = _first_lines(text)
            if firsts or not torch.equal(v.causal, ones.tril()) or v.wrong_cells():
                assert len(firsts) == 1 and where["mask"] in next(iter(firsts)).split(":")[0], text


@pytest.mark.parametrize("name, fn", [(n, f) for n, f, w in MISTAKES if "head" in w])
def test_the_head_dimension_readout_follows_the_students_numbers(name, fn):
    ex = explorers.head_dimension_explorer(**{name: fn})
    for d_k in (1, 4, 64, 128):
        for scale in (False, True):
            with ex.batch():
                ex.controls["d_k"].value, ex.controls["scale"].value = d_k, scale
            v, text = ex.state, ex.readout.value
            _check_common(text)
            assert f"scaled std {v.scaled.std().item():.2f}" in text
            assert f"raw std {v.raw.std().item():.2f}" in text
            if "spread stays near 1" in text:
                assert 0.5 <= v.scaled_std <= 2.0, text
            if "scaling changes nothing" in text:
                assert torch.allclose(v.scaled, v.raw), text
            row = v.weights[v.row]
            top = re.search(r"top weight ([\d.]+) on '(\w+)'", text)
            assert top and float(top.group(1)) == pytest.approx(row.max().item(), abs=5e-3)
            assert v.tokens[int(row.argmax())] == top.group(2)
            if "one key takes almost all the weight" in text:
                assert row.max() > 0.9 and row.sum() == pytest.approx(1, abs=1e-3)
            differs = d_k > 1 or name == "softmax"
            assert (FIRST in text) == differs, text
    ex.controls["d_k"].value, ex.controls["scale"].value = 64, True
    if name == "scaled_scores":
        assert "8 times smaller" in ex.readout.value and "divided by d_k = 64 rather than sqrt(64)" in (
            ex.readout.value
        )
        assert "spread stays near 1" not in ex.readout.value


def test_the_issues_cases_read_as_their_pictures():
    masks = explorers.mask_explorer(causal_mask=causal_mask_inverted)
    text = masks.readout.value
    assert "query i may look at keys 0 .. i " not in text and "keys i .. T-1" in text
    assert "the 10 below the diagonal (earlier tokens) are hidden" in text
    inverted = explorers.mask_explorer(apply_mask=apply_mask_inverted).readout.value
    assert "-inf where a finite score" in inverted and "e+308" not in inverted
    zero = explorers.mask_explorer(apply_mask=apply_mask_zero).readout.value
    assert "0 where -inf was expected" in zero
    stepper = explorers.stage_stepper(attention=attention_mask_after_softmax, example="cat_sat")
    stepper.controls["query"].value = 2
    stepper.controls["stage"].value = 4
    text = stepper.readout.value
    shown = stepper.st.A[2].sum().item()
    assert shown < 0.99
    assert f"sums to {shown:.3f}, not 1" in text, text
    assert "this stage is where your head first differs from the lesson" in text
    shown_all = _everything_shown(stepper)  # how it differs: once, in the banner across the explorer
    assert "your `attention` gives" in shown_all and "mask is applied after the softmax" in shown_all
    stepper.controls["stage"].value = 2
    assert "your `attention` does this step inside" in stepper.readout.value
    heads = explorers.head_dimension_explorer(scaled_scores=scaled_scores_by_d_k, scale=True)
    assert "spread stays near 1" not in heads.readout.value and "far from 1" in heads.readout.value


def test_a_row_with_no_allowed_key_reads_as_all_zero_everywhere():
    explainer = explorers.cell_explainer(causal_mask=causal_mask_off_by_one, follow=0)
    story = explainer.row_story.value
    assert "'The(0)' may look at no key" in story and "looks most at" not in story
    assert "(all 0: no key is allowed)" in story
    weight = explainer.explanations[("A", 0, 0)].text
    assert "every key is masked" in weight and "(sums to 1)" not in weight
    stepper = explorers.stage_stepper(causal_mask=causal_mask_off_by_one, example="cat_sat", query=0, stage=4)
    assert "every key is hidden" in stepper.readout.value and "looks most at" not in stepper.readout.value
    stepper.controls["stage"].value = 5
    assert "may look at no key, so its output is 0" in stepper.readout.value
    pipeline = explorers.pipeline_view(causal_mask=causal_mask_off_by_one, query=0)
    pipeline.cells[("O", 0, 0)].click()
    assert "may look at no key" in pipeline.explanation.value


def test_tokens_are_numbered_from_0_everywhere_as_in_the_lessons():
    explainer = explorers.cell_explainer()  # "The cat sat on the"
    st = explainer.st
    assert [st.label(i) for i in range(st.T)] == ["The(0)", "cat", "sat", "on", "the(4)"]
    assert "Following 'the(4)' (query 4;" in explainer.row_story.value
    assert "'cat' (position 1) is not after 'the(4)' (position 4)" in explainer.explanations[("S", 4, 1)].text
    pipeline = explorers.pipeline_view(query=4)
    pipeline.cells[("masked", 4, 1)].click()
    assert "(position 1)" in pipeline.explanation.value and "(position 4)" in pipeline.explanation.value
    masks = explorers.mask_explorer()
    assert "4 the</th>" in masks.picture.value and "0 The</th>" in masks.picture.value


def test_the_model_solutions_read_with_no_difference():
    ns = _model_solutions()
    for name in ("scaled_scores", "causal_mask", "apply_mask", "softmax", "mix", "attention"):
        for label, ex in _stage_explorers(name, ns[name]).items():
            for text in _stage_texts(ex):
                assert FIRST not in text and "differs" not in text, f"{label} with `{name}`: {text}"
                _check_sums(text)
                _check_looks(text, ex.st)
    masks = explorers.mask_explorer(ns["causal_mask"], ns["padding_mask"], ns["apply_mask"])
    assert FIRST not in masks.readout.value
    heads = explorers.head_dimension_explorer(ns["scaled_scores"], ns["softmax"])
    assert FIRST not in heads.readout.value


# ------------------------------------------- the head-dimension and sharpness explorers' framed panel


def scaled_scores_not_scaled(Q, K):
    return Q @ K.transpose(-2, -1)


def softmax_whole_sum(Z, dim=-1):
    e = torch.exp(Z - Z.max())
    return e / e.sum()  # over the whole matrix, not along dim


def _lookup(scale=lambda s, d: s / math.sqrt(d), normalise=True, blend_scores=False):
    """A soft_lookup as a student writes it, with one of the usual slips."""

    def soft_lookup(query, keys, values, sharpness):
        scores = {
            n: scale(sharpness, len(query)) * sum(q * k for q, k in zip(query, key))
            for n, key in keys.items()
        }
        top = max(scores.values())
        exps = {n: math.exp(s - top) for n, s in scores.items()}
        total = sum(exps.values()) if normalise else 1.0
        w = {n: e / total for n, e in exps.items()}
        by = scores if blend_scores else w
        width = len(next(iter(values.values())))
        return w, [sum(by[n] * values[n][i] for n in keys) for i in range(width)]

    return soft_lookup


LOOKUPS = {  # the slip -> the words its first "differs" line must hold somewhere
    "not divided by sqrt(d)": (_lookup(scale=lambda s, d: s), ""),
    "exps not divided by their sum": (
        _lookup(normalise=False),
        "as if the exps were not divided by their sum",
    ),
    "the scores blended instead of the weights": (_lookup(blend_scores=True), ""),
    "sharpness left out": (_lookup(scale=lambda s, d: 1 / math.sqrt(d)), ""),
}
HEAD_PANELS = {"spread": "the lower row of the panel 'Score spread'", "heat": "the panel 'Softmax weights A'"}
SHARP_PANELS = {
    "weights": "the panel 'Weights'",
    "blend": "the panel 'The blend'",
    "curves": "the panel 'Each weight as the sharpness grows'",
}


def _framed(ex, png: bytes | None = None) -> list[str]:
    """The panels of an explorer's picture framed in vermillion, measured on its pixels as the stepper's frame is."""
    from tests.test_explorers_stages import _vermillion_share

    png = ex.image.value if png is None else png
    keys = {frame.axes: key for key, frame in ex.figure.departs.frames.items()}
    framed = []
    for ax in ex.figure.ff.fig.axes[:4]:  # the four panels (not the colour bar)
        share = _vermillion_share(png, ax)
        assert share > 0.9 or share < 0.05, f"a half-drawn frame ({share:.0%}) on {ax.get_title()!r}"
        if share > 0.9:
            framed.append(keys.get(ax, ax.get_title()))
    return framed


def _first_line(text: str) -> str | None:
    lines = [line for line in _plain(text).splitlines() if FIRST in line]
    assert len(lines) <= 1, lines
    return lines[0] if lines else None


def _check_count(line: str, cells: int, total: int) -> None:
    said = re.search(r": (all (\d+) cells|(\d+) of (\d+) cells) differ", line)
    assert said, line
    if said.group(2):
        assert cells == total == int(said.group(2)), (line, cells, total)
    else:
        assert (cells, total) == (int(said.group(3)), int(said.group(4))), (line, cells, total)


def _number(text: str) -> float:
    return {"-inf": -math.inf, "inf": math.inf, "NaN": math.nan}.get(text, None) or float(text)


def _head_expected(v):
    """The panel that first departs, and the tensors it departs with, worked out here from what is shown."""
    from attention_course.explorers.compare import differing

    lesson = v.raw / math.sqrt(v.d_k)
    if differing(v.scaled, lesson):
        return "spread", v.scaled, lesson
    want = torch.softmax(v.shown, dim=-1)
    if differing(v.weights, want):
        return "heat", v.weights, want
    return None, None, None


@pytest.mark.parametrize(
    "name, fn",
    [
        ("scaled_scores", scaled_scores_by_d_k),
        ("scaled_scores", scaled_scores_not_scaled),
        ("softmax", softmax_wrong_dim),
        ("softmax", softmax_whole_sum),
    ],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_the_head_dimension_explorer_frames_the_panel_that_first_differs(name, fn):
    from attention_course.explorers.compare import differing

    ex = explorers.head_dimension_explorer(**{name: fn})
    start = _head_expected(ex.state)[0]
    assert start is not None and _framed(ex, ex.static_png) == [start], "the saved picture is framed too"
    assert _first_line(ex.static_html) == _first_line(ex.text) == _first_line(ex.readout.value)
    seen = set()
    for d_k in (1, 16, 64):
        for scale in (False, True):
            with ex.batch():
                ex.controls["d_k"].value, ex.controls["scale"].value = d_k, scale
            v, text = ex.state, ex.readout.value
            _check_common(text)
            panel, got, want = _head_expected(v)
            seen.add(panel)
            assert _framed(ex) == ([panel] if panel else []), (d_k, scale, text)
            line = _first_line(text)
            if panel is None:
                assert line is None and "differs" not in text, text
                continue
            head, _, rest = line.partition(" (your ")
            assert HEAD_PANELS[panel] in head and f"`{name}`" in rest, line
            _check_count(line, len(differing(got, want)), want.numel())
            cell = re.search(
                r"e\.g\. (?:score|weight)\[(\w+), (\w+)\] is (\S+) where (\S+) was expected", line
            )
            assert cell, line
            i, j = v.tokens.index(cell.group(1)), v.tokens.index(cell.group(2))
            assert _number(cell.group(3)) == pytest.approx(got[i, j].item(), abs=1e-3), line
            assert _number(cell.group(4)) == pytest.approx(want[i, j].item(), abs=1e-3), line
            ratio = re.search(r"every value is ([\d.]+) times (smaller|larger)", line)
            if ratio:
                r = (got / want).median().item()
                assert float(ratio.group(1)) == pytest.approx(r if r > 1 else 1 / r, rel=1e-3), line
                assert (ratio.group(2) == "larger") == (r > 1), line
    if name == "scaled_scores":
        assert seen == {None, "spread"}, "d_k = 1 scales by 1: nothing differs there"
        ex.controls["d_k"].value = 64
        words = {
            scaled_scores_by_d_k: "8 times smaller",
            scaled_scores_not_scaled: "not divided by sqrt(d_k)",
        }
        assert words[fn] in _first_line(ex.readout.value)
    else:
        assert seen == {"heat"}


@pytest.mark.parametrize("with_solutions", [False, True], ids=["built-in", "model solutions"])
def test_the_head_dimension_and_sharpness_explorers_frame_nothing_with_the_lessons_functions(with_solutions):
    ns = _model_solutions() if with_solutions else {}
    heads = explorers.head_dimension_explorer(ns.get("scaled_scores"), ns.get("softmax"))
    colours = explorers.sharpness_explorer(ns.get("soft_lookup"))
    assert _framed(heads, heads.static_png) == [] and _framed(colours, colours.static_png) == []
    for d_k in (1, 16, 64, 128):
        for scale in (False, True):
            with heads.batch():
                heads.controls["d_k"].value, heads.controls["scale"].value = d_k, scale
            assert _framed(heads) == [] and heads.state.departs is None
            assert "differs" not in _everything_shown(heads) and FIRST not in heads.readout.value
    for sharpness in (0.0, 1.0, 5.0, 30.0):
        colours.controls["sharpness"].value = sharpness
        for button in colours.controls["presets"]:
            button.click()
            assert _framed(colours) == [] and colours.state.departs is None
            assert "differs" not in _everything_shown(colours) and FIRST not in colours.readout.value


def _sharp_expected(ex):
    """The panel of the sharpness explorer that first departs, and its tensors, worked out here from what is shown."""
    from attention_course.explorers import sharpness
    from attention_course.explorers.compare import differing

    v, names = ex.state, list(ex.state.keys)
    values = ex.dictionary.values
    lesson = sharpness.colour_view(v.query, v.keys, values, v.sharpness)  # the built-in arithmetic
    got = torch.tensor([v.weights[n] for n in names], dtype=torch.float64)
    want = torch.tensor([lesson.weights[n] for n in names], dtype=torch.float64)
    if differing(got, want):
        return "weights", got, want
    blend = [sum(v.weights[n] * values[n][c] for n in names) for c in range(2)]
    got, want = torch.tensor(v.output, dtype=torch.float64), torch.tensor(blend, dtype=torch.float64)
    if differing(got, want):
        return "blend", got, want
    curves = sharpness.colour_curves(v.query, v.keys, values, ex.grid)
    got = torch.tensor([ex._curves[n] for n in names], dtype=torch.float64)
    want = torch.tensor([curves[n] for n in names], dtype=torch.float64)
    if differing(got, want):
        return "curves", got, want
    return None, None, None


@pytest.mark.parametrize("slip", list(LOOKUPS))
def test_the_sharpness_explorer_frames_the_panel_that_first_differs(slip):
    from attention_course.explorers.compare import differing

    fn, words = LOOKUPS[slip]
    ex = explorers.sharpness_explorer(soft_lookup=fn)
    assert ex.choice.source == "yours"
    start = _sharp_expected(ex)[0]
    assert start is not None and _framed(ex, ex.static_png) == [start], "the saved picture is framed too"
    assert _first_line(ex.static_html) == _first_line(ex.text) == _first_line(ex.readout.value)
    seen, worded = set(), 0
    for sharpness in (0.0, 1.0, 5.0, 30.0):
        ex.controls["sharpness"].value = sharpness
        for button in [None, *ex.controls["presets"][1:3]]:
            if button is not None:
                button.click()
            v, text = ex.state, ex.readout.value
            _check_common(text)
            panel, got, want = _sharp_expected(ex)
            seen.add(panel)
            assert _framed(ex) == ([panel] if panel else []), (slip, sharpness, text)
            assert v.departs == panel
            line = _first_line(text)
            if panel is None:
                assert line is None and "differs" not in text, text
                continue
            head, _, rest = line.partition(" (your ")
            assert SHARP_PANELS[panel] in head and "`soft_lookup`" in rest, line
            if panel != "curves":
                assert f"at sharpness {v.sharpness:g}" in head, line
            _check_count(line, len(differing(got, want)), want.numel())
            ix = differing(got, want)[0]
            cell = re.search(r"e\.g\. (.+?) is (\S+) where (\S+) was expected", line)
            assert cell, line
            names = list(v.keys)
            if panel == "blend":
                assert cell.group(1) == f"the {('red', 'green')[ix[0]]} amount", line
            else:
                assert cell.group(1).startswith(f"the weight of '{names[ix[0]]}'"), line
            if panel == "curves":
                assert cell.group(1).endswith(f"at sharpness {ex.grid[ix[1]]:g}"), line
            assert _number(cell.group(2)) == pytest.approx(got[ix].item(), abs=1e-3), line
            assert _number(cell.group(3)) == pytest.approx(want[ix].item(), abs=1e-3), line
            if len(differing(got, want)) == want.numel():  # every weight one multiple of the lesson's
                assert words in line, line
                worded += words in line
            total = sum(v.weights.values())
            if not math.isclose(total, 1, abs_tol=1e-3):
                said = re.search(r"\(sums to ([\d.]+), not 1\)", text)
                assert said and float(said.group(1)) == pytest.approx(total, abs=1e-3), text
                ratio = re.search(r"every value is ([\d.]+) times larger", line)
                assert ratio and float(ratio.group(1)) == pytest.approx(total, rel=1e-3), line
            blend = re.search(r"blend: \[(-?\d+), (-?\d+)\]", text)
            assert [int(blend.group(1)), int(blend.group(2))] == [round(x) for x in v.output], text
    want_seen = {
        "not divided by sqrt(d)": {"weights", "curves"},  # sharpness 0: even weights, as the lesson's
        "exps not divided by their sum": {"weights"},
        "the scores blended instead of the weights": {"blend"},
        "sharpness left out": {"weights", "curves"},  # sharpness 1: the lesson's weights
    }[slip]
    assert seen == want_seen, seen
    assert worded or not words, f"never said: {words}"
