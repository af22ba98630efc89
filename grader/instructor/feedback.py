"""Feedback: one HTML page per student and lesson, with every check's result and diagnosis.

nbgrader's ``generate_feedback`` renders the autograded notebook; its
``ClearHiddenTests`` removes hidden blocks from the cell sources but not from
tracebacks already in the outputs. The two preprocessors here (configured in
``nbgrader_config.py``, so plain ``nbgrader generate_feedback`` uses them too)
close that gap and add a summary:

- ``ScrubTracebacks``: a check cell's error keeps only ``Error: message`` (the
  message names what differs and the diagnosis; the frames would show test
  code), any traceback through the grading package is cut the same way, and
  output that repeats a hidden line is dropped;
- ``ResultsSummary``: a table at the top: each check, its points, passed or
  not, and what to fix;
- ``grader.classroom.cells.CapOutputs`` (last): at most 64 KB of output per
  cell, so a notebook that printed 100 MB still gives a small page.

Everything from the student is escaped before the page is made (``EscapeStudentContent``, which
``ScrubTracebacks`` also runs, so the configured list needs no new line): outputs keep only text and
images (no HTML, JavaScript, SVG, Markdown, LaTeX or widgets: they all came from the student's
kernel), a Markdown or raw cell that is not exactly one of the release is shown as literal text,
and the summary's messages and diagnoses are character references. The formgrader renders
autograded notebooks with its own exporter: ``c.HTMLExporter.preprocessors =
["grader.instructor.feedback.EscapeStudentContent"]`` in nbgrader_config.py covers it too.

Every page written is then scanned for hidden-test lines; a page that shows
one is deleted and reported, never left for students.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import hmac
import html
import json
import os
import re
from pathlib import Path
from typing import Any

from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

from grader import course
from grader.classroom import lessons
from grader.instructor import escape

STATUS_NOTES = {
    "syntax error": "A cell has a syntax error, so the code in it was not defined: fix it and run the cell.",
    "timed out": "A cell ran past the time limit and was stopped (an endless loop?).",
    "out of memory": "A cell used more memory than allowed and was stopped.",
    "exited": "A cell called sys.exit(): the code after that point in the cell did not run.",
    "kernel died": (
        "The notebook's kernel stopped (os._exit, exit(), a crash, or the memory limit): "
        "the checks after that point did not run."
    ),
    "invalid notebook": "The file handed in is not a readable notebook: hand in the .ipynb saved from Jupyter.",
    "not attempted": "No exercise was attempted: write your code where a cell says YOUR CODE HERE.",
    "repaired": (
        "Some check cells of your notebook were changed, copied, relabelled or given other points: they "
        "were put back as released, and your code was graded against them. Keep the cells you were given."
    ),
}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _is_grade(cell: Any) -> bool:
    return cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade", False)


def _hidden_lines(resources: dict) -> set[str]:
    lesson = resources.get("nbgrader", {}).get("assignment")
    try:
        les = lessons.lesson(lesson)
    except (OSError, TypeError):
        return set()
    visible = set()
    for c in les.tests:
        visible.update(ln.strip() for ln in lessons.HIDDEN_BLOCK.sub("", c.source).splitlines())
    return {ln for ln in les.hidden_lines() if ln not in visible}


class ScrubTracebacks(NbGraderPreprocessor):
    """Reduce error outputs of check cells (and any through the grading package) to their message."""

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        hidden = _hidden_lines(resources)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            grade = _is_grade(cell)
            kept = []
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    frames = "\n".join(ANSI.sub("", t) for t in out.get("traceback", []))
                    # frames through the grading package (course_runtime: its modules inside the seal)
                    if (
                        grade
                        or "grader" in frames
                        or "course_runtime" in frames
                        or any(h in frames for h in hidden)
                    ):
                        out["traceback"] = [f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"]
                text = json.dumps(out)
                if any(h in text for h in hidden if len(h) > 6) and out.get("output_type") != "error":
                    continue  # output that repeats hidden test code
                kept.append(out)
            cell.outputs = kept
        return escape_student_content(nb, resources), resources


# ------------------------------------------------------------------ what the student wrote

SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@functools.cache
def _release_cells(path: str, mtime: float, answers: bool) -> dict[str, dict]:
    try:
        nb = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    if not answers:  # an instructor notebook: its model answers are no release text
        nb = {
            "cells": [
                c
                for c in nb.get("cells", [])
                if not c.get("metadata", {}).get("nbgrader", {}).get("solution")
            ]
        }
    return escape.release_cells(nb)


def release_text(lesson_id: str, notebook: str | None = None) -> dict[str, dict]:
    """The Markdown and raw cells students were given for ``lesson_id`` (source -> attachments):
    the release in notebooks/, and the instructor's text cells in solutions/ (no model answers)."""
    found: dict[str, dict] = {}
    name = notebook or lesson_id
    if not SAFE_NAME.fullmatch(str(lesson_id)) or not SAFE_NAME.fullmatch(str(name)):
        return found
    for folder, answers in (("notebooks", True), ("solutions", False)):
        path = course.ROOT / folder / lesson_id / f"{name}.ipynb"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        for source, attachments in _release_cells(str(path), mtime, answers).items():
            found.setdefault(source, attachments)
    return found


