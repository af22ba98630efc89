"""The row follower and cell explainer: every cell of Q, K, V, S, A and O is a button.

The widget and the static tables saved with the notebook; the arithmetic of each
cell comes from :mod:`stages` (shared with the pipeline view).
"""

from __future__ import annotations

import html
import math

import ipywidgets as W
import torch

from .base import Explorer, _pre, text_height
from .choosing import banner_text
from .drawing import MASKED
from .numeric import fmt
from .stages import (
    MATRICES,
    Explanation,
    Stages,
    _sources,
    _stage_choices,
    _stages,
    difference_html,
    explain_cell,
    explain_row,
)

# ---------------------------------------------------------------------- widget

_LIGHT, _DARK = (0xF7, 0xFB, 0xFF), (0x6B, 0xAE, 0xD6)  # a light blue ramp: black text stays readable


def _ramp(t: float) -> str:
    t = min(1.0, max(0.0, t))
    return "#" + "".join(f"{round(a + (b - a) * t):02x}" for a, b in zip(_LIGHT, _DARK))


def colour_range(values, weights: bool = False) -> tuple[float, float]:
    """The values a matrix's colour ramp spans: its finite ones (weights: always 0 to 1)."""
    if weights:
        return 0.0, 1.0
    finite = [x for x in torch.as_tensor(values, dtype=torch.float64).flatten().tolist() if math.isfinite(x)]
    return (min(finite), max(finite)) if finite else (0.0, 1.0)


def cell_colour(x: float, lo: float, hi: float) -> str:
    """A cell's background: grey where masked (not finite), else its place on the ramp from lo to hi."""
    return MASKED if not math.isfinite(x) else _ramp((x - lo) / (hi - lo) if hi > lo else 0.5)


def cell_class(key: tuple[str, int, int]) -> str:
    """The CSS class of a grid's button (matrix or stage, row, column): its handle for styling and tests."""
    return "ac-cell-{}-{}-{}".format(*key)


class ButtonGrid:
    """The matrix cells of an explorer: buttons that share one Layout and one ButtonStyle.

    Each button's colour and outline are rules in two hidden <style> widgets scoped to the
    explorer (``ac-id-<uid>``), not traits of the button: a grid costs one message per button
    (not three), and lighting any number of cells costs one. A front end that falls behind
    (a loaded laptop) can lose messages beyond ZeroMQ's high-water mark of 1,000: an explorer
    that sent a thousand at once could then show nothing.
    """

    def __init__(self, uid: str, cell_width: str) -> None:
        self.scope = f".ac-id-{uid}"
        self.layout = W.Layout(width=cell_width, height="22px", margin="1px", padding="0")
        self.style = W.ButtonStyle()
        self._shared: dict[tuple, W.Layout] = {}
        self._text_style = None  # one style for every HTML of the grid (ipywidgets 8 makes one per HTML)
        self.colour_css, self.lit_css = self.html("", display="none"), self.html("", display="none")
        self.widgets = [self.colour_css, self.lit_css]
        self._names: dict[int, str] = {}  # id(button) -> its class
        self.colours: dict[str, str] = {}
        self.lit: dict[str, tuple[str, str]] = {}

    def lay(self, **kw) -> W.Layout:
        """One Layout for every widget of the grid laid out alike (never changed after)."""
        key = tuple(sorted(kw.items()))
        if key not in self._shared:
            self._shared[key] = W.Layout(**kw)
        return self._shared[key]

    def html(self, value: str, **layout) -> W.HTML:
        """An HTML widget laid out as ``layout`` (a shared Layout), sharing its style with the grid's others."""
        extra = {} if self._text_style is None else {"style": self._text_style}
        widget = W.HTML(value, layout=self.lay(**layout), **extra)
        self._text_style = widget.style
        return widget

    def button(self, name: str, description: str = "", tooltip: str = "") -> W.Button:
        b = W.Button(
            description=description,
            tooltip=tooltip,
            layout=self.layout,
            style=self.style,
            _dom_classes=("ac-cell", name),  # sent with the button, not after it
        )
        self._names[id(b)] = name
        return b

    def paint(self, colours: dict[str, str]) -> None:
        """Every button's background (its class -> colour), in one message."""
        if colours != self.colours:
            self.colours = dict(colours)
            rules = "".join(f"{self.scope} .{n}{{background:{c} !important}}" for n, c in colours.items())
            self.colour_css.value = f"<style>{rules}</style>"

    def light(self, lit: dict[str, tuple[str, str]]) -> None:
        """Outline these buttons (class -> (border, more CSS)) and no other, in one message."""
        if lit != self.lit:
            self.lit = dict(lit)
            rules = "".join(
                f"{self.scope} .ac-cell.{n}{{border:{border} !important;{more}}}"
                for n, (border, more) in lit.items()
            )
            self.lit_css.value = f"<style>{rules}</style>"

    def border(self, button: W.Button) -> str:
        """The outline a button shows ('' for none)."""
        return self.lit.get(self._names[id(button)], ("", ""))[0]

    def row_label(self, text: str, width: str):
        """A grid row's token, as tall as the row's buttons (a plain Label would take a control's 28 px)."""
        text = f"<div style='font-size:13px;line-height:24px;white-space:nowrap'>{html.escape(text)}</div>"
        return self.html(text, width=width, margin="0")

    def row(self, children) -> W.HBox:
        return W.HBox(children, layout=self.lay())

    def header(self, cols: list[str], label_w: str, cell_w: str) -> W.HTML:
        """Column names, bottom-aligned in a row two lines tall: grids side by side keep their rows level."""
        names = "".join(
            f"<div style='width:{cell_w};margin:0 1px;flex:none;font-size:12px;line-height:1.1;text-align:center'>"
            f"{html.escape(c)}</div>"
            for c in cols
        )
        width = int(label_w.removesuffix("px")) + len(cols) * (int(cell_w.removesuffix("px")) + 2)
        return self.html(
            f"<div style='display:flex;align-items:flex-end;height:28px'><div style='width:{label_w};flex:none'>"
            f"</div>{names}</div>",
            width=f"{width}px",
            margin="0",
        )


