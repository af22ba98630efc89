"""Autograde one submission with real nbgrader, safely: the unit of work of a grading run.

``grade_job(job)`` is a pure function of its input (the submitted bytes, a
gradebook template, the options) so that any executor -- a local process pool
or a Dask cluster -- can run it. It builds a private, throw-away nbgrader
course for the one submission (its own gradebook copy, so a student's code
cannot reach the real one), and runs nbgrader's ``Autograde`` converter with
three extra preprocessors:

``IndependentChecks`` (before Execute)
    tamper scan of the student's code, then the trusted decision of every
    test cell (``grader.classroom.trusted`` + the sandbox), before the kernel
    starts so nothing the kernel writes can reach the sandbox;
``GuardedExecute`` (nbgrader's Execute)
    kernels forked from the fork server (sealed in bubblewrap where it works,
    ``grader.classroom.seal``) with a memory cap and the guard; hidden
    test blocks are left out of what the kernel runs (they run only on the
    trusted side); a dead kernel or a runaway notebook ends with outputs that
    say so, not a crash;
``ApplyVerdicts`` (after Execute, before SaveAutoGrades)
    every test cell's outputs say the trusted verdict and nothing else that
    nbgrader would score: a pass has no error output, a failure exactly one,
    carrying the diagnosis; whatever the cell wrote to stderr becomes a short
    stdout note. A pass in the kernel that the trusted side failed outside
    the hidden block is flagged.

A job takes a head start (``_start_early``): before nbgrader prepares the notebook (its
gradebook rows, restoring cells) it starts the independent checks on the cells as restoring will
leave them, and the kernel, which runs nothing until nbgrader gives it the cells.
``IndependentChecks`` compares the cells nbgrader then runs with those the checks were given,
and starts them again on the real ones if they differ: a verdict is always about what ran.

The same three preprocessors are in the course's ``nbgrader_config.py``, so
plain ``nbgrader autograde`` (and the formgrader) grade the same way: without
a job, ``IndependentChecks`` builds the notebook's context from nbgrader's
resources (lesson, student, autograded folder), starts the fork server on
first use, and ``ApplyVerdicts`` cleans up after the notebook.

The result carries the final notebook; the coordinator writes it and the
grades into the course (one writer for the real gradebook).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader import course
from grader.classroom import gradebooks, guard, kernels, lessons, seal, servers, tamper_scan
from grader.classroom.executors import RUN_AREA
from grader.classroom.jobs import (  # noqa: F401 - re-exported
    CellResult,
    Job,
    JobResult,
    Options,
    default_protected,
    digest_of,
)

# nbgrader's gradebook code makes SQLAlchemy warn about its autoflush on every submission: noise
warnings.filterwarnings("ignore", message=".*not in session.*")

# ------------------------------------------------------------------ per-worker state

_CONTEXT: dict[str, Any] = {}  # the job being graded (read by the preprocessors)


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
    "repaired",
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


def _is_test_cell(cell: Any) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


# ------------------------------------------------------------------ plain nbgrader: a context per notebook


def _new_context(root: Path, lesson: Any, opts: Options, deny: list, **who: Any) -> None:
    """A fresh context for one notebook: its private folders, what it may not touch, empty records."""
    for name in ("trusted", "scratch", "tmp"):
        (root / name).mkdir()
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
        **who,
    )


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _begin_notebook(resources: dict, config: Any) -> bool:
    """Set up the context of one notebook graded by plain nbgrader; False if it is not a lesson."""
    _end_notebook()
    info = resources.get("nbgrader") or {}
    lesson_id = str(info.get("assignment") or "")
    try:
        lesson = lessons.lesson(lesson_id)
    except (OSError, ValueError):
        return False
    autograded_dir = Path((resources.get("metadata") or {}).get("path") or os.getcwd()).resolve()
    timeout = config.Execute.timeout if "timeout" in config.Execute else 60
    # kernels forked from this process's fork servers, started at its first notebook and kept for the rest
    opts = Options(timeout=int(timeout or 60))
    root = Path(tempfile.mkdtemp(prefix="autograde-"))
    deny = _protected_around(autograded_dir)
    student = str(info.get("student") or "")
    try:  # what the student handed in, byte for byte: the hidden cases' salt is drawn from it
        submission = _digest(course.submission_path(lesson_id, student).read_bytes())
    except OSError:
        submission = ""
    _new_context(root, lesson, opts, deny, plain=True, student=student, submission=submission)
    _configure_kernels(root, autograded_dir, deny, opts)
    return True


def _end_notebook() -> None:
    """Stop what plain nbgrader's notebook left running and delete its private folder."""
    if not _CONTEXT.get("plain"):
        return
    watchdog = _CONTEXT.get("watchdog")
    if watchdog is not None:
        watchdog.cancel()
    _abandon_checks()
    _kill_kernels()
    shutil.rmtree(_CONTEXT["root"], ignore_errors=True)
    _close_box()
    _CONTEXT.clear()


