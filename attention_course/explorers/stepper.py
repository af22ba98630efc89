"""The stage stepper (lesson 07): one query row through raw scores, scaled, masked, weights, output.

The arithmetic of a row at each stage, the figure (every stage pre-rendered) and the
widget. The stages themselves come from :mod:`stages`.
"""

from __future__ import annotations

import html
import math

import ipywidgets as W
import numpy as np
import torch
from matplotlib.colors import Normalize
from matplotlib.patches import Rectangle

from .base import Explorer, _classes, _image, _pre, _quick, _readout
from .choosing import banner_text
from .compare import compare, is_empty, looks_words, sum_words
from .drawing import (
    BLUE,
    DEPARTS_NOTE,
    DPI,
    FONT,
    FONT_SMALL,
    FONT_TITLE,
    MASKED,
    VERMILLION,
    Bars,
    FastFigure,
    QuickText,
    _cmap_with_bad,
    _sources_footer,
    _text_colour,
    departs_frame,
    png_bytes,
)
from .numeric import fmt, fmt_list
from .stages import Stage, Stages, _softmax_steps, _sources, _stage_choices, _stages, _terms, difference_html

# ----------------------------------------------------------------- computation


def _row_check(st: Stages, key: str, i: int, got: torch.Tensor, want: torch.Tensor, what: str) -> list[str]:
    """A line when row i of a shown stage is not what the lesson's arithmetic gives from the row before it."""
    cols = st.value_names if key == "O" else [st.label(j) for j in range(st.T)]
    matrix = {"masked": "masked", "scaled": "scaled"}.get(key, key)
    diff = compare(key, "", got, want, name=lambda ix: f"{matrix}[{st.label(i)}, {cols[ix[0]]}]", what=what)
    if diff is None:
        return []
    maker = st.made_by.get(key, "")
    who = f"your `{maker}`" if st.yours(key) else "this stage"
    return [
        f"  {who} gives {fmt_list(got.tolist(), 3 if key == 'A' else 2)} here, "
        f"so this row differs from the arithmetic above in {len(diff.cells)} of {diff.total} cells, "
        f"e.g. {diff.example}"
    ]


def _inside(st: Stages, key: str) -> list[str]:
    """A note on a stage the explorer works out itself while the student's ``attention`` does it inside."""
    if st.made_by.get("A") == "attention" and st.yours("A") and not st.yours(key):
        return [
            f"  (the lesson's arithmetic, worked out here: your `attention` does this step inside, "
            f"and its weights show at {st.stage_number('A')})"
        ]
    return []


def _difference_lines(st: Stages, stage: Stage) -> list[str]:
    """Whether this is the stage where the head first departs from the lesson (the banner says how)."""
    diff = st.first_difference
    if diff is None:
        return []
    here = {"allowed": "masked", "Q": "", "K": "", "V": ""}.get(diff.stage, diff.stage)
    return (
        ["\u25b6 this stage is where your head first differs from the lesson (how: above)"]
        if here == stage.key
        else []
    )


