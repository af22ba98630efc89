"""Escaping what students wrote, wherever the course shows it: Markdown, HTML pages, CSV, notebooks.

Everything a grading run reports can come from a student: a check's message holds the error
text their code raised, a name or a note from the files they hand in, a notebook's outputs
from their kernel. So:

- ``md_text``: text in a Markdown report (``class_report.md``): no HTML, link, code span or table
  cell break survives; ``md_code`` for what the report shows as code;
- ``md_html``: text in Markdown that nbconvert renders to HTML (the feedback summary): every
  character that Markdown, HTML or MathJax reads becomes a character reference, inside a span
  MathJax skips;
- ``csv_cell`` and the writers: a text cell that a spreadsheet would read as a formula (``=``,
  ``+``, ``-``, ``@``, tab, carriage return) gets a leading ``'`` (OWASP's CSV-injection rule);
  numbers, and text that is a plain number, are left as they are;
- ``sanitise_notebook``: a notebook about to become an HTML page keeps only outputs that cannot
  run code (text, PNG, JPEG), and shows every Markdown or raw cell that is not exactly a cell of
  the release as literal text.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable
from typing import Any

from grader.classroom.jobs import one_line

# ------------------------------------------------------------------ Markdown reports

_MD = {
    "\\": "\\\\",
    "|": "\\|",
    "[": "\\[",
    "]": "\\]",
    "`": "\\`",
    "<": "&lt;",
    ">": "&gt;",
    "&": "&amp;",
}
_BREAKS = re.compile(r"\r\n|[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.:/ -]+")


def md_text(value: Any) -> str:
    """``value`` as text in a Markdown table or list: no HTML, link, code span, cell break or control
    character (shown as its escape: the report is read in a terminal too)."""
    return "".join(_MD.get(ch, ch) for ch in one_line(_BREAKS.sub(" ", str(value))))


def md_code(value: Any) -> str:
    """``value`` as inline code where it is a plain name, else as escaped text."""
    text = str(value)
    return f"`{text}`" if _PLAIN_NAME.fullmatch(text) else md_text(text)


# ------------------------------------------------------------------ Markdown rendered to HTML

# what Markdown (links, code, emphasis, tables, escapes), HTML and MathJax ($) read
_ACTIVE = set("\\|[]`<>&\"'$*_~!{}#")


def md_html(value: Any) -> str:
    """``value`` as literal text in Markdown that becomes HTML: character references, in a span
    MathJax leaves alone (``tex2jax_ignore``), on one line."""
    text = _BREAKS.sub(" ", str(value))
    inner = "".join(f"&#{ord(ch)};" if ch in _ACTIVE else ch for ch in text)
    return f'<span class="tex2jax_ignore">{inner}</span>'


def md_html_code(value: Any) -> str:
    """``value`` as inline code in Markdown that becomes HTML, escaped like ``md_html``."""
    text = _BREAKS.sub(" ", str(value))
    return "<code>" + "".join(f"&#{ord(ch)};" if ch in _ACTIVE else ch for ch in text) + "</code>"


# ------------------------------------------------------------------ CSV

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def csv_cell(value: Any) -> Any:
    """``value`` safe for a spreadsheet: text a spreadsheet would read as a formula gets a leading
    ``'``; numbers, and text that is a plain number (``-1.5``), stay as they are."""
    if not isinstance(value, str) or not value:
        return value
    if _NUMBER.fullmatch(value):
        return value
    # a formula after leading blanks counts too (some spreadsheets trim them)
    if value[0] in FORMULA_START or value.lstrip(" \u00a0")[:1] in FORMULA_START[:4]:
        return "'" + value
    return value


def csv_row(row: Iterable[Any]) -> list[Any]:
    return [csv_cell(v) for v in row]


class CsvWriter:
    """``csv.writer`` whose every text cell goes through ``csv_cell``."""

    def __init__(self, f: Any, *args: Any, **kwargs: Any) -> None:
        self._writer = csv.writer(f, *args, **kwargs)

    @property
    def dialect(self) -> Any:
        return self._writer.dialect

    def writerow(self, row: Iterable[Any]) -> Any:
        return self._writer.writerow(csv_row(row))

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def csv_writer(f: Any, *args: Any, **kwargs: Any) -> CsvWriter:
    return CsvWriter(f, *args, **kwargs)


class CsvDictWriter(csv.DictWriter):
    """``csv.DictWriter`` whose every text cell goes through ``csv_cell``."""

    def writerow(self, rowdict: dict) -> Any:
        return super().writerow({k: csv_cell(v) for k, v in rowdict.items()})

    def writerows(self, rowdicts: Iterable[dict]) -> None:
        for row in rowdicts:
            self.writerow(row)


# ------------------------------------------------------------------ notebooks shown as HTML

# outputs an HTML page shows without running anything: nbconvert escapes text, and puts images
# in an <img> (base64 checked here)
SAFE_OUTPUTS = ("text/plain", "image/png", "image/jpeg")
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
_GRADE_ID = re.compile(r"[A-Za-z0-9_.-]+")


def source_text(source: Any) -> str:
    """A cell's source (or an output's text) as one string, whether a string or a list of lines."""
    if isinstance(source, list):
        return "".join(str(s) for s in source)
    return "" if source is None else str(source)


