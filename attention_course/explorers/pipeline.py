"""Lesson 07's linked pipeline view: the whole head for one query, every cell a button.

X, Q, K and V, then the chosen query's row of raw scores, scaled scores, masked
scores, weights and output, side by side. Clicking a cell (or Tab to it, Enter)
shows its arithmetic and lights up the cells it came from in every earlier stage:
the ones that feed it directly, and the ones that feed those. :func:`explain` and
:func:`sources` are pure (tested without widgets); :class:`PipelineView` wires them.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import ipywidgets as W

from .base import Explorer, _pre
from .choosing import banner_text
from .drawing import MASKED
from .explainer import _ramp, _static_tables
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


# --------------------------------------------------------------------- widgets


class PipelineView(Explorer):
    kind = "pipeline"
    title = "Pipeline view"
    CELL = "54px"

    def __init__(self, example: str = "cat_sat", causal=None, query=None, **functions) -> None:
        super().__init__()
        self.choices = _stage_choices(functions)
        self.st = st = _stages(example, causal, self.choices)
        banner, footer = _sources(st, self.choices)
        self.stage_names = stage_names(st)
        self.query = st.T - 1 if query is None else int(query)
        self.buttons: dict[tuple[str, int, int], W.Button] = {}  # (stage, shown row, column)
        self.cells: dict[Cell, W.Button] = {}  # full-matrix coordinates: what a click means
        self._lit: dict[tuple[str, int, int], str] = {}
        grids = {s: self._grid(s) for s in self.stage_names}
        chooser = W.ToggleButtons(
            options=[(st.label(i), i) for i in range(st.T)],
            value=self.query,
            description="query",
            style={"button_width": "70px"},
        )
        chooser.add_class("ac-query")
        chooser.observe(self._choose_query, names="value")
        self.controls = {"query": chooser, "cells": self.cells}
        self.explanation = W.HTML()
        self.explanation.add_class("ac-explanation")
        legend = W.HTML(
            "<div class='ac-pipeline-legend' style='font-size:12px;margin:2px 0'>"
            f"<span style='border:3px solid {CHOSEN};padding:0 6px;margin-right:12px'>the cell you chose</span>"
            f"<span style='background:{DIRECT};border:2px solid #8a5a00;padding:0 6px;margin-right:12px'>"
            "feeds it directly</span>"
            f"<span style='background:{EARLIER};border:2px dashed #8a5a00;padding:0 6px;margin-right:12px'>"
            "feeds it through earlier steps</span>"
            f"<span style='background:{MASKED};padding:0 6px'>-inf: hidden by the mask</span></div>"
        )
        intro = W.HTML(
            f"<b>{html.escape(st.title)}</b>{' (causal mask)' if st.causal else ''}: the whole head for one "
            "query. Click a cell (or Tab to it and press Enter) to see its arithmetic and the cells it came from."
            + banner
        )
        gap = W.Layout(margin="0 16px 0 0")
        mid = [grids["Q"], grids["K"], grids["V"]]
        right = [grids[s] for s in self.stage_names if s in ROW_STAGES]
        self._root(
            intro,
            chooser,
            legend,
            W.HBox([W.VBox([grids["X"]], layout=gap), W.VBox(mid, layout=gap), W.VBox(right)]),
            self.explanation,
        )
        j = max(range(st.T), key=lambda c: st.A[self.query, c].item())
        self.selected: Cell = ("A", self.query, j)
        self._fill_rows()
        self.refresh()
        self.static_html = _static_tables(st, self.query) + self.explanation.value
        self.text = f"{self.title}: {st.title}\n{footer}\n{banner_text(list(self.choices.values()))}".rstrip()

    def _grid(self, stage: str):
        cols = columns(self.st, stage)
        label_w = "70px"
        header = W.HBox(
            [W.Label("", layout=W.Layout(width=label_w))]
            + [
                W.HTML(
                    f"<div style='font-size:12px;line-height:1.1;text-align:center'>{html.escape(c)}</div>",
                    layout=W.Layout(width=self.CELL, margin="0 1px"),
                )
                for c in cols
            ]
        )
        rows = [W.HTML(f"<b style='font-size:13px'>{html.escape(TITLES[stage])}</b>"), header]
        n_rows = self.st.T if stage in ("X", "K", "V") else 1
        self._row_labels = getattr(self, "_row_labels", {})
        for r in range(n_rows):
            buttons = []
            for c in range(len(cols)):
                b = W.Button(layout=W.Layout(width=self.CELL, height="26px", margin="1px", padding="0"))
                b.add_class("ac-cell")
                b.add_class(f"ac-cell-{stage}-{r}-{c}")
                b.on_click(lambda _b, key=(stage, r, c): self._click(key))
                self.buttons[(stage, r, c)] = b
                buttons.append(b)
            label = W.Label(self.st.label(r) if n_rows > 1 else "", layout=W.Layout(width=label_w))
            self._row_labels[(stage, r)] = label
            rows.append(W.HBox([label] + buttons))
        box = W.VBox(rows, layout=W.Layout(margin="0 0 6px 0"))
        box.add_class(f"ac-grid-{stage}")
        return box

    def _full(self, key: tuple[str, int, int]) -> Cell:
        stage, r, c = key
        return (stage, r, c) if stage in ("X", "K", "V") else (stage, self.query, c)

    def _fill_rows(self) -> None:
        """Values, colours and tooltips of every button for the current query."""
        st = self.st
        self.cells.clear()
        for key, b in self.buttons.items():
            stage, i, j = cell = self._full(key)
            M = matrix(st, stage)
            finite = M[M.isfinite()]
            lo, hi = (finite.min().item(), finite.max().item()) if finite.numel() else (0.0, 1.0)
            if stage == "A":
                lo, hi = 0.0, 1.0
            x = M[i, j].item()
            b.description = fmt(x, 3 if stage == "A" else 2)
            b.style.button_color = (
                MASKED if not math.isfinite(x) else _ramp((x - lo) / (hi - lo) if hi > lo else 0.5)
            )
            b.tooltip = explain(st, cell).text
            self.cells[cell] = b
        for (stage, _r), label in self._row_labels.items():
            if stage not in ("X", "K", "V"):
                label.value = st.label(self.query)
        self._base = {key: b.style.button_color for key, b in self.buttons.items()}
        self._lit = {}

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
        direct, earlier = sources(st, self.selected)
        want: dict[tuple[str, int, int], str] = {}
        for key in self.buttons:
            full = self._full(key)
            if full == self.selected:
                want[key] = "chosen"
            elif full in direct:
                want[key] = "direct"
            elif full in earlier:
                want[key] = "earlier"
        for key in set(self._lit) | set(want):
            old, new = self._lit.get(key), want.get(key)
            if old == new:
                continue
            b = self.buttons[key]
            b.layout.border = {
                "chosen": f"3px solid {CHOSEN}",
                "direct": "2px solid #8a5a00",
                "earlier": "2px dashed #8a5a00",
            }.get(new, "")
            b.style.button_color = {"direct": DIRECT, "earlier": EARLIER}.get(new, self._base[key])
        self._lit = want
        check = ""
        if step.check:
            ok = "matches" in step.check
            check = (
                f"<div class='ac-check' style='font-size:13px;color:{'#006d2c' if ok else '#D55E00'}'>"
                f"{'&#10004;' if ok else '&#10008;'} {html.escape(step.check)}</div>"
            )
        n_direct, n_earlier = len(direct), len(earlier)
        feeds = (
            f"fed directly by {n_direct} cell{'s' if n_direct != 1 else ''}"
            + (f", and through them by {n_earlier} more" if n_earlier else "")
            if n_direct
            else "fed by no earlier cell"
        )
        self.explanation.value = (
            f"<div class='ac-explain' style='font-size:13px'><b>{html.escape(step.title)}</b> ({feeds})"
            + _pre("\n".join(step.lines), "ac-arithmetic")
            + check
            + "</div>"
        )
