"""Where a notebook may write, how its files on disk are counted, and which of its processes Linux's OOM
killer ends first, where grading runs as root and where it does not (the last test runs the others again
as an ordinary user).

Where grading is not root, student code runs as the grader's own user, and that user owned what
bubblewrap made for the seal: its root (with the folder the course's runtime modules are imported from),
/dev and the folder that covers the course. Every notebook forked from the same server shares those, so one
notebook planted a module there that every later classmate's sandbox imported (their checks then ran none
of their cells: 0 points, flagged), or kept gigabytes in /dev for the rest of the run. Its processes were
not the OOM killer's first choice either: their OOM score could not be set. And a folder it could write
in but not list hid its files from the watch on its disk use.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from grader import course
from tests import attacks
from tests import test_seal as _seal
from tests.test_boundary import _correct_notebook, _next_classmate_keeps_full_marks, _tests_as_nobody, _texts
from tests.test_seal import _run, needs_seal

gradebook = _seal.gradebook
kernel_settings = _seal.kernel_settings
sealed_fork_server = _seal.sealed_fork_server

SHARED = ["/", "/opt/course_runtime/course_runtime/sandbox", "/dev", "/tmp", os.path.realpath(course.ROOT)]
OWN = ["/var/tmp", "/dev/shm", "$TMPDIR", "$PWD"]

# from a shell: a folder and a file in each place, and what it could do there
_WRITE_EVERYWHERE = (
    attacks.FORK_EXEC
    + r"""
places = " ".join(f'"{p}"' for p in PLACES)
_shell_said(f'for p in {places}; do if mkdir -p "$p/planted" 2>/dev/null && echo x > "$p/planted/f" 2>/dev/null; '
            'then echo "WROTE $p"; else echo "REFUSED $p"; fi; done > places.txt', "places.txt", 200)
"""
)


@needs_seal
def test_a_notebook_writes_nowhere_but_its_own_folders(gradebook):
    """A notebook's shell writes in its own folders (where it works, its temporary folders) and nowhere
    else: not in the seal's root, the folder the runtime modules come from, /dev, /tmp or the folder that
    covers the course; and a classmate graded next by the same worker keeps full marks."""
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    nb = _correct_notebook()
    nb.cells.insert(1, nbformat.v4.new_code_cell(_WRITE_EVERYWHERE.replace("PLACES", repr(SHARED + OWN))))
    writer = grade_job(
        Job("planting_pat", _seal.LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=30))
    )
    assert writer.error is None, writer.error
    lines = _texts(nbformat.reads(writer.notebook, 4)).splitlines()
    done = {
        line.partition(" ")[2]: line.split()[0] for line in lines if line.startswith(("WROTE ", "REFUSED "))
    }
    assert done.get("/var/tmp") == done.get("/dev/shm") == "WROTE", "the attack did not run as written"
    assert list(done.values()).count("WROTE") == len(OWN), done
    assert all(done.get(p) == "REFUSED" for p in SHARED), done
    _next_classmate_keeps_full_marks(template)


@needs_seal
def test_a_notebooks_processes_are_the_first_the_oom_killer_ends(kernel_settings, sealed_fork_server):
    """The kernel (and all it starts) has the highest OOM score, so a machine out of memory loses a
    notebook's processes before the servers that fork every notebook's."""
    probe = "print('OOM', open('/proc/self/oom_score_adj').read().strip())"
    nb = _run([probe], Path(sealed_fork_server.sealed_area), kernel_settings, sealed_fork_server)
    assert "OOM 1000" in _texts(nb), _texts(nb)


# in Python, as the sandbox runs it too (it starts no programs): 6 files of 256 MiB (each at the file-size
# limit) in a folder the grader's user may not list
_HIDE_AND_FILL = r"""
import os, time
hidden = os.path.join(os.environ.get("TMPDIR") or os.getcwd(), ".h")
os.makedirs(hidden, exist_ok=True)
os.chmod(hidden, 0o300)
block = b"1" * (8 << 20)
for i in range(6):
    with open(os.path.join(hidden, f"big{i}"), "wb") as f:
        for _ in range(32):
            f.write(block)
time.sleep(20)
print("NOT", "STOPPED")
"""


@needs_seal
@pytest.mark.skipif(os.geteuid() == 0, reason="as root the area is a file system in memory of 1 GiB")
def test_a_notebook_that_hides_its_files_from_the_disk_watch_is_stopped(gradebook):
    """Where grading is not root the area is on disk, and the notebook runs as the grader's user: 1.5 GB
    written in a folder it may write in but not list (mode 300) is counted all the same (it was not, and
    ran to its time limit), the notebook is stopped and flagged, and its files go. Stopped while its kernel
    still waited at the lesson's first cell, it is graded, not "could not be graded: the lesson's own cell
    failed before any of the student's code ran" (with no flag), as it was."""
    import time

    from grader.classroom import servers
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    nb = _correct_notebook()
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
    answer.source = (
        _HIDE_AND_FILL + "\n" + answer.source
    )  # run first where the checks run, before the kernel's cells
    area = Path(servers.sealed_area())
    start = time.monotonic()
    hider = grade_job(
        Job("hiding_hal", _seal.LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=60))
    )
    assert time.monotonic() - start < 15, "the notebook ran on"
    assert hider.error is None and hider.status == "graded", (hider.status, hider.error)
    assert "NOT STOPPED" not in hider.notebook.decode() and "DiskLimit" in hider.notebook.decode()
    assert any(flag.endswith("on disk: stopped") or "disk watch" in flag for flag in hider.flags), hider.flags
    assert not list(area.rglob("big*")), "its files were left"
    _next_classmate_keeps_full_marks(template)


@needs_seal
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become nobody")
def test_the_mounts_hold_where_grading_does_not_run_as_root():
    """The tests above, run again by an ordinary user (nobody)."""
    code, said = _tests_as_nobody(__file__, 600)
    assert code == 0, said
    assert re.search(r"\b3 passed", said) and "failed" not in said, said
