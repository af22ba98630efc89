"""The ipywidgets wiring of the explorers (runs on ipywidgets 7 and 8).

Each explorer is an object that displays as live widgets where a widget front end
exists, and as a static picture of its default setting where none does (the display
bundle carries both; the front end picks what it can show). Controls call
``refresh``, which recomputes with the pure functions of :mod:`compute`, updates the
figure in place and swaps the PNG bytes of one ``Image`` widget.
"""

from __future__ import annotations

import base64
import functools
import html
import math
import warnings
from contextlib import contextmanager

import ipywidgets as W

from . import compute, figures
from .backend import Choice, StudentFunctionError, banner_html, banner_text, choose, fallback, one_thread

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def _quick(method):
    """Run an update of tiny tensors without PyTorch's thread pool (see ``one_thread``)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with one_thread():
            return method(self, *args, **kwargs)

    return wrapper


def _view_json(widget) -> dict:
    """What a front end needs to show a widget: protocol 2.0, the same on ipywidgets 7 and 8."""
    return {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}


def _pre(text: str, cls: str = "") -> str:
    return (
        f"<pre class='{cls}' style='margin:2px 0;padding:6px 8px;background:#f6f6f6;border-left:3px solid #0072B2;"
        "white-space:pre-wrap;font-size:12px;line-height:1.35'>" + html.escape(text, quote=False) + "</pre>"
    )


class Explorer:
    """What an explorer function returns. Display it (last line of a cell) to use it.

    Attributes: ``widget`` (the root widget), ``controls`` (name -> widget, for
    driving it from code), ``state`` (the last computed view).
    """

    kind = "explorer"
    title = "Explorer"

    def __init__(self) -> None:
        self.widget = None
        self.controls: dict[str, object] = {}
        self.state = None
        self.static_png: bytes = b""
        self.static_html: str = ""
        self.text: str = self.title
        self._hold = 0

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        bundle = {"text/plain": self.text}
        if self.static_png:
            bundle["image/png"] = base64.b64encode(self.static_png).decode("ascii")
        if self.static_html or self.static_png:
            img = (
                f"<img alt='{html.escape(self.title)}' src='data:image/png;base64,{bundle['image/png']}'/>"
                if self.static_png
                else ""
            )
            bundle["text/html"] = (
                f"<div class='ac-static'><p><b>{html.escape(self.title)}</b> "
                "(a static picture of its default setting: the sliders need a widget front end)</p>"
                f"{img}{self.static_html}</div>"
            )
        if self.widget is not None:
            bundle[WIDGET_MIME] = _view_json(self.widget)
        return bundle

    def __repr__(self) -> str:
        return self.text

    @contextmanager
    def batch(self):
        """Change several controls with a single refresh at the end."""
        self._hold += 1
        try:
            yield self
        finally:
            self._hold -= 1
            if not self._hold:
                self.refresh()

    def _changed(self, change=None) -> None:
        if not self._hold:
            self.refresh()

    def refresh(self) -> None:  # pragma: no cover - every explorer overrides it
        raise NotImplementedError

    def _root(self, *children):
        root = W.VBox(list(children))
        root.add_class("ac-explorer")
        root.add_class(f"ac-{self.kind}")
        self.widget = root
        return root


class Skipped(Explorer):
    """Stands in for an explorer while a notebook is being graded: computes and draws nothing."""

    def __init__(self, title: str) -> None:
        super().__init__()
        self.title = title
        self.text = f"{title}: not shown while the notebook is being graded."


def _classes(controls: dict, prefix: str) -> None:
    """CSS classes named after the controls (``ac-d_k``, ...): handles for tests and styling."""
    for name, widget in controls.items():
        widget.add_class(prefix + name)


def _image():
    image = W.Image(format="png", layout=W.Layout(max_width="100%", height="auto"))
    image.add_class("ac-figure")
    return image


def _readout():
    readout = W.HTML()
    readout.add_class("ac-readout")
    return readout


# ------------------------------------------------------------ head dimension


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
        seed: int = compute.HEAD_SEED,
        row: int = compute.HEAD_ROW,
    ) -> None:
        super().__init__()
        self.choices: list[Choice] = [
            choose("scaled_scores", scaled_scores),
            choose("softmax", softmax, lesson="lesson 05"),
        ]
        if score_spread is not None:
            self.choices.append(choose("score_spread", score_spread))
        self.fns = {c.name: c for c in self.choices}
        self.tokens = compute.HEAD_TOKENS
        self.d_values = list(compute.CURVE_D_K)
        try:  # the curve runs the student's functions on batches (n, T, d_k)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # e.g. `.T` on a batch: not ready for batches yet
                unscaled, scaled = compute.expected_entropy(
                    self.d_values, self.fns["scaled_scores"].fn, self.fns["softmax"].fn
                )
        except Exception:  # then the curve is drawn with the built-ins
            unscaled, scaled = compute.expected_entropy(self.d_values)
        footer = "  |  ".join(f"{c.name}: {c.source}" for c in self.choices)
        self.figure = figures.HeadDimensionFigure(self.tokens, self.d_values, unscaled, scaled, footer)
        self.seed = int(seed)
        self.Q, self.K = compute.draw_head_vectors(self.seed)

        d_slider = W.IntSlider(
            value=d_k,
            min=1,
            max=compute.D_K_MAX,
            step=1,
            description="d_k",
            continuous_update=True,
            layout=W.Layout(width="430px"),
        )
        toggle = W.ToggleButton(
            value=bool(scale), description="scale by 1/sqrt(d_k)", layout=W.Layout(width="190px")
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
            layout=W.Layout(width="190px"),
        )
        self.controls = {"d_k": d_slider, "scale": toggle, "resample": resample, "row": row_choice}
        _classes(self.controls, "ac-")
        d_slider.observe(self._changed, names="value")
        toggle.observe(self._changed, names="value")
        row_choice.observe(self._changed, names="value")
        resample.on_click(self._resample)
        self.image, self.readout = _image(), _readout()
        self.banner = W.HTML(banner_html(self.choices))
        self._root(
            self.banner, W.HBox([d_slider, toggle]), W.HBox([row_choice, resample]), self.image, self.readout
        )
        self.refresh()
        self.static_png = self.image.value
        self.static_html = self.readout.value
        self.text = f"{self.title}\n{banner_text(self.choices)}\n{self.state.summary()}"

    @_quick
    def _resample(self, _button=None) -> None:
        self.seed += 1
        self.Q, self.K = compute.draw_head_vectors(self.seed)
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
        v = compute.head_view(
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
            text += "\n" + compute.spread_line(v.d_k, self.seed, spread.fn)
        self.readout.value = _pre(text, "ac-summary")


# ----------------------------------------------------------------- sharpness

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
        self.figure = figures.SharpnessFigure(self.names, self.grid, f"soft_lookup: {self.choice.source}")
        self._curve_key = None
        self._curves = None
        q = list(query) if query is not None else d.query
        sharp = W.FloatSlider(
            value=sharpness,
            min=0.0,
            max=30.0,
            step=0.5,
            description="sharpness",
            continuous_update=True,
            readout_format=".1f",
            layout=W.Layout(width="430px"),
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
        editors = W.HBox([W.VBox([qx, qy]), W.VBox(key_rows)])
        self._root(banner, sharp, editors, follow_ups, self.image, self.readout)
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
        v = compute.colour_view(query, keys, values, c["sharpness"].value, fn)
        key = (tuple(query), tuple(tuple(k) for k in keys.values()))
        if key != self._curve_key:
            self._curves = compute.colour_curves(query, keys, values, self.grid, fn)
            self._curve_key = key
        self.state = v
        self.figure.update(v, self._curves)
        self.image.value = self.figure.render()
        self.readout.value = (
            f"<div style='display:flex;gap:10px;align-items:center'><div class='ac-swatch' title='{v.hex}' "
            f"style='width:42px;height:42px;border:1px solid #000;background:{v.hex}'></div>"
            f"<div style='flex:1'>{_pre(v.summary(), 'ac-summary')}</div></div>"
        )


# ------------------------------------------------------------- stage stepper


LESSON_OF = {
    "project": "lesson 01",
    "scores": "lesson 02",
    "scaled_scores": "lesson 03",
    "causal_mask": "lesson 04",
    "apply_mask": "lesson 04",
    "softmax": "lesson 05",
    "mix": "lesson 06",
    "attention": "lesson 07",
}


def _stage_choices(funcs: dict) -> dict[str, Choice]:
    return {name: choose(name, fn) for name, fn in funcs.items() if fn is not None}


def _stages(example: str, causal, choices: dict[str, Choice]) -> compute.Stages:
    """The stages, with the built-in version standing in for any of the student's functions that fails."""
    while True:
        try:
            return compute.example_stages(example, causal, choices)
        except StudentFunctionError as error:
            choices[error.name] = fallback(error)


