"""Binder: the repository builds with repo2docker from environment.yml and postBuild.

Building the image needs Docker, which CI does not have; these tests check what
repo2docker (written for version 2026.4.0) reads, by its own rules: where it looks
for configuration, which buildpack it picks, the Python it selects, the conda
environment layer it can cache, and the postBuild step it runs afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import venv

import pytest
import yaml
from packaging.requirements import Requirement

from quickstart import INSTRUCTOR_PLUGINS
from tests.nbtools import ROOT

ENVIRONMENT = yaml.safe_load((ROOT / "environment.yml").read_text())
DEPENDENCIES = ENVIRONMENT["dependencies"]
PIP = next(d["pip"] for d in DEPENDENCIES if isinstance(d, dict) and "pip" in d)
POSTBUILD = ROOT / "postBuild"

# repo2docker 2026.4.0: the Pythons it has a frozen base environment for, and its version pattern
SUPPORTED_PYTHONS = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13", "3.14")
PYTHON_REGEX = re.compile(r"python\s*=+\s*([\d\.]*)")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def test_configuration_is_read_from_the_repository_root():
    """A binder/ or .binder/ folder would make repo2docker ignore the root environment.yml and postBuild."""
    for folder in ("binder", ".binder"):
        assert not (ROOT / folder).exists(), f"{folder}/ would hide the root configuration from repo2docker"
    assert not (ROOT / "environment.yaml").exists(), "one environment file (repo2docker takes .yml first)"


def test_repo2docker_picks_the_conda_buildpack():
    """Buildpacks tried before conda's (Docker, Julia, Nix, R) must find nothing to act on."""
    for name in ("Dockerfile", "Project.toml", "JuliaProject.toml", "REQUIRE", "default.nix", "DESCRIPTION"):
        assert not (ROOT / name).exists(), f"{name} would make repo2docker use another buildpack"
    runtime = ROOT / "runtime.txt"
    assert not runtime.exists() or runtime.read_text().startswith("python-")
    assert isinstance(ENVIRONMENT, dict) and ENVIRONMENT.get("dependencies")


def test_environment_pins_a_python_repo2docker_supports():
    pythons = [m.group(1) for d in DEPENDENCIES if isinstance(d, str) and (m := PYTHON_REGEX.match(d))]
    assert len(pythons) == 1, "pin Python exactly once, as python=X.Y"
    assert pythons[0] in SUPPORTED_PYTHONS, f"repo2docker has no base environment for Python {pythons[0]}"


def test_environment_resolves_on_conda_forge_alone():
    assert ENVIRONMENT["channels"] == ["conda-forge"]
    for dep in DEPENDENCIES:
        assert not (isinstance(dep, str) and "::" in dep), f"{dep}: no package from another channel"


def test_pytorch_is_the_build_without_gpu_libraries():
    """A CUDA build (with its nvidia-* libraries) would not fit Binder's memory and image limits."""
    conda_names = {re.split(r"[=<>!\s]", d, maxsplit=1)[0] for d in DEPENDENCIES if isinstance(d, str)}
    for name in ("pytorch", "pytorch-gpu", "pytorch-cuda", "cudatoolkit", "cuda-version", "torch"):
        assert name not in conda_names, f"{name} from conda: PyTorch comes from the CPU wheel index"
    assert f"--extra-index-url {CPU_INDEX}" in PIP or f"--index-url {CPU_INDEX}" in PIP
    assert not any(re.search(r"download\.pytorch\.org/whl/(cu|rocm)", line) for line in PIP)
    torch = [Requirement(line) for line in PIP if not line.startswith("-") and line.startswith("torch")]
    linux = {"sys_platform": "linux", "platform_system": "Linux"}
    on_linux = [r for r in torch if r.marker is None or r.marker.evaluate(linux)]
    assert len(on_linux) == 1
    (spec,) = on_linux[0].specifier
    assert spec.operator == "==" and spec.version.endswith("+cpu"), (
        "on Linux, pin torch==X+cpu so pip cannot fall back to the CUDA build from PyPI"
    )
    for line in PIP:
        if not line.startswith("-"):
            assert not Requirement(line).name.startswith("nvidia-"), line


def test_environment_layer_can_be_cached():
    """No local requirement (`-e .`): repo2docker then builds the environment before copying the repo."""
    for line in PIP:
        assert not re.match(r"(-e|--editable)\b|\.|/|file:", line.strip()), f"{line}: install it in postBuild"


def test_postbuild_installs_the_course_and_shows_students_the_student_interface():
    text = POSTBUILD.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in text
    commands = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands[1:] == [
        "python -m pip install --no-cache-dir --no-deps --editable .",
        "jupyter labextension disable --level=sys_prefix " + " ".join(INSTRUCTOR_PLUGINS),
    ], commands
    assert os.access(POSTBUILD, os.X_OK), "postBuild should be executable (chmod +x)"
    check = subprocess.run(["bash", "-n", str(POSTBUILD)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


@pytest.mark.slow
def test_postbuild_makes_the_helpers_and_data_importable_from_the_repository(tmp_path):
    """Run postBuild as repo2docker does (in the repository, its environment's python on PATH)."""
    repo = tmp_path / "repo"
    for name in ("attention_course", "grader", "data"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "postBuild"):
        shutil.copy2(ROOT / name, repo / name)
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    # this bare environment has no JupyterLab: a stand-in `jupyter` records what postBuild asks of it
    calls = tmp_path / "jupyter-calls.txt"
    (bin_dir / "jupyter").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "jupyter").chmod(0o755)
    env = dict(os.environ, PATH=os.pathsep.join([str(bin_dir), os.environ["PATH"]]))
    env.pop("PYTHONPATH", None)
    run = subprocess.run(["./postBuild"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert calls.read_text().split() == ["labextension", "disable", "--level=sys_prefix", *INSTRUCTOR_PLUGINS]
    probe = (
        "import importlib.util, pathlib;"
        "spec = importlib.util.find_spec('attention_course');"
        "print(pathlib.Path(spec.origin).parent.parent / 'data' / 'love_cats.json')"
    )
    out = subprocess.run(
        [str(bin_dir / "python"), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(repo / "data" / "love_cats.json")
    assert (repo / "data" / "love_cats.json").is_file()
    freeze = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "list", "--format=freeze"],
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    assert "torch" not in freeze, "postBuild must not install dependencies (--no-deps)"