def _lesson_of(resources: dict) -> tuple[str | None, str | None]:
    """(lesson, notebook) of a conversion: nbgrader's converters and the formgrader say it differently."""
    nbg = resources.get("nbgrader") or {}
    lesson_id = nbg.get("assignment") or resources.get("assignment_id")
    notebook = nbg.get("notebook") or resources.get("notebook_id")
    return lesson_id, notebook


def escape_student_content(nb: Any, resources: dict) -> Any:
    """``nb`` with nothing from the student left to run as HTML or script (``escape.sanitise_notebook``):
    outputs as text and images, the student's Markdown as literal text, the release's kept."""
    lesson_id, notebook = _lesson_of(resources)
    release = release_text(lesson_id, notebook) if lesson_id else {}
    return escape.sanitise_notebook(nb, release)


class EscapeStudentContent(NbGraderPreprocessor):
    """Escape everything the student wrote before a notebook becomes HTML (feedback or formgrader)."""

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        return escape_student_content(nb, resources), resources


def _first_lines(message: str, named: str | None = None, recorded: bool = False) -> tuple[str, str | None]:
    """(what differs, diagnosis) from a check's message. The message holds the student's own error text
    too, so the diagnosis is only the check's own last line, and only where it names the mistake the
    grading recorded (``named``), or without a record, one of the course's."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    diagnosis = lines[-1][len("Diagnosis: ") :] if lines and lines[-1].startswith("Diagnosis: ") else None
    if diagnosis and not (
        bool(named) and diagnosis.startswith(f"{named}. ") or not recorded and diagnosis in _mistakes()
    ):
        diagnosis = None
    what = next((ln[len("What differs: ") :] for ln in lines if ln.startswith("What differs: ")), None)
    if what is None:
        what = lines[0] if lines else ""
    return what, diagnosis


@functools.cache
def _mistakes() -> frozenset[str]:
    """Every diagnosis a check writes: each named mistake of every exercise, with its hint."""
    from grader import registry

    return frozenset(f"{t.name}. {t.hint}" for ex in registry.exercises().values() for t in ex.traps)


def _record(resources: dict) -> dict:
    nbg = resources.get("nbgrader", {})
    path = (
        course.work_dir()
        / "classroom"
        / "results"
        / str(nbg.get("assignment"))
        / f"{nbg.get('student')}.json"
    )
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class ResultsSummary(NbGraderPreprocessor):
    """A table at the top of the feedback: every check, its points, and what to fix."""

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        rows = []
        earned = total = 0.0
        record = _record(resources)
        tool = {c.get("grade_id"): c.get("score") for c in record.get("cells", [])}
        named = {c.get("grade_id"): c.get("diagnosis") for c in record.get("cells", [])}
        for cell in nb.cells:
            if not _is_grade(cell):
                continue
            meta = cell.metadata["nbgrader"]
            points = float(meta.get("points", 0) or 0)
            score = meta.get("score")
            score = float(score) if score is not None else 0.0
            earned += score
            total += points
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            pts = f"{score:g} / {points:g}"
            by_hand = tool.get(meta["grade_id"]) not in (None, score)  # the gradebook's: the instructor's
            if by_hand:
                pts += " (set by your instructor)"
            if score >= points and (by_hand or not errors):
                rows.append((meta["grade_id"], pts, "passed", ""))
                continue
            if by_hand and not errors:  # the code passed; the instructor's comment, if any, is in the cell
                rows.append((meta["grade_id"], pts, "not yet", ""))
                continue
            message = f"{errors[0].get('ename', '')}: {errors[0].get('evalue', '')}" if errors else "failed"
            what, diagnosis = _first_lines(
                str(errors[0].get("evalue", "")) if errors else "", named.get(meta["grade_id"]), bool(named)
            )
            if not what:
                what = message
            # the message (and so the diagnosis) is text the student's code can choose
            fix = escape.md_html(what)
            if diagnosis:
                fix += f"<br><b>Diagnosis:</b> {escape.md_html(diagnosis)}"
            rows.append((meta["grade_id"], pts, "not yet", fix))
        if not rows:
            return nb, resources
        status = record.get("status")
        lines = [f"## Your results: {earned:g} / {total:g} points", ""]
        penalty = float(resources.get("nbgrader", {}).get("late_penalty") or 0)
        if penalty:
            lines += [
                f"**Late penalty:** {penalty:g} points off, for a score of {max(0.0, earned - penalty):g}.",
                "",
            ]
        if status in STATUS_NOTES:
            lines += [f"**Note:** {STATUS_NOTES[status]}", ""]
        lines += ["| check | points | result | what to fix |", "|---|---|---|---|"]
        for gid, pts, result, fix in rows:
            lines.append(
                f"| {escape.md_html_code(gid)} | {pts} | {result} | {fix.replace('|', '&#124;').replace(chr(10), ' ')} |"
            )
        lines += ["", "Each check's full message is in the notebook below, under its cell."]
        summary = NotebookNode(cell_type="markdown", metadata={}, source="\n".join(lines))
        if "id" in (nb.cells[0] if nb.cells else {}):
            summary["id"] = "classroom-results-summary"
        nb.cells.insert(0, summary)
        return nb, resources


# ------------------------------------------------------------------ leaks


def page_text(page: str) -> str:
    """What a reader sees in an HTML page: no scripts or styles, tags removed, entities decoded."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S | re.I)
    page = re.sub(r"<[^>]+>", "", page)
    return html.unescape(page)


