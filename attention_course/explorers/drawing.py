"""How the explorers draw: built once, then updated in place and blitted to PNG bytes.

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
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Rectangle

DPI = 80
MIN_TEXT_PX = 11.0  # the smallest text on a projector at 100% zoom, in CSS pixels
FONT_SMALL = 10.0  # points: 10 * 80 / 72 = 11.1 px at DPI 80, the smallest size in any figure
FONT = 10.5  # points: labels
FONT_TITLE = 11.5  # points: titles
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
    "font.size": FONT,
    "axes.titlesize": FONT_TITLE,
    "axes.labelsize": FONT,
    "xtick.labelsize": FONT_SMALL,
    "ytick.labelsize": FONT_SMALL,
    "legend.fontsize": FONT_SMALL,
}


def text_px(points: float, dpi: float = DPI) -> float:
    """The height in pixels of a font of ``points`` in a figure of ``dpi`` shown at its natural size."""
    return points * dpi / 72


def min_text_px(fig: Figure) -> float:
    """The smallest font of any visible text in a figure, in pixels at its natural size."""
    from matplotlib.text import Text

    sizes = [
        t.get_fontsize()
        for t in fig.findobj(lambda a: isinstance(a, Text | QuickText))
        if t.get_visible() and t.get_text().strip()
    ]
    return text_px(min(sizes), fig.dpi) if sizes else math.inf


def texts_outside(fig: Figure) -> list[str]:
    """The visible texts of a figure that reach past its edges (they would be cut off)."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    out = []
    for t in fig.findobj(Text):
        if not (t.get_visible() and t.get_text().strip()) or t.figure is None:
            continue
        ext = t.get_window_extent(renderer)
        if ext.x0 < box.x0 - 0.5 or ext.x1 > box.x1 + 0.5 or ext.y0 < box.y0 - 0.5 or ext.y1 > box.y1 + 0.5:
            out.append(t.get_text())
    return out


# ---------------------------------------------------------------- PNG, quickly


def png_bytes(rgba: np.ndarray) -> bytes:
    """Encode an (H, W, 4) uint8 picture as an RGBA PNG, fast.

    Rows use PNG's "Up" filter (difference with the row above), so the large flat
    areas of a plot become zeros that deflate's quickest setting packs in one pass.
    """
    h, w, _ = rgba.shape
    opaque = bool((rgba[..., 3] == 255).all())  # a plot on a white figure: RGB, a quarter less to pack
    channels = 3 if opaque else 4
    flat = np.ascontiguousarray(rgba[..., :channels]).reshape(h, w * channels)
    rows = np.empty((h, w * channels + 1), np.uint8)
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

    header = struct.pack(
        ">IIBBBBB", w, h, 8, 2 if opaque else 6, 0, 0, 0
    )  # 8 bits, colour type 2 RGB / 6 RGBA
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
        fontsize=FONT_SMALL,
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

    def get_fontsize(self) -> float:
        return self._props.get_size_in_points()

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

    def prepare(self, texts, dpi: float) -> None:
        """Draw the pictures of texts it will show before they are needed (e.g. one title per row)."""
        current = self._text
        for text in texts:
            self._text = str(text)
            self._sprite(dpi)
        self._text = current

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
        fig.text(0.005, 0.005, text, fontsize=FONT_SMALL, color="#333333", ha="left", va="bottom")


def _cmap_with_bad():
    import matplotlib

    return matplotlib.colormaps[CMAP].with_extremes(bad=MASKED)


# the words beside a framed panel, as in the stage stepper
DEPARTS_NOTE = "first differs from the lesson here"


def departs_frame(ax) -> Rectangle:
    """A hidden vermillion frame, 3 px just outside ``ax``: the panel that first differs from the lesson."""
    frame = Rectangle(
        (-0.012, -0.012), 1.024, 1.024, transform=ax.transAxes, fill=False, ec=VERMILLION, lw=3, clip_on=False
    )
    frame.set_visible(False)
    ax.add_patch(frame)
    return frame


class DepartsFrames:
    """A vermillion frame and a note for each panel that can depart from the lesson; at most one is shown.

    ``panels`` maps a key to (axes, (x, y) of the note in the axes' coordinates, the note's
    vertical alignment, an arrow pointing from the note to the panel). The frame is drawn as
    the stage stepper draws its own: 3 px of vermillion just outside the axes. Every artist
    starts hidden; add :attr:`artists` to the figure's animated ones.
    """

    def __init__(self, panels: dict):
        self.frames, self.notes = {}, {}
        for key, (ax, (x, y), va, arrow) in panels.items():
            frame = departs_frame(ax)
            note = quick_text(
                ax, x, y, axes_coords=True, ha="center", va=va, fontsize=FONT, weight="bold", color=VERMILLION
            )
            note.set_text(f"{arrow} {DEPARTS_NOTE}".strip())
            note.set_visible(False)
            self.frames[key], self.notes[key] = frame, note
        self.shown = None

    @property
    def artists(self) -> list:
        return [*self.frames.values(), *self.notes.values()]

    def show(self, key) -> None:
        """Frame the panel ``key`` (None: frame nothing)."""
        self.shown = key if key in self.frames else None
        for k in self.frames:
            self.frames[k].set_visible(k == self.shown)
            self.notes[k].set_visible(k == self.shown)