def stage_row_lines(st: Stages, stage: Stage, i: int) -> list[str]:
    """The arithmetic of row i at one stage of the stepper, read from the matrices the stages show."""
    name = st.label(i)
    keys = [st.label(j) for j in range(st.T)]
    if stage.key == "S":
        q = st.Q[i].tolist()
        lines = [f"S[{name}, j] = q_{name} . k_j for every key j:"]
        for j, key in enumerate(keys):
            k = st.K[j].tolist()
            want = sum(a * b for a, b in zip(q, k))
            lines.append(f"  q_{name} . k_{key} = {_terms(q, k)} = {fmt(want)}")
        lines += _row_check(st, "S", i, st.S[i], st.Q[i] @ st.K.mT, "score")
    elif stage.key == "scaled":
        root = math.sqrt(st.d_k)
        want = st.S[i] / root
        lines = [
            f"divide row '{name}' by sqrt(d_k) = sqrt({st.d_k}) = {root:.3f}:",
            f"  {fmt_list(st.S[i].tolist())} / {root:.3f} = {fmt_list(want.tolist())}",
        ]
        lines += _row_check(st, "scaled", i, st.scaled[i], want, "score")
        lines += _inside(st, "scaled")
    elif stage.key == "masked":
        hidden = [keys[j] for j in range(st.T) if not bool(st.allowed[i, j])]
        later = [keys[j] for j in range(i + 1, st.T)]
        if hidden == later:
            what = (
                f"keys after '{name}' ({', '.join(hidden)}) become -inf"
                if hidden
                else "nothing comes after it"
            )
        else:
            what = (
                f"the mask shown hides {', '.join(hidden) if hidden else 'no key'} from '{name}', "
                f"where the lesson's causal mask hides {', '.join(later) if later else 'no key'} (the keys after it)"
            )
        lines = [f"causal mask: {what}:", f"  {fmt_list(st.masked[i].tolist())}"]
        want = st.scaled[i].masked_fill(~st.allowed[i], -math.inf)
        lines += _row_check(st, "masked", i, st.masked[i], want, "score")
        lines += _inside(st, "masked")
    elif stage.key == "A":
        before = st.masked if st.causal else st.scaled
        shifted, top, exps, total, weights = _softmax_steps(before[i].tolist())
        shown = st.A[i].tolist()
        if total > 0:
            how = f"minus the max {fmt(top)}, exp, divide by the sum {fmt(total, 3)}"
        else:
            how = "every key is hidden, so the whole row is 0 (never NaN)"
        lines = [f"softmax of row '{name}' above: {how}:", f"  {fmt_list(weights, 3)} ({sum_words(weights)})"]
        check = _row_check(st, "A", i, st.A[i], torch.tensor(weights, dtype=st.A.dtype), "weight")
        lines += check
        if check:
            lines.append(f"  the weights shown: {sum_words(shown)}")
        lines.append(looks_words(name, shown, keys))
    else:
        a = st.A[i].tolist()
        terms = " + ".join(f"{fmt(w, 3)}*v_{k}" for w, k in zip(a, keys))
        want = st.A[i] @ st.V
        lines = [f"O[{name}] = {terms}", f"  = {fmt_list(want.tolist())}"]
        if is_empty(a):
            lines[-1] += f": '{name}' may look at no key, so its output is 0"
        lines += _row_check(st, "O", i, st.O[i], want, "output")
    return lines + _difference_lines(st, stage)


# ---------------------------------------------------------------------- figure


