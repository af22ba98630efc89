"""One boundary per notebook: what a process forked to run student code does before it runs any.

The sealed fork server (``fork_server --sealed``, inside bubblewrap) serves every notebook of
one grading worker. Each kernel or sandbox it forks first calls ``enter``, which puts the
student's code where nothing of the server, or of any other notebook, can be reached:

- **its own namespaces**: a new PID namespace, made by the server for the child it is about to
  fork (``new_pid_namespace``): its process 1 is a do-nothing ``sleep`` and the child is
  process 2. The child then makes new mount, network, IPC and UTS namespaces (``unshare``),
  with a ``/proc`` of its own that hides other users' processes. So the fork server, its pipes
  and other notebooks have no process id, no ``/proc`` entry and no file descriptor the
  student can name. When the child ends, the server kills process 1, and Linux kills
  everything left in the namespace: nothing the student started outlives the notebook.
  Where the server is not root, the child does all this itself (``enter``), in a user
  namespace of the same user. It stays outside as a proxy (``_proxy``), forks process 1 of the
  new namespace, and that process forks the student's.
- **no privilege**: when the server is root it changes to a user id of the notebook's own
  (``UID_BASE`` and up, no account's) after giving that user the notebook's writable folders; in every case the capability bounding set and the
  process's capabilities are emptied, ``no_new_privs`` is set, and a seccomp filter
  (``seccomp_filter``) refuses the calls that reach past a namespace or into another process:
  ``ptrace``, ``process_vm_*``, ``open_by_handle_at``, mounts, ``unshare``/``setns`` and
  namespace flags of ``clone``, ``keyctl``, ``bpf``, module loading, ``perf_event_open``,
  ``userfaultfd``, ``io_uring``, ``TIOCSTI`` and the rest of ``DENIED``.
- **limits**: file size (``FILE_LIMIT``), core files off, and for the notebook's user a process
  count (Linux counts it per user, so one notebook's processes never use up another's).

The fork server itself is made non-dumpable (``protect_server``): even a process of the same
user cannot open its ``/proc`` files or attach to it.

The rules a lesson states (which calls are allowed) are checked by the trusted side and the
audit hook; this module is the wall those rest on, and needs neither.

Only the standard library, loaded before any fork (``ctypes`` is never opened after the
guard's audit hook is in place).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import select
import signal
import struct
import sys

# where grading runs as root, each notebook's processes get a user id of their own, drawn from this
# range (no account has one): no other notebook's processes or files are theirs, and the process
# limit, which Linux counts per user across the machine, is each notebook's alone
UID_BASE = 2_000_000_000
UID_RANGE = 1 << 24
FILE_LIMIT = 256 * 1024 * 1024  # the largest file student code may write (bytes)
TMP_SIZE = 64 * 1024 * 1024  # each of a notebook's own /var/tmp and /dev/shm (memory, bytes)
PROCESS_LIMIT = 1024  # processes and threads of a notebook's user (only where the server is root)

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080
NAMESPACE_FLAGS = (
    CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
    | CLONE_NEWTIME
)
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND = 0x4000, 0x40000, 0x2, 0x4, 0x8, 0x1000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 4, 24, 38, 22
SECCOMP_MODE_FILTER = 2
TIOCSTI = 0x5412

# the calls student code never needs, by architecture: (audit arch, {name: number}, clone, clone3, ioctl)
_X86_64 = {
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "process_madvise": 440,
    "pidfd_getfd": 438,
    "kcmp": 312,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "move_mount": 429,
    "open_tree": 428,
    "mount_setattr": 442,
    "unshare": 272,
    "setns": 308,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "bpf": 321,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "perf_event_open": 298,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "reboot": 169,
    "swapon": 167,
    "swapoff": 168,
    "acct": 163,
    "syslog": 103,
    "iopl": 172,
    "ioperm": 173,
    "quotactl": 179,
    "lookup_dcookie": 212,
    "settimeofday": 164,
    "clock_settime": 227,
    "adjtimex": 159,
    "clock_adjtime": 305,
    "vhangup": 153,
    "uselib": 134,
}
_AARCH64 = {
    "ptrace": 117,
    "process_vm_readv": 270,
    "process_vm_writev": 271,
    "process_madvise": 440,
    "pidfd_getfd": 438,
    "kcmp": 272,
    "name_to_handle_at": 264,
    "open_by_handle_at": 265,
    "mount": 40,
    "umount2": 39,
    "pivot_root": 41,
    "chroot": 51,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "move_mount": 429,
    "open_tree": 428,
    "mount_setattr": 442,
    "unshare": 97,
    "setns": 268,
    "keyctl": 219,
    "add_key": 217,
    "request_key": 218,
    "bpf": 280,
    "init_module": 105,
    "finit_module": 273,
    "delete_module": 106,
    "kexec_load": 104,
    "kexec_file_load": 294,
    "perf_event_open": 241,
    "userfaultfd": 282,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "reboot": 142,
    "swapon": 224,
    "swapoff": 225,
    "acct": 89,
    "syslog": 116,
    "quotactl": 60,
    "lookup_dcookie": 18,
    "settimeofday": 170,
    "clock_settime": 112,
    "adjtimex": 171,
    "clock_adjtime": 266,
    "vhangup": 58,
}
ARCHES = {
    "x86_64": (0xC000003E, _X86_64, 56, 435, 16),
    "aarch64": (0xC00000B7, _AARCH64, 220, 435, 29),
}
DENIED = sorted(_X86_64)

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


# ---------------------------------------------------------------- the seccomp filter


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The classic-BPF program (``struct sock_filter[]``) of the notebook's seccomp filter, or
    None on an architecture this module has no numbers for.

    Every call of ``DENIED`` fails with EPERM, as does ``clone`` with a namespace flag and
    ``ioctl(TIOCSTI)``; ``clone3`` fails with ENOSYS (its flags live in memory a filter cannot
    read; the C library then falls back to ``clone``); calls of another architecture's ABI
    (x32, i386) fail with EPERM. Everything else is allowed.
    """
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, numbers, clone, clone3, ioctl = arch
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, DENY, NOSYS = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    prog: list[tuple] = []  # (code, jump-true label or 0, jump-false label or 0, k)

    def jump(code: int, k: int, yes: object = 0, no: object = 0) -> None:
        prog.append((code, yes, no, k))

    jump(LD, 4)  # seccomp_data.arch
    jump(JEQ, audit_arch, 0, "deny")
    jump(LD, 0)  # seccomp_data.nr
    if audit_arch == 0xC000003E:
        jump(JGE, 0x40000000, "deny", 0)  # the x32 ABI
    for nr in sorted(numbers.values()):
        jump(JEQ, nr, "deny", 0)
    jump(JEQ, clone3, "nosys", 0)
    jump(JEQ, clone, "clone", 0)
    jump(JEQ, ioctl, "ioctl", 0)
    jump(RET, ALLOW)
    labels = {"clone": len(prog)}
    jump(LD, 16)  # args[0], low half: the flags
    jump(JSET, NAMESPACE_FLAGS, "deny", 0)
    jump(RET, ALLOW)
    labels["ioctl"] = len(prog)
    jump(LD, 24)  # args[1], low half: the request
    jump(JEQ, TIOCSTI, "deny", 0)
    jump(RET, ALLOW)
    labels["nosys"] = len(prog)
    jump(RET, NOSYS)
    labels["deny"] = len(prog)
    jump(RET, DENY)
    out = b""
    for i, (code, yes, no, k) in enumerate(prog):
        jt = labels[yes] - i - 1 if isinstance(yes, str) else yes
        jf = labels[no] - i - 1 if isinstance(no, str) else no
        assert 0 <= jt < 256 and 0 <= jf < 256
        out += struct.pack("=HBBI", code, jt, jf, k)
    return out


