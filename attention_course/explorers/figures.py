"""Figures of the explorers: built once, then updated in place and blitted to PNG bytes.

Each figure draws its static parts (axes, ticks, labels, curves that never change)
once and keeps that picture as a background. An update only moves the artists that
change (``set_data``, ``set_height``, ``set_array``), pastes the background back and
draws those artists on top, then encodes the pixels as a PNG. No pyplot, no global
state: nothing is shown unless an explorer shows it. Colours follow the Okabe-Ito
palette and the cividis colour map, both readable with colour-blindness.

Glyphs are the costly part of a redraw, so text that changes on every event is kept
short (numbers); sentences go to the HTML readout beside the picture.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.collections import PolyCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Rectangle

from . import compute

DPI = 80
BLUE, ORANGE, VERMILLION, GREEN, SKY, PURPLE = (
    "#0072B2",
    "#E69F00",
    "#D55E00",
    "#009E73",
    "#56B4E9",
    "#CC79A7",
)
CMAP = "cividis"
MASKED = "#d9d9d9"
STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
}


# --------------------------------------------------------------- PNG, quickly


def png_bytes(rgba: np.ndarray) -> bytes:
    """Encode an (H, W, 4) uint8 picture as an RGBA PNG, fast.

    Rows use PNG's "Up" filter (difference with the row above), so the large flat
    areas of a plot become zeros that deflate's quickest setting packs in one pass.
    """
    h, w, _ = rgba.shape
    flat = np.ascontiguousarray(rgba).reshape(h, w * 4)
    rows = np.empty((h, w * 4 + 1), np.uint8)
    rows[:, 0] = 2  # filter type "Up"
    rows[0, 0] = 0
    rows[0, 1:] = flat[0]
    np.subtract(flat[1:], flat[:-1], out=rows[1:, 1:])  # wraps mod 256, as PNG wants
    packer = zlib.compressobj(1)
    data = packer.compress(rows.tobytes()) + packer.flush()

    def chunk(tag: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)  # 8 bits, colour type 6: RGBA
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


class FastFigure:
    """A Matplotlib figure that re-renders only its animated artists.

    ``layout`` names a static state (e.g. which stage is shown): one background is
    kept per layout, drawn the first time that layout is rendered.
    """

    def __init__(self, width: float, height: float, dpi: int = DPI):
        import matplotlib

        with matplotlib.rc_context(STYLE):
            self.fig = Figure(figsize=(width, height), dpi=dpi)
        self.canvas = FigureCanvasAgg(self.fig)
        self.animated: list = []
        self._backgrounds: dict = {}
        self.full_draws = 0

    def animate(self, *artists):
        """Mark artists as the ones that change; returns them (in drawing order)."""
        for a in artists:
            a.set_animated(True)
            self.animated.append(a)
        return artists

    def has(self, layout: object = None) -> bool:
        """Whether the background of this layout is already drawn."""
        return layout in self._backgrounds

    def forget(self) -> None:
        """Drop every stored background (after a change to the static parts)."""
        self._backgrounds.clear()

    def render(self, layout: object = None) -> bytes:
        """PNG bytes of the figure as it is now."""
        bg = self._backgrounds.get(layout)
        if bg is None:
            self.canvas.draw()  # everything except the animated artists (images excepted, redrawn below)
            self.full_draws += 1
            self._backgrounds[layout] = self.canvas.copy_from_bbox(self.fig.bbox)
        else:
            self.canvas.restore_region(bg)
        for artist in self.animated:
            if artist.get_visible():
                self.fig.draw_artist(artist)
        return png_bytes(np.asarray(self.canvas.buffer_rgba()))

    def full_png(self) -> bytes:
        """PNG bytes from a complete redraw (for the static fallback and tests)."""
        for a in self.animated:
            a.set_animated(False)
        try:
            self.canvas.draw()
            return png_bytes(np.asarray(self.canvas.buffer_rgba()))
        finally:
            for a in self.animated:
                a.set_animated(True)
            self._backgrounds.clear()


class QuickText(Artist):
    """A short text whose pixels are kept by content: a string drawn before costs one paste.

    Matplotlib lays out and rasterises every glyph on every draw; the numbers an
    explorer shows on each event repeat often (0.41, std 7.51, ...), so this artist
    renders each distinct string once into a small transparent picture.
    """

    _sprites: OrderedDict = OrderedDict()
    _MAX = 4096

    def __init__(
        self,
        x,
        y,
        text="",
        *,
        transform,
        ha="center",
        va="bottom",
        fontsize=8,
        color="black",
        weight="normal",
    ):
        super().__init__()
        self.set_transform(transform)
        self._x, self._y, self._text = x, y, str(text)
        self._props = FontProperties(size=fontsize, weight=weight)
        self._color, self._ha, self._va = color, ha, va

    def set_text(self, text) -> None:
        self._text = str(text)

    def get_text(self) -> str:
        return self._text

    def set_position(self, xy) -> None:
        self._x, self._y = xy

    def set_y(self, y) -> None:
        self._y = y

    def _sprite(self, dpi: float):
        key = (self._text, self._props.get_size_in_points(), self._props.get_weight(), self._color, dpi)
        hit = self._sprites.get(key)
        if hit is not None:
            self._sprites.move_to_end(key)
            return hit
        w, h, d = RendererAgg(1, 1, dpi).get_text_width_height_descent(self._text, self._props, ismath=False)
        pad = 2
        width, height = int(math.ceil(w)) + 2 * pad, int(math.ceil(h)) + 2 * pad
        renderer = RendererAgg(width, height, dpi)  # transparent to start with
        gc = renderer.new_gc()
        gc.set_foreground(self._color)
        renderer.draw_text(
            gc, pad, height - pad - d, self._text, self._props, 0
        )  # y from the top: the baseline
        gc.restore()
        pixels = np.ascontiguousarray(
            np.asarray(renderer.buffer_rgba())[::-1]
        )  # draw_image wants bottom row first
        hit = (pixels, w, h, d, pad)
        self._sprites[key] = hit
        if len(self._sprites) > self._MAX:
            self._sprites.popitem(last=False)
        return hit

    def draw(self, renderer) -> None:
        if not self.get_visible() or not self._text:
            return
        pixels, w, h, d, pad = self._sprite(renderer.dpi)
        px, py = self.get_transform().transform((self._x, self._y))
        left = px - {"left": 0.0, "center": w / 2, "right": w}[self._ha]
        bottom = py - {"bottom": 0.0, "baseline": d, "center": h / 2, "top": h}[self._va]
        gc = renderer.new_gc()
        renderer.draw_image(gc, round(left - pad), round(bottom - pad), pixels)
        gc.restore()


def quick_text(ax, x, y, text="", *, axes_coords=False, **kwargs) -> QuickText:
    """Add a :class:`QuickText` to ``ax`` at (x, y) in data (or axes) coordinates."""
    artist = QuickText(x, y, text, transform=ax.transAxes if axes_coords else ax.transData, **kwargs)
    ax.add_artist(artist)
    return artist


class Bars:
    """A bar chart as one polygon collection: one draw call for all bars, heights set in place."""

    def __init__(self, ax, n: int, width: float = 0.7, colour: str = BLUE, edgecolor="none", lw: float = 0.0):
        self.n, self.half = n, width / 2
        self.colour = colour
        self.collection = PolyCollection(
            [self._box(j, 0.0) for j in range(n)],
            facecolors=[colour] * n,
            edgecolors=edgecolor,
            linewidths=lw,
        )
        ax.add_collection(self.collection, autolim=False)

    def _box(self, j: int, h: float):
        return [(j - self.half, 0.0), (j + self.half, 0.0), (j + self.half, h), (j - self.half, h)]

    def set(self, heights: Sequence[float], colours: Sequence[str] | None = None) -> None:
        """Heights of the first len(heights) bars (the rest are hidden), and their colours."""
        self.collection.set_verts([self._box(j, h) for j, h in enumerate(heights)])
        self.collection.set_facecolor(list(colours) if colours is not None else [self.colour] * len(heights))


def _text_colour(rgba) -> str:
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def _sources_footer(fig: Figure, text: str) -> None:
    if text:
        fig.text(0.005, 0.005, text, fontsize=7.5, color="#444444", ha="left", va="bottom")


# --------------------------------------------------------- head dimension (03)


class HeadDimensionFigure:
    """Score spread, the weight matrix, one row's weights and the entropy curve."""

    def __init__(
        self,
        tokens: Sequence[str],
        d_values: Sequence[int],
        curve_unscaled: Sequence[float],
        curve_scaled: Sequence[float],
        footer: str = "",
    ):
        T = len(tokens)
        self.T = T
        self.ff = ff = FastFigure(8.6, 5.4)
        fig = ff.fig
        fig.subplots_adjust(left=0.1, right=0.95, top=0.94, bottom=0.15, hspace=0.62, wspace=0.32)
        ax_spread, ax_heat, ax_bar, ax_curve = fig.subplots(2, 2).flat

        # Score spread: raw on top, scaled below; every one of the T x T scores is a dot.
        ax_spread.set_title(f"Score spread: all {T} x {T} dot products")
        ax_spread.set_xlim(-42, 42)
        ax_spread.set_ylim(-0.6, 1.6)
        ax_spread.set_yticks([1, 0], ["raw\nq . k", "scaled\n/ sqrt(d_k)"])
        ax_spread.set_xlabel("score")
        ax_spread.axvline(0, color="#999999", lw=0.8)
        jitter = (np.arange(T * T) * 0.618034) % 1.0 * 0.5 - 0.25
        self._jitter = jitter
        # Line2D markers: Agg stamps one marker bitmap per point, far cheaper than a scatter collection.
        (self.raw_dots,) = ax_spread.plot([], [], "o", ms=3.5, color=VERMILLION, ls="none")
        (self.scaled_dots,) = ax_spread.plot([], [], "s", ms=3.2, color=BLUE, ls="none")
        (self.std_bars,) = ax_spread.plot([], [], color="black", lw=1.6, marker="|", ms=9)  # -std .. +std
        self.raw_label = quick_text(ax_spread, 41, 1.42, ha="right", va="center", fontsize=8)
        self.scaled_label = quick_text(ax_spread, 41, 0.42, ha="right", va="center", fontsize=8)
        ax_spread.text(
            -41, 1.5, "\u25b6 goes into softmax", ha="left", va="center", fontsize=7, color="#333333"
        )
        (self.into_softmax,) = ax_spread.plot([], [], ">", color="black", ms=7, clip_on=False)

        # The weight matrix.
        ax_heat.set_title("Softmax weights A (rows: queries)")
        edges = np.arange(T + 1) - 0.5
        self.heat = ax_heat.pcolormesh(edges, edges, np.zeros((T, T)), cmap=CMAP, vmin=0, vmax=1)
        ax_heat.set_xlim(-0.5, T - 0.5)
        ax_heat.set_ylim(T - 0.5, -0.5)  # first query on top, as in a matrix
        ax_heat.set_xticks(range(T), tokens, rotation=45, ha="right", rotation_mode="anchor")
        ax_heat.set_yticks(range(T), tokens)
        ax_heat.set_xlabel("key")
        ax_heat.set_ylabel("query")
        fig.colorbar(self.heat, ax=ax_heat, fraction=0.05, pad=0.02).set_label("weight")
        self.row = 0
        self.row_box_outer = Rectangle((-0.5, -0.5), T, 1, fill=False, ec="black", lw=4)
        self.row_box_inner = Rectangle((-0.5, -0.5), T, 1, fill=False, ec="white", lw=1.8)
        ax_heat.add_patch(self.row_box_outer)
        ax_heat.add_patch(self.row_box_inner)

        # One row's weights.
        ax_bar.set_ylim(0, 1.12)
        ax_bar.set_xticks(range(T), tokens, rotation=45, ha="right", rotation_mode="anchor")
        ax_bar.set_xlabel("key")
        ax_bar.set_ylabel("weight")
        ax_bar.set_xlim(-0.6, T - 0.4)
        self.bars = Bars(ax_bar, T)
        self.top_label = quick_text(ax_bar, 0, 0, ha="center", va="bottom", fontsize=8)
        self.ax_bar = ax_bar
        self.tokens = list(tokens)
        self.entropy_text = quick_text(ax_bar, 0.98, 0.93, axes_coords=True, ha="right", va="top", fontsize=9)

        # Entropy against d_k: the average over many random rows, and where this row sits.
        ax_curve.set_title("Entropy of a row (average of many)")
        ax_curve.set_xscale("log", base=2)
        ax_curve.set_xlim(1, max(d_values))
        ticks = [d for d in (1, 2, 4, 8, 16, 32, 64, 128) if d <= max(d_values)]
        ax_curve.set_xticks(ticks, [str(d) for d in ticks])
        ax_curve.minorticks_off()
        ax_curve.set_ylim(0, math.log(T) * 1.12)
        ax_curve.set_xlabel("d_k (log scale)")
        ax_curve.set_ylabel("entropy (nats)")
        ax_curve.axhspan(0, compute.SATURATED, color="#e0e0e0", hatch="//", ec="#bbbbbb", lw=0)
        ax_curve.text(1.1, compute.SATURATED / 2, "near one-hot", fontsize=7, va="center", color="#555555")
        ax_curve.axhline(math.log(T), color="#777777", lw=0.8, ls=":")
        ax_curve.text(1.1, math.log(T), f"uniform: ln {T}", fontsize=7, va="bottom", color="#555555")
        ax_curve.plot(d_values, curve_unscaled, color=VERMILLION, ls="--", lw=1.8, label="not scaled")
        ax_curve.plot(d_values, curve_scaled, color=BLUE, ls="-", lw=1.8, label="scaled by 1/sqrt(d_k)")
        ax_curve.legend(loc="lower left", fontsize=7, frameon=False, bbox_to_anchor=(0.0, 0.08))
        self.d_line = ax_curve.axvline(1, color="black", lw=0.8)
        (self.d_point,) = ax_curve.plot([], [], "o", color="black", mfc="white", ms=7, label="this row")
        _sources_footer(fig, footer)

        ff.animate(
            self.raw_dots,
            self.scaled_dots,
            self.std_bars,
            self.raw_label,
            self.scaled_label,
            self.into_softmax,
            self.heat,
            self.row_box_outer,
            self.row_box_inner,
            self.bars.collection,
            self.top_label,
            self.entropy_text,
            self.d_line,
            self.d_point,
        )

    def update(self, v: compute.HeadView) -> None:
        raw = v.raw.flatten().numpy()
        scaled = v.scaled.flatten().numpy()
        self.raw_dots.set_data(np.clip(raw, -41, 41), 1 + self._jitter)
        self.scaled_dots.set_data(np.clip(scaled, -41, 41), self._jitter)
        self.raw_dots.set_alpha(0.3 if v.scale else 0.95)
        self.scaled_dots.set_alpha(0.95 if v.scale else 0.3)
        self.std_bars.set_data(
            [-v.raw_std, v.raw_std, np.nan, -v.scaled_std, v.scaled_std], [1.36, 1.36, np.nan, 0.36, 0.36]
        )
        self.raw_label.set_text(f"std {v.raw_std:.1f}")
        self.scaled_label.set_text(f"std {v.scaled_std:.1f}")
        self.into_softmax.set_data([-40], [0.0 if v.scale else 1.0])
        self.heat.set_array(v.weights.numpy().ravel())
        for box in (self.row_box_outer, self.row_box_inner):
            box.set_y(v.row - 0.5)
        top = max(range(self.T), key=v.row_weights.__getitem__)
        self.bars.set(v.row_weights, [VERMILLION if j == top else BLUE for j in range(self.T)])
        self.top_label.set_text(f"{v.row_weights[top]:.2f}")
        self.top_label.set_position((top, v.row_weights[top] + 0.01))
        self.entropy_text.set_text(f"H = {v.row_entropy:.2f}")
        self.row = v.row
        if not self.ff.has(v.row):  # the title is part of this row's background
            self.ax_bar.set_title(f"Weights of row '{self.tokens[v.row]}' (H: entropy, nats)")
        self.d_line.set_xdata([v.d_k, v.d_k])
        self.d_point.set_data([v.d_k], [v.row_entropy])

    def render(self) -> bytes:
        return self.ff.render(layout=self.row)