def _sources(st: compute.Stages, choices: dict[str, Choice]) -> tuple[str, str]:
    """Banner HTML and figure footer: whose function made each step (built-ins named, with their lesson)."""
    steps = ["scaled_scores"]
    if not ("attention" in choices and choices["attention"].yours):
        steps += (["causal_mask", "apply_mask"] if st.causal else []) + ["softmax", "mix"]
    builtin = [n for n in steps if n not in choices]
    html_out = banner_html(list(choices.values())) if choices else ""
    if builtin:
        names = ", ".join(f"<code>{n}</code> ({LESSON_OF[n]})" for n in builtin)
        html_out += (
            f"<div class='ac-source ac-source-builtin' style='font-size:0.9em'><b>[built-in]</b> {names}: "
            "the course's versions, until you write yours</div>"
        )
    footer = "  |  ".join(
        [f"{c.name}: {c.source}" for c in choices.values()] + [f"{n}: built-in" for n in builtin]
    )
    return html_out, footer


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
        self.figure = figures.StageFigure(self.st, footer)
        T = self.st.T
        q = T - 1 if query is None else int(query)
        step = W.IntSlider(
            value=stage,
            min=1,
            max=len(self.stages),
            step=1,
            description="stage",
            layout=W.Layout(width="300px"),
        )
        self.stage_name = W.HTML()
        chooser = W.ToggleButtons(
            options=[(self.st.label(i), i) for i in range(T)],
            value=q,
            description="query",
            style={"button_width": "70px"},
        )
        self.controls = {"stage": step, "query": chooser}
        _classes(self.controls, "ac-")
        self.stage_name.add_class("ac-stage-name")
        step.observe(self._changed, names="value")
        chooser.observe(self._changed, names="value")
        self.image, self.readout = _image(), _readout()
        steps = " -> ".join(f"{n + 1} {s.title}" for n, s in enumerate(self.stages))
        intro = W.HTML(f"<b>{html.escape(self.st.title)}</b>: {html.escape(steps)}" + banner)
        self._root(intro, W.HBox([step, self.stage_name]), chooser, self.image, self.readout)
        self.refresh()
        self.static_png = self.image.value
        self.static_html = self.readout.value
        self.text = f"{self.title}: {self.st.title}\n{steps}\n{footer}"

    @_quick
    def refresh(self) -> None:
        k = self.controls["stage"].value - 1
        i = self.controls["query"].value
        stage = self.stages[k]
        self.state = (stage.key, i)
        self.figure.update(k, i)
        self.image.value = self.figure.render(k)
        self.stage_name.value = f"<b>{k + 1}. {html.escape(stage.title)}</b>: {html.escape(stage.formula)}"
        self.readout.value = _pre("\n".join(compute.stage_row_lines(self.st, stage, i)), "ac-summary")


