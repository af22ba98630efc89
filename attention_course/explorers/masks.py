"""Lesson 04's mask explorer: the causal mask, a padded batch and the scores each mask hides.

The picture is HTML (tables with a legend), so it stays sharp at any zoom and every
label is real text. :func:`mask_view` computes one setting (pure, testable); the
:class:`MaskExplorer` wires sliders to it: the readout beside the causal mask, each
sequence's length slider right above that sequence, all on one projector screen. Where the student's ``causal_mask``,
``padding_mask`` or ``apply_mask`` runs, the view shows what it returns; otherwise
the view works that step out inline and says so.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import ipywidgets as W
import torch

from .base import Explorer, _pre
from .choosing import Choice, StudentFunctionError, banner_html, banner_text, choose, fallback, one_thread
from .compare import Difference, cell_words, compare, mask_pattern
from .numeric import fmt

SENTENCE = "cat_sat"  # "The cat sat on the": sequence b is its first lengths[b] tokens, then padding
PAD = "<pad>"
T_MAX = 5
MAX_SEQUENCES = 4

# Cell colours (Okabe-Ito based, readable with colour-blindness), one per reason a score is hidden.
ALLOWED_BG = "#cfe8f7"
CAUSAL_BG = "repeating-linear-gradient(45deg,#f3c27a 0 4px,#fbe3bf 4px 8px)"
PADDING_BG = "repeating-linear-gradient(-45deg,#c99bbb 0 4px,#efdcea 4px 8px)"
BOTH_BG = "repeating-linear-gradient(45deg,#b0b0b0 0 4px,#e4e4e4 4px 8px)"
WRONG = "#D55E00"


def _keys_phrase(keys: Sequence[int]) -> str:
    keys = list(keys)
    if not keys:
        return "no keys"
    if len(keys) == 1:
        return f"key {keys[0]}"
    return "keys " + ", ".join(str(k) for k in keys[:-1]) + f" and {keys[-1]}"


@dataclass(frozen=True)
class MaskView:
    """One setting of the mask explorer, computed.

    Shapes: causal (T, T); padding (B, 1, T); combined, scores, masked and weights (B, T, T).
    """

    T: int
    lengths: tuple[int, ...]
    sentence: tuple[str, ...]
    causal: torch.Tensor
    padding: torch.Tensor
    combined: torch.Tensor
    scores: torch.Tensor
    masked: torch.Tensor
    weights: torch.Tensor
    choices: dict[str, Choice] = field(default_factory=dict)

    @property
    def B(self) -> int:
        return len(self.lengths)

    def tokens(self, b: int) -> list[str]:
        """Sequence b's tokens: its real ones, then padding."""
        L = self.lengths[b]
        return list(self.sentence[: min(L, self.T)]) + [PAD] * (self.T - min(L, self.T))

    def hidden_by(self, b: int, i: int, j: int) -> str:
        """Why score (i, j) of sequence b is hidden: "", "causal", "padding" or "both" (by the masks shown)."""
        causal = not bool(self.causal[i, j])
        padding = not bool(self.padding[b, 0, j])
        return "both" if causal and padding else "causal" if causal else "padding" if padding else ""

    def hidden(self, b: int) -> list[tuple[int, int]]:
        """Cells (query, key) of sequence b that the combined mask hides."""
        return [(i, j) for i in range(self.T) for j in range(self.T) if not bool(self.combined[b, i, j])]

    def name(self, b: int, i: int, j: int) -> str:
        """A cell in words: "sequence 2, query 4 'the', key 1 'cat'" (positions count from 0)."""
        toks = self.tokens(b)
        return f"sequence {b + 1}, query {i} '{toks[i]}', key {j} '{toks[j]}'"

    def differences(self) -> list[Difference]:
        """Each mask or score matrix shown that departs from the lesson's arithmetic, in the order they are made."""
        T = self.T
        lengths = torch.tensor(self.lengths)
        want_padding = (torch.arange(T)[None, :] < lengths[:, None])[:, None, :]  # (B, 1, T)
        steps = (
            ("causal", "the causal mask", self.causal, torch.ones(T, T).tril().bool(), "causal_mask"),
            ("padding", "the padding mask", self.padding, want_padding, "padding_mask"),
            (
                "masked",
                "the masked scores",
                self.masked,
                self.scores.masked_fill(~self.combined, -math.inf),
                "apply_mask",
            ),
        )
        out = []
        for key, title, got, want, maker in steps:
            c = self.choices.get(maker)
            yours = c is not None and c.yours

            def name(ix, key=key):
                if key == "causal":
                    i, j = ix
                    return f"query {i} '{self.sentence[i]}' looking at key {j} '{self.sentence[j]}'"
                if key == "padding":
                    b, _, j = ix
                    return f"sequence {b + 1}, key {j} '{self.tokens(b)[j]}'"
                return self.name(*ix)

            diff = compare(key, title, got, want, maker, yours, name)
            if diff is not None:
                out.append(diff)
        return out

    def lines(self) -> list[str]:
        """The readout in words, every count read from the masks and scores shown."""
        T = self.T
        n_allowed = int(self.causal.sum())
        what, where = mask_pattern(self.causal)
        hidden = T * T - n_allowed
        out = [
            f"causal mask (T = {T}): {what}, {n_allowed} of {T * T} cells allowed; "
            + (
                "none is hidden."
                if not hidden
                else f"the {hidden} {where} are hidden."
                if where
                else f"{hidden} {'is' if hidden == 1 else 'are'} hidden."
            ),
        ]
        said_rows = said_empty = (
            False  # each explanation once, at its first sequence: the readout fits a screen
        )
        for b, L in enumerate(self.lengths):
            pad_keys = [j for j in range(T) if not bool(self.padding[b, 0, j])]
            head = f"sequence {b + 1} (b = {b}) has length {L}: "
            if not pad_keys:
                text = head + "no padding, only the causal mask hides scores"
            else:
                text = (
                    head
                    + f"{_keys_phrase(pad_keys)} {'is' if len(pad_keys) == 1 else 'are'} padding, hidden from every query"
                )
            if pad_keys and len(pad_keys) < T and not said_rows:
                said_rows = True
                n = len(pad_keys)
                text += (
                    f" (as queries, {'it still looks' if n == 1 else 'they still look'} at the real keys: "
                    f"{'its row is' if n == 1 else 'their rows are'} ignored later)"
                )
            allowed = int(self.combined[b].sum())
            text += f"; with the causal mask too, {allowed} of {T * T} scores are allowed."
            empty = [i for i in range(T) if not bool(self.combined[b, i].any())]
            if empty:
                toks = self.tokens(b)
                names = ", ".join(f"{i} '{toks[i]}'" for i in empty)
                text += (
                    f" Query row{'s' if len(empty) > 1 else ''} {names} "
                    f"{'see' if len(empty) > 1 else 'sees'} nothing at all"
                    + (
                        ": weights 0, output 0."
                        if said_empty
                        else ": softmax of an all -inf row is NaN "
                        "(the weights here show 0, as lesson 05's softmax gives, and so the output is 0)."
                    )
                )
                said_empty = True
            out.append(text)
        kept, lost = self.kept_cells(), self.lost_cells()
        if kept:
            b, i, j = kept[0]
            x = self.masked[b, i, j].item()
            out.append(
                f"The mask hides {len(kept)} cell{'s' if len(kept) > 1 else ''} whose masked score is not -inf "
                f"(outlined), e.g. {self.name(b, i, j)}: {cell_words(x, -math.inf)}."
            )
        if lost:
            b, i, j = lost[0]
            out.append(
                f"The mask allows {len(lost)} cell{'s' if len(lost) > 1 else ''} whose masked score is -inf "
                f"(outlined), e.g. {self.name(b, i, j)}: "
                f"{cell_words(self.masked[b, i, j].item(), self.scores[b, i, j].item())}."
            )
        diffs = self.differences()
        if diffs:
            out.append(diffs[0].line())
        return out

    def kept_cells(self) -> list[tuple[int, int, int]]:
        """Cells the combined mask hides whose masked score is not -inf."""
        return [c for c in self.wrong_cells() if not bool(self.combined[c])]

    def lost_cells(self) -> list[tuple[int, int, int]]:
        """Cells the combined mask allows whose masked score became -inf."""
        return [c for c in self.wrong_cells() if bool(self.combined[c])]

    def weights_line(self) -> str:
        """What softmax made of the hidden scores, read from the weights shown."""
        leaks = [c for c in self.kept_cells() if self.weights[c].item() > 0]
        if leaks:
            b, i, j = leaks[0]
            return (
                f"weights: {len(leaks)} hidden cell{'s' if len(leaks) > 1 else ''} still get weight, because "
                f"their score is not -inf (e.g. {self.name(b, i, j)}: weight {fmt(self.weights[b, i, j].item(), 3)})."
            )
        sums = self.weights.sum(-1)  # (B, T)
        empty = ~self.combined.any(-1)  # (B, T): rows with no allowed key
        ok = torch.where(empty, sums == 0, (sums - 1).abs() < 1e-6)
        if bool(ok.all()):
            return (
                "weights: every hidden score (-inf) becomes exactly 0 after softmax; "
                "the allowed weights of each row sum to 1"
                + ("; a row with no allowed key is all 0." if bool(empty.any()) else ".")
            )
        b, i = (int(x) for x in (~ok).nonzero()[0])
        return (
            f"weights: row {i} '{self.tokens(b)[i]}' of sequence {b + 1} sums to {fmt(sums[b, i].item(), 3)}."
        )

    def wrong_cells(self) -> list[tuple[int, int, int]]:
        """Cells the combined mask hides whose masked score is not -inf, or allowed cells that became -inf."""
        bad = []
        for b in range(self.B):
            for i in range(self.T):
                for j in range(self.T):
                    x = self.masked[b, i, j].item()
                    hidden = not bool(self.combined[b, i, j])
                    if hidden != (math.isinf(x) and x < 0):
                        bad.append((b, i, j))
        return bad


