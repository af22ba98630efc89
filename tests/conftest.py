"""Shared fixtures: a private grading work folder built once per test session."""

from __future__ import annotations

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
