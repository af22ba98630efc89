"""One boundary per notebook (grader/classroom/boundary.py), attacked from below Python.

Every kernel and sandbox of a sealed fork server runs in namespaces of its own, as an
unprivileged user with no capabilities and a seccomp filter. These tests attack it the way a
student who knows the machine would: from /bin/sh and with ctypes, with the course's audit-hook
guard switched off (``guard={}``), so that whatever is refused here, the operating system refused.
The graded-job tests run with the guard on and reach the shell the way that slipped past it
(``_posixsubprocess.fork_exec``, which raises no audit event).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import nbformat
import pytest

from grader import course
from grader.classroom import boundary, kernels
from grader.classroom.fork_client import ForkServer, ServerTimeout
from tests import test_seal as _seal
from tests.nbtools import filled, solution_sources
from tests.test_seal import LESSON, _alive, _run, needs_seal

# the seal tests' fixtures: a sealed fork server, kernels with no guard, a gradebook of lesson 01
gradebook = _seal.gradebook
kernel_settings = _seal.kernel_settings
sealed_fork_server = _seal.sealed_fork_server

_PROBE = r"""
import ctypes, errno, json, os, platform
libc = ctypes.CDLL(None, use_errno=True)
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
numbers = {"x86_64": {"ptrace": 101, "open_by_handle_at": 304, "unshare": 272, "mount": 165, "keyctl": 250,
                      "bpf": 321, "setns": 308},
           "aarch64": {"ptrace": 117, "open_by_handle_at": 265, "unshare": 97, "mount": 40, "keyctl": 219,
                       "bpf": 280, "setns": 268}}[platform.machine()]
args = {"ptrace": (16, 1, 0, 0), "open_by_handle_at": (3, 0, 0), "unshare": (0x10000000,),
        "mount": (0, 0, 0, 0, 0), "keyctl": (0, 0), "bpf": (0, 0, 0), "setns": (0, 0)}
calls = {}
for name, nr in numbers.items():
    result = libc.syscall(nr, *args[name])
    calls[name] = "allowed" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
try:
    open("big", "wb").close()
    os.truncate("big", 300 * 1024 * 1024)
    big = "written"
except OSError as e:
    big = errno.errorcode.get(e.errno, "?")