def _as_bool(t) -> torch.Tensor:
    return torch.as_tensor(t).detach().to("cpu").bool()


def mask_view(T: int, lengths: Sequence[int], choices: dict[str, Choice] | None = None) -> MaskView:
    """The causal mask, the padding masks, their combination and the masked scores of a padded batch.

    ``choices`` maps ``causal_mask``, ``padding_mask`` and ``apply_mask`` to :class:`Choice`;
    a step whose choice is not the student's is worked out here, inline.
    """
    from attention_course import data

    choices = dict(choices or {})

    def yours(name: str):
        c = choices.get(name)
        return c.fn if c is not None and c.yours else None

    T = int(T)
    if not 1 <= T <= T_MAX:
        raise ValueError(f"T must be between 1 and {T_MAX} (the sentence has {T_MAX} tokens), not {T}")
    lengths = tuple(min(max(int(n), 0), T) for n in lengths)
    ex = getattr(data, SENTENCE)()
    lengths_t = torch.tensor(lengths, dtype=torch.long)
    if yours("causal_mask"):
        causal = _as_bool(yours("causal_mask")(T))
    else:
        causal = torch.ones(T, T).tril().bool()  # key j <= query i
    if yours("padding_mask"):
        padding = _as_bool(yours("padding_mask")(lengths_t.clone(), T))
    else:
        padding = (torch.arange(T)[None, :] < lengths_t[:, None])[:, None, :]  # (B, 1, T)
    combined = (padding & causal).expand(len(lengths), T, T)  # (B, 1, T) & (T, T) -> (B, T, T)
    X = ex.X.double()[:T]  # (T, d_model)
    real = (torch.arange(T)[None, :] < lengths_t[:, None]).double()[..., None]  # (B, T, 1)
    Xb = X[None] * real  # (B, T, d_model): padding rows are zeros
    Q, K = Xb @ ex.W_q.double(), Xb @ ex.W_k.double()  # (B, T, d_k)
    scores = Q @ K.mT / math.sqrt(Q.shape[-1])  # (B, T, T)
    if yours("apply_mask"):
        masked = (
            torch.as_tensor(yours("apply_mask")(scores.clone(), combined.clone()))
            .detach()
            .to("cpu", torch.float64)
        )
    else:
        masked = scores.masked_fill(~combined, -math.inf)
    weights = torch.softmax(masked, dim=-1).nan_to_num(nan=0.0)  # an all -inf row: zeros
    return MaskView(
        T=T,
        lengths=lengths,
        sentence=tuple(ex.tokens),
        causal=causal,
        padding=padding,
        combined=combined,
        scores=scores,
        masked=masked,
        weights=weights,
        choices=choices,
    )


