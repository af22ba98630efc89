"""What crosses between a grading run's coordinator and its workers: the job, its options, its result.

Kept apart from ``grader.classroom.autograde`` so that the coordinator can describe jobs (and
start its workers) before it imports nbgrader.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from grader import course


def one_line(text: str) -> str:
    """Text student code chose, as one line of a log or the console: what is not printable, escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@dataclass
class Options:
    """How to grade (same for every submission of a run)."""

    timeout: int = 60  # seconds per cell
    memory: int | None = 4 << 30  # bytes per notebook: what its code adds to the kernel, and to the sandbox
    notebook_timeout: int = 600  # seconds per submission, all in
    protect: list[str] = field(default_factory=list)  # paths no student code may touch (work folder, sources)
    threads: int = 1  # torch threads per notebook


@dataclass
class Job:
    student: str
    lesson: str
    notebook: bytes
    template: bytes  # an nbgrader gradebook with the course's assignments and no students
    timestamp: str | None = None
    digest: str = ""
    options: Options = field(default_factory=Options)


@dataclass
class CellResult:
    grade_id: str
    exercise: str
    points: float
    score: float
    kernel_passed: bool | None
    trusted_passed: bool | None
    message: str = ""
    diagnosis: str | None = None


@dataclass
class JobResult:
    student: str
    lesson: str
    digest: str
    status: str
    score: float = 0.0
    max_score: float = 0.0
    cells: list[CellResult] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    notebook: bytes | None = None  # the autograded notebook
    files: dict[str, bytes] = field(default_factory=dict)  # other files of the autograded folder
    error: str | None = None  # an internal failure of the tool (the submission is then retried)
    phases: dict[str, float] = field(default_factory=dict)  # seconds spent in each step
    isolation: str = ""  # "sealed" (bubblewrap), or "not sealed: <why>" (the guard alone; see seal.py)

    def summary(self) -> dict:
        """Everything but the bytes, as plain JSON data."""
        from dataclasses import asdict

        d = asdict(self)
        d.pop("notebook")
        d.pop("files")
        return d


def digest_of(notebook: bytes, timestamp: str | None) -> str:
    h = hashlib.sha256(notebook)
    h.update(b"\0" + (timestamp or "").encode())
    return h.hexdigest()[:20]


def default_protected() -> list[str]:
    """What no student code may open: the work folder (gradebook, every submission) and the sources."""
    return [str(course.work_dir().resolve()), str(course.ROOT / "_grading"), str(course.ROOT / "solutions")]


FILE_CAP = 64 * 1024 * 1024  # the most read of one file a student could make or touch
SUBMITTED_CAP = 50 << 20  # a submitted file at most (as collect's): its graded copy then fits FILE_CAP


def read_regular(path: Path, cap: int = FILE_CAP) -> bytes:
    """The bytes of ``path`` if it is a regular file (a link is never followed) of at most ``cap``
    bytes; ``OSError`` saying why otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:  # ELOOP: the file is a link
        raise OSError(
            f"{path.name}: " + ("a link, not a file" if e.errno == errno.ELOOP else e.strerror)
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path.name}: not a regular file")
        if st.st_size > cap:
            raise OSError(f"{path.name}: larger than {cap >> 20} MB")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(cap)
    finally:
        os.close(fd)
