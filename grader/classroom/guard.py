"""Limits for the processes that run student code: an audit hook and resource limits.

Installed in a student's kernel and in the sandbox before any student code runs.
A Python audit hook (PEP 578) cannot be removed once added: it refuses to open
protected paths (the gradebook, the instructor's sources, the hidden reference),
to start other programs, to load native code through ctypes, or to signal other
processes. The sandbox also refuses to import the grading package at all.

An audit hook is not a sandbox (native code and interpreter internals can get
past it). Where bubblewrap works, both processes run sealed as well
(``grader.classroom.seal``): the protected files are then not even there, and
this hook is a second line. Where it does not, this hook is all there is, and
every result says "not sealed".

This module imports nothing from the grading package: it is loaded into
processes that must never see the hidden reference.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from typing import Any

# events that start programs, load native code or open the network
PROCESS_EVENTS = tuple(
    "subprocess.Popen os.system os.exec os.posix_spawn os.spawn os.fork os.forkpty pty.spawn os.startfile".split()
)
NATIVE_EVENTS = ("ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle")
NETWORK_EVENTS = ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo")

# event -> positions of its path arguments, and whether the event changes the file system
_CHANGES = (
    "os.remove os.rmdir os.truncate os.chmod os.chown os.utime os.mkdir os.chflags os.setxattr os.removexattr "
    "shutil.rmtree shutil.make_archive sqlite3.connect"
)
_READS = "os.listdir os.scandir os.chdir glob.glob os.getxattr os.listxattr"
_COPIES = "os.link os.symlink shutil.copyfile shutil.copytree shutil.unpack_archive"  # from a path, to a path
PATH_EVENTS = {
    "open": ((0, None),),  # reading or writing: decided by its mode and flags
    **dict.fromkeys(_CHANGES.split(), ((0, True),)),
    **dict.fromkeys(_READS.split(), ((0, False),)),
    **dict.fromkeys(_COPIES.split(), ((0, False), (1, True))),
    **dict.fromkeys(["os.rename", "shutil.move"], ((0, True), (1, True))),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def policy(
    deny: list[str],
    *,
    write_only_in: list[str] | None = None,
    read_only_in: list[str] | None = None,
    deny_imports: tuple[str, ...] = (),
    strict: bool = False,
) -> dict[str, Any]:
    """A guard policy (plain data, so it can cross a pipe).

    ``deny``: folders or files nothing may open, list, change or delete; any path
    whose name mentions "gradebook" is refused too.
    ``write_only_in``: if given, the only folders where files may be created or changed.
    ``read_only_in``: if given, the only folders whose files may be read at all.
    ``deny_imports``: top-level package names that cannot be imported.
    ``strict``: also refuse the network and any look at other processes in /proc.
    """
    events = list(PROCESS_EVENTS) + list(NATIVE_EVENTS)
    if strict:
        events += list(NETWORK_EVENTS)

    def real(paths):
        return None if paths is None else [os.path.realpath(p) for p in paths]

    return {
        "deny": real(deny),
        "write_only_in": real(write_only_in),
        "read_only_in": real(read_only_in),
        "deny_imports": list(deny_imports),
        "deny_events": events,
        "strict": strict,
    }


def first_to_go() -> None:
    """Make this process, and all it starts, the first that Linux's OOM killer ends when the machine runs out
    of memory: a notebook's own processes, never the servers that fork every notebook's (children inherit it)."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")


def limit_memory(max_bytes: int | None, beyond_now: bool = False, final: bool = True) -> None:
    """Cap the address space (or, with a GPU driver present, the data segment) of this process.

    Children inherit the limit. CUDA reserves far more address space than it
    uses, so on GPU machines the data segment is limited instead. ``beyond_now``: ``max_bytes``
    more than the process maps already (a fork with its libraries loaded). ``final``: the hard limit
    too, which an unprivileged process cannot raise again (student code cannot lift its cap).
    """
    if not max_bytes:
        return
    gpu = os.path.exists("/dev/nvidiactl")
    which = resource.RLIMIT_DATA if gpu else resource.RLIMIT_AS
    if beyond_now:
        field = "VmData:" if gpu else "VmSize:"
        with open("/proc/self/status") as status:
            max_bytes += next((int(ln.split()[1]) << 10 for ln in status if ln.startswith(field)), 0)
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        max_bytes = min(max_bytes, hard)
    resource.setrlimit(which, (max_bytes, max_bytes if final else hard))