# ----------------------------------------------------------------- the picture

_CELL = "min-width:30px;height:24px;padding:1px 2px;text-align:center;font-size:12px;border:1px solid #ffffff"
_HEAD = "font-size:11px;padding:1px 2px;font-weight:normal;color:#222;line-height:1.15;white-space:nowrap"
_DEPARTS = f"outline:3px solid {WRONG};outline-offset:1px"
_DEPARTS_NOTE = (
    f"<div class='ac-departs-note' style='font-size:12px;color:{WRONG};font-weight:bold'>"
    "&#9888; first differs from the lesson here</div>"
)


def _swatch(bg: str, text: str, label: str) -> str:
    return (
        "<span style='display:inline-flex;align-items:center;gap:4px;margin-right:12px;font-size:12px'>"
        f"<span style='display:inline-block;min-width:30px;height:18px;line-height:18px;text-align:center;"
        f"background:{bg};border:1px solid #999'>{text}</span>{html.escape(label)}</span>"
    )


def legend_html(outlined: bool = True) -> str:
    """What each mark of the picture means (the outline only where a cell is outlined, unless asked for)."""
    return (
        "<div class='ac-mask-legend' style='margin:2px 0'>"
        + _swatch(ALLOWED_BG, "&#10003;", "allowed")
        + _swatch(CAUSAL_BG, "&minus;&infin;", "hidden by the causal mask")
        + _swatch(PADDING_BG, "&minus;&infin;", "hidden by the padding mask")
        + _swatch(BOTH_BG, "&minus;&infin;", "hidden by both")
        + (
            f"<span style='font-size:12px'><span style='outline:2px solid {WRONG};padding:0 4px'>"
            "outlined</span>: the masked score disagrees with the mask</span>"
            if outlined
            else ""
        )
        + "</div>"
    )