def _install_seccomp(program: bytes) -> None:
    buffer = ctypes.create_string_buffer(program, len(program))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(program) // 8, ctypes.addressof(buffer))
    _check(
        _LIBC.prctl(
            PR_SET_SECCOMP,
            ctypes.c_ulong(SECCOMP_MODE_FILTER),
            ctypes.byref(prog),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        ),
        "seccomp filter",
    )


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
                    try:
                        os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
                    except OSError:
                        pass
            os.fchown(fd, uid, gid)
        finally:
            os.close(fd)


def _passable(folder: str) -> None:
    """Let every user pass through ``folder`` and the folders above it (never list them): in the
    seal those are the worker's area (0700 outside, in a 0700 folder) and bubblewrap's own."""
    import stat

    while folder and folder != "/":
        try:
            mode = os.lstat(folder).st_mode
            if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
                os.chmod(folder, stat.S_IMODE(mode) | stat.S_IXOTH)
        except OSError:
            pass
        folder = os.path.dirname(folder)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------- entering


def protect_server() -> None:
    """Make the sealed fork server non-dumpable: no process of the same user can read its ``/proc``
    files (its pipes among them), its memory, or attach to it."""
    if _LIBC is not None:
        _prctl(PR_SET_DUMPABLE, 0)


def available() -> bool:
    return _LIBC is not None and sys.platform.startswith("linux")


_OWN_PID_NS: int | None = None  # the fork server's own PID namespace (an open descriptor)
SLEEPER = "/usr/bin/sleep"  # what process 1 of a namespace the server makes runs: nothing at all


