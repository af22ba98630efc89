"""Autograde one submission with real nbgrader, safely: the unit of work of a grading run.

``grade_job(job)`` is a pure function of its input (the submitted bytes, a gradebook template, the
options), so any executor (a local process pool or a Dask cluster) can run it. It builds a private,
throw-away nbgrader course for the one submission (its own gradebook copy, so a student's code
cannot reach the real one) and runs nbgrader's ``Autograde`` converter with the preprocessors the
course's ``nbgrader_config.py`` names, so plain ``nbgrader autograde`` and the formgrader grade the
same way (``docs/ARCHITECTURE.md``, one grading run):

- ``IndependentChecks`` (before Execute): the tamper scan, then the trusted decision of every test
  cell (``trusted`` + the sandbox), started before the kernel so nothing it writes reaches them;
- ``GuardedExecute`` (nbgrader's Execute): kernels forked from the fork server, hidden test blocks
  left out (they run only on the trusted side); a dead kernel or a runaway notebook ends with
  outputs that say so, not a crash;
- ``ApplyVerdicts`` (``verdicts``): every test cell's outputs say the trusted verdict and nothing
  else nbgrader would score (what it wrote to stderr becomes a note; a pass in the kernel that the
  trusted side failed is flagged).

A job takes a head start (``_start_early``): the checks start on the cells as restoring will leave
them, and the kernel starts, before nbgrader prepares the notebook; ``IndependentChecks`` starts
the checks again if the cells nbgrader runs differ, so a verdict is always about what ran. The
result carries the final notebook; the coordinator writes it into the course.

This module holds the job and the first two preprocessors; beside it: ``context`` (a notebook's
shared state), ``independent`` (the checks' lifecycle), ``lifecycle`` (its folders and kernels),
``verdicts`` (``ApplyVerdicts``, the graded notebook made safe to read).
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grader import course
from grader.classroom import grades, kernels, lessons, tamper_scan
from grader.classroom.context import (
    _CONTEXT,
    CouldNotGrade,
    _digest,
    _error_output,
    _grade_cells,
    worst,
)
from grader.classroom.executors import RUN_AREA
from grader.classroom.independent import (
    _checks_job,
    _discard_checks,
    _finish_checks,
    _start_checks,
)
from grader.classroom.jobs import (  # noqa: F401 - re-exported
    CellResult,
    Job,
    JobResult,
    Options,
    default_protected,
    digest_of,
    read_regular,
)
from grader.classroom.lifecycle import _begin_notebook, _start_early, begin, end, stop_student_code
from grader.classroom.trees import remove_tree

# nbgrader's gradebook code makes SQLAlchemy warn about its autoflush on every submission: noise
warnings.filterwarnings("ignore", message=".*not in session.*")


# ------------------------------------------------------------------ preprocessors

from nbformat import NotebookNode  # noqa: E402
from nbgrader.preprocessors import Execute, NbGraderPreprocessor  # noqa: E402
from traitlets import Bool  # noqa: E402

from grader.classroom.cells import MAX_OUTPUT, _size  # noqa: E402


def _is_test_cell(cell: Any) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


class IndependentChecks(NbGraderPreprocessor):
    """Decide every test cell outside the kernel (see grader.classroom.trusted)."""

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        try:
            begun = bool(_CONTEXT.get("job")) or _begin_notebook(resources, self.config)
        except CouldNotGrade as e:
            self.log.error("Could not be graded: %s", e)
            raise
        if not begun:
            self.log.warning("Not a lesson of this course: graded by the notebook alone")
            return nb, resources
        ctx = _CONTEXT
        job = _checks_job(nb)
        ctx["flags"] += [
            s
            for s in tamper_scan.scan([c["source"] for c in job["student_cells"] if c["kind"] == "other"])
            if s not in ctx["flags"]
        ]
        if ctx.get("checks") is not None and ctx.get("checks_job") == job:
            return nb, resources  # started before nbgrader prepared the notebook, on these very cells
        if ctx.get("checks") is not None:  # started on cells that nbgrader's repairs then changed
            _discard_checks()
            ctx["phases"]["checks started again"] = 1
        _start_checks(ctx, job)
        return nb, resources


# kernel messages whose size the kernel chooses (what a cell prints, shows or raises, widget messages)
_BULKY = frozenset("display_data execute_result stream update_display_data comm_open comm_msg error".split())
CUT = " and more not shown; a cell keeps at most "


def _bulk(x: Any) -> int:
    """About the memory a parsed kernel message takes: its strings, and 64 bytes an item."""
    n, todo = 0, [x]
    while todo:
        x = todo.pop()
        n += 64 + (len(x) if isinstance(x, str | bytes | memoryview) else 0)
        if isinstance(x, dict):
            todo += [*x, *x.values()]
        elif isinstance(x, list | tuple):
            todo += x
    return n


class GuardedExecute(Execute):
    """nbgrader's Execute, with guarded kernels; a dead kernel ends the notebook, not the class."""

    # the kernel's widget state, which a kernel can make any size, is not collected (nor kept: CapOutputs)
    store_widget_state = Bool(False).tag(config=True)

    # output a notebook may send that this worker keeps, counted as parsed (64 bytes an item and each string;
    # no limit of the notebook's covers this process): the rest is dropped as it comes, with a note in the
    # cell (the feedback shows far less of it: CapOutputs). A message is at most kernels.MESSAGE_BYTES.
    NOTEBOOK_OUTPUT = 32 << 20

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs["kernel_manager_class"] = kernels.GuardedKernelManager
        super().__init__(*args, **kwargs)
        self._current, self._sent = -1, 0

    def process_message(self, msg: dict, cell: Any, cell_index: int) -> Any:
        if msg["msg_type"] in _BULKY:
            self._sent += _bulk([msg["content"], msg.get("metadata"), msg.get("buffers")])
            if self._sent > self.NOTEBOOK_OUTPUT:
                if not any(o.get("name") == "stdout" and CUT in str(o.get("text")) for o in cell.outputs):
                    text = f"\n[output cut: {_size(self._sent)} and more not shown; a cell keeps at most {_size(MAX_OUTPUT)}]\n"
                    cell.outputs.append(NotebookNode(output_type="stream", name="stdout", text=text))
                if msg["msg_type"] != "error" or any(o.get("output_type") == "error" for o in cell.outputs):
                    return None
                c = msg["content"]  # the cell's first error is kept (it fails the cell), cut short
                c["evalue"], c["traceback"] = (
                    str(c.get("evalue", ""))[:4096],
                    [str(t)[:4096] for t in c.get("traceback", [])[:40]],
                )
        return super().process_message(msg, cell, cell_index)

    def preprocess_cell(self, cell: Any, resources: Any, index: int) -> Any:
        self._current = index
        if getattr(self.kc, "tampered", None):
            raise kernels.KernelTampered(self.kc.tampered)
        _finish_checks()  # the kernel is ready: wait for the checks (if still running), whose sandbox then goes
        if not (_CONTEXT and _is_test_cell(cell) and lessons.HIDDEN_BLOCK.search(cell.source)):
            return super().preprocess_cell(cell, resources, index)
        # hidden checks run only on the trusted side: the kernel runs what students see
        source = cell.source
        cell.source = _student_view(source)
        try:
            return super().preprocess_cell(cell, resources, index)
        finally:
            cell.source = source

    def preprocess(self, nb: Any, resources: Any = None, km: Any = None) -> Any:
        self._current, self._sent = -1, 0
        if _CONTEXT:
            _CONTEXT["phases"]["kernel start"] = time.perf_counter()
        early = _CONTEXT.pop("kernel", None) if _CONTEXT else None
        if km is None and early is not None:
            wanted = (nb.metadata.get("kernelspec") or {}).get("name") or self.kernel_name
            if early.kernel_name == wanted:
                km = early
            else:
                _CONTEXT["kernel"] = early  # another kind than the notebook asks for: stopped after
        try:
            return super().preprocess(nb, resources, km)
        except Exception as e:  # noqa: BLE001 - the kernel or the notebook ran out of road
            return self._ran_out(nb, resources, e)

    @contextmanager
    def setup_kernel(self, **kwargs: Any) -> Iterator[None]:
        # a kernel started early is stopped after the run like one nbclient starts itself
        kwargs.setdefault("cleanup_kc", True)
        with super().setup_kernel(**kwargs):
            yield

    def _ran_out(self, nb: Any, resources: Any, e: Exception) -> Any:
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        if _CONTEXT.get("stop"):  # the grader stopped the notebook (``lifecycle``)
            ename, why = _CONTEXT["stop"]
        elif isinstance(e, CellTimeoutError):
            ename, why = "CellTimeoutError", "the cell ran past its time limit"
        elif isinstance(e, DeadKernelError) or "died" in str(e).lower():
            why = "the kernel died while running this cell (os._exit, exit(), a crash, or the memory limit)"
            ename = "KernelDied"
        else:
            ename, why = "KernelDied", f"the kernel stopped: {type(e).__name__}: {e}"
        if isinstance(e, kernels.KernelTampered) and _CONTEXT:
            _CONTEXT["flags"].append(f"tampered with the kernel as it started: {e}")
        self._mark_rest(nb, ename, why)
        return nb, resources

    def _mark_rest(self, nb: Any, ename: str, why: str) -> None:
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or i < self._current:
                continue
            if i == max(self._current, 0):
                cell.outputs = list(cell.get("outputs", [])) + [_error_output(ename, why)]
            elif cell.metadata.get("nbgrader", {}).get("grade"):
                cell.outputs = [
                    _error_output(ename, "not run: " + why.replace("this cell", "an earlier cell"))
                ]


