"""What one notebook may leave behind and how many processes it may start, where grading runs as root
and where it does not (the last test runs the others again as an ordinary user).

Where grading is not root, student code runs as the grader's own user (in a user namespace of its
own): it can take the write permission away from the folders it writes in, which once left them, and
everything in them, on the disk after the notebook, for every later run; and its process limit was
the machine's.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from grader.classroom import boundary
from tests import attacks
from tests import test_seal as _seal
from tests.test_boundary import _correct_notebook, _next_classmate_keeps_full_marks, _tests_as_nobody, _texts
from tests.test_seal import LESSON, _run, needs_seal

gradebook = _seal.gradebook
kernel_settings = _seal.kernel_settings
sealed_fork_server = _seal.sealed_fork_server

# folders made read-only, with files in them, where the kernel works and in its temporary folder
_READ_ONLY_FOLDERS = (
    attacks.FORK_EXEC
    + r"""
import os, time
here, tmp = os.getcwd(), os.environ.get("TMPDIR", "/tmp")
script = "; ".join(
    f"mkdir -p {where}/keep/sub && echo kept > {where}/keep/sub/f && chmod 555 {where}/keep/sub {where}/keep"
    for where in (here, tmp)
)
_shell(script + "; echo done > " + tmp + "/.done")
for _ in range(100):
    if os.path.exists(tmp + "/.done"):
        break
    time.sleep(0.05)
print("READ-ONLY", sorted(os.listdir("keep")), oct(os.stat("keep").st_mode & 0o777))
"""
)


@needs_seal
def test_folders_a_notebook_made_read_only_go_with_it(gradebook):
    """A notebook that leaves read-only folders with files in them, where its kernel works and in its
    temporary folder: its job ends as a job does, nothing of it stays in the area, and the next
    classmate of the same worker keeps full marks."""
    from grader.classroom import servers
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    nb = _correct_notebook()
    nb.cells.insert(1, nbformat.v4.new_code_cell(_READ_ONLY_FOLDERS))
    area = Path(servers.sealed_area())
    before = set(area.glob("job-*"))
    locked = grade_job(
        Job("locked_lou", LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=30))
    )
    assert locked.error is None, locked.error
    assert "READ-ONLY ['sub'] 0o555" in locked.notebook.decode(), "the attack did not run as written"
    assert set(area.glob("job-*")) <= before, "the job's folder was left"
    assert not list(area.rglob("keep")), f"left in the area: {list(area.rglob('keep'))}"
    _next_classmate_keeps_full_marks(template)


_FILL_THE_DISK = (
    attacks.FORK_EXEC
    + r"""
import time
_shell("for i in 1 2 3 4 5 6; do fallocate -l 256M big$i; done")
time.sleep(20)
print("NOT", "STOPPED")
"""
)


@needs_seal
@pytest.mark.skipif(os.geteuid() == 0, reason="as root the area is a file system in memory of 1 GiB")
def test_a_notebook_that_fills_the_disk_is_stopped_and_its_files_go(gradebook):
    """Where grading is not root the area is on disk: a notebook that writes 1.5 GB there, in files each
    under the size limit, is stopped within a moment (not at its time limit), flagged, its files go, and
    the next classmate of the same worker keeps full marks."""
    import time

    from grader.classroom import lifecycle, servers
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    nb = _correct_notebook()
    nb.cells.insert(1, nbformat.v4.new_code_cell(_FILL_THE_DISK))
    area = Path(servers.sealed_area())
    start = time.monotonic()
    filler = grade_job(
        Job("full_fay", LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=60))
    )
    assert time.monotonic() - start < 15, "the notebook ran on"
    assert filler.error is None, filler.error
    assert "NOT STOPPED" not in filler.notebook.decode() and "DiskLimit" in filler.notebook.decode()
    assert any(f"over {lifecycle.DISK_BYTES >> 20} MB" in flag for flag in filler.flags), filler.flags
    assert not list(area.rglob("big*")), "its files were left"
    _next_classmate_keeps_full_marks(template)


_MANY_PROCESSES = r"""
import resource, subprocess
started = []
try:
    for _ in range(1200):
        started.append(subprocess.Popen(["sleep", "30"]))
except OSError as e:
    print("REFUSED", type(e).__name__)
print("STARTED", len(started), "LIMIT", resource.getrlimit(resource.RLIMIT_NPROC)[0])
"""  # they end with the notebook


@needs_seal
def test_a_notebook_starts_no_more_processes_than_its_limit(kernel_settings, sealed_fork_server):
    """A notebook that starts processes until it is refused: it is refused before it has
    ``boundary.PROCESS_LIMIT`` of them (not at the machine's limit, where grading is not root)."""
    if os.geteuid() != 0 and boundary._RELEASE < (5, 14):
        pytest.skip("before Linux 5.14, a user's processes are counted across the machine")
    nb = _run([_MANY_PROCESSES], Path(sealed_fork_server.sealed_area), kernel_settings, sealed_fork_server)
    said = _texts(nb)
    started = re.search(r"STARTED (\d+) LIMIT (\d+)", said)
    assert started, said
    assert 100 < int(started.group(1)) < boundary.PROCESS_LIMIT, said
    assert int(started.group(2)) == boundary.PROCESS_LIMIT, said


@needs_seal
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become nobody")
def test_the_limits_hold_where_grading_does_not_run_as_root():
    """The tests above, run again by an ordinary user (nobody)."""
    code, said = _tests_as_nobody(__file__, 600)
    assert code == 0, said
    assert re.search(r"\b3 passed", said) and "failed" not in said, said
