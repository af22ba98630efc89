"""How the CPU (and memory) is shared between the notebooks a run grades at once, where grading runs as root and
where it does not (the last test runs the other again as an ordinary user).

Where grading is not root, a notebook gets no cgroup of its own and so no CPU quota. Every kernel and
sandbox of the sealed fork server shared the one session bubblewrap makes, and Linux's scheduler shared
the CPU among their processes one by one: one notebook that started a thousand busy shell loops took over
99 % of it, a classmate graded beside it "timed out" and another's kernel died. Each process the fork
server starts for a notebook now leads a session of its own, and student code may make no other (the
seccomp filter refuses ``setsid``); where Linux schedules sessions as groups (autogroup, on by default),
a notebook's processes together get one notebook's share.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from grader.classroom import kernels
from grader.classroom.fork_client import ForkServer
from tests import test_seal as _seal
from tests.test_boundary import _tests_as_nobody, _texts
from tests.test_seal import _run, needs_seal

kernel_settings = _seal.kernel_settings
sealed_fork_server = _seal.sealed_fork_server


def _autogroups() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


# the kernel's scheduling group, that of a program it starts (where a student's busy loops would run), and
# that of a program it starts in a session of its own (a thousand sessions would be a thousand groups)
_GROUP = """
import subprocess
def group(**how):
    try:
        return subprocess.run(["cat", "/proc/self/autogroup"], capture_output=True, text=True, **how).stdout.split()[0]
    except OSError as e:
        return type(e).__name__
print("GROUP", open("/proc/self/autogroup").read().split()[0], group(), group(start_new_session=True))
"""


@needs_seal
@pytest.mark.skipif(not _autogroups(), reason="Linux does not group scheduling by session here (autogroup)")
def test_each_notebook_shares_the_cpu_as_one(kernel_settings, sealed_fork_server):
    """Two notebooks' kernels from one sealed server are in scheduling groups of their own, each with
    the processes it starts, which may not make sessions (groups) of their own."""
    groups = []
    for _ in range(2):
        nb = _run([_GROUP], Path(sealed_fork_server.sealed_area), kernel_settings, sealed_fork_server)
        said = re.search(r"GROUP (\S+) (\S+) (\S+)", _texts(nb))
        assert said, _texts(nb)
        assert said[1] == said[2], f"a program the kernel started left its group: {said[0]}"
        assert said[3] == "PermissionError", f"a program the kernel started made a session: {said[0]}"
        groups.append(said[1])
    assert groups[0] != groups[1], f"two notebooks share one scheduling group: {groups}"
    assert Path("/proc/self/autogroup").read_text().split()[0] not in groups


_REAL_TIME = """
import os
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    print("REAL TIME", os.sched_getscheduler(0))
except OSError as e:
    print("REAL TIME", type(e).__name__)
"""


@needs_seal
def test_no_notebook_takes_a_real_time_priority(kernel_settings, tmp_path):
    """Where the grader's user may give its processes a real-time priority (``RLIMIT_RTPRIO``, as a
    desktop's audio group may), a notebook may not: one busy process of it at such a priority would
    hold a core against every classmate."""
    import resource

    saved = resource.getrlimit(resource.RLIMIT_RTPRIO)
    try:
        resource.setrlimit(resource.RLIMIT_RTPRIO, (50, 50))
    except (ValueError, OSError):
        pytest.skip("this user may not raise its real-time limit (and so neither may its notebooks)")
    try:
        server = ForkServer(kernels.kernel_env(None), sealed_area=str(tmp_path))
        try:
            nb = _run([_REAL_TIME], tmp_path, kernel_settings, server)
        finally:
            server.close()
    finally:
        resource.setrlimit(resource.RLIMIT_RTPRIO, saved)
    assert "REAL TIME PermissionError" in _texts(nb), _texts(nb)


# a notebook that puts itself last in the OOM killer's line, behind a classmate's kernel
_OOM_BACK = """
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("0")
except OSError as e:
    print("OOM", type(e).__name__)
print("OOM", open("/proc/self/oom_score_adj").read().strip())
"""


@needs_seal
def test_no_notebook_leaves_the_front_of_the_oom_killers_line(kernel_settings, sealed_fork_server):
    """Its kernel is the OOM killer's first and may not set itself back: one that did (grading not as root)
    made Linux end a classmate's kernel instead of its own, and the classmate lost points."""
    nb = _run([_OOM_BACK], Path(sealed_fork_server.sealed_area), kernel_settings, sealed_fork_server)
    said = _texts(nb)
    assert "OOM PermissionError" in said and "OOM 1000" in said, said


@needs_seal
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become nobody")
def test_the_cpu_shares_hold_where_grading_does_not_run_as_root():
    """The tests above, run again by an ordinary user (nobody), who gets no cgroup and no CPU quota."""
    code, said = _tests_as_nobody(__file__, 300)
    assert code == 0, said
    assert re.search(r"\b2 passed", said) and "failed" not in said, said
