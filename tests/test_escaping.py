"""Everything a student wrote is escaped wherever the course shows it: feedback pages, the
formgrader's view, the class report and every CSV the course writes."""

from __future__ import annotations

import copy
import csv
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from grader import course
from grader.classroom import grading
from grader.instructor import escape, feedback, report

LESSON = "01_projection"
RELEASE = course.ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb"
TEMPLATES = Path(__import__("nbgrader").__file__).parent / "server_extensions" / "formgrader" / "templates"

STUDENT_MARKDOWN = (
    "My answer <img src=x onerror=alert(1)> and [x](javascript:alert(1)) "
    '<a href="javascript:alert(7)" onclick="alert(8)">y</a>\n\n'
    "<script>alert('md')</script>\n\n"
    "```\n<script>alert('fence')</script>\n```\n\n"  # a fence of its own cannot end the literal block
    "$\\href{javascript:alert(9)}{z}$ <javascript:alert(10)>"
)
EVIL_MESSAGE = (
    "What differs: [x](javascript:alert(11)) <img src=x onerror=alert(12)> | `c` $\\href{javascript:alert(13)}{m}$\n"
    "Diagnosis: <script>alert(14)</script> Q was computed with W_k."
)


# the formgrader template's own handlers (show or hide the student's name)
TEMPLATE_HANDLERS = {"toggle_name(true);", "toggle_name(false);"}


