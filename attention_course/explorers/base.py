"""What every explorer shares: the ``Explorer`` base class, its saved picture and readout, and ``Skipped``.

Each explorer is an object that, displayed, leaves its starting picture and readout
as plain outputs (PNG and HTML: what GitHub, nbviewer and HTML exports show without
widget JavaScript) and then the live widget (ipywidgets 7 or 8), whose <style> hides
those saved outputs wherever it renders (JupyterLab; Colab keeps each output apart).
Controls call ``refresh``, which recomputes, updates the figure in place and swaps the
PNG bytes of one ``Image`` widget.
"""

from __future__ import annotations

import base64
import functools
import html
import math
import uuid
from contextlib import contextmanager

import ipywidgets as W

from .choosing import Choice, banner_html, banner_text, one_thread

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
        f"<pre class='{cls}' style='margin:2px 0;padding:4px 8px;background:#f6f6f6;border-left:3px solid #0072B2;"
        "white-space:pre-wrap;word-break:normal;overflow-wrap:break-word;font-size:12px;line-height:1.35'>"
        + html.escape(text, quote=False)
        + "</pre>"
    )


def text_height(texts: list[str], chars_per_line: int = 110) -> str:
    """The height (CSS) that holds the tallest of several explanations, each a bold title, lines in a
    ``_pre`` box and a check line: reserved, so that the controls above do not move as it changes."""

    def rows(line: str) -> int:
        return max(1, -(-len(line) // chars_per_line))  # a long line wraps

    tallest = 0.0
    for text in texts:
        title, *lines = text.splitlines()
        tallest = max(tallest, 18.0 * rows(title) + 16.2 * sum(rows(x) for x in lines) + 12 + 18)
    return f"{math.ceil(tallest)}px"


STATIC_LABEL = "Picture of the starting setting, saved with the notebook"
"""The words above an explorer's saved picture (seen on GitHub, nbviewer, HTML exports and Colab)."""

# How the live widget looks: every control's state in words and colour, the chosen button outlined.
EXPLORER_CSS = (
    ".ac-explorer .ac-on{background:#009E73 !important;color:#fff !important;font-weight:bold}"
    ".ac-explorer .ac-off{background:#fff !important;color:#000 !important;border:2px solid #D55E00 !important}"
    ".ac-explorer .widget-toggle-buttons .widget-toggle-button.mod-active,"
    ".ac-explorer .widget-toggle-buttons button.mod-active{background:#0072B2 !important;color:#fff !important;"
    "outline:2px solid #000;outline-offset:-2px;font-weight:bold}"
    # compact: text lines as tall as their font (not a control's 28 px), a chooser's label beside its buttons
    ".ac-explorer .widget-html-content{line-height:1.35}"
    ".ac-explorer .widget-toggle-buttons{display:flex;flex-wrap:wrap;align-items:center}"
    ".ac-explorer .ac-cell{line-height:1.2 !important}"
)


class Explorer:
    """What an explorer function returns. Display it (last line of a cell) to use it.

    Attributes: ``widget`` (the root widget), ``controls`` (name -> widget, for
    driving it from code), ``state`` (the last computed view). Displayed, it leaves
    its starting picture and readout as plain outputs (see ``static_outputs``) and
    then the live widget, which hides those outputs where it renders.
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
        self.uid = uuid.uuid4().hex[:12]
        self._hold = 0

    def static_outputs(self) -> list[dict]:
        """The starting setting as plain outputs: a label, the picture (PNG) and the readout (HTML).

        Each is a display bundle any notebook viewer shows without widget JavaScript
        (GitHub, nbviewer, ``nbconvert --execute``, a saved copy from Colab).
        """
        if not (self.static_png or self.static_html):
            return [] if self.widget is not None else [{"text/plain": self.text}]
        cls = f"ac-static ac-static-{self.uid}"
        title = html.escape(self.title)
        failed = self.failed_functions()  # said in the saved copy too, not only in the live banner
        outputs = [
            {
                "text/html": f"<div class='{cls} ac-static-label' style='font-size:13px;margin:2px 0'>"
                f"<b>{title}</b>: {STATIC_LABEL}. The live controls come below it when the notebook runs."
                f"{banner_html(failed)}</div>",
                "text/plain": f"{self.title}: {STATIC_LABEL}."
                + (f"\n{banner_text(failed)}" if failed else ""),
            }
        ]
        if self.static_png:
            outputs.append(
                {
                    "image/png": base64.b64encode(self.static_png).decode("ascii"),
                    "text/plain": f"<{self.title}: picture of the starting setting>",
                }
            )
        if self.static_html:
            outputs.append(
                {
                    "text/html": f"<div class='{cls} ac-static-readout'>{self.static_html}</div>",
                    "text/plain": self.text,
                }
            )
        return outputs

    def failed_functions(self) -> list[Choice]:
        """The student's functions this explorer could not use (they raised, or returned a wrong shape)."""
        choices = getattr(self, "choices", None) or ()
        return [
            c for c in (choices.values() if isinstance(choices, dict) else choices) if c.source == "error"
        ]

    def _hide_static_css(self) -> str:
        """CSS that hides this explorer's saved outputs in JupyterLab once the live widget shows."""
        u = self.uid
        rules = [f".ac-static-{u}{{display:none !important}}"]
        child = ".jp-OutputArea-child"
        rules.append(f"{child}:has(.ac-static-{u}){{display:none !important}}")
        # the picture (a plain PNG output) sits between the label and the readout
        rules.append(f"{child}:has(.ac-static-label.ac-static-{u}) + {child}{{display:none !important}}")
        rules.append(f"{child}:has(+ {child} .ac-static-readout.ac-static-{u}){{display:none !important}}")
        return "".join(rules)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        for bundle in self.static_outputs():
            light = {"image/png": {"needs_background": "light"}} if "image/png" in bundle else None
            display(bundle, raw=True, metadata=light)  # a dark theme keeps the picture on white
        if self.widget is not None:
            display(
                {
                    WIDGET_MIME: _view_json(self.widget),
                    "text/plain": f"{self.title}: live controls (they need a running kernel with ipywidgets)",
                },
                raw=True,
            )

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
        self._style = W.HTML(layout=W.Layout(display="none"))  # a <style> applies wherever it sits
        self._style.add_class("ac-style")
        classes = (
            "ac-explorer",
            f"ac-{self.kind}",
            f"ac-id-{self.uid}",
        )  # the last scopes per-explorer rules
        root = W.VBox([*children, self._style], _dom_classes=classes)
        self.widget = root
        self._restyle()
        return root

    def _restyle(self) -> None:
        """Set the <style> of the live widget: the explorers' look, and this explorer's saved outputs hidden."""
        style = getattr(self, "_style", None)
        if style is not None:
            style.value = f"<style>{EXPLORER_CSS}{self._hide_static_css()}</style>"


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
    """The figure's picture, shown at its natural size (a flex column would otherwise stretch and blur it)."""
    image = W.Image(format="png", layout=W.Layout(max_width="100%", height="auto", align_self="flex-start"))
    image.add_class("ac-figure")
    return image


def _readout():
    readout = W.HTML()
    readout.add_class("ac-readout")
    return readout
