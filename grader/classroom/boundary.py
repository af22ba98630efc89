"""One boundary per notebook: what a process forked to run student code does before it runs any.

Each kernel or sandbox the sealed fork server forks calls ``enter`` first. ``docs/ARCHITECTURE.md``
(one grading run, and the paragraph on the boundary) says what that gives: a PID namespace whose
process 1 only reaps orphans (``REAPER``; made by the server, ``new_pid_namespace``, or behind a
proxy where the server is not root, ``_proxy``), new mount, network, IPC and UTS namespaces with the
server's folder covered (``_conceal``), a user of the notebook's own (``UID_BASE``), no capabilities
(bounding set included), ``no_new_privs``, the seccomp filter (``seccomp_filter``), file-size and
process limits, and a cgroup of its own where the worker may make them (``make_cgroups``). The fork
server itself is non-dumpable (``protect_server``).

The rules a lesson states are checked by the trusted side and the audit hook; this module is the
wall those rest on, and needs neither. Only the standard library, loaded before any fork (``ctypes``
is never opened after the guard's audit hook is in place).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import re
import resource
import select
import signal
import struct
import sys

from .seccomp import (  # noqa: F401 - seccomp_filter is this module's to offer too
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    SECCOMP_MODE_FILTER,
    seccomp_filter,
)

# where grading runs as root, each notebook's processes get a user id of their own, drawn from this
# range (no account has one): no other notebook's processes or files are theirs, and the process
# limit, which Linux counts per user across the machine, is each notebook's alone
UID_BASE = 2_000_000_000
UID_RANGE = 1 << 24
FILE_LIMIT = 256 * 1024 * 1024  # the largest file student code may write (bytes)
TMP_SIZE = 64 * 1024 * 1024  # each of a notebook's own /var/tmp and /dev/shm (memory, bytes)
PROCESS_LIMIT = 1024  # processes and threads of a notebook (not root: of its user namespace, Linux 5.14+)
_RELEASE = tuple(int(n) for n in re.findall(r"\d+", platform.release())[:2])

MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND = 0x4000, 0x40000, 0x2, 0x4, 0x8, 0x1000
MS_RDONLY, MS_REMOUNT, MNT_DETACH = 0x1, 0x20, 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 4, 24, 38, 22
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # not Linux: grading is not sealed there anyway
    _LIBC = None


class BoundaryError(RuntimeError):
    """The boundary could not be made: the student's code must not run."""


def _check(result: int, what: str) -> None:
    if result != 0:
        e = ctypes.get_errno()
        raise BoundaryError(f"{what}: {os.strerror(e)} (errno {e})")


def _prctl(option: int, arg: int = 0) -> int:
    return _LIBC.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


def _install_seccomp(program: bytes) -> None:
    buffer = ctypes.create_string_buffer(program, len(program))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(program) // 8, ctypes.addressof(buffer))
    zero = ctypes.c_ulong(0)
    result = _LIBC.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog), zero, zero)
    _check(result, "seccomp filter")


# ---------------------------------------------------------------- privileges


def _drop_capabilities() -> None:
    """Empty this process's capabilities (effective, permitted, inheritable)."""
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two empty {effective, permitted, inheritable} sets
    nr = {"x86_64": 126, "aarch64": 91}.get(platform.machine())
    if nr is not None:
        _check(_LIBC.syscall(nr, header, data), "capset")


def _give(paths: list[str], uid: int, gid: int) -> None:
    """Hand the notebook's writable folders (and what is in them) to ``uid``: each folder is opened
    without following a link, walked by descriptor (a folder swapped for a link meanwhile is not
    entered), and handed over itself last."""
    for top in paths:
        if not top or not os.path.isabs(top):
            continue
        _passable(os.path.dirname(os.path.abspath(top)))
        try:
            fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            for _, dirs, files, dir_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
                for name in dirs + files:
                    with contextlib.suppress(OSError):
                        os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
            os.fchown(fd, uid, gid)
        finally:
            os.close(fd)


def _passable(folder: str) -> None:
    """Let every user pass through ``folder`` and the folders above it (never list them): in the
    seal those are the worker's area (0700 outside, in a 0700 folder) and bubblewrap's own."""
    import stat

    while folder and folder != "/":
        with contextlib.suppress(OSError):
            mode = os.lstat(folder).st_mode
            if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
                os.chmod(folder, stat.S_IMODE(mode) | stat.S_IXOTH)
        folder = os.path.dirname(folder)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------- a cgroup per notebook