class Markup(HTMLParser):
    """What a browser would run in a page: scripts, on* attributes, javascript: URLs, active elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[str] = []
        self._script: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, {k.lower(): (v or "") for k, v in attrs}))
        if tag == "script":
            self._script = []

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._script.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._script is not None:
            self.scripts.append("".join(self._script))
            self._script = None

    def active(self) -> list[str]:
        found = []
        for tag, attrs in self.tags:
            found += [
                f"<{tag} {k}={v!r}>"
                for k, v in attrs.items()
                if k.startswith("on") and v not in TEMPLATE_HANDLERS
            ]
            found += [
                f"<{tag} {k}={v!r}>"
                for k, v in attrs.items()
                if re.sub(r"[\s\x00-\x1f]", "", v).lower().startswith(("javascript:", "vbscript:"))
            ]
            if tag in ("svg", "iframe", "object", "embed", "math", "base", "form"):
                found.append(f"<{tag}>")
            if tag == "script" and "alert" in attrs.get("src", ""):
                found.append(f"<script src={attrs['src']!r}>")
        found += [f"<script>{s[:60]}</script>" for s in self.scripts if "alert" in s]
        return found


def active_markup(page: str) -> list[str]:
    parser = Markup()
    parser.feed(page)
    parser.close()
    return parser.active()


def _output(kind: str, data: dict, **more) -> nbformat.NotebookNode:
    return nbformat.from_dict({"output_type": kind, "data": data, "metadata": {}, **more})


def graded_notebook() -> nbformat.NotebookNode:
    """Lesson 01 as it comes back from autograding, with a student who tried to put script in the page."""
    nb = nbformat.read(RELEASE, as_version=4)
    own = nbformat.v4.new_code_cell("from IPython.display import HTML, Javascript, SVG, display\n...")
    own.execution_count = 3
    own.outputs = [
        _output(
            "display_data",
            {
                "text/html": "<script>alert('html')</script><b onmouseover=alert(2)>bold</b>",
                "text/plain": "<IPython.core.display.HTML object>",
            },
        ),
        _output("display_data", {"application/javascript": "alert('js')"}),
        _output(
            "display_data", {"image/svg+xml": '<svg xmlns="http://www.w3.org/2000/svg" onload="alert(3)"/>'}
        ),
        _output("display_data", {"text/markdown": "[m](javascript:alert(4)) <img src=x onerror=alert(5)>"}),
        _output("display_data", {"text/latex": "$\\href{javascript:alert(6)}{x}$"}),
        _output(
            "display_data",
            {"application/vnd.jupyter.widget-view+json": {"model_id": "m", "version_major": 2}},
        ),
        _output("display_data", {"image/png": 'AAAA" onerror="alert(15)', "text/plain": "<Figure>"}),
        _output("display_data", {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure size 10x10>"}),
        _output(
            "execute_result", {"text/html": "<iframe src='javascript:alert(16)'></iframe>"}, execution_count=3
        ),
        nbformat.v4.new_output("stream", name="stdout", text="<script>alert('stream')</script>\n"),
    ]
    student_md = nbformat.v4.new_markdown_cell(STUDENT_MARKDOWN)
    # dressed up as a locked instructor cell: its source is not the release's, so it is the student's
    forged = nbformat.v4.new_markdown_cell('<img src=x onerror="alert(17)">')
    forged.metadata["nbgrader"] = {
        "grade": False,
        "solution": False,
        "locked": True,
        "grade_id": 'md-01"><script>alert(18)</script>',
        "schema_version": 3,
    }
    raw = nbformat.v4.new_raw_cell("<script>alert(19)</script>", metadata={"raw_mimetype": "text/html"})
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            meta["score"] = 0.0 if meta["grade_id"] == "test01_project_values" else float(meta["points"])
        if meta.get("grade_id") == "test01_project_values":
            cell.outputs = [
                nbformat.v4.new_output("error", ename="AssertionError", evalue=EVIL_MESSAGE, traceback=["x"])
            ]
    answer = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("solution"))
    nb.cells[answer + 1 : answer + 1] = [own, student_md, forged, raw]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"<script>": 1}}}
    return nb


def _resources() -> dict:
    return {
        "nbgrader": {
            "assignment": LESSON,
            "notebook": LESSON,
            "student": "mallory",
            "score": 5.0,
            "max_score": 7.0,
            "late_penalty": 0.0,
        }
    }


def feedback_page(nb: nbformat.NotebookNode) -> str:
    """The page nbgrader's generate_feedback makes: the course's feedback preprocessors (as
    nbgrader_config.py lists them, GetGrades aside: the scores are in the notebook already), then
    nbconvert's HTMLExporter with nbgrader's feedback template, set up as GenerateFeedback does."""
    from nbgrader.converters import GenerateFeedback
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.preprocessors import ClearHiddenTests

    from grader.classroom.cells import CapOutputs

    resources = _resources()
    for pp in (ClearHiddenTests(), feedback.ScrubTracebacks(), feedback.ResultsSummary(), CapOutputs()):
        nb, resources = pp.preprocess(nb, resources)
    converter = GenerateFeedback(coursedir=CourseDirectory())
    exporter = converter.exporter_class(config=converter.config)
    html_page, _ = exporter.from_notebook_node(nb, resources=resources)
    return html_page


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(tmp_path / "work"))
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


# ------------------------------------------------------------------ feedback pages


def test_the_course_config_reaches_the_sanitiser_for_plain_nbgrader():
    """Plain `nbgrader generate_feedback` runs the preprocessors nbgrader_config.py lists;
    ScrubTracebacks, one of them, escapes the student's content."""
    config = (course.ROOT / "nbgrader_config.py").read_text()
    listed = config.split("c.GenerateFeedback.preprocessors = [", 1)[1].split("]", 1)[0]
    assert "grader.instructor.feedback.ScrubTracebacks" in listed
    nb, _ = feedback.ScrubTracebacks().preprocess(graded_notebook(), _resources())
    assert not any("text/html" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_feedback_page_shows_the_students_html_and_markdown_as_text(work):
    page = feedback_page(graded_notebook())
    assert active_markup(page) == []
    assert "<script>alert" not in page and "<img src=x onerror" not in page
    assert not re.search(r"<a\s[^>]*href\s*=\s*[\"']?\s*javascript:", page, re.I)
    text = feedback.page_text(page)
    # the student's text is all there, as written
    assert "My answer <img src=x onerror=alert(1)> and [x](javascript:alert(1))" in text
    assert "<script>alert('fence')</script>" in text and "<script>alert('md')</script>" in text
    assert "<script>alert('stream')</script>" in text
    assert "<IPython.core.display.HTML object>" in text
    assert "[text/html output not shown here: only text and images are]" in text
    assert "[application/javascript output not shown here" in text
    assert "[image/svg+xml output not shown here" in text
    # a real image stays an image
    assert re.search(r'<img [^>]*src="data:image/png;base64,iVBORw0KGgo="', page)
    # the instructor's own Markdown keeps its HTML (a <details> in the release)
    release = json.loads(RELEASE.read_text())
    assert any("<details>" in "".join(c["source"]) for c in release["cells"] if c["cell_type"] == "markdown")
    assert "<details>" in page and "<summary>" in page
    # the summary shows the check's message and diagnosis as text, never as a link or markup
    assert "Your results: 5 / 7 points" in text
    assert "[x](javascript:alert(11)) <img src=x onerror=alert(12)> | `c`" in text
    assert "Diagnosis: <script>alert(14)</script> Q was computed with W_k." in text
    summary = page.split("Your results", 1)[1].split("</table>", 1)[0]
    assert 'class="tex2jax_ignore"' in summary  # MathJax leaves the student's $...$ alone


def test_nbgrader_generate_feedback_with_the_course_config(work):
    """The real thing: nbgrader's generate_feedback, configured by nbgrader_config.py (as both
    ``python -m grader feedback`` and plain ``nbgrader generate_feedback`` run it), GetGrades included."""
    from nbgrader.api import Gradebook

    nb = graded_notebook()
    with Gradebook(grading.gradebook_url(), "attention-step-by-step") as gb:
        gb.add_assignment(LESSON)
        gb.add_notebook(LESSON, LESSON)
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade"):
                gb.add_grade_cell(
                    meta["grade_id"], LESSON, LESSON, max_score=meta["points"], cell_type="code"
                )
            if meta.get("solution"):
                gb.add_solution_cell(meta["grade_id"], LESSON, LESSON)
        gb.add_student("mallory")
        gb.add_submission(LESSON, "mallory")
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade"):
                gb.find_grade(meta["grade_id"], LESSON, LESSON, "mallory").auto_score = meta["score"]
        gb.db.commit()
    dest = course.autograded_path(LESSON, "mallory")
    dest.parent.mkdir(parents=True)
    nbformat.write(nb, dest)
    (dest.parent / "timestamp.txt").write_text("2024-01-01 00:00:00")
    assert feedback.feedback_job((LESSON, "mallory")) == {
        "lesson": LESSON,
        "student": "mallory",
        "path": str(feedback.feedback_path(LESSON, "mallory")),
    }
    page = feedback.feedback_path(LESSON, "mallory").read_text()
    assert active_markup(page) == []
    text = feedback.page_text(page)
    assert "My answer <img src=x onerror=alert(1)> and [x](javascript:alert(1))" in text
    assert "Your results: 5 / 7 points" in text and "<details>" in page


def test_the_sanitiser_keeps_the_release_and_runs_twice_to_the_same_notebook(work):
    nb = graded_notebook()
    release = {"".join(c["source"]) for c in json.loads(RELEASE.read_text())["cells"]}
    once = feedback.escape_student_content(copy.deepcopy(nb), _resources())
    twice = feedback.escape_student_content(copy.deepcopy(once), _resources())
    assert once == twice
    kept = [c.source for c in once.cells if c.cell_type == "markdown" and c.source in release]
    assert len(kept) == sum(1 for c in nb.cells if c.cell_type == "markdown" and c.source in release)
    student = [c for c in once.cells if c.cell_type == "markdown" and c.source not in release]
    assert len(student) == 3 and all(escape.is_literal(c.source) for c in student)  # markdown, forged, raw
    assert once.cells[[c.source for c in nb.cells].index(STUDENT_MARKDOWN)].source.startswith("````\n")
    assert all(
        re.fullmatch(r"[A-Za-z0-9_.-]+", c.metadata["nbgrader"]["grade_id"])
        for c in once.cells
        if "nbgrader" in c.metadata
    )
    assert "widgets" not in once.metadata
    # an unknown lesson: every Markdown cell is the student's
    blind = escape.sanitise_notebook(copy.deepcopy(nb), {})
    assert all(
        escape.is_literal(c.source) or not c.source.strip() for c in blind.cells if c.cell_type == "markdown"
    )


def test_the_formgrader_view_with_the_sanitiser_configured(work):
    """What the formgrader shows: nbgrader's formgrade template, with the sanitiser as
    ``c.HTMLExporter.preprocessors = ["grader.instructor.feedback.EscapeStudentContent"]``."""
    from nbconvert.exporters import HTMLExporter
    from traitlets.config import Config

    c = Config()
    c.HTMLExporter.template_name = "formgrade"
    c.HTMLExporter.extra_template_basedirs = [str(TEMPLATES)]
    c.HTMLExporter.preprocessors = ["grader.instructor.feedback.EscapeStudentContent"]
    resources = {
        "assignment_id": LESSON,
        "notebook_id": LESSON,
        "submission_id": "1",
        "index": 0,
        "total": 1,
        "base_url": "",
        "student": "mallory",
        "last_name": "",
        "first_name": "",
        "notebook_path": "x",
    }
    page, _ = HTMLExporter(config=c).from_notebook_node(graded_notebook(), resources=resources)
    assert active_markup(page) == []
    assert "<details>" in page  # the instructor's markup is kept
    assert "My answer <img src=x onerror=alert(1)>" in feedback.page_text(page)


@pytest.mark.parametrize(
    "output",
    [
        {"output_type": "display_data", "data": {"text/html": "<b>x</b>"}, "metadata": {}},
        {
            "output_type": "display_data",
            "data": {"image/png": "AAAA", "text/plain": "p"},
            "metadata": {"image/png": {"width": "1 onerror=alert(1)", "height": 20}},
        },
        {"output_type": "stream", "name": "<script>", "text": ["a", "b"]},
        {"output_type": "weird", "x": 1},
    ],
)
def test_every_output_kept_is_text_or_an_image(output):
    clean = escape.sanitise_output(output)
    nbformat.validate(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[nbformat.from_dict(clean)])])
    )
    for mime in clean.get("data", {}):
        assert mime in escape.SAFE_OUTPUTS
    assert "onerror" not in json.dumps(clean.get("metadata", {}))


