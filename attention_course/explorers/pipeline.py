"""Lesson 07's linked pipeline view: the whole head for one query, every cell a button.

X, K and V, then the chosen query's Q, its row of raw scores, scaled scores, masked
scores and weights (one line each) and its output. Clicking a cell (or Tab to it,
Enter) shows its arithmetic and lights up the cells that feed it directly; "earlier
sources" lights the ones that feed those too. It starts on a query the mask hides keys
from, and frames the stage where the head first departs from the lesson. :func:`explain`
and :func:`sources` are pure (tested without widgets); :class:`PipelineView` wires them.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import ipywidgets as W

from .base import Explorer, _pre, text_height
from .choosing import banner_text
from .drawing import MASKED
from .explainer import ButtonGrid, cell_class, cell_colour, colour_range, numbered, table_html
from .numeric import fmt, fmt_list
from .stages import (
    Stages,
    _softmax_steps,
    _sources,
    _stage_choices,
    _stages,
    _terms,
    check_line,
    explain_cell,
    mask_line,
)

Cell = tuple[str, int, int]  # (stage, row, column) in the full matrix of that stage

ROW_STAGES = ("S", "scaled", "masked", "A", "O")
TITLES = {
    "X": "X: the inputs",
    "Q": "Q = X W_q (this query's row)",
    "K": "K = X W_k: keys",
    "V": "V = X W_v: values",
    "S": "raw scores q . k",
    "scaled": "scaled: / sqrt(d_k)",
    "masked": "masked: -inf after the query",
    "A": "weights: softmax",
    "O": "output: A V",
}
DIRECT, EARLIER, CHOSEN = "#E69F00", "#F8DDA8", "#000000"


def stage_names(st: Stages) -> tuple[str, ...]:
    """The stages shown, in order (no "masked" stage without a mask)."""
    return ("X", "Q", "K", "V", "S", "scaled") + (("masked",) if st.causal else ()) + ("A", "O")


def matrix(st: Stages, stage: str):
    """The full matrix of one stage (float64): X, Q, K, V (T, .), S, scaled, masked, A (T, T), O (T, d_v)."""
    return {
        "X": st.X,
        "Q": st.Q,
        "K": st.K,
        "V": st.V,
        "S": st.S,
        "scaled": st.scaled,
        "masked": st.masked,
        "A": st.A,
        "O": st.O,
    }[stage]


def columns(st: Stages, stage: str) -> list[str]:
    keys = [st.label(j) for j in range(st.T)]
    return {
        "X": list(st.features),
        "Q": [f"d{c}" for c in range(st.d_k)],
        "K": [f"d{c}" for c in range(st.d_k)],
        "V": list(st.value_names),
        "O": list(st.value_names),
    }.get(stage, keys)


def _seen(st: Stages, i: int) -> list[int]:
    """The keys query i's weights come from: those not masked to -inf."""
    row = (st.masked if st.causal else st.scaled)[i].tolist()
    return [j for j, x in enumerate(row) if not (math.isinf(x) and x < 0)]


def inputs(st: Stages, cell: Cell) -> list[Cell]:
    """The cells that feed ``cell`` directly (a masked key's exp(-inf) = 0 feeds nothing)."""
    stage, i, j = cell
    if stage == "X":
        return []
    if stage in ("Q", "K", "V"):
        return [("X", i, f) for f in range(st.X.shape[-1])]
    if stage == "S":
        return [("Q", i, c) for c in range(st.d_k)] + [("K", j, c) for c in range(st.d_k)]
    if stage == "scaled":
        return [("S", i, j)]
    if stage == "masked":
        return [] if not bool(st.allowed[i, j]) else [("scaled", i, j)]
    before = "masked" if st.causal else "scaled"
    if stage == "A":
        return [(before, i, c) for c in _seen(st, i)]
    # O
    seen = _seen(st, i)
    return [("A", i, c) for c in seen] + [("V", r, j) for r in seen]