# ------------------------------------------------------------------ the job


def _as_restored(nb: Any, lesson: lessons.Lesson) -> Any:
    """A repaired submission (``cells.repair``) with its test and locked cells' sources as nbgrader's
    OverwriteCells puts them back from the gradebook: what the kernel will be given, in all but
    rare cases (a deleted test cell is put back only by nbgrader); ``IndependentChecks`` compares."""
    release = {c.name: c for c in lesson.release}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader")
        rel = release.get(meta.get("grade_id")) if isinstance(meta, dict) else None
        if rel is not None and (rel.locked or rel.is_test) and rel.cell_type == cell.cell_type:
            cell.source = rel.source
    return nb


def _course_config(root: Path, lesson_id: str, options: Options, gradebook: Path) -> Any:
    cfg = grades.course_config()
    cd = cfg.CourseDirectory
    cd.root = str(root / "course")
    cd.source_directory = str(course.ROOT / "solutions")
    cd.submitted_directory = "submitted"
    cd.autograded_directory = "autograded"
    # its one notebook by name: nbgrader then keeps the autograded folder that the kernel started
    # early works in (with "*" and --force it deletes the folder first)
    cd.notebook_id = lesson_id
    cd.db_url = "sqlite:///" + str(gradebook)
    cfg.NbGrader.logfile = ""
    cfg.Execute.timeout = options.timeout
    # every output has come when the last cell has replied: the kernel is stopped, not asked to stop
    # and waited for (it and whatever it started are killed right after in any case)
    cfg.Execute.shutdown_kernel = "immediate"
    # the notebook is validated once after nbgrader's steps, not after each of its dozen steps
    cfg.Exporter.optimistic_validation = True
    cfg.Autograde.autograde_preprocessors = list(JOB_PREPROCESSORS)
    cfg.Autograde.pre_convert_hook = None  # the job's private gradebook was made with its lesson in it
    return cfg