# ------------------------------------------------------------------ class report and CSVs

EVIL_DIAGNOSIS = '=HYPERLINK("http://x","y")'
EVIL_NAME = "ada|<img src=x onerror=alert(1)>"


def _records() -> list[dict]:
    def rec(student, scores, diag=None, status="graded", flags=(), notes=(), score=None):
        cells = [
            {
                "grade_id": f"t{i}",
                "exercise": "project",
                "points": 2.0,
                "score": s,
                "diagnosis": diag if i == 1 else None,
            }
            for i, s in enumerate(scores)
        ]
        return {
            "student": student,
            "lesson": LESSON,
            "status": status,
            "cells": cells,
            "flags": list(flags),
            "notes": list(notes),
            "score": sum(scores) if score is None else score,
            "max_score": 4.0,
            "seconds": 1.0,
        }

    return [
        rec(
            EVIL_NAME,
            [2, 0],
            diag=EVIL_DIAGNOSIS,
            flags=["[x](javascript:alert(1))"],
            notes=["one\n| two |", "`c` & <b>"],
        ),
        rec("@bob", [2, 0], diag=EVIL_DIAGNOSIS, status="+kernel died", score=-1.5),
        rec("-12", [2, 2]),
    ]


def test_class_report_markdown_shows_names_and_diagnoses_as_text():
    rep = report.build(_records())
    assert rep.misconceptions == [("project", EVIL_DIAGNOSIS, 2)]
    md = report.markdown(rep)
    assert '| `project` | =HYPERLINK("http://x","y") | 2 |' in md
    assert "ada\\|&lt;img src=x onerror=alert(1)&gt;" in md
    assert "\\[x\\](javascript:alert(1))" in md
    assert "<img" not in md and "[x](javascript:" not in md and "<b>" not in md
    # every table row still has its own cells: no name or note adds a column or a line
    for line in md.splitlines():
        if line.startswith("| "):
            header = {"| lesson": 5, "| exercise": 3, "| student": 4}
            cells = len(re.findall(r"(?<!\\)\|", line)) - 1
            assert cells in header.values(), line
    from nbconvert.filters.markdown import markdown2html

    rendered = markdown2html(md)
    assert active_markup(rendered) == [] and "<img src=x" not in rendered
    assert "<img" not in rendered.replace('<img src="class_report.png"', "").replace("<img alt=", "")


