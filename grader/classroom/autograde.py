"""Autograde one submission with real nbgrader, safely: the unit of work of a grading run.

``grade_job(job)`` is a pure function of its input (the submitted bytes, a
gradebook template, the options) so that any executor -- a local process pool
or a Dask cluster -- can run it. It builds a private, throw-away nbgrader
course for the one submission (its own gradebook copy, so a student's code
cannot reach the real one), and runs nbgrader's ``Autograde`` converter with
three extra preprocessors:

``IndependentChecks`` (before Execute)
    static scan of the student's code, then the trusted re-decision of every
    test cell (``grader.classroom.trusted`` + the sandbox), before the kernel
    starts so nothing the kernel writes can reach the sandbox;
``GuardedExecute`` (nbgrader's Execute)
    kernels forked from the zygote with a memory cap and the guard; a dead
    kernel or a runaway notebook ends with outputs that say so, not a crash;
``ApplyVerdicts`` (after Execute, before SaveAutoGrades)
    a test cell the trusted side failed gets an error output carrying the
    diagnosis, so nbgrader scores it 0; a pass in the kernel that the trusted
    side failed is flagged.

The result carries the final notebook; the coordinator writes it and the
grades into the course (one writer for the real gradebook).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader import course
from grader.classroom import guard, kernels, lessons, static
from grader.classroom.zygote import Zygote

# ------------------------------------------------------------------ data crossing the executor


@dataclass
class Options:
    """How to grade (same for every submission of a run)."""

    timeout: int = 60  # seconds per cell
    memory: int | None = 4 << 30  # bytes per notebook (kernel and sandbox each)
    notebook_timeout: int = 600  # seconds per submission, all in
    kernels: str = "fork"  # "fork" (from the zygote) or "plain" (a new process each)
    protect: list[str] = field(default_factory=list)  # paths no student code may touch (work folder, sources)
    threads: int = 1  # torch threads per notebook


@dataclass
class Job:
    student: str
    lesson: str
    notebook: bytes
    template: bytes  # an nbgrader gradebook with the course's assignments and no students
    timestamp: str | None = None
    digest: str = ""
    options: Options = field(default_factory=Options)


@dataclass
class CellResult:
    grade_id: str
    exercise: str
    points: float
    score: float
    kernel_passed: bool | None
    trusted_passed: bool | None
    message: str = ""
    diagnosis: str | None = None


@dataclass
class JobResult:
    student: str
    lesson: str
    digest: str
    status: str
    score: float = 0.0
    max_score: float = 0.0
    cells: list[CellResult] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    notebook: bytes | None = None  # the autograded notebook
    files: dict[str, bytes] = field(default_factory=dict)  # other files of the autograded folder
    error: str | None = None  # an internal failure of the tool (the submission is then retried)
    phases: dict[str, float] = field(default_factory=dict)  # seconds spent in each step

    def summary(self) -> dict:
        """Everything but the bytes, as plain JSON data."""
        from dataclasses import asdict

        d = asdict(self)
        d.pop("notebook")
        d.pop("files")
        return d


def digest_of(notebook: bytes, timestamp: str | None) -> str:
    h = hashlib.sha256(notebook)
    h.update(b"\0" + (timestamp or "").encode())
    return h.hexdigest()[:20]


# nbgrader's gradebook code makes SQLAlchemy warn about its autoflush on every submission: noise
warnings.filterwarnings("ignore", message=".*not in session.*")

# ------------------------------------------------------------------ per-worker state

_ZYGOTE: Zygote | None = None
_CONTEXT: dict[str, Any] = {}  # the job being graded (read by the preprocessors)


def _zygote() -> Zygote:
    global _ZYGOTE
    if _ZYGOTE is None:
        env = dict(os.environ)
        env.pop("ATTENTION_COURSE_WORK", None)
        _ZYGOTE = Zygote(env)
        import atexit

        atexit.register(_ZYGOTE.close)
    return _ZYGOTE


def warm_up() -> None:
    """Start this worker's fork server and load nbgrader now, while the other workers do the same."""
    _zygote().ensure()
    import nbgrader.apps  # noqa: F401 - the slowest import of a job, done once per worker