def leaks(page: str, lesson_id: str, student_code: str = "") -> list[str]:
    """Hidden-test lines (and markers) visible in a feedback page, except those the student wrote."""
    text = page_text(page)
    found = []
    for marker in ("BEGIN HIDDEN", "END HIDDEN", "grader.check"):
        if marker in text and marker not in student_code:
            found.append(marker)
    les = lessons.lesson(lesson_id)
    visible = set()
    for c in les.tests:
        visible.update(ln.strip() for ln in lessons.HIDDEN_BLOCK.sub("", c.source).splitlines())
    text_lines = {ln.strip() for ln in text.splitlines()}
    for line in les.hidden_lines():
        if line in visible or line in student_code:
            continue
        if line in text_lines or (len(line) > 12 and line in text):
            found.append(line)
    return found


def student_code(lesson_id: str, student: str) -> str:
    """Every code cell the student handed in (their own lines may repeat a hidden one)."""
    path = course.submission_path(lesson_id, student)
    try:
        nb = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    out = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code" and not cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
            src = cell.get("source", "")
            out.append("".join(src) if isinstance(src, list) else src)
    return "\n".join(out)


# ------------------------------------------------------------------ what nbgrader's exchange reads

EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")
SMALL = 4096  # bytes: a timestamp or an exchange secret is far shorter


