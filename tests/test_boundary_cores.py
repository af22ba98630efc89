"""The cores of the notebooks a run grades at once: each worker's notebooks run on a share of the run's
cores that no other worker's notebooks use (the last test runs the others again as an ordinary user in a
CPU cgroup of its own).

Where grading is not root, a notebook gets no CPU quota. Autogroup (``tests/test_boundary_cpu.py``) made
each notebook one scheduling group, but Linux ignores autogroup for processes in a cgroup the CPU
controller manages, as systemd's user sessions, containers and CI runners often are: there one notebook
that started a thousand busy shell loops took the CPU from its classmates again, whose checks "could not
finish" and lost their points. Cores of their own hold whatever the cgroups are.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from grader.classroom import kernels, seal
from grader.classroom.fork_client import ForkServer
from tests import test_seal as _seal
from tests.test_boundary import _tests_as_nobody, _texts
from tests.test_seal import _run, needs_seal

kernel_settings = _seal.kernel_settings
CORES = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="one core: there is no other to keep")


@pytest.fixture
def two_workers():
    """The sealed servers of two workers of one run, each on its part of the run's area (``part-<i>``)."""
    # a short path: the kernels' sockets are in it
    area = Path(tempfile.mkdtemp(prefix="cores-", dir=seal.short_tmp()))
    for i in range(2):
        (area / f"part-{i}").mkdir()
    servers = [ForkServer(kernels.kernel_env(None), sealed_area=str(area / f"part-{i}")) for i in range(2)]
    yield servers
    for server in servers:
        server.close()
    shutil.rmtree(area, ignore_errors=True)


_CORES = """
import os
print("CORES", sorted(os.sched_getaffinity(0)))
try:
    os.sched_setaffinity(0, range(os.cpu_count()))
    print("WIDENED", sorted(os.sched_getaffinity(0)))
except OSError as e:
    print("WIDENED", type(e).__name__)
"""


@needs_seal
@needs_two_cores
def test_notebooks_graded_at_once_run_on_cores_of_their_own(kernel_settings, two_workers):
    """Each worker's notebook runs on its own share of the cores, which student code may not widen."""
    for i, server in enumerate(two_workers):
        said = _texts(_run([_CORES], Path(server.sealed_area), kernel_settings, server))
        assert f"CORES {CORES[i::2]}" in said, said
        assert "WIDENED PermissionError" in said, said


# a notebook that keeps 60 busy processes running (for 40 s, or until the test leaves a file "stop")
_SPINNING = """
import subprocess, sys, time
spin = "import os, time\\nend = time.monotonic() + 40\\nwhile time.monotonic() < end and not os.path.exists('stop'): pass"
procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(60)]
time.sleep(1)
open("spinning", "w").close()
for p in procs:
    p.wait()
"""

# a classmate's notebook that needs 0.5 s of CPU: the seconds it took to get it
_WORKING = """
import time
wall, cpu = time.monotonic(), time.process_time()
while time.process_time() - cpu < 0.5:
    pass
print("TOOK", round(time.monotonic() - wall, 2))
"""


@needs_seal
@needs_two_cores
def test_a_notebooks_busy_processes_leave_a_classmate_its_time(kernel_settings, two_workers):
    """A notebook spinning 60 processes beside a classmate's: the classmate's kernel starts and does its
    half second of work in seconds. (Sharing the CPU process by process, as where grading was not root and
    in a CPU cgroup, it took 41.7 s: until the spinners stopped. The limits leave room for a busy machine.)"""
    spinner, classmate = two_workers
    started = threading.Thread(
        target=_run, args=([_SPINNING], Path(spinner.sealed_area), kernel_settings, spinner), daemon=True
    )
    started.start()
    deadline = time.monotonic() + 60
    while not list(Path(spinner.sealed_area).glob("job-*/spinning")) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert started.is_alive(), "the spinning notebook ended before its classmate ran"
        begun = time.monotonic()
        said = _texts(_run([_WORKING], Path(classmate.sealed_area), kernel_settings, classmate))
        whole = time.monotonic() - begun
    finally:
        for job in Path(spinner.sealed_area).glob("job-*"):
            (job / "stop").touch()
        started.join(60)
    took = re.search(r"TOOK ([0-9.]+)", said)
    assert took and float(took.group(1)) < 5 and whole < 20, f"{said} (the notebook: {whole:.1f} s)"


def _cpu_cgroup_parent() -> str | None:
    """A folder of the CPU controller's where root may make a cgroup (cgroup v1's hierarchy, or v2's root
    with the controller on for its children)."""
    for v1 in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
        if os.path.exists(f"{v1}/cgroup.procs"):
            return v1
    try:
        on = Path("/sys/fs/cgroup/cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    return "/sys/fs/cgroup" if "cpu" in on else None


@needs_seal
@needs_two_cores
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become nobody")
def test_the_cores_hold_where_grading_is_not_root_and_in_a_cpu_cgroup():
    """The tests above, run again by an ordinary user (nobody: no CPU quota) in a CPU cgroup of its own,
    where Linux does not group a notebook's processes by session."""
    parent = _cpu_cgroup_parent()
    if parent is None or not os.access(parent, os.W_OK):
        pytest.skip("no CPU cgroup can be made here")
    mine = Path(parent) / f"attention-course-test-{os.getpid()}"
    mine.mkdir()
    try:
        # weighed as much as the rest of the machine: Linux splits a cgroup's weight among the cores by the
        # load on each, so 60 spinners would leave a classmate's core a sliver of it against the tests
        # running beside; what is tested is what one notebook takes from another
        for name, most in (("cpu.shares", "262144"), ("cpu.weight", "10000")):
            if (mine / name).exists():
                (mine / name).write_text(most)
        back = _own_cgroup(parent)
        (mine / "cgroup.procs").write_text(str(os.getpid()))  # the tests' processes start in it
        try:
            code, said = _tests_as_nobody(__file__, 300)
        finally:
            Path(back, "cgroup.procs").write_text(str(os.getpid()))
    finally:
        time.sleep(0.5)  # its last processes leave it
        with contextlib.suppress(OSError):
            mine.rmdir()
    assert code == 0, said
    assert re.search(r"\b2 passed", said) and "failed" not in said, said


def _own_cgroup(parent: str) -> str:
    """This process's cgroup folder under the CPU controller's ``parent``."""
    for line in open("/proc/self/cgroup"):
        _, controllers, path = line.rstrip("\n").split(":", 2)
        if "cpu" in controllers.split(",") or (not controllers and parent == "/sys/fs/cgroup"):
            return parent + path.rstrip("/")
    return parent
