"""A newcomer's first hour: quickstart.py sets up once, opens lesson 01, stops cleanly; plain nbgrader grades.

The tests that start JupyterLab or nbgrader use the course's own .venv as ``quickstart.py test``
left it (nothing is installed again); the set-up logic itself is checked on a stand-in pip.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import quickstart
from tests.nbtools import ROOT
from tests.procs import running

LESSON = "01_projection"


def _venv_up_to_date(*parts: str) -> bool:
    return all(quickstart.marker(part).exists() for part in ("course", *parts))


needs_set_up_venv = pytest.mark.skipif(
    not _venv_up_to_date("test"),
    reason=".venv was not set up by `python3 quickstart.py test` for this pyproject.toml "
    "(these tests use it and must not install anything)",
)


def _quickstart(*args: str, env: dict | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "quickstart.py"), *args],
        cwd=ROOT,
        env=env or dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def _git_status() -> list[str]:
    out = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(
        line for line in out.splitlines() if "__pycache__" not in line and not line.endswith(".pyc")
    )


# ------------------------------------------------------------------ setting up .venv (stand-in pip)


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """quickstart.py pointed at a scratch project whose pip only records what it is asked."""
    (tmp_path / "pyproject.toml").write_text('dependencies = ["torch==2.13.0"]\n')
    venv_dir = tmp_path / ".venv"
    python = venv_dir / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    for name, value in {
        "ROOT": tmp_path,
        "VENV": venv_dir,
        "BIN": python.parent,
        "PYTHON": python,
        "STUDENT_INTERFACE": venv_dir / ".student-interface",
    }.items():
        monkeypatch.setattr(quickstart, name, value)
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(quickstart, "pip", lambda *args: calls.append(args))
    monkeypatch.setattr(quickstart, "installed_version", lambda dist: "2.13.0+cpu")
    return tmp_path, calls


def test_lab_then_test_then_lab_installs_each_part_once_and_says_so(sandbox, capsys):
    root, calls = sandbox
    assert quickstart.ensure_env() is True
    assert "installing the course and its dependencies into .venv/ (first run" in capsys.readouterr().out
    assert calls == [("install", "--editable", ".")]

    assert quickstart.ensure_env(("test",)) is True
    out = capsys.readouterr().out
    assert "adding the test tools to .venv/ (once)" in out and "first run" not in out
    assert calls[-1] == ("install", "--editable", ".[test]")

    for extras, said in [((), "(course)"), (("test",), "(course + test)"), ((), "(course)")]:
        assert quickstart.ensure_env(extras) is False
        assert f".venv/ is up to date {said}" in capsys.readouterr().out
    assert len(calls) == 2, calls


def test_a_changed_pyproject_updates_venv_once(sandbox, capsys):
    root, calls = sandbox
    quickstart.ensure_env(("test",))
    (root / "pyproject.toml").write_text('dependencies = ["torch==2.13.0", "numpy==2.4.6"]\n')
    capsys.readouterr()
    assert quickstart.ensure_env() is True
    assert "pyproject.toml changed: updating .venv/" in capsys.readouterr().out
    assert quickstart.ensure_env(("test",)) is True, "the test tools of the old pyproject.toml are not enough"
    assert quickstart.ensure_env(("test",)) is False
    assert len(calls) == 3
    assert sorted(p.name.rsplit("-", 1)[1] for p in (root / ".venv").glob(".installed-*")) == [
        "course",
        "test",
    ]


@pytest.mark.parametrize("reachable", [True, False])
def test_without_a_gpu_pytorch_is_the_cpu_build_or_the_message_says_why_not(
    sandbox, monkeypatch, capsys, reachable
):
    root, calls = sandbox
    monkeypatch.setattr(quickstart, "installed_version", lambda dist: None)
    monkeypatch.setattr(quickstart, "has_cuda_gpu", lambda: False)
    monkeypatch.setattr(quickstart.sys, "platform", "linux")
    monkeypatch.setattr(quickstart, "reachable", lambda url, timeout=3.0: reachable)
    quickstart.ensure_env()
    out = capsys.readouterr().out
    if reachable:
        assert calls[0] == ("install", "--extra-index-url", quickstart.TORCH_CPU_INDEX, "torch==2.13.0+cpu")
        assert "CPU build" in out
    else:
        assert "download.pytorch.org/whl/cpu cannot be reached: PyTorch 2.13.0 from the default index" in out
        assert calls == [("install", "--editable", ".")]


def test_with_a_gpu_pytorch_comes_from_the_default_index(sandbox, monkeypatch):
    root, calls = sandbox
    monkeypatch.setattr(quickstart, "installed_version", lambda dist: None)
    monkeypatch.setattr(quickstart, "has_cuda_gpu", lambda: True)
    quickstart.ensure_env()
    assert calls == [("install", "--editable", ".")]


def test_an_unreachable_index_is_given_up_on_quickly():
    start = time.perf_counter()
    assert quickstart.reachable("http://10.255.255.1:81/whl/cpu/torch/", timeout=0.5) is False
    assert time.perf_counter() - start < 2


def test_the_torch_pin_is_pyprojects():
    assert f'"torch=={quickstart.torch_pin()}"' in (ROOT / "pyproject.toml").read_text()


# ------------------------------------------------------------------ stopping what quickstart starts


CHILD = """
import signal, sys, time
log = open(sys.argv[1], "a")
def note(signum, frame):
    log.write(signal.Signals(signum).name + "\\n"); log.flush()
    if sys.argv[2] == "exit":
        sys.exit(0)