CGROUPS: list[str] = []  # the worker's cgroup folders (memory, pids), bound into the seal writable
CGROUP_NAME: str | None = None  # set by the server just before it forks a child: that child's cgroup
CGROUP_ROOT = "/sys/fs/cgroup"


def _cgroup_parents() -> list[tuple[str, set[str]]]:
    """This process's own cgroup folders and the controllers of each that a notebook is held by
    (memory, pids, cpu): cgroup v1 has one hierarchy per controller, v2 one for all (where the
    controllers are enabled for its children)."""
    found = []
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and os.path.exists(f"{CGROUP_ROOT}/cgroup.controllers"):
            folder = CGROUP_ROOT + path.rstrip("/")
            try:
                enabled = set(open(f"{folder}/cgroup.subtree_control").read().split())
            except OSError:
                continue
            if {"memory", "pids"} <= enabled:
                found.append((folder, enabled & {"memory", "pids", "cpu"}))
        held = set(controllers.split(",")) & {"memory", "pids", "cpu"}
        if held:
            found.append((f"{CGROUP_ROOT}/{controllers}{path.rstrip('/')}", held))
    return found


def make_cgroups() -> list[str]:
    """In a worker, before its sealed fork server starts: a cgroup folder of its own under each
    controller's, where each notebook's processes get a child cgroup (``_join_cgroup``), so that the
    memory cap holds for all of a notebook's processes together (its tmpfs pages too) and its process
    count is its own. Empty where this process may not make cgroups: the caps are then per process."""
    made: list[str] = []
    parents = _cgroup_parents()
    if not {"memory", "pids"} <= set().union(*(held for _, held in parents)):
        return []
    for parent, _ in parents:
        for old in os.listdir(parent) if os.access(parent, os.W_OK) else []:
            pid = old.split("-")[2] if old.startswith("attention-course-") else ""
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):  # a worker that was stopped
                remove_cgroups([f"{parent}/{old}"])
        folder = f"{parent}/attention-course-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            os.mkdir(folder, 0o755)
        except OSError:
            remove_cgroups(made)
            return []
        made.append(folder)
    return made


def remove_cgroups(folders: list[str], names: set[str] | None = None) -> set[str]:
    """Remove the notebooks' cgroups ``names`` (their processes have ended), or, with no names, every
    notebook's cgroup and the folders themselves. Returns the names still there (busy a moment
    longer, while their processes end): the next call tries them again."""
    left: set[str] = set()
    for folder in folders:
        try:
            present = [n for n in os.listdir(folder) if n.startswith("notebook-")]
        except OSError:
            continue
        for name in present if names is None else sorted(names & set(present)):
            try:
                os.rmdir(os.path.join(folder, name))
            except OSError:
                left.add(name)
        if names is None:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
    return left


def _join_cgroup(memory: int | None, cpus: int) -> None:
    """In a child of the sealed fork server, still privileged: a cgroup of this notebook's own, with
    its memory cap (swap included), process limit and CPU quota (``cpus`` cores at most), that every
    process it starts stays in. Then the cgroup files are covered: no one else's show."""
    period = 100_000
    for parent in CGROUPS:
        mine = f"{parent}/{CGROUP_NAME or 'notebook-' + os.urandom(6).hex()}"
        os.mkdir(mine, 0o755)
        settings = [
            ("memory.max", str(memory), "memory.limit_in_bytes", str(memory)),
            ("memory.swap.max", "0", "memory.memsw.limit_in_bytes", str(memory)),
            ("pids.max", str(PROCESS_LIMIT), "pids.max", str(PROCESS_LIMIT)),
            ("cpu.max", f"{cpus * period} {period}", "cpu.cfs_quota_us", str(cpus * period)),
        ]
        for v2, v2_value, v1, v1_value in settings:
            if v2.startswith("memory") and not memory:
                continue
            for name, value in ((v2, v2_value), (v1, v1_value)):
                if os.path.exists(f"{mine}/{name}"):
                    _write(f"{mine}/{name}", value)
                    break
        _write(f"{mine}/cgroup.procs", "0")
    if CGROUPS and os.path.isdir(CGROUP_ROOT):
        flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        _check(_LIBC.mount(b"tmpfs", CGROUP_ROOT.encode(), b"tmpfs", flags, b"size=4096"), "cover cgroups")