# ------------------------------------------------------------- sharpness (05)

KEY_COLOURS = {"red": "#E41A1C", "green": "#2CA02C", "orange": "#FF9F1C"}
KEY_STYLES = {"red": ("-", "o"), "green": ("--", "s"), "orange": (":", "^")}  # line style, marker
_PLAIN = ("-", "o")


class SharpnessFigure:
    """Weights as bars, the blend as a swatch, weights against sharpness, vectors in the plane."""

    def __init__(self, names: Sequence[str], grid: Sequence[float], footer: str = ""):
        self.names = list(names)
        n = len(names)
        self.grid = np.asarray(grid, dtype=float)
        self.ff = ff = FastFigure(8.6, 5.0)
        fig = ff.fig
        fig.subplots_adjust(left=0.08, right=0.98, top=0.93, bottom=0.13, hspace=0.5, wspace=0.3)
        ax_w, ax_sw, ax_curve, ax_vec = fig.subplots(2, 2).flat
        colours = [KEY_COLOURS.get(k, SKY) for k in names]

        ax_w.set_title("Weights: softmax of the scores")
        ax_w.set_ylim(0, 1.15)
        ax_w.set_ylabel("weight")
        ax_w.set_xticks(range(n), names)
        ax_w.set_xlabel("key")
        ax_w.set_xlim(-0.6, n - 0.4)
        self.colours = colours
        self.bars = Bars(ax_w, n, width=0.6, edgecolor="black", lw=0.8)
        self.bar_labels = [quick_text(ax_w, j, 0, ha="center", va="bottom", fontsize=8) for j in range(n)]

        ax_sw.set_title("The blend: weights x values")
        ax_sw.set_xlim(0, 1)
        ax_sw.set_ylim(0, 1)
        ax_sw.axis("off")
        self.segments = [Rectangle((0, 0.72), 0, 0.16, fc=c, ec="black", lw=0.6) for c in colours]
        for seg in self.segments:
            ax_sw.add_patch(seg)
        ax_sw.text(
            0, 0.92, f"shares of the weight ({', '.join(names)}, left to right)", fontsize=8, va="bottom"
        )
        ax_sw.text(0, 0.6, "blended colour (red, green amounts)", fontsize=8, va="bottom")
        self.swatch = Rectangle((0, 0.05), 0.62, 0.52, fc="white", ec="black", lw=1)
        ax_sw.add_patch(self.swatch)
        self.swatch_text = quick_text(ax_sw, 0.66, 0.31, ha="left", va="center", fontsize=10)

        ax_curve.set_title("Each weight as the sharpness grows")
        ax_curve.set_xlim(self.grid[0], self.grid[-1])
        ax_curve.set_ylim(0, 1.02)
        ax_curve.set_xlabel("sharpness")
        ax_curve.set_ylabel("weight")
        self.curves = []
        for name, c in zip(names, colours):
            (line,) = ax_curve.plot([], [], color=c, ls=KEY_STYLES.get(name, _PLAIN)[0], lw=2, label=name)
            self.curves.append(line)
        ax_curve.legend(loc="center right", fontsize=7, frameon=False)
        self.s_line = ax_curve.axvline(1, color="black", lw=0.8)

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
        ax_vec.legend(loc="lower left", fontsize=7, frameon=False, handlelength=2.5)
        _sources_footer(fig, footer)

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
        )

    def update(self, v: compute.ColourView, curves: dict[str, list[float]]) -> None:
        left = 0.0
        self.bars.set([v.weights[name] for name in self.names], self.colours)
        for name, label, seg, line in zip(self.names, self.bar_labels, self.segments, self.curves):
            w = v.weights[name]
            label.set_text(f"{w:.2f}")
            label.set_y(w + 0.02)
            seg.set_x(left)
            seg.set_width(w)
            left += w
            line.set_data(self.grid, curves[name])
        self.swatch.set_facecolor(v.hex)
        r, g, _ = v.rgb
        self.swatch_text.set_text(f"[{r}, {g}]")
        self.s_line.set_xdata([v.sharpness, v.sharpness])
        for name, line in zip(self.names, self.key_lines):
            x, y = v.keys[name][:2]
            line.set_data([0, x], [0, y])
        qx, qy = v.query[:2]
        self.query_line.set_data([0, qx], [0, qy])

    def render(self) -> bytes:
        return self.ff.render()