_BG = {"": ALLOWED_BG, "causal": CAUSAL_BG, "padding": PADDING_BG, "both": BOTH_BG}


def _column_heads(names: list[tuple[int, str]]) -> str:
    """The key columns' header: position over token, on two lines (so that five columns stay narrow)."""
    return (
        "<tr><th></th>"
        + "".join(f"<th style='{_HEAD}'>{j}<br>{html.escape(t)}</th>" for j, t in names)
        + "</tr>"
    )


def departs(v: MaskView) -> str | None:
    """Which part of the picture first departs from the lesson: "causal", "padding", "masked" or None."""
    diffs = v.differences()
    return diffs[0].stage if diffs else None


def _causal_table(v: MaskView, mark: bool = False) -> str:
    names = [f"{j} {t}" for j, t in enumerate(v.sentence[: v.T])]

    def cell(i, j):
        ok = bool(v.causal[i, j])
        return (
            f"<td class='ac-mask-cell {'ac-allowed' if ok else 'ac-hidden'}' "
            f"style='{_CELL};background:{ALLOWED_BG if ok else CAUSAL_BG}'>{'&#10003;' if ok else '&minus;&infin;'}</td>"
        )

    head = _column_heads(list(enumerate(v.sentence[: v.T])))
    body = "".join(
        f"<tr><th style='{_HEAD};text-align:right'>{html.escape(r)}</th>{''.join(cell(i, j) for j in range(v.T))}</tr>"
        for i, r in enumerate(names)
    )
    style = f";{_DEPARTS}" if mark else ""
    return (
        f"<div class='ac-causal-panel{' ac-departs' if mark else ''}' style='margin:2px 4px 4px 0'>"
        f"<div style='font-size:13px'><b>causal mask</b> ({v.T} &times; {v.T})<br>rows: queries, columns: keys</div>"
        + (_DEPARTS_NOTE if mark else "")
        + f"<table class='ac-causal' style='border-collapse:collapse{style}'>{head}{body}</table></div>"
    )