class StageFigure:
    """The current stage, the stage before it (faint), one colour scale per quantity, and the chosen row.

    Scores (raw, scaled, masked) share one colour scale and one bar axis, so dividing by
    sqrt(d_k) visibly shrinks them; weights run 0..1; the output has its own scale. Every
    part that differs between stages or queries is an animated artist over one shared
    background, and the texts are sprites kept by content, so a stage seen for the first
    time costs no full redraw.
    """

    W_PX, H_PX = 688, 480
    QUANTITY = {"S": "score", "scaled": "score", "masked": "score", "A": "weight", "O": "output"}
    SHORT = {
        "S": "S = Q K^T",
        "masked": "-inf for later keys",
        "A": "A = softmax(row)",
        "O": "O = A V",
    }

    def __init__(self, st: Stages, footer: str = ""):
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
        from matplotlib.ticker import MaxNLocator

        self.st = st
        self.stages = st.stages()
        T = st.T
        self.ncols_max = max(T, len(st.value_names))
        self.ff = ff = FastFigure(self.W_PX / DPI, self.H_PX / DPI)
        fig = ff.fig
        self.cmap = _cmap_with_bad()

        # One colour scale (and bar axis) per quantity, the same for every stage showing it.
        def finite_range(*mats) -> tuple[float, float]:
            vals = np.concatenate([m.numpy().ravel() for m in mats])
            vals = vals[np.isfinite(vals)]
            lo, hi = (float(vals.min()), float(vals.max())) if vals.size else (0.0, 1.0)
            return (lo, hi) if hi > lo else (lo, lo + 1.0)

        self.limits = {
            "score": finite_range(st.S, st.scaled),
            "weight": (0.0, 1.0),
            "output": finite_range(st.O),
        }
        self.norms = {q: Normalize(*lim) for q, lim in self.limits.items()}
        self.ticks = {
            q: [t for t in MaxNLocator(nbins=5).tick_values(lo, hi) if lo - 1e-9 <= t <= hi + 1e-9]
            for q, (lo, hi) in self.limits.items()
        }

        def px(x0, y0, w, h):  # a rectangle in pixels from the top left -> figure fractions
            return [x0 / self.W_PX, 1 - (y0 + h) / self.H_PX, w / self.W_PX, h / self.H_PX]

        self._masked = [np.ma.masked_invalid(s.matrix.numpy()) for s in self.stages]  # -inf: the "bad" colour
        self._png: dict[tuple[int, int], bytes] = {}  # the picture is fixed by (stage, query): keep each one
        self.ax_all = fig.add_axes([0, 0, 1, 1])
        self.ax_all.set_axis_off()
        self.ax_prev = fig.add_axes(px(72, 56, 178, 168))
        self.ax_now = fig.add_axes(px(330, 56, 236, 168))
        self.ax_cb = fig.add_axes(px(584, 56, 14, 168))
        self.ax_row = fig.add_axes(px(72, 296, 600, 86))
        for ax in (self.ax_prev, self.ax_now, self.ax_cb, self.ax_row):
            ax.set_xticks([])
            ax.set_yticks([])
        for ax in (self.ax_prev, self.ax_now):
            ax.set_ylim(T - 0.5, -0.5)
        self.ax_cb.set_xlim(0, 1)
        self.ax_cb.set_ylim(0, 1)  # the gradient is the same for every quantity: only its labels change

        animated = []

        def qt(ax, x, y, transform=None, **kw):
            kw.setdefault("fontsize", FONT_SMALL)
            t = QuickText(x, y, "", transform=transform if transform is not None else ax.transData, **kw)
            ax.add_artist(t)
            animated.append(t)
            return t

        # The two matrices: an image, a number per cell, column labels (two lines), row labels.
        self.panels = {}
        for name, ax, faint in (("prev", self.ax_prev, True), ("now", self.ax_now, False)):
            image = ax.imshow(
                np.zeros((T, T)),
                cmap=self.cmap,
                norm=self.norms["score"],
                aspect="auto",
                interpolation="nearest",
                alpha=0.4 if faint else 1.0,
            )
            animated.append(image)
            cells = [
                [qt(ax, j, i, ha="center", va="center") for j in range(self.ncols_max)] for i in range(T)
            ]
            xaxis = ax.get_xaxis_transform()
            line = 13.5 / 168  # one text line, in axes units
            cols = [
                (
                    qt(ax, j, -line, xaxis, ha="center", va="baseline"),
                    qt(ax, j, -2 * line, xaxis, ha="center", va="baseline"),
                )
                for j in range(self.ncols_max)
            ]
            yaxis = ax.get_yaxis_transform()
            rows = [qt(ax, -0.03, i, yaxis, ha="right", va="center") for i in range(T)]
            title = qt(
                ax,
                0.0,
                1.03,
                ax.transAxes,
                ha="left",
                va="baseline",
                fontsize=FONT if faint else FONT_TITLE,
                weight="normal" if faint else "bold",
                color="#555555" if faint else "black",
            )
            self.panels[name] = {
                "ax": ax,
                "image": image,
                "cells": cells,
                "cols": cols,
                "rows": rows,
                "title": title,
            }
        self.prev_note = qt(
            self.ax_prev, 0.5, 0.5, self.ax_prev.transAxes, ha="center", va="center", color="#555555"
        )
        # The stage where the head first departs from the lesson: a vermillion frame and a line under it.
        self.departs = None  # the index of that stage (set by the stepper), None where none departs
        self.departs_box = departs_frame(self.ax_now)
        animated.append(self.departs_box)
        self.departs_text = qt(
            self.ax_all,
            330 / self.W_PX,
            1 - 272 / self.H_PX,
            self.ax_all.transAxes,
            ha="left",
            va="baseline",
            fontsize=FONT,
            weight="bold",
            color=VERMILLION,
        )
        self.row_box = Rectangle((-0.5, -0.5), 1, 1, fill=False, ec="black", lw=3.5)
        self.row_box_inner = Rectangle((-0.5, -0.5), 1, 1, fill=False, ec="white", lw=1.4)
        self.prev_box = Rectangle((-0.5, -0.5), 1, 1, fill=False, ec="black", lw=1.5)
        self.ax_now.add_patch(self.row_box)
        self.ax_now.add_patch(self.row_box_inner)
        self.ax_prev.add_patch(self.prev_box)
        animated += [self.row_box, self.row_box_inner, self.prev_box]
        self.state_text = qt(
            self.ax_all,
            72 / self.W_PX,
            1 - 20 / self.H_PX,
            self.ax_all.transAxes,
            ha="left",
            va="baseline",
            fontsize=FONT,
        )

        # The colour bar of the current quantity.
        self.cb_image = self.ax_cb.imshow(
            np.linspace(0, 1, 256)[:, None],
            cmap=self.cmap,
            aspect="auto",
            origin="lower",
            extent=(0, 1, 0, 1),
        )
        cb_y = self.ax_cb.get_yaxis_transform()
        self.cb_ticks = Line2D([], [], color="black", lw=1, transform=cb_y, clip_on=False)
        self.ax_cb.add_line(self.cb_ticks)
        animated.append(self.cb_ticks)
        self.cb_labels = [qt(self.ax_cb, 1.5, 0, cb_y, ha="left", va="center") for _ in range(8)]
        self.cb_name = qt(self.ax_cb, 0.0, -0.1, self.ax_cb.transAxes, ha="left", va="baseline")

        # The chosen query's row as bars, on the quantity's fixed axis.
        row_y = self.ax_row.get_yaxis_transform()
        self.grid = Line2D([], [], color="#cccccc", lw=0.8, transform=row_y)
        self.zero = Line2D([], [], color="#555555", lw=1.0, transform=row_y)
        self.ax_row.add_line(self.grid)
        self.ax_row.add_line(self.zero)
        animated += [self.grid, self.zero]
        self.bars = Bars(self.ax_row, self.ncols_max, width=0.6)
        animated.append(self.bars.collection)
        self.bar_labels = [qt(self.ax_row, j, 0, ha="center", va="bottom") for j in range(self.ncols_max)]
        self.row_ticks = [qt(self.ax_row, -0.008, 0, row_y, ha="right", va="center") for _ in range(8)]
        self.row_axis_name = qt(self.ax_row, -0.008, 1.04, self.ax_row.transAxes, ha="right", va="baseline")
        row_x = self.ax_row.get_xaxis_transform()
        self.row_cols = [
            (
                qt(self.ax_row, j, -14 / 86, row_x, ha="center", va="baseline"),
                qt(self.ax_row, j, -27 / 86, row_x, ha="center", va="baseline"),
            )
            for j in range(self.ncols_max)
        ]
        # "row of query" then the token, bold and coloured, on one baseline.
        self.row_title = qt(
            self.ax_row, 0.0, 1.06, self.ax_row.transAxes, ha="left", va="baseline", fontsize=FONT
        )
        self.row_token = qt(
            self.ax_row,
            0.0,
            1.06,
            self.ax_row.transAxes,
            ha="left",
            va="baseline",
            fontsize=FONT,
            weight="bold",
            color=BLUE,
        )

        handles = [
            Patch(fill=False, ec="black", lw=2, label="chosen query's row"),
            Patch(fc=VERMILLION, label="largest in the row"),
            Patch(fc=self.cmap(0.5), alpha=0.4, label="left: the stage before"),
        ]
        if st.causal:
            handles.insert(2, Patch(fc=MASKED, ec="#999999", label="-inf: hidden by the mask"))
        fig.legend(
            handles=handles,
            loc="lower left",
            bbox_to_anchor=(72 / self.W_PX, 30 / self.H_PX),
            ncol=4,
            frameon=False,
            fontsize=FONT_SMALL,
            handlelength=1.4,
            columnspacing=1.2,
            borderaxespad=0,
            borderpad=0,
        )
        _sources_footer(fig, footer)
        ff.animate(*animated)
        self._quick = [a for a in animated if isinstance(a, QuickText)]
        query_artists = [
            self.row_box,
            self.row_box_inner,
            self.prev_box,
            self.bars.collection,
            self.row_token,
        ]
        query_artists += self.bar_labels + self.panels["now"]["rows"] + self.panels["prev"]["rows"]
        self._query_artists = set(query_artists)  # drawn on every new (stage, query); the rest once per stage
        self._stage_pixels: dict = {}
        self._base = None
        self.k = 0

    # -------------------------------------------------------------- helpers

    def stage_title(self, k: int) -> str:
        s = self.stages[k]
        formula = f"S / sqrt({self.st.d_k})" if s.key == "scaled" else self.SHORT[s.key]
        return f"{k + 1}. {s.title}: {formula}"

    def state_words(self, k: int) -> str:
        """Which operations have been applied by stage k, in words."""
        keys = [s.key for s in self.stages[: k + 1]]
        parts = [
            "scaling: "
            + (f"ON (/ sqrt({self.st.d_k}) = {math.sqrt(self.st.d_k):.2f})" if "scaled" in keys else "OFF")
        ]
        if self.st.causal:
            parts.append("mask: " + ("ON" if "masked" in keys else "OFF"))
        parts.append("softmax: " + ("ON" if "A" in keys else "OFF"))
        parts.append("mixed with V: " + ("ON" if "O" in keys else "OFF"))
        return "  |  ".join(parts)

    def _rows(self, panel: dict, i: int | None) -> None:
        """Row labels: the chosen query's marked by an arrow, colour and weight."""
        for r, t in enumerate(panel["rows"]):
            chosen = r == i
            t.set_text(("\u25b6 " if chosen else "") + self.st.label(r))
            t._color = BLUE if chosen else "black"
            t._props.set_weight("bold" if chosen else "normal")

    def _matrix(self, panel: dict, k: int, faint: bool) -> None:
        stage = self.stages[k]
        M = stage.matrix.numpy()
        T, ncols = M.shape
        norm = self.norms[self.QUANTITY[stage.key]]
        panel["image"].set_data(self._masked[k])
        panel["image"].set_norm(norm)
        panel["image"].set_extent((-0.5, ncols - 0.5, T - 0.5, -0.5))
        panel["image"].set_visible(True)
        dp = 3 if stage.key == "A" and not faint else 2
        for r, row in enumerate(panel["cells"]):
            for j, t in enumerate(row):
                if j >= ncols:
                    t.set_visible(False)
                    continue
                x = M[r, j]
                t.set_visible(True)
                t.set_text(fmt(x, dp))
                if faint:
                    t._color = "#444444"
                else:
                    t._color = _text_colour(self.cmap(norm(x))) if np.isfinite(x) else "black"
        for j, (a, b) in enumerate(panel["cols"]):
            words = stage.columns[j].split(" ", 1) if j < ncols else ["", ""]
            a.set_text(words[0])
            b.set_text(words[1] if len(words) > 1 else "")
        panel["title"].set_text(f"before: {k + 1}. {stage.title}" if faint else self.stage_title(k))

    def update(self, k: int, i: int) -> None:
        """Show stage k with query i's row (a picture drawn before is reused as it is)."""
        self.k, self.i = k, i
        if (k, i) in self._png:
            return
        if k not in self._stage_pixels:
            self._show_stage(k)
        self._show_query(k, i)

    def show(self, k: int, i: int) -> None:
        """Set every animated artist for stage k and query i."""
        self._show_stage(k)
        self._show_query(k, i)

    def _show_stage(self, k: int) -> None:
        """The artists that depend on the stage alone (drawn once per stage, then kept as pixels)."""
        stage = self.stages[k]
        quantity = self.QUANTITY[stage.key]
        ncols = len(stage.columns)
        self._matrix(self.panels["now"], k, faint=False)
        prev = self.panels["prev"]
        if k > 0:
            self._matrix(prev, k - 1, faint=True)
            self.prev_note.set_text("")
        else:
            prev["image"].set_visible(False)
            for row in prev["cells"]:
                for t in row:
                    t.set_visible(False)
            for a, b in prev["cols"]:
                a.set_text("")
                b.set_text("")
            prev["title"].set_text("before: Q and K")
            self.prev_note.set_text("the first stage")
        self.state_text.set_text(self.state_words(k))
        here = k == self.departs
        self.departs_box.set_visible(here)
        self.departs_text.set_text(DEPARTS_NOTE if here else "")

        # colour bar of this quantity
        lo, hi = self.limits[quantity]
        ticks = self.ticks[quantity]
        xs, ys = [], []
        at = [(t - lo) / (hi - lo) for t in ticks]  # where each tick sits on the 0..1 gradient
        for t in at:
            xs += [1.0, 1.35, np.nan]
            ys += [t, t, np.nan]
        self.cb_ticks.set_data(xs, ys)
        for n, label in enumerate(self.cb_labels):
            label.set_visible(n < len(ticks))
            if n < len(ticks):
                label.set_text(fmt(ticks[n], 2))
                label.set_y(at[n])
        self.cb_name.set_text(quantity)

        # the bar axis of this quantity, fixed across the stages that show it
        self._axes_limits(k)
        gx, gy = [], []
        for t in ticks:
            gx += [0, 1, np.nan]
            gy += [t, t, np.nan]
        self.grid.set_data(gx, gy)
        self.zero.set_data([0, 1], [0, 0])
        for n, label in enumerate(self.row_ticks):
            label.set_visible(n < len(ticks))
            if n < len(ticks):
                label.set_text(fmt(ticks[n], 2))
                label.set_y(ticks[n])
        self.row_axis_name.set_text(quantity)
        for j, (a, b) in enumerate(self.row_cols):
            words = stage.columns[j].split(" ", 1) if j < ncols else ["", ""]
            a.set_text(words[0])
            b.set_text(words[1] if len(words) > 1 else "")
        self.row_title.set_text(f"{stage.title}, row of query ")

    def _axes_limits(self, k: int) -> None:
        """Data limits of stage k (every artist placed in data units needs them, cached pixels or not)."""
        stage = self.stages[k]
        quantity = self.QUANTITY[stage.key]
        ncols = len(stage.columns)
        lo, hi = self.limits[quantity]
        top = hi if quantity != "weight" else 1.0
        bottom = min(lo, 0.0)
        pad = 0.18 * (top - bottom)
        prev_cols = len(self.stages[k - 1].columns) if k > 0 else ncols
        wanted = (
            (self.ax_now, (-0.5, ncols - 0.5), None),
            (self.ax_prev, (-0.5, prev_cols - 0.5), None),
            (
                self.ax_row,
                (-0.6, ncols - 0.4),
                (bottom - (0.05 * (top - bottom) if bottom < 0 else 0), top + pad),
            ),
        )
        for ax, xlim, ylim in wanted:
            if ax.get_xlim() != xlim:
                ax.set_xlim(*xlim)
            if ylim is not None and ax.get_ylim() != ylim:
                ax.set_ylim(*ylim)

    def _show_query(self, k: int, i: int) -> None:
        """The artists that depend on the chosen query too."""
        self._axes_limits(k)
        stage = self.stages[k]
        quantity = self.QUANTITY[stage.key]
        ncols = len(stage.columns)
        self._rows(self.panels["now"], i)
        self._rows(self.panels["prev"], i if k > 0 else None)
        for box in (self.row_box, self.row_box_inner):
            box.set_bounds(-0.5, i - 0.5, ncols, 1)
        if k > 0:
            self.prev_box.set_bounds(-0.5, i - 0.5, len(self.stages[k - 1].columns), 1)
        self.prev_box.set_visible(k > 0)
        row = stage.matrix[i].tolist()
        lo, hi = self.ax_row.get_ylim()
        dp = 3 if stage.key == "A" else 2
        best = max(range(ncols), key=lambda j: row[j] if math.isfinite(row[j]) else -math.inf)
        heights = [x if math.isfinite(x) else 0.0 for x in row]
        self.bars.set(
            heights, [VERMILLION if (j == best and quantity != "output") else BLUE for j in range(ncols)]
        )
        lift = 0.02 * (hi - lo)
        for j, label in enumerate(self.bar_labels):
            label.set_visible(j < ncols)
            if j < ncols:
                label.set_text(fmt(row[j], dp))
                label.set_y(max(heights[j], 0.0) + lift)
        self.row_token.set_text(self.st.label(i))
        self.row_token.set_position((self._after(self.row_title) + 4 / self.ax_row.bbox.width, 1.06))

    def _after(self, t: QuickText) -> float:
        """Where, in axes units of the row panel, the text ``t`` ends."""
        _pixels, w, _h, _d, _pad = t._sprite(self.ff.fig.dpi)
        return t._x + w / self.ax_row.bbox.width

    def prerender(self, i: int) -> None:
        """Draw every stage for query i now, so that stepping through them the first time costs nothing."""
        k, i0 = self.k, self.i
        for n in range(len(self.stages)):
            self.update(n, i)
            self.render()
        self.update(k, i0)

    def render(self, k: int | None = None) -> bytes:
        """PNG bytes of the current stage and query: stage pixels kept per stage, pictures per (stage, query)."""
        key = (self.k, self.i)
        if key in self._png:
            return self._png[key]
        ff, canvas = self.ff, self.ff.canvas
        pixels = self._stage_pixels.get(self.k)
        if pixels is None:
            if self._base is None:
                canvas.draw()  # the one full draw: axes frames, legend, footer
                ff.full_draws += 1
                self._base = canvas.copy_from_bbox(ff.fig.bbox)
            else:
                canvas.restore_region(self._base)
            for artist in ff.animated:
                if artist not in self._query_artists and artist.get_visible():
                    ff.fig.draw_artist(artist)
            pixels = self._stage_pixels[self.k] = canvas.copy_from_bbox(ff.fig.bbox)
        else:
            canvas.restore_region(pixels)
        for artist in ff.animated:
            if artist in self._query_artists and artist.get_visible():
                ff.fig.draw_artist(artist)
        self._png[key] = png_bytes(np.asarray(canvas.buffer_rgba()))
        return self._png[key]

    def text_boxes(self) -> list[tuple[str, float, float, float, float]]:
        """Every visible text drawn on the last render: (text, x0, y0, x1, y1) in pixels (for tests)."""
        out = []
        dpi = self.ff.fig.dpi
        for t in self._quick:
            if not (t.get_visible() and t.get_text()):
                continue
            _pixels, w, h, d, _pad = t._sprite(dpi)
            px_, py_ = t.get_transform().transform((t._x, t._y))
            left = px_ - {"left": 0.0, "center": w / 2, "right": w}[t._ha]
            bottom = py_ - {"bottom": 0.0, "baseline": d, "center": h / 2, "top": h}[t._va]
            out.append((t.get_text(), left, bottom, left + w, bottom + h))
        return out