def sources(st: Stages, cell: Cell) -> tuple[set[Cell], set[Cell]]:
    """(direct, earlier): the cells feeding ``cell`` directly, and those feeding it through them."""
    direct = set(inputs(st, cell))
    earlier: set[Cell] = set()
    todo = list(direct)
    while todo:
        for c in inputs(st, todo.pop()):
            if c not in earlier and c not in direct:
                earlier.add(c)
                todo.append(c)
    return direct, earlier


@dataclass(frozen=True)
class Step:
    """The arithmetic of one cell, line by line, and the number it gives."""

    cell: Cell
    title: str
    lines: tuple[str, ...]
    value: float
    check: str = ""

    @property
    def text(self) -> str:
        return "\n".join((self.title, *self.lines, *((self.check,) if self.check else ())))


def explain(st: Stages, cell: Cell) -> Step:
    """The exact arithmetic behind one cell of the pipeline, worked out from the cells that feed it."""
    stage, i, j = cell
    name = st.label(i)
    if stage == "X":
        title = f"X[{name}, {st.features[j]}]: feature '{st.features[j]}' of the input row of '{name}'"
        value = st.X[i, j].item()
        return Step(cell, title, (f"given: the example's input, {fmt(value)}",), value)
    if stage in ("Q", "K", "V"):
        ex = explain_cell(st, stage, i, j)
        return Step(cell, ex.title, ex.lines, ex.value, ex.check)
    key = st.label(j) if stage != "O" else ""
    if stage in ("S", "scaled", "masked"):
        q, k = st.Q[i].tolist(), st.K[j].tolist()
        raw = sum(a * b for a, b in zip(q, k))
        root = math.sqrt(st.d_k)
        lines = [
            f"q_{name} = {fmt_list(q)},  k_{key} = {fmt_list(k)}",
            f"S[{name}, {key}] = q_{name} . k_{key} = {_terms(q, k)} = {fmt(raw)}",
        ]
        value = raw
        if stage in ("scaled", "masked"):
            value = raw / root
            lines.append(f"scaled = {fmt(raw)} / sqrt({st.d_k}) = {fmt(raw)} / {root:.3f} = {fmt(value)}")
        if stage == "masked":
            line, value = mask_line(st, i, j, value)
            if math.isinf(value):
                lines = [f"{line}, whatever it was"]
            else:
                lines.append(line)
        title = {
            "S": f"S[{name}, {key}]: raw score of query '{name}' against key '{key}'",
            "scaled": f"scaled[{name}, {key}]: the raw score divided by sqrt(d_k)",
            "masked": f"masked[{name}, {key}]: the scaled score after the causal mask",
        }[stage]
        got = matrix(st, stage)[i, j].item()
        return Step(cell, title, tuple(lines), value, _check(st, stage, got, value))
    if stage == "A":
        row = (st.masked if st.causal else st.scaled)[i].tolist()
        shifted, top, exps, total, weights = _softmax_steps(row)
        where = "masked scores" if st.causal else "scaled scores"
        lines = [
            f"row '{name}' of the {where}: {fmt_list(row)}",
            f"minus the row max {fmt(top)}: {fmt_list(shifted)}"
            if total > 0
            else "every score is -inf: no row max",
            f"exp(x - max): {fmt_list(exps, 3)}",
            f"row sum: {' + '.join(fmt(e, 3) for e in exps)} = {fmt(total, 3)}",
            f"A[{name}, {key}] = {fmt(exps[j], 3)} / {fmt(total, 3)} = {fmt(weights[j], 3)}"
            if total > 0
            else f"every key is masked: the whole row is 0, never NaN, so A[{name}, {key}] = 0 and the output is 0",
        ]
        if math.isinf(row[j]) and total > 0:
            lines.append(f"'{key}' is masked: exp(-inf) = 0, no attention at all")
        title = f"A[{name}, {key}]: the share of its attention '{name}' gives to '{key}'"
        return Step(cell, title, tuple(lines), weights[j], _check(st, "A", st.A[i, j].item(), weights[j], 3))
    col = st.value_names[j]
    seen = _seen(st, i)
    a = [st.A[i, r].item() for r in seen]
    v = [st.V[r, j].item() for r in seen]
    value = sum(x * y for x, y in zip(a, v))
    keys = ", ".join(st.label(r) for r in seen)
    if seen:
        lines = (
            f"O[{name}, {col}] = sum over the keys '{name}' sees ({keys}) of A[{name}, key] * V[key, {col}]",
            f"  = {_terms(a, v, 3)}",
            f"  = {fmt(value)}",
        )
    else:
        lines = (f"'{name}' may look at no key: its weights are all 0, so O[{name}, {col}] = 0",)
    title = f"O[{name}, {col}]: the value column '{col}' averaged with row '{name}' of A"
    return Step(cell, title, lines, value, _check(st, "O", st.O[i, j].item(), value))