def _protected_around(autograded_dir: Path) -> list[str]:
    """What a kernel run in ``autograded_dir`` may not open: the sources, and every other part of the
    work folder (the gradebook, other submissions, other students' autograded copies)."""
    deny = [str(course.ROOT / "solutions")]
    for top in {course.work_dir().resolve(), (course.ROOT / "_grading").resolve()}:
        if not autograded_dir.is_relative_to(top) or autograded_dir == top:
            deny.append(str(top))
            continue
        here = autograded_dir
        while here != top:
            if here.parent.is_dir():
                deny += [str(p) for p in here.parent.iterdir() if p != here]
            here = here.parent
    return deny


def _open_box(root: Path, autograded_dir: Path) -> Path:
    """The folder where this notebook's student code may write (tmp, scratch; for a job, the autograded
    copy too): inside the seal's area when sealed, else the private root. Records which it is."""
    refusal = seal.unsealed_refusal()
    if refusal is not None:
        raise CouldNotGrade(refusal)
    ok, why = seal.available()
    if not ok:
        _CONTEXT.update(box=root, isolation=f"{seal.NOT_SEALED}: {why}")
        _CONTEXT["notes"].append(
            f"{seal.NOT_SEALED}: {why}; the student's code ran under the in-process guard only"
        )
        return root
    box = Path(tempfile.mkdtemp(prefix="job-", dir=servers.sealed_area()))
    for name in ("tmp", "scratch", "pipes", "ipc"):
        (box / name).mkdir()
    if _CONTEXT.get("job"):  # nbgrader writes the autograded copy where the sealed kernel can work in it
        (box / "autograded").mkdir()
        autograded_dir.parents[1].symlink_to(box / "autograded", target_is_directory=True)
    _CONTEXT.update(box=box, isolation=seal.SEALED)
    return box


def _close_box() -> None:
    """Delete the notebook's sealed folder; later kernels start with the defaults again."""
    box = _CONTEXT.get("box")
    if box is not None and box != _CONTEXT.get("root"):
        shutil.rmtree(box, ignore_errors=True)
    kernels.SETTINGS = kernels.KernelSettings()