# ---------------------------------------------------------- stage stepper (07)


class StageFigure:
    """The matrix of the current stage (one background per stage) and the chosen row as bars."""

    def __init__(self, st: compute.Stages, footer: str = ""):
        self.st = st
        self.stages = st.stages()
        T = st.T
        self.ff = ff = FastFigure(8.6, 3.7)
        fig = ff.fig
        fig.subplots_adjust(left=0.1, right=0.985, top=0.87, bottom=0.24, wspace=0.35)
        self.ax_mat, self.ax_row = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.0, 1.25]})
        self.layers = []
        for stage in self.stages:
            M = stage.matrix.numpy()
            finite = np.isfinite(M)
            lo, hi = (M[finite].min(), M[finite].max()) if finite.any() else (0.0, 1.0)
            if stage.key == "A":
                lo, hi = 0.0, 1.0
            norm = Normalize(lo, hi if hi > lo else lo + 1)
            image = self.ax_mat.imshow(
                np.ma.masked_invalid(M), cmap=_cmap_with_bad(), norm=norm, aspect="auto"
            )
            cmap = image.get_cmap()
            texts = []
            dp = 3 if stage.key == "A" else 2
            for i in range(M.shape[0]):
                for j in range(M.shape[1]):
                    colour = _text_colour(cmap(norm(M[i, j]))) if finite[i, j] else "black"
                    texts.append(
                        self.ax_mat.text(
                            j, i, compute.fmt(M[i, j], dp), ha="center", va="center", fontsize=8, color=colour
                        )
                    )
            self.layers.append((image, texts, (lo, hi)))
        self.row_box = Rectangle((-0.5, -0.5), 1, 1, fill=False, ec="black", lw=4)
        self.row_box_inner = Rectangle((-0.5, -0.5), 1, 1, fill=False, ec="white", lw=1.8)
        self.ax_mat.add_patch(self.row_box)
        self.ax_mat.add_patch(self.row_box_inner)
        self.ax_mat.set_yticks(range(T), [st.label(i) for i in range(T)])
        self.ax_mat.set_ylabel("query")
        width = max(T, len(st.value_names))
        self.bars = Bars(self.ax_row, width, width=0.65)
        self.bar_labels = [
            quick_text(self.ax_row, j, 0, ha="center", va="bottom", fontsize=8) for j in range(width)
        ]
        self.ax_row.axhline(0, color="#666666", lw=0.8)
        self.ax_row.text(0.5, 1.03, "row of query", transform=self.ax_row.transAxes, ha="right", va="bottom")
        self.row_title = quick_text(
            self.ax_row, 0.52, 1.03, axes_coords=True, ha="left", va="bottom", fontsize=10, weight="bold"
        )
        _sources_footer(fig, footer)
        ff.animate(self.row_box, self.row_box_inner, self.bars.collection, *self.bar_labels, self.row_title)
        self._shown = None

    def _limits(self, k: int) -> None:
        """Axis limits of stage k: all the animated artists need (the rest is in its background)."""
        stage = self.stages[k]
        ncols = len(stage.columns)
        self.ax_mat.set_xlim(-0.5, ncols - 0.5)
        self.ax_mat.set_ylim(stage.matrix.shape[0] - 0.5, -0.5)
        self.ax_row.set_xlim(-0.6, ncols - 0.4)
        lo, hi = self.layers[k][2]
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        pad = 0.15 * (hi - lo or 1.0)
        self.ax_row.set_ylim(lo - (pad if lo < 0 else 0), hi + pad)
        for j, label in enumerate(self.bar_labels):
            label.set_visible(j < ncols)

    def _show_stage(self, k: int) -> None:
        if self._shown == k:
            return
        self._shown = k
        self._limits(k)
        if self.ff.has(k):
            return
        stage = self.stages[k]
        for n, (image, texts, _) in enumerate(self.layers):
            for a in (image, *texts):
                a.set_visible(n == k)
        cols = stage.columns
        self.ax_mat.set_xticks(range(len(cols)), cols, rotation=30, ha="right", rotation_mode="anchor")
        self.ax_mat.set_xlabel("value dimension" if stage.key == "O" else "key")
        self.ax_mat.set_title(f"{k + 1}. {stage.title}: {stage.formula}", loc="left", fontsize=9.5)
        self.ax_row.set_xticks(range(len(cols)), cols, rotation=30, ha="right", rotation_mode="anchor")
        self.ax_row.set_ylabel({"A": "weight", "O": "output"}.get(stage.key, "score"))
        self.ax_row.set_xlabel("value dimension" if stage.key == "O" else "key")
        self._limits(k)  # set_xticks may have moved them

    def update(self, k: int, i: int) -> None:
        self._show_stage(k)
        stage = self.stages[k]
        row = stage.matrix[i].tolist()
        ncols = len(stage.columns)
        self.row_box.set_bounds(-0.5, i - 0.5, ncols, 1)
        self.row_box_inner.set_bounds(-0.5, i - 0.5, ncols, 1)
        dp = 3 if stage.key == "A" else 2
        best = max(range(ncols), key=lambda j: row[j] if math.isfinite(row[j]) else -math.inf)
        heights = [x if math.isfinite(x) else 0.0 for x in row]
        self.bars.set(
            heights, [VERMILLION if (j == best and stage.key != "O") else BLUE for j in range(ncols)]
        )
        lift = 0.015 * (self.ax_row.get_ylim()[1] - self.ax_row.get_ylim()[0])
        for j, (x, h) in enumerate(zip(row, heights)):
            self.bar_labels[j].set_text(compute.fmt(x, dp))
            self.bar_labels[j].set_y(max(h, 0.0) + lift)
        self.row_title.set_text(self.st.label(i))

    def render(self, k: int) -> bytes:
        return self.ff.render(layout=k)