# what nbgrader runs after sanitizing a submission (nbgrader_config.py names the same list)
AUTOGRADE_PREPROCESSORS = tuple(
    "grader.classroom.autograde.IndependentChecks grader.classroom.autograde.GuardedExecute "
    "grader.classroom.verdicts.ApplyVerdicts nbgrader.preprocessors.IgnorePattern "
    "nbconvert.preprocessors.ClearMetadataPreprocessor nbgrader.preprocessors.LimitOutput "
    "grader.classroom.cells.CapOutputs nbgrader.preprocessors.SaveAutoGrades "
    "nbgrader.preprocessors.AssignLatePenalties nbgrader.preprocessors.CheckCellMetadata".split()
)
# what a job leaves out: it grades into a throw-away copy of the gradebook, and the run applies
# these two to the final notebook in the course's gradebook (grades.write_grades)
GRADEBOOK_WRITERS = ("nbgrader.preprocessors.SaveAutoGrades", "nbgrader.preprocessors.AssignLatePenalties")
JOB_PREPROCESSORS = tuple(p for p in AUTOGRADE_PREPROCESSORS if p not in GRADEBOOK_WRITERS)


_PRIVATE: dict[str, Path] = {}


def _private_gradebook() -> Path:
    """Where this process's jobs keep their copy of the gradebook: one path for all of them.

    The folder is private to this process and denied to student code like the job's own folder
    (``_private_area``). In a local run it lies in the run's own folder, which the run removes
    when it ends (its workers are stopped, with no chance to clean up); elsewhere it goes when
    this process exits.
    """
    if "dir" not in _PRIVATE:
        import atexit

        area = os.environ.get(RUN_AREA)
        if area and os.path.isdir(area):
            _PRIVATE["dir"] = Path(tempfile.mkdtemp(prefix="classroom-gradebook-", dir=area))
            _PRIVATE["area"] = Path(area)
        else:
            _PRIVATE["dir"] = _PRIVATE["area"] = Path(tempfile.mkdtemp(prefix="classroom-gradebook-"))
        atexit.register(remove_tree, _PRIVATE["dir"])
    return _PRIVATE["dir"] / "gradebook.db"