def _configure_kernels(root: Path, autograded_dir: Path, deny: list[str], opts: Options) -> None:
    """How this notebook's kernel is started: its seal, guard, memory cap and private temp folder."""
    box = _open_box(root, autograded_dir)
    sealed = box != root
    fork = opts.kernels == "fork"
    workdir = None
    if sealed and fork and not _CONTEXT.get("job"):
        # plain nbgrader's autograded folder is not in the sealed fork server's view: the kernel works
        # in a copy of it inside the box (links copied as links, so none leads out of the seal)
        workdir = box / "autograded"
        shutil.copytree(autograded_dir, workdir, symlinks=True, dirs_exist_ok=True)
    kernel_policy = guard.policy(
        deny=deny + [str(root / "trusted"), str(root / "scratch"), str(box / "scratch"), str(box / "pipes")],
        write_only_in=[str(workdir or autograded_dir), str(box / "tmp"), os.devnull],
        deny_imports=("grader",),
    )
    if fork:
        kernels.SETTINGS.fork_server = servers.sealed() if sealed else servers.plain()
        # what the lesson's cells import, loaded once in each server that forks a process to run them
        for server in (kernels.SETTINGS.fork_server, servers.plain()):
            server.preload(list(_CONTEXT["lesson"].imports))
    kernels.SETTINGS.cwd = str(workdir) if workdir else None
    kernels.SETTINGS.sealed = sealed
    kernels.SETTINGS.area = str(box / "ipc") if sealed else None
    kernels.SETTINGS.memory = opts.memory
    kernels.SETTINGS.guard = kernel_policy
    kernels.SETTINGS.handles = []
    kernels.SETTINGS.log = str(box / "kernel.log")
    kernels.SETTINGS.threads = opts.threads
    kernels.SETTINGS.env = {"TMPDIR": str(box / "tmp"), "IPYTHONDIR": str(box / "tmp" / "ipython")}


def _kill_kernels() -> None:
    """Kill the notebook's kernels, and in the seal every process the notebook left behind."""
    kernels.kill_all()
    if _CONTEXT.get("isolation") == seal.SEALED and servers.SEALED is not None:
        try:
            servers.SEALED.reset()
        except RuntimeError:
            pass


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


def _checks_job(nb: Any) -> dict:
    """What the trusted process is asked to decide for this notebook: its code cells as they will
    run (test cells as nbgrader restores them, hidden blocks included), and the lesson's."""
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
    return {
        "source_cells": [vars(c) for c in lesson.cells],
        "student_cells": student_cells,
        "graded_names": lesson.graded_names,
        "cell_timeout": ctx["options"].timeout,
        "result_path": str(ctx["root"] / "trusted" / "result.json"),
        "salt": course.case_salt(
            lesson.id, ctx.get("student", ""), [ctx.get("submission") or repr(nb.cells)]
        ),
    }


@dataclass
class _RunningChecks:
    """A notebook's independent checks while they run: the trusted process, and (sealed) its sandbox."""

    trusted: Any
    sandbox: Any | None
    started: float  # time.perf_counter()
    until: float  # time.monotonic() by which they must end
    trusted_dir: Path


def _finish_checks() -> None:
    """Wait for the independent checks started for this notebook (if any), and keep their verdicts."""
    ctx = _CONTEXT
    checks: _RunningChecks | None = ctx.pop("checks", None)
    if checks is None:
        return
    ctx["trusted"] = _await_trusted(ctx, checks)
    ctx["phases"]["independent checks"] = round(time.perf_counter() - checks.started, 3)
    for k, v in ((ctx["trusted"] or {}).get("timings") or {}).items():
        ctx["phases"][f"  {k}"] = v


def _abandon_checks() -> None:
    """Stop the checks of a notebook that ends before they were awaited."""
    checks: _RunningChecks | None = _CONTEXT.pop("checks", None)
    _CONTEXT.pop("checks_job", None)
    if checks is not None:
        for proc in (checks.trusted, checks.sandbox):
            if proc is not None:
                proc.kill()


def _discard_checks() -> None:
    """Stop checks started on cells that are not the ones that will run, and clear what they left, so
    that new ones start as the first did (nothing of the old ones can reach the new verdicts)."""
    checks: _RunningChecks | None = _CONTEXT.get("checks")
    _abandon_checks()
    if checks is None:
        return
    for proc in (checks.trusted, checks.sandbox):
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - a process that outlives SIGKILL: the job's folders go with it
                pass
    for path in [checks.trusted_dir / "result.json", checks.trusted_dir / "result.json.tmp"]:
        path.unlink(missing_ok=True)
    box: Path = _CONTEXT.get("box", _CONTEXT["root"])
    for pipe in (box / "pipes").glob("*"):
        pipe.unlink(missing_ok=True)


