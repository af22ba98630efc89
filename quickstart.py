#!/usr/bin/env python3
"""Set up the course in ./.venv and open it, or run every test.

    python3 quickstart.py lab     # set up, then open the lessons in JupyterLab
    python3 quickstart.py test    # set up, then run every test of the project

Needs only Python 3.10+ to start: everything else is installed into .venv/
(re-installed only when pyproject.toml changes). Extra arguments after
``test`` go to pytest; after ``lab``, to JupyterLab.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")


def say(msg: str) -> None:
    print(f"[quickstart] {msg}", flush=True)


def ensure_env(extras: str) -> None:
    """Create .venv and install the course into it unless it is already up to date."""
    if not PYTHON.exists():
        say(f"creating {VENV.relative_to(ROOT)}/")
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp_key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extras.encode()).hexdigest()[:16]
    stamp = VENV / f".installed-{stamp_key}"
    if stamp.exists():
        return
    say("installing the course and its dependencies (first run only; a few minutes)")
    target = f".[{extras}]" if extras else "."
    subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True, cwd=ROOT)
    subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "-e", target], check=True, cwd=ROOT)
    for old in VENV.glob(".installed-*"):
        old.unlink()
    stamp.touch()


def env_with_venv() -> dict[str, str]:
    """The environment of an activated .venv (nbgrader needs its bin/ on PATH)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(VENV)
    return env


def lab(args: list[str]) -> int:
    ensure_env("")
    cmd = [str(BIN / "jupyter"), "lab", "--notebook-dir", str(ROOT), *args]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in args:
        cmd.append("--allow-root")
    if not any(a.startswith("--ServerApp.default_url") for a in args):
        cmd.append("--ServerApp.default_url=/lab/tree/notebooks/01_projection/01_projection.ipynb")
    say("opening the course: " + " ".join(cmd[1:]))
    return subprocess.call(cmd, cwd=ROOT, env=env_with_venv())


def test(args: list[str]) -> int:
    ensure_env("test")
    cmd = [str(PYTHON), "-m", "pytest", *args]
    say("running the tests: " + " ".join(cmd[1:]))
    return subprocess.call(cmd, cwd=ROOT, env=env_with_venv())


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"lab", "test"}:
        print(__doc__)
        return 2
    return {"lab": lab, "test": test}[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
