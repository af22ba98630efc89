"""Crafted submissions: a notebook whose nbgrader structure was damaged, on purpose or not.

Each is graded on what can be matched to the release: test cells come back
from the source with the release's points, duplicates go, forged cells go, and
the record says "repaired" with the lesson's own maximum. A 5 MB print must
leave a small autograded notebook and feedback page (``BIG_PRINT``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import nbformat

from tests.class_sim.spec import HIDDEN01, L1, V01, Case, _sol01, _wk

BIG_PRINT = 5_000_000  # characters printed by one cell of x01_big_print
VALUES01 = "test01_project_values"


def _cell(nb: nbformat.NotebookNode, grade_id: str) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _test_to_answer(nb: nbformat.NotebookNode) -> None:
    cell = _cell(nb, HIDDEN01)
    cell.metadata.nbgrader.update(solution=True, locked=False)
    cell.source = "pass"


def _rename(nb: nbformat.NotebookNode) -> None:
    for gid in (VALUES01, HIDDEN01):
        cell = _cell(nb, gid)
        cell.metadata.nbgrader["grade_id"] = gid + "_mine"
        cell["id"] = gid + "-mine"  # a new cell id as well: found by position, not by id
        cell.source = "pass"


def _duplicate_test(nb: nbformat.NotebookNode) -> None:
    cell = _cell(nb, HIDDEN01)
    twin = copy.deepcopy(cell)
    twin["id"] = "hidden-copy"
    twin.source = "pass"
    nb.cells.insert(nb.cells.index(cell), twin)  # the copy comes first


def _tests_pasted_above(nb: nbformat.NotebookNode) -> None:
    """Every cell given a new id (pasted into a new notebook, as some platforms save), and a copy of each
    test cell pasted above the answer (to try it first): the copies run before the answer exists."""
    _new_ids(nb)
    answer = _cell(nb, "ex01_project")
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade") and c is not answer]
    for i, cell in enumerate(tests):
        twin = copy.deepcopy(cell)
        twin["id"] = f"tried-first-{i}"
        nb.cells.insert(nb.cells.index(answer), twin)


def _duplicate_answer(nb: nbformat.NotebookNode) -> None:
    cell = _cell(nb, "ex01_project")
    twin = copy.deepcopy(cell)
    twin["id"] = "answer-copy"
    twin.source = _sol01()  # the later, correct definition is the one that counts
    nb.cells.insert(nb.cells.index(cell) + 1, twin)


def _points(nb: nbformat.NotebookNode) -> None:
    _cell(nb, HIDDEN01).metadata.nbgrader["points"] = 100


def _strip_metadata(nb: nbformat.NotebookNode) -> None:
    for gid in ("test01_project_shapes", VALUES01, HIDDEN01):
        del _cell(nb, gid).metadata["nbgrader"]


def _forged(nb: nbformat.NotebookNode) -> None:
    bonus = nbformat.v4.new_code_cell("pass")
    bonus.metadata["nbgrader"] = {
        "grade": True,
        "grade_id": "bonus",
        "locked": True,
        "points": 50,
        "schema_version": 3,
        "solution": False,
        "task": False,
    }
    empty = nbformat.v4.new_code_cell("x = 1")
    empty.metadata["nbgrader"] = {}  # what nbgrader's DeduplicateIds leaves: it stopped whole runs
    old = nbformat.v4.new_code_cell("y = 2")
    old.metadata["nbgrader"] = {"grade": False, "solution": False, "grade_id": "old", "schema_version": 1}
    nb.cells += [bonus, empty, old]


def _new_ids(nb: nbformat.NotebookNode) -> None:
    """Every cell pasted into a new notebook: ids the lesson never gave."""
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"pasted-{i:04x}"


def _no_ids(nb: nbformat.NotebookNode) -> None:
    """Saved by a tool that writes nbformat 4.4: no cell ids at all."""
    nb.nbformat_minor = 4
    for cell in nb.cells:
        cell.pop("id", None)


def _big_print(nb: nbformat.NotebookNode) -> None:
    nb.cells.append(nbformat.v4.new_code_cell(f"print('x' * {BIG_PRINT})"))


def _case(student: str, what: str, answer: str, edit: Callable, **kw) -> Case:
    return Case(student, L1, what, {"ex01_project": answer}, edit=edit, **kw)


def cases() -> list[Case]:
    """Crafted lesson-01 submissions with the score and status each must get."""
    sol, wk = _sol01(), _wk()
    return [
        _case(
            "x01_test_to_answer",
            "the hidden test cell turned into an answer cell, emptied, wrong answer",
            wk,
            _test_to_answer,
            fails=V01,
            status="repaired",
            score=1,
            notes=(f"{HIDDEN01}: test cell turned into an answer cell",),
        ),
        _case(
            "x01_renamed_ids",
            "two test cells renamed (grade id and cell id) and emptied, wrong answer",
            wk,
            _rename,
            fails=V01,
            status="repaired",
            score=1,
            notes=("grade id 'test01_project_hidden_mine' the release does not have was removed",),
        ),
        _case(
            "x01_duplicated_test",
            "an emptied copy of the hidden test cell above it, wrong answer",
            wk,
            _duplicate_test,
            fails=V01,
            status="repaired",
            score=1,
            notes=(f"{HIDDEN01}: test cell duplicated",),
        ),
        _case(
            "x01_tests_pasted_above",
            "new cell ids, a copy of every test cell pasted above the answer, correct answer",
            sol,
            _tests_pasted_above,
            status="repaired",
            score=7,
            notes=(f"{HIDDEN01}: test cell duplicated",),
        ),
        _case(
            "x01_duplicated_answer",
            "the answer cell duplicated, the copy correct",
            wk,
            _duplicate_answer,
            status="repaired",
            score=7,
            notes=("ex01_project: answer cell duplicated",),
        ),
        _case(
            "x01_points",
            "100 points on the hidden test cell, correct answer",
            sol,
            _points,
            status="repaired",
            score=7,
            notes=(f"{HIDDEN01}: test cell points changed to 100",),
        ),
        _case(
            "x01_no_metadata",
            "nbgrader metadata removed from every test cell, wrong answer",
            wk,
            _strip_metadata,
            fails=V01,
            status="repaired",
            score=1,
            notes=(f"{HIDDEN01}: test cell nbgrader metadata removed",),
        ),
        _case(
            "x01_forged_cells",
            "a forged 50-point test cell and broken nbgrader metadata, correct answer",
            sol,
            _forged,
            status="repaired",
            score=7,
            notes=("grade id 'bonus' the release does not have was removed",),
        ),
        _case("x01_big_print", "prints 5 MB, correct answer", sol, _big_print, score=7),
        # found by grade id and source, as the lesson's ids would: before, every cell of theirs ran after
        # the last test cell outside the notebook, and each scored 0, "failed the independent check"
        _case(
            "x01_new_ids",
            "every cell given a new id (pasted into a new notebook), correct answer",
            sol,
            _new_ids,
            score=7,
        ),
        _case("x01_no_ids", "saved as nbformat 4.4, without cell ids, correct answer", sol, _no_ids, score=7),
    ]