# ---------------------------------------------------------------------- widget


class StageStepper(Explorer):
    kind = "stage-stepper"
    title = "Stage stepper"

    def __init__(
        self, example: str = "love_cats", causal=None, stage: int = 1, query=None, **functions
    ) -> None:
        super().__init__()
        self.choices = _stage_choices(functions)
        self.st = _stages(example, causal, self.choices)
        self.stages = self.st.stages()
        banner, footer = _sources(self.st, self.choices)
        self.figure = StageFigure(self.st, footer)
        T = self.st.T
        q = T - 1 if query is None else int(query)
        step = W.IntSlider(
            value=stage,
            min=1,
            max=len(self.stages),
            step=1,
            description="stage",
            layout=W.Layout(width="260px"),
        )
        self.stage_name = W.HTML()
        chooser = W.ToggleButtons(
            options=[(self.st.label(i), i) for i in range(T)],
            value=q,
            description="query",
            style={"button_width": "70px", "description_width": "46px"},
            layout=W.Layout(width="auto"),
        )
        self.controls = {"stage": step, "query": chooser}
        _classes(self.controls, "ac-")
        self.stage_name.add_class("ac-stage-name")
        step.observe(self._changed, names="value")
        chooser.observe(self._changed, names="value")
        self.image, self.readout = _image(), _readout()
        self.departs = departs = self._departs()
        self.figure.departs = departs  # framed in the picture too
        steps = " -> ".join(
            f"{n + 1} {s.title}" + (" (first differs from the lesson)" if n == departs else "")
            for n, s in enumerate(self.stages)
        )
        intro = W.HTML(f"<b>{html.escape(self.st.title)}</b>: {html.escape(steps)}" + banner)
        controls = W.HBox([step, chooser], layout=W.Layout(flex_flow="row wrap", align_items="center"))
        self._root(intro, controls, self.stage_name, self.image, self.readout)
        self.refresh()
        self.figure.prerender(q)  # every stage of the first query: the first step through them is instant
        self.static_png = self.image.value
        self.static_html = difference_html(self.st) + self.readout.value
        diff = self.st.first_difference
        notes = [footer, banner_text(self.failed_functions()), diff.line() if diff is not None else ""]
        self.text = f"{self.title}: {self.st.title}\n{steps}\n" + "\n".join(n for n in notes if n)

    def _departs(self) -> int | None:
        """The index of the first stage that departs from the lesson (None where none does)."""
        diff = self.st.first_difference
        if diff is None:
            return None
        key = {"allowed": "masked", "Q": "S", "K": "S", "V": "O"}.get(diff.stage, diff.stage)
        return next((n for n, s in enumerate(self.stages) if s.key == key), None)

    @_quick
    def refresh(self) -> None:
        k = self.controls["stage"].value - 1
        i = self.controls["query"].value
        stage = self.stages[k]
        self.state = (stage.key, i)
        self.figure.update(k, i)
        self.image.value = self.figure.render(k)
        mark = (
            " <span class='ac-departs' style='color:#a33c00'>&#9888; first differs from the lesson here</span>"
            if k == self.departs
            else ""
        )
        self.stage_name.value = (
            f"<b>{k + 1}. {html.escape(stage.title)}</b>: {html.escape(stage.formula)}{mark} &nbsp;&mdash;&nbsp; "
            f"<span class='ac-stage-state'>{html.escape(self.figure.state_words(k))}</span>"
        )
        self.readout.value = _pre("\n".join(stage_row_lines(self.st, stage, i)), "ac-summary")