def literal_markdown(text: str) -> str:
    """Markdown showing ``text`` exactly as written: a fenced block longer than any backtick run in
    it (so it cannot be closed early), which nbconvert renders escaped in <pre><code>."""
    if not text.strip():
        return ""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text.rstrip(chr(10))}\n{fence}"


def is_literal(text: str) -> bool:
    """Whether Markdown ``text`` is one fenced block nothing inside can close (as ``literal_markdown``
    writes it): shown as escaped text whoever wrote it, so it needs no second fence."""
    m = re.fullmatch(r"(`{3,})\n(.*)\n\1", text, re.S)
    return m is not None and "`" * len(m.group(1)) not in m.group(2)


def _note(dropped: list[str]) -> str:
    return f"[{', '.join(sorted(dropped))} output not shown here: only text and images are]"


def sanitise_output(out: dict) -> dict:
    """An output that nbconvert's HTML shows as text or an image, never as markup or script."""
    kind = out.get("output_type")
    if kind == "stream":
        name = out.get("name") if out.get("name") in ("stdout", "stderr") else "stdout"
        return {"output_type": "stream", "name": name, "text": source_text(out.get("text"))}
    if kind == "error":
        tb = out.get("traceback")
        return {
            "output_type": "error",
            "ename": str(out.get("ename", "")),
            "evalue": str(out.get("evalue", "")),
            "traceback": [str(t) for t in tb] if isinstance(tb, list) else [source_text(tb)],
        }
    if kind not in ("display_data", "execute_result"):
        return {"output_type": "stream", "name": "stdout", "text": f"[{kind!s:.40} output not shown here]\n"}
    data = out.get("data") if isinstance(out.get("data"), dict) else {}
    kept: dict[str, Any] = {}
    dropped = []
    for mime, value in data.items():
        if mime == "text/plain":
            kept[mime] = source_text(value)
        elif mime in ("image/png", "image/jpeg") and _BASE64.fullmatch(source_text(value)):
            kept[mime] = source_text(value)
        else:
            dropped.append(str(mime)[:60])
    if dropped:
        note = _note(dropped)
        kept["text/plain"] = f"{kept['text/plain']}\n{note}" if kept.get("text/plain") else note
    metadata: dict[str, Any] = {}
    for mime in ("image/png", "image/jpeg"):
        meta = (out.get("metadata") or {}).get(mime) if isinstance(out.get("metadata"), dict) else None
        if mime in kept and isinstance(meta, dict):
            size = {k: meta[k] for k in ("width", "height") if type(meta.get(k)) is int and meta[k] > 0}
            if size:
                metadata[mime] = size
    clean: dict[str, Any] = {"output_type": kind, "data": kept, "metadata": metadata}
    if kind == "execute_result":
        count = out.get("execution_count")
        clean["execution_count"] = count if type(count) is int else None
    return clean


def sanitise_notebook(nb: Any, release: dict[str, dict] | None = None) -> Any:
    """``nb`` (an nbformat notebook, changed in place) ready to be shown as HTML.

    ``release`` maps the source of every Markdown and raw cell of the released notebook to its
    attachments: such a cell, written by the instructor, keeps its Markdown. Every other Markdown or
    raw cell (one the student wrote or changed) is shown as literal text. Every output is reduced to
    text and images, whichever cell it is under: they all came from the student's kernel. The
    notebook's widget state is dropped, and a grade id that the page would show as markup is
    reduced to safe characters.
    """
    from nbformat import NotebookNode, from_dict

    release = release or {}
    widgets = nb.metadata.get("widgets") if hasattr(nb, "metadata") else None
    if widgets is not None:
        del nb.metadata["widgets"]
    for i, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader")
        if isinstance(meta, dict) and "grade_id" in meta and not _GRADE_ID.fullmatch(str(meta["grade_id"])):
            meta["grade_id"] = re.sub(r"[^A-Za-z0-9_.-]", "_", str(meta["grade_id"]))[:80] or "cell"
        if cell.cell_type == "code":
            cell.outputs = [from_dict(sanitise_output(o)) for o in cell.get("outputs", [])]
            continue
        text = source_text(cell.get("source"))
        if cell.cell_type == "markdown" and (not text.strip() or is_literal(text)):
            cell.pop("attachments", None)  # already literal text (sanitised before, or written so)
            continue
        if cell.cell_type in ("markdown", "raw") and text in release:
            attachments = release[text]
            if attachments:
                cell["attachments"] = from_dict(attachments)
            elif "attachments" in cell:
                del cell["attachments"]
            continue
        clean = NotebookNode(cell_type="markdown", metadata=cell.get("metadata", NotebookNode()))
        clean["source"] = literal_markdown(text)
        if "id" in cell:
            clean["id"] = cell["id"]
        nb.cells[i] = clean
    return nb


def release_cells(nb: dict) -> dict[str, dict]:
    """Every Markdown and raw cell of a released notebook (a dict as read from JSON): source -> attachments."""
    found: dict[str, dict] = {}
    for cell in nb.get("cells", []):
        if cell.get("cell_type") in ("markdown", "raw"):
            found.setdefault(source_text(cell.get("source")), cell.get("attachments") or {})
    return found