def _check(st: Stages, stage: str, got: float, want: float, dp: int = 2) -> str:
    return check_line(st, stage, got, want, dp)


def default_query(st: Stages) -> int:
    """The query the view starts on: one whose row the mask hides keys from (the last query where none does).

    Among the rows with hidden keys, the one with as many keys seen as hidden (the later one on a tie):
    its first picture shows -inf beside real scores, so the mask is seen to act.
    """
    hidden = {i: st.T - len(_seen(st, i)) for i in range(st.T)}
    rows = [i for i, n in hidden.items() if n]
    if not st.causal or not rows:
        return st.T - 1
    return max(rows, key=lambda i: (min(hidden[i], st.T - hidden[i]), i))


def departs(st: Stages) -> str | None:
    """The stage of the pipeline where the head first departs from the lesson's arithmetic (None if nowhere)."""
    diff = st.first_difference
    if diff is None:
        return None
    return {"allowed": "masked"}.get(diff.stage, diff.stage)


# --------------------------------------------------------------------- widgets

HEADS = {  # the grids' titles on screen (TITLES says the same at length, in the saved copy)
    "X": "X: the inputs",
    "K": "K = X W_k: keys",
    "V": "V = X W_v: values",
    "Q": "Q = X W_q",
    "O": "O = A V",
    "table": "this query: scores to weights",
}
SHORT = {  # the row labels of the query's table (TITLES says the same at length, in their tooltips)
    "S": "raw q . k",
    "scaled": "/ sqrt(d_k)",
    "masked": "masked",
    "A": "softmax: A",
}
DEPARTS = "#D55E00"  # the frame of the stage that first departs from the lesson (Okabe-Ito vermillion)


def _earlier_words(on: bool) -> str:
    return f"earlier sources: {'SHOWN' if on else 'HIDDEN'}"


