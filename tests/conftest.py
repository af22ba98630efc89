"""Shared fixtures: a private grading work folder built once per test session."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
    ),
]


@pytest.fixture(scope="session")
def built_course(tmp_path_factory):
    """Build every lesson with nbgrader into a private work folder.

    Yields the folder the student notebooks were released into; the gradebook
    (with every test cell recorded) lives in $ATTENTION_COURSE_WORK.
    """
    from grader import course

    work = tmp_path_factory.mktemp("grading")
    old = os.environ.get("ATTENTION_COURSE_WORK")
    os.environ["ATTENTION_COURSE_WORK"] = str(work)
    release = work / "release"
    course.build_notebooks(release_dir=release)
    yield release
    if old is None:
        del os.environ["ATTENTION_COURSE_WORK"]
    else:
        os.environ["ATTENTION_COURSE_WORK"] = old
    shutil.rmtree(work, ignore_errors=True)


class ProgressLines(io.TextIOBase):
    """A text stream that shows each line on pytest's terminal at once (for long fixtures)."""

    def __init__(self, config: pytest.Config, prefix: str):
        self.writer, self.prefix = config.get_terminal_writer(), prefix
        self.capture = config.pluginmanager.getplugin("capturemanager")

    def write(self, text: str) -> int:
        lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
        if lines:
            with self.capture.global_and_fixture_disabled():  # past pytest's output capture
                for line in lines:
                    self.writer.line(f"\n[{self.prefix}] {line}")
                self.writer.flush()
        return len(text)


@pytest.fixture(scope="session")
def progress_lines(request):
    """Make a stream that prints progress lines of a long fixture (at least one a minute)."""
    return lambda prefix: ProgressLines(request.config, prefix)