# ------------------------------------------------- row follower, cell explainer

_LIGHT, _DARK = (0xF7, 0xFB, 0xFF), (0x6B, 0xAE, 0xD6)  # a light blue ramp: black text stays readable


def _ramp(t: float) -> str:
    t = min(1.0, max(0.0, t))
    return "#" + "".join(f"{round(a + (b - a) * t):02x}" for a, b in zip(_LIGHT, _DARK))


class CellExplainer(Explorer):
    kind = "cell-explainer"
    title = "Row follower and cell explainer"
    CELL = "52px"

    def __init__(self, example: str = "cat_sat", causal=None, follow=None, **functions) -> None:
        super().__init__()
        self.choices = _stage_choices(functions)
        self.st = st = _stages(example, causal, self.choices)
        banner, footer = _sources(st, self.choices)
        T = st.T
        self.follow = T - 1 if follow is None else int(follow)
        self.cells: dict[tuple[str, int, int], W.Button] = {}
        self.explanations: dict[tuple[str, int, int], compute.Explanation] = {}
        self._lit: dict[tuple[str, int, int], str] = {}
        grids = {m: self._grid(m) for m in compute.MATRICES}
        chooser = W.ToggleButtons(
            options=[(st.label(i), i) for i in range(T)],
            value=self.follow,
            description="follow",
            style={"button_width": "70px"},
        )
        chooser.observe(self._follow, names="value")
        self.controls = {"follow": chooser, "cells": self.cells}
        chooser.add_class("ac-follow")
        self.explanation = W.HTML()
        self.explanation.add_class("ac-explanation")
        self.row_story = W.HTML()
        self.row_story.add_class("ac-row-story")
        intro = W.HTML(
            f"<b>{html.escape(st.title)}</b>{' (causal mask)' if st.causal else ''}: choose a token to follow its "
            "row; point at any cell for its arithmetic, click it (or Tab to it and press Enter) to keep it below."
            + banner
        )
        gap = W.Layout(margin="0 14px 6px 0")
        self._root(
            intro,
            chooser,
            W.HBox([W.VBox([grids["Q"]], layout=gap), W.VBox([grids["K"]], layout=gap), grids["V"]]),
            W.HBox([W.VBox([grids["S"]], layout=gap), W.VBox([grids["A"]], layout=gap), grids["O"]]),
            self.row_story,
            self.explanation,
        )
        j = max(range(T), key=lambda c: st.A[self.follow, c].item())
        self.selected = ("A", self.follow, j)
        self.refresh()
        self.static_html = _static_tables(st, self.follow) + self.row_story.value + self.explanation.value
        self.text = f"{self.title}: {st.title}\n{footer}\n" + "\n".join(compute.explain_row(st, self.follow))

    def _matrix(self, m: str):
        st = self.st
        return {"Q": st.Q, "K": st.K, "V": st.V, "S": st.masked, "A": st.A, "O": st.O}[m]

    def _grid(self, m: str):
        st = self.st
        M = self._matrix(m)
        finite = M[M.isfinite()]
        lo, hi = (finite.min().item(), finite.max().item()) if finite.numel() else (0.0, 1.0)
        if m == "A":
            lo, hi = 0.0, 1.0
        cols = {
            "Q": [f"d{c}" for c in range(st.d_k)],
            "K": [f"d{c}" for c in range(st.d_k)],
            "V": list(st.value_names),
            "S": [st.label(j) for j in range(st.T)],
            "A": [st.label(j) for j in range(st.T)],
            "O": list(st.value_names),
        }[m]
        titles = {
            "Q": "Q: queries",
            "K": "K: keys",
            "V": "V: values",
            "S": "S: scores / sqrt(d_k)" + (", masked" if st.causal else ""),
            "A": "A: weights",
            "O": "O: outputs",
        }
        label_w = "62px"
        header = W.HBox(
            [W.Label("", layout=W.Layout(width=label_w))]
            + [
                W.HTML(
                    f"<div style='font-size:11px;line-height:1.1;text-align:center'>{html.escape(c)}</div>",
                    layout=W.Layout(width=self.CELL, margin="0 1px"),
                )
                for c in cols
            ]
        )
        rows = [W.HTML(f"<b>{html.escape(titles[m])}</b>"), header]
        for i in range(M.shape[0]):
            buttons = []
            for j in range(M.shape[1]):
                x = M[i, j].item()
                ex = compute.explain_cell(st, m, i, j)
                self.explanations[(m, i, j)] = ex
                colour = MASKED if not math.isfinite(x) else _ramp((x - lo) / (hi - lo) if hi > lo else 0.5)
                b = W.Button(
                    description=compute.fmt(x, 2),
                    tooltip=ex.text,
                    layout=W.Layout(width=self.CELL, height="26px", margin="1px", padding="0"),
                    style={"button_color": colour},
                )
                b.add_class("ac-cell")
                b.add_class(f"ac-cell-{m}-{i}-{j}")
                b.on_click(lambda _b, key=(m, i, j): self.select(*key))
                self.cells[(m, i, j)] = b
                buttons.append(b)
            rows.append(W.HBox([W.Label(st.label(i), layout=W.Layout(width=label_w))] + buttons))
        return W.VBox(rows)

    def _follow(self, change) -> None:
        self.follow = change["new"]
        self.refresh()

    def select(self, matrix: str, i: int, j: int) -> None:
        """Explain one cell (what a click does)."""
        self.selected = (matrix, i, j)
        self.refresh()

    def refresh(self) -> None:
        ex = self.explanations[self.selected]
        self.state = ex
        want: dict[tuple[str, int, int], str] = {}
        for m in ("Q", "S", "A", "O"):
            ncols = self._matrix(m).shape[1]
            for c in range(ncols):
                want[(m, self.follow, c)] = "follow"
        for key in ex.inputs:
            want[key] = "input"
        want[self.selected] = "selected"
        for key in set(self._lit) | set(want):
            old, new = self._lit.get(key), want.get(key)
            if old == new:
                continue
            b = self.cells[key]
            with b.layout.hold_sync():
                b.layout.border = {"selected": "3px solid #000000", "input": "2px dashed #333333"}.get(new)
            b.style.font_weight = "bold" if new else ""
        self._lit = want
        story = "\n".join(compute.explain_row(self.st, self.follow))
        self.row_story.value = _pre(story, "ac-story")
        check = ""
        if ex.check:
            ok = "matches" in ex.check
            check = (
                f"<div class='ac-check' style='color:{'#006d2c' if ok else '#D55E00'}'>"
                f"{'&#10004;' if ok else '&#10008;'} {html.escape(ex.check)}</div>"
            )
        self.explanation.value = (
            f"<div class='ac-explain'><b>{html.escape(ex.title)}</b>"
            + _pre("\n".join(ex.lines), "ac-arithmetic")
            + check
            + "</div>"
        )