print("PROBE " + json.dumps({
    "uid": os.getuid(), "pid": os.getpid(), "ppid": os.getppid(),
    "CapEff": status["CapEff"].strip(), "CapBnd": status["CapBnd"].strip(),
    "NoNewPrivs": status["NoNewPrivs"].strip(), "Seccomp": status["Seccomp"].strip(),
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "calls": calls, "big file": big,
}))
"""


def _probe(nb: nbformat.NotebookNode) -> dict:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            for line in str(out.get("text", "")).splitlines():
                if line.startswith("PROBE "):
                    return json.loads(line[6:])
    raise AssertionError(f"the probe printed nothing: {[c.get('outputs') for c in nb.cells]}")


def _texts(nb: nbformat.NotebookNode) -> str:
    return "".join(
        str(o.get("text", "")) + str(o.get("evalue", "")) for c in nb.cells for o in c.get("outputs", [])
    )


def test_the_seccomp_filter_is_a_program_for_this_machine():
    program = boundary.seccomp_filter()
    assert program is not None and len(program) % 8 == 0 and len(program) // 8 < 256
    assert boundary.seccomp_filter("riscv-none") is None


@needs_seal
def test_student_code_runs_unprivileged_in_a_namespace_of_its_own(kernel_settings, sealed_fork_server):
    """No capability, no_new_privs, the filter, a PID namespace with nothing else of anyone's in it;
    the calls that crossed the seal before (open_by_handle_at, ptrace, namespaces) fail."""
    nb = _run([_PROBE], Path(sealed_fork_server.sealed_area), kernel_settings, sealed_fork_server)
    seen = _probe(nb)
    assert seen["uid"] != 0
    if os.geteuid() == 0:
        assert boundary.UID_BASE <= seen["uid"] < boundary.UID_BASE + boundary.UID_RANGE
    assert seen["CapEff"] == seen["CapBnd"] == "0000000000000000"
    assert seen["NoNewPrivs"] == "1" and seen["Seccomp"] == "2"
    # the second process of its namespace: process 1 is a do-nothing init, and its parent (the fork
    # server, or the proxy where grading is not root) lies outside, so it has no number here
    assert seen["pid"] == 2 and seen["ppid"] in (0, 1)
    # no pid of the fork server or of other notebooks; process 1 is listed only where it is the
    # student's own user (grading not as root), else hidden
    assert seen["processes"] in ([2], [1, 2]), seen["processes"]
    assert set(seen["calls"].values()) == {"EPERM"}, seen["calls"]
    assert seen["big file"] == "EFBIG"


_SHELL_ATTACK = r"""
import subprocess
attack = r'''
for p in /proc/[0-9]*; do
  n=${p#/proc/}
  [ "$n" = "$$" ] || [ "$n" = "$PPID" ] && continue
  echo '{"op": "preload", "modules": ["planted"]}' 2>/dev/null > $p/fd/0 && echo "WROTE $n"
  timeout 1 head -c 1 $p/fd/1 >/dev/null 2>&1 && echo "READ $n"
  kill -STOP $n 2>/dev/null && echo "STOPPED $n"
done
# a process that outlives the notebook if it can, and writes where the next one works
setsid sh -c 'sleep 0.5; while true; do echo planted > "$1/planted.py" 2>/dev/null; sleep 0.1; done' outlives-{marker} "{area}" >/dev/null 2>&1 &
echo planted > /tmp/planted.py 2>/dev/null && echo "PLANTED /tmp"
echo planted > /dev/shm/planted 2>/dev/null && echo "PLANTED shm"
echo planted > /tmp/matplotlib/matplotlibrc 2>/dev/null && echo "PLANTED mpl"
echo "USER $(id -u)"
echo done
'''
print(subprocess.run(["/bin/sh", "-c", attack], capture_output=True, text=True, timeout=20).stdout)
"""


@needs_seal
def test_one_notebook_cannot_reach_the_fork_server_or_the_notebooks_after_it(
    kernel_settings, sealed_fork_server
):
    """From a shell: write into every visible process's stdin, stop them, leave a process behind and
    plant files in the shared folders. The fork server serves the next notebook as before, which
    sees nothing planted, and nothing of the first notebook is left running."""
    area = Path(sealed_fork_server.sealed_area)
    marker = f"m{os.getpid()}x{time.monotonic_ns() % 10**6}"
    first = _run(
        [_SHELL_ATTACK.replace("{marker}", marker).replace("{area}", str(area))],
        area,
        kernel_settings,
        sealed_fork_server,
    )
    said = _texts(first)
    assert "done" in said, said
    # it can name no process but its own (process 1 of its namespace at most, which ends with it);
    # /dev/shm and matplotlib's folder are its own too, and die with it
    reached = set(re.findall(r"(?:WROTE|READ|STOPPED) (\d+)", said))
    assert reached <= {"1"}, said  # its namespace's process 1 at most, which ends with it
    assert "PLANTED /tmp" not in said, said
    time.sleep(1.0)
    assert _alive(f"outlives-{marker}") == [], "a process of the notebook outlived it"
    assert not (area / "planted.py").exists()
    second = _run(
        [
            "import os, sys\n"
            "print('USER', os.getuid())\n"
            "print('SHM', os.listdir('/dev/shm'))\n"
            "print('MPL', sorted(os.listdir('/tmp/matplotlib')))\n"
            "print('RUNS', 'planted' in sys.modules)"
        ],
        area,
        kernel_settings,
        sealed_fork_server,
    )
    users = re.findall(r"USER (\d+)", said)
    said = _texts(second)
    assert "SHM []" in said and "RUNS False" in said and "matplotlibrc" not in said, said
    if os.geteuid() == 0:  # each notebook a user of its own: no process or file of one is the other's
        assert users and users != re.findall(r"USER (\d+)", said), (users, said)


@needs_seal
def test_a_process_that_left_the_kernels_group_ends_when_the_kernel_is_killed(
    kernel_settings, sealed_fork_server
):
    """A grading kernel is killed at once (nbgrader's immediate shutdown: SIGKILL to the process the
    fork server knows). A process the cell started in a session of its own ends with it."""
    from nbclient import NotebookClient

    area = Path(sealed_fork_server.sealed_area)
    marker = f"k{os.getpid()}x{time.monotonic_ns() % 10**6}"
    kernel_settings.fork_server = sealed_fork_server
    kernel_settings.area = str(area)
    cwd = area / f"job-{marker}"
    cwd.mkdir()
    cell = f"import subprocess\nsubprocess.Popen(['setsid', 'sh', '-c', 'while true; do sleep 0.1; done', 'left-{marker}'])"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(
        nb,
        timeout=60,
        shutdown_kernel="immediate",
        kernel_manager_class=kernels.GuardedKernelManager,
        resources={"metadata": {"path": str(cwd)}},
    ).execute()
    deadline = time.monotonic() + 5
    while _alive(f"left-{marker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(f"left-{marker}") == [], "a process of the notebook outlived its kernel"


@needs_seal
def test_a_stopped_fork_server_costs_a_timeout_not_the_run(monkeypatch):
    """A fork server that stops answering (SIGSTOP) is killed after the deadline; the request that
    waited fails with ServerTimeout, and the next request gets a new server."""
    from grader.classroom import fork_client

    monkeypatch.setattr(fork_client, "ANSWER_SECONDS", 2.0)
    z = ForkServer(kernels.kernel_env(None), trusted_only=False)
    try:
        z.ensure()
        os.kill(z._proc.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(ServerTimeout):
            z.request({"op": "poll", "pid": 1})
        assert time.monotonic() - started < 10
        z.ensure()  # a fresh server
        assert z.request({"op": "poll", "pid": 1}) == {"returncode": -1}
    finally:
        z.close()


# ------------------------------------------------------------------ graded jobs, guard on

_FORK_EXEC = """
import _posixsubprocess, os
def _shell(script):
    r, w = os.pipe()
    return _posixsubprocess.fork_exec([b"/bin/sh", b"-c", script.encode()], [b"/bin/sh"], True, (), None, None,
        -1, -1, -1, -1, -1, -1, r, w, True, True, -1, None, None, None, -1, None, False)
