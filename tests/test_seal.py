"""The seal around student code while grading: real bubblewrap, real kernels, real sandbox.

A kernel started the way grading starts it (forked from the sealed fork server,
or one bwrap per kernel as plain ``nbgrader autograde`` does) must not see the
grading code, the instructor's sources, the gradebook, another student's
submission, the home folder or the socket of the forkserver that grading workers
come from, must not reach the network, and must leave no
process behind. In place of the explorers it finds their stand-in: every
explorer cell shows what it showed while graded, and no internal module of the
explorers (their computations) can be imported. A graded submission whose code
is right only where the grading package and the explorers' internals are out of
sight gets full marks from both the kernel and the sandbox; with the seal turned
off the run says "not sealed".
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from grader import course
from grader.classroom import kernels, seal
from grader.classroom.fork_client import ForkServer
from tests.nbtools import grading_work
from tests.procs import parent

pytestmark = pytest.mark.slow
SEALED, WHY = seal.available()
needs_seal = pytest.mark.skipif(not SEALED, reason=f"no seal here: {WHY}")
LESSON = "01_projection"


# ------------------------------------------------------------------ helpers


def _probe_cell(paths: dict[str, str], port: int) -> str:
    """A cell that prints, as JSON, what it could see of each path, of grader and of the network."""
    return f"""
import json, os, socket
seen = {{}}
for name, path in {paths!r}.items():
    if not os.path.lexists(path):
        seen[name] = "absent"
        continue
    try:
        seen[name] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path, "rb").read(16).hex()
    except Exception as e:
        seen[name] = type(e).__name__
try:
    import grader
    seen["import grader"] = "imported"
except ImportError as e:
    seen["import grader"] = "ImportError"
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
    seen["tcp"] = "connected"
except OSError as e:
    seen["tcp"] = type(e).__name__
print("SEEN " + json.dumps(seen))
"""


def _seen(nb: nbformat.NotebookNode) -> dict:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            for line in str(out.get("text", "")).splitlines():
                if line.startswith("SEEN "):
                    return json.loads(line[5:])
    raise AssertionError(f"the probe printed nothing: {[c.get('outputs') for c in nb.cells]}")


def _alive(marker: str) -> list[int]:
    """Processes anywhere on this machine whose command line holds the marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.fixture
def course_like(tmp_path):
    """A work folder like a real grading run's: gradebook, two students' submissions, one autograded copy."""
    work = tmp_path / "work"
    (work / "gradebook.db").parent.mkdir(parents=True)
    (work / "gradebook.db").write_bytes(b"SQLite format 3\0 the gradebook")
    other = work / "submitted" / "bob" / LESSON
    other.mkdir(parents=True)
    (other / f"{LESSON}.ipynb").write_text('{"bob": "answers"}')
    mine = work / "autograded" / "alice" / LESSON
    mine.mkdir(parents=True)
    return work, mine


@pytest.fixture
def listener():
    srv = socket.create_server(("127.0.0.1", 0))
    srv.setblocking(False)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def sealed_fork_server(tmp_path_factory):
    area = tmp_path_factory.mktemp("sealed-area")
    z = ForkServer(kernels.kernel_env(None), sealed_area=str(area))
    yield z
    z.close()


@pytest.fixture
def kernel_settings():
    """Kernels with the seal and nothing else (no guard): what is refused here, the seal refused."""
    saved = kernels.SETTINGS
    kernels.SETTINGS = kernels.KernelSettings(sealed=True, guard={})
    yield kernels.SETTINGS
    kernels.SETTINGS = saved


