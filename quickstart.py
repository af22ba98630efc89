#!/usr/bin/env python3
"""Set up the course in ./.venv and open it, or run every test.

    python3 quickstart.py lab     # set up, then open lesson 01 in JupyterLab (Ctrl-C stops it)
    python3 quickstart.py test    # set up, then run every test of the project

Needs only Python 3.11 or newer to start (the course is tested on Python 3.11).
Everything else goes into .venv/: ``lab`` installs the course, ``test`` adds the test tools
on top; each is installed once, and again only when pyproject.toml changes. Without a CUDA
GPU, PyTorch's CPU build is installed. Extra arguments after ``test`` go to pytest; after
``lab``, to JupyterLab.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
import venv
from pathlib import Path

MIN_PYTHON = (3, 11)
ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
LESSON_01 = "/lab/tree/notebooks/01_projection/01_projection.ipynb"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# nbgrader's instructor panels, hidden from students; Validate (a student tool) stays.
INSTRUCTOR_PLUGINS = (
    "@jupyter/nbgrader:formgrader",
    "@jupyter/nbgrader:create-assignment",
    "@jupyter/nbgrader:course-list",
)
STUDENT_INTERFACE = VENV / ".student-interface"
STOP_GRACE_S = 10.0


def say(msg: str) -> None:
    print(f"[quickstart] {msg}", flush=True)


def pip(*args: str) -> None:
    """Run the environment's pip, quietly (errors still show)."""
    # setuptools' note on every editable install ("Editable installation. Please be careful ...")
    warnings = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), "ignore:Editable installation"]))
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONWARNINGS=warnings)
    subprocess.run([str(PYTHON), "-m", "pip", *args, "--quiet"], check=True, cwd=ROOT, env=env)


def stamp_key() -> str:
    """What an install depends on: pyproject.toml, nothing else."""
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]


def marker(part: str) -> Path:
    """The file saying that ``part`` ("course" or an extra such as "test") is installed."""
    return VENV / f".installed-{stamp_key()}-{part}"


def torch_pin() -> str:
    """PyTorch's version pinned in pyproject.toml's dependencies."""
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'"torch==([^";\s]+)', text).group(1)


def has_cuda_gpu() -> bool:
    """Whether an NVIDIA GPU that a CUDA build of PyTorch could use is present."""
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


def reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether ``url`` answers within ``timeout`` seconds (name lookup included)."""
    answer: list[bool] = []

    def probe() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
                answer.append(True)
        except Exception:  # noqa: BLE001 - any failure means "cannot be reached"
            answer.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answer and answer[0])


def installed_version(dist: str) -> str | None:
    """The version of ``dist`` installed in .venv, or None."""
    code = f"import importlib.metadata as m\ntry: print(m.version({dist!r}))\nexcept m.PackageNotFoundError: pass"
    out = subprocess.run([str(PYTHON), "-c", code], capture_output=True, text=True).stdout.strip()
    return out or None


def install_torch() -> None:
    """Without a CUDA GPU, install PyTorch's CPU build (the default index's Linux build bundles CUDA)."""
    pin = torch_pin()
    have = installed_version("torch")
    if have and have.split("+")[0] == pin:
        return
    if sys.platform == "darwin" or has_cuda_gpu():
        return  # macOS wheels are CPU builds already; with a GPU the default build is the right one
    if reachable(TORCH_CPU_INDEX + "/torch/"):
        say(f"no CUDA GPU here: installing PyTorch {pin}, CPU build, from {TORCH_CPU_INDEX}")
        pip("install", "--extra-index-url", TORCH_CPU_INDEX, f"torch=={pin}+cpu")
    else:
        say(
            f"no CUDA GPU here, but {TORCH_CPU_INDEX} cannot be reached: PyTorch {pin} from the default index"
        )


def ensure_env(extras: tuple[str, ...] = ()) -> bool:
    """Install into .venv what ``extras`` need and it lacks; return whether anything was installed."""
    fresh = not PYTHON.exists()
    if fresh:
        say("creating .venv/")
        venv.EnvBuilder(with_pip=True).create(VENV)
        pip("install", "--upgrade", "pip")
    parts = ("course", *extras)
    missing = [part for part in parts if not marker(part).exists()]
    if not missing:
        say(f".venv/ is up to date ({' + '.join(parts)})")
        return False
    stale = [p for p in VENV.glob(".installed-*") if not p.name.startswith(f".installed-{stamp_key()}-")]
    if "course" in missing:
        if fresh or not stale:
            what = "the course and its dependencies" + (
                f", with the {' and '.join(extras)} tools," if extras else ""
            )
            say(f"installing {what} into .venv/ (first run: a few minutes)")
        else:
            say("pyproject.toml changed: updating .venv/")
        install_torch()
    else:
        say(f"adding the {' and '.join(missing)} tools to .venv/ (once)")
    target = f".[{','.join(extras)}]" if extras else "."
    pip("install", "--editable", target)
    for old in stale:
        old.unlink()
    for part in parts:
        marker(part).touch()
    say(".venv/ is ready")
    return True


def hide_instructor_tools() -> None:
    """Turn nbgrader's instructor panels off in .venv's JupyterLab, once: students see the student interface."""
    if STUDENT_INTERFACE.exists():
        return
    cmd = [str(BIN / "jupyter"), "labextension", "disable", "--level=sys_prefix", *INSTRUCTOR_PLUGINS]
    subprocess.run(cmd, check=True, cwd=ROOT, env=env_with_venv(), capture_output=True)
    STUDENT_INTERFACE.touch()
    say("nbgrader's instructor panels are off in this JupyterLab (README, For instructors, turns them on)")


def env_with_venv() -> dict[str, str]:
    """The environment of an activated .venv (nbgrader needs its bin/ on PATH)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(VENV)
    return env


