"""The head-dimension explorer (lesson 03): d_k slider, 1/sqrt(d_k) toggle, entropy of the weights.

Its computation (a random sample of queries and keys, the weights' entropy for every
d_k), its figure and its widget.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import ipywidgets as W
import numpy as np
import torch
from matplotlib.patches import Rectangle

from .base import Explorer, _classes, _image, _pre, _quick, _readout
from .choosing import Choice, StudentFunctionError, banner_html, banner_text, choose, fallback
from .compare import Difference, compare, differing, is_empty, sum_words
from .drawing import (
    BLUE,
    CMAP,
    FONT,
    FONT_SMALL,
    FONT_TITLE,
    ORANGE,
    VERMILLION,
    Bars,
    DepartsFrames,
    FastFigure,
    _sources_footer,
    quick_text,
)
from .numeric import entropy

# ----------------------------------------------------------------- computation

HEAD_TOKENS = ("a", "small", "cat", "sat", "on", "the", "warm", "mat")
D_K_MAX = 128
SATURATED = 0.2  # nats: below this a row is "near one-hot" (about 1.1 keys share it)
CURVE_D_K = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # log-spaced: the entropy curve's points
HEAD_SEED = 4
HEAD_ROW = 5  # "the": saturates at d_k = 64 unscaled with this seed
PANELS = {"scaled": "spread", "A": "heat"}  # the panel that shows each compared matrix


def draw_head_vectors(seed: int, T: int = len(HEAD_TOKENS), d_max: int = D_K_MAX):
    """Seeded queries and keys with unit-variance components; a d_k view uses the first d_k columns.

    Shapes: -> Q (T, d_max), K (T, d_max).
    """
    g = torch.Generator().manual_seed(int(seed))
    return torch.randn(T, d_max, generator=g), torch.randn(T, d_max, generator=g)


@dataclass(frozen=True)
class HeadView:
    """One setting of the head-dimension explorer, computed.

    Shapes: raw, scaled, weights (T, T); row_weights (T,).
    """

    d_k: int
    scale: bool
    seed: int
    row: int
    tokens: tuple[str, ...]
    raw: torch.Tensor
    scaled: torch.Tensor
    weights: torch.Tensor
    raw_std: float
    scaled_std: float
    row_weights: list[float]
    row_entropy: float
    mean_entropy: float
    differences: tuple[Difference, ...] = ()

    @property
    def shown(self) -> torch.Tensor:
        """The scores that go into softmax: scaled when the toggle is on."""
        return self.scaled if self.scale else self.raw

    @property
    def departs(self) -> str | None:
        """The panel that first departs from the lesson ("spread" or "heat"), None where none does."""
        return PANELS[self.differences[0].stage] if self.differences else None

    @property
    def top(self) -> tuple[str, float]:
        j = max(range(len(self.row_weights)), key=self.row_weights.__getitem__)
        return self.tokens[j], self.row_weights[j]

    @property
    def effective_keys(self) -> float:
        """exp(entropy): how many keys the row spreads over (1 = one-hot, T = uniform)."""
        return math.exp(self.row_entropy)

    @property
    def saturated(self) -> bool:
        return self.row_entropy < SATURATED

    def summary(self) -> str:
        """The readout in words, read from the scores and weights shown, with a hint that invites the next move."""
        name, w = self.top
        T = len(self.tokens)
        row = self.row_weights
        sums_to_1 = math.isclose(sum(row), 1.0, abs_tol=1e-3)
        top = f"top weight {w:.2f} on '{name}'" if not is_empty(row) else "every weight 0"
        lines = [
            f"d_k = {self.d_k}, {'scaled by 1/sqrt(d_k)' if self.scale else 'not scaled'} (seed {self.seed})",
            f"score spread: raw std {self.raw_std:.2f}, scaled std {self.scaled_std:.2f}",
            f"row '{self.tokens[self.row]}': entropy {self.row_entropy:.3f} nats "
            f"(about {self.effective_keys:.1f} of {T} keys; uniform would be {math.log(T):.2f}), {top}"
            + ("" if sums_to_1 else f"; the row {sum_words(row)}"),
        ]
        unchanged = torch.allclose(self.scaled, self.raw, rtol=1e-4, atol=1e-6)
        near_one = 0.5 <= self.scaled_std <= 2.0
        if not sums_to_1:
            lines.append(
                "This row's weights do not sum to 1, so its entropy says little: see the difference below."
            )
        elif self.d_k == 1 and unchanged:
            lines.append("At d_k = 1, sqrt(d_k) = 1: scaling changes nothing. Drag d_k up.")
        elif self.saturated and sums_to_1 and w > 0.9 and not self.scale:
            lines.append(
                "Saturated: one key takes almost all the weight, and softmax's gradient almost vanishes. "
                "Turn on scaling."
            )
        elif self.saturated and sums_to_1 and w > 0.9:
            lines.append(
                "Still peaked even though scaled: this sample has one clear winner. Try another sample."
            )
        elif self.scale and near_one and sums_to_1:
            lines.append("Scaled: the spread stays near 1 whatever d_k is, so the weights stay spread out.")
        elif self.scale:
            shape = "nearly uniform" if self.effective_keys > 0.8 * T else "peaked"
            lines.append(
                f"Scaled: the scaled scores spread {self.scaled_std:.2f}, "
                + ("near 1" if near_one else "far from 1")
                + f", and the weights of this row are {shape}"
                + ("." if near_one else " (dividing by sqrt(d_k) keeps the spread near 1).")
            )
        else:
            lines.append("Not saturated yet: drag d_k up and watch the spread and the entropy.")
        if self.differences:
            lines.append(self.differences[0].line())
        return "\n".join(lines)


def head_view(
    Q_pool: torch.Tensor,
    K_pool: torch.Tensor,
    d_k: int,
    scale: bool,
    row: int = HEAD_ROW,
    seed: int = HEAD_SEED,
    scaled_scores: Callable | None = None,
    softmax: Callable | None = None,
    tokens: Sequence[str] = HEAD_TOKENS,
) -> HeadView:
    """Raw and scaled scores of the first d_k dimensions, the softmax weights and their entropy.

    ``scaled_scores`` and ``softmax`` are the student's (None: worked out here).
    """
    Q, K = Q_pool[:, :d_k], K_pool[:, :d_k]  # (T, d_k)
    raw = (Q @ K.T).double()  # (T, T): q_i . k_j
    if scaled_scores is not None:  # on copies: a function that changes its inputs changes nothing here
        scaled = _as_double(scaled_scores(Q.clone(), K.clone()))  # (T, T): the student's function
    else:
        scaled = raw / math.sqrt(d_k)
    shown = scaled if scale else raw
    if softmax is not None:
        weights = _as_double(softmax(shown.clone(), dim=-1))  # (T, T)
    else:
        weights = torch.softmax(shown, dim=-1)  # no row of this sample is masked
    H = entropy(weights)  # (T,)
    differences = []
    if scaled_scores is not None:
        root = math.sqrt(d_k)
        hints = {
            1 / root: f"as if divided by d_k = {d_k} rather than sqrt({d_k}) = {root:.3g}",
            root: "as if not divided by sqrt(d_k) at all",
            float(d_k): "as if multiplied by sqrt(d_k) rather than divided",
        }
        differences.append(
            compare(
                "scaled",
                f"the scaled scores at d_k = {d_k}, in the lower row of the panel 'Score spread'",
                scaled,
                raw / root,
                "scaled_scores",
                True,
                lambda ix: f"score[{tokens[ix[0]]}, {tokens[ix[1]]}]",
                hints=hints,
            )
        )
    if softmax is not None:
        want = torch.softmax(shown, dim=-1)
        diff = compare(
            "A",
            "the weights, in the panel 'Softmax weights A'",
            weights,
            want,
            "softmax",
            True,
            lambda ix: f"weight[{tokens[ix[0]]}, {tokens[ix[1]]}]",
            what="weight",
        )
        if diff is not None and not differing(weights, torch.softmax(shown, dim=-2)):
            diff = replace(
                diff, words=diff.words + "; these are the weights of softmax down the columns (dim -2)"
            )
        differences.append(diff)
    return HeadView(
        d_k=int(d_k),
        scale=bool(scale),
        seed=int(seed),
        row=int(row),
        tokens=tuple(tokens),
        raw=raw,
        scaled=scaled,
        weights=weights,
        raw_std=raw.std().item(),
        scaled_std=scaled.std().item(),
        row_weights=weights[row].tolist(),
        row_entropy=H[row].item(),
        mean_entropy=H.mean().item(),
        differences=tuple(d for d in differences if d is not None),
    )


def expected_entropy(
    d_values: Sequence[int],
    scaled_scores: Callable | None = None,
    softmax: Callable | None = None,
    T: int = len(HEAD_TOKENS),
    n: int = 128,
    seed: int = 2024,
) -> tuple[list[float], list[float]]:
    """Average row entropy over n random samples, unscaled and scaled, for each d_k.

    Shapes: per d_k, Q and K (n, T, d_k) -> weights (n, T, T) -> entropy (n, T) -> one mean.
    ``scaled_scores`` and ``softmax`` are the student's (None: worked out here).
    """
    g = torch.Generator().manual_seed(seed)
    Qs = torch.randn(n, T, max(d_values), generator=g)
    Ks = torch.randn(n, T, max(d_values), generator=g)
    unscaled, scaled = [], []
    for d in d_values:
        Q, K = Qs[..., :d], Ks[..., :d]
        raw = Q @ K.transpose(-2, -1)  # (n, T, T)
        by_root = scaled_scores(Q.clone(), K.clone()) if scaled_scores is not None else raw / math.sqrt(d)
        for S, into in ((raw, unscaled), (by_root, scaled)):
            W = softmax(S.clone(), dim=-1) if softmax is not None else torch.softmax(S, dim=-1)
            into.append(entropy(_as_double(W)).mean().item())
    return unscaled, scaled


SPREAD_TOLERANCE = 0.15  # relative: 2000 pairs measure a std to 1.6-3.2% (d_k = 1 the worst): over 4 sigma


def spread_numbers(d_k: int, seed: int, n: int = 2000) -> tuple[float, float]:
    """The raw and scaled std of n dot products at this d_k, measured here (the explorer's own reading)."""
    g = torch.Generator().manual_seed(int(seed))
    q, k = torch.randn(n, d_k, generator=g), torch.randn(n, d_k, generator=g)  # (n, d_k)
    raw = (q * k).sum(-1).std().item()
    return raw, raw / math.sqrt(d_k)


def spread_line(d_k: int, seed: int, score_spread: Callable | None = None, n: int = 2000) -> str:
    """One line of the readout: the std of n raw and scaled dot products at this d_k.

    ``score_spread`` is the student's (None: the spread is measured here). The student's
    function gets a fresh generator of its own; the explorer's reading uses another with
    the same seed, so the two see the same random numbers when they draw them alike.
    A difference is pointed out only where the lesson's check would object too: a raw
    std away from sqrt(d_k), or a scaled one away from 1, by more than sampling explains.
    """
    mine = spread_numbers(d_k, seed, n)
    if score_spread is None:
        return f"the built-in score_spread({d_k}, n={n}): raw std {mine[0]:.2f}, scaled std {mine[1]:.2f}"
    raw, scaled = (float(x) for x in score_spread(d_k, n, torch.Generator().manual_seed(int(seed))))
    line = f"your score_spread({d_k}, n={n}): raw std {raw:.2f}, scaled std {scaled:.2f}"
    want = (math.sqrt(d_k), 1.0)
    same_draws = math.isclose(raw, mine[0], rel_tol=1e-5) and math.isclose(scaled, mine[1], rel_tol=1e-5)
    off = [
        name
        for name, got, target in (("raw", raw, want[0]), ("scaled", scaled, want[1]))
        if not (same_draws or abs(got - target) <= SPREAD_TOLERANCE * target)
    ]
    if off:
        line += (
            f"; it differs from what d_k = {d_k} gives: raw std about sqrt({d_k}) = {want[0]:.2f}, "
            f"scaled std about 1 (measured here, same seed: {mine[0]:.2f}, {mine[1]:.2f})"
        )
    return line


def _as_double(t) -> torch.Tensor:
    return torch.as_tensor(t).detach().to("cpu", torch.float64)


# ---------------------------------------------------------------------- figure


SPREAD_NOTE_Y, HEAT_NOTE_Y = -0.3, -0.375  # axes coordinates: under each panel's axis label


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
        self.ff = ff = FastFigure(9.4, 6.2)
        fig = ff.fig
        fig.subplots_adjust(left=0.11, right=0.95, top=0.94, bottom=0.15, hspace=0.7, wspace=0.36)
        ax_spread, ax_heat, ax_bar, ax_curve = fig.subplots(2, 2).flat

        # Score spread: raw on top, scaled below; every one of the T x T scores is a dot.
        ax_spread.set_title(f"Score spread: all {T} x {T} dot products")
        ax_spread.set_xlim(-42, 42)
        ax_spread.set_ylim(-0.6, 1.75)
        ax_spread.set_yticks([1, 0], ["raw\nq . k", "scaled\n/ sqrt(d_k)"])
        ax_spread.set_xlabel("score")
        ax_spread.axvline(0, color="#999999", lw=0.8)
        jitter = (np.arange(T * T) * 0.618034) % 1.0 * 0.5 - 0.25
        self._jitter = jitter
        # Line2D markers: Agg stamps one marker bitmap per point, far cheaper than a scatter collection.
        (self.raw_dots,) = ax_spread.plot([], [], "o", ms=3.5, color=VERMILLION, ls="none")
        (self.scaled_dots,) = ax_spread.plot([], [], "s", ms=3.2, color=BLUE, ls="none")
        (self.std_bars,) = ax_spread.plot([], [], color="black", lw=1.6, marker="|", ms=9)  # -std .. +std
        self.raw_label = quick_text(ax_spread, 41, 1.45, ha="right", va="center")
        self.scaled_label = quick_text(ax_spread, 41, 0.45, ha="right", va="center")
        ax_spread.text(
            -41, 1.6, "\u25b6 goes into softmax", ha="left", va="center", fontsize=FONT_SMALL, color="#222222"
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
        # the followed row: a thick outline in two colours, visible on dark and light cells alike
        self.row_box_outer = Rectangle((-0.5, -0.5), T, 1, fill=False, ec=ORANGE, lw=4)
        self.row_box_inner = Rectangle((-0.5, -0.5), T, 1, fill=False, ec="black", lw=1.5)
        ax_heat.add_patch(self.row_box_outer)
        ax_heat.add_patch(self.row_box_inner)

        # One row's weights (its title changes with the row: drawn like the numbers, no new background).
        ax_bar.set_ylim(0, 1.15)
        ax_bar.set_xticks(range(T), tokens, rotation=45, ha="right", rotation_mode="anchor")
        ax_bar.set_xlabel("key")
        ax_bar.set_ylabel("weight")
        ax_bar.set_xlim(-0.6, T - 0.4)
        self.bars = Bars(ax_bar, T)
        self.top_label = quick_text(ax_bar, 0, 0, ha="center", va="bottom")
        self.bar_title = quick_text(
            ax_bar, 0.5, 1.04, axes_coords=True, ha="center", va="bottom", fontsize=FONT_TITLE
        )
        self.ax_bar = ax_bar
        self.tokens = list(tokens)
        self.bar_title.prepare([self._bar_title(r) for r in range(T)], fig.dpi)
        self.entropy_text = quick_text(
            ax_bar, 0.98, 0.95, axes_coords=True, ha="right", va="top", fontsize=FONT
        )

        # Entropy against d_k: the average over many random rows, and where this sample's row sits.
        ax_curve.set_title("Entropy of a row against d_k")
        ax_curve.set_xscale("log", base=2)
        ax_curve.set_xlim(0.8, max(d_values) * 1.25)  # room for the marker at both ends
        ticks = [d for d in (1, 2, 4, 8, 16, 32, 64, 128) if d <= max(d_values)]
        ax_curve.set_xticks(ticks, [str(d) for d in ticks])
        ax_curve.minorticks_off()
        ax_curve.set_ylim(0, math.log(T) * 1.12)
        ax_curve.set_xlabel("d_k (log scale)")
        ax_curve.set_ylabel("entropy (nats)")
        ax_curve.axhspan(0, SATURATED, color="#e0e0e0", hatch="//", ec="#bbbbbb", lw=0)
        ax_curve.text(0.9, SATURATED / 2, "near one-hot", fontsize=FONT_SMALL, va="center", color="#333333")
        ax_curve.axhline(math.log(T), color="#777777", lw=0.8, ls=":")
        ax_curve.text(0.9, math.log(T), f"uniform: ln {T}", fontsize=FONT_SMALL, va="bottom", color="#333333")
        ax_curve.plot(
            d_values, curve_unscaled, color=VERMILLION, ls="--", lw=1.8, label="not scaled (average)"
        )
        ax_curve.plot(d_values, curve_scaled, color=BLUE, ls="-", lw=1.8, label="scaled (average)")
        self.d_line = ax_curve.axvline(1, color="black", lw=0.8)
        (self.d_point,) = ax_curve.plot(
            [],
            [],
            "o",
            color="black",
            mfc="white",
            mew=1.5,
            ms=7,
            clip_on=False,
            label="this row (one sample)",
        )
        ax_curve.legend(
            loc="lower left",
            frameon=True,
            framealpha=0.85,
            edgecolor="none",
            bbox_to_anchor=(0.0, 0.1),
            handlelength=2.2,
            borderpad=0.2,
            labelspacing=0.25,
        )
        _sources_footer(fig, footer)
        # the panel whose matrix first departs from the lesson: framed, with a note under it
        self.departs = DepartsFrames(
            {
                "spread": (ax_spread, (0.5, SPREAD_NOTE_Y), "top", "\u25b2"),
                "heat": (ax_heat, (0.5, HEAT_NOTE_Y), "top", "\u25b2"),
            }
        )

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
            self.bar_title,
            self.entropy_text,
            self.d_line,
            self.d_point,
            *self.departs.artists,
        )

    def update(self, v: HeadView) -> None:
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
        self.bar_title.set_text(self._bar_title(v.row))
        self.d_line.set_xdata([v.d_k, v.d_k])
        self.d_point.set_data([v.d_k], [v.row_entropy])
        self.departs.show(v.departs)

    def _bar_title(self, row: int) -> str:
        return f"Weights of row '{self.tokens[row]}' (H: entropy, nats)"

    def render(self) -> bytes:
        return self.ff.render()


# ---------------------------------------------------------------------- widget


def _scale_words(on: bool) -> str:
    return f"scaling 1/sqrt(d_k): {'ON' if on else 'OFF'}"


def _show_toggle(toggle) -> None:
    """A toggle's state in words and in colour (green ON, white with an orange edge OFF)."""
    on = bool(toggle.value)
    toggle.description = _scale_words(on)  # setting an unchanged value sends nothing
    toggle.button_style = "success" if on else ""
    toggle.remove_class("ac-off" if on else "ac-on")
    toggle.add_class("ac-on" if on else "ac-off")


class HeadDimensionExplorer(Explorer):
    kind = "head-dimension"
    title = "Head-dimension explorer"

    def __init__(
        self,
        scaled_scores=None,
        softmax=None,
        score_spread=None,
        d_k: int = 64,
        scale: bool = False,
        seed: int = HEAD_SEED,
        row: int = HEAD_ROW,
    ) -> None:
        super().__init__()
        self.choices: list[Choice] = [
            choose("scaled_scores", scaled_scores),
            choose("softmax", softmax, lesson="lesson 05"),
        ]
        if score_spread is not None:
            self.choices.append(choose("score_spread", score_spread))
        self.fns = {c.name: c for c in self.choices}
        self.tokens = HEAD_TOKENS
        self.d_values = list(CURVE_D_K)
        try:  # the curve runs the student's functions on batches (n, T, d_k)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # e.g. `.T` on a batch: not ready for batches yet
                unscaled, scaled = expected_entropy(
                    self.d_values, self.fns["scaled_scores"].fn, self.fns["softmax"].fn
                )
        except Exception:  # then the curve is drawn with the built-ins
            unscaled, scaled = expected_entropy(self.d_values)
        footer = "  |  ".join(f"{c.name}: {c.source}" for c in self.choices)
        self.figure = HeadDimensionFigure(self.tokens, self.d_values, unscaled, scaled, footer)
        self.seed = int(seed)
        self.Q, self.K = draw_head_vectors(self.seed)

        d_slider = W.IntSlider(
            value=d_k,
            min=1,
            max=D_K_MAX,
            step=1,
            description="d_k",
            continuous_update=True,
            layout=W.Layout(width="300px"),
        )
        toggle = W.ToggleButton(
            value=bool(scale),
            description=_scale_words(bool(scale)),
            tooltip="divide the scores by sqrt(d_k) before softmax",
            layout=W.Layout(width="210px"),
        )
        resample = W.Button(
            description="new random vectors",
            tooltip="draw new queries and keys (next seed)",
            layout=W.Layout(width="auto"),
        )
        row_choice = W.Dropdown(
            options=[(t, i) for i, t in enumerate(self.tokens)],
            value=row,
            description="query row",
            style={"description_width": "70px"},
            layout=W.Layout(width="160px"),
        )
        self.controls = {"d_k": d_slider, "scale": toggle, "resample": resample, "row": row_choice}
        _classes(self.controls, "ac-")
        d_slider.observe(self._changed, names="value")
        toggle.observe(self._changed, names="value")
        row_choice.observe(self._changed, names="value")
        resample.on_click(self._resample)
        self.image, self.readout = _image(), _readout()
        self.banner = W.HTML(banner_html(self.choices))
        controls = W.HBox([d_slider, toggle, row_choice, resample], layout=W.Layout(flex_flow="row wrap"))
        self._root(self.banner, controls, self.image, self.readout)
        self.refresh()
        self.static_png = self.image.value
        self.static_html = self.readout.value
        self.text = f"{self.title}\n{banner_text(self.choices)}\n{self.state.summary()}"

    @_quick
    def _resample(self, _button=None) -> None:
        self.seed += 1
        self.Q, self.K = draw_head_vectors(self.seed)
        self.refresh()

    def _swap(self, error: StudentFunctionError) -> None:
        """A function of the student's failed: run the built-in one instead, and say so."""
        self.choices = [fallback(error) if c.name == error.name else c for c in self.choices]
        self.fns = {c.name: c for c in self.choices}
        self.banner.value = banner_html(self.choices)

    @_quick
    def refresh(self) -> None:
        try:
            self._refresh()
        except StudentFunctionError as error:
            self._swap(error)
            self._refresh()

    def _refresh(self) -> None:
        c = self.controls
        _show_toggle(c["scale"])
        v = head_view(
            self.Q,
            self.K,
            c["d_k"].value,
            c["scale"].value,
            row=c["row"].value,
            seed=self.seed,
            scaled_scores=self.fns["scaled_scores"].fn,
            softmax=self.fns["softmax"].fn,
            tokens=self.tokens,
        )
        self.state = v
        self.figure.update(v)
        self.image.value = self.figure.render()
        text = v.summary()
        spread = self.fns.get("score_spread")
        if spread is not None:
            text += "\n" + spread_line(v.d_k, self.seed, spread.fn)
        self.readout.value = _pre(text, "ac-summary")
