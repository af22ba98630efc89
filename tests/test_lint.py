"""The project's Python code is lint-clean and formatted (ruff)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.nbtools import ROOT


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff(args):
    ruff = shutil.which("ruff") or str(__import__("pathlib").Path(sys.executable).parent / "ruff")
    result = subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
