"""The seccomp filter of a notebook's processes (``boundary``): the calls student code never needs.

A classic-BPF program built from tables of system call numbers per architecture; only the
standard library, nothing is loaded into the kernel here (``boundary._install_seccomp`` does).
"""

from __future__ import annotations

import errno
import platform
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080
NAMESPACE_FLAGS = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
NAMESPACE_FLAGS |= CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWTIME
SECCOMP_MODE_FILTER = 2
TIOCSTI = 0x5412
# the sockets student code may create, family -> protocols: local ones (the kernel's own), TCP and UDP
# in the notebook's network namespace (nothing beyond it), netlink's routing (the C library asks it for
# addresses). AF_VSOCK would reach a virtual machine's host past that namespace; the rest (AF_ALG,
# AF_PACKET, MPTCP, SCTP, netlink's XFRM, ...) are kernel code no notebook needs
SOCKETS = {1: (0,), 2: (0, 6, 17), 10: (0, 6, 17), 16: (0,)}  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK

# the calls student code never needs: name -> (number on x86_64, on aarch64; None where it has none)
_CALLS = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "process_madvise": (440, 440),
    "pidfd_getfd": (438, 438),
    "kcmp": (312, 272),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "move_mount": (429, 429),
    "open_tree": (428, 428),
    "open_tree_attr": (467, 467),
    "mount_setattr": (442, 442),
    "unshare": (272, 97),
    "setns": (308, 268),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "acct": (163, 89),
    "syslog": (103, 116),
    "iopl": (172, None),
    "ioperm": (173, None),
    "quotactl": (179, 60),
    "lookup_dcookie": (212, 18),
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
    "adjtimex": (159, 171),
    "clock_adjtime": (305, 266),
    "vhangup": (153, 58),
    "inotify_init": (253, None),  # watching files the seal shares with the host (and so who opens them, when)
    "inotify_init1": (294, 26),
    "fanotify_init": (300, 262),
    "uselib": (134, None),
    "setsid": (112, 157),  # each session is a scheduling group (autogroup): a thousand would take the CPU
    "sched_setaffinity": (203, 122),  # a notebook's cores are its worker's share (fork_server), no more
}
_X86_64 = {name: x86 for name, (x86, _) in _CALLS.items()}
_AARCH64 = {name: arm for name, (_, arm) in _CALLS.items() if arm is not None}
# by architecture: (audit arch, {name: number}, clone, clone3, ioctl, (socket, socketpair))
ARCHES = {
    "x86_64": (0xC000003E, _X86_64, 56, 435, 16, (41, 53)),
    "aarch64": (0xC00000B7, _AARCH64, 220, 435, 29, (198, 199)),
}


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The notebook's seccomp filter, a classic-BPF program (``struct sock_filter[]``); None elsewhere.

    Every call named in ``_CALLS`` fails with EPERM, as do ``clone`` with a namespace flag, ``ioctl(TIOCSTI)``,
    ``socket`` and ``socketpair`` of a family or protocol not in ``SOCKETS``, and calls of another ABI (x32,
    i386); ``clone3`` fails with ENOSYS (its flags live in memory a filter cannot read; the C library then
    falls back to ``clone``). Everything else is allowed.
    """
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, numbers, clone, clone3, ioctl, sockets = arch
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
    for nr in sockets:
        jump(JEQ, nr, "socket", 0)
    jump(RET, ALLOW)
    labels = {"socket": len(prog)}
    jump(LD, 16)  # args[0], low half: the family
    for family in SOCKETS:
        jump(JEQ, family, f"family {family}", 0)
    jump(RET, DENY)
    for family, protocols in SOCKETS.items():
        labels[f"family {family}"] = len(prog)
        jump(LD, 32)  # args[2], low half: the protocol
        for protocol in protocols:
            jump(JEQ, protocol, "allow", 0)
        jump(RET, DENY)
    labels["allow"] = len(prog)
    jump(RET, ALLOW)
    labels["clone"] = len(prog)
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
