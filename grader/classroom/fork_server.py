"""A fork server: one process that has imported PyTorch and the kernel once, and forks per use.

Starting a kernel and importing torch costs about 1.5 s of CPU; forking a process that did both
costs a few milliseconds. A worker asks it, over a pipe (or a run's workers over a socket), for a
``kernel``, a ``trusted`` process (which forks its own guarded ``sandbox`` child before it imports
the checks), or, from the sealed server only, a ``sandbox`` alone that a ``trusted`` process of the
other server talks to through two named pipes. Who runs which server, and where: the picture of
one grading run in ``docs/ARCHITECTURE.md``; the worker's side is ``fork_client``.

A server that forks student code imports nothing of the grading package but this module and the
guard, so no forked process has the hidden reference in memory. After each job, ``reset`` kills
what it forked for that worker; when a worker goes away (end of its pipe or connection) the server
kills what it forked for it, and a worker's own server then exits.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import linecache
import os
import resource
import select
import signal
import sys
import time
import traceback
from typing import Any

# what a kernel needs, what every lesson's setup cell imports and a kernel loads at its first cell, and
# what IPKernelApp.initialize loads in every kernel
PRELOAD = tuple(
    "torch numpy IPython ipykernel.kernelapp ipykernel.ipkernel attention_course attention_course.data "
    "attention_course.checks IPython.core.completerlib IPython.core.oinspect sqlite3 bdb IPython.core.debugger "
    "IPython.extensions.storemagic psutil tornado.platform.asyncio".split()
)


# ---------------------------------------------------------------- the server


def _reap(*_: Any) -> None:
    """Reap the children that ended, each after killing what is left of its process group.

    The group is killed while the ended child is still a zombie, whose process id (the group's id)
    no other process can have been given: once reaped, that number may be reused by any process
    of the machine, so no one signals a group of ours by number afterwards.
    """
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or not info.si_pid:
            return
        pid = info.si_pid
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)  # whatever the child started in its group (it leads one)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            continue
        _children.discard(pid)
        _owner.pop(pid, None)
        _exited[pid] = os.waitstatus_to_exitcode(status)
        cgroup = _cgroup_of.pop(pid, None)
        if cgroup is not None:
            _ended_cgroups.add(cgroup)
        init = _inits.pop(pid, None)
        if init is not None:  # not reaped yet (it never ends by itself): the pid is still its own
            with contextlib.suppress(OSError):
                os.kill(init, signal.SIGKILL)  # and with it everything left in the namespace


_children: set[int] = set()
_owner: dict[int, int] = {}  # a child's worker (the descriptor it asks on): a reset ends that worker's alone
_cgroup_of: dict[int, str] = {}  # a child's cgroup (sealed, where the worker made cgroups)
_ended_cgroups: set[str] = set()  # cgroups of children that ended, to be removed
_inits: dict[int, int] = {}  # a child's PID namespace's process 1 (sealed, root): killed when the child ends
_IN_NEW_PID_NS = False  # in a child: forked into a PID namespace the server made for it
_exited: dict[int, int] = {}  # exit codes of children that ended (polled by a sealed fork server's worker)


def _child_common(req: dict) -> None:
    """What every child does first: own session and process group (Linux schedules a session as one group:
    a thousand busy processes take one notebook's CPU share, quota or not), default signals, quiet stdio."""
    os.setsid()  # (the server sets no group first: a group leader cannot make a session)
    with contextlib.suppress(OSError, ValueError):  # its worker's cores (``ForkServer._cores``), no others
        os.sched_setaffinity(0, req.get("cores") or os.sched_getaffinity(0))
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
        mpl = sys.modules.get("matplotlib")
        if mpl is not None and os.environ.get("MPLBACKEND"):
            # matplotlib read MPLBACKEND when this server loaded it: a kernel's is its inline backend
            # (a figure becomes an output), a sandbox's Agg. pyplot picks it at its first figure.
            with contextlib.suppress(Exception):  # an unknown backend: matplotlib says so at the first figure
                mpl.rcParams["backend"] = os.environ["MPLBACKEND"]
    threads = int(req.get("threads") or 0)
    if threads and "torch" in sys.modules:
        # several notebooks run side by side: one thread each avoids oversubscribing the cores
        sys.modules["torch"].set_num_threads(threads)


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):  # best effort; not on every platform
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def _enter_boundary(req: dict) -> None:
    """In a sealed fork server: the notebook's own namespaces, no privilege, the seccomp filter
    (``boundary``), before anything of the student's runs. Outside the seal there is none."""
    if "--sealed" in sys.argv:
        from . import boundary

        memory = req.get("memory") or (req.get("sandbox") or {}).get("memory")
        writable = [p for p in req.get("writable") or [] if p]
        cpus = int(req.get("threads") or 0)  # as many cores as it may use threads (0: all)
        boundary.enter(writable, in_new_pid_namespace=_IN_NEW_PID_NS, memory=memory, cpus=cpus)
        tmp = os.environ.get("TMPDIR")
        if tmp and os.path.isdir(tmp) and os.access(tmp, os.W_OK):
            os.environ["HOME"] = tmp  # the seal's /tmp is not the notebook's to write in


def _run_kernel(req: dict) -> None:
    from . import guard

    _enter_boundary(req)
    guard.first_to_go()
    # capped on what the student's code adds: not the forked libraries (1 GiB, shared), nor the kernel's threads
    guard.limit_memory(req.get("memory"), beyond_now=True, final=False)
    guard.install(req["guard"])
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(req["argv"])
    guard.limit_memory(req.get("memory"), beyond_now=True)
    # IPython formats every error of a cell twice: for the output, and for its session history (read only
    # by ``%notebook``); the history keeps Python's plain traceback instead (a millisecond, not tens)
    app.shell._format_exception_for_storage = _plain_error_record
    app.start()


def _plain_error_record(exception: BaseException, *_: Any, **__: Any) -> dict:
    """An error as the history keeps it, in Python's own traceback format."""
    return {
        "ename": type(exception).__name__,
        "evalue": str(exception),
        "traceback": traceback.format_exception(type(exception), exception, exception.__traceback__),
    }


def _open_pipes(pipes: dict, sandbox_side: bool) -> tuple[int, int]:
    """Open the two named pipes between a sealed sandbox and its trusted process (in the same order)."""
    first = os.open(pipes["to_sandbox"], os.O_RDONLY if sandbox_side else os.O_WRONLY)
    second = os.open(pipes["from_sandbox"], os.O_WRONLY if sandbox_side else os.O_RDONLY)
    return (first, second) if sandbox_side else (second, first)  # (read, write)


def _run_sandbox(req: dict) -> None:
    """The sandbox alone (sealed fork server): its trusted process is a child of the other fork server."""
    rfd, wfd = _open_pipes(req["pipes"], sandbox_side=True)
    _enter_boundary(req)
    from . import sandbox

    sandbox.serve(rfd, wfd, req["sandbox"])


# what this process forks on request; the fork server outside the seal adds "trusted"
# (grader/classroom/trusted_server.py), which runs the checks and needs the grading package
ROLES: dict[str, Any] = {"kernel": _run_kernel, "sandbox": _run_sandbox}


def _operate(req: dict) -> dict:
    """Requests about children rather than new ones: poll, signal, reset."""
    op = req.get("op")
    pid = int(req.get("pid") or 0)
    if op == "poll":
        if pid in _children:
            return {"returncode": None}
        return {"returncode": _exited.get(pid, -1)}
    if op == "signal":
        if pid in _children:
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    kill(pid, int(req["signal"]))
                    break
        return {"ok": True}
    if op == "preload":
        loaded = _preload([m for m in req.get("modules") or [] if m not in sys.modules])
        if loaded:
            _freeze()
        return {"loaded": loaded}
    return {"error": f"unknown request {op!r}"}


def _freeze() -> None:
    """Keep what the server has loaded out of its children's garbage collections (``gc.freeze``): a
    child's first full collection otherwise walks every object of PyTorch, IPython and the rest (about
    0.1 s in each kernel, sandbox and trusted process), and leaves their pages shared with the server."""
    gc.freeze()  # no collection first: it cost 0.1 s of every server's start and freed a few hundred objects


def _preload(modules: list[str]) -> list[str]:
    """Import what a lesson's own cells import (``matplotlib.pyplot``: about 0.2 s in every kernel,
    sandbox and trusted process of lessons 02-11), once for all the children forked after."""
    loaded = []
    for name in modules:
        if name.split(".")[0] in ("grader", "attention_course", "course_runtime"):
            continue  # never the grading package here; the student helpers are loaded as they should be
        try:
            __import__(name)
            loaded.append(name)
        except Exception:  # noqa: BLE001 - a module this machine lacks: the child fails as it would anyway
            pass
    return loaded


def _load_kernel_without_debugger() -> None:
    """Load ipykernel's debugger module with debugpy kept out of it.

    A grading kernel is never debugged (nbclient sends no debug requests), and importing debugpy
    for it took about 65 ms of every kernel's start. ``debugpy`` itself stays importable for
    student code.
    """
    if "debugpy" in sys.modules or "ipykernel.debugger" in sys.modules:
        return
    sys.modules["debugpy"] = None  # type: ignore[assignment] - makes "import debugpy" fail here
    try:
        import ipykernel.debugger  # noqa: F401 - it then records that no debugger is available
    except Exception:  # noqa: BLE001 - without ipykernel only the speed is lost
        pass
    finally:
        del sys.modules["debugpy"]


def _warm_tracebacks() -> None:
    """Format an error as a graded kernel does (after every import), and parse the files a failing check's
    traceback shows: a kernel's first traceback loads stack_data and Pygments and finds every module's
    file, and each parses the files of its frames; 0.05 to 0.1 s per error of a graded notebook."""
    cell = "/warm-up/cell.py"
    source = "def _f(x):\n    return x.missing\n_f(None)\n"
    linecache.cache[cell] = (len(source), None, source.splitlines(True), cell)
    try:
        import stack_data
        from IPython.core import ultratb

        try:
            exec(compile(source, cell, "exec"), {})
        except AttributeError:
            handler = ultratb.AutoFormattedTB(mode="Context", theme_name="neutral", tb_offset=1)
            handler.structured_traceback(*sys.exc_info())
        for module in (contextlib, sys.modules["attention_course.diagnosis"]):
            parsed = stack_data.Source.for_filename(module.__file__)
            parsed.asttokens()
            parsed.pieces  # noqa: B018 - computed once, kept by every child
    except Exception:  # noqa: BLE001 - another IPython or course package: only the speed is lost
        pass
    finally:
        linecache.cache.pop(cell, None)


def serve(load_checks: Any = None) -> None:
    """The fork server's main loop: read one JSON request per line, fork, answer with the pid.

    ``load_checks``: what a server that forks trusted processes only (``--trusted-only``) loads
    instead of the kernel (given by grader/classroom/trusted_server.py)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    data = resource.getrlimit(resource.RLIMIT_DATA)[1]  # a grading worker's cap on its own data is not ours
    resource.setrlimit(resource.RLIMIT_DATA, (data, data))
    trusted_only = "--trusted-only" in sys.argv
    if trusted_only and load_checks is not None:
        load_checks()
    elif not trusted_only:
        for name in PRELOAD:
            with contextlib.suppress(Exception):  # a missing optional module only costs speed
                __import__(name)
        _load_kernel_without_debugger()
        with contextlib.suppress(Exception):  # the sandboxes' 'meta' pass of the hidden checks (0.3 s)
            __import__("attention_course.checks").checks.warm_meta()
    with contextlib.suppress(Exception):  # a tensor's first printing, saving and loading: 5-10 ms a child
        torch, buffer = sys.modules["torch"], io.BytesIO()
        torch.save([torch.ones(2, 2) / 3, repr(torch.ones(1))], buffer)
        torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    if not trusted_only:
        _warm_tracebacks()  # last: it notes every module loaded so far
    from . import guard  # noqa: F401 - loaded once, before any fork

    if "--sealed" in sys.argv:
        from . import boundary

        boundary.protect_server()  # nothing of the same user can open its /proc files or attach to it
        boundary.AREA = os.getcwd()  # the seal's writable folder: each child sees only its own part
        cgroups = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--cgroups=")), "")
        boundary.CGROUPS = [c for c in cgroups.split(":") if c]  # each child makes one of its own there
    _freeze()
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the worker, which closes us
    listen = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--listen-fd=")), None)
    _serve(listen, trusted_only)
    for pid in list(_children):
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(OSError):
                kill(pid, signal.SIGKILL)
    # nothing is left to save: leave without tearing down PyTorch and the rest module by module,
    # which costs a few tenths of a second of CPU that whoever closed this server waits out
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve(listen_fd: int | None, trusted_only: bool) -> None:
    """Answer the worker that started this server, on stdin and stdout, until stdin ends; or (a server
    shared by a grading run's workers) every worker that connects to the listening socket ``listen_fd``,
    each on its own connection, in the order it asked, until stdin (from the run) ends. A worker's
    ``reset``, and the end of its connection, kill the children forked for it alone. The socket lives in
    a folder only the instructor can open, outside the seal, and no child keeps a descriptor of it."""
    import socket

    listener = None if listen_fd is None else socket.socket(fileno=listen_fd)
    peers: dict[int, list] = {}  # a worker's descriptor: [where to answer, what it sent unanswered]

    def greet(read: int, write: int) -> None:
        peers[read] = [write, b""]
        _send(write, b'{"ready": true}\n')

    if listener is None:
        greet(0, 1)
    while True:
        ready, _, _ = select.select([0, *peers, *([listener] if listener else [])], [], [])
        if listener is not None and 0 in ready and not os.read(0, 4096):
            return
        if listener is not None and listener in ready:
            conn = listener.accept()[0].detach()
            greet(conn, conn)
        for read in [r for r in ready if r in peers]:
            write, buffer = peers[read]
            try:
                data = os.read(read, 65536)
            except OSError:
                data = b""
            if not data:  # that worker is done (or gone): so are the notebooks it had
                _end(read)
                del peers[read]
                if read == 0:
                    return
                os.close(read)
                continue
            *lines, peers[read][1] = (buffer + data).split(b"\n")
            for line in lines:
                req = json.loads(line)
                reset = req.get("op") == "reset"
                answer = {"killed": _end(read)} if reset else _answer(req, trusted_only, read)
                _send(write, json.dumps(answer).encode() + b"\n")


def _send(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # a worker gone: its connection ends
        while data:
            data = data[os.write(fd, data) :]


def _end(worker: int) -> int:
    """Kill the children forked for this worker, and the PID namespaces they lead; how many ran. (Only
    children not reaped yet: a pid Linux gave to another worker's child since is that worker's.)"""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # none reaped (its pid reused) meanwhile
    running = {pid for pid in list(_children) if _owner.get(pid) == worker}
    ending = []  # a descriptor per child, readable once it has ended
    for pid in running:
        with contextlib.suppress(OSError):
            ending.append(os.pidfd_open(pid))
        for kill, target in ((os.killpg, pid), (os.kill, pid), (os.kill, _inits.get(pid))):
            if target:
                with contextlib.suppress(OSError):
                    kill(target, signal.SIGKILL)
    deadline, opened = time.monotonic() + 0.1, list(ending)
    while running & _children and time.monotonic() < deadline:  # ended and reaped before the worker goes on
        ended = select.select(ending, [], [], 0.01)[0]  # as one ends, or 10 ms (no pidfd on this Linux)
        ending = [fd for fd in ending if fd not in ended]
        _reap()
    for fd in opened:
        os.close(fd)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    return len(running)


def _answer(req: dict, trusted_only: bool, worker: int) -> dict:
    """One request's answer: an operation's result, or the pid of the child forked for it."""
    global _IN_NEW_PID_NS
    if "op" in req:
        return _operate(req)
    role = ROLES.get(req.get("role"))
    why = f"unknown role {req.get('role')!r}" if role is None else None
    if trusted_only and not (req.get("role") == "trusted" and req.get("pipes")):
        why = "this fork server forks only sealed trusted processes"
    if why:
        return {"error": why}
    # no reaping between fork() and noting the child: its exit code must not be lost or stale
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    init = cgroup = None
    if "--sealed" in sys.argv and role in (_run_kernel, _run_sandbox):
        from . import boundary

        if boundary.CGROUPS:  # the cgroups of notebooks that ended; one named for the next child
            _ended_cgroups.intersection_update(boundary.remove_cgroups(boundary.CGROUPS, _ended_cgroups))
            cgroup = boundary.CGROUP_NAME = f"notebook-{os.urandom(6).hex()}"
        init = boundary.new_pid_namespace()
    pid = os.fork()
    if pid != 0 and init is not None:
        boundary.restore_pid_namespace()
    if pid == 0:
        code = 0
        try:
            _IN_NEW_PID_NS = init is not None
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            _child_common(req)
            role(req)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - report, then leave without running the server's cleanup
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    _exited.pop(pid, None)  # a pid of this namespace used before
    _children.add(pid)
    _owner[pid] = worker
    if init is not None:
        _inits[pid] = init
    if cgroup is not None:
        _cgroup_of[pid] = cgroup
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    return {"pid": pid}


if __name__ == "__main__":
    serve()