# ------------------------------------------------------------------ statuses

SYNTAX = ("SyntaxError", "IndentationError", "TabError")
SEVERITY = [
    "invalid notebook",
    "kernel died",
    "timed out",
    "out of memory",
    "exited",
    "not verified",
    "syntax error",
    "not attempted",
    "graded",
]


def _is_memory_error(ename: str, evalue: str) -> bool:
    text = f"{ename} {evalue}".lower()
    return (
        ename in ("MemoryError", "OutOfMemoryError")
        or "can't allocate memory" in text
        or "out of memory" in text
    )


def run_status(nb: Any) -> set[str]:
    """What happened while the kernel ran, read from the outputs of every code cell."""
    found = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") != "error":
                continue
            ename, evalue = out.get("ename", ""), str(out.get("evalue", ""))
            if ename in SYNTAX:
                found.add("syntax error")
            elif ename in ("CellTimeoutError", "NotebookTimeout"):
                found.add("timed out")
            elif _is_memory_error(ename, evalue):
                found.add("out of memory")
            elif ename == "SystemExit":
                found.add("exited")
            elif ename == "KernelDied":
                found.add("kernel died")
    return found


def worst(statuses: set[str]) -> str:
    for s in SEVERITY:
        if s in statuses:
            return s
    return "graded"


# ------------------------------------------------------------------ preprocessors

from nbformat import NotebookNode  # noqa: E402
from nbgrader.preprocessors import Execute, NbGraderPreprocessor  # noqa: E402


def _error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _grade_cells(nb: Any) -> list[Any]:
    return [c for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")]


class IndependentChecks(NbGraderPreprocessor):
    """Decide every test cell outside the kernel (see grader.classroom.trusted)."""

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        ctx = _CONTEXT
        lesson: lessons.Lesson = ctx["lesson"]
        student_cells = []
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            meta = cell.metadata.get("nbgrader", {})
            kind = "test" if meta.get("grade") and not meta.get("solution") else "other"
            student_cells.append(
                {
                    "id": cell.get("id") or f"cell-{i}",
                    "kind": kind,
                    "grade_id": meta.get("grade_id"),
                    "source": cell.source,
                }
            )
        ctx["flags"] += [
            s
            for s in static.scan([c["source"] for c in student_cells if c["kind"] == "other"])
            if s not in ctx["flags"]
        ]
        trusted_dir: Path = ctx["root"] / "trusted"
        job = {
            "source_cells": [vars(c) for c in lesson.cells],
            "student_cells": student_cells,
            "graded_names": lesson.graded_names,
            "cell_timeout": ctx["options"].timeout,
            "result_path": str(trusted_dir / "result.json"),
        }
        (trusted_dir / "job.json").write_text(json.dumps(job))
        t = time.perf_counter()
        ctx["trusted"] = _run_trusted(ctx, trusted_dir)
        ctx["phases"]["independent checks"] = round(time.perf_counter() - t, 3)
        for k, v in ((ctx["trusted"] or {}).get("timings") or {}).items():
            ctx["phases"][f"  {k}"] = v
        ctx["phases"]["kernel start"] = time.perf_counter()
        return nb, resources


def _run_trusted(ctx: dict, trusted_dir: Path) -> dict | None:
    opts: Options = ctx["options"]
    root: Path = ctx["root"]
    scratch = root / "scratch"
    sandbox_policy = guard.policy(
        deny=ctx["deny"] + [str(root / "course"), str(trusted_dir)],
        write_only_in=[str(scratch), os.devnull],
        read_only_in=_sandbox_readable() + [str(scratch)],
        deny_imports=("grader",),
        strict=True,
    )
    budget = max(30, opts.timeout * (len(ctx["lesson"].cells) + 4))
    proc = _zygote().fork(
        "trusted",
        cwd=str(trusted_dir),
        env=_child_env(ctx),
        job=str(trusted_dir / "job.json"),
        sandbox={
            "scratch": str(scratch),
            "memory": opts.memory,
            "cpu_seconds": budget + 30,
            "guard": sandbox_policy,
            "cell_timeout": opts.timeout,
        },
        log=str(root / "trusted.log"),
        threads=opts.threads,
    )
    try:
        proc.wait(timeout=min(budget, max(1, ctx["deadline"] - time.monotonic())))
    except Exception:  # noqa: BLE001 - took too long
        proc.kill()
        return None
    result = trusted_dir / "result.json"
    if not result.exists():
        return None
    return json.loads(result.read_text())


_READABLE: list[str] = []


def _sandbox_readable() -> list[str]:
    """Where a sandbox may read: the Python installation, the student helpers and data, system files."""
    if not _READABLE:
        import site
        import sysconfig

        paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sysconfig.get_paths()["stdlib"]}
        paths.update(site.getsitepackages())
        import attention_course

        helpers = Path(attention_course.__file__).resolve().parent
        paths.update({str(helpers), str(helpers.parent / "data")})
        home = Path.home()
        paths.update({str(home / ".cache" / "matplotlib"), str(home / ".config" / "matplotlib")})
        paths.update(
            {
                "/usr",
                "/lib",
                "/lib64",
                "/etc",
                "/proc",
                "/sys",
                os.devnull,
                "/dev/urandom",
                "/dev/random",
                "/dev/zero",
            }
        )
        paths.update(str(p) for p in Path("/dev").glob("nvidia*"))  # CUDA
        if os.environ.get("ATTENTION_COURSE_DATA"):
            paths.add(os.environ["ATTENTION_COURSE_DATA"])
        _READABLE.extend(sorted(paths))
    return list(_READABLE)