def _private_area() -> Path:
    """The folder to deny student code for the private gradebooks: the run's own folder, which
    holds every worker's, or this process's own where there is none."""
    _private_gradebook()
    return _PRIVATE["area"]


# the student's name inside a job's private course: its gradebook copy then holds the submission's rows
# before the job starts (``_gradebook_with_submission``), and no student id becomes a path there
PRIVATE_STUDENT = "student"
_PREPARED: dict[tuple[str, str], bytes] = {}


def _gradebook_with_submission(template: bytes, lesson_id: str) -> bytes:
    """The gradebook template with PRIVATE_STUDENT's (empty) submission of the lesson in it, made once
    per template and lesson in this process: nbgrader then only updates those rows for each job,
    where it would create a grade and a comment row for every cell (about 30 ms per notebook)."""
    import hashlib

    key = (hashlib.sha256(template).hexdigest(), lesson_id)
    if key not in _PREPARED:
        from nbgrader.api import Gradebook

        path = _private_gradebook()
        path.write_bytes(template)
        with Gradebook("sqlite:///" + str(path)) as gb:
            gb.update_or_create_student(PRIVATE_STUDENT)
            gb.update_or_create_submission(lesson_id, PRIVATE_STUDENT)
        for old in [k for k in _PREPARED if k[0] != key[0]]:  # another run's template
            del _PREPARED[old]
        _PREPARED[key] = path.read_bytes()
        path.unlink()
    return _PREPARED[key]


def _test_cell_notes(submitted: Any, lesson: lessons.Lesson) -> list[str]:
    """Which test cells the student deleted or edited (nbgrader puts them back)."""
    notes = []
    grade_ids = [c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in submitted.cells]
    found = {gid: cell for gid, cell in zip(grade_ids, submitted.cells) if gid}
    for test in lesson.tests:
        cell = found.get(test.grade_id)
        if cell is None:
            notes.append(f"{test.grade_id}: test cell deleted (restored)")
        elif cell.source.strip() != _student_view(test.source).strip():
            notes.append(f"{test.grade_id}: test cell edited (restored)")
    return notes


def _student_view(source: str) -> str:
    """A test cell as students see it: hidden blocks removed."""
    return lessons.HIDDEN_BLOCK.sub("", source)


def _unattempted(nb: Any) -> bool:
    from nbgrader.utils import compute_checksum, is_solution

    sols = [c for c in nb.cells if is_solution(c) and c.cell_type == "code"]
    return bool(sols) and all(c.metadata.nbgrader.get("checksum") == compute_checksum(c) for c in sols)


def _placeholder(lesson_id: str, why: str) -> Any:
    """The student version of a lesson with every check failed and a note saying why."""
    import nbformat

    nb = nbformat.read(course.ROOT / "notebooks" / lesson_id / f"{lesson_id}.ipynb", as_version=4)
    note = nbformat.v4.new_markdown_cell(
        f"**This submission could not be graded: the file is not a readable notebook.**\n\n{why}\n\n"
        "Every check below is marked as failed. Submit the `.ipynb` file saved from Jupyter."
    )
    note.metadata["nbgrader"] = dict(
        grade=False,
        grade_id="invalid-notebook-note",
        locked=True,
        schema_version=3,
        solution=False,
        task=False,
    )
    for cell in _grade_cells(nb):
        cell.outputs = [
            _error_output("InvalidNotebook", "not run: the submitted file is not a readable notebook")
        ]
    nb.cells.insert(0, note)
    return nb