def _sequence_panel(v: MaskView, b: int, show: str = "scores", mark: str | None = None) -> str:
    """Sequence b: its padding mask (aligned with the key columns) over its masked scores (or weights)."""
    toks = v.tokens(b)
    names = [f"{j} {t}" for j, t in enumerate(toks)]
    wrong = set(v.wrong_cells())
    head = _column_heads(list(enumerate(toks)))
    pad_cells = []
    for j in range(v.T):
        real = bool(v.padding[b, 0, j])
        pad_cells.append(
            f"<td class='ac-pad-cell {'ac-allowed' if real else 'ac-hidden'}' "
            f"style='{_CELL};background:{ALLOWED_BG if real else PADDING_BG}'>"
            f"{'&#10003;' if real else '&minus;&infin;'}</td>"
        )
    pad_mark = f";{_DEPARTS}" if mark == "padding" else ""
    pad = (
        f"<tr class='ac-padding{' ac-departs' if pad_mark else ''}' style='{pad_mark[1:]}'>"
        f"<th style='{_HEAD};text-align:right'>padding<br>mask</th>{''.join(pad_cells)}</tr>"
        f"<tr><td colspan='{v.T + 1}' style='height:6px'></td></tr>"
    )
    rows = []
    for i in range(v.T):
        tds = []
        for j in range(v.T):
            reason = v.hidden_by(b, i, j)
            hidden = not bool(v.combined[b, i, j])
            if hidden and not reason:
                reason = "both"
            x = v.masked[b, i, j].item()
            text = "&minus;&infin;" if math.isinf(x) and x < 0 else fmt(x)
            if show == "weights":
                text = fmt(v.weights[b, i, j].item())
            outline = f";outline:2px solid {WRONG};outline-offset:-2px" if (b, i, j) in wrong else ""
            tds.append(
                f"<td class='ac-score {'ac-hidden' if hidden else 'ac-allowed'} ac-by-{reason or 'none'}' "
                f"data-q='{i}' data-k='{j}' style='{_CELL};background:{_BG[reason]}{outline}'>{text}</td>"
            )
        rows.append(
            f"<tr><th style='{_HEAD};text-align:right'>{html.escape(names[i])}</th>{''.join(tds)}</tr>"
        )
    cap = f"<b>sequence {b + 1}</b>, length {v.lengths[b]}"  # its tokens head the rows and columns
    scores_mark = f";{_DEPARTS}" if mark == "masked" else ""
    note = _DEPARTS_NOTE if mark in ("padding", "masked") else ""
    return (  # the caption is the table's own: it wraps to the table's width
        f"<div class='ac-sequence ac-sequence-{b}' style='margin:0 4px 4px 0'>"
        f"<table class='ac-scores{' ac-departs' if mark == 'masked' else ''}' style='border-collapse:collapse{scores_mark}'>"
        f"<caption style='caption-side:top;text-align:left;font-size:12px'>{cap}{note}</caption>"
        f"{head}{pad}{''.join(rows)}</table></div>"
    )


def sequences_note(show: str = "scores") -> str:
    """What each sequence's table holds, said once above them all."""
    what = (
        "the softmax weights of its masked scores"
        if show == "weights"
        else "its scaled scores after the combined mask (causal AND padding)"
    )
    return (
        f"<div class='ac-sequences-note' style='font-size:12px;margin:2px 0'>Each sequence: its padding mask "
        f"(top row) over {what}; rows: queries.</div>"
    )


def picture_html(v: MaskView, show: str = "scores") -> str:
    """The whole picture: legend, causal mask, then each sequence's padding mask and masked scores (or weights)."""
    mark = departs(v)
    panels = "".join(_sequence_panel(v, b, show, mark) for b in range(v.B))
    return (
        "<div class='ac-mask-picture' style='font-size:12px;line-height:1.3'>"
        + legend_html()
        + f"<div style='display:flex;flex-wrap:wrap;align-items:flex-start'>{_causal_table(v, mark == 'causal')}</div>"
        + sequences_note(show)
        + f"<div style='display:flex;flex-wrap:wrap;align-items:flex-start;gap:0 8px'>{panels}</div></div>"
    )


# --------------------------------------------------------------------- widgets


class _Joined:
    """The HTML of several widgets read as one, in the order they are laid out (what the picture shows)."""

    def __init__(self, *widgets) -> None:
        self.widgets = widgets

    @property
    def value(self) -> str:
        return "".join(w.value for w in self.widgets)