signal.signal(signal.SIGTERM, note)
signal.signal(signal.SIGINT, note)
log.write("ready\\n"); log.flush()
while True:
    time.sleep(0.1)
"""


@pytest.mark.parametrize(
    "sent, child, heard, code",
    [
        (signal.SIGINT, "exit", ["SIGTERM"], 0),  # Ctrl-C
        (signal.SIGTERM, "exit", ["SIGTERM"], 0),
        (signal.SIGTERM, "linger", ["SIGTERM"], 128 + signal.SIGKILL),  # killed after the grace time
    ],
)
def test_a_signal_to_quickstart_stops_its_child(tmp_path, sent, child, heard, code):
    log = tmp_path / "child.log"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    runner = (
        "import signal, sys, quickstart\n"
        "quickstart.STOP_GRACE_S = 1.0\n"
        f"sys.exit(quickstart.run_until_stopped([sys.executable, {str(script)!r}, {str(log)!r}, {child!r}],"
        " stop_with=signal.SIGTERM))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", runner], cwd=ROOT)
    deadline = time.monotonic() + 30
    while not (log.exists() and "ready" in log.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "the child did not start"
        time.sleep(0.05)
    (kid,) = _children(proc.pid)
    proc.send_signal(sent)
    assert proc.wait(timeout=20) == code
    assert log.read_text().split()[1:] == heard
    assert not running(kid), "the child outlived quickstart"


# ------------------------------------------------------------------ quickstart.py lab, for real


@pytest.mark.slow
@needs_set_up_venv
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to find the server")
def test_lab_serves_lesson_01_as_students_see_it_and_stops_with_quickstart(tmp_path):
    port = _free_port()
    env = dict(
        os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt")
    )
    lab = _quickstart(
        "lab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port_retries=0",
        "--IdentityProvider.token=",
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            assert lab.poll() is None, f"JupyterLab did not start:\n{lab.stdout.read()}"
            assert time.monotonic() < deadline, "JupyterLab did not answer within 120 s"
            try:
                urllib.request.urlopen(f"{base}/api/status", timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)

        with urllib.request.urlopen(f"{base}/", timeout=30) as landing:
            assert urllib.parse.urlparse(landing.url).path == quickstart.LESSON_01
            assert landing.status == 200
        with urllib.request.urlopen(f"{base}/lab", timeout=30) as page:
            html = page.read().decode()
        config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', html, re.S).group(1))
        disabled = config.get("disabledExtensions", [])
        for plugin in quickstart.INSTRUCTOR_PLUGINS:
            assert plugin in disabled, f"{plugin} is on in the students' JupyterLab"
        assert "@jupyter/nbgrader:validate-assignment" not in disabled, "students keep the Validate button"

        servers = _children(lab.pid)
        assert servers, "quickstart.py started no JupyterLab process"
        lab.send_signal(signal.SIGTERM)
        lab.wait(timeout=30)
        lines = lab.stdout.read().splitlines()
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait()
    out = "\n".join(lines)
    assert "[quickstart] .venv/ is up to date (course)" in out, out
    assert "installing" not in out, out
    assert f":{port}{quickstart.LESSON_01}" in out, "the address JupyterLab prints does not lead to lesson 01"
    for pid in servers:
        assert not running(pid), "JupyterLab outlived quickstart.py"
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"{base}/api/status", timeout=2)


@needs_set_up_venv
def test_test_after_lab_finds_everything_installed():
    run = _quickstart("test", "--version")
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 0, out
    assert "[quickstart] .venv/ is up to date (course + test)" in out
    assert "installing" not in out and "adding" not in out


# ------------------------------------------------------------------ plain nbgrader, as the README says


def _repo_read_only() -> list[str]:
    """A command prefix that runs its command with the repository read-only (bubblewrap), or []."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return []
    prefix = [
        bwrap,
        "--bind",
        "/",
        "/",
        "--ro-bind",
        str(ROOT),
        str(ROOT),
        "--dev",
        "/dev",
        "--proc",
        "/proc",
    ]
    probe = subprocess.run([*prefix, "--die-with-parent", "true"], capture_output=True)
    return [*prefix, "--die-with-parent"] if probe.returncode == 0 else []