DEPARTS = "#D55E00"  # the frame of the matrix where the head first departs from the lesson (vermillion)
SHOWN_IN = {"allowed": "S", "masked": "S", "scaled": "S"}  # the explainer's S is the scaled, masked scores


class CellExplainer(Explorer):
    kind = "cell-explainer"
    title = "Row follower and cell explainer"
    CELL = "46px"
    LABEL = "58px"

    def __init__(self, example: str = "cat_sat", causal=None, follow=None, **functions) -> None:
        super().__init__()
        self.choices = _stage_choices(functions)
        self.st = st = _stages(example, causal, self.choices)
        title = f"<b>{html.escape(st.title)}</b>{' (causal mask)' if st.causal else ''}"
        banner, footer = _sources(st, self.choices, lead=title)
        T = st.T
        self.follow = T - 1 if follow is None else int(follow)
        diff = st.first_difference
        self.departs = None if diff is None else SHOWN_IN.get(diff.stage, diff.stage)
        self.grid = ButtonGrid(self.uid, self.CELL)
        self._colours: dict[str, str] = {}  # each button's background, sent as one <style>
        self.cells: dict[tuple[str, int, int], W.Button] = {}
        self.explanations: dict[tuple[str, int, int], Explanation] = {}
        chooser = W.ToggleButtons(
            options=[(st.label(i), i) for i in range(T)],
            value=self.follow,
            description="follow",
            style={"button_width": "70px", "description_width": "46px"},
            layout=W.Layout(width="auto"),
        )
        chooser.observe(self._follow, names="value")
        self.controls = {"follow": chooser, "cells": self.cells}
        chooser.add_class("ac-follow")
        self.explanation = W.HTML()
        self.explanation.add_class("ac-explanation")
        self.row_story = W.HTML(layout=W.Layout(flex="1 1 0", min_width="240px", margin="0"))
        self.row_story.add_class("ac-row-story")
        intro = W.HTML(banner)  # the example, and whose function made each step
        hint = W.HTML(
            "<div style='font-size:13px;margin-left:10px'>click a cell (or Tab, Enter) for its arithmetic</div>"
        )
        gap = W.Layout(margin="0 12px 4px 0")
        first = {"Q", "S"}  # the grids that carry the row labels (the others sit beside them, row for row)
        grids = {m: self._grid(m, labels=m in first, layout=gap) for m in MATRICES}
        self.grid.paint(self._colours)
        self._root(
            intro,
            W.HBox([chooser, hint], layout=W.Layout(flex_flow="row wrap", align_items="center")),
            W.HBox([grids["Q"], grids["K"], grids["V"], self.row_story]),
            W.HBox([grids["S"], grids["A"], grids["O"]]),
            self.explanation,
            *self.grid.widgets,
        )
        # room for the longest arithmetic of any cell: a click never moves what is below or above it
        self.explanation.layout.min_height = text_height([e.text for e in self.explanations.values()])
        j = max(range(T), key=lambda c: st.A[self.follow, c].item())
        self.selected = ("A", self.follow, j)
        self.refresh()
        self.static_html = (
            _static_tables(st, self.follow)
            + difference_html(st)
            + self.row_story.value
            + self.explanation.value
        )
        notes = [banner_text(self.failed_functions())]
        notes.append(st.first_difference.line() if st.first_difference is not None else "")
        self.text = f"{self.title}: {st.title}\n{footer}\n" + "".join(f"{n}\n" for n in notes if n)
        self.text += "\n".join(explain_row(st, self.follow))

    def _matrix(self, m: str):
        st = self.st
        return {"Q": st.Q, "K": st.K, "V": st.V, "S": st.masked, "A": st.A, "O": st.O}[m]

    def _grid(self, m: str, labels: bool, layout: W.Layout):
        st = self.st
        M = self._matrix(m)
        lo, hi = colour_range(M, weights=m == "A")
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
        label_w = self.LABEL if labels else "0px"
        width = int(label_w[:-2]) + len(cols) * (int(self.CELL[:-2]) + 2)
        title = html.escape(titles[m])
        if m == self.departs:
            title += (
                f"<br><span class='ac-departs-note' style='color:{DEPARTS}'>&#9888; first differs from the "
                "lesson here</span>"
            )
        header = self.grid.header(cols, label_w, self.CELL)
        rows = [
            self.grid.html(
                f"<div style='font-size:13px;font-weight:bold;line-height:1.25'>{title}</div>",
                width=f"{width}px",
                margin="0",
            ),
            header,
        ]
        for i in range(M.shape[0]):
            buttons = []
            for j in range(M.shape[1]):
                x = M[i, j].item()
                ex = explain_cell(st, m, i, j)
                self.explanations[(m, i, j)] = ex
                name = cell_class((m, i, j))
                self._colours[name] = cell_colour(x, lo, hi)
                b = self.grid.button(name, fmt(x, 2), ex.text)
                b.on_click(lambda _b, key=(m, i, j): self.select(*key))
                self.cells[(m, i, j)] = b
                buttons.append(b)
            label = [self.grid.row_label(st.label(i), label_w)] if labels else []
            rows.append(self.grid.row(label + buttons))
        box = W.VBox(rows, layout=W.Layout(margin=layout.margin))
        box.add_class(f"ac-grid-{m}")
        if m == self.departs:
            box.add_class("ac-departs")
            box.layout.border = f"3px solid {DEPARTS}"
            box.layout.padding = "2px"
        return box

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
        outlines = {
            "selected": "3px solid #000000",
            "input": "2px dashed #333333",
            "follow": "2px solid #0072B2",
        }
        self.grid.light({cell_class(key): (outlines[v], "font-weight:bold") for key, v in want.items()})
        story = "\n".join(explain_row(self.st, self.follow))
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


