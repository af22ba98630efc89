"""A notebook past its whole time limit (``--notebook-timeout``): stopped there, not at the end of its
cells, its status "timed out", every check it cut short saying why, and no classmate of the same worker
paying for it."""

from __future__ import annotations

import time

import nbformat

from tests import test_seal as _seal
from tests.test_boundary import _correct_notebook, _next_classmate_keeps_full_marks
from tests.test_seal import LESSON, needs_seal

gradebook = _seal.gradebook

_SLOW_CELL = (
    "import time\ntime.sleep(4)\nprint('SLEPT')\n"  # under the cell's limit; three are past the notebook's
)


@needs_seal
def test_a_notebook_past_its_time_limit_is_stopped_and_each_check_it_cut_short_says_so(gradebook):
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    nb = _correct_notebook()
    for _ in range(3):
        nb.cells.insert(1, nbformat.v4.new_code_cell(_SLOW_CELL))
    start = time.monotonic()
    slow = grade_job(
        Job(
            "slow_sam",
            LESSON,
            nbformat.writes(nb).encode(),
            template,
            options=Options(timeout=30, notebook_timeout=6),
        )
    )
    assert time.monotonic() - start < 20, "the notebook ran on past its limit"
    assert slow.error is None and slow.status == "timed out", (slow.error, slow.status)
    graded = nbformat.reads(slow.notebook.decode(), as_version=4)
    errors = {
        c.metadata.get("nbgrader", {}).get("grade_id"): (o["ename"], o["evalue"])
        for c in graded.cells
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    }
    stopped = ("NotebookTimeout", "not run: the notebook ran past its time limit and was stopped")
    checks = [c.grade_id for c in slow.cells]
    assert checks and all(errors.get(gid) == stopped for gid in checks), errors
    assert all(c.score == 0 and c.message == stopped[1] for c in slow.cells), slow.cells
    _next_classmate_keeps_full_marks(template)