# ---------------------------------------------------------------- entering


def protect_server() -> None:
    """Make the sealed fork server non-dumpable: no process of the same user can read its ``/proc``
    files (its pipes among them), its memory, or attach to it."""
    if _LIBC is not None:
        _prctl(PR_SET_DUMPABLE, 0)


def available() -> bool:
    return _LIBC is not None and sys.platform.startswith("linux")


_OWN_PID_NS: int | None = None  # the fork server's own PID namespace (an open descriptor)
AREA: str | None = None  # the sealed fork server's folder (every job's): a child sees only its own part
# process 1 of a namespace the server makes: reaps what the student's processes leave and does
# nothing else (``python -I -S``: no site, no environment, no descriptor of the server's)
REAPER = """\
import os, signal
for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # process 1 leaves only when killed
    signal.signal(number, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    signal.sigwait({signal.SIGCHLD})
"""


def new_pid_namespace() -> int | None:
    """In the (root) fork server, just before it forks a process for student code: make the next
    child of this process the second process of a new PID namespace whose process 1 is a
    process spawned now that only reaps (``REAPER``, no descriptor of the server's). Returns that
    process's pid, which the server kills when the child ends (and with it the namespace); None
    where this process cannot (not root): the child then makes its namespace itself (``enter``).

    The child is not process 1, which Linux shields from its own namespace's signals: student
    code that signals itself ends as it would anywhere. Made here, the namespace costs no fork
    of the server's memory beyond the child's own."""
    global _OWN_PID_NS
    if os.geteuid() != 0 or not available() or not os.path.exists(sys.executable):
        return None
    if _OWN_PID_NS is None:
        _OWN_PID_NS = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    # children in this process's own namespace again (the last one made is gone), then a new one
    if _LIBC.setns(_OWN_PID_NS, CLONE_NEWPID) != 0 or _LIBC.unshare(CLONE_NEWPID) != 0:
        return None
    null = (os.O_RDWR, 0)
    actions = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, *null) for fd in (0, 1, 2)]
    try:
        argv = [sys.executable, "-I", "-S", "-c", REAPER]
        return os.posix_spawn(sys.executable, argv, {}, file_actions=actions, setsid=True)
    except OSError:
        _LIBC.setns(_OWN_PID_NS, CLONE_NEWPID)
        return None


def restore_pid_namespace() -> None:
    """In the server, after a fork into a ``new_pid_namespace``: no later child lands in a student's namespace."""
    if _OWN_PID_NS is not None:
        _LIBC.setns(_OWN_PID_NS, CLONE_NEWPID)


