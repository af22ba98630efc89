"""A graded notebook's life around nbgrader's steps: its folders, its box, its kernels.

What a notebook's student code may write to (inside the seal's area when sealed, ``_open_box``), how
its kernel is started (seal, guard, memory cap: ``_configure_kernels``), plain nbgrader's notebook
begun and ended, a job's head start (``_start_early``), and everything the notebook started stopped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from grader import course
from grader.classroom import guard, kernels, lessons, seal, servers
from grader.classroom.context import _CONTEXT, CouldNotGrade, _digest, _new_context
from grader.classroom.independent import _abandon_checks, _checks_job, _discard_checks, _start_checks
from grader.classroom.jobs import Options
from grader.classroom.trees import remove_tree


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
    begin(root, lesson, opts, deny, autograded_dir, plain=True, student=student, submission=submission)
    return True


def begin(root: Path, lesson: Any, opts: Options, deny: list[str], autograded_dir: Path, **who: Any) -> None:
    """Set up one notebook's grading, the same for the course's tool and for plain nbgrader: its
    context (private folders, what it may not touch, empty records), how its kernel starts (seal,
    guard, memory cap), and the watchdog of its time limit (``opts.notebook_timeout``)."""
    _new_context(root, lesson, opts, deny, **who)
    _configure_kernels(root, autograded_dir, deny, opts)
    watchdog = threading.Timer(opts.notebook_timeout, _stop_notebook)
    watchdog.daemon = True
    watchdog.start()
    _CONTEXT["watchdog"] = watchdog
    if os.geteuid() != 0 and _CONTEXT["box"] != root:  # as root the area is 1 GiB in memory already
        _CONTEXT["disk watch"] = token = object()  # this notebook's: the watch ends with it
        threading.Thread(target=_watch_disk, args=(_CONTEXT["box"], token), daemon=True).start()


DISK_BYTES = 1 << 30  # what a notebook may keep on disk where grading is not root (its area has no cap)


def _watch_disk(box: Path, token: object) -> None:
    """Five times a second while the notebook runs: stop it once its files in ``box`` pass ``DISK_BYTES``
    (or 10,000 entries), as a notebook past its time limit is stopped, and flag it for review."""
    while _CONTEXT.get("disk watch") is token and not _CONTEXT.get("stopped"):
        used, seen, folders = 0, 0, [str(box)]
        while folders and seen < 10_000:
            try:
                entries = _listed(folders.pop())
            except PermissionError:  # a folder it keeps from the grader's user: its files cannot be counted
                used, seen = DISK_BYTES + 1, -1
                break
            except OSError:  # gone meanwhile
                continue
            with contextlib.suppress(OSError), entries:
                for entry in entries:
                    seen += 1
                    used += entry.stat(follow_symlinks=False).st_blocks * 512
                    folders += [entry.path] if entry.is_dir(follow_symlinks=False) else []
        if (used > DISK_BYTES or seen >= 10_000) and _CONTEXT.get("disk watch") is token:
            what = f"wrote over {DISK_BYTES >> 20} MB or 10,000 files on disk"
            _CONTEXT["flags"].append(
                ("kept a folder from the disk watch" if seen < 0 else what) + ": stopped"
            )
            _CONTEXT["stop"] = ("DiskLimit", "the notebook's files passed their disk limit: it was stopped")
            _kill_kernels()
            return
        threading.Event().wait(0.2)


def _listed(folder: str) -> Any:
    """``os.scandir(folder)``; a folder the notebook's code took the grader's user's read permission from
    (it runs as that user where grading is not root) gets it back first, without following a link."""
    try:
        return os.scandir(folder)
    except PermissionError:
        fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.chmod(f"/proc/self/fd/{fd}", 0o700)
        finally:
            os.close(fd)
        return os.scandir(folder)


def stop_student_code() -> None:
    """Once the notebook has run: its watchdog off, a kernel started early and not used stopped,
    its kernels killed and, in the seal, every process it left behind (once)."""
    if not _CONTEXT or _CONTEXT.get("stopped"):
        return
    watchdog = _CONTEXT.pop("watchdog", None)
    if watchdog is not None:
        watchdog.cancel()
    _drop_early_kernel()
    _kill_kernels()
    _CONTEXT["stopped"] = True


def end() -> None:
    """The notebook is done (graded or not): everything it started stopped, its private folder and
    its box deleted; later kernels start with the defaults again."""
    if _CONTEXT:
        stop_student_code()
        _abandon_checks()
        remove_tree(_CONTEXT["root"])
    _close_box()
    _CONTEXT.clear()


def _end_notebook() -> None:
    """Plain nbgrader's notebook is done (the tool's job ends in ``autograde.grade_job``)."""
    if _CONTEXT.get("plain"):
        end()


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
        remove_tree(box)
    kernels.SETTINGS = kernels.KernelSettings()


def _configure_kernels(root: Path, autograded_dir: Path, deny: list[str], opts: Options) -> None:
    """How this notebook's kernel is started: its seal, guard, memory cap and private temp folder."""
    box = _open_box(root, autograded_dir)
    sealed = box != root
    workdir = None
    if sealed and not _CONTEXT.get("job"):
        # plain nbgrader's autograded folder is not in the sealed fork server's view: the kernel works
        # in a copy of it inside the box (links copied as links, so none leads out of the seal)
        workdir = box / "autograded"
        shutil.copytree(autograded_dir, workdir, symlinks=True, dirs_exist_ok=True)
    kernel_policy = guard.policy(
        deny=deny + [str(root / "trusted"), str(root / "scratch"), str(box / "scratch"), str(box / "pipes")],
        write_only_in=[str(workdir or autograded_dir), str(box / "tmp"), os.devnull],
        deny_imports=("grader",),
    )
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
        with contextlib.suppress(RuntimeError):
            servers.SEALED.reset()


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

        with contextlib.suppress(Exception):  # killed with the job's other processes right after
            run_sync(km.shutdown_kernel)(now=True)


def _stop_notebook() -> None:
    """The whole notebook ran too long: kill its kernel (the executor then marks the rest)."""
    _CONTEXT["stop"] = ("NotebookTimeout", "the notebook ran past its time limit and was stopped")
    kernels.kill_all()
