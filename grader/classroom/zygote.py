"""A fork server: one process that has imported PyTorch and the kernel once, and forks per use.

Starting a Jupyter kernel and importing torch costs about 1.5 s of CPU per
notebook; forking a process that already did both costs a few milliseconds.
Each grading worker starts one zygote (``python -m grader.classroom.zygote``)
and asks it, over a pipe, for:

- ``kernel``: an IPython kernel for one notebook (a fresh process each time,
  with a memory cap and the guard's audit hook in place before student code);
- ``trusted``: the process that re-decides test verdicts outside the kernel; it
  first forks its own ``sandbox`` child (guarded, unable to import the grading
  package) that runs the student's code, and only then imports the checks.

The zygote imports nothing from the grading package but this module and the
guard, so a forked sandbox has no hidden reference in memory. Children are in
their own process group; when the worker goes away (EOF on the pipe) the
zygote kills them all and exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from typing import Any

PRELOAD = ("torch", "numpy", "IPython", "ipykernel.kernelapp", "ipykernel.ipkernel", "attention_course")


# ---------------------------------------------------------------- the server


def _reap(*_: Any) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _children.discard(pid)


_children: set[int] = set()


def _child_common(req: dict) -> None:
    """What every child does first: own process group, default signals, quiet stdio."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    log = req.get("log")
    null = os.open(os.devnull, os.O_RDWR)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if log else null
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.closerange(3, 1024)
    if req.get("cwd"):
        os.chdir(req["cwd"])
    if req.get("env") is not None:
        os.environ.clear()
        os.environ.update(req["env"])
    threads = int(req.get("threads") or 0)
    if threads and "torch" in sys.modules:
        # several notebooks run side by side: one thread each avoids oversubscribing the cores
        sys.modules["torch"].set_num_threads(threads)


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort; not on every platform
        pass


def _run_kernel(req: dict) -> None:
    from grader.classroom import guard

    guard.limit_memory(req.get("memory"))
    guard.install(req["guard"])
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(req["argv"])
    app.start()


def _run_trusted(req: dict) -> None:
    """Fork the sandbox first (before anything trusted is loaded), then evaluate."""
    to_sandbox_r, to_sandbox_w = os.pipe()
    from_sandbox_r, from_sandbox_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(to_sandbox_w)
        os.close(from_sandbox_r)
        os.setpgid(0, 0)
        _die_with_parent()
        from grader.classroom import sandbox

        try:
            sandbox.serve(to_sandbox_r, from_sandbox_w, req["sandbox"])
        finally:
            os._exit(0)
    os.close(to_sandbox_r)
    os.close(from_sandbox_w)
    from grader.classroom import trusted

    trusted.main(req["job"], to_sandbox_w, from_sandbox_r, pid)


ROLES = {"kernel": _run_kernel, "trusted": _run_trusted}


def serve() -> None:
    """The zygote's main loop: read one JSON request per line, fork, answer with the pid."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a missing optional module only costs speed
            pass
    import grader.classroom.guard  # noqa: F401 - loaded once, before any fork

    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the worker, which closes us
    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer
    stdout.write(b'{"ready": true}\n')
    stdout.flush()
    while True:
        try:
            line = stdin.readline()
        except InterruptedError:
            continue
        if not line:
            break
        req = json.loads(line)
        role = ROLES.get(req.get("role"))
        if role is None:
            stdout.write(json.dumps({"error": f"unknown role {req.get('role')!r}"}).encode() + b"\n")
            stdout.flush()
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _child_common(req)
                role(req)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:  # noqa: BLE001 - report, then leave without running the server's cleanup
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        _children.add(pid)
        stdout.write(json.dumps({"pid": pid}).encode() + b"\n")
        stdout.flush()
    for pid in list(_children):
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass


# ---------------------------------------------------------------- the client


class ForkedProcess:
    """A Popen look-alike for a process forked by the zygote (not our child).

    Exit is observed with a pidfd, which works for any process; the exit code is
    not known here (the zygote reaps), so a finished process reports -1.
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
            try:
                signal.pidfd_send_signal(self._fd, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Zygote:
    """The worker's handle on its fork server (started on first use, restarted if it died)."""

    def __init__(self, env: dict[str, str] | None = None):
        self._env = env
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _start(self) -> None:
        env = dict(self._env or os.environ)
        env.setdefault("MPLBACKEND", "Agg")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "grader.classroom.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        first = self._proc.stdout.readline()
        if not first.startswith(b'{"ready"'):
            raise RuntimeError(f"the fork server did not start: {first!r}")

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def ensure(self) -> None:
        """Start the fork server unless it is running."""
        with self._lock:
            if not self.alive():
                self._start()

    def fork(self, role: str, **request: Any) -> ForkedProcess:
        with self._lock:
            if not self.alive():
                self._start()
            assert self._proc is not None and self._proc.stdin and self._proc.stdout
            self._proc.stdin.write(json.dumps({"role": role, **request}).encode() + b"\n")
            self._proc.stdin.flush()
            answer = json.loads(self._proc.stdout.readline() or b'{"error": "the fork server died"}')
        if "pid" not in answer:
            raise RuntimeError(answer.get("error", "the fork server failed"))
        return ForkedProcess(answer["pid"])

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=5)
            except Exception:  # noqa: BLE001
                self._proc.kill()
            self._proc = None


if __name__ == "__main__":
    serve()
