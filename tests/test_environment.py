"""One source of truth for dependencies: pyproject.toml, environment.yml and the installed environment agree."""

from __future__ import annotations

import ast
import re
import tomllib
from importlib.metadata import version

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.nbtools import ROOT

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


def test_one_python_version_everywhere():
    """environment.yml's Python is the lowest pyproject.toml allows, ruff's target, quickstart's and the README's."""
    (python,) = [dep for dep in CONDA if dep.startswith("python")]
    tested = re.fullmatch(r"python=(\d+\.\d+)", python).group(1)
    assert PYPROJECT["project"]["requires-python"] == f">={tested}"
    assert Version(tested) in SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py" + tested.replace(".", "")
    quickstart = ast.parse((ROOT / "quickstart.py").read_text())
    (minimum,) = [
        node.value
        for node in quickstart.body
        if isinstance(node, ast.Assign) and node.targets[0].id == "MIN_PYTHON"
    ]
    assert ".".join(map(str, ast.literal_eval(minimum))) == tested, "quickstart.py checks for another Python"
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for name, text in [
        ("quickstart.py", ast.get_docstring(quickstart)),
        ("README's Quick start", quick_start),
    ]:
        named = set(re.findall(r"Python (3\.\d+)", text))
        assert named == {tested}, f"{name} names Python {sorted(named)}, environment.yml {tested}"
    assert f"Python {tested}" in readme.split("**Binder**", 1)[1], (
        "the README's Binder entry names another Python"
    )


@pytest.mark.parametrize("name", sorted(RUNTIME))
def test_installed_environment_matches_the_pins(name):
    """The environment the README and CI install (`pip install -e .`) is the pinned one."""
    assert Version(version(name)).public == RUNTIME[name], (
        f"{name} {version(name)} is installed, pyproject.toml pins {RUNTIME[name]}: "
        "reinstall with `python3 quickstart.py test`"
    )
