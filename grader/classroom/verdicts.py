"""The trusted verdicts in the graded notebook, and the notebook made safe to read.

``ApplyVerdicts`` (after nbgrader's Execute, before SaveAutoGrades) makes every test cell's outputs
say the trusted verdict and nothing else nbgrader would score, and ends the notebook with how its
code ran; before that, nothing the student started is left, and the folder nbgrader writes into is
one no student process could reach (``_after_student_code``, ``read_regular``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

from grader import course
from grader.classroom import lessons, seal
from grader.classroom.context import _CONTEXT, CouldNotGrade, _error_output, _grade_cells, run_status
from grader.classroom.independent import _finish_checks
from grader.classroom.jobs import CellResult, one_line
from grader.classroom.lifecycle import _end_notebook, stop_student_code
from grader.classroom.trees import remove_tree


class ApplyVerdicts(NbGraderPreprocessor):
    """Make every test cell's outputs say the trusted verdict; flag kernel passes it failed."""

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        if not _CONTEXT:  # not a lesson: only what no verdict may depend on
            for cell in _grade_cells(nb):
                cell.outputs = _stderr_as_note(cell.get("outputs", []))
            return nb, resources
        try:
            _after_student_code(resources)
            # stopped for the files it wrote (its code ran, in the sandbox at least): graded as it is
            written = (_CONTEXT.get("stop") or ("",))[0] == "DiskLimit"
            reason = None if written else _failed_before_student_code(nb, _CONTEXT["lesson"])
            if reason is not None:
                _CONTEXT["could_not_grade"] = reason
                self.log.error(
                    "Could not be graded: %s/%s: %s", _CONTEXT.get("student"), _CONTEXT["lesson"].id, reason
                )
                raise CouldNotGrade(reason)
            self._apply(nb)
            _say_isolation(nb, _CONTEXT.get("isolation") or "?")
        finally:
            if _CONTEXT.get("plain"):
                ctx = _CONTEXT
                who = f"{ctx['student']}/{ctx['lesson'].id}"
                isolation = ctx.get("isolation") or "?"
                if isolation == seal.SEALED:
                    self.log.info("Isolation: %s: sealed", who)
                else:
                    self.log.warning(
                        "Isolation: %s: %s", who, isolation.replace(seal.NOT_SEALED, "NOT SEALED", 1)
                    )
                for flag in ctx["flags"]:
                    self.log.warning("Flagged for review: %s: %s", who, one_line(flag))
                for note in ctx["notes"]:
                    self.log.info("%s: %s", who, one_line(note))
                _end_notebook()
        return nb, resources

    def _apply(self, nb: Any) -> None:
        from nbgrader.utils import determine_grade

        ctx = _CONTEXT
        started = ctx["phases"].pop("kernel start", None)
        if started is not None:
            ctx["phases"]["notebook run"] = round(time.perf_counter() - started, 3)
        ctx["run"] = run_status(nb)
        trusted = ctx.get("trusted")
        verdicts = (trusted or {}).get("verdicts", {})
        lesson: lessons.Lesson = ctx["lesson"]
        for cell in _grade_cells(nb):
            gid = cell.metadata["nbgrader"]["grade_id"]
            points = float(cell.metadata["nbgrader"].get("points", 0) or 0)
            kernel_error = _first_error(cell)
            outputs = _stderr_as_note(cell.get("outputs", []))  # a warning fails nothing, nor in the kernel
            try:  # a number above the cell's points that the notebook shows is no score of the kernel's
                kernel_score = determine_grade(NotebookNode({**cell, "outputs": outputs}), self.log)[0]
            except ValueError:
                kernel_score = None
            kernel_passed = kernel_score is not None and kernel_score >= points
            verdict = verdicts.get(gid)
            # why the trusted side ended the sandbox, never the failure's message: that holds the student's text
            stop, gone = ctx.get("stop"), str((verdict or {}).get("gone") or "")
            # a check cut short by the grader's stop: its process ended, or all the checks' time ran out
            cut = any(w in gone for w in ("ended its process", "all the checks of this notebook"))
            if stop and (verdict is None or (not verdict["passed"] and cut)):
                verdict = dict(passed=False, ename=stop[0], message="not run: " + stop[1], stopped=True)
            if verdict is None:
                if trusted is None:
                    reason = "this check could not be run outside the notebook (time limit)"
                    ctx["not_verified"] = True
                else:
                    reason = "this check did not run outside the notebook"
                verdict = {"passed": False, "ename": "NotVerified", "message": reason}
            if verdict["passed"] is None:
                # cannot be decided outside the notebook (inputs of the lesson's own that cannot leave this
                # process; never a value of the student's): the kernel's verdict stands, for a person to review
                ctx["flags"].append(f"{gid}: checked in the notebook only ({verdict.get('message', '')})")
                cell.outputs = outputs
                ctx["cells"].append(
                    CellResult(gid, lesson.exercise_of(gid), points, 0.0, kernel_passed, None)
                )
                continue
            result = CellResult(
                grade_id=gid,
                exercise=lesson.exercise_of(gid),
                points=points,
                score=0.0,
                kernel_passed=kernel_passed,
                trusted_passed=bool(verdict["passed"]),
                message="" if verdict["passed"] else verdict.get("message", ""),
                diagnosis=verdict.get("diagnosis"),
            )
            kept = [o for o in outputs if o.get("output_type") != "error" and not _is_score(o)]
            if verdict["passed"]:
                if kernel_error is not None:
                    ename, evalue = kernel_error
                    ctx["notes"].append(
                        f"{gid}: failed in the notebook ({ename}), passed the independent check"
                    )
                    kept.append(
                        _stream_note(
                            f"Note: in the notebook this check raised {ename}: {evalue}\n"
                            "It passed when checked outside the notebook, so it keeps its points."
                        )
                    )
                cell.outputs = kept
            else:
                if kernel_passed and verdict.get("ename") != "NotVerified" and not verdict.get("hidden"):
                    if verdict.get("stopped") or any(w in gone for w in _COULD_NOT_FINISH):
                        ctx["notes"].append(
                            f"{gid}: passed in the notebook, but the check outside it could not finish"
                        )
                    else:  # an honest in-place bug as well (graded, the kernel does not look): it says which
                        why = ", its inputs changed in place" if verdict.get("in_place") else ""
                        ctx["flags"].append(
                            f"{gid}: passed in the notebook, failed the independent check" + why
                        )
                ename = verdict.get("ename") or "AssertionError"
                cell.outputs = kept + [_error_output(ename, result.message or ename)]
            ctx["cells"].append(result)