MASKED = figures.MASKED


def _static_tables(st: compute.Stages, follow: int) -> str:
    """Every matrix as an HTML table (what the explainer shows without a widget front end)."""
    out = ["<div style='display:flex;flex-wrap:wrap;gap:14px'>"]
    for m, M in (("Q", st.Q), ("K", st.K), ("V", st.V), ("S", st.masked), ("A", st.A), ("O", st.O)):
        finite = M[M.isfinite()]
        lo, hi = (finite.min().item(), finite.max().item()) if finite.numel() else (0.0, 1.0)
        rows = []
        for i in range(M.shape[0]):
            cells = []
            for j in range(M.shape[1]):
                x = M[i, j].item()
                colour = MASKED if not math.isfinite(x) else _ramp((x - lo) / (hi - lo) if hi > lo else 0.5)
                weight = "bold" if (i == follow and m in "QSAO") else "normal"
                cells.append(
                    f"<td style='background:{colour};color:#000;font-weight:{weight};padding:2px 6px'>"
                    f"{compute.fmt(x, 2)}</td>"
                )
            rows.append(
                f"<tr><th style='text-align:right'>{html.escape(st.label(i))}</th>{''.join(cells)}</tr>"
            )
        out.append(f"<table><caption><b>{m}</b></caption>{''.join(rows)}</table>")
    out.append("</div>")
    return "".join(out)