class PipelineView(Explorer):
    kind = "pipeline"
    title = "Pipeline view"
    CELL = "48px"
    LABEL = "58px"

    def __init__(self, example: str = "cat_sat", causal=None, query=None, **functions) -> None:
        super().__init__()
        self.choices = _stage_choices(functions)
        self.st = st = _stages(example, causal, self.choices)
        title = f"<b>{html.escape(st.title)}</b>{' (causal mask)' if st.causal else ''}: one query, X to O"
        banner, footer = _sources(st, self.choices, lead=title)
        self.stage_names = stage_names(st)
        self.departs = departs(st)
        self.query = default_query(st) if query is None else int(query)
        self.grid = ButtonGrid(self.uid, self.CELL)
        self._ranges = {
            stage: colour_range(matrix(st, stage), weights=stage == "A") for stage in self.stage_names
        }
        self.buttons: dict[tuple[str, int, int], W.Button] = {}  # (stage, shown row, column)
        self.cells: dict[Cell, W.Button] = {}  # full-matrix coordinates: what a click means
        self._lit: dict[tuple[str, int, int], str] = {}
        self._titles: dict[str, W.HTML] = {}
        self._tooltips: dict[Cell, str] = {}
        chooser = W.ToggleButtons(
            options=[(st.label(i), i) for i in range(st.T)],
            value=self.query,
            description="query",
            style={"button_width": "70px", "description_width": "46px"},
            layout=W.Layout(width="auto"),
        )
        chooser.add_class("ac-query")
        chooser.observe(self._choose_query, names="value")
        earlier = W.ToggleButton(
            value=False,
            description=_earlier_words(False),
            tooltip="also light the cells that feed the chosen one through earlier steps (dashed)",
            layout=W.Layout(width="210px"),
        )
        earlier.add_class("ac-earlier")
        earlier.observe(self._changed, names="value")
        self.controls = {"query": chooser, "earlier": earlier, "cells": self.cells}
        self.explanation = W.HTML()
        self.explanation.add_class("ac-explanation")
        intro = W.HTML(banner)  # the example, and whose function made each step
        legend = W.HTML(
            "<div class='ac-pipeline-legend' style='font-size:12px;margin:2px 0'>Click a cell (or Tab, Enter) "
            "for its arithmetic: "
            f"<span style='border:3px solid {CHOSEN};padding:0 5px;margin-right:10px'>chosen</span>"
            f"<span style='background:{DIRECT};border:2px solid #8a5a00;padding:0 5px;margin-right:10px'>"
            "feeds it directly</span>"
            f"<span style='background:{EARLIER};border:2px dashed #8a5a00;padding:0 5px;margin-right:10px'>"
            "feeds it earlier</span>"
            f"<span style='background:{MASKED};padding:0 5px'>-inf: masked</span></div>"
        )
        gap = W.Layout(margin="0 14px 4px 0")
        inputs = W.HBox([self._grid(s, gap) for s in ("X", "K", "V")])
        query_row = W.HBox([self._grid("Q", gap), self._table(gap), self._grid("O", gap)])
        self._root(
            intro,
            W.HBox([chooser, earlier], layout=W.Layout(flex_flow="row wrap", align_items="center")),
            legend,
            inputs,
            query_row,
            self.explanation,
            *self.grid.widgets,
        )
        # room for the longest arithmetic of any cell, for every query: a click never moves the grids
        every = [
            (s, i, j)
            for (s, r, j) in self.buttons
            for i in (range(st.T) if s not in ("X", "K", "V") else [r])
        ]
        self.explanation.layout.min_height = text_height([self._tooltip(cell) for cell in every])
        j = max(range(st.T), key=lambda c: st.A[self.query, c].item())
        self.selected: Cell = ("A", self.query, j)
        self._fill_rows()
        self.refresh()
        self.static_html = _static_pipeline(st, self.query) + self.explanation.value
        self.text = f"{self.title}: {st.title}\n{footer}\n{banner_text(list(self.choices.values()))}".rstrip()

    # ------------------------------------------------------------------ layout

    def _button(self, stage: str, r: int, c: int) -> W.Button:
        cell = self._full((stage, r, c))
        b = self.grid.button(cell_class((stage, r, c)), self._face(cell)[0], self._tooltip(cell))
        b.on_click(lambda _b, key=(stage, r, c): self._click(key))
        self.buttons[(stage, r, c)] = b
        return b

    def _face(self, cell: Cell) -> tuple[str, str]:
        """A cell's label and background colour."""
        stage, i, j = cell
        x = matrix(self.st, stage)[i, j].item()
        return fmt(x, 3 if stage == "A" else 2), cell_colour(x, *self._ranges[stage])

    def _width(self, label_w: str, n: int) -> int:
        """The width in pixels of a grid: its row labels and n cells (each with a 1 px margin either side)."""
        return int(label_w.removesuffix("px")) + n * (int(self.CELL.removesuffix("px")) + 2)

    def _title(self, stage: str, width: int) -> W.HTML:
        """A grid's title, as wide as its grid; the stage where the head first departs from the lesson says so."""
        text = html.escape(HEADS[stage])
        if stage == self.departs or (stage == "table" and self.departs in SHORT):
            where = f": {SHORT[self.departs]}" if stage == "table" else " here"
            text = (
                f"{text}<br><span class='ac-departs-note' style='color:{DEPARTS}'>&#9888; first differs from the "
                f"lesson{html.escape(where)}</span>"
            )
        title = self.grid.html(
            f"<div style='font-size:13px;font-weight:bold;line-height:1.25'>{text}</div>",
            width=f"{width}px",
            margin="0",
        )
        self._titles[stage] = title
        return title

    def _frame(self, box, stage: str) -> None:
        """Box a stage's grid; the first one that departs from the lesson gets a vermillion frame."""
        box.add_class(f"ac-grid-{stage}")
        if stage == self.departs:
            box.add_class("ac-departs")
            box.layout.border = f"3px solid {DEPARTS}"
            box.layout.padding = "2px"

    def _grid(self, stage: str, layout: W.Layout):
        """X, K, V (every token a row, its label on the left) or Q and O (the query's row alone)."""
        cols = columns(self.st, stage)
        full = stage in ("X", "K", "V")
        label_w = self.LABEL if full else "0px"
        rows = [
            self._title(stage, self._width(label_w, len(cols))),
            self.grid.header(cols, label_w, self.CELL),
        ]
        for r in range(self.st.T if full else 1):
            label = [self.grid.row_label(self.st.label(r), label_w)] if full else []
            buttons = [self._button(stage, r, c) for c in range(len(cols))]
            rows.append(self.grid.row(label + buttons))
        box = W.VBox(rows, layout=W.Layout(margin=layout.margin))
        self._frame(box, stage)
        return box

    def _table(self, layout: W.Layout):
        """The query's row of scores, scaled scores, masked scores and weights: one stage a line, keys across."""
        st = self.st
        stages = [s for s in self.stage_names if s in SHORT]
        label_w = "96px"
        rows = [
            self._title("table", self._width(label_w, st.T)),
            self.grid.header(columns(st, "S"), label_w, self.CELL),
        ]
        for stage in stages:
            label = self.grid.html(
                f"<div title='{html.escape(TITLES[stage], quote=True)}' style='font-size:12px;line-height:24px'>"
                f"{html.escape(SHORT[stage])}</div>",
                width=label_w,
                margin="0",
            )
            departs = stage == self.departs
            rows.append(
                W.HBox(
                    [label] + [self._button(stage, 0, c) for c in range(st.T)],
                    layout=W.Layout(border=f"3px solid {DEPARTS}") if departs else self.grid.lay(),
                    _dom_classes=(f"ac-grid-{stage}",) + (("ac-departs",) if departs else ()),
                )
            )
        box = W.VBox(rows, layout=W.Layout(margin=layout.margin))
        box.add_class("ac-grid-row-stages")
        return box

    # ---------------------------------------------------------------- behaviour

    def _full(self, key: tuple[str, int, int]) -> Cell:
        stage, r, c = key
        return (stage, r, c) if stage in ("X", "K", "V") else (stage, self.query, c)

    def _fill_rows(self) -> None:
        """Labels, colours and tooltips of every button for the current query (unchanged ones send nothing)."""
        self.cells.clear()
        colours = {}
        for key, b in self.buttons.items():
            cell = self._full(key)
            description, colours[cell_class(key)] = self._face(cell)
            with b.hold_sync():  # description and tooltip in one message
                b.description = description
                b.tooltip = self._tooltip(cell)
            self.cells[cell] = b
        self.grid.paint(colours)
        self._lit = {}

    def _tooltip(self, cell: Cell) -> str:
        """A cell's arithmetic in words, worked out once per cell (a query seen again costs nothing)."""
        if cell not in self._tooltips:
            self._tooltips[cell] = explain(self.st, cell).text
        return self._tooltips[cell]

    def _choose_query(self, change) -> None:
        self.query = change["new"]
        stage, _, j = self.selected
        self.selected = (stage, self.query, j) if stage not in ("X", "K", "V") else self.selected
        self._fill_rows()
        self.refresh()

    def _click(self, key: tuple[str, int, int]) -> None:
        self.select(*self._full(key))

    def select(self, stage: str, i: int, j: int) -> None:
        """Explain one cell (what a click does); a row stage's cell must be in the chosen query's row."""
        if stage not in ("X", "K", "V") and i != self.query:
            self.controls["query"].value = i
        self.selected = (stage, i, j)
        self.refresh()

    @property
    def lit(self) -> dict[Cell, str]:
        """Every highlighted cell, in full-matrix coordinates: "chosen", "direct" or "earlier"."""
        return {self._full(k): v for k, v in self._lit.items()}

    def refresh(self) -> None:
        st = self.st
        step = explain(st, self.selected)
        self.state = step
        toggle = self.controls["earlier"]
        show_earlier = bool(toggle.value)
        toggle.description = _earlier_words(show_earlier)
        toggle.remove_class("ac-off" if show_earlier else "ac-on")
        toggle.add_class("ac-on" if show_earlier else "ac-off")
        direct, earlier = sources(st, self.selected)
        want: dict[tuple[str, int, int], str] = {}
        for key in self.buttons:
            full = self._full(key)
            if full == self.selected:
                want[key] = "chosen"
            elif full in direct:
                want[key] = "direct"
            elif show_earlier and full in earlier:
                want[key] = "earlier"
        borders = {
            "chosen": f"3px solid {CHOSEN}",
            "direct": "2px solid #8a5a00",
            "earlier": "2px dashed #8a5a00",
        }
        fills = {"direct": f"background:{DIRECT} !important", "earlier": f"background:{EARLIER} !important"}
        self.grid.light({cell_class(key): (borders[v], fills.get(v, "")) for key, v in want.items()})
        self._lit = want
        check = ""
        if step.check:
            ok = "matches" in step.check
            check = (
                f"<div class='ac-check' style='font-size:13px;color:{'#006d2c' if ok else '#D55E00'}'>"
                f"{'&#10004;' if ok else '&#10008;'} {html.escape(step.check)}</div>"
            )
        n_direct, n_earlier = len(direct), len(earlier)
        if not n_direct:
            feeds = "fed by no earlier cell"
        else:
            feeds = f"fed directly by {n_direct} cell{'s' if n_direct != 1 else ''}"
            if n_earlier:
                feeds += f"; {n_earlier} earlier cells feed those" + ("" if show_earlier else ", not lit")
        self.explanation.value = (
            f"<div class='ac-explain' style='font-size:13px'><b>{html.escape(step.title)}</b> ({feeds})"
            + _pre("\n".join(step.lines), "ac-arithmetic")
            + check
            + "</div>"
        )