def new_pid_namespace() -> int | None:
    """In the (root) fork server, just before it forks a process for student code: make the next
    child of this process the second process of a new PID namespace whose process 1 is a
    do-nothing process spawned now (``SLEEPER``, no descriptor of the server's). Returns that
    process's pid, which the server kills when the child ends (and with it the namespace); None
    where this process cannot (not root): the child then makes its namespace itself (``enter``).

    The child is not process 1, which Linux shields from its own namespace's signals: student
    code that signals itself ends as it would anywhere. Made here, the namespace costs no fork
    of the server's memory beyond the child's own."""
    global _OWN_PID_NS
    if os.geteuid() != 0 or not available() or not os.path.exists(SLEEPER):
        return None
    if _OWN_PID_NS is None:
        _OWN_PID_NS = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    # children in this process's own namespace again (the last one made is gone), then a new one
    if _LIBC.setns(_OWN_PID_NS, CLONE_NEWPID) != 0 or _LIBC.unshare(CLONE_NEWPID) != 0:
        return None
    null = (os.O_RDWR, 0)
    actions = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, *null) for fd in (0, 1, 2)]
    try:
        return os.posix_spawn(SLEEPER, [SLEEPER, "infinity"], {}, file_actions=actions, setsid=True)
    except OSError:
        _LIBC.setns(_OWN_PID_NS, CLONE_NEWPID)
        return None


def restore_pid_namespace() -> None:
    """In the server, right after it forked into a namespace of ``new_pid_namespace``: its next
    children are its own again, so nothing else it starts can land in a student's namespace."""
    if _OWN_PID_NS is not None:
        _LIBC.setns(_OWN_PID_NS, CLONE_NEWPID)


def enter(writable: list[str], in_new_pid_namespace: bool = False) -> None:
    """Called in a process just forked (one thread) to run student code: make the notebook's
    boundary and return inside it, unprivileged. The calling process becomes the proxy that the
    fork server knows (it never returns). Raises ``BoundaryError`` if any step fails: then no
    student code may run."""
    if not available():
        raise BoundaryError("no C library to make a boundary with")
    if in_new_pid_namespace:  # the server made it (``new_pid_namespace``): the rest is this process's
        _check(_LIBC.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
        _inside(True, writable, None)
        return
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    root = os.geteuid() == 0 and _LIBC.unshare(flags) == 0
    if not root:  # not root, or root without the capabilities: a user namespace of the same user
        _check(_LIBC.unshare(flags | CLONE_NEWUSER), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
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
        _inside(root, writable, alive_r)
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


def _private_tmp(owner: tuple[int, int] | None) -> None:
    """Fresh ``/var/tmp``, ``/dev/shm`` and matplotlib's folder (``/tmp/matplotlib``, with the font
    list copied, so no cell rebuilds it) for this notebook alone. ``/tmp`` itself stays the seal's:
    the worker's area is bound below it, and nobody may write there (its TMPDIR is its own)."""
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


def _private_ptys() -> None:
    """Terminals of this notebook's own (a new ``devpts`` instance), so no other notebook can open
    one of them, read what it shows or type into it."""
    if not os.path.isdir("/dev/pts"):
        return
    options = b"newinstance,ptmxmode=0666,mode=0620"
    _check(_LIBC.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC, options), "devpts")
    if os.path.exists("/dev/ptmx") and not os.path.islink("/dev/ptmx"):
        _check(_LIBC.mount(b"/dev/pts/ptmx", b"/dev/ptmx", None, MS_BIND, None), "bind /dev/ptmx")


def _inside(root: bool, writable: list[str], alive: int | None) -> None:
    """In the notebook's PID namespace: its own /proc and temporary folders, no privilege, the
    filter."""
    _check(_LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    # a /proc of this namespace only; where Linux refuses a new one (a user namespace inside
    # bubblewrap's, whose /proc has covered parts) the old one stays: it lists pids of the seal
    # that this namespace cannot name, and the fork server is non-dumpable
    # processes of other users (the namespace's root-owned process 1) are not even listed there
    proc_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if _LIBC.mount(b"proc", b"/proc", b"proc", proc_flags, b"hidepid=2") != 0:
        _LIBC.mount(b"proc", b"/proc", b"proc", proc_flags, None)
    user = UID_BASE + int.from_bytes(os.urandom(3), "little") % UID_RANGE if root else None
    _private_tmp((user, user) if user is not None else None)
    if user is not None:
        _give(writable, user, user)
        resource.setrlimit(resource.RLIMIT_NPROC, (PROCESS_LIMIT, PROCESS_LIMIT))
    for cap in range(64):  # the bounding set (needs CAP_SETPCAP: emptied while it is still there)
        if _prctl(PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    if root:
        os.setgroups([])
        os.setresgid(user, user, user)
        os.setresuid(user, user, user)  # every capability goes with uid 0
        _prctl(PR_SET_DUMPABLE, 1)  # its own /proc files are its own again
    _drop_capabilities()
    # the proxy killed: this process, and with it the whole namespace, ends (set only now: a change
    # of user clears it); a proxy already gone shows as the end of the pipe it holds
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if alive is not None:
        if select.select([alive], [], [], 0)[0]:
            os._exit(70)
        os.close(alive)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")
    program = seccomp_filter()
    if program is None:
        raise BoundaryError(f"no seccomp filter for {platform.machine()}")
    _install_seccomp(program)


def _leave_with(child: int) -> None:
    """Wait for ``child`` (reaping any other child meanwhile) and leave with its exit code: killed
    by a signal, 128 + its number, as a shell says."""
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