class MaskExplorer(Explorer):
    kind = "mask-explorer"
    title = "Mask explorer"

    def __init__(self, T: int = 5, lengths: Sequence[int] = (5, 3, 2), **functions) -> None:
        super().__init__()
        if not 1 <= int(T) <= T_MAX:
            raise ValueError(f"T must be between 1 and {T_MAX} (the sentence has {T_MAX} tokens), not {T}")
        if not 1 <= len(lengths) <= MAX_SEQUENCES:
            raise ValueError(f"give between 1 and {MAX_SEQUENCES} lengths, not {len(lengths)}")
        self.choices = {
            name: choose(name, fn, compare=True) for name, fn in functions.items() if fn is not None
        }
        t_slider = W.IntSlider(
            value=int(T), min=1, max=T_MAX, description="T", layout=W.Layout(width="260px")
        )
        show = W.ToggleButtons(
            options=[("masked scores", "scores"), ("softmax weights", "weights")],
            value="scores",
            description="show",
            style={"button_width": "150px", "description_width": "40px"},
            layout=W.Layout(width="auto"),
        )
        self.controls = {"T": t_slider, "show": show}
        for b, n in enumerate(lengths):
            self.controls[f"length_{b}"] = W.IntSlider(
                value=min(max(int(n), 0), int(T)),
                min=0,
                max=int(T),
                description=f"length {b + 1}",
                style={"description_width": "64px"},
                layout=W.Layout(width="250px", margin="2px 0"),  # above the sequence it pads
            )
        for name, w in self.controls.items():
            w.add_class(f"ac-{name.replace('_', '-')}")
            w.observe(self._changed, names="value")
        self.B = len(lengths)
        self.banner = W.HTML(self._banner())
        self.legend = W.HTML()
        self.causal = W.HTML()
        self.note = W.HTML()
        self.sequences = [W.HTML() for _ in range(self.B)]
        self.picture = _Joined(self.legend, self.causal, self.note, *self.sequences)
        self.readout = W.HTML(layout=W.Layout(flex="1 1 0", min_width="300px", margin="0"))
        self.readout.add_class("ac-readout")
        intro = W.HTML(
            "<b>Mask explorer</b>: a causal mask and a padded batch of <i>The cat sat on the</i>; "
            "drag a length to pad a sequence."
        )
        panels = []
        for b in range(self.B):
            panel = W.VBox(
                [self.controls[f"length_{b}"], self.sequences[b]],
                layout=W.Layout(margin="0 4px 0 0"),
            )
            panel.add_class("ac-sequence-panel")
            panel.add_class(f"ac-sequence-panel-{b}")
            panels.append(panel)
        picture = W.VBox(
            [
                self.legend,
                W.HBox([self.causal, self.readout], layout=W.Layout(align_items="flex-start")),
                self.note,
                W.HBox(panels, layout=W.Layout(flex_flow="row wrap", align_items="flex-start")),
            ]
        )
        picture.add_class("ac-mask-picture")
        self._root(intro, self.banner, W.HBox([t_slider, show]), picture)
        self.refresh()
        self.static_html = picture_html(self.state, show.value) + self.readout.value
        banner = banner_text(list(self.choices.values()))
        self.text = "\n".join([self.title, *([banner] if banner else []), *self.state.lines()])

    def _banner(self) -> str:
        builtin = [n for n in ("causal_mask", "padding_mask", "apply_mask") if n not in self.choices]
        more = []
        if builtin:
            more.append(
                "<div class='ac-source ac-source-builtin'><b>[built-in]</b> "
                + ", ".join(f"<code>{n}</code>" for n in builtin)
                + ": the course's versions, until you pass yours</div>"
            )
        return banner_html(list(self.choices.values()), more)

    def _changed(self, change=None) -> None:
        if change is not None and change.get("owner") is self.controls["T"] and not self._hold:
            with self.batch():
                T = self.controls["T"].value
                for b in range(self.B):
                    s = self.controls[f"length_{b}"]
                    s.max = T
                    s.value = min(s.value, T)
            return
        super()._changed(change)

    def refresh(self) -> None:
        with one_thread():
            try:
                self._refresh()
            except StudentFunctionError as error:
                self.choices[error.name] = fallback(error)
                self.banner.value = self._banner()
                self._refresh()

    def _refresh(self) -> None:
        T = self.controls["T"].value
        lengths = [self.controls[f"length_{b}"].value for b in range(self.B)]
        v = mask_view(T, lengths, self.choices)
        self.state = v
        show = self.controls["show"].value
        mark = departs(v)
        self.legend.value = legend_html(outlined=bool(v.wrong_cells()))
        self.causal.value = _causal_table(v, mark == "causal")
        self.note.value = sequences_note(show)
        for b, widget in enumerate(self.sequences):
            widget.value = _sequence_panel(v, b, show, mark)
        lines = v.lines()
        if show == "weights":
            lines.append(v.weights_line())
        self.readout.value = _pre("\n".join(lines), "ac-summary")