def _cmap_with_bad():
    import matplotlib

    return matplotlib.colormaps[CMAP].with_extremes(bad=MASKED)


# -------------------------------------------------- all matrices, statically


def matrices_figure(st: compute.Stages, follow: int | None = None) -> Figure:
    """Q, K, V, S (scaled, masked), A and O as annotated heat maps (a complete, static figure)."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(9.6, 5.6), dpi=DPI)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=0.07, right=0.99, top=0.92, bottom=0.1, hspace=0.6, wspace=0.45)
    keys = [st.label(j) for j in range(st.T)]
    dims = [f"d{c}" for c in range(st.d_k)]
    panels = [
        ("Q (queries)", st.Q, dims),
        ("K (keys)", st.K, dims),
        ("V (values)", st.V, list(st.value_names)),
        ("S / sqrt(d_k)" + (", masked" if st.causal else ""), st.masked, keys),
        ("A = softmax(S)", st.A, keys),
        ("O = A V", st.O, list(st.value_names)),
    ]
    for ax, (title, M, cols) in zip(fig.subplots(2, 3).flat, panels):
        M = M.numpy()
        finite = np.isfinite(M)
        lo, hi = (M[finite].min(), M[finite].max()) if finite.any() else (0, 1)
        norm = Normalize(lo, hi if hi > lo else lo + 1)
        image = ax.imshow(np.ma.masked_invalid(M), cmap=_cmap_with_bad(), norm=norm, aspect="auto")
        for i in range(M.shape[0]):
            for j in range(M.shape[1]):
                colour = _text_colour(image.get_cmap()(norm(M[i, j]))) if finite[i, j] else "black"
                ax.text(j, i, compute.fmt(M[i, j], 2), ha="center", va="center", fontsize=7.5, color=colour)
        ax.set_title(title)
        ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right", rotation_mode="anchor")
        ax.set_yticks(range(st.T), keys)
        if follow is not None and title[0] in "QSAO":
            ax.add_patch(Rectangle((-0.5, follow - 0.5), len(cols), 1, fill=False, ec="black", lw=2.5))
    return fig
