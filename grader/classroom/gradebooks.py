"""nbgrader's gradebook, opened faster in the processes of a grading run (its workers and coordinator).

nbgrader opens its gradebook about ten times per notebook graded, each time with a new SQLAlchemy
engine, which compiles every statement afresh, and with a check of every table: about 50 ms of
CPU per notebook in a worker and as much again where the coordinator records the grades.
``reuse_engines`` keeps one engine per database URL instead, checks a database's tables once per
schema, and lets nbgrader's metadata check (which re-checks its own JSON schema for every cell)
check the schema once. What nbgrader reads and writes is unchanged.

``one_transaction`` and ``lent`` let a grading run record a batch of finished jobs with
nbgrader's own steps in one transaction (``grading.write_grades``).

Only the grading run's own processes call it; plain ``nbgrader`` commands are left as they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def reuse_engines() -> None:
    """Make nbgrader's ``Gradebook`` reuse one engine per database URL in this process.

    The engines keep no connection open between uses (``NullPool``): a gradebook file replaced
    between jobs is opened afresh by the next one. nbgrader's notebook metadata check, which
    re-checks its own schema at every cell, checks it once.
    """
    import os

    if os.environ.get("ATTENTION_COURSE_NBGRADER_AS_IS"):  # benchmarks/gradebook_patch.py's baseline
        return
    from nbgrader import api
    from nbgrader.nbgraderformat import common

    if getattr(api.create_engine, "reuses_engines", False):
        return
    import types

    import jsonschema
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    engines: dict[tuple, Any] = {}

    def create_engine(url: Any, **kw: Any) -> Any:
        key = (str(url), tuple(sorted(kw.items())))
        if key not in engines:
            engines[key] = sqlalchemy.create_engine(url, poolclass=NullPool, **kw)
        return engines[key]

    create_engine.reuses_engines = True  # type: ignore[attr-defined]
    api.create_engine = create_engine

    # Each Gradebook also lists the tables and has SQLAlchemy check every one before creating any
    # that is missing (about 5 ms of CPU each time). Once a database has them all, the same file
    # with the same schema (SQLite's schema cookie) is taken as having them.
    complete: dict[tuple, list[str]] = {}

    def schema(engine: Any) -> tuple | None:
        if engine.dialect.name != "sqlite":
            return None
        with engine.connect() as connection:
            return (str(engine.url), connection.exec_driver_sql("PRAGMA schema_version").scalar())

    class Tables:
        """What nbgrader asks of ``sqlalchemy.inspect``: the table names."""

        def __init__(self, names: list[str]):
            self.names = names

        def get_table_names(self) -> list[str]:
            return list(self.names)

    def inspect(engine: Any) -> Any:
        key = schema(engine)
        return Tables(complete[key]) if key in complete else sqlalchemy.inspect(engine)

    create_all = api.Base.metadata.create_all

    def create_all_once(bind: Any = None, **kw: Any) -> None:
        if schema(bind) in complete:
            return
        create_all(bind=bind, **kw)
        key = schema(bind)
        if key is not None:
            complete[key] = sqlalchemy.inspect(bind).get_table_names()

    api.inspect = inspect
    api.Base.metadata.create_all = create_all_once  # type: ignore[method-assign]

    validators: dict[str, Any] = {}

    def validate(instance: Any, schema: dict) -> None:
        """jsonschema.validate, with the schema checked once rather than at every call."""
        key = json.dumps(schema, sort_keys=True)
        if key not in validators:
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
            validators[key] = cls(schema)
        error = jsonschema.exceptions.best_match(validators[key].iter_errors(instance))
        if error is not None:
            raise error

    common.jsonschema = types.SimpleNamespace(validate=validate)


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
