"""How the CPU is shared between the notebooks a run grades at once, where grading runs as root and
where it does not (the last test runs the other again as an ordinary user).

Where grading is not root, a notebook gets no cgroup of its own and so no CPU quota. Every kernel and
sandbox of the sealed fork server shared the one session bubblewrap makes, and Linux's scheduler shared
the CPU among their processes one by one: one notebook that started a thousand busy shell loops took over
99 % of it, a classmate graded beside it "timed out" and another's kernel died. Each process the fork
server starts for a notebook now leads a session of its own; where Linux schedules sessions as groups
(autogroup, on by default), a notebook's processes together get one notebook's share.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

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


# the kernel's scheduling group, and that of a shell it starts (where a student's busy loops would run)
_GROUP = """
import subprocess
shell = subprocess.run(["cat", "/proc/self/autogroup"], capture_output=True, text=True).stdout
print("GROUP", open("/proc/self/autogroup").read().split()[0], shell.split()[0])
"""


@needs_seal
@pytest.mark.skipif(not _autogroups(), reason="Linux does not group scheduling by session here (autogroup)")
def test_each_notebook_shares_the_cpu_as_one(kernel_settings, sealed_fork_server):
    """Two notebooks' kernels from one sealed server are in scheduling groups of their own, each with
    the processes it starts."""
    groups = []
    for _ in range(2):
        nb = _run([_GROUP], Path(sealed_fork_server.sealed_area), kernel_settings, sealed_fork_server)
        said = re.search(r"GROUP (\S+) (\S+)", _texts(nb))
        assert said, _texts(nb)
        assert said[1] == said[2], f"a shell the kernel started left its group: {said[0]}"
        groups.append(said[1])
    assert groups[0] != groups[1], f"two notebooks share one scheduling group: {groups}"
    assert Path("/proc/self/autogroup").read_text().split()[0] not in groups


@needs_seal
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become nobody")
def test_the_cpu_shares_hold_where_grading_does_not_run_as_root():
    """The test above, run again by an ordinary user (nobody), who gets no cgroup and no CPU quota."""
    code, said = _tests_as_nobody(__file__, 300)
    assert code == 0, said
    assert re.search(r"\b1 passed", said) and "failed" not in said, said
