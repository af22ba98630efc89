"""The sharpness explorer (lesson 05): the colour soft dictionary, its weights against sharpness.

Its computation (weights and blended colour of a soft look-up), its figure and its widget.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import ipywidgets as W
import numpy as np
import torch
from matplotlib.patches import Rectangle

from .base import Explorer, _classes, _image, _pre, _quick, _readout
from .choosing import StudentFunctionError, banner_html, banner_text, choose, fallback
from .compare import Difference, compare, is_empty, sum_words
from .drawing import (
    FONT_SMALL,
    FONT_TITLE,
    SKY,
    Bars,
    DepartsFrames,
    FastFigure,
    _sources_footer,
    quick_text,
)
from .numeric import fmt, fmt_list

# ----------------------------------------------------------------- computation


@dataclass(frozen=True)
class ColourView:
    """One setting of the colour soft dictionary, computed (plain Python numbers)."""

    query: tuple[float, ...]
    keys: dict[str, tuple[float, ...]]
    values: dict[str, tuple[float, ...]]
    sharpness: float
    scores: dict[str, float]
    weights: dict[str, float]
    output: tuple[float, ...]
    yours: bool = False  # whether the student's soft_lookup made the weights and the blend
    differences: tuple[Difference, ...] = ()  # where they depart from the lesson's arithmetic, in panel order

    @property
    def departs(self) -> str | None:
        """The panel that first departs from the lesson ("weights", "blend", "curves"), None where none does."""
        return self.differences[0].stage if self.differences else None

    @property
    def rgb(self) -> tuple[int, int, int]:
        """The blended colour: (red, green) amounts, no blue, clipped to 0..255."""
        r, g = (self.output + (0.0, 0.0))[:2]
        return (_clip(r), _clip(g), 0)

    @property
    def hex(self) -> str:
        return "#{:02x}{:02x}{:02x}".format(*self.rgb)

    def summary(self) -> str:
        """The readout in words, read from the weights and the blend shown (the student's where theirs ran)."""
        names = list(self.keys)
        row = [self.weights[n] for n in names]
        top = max(names, key=self.weights.__getitem__)
        sums_to_1 = math.isclose(sum(row), 1.0, abs_tol=1e-3)
        scores = "the lesson's scores" if self.yours else "scores"
        lines = [
            f"query {fmt_list(self.query)}, sharpness {fmt(self.sharpness, 2)}",
            f"{scores} = sharpness * (query . key) / sqrt({len(self.query)}): "
            + ", ".join(f"{n} {self.scores[n]:.2f}" for n in names),
            "weights: "
            + ", ".join(f"{n} {self.weights[n]:.2f}" for n in names)
            + ("" if sums_to_1 else " (" + ("all 0" if is_empty(row) else sum_words(row)) + ")")
            + "; blend: ["
            + ", ".join(f"{x:.0f}" for x in self.output)
            + f"] (red, green amounts) = colour {self.hex}",
        ]
        w = self.weights[top]
        if not sums_to_1:
            lines.append("These weights do not sum to 1, so the blend is not a mix of the values: see below.")
        elif (
            self.differences
        ):  # advice on the sharpness would read wrong weights as right: say how they differ
            pass
        elif w > 0.9:
            lines.append(f"Almost a hard look-up: '{top}' takes {w:.0%}. Lower the sharpness to blend.")
        elif w < 1.5 / len(names):
            lines.append("Nearly an even blend: raise the sharpness to pick a winner.")
        else:
            lines.append(f"'{top}' leads with {w:.0%}; the others still colour the blend.")
        if self.differences:
            lines.append(self.differences[0].line())
        return "\n".join(lines)


def _clip(x: float) -> int:
    return int(round(min(255.0, max(0.0, float(x)))))


def colour_scores(
    query: Sequence[float], keys: dict[str, Sequence[float]], sharpness: float
) -> dict[str, float]:
    """score(name) = sharpness * (query . key) / sqrt(len(query))."""
    d = len(query)
    return {n: sharpness * sum(q * k for q, k in zip(query, key)) / math.sqrt(d) for n, key in keys.items()}


def colour_view(
    query: Sequence[float],
    keys: dict[str, Sequence[float]],
    values: dict[str, Sequence[float]],
    sharpness: float,
    soft_lookup: Callable | None = None,
) -> ColourView:
    """Weights and blended colour of one soft look-up, with the scores that led to them.

    ``soft_lookup`` is the student's (None: the look-up is worked out here).
    """
    query = [float(q) for q in query]
    keys = {n: [float(x) for x in k] for n, k in keys.items()}
    values = {n: [float(x) for x in v] for n, v in values.items()}
    scores = colour_scores(query, keys, float(sharpness))
    if soft_lookup is not None:  # on copies: a function that changes its inputs changes nothing here
        weights, output = soft_lookup(*copy.deepcopy((query, keys, values)), float(sharpness))
    else:
        weights = _colour_weights(scores)
        output = _blend(weights, values)
    weights = {n: float(weights[n]) for n in keys}
    output = tuple(float(x) for x in output)
    return ColourView(
        query=tuple(query),
        keys={n: tuple(k) for n, k in keys.items()},
        values={n: tuple(v) for n, v in values.items()},
        sharpness=float(sharpness),
        scores=scores,
        weights=weights,
        output=output,
        yours=soft_lookup is not None,
        differences=lookup_differences(scores, values, float(sharpness), weights, output)
        if soft_lookup is not None
        else (),
    )


def _blend(weights: dict[str, float], values: dict[str, Sequence[float]]) -> list[float]:
    """The lesson's blend: sum over the keys of weight * value, entry by entry."""
    width = len(next(iter(values.values())))
    return [sum(weights[n] * values[n][c] for n in values) for c in range(width)]


def _amount(c: int, width: int) -> str:
    return f"the {('red', 'green')[c]} amount" if width == 2 else f"blend[{c}]"


def lookup_differences(
    scores: dict[str, float],
    values: dict[str, Sequence[float]],
    sharpness: float,
    weights: dict[str, float],
    output: Sequence[float],
) -> tuple[Difference, ...]:
    """Where the weights and the blend shown depart from the lesson's arithmetic, in the figure's order.

    The weights against the softmax of the lesson's scores; the blend against the lesson's
    blend of the weights shown (so a blend is faulted only for its own arithmetic).
    """
    names = list(scores)
    got = torch.tensor([weights[n] for n in names], dtype=torch.float64)
    want = _colour_weights(scores)
    top = max(scores.values())
    hints = {  # every weight one multiple of the lesson's: the exps were not divided by their sum
        sum(math.exp(x - top) for x in scores.values()): "as if the exps were not divided by their sum",
    }
    if top < 700:  # math.exp overflows past 709
        hints[sum(math.exp(x) for x in scores.values())] = "as if the exps were not divided by their sum"
    at = f"at sharpness {fmt(sharpness, 2)}"
    found = [
        compare(
            "weights",
            f"the weights {at}, in the panel 'Weights'",
            got,
            torch.tensor([want[n] for n in names], dtype=torch.float64),
            "soft_lookup",
            True,
            lambda ix: f"the weight of '{names[ix[0]]}'",
            what="weight",
            hints=hints,
        )
    ]
    blend = torch.tensor(list(output), dtype=torch.float64)
    lesson = torch.tensor(_blend(weights, values), dtype=torch.float64)
    found.append(
        compare(
            "blend",
            f"the blend of these weights {at}, in the panel 'The blend'",
            blend,
            lesson,
            "soft_lookup",
            True,
            lambda ix: _amount(ix[0], len(lesson)),
            what="amount",
        )
    )
    return tuple(d for d in found if d is not None)


def curve_difference(
    query: Sequence[float],
    keys: dict[str, Sequence[float]],
    grid: Sequence[float],
    curves: dict[str, list[float]],
) -> Difference | None:
    """Where the weight curves shown (the student's soft_lookup over ``grid``) depart from the lesson's."""
    names = list(keys)
    lesson = [_colour_weights(colour_scores(query, keys, float(s))) for s in grid]
    got = torch.tensor([curves[n] for n in names], dtype=torch.float64)  # (keys, grid)
    want = torch.tensor([[w[n] for w in lesson] for n in names], dtype=torch.float64)
    return compare(
        "curves",
        "the weights as the sharpness grows, in the panel 'Each weight as the sharpness grows'",
        got,
        want,
        "soft_lookup",
        True,
        lambda ix: f"the weight of '{names[ix[0]]}' at sharpness {fmt(grid[ix[1]], 2)}",
        what="weight",
    )


def _colour_weights(scores: dict[str, float]) -> dict[str, float]:
    """The explorer's weights from its scores (softmax over the keys, largest score first subtracted)."""
    top = max(scores.values())
    exps = {n: math.exp(x - top) for n, x in scores.items()}
    total = sum(exps.values())
    return {n: e / total for n, e in exps.items()}


def colour_curves(
    query: Sequence[float],
    keys: dict[str, Sequence[float]],
    values: dict[str, Sequence[float]],
    grid: Sequence[float],
    soft_lookup: Callable | None = None,
) -> dict[str, list[float]]:
    """Each key's weight as the sharpness runs over ``grid`` (``soft_lookup``: the student's, or None)."""
    curves: dict[str, list[float]] = {n: [] for n in keys}
    for s in grid:
        if soft_lookup is not None:
            weights, _ = soft_lookup(*copy.deepcopy((list(query), dict(keys), dict(values))), float(s))
        else:
            weights = _colour_weights(colour_scores(query, keys, float(s)))
        for n in keys:
            curves[n].append(float(weights[n]))
    return curves


# ---------------------------------------------------------------------- figure

KEY_COLOURS = {"red": "#E41A1C", "green": "#2CA02C", "orange": "#FF9F1C"}
KEY_STYLES = {"red": ("-", "o"), "green": ("--", "s"), "orange": (":", "^")}  # line style, marker
_PLAIN = ("-", "o")


# axes coordinates of the notes beside a framed panel: under the top row's panels, above the curves' title
WEIGHTS_NOTE_Y, BLEND_NOTE_Y, CURVES_NOTE_Y = -0.28, -0.12, 1.135


class SharpnessFigure:
    """Weights as bars, the blend as a swatch, weights against sharpness, vectors in the plane."""

    def __init__(self, names: Sequence[str], grid: Sequence[float], footer: str = ""):
        self.names = list(names)
        n = len(names)
        self.grid = np.asarray(grid, dtype=float)
        self.ff = ff = FastFigure(9.4, 5.5)
        fig = ff.fig
        fig.subplots_adjust(left=0.08, right=0.97, top=0.945, bottom=0.13, hspace=0.6, wspace=0.3)
        ax_w, ax_sw, ax_curve, ax_vec = fig.subplots(2, 2).flat
        colours = [KEY_COLOURS.get(k, SKY) for k in names]

        ax_w.set_title("Weights: softmax of the scores")
        ax_w.set_ylim(0, 1.18)
        ax_w.set_ylabel("weight")
        ax_w.set_xticks(range(n), names)
        ax_w.set_xlabel("key")
        ax_w.set_xlim(-0.6, n - 0.4)
        self.colours = colours
        self.bars = Bars(ax_w, n, width=0.6, edgecolor="black", lw=0.8)
        self.bar_labels = [quick_text(ax_w, j, 0, ha="center", va="bottom") for j in range(n)]

        ax_sw.set_title("The blend: weights x values")
        ax_sw.set_xlim(0, 1)
        ax_sw.set_ylim(0, 1)
        ax_sw.axis("off")
        # the stacked bar spans 0 .. 0.96 of the axes: nothing reaches past the figure's edge
        self.bar_width = 0.96
        self.segments = [Rectangle((0, 0.68), 0, 0.16, fc=c, ec="black", lw=0.6) for c in colours]
        for seg in self.segments:
            ax_sw.add_patch(seg)
        ax_sw.text(0, 0.87, f"shares of the weight: {', '.join(names)}", fontsize=FONT_SMALL, va="bottom")
        ax_sw.text(0, 0.56, "blended colour (red, green amounts)", fontsize=FONT_SMALL, va="bottom")
        self.swatch = Rectangle((0, 0.02), 0.55, 0.5, fc="white", ec="black", lw=1)
        ax_sw.add_patch(self.swatch)
        self.swatch_text = quick_text(ax_sw, 0.59, 0.27, ha="left", va="center", fontsize=FONT_TITLE)

        ax_curve.set_title("Each weight as the sharpness grows")
        ax_curve.set_xlim(self.grid[0] - 1.0, self.grid[-1])  # sharpness 0 stays off the axis line
        ax_curve.set_ylim(0, 1.02)
        ax_curve.set_xlabel("sharpness")
        ax_curve.set_ylabel("weight")
        self.curves = []
        for name, c in zip(names, colours):
            (line,) = ax_curve.plot([], [], color=c, ls=KEY_STYLES.get(name, _PLAIN)[0], lw=2, label=name)
            self.curves.append(line)
        self.s_line = ax_curve.axvline(1, color="black", lw=1.6, label="your sharpness")
        ax_curve.legend(loc="center right", frameon=False, handlelength=2.2, labelspacing=0.25)

        ax_vec.set_title("Query and keys in the plane")
        ax_vec.set_xlim(-1.8, 1.8)
        ax_vec.set_ylim(-1.3, 1.5)
        ax_vec.set_aspect("equal", adjustable="box")
        ax_vec.axhline(0, color="#bbbbbb", lw=0.6)
        ax_vec.axvline(0, color="#bbbbbb", lw=0.6)
        ax_vec.set_xlabel("dimension 0")
        ax_vec.set_ylabel("dimension 1")
        self.key_lines = []
        for name, c in zip(names, colours):
            style = KEY_STYLES.get(name, _PLAIN)
            (line,) = ax_vec.plot(
                [], [], color=c, ls=style[0], lw=2, marker=style[1], ms=6, mec="black", markevery=[1]
            )
            line.set_label(name)
            self.key_lines.append(line)
        (self.query_line,) = ax_vec.plot(
            [], [], color="black", lw=2.2, marker="D", ms=6, markevery=[1], label="query"
        )
        ax_vec.legend(loc="lower left", frameon=False, handlelength=2.2, labelspacing=0.2, borderaxespad=0.2)
        _sources_footer(fig, footer)
        # the panel that first departs from the lesson: framed, with a note beside it
        self.departs = DepartsFrames(
            {
                "weights": (ax_w, (0.5, WEIGHTS_NOTE_Y), "top", "\u25b2"),
                "blend": (ax_sw, (0.5, BLEND_NOTE_Y), "top", "\u25b2"),
                "curves": (ax_curve, (0.5, CURVES_NOTE_Y), "bottom", "\u25bc"),
            }
        )

        ff.animate(
            self.bars.collection,
            *self.bar_labels,
            *self.segments,
            self.swatch,
            self.swatch_text,
            *self.curves,
            self.s_line,
            *self.key_lines,
            self.query_line,
            *self.departs.artists,
        )

    def update(self, v: ColourView, curves: dict[str, list[float]]) -> None:
        left = 0.0
        self.bars.set([v.weights[name] for name in self.names], self.colours)
        for name, label, seg, line in zip(self.names, self.bar_labels, self.segments, self.curves):
            w = v.weights[name]
            label.set_text(f"{w:.2f}")
            label.set_y(min(w, 1.03) + 0.02)  # a weight above 1 (a wrong soft_lookup) keeps its label
            seg.set_x(left * self.bar_width)
            seg.set_width(w * self.bar_width)
            left += w
            line.set_data(self.grid, curves[name])
        self.swatch.set_facecolor(v.hex)
        # the amounts as computed (the swatch's colour clips them to 0..255)
        self.swatch_text.set_text("[" + ", ".join(f"{x:.0f}" for x in v.output[:2]) + "]")
        self.s_line.set_xdata([v.sharpness, v.sharpness])
        for name, line in zip(self.names, self.key_lines):
            x, y = v.keys[name][:2]
            line.set_data([0, x], [0, y])
        qx, qy = v.query[:2]
        self.query_line.set_data([0, qx], [0, qy])
        self.departs.show(v.departs)

    def render(self) -> bytes:
        return self.ff.render()


# ---------------------------------------------------------------------- widget

PRESETS = {
    "start: query [1.0, 0.1]": {"query": (1.0, 0.1)},
    "query [0.0, 1.0]": {"query": (0.0, 1.0)},
    "query = orange's key": {"query": (0.8, 0.6)},
    "orange's key doubled": {"keys": {"orange": (1.6, 1.2)}},
}


class SharpnessExplorer(Explorer):
    kind = "sharpness"
    title = "Sharpness explorer"

    def __init__(self, soft_lookup=None, sharpness: float = 1.0, query=None) -> None:
        super().__init__()
        from attention_course import data

        self.choice = choose("soft_lookup", soft_lookup)
        self.dictionary = d = data.colours()
        self.names = list(d.keys)
        self.grid = [float(i) for i in range(31)]  # sharpness 0 .. 30
        self.figure = SharpnessFigure(self.names, self.grid, f"soft_lookup: {self.choice.source}")
        self._curve_key = None
        self._curves = None
        self._curve_difference = None
        q = list(query) if query is not None else d.query
        sharp = W.FloatSlider(
            value=sharpness,
            min=0.0,
            max=30.0,
            step=0.5,
            description="sharpness",
            continuous_update=True,
            readout_format=".1f",
            layout=W.Layout(width="300px"),
        )
        qx = W.FloatSlider(
            value=q[0], min=-1.5, max=1.5, step=0.05, description="query x", layout=W.Layout(width="300px")
        )
        qy = W.FloatSlider(
            value=q[1], min=-1.5, max=1.5, step=0.05, description="query y", layout=W.Layout(width="300px")
        )
        self.controls = {"sharpness": sharp, "query_x": qx, "query_y": qy}
        _classes(self.controls, "ac-")
        key_rows = []
        for name in self.names:
            kx = W.BoundedFloatText(
                value=d.keys[name][0], min=-1.7, max=1.7, step=0.1, layout=W.Layout(width="70px")
            )
            ky = W.BoundedFloatText(
                value=d.keys[name][1], min=-1.2, max=1.4, step=0.1, layout=W.Layout(width="70px")
            )
            self.controls[f"{name}_x"], self.controls[f"{name}_y"] = kx, ky
            key_rows.append(W.HBox([W.Label(f"key {name}:", layout=W.Layout(width="90px")), kx, ky]))
        buttons = []
        for label in PRESETS:
            b = W.Button(description=label, layout=W.Layout(width="auto"), tooltip=label)
            b.add_class("ac-preset")
            b.on_click(lambda _b, label=label: self.apply_preset(label))
            buttons.append(b)
        self.controls["presets"] = buttons
        for name, w in self.controls.items():
            if name != "presets":
                w.observe(self._changed, names="value")
        self.image, self.readout = _image(), _readout()
        self.banner = banner = W.HTML(banner_html([self.choice]))
        follow_ups = W.HBox([W.Label("Try:"), *buttons], layout=W.Layout(flex_flow="row wrap"))
        editors = W.HBox([W.VBox([sharp, qx, qy]), W.VBox(key_rows)])  # the sharpness beside the keys
        self._root(banner, editors, follow_ups, self.image, self.readout)
        self.refresh()
        self.static_png = self.image.value
        self.static_html = self.readout.value
        self.text = f"{self.title}\n{banner_text([self.choice])}\n{self.state.summary()}"

    def apply_preset(self, label: str) -> None:
        """One click per follow-up question: set the query and keys (sharpness stays)."""
        preset = PRESETS[label]
        c = self.controls
        with self.batch():
            query = preset.get("query")
            keys = dict(self.dictionary.keys)
            keys.update(preset.get("keys", {}))
            if "keys" not in preset:
                keys = self.dictionary.keys
            if query is not None:
                c["query_x"].value, c["query_y"].value = query
            for name in self.names:
                c[f"{name}_x"].value, c[f"{name}_y"].value = keys[name]

    @_quick
    def refresh(self) -> None:
        try:
            self._refresh()
        except StudentFunctionError as error:
            self.choice = fallback(error)
            self.banner.value = banner_html([self.choice])
            self._curve_key = None
            self._refresh()

    def _refresh(self) -> None:
        c = self.controls
        query = [c["query_x"].value, c["query_y"].value]
        keys = {n: [c[f"{n}_x"].value, c[f"{n}_y"].value] for n in self.names}
        values = self.dictionary.values
        fn = self.choice.fn
        v = colour_view(query, keys, values, c["sharpness"].value, fn)
        key = (tuple(query), tuple(tuple(k) for k in keys.values()))
        if key != self._curve_key:
            self._curves = colour_curves(query, keys, values, self.grid, fn)
            self._curve_difference = curve_difference(query, keys, self.grid, self._curves) if fn else None
            self._curve_key = key
        if self._curve_difference is not None:  # the curves come after the weights and the blend
            v = replace(v, differences=(*v.differences, self._curve_difference))
        self.state = v
        self.figure.update(v, self._curves)
        self.image.value = self.figure.render()
        self.readout.value = (
            f"<div style='display:flex;gap:10px;align-items:center'><div class='ac-swatch' title='{v.hex}' "
            f"style='width:42px;height:42px;border:1px solid #000;background:{v.hex}'></div>"
            f"<div style='flex:1'>{_pre(v.summary(), 'ac-summary')}</div></div>"
        )