def _run(
    cells: list[str], cwd: Path, settings: kernels.KernelSettings, fork_server: ForkServer | None
) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    settings.fork_server = fork_server
    if fork_server is not None:  # the tool's layout: the kernel works where the sealed fork server sees
        area = Path(fork_server.sealed_area)
        settings.area = str(area)
        cwd = area / f"job-{uuid.uuid4().hex[:8]}"
        cwd.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(
        nb,
        timeout=60,
        kernel_manager_class=kernels.GuardedKernelManager,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    return nb


def test_no_grading_kernel_starts_outside_a_fork_server(kernel_settings, tmp_path):
    """A kernel set to be sealed or guarded, with no fork server to fork it, is never started some
    other way (bubblewrap alone gave a root kernel every capability): the notebook stops with why."""
    for settings in (kernel_settings, kernels.KernelSettings(sealed=False, guard={"deny": ["/x"]})):
        kernels.SETTINGS = settings
        with pytest.raises(RuntimeError, match="forked from its fork server"):
            _run(["print('ran')"], tmp_path, settings, None)


@pytest.fixture
def grading_forkserver():
    """The socket of the forkserver that a grading run's two workers are forked from, started as
    a run starts it and running while the test does."""
    import multiprocessing.forkserver

    from grader.classroom import executors, servers

    with executors.LocalExecutor(2, preload=servers.WORKER_MODULES) as ex:
        list(ex.run(str, [0, 1]))
        address = multiprocessing.forkserver._forkserver._forkserver_address
        assert address and os.path.exists(address), address
        yield address


# ------------------------------------------------------------------ the kernel


@needs_seal
def test_a_workers_fork_servers_are_still_running_when_its_first_job_comes():
    """A new worker starts both its fork servers, then loads the grading code. The sealed one runs
    under ``bwrap --die-with-parent``, which kills it when the thread that started it ends: a
    server started from a passing thread is gone, and the first job pays for a second start."""
    script = """
import json, time
from grader.classroom import servers
servers.warm_up()
first = {name: getattr(servers, name)._proc.pid for name in ("PLAIN", "SEALED")}
time.sleep(1.0)
alive = {name: getattr(servers, name).alive() for name in first}
for name in first:
    getattr(servers, name).ensure()  # what a job does before it forks: start the server if it is gone
print(json.dumps({"alive": alive, "same": {name: getattr(servers, name)._proc.pid == first[name] for name in first}}))
"""
    env = {k: v for k, v in os.environ.items() if k != seal.OFF_VARIABLE}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=course.ROOT, env=env
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {
        "alive": {"PLAIN": True, "SEALED": True},
        "same": {"PLAIN": True, "SEALED": True},
    }


@needs_seal
def test_a_grading_kernel_loses_nothing_its_first_cell_writes(
    course_like, kernel_settings, sealed_fork_server
):
    """The grading kernels' client stops waiting as soon as the kernel has answered (no fixed
    0.2 s of silence on IOPub): what the first cells write at once all reaches the notebook."""
    assert isinstance(kernels.GuardedKernelManager().client(), kernels.GuardedKernelClient)
    _, mine = course_like
    cells = [
        "import sys\nfor i in range(300):\n    print(i)\nprint('to stderr', file=sys.stderr)",
        "print('second')",
    ]
    fork_server = sealed_fork_server
    nb = _run(cells, mine, kernel_settings, fork_server)
    streams = [o for o in nb.cells[0].outputs if o.output_type == "stream"]
    assert "".join(o.text for o in streams if o.name == "stdout").split() == [str(i) for i in range(300)]
    assert "".join(o.text for o in streams if o.name == "stderr") == "to stderr\n"
    assert [o.get("text") for o in nb.cells[1].outputs] == ["second\n"]


@needs_seal
def test_sealed_kernel_sees_nothing_of_the_course_and_no_network(
    course_like, listener, kernel_settings, sealed_fork_server, grading_forkserver
):
    work, mine = course_like
    home = Path.home()
    forkserver = grading_forkserver
    python_under_home = {
        Path(p).relative_to(home).parts[0] for p in seal.python_paths() if Path(p).is_relative_to(home)
    }
    paths = {
        "grader": str(course.ROOT / "grader"),
        "solutions": str(course.ROOT / "solutions"),
        "repository": str(course.ROOT),
        "gradebook": str(work / "gradebook.db"),
        "other submission": str(work / "submitted" / "bob" / LESSON / f"{LESSON}.ipynb"),
        "work folder": str(work),
        "home": str(home),
        "workers' forkserver": forkserver,
        "workers' forkserver folder": os.path.dirname(forkserver),
    }
    port = listener.getsockname()[1]
    fork_server = sealed_fork_server
    nb = _run([_probe_cell(paths, port)], mine, kernel_settings, fork_server)
    seen = _seen(nb)
    for name in ("grader", "solutions", "gradebook", "other submission", "workers' forkserver"):
        assert seen[name] == "absent", f"{name} is visible in the seal: {seen[name]}"
    # a kernel's own folder, and so the names of the folders above it, may show in the seal
    assert seen["work folder"] in ("absent", ["autograded"]), seen["work folder"]
    # the forkserver that grading workers come from forks anything it is asked to, unsealed
    assert seen["workers' forkserver folder"] in ("absent", []), seen["workers' forkserver folder"]
    assert set(seen["repository"]) <= {"attention_course", "data", ".venv"}, seen["repository"]
    assert set(seen["home"]) <= python_under_home, f"home folder visible: {seen['home']}"
    assert seen["import grader"] == "ImportError"
    assert seen["tcp"] != "connected"
    with pytest.raises(BlockingIOError):
        listener.accept()


@needs_seal
def test_background_process_does_not_outlive_the_notebook(course_like, kernel_settings, sealed_fork_server):
    _, mine = course_like
    marker = f"{600 + int(time.time() * 1000) % 1000}.{os.getpid() % 1000}"  # a sleep nobody else runs
    start = (  # in a session of its own where that is not refused, else in a group of its own
        "import subprocess, time\n"
        "try:\n"
        f"    p = subprocess.Popen(['sleep', '{marker}'], start_new_session=True, stdout=subprocess.DEVNULL)\n"
        "except PermissionError:\n"
        f"    p = subprocess.Popen(['sleep', '{marker}'], stdout=subprocess.DEVNULL, process_group=0)\n"
        "time.sleep(0.2)\n"
        "print('running' if p.poll() is None else 'not running')"
    )
    fork_server = sealed_fork_server
    try:
        nb = _run([start], mine, kernel_settings, fork_server)
        assert "'running" in str(nb.cells[0].outputs), nb.cells[0].outputs
        fork_server.reset()  # what a job does when its notebook ends (lifecycle._kill_kernels)
        deadline = time.monotonic() + 5
        while _alive(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(marker), "a process started by the notebook outlived it"
    finally:
        for pid in _alive(marker):
            os.kill(pid, 9)


@needs_seal
def test_a_notebooks_processes_go_before_the_servers_when_memory_runs_out(
    course_like, kernel_settings, sealed_fork_server
):
    """Out of memory machine-wide, Linux's OOM killer ends the process that scores highest. A notebook
    that spread its memory over many small processes made the fork server every kernel comes from the
    largest, and its end took every classmate's notebook with it: a notebook's processes, and what they
    start, now score first (1000), the servers and workers as they were."""
    _, mine = course_like
    cell = (
        "import subprocess\n"
        "own = open('/proc/self/oom_score_adj').read().strip()\n"
        "child = subprocess.run(['cat', '/proc/self/oom_score_adj'], capture_output=True, text=True)\n"
        "print('scores', own, child.stdout.strip())"
    )
    nb = _run([cell], mine, kernel_settings, sealed_fork_server)
    assert "scores 1000 1000" in str(nb.cells[0].outputs), nb.cells[0].outputs
    assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"


@needs_seal
def test_a_notebook_cannot_watch_who_opens_the_files_it_shares_with_the_host(
    course_like, kernel_settings, sealed_fork_server
):
    """The seal binds the course's data and the Python installation from the host, read-only. With inotify or
    fanotify a notebook saw every process on the machine open them: when each classmate's checks read the
    lesson's data, and what ran outside the seal. Neither can be made in a notebook now."""
    import platform

    from grader.classroom import seccomp

    _, mine = course_like
    numbers = seccomp.ARCHES[platform.machine()][1]
    calls = ((numbers["inotify_init1"], (0,)), (numbers["fanotify_init"], (0x200, 0)))  # FAN_REPORT_FID
    probe = (
        "import ctypes, errno; libc = ctypes.CDLL(None, use_errno=True); "
        "print([(libc.syscall(n, *a), errno.errorcode.get(ctypes.get_errno())) "
        f"for n, a in {calls!r}])"
    )
    cell = (
        "import subprocess, sys\n"
        f"done = subprocess.run(['python3', '-I', '-S', '-c', {probe!r}], capture_output=True, text=True)\n"
        "print('made:', done.stdout.strip(), done.stderr.strip()[-300:])"
    )
    nb = _run([cell], mine, kernel_settings, sealed_fork_server)
    assert "made: [(-1, 'EPERM'), (-1, 'EPERM')]" in str(nb.cells[0].outputs), nb.cells[0].outputs


# ------------------------------------------------------------------ the explorers while graded


def _explorers_as_graded(monkeypatch) -> dict[str, list[dict]]:
    """What each explorer leaves in a graded notebook, from the explorers themselves (NBGRADER_EXECUTION set)."""
    import attention_course.explorers as explorers

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    shown = {}
    for name in explorers.__all__:
        bundles = getattr(explorers, name)().static_outputs()
        shown[name] = [{"output_type": "display_data", "data": b, "metadata": {}} for b in bundles]
    return shown


def _internal_modules() -> list[str]:
    """Every module of the explorers but their package: what glue around their computations would import."""
    import attention_course.explorers as explorers

    folder = Path(explorers.__file__).parent
    return sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")


def test_stand_in_offers_every_explorer_and_nothing_else(monkeypatch):
    import importlib.util

    path = Path(seal.graded_explorers()) / "__init__.py"
    spec = importlib.util.spec_from_file_location("graded_explorers", path)
    stand_in = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stand_in)
    shown = _explorers_as_graded(monkeypatch)
    assert stand_in.__all__ == list(shown)
    assert {n for n in vars(stand_in) if not n.startswith("_")} == set(shown)
    for name, outputs in shown.items():
        said = getattr(stand_in, name)(attention=None)
        assert outputs == [{"output_type": "display_data", "data": {"text/plain": said.text}, "metadata": {}}]
        assert repr(said) == outputs[0]["data"]["text/plain"]
    assert [p.name for p in path.parent.iterdir()] == ["__init__.py"]


def test_the_stand_in_outlives_the_process_that_made_it_and_is_made_again_when_missing(monkeypatch, tmp_path):
    """Grading workers come and go: the folder the seal binds must not go with the one that made it."""
    import shutil
    import subprocess
    import sys

    folder = Path(seal.graded_explorers())
    made_elsewhere = subprocess.run(
        [sys.executable, "-c", "from grader.classroom import seal; print(seal.graded_explorers())"],
        cwd=seal.repo_root(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert made_elsewhere == str(folder) and (folder / "__init__.py").is_file()  # that process has ended
    # in a folder of this test's own (sealed kernels of other tests keep the shared one bound)
    monkeypatch.setattr(seal, "short_tmp", lambda: str(tmp_path))
    own = Path(seal.graded_explorers())
    assert (
        own.parent.parent == tmp_path
        and (own / "__init__.py").read_text() == (folder / "__init__.py").read_text()
    )
    shutil.rmtree(own.parent)
    assert seal.graded_explorers() == str(own) and (own / "__init__.py").is_file()
    (own / "__init__.py").write_text("changed = True\n")  # not the stand-in: made again
    assert seal.graded_explorers() == str(own)
    assert "changed = True" not in (own / "__init__.py").read_text()


@needs_seal
def test_sealed_kernel_shows_the_explorers_as_graded_and_none_of_their_internals(
    course_like, kernel_settings, sealed_fork_server, monkeypatch
):
    _, mine = course_like
    shown = _explorers_as_graded(monkeypatch)
    cells = [f"from attention_course.explorers import {name}\n\n{name}()" for name in shown]
    probe = f"""
import importlib, json, os
import attention_course.explorers as explorers
seen = {{"folder": sorted(os.listdir(os.path.dirname(explorers.__file__)))}}
for name in {_internal_modules()!r}:
    try:
        importlib.import_module("attention_course.explorers." + name)
        seen[name] = "imported"
    except ImportError as e:
        seen[name] = type(e).__name__
try:
    from attention_course.explorers import stages  # noqa: F401
    seen["from import"] = "imported"
except ImportError as e:
    seen["from import"] = type(e).__name__
print("SEEN " + json.dumps(seen))
"""
    fork_server = sealed_fork_server
    nb = _run([*cells, probe], mine, kernel_settings, fork_server)
    for name, cell in zip(shown, nb.cells, strict=False):
        assert [dict(o) for o in cell.outputs] == shown[name], (name, cell.outputs)
    seen = _seen(nb)
    assert seen.pop("folder") == ["__init__.py"]
    assert len(seen) > 5 and set(seen.values()) <= {"ModuleNotFoundError", "ImportError"}, seen


# ------------------------------------------------------------------ a graded submission


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory):
    """A work folder whose gradebook knows lesson 01 (built once for this module)."""
    work = tmp_path_factory.mktemp("seal-grading")
    with grading_work(work, [LESSON]) as template:
        yield work, template


def _submission(port: int) -> bytes:
    """Lesson 01 answered correctly only where grading code and explorer internals are out of sight; a probe."""
    nb = nbformat.read(course.ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", as_version=4)
    answer = f'''import importlib
import os

import torch


def project(X: torch.Tensor, W_q: torch.Tensor, W_k: torch.Tensor, W_v: torch.Tensor):
    """Right in the seal; wrong wherever the grading package or the explorers' internals can be reached."""
    try:
        import grader  # noqa: F401

        sealed = False
    except ImportError:
        sealed = not os.path.exists({str(course.ROOT / "grader")!r})
    try:
        importlib.import_module("attention_course.explorers.stages")
        sealed = False
    except ImportError:
        pass
    if not sealed:
        W_q = W_k
    return X @ W_q, X @ W_k, X @ W_v
'''
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "ex01_project":
            cell.source = answer
    probe = {"grader": str(course.ROOT / "grader"), "solutions": str(course.ROOT / "solutions")}
    nb.cells.append(nbformat.v4.new_code_cell(_probe_cell(probe, port)))
    return nbformat.writes(nb).encode()


@needs_seal
def test_graded_submission_runs_sealed_in_kernel_and_sandbox(gradebook, listener):
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    result = grade_job(
        Job(
            "sealed_sam",
            LESSON,
            _submission(listener.getsockname()[1]),
            template,
            options=Options(timeout=30),
        )
    )
    assert result.error is None, result.error
    assert result.isolation == "sealed"
    # the sandbox decides the hidden checks: full marks only if it could not see grader/ either
    assert result.score == result.max_score == 7, [(c.grade_id, c.score, c.message) for c in result.cells]
    seen = _seen(nbformat.reads(result.notebook.decode(), as_version=4))
    assert seen["grader"] == seen["solutions"] == "absent"
    assert seen["tcp"] != "connected"


_SIBLINGS_CELL = """
import os
def _field(pid, name):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(name + ":"):
            return line.split()[1]
siblings = []
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
        continue
    try:  # another child of the fork server that forked this kernel, and not yet dead
        if int(_field(entry, "PPid")) == os.getppid() and _field(entry, "State") not in ("Z", "X"):
            siblings.append(open(f"/proc/{entry}/cmdline", "rb").read().replace(bytes(1), b" ").decode())
    except (OSError, ValueError, TypeError):
        pass
print("SIBLINGS", len(siblings), siblings)
"""


@needs_seal
def test_a_kernel_runs_no_student_code_while_the_sandbox_lives(gradebook):
    """The kernel starts while the sandbox runs the independent checks, but its first cell runs only
    once the sandbox (the other process with this student's code) is gone: the kernel's code finds no
    other process forked beside it."""
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    nb = nbformat.read(course.ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(_SIBLINGS_CELL))
    # the sandbox runs this too, and lives on for a while: long enough for a kernel that did not wait
    nb.cells.insert(1, nbformat.v4.new_code_cell("import time\ntime.sleep(1.5)"))
    result = grade_job(
        Job("first_cell_fay", LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=30))
    )
    assert result.error is None, result.error
    assert result.isolation == "sealed"
    graded = nbformat.reads(result.notebook.decode(), as_version=4)
    text = "".join(str(o.get("text", "")) for o in graded.cells[0].outputs)
    assert text.startswith("SIBLINGS 0 "), text
    # and the checks ran in full: the untouched notebook fails every one of them
    assert result.cells and all(c.trusted_passed is False for c in result.cells), result.cells


@needs_seal
@pytest.mark.parametrize("shared", [False, True], ids=["a worker's own", "shared by the workers"])
def test_the_plain_fork_server_beside_the_seal_forks_nothing_that_runs_student_code(tmp_path, shared):
    """Where the seal works, the fork server outside it has the checks loaded, so it refuses to fork
    a kernel, a sandbox, or a trusted process with an unsealed sandbox of its own: the one a worker
    starts, and the one a grading run shares among its workers, on each worker's connection."""
    from grader.classroom import servers

    assert servers.plain().trusted_only  # what a grading worker gets
    run = servers.SharedServer() if shared else None
    clients = [
        ForkServer(servers.kernel_env(None), trusted_only=True, address=run.address if run else None)
        for _ in range(2 if shared else 1)
    ]
    try:
        for server in clients:
            for role, request in (
                ("kernel", {"argv": ["-f", str(tmp_path / "kernel.json")], "guard": {}}),
                ("sandbox", {"pipes": {"to_sandbox": "x", "from_sandbox": "y"}, "sandbox": {}}),
                ("trusted", {"job": str(tmp_path / "job.json"), "sandbox": {}, "pipes": None}),
            ):
                with pytest.raises(RuntimeError, match="only sealed trusted processes"):
                    server.fork(role, cwd=str(tmp_path), **request)
            assert server.alive()
            assert server.address == (run.address if run else None), "it started a server of its own"
    finally:
        for server in clients:
            server.close()
        if run is not None:
            run.close()
    if run is not None:
        assert not os.path.exists(run.folder), "the shared server's socket folder was left behind"
        assert servers.SHARED_TRUSTED not in os.environ


def _descends_from_me(pid: int | None) -> bool:
    while pid and pid != os.getpid():
        pid = parent(pid)
    return bool(pid)


def _top_trusted_servers() -> set[int]:
    """The trusted-only fork servers that this process started, itself or through its workers,
    running now (not the trusted processes they forked; not those of tests running beside it)."""
    found = set(_alive("--trusted-only"))
    return {pid for pid in found if parent(pid) not in found and _descends_from_me(pid)}


def _my_forkservers() -> set[int]:
    """multiprocessing forkservers that this process started and that are running now."""
    return {pid for pid in _alive("multiprocessing.forkserver import main") if parent(pid) == os.getpid()}


def _grade_with_two_workers(tmp_path, monkeypatch, notebooks: list, watch) -> tuple:
    """Grade these notebooks (students s0, s1, ...) with two local workers, calling ``watch()`` every
    50 ms while the run lasts: the run's summary, its records by student, and what each call returned."""
    import threading

    from grader.classroom import grading
    from grader.classroom.jobs import Options

    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(tmp_path))
    for i, nb in enumerate(notebooks):
        dest = tmp_path / "submitted" / f"s{i}" / LESSON / f"{LESSON}.ipynb"
        dest.parent.mkdir(parents=True)
        nbformat.write(nb, dest)
    seen: list = []
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            seen.append(watch())
            time.sleep(0.05)

    watcher = threading.Thread(target=loop, daemon=True)
    watcher.start()
    try:
        summary = grading.grade([LESSON], options=Options(timeout=30), workers=2, progress=False)
    finally:
        done.set()
        watcher.join()
    return summary, {r["student"]: r for r in grading.load_records([LESSON])}, seen


@needs_seal
def test_a_grading_runs_workers_share_one_trusted_server_and_grade_as_before(tmp_path, monkeypatch):
    """Two local workers fork their trusted processes from one fork server that the run starts
    (one PyTorch and checks import fewer), the grades are those of each notebook graded alone, and
    the server is gone when the run ends; so is the forkserver that the workers were forked from."""
    right, untouched = _answered(), nbformat.read(course.ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", 4)
    before = _top_trusted_servers()
    forkservers: set[int] = set()

    def watch() -> set[int]:
        forkservers.update(_my_forkservers())
        return _top_trusted_servers() - before

    summary, records, seen = _grade_with_two_workers(tmp_path, monkeypatch, [right, untouched] * 2, watch)
    assert summary.workers == 2 and summary.graded == 4 and not summary.failed, summary
    assert [records[f"s{i}"]["score"] for i in range(4)] == [7.0, 0.0, 7.0, 0.0], records
    assert all(not r.get("flags") for r in records.values()), records
    assert max(len(s) for s in seen) == 1, f"trusted-only fork servers at once: {max(len(s) for s in seen)}"
    ever = set().union(*seen)
    assert ever and not (ever & set(_alive("--trusted-only"))), "the shared fork server outlived the run"
    assert len(forkservers) == 1, f"forkservers of the run: {forkservers}"
    assert not (forkservers & set(_alive("multiprocessing.forkserver"))), (
        "the workers' forkserver outlived the run"
    )


def _top_sealed_servers() -> set[int]:
    """The sealed fork servers (their bubblewrap) that this process started, itself or through its
    workers, running now (not what they forked; not those of tests running beside it)."""
    found = set(_alive("--sealed"))
    return {pid for pid in found if parent(pid) not in found and _descends_from_me(pid)}


@needs_seal
def test_a_grading_runs_workers_share_one_sealed_server_and_grade_as_before(tmp_path, monkeypatch):
    """Two local workers fork their kernels and sandboxes from one sealed fork server that the run
    starts (one PyTorch and kernel import fewer), each notebook still in a boundary of its own: the
    grades are those of each notebook graded alone, and the server is gone when the run ends."""
    right, untouched = _answered(), nbformat.read(course.ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", 4)
    before = _top_sealed_servers()
    summary, records, seen = _grade_with_two_workers(
        tmp_path, monkeypatch, [untouched, right] * 2, lambda: _top_sealed_servers() - before
    )
    assert summary.workers == 2 and summary.graded == 4 and not summary.failed, summary
    assert [records[f"s{i}"]["score"] for i in range(4)] == [0.0, 7.0, 0.0, 7.0], records
    assert all(r.get("isolation") == seal.SEALED for r in records.values()), records
    assert max(len(s) for s in seen) == 1, f"sealed fork servers at once: {max(len(s) for s in seen)}"
    ever = set().union(*seen)
    assert ever and not (ever & set(_alive("--sealed"))), "the shared sealed server outlived the run"


@needs_seal
def test_a_worker_stops_only_its_own_notebooks_in_the_shared_sealed_server():
    """Where a run's workers share the sealed fork server, a worker's reset between two jobs stops
    what was forked for it, never what runs for the other worker; the end of a worker's connection
    stops the rest of its own."""
    import tempfile

    from grader.classroom import servers

    run = servers.SharedServer(sealed=True)
    area = Path(os.environ[servers.SHARED_AREA])
    a, b = (ForkServer(servers.kernel_env(None), sealed_area=str(area), address=run.address) for _ in "ab")
    try:
        waiting = {}
        for name, server in (("a", a), ("b", b)):
            job = Path(tempfile.mkdtemp(prefix="job-", dir=area))
            pipes = {p: str(job / p) for p in ("to_sandbox", "from_sandbox")}
            for path in pipes.values():
                os.mkfifo(path)
            # a sandbox that waits for its trusted process, which never comes
            waiting[name] = server.fork("sandbox", cwd=str(job), pipes=pipes, sandbox={})
        assert a.address == b.address == run.address, "a worker started a sealed server of its own"
        assert waiting["a"].poll() is None and waiting["b"].poll() is None
        a.reset()
        waiting["a"].wait(timeout=10)
        time.sleep(0.3)
        assert waiting["b"].poll() is None, "a worker's reset stopped the other worker's notebook"
        b.close()
        end = time.monotonic() + 10
        while a.request({"op": "poll", "pid": waiting["b"].pid}).get("returncode") is None:
            assert time.monotonic() < end, "a closed connection's notebook still runs"
            time.sleep(0.05)
    finally:
        for server in (a, b, run):
            server.close()
    assert servers.SHARED_SEALED not in os.environ and servers.SHARED_AREA not in os.environ


@needs_seal
def test_each_worker_of_a_run_writes_in_its_own_part_of_the_shared_sealed_area():
    """The workers share the sealed server, not the space their notebooks write in: each takes a part of
    the run's area that no other living worker holds (where grading runs as root, a file system in memory
    of its own, so no notebook can fill a classmate's); one more worker than parts gets a folder of its
    own, and a part is free again once its worker ended."""
    from grader.classroom import servers

    run = servers.SharedServer(sealed=True, workers=2)
    area = Path(os.environ[servers.SHARED_AREA])
    code = "from grader.classroom import servers; print(servers.sealed_area(), flush=True); input()"

    def workers(n: int) -> list[str]:
        procs = [
            subprocess.Popen([sys.executable, "-c", code], cwd=course.ROOT, text=True, stdin=-1, stdout=-1)
            for _ in range(n)
        ]
        parts = [p.stdout.readline().strip() for p in procs]
        for p in procs:
            p.communicate("\n", timeout=30)
        return parts

    try:
        together, later = workers(3), workers(1)
        mounted = [os.path.ismount(area / f"part-{i}") for i in range(2)]
    finally:
        run.close()
    assert len(set(together)) == 3 and all(Path(p).parent == area for p in together), together
    assert sorted(Path(p).name for p in together)[:2] == ["part-0", "part-1"], together
    assert Path(later[0]).name.startswith("part-"), later
    if os.geteuid() == 0 and os.path.ismount(area):
        assert all(mounted), "a worker's part of the area is not a file system of its own"


@needs_seal
def test_a_worker_whose_shared_server_is_gone_starts_its_own(gradebook, tmp_path, monkeypatch):
    """A worker that cannot reach the run's shared trusted-only server (it died, or was never
    started) starts one of its own, and grades as before."""
    from grader.classroom import servers

    monkeypatch.setenv(servers.SHARED_TRUSTED, str(tmp_path / "nobody-listens-here"))
    saved = servers.PLAIN
    servers.PLAIN = None
    try:
        _, template = gradebook
        result = _grade_nb(template, "alone_al", _answered())
        assert result.score == result.max_score == 7, [(c.grade_id, c.score, c.message) for c in result.cells]
        assert servers.PLAIN.address is None and servers.PLAIN.alive()
    finally:
        if servers.PLAIN is not None:
            servers.PLAIN.close()
        servers.PLAIN = saved


def test_run_without_the_seal_says_not_sealed(gradebook, monkeypatch):
    """Without the seal a run says so everywhere, and its two workers are spawned: none is forked
    from a forkserver, whose socket an unsealed kernel could reach."""
    import threading

    from grader.classroom import grading

    work, _ = gradebook
    monkeypatch.setenv(seal.OFF_VARIABLE, "1")
    assert seal.available() == (False, f"turned off by {seal.OFF_VARIABLE}")
    student, other = "unsealed_uma", "unsealed_ugo"
    for who in (student, other):
        path = course.submission_path(LESSON, who)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_submission(9))
    forkservers: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            forkservers.update(_my_forkservers())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        summary = grading.grade([LESSON], [student, other], workers=2, progress=False, force=True)
    finally:
        done.set()
        watcher.join()
    assert summary.workers == 2 and summary.graded == 2, summary
    assert not forkservers, f"an unsealed run forked its workers from a forkserver: {forkservers}"
    text = grading.format_summary(summary)
    assert f"NOT SEALED (turned off by {seal.OFF_VARIABLE})" in text, text
    record = next(r for r in grading.load_records([LESSON]) if r["student"] == student)
    assert record["isolation"].startswith("not sealed")
    assert any(n.startswith("not sealed") for n in record["notes"])
    # the guard alone lets the code see the grading package: the answer that depends on it is wrong
    assert record["score"] < 7
    # the export says so too: in the class report's first lines and in the grades' isolation column
    from grader.instructor import report

    paths = report.export(work / "report-unsealed", only_lessons=[LESSON])
    head = paths["report"].read_text().splitlines()[:4]
    assert any("NOT SEALED" in line for line in head), head
    import csv

    rows = list(csv.DictReader((work / "report-unsealed" / "grades.csv").open()))
    assert any(r["student_id"] == student and r["isolation"].startswith("not sealed") for r in rows)


# ------------------------------------------------------------------ a job's head start


def _answered() -> nbformat.NotebookNode:
    """Lesson 01 as a student hands it in with every answer right."""
    from tests.nbtools import filled, solution_sources

    return filled(course.ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", solution_sources(LESSON))


def _grade_nb(template: bytes, student: str, nb: nbformat.NotebookNode):
    from grader.classroom.autograde import Job, Options, grade_job

    result = grade_job(
        Job(student, LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=30))
    )
    assert result.error is None, result.error
    return result


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "not sealed"])
def test_checks_started_before_nbgrader_decide_only_the_cells_that_then_run(gradebook, sealed, monkeypatch):
    """A job starts its independent checks before nbgrader has restored the notebook, on the cells as
    restoring will leave them. Where nbgrader's restoring changes the cells (a deleted test cell put
    back), those checks are thrown away and the cells that run are checked: the grades are the same
    as for the notebook handed in whole."""
    if sealed and not SEALED:
        pytest.skip(f"no seal here: {WHY}")
    if not sealed:
        monkeypatch.setenv(seal.OFF_VARIABLE, "1")
    _, template = gradebook
    whole = _grade_nb(template, "whole_wes", _answered())
    assert whole.score == whole.max_score == 7, [(c.grade_id, c.score, c.message) for c in whole.cells]
    assert "checks started again" not in whole.phases, whole.phases

    edited = _answered()  # a test cell emptied: restoring puts its source back, as the head start guessed
    next(
        c for c in edited.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test01_project_values"
    ).source = "pass"
    result = _grade_nb(template, "edited_eve", edited)
    assert "checks started again" not in result.phases, result.phases
    assert [(c.grade_id, c.score) for c in result.cells] == [(c.grade_id, c.score) for c in whole.cells]

    deleted = _answered()  # a test cell deleted: only nbgrader puts it back, so the checks start again
    deleted.cells = [
        c for c in deleted.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "test01_project_values"
    ]
    result = _grade_nb(template, "deleted_dee", deleted)
    assert result.phases.get("checks started again") == 1, result.phases
    assert [(c.grade_id, c.score) for c in result.cells] == [(c.grade_id, c.score) for c in whole.cells]
    assert any("test01_project_values" in n and "deleted" in n for n in result.notes), result.notes

    wrong = _answered()  # and a wrong answer in that notebook loses what it loses handed in whole
    wrong.cells = [
        c for c in wrong.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "test01_project_values"
    ]
    answer = next(c for c in wrong.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ex01_project")
    answer.source = answer.source.replace("Q = X @ W_q", "Q = X @ W_k")
    result = _grade_nb(template, "deleted_wrong_dan", wrong)
    assert result.phases.get("checks started again") == 1, result.phases
    scores = {c.grade_id: c.score for c in result.cells}
    assert scores["test01_project_hidden"] == 0 and scores["test01_project_values"] == 0, scores
    assert scores["test01_project_shapes"] == 1, scores


_WHERE_CELL = """
import os
print("EXECUTION", os.environ.get("NBGRADER_EXECUTION"))
print("FILES", sorted(os.listdir(".")))
"""


def test_a_kernel_started_early_runs_as_nbgrader_would_start_it(gradebook):
    """The kernel a job starts before nbgrader asks for one works where nbgrader puts the notebook,
    and knows it is being graded (the explorers and the Colab cell then do nothing)."""
    _, template = gradebook
    nb = _answered()
    nb.cells.insert(1, nbformat.v4.new_code_cell(_WHERE_CELL))
    result = _grade_nb(template, "early_ezra", nb)
    assert result.score == result.max_score, [(c.grade_id, c.score, c.message) for c in result.cells]
    graded = nbformat.reads(result.notebook.decode(), as_version=4)
    text = "".join(str(o.get("text", "")) for o in graded.cells[1].outputs)
    assert "EXECUTION autograde" in text, text
    assert f"'{LESSON}.ipynb'" in text.split("FILES", 1)[1], text


def test_a_lessons_imports_are_loaded_once_and_its_figures_still_show(gradebook):
    """A lesson's own imports (matplotlib.pyplot, about 0.2 s in each kernel, sandbox and trusted
    process) are loaded once by the fork servers; a kernel forked after still draws its figures
    inline, into the graded notebook, as one that imported pyplot itself."""
    from grader.classroom import grading, servers
    from tests.nbtools import filled, solution_sources

    lesson = "05_softmax"
    grading.ensure_gradebook([LESSON, lesson])
    nb = filled(course.ROOT / "notebooks" / lesson / f"{lesson}.ipynb", solution_sources(lesson))
    nb.cells.append(
        nbformat.v4.new_code_cell("import matplotlib\nprint('BACKEND', matplotlib.get_backend())")
    )
    from grader.classroom.autograde import Job, Options, grade_job

    job = Job(
        "figures_fay", lesson, nbformat.writes(nb).encode(), grading.template(), options=Options(timeout=60)
    )
    result = grade_job(job)
    assert result.error is None, result.error
    assert result.score == result.max_score, [(c.grade_id, c.score, c.message) for c in result.cells]
    forking = servers.sealed() if result.isolation == "sealed" else servers.plain()
    assert "matplotlib.pyplot" in forking.preloaded and "matplotlib.pyplot" in servers.plain().preloaded
    graded = nbformat.reads(result.notebook.decode(), as_version=4)
    text = "".join(str(o.get("text", "")) for o in graded.cells[-1].outputs)
    assert "BACKEND module://matplotlib_inline.backend_inline" in text, text
    figures = [c for c in graded.cells if c.cell_type == "code" and "plt.show()" in c.source]
    images = [[o for o in c.outputs if "image/png" in o.get("data", {})] for c in figures]
    assert figures and all(images), [(c.source[:40], [o.output_type for o in c.outputs]) for c in figures]


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "not sealed"])
def test_grading_never_signals_a_process_by_a_bare_id(gradebook, sealed, monkeypatch):
    """Linux gives a dead process's id to the next process (after 32,768 ids on many machines): a
    signal sent by id to a kernel that has ended could kill any program of the instructor. A job
    signals its kernels and checks only through pidfds or their fork server, also when the kernel
    ends on its own."""
    if sealed and not SEALED:
        pytest.skip(f"no seal here: {WHY}")
    if not sealed:
        monkeypatch.setenv(seal.OFF_VARIABLE, "1")
    _, template = gradebook
    sent: list[tuple[str, int, int]] = []
    for name in ("kill", "killpg"):
        real = getattr(os, name)
        monkeypatch.setattr(
            os, name, lambda pid, sig, _n=name, _r=real: (sent.append((_n, pid, sig)), _r(pid, sig))[1]
        )
    _grade_nb(template, "whole_wes", _answered())
    ends = _answered()
    ends.cells.insert(3, nbformat.v4.new_code_cell("import os\nos._exit(3)"))  # the kernel ends itself
    result = _grade_nb(template, "exits_eli", ends)
    assert result.status == "kernel died", result.status
    assert sent == [], sent


