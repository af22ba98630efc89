"""Shared fixtures, built once per test session: a private grading work folder, the graded simulated class."""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

# The test suite grades with or without bubblewrap: where the seal does not work here, it asks for
# unsealed grading as an instructor would (grading stops otherwise); the sealed tests are skipped.
from grader.classroom import seal  # noqa: E402

if not seal.available()[0]:
    os.environ.setdefault(seal.OFF_VARIABLE, "1")

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
    # every cell that calls a looping function waits out the whole limit (about 13 in lesson 01, and as
    # many checks outside the kernel): 2 s each keeps that run at half a minute; the cells that do end
    # take milliseconds
    quick = grading.grade(only_students=short, options=Options(timeout=2), workers=2, progress=bar)
    others = sorted(set(students) - set(short))
    rest = grading.grade(only_students=others, options=Options(timeout=60), workers=2, progress=bar)
    records = {(r["student"], r["lesson"]): r for r in grading.load_records() if r["student"] in students}
    yield cases, records, (quick, rest)


class ProgressLines(io.TextIOBase):
    """A text stream that shows each line on pytest's terminal at once (for long fixtures).

    In a pytest-xdist worker, whose terminal nobody sees, the lines go to a file that the main
    process shows as they come (``_relay_progress``).
    """

    def __init__(self, config: pytest.Config, prefix: str):
        self.writer, self.prefix = config.get_terminal_writer(), prefix
        self.capture = config.pluginmanager.getplugin("capturemanager")
        worker = getattr(config, "workerinput", {}).get("workerid")
        folder = os.environ.get(PROGRESS_FOLDER)
        self.relay = Path(folder) / f"{worker}.log" if worker and folder else None

    def write(self, text: str) -> int:
        lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
        if lines and self.relay is not None:
            with self.relay.open("a") as f:
                f.writelines(f"[{self.prefix}] {line}\n" for line in lines)
        elif lines:
            with self.capture.global_and_fixture_disabled():  # past pytest's output capture
                for line in lines:
                    self.writer.line(f"\n[{self.prefix}] {line}")
                self.writer.flush()
        return len(text)


@pytest.fixture(scope="session")
def progress_lines(request):
    """Make a stream that prints progress lines of a long fixture (at least one a minute)."""
    return lambda prefix: ProgressLines(request.config, prefix)


# ------------------------------------------------------------ running on every core (pytest-xdist)

PROGRESS_FOLDER = "ATTENTION_COURSE_TEST_PROGRESS"  # where xdist workers write their progress lines
MAX_WORKERS = 4  # beyond this the simulated class (one worker's share) is the longest part anyway
# the files whose tests read the graded simulated class: one worker runs them all, so it is graded once
SIMULATED_CLASS_FILES = ("test_classroom_class.py", "test_classroom_crafts.py")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per CPU this process may use, at most MAX_WORKERS."""
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile``, with the simulated class's files as one unit (see ``_CourseScheduling``)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _CourseScheduling(LoadScopeScheduling):
        """Each test file is one unit of work for one worker (its module fixtures are built once); the
        files in SIMULATED_CLASS_FILES are one unit together. Units are handed out in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "simulated class" if Path(path).name in SIMULATED_CLASS_FILES else path

    return _CourseScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The simulated class's tests run first (the longest single piece of work), and only from its files."""
    for item in items:
        if "graded_class" in item.fixturenames and item.path.name not in SIMULATED_CLASS_FILES:
            raise pytest.UsageError(
                f"{item.nodeid} reads the graded simulated class: add its file to "
                "SIMULATED_CLASS_FILES in tests/conftest.py, or the class is graded once per worker"
            )
    items.sort(key=lambda item: item.path.name not in SIMULATED_CLASS_FILES)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return  # a worker, or no workers: fixtures print their progress themselves
    folder = Path(tempfile.mkdtemp(prefix="test-progress-"))
    os.environ[PROGRESS_FOLDER] = str(folder)  # the workers start after this and inherit it
    stop = threading.Event()
    thread = threading.Thread(target=_relay_progress, args=(config, folder, stop), daemon=True)
    thread.start()
    config.add_cleanup(lambda: (stop.set(), thread.join(5), shutil.rmtree(folder, ignore_errors=True)))


def _relay_progress(config: pytest.Config, folder: Path, stop: threading.Event) -> None:
    """Show on the terminal each progress line the workers write (checked every second)."""
    read: dict[Path, int] = {}
    while True:
        last = stop.wait(1.0)
        writer = config.get_terminal_writer()  # the terminal reporter exists once configuration is over
        for path in sorted(folder.glob("*.log")):
            with path.open("rb") as f:
                f.seek(read.get(path, 0))
                text = f.read()
            done = text[: text.rfind(b"\n") + 1]  # whole lines only
            read[path] = read.get(path, 0) + len(done)
            if done:
                writer.line()
                for line in done.decode(errors="replace").splitlines():
                    writer.line(f"[{path.stem}] {line}")
                writer.flush()
        if last:
            return


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    """Say how many workers ran the tests (benchmarks/suite.py reads this line)."""
    if not hasattr(config, "workerinput"):
        terminalreporter.write_line(f"test workers: {getattr(config.option, 'numprocesses', 0) or 1}")
