"""Recording the course's lessons in nbgrader's gradebook where plain nbgrader needs them.

``nbgrader autograde`` and the formgrader's Autograde button grade a lesson only once the gradebook
knows its test cells; nbgrader_config.py calls ``record_lessons`` when it loads and names
``record_before_autograde`` as Autograde's pre-convert hook, so neither needs a *Generate* first.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from pathlib import Path
from stat import S_ISDIR, S_ISREG

from grader.course import lessons, work_dir

_recording = False
# the most entries a submission's folder keeps beside its notebook: nbgrader lists the whole folder again
# for each file it copies from it, a time that grows with the square of their number (8,000: 3 minutes)
ENTRIES_CAP = 1000


def _silence(record: object) -> bool:
    return False


def record_lessons(argv: list[str] | None = None) -> list[str]:
    """Before plain ``nbgrader autograde`` (``argv``, default ``sys.argv``; else nothing), set aside
    what ``set_aside`` moves from every submission (without ``--force`` nbgrader reads a graded one's
    timestamp.txt before its pre-convert hook: a pipe there stopped the run), then record in the gradebook,
    from solutions/, each lesson it lacks or whose cells changed (no build step first). The ones recorded."""
    argv = sys.argv if argv is None else argv
    program = Path(argv[0]).name if argv else ""
    plain_nbgrader = program == "nbgrader" or (
        program == "__main__.py" and Path(argv[0]).parent.name == "nbgrader"
    )
    if _recording or not plain_nbgrader or argv[1:2] != ["autograde"]:
        return []
    for folder in sorted((work_dir() / "submitted").glob("*/*")):
        with contextlib.suppress(OSError):  # the pre-convert hook tries it again, for this one submission
            set_aside(folder)
    return _record(lessons())


def record_before_autograde(assignment: str = "", notebooks: list[str] | tuple = (), **_: object) -> None:
    """nbgrader's ``Autograde.pre_convert_hook`` (nbgrader_config.py): before a submission is graded (the
    command line, or the formgrader's button in the Lab server), its lesson is recorded from solutions/ if
    the gradebook lacks it or its cells changed (no *Generate* first; the test shown is the one graded),
    then ``set_aside`` moves what nbgrader would read through a link, or that is no small regular file."""
    if assignment in lessons():
        _record([assignment])
    if notebooks:
        set_aside(Path(notebooks[0]).parent)


def set_aside(folder: Path) -> Path | None:
    """Move out of a submission's folder (to a new folder in ``<work>/classroom/set_aside/``, as they are,
    links not followed) what nbgrader would otherwise read or copy as root: links, pipes and other special
    files, and files over SUBMITTED_CAP (in a folder of over ENTRIES_CAP entries, all but the notebook and its
    timestamp); a link in place of the folder goes too, and the whole folder where one of them cannot be
    moved. nbgrader then grades the rest, or (the notebook gone) reports this one as failed; the others are
    graded. Returns the folder they went into (None: nothing to set aside)."""
    import tempfile

    from grader.classroom.jobs import SUBMITTED_CAP

    def readable(path: Path) -> bool:  # a folder, or a regular file within the cap
        st = path.lstat()
        return S_ISDIR(st.st_mode) or S_ISREG(st.st_mode) and st.st_size <= SUBMITTED_CAP

    folder, work = Path(os.path.abspath(folder)), Path(os.path.abspath(work_dir()))
    bad = [p for p in (folder.parent, folder) if p.is_symlink()]
    every = itertools.islice((Path(t) / n for t, d, f in os.walk(folder) for n in d + f), ENTRIES_CAP + 1)
    found = [] if bad else list(every)
    bad = bad or [p for p in found if not readable(p)]
    if len(found) > ENTRIES_CAP:  # nbgrader lists the folder again for each file: the notebook alone stays
        keep = (folder.name + ".ipynb", "timestamp.txt")
        bad = [p for p in folder.iterdir() if not (p.name in keep and readable(p) and p.is_file())]
    if not bad:
        return None
    (work / "classroom" / "set_aside").mkdir(parents=True, exist_ok=True)
    into = Path(tempfile.mkdtemp(prefix=folder.parent.name + "-", dir=work / "classroom" / "set_aside"))
    try:  # into a folder made now: nothing set aside before (a link, say) is on the way
        for i, path in enumerate(bad):
            os.replace(path, into / f"{i}-{path.name}"[:200])
    except OSError:
        os.replace(folder, into / "the whole submission")
        bad = [folder]
    why = f"a link, a special file, over {SUBMITTED_CAP >> 20} MB, or one of over {ENTRIES_CAP} files"
    for path in bad[:10]:
        print(f"[nbgrader_config] {path}: {why}: not read, moved into {into}", file=sys.stderr)
    if len(bad) > 10:
        print(f"[nbgrader_config] and {len(bad) - 10} more of {folder}, moved into {into}", file=sys.stderr)
    return into


def _record(lesson_ids: list[str]) -> list[str]:
    """Record ``lesson_ids`` in the course's gradebook where needed (one process at a time); the ones recorded."""
    global _recording
    if _recording:
        return []
    from traitlets.log import get_logger

    from grader.classroom.grading import ensure_gradebook

    _recording = True  # recording loads nbgrader_config.py again
    log = get_logger()  # the running nbgrader command's: its details of recording are noise here
    log.addFilter(_silence)
    try:
        work_dir().mkdir(parents=True, exist_ok=True)
        with open(work_dir() / ".gradebook.lock", "w") as lock:
            if os.name == "posix":
                import fcntl

                fcntl.flock(lock, fcntl.LOCK_EX)  # several `nbgrader autograde` at once record once
            recorded = ensure_gradebook(lesson_ids)
    except RuntimeError as e:
        print(f"[nbgrader_config] {e}", file=sys.stderr)
        return []
    finally:
        log.removeFilter(_silence)
        _recording = False
    if recorded:
        print(
            f"[nbgrader_config] recorded in the gradebook from solutions/: {', '.join(recorded)}",
            file=sys.stderr,
        )
    return recorded