def test_class_report_shows_a_control_character_in_a_name_as_its_escape():
    """A folder placed by hand can name a student with a terminal's erase-line sequence: the report, read
    with ``cat`` as often as rendered, kept it as it was."""
    records = _records()
    records[0]["student"] = "ctl\x1b[2K\rwipe"
    md = report.markdown(report.build(records))
    assert "\x1b" not in md and "\r" not in md, repr(md)
    assert "ctl\\\\x1b\\[2K wipe" in md, md


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ('=HYPERLINK("http://x","y")', '\'=HYPERLINK("http://x","y")'),
        ("+cmd", "'+cmd"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("  =1+1", "'  =1+1"),
        ("-1.5", "-1.5"),
        ("+12.0", "+12.0"),
        ("ada", "ada"),
        ("", ""),
        (-1.5, -1.5),
        (12.0, 12.0),
        (None, None),
    ],
)
def test_csv_cells_that_a_spreadsheet_would_run_start_with_a_quote(value, written):
    assert escape.csv_cell(value) == written


def test_every_csv_of_the_export_quotes_formulas_and_keeps_numbers(work):
    from nbgrader.api import Gradebook

    records = _records()
    for r in records:
        path = grading.results_dir() / LESSON / f"{r['student']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(r))
    with Gradebook(grading.gradebook_url(), "attention-step-by-step") as gb:
        gb.add_assignment(LESSON)
        gb.add_notebook(LESSON, LESSON)
        gb.add_student(EVIL_NAME, first_name="=cmd|' /C calc'!A0", last_name="Lovelace, Ada", email="@x")
    paths = report.export(work / "report", [LESSON])
    tables = {
        name: list(csv.reader(paths[name].open())) for name in ("grades", "misconceptions", "submissions")
    }
    starts = tuple("=+-@\t\r")
    for name, rows in tables.items():
        for row in rows:
            for cell in row:
                assert not cell.startswith(starts) or re.fullmatch(r"[+-]?\d+(\.\d*)?", cell), (name, cell)
    assert tables["misconceptions"][1:] == [["project", "'" + EVIL_DIAGNOSIS, "2"]]
    subs = {r[0]: r for r in tables["submissions"][1:]}
    assert subs["'@bob"][3] == "-1.5"  # a score stays a number
    assert subs["-12"][0] == "-12"  # so does text that is a plain number
    assert subs["'@bob"][7] == "'" + EVIL_DIAGNOSIS and subs["'@bob"][2] == "'+kernel died"
    grades = {r["student_id"]: r for r in csv.DictReader(paths["grades"].open())}
    assert grades[EVIL_NAME]["first_name"] == "'=cmd|' /C calc'!A0"
    assert grades[EVIL_NAME]["last_name"] == "Lovelace, Ada" and grades[EVIL_NAME]["email"] == "'@x"
    assert grades["'@bob"]["raw_score"] == "-1.5"
    md = paths["report"].read_text()
    assert "ada\\|&lt;img" in md and "<img" not in md