_TH = "font-size:12px;padding:1px 6px;font-weight:normal;color:#222;text-align:center"


def numbered(st: Stages, i: int) -> str:
    """A token with its position, counted from 0 as in the lessons: "The(0)", "cat(1)"."""
    return f"{st.tokens[i]}({i})"


def table_html(
    caption: str,
    rows: list[str],
    cols: list[str],
    values,
    cls: str,
    ranges: list[tuple[float, float]] | None = None,
    mark_row: int | None = None,
    notes: list[str] = (),
) -> str:
    """One matrix as an HTML table: its name above it, a header cell for every column and for every row.

    ``values``: a (rows, cols) tensor or list of rows; ``ranges``: the colour scale of each row (one
    scale for the whole table where not given); ``mark_row``: a row outlined (the one followed).
    """
    values = values.tolist() if hasattr(values, "tolist") else [list(r) for r in values]
    if ranges is None:
        ranges = [colour_range(values)] * len(values)
    head = f"<tr><th style='{_TH}'></th>" + "".join(
        f"<th scope='col' style='{_TH}'>{html.escape(c)}</th>" for c in cols
    )
    body = []
    for r, (name, row, (lo, hi)) in enumerate(zip(rows, values, ranges)):
        mark = "font-weight:bold;box-shadow:inset 0 0 0 2px #0072B2;" if r == mark_row else ""
        tds = "".join(
            f"<td style='background:{cell_colour(x, lo, hi)};"
            f"color:#000;{mark}padding:2px 6px;text-align:right'>{fmt(x, 2)}</td>"
            for x in row
        )
        body.append(f"<tr><th scope='row' style='{_TH};text-align:right'>{html.escape(name)}</th>{tds}</tr>")
    listed = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (
        f"<div class='ac-static-{cls}'><div style='font-size:13px;font-weight:bold'>{html.escape(caption)}</div>"
        f"<table><thead>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        + (f"<ul style='font-size:12px;margin:2px 0;padding-left:18px'>{listed}</ul>" if listed else "")
        + "</div>"
    )


def _static_tables(st: Stages, follow: int) -> str:
    """Every matrix as an HTML table (what the explainer shows without a widget front end), rows and columns named."""
    tokens = [numbered(st, i) for i in range(st.T)]
    dims = [f"d{c}" for c in range(st.d_k)]
    values = list(st.value_names)
    S = (
        "scaled, masked scores: S / sqrt(d_k), -inf where the mask hides the key"
        if st.causal
        else ("scaled scores: S / sqrt(d_k) (no mask)")
    )
    tables = [
        ("X", "X: the inputs (rows: tokens, columns: features)", st.X, list(st.features), None),
        ("Q", "Q = X W_q: the queries", st.Q, dims, follow),
        ("K", "K = X W_k: the keys", st.K, dims, None),
        ("V", "V = X W_v: the values", st.V, values, None),
        ("S", f"{S} (rows: queries, columns: keys)", st.masked, tokens, follow),
        ("A", "A = softmax of each row: the weights (rows: queries, columns: keys)", st.A, tokens, follow),
        ("O", "O = A V: the outputs", st.O, values, follow),
    ]
    return (
        "<div style='display:flex;flex-wrap:wrap;gap:8px 18px;align-items:flex-start'>"
        + "".join(table_html(cap, tokens, cols, M, m, mark_row=mark) for m, cap, M, cols, mark in tables)
        + "</div>"
    )