@pytest.mark.slow
@needs_set_up_venv
def test_plain_nbgrader_autograde_and_export_need_no_build_and_write_only_to_the_work_folder(tmp_path):
    work = tmp_path / "work"
    for student, source in [("ada", ROOT / "solutions"), ("bob", ROOT / "notebooks")]:
        target = work / "submitted" / student / LESSON / f"{LESSON}.ipynb"
        target.parent.mkdir(parents=True)
        shutil.copy(source / LESSON / f"{LESSON}.ipynb", target)
    env = quickstart.env_with_venv()
    env["ATTENTION_COURSE_WORK"] = str(work)
    # With bubblewrap the repository is read-only to nbgrader, so a write there fails the command;
    # without it, the repository's status before and after tells (exact only while nobody edits it).
    sealed = _repo_read_only()
    grading = ROOT / "_grading"
    before = _git_status()
    was = {p: p.stat().st_mtime_ns for p in grading.rglob("*")} if grading.exists() else {}

    def nbgrader(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [*sealed, "nbgrader", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert "Read-only file system" not in done.stdout + done.stderr, "nbgrader wrote into the repository"
        return done

    run = nbgrader("autograde", LESSON)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "recorded in the gradebook from solutions/" in run.stderr
    assert "SAWarning" not in run.stderr, run.stderr
    export = nbgrader("export")
    assert export.returncode == 0, export.stdout + export.stderr

    with open(work / "grades.csv", newline="") as f:
        rows = {(r["assignment"], r["student_id"]): r for r in csv.DictReader(f)}
    ada, bob = rows[(LESSON, "ada")], rows[(LESSON, "bob")]
    assert float(ada["score"]) == float(ada["max_score"]) > 0, "the model solution earns every point"
    assert float(bob["score"]) == 0, "an untouched notebook earns nothing"

    again = nbgrader("autograde", LESSON, "--student", "bob", "--force")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "recorded in the gradebook" not in again.stderr, "the lessons were recorded a second time"

    assert not (ROOT / "grades.csv").exists()
    if not sealed:
        after = _git_status()
        assert after == before, f"grading wrote into the repository: {sorted(set(after) ^ set(before))}"
        now = {p: p.stat().st_mtime_ns for p in grading.rglob("*")} if grading.exists() else {}
        assert now == was, "grading wrote to _grading/ although ATTENTION_COURSE_WORK names another folder"