# ---------------------------------------------------------------- static copy


def _static_pipeline(st: Stages, query: int) -> str:
    """The starting picture as HTML tables (what shows without a widget front end), every row and column named."""
    tokens = [numbered(st, i) for i in range(st.T)]
    dims = [f"d{c}" for c in range(st.d_k)]
    me = numbered(st, query)  # captions and notes are escaped by table_html
    row_stages = [s for s in stage_names(st) if s in SHORT]
    labels = {"S": "raw S", "scaled": "scaled", "masked": "masked", "A": "weights A"}
    words = {
        "S": f"the raw scores q . k (row {me} of Q K^T)",
        "scaled": f"raw S / sqrt(d_k) = raw S / sqrt({st.d_k})",
        "masked": "the scaled scores, -inf where the mask hides the key",
        "A": f"softmax of the {'masked' if st.causal else 'scaled'} scores (the row sums to 1)",
    }

    def row_range(stage: str) -> tuple[float, float]:
        return colour_range(matrix(st, stage)[query], weights=stage == "A")

    tables = [
        table_html("X: the inputs (rows: tokens, columns: features)", tokens, list(st.features), st.X, "X"),
        table_html("K = X W_k: the keys", tokens, dims, st.K, "K"),
        table_html("V = X W_v: the values", tokens, list(st.value_names), st.V, "V"),
        table_html(f"Q = X W_q: the query of {me}", [me], dims, st.Q[query : query + 1], "Q"),
        table_html(
            f"Query {me}, stage by stage (columns: keys)",
            [labels[s] for s in row_stages],
            tokens,
            [matrix(st, s)[query].tolist() for s in row_stages],  # each stage: the query's row only
            "row-stages",
            ranges=[row_range(s) for s in row_stages],
            notes=[f"{labels[s]}: {words[s]}" for s in row_stages],
        ),
        table_html(f"O = A V: the output of {me}", [me], list(st.value_names), st.O[query : query + 1], "O"),
    ]
    return (
        "<div class='ac-static-pipeline' style='display:flex;flex-wrap:wrap;gap:8px 18px;align-items:flex-start'>"
        + "".join(tables)
        + "</div>"
    )
