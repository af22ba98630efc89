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
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from grader import course
from grader.classroom import boundary, kernels
from grader.classroom.fork_client import ForkServer, ServerTimeout
from tests import attacks
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
                      "bpf": 321, "setns": 308, "open_tree_attr": 467},
           "aarch64": {"ptrace": 117, "open_by_handle_at": 265, "unshare": 97, "mount": 40, "keyctl": 219,
                       "bpf": 280, "setns": 268, "open_tree_attr": 467}}[platform.machine()]
args = {"ptrace": (16, 1, 0, 0), "open_by_handle_at": (3, 0, 0), "unshare": (0x10000000,),
        "mount": (0, 0, 0, 0, 0), "keyctl": (0, 0), "bpf": (0, 0, 0), "setns": (0, 0),
        "open_tree_attr": (-100, 0, 0, 0, 0)}  # no path: EFAULT (ENOSYS before Linux 6.15) unless refused
calls = {}
for name, nr in numbers.items():
    result = libc.syscall(nr, *args[name])
    calls[name] = "allowed" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
import socket
for family, kind, protocol, name in (
    (40, 1, 0, "AF_VSOCK"), (38, 5, 0, "AF_ALG"), (17, 2, 0, "AF_PACKET"), (15, 3, 2, "AF_KEY"), (30, 4, 0, "AF_TIPC"),
    (2, 1, 262, "AF_INET MPTCP"), (2, 2, 136, "AF_INET UDPLITE"), (16, 3, 6, "AF_NETLINK XFRM"),
):  # kinds: stream, seqpacket, dgram, raw, rdm
    try:
        socket.socket(family, kind, protocol).close()
        calls["socket " + name] = "allowed"
    except OSError as e:
        calls["socket " + name] = errno.errorcode.get(e.errno, "?")
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
# a process that outlives the notebook if it can, and writes where the next one works (in a session of
# its own where that is not refused)
plant='sleep 0.5; while true; do echo planted > "$1/planted.py" 2>/dev/null; sleep 0.1; done'
(setsid sh -c "$plant" outlives-{marker} "{area}" || sh -c "$plant" outlives-{marker} "{area}") >/dev/null 2>&1 &
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
def test_a_notebook_sees_only_its_own_folders_of_the_seals_area(kernel_settings, sealed_fork_server):
    """Another job's notebook and pipes lie in the same area: the kernel lists only its own folders
    there, cannot open the other job's file by its path, and no relative path from its working
    folder leads to what is covered."""
    area = Path(sealed_fork_server.sealed_area)
    other = area / "job-other"
    other.mkdir(exist_ok=True)
    (other / "graded.ipynb").write_text("SECRET-OF-ANOTHER-JOB")
    (area / "pipes").mkdir(exist_ok=True)
    cell = f"""
import os
area = {str(area)!r}
print("AREA", sorted(os.listdir(area)))
print("PARENT", sorted(os.listdir("..")))
for path in (area + "/job-other/graded.ipynb", "../job-other/graded.ipynb"):
    try:
        print("READ", open(path).read())
    except OSError as e:
        print("REFUSED", type(e).__name__)
open("mine.txt", "w").write("written")
print("OWN", open("mine.txt").read())
"""
    nb = _run([cell], area, kernel_settings, sealed_fork_server)
    said = _texts(nb)
    listed = re.search(r"AREA \[(.*)\]", said)
    assert listed, said
    names = {n.strip(" '") for n in listed.group(1).split(",") if n.strip()}
    assert names and all(n.startswith(("job-", "kernel-")) for n in names), said
    assert "job-other" not in names and "pipes" not in names, said
    assert "job-other" not in said.split("PARENT", 1)[1].split("\n", 1)[0], said
    assert "SECRET-OF-ANOTHER-JOB" not in said and said.count("REFUSED FileNotFoundError") == 2, said
    assert "OWN written" in said, said
    assert (other / "graded.ipynb").read_text() == "SECRET-OF-ANOTHER-JOB"


