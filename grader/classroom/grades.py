"""The course's gradebook, read and written by a grading run (``grader.classroom.grading``).

Its lessons recorded (``ensure_gradebook``), the template every job grades into (``template``), the
grades of finished jobs written with nbgrader's own steps in one transaction (``write_grades``), and
what it holds. Loads nothing of nbgrader until a function needs it: the coordinator reads it too.
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grader import course
from grader.classroom import lessons

# ------------------------------------------------------------------ the course's gradebook


def course_config() -> Any:
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    return Config(PyFileConfigLoader("nbgrader_config.py", path=str(course.ROOT)).load_config())


def gradebook_url() -> str:
    return "sqlite:///" + str(course.work_dir() / "gradebook.db")


def _db_path() -> Path:
    return Path(gradebook_url()[len("sqlite:///") :])


def _gradebook_cells(lesson_id: str) -> tuple[dict[str, tuple[str, float]], set[str]] | None:
    """What the gradebook holds for a lesson: its test cells (grade id -> (source, points)) and
    the names of all its recorded cells; None if it holds nothing."""
    if not _db_path().exists():
        return None
    where = "JOIN notebook n ON s.notebook_id = n.id JOIN assignment a ON n.assignment_id = a.id WHERE a.name = ? AND n.name = ?"
    tests_query = (
        "SELECT s.name, s.source, g.max_score FROM source_cell s "
        "JOIN base_cell b ON b.name = s.name AND b.notebook_id = s.notebook_id JOIN grade_cells g ON g.id = b.id "
        + where
    )
    try:
        with sqlite3.connect(_db_path()) as db:
            tests = db.execute(tests_query, (lesson_id, lesson_id)).fetchall()
            names = {
                r[0] for r in db.execute("SELECT s.name FROM source_cell s " + where, (lesson_id, lesson_id))
            }
    except sqlite3.OperationalError:
        return None
    if not names:
        return None
    return {name: (source, float(points)) for name, source, points in tests}, names


def _source_cell_names(lesson_id: str) -> set[str]:
    import nbformat

    nb = nbformat.read(lessons.lesson(lesson_id).path, as_version=4)
    return {
        c.metadata["nbgrader"]["grade_id"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
    }


def ensure_gradebook(lesson_ids: list[str]) -> list[str]:
    """Record in the gradebook every lesson it lacks, or whose recorded cells changed since; return those."""
    stale = []
    for lesson_id in lesson_ids:
        held = _gradebook_cells(lesson_id)
        want = {c.grade_id: (c.source.strip(), c.points) for c in lessons.lesson(lesson_id).tests}
        if (
            held is None
            or {k: (v[0].strip(), v[1]) for k, v in held[0].items()} != want
            or held[1] != _source_cell_names(lesson_id)
        ):
            stale.append(lesson_id)
    if stale:
        try:
            with tempfile.TemporaryDirectory(prefix="classroom-release-") as tmp:
                course.build_notebooks(release_dir=Path(tmp), only=stale)
        except RuntimeError as e:
            if "submissions associated" in str(e):
                raise RuntimeError(
                    f"The cells of {', '.join(stale)} changed after submissions were graded, and nbgrader "
                    "cannot change a lesson that has submissions. Either restore the lesson as it was "
                    "released, or (to regrade everyone against the new version) remove it from the "
                    "gradebook first: nbgrader db assignment remove <lesson> --force"
                ) from None
            raise
    return stale


def template() -> bytes:
    """The course's gradebook with its assignments and no students: each job's private copy."""
    with tempfile.TemporaryDirectory(prefix="classroom-template-") as tmp:
        dest = Path(tmp) / "template.db"
        src = sqlite3.connect(_db_path())
        dst = sqlite3.connect(dest)
        with dst:
            src.backup(dst)
        src.close()
        with dst:
            for table in ("grade", "comment", "submitted_notebook", "submitted_assignment", "student"):
                dst.execute(f"DELETE FROM {table}")
        dst.execute("VACUUM")
        dst.close()
        return dest.read_bytes()


def _retry(fn, *args: Any, attempts: int = 30) -> Any:
    """Run fn, waiting and retrying while SQLite says the database is locked (the formgrader is open)."""
    import sqlalchemy

    for i in range(attempts):
        try:
            return fn(*args)
        except (sqlite3.OperationalError, sqlalchemy.exc.OperationalError) as e:
            if "locked" not in str(e) or i == attempts - 1:
                raise
            time.sleep(min(0.1 * 2**i, 2.0))
    return None


def write_grades(
    url: str, course_id: str | None, entries: list[tuple[str, str, str | None, bytes]]
) -> list[dict]:
    """Record finished jobs (lesson, student, timestamp, final notebook) in the gradebook at ``url``
    with nbgrader's own steps: the student and the submission, then SaveAutoGrades and
    AssignLatePenalties on the final notebook. All of them in one transaction: the gradebook holds
    every one of them afterwards, or (if this raises) none. Return the timestamp and late penalty
    it then holds for each.

    Runs wherever nbgrader is loaded already: in a helper process of the run (which keeps its engine,
    and what SQLAlchemy compiled, from batch to batch: ``grader.classroom.preloaded``), or the
    coordinator. ``course_id`` None: the configuration's.
    """
    import warnings

    import nbformat
    from nbgrader.api import Gradebook
    from nbgrader.preprocessors import AssignLatePenalties, SaveAutoGrades
    from nbgrader.utils import parse_utc

    warnings.filterwarnings("ignore", module="nbgrader")  # its own SQLAlchemy autoflush chatter
    warnings.filterwarnings("ignore", message=".*not in session.*")
    cfg = course_config()
    gb = Gradebook(url, cfg.CourseDirectory.get("course_id", "") if course_id is None else course_id)
    try:
        with one_transaction(gb), lent(gb, url):
            for lesson, student, timestamp, notebook in entries:
                gb.update_or_create_student(student)
                if timestamp:
                    gb.update_or_create_submission(lesson, student, timestamp=parse_utc(timestamp))
                else:
                    gb.update_or_create_submission(lesson, student)
                nb = nbformat.reads(notebook.decode(), as_version=4)
                resources = {
                    "nbgrader": {"notebook": lesson, "assignment": lesson, "student": student, "db_url": url}
                }
                SaveAutoGrades(config=cfg).preprocess(nb, resources)
                AssignLatePenalties(config=cfg).preprocess(nb, resources)
        subs = [gb.find_submission(lesson, student) for lesson, student, _, _ in entries]
        return [
            dict(
                timestamp=s.timestamp and str(s.timestamp), late_penalty=float(s.late_submission_penalty or 0)
            )
            for s in subs
        ]
    finally:
        gb.close()


def graded_in_gradebook() -> set[tuple[str, str]]:
    if not _db_path().exists():
        return set()
    with sqlite3.connect(_db_path()) as db:
        try:
            rows = db.execute(
                "SELECT s.student_id, a.name FROM submitted_assignment s JOIN assignment a ON s.assignment_id = a.id"
            )
            return {(r[0], r[1]) for r in rows}
        except sqlite3.OperationalError:
            return set()


# ------------------------------------------------------------------ a batch in one transaction


@contextmanager
def one_transaction(gb: Any) -> Iterator[None]:
    """Make what nbgrader does with the open ``Gradebook`` ``gb`` one transaction, committed at the end.

    nbgrader commits after nearly every change (a dozen times per notebook recorded); inside this
    block each of its commits sends the changes and expires every loaded object, as a commit does,
    so that what it reads next is re-read from the database, but the transaction stays open: the
    block's changes are written at once at its end, or none of them if it raises.
    """
    session = gb.db

    def commit() -> None:
        session.flush()
        session.expire_all()

    session.commit = commit
    try:
        yield
    except BaseException:
        del session.commit
        session.rollback()
        raise
    del session.commit
    session.commit()


@contextmanager
def lent(gb: Any, url: str) -> Iterator[None]:
    """Let nbgrader's SaveAutoGrades and AssignLatePenalties use the open ``Gradebook`` ``gb`` (of the
    database at ``url``) where each would open one of its own, so that they join its transaction.

    Opening one also makes sure the course it names exists (``check_course``): so does this.
    """
    from nbgrader.api import Gradebook
    from nbgrader.preprocessors import latesubmissions, saveautogrades

    class Lent:
        """``gb`` as the preprocessor's own gradebook: closing it leaves it open."""

        def __getattr__(self, name: str) -> Any:
            return getattr(gb, name)

        def __enter__(self) -> Lent:
            return self

        def __exit__(self, *exc: Any) -> None:
            pass

        def close(self) -> None:
            pass

    def open_gradebook(db_url: str, course_id: str = "default_course", authenticator: Any = None) -> Any:
        if db_url != url:
            return Gradebook(db_url, course_id, authenticator)
        gb.check_course(course_id=course_id)
        return Lent()

    modules = (saveautogrades, latesubmissions)
    for module in modules:
        module.Gradebook = open_gradebook
    try:
        yield
    finally:
        for module in modules:
            module.Gradebook = Gradebook
