"""A grading worker's two fork servers (``grader.classroom.fork_server``), and its warm-up.

- ``plain()``: forks the trusted processes (and, without bubblewrap, kernels and sandboxes);
- ``sealed()``: started inside the seal (``grader.classroom.seal``), forks kernels and sandboxes.

Both are started once per worker process and kept for every job it grades; where the seal
works, the local workers of one run share one of each instead (``SharedServer``, started by the run,
reached on a Unix socket). This module imports nothing heavy, so that a new worker starts them before
it imports nbgrader: the servers load PyTorch while the worker loads the rest.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import gc
import importlib
import os
import tempfile
from pathlib import Path

from grader.classroom import seal
from grader.classroom.executors import RUN_AREA
from grader.classroom.fork_client import ForkServer
from grader.classroom.trees import remove_tree

# where a run's workers find the fork servers they share (their Unix sockets), and the sealed one's area
SHARED_TRUSTED, SHARED_SEALED = "ATTENTION_COURSE_TRUSTED_SERVER", "ATTENTION_COURSE_SEALED_SERVER"
SHARED_AREA = "ATTENTION_COURSE_SEALED_AREA"
SHARED = (SHARED_TRUSTED, SHARED_SEALED, SHARED_AREA)
# variables a student kernel must not see (they lead to the real gradebook, or the grading run)
SCRUBBED_ENV = ("ATTENTION_COURSE_WORK", "JPY_PARENT_PID", *SHARED, RUN_AREA)

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


class SharedServer:
    """One fork server of a kind for all the local workers of a grading run (each connects to it instead
    of starting its own: one PyTorch import fewer per worker): the trusted-only one, or with ``sealed``
    the one inside the seal, whose area holds every worker's job folders.

    Only where the seal works: the trusted-only server forks nothing but trusted processes, and both
    sockets are in a folder of this user's that the seal does not show. Workers find them by
    ``SHARED_TRUSTED``, ``SHARED_SEALED`` and ``SHARED_AREA`` in their environment; ``close`` stops it.
    """

    def __init__(self, sealed: bool = False, workers: int = 2) -> None:
        import socket

        self.folder = tempfile.mkdtemp(prefix="classroom-shared-", dir=seal.short_tmp())
        self.address = os.path.join(self.folder, "socket")
        self._names = (SHARED_SEALED, SHARED_AREA) if sealed else (SHARED_TRUSTED,)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.address)
            listener.listen(64)
            hidden = ("ATTENTION_COURSE_WORK", *SHARED)
            env = kernel_env(None) if sealed else {k: v for k, v in os.environ.items() if k not in hidden}
            if sealed:
                env["MPLBACKEND"] = "Agg"
            area = sealed_area() if sealed else None
            for i in range(workers if sealed else 0):  # each worker's part of the area (``_claim``)
                os.makedirs(os.path.join(area, f"part-{i}"), mode=0o700, exist_ok=True)
                _in_memory(os.path.join(area, f"part-{i}"))
            self.server = ForkServer(env, area, trusted_only=not sealed, listen_fd=listener.fileno())
            self.server.begin()
        except OSError:
            remove_tree(self.folder)
            raise
        finally:
            listener.close()  # the server holds it now: connections queue until it serves them
        self._saved = {name: os.environ.pop(name) for name in self._names if name in os.environ}
        os.environ.update(zip(self._names, (self.address, area or "")))

    def close(self) -> None:
        for name in self._names:
            os.environ.pop(name, None)
        os.environ.update(self._saved)  # as before the run
        self.server.close()  # the server ends, and kills what it forked
        remove_tree(self.folder)


def share_servers(workers: int) -> list[SharedServer]:
    """The fork servers shared by a run of ``workers`` local workers, where sharing saves anything (two
    workers or more) and the seal works; none otherwise (each worker starts its own)."""
    shared: list[SharedServer] = []
    if workers >= 2 and seal.available()[0]:
        for sealed in (True, False):
            with contextlib.suppress(OSError):
                shared.append(SharedServer(sealed, workers))
    return shared


AREA_BYTES = 1 << 30  # where grading runs as root: the most a worker's area (or part) holds, in memory


def sealed_area() -> str:
    """The folder the seal shows (read-write): a folder per job, removed after it. A worker whose run
    shares the sealed server has a part of the run's area that no other worker holds (``_claim``).

    Where grading runs as root, each is a file system in memory of its own (``AREA_BYTES``), so no
    notebook can fill the machine's disk or a classmate's area; the pages a notebook writes count
    against its own memory cap (its cgroup). Elsewhere it is a folder on disk."""
    global _AREA
    if os.environ.get(SHARED_SEALED) and os.path.isdir(os.environ.get(SHARED_AREA) or ""):
        return _claim(os.environ[SHARED_AREA])
    if _AREA is None:
        parent = Path(seal.short_tmp()) / f"classroom-sealed-{os.getuid()}"
        parent.mkdir(mode=0o700, exist_ok=True)
        for old in parent.iterdir():  # areas of workers that were stopped without cleaning up
            pid = old.name.split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                _drop_area(str(old))
        _AREA = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=parent)
        _in_memory(_AREA)
        atexit.register(_drop_area, _AREA)
    return _AREA


def _in_memory(folder: str) -> None:
    """Where grading runs as root, make ``folder`` a file system in memory of ``AREA_BYTES`` (where
    Linux refuses, as in a container that may not mount, it stays on disk)."""
    if os.geteuid() == 0 and seal.available()[0] and not os.path.ismount(folder):
        from grader.classroom.boundary import _LIBC, MS_NODEV, MS_NOSUID

        options = f"size={AREA_BYTES},mode=0700".encode()
        _LIBC.mount(b"tmpfs", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options)


_CLAIMED: dict[str, str] = {}


def _claim(run_area: str) -> str:
    """This worker's part of the run's area (``SharedServer`` makes one per worker): the first that no
    living worker holds (a lock held while this process lives), or a new folder if there is none."""
    if run_area not in _CLAIMED:
        for part in sorted(Path(run_area).glob("part-*")):
            held = os.open(part / ".held", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # kept: released when this process ends
            except OSError:
                os.close(held)
                continue
            _CLAIMED[run_area] = str(part)
            break
        else:
            _CLAIMED[run_area] = tempfile.mkdtemp(prefix="worker-", dir=run_area)
    return _CLAIMED[run_area]


def _drop_area(area: str) -> None:
    """Remove a worker's area, whatever its notebooks left there (its file system with it)."""
    if os.path.ismount(area):
        from grader.classroom.boundary import _LIBC, MNT_DETACH

        _LIBC.umount2(area.encode(), MNT_DETACH)
    remove_tree(area)


def sealed() -> ForkServer:
    """The fork server inside the seal: kernels and sandboxes of this worker are forked from it."""
    global SEALED
    if SEALED is None:
        env = kernel_env(None)
        env["MPLBACKEND"] = "Agg"
        SEALED = ForkServer(env, sealed_area=sealed_area(), address=os.environ.get(SHARED_SEALED))
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
    for name in WORKER_MODULES:  # loaded already where the worker was forked from the forkserver
        importlib.import_module(name)
    from grader.classroom import tamper_scan

    tamper_scan.graded_names()  # the scan's names of graded functions: every lesson's source, read once
    for server in started:
        with contextlib.suppress(RuntimeError, OSError):
            server.ensure()
    gc.freeze()  # nbgrader's modules stay for the worker's life: its garbage collections skip them