def test_plain_nbgrader_export_with_the_safe_plugin(work):
    """``c.ExportApp.plugin_class = "grader.instructor.report.SafeCsvExport"``: nbgrader's columns,
    a comma in a name stays in its cell, a formula is quoted."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin
    from traitlets.utils.importstring import import_item

    plugin_class = import_item("grader.instructor.report.SafeCsvExport")
    assert issubclass(plugin_class, CsvExportPlugin)
    with Gradebook(grading.gradebook_url(), "attention-step-by-step") as gb:
        gb.add_assignment(LESSON)
        gb.add_student("s1", first_name=EVIL_DIAGNOSIS, last_name="Lovelace, Ada")
        gb.add_student("s2", first_name="Bob")
        dest = work / "grades.csv"
        plugin_class(to=str(dest)).export(gb)
        plain = work / "plain.csv"
        CsvExportPlugin(to=str(plain)).export(gb)
    rows = list(csv.DictReader(dest.open()))
    assert list(rows[0]) == plain.read_text().splitlines()[0].split(",")
    s1 = next(r for r in rows if r["student_id"] == "s1")
    assert s1["first_name"] == "'" + EVIL_DIAGNOSIS and s1["last_name"] == "Lovelace, Ada"
    assert s1["score"] == "0.0" and s1["assignment"] == LESSON
    assert os.path.getsize(dest) > 0


# a right answer outside the notebook but for its message, which makes up a diagnosis of its own
FAKE_DIAGNOSIS = """
def project(X, W_q, W_k, W_v):
    import sys
    if "course_runtime.sandbox" in sys.modules:
        raise ValueError("nope\\nDiagnosis: FAKE you were told the answer")
    return X @ W_q, X @ W_k, X @ W_v