_COULD_NOT_FINISH = ("did not finish", "ended its process")

ISOLATION_MARK = "\n\n---\n"  # what sets the line on how the notebook's code ran apart from the title


def _say_isolation(nb: Any, isolation: str) -> None:
    """Say, last in the graded notebook's title cell, how its code ran: the formgrader's view of the
    submission and the feedback show it first, to whoever reads the grade. Whatever the student
    wrote in that cell stays above it (a notebook with no title cell says it in its metadata)."""
    if isolation == seal.SEALED:
        text = (
            "**Graded sealed.** The code of this notebook ran in a boundary of its own, and every "
            "check's verdict came from a process outside it."
        )
    else:
        why = isolation.split(":", 1)[1].strip() if ":" in isolation else isolation
        text = (
            f"**Graded NOT SEALED** ({why}). The code of this notebook ran under the in-process "
            "guard only: grade it again where bubblewrap works before relying on this score."
        )
    nb.metadata.setdefault("attention_course", {})["isolation"] = isolation
    if nb.cells and nb.cells[0].cell_type == "markdown":
        nb.cells[0].source = nb.cells[0].source.rstrip() + ISOLATION_MARK + text


def _failed_before_student_code(nb: Any, lesson: lessons.Lesson) -> str | None:
    """Why the lesson's own cells above the student's first cell failed, or None if they did not.

    Only the lesson's leading code cells count, all of them, in the lesson's order and as the lesson
    has them: a notebook whose cells up to the failure differ from those (a cell removed, moved,
    edited or added) is graded as it is, since the failure may then be the student's doing."""
    leading = []
    for c in lesson.cells:
        if c.kind != "context":
            break
        leading.append(c.source.strip())
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    for i, cell in enumerate(code[: len(leading)]):
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") or meta.get("grade") or cell.source.strip() != leading[i]:
            return None
        error = _first_error(cell)
        if error is not None:
            ename, evalue = error
            what = f"cell {meta['grade_id']}" if meta.get("grade_id") else "setup cell"
            return (
                f"the lesson's own {what} failed before any of the student's code ran "
                f"({one_line(ename)}: {one_line(evalue.strip()[:300])}); nothing of the submission was checked"
            )
    return None