def _read_small(path: Path) -> str | None:
    """A short text file's content, read without following a link (None: absent, a link, too long)."""
    from grader.classroom.jobs import read_regular

    try:
        return read_regular(path, SMALL).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _handed_in(lesson_id: str, student: str) -> str:
    """When a submission was handed in, as nbgrader writes it: its ``timestamp.txt`` (the exchange's
    or collect's), else the time the notebook was placed."""
    submitted = course.submission_path(lesson_id, student)
    text = _read_small(submitted.parent / "timestamp.txt")
    if text:
        return text
    try:
        placed = datetime.datetime.fromtimestamp(submitted.stat().st_mtime, datetime.UTC)
    except OSError:
        placed = datetime.datetime.now(datetime.UTC)
    return placed.strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def _secret_of(lesson_id: str, student: str) -> str:
    """The submission's exchange secret: the one ``nbgrader submit`` wrote (kept beside the notebook
    by ``nbgrader collect``), else one drawn from the course secret, the same at every regeneration."""
    text = _read_small(course.submission_path(lesson_id, student).parent / "submission_secret.txt")
    if text and re.fullmatch(r"[0-9A-Za-z]{16,512}", text):
        return text
    message = "\0".join(["feedback", lesson_id, student]).encode("utf-8", "surrogatepass")
    return hmac.new(course.secret(), message, hashlib.sha256).hexdigest()


def exchange_files(lesson_id: str, student: str) -> list[str]:
    """Give a feedback folder the files ``nbgrader release_feedback`` reads beside each page.

    ``release_feedback`` opens ``timestamp.txt`` and ``submission_secret.txt`` in every feedback
    folder and stops at the first one without them, so one submission placed by hand (or graded by
    the tool, which keeps no secret in its autograded folders) stopped the release for the rest of
    the class. A missing timestamp is the submission's own (see ``_handed_in``); a missing secret
    is the one the student's ``nbgrader submit`` made, so ``nbgrader fetch_feedback`` finds the page,
    else a stable one of the course's. Returns the files written.
    """
    folder = feedback_path(lesson_id, student).parent
    if not SAFE_NAME.fullmatch(lesson_id) or not SAFE_NAME.fullmatch(student) or not folder.is_dir():
        return []
    written = []
    for name, make in zip(EXCHANGE_FILES, (_handed_in, _secret_of)):
        path = folder / name
        if os.path.lexists(path) and _read_small(path):
            continue
        if os.path.lexists(path):
            path.unlink()
        path.write_text(make(lesson_id, student))
        written.append(name)
    return written


def after_feedback(
    assignment: str = "", student: str = "", notebooks: list[str] | None = None, **_: Any
) -> None:
    """nbgrader's ``GenerateFeedback.post_convert_hook`` (nbgrader_config.py): once a submission's
    pages are written, its feedback folder gets what ``nbgrader release_feedback`` reads. nbgrader
    passes the autograded notebooks (``<autograded>/<student>/<lesson>/<notebook>.ipynb``); its
    ``student`` may be a pattern, so the student and lesson are read from those paths."""
    done = set()
    for nb in notebooks or []:
        folder = Path(nb).parent
        key = (folder.name, folder.parent.name)
        if key not in done:
            done.add(key)
            exchange_files(*key)


# ------------------------------------------------------------------ generating


def feedback_path(lesson_id: str, student: str) -> Path:
    return course.work_dir() / "feedback" / student / lesson_id / f"{lesson_id}.html"


def feedback_job(item: tuple[str, str]) -> dict:
    """Generate one student's feedback for one lesson with nbgrader; check it for leaks."""
    lesson_id, student = item
    try:
        course.ensure_tools_on_path()
        result = course.api().generate_feedback(lesson_id, student, force=True)
        if not result["success"] or not feedback_path(lesson_id, student).exists():
            return {"lesson": lesson_id, "student": student, "error": (result.get("log") or "")[-2000:]}
        return _checked_page(lesson_id, student)
    except Exception as e:  # noqa: BLE001 - one page never stops the rest
        return {"lesson": lesson_id, "student": student, "error": f"{type(e).__name__}: {e}"}


