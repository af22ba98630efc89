"""The row follower and cell explainer: every cell of Q, K, V, S, A and O is a button.

The widget and the static tables saved with the notebook; the arithmetic of each
cell comes from :mod:`stages` (shared with the pipeline view).
"""

from __future__ import annotations

import html
import math

import ipywidgets as W

from .base import Explorer, _pre
from .drawing import MASKED
from .numeric import fmt
from .stages import (
    MATRICES,
    Explanation,
    Stages,
    _sources,
    _stage_choices,
    _stages,
    explain_cell,
    explain_row,
)

# ---------------------------------------------------------------------- widget

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
        self.explanations: dict[tuple[str, int, int], Explanation] = {}
        self._lit: dict[tuple[str, int, int], str] = {}
        grids = {m: self._grid(m) for m in MATRICES}
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
        self.text = f"{self.title}: {st.title}\n{footer}\n" + "\n".join(explain_row(st, self.follow))

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
                ex = explain_cell(st, m, i, j)
                self.explanations[(m, i, j)] = ex
                colour = MASKED if not math.isfinite(x) else _ramp((x - lo) / (hi - lo) if hi > lo else 0.5)
                b = W.Button(
                    description=fmt(x, 2),
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
                b.layout.border = {
                    "selected": "3px solid #000000",
                    "input": "2px dashed #333333",
                    "follow": "2px solid #0072B2",
                }.get(new)
            b.style.font_weight = "bold" if new else ""
        self._lit = want
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


def _static_tables(st: Stages, follow: int) -> str:
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
                followed = i == follow and m in "QSAO"
                mark = "font-weight:bold;box-shadow:inset 0 0 0 2px #0072B2;" if followed else ""
                cells.append(
                    f"<td style='background:{colour};color:#000;{mark}padding:2px 6px'>{fmt(x, 2)}</td>"
                )
            rows.append(
                f"<tr><th style='text-align:right'>{html.escape(st.label(i))}</th>{''.join(cells)}</tr>"
            )
        out.append(f"<table><caption><b>{m}</b></caption>{''.join(rows)}</table>")
    out.append("</div>")
    return "".join(out)