def enter(
    writable: list[str], in_new_pid_namespace: bool = False, memory: int | None = None, cpus: int = 0
) -> None:
    """Called in a process just forked (one thread) to run student code: make the notebook's
    boundary and return inside it, unprivileged. The calling process becomes the proxy that the
    fork server knows (it never returns). Raises ``BoundaryError`` if any step fails: then no
    student code may run."""
    if not available():
        raise BoundaryError("no C library to make a boundary with")
    if in_new_pid_namespace:  # the server made it (``new_pid_namespace``): the rest is this process's
        _check(_LIBC.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
        _inside(True, writable, None, memory, cpus)
        return
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    root = os.geteuid() == 0 and _LIBC.unshare(flags) == 0
    if not root:  # not root, or root without the capabilities: a user namespace of the same user
        _check(_LIBC.unshare(flags | CLONE_NEWUSER), "unshare")
        # the server is non-dumpable (``protect_server``), and so is this fork of it: its /proc files
        # belong to root until it is dumpable again, for as long as it takes to write its maps
        _prctl(PR_SET_DUMPABLE, 1)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        _prctl(PR_SET_DUMPABLE, 0)
    ready_r, ready_w = os.pipe()
    alive_r, alive_w = os.pipe()  # held open by the proxy for as long as it lives
    pid = os.fork()
    if pid != 0:
        os.close(ready_w)
        os.close(alive_r)
        _proxy(pid, ready_r)
    os.close(ready_r)
    os.close(alive_w)
    try:
        _inside(root, writable, alive_r, memory, cpus)
    except BaseException as e:  # noqa: BLE001 - whatever failed, no student code runs
        os.write(ready_w, f"{type(e).__name__}: {e}".encode()[:500])
        os._exit(70)
    os.close(ready_w)
    # process 1 stays a plain init: Linux shields it from the signals of its own namespace, and the
    # student's code, which may signal itself, runs as its child. It reaps what the student leaves,
    # and leaves with the student's process, which ends the namespace.
    student = os.fork()
    if student != 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is for the student's process
        _leave_with(student)


def _conceal(area: str | None, writable: list[str]) -> None:
    """Cover the fork server's folder (every job's: the graded notebook, the trusted side's pipes,
    logs) with an empty one, and show again in it only this process's writable folders. The
    working folder is entered again, so no relative path leads to what is covered."""
    if not area or not os.path.isdir(area):
        return
    area = os.path.realpath(area)
    inside = [os.path.realpath(w) for w in writable]
    cwd = os.getcwd()
    kept = [
        (w, os.open(w, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        for w in sorted(set(inside))
        if w.startswith(area + "/") and os.path.isdir(w)
    ]
    options = b"size=1048576,nr_inodes=1024,mode=0755"
    _check(_LIBC.mount(b"tmpfs", area.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options), "tmpfs on the area")
    for w, fd in kept:
        os.makedirs(w, 0o755, exist_ok=True)
        _check(_LIBC.mount(f"/proc/self/fd/{fd}".encode(), w.encode(), None, MS_BIND | MS_REC, None), "bind")
        os.close(fd)
    os.chdir(cwd)


def _private_tmp(owner: tuple[int, int] | None) -> None:
    """Fresh ``/var/tmp``, ``/dev/shm`` and matplotlib's folder (``/tmp/matplotlib``, with the font
    list copied, so no cell rebuilds it) for this notebook alone. ``/tmp`` itself stays the seal's:
    the worker's area is bound below it; it is made read-only here (its TMPDIR is its own)."""
    fonts = {}
    mpl = "/tmp/matplotlib"
    if os.path.isdir(mpl):
        for name in os.listdir(mpl):
            path = os.path.join(mpl, name)
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    fonts[name] = f.read(8 * 1024 * 1024)
    else:
        os.makedirs(mpl, 0o755)
    for where, size in (("/var/tmp", TMP_SIZE), ("/dev/shm", TMP_SIZE), (mpl, 16 * 1024 * 1024)):
        if os.path.isdir(where):
            options = f"size={size},mode=1777".encode()
            _check(
                _LIBC.mount(b"tmpfs", where.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options),
                f"tmpfs on {where}",
            )
    _private_ptys()
    for name, data in fonts.items():
        with open(os.path.join(mpl, name), "wb") as f:
            f.write(data)
    if owner is not None:
        _give([mpl], *owner)


# a mount's own flags, as /proc/self/mountinfo names them (Linux keeps them locked in a user namespace)
_MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "nosymfollow": 0x100}
_MOUNT_FLAGS |= {"noatime": 0x400, "nodiratime": 0x800, "relatime": 0x200000, "strictatime": 0x1000000}


def _read_only_but(keep: set[str]) -> None:
    """Make every mount this notebook can reach read-only, but its own writable folders (``keep``) and
    the file systems of the kernel (/proc, terminals). Where grading is not root, the notebook's user is
    the grader's, and owns what bubblewrap made (the root, /dev, /tmp, the cover on the course): every
    notebook forked from the same server shares those, and the server imports from them."""
    top: dict[str, tuple[list[str], str]] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:  # in the order mounted: the last at a place is the one seen there
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            top[point] = (fields[5].split(","), fields[fields.index("-") + 1])
    for point, (options, kind) in top.items():
        if (
            "ro" in options
            or point in keep
            or kind in ("proc", "sysfs", "devpts", "mqueue", "cgroup", "cgroup2")
        ):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in options:
            flags |= _MOUNT_FLAGS.get(option, 0)
        if _LIBC.mount(None, point.encode(), None, flags, None) != 0:
            e = ctypes.get_errno()
            # not a mount where it is seen now (covered: the one on top has its own line) or out of reach
            if e not in (errno.EINVAL, errno.ENOENT, errno.EACCES):
                raise BoundaryError(f"read-only {point}: {os.strerror(e)} (errno {e})")


def _private_ptys() -> None:
    """Terminals of this notebook's own (a new ``devpts`` instance), so no other notebook can open
    one of them, read what it shows or type into it."""
    if not os.path.isdir("/dev/pts"):
        return
    options = b"newinstance,ptmxmode=0666,mode=0620"
    _check(_LIBC.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC, options), "devpts")
    if os.path.exists("/dev/ptmx") and not os.path.islink("/dev/ptmx"):
        _check(_LIBC.mount(b"/dev/pts/ptmx", b"/dev/ptmx", None, MS_BIND, None), "bind /dev/ptmx")


def _inside(
    root: bool, writable: list[str], alive: int | None, memory: int | None = None, cpus: int = 0
) -> None:
    """In the notebook's namespaces: own cgroup, /proc and temporary folders, no privilege, the filter."""
    _check(_LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _join_cgroup(memory, cpus or os.cpu_count() or 1)
    # a /proc of this namespace only; where Linux refuses a new one (a user namespace inside
    # bubblewrap's, whose /proc has covered parts) the old one stays: it lists pids of the seal
    # that this namespace cannot name, and the fork server is non-dumpable
    # processes of other users (the namespace's root-owned process 1) are not even listed there
    proc_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if _LIBC.mount(b"proc", b"/proc", b"proc", proc_flags, b"hidepid=2") != 0:
        _LIBC.mount(b"proc", b"/proc", b"proc", proc_flags, None)
    _conceal(AREA, writable)
    user = UID_BASE + int.from_bytes(os.urandom(3), "little") % UID_RANGE if root else None
    _private_tmp((user, user) if user is not None else None)
    _read_only_but({os.path.realpath(w) for w in writable} | {"/var/tmp", "/dev/shm", "/tmp/matplotlib"})
    if user is not None:
        _give(writable, user, user)
    if user is not None or _RELEASE >= (5, 14):
        resource.setrlimit(resource.RLIMIT_NPROC, (PROCESS_LIMIT, PROCESS_LIMIT))
    for cap in range(64):  # the bounding set (needs CAP_SETPCAP: emptied while it is still there)
        if _prctl(PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    if root:
        os.setgroups([])
        os.setresgid(user, user, user)
        os.setresuid(user, user, user)  # every capability goes with uid 0
    _prctl(PR_SET_DUMPABLE, 1)  # its /proc files its own, to put it first in the OOM killer's line; then
    _write("/proc/self/oom_score_adj", "1000")  # root's again: it may not set itself back (what it starts
    _prctl(PR_SET_DUMPABLE, 0)  # is dumpable again and may, itself only: never its kernel or sandbox)
    _drop_capabilities()
    # the proxy killed: this process, and with it the whole namespace, ends (set only now: a change
    # of user clears it); a proxy already gone shows as the end of the pipe it holds
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if alive is not None:
        if select.select([alive], [], [], 0)[0]:
            os._exit(70)
        os.close(alive)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    for limit in (resource.RLIMIT_CORE, resource.RLIMIT_RTPRIO, resource.RLIMIT_NICE):  # no higher priority
        resource.setrlimit(limit, (0, 0))
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")
    program = seccomp_filter()
    if program is None:
        raise BoundaryError(f"no seccomp filter for {platform.machine()}")
    _install_seccomp(program)


def _leave_with(child: int) -> None:
    """Wait for ``child`` (reaping others) and leave with its exit code (killed by a signal: 128 + its number)."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(1)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


def _proxy(child: int, ready: int) -> None:
    """The forked child outside the notebook's namespaces: wait for process 1 inside and leave with
    its exit code. SIGTERM kills the notebook; SIGINT reaches the student's process directly (same
    process group) and is ignored here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGKILL))
    why = b""
    while True:
        try:
            chunk = os.read(ready, 500)
        except InterruptedError:
            continue
        if not chunk:
            break
        why += chunk
    if why:
        sys.stderr.write(f"the notebook's boundary could not be made: {why.decode(errors='replace')}\n")
        sys.stderr.flush()
        os.waitpid(child, 0)
        os._exit(70)
    _leave_with(child)