def limit_cpu(seconds: int | None) -> None:
    """Hard stop after this much CPU time (SIGXCPU, then SIGKILL)."""
    if seconds:
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))


def install(pol: dict[str, Any]) -> None:
    """Add the audit hook described by ``pol`` to this process (for good)."""
    realpath = os.path.realpath
    fspath = os.fspath
    getpid = os.getpid
    sep = os.sep
    deny = tuple(pol.get("deny") or ())
    writable = pol.get("write_only_in")
    writable = None if writable is None else tuple(writable)
    readable = pol.get("read_only_in")
    readable = None if readable is None else tuple(readable)
    deny_imports = frozenset(pol.get("deny_imports", ()))
    deny_events = frozenset(pol.get("deny_events", ()))
    strict = bool(pol.get("strict"))
    events = dict(PATH_EVENTS)
    write_flags = _WRITE_FLAGS

    def inside(full: str, roots: tuple) -> bool:
        for d in roots:
            if full == d or full.startswith(d + sep) or d == sep:
                return True
        return False

    def refused(path: Any, writing: bool) -> bool:
        if isinstance(path, int) or path is None or path in ("", ":memory:", b""):
            return False
        try:
            p = fspath(path)
            if isinstance(p, bytes):
                p = p.decode("utf-8", "surrogateescape")
            if "gradebook" in p.lower():
                return True
            full = realpath(p)
        except Exception:  # noqa: BLE001 - a path that cannot be read is refused
            return True
        if "gradebook" in full.lower() or inside(full, deny):
            return True
        if full.startswith("/proc/"):
            part = full.split("/")[2]
            if part.isdigit() and int(part) != getpid():
                if strict or full.split("/")[3:4] in (["mem"], ["environ"], ["root"], ["cwd"]):
                    return True
        if writing and writable is not None and not inside(full, writable):
            return True
        if (
            readable is not None
            and not inside(full, readable)
            and not (writing and writable and inside(full, writable))
        ):
            return True
        return False

    def hook(event: str, args: tuple) -> None:
        if event in deny_events:
            raise PermissionError(f"not allowed while grading: {event}")
        spec = events.get(event)
        if spec is not None:
            for i, writing in spec:
                if writing is None:  # open(path, mode, flags)
                    mode = args[1] if len(args) > 1 else None
                    flags = args[2] if len(args) > 2 else 0
                    writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
                        isinstance(flags, int) and flags & write_flags
                    )
                if i < len(args) and refused(args[i], writing):
                    raise PermissionError(f"not allowed while grading: {event} {args[i]!r}")
            return
        if event == "import" and deny_imports:
            name = args[0] if args else ""
            if isinstance(name, str) and name.split(".")[0] in deny_imports:
                raise ImportError(f"No module named {name!r}")
        elif event == "os.kill":
            if args and args[0] not in (0, getpid()):
                raise PermissionError("not allowed while grading: signalling another process")
        elif event == "os.killpg":
            if args and args[0] != os.getpgid(0):
                raise PermissionError("not allowed while grading: signalling another process group")

    sys.addaudithook(hook)


class BlockImports:
    """A meta path finder that refuses some top-level packages (first line of defence)."""

    def __init__(self, names: tuple[str, ...]):
        self.names = frozenset(names)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.split(".")[0] in self.names:
            raise ImportError(f"No module named {fullname!r}")
        return None


def forget_modules(names: tuple[str, ...]) -> None:
    """Drop already-imported packages (and their submodules) from sys.modules."""
    for key in list(sys.modules):
        if key.split(".")[0] in names:
            del sys.modules[key]
