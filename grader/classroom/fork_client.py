"""The grading side of a fork server (grader/classroom/fork_server.py): start it, ask it to fork, watch
what it forked.

A worker holds one ``ForkServer`` per kind: the sealed one (started inside bubblewrap, forking kernels
and sandboxes) and the plain one beside it (``grader/classroom/trusted_server.py``, forking the trusted
processes that decide the checks). Every request has a deadline (``ANSWER_SECONDS``, ``READY_SECONDS``):
a server that stops answering is killed and reaped, and the request fails with ``ServerTimeout``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any


class _Signals:
    def kill(self) -> None:
        """SIGKILL through the pidfd or the fork server (never by the bare id, which may belong to another
        process by now); its fork server then kills the rest of its process group when it reaps it."""
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkedProcess(_Signals):
    """A Popen look-alike for a process forked by the fork server (not our child).

    Exit is observed with a pidfd, which works for any process; the exit code is
    not known here (the fork server reaps), so a finished process reports -1.
    """

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            self._fd = None
            self.returncode = -1

    def _finished(self, timeout: float) -> bool:
        if self._fd is None:
            return True
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if ready:
            os.close(self._fd)
            self._fd = None
            self.returncode = -1
            return True
        return False

    def poll(self) -> int | None:
        self._finished(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._finished(timeout if timeout is not None else 1e9):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self._fd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._fd, sig)


class SealedProcess(_Signals):
    """A Popen look-alike for a child of a sealed fork server, known only by its pid in the seal.

    That pid means nothing outside (another PID namespace): every question and
    signal goes through the fork server, which reaps its children and knows their
    exit codes.
    """

    def __init__(self, fork_server: ForkServer, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        self._fork_server = fork_server

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = self._fork_server.request({"op": "poll", "pid": self.pid}).get("returncode")
            except RuntimeError:  # the fork server is gone, and its children with it
                self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"pid {self.pid} (sealed)", timeout)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(RuntimeError):
                self._fork_server.request({"op": "signal", "pid": self.pid, "signal": int(sig)})


class _Connection:
    """A Popen look-alike for a shared fork server reached through its Unix socket: ``stdin`` and
    ``stdout`` are the two directions of the connection; it has ended when the server closed it."""

    def __init__(self, address: str):
        import socket

        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(address)
        except OSError:
            self._sock.close()
            raise
        self.stdin = self._sock.makefile("wb")
        self.stdout = self._sock.makefile("rb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            import socket

            try:
                readable, _, _ = select.select([self._sock], [], [], 0)
                if readable and not self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                    self.returncode = -1  # the server closed the connection: it is gone
            except BlockingIOError:
                pass
            except OSError:
                self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.kill()
        return -1

    def kill(self) -> None:
        for part in (self.stdin, self.stdout, self._sock):
            with contextlib.suppress(OSError):
                part.close()
        self.returncode = -1


ANSWER_SECONDS = 30.0  # the longest a fork server may take to answer one request (a fork, a poll)
READY_SECONDS = 120.0  # ... or to start (bubblewrap, then PyTorch and the kernel imported)


class ServerTimeout(RuntimeError):
    """A fork server did not answer in time: it was killed (its children with it)."""


class ForkServer:
    """The worker's handle on its fork server (started on first use, restarted if it died).

    ``sealed_area``: start it inside bubblewrap (grader.classroom.seal), with this
    folder (the worker's per-job folders) as the only writable one.

    ``address``: a server of this kind shared by the workers of a grading run
    (``grader.classroom.servers.SharedServer``), reached through this Unix socket; if it cannot be
    reached, or once it failed to answer in time, the worker starts its own as before.
    ``listen_fd``: start a shared one, answering every connection to this listening socket (not stdout).
    """

    def __init__(
        self,
        env: dict[str, str] | None = None,
        sealed_area: str | None = None,
        trusted_only: bool = False,
        address: str | None = None,
        listen_fd: int | None = None,
    ):
        self._env = env
        self.address = address
        self.listen_fd = listen_fd
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._starting = False  # spawned, and its "ready" line not read yet
        self._unread = 0  # answers to preload requests not read yet
        self.preloaded: set[str] = set()  # modules asked for since it started
        self.sealed_area = sealed_area
        self.cgroups: list[str] | None = None  # sealed: the cgroup folders its notebooks' cgroups go in
        # forks only trusted processes that talk to a sealed sandbox (and loads the checks to fork them)
        self.trusted_only = trusted_only and sealed_area is None

    @property
    def sealed(self) -> bool:
        return self.sealed_area is not None

    def _spawn(self) -> None:
        """Start the fork server's process; ``_await_ready`` waits for it to have loaded its modules.

        Call it from a thread that outlives the server (the worker's main thread): a sealed
        server runs under ``bwrap --die-with-parent``, which kills it when the *thread* that
        started it ends.
        """
        self._proc = self._connect() or self._start_process()  # type: ignore[assignment]
        self._starting = True
        self._unread = 0
        self.preloaded = set()

    def _connect(self) -> _Connection | None:
        """A connection to the shared server, if this handle has one and it can be reached."""
        if self.address is not None:
            try:
                return _Connection(self.address)
            except OSError:
                self.address = None  # the shared server is gone: this worker starts its own
        return None

    def _start_process(self) -> subprocess.Popen:
        env = dict(self._env or os.environ)
        env.setdefault("MPLBACKEND", "Agg")
        listen = [] if self.listen_fd is None else [f"--listen-fd={self.listen_fd}"]
        # outside the seal (``--trusted-only``: forks trusted processes only)
        trusted_only = ["--trusted-only"] if self.trusted_only else []
        cmd = [sys.executable, "-m", "grader.classroom.trusted_server", *trusted_only, *listen]
        if self.sealed_area is not None:
            from grader.classroom import boundary, seal

            env = seal.sealed_env(env)
            if self.cgroups is None:
                self.cgroups = boundary.make_cgroups()
            argv = [sys.executable, "-m", f"{seal.RUNTIME_PACKAGE}.fork_server", "--sealed"]
            argv += [f"--cgroups={':'.join(self.cgroups)}", *listen]
            cmd = seal.command(
                argv, writable=[self.sealed_area, *self.cgroups], cwd=self.sealed_area, env=env
            )
        return subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if self.listen_fd is None else subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            pass_fds=() if self.listen_fd is None else (self.listen_fd,),
        )

    def _answer(self, seconds: float | None = None) -> bytes:
        """The server's next line; if none comes within ``seconds`` the server is killed (a stopped or
        wedged server costs the request that waited, never the run) and ``ServerTimeout`` raised."""
        proc = self._proc
        assert proc is not None and proc.stdout
        seconds = ANSWER_SECONDS if seconds is None else seconds
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            proc.kill()

        timer = threading.Timer(seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            line = proc.stdout.readline()
        except (OSError, ValueError):
            line = b""
        finally:
            timer.cancel()
        if expired.is_set():
            if isinstance(proc, _Connection):
                self.address = None  # a shared server that stopped answering: no second wait for it
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)  # gone before anyone asks whether it is alive
            raise ServerTimeout(f"the fork server did not answer within {seconds:.0f} s, and was stopped")
        return line

    def _await_ready(self) -> None:
        assert self._proc is not None and self._proc.stdout
        self._starting = False
        first = self._answer(READY_SECONDS)
        if not first.startswith(b'{"ready"'):
            if isinstance(self._proc, _Connection):  # the shared server went away: start our own
                self._proc.kill()
                self.address = None
                self._spawn()
                return self._await_ready()
            raise RuntimeError(f"the fork server did not start: {first!r}")

    def _ready(self) -> None:
        """Under the lock: a running, ready fork server (started now if there is none), with every
        earlier preload done (its answers read)."""
        if not self.alive():
            self._spawn()
        if self._starting:
            self._await_ready()
        while self._unread:
            assert self._proc is not None and self._proc.stdout
            self._unread -= 1
            self._answer(READY_SECONDS)  # an import of a lesson's modules

    def preload(self, modules: list[str]) -> None:
        """Have the server import these modules (those not asked for before), without waiting: its
        next fork waits for them. Started if it is not running."""
        with self._lock:
            wanted = [m for m in modules if m not in self.preloaded]
            if not wanted:
                return
            self._ready()
            assert self._proc is not None and self._proc.stdin
            try:
                self._proc.stdin.write(json.dumps({"op": "preload", "modules": wanted}).encode() + b"\n")
                self._proc.stdin.flush()
            except OSError:
                return  # it died: the next use starts another
            self._unread += 1
            self.preloaded.update(wanted)

    def begin(self) -> None:
        """Start the fork server if it is not running, without waiting for it (its first use waits)."""
        with self._lock:
            if not self.alive():
                self._spawn()

    def request(self, message: dict) -> dict:
        """Ask a running fork server about its children (never starts one)."""
        with self._lock:
            if not self.alive():
                raise RuntimeError("the fork server is not running")
            try:
                self._ready()
                assert self._proc is not None and self._proc.stdin and self._proc.stdout
                self._proc.stdin.write(json.dumps(message).encode() + b"\n")
                self._proc.stdin.flush()
                line = self._answer()
            except OSError as e:
                raise RuntimeError(f"the fork server died ({e})") from None
        if not line:
            raise RuntimeError("the fork server died")
        return json.loads(line)

    def reset(self) -> None:
        """Sealed: kill what the server forked for this worker, and all their processes (between two jobs)."""
        if self.sealed and self.alive():
            self.request({"op": "reset"})

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def ensure(self) -> None:
        """Start the fork server unless it is running."""
        with self._lock:
            self._ready()

    def _cores(self) -> list[int] | None:
        """Where a run's workers share the sealed server (each its part of the area, ``part-<i>``), the cores
        this worker's notebooks run on: a share of the run's that no other worker's notebooks use, so that
        however many busy processes a notebook starts, they cannot take a classmate's time (cgroup or not)."""
        area, name = os.path.split(self.sealed_area or "")
        if not name.startswith("part-") or not name[5:].isdigit():
            return None
        parts = sum(n.startswith("part-") for n in os.listdir(area))
        i, cores = int(name[5:]), sorted(os.sched_getaffinity(0))
        return cores[i::parts] if parts <= len(cores) else [cores[i % len(cores)]]

    def fork(self, role: str, **request: Any) -> ForkedProcess | SealedProcess:
        if self.sealed:
            request["cores"] = self._cores()
        if self.sealed and request.get("env") is not None:
            from grader.classroom import seal

            request["env"] = seal.sealed_env(request["env"])
        with self._lock:
            self._ready()
            assert self._proc is not None and self._proc.stdin and self._proc.stdout
            self._proc.stdin.write(json.dumps({"role": role, **request}).encode() + b"\n")
            self._proc.stdin.flush()
            answer = json.loads(self._answer() or b'{"error": "the fork server died"}')
        if "pid" not in answer:
            raise RuntimeError(answer.get("error", "the fork server failed"))
        if self.sealed:
            return SealedProcess(self, answer["pid"])
        return ForkedProcess(answer["pid"])

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=5)
            except Exception:  # noqa: BLE001
                self._proc.kill()
            self._proc = None
        if self.cgroups:
            from grader.classroom import boundary

            boundary.remove_cgroups(self.cgroups)
            self.cgroups = None