def _start_checks(ctx: dict, job: dict) -> None:
    """Start the notebook's independent checks on ``job`` (``_checks_job``): fork the trusted process
    (and, sealed, the student's sandbox it talks to); ``_finish_checks`` waits for their verdicts.

    They run while the notebook's kernel starts (``GuardedExecute`` waits for them before the
    kernel runs its first cell): no student code runs in the kernel until the sandbox, the other
    process with the student's code, is gone.
    """
    started = time.perf_counter()
    trusted_dir: Path = ctx["root"] / "trusted"
    (trusted_dir / "job.json").write_text(json.dumps(job))
    ctx["checks_job"] = job
    opts: Options = ctx["options"]
    root: Path = ctx["root"]
    box: Path = ctx.get("box", root)
    scratch = box / "scratch"
    sealed = box != root
    sandbox_policy = guard.policy(
        deny=ctx["deny"] + [str(root / "course"), str(trusted_dir)],
        write_only_in=[str(scratch), os.devnull],
        read_only_in=_sandbox_readable() + [str(scratch)] + (["/tmp/matplotlib"] if sealed else []),
        deny_imports=("grader",),
        strict=True,
    )
    budget = max(30, opts.timeout * (len(ctx["lesson"].cells) + 4))
    sandbox_cfg = {
        "scratch": str(scratch),
        "memory": opts.memory,
        "cpu_seconds": budget + 30,
        "guard": sandbox_policy,
        "cell_timeout": opts.timeout,
    }
    box_proc = None
    pipes = None
    if sealed:  # the sandbox is forked in the seal; the trusted process outside talks to it by named pipes
        pipes = {
            "to_sandbox": str(box / "pipes" / "to_sandbox"),
            "from_sandbox": str(box / "pipes" / "from_sandbox"),
        }
        for path in pipes.values():
            os.mkfifo(path, 0o600)
        box_proc = servers.sealed().fork(
            "sandbox",
            cwd=str(scratch),
            env=_child_env(ctx),
            pipes=pipes,
            sandbox=sandbox_cfg,
            log=str(box / "sandbox.log"),
            threads=opts.threads,
            writable=[str(scratch)],
        )
    proc = servers.plain().fork(
        "trusted",
        cwd=str(trusted_dir),
        env=_child_env(ctx),
        job=str(trusted_dir / "job.json"),
        sandbox=sandbox_cfg,
        pipes=pipes,
        log=str(root / "trusted.log"),
        threads=opts.threads,
    )
    ctx["checks"] = _RunningChecks(proc, box_proc, started, time.monotonic() + budget, trusted_dir)


def _await_trusted(ctx: dict, checks: _RunningChecks) -> dict | None:
    """The trusted process's verdicts, once it has ended (None if it ran past its time)."""
    try:
        checks.trusted.wait(timeout=max(1, min(checks.until, ctx["deadline"]) - time.monotonic()))
    except Exception:  # noqa: BLE001 - took too long
        checks.trusted.kill()
        return None
    finally:
        if checks.sandbox is not None:
            checks.sandbox.kill()
    result = checks.trusted_dir / "result.json"
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
    env["TMPDIR"] = str(ctx.get("box", ctx["root"]) / "tmp")
    return env