"""

# keeps replacing every notebook it can find below the kernel's folder, and the folder itself
_DOCTOR = (
    _FORK_EXEC
    + r'''
_shell("""
here=$(pwd)
top=$(dirname "$here")
while true; do
  for f in "$here"/*.ipynb; do
    printf '%s' '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}' > "$f.new" 2>/dev/null && mv -f "$f.new" "$f" 2>/dev/null
  done
  ln -sfn /work "$here/timestamp.txt" 2>/dev/null
  sleep 0.01
done
""")
'''
)


def _correct_notebook() -> nbformat.NotebookNode:
    return filled(course.ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", solution_sources(LESSON))


@needs_seal
def test_a_process_left_behind_cannot_touch_the_graded_notebook(gradebook):
    """A stub submission whose shell keeps replacing the notebook in its folder earns what its code
    earns (nothing), and the graded notebook is nbgrader's; a classmate graded next by the same
    worker keeps full marks."""
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    nb = nbformat.read(course.ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", as_version=4)
    nb.cells.insert(1, nbformat.v4.new_code_cell(_DOCTOR))
    attacker = grade_job(
        Job(
            "doctor_dan",
            LESSON,
            nbformat.writes(nb).encode(),
            template,
            timestamp="2026-11-01 10:00:00",
            options=Options(timeout=30),
        )
    )
    assert attacker.error is None, attacker.error
    assert attacker.isolation == "sealed"
    assert attacker.score == 0, [(c.grade_id, c.score) for c in attacker.cells]
    graded = nbformat.reads(attacker.notebook.decode(), as_version=4)
    assert len(graded.cells) > 5  # nbgrader's notebook, not the doctored one
    assert attacker.files.get("timestamp.txt") == b"2026-11-01 10:00:00"
    victim = grade_job(
        Job(
            "victim_vic",
            LESSON,
            nbformat.writes(_correct_notebook()).encode(),
            template,
            options=Options(timeout=30),
        )
    )
    assert victim.error is None, victim.error
    assert victim.score == victim.max_score, [(c.grade_id, c.score, c.message) for c in victim.cells]


@needs_seal
def test_a_notebook_that_attacks_the_fork_server_leaves_the_next_classmate_full_marks(gradebook):
    """The attack that zeroed a worker's later students: a shell writes a preload request into the
    fork server's stdin and stops every process it sees. Here it sees none of them."""
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    attack = (
        _FORK_EXEC
        + r'''
open("planted.py", "w").write("import os\nos._exit(3)\n")
_shell("""
for p in /proc/[0-9]*; do
  echo '{"op": "preload", "modules": ["planted"]}' > $p/fd/0 2>/dev/null
  kill -STOP ${p#/proc/} 2>/dev/null
done
""")
'''
    )
    nb = _correct_notebook()
    nb.cells.insert(1, nbformat.v4.new_code_cell(attack))
    attacker = grade_job(
        Job("mallory", LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=30))
    )
    assert attacker.error is None, attacker.error
    for student in ("alice_after", "bob_after"):
        victim = grade_job(
            Job(
                student,
                LESSON,
                nbformat.writes(_correct_notebook()).encode(),
                template,
                options=Options(timeout=30),
            )
        )
        assert victim.error is None, victim.error
        assert victim.isolation == "sealed"
        assert victim.score == victim.max_score, [(c.grade_id, c.score, c.message) for c in victim.cells]


def test_a_job_past_its_deadline_is_reported_and_the_others_are_still_done():
    """A job that never ends (a wedged worker) ends as "could not be graded: timed out" at the
    run's deadline for one job; the jobs beside it still give their results."""
    from grader.classroom.executors import JobTimeout, LocalExecutor

    started = time.monotonic()
    with LocalExecutor(2) as ex:
        results = dict(ex.run(time.sleep, [0.2, 600, 0.3, 0.1], deadline=3))
    assert time.monotonic() - started < 60
    assert isinstance(results[600], JobTimeout) and "timed out" in str(results[600])
    assert [results[t] for t in (0.2, 0.3, 0.1)] == [None, None, None]


@pytest.mark.parametrize(
    "code",
    [
        "import torch\ndef softmax(Z, dim=-1, f=torch.softmax):\n    with torch._C.DisableTorchFunction():\n"
        "        return f(Z, dim)",
        "from torch.utils._python_dispatch import _disable_current_modes",
        "import torch\nwith torch._C._DisableTorchDispatch():\n    pass",
    ],
)
def test_code_that_turns_off_the_rules_watch_is_flagged_for_review(code):
    """The lessons' rules are watched by a torch function mode, which code in the student's own
    process can switch off: that is flagged for a look (the rule itself is best effort)."""
    from grader.classroom import tamper_scan

    assert "turns off the course's watch on torch calls (the lesson's rules)" in tamper_scan.scan([code])


def test_a_subclass_unwrapped_for_speed_is_not_flagged():
    """``DisableTorchFunctionSubclass`` only unwraps tensor subclasses (the watch still sees the calls)."""
    from grader.classroom import tamper_scan

    code = "import torch\nwith torch._C.DisableTorchFunctionSubclass():\n    x = torch.ones(2)"
    assert tamper_scan.scan([code]) == []
