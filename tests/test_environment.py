"""One source of truth for dependencies: pyproject.toml, environment.yml and the installed environment agree."""

from __future__ import annotations

import re
from importlib.metadata import version

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.nbtools import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ENVIRONMENT = yaml.safe_load((ROOT / "environment.yml").read_text())
CONDA = [d for d in ENVIRONMENT["dependencies"] if isinstance(d, str)]
PIP = next(d["pip"] for d in ENVIRONMENT["dependencies"] if isinstance(d, dict) and "pip" in d)


def pinned(requirements) -> dict[str, str]:
    """{name: version} of exact pins (``name==version``), local labels such as +cpu dropped."""
    pins = {}
    for line in requirements:
        if line.startswith("-"):  # pip options, e.g. --extra-index-url
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"{line!r}: pin an exact version (==), so every install is the same"
        pins.setdefault(canonicalize_name(req.name), str(Version(spec.version).public))
        assert pins[canonicalize_name(req.name)] == Version(spec.version).public, f"{req.name}: two versions"
    return pins


RUNTIME = pinned(PYPROJECT["project"]["dependencies"])


def test_pyproject_pins_every_runtime_dependency():
    assert set(RUNTIME) >= {"torch", "numpy", "matplotlib", "ipywidgets", "jupyterlab", "nbgrader"}


def test_environment_yml_installs_exactly_the_pyproject_runtime():
    assert pinned(PIP) == RUNTIME, (
        "environment.yml's pip list and pyproject.toml's [project] dependencies differ: "
        "change both together (pyproject.toml is the source of truth)"
    )


def test_no_runtime_package_comes_from_conda_as_well():
    """conda provides only Python and pip, so no package has two sources and two versions."""
    names = {re.split(r"[=<>!\s]", dep, maxsplit=1)[0] for dep in CONDA}
    assert names == {"python", "pip"}, names


def test_environment_python_meets_requires_python_and_the_readme():
    (python,) = [dep for dep in CONDA if dep.startswith("python")]
    pinned_version = re.fullmatch(r"python=(\d+\.\d+)", python).group(1)
    assert Version(pinned_version) in SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert f"Python {pinned_version}" in (ROOT / "README.md").read_text(), "the README names another Python"


@pytest.mark.parametrize("name", sorted(RUNTIME))
def test_installed_environment_matches_the_pins(name):
    """The environment the README and CI install (`pip install -e .`) is the pinned one."""
    assert Version(version(name)).public == RUNTIME[name], (
        f"{name} {version(name)} is installed, pyproject.toml pins {RUNTIME[name]}: "
        "reinstall with `python3 quickstart.py test`"
    )