def _first_error(cell: Any) -> tuple[str, str] | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return str(out.get("ename", "")), str(out.get("evalue", ""))
    return None


def _is_score(output: Any) -> bool:
    """An execute_result that nbgrader would read as partial credit."""
    if output.get("output_type") != "execute_result":
        return False
    try:
        float(output.get("data", {}).get("text/plain", ""))
    except (TypeError, ValueError):
        return False
    return True


STDERR_NOTE = "Note: your code wrote this to stderr (it does not affect the grade):"
NOTE_LINES = 20
NOTE_BYTES = 2048


def _stream_note(text: str) -> NotebookNode:
    return NotebookNode(
        output_type="stream", name="stdout", text=text if text.endswith("\n") else text + "\n"
    )


def _stderr_as_note(outputs: list) -> list:
    """The outputs with everything written to stderr turned into one short stdout note, where it began."""
    stderr = [
        i for i, o in enumerate(outputs) if o.get("output_type") == "stream" and o.get("name") == "stderr"
    ]
    if not stderr:
        return list(outputs)
    texts = [outputs[i].get("text", "") for i in stderr]
    lines = "".join("".join(t) if isinstance(t, list) else str(t) for t in texts).splitlines()
    shown: list[str] = []
    size = 0
    for line in lines[:NOTE_LINES]:
        if size + len(line) + 1 > NOTE_BYTES:
            line = line[: max(0, NOTE_BYTES - size)]
            if line:
                shown.append(line + " ...")
            break
        shown.append(line)
        size += len(line) + 1
    more = len(lines) - len(shown)
    text = "\n".join([STDERR_NOTE, *shown] + ([f"... ({more} more lines)"] if more > 0 else []))
    rest = [o for i, o in enumerate(outputs) if i not in stderr]
    return rest[: stderr[0]] + [_stream_note(text)] + rest[stderr[0] :]


# ------------------------------------------------------------------ after the student's code


def _after_student_code(resources: dict) -> None:
    """Once the notebook has run, before nbgrader writes anything: its checks done (a kernel that ended before
    its first cell did not wait for them), then nothing the student started left (its kernel, and sealed, its
    whole namespace), and the folder nbgrader writes the graded notebook into one no student process could
    reach or replace.

    A job's autograded folder was the sealed kernel's working folder (reached through a link into the seal's
    area): it is replaced by a new folder outside the seal holding only what nbgrader put there, taken from
    trusted copies (the timestamp of the job, the lesson's own files from ``solutions/``). Where the kernel
    worked in nbgrader's own folder (not sealed), every link and special file it made there is removed.
    """
    _finish_checks()
    stop_student_code()
    folder = Path((resources.get("metadata") or {}).get("path") or "")
    if not folder.name:
        return
    if _CONTEXT.get("job"):
        _fresh_autograded(folder)
    elif _CONTEXT.get("isolation") != seal.SEALED:
        _drop_links(folder)


def _fresh_autograded(folder: Path) -> None:
    """Replace a job's autograded folder by a new real one with only nbgrader's own files in it."""
    lesson = _CONTEXT["lesson"].id
    student_side = folder.parent
    kept: dict[str, bytes] = {}
    timestamp = _CONTEXT.get("timestamp")
    if timestamp:
        kept["timestamp.txt"] = timestamp.encode()
    source_dir = course.ROOT / "solutions" / lesson
    for path in source_dir.rglob("*") if source_dir.is_dir() else []:
        rel = path.relative_to(source_dir)
        if path.is_file() and path.suffix != ".ipynb" and os.path.lexists(folder / rel):
            kept[str(rel)] = path.read_bytes()
    fresh = student_side.parent / f".{student_side.name}.graded"
    remove_tree(fresh)
    for rel, data in kept.items():
        target = fresh / folder.name / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (fresh / folder.name).mkdir(parents=True, exist_ok=True)
    if student_side.is_symlink() or not student_side.is_dir():
        student_side.unlink()
    else:
        remove_tree(student_side)
    os.rename(fresh, student_side)


def _drop_links(folder: Path) -> None:
    """Remove every link and special file below ``folder`` (links are not followed)."""
    for top, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            path = Path(top) / name
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                with contextlib.suppress(OSError):
                    path.unlink()