_ZOMBIES = r"""
import os, subprocess, time
# each shell starts a child and leaves at once: the child, orphaned, is process 1's to reap
for _ in range(5):
    subprocess.run(["/bin/sh", "-c", "sleep 0.05 &"], check=True)
time.sleep(1.0)
def state(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
print("ZOMBIES", sum(state(p) == "Z" for p in os.listdir("/proc") if p.isdigit()))
"""


@needs_seal
def test_processes_a_student_orphans_are_reaped_inside_the_notebook(kernel_settings, sealed_fork_server):
    """Process 1 of a notebook's namespace reaps the orphans its processes leave: none stays a zombie
    (each would count against the notebook's process limit until the notebook ends)."""
    nb = _run([_ZOMBIES], Path(sealed_fork_server.sealed_area), kernel_settings, sealed_fork_server)
    said = _texts(nb)
    assert "ZOMBIES 0" in said, said


_MEMORY_HOGS = r"""
import subprocess, sys
print("CGROUP", open("/proc/self/cgroup").read().replace(chr(10), " "))
# each says "held" once it has held 900 MB for 3 s: one the cap killed meanwhile never says it
hog = "x = b'1' * (900 * 2**20); import time; time.sleep(3); print('held', flush=True)"
children = [subprocess.Popen([sys.executable, "-c", hog], stdout=subprocess.PIPE, text=True) for _ in range(3)]
print("HELD", sum(c.communicate()[0].count("held") for c in children))
"""


@needs_seal
def test_the_memory_cap_holds_for_all_of_a_notebooks_processes_together(kernel_settings, sealed_fork_server):
    """Three processes of 900 MB each, under a 2 GiB cap that each of them alone stays below: where
    the worker can make cgroups, the notebook's cgroup holds them to the cap together (not all three
    live), and each notebook's cgroup is its own."""
    made = boundary.make_cgroups()
    boundary.remove_cgroups(made)
    if not made:
        pytest.skip("this machine gives the grading process no cgroup of its own to divide")
    kernel_settings.memory = 2 * 2**30
    nb = _run([_MEMORY_HOGS], Path(sealed_fork_server.sealed_area), kernel_settings, sealed_fork_server)
    said = _texts(nb)
    assert sealed_fork_server.cgroups, "the worker made no cgroup folders where it may"
    assert "/notebook-" in said, said
    held = re.search(r"HELD (\d)", said)
    assert held and int(held.group(1)) < 3, said
    again = _run(
        ["print('CGROUP', open('/proc/self/cgroup').read().replace(chr(10), ' '))"],
        Path(sealed_fork_server.sealed_area),
        kernel_settings,
        sealed_fork_server,
    )
    first = set(re.findall(r"notebook-[0-9a-f]+", said))
    second = set(re.findall(r"notebook-[0-9a-f]+", _texts(again)))
    assert first and second and not first & second, (said, _texts(again))


@needs_seal
def test_a_notebooks_memory_cap_is_for_its_own_code_not_the_libraries_its_kernel_starts_with(
    kernel_settings, sealed_fork_server
):
    """A kernel is forked with PyTorch, IPython and the course loaded: about 1 GiB of address space,
    nearly all of it shared with its fork server. Under a 1 GiB cap that counted those too, a kernel had
    a few MB left and could die before its first cell; the cap is what the student's code adds, and
    the student's code cannot lift it (no audit hook needed: it is the hard limit)."""
    kernel_settings.memory = 1 << 30
    nb = _run(
        ["import torch\nx = torch.ones(2**27)  # 512 MiB, written\nprint('MADE', int(x.sum()))"],
        Path(sealed_fork_server.sealed_area),
        kernel_settings,
        sealed_fork_server,
    )
    assert "MADE 134217728" in _texts(nb), _texts(nb)
    over = _run(
        [
            "import torch\ntry:\n    x = torch.ones(2**28 + 2**27)\nexcept RuntimeError as e:\n    print('REFUSED', e)"
        ],
        Path(sealed_fork_server.sealed_area),
        kernel_settings,
        sealed_fork_server,
    )
    assert "REFUSED" in _texts(over), _texts(over)
    lift = _run([_LIFT_CAP], Path(sealed_fork_server.sealed_area), kernel_settings, sealed_fork_server)
    assert "KEPT" in _texts(lift) and "LIFTED" not in _texts(lift), _texts(lift)