def _child_env(ctx: dict) -> dict[str, str]:
    env = kernels.kernel_env(None)
    env["MPLBACKEND"] = "Agg"
    env["NBGRADER_EXECUTION"] = "autograde"
    env["TMPDIR"] = str(ctx["root"] / "tmp")
    return env


class GuardedExecute(Execute):
    """nbgrader's Execute, with guarded kernels; a dead kernel ends the notebook, not the class."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs["kernel_manager_class"] = kernels.GuardedKernelManager
        super().__init__(*args, **kwargs)
        self._current = -1

    def preprocess_cell(self, cell: Any, resources: Any, index: int) -> Any:
        self._current = index
        return super().preprocess_cell(cell, resources, index)

    def preprocess(self, nb: Any, resources: Any = None, km: Any = None) -> Any:
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        self._current = -1
        try:
            return super().preprocess(nb, resources, km)
        except Exception as e:  # noqa: BLE001 - the kernel or the notebook ran out of road
            if _CONTEXT.get("notebook_timed_out"):
                ename, why = "NotebookTimeout", "the notebook ran past its time limit and was stopped"
            elif isinstance(e, CellTimeoutError):
                ename, why = "CellTimeoutError", "the cell ran past its time limit"
            elif isinstance(e, DeadKernelError) or "died" in str(e).lower():
                ename, why = (
                    "KernelDied",
                    (
                        "the kernel died while running this cell (os._exit, exit(), a crash, "
                        "or the memory limit)"
                    ),
                )
            else:
                ename, why = "KernelDied", f"the kernel stopped: {type(e).__name__}: {e}"
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


class ApplyVerdicts(NbGraderPreprocessor):
    """Score a test cell 0 unless the trusted side passed it too; flag kernel passes it failed."""

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        from nbgrader.utils import determine_grade

        ctx = _CONTEXT
        ctx["phases"]["notebook run"] = round(time.perf_counter() - ctx["phases"].pop("kernel start"), 3)
        ctx["run"] = run_status(nb)
        trusted = ctx.get("trusted")
        verdicts = (trusted or {}).get("verdicts", {})
        lesson: lessons.Lesson = ctx["lesson"]
        for cell in _grade_cells(nb):
            gid = cell.metadata["nbgrader"]["grade_id"]
            points = float(cell.metadata["nbgrader"].get("points", 0) or 0)
            kernel_score, _ = determine_grade(cell, self.log)
            kernel_passed = kernel_score is not None and kernel_score >= points
            verdict = verdicts.get(gid)
            if verdict is None:
                if trusted is None:
                    reason = "this check could not be run outside the notebook (time limit)"
                    ctx["not_verified"] = True
                else:
                    reason = "this check did not run outside the notebook"
                verdict = {"passed": False, "ename": "NotVerified", "message": reason}
            if (
                verdict["passed"] is None
            ):  # cannot be decided outside the notebook: the kernel's verdict stands
                ctx["notes"].append(f"{gid}: checked in the notebook only ({verdict.get('message', '')})")
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
            if not verdict["passed"]:
                if kernel_passed and verdict.get("ename") != "NotVerified":
                    if "did not finish" in result.message or "ended its process" in result.message:
                        ctx["notes"].append(
                            f"{gid}: passed in the notebook, but the check outside it could not finish"
                        )
                    else:
                        ctx["flags"].append(f"{gid}: passed in the notebook, failed the independent check")
                # keep the kernel's own error when it failed there too (it is what the student saw),
                # but always make sure the cell carries the independent verdict
                if kernel_passed or not _has_error(cell):
                    cell.outputs = [_error_output(verdict.get("ename") or "AssertionError", result.message)]
                elif verdict.get("ename") == "AssertionError" and result.message:
                    cell.outputs = [_error_output("AssertionError", result.message)]
            ctx["cells"].append(result)
        return nb, resources


def _has_error(cell: Any) -> bool:
    return any(o.get("output_type") == "error" for o in cell.get("outputs", []))


# ------------------------------------------------------------------ the job


def _course_config(root: Path, lesson_id: str, options: Options) -> Any:
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    cfg = Config(PyFileConfigLoader("nbgrader_config.py", path=str(course.ROOT)).load_config())
    cd = cfg.CourseDirectory
    cd.root = str(root / "course")
    cd.source_directory = str(course.ROOT / "solutions")
    cd.submitted_directory = "submitted"
    cd.autograded_directory = "autograded"
    cd.db_url = "sqlite:///" + str(root / "course" / "gradebook.db")
    cfg.NbGrader.logfile = ""
    cfg.Execute.timeout = options.timeout
    cfg.OverwriteCells.add_missing_cells = True
    cfg.Autograde.autograde_preprocessors = [
        IndependentChecks,
        GuardedExecute,
        ApplyVerdicts,
        "nbgrader.preprocessors.IgnorePattern",
        "nbconvert.preprocessors.ClearMetadataPreprocessor",
        "nbgrader.preprocessors.LimitOutput",
        "nbgrader.preprocessors.SaveAutoGrades",
        "nbgrader.preprocessors.AssignLatePenalties",
        "nbgrader.preprocessors.CheckCellMetadata",
    ]
    return cfg


def _test_cell_notes(submitted: Any, lesson: lessons.Lesson) -> list[str]:
    """Which test cells the student deleted or edited (nbgrader puts them back)."""
    notes = []
    found = {}
    for cell in submitted.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid:
            found[gid] = cell
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
    note.metadata["nbgrader"] = {
        "grade": False,
        "grade_id": "invalid-notebook-note",
        "locked": True,
        "schema_version": 3,
        "solution": False,
        "task": False,
    }
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
    except Exception:  # noqa: BLE001 - never let one submission stop the class
        result.status = "grading failed"
        result.error = traceback.format_exc()[-4000:]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        _CONTEXT.clear()
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
        result.cells = [
            CellResult(
                t.grade_id,
                lesson.exercise_of(t.grade_id),
                t.points,
                0.0,
                None,
                None,
                "not a readable notebook",
            )
            for t in lesson.tests
        ]
        return
    result.notes += _test_cell_notes(submitted, lesson)

    # a private course for this one submission
    course_dir = root / "course"
    sub_dir = course_dir / "submitted" / job.student / job.lesson
    sub_dir.mkdir(parents=True)
    (sub_dir / f"{job.lesson}.ipynb").write_bytes(job.notebook)
    if job.timestamp:
        (sub_dir / "timestamp.txt").write_text(job.timestamp)
    (course_dir / "gradebook.db").write_bytes(job.template)
    for name in ("trusted", "scratch", "tmp"):
        (root / name).mkdir()
    deny = list(opts.protect) or default_protected()
    _CONTEXT.clear()
    _CONTEXT.update(
        lesson=lesson,
        options=opts,
        root=root,
        deny=deny,
        flags=[],
        notes=[],
        cells=[],
        phases={},
        deadline=time.monotonic() + opts.notebook_timeout,
    )
    autograded_dir = course_dir / "autograded" / job.student / job.lesson
    kernel_policy = guard.policy(
        deny=deny + [str(root / "trusted"), str(root / "scratch")],
        write_only_in=[str(autograded_dir), str(root / "tmp"), os.devnull],
    )
    kernels.SETTINGS.zygote = _zygote() if opts.kernels == "fork" else None
    kernels.SETTINGS.memory = opts.memory
    kernels.SETTINGS.guard = kernel_policy
    kernels.SETTINGS.pids = []
    kernels.SETTINGS.log = str(root / "kernel.log")
    kernels.SETTINGS.threads = opts.threads
    kernels.SETTINGS.env = {"TMPDIR": str(root / "tmp"), "IPYTHONDIR": str(root / "tmp" / "ipython")}

    t0 = time.perf_counter()
    watchdog = threading.Timer(opts.notebook_timeout, _stop_notebook)
    watchdog.daemon = True
    watchdog.start()
    try:
        from nbgrader.apps import NbGraderAPI

        course.ensure_tools_on_path()
        api = NbGraderAPI(config=_course_config(root, job.lesson, opts))
        outcome = api.autograde(job.lesson, job.student, force=True, create=True)
    finally:
        watchdog.cancel()
        for pid in kernels.SETTINGS.pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    _CONTEXT["phases"]["nbgrader autograde"] = round(time.perf_counter() - t0, 3)
    final = autograded_dir / f"{job.lesson}.ipynb"
    if not outcome["success"] or not final.exists():
        raise RuntimeError(
            f"nbgrader autograde failed:\n{outcome.get('log', '')[-3000:]}\n{outcome.get('error', '')}"
        )
    nb = nbformat.read(final, as_version=4)
    result.notebook = final.read_bytes()
    # the files nbgrader put beside the notebook (the lesson's own files, the timestamp), not what the
    # student's code wrote there
    source_dir = course.ROOT / "solutions" / job.lesson
    for path in autograded_dir.rglob("*"):
        rel = path.relative_to(autograded_dir)
        if path.is_file() and path != final and (rel.name == "timestamp.txt" or (source_dir / rel).is_file()):
            result.files[str(rel)] = path.read_bytes()
    ctx = _CONTEXT
    result.phases = ctx["phases"]
    result.cells = ctx["cells"]
    result.flags += ctx["flags"]
    result.notes += ctx["notes"]
    statuses = set(ctx.get("run", set()))
    if ctx.get("not_verified"):
        statuses.add("not verified")
    if _unattempted(nb):
        statuses.add("not attempted")
    result.status = worst(statuses)
    result.score = float(sum(c.score for c in result.cells))
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


def default_protected() -> list[str]:
    """What no student code may open: the work folder (gradebook, every submission) and the sources."""
    return [str(course.work_dir().resolve()), str(course.ROOT / "_grading"), str(course.ROOT / "solutions")]


def _stop_notebook() -> None:
    """The whole notebook ran too long: kill its kernel (the executor then marks the rest)."""
    _CONTEXT["notebook_timed_out"] = True
    for pid in list(kernels.SETTINGS.pids):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