class GuardedExecute(Execute):
    """nbgrader's Execute, with guarded kernels; a dead kernel ends the notebook, not the class."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs["kernel_manager_class"] = kernels.GuardedKernelManager
        super().__init__(*args, **kwargs)
        self._current = -1

    def preprocess_cell(self, cell: Any, resources: Any, index: int) -> Any:
        self._current = index
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
        self._current = -1
        if _CONTEXT:
            _CONTEXT["phases"]["kernel start"] = time.perf_counter()
        early = _CONTEXT.pop("kernel", None) if _CONTEXT else None
        if km is None and early is not None:
            wanted = (nb.metadata.get("kernelspec") or {}).get("name") or self.kernel_name
            if early.kernel_name == wanted:
                km = early
            else:
                _CONTEXT["kernel"] = early  # another kind than the notebook asks for: stopped after
        if _CONTEXT.get("plain"):
            watchdog = threading.Timer(_CONTEXT["options"].notebook_timeout, _stop_notebook)
            watchdog.daemon = True
            watchdog.start()
            _CONTEXT["watchdog"] = watchdog
        try:
            return super().preprocess(nb, resources, km)
        except Exception as e:  # noqa: BLE001 - the kernel or the notebook ran out of road
            return self._ran_out(nb, resources, e)
        finally:
            if _CONTEXT.get("watchdog") is not None:
                _CONTEXT.pop("watchdog").cancel()

    @contextmanager
    def setup_kernel(self, **kwargs: Any) -> Iterator[None]:
        # a kernel started early is stopped after the run like one nbclient starts itself
        kwargs.setdefault("cleanup_kc", True)
        with super().setup_kernel(**kwargs):
            yield

    def _ran_out(self, nb: Any, resources: Any, e: Exception) -> Any:
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        if _CONTEXT.get("notebook_timed_out"):
            ename, why = "NotebookTimeout", "the notebook ran past its time limit and was stopped"
        elif isinstance(e, CellTimeoutError):
            ename, why = "CellTimeoutError", "the cell ran past its time limit"
        elif isinstance(e, DeadKernelError) or "died" in str(e).lower():
            ename, why = (
                "KernelDied",
                ("the kernel died while running this cell (os._exit, exit(), a crash, or the memory limit)"),
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
    """Make every test cell's outputs say the trusted verdict; flag kernel passes it failed."""

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        if not _CONTEXT:  # not a lesson: only what no verdict may depend on
            for cell in _grade_cells(nb):
                cell.outputs = _stderr_as_note(cell.get("outputs", []))
            return nb, resources
        try:
            _after_student_code(resources)
            reason = _failed_before_student_code(nb, _CONTEXT["lesson"])
            if reason is not None:
                _CONTEXT["could_not_grade"] = reason
                self.log.error(
                    "Could not be graded: %s/%s: %s", _CONTEXT.get("student"), _CONTEXT["lesson"].id, reason
                )
                raise CouldNotGrade(reason)
            self._apply(nb)
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
                    self.log.warning("Flagged for review: %s: %s", who, flag)
                for note in ctx["notes"]:
                    self.log.info("%s: %s", who, note)
                _end_notebook()
        return nb, resources

    def _apply(self, nb: Any) -> None:
        from nbgrader.utils import determine_grade

        ctx = _CONTEXT
        _finish_checks()  # if no cell ran (the kernel did not start)
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
            kernel_score, _ = determine_grade(cell, self.log)
            kernel_passed = kernel_score is not None and kernel_score >= points
            outputs = _stderr_as_note(cell.get("outputs", []))
            verdict = verdicts.get(gid)
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
                    if "did not finish" in result.message or "ended its process" in result.message:
                        ctx["notes"].append(
                            f"{gid}: passed in the notebook, but the check outside it could not finish"
                        )
                    else:
                        ctx["flags"].append(f"{gid}: passed in the notebook, failed the independent check")
                ename = verdict.get("ename") or "AssertionError"
                cell.outputs = kept + [_error_output(ename, result.message or ename)]
            ctx["cells"].append(result)