_LIFT_CAP = r"""
import os, resource, sys, torch
cap = resource.RLIMIT_DATA if os.path.exists("/dev/nvidiactl") else resource.RLIMIT_AS
try:
    resource.setrlimit(cap, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
except (ValueError, OSError) as e:
    print("KEPT", e)
try:
    x = torch.ones(2**28 + 2**27)
    print("LIFTED", x.numel())
except RuntimeError:
    print("KEPT: still refused")
"""


_SPINNERS = r"""
import os, subprocess, sys
print("CGROUP FILES", sorted(os.listdir("/sys/fs/cgroup")))
# four processes that spin for 2 s each, in sessions of their own where that is not refused (no
# scheduler group holds them together), and say how much CPU time they got
spin = "import os, time\nend = time.monotonic() + 2\nwhile time.monotonic() < end: pass\nt = os.times()\nprint(t.user + t.system)"
def start():
    try:
        return subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True, start_new_session=True)
    except PermissionError:  # no session of its own: the seccomp filter refuses it
        return subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
procs = [start() for _ in range(4)]
print("CORES USED", round(sum(float(p.communicate()[0]) for p in procs) / 2, 2))
"""


@needs_seal
def test_a_notebook_uses_no_more_cores_than_its_threads(kernel_settings, sealed_fork_server):
    """Spinning processes of one notebook share the cores it was given (one here), so a classmate
    graded at the same time keeps the rest; the cgroup files of other notebooks are not shown."""
    made = boundary.make_cgroups()
    boundary.remove_cgroups(made)
    if not any("cpu" in held for _, held in boundary._cgroup_parents()) or not made:
        pytest.skip("this machine gives the grading process no CPU cgroup of its own to divide")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: a quota of one core holds nothing back")
    kernel_settings.threads = 1
    nb = _run([_SPINNERS], Path(sealed_fork_server.sealed_area), kernel_settings, sealed_fork_server)
    said = _texts(nb)
    used = re.search(r"CORES USED ([0-9.]+)", said)
    assert used and float(used.group(1)) <= 1.15, said
    assert "CGROUP FILES []" in said, said


_SANDBOX_LOOKS = """
import os
def _sees_the_job():
    # in the sandbox (its folder is the job's scratch) anything else of the job is a leak
    return os.path.basename(os.getcwd()) == "scratch" and {condition}
if _sees_the_job():
    def project(X, W_q, W_k, W_v):
        return X @ W_q * 0, X @ W_k * 0, X @ W_v * 0
"""


@needs_seal
@pytest.mark.parametrize(
    "condition, full_marks",
    [
        # the red team's route to the submitted notebook: up from the scratch folder
        ("sorted(os.listdir('..')) != ['scratch']", True),
        ("any(os.path.exists(p) for p in ('../autograded', '../pipes', '../tmp', '../kernel.log'))", True),
        # the control: a sandbox that always sabotages loses the marks, so the two above are seen
        ("True", False),
    ],
)
def test_the_sandbox_sees_nothing_of_its_job_but_its_scratch(gradebook, condition, full_marks):
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    nb = _correct_notebook()
    answer = next(i for i, c in enumerate(nb.cells) if c.get("id") == "ex01_project")
    nb.cells.insert(answer + 1, nbformat.v4.new_code_cell(_SANDBOX_LOOKS.format(condition=condition)))
    result = grade_job(
        Job("curious_cat", LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=30))
    )
    assert result.error is None, result.error
    assert result.isolation == "sealed"
    scores = [(c.grade_id, c.score, c.message) for c in result.cells]
    assert (result.score == result.max_score) is full_marks, scores


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
    loop = f"['sh', '-c', 'while true; do sleep 0.1; done', 'left-{marker}']"
    cell = (  # in a session of its own where that is not refused, else in a group of its own
        f"import subprocess\ntry:\n    subprocess.Popen({loop}, start_new_session=True)\n"
        f"except PermissionError:\n    subprocess.Popen({loop}, process_group=0)"
    )
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