def test_what_an_unsealed_kernel_started_ends_with_it(tmp_path):
    """Without the seal, what a kernel starts in its own process group is killed when the kernel
    ends, by the fork server that reaps it (while the group's id is still the kernel's own)."""
    server = ForkServer(kernels.kernel_env(None))
    saved = kernels.SETTINGS
    kernels.SETTINGS = kernels.KernelSettings(sealed=False, guard={}, fork_server=server)
    marker = f"{700 + int(time.time() * 1000) % 1000}.{os.getpid() % 1000}"
    start = (
        "import subprocess, time\n"
        f"p = subprocess.Popen(['sleep', '{marker}'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "time.sleep(0.2)\n"
        "print('running' if p.poll() is None else 'not running')"
    )
    try:
        from nbclient import NotebookClient

        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(start)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        NotebookClient(
            nb,
            timeout=60,
            kernel_manager_class=kernels.GuardedKernelManager,
            resources={"metadata": {"path": str(tmp_path)}},
        ).execute()
        assert "'running" in str(nb.cells[0].outputs), nb.cells[0].outputs
        assert kernels.SETTINGS.handles, "the kernel was not forked from the fork server"
        deadline = time.monotonic() + 5
        while _alive(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(marker), "a process the kernel started outlived it"
    finally:
        kernels.SETTINGS = saved
        server.close()
        for pid in _alive(marker):
            os.kill(pid, 9)


def test_a_grading_kernel_shows_ipythons_traceback_and_keeps_a_plain_one(tmp_path):
    """A forked grading kernel shows an error exactly as a kernel that JupyterLab starts does (the
    output a student and the feedback see); only its session history keeps Python's plain
    traceback, formatted in a millisecond instead of a second IPython formatting."""
    from nbclient import NotebookClient

    cells = [
        "def project(X):\n    raise NotImplementedError('write project')\n\nproject([1, 2])",
        "from IPython import get_ipython\n"
        "kept = get_ipython().history_manager.exceptions\n"
        "print(sorted(kept), kept[1]['ename'], kept[1]['traceback'][0].strip())",
    ]

    def run(manager_class=None) -> nbformat.NotebookNode:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in cells])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        kwargs = {"kernel_manager_class": manager_class} if manager_class else {}
        NotebookClient(
            nb, timeout=60, allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}, **kwargs
        ).execute()
        return nb

    server = ForkServer(kernels.kernel_env(None))
    saved = kernels.SETTINGS
    kernels.SETTINGS = kernels.KernelSettings(sealed=False, guard={}, fork_server=server)
    try:
        graded = run(kernels.GuardedKernelManager)
        assert kernels.SETTINGS.handles, "the kernel was not forked from the fork server"
    finally:
        kernels.SETTINGS = saved
        server.close()
    plain = run()
    shown, expected = graded.cells[0].outputs[0], plain.cells[0].outputs[0]
    assert shown.output_type == expected.output_type == "error", (shown, expected)
    assert shown.traceback == expected.traceback, (shown.traceback, expected.traceback)
    assert any("write project" in line for line in shown.traceback), shown.traceback
    bare = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in shown.traceback]  # without its colours
    assert any("Cell In[1], line 4" in line for line in bare), bare  # IPython's own format
    printed = "".join(o.get("text", "") for o in graded.cells[1].outputs)
    assert printed.strip() == "[1] NotImplementedError Traceback (most recent call last):", graded.cells[
        1
    ].outputs