class CouldNotGrade(RuntimeError):
    """The notebook failed before any of the student's code ran (the course package could not be
    imported, a setup cell of the lesson's own failed): no score, the reason instead."""


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
                f"({ename}: {evalue.strip()[:300]}); nothing of the submission was checked"
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
    written = "".join(
        "".join(o.get("text", "")) if isinstance(o.get("text"), list) else str(o.get("text", ""))
        for o in outputs
        if o.get("output_type") == "stream" and o.get("name") == "stderr"
    )
    if not any(o.get("output_type") == "stream" and o.get("name") == "stderr" for o in outputs):
        return list(outputs)
    lines = written.splitlines()
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
    out, placed = [], False
    for o in outputs:
        if o.get("output_type") == "stream" and o.get("name") == "stderr":
            if not placed:
                out.append(_stream_note(text))
                placed = True
            continue
        out.append(o)
    return out


# ------------------------------------------------------------------ after the student's code

FILE_CAP = 64 * 1024 * 1024  # the most the worker reads of one file that student code could touch


def read_regular(path: Path, cap: int = FILE_CAP) -> bytes:
    """The bytes of ``path`` if it is a regular file (a link is never followed) of at most ``cap``
    bytes; ``OSError`` otherwise."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path.name}: not a regular file")
        if st.st_size > cap:
            raise OSError(f"{path.name}: larger than {cap} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(cap)
    finally:
        os.close(fd)


def _after_student_code(resources: dict) -> None:
    """Once the notebook has run, before nbgrader writes anything: nothing the student started is
    left (its kernel, and sealed, its whole namespace), and the folder nbgrader writes the graded
    notebook into is one no student process could reach or replace.

    A job's autograded folder was the sealed kernel's working folder (reached through a link
    into the seal's area): it is replaced by a new folder outside the seal holding only what
    nbgrader put there, taken from trusted copies (the timestamp of the job, the lesson's own
    files from ``solutions/``). Where the kernel worked in nbgrader's own folder (not sealed),
    every link and special file it made there is removed.
    """
    _drop_early_kernel()
    _kill_kernels()
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
    shutil.rmtree(fresh, ignore_errors=True)
    for rel, data in kept.items():
        target = fresh / folder.name / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (fresh / folder.name).mkdir(parents=True, exist_ok=True)
    if student_side.is_symlink() or not student_side.is_dir():
        student_side.unlink()
    else:
        shutil.rmtree(student_side)
    os.rename(fresh, student_side)


def _drop_links(folder: Path) -> None:
    """Remove every link and special file below ``folder`` (links are not followed)."""
    for top, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            path = Path(top) / name
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                try:
                    path.unlink()
                except OSError:
                    pass


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


def _start_early(predicted: Any, autograded_dir: Path, cfg: Any) -> None:
    """A job's head start, taken while nbgrader prepares the notebook (gradebook rows, sanitizing):
    the independent checks on the cells as they will run, and the kernel, started (it runs nothing
    until nbgrader gives it the notebook's cells, and no cell before the checks are done).

    Checks started on other cells than nbgrader then runs are discarded and started again
    (``IndependentChecks``); a kernel of another kind than the notebook asks for is not used.
    """
    ctx = _CONTEXT
    try:
        _start_checks(ctx, _checks_job(predicted))
    except Exception:  # noqa: BLE001 - IndependentChecks starts them in nbgrader's run, and reports
        _discard_checks()
    from jupyter_core.utils import run_sync

    autograded_dir.mkdir(parents=True, exist_ok=True)  # nbgrader keeps it: only its notebook is new
    km = kernels.GuardedKernelManager(kernel_name=ctx["lesson"].kernel, config=cfg)
    args = ["--HistoryManager.hist_file=:memory:"] if km.ipykernel else []  # as nbclient starts one
    env = dict(os.environ, NBGRADER_EXECUTION="autograde")  # what nbgrader sets while it executes
    try:
        run_sync(km.start_kernel)(extra_arguments=args, cwd=str(autograded_dir), env=env)
    except Exception:  # noqa: BLE001 - nbclient starts one the usual way
        return
    ctx["kernel"] = km


def _drop_early_kernel() -> None:
    """Stop a kernel started early that nbgrader's run did not take (the notebook ended before)."""
    km = _CONTEXT.pop("kernel", None)
    if km is not None:
        from jupyter_core.utils import run_sync

        try:
            run_sync(km.shutdown_kernel)(now=True)
        except Exception:  # noqa: BLE001 - killed with the job's other processes right after
            pass


def _course_config(root: Path, lesson_id: str, options: Options, gradebook: Path) -> Any:
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    cfg = Config(PyFileConfigLoader("nbgrader_config.py", path=str(course.ROOT)).load_config())
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
    cfg.OverwriteCells.add_missing_cells = True
    cfg.Autograde.autograde_preprocessors = list(JOB_PREPROCESSORS)
    cfg.Autograde.pre_convert_hook = None  # the job's private gradebook was made with its lesson in it
    return cfg


# what nbgrader runs after sanitizing a submission (nbgrader_config.py names the same list)
AUTOGRADE_PREPROCESSORS = (
    "grader.classroom.autograde.IndependentChecks",
    "grader.classroom.autograde.GuardedExecute",
    "grader.classroom.autograde.ApplyVerdicts",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "grader.classroom.cells.CapOutputs",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
)
# what a job leaves out: it grades into a throw-away copy of the gradebook, and the run applies
# these two to the final notebook in the course's gradebook (grading.write_grades)
GRADEBOOK_WRITERS = ("nbgrader.preprocessors.SaveAutoGrades", "nbgrader.preprocessors.AssignLatePenalties")
JOB_PREPROCESSORS = tuple(p for p in AUTOGRADE_PREPROCESSORS if p not in GRADEBOOK_WRITERS)


_PRIVATE: dict[str, Path] = {}


def _private_gradebook() -> Path:
    """Where this process's jobs keep their copy of the gradebook: one path for all of them.

    nbgrader opens a gradebook about ten times per notebook, each time with a new SQLAlchemy engine
    that compiles every statement afresh (about 50 ms per notebook). With one path, one engine
    (``gradebooks.reuse_engines``) serves every job of the process, its compiled statements with it.
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
        atexit.register(shutil.rmtree, _PRIVATE["dir"], True)
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

        gradebooks.reuse_engines()
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
    except CouldNotGrade as e:
        result.status = "could not be graded"
        result.error = f"could not be graded: {e}"
    except Exception:  # noqa: BLE001 - never let one submission stop the class
        result.status = "grading failed"
        result.error = traceback.format_exc()[-4000:]
    finally:
        _abandon_checks()
        shutil.rmtree(root, ignore_errors=True)
        _private_gradebook().unlink(missing_ok=True)
        _close_box()
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
    _new_context(
        root,
        lesson,
        opts,
        deny,
        job=True,
        timestamp=job.timestamp,
        student=job.student,
        submission=_digest(job.notebook),
    )
    autograded_dir = course_dir / "autograded" / PRIVATE_STUDENT / job.lesson
    _configure_kernels(root, autograded_dir, deny, opts)

    t0 = time.perf_counter()
    watchdog = threading.Timer(opts.notebook_timeout, _stop_notebook)
    watchdog.daemon = True
    watchdog.start()
    try:
        from nbgrader.apps import NbGraderAPI

        course.ensure_tools_on_path()
        gradebooks.reuse_engines()
        cfg = _course_config(root, job.lesson, opts, gradebook)
        _start_early(_as_restored(predicted, lesson), autograded_dir, cfg)
        api = NbGraderAPI(config=cfg)
        outcome = api.autograde(job.lesson, PRIVATE_STUDENT, force=True, create=True)
    finally:
        watchdog.cancel()
        _drop_early_kernel()
        _kill_kernels()
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


def _stop_notebook() -> None:
    """The whole notebook ran too long: kill its kernel (the executor then marks the rest)."""
    _CONTEXT["notebook_timed_out"] = True
    kernels.kill_all()