# keeps replacing every notebook it can find below the kernel's folder, and the folder itself
_DOCTOR = (
    attacks.FORK_EXEC
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


def _next_classmate_keeps_full_marks(template: bytes) -> None:
    """A correct notebook graded next by the same worker earns full marks."""
    from grader.classroom.autograde import Job, Options, grade_job

    notebook = nbformat.writes(_correct_notebook()).encode()
    victim = grade_job(Job("next_ned", LESSON, notebook, template, options=Options(timeout=30)))
    assert victim.error is None, victim.error
    assert victim.score == victim.max_score, [(c.grade_id, c.score, c.message) for c in victim.cells]


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
        attacks.FORK_EXEC
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


_PLAIN_WORK = """
import multiprocessing, os, resource, sys, tempfile
from pathlib import Path
from tests.nbtools import grading_work
print("process limit", resource.getrlimit(resource.RLIMIT_NPROC), file=sys.stderr)
with grading_work(Path(tempfile.mkdtemp()), ["01_projection"]):
    pass
with multiprocessing.get_context("forkserver").Pool(1) as pool:
    assert pool.apply(os.getpid) != os.getpid()
"""


def _as_nobody(argv: list[str], home: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run argv in the course folder as an ordinary user (nobody), with a home of its own."""
    env = {
        "HOME": str(home),
        "TMPDIR": str(home),
        "MPLCONFIGDIR": str(home / "mpl"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
    }
    who = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    # where Python lies below a folder only root may enter (/root), it is shown in a mount namespace
    shown = _shown_to_others([sys.base_prefix, sys.prefix, str(course.ROOT)], home)
    if shown:
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'{shown} exec "$@"',
            "sh",
            *who,
            *argv,
        ]
        who = []
    return subprocess.run(
        who + argv, cwd=course.ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _shown_to_others(paths: list[str], stages: Path) -> str:
    """Shell lines that cover each folder others may not enter, above these paths, with one that shows
    only the entries on the way to them (as a machine whose Python is installed for everyone would)."""
    entries: dict[str, set[str]] = {}
    for path in paths:
        parts = Path(path).resolve().parts
        for i in range(1, len(parts) - 1):
            folder = str(Path(*parts[: i + 1]))
            if not os.stat(folder).st_mode & 0o001:
                entries.setdefault(folder, set()).add(parts[i + 1])
                break
    lines = []
    for folder, names in entries.items():
        stage = tempfile.mkdtemp(prefix="shown-", dir=stages)
        lines.append(f"mount -t tmpfs -o mode=0755,size=1m tmpfs {stage} &&")
        for name in sorted(names):
            inner = shlex.quote(os.path.join(folder, name))
            lines.append(
                f"mkdir {stage}/{shlex.quote(name)} && mount --bind {inner} {stage}/{shlex.quote(name)} &&"
            )
        lines.append(f"mount --move {stage} {shlex.quote(folder)} &&")
    return " ".join(lines)


@needs_seal
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become nobody")
def test_the_boundary_holds_where_grading_does_not_run_as_root():
    """Grading run by an ordinary user (a JupyterHub server, a laptop): each child makes its namespaces
    itself, in a user namespace of that user. Every attack above is tried again that way, and all
    hold (the memory test is skipped there: an ordinary user gets no cgroup to divide)."""
    code, said = _tests_as_nobody(__file__, 900, also=_PLAIN_WORK)
    assert code == 0, said
    assert re.search(r"\b1[0-9] passed", said) and "failed" not in said, said


def _tests_as_nobody(path: str, timeout: float, also: str | None = None) -> tuple[int, str]:
    """Run the tests of ``path`` but those named ``does_not_run_as_root`` as nobody: the exit status, and
    what failed first (one line each) with the end of the run. Skips where an ordinary user cannot run
    the course here, or (``also``: Python code) cannot do what grading needs beside the boundary."""
    home = Path(tempfile.mkdtemp(prefix="boundary-nobody-", dir="/tmp"))  # reachable by anyone
    os.chmod(home, 0o777)
    try:
        can = _as_nobody([sys.executable, "-c", "import grader, torch"], home, 120)
        if can.returncode != 0:
            pytest.skip(f"the course cannot be read by an ordinary user here: {can.stderr[-300:]}")
        # what grading needs that has nothing to do with the boundary: nbgrader making a gradebook,
        # a multiprocessing pool. Where an ordinary user cannot do these here, the skip says why.
        plain = _as_nobody([sys.executable, "-c", also], home, 300) if also else None
        if plain is not None and plain.returncode != 0:
            pytest.skip(f"an ordinary user cannot grade here, sealed or not: {plain.stderr[-600:]}")
        if _as_nobody(["unshare", "--user", "true"], home, 30).returncode != 0:
            pytest.skip("ordinary users may not make user namespaces on this machine")
        tests = [sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider", path]
        done = _as_nobody(
            tests + ["-k", "not does_not_run_as_root", "-rfEs", "--tb=line", "-W", "ignore"], home, timeout
        )
        failed = [line for line in done.stdout.splitlines() if re.match(r"(FAILED|ERROR|E ) ", line)]
        return done.returncode, "\n".join(failed[:40]) + "\n...\n" + done.stdout[-6000:] + done.stderr[-2000:]
    finally:
        shutil.rmtree(home, ignore_errors=True)


_FILL_THE_DISK = r"""
import os, subprocess
made = 0
for i in range(8):  # 2 GB in files of 256 MB, each below the file-size limit
    done = subprocess.run(["fallocate", "-l", "256M", f"big{i}"], capture_output=True, text=True)
    made += done.returncode == 0
print("MADE", made)
"""


@needs_seal
@pytest.mark.skipif(os.geteuid() != 0, reason="only where grading runs as root is the area in memory")
def test_a_notebook_cannot_fill_the_machines_disk(kernel_settings):
    """Where grading runs as root, a worker's area is a file system in memory of its own: a notebook
    that writes 2 GB in files each under the size limit is stopped at the area's size, and the
    machine's disk does not move."""
    from grader.classroom import servers

    if not shutil.which("fallocate"):
        pytest.skip("no fallocate here")
    area = servers.sealed_area()
    if not os.path.ismount(area):
        pytest.skip("this machine may not mount a file system for the area")
    disk = shutil.disk_usage(tempfile.gettempdir()).used
    server = ForkServer(kernels.kernel_env(None), sealed_area=area)
    try:
        nb = _run([_FILL_THE_DISK], Path(area), kernel_settings, server)
    finally:
        server.close()
    said = _texts(nb)
    made = re.search(r"MADE (\d)", said)
    assert made and int(made.group(1)) <= servers.AREA_BYTES // (256 << 20), said
    assert shutil.disk_usage(tempfile.gettempdir()).used - disk < 256 << 20


_DEEP_TREE = (
    attacks.FORK_EXEC
    + r"""
import time
_shell("i=0; while [ $i -lt 3000 ]; do mkdir d && cd d || break; i=$((i+1)); done")
time.sleep(6)
"""
)


@needs_seal
def test_a_tree_thousands_of_folders_deep_costs_its_notebook_not_the_run(gradebook):
    """A folder tree 3,000 deep, left in the job's folder: the job ends as a job does, its folder is
    removed, and the next classmate of the same worker keeps full marks."""
    from grader.classroom import servers
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    nb = _correct_notebook()
    nb.cells.insert(1, nbformat.v4.new_code_cell(_DEEP_TREE))
    jobs = set(Path(servers.sealed_area()).glob("job-*"))
    deep = grade_job(
        Job("deep_dora", LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=30))
    )
    assert deep.error is None, deep.error
    assert set(Path(servers.sealed_area()).glob("job-*")) <= jobs, "the job's folder was left"
    victim = grade_job(
        Job(
            "next_ned",
            LESSON,
            nbformat.writes(_correct_notebook()).encode(),
            template,
            options=Options(timeout=30),
        )
    )
    assert victim.error is None, victim.error
    assert victim.score == victim.max_score, [(c.grade_id, c.score, c.message) for c in victim.cells]
