"""nbgrader's gradebook, written a batch at a time by a grading run (its coordinator or helper).

``one_transaction`` and ``lent`` let a grading run record a batch of finished jobs with nbgrader's
own steps (the student, the submission, SaveAutoGrades, AssignLatePenalties) in one transaction
(``grades.write_grades``): the gradebook then holds every job of the batch, or none of them if the
run stops in between, so a run started again grades exactly what is missing. nbgrader itself
opens, reads and writes its gradebook as it always does.

Only the grading run's own processes call them; plain ``nbgrader`` commands are left as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


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
