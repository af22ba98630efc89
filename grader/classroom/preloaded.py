"""What a grading worker loads before its first job, imported once (its import is the warm-up).

A worker spawned on its own imports this while its fork servers start; two or more workers are
forked from multiprocessing's forkserver, which imported it once for all of them
(``grader.classroom.executors``). Besides nbgrader (a job's slowest import), it does what the
first job would otherwise do on its own: load IPython's input transformer (the sandbox's source),
SQLAlchemy's SQLite dialect and nbgrader's gradebook mappers, and compile nbformat's schema
validator. Nothing here reads the environment, a course or a file of the run.
"""

from __future__ import annotations

import ipykernel.kernelspec  # noqa: F401
import IPython.core.inputtransformer2  # noqa: F401
import nbformat
import nbformat.validator
import nbgrader.api
import sqlalchemy.dialects.sqlite  # noqa: F401
import sqlalchemy.orm

from grader.classroom import autograde, cells, sandbox  # noqa: F401

sqlalchemy.orm.configure_mappers()
for relaxed in (False, True):  # the two validators of every job (nbconvert's between its steps is relaxed)
    nbformat.validator.get_validator(relax_add_props=relaxed)
# nbgrader opens a job's gradebook eight times, each time with a new engine that compiled every statement
# again (about 40 ms of CPU a notebook): a worker keeps one engine per database, and what it compiled,
# but no connection (each opens the file as it is now, which the next job replaces)
_ENGINES: dict[str, sqlalchemy.Engine] = {}
nbgrader.api.create_engine = lambda url, **kw: (
    _ENGINES.get(url)
    or _ENGINES.setdefault(url, sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool, **kw))
)
