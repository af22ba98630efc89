"""Shared fixtures, built once per test session: a private grading work folder, the graded simulated class."""

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
def built_course(tmp_path_factory, progress_lines):
    """Build every lesson with nbgrader into a private work folder (a line per lesson built).

    Yields the folder the student notebooks were released into; the gradebook
    (with every test cell recorded) lives in $ATTENTION_COURSE_WORK.
    """
    from grader import course

    work = tmp_path_factory.mktemp("grading")
    old = os.environ.get("ATTENTION_COURSE_WORK")
    os.environ["ATTENTION_COURSE_WORK"] = str(work)
    release = work / "release"
    bar = progress_lines("building the lessons")
    for lesson in course.lessons():
        course.build_notebooks(release_dir=release, only=[lesson])
        bar.write(f"{lesson} built\n")
    yield release
    if old is None:
        del os.environ["ATTENTION_COURSE_WORK"]
    else:
        os.environ["ATTENTION_COURSE_WORK"] = old
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def graded_class(built_course, progress_lines):
    """The simulated class (tests/class_sim) graded once per run by the tool, for every test that reads it.

    Two runs: the endless loops with a short cell timeout, then the rest. Yields (cases, records by
    (student, lesson), (summary of the short run, summary of the rest)).
    """
    from grader import course
    from grader.classroom import grading
    from grader.classroom.autograde import Options
    from tests.class_sim import spec

    bar = progress_lines("grading the simulated class")
    cases = spec.cases(course.work_dir())
    spec.materialize(cases, built_course)
    students = sorted({c.student for c in cases})
    short = sorted({c.student for c in cases if c.short_timeout})
    quick = grading.grade(only_students=short, options=Options(timeout=5), workers=2, progress=bar)
    others = sorted(set(students) - set(short))
    rest = grading.grade(only_students=others, options=Options(timeout=60), workers=2, progress=bar)
    records = {(r["student"], r["lesson"]): r for r in grading.load_records() if r["student"] in students}
    yield cases, records, (quick, rest)


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
