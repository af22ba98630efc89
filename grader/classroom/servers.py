"""A grading worker's two fork servers (``grader.classroom.fork_server``), and its warm-up.

- ``plain()``: forks the trusted processes (and, without bubblewrap, kernels and sandboxes);
- ``sealed()``: started inside the seal (``grader.classroom.seal``), forks kernels and sandboxes.

Both are started once per worker process and kept for every job it grades; where the seal
works, the local workers of one run share a single trusted-only ``plain`` server instead
(``SharedTrusted``, started by the run, reached on a Unix socket). This module
imports nothing heavy, so that a new worker starts them before it imports nbgrader: the
servers load PyTorch while the worker loads the rest.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
from pathlib import Path

from grader.classroom import seal
from grader.classroom.executors import RUN_AREA
from grader.classroom.fork_client import ForkServer, plain_command
from grader.classroom.trees import remove_tree

# the Unix socket of the trusted-only fork server that a grading run shares among its workers
SHARED_TRUSTED = "ATTENTION_COURSE_TRUSTED_SERVER"
# variables a student kernel must not see (they lead to the real gradebook, or the grading run)
SCRUBBED_ENV = ("ATTENTION_COURSE_WORK", "JPY_PARENT_PID", SHARED_TRUSTED, RUN_AREA)

# what a worker loads before its first job (nbgrader, and what the first job would load): imported
# during the warm-up, or once for all workers by the forkserver they are forked from
WORKER_MODULES = ("grader.classroom.preloaded",)

PLAIN: ForkServer | None = None
SEALED: ForkServer | None = None
_AREA: str | None = None


def kernel_env(env: dict[str, str] | None) -> dict[str, str]:
    """The environment of a student's kernel: ``env`` (default: this process's) without what leads
    to the course's work folder."""
    clean = dict(env if env is not None else os.environ)
    for name in SCRUBBED_ENV:
        clean.pop(name, None)
    clean.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    return clean


def plain() -> ForkServer:
    """The fork server outside the seal (started on first use). Where the seal works, it forks
    only trusted processes (each talks to a sandbox in the seal) and has the checks loaded."""
    global PLAIN
    trusted_only = seal.available()[0]
    if PLAIN is not None and PLAIN.trusted_only != trusted_only:  # the seal was turned on or off since
        PLAIN.close()
        PLAIN = None
    if PLAIN is None:
        env = dict(os.environ)
        env.pop("ATTENTION_COURSE_WORK", None)
        address = env.pop(SHARED_TRUSTED, None)
        PLAIN = ForkServer(env, trusted_only=trusted_only, address=address)
        atexit.register(PLAIN.close)
    return PLAIN


class SharedTrusted:
    """One trusted-only fork server for all the workers of a grading run on this machine (each
    connects to it instead of starting its own: one PyTorch and checks import fewer per worker).

    Only where the seal works: that server forks nothing but trusted processes, which run no
    student code, and its socket is in a folder of this user's that the seal does not show.
    Workers find it by ``SHARED_TRUSTED`` in their environment; ``close`` stops it.
    """

    def __init__(self) -> None:
        import socket
        import subprocess

        self.folder = tempfile.mkdtemp(prefix="classroom-trusted-", dir=seal.short_tmp())
        self.address = os.path.join(self.folder, "socket")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.address)
            listener.listen(64)
            env = dict(os.environ)
            for name in ("ATTENTION_COURSE_WORK", SHARED_TRUSTED):
                env.pop(name, None)
            env.setdefault("MPLBACKEND", "Agg")
            self._proc = subprocess.Popen(
                plain_command(trusted_only=True) + [f"--listen-fd={listener.fileno()}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                env=env,
                pass_fds=(listener.fileno(),),
                start_new_session=True,
            )
        except OSError:
            remove_tree(self.folder)
            raise
        finally:
            listener.close()  # the server holds it now: connections queue until it serves them
        self._saved = os.environ.get(SHARED_TRUSTED)
        os.environ[SHARED_TRUSTED] = self.address

    def close(self) -> None:
        if self._saved is None:
            os.environ.pop(SHARED_TRUSTED, None)
        else:
            os.environ[SHARED_TRUSTED] = self._saved
        try:
            self._proc.stdin.close()  # the server ends, and kills what it forked
            self._proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - it did not end in time
            self._proc.kill()
            self._proc.wait()
        remove_tree(self.folder)


def share_trusted(workers: int) -> SharedTrusted | None:
    """The shared trusted-only fork server for a run of ``workers`` local workers, where sharing
    one saves anything (two workers or more) and the seal works; None otherwise."""
    if workers < 2 or not seal.available()[0]:
        return None
    try:
        return SharedTrusted()
    except OSError:
        return None  # each worker starts its own, as with one worker


AREA_BYTES = 1 << 30  # where grading runs as root: the most a worker's area holds (in memory)


def sealed_area() -> str:
    """This worker's folder that the seal shows (read-write): one sub-folder per job, removed after it.

    Where grading runs as root it is a file system in memory of its own (``AREA_BYTES``), so no
    notebook can fill the machine's disk; the pages a notebook writes count against its own memory
    cap (its cgroup). Elsewhere it is a folder on disk."""
    global _AREA
    if _AREA is None:
        parent = Path(seal.short_tmp()) / f"classroom-sealed-{os.getuid()}"
        parent.mkdir(mode=0o700, exist_ok=True)
        for old in parent.iterdir():  # areas of workers that were stopped without cleaning up
            pid = old.name.split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                _drop_area(str(old))
        _AREA = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=parent)
        if os.geteuid() == 0 and seal.available()[0]:
            options = f"size={AREA_BYTES},mode=0700".encode()
            # where Linux refuses (a container that may not mount), the area stays on disk
            _libc().mount(b"tmpfs", _AREA.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options)
        atexit.register(_drop_area, _AREA)
    return _AREA


MS_NOSUID, MS_NODEV, MNT_DETACH = 0x2, 0x4, 0x2


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _drop_area(area: str) -> None:
    """Remove a worker's area, whatever its notebooks left there (its file system with it)."""
    if os.path.ismount(area):
        _libc().umount2(area.encode(), MNT_DETACH)
    remove_tree(area)


def sealed() -> ForkServer:
    """The fork server inside the seal: kernels and sandboxes of this worker are forked from it."""
    global SEALED
    if SEALED is None:
        env = kernel_env(None)
        env["MPLBACKEND"] = "Agg"
        SEALED = ForkServer(env, sealed_area=sealed_area())
        atexit.register(SEALED.close)
    return SEALED


def warm_up() -> None:
    """A new worker's first step: start its fork servers, load the grading code, then wait for them.

    The servers are started from this (the worker's main) thread, because a sealed one dies with
    the thread that started it. A failed start is retried, and reported, by the first job that
    needs the server.
    """
    started = []
    # the sealed one first: it takes longer to start, and a job needs it first (for its sandbox)
    for server in (sealed, plain) if seal.available()[0] else (plain,):
        try:
            started.append(server())
            started[-1].begin()
        except OSError:
            pass
    import importlib

    for name in WORKER_MODULES:  # loaded already where the worker was forked from the forkserver
        importlib.import_module(name)
    from grader.classroom import tamper_scan

    tamper_scan.graded_names()  # the scan's names of graded functions: every lesson's source, read once
    for server in started:
        with contextlib.suppress(RuntimeError, OSError):
            server.ensure()
    import gc

    gc.freeze()  # nbgrader's modules stay for the worker's life: its garbage collections skip them