def grade_job(job: Job) -> JobResult:
    """Autograde one submission; never raises (an internal failure is reported in ``error``)."""
    start = time.perf_counter()
    lesson = lessons.lesson(job.lesson)
    result = JobResult(
        job.student, job.lesson, job.digest or digest_of(job.notebook, job.timestamp), "graded"
    )
    result.max_score = lesson.max_score
    root = Path(tempfile.mkdtemp(prefix="classroom-"))
    try:
        _grade(job, lesson, root, result)
    except CouldNotGrade as e:
        result.status = "could not be graded"
        result.error = f"could not be graded: {e}"
    except Exception:  # noqa: BLE001 - never let one submission stop the class
        result.status = "grading failed"
        result.error = traceback.format_exc()[-4000:]
    finally:
        end()
        remove_tree(root)  # where the notebook's set-up never began
        _private_gradebook().unlink(missing_ok=True)
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def _grade(job: Job, lesson: lessons.Lesson, root: Path, result: JobResult) -> None:
    import nbformat

    opts = job.options
    # is it a notebook at all?
    try:
        submitted = nbformat.reads(job.notebook.decode("utf-8"), as_version=4)
        nbformat.validate(submitted)
    except Exception as e:  # noqa: BLE001 - any unreadable file
        nb = _placeholder(job.lesson, f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        result.status = "invalid notebook"
        result.notebook = nbformat.writes(nb).encode()
        why = "not a readable notebook"
        result.cells = [
            CellResult(t.grade_id, lesson.exercise_of(t.grade_id), t.points, 0.0, None, None, why)
            for t in lesson.tests
        ]
        return
    result.notes += _test_cell_notes(submitted, lesson)
    # what RestoreCells will repair in nbgrader's sanitize step (the same function, on a copy)
    from grader.classroom import cells as cell_repair

    predicted = nbformat.from_dict(submitted)
    repairs = cell_repair.repair(predicted, lesson.release)
    repaired = {note.split(":", 1)[0] for note in repairs}
    result.notes = [n for n in result.notes if n.split(":", 1)[0] not in repaired] + repairs

    # a private course for this one submission, where the student is called PRIVATE_STUDENT
    course_dir = root / "course"
    sub_dir = course_dir / "submitted" / PRIVATE_STUDENT / job.lesson
    sub_dir.mkdir(parents=True)
    (sub_dir / f"{job.lesson}.ipynb").write_bytes(job.notebook)
    if job.timestamp:
        (sub_dir / "timestamp.txt").write_text(job.timestamp)
    gradebook = _private_gradebook()
    gradebook.write_bytes(_gradebook_with_submission(job.template, job.lesson))
    deny = (list(opts.protect) or default_protected()) + [str(_private_area())]
    autograded_dir = course_dir / "autograded" / PRIVATE_STUDENT / job.lesson
    who = dict(timestamp=job.timestamp, student=job.student, submission=_digest(job.notebook))
    begin(root, lesson, opts, deny, autograded_dir, job=True, **who)
    t0 = time.perf_counter()
    try:
        from nbgrader.apps import NbGraderAPI

        course.ensure_tools_on_path()
        cfg = _course_config(root, job.lesson, opts, gradebook)
        _start_early(_as_restored(predicted, lesson), autograded_dir, cfg)
        api = NbGraderAPI(config=cfg)
        outcome = api.autograde(job.lesson, PRIVATE_STUDENT, force=True, create=True)
    finally:
        stop_student_code()
    _CONTEXT["phases"]["nbgrader autograde"] = round(time.perf_counter() - t0, 3)
    if _CONTEXT.get("could_not_grade"):
        raise CouldNotGrade(_CONTEXT["could_not_grade"])
    final = autograded_dir / f"{job.lesson}.ipynb"
    if not outcome["success"] or not final.exists():
        raise RuntimeError(
            f"nbgrader autograde failed:\n{outcome.get('log', '')[-3000:]}\n{outcome.get('error', '')}"
        )
    result.notebook = read_regular(final)
    nb = nbformat.reads(result.notebook.decode("utf-8"), as_version=4)
    # the files nbgrader put beside the notebook (the lesson's own files, the timestamp): the folder
    # was made anew from trusted copies once the student's code had ended (``_after_student_code``)
    source_dir = course.ROOT / "solutions" / job.lesson
    for path in autograded_dir.rglob("*"):
        rel = path.relative_to(autograded_dir)
        if path != final and (rel.name == "timestamp.txt" or (source_dir / rel).is_file()):
            try:
                result.files[str(rel)] = read_regular(path)
            except OSError:
                continue
    ctx = _CONTEXT
    result.phases = ctx["phases"]
    result.cells = ctx["cells"]
    result.flags += ctx["flags"]
    result.notes += ctx["notes"]
    result.isolation = ctx.get("isolation", "")
    statuses = set(ctx.get("run", set()))
    if ctx.get("not_verified"):
        statuses.add("not verified")
    if _unattempted(nb):
        statuses.add("not attempted")
    if repairs:
        statuses.add("repaired")
    result.status = worst(statuses)
    _score_cells(nb, result)


def _score_cells(nb: Any, result: JobResult) -> None:
    """Each test cell's score as nbgrader computes it from the final notebook."""
    from nbgrader.utils import determine_grade

    by_id = {c.grade_id: c for c in result.cells}
    for cell in _grade_cells(nb):
        gid = cell.metadata["nbgrader"]["grade_id"]
        score, _ = determine_grade(cell, None)
        if gid in by_id:
            by_id[gid].score = float(score or 0)
    result.score = float(sum(c.score for c in result.cells))