"""


@pytest.mark.slow
def test_a_feedback_page_diagnoses_only_the_mistake_the_grading_found(tmp_path, monkeypatch):
    """A check's message holds the student's own error text, and the feedback page took the first
    "Diagnosis: " in it for the check's: a made-up one stood in bold as the course's diagnosis, and the
    words of a real mistake (planted) named a mistake nobody made. Only the mistake the grading found
    (its record) is diagnosed; a notebook graded without a record keeps only one of the course's own."""
    from tests import attacks
    from tests.nbtools import ROOT, filled, grading_work, solution_sources

    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(tmp_path))
    sol = solution_sources(LESSON)["ex01_project"]
    answers = {
        "fake": FAKE_DIAGNOSIS,
        "planted": attacks.PLANTED_DIAGNOSIS,
        "wk": sol.replace("Q = X @ W_q", "Q = X @ W_k"),
    }
    with grading_work(tmp_path, [LESSON]):
        for student, answer in answers.items():
            path = course.submission_path(LESSON, student)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                json.dumps(filled(ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", {"ex01_project": answer}))
            )
    summary = grading.grade([LESSON], progress=False)
    assert summary.graded == 3, grading.format_summary(summary)
    feedback.generate([LESSON], workers=1, progress=False)

    def table(student: str) -> str:
        page = feedback.feedback_path(LESSON, student).read_text()
        return feedback.page_text(page.split("Your results", 1)[1].split("</table>", 1)[0])

    assert "Diagnosis: Q was computed with W_k." in table("wk")
    for student in ("fake", "planted"):
        assert "Diagnosis" not in table(student), table(student)
    # without a record (plain nbgrader's grading): the made-up one is not the course's
    nb = graded_notebook()
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" and "Diagnosis: " in out.get("evalue", ""):
                out["evalue"] = "What differs: nope\nDiagnosis: FAKE you were told the answer"
    page = feedback_page(nb)
    summary_text = feedback.page_text(page.split("Your results", 1)[1].split("</table>", 1)[0])
    assert "nope" in summary_text and "Diagnosis" not in summary_text, summary_text