def run_until_stopped(
    cmd: list[str], stop_with: signal.Signals | None = None, grace: float | None = None
) -> int:
    """Run ``cmd``; Ctrl-C or SIGTERM to this process stops it too, killed if it lingers.

    The child gets ``stop_with`` (default: the signal received) and ``grace`` seconds (default
    STOP_GRACE_S) to finish; a second signal kills it at once.
    """
    posix = os.name == "posix"
    child = subprocess.Popen(cmd, cwd=ROOT, env=env_with_venv(), start_new_session=posix)
    received: list[int] = []
    killer = threading.Timer(STOP_GRACE_S if grace is None else grace, child.kill)
    killer.daemon = True

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        if len(received) > 1 or not posix:
            child.kill()
            return
        child.send_signal(stop_with or signum)
        killer.start()

    caught = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if posix else [])
    previous = {s: signal.signal(s, forward) for s in caught}
    try:
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:  # a signal arriving before the handlers were in place
                forward(signal.SIGINT, None)
    finally:
        killer.cancel()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


def lab(args: list[str]) -> int:
    ensure_env()
    hide_instructor_tools()
    cmd = [str(BIN / "jupyter"), "lab", f"--ServerApp.root_dir={ROOT}", *args]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in args:
        cmd.append("--allow-root")
    # JupyterLab's own default_url wins over the server's: set it, unless asked for another page.
    if not any(re.match(r"--(LabApp\.|ServerApp\.)?default_url\b", a) for a in args):
        cmd.append(f"--LabApp.default_url={LESSON_01}")
    say("opening lesson 01 in JupyterLab (Ctrl-C stops it): " + " ".join(cmd[1:]))
    return run_until_stopped(cmd, stop_with=signal.SIGTERM)


def test(args: list[str]) -> int:
    ensure_env(("test",))
    cmd = [str(PYTHON), "-m", "pytest", *args]
    say("running the tests: " + " ".join(cmd[1:]))
    return run_until_stopped(cmd, grace=60.0)  # pytest prints its summary after Ctrl-C


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"lab", "test"}:
        print(__doc__)
        return 2
    if sys.version_info < MIN_PYTHON:
        say(f"needs Python {'.'.join(map(str, MIN_PYTHON))} or newer; this is {sys.version.split()[0]}")
        return 2
    try:
        return {"lab": lab, "test": test}[argv[0]](argv[1:])
    except KeyboardInterrupt:  # during set-up: nothing half-installed counts as installed
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