def _checked_page(lesson_id: str, student: str) -> dict:
    """A page just written, checked for hidden test code (deleted if it shows any)."""
    path = feedback_path(lesson_id, student)
    if not path.exists():
        return {"lesson": lesson_id, "student": student, "error": "nbgrader wrote no page"}
    found = leaks(path.read_text(), lesson_id, student_code(lesson_id, student))
    if found:
        path.unlink()
        return {
            "lesson": lesson_id,
            "student": student,
            "error": f"hidden test code in the page: {found[:3]}",
        }
    exchange_files(lesson_id, student)  # if nbgrader's hook did not run (it logs its errors only)
    return {"lesson": lesson_id, "student": student, "path": str(path)}


def feedback_batch(item: tuple[str, tuple[str, ...], tuple[str, ...]]) -> list[dict]:
    """Pages for ``students`` of one lesson in one nbgrader run (one exporter for all of them), each
    checked for leaks; ``others`` are the lesson's other graded students, left out of the run.

    If the run fails, every page is made on its own, so a page that cannot be made names itself.
    """
    lesson_id, students, others = item
    if len(students) > 1:
        try:
            course.ensure_tools_on_path()
            nbapi = course.api()
            nbapi.coursedir.student_id_exclude = ",".join(others)
            if nbapi.generate_feedback(lesson_id, "*", force=True)["success"]:
                return [_checked_page(lesson_id, student) for student in students]
        except Exception:  # noqa: BLE001 - made one by one below, each with its own error
            pass
    return [feedback_job((lesson_id, student)) for student in students]


def _batches(pairs: list[tuple[str, str]], workers: int, most: int = 8) -> list[tuple[str, tuple, tuple]]:
    """``pairs`` as feedback_batch items: per lesson, chunks of at most ``most`` students, enough
    chunks to keep ``workers`` busy."""
    by_lesson: dict[str, list[str]] = {}
    for lesson_id, student in pairs:
        by_lesson.setdefault(lesson_id, []).append(student)
    items = []
    root = course.work_dir() / "autograded"
    for lesson_id, students in by_lesson.items():
        graded = {nb.parent.parent.name for nb in root.glob(f"*/{lesson_id}/{lesson_id}.ipynb")}
        size = max(1, min(most, -(-len(pairs) // workers), len(students)))
        for i in range(0, len(students), size):
            chunk = tuple(students[i : i + size])
            items.append((lesson_id, chunk, tuple(sorted(graded - set(chunk)))))
    return items


def graded_pairs(
    only_lessons: list[str] | None = None, only_students: list[str] | None = None
) -> list[tuple[str, str]]:
    pairs = []
    root = course.work_dir() / "autograded"
    for lesson_id in only_lessons or course.lessons():
        for nb in sorted(root.glob(f"*/{lesson_id}/{lesson_id}.ipynb")):
            student = nb.parent.parent.name
            if only_students and student not in only_students:
                continue
            pairs.append((lesson_id, student))
    return pairs


def generate(
    only_lessons: list[str] | None = None,
    only_students: list[str] | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> list[dict]:
    """Feedback for every autograded submission; returns one dict per page (path or error)."""
    from grader.classroom import executors
    from grader.classroom.progress import Progress

    pairs = graded_pairs(only_lessons, only_students)
    if not pairs:
        return []
    bar = Progress(len(pairs), "pages") if progress else None
    results = []
    n = 1 if workers == 1 or len(pairs) < 4 else min(workers or executors.default_workers(), len(pairs))
    items = _batches(pairs, n)
    if n == 1:
        stream = ((item, feedback_batch(item)) for item in items)
        ex = None
    else:
        ex = executors.LocalExecutor(n)
        stream = ex.run(feedback_batch, items)
    try:
        for item, pages in stream:
            if isinstance(pages, BaseException):
                pages = [{"lesson": item[0], "student": s, "error": repr(pages)} for s in item[1]]
            for res in pages:
                results.append(res)
                if bar:
                    bar.update(f"{res['student']}/{res['lesson']}", problem="error" in res)
    finally:
        if ex is not None:
            ex.close()
        if bar:
            bar.close()
    return results
