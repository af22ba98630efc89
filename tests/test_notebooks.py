"""Notebooks run for real, the student versions are clean and match a fresh build."""

from __future__ import annotations

import json
import re

import nbformat
import pytest

from grader import course
from tests.nbtools import ROOT, execute, run_in_kernel

LESSONS = course.lessons()


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_solution_notebook_runs_top_to_bottom(lesson):
    nb = execute(ROOT / "solutions" / lesson / f"{lesson}.ipynb")
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", f"{cell.id}: {out.get('ename')}: {out.get('evalue')}"
            assert not (out.output_type == "stream" and out.name == "stderr"), (
                f"{cell.id} wrote to stderr: {out.text}"
            )
            # outside grading a failed visible check reports and goes on: it must not fail either
            assert "FAILED: this check" not in out.get("text", ""), f"{cell.id}: {out.get('text')}"


def test_lessons_exist_in_both_versions():
    assert LESSONS, "no lessons found in solutions/"
    for lesson in LESSONS:
        assert (ROOT / "notebooks" / lesson / f"{lesson}.ipynb").is_file(), f"no student version of {lesson}"


@pytest.mark.parametrize("folder", ["solutions", "notebooks"])
def test_no_outputs_committed(folder):
    for path in sorted((ROOT / folder).glob("*/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name}:{cell.id} has outputs"


@pytest.mark.parametrize("lesson", LESSONS)
def test_student_notebook_has_no_solution_hidden_tests_or_reference(lesson):
    text = (ROOT / "notebooks" / lesson / f"{lesson}.ipynb").read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text, f"{lesson}: student notebook contains {marker!r}"
    nb = nbformat.read(ROOT / "notebooks" / lesson / f"{lesson}.ipynb", as_version=4)
    solutions = nbformat.read(ROOT / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert not re.search(r"^\s*(import grader|from grader)", code, re.M), "student notebook imports grader"
    assert "grader.check" not in code
    # every line of every solution body is gone from the student version
    for cell in solutions.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            body = cell.source.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
            for line in body.strip().splitlines():
                if line.strip() and not line.strip().startswith("#"):
                    student_cell = next(c for c in nb.cells if c.get("id") == cell.id)
                    assert line.strip() not in student_cell.source, (
                        f"{cell.id}: solution line {line!r} leaked"
                    )


@pytest.mark.slow
def test_committed_student_notebooks_match_a_fresh_build(built_course):
    """notebooks/ is what `python -m grader build` makes from solutions/ (rebuild and commit if not)."""
    for lesson in LESSONS:
        fresh = json.loads((built_course / lesson / f"{lesson}.ipynb").read_text())
        committed = json.loads((ROOT / "notebooks" / lesson / f"{lesson}.ipynb").read_text())
        assert fresh == committed, f"notebooks/{lesson} is stale: run `python -m grader build` and commit"


def test_student_helpers_never_import_the_grader():
    """Nothing a student receives imports grader/ (the helpers and the notebooks)."""
    for path in sorted((ROOT / "attention_course").rglob("*.py")):
        text = path.read_text()
        assert not re.search(r"^\s*(import grader|from grader)", text, re.M), f"{path} imports grader"


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_shows_its_total_points(lesson):
    nb = nbformat.read(ROOT / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    total = sum(c.metadata.get("nbgrader", {}).get("points", 0) for c in nb.cells)
    assert f"**Points: {total}**" in nb.cells[0].source, (
        f"{lesson}: the first cell should show 'Points: {total}'"
    )


def _run_student_notebook(lesson: str, monkeypatch, grading: str | None) -> nbformat.NotebookNode:
    """The student notebook as handed out (every exercise a stub), run top to bottom, errors kept."""

    if grading is None:
        monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    else:
        monkeypatch.setenv("NBGRADER_EXECUTION", grading)
    path = ROOT / "notebooks" / lesson / f"{lesson}.ipynb"
    nb = nbformat.read(path, as_version=4)
    run_in_kernel(nb, path.parent, timeout=300, allow_errors=True)
    return nb


def _exercises(nb: nbformat.NotebookNode) -> list[str]:
    return [
        c.metadata["nbgrader"]["grade_id"].split("_", 1)[1]
        for c in nb.cells
        if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")
    ]


def _text(cell) -> str:
    return "".join(out.get("text", "") for out in cell.get("outputs", []) if out.output_type == "stream")


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_run_all_with_nothing_implemented_reaches_every_explorer(lesson, monkeypatch):
    """A student who runs every cell before writing anything sees each explorer and what is left to do."""
    nb = _run_student_notebook(lesson, monkeypatch, grading=None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", (
                f"{lesson}:{cell.id} stopped Run All: {out.ename}: {out.evalue}"
            )
    checks = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert checks, f"{lesson} has no check cells"
    for cell in checks:
        assert "not done yet: `" in _text(cell) and "is still a stub" in _text(cell), (
            f"{lesson}:{cell.id} should say that the exercise is not done yet, got {_text(cell)!r}"
        )
    for cell in nb.cells:
        if cell.cell_type == "code" and "from attention_course.explorers import" in cell.source:
            assert cell.outputs, f"{lesson}:{cell.id}: the explorer showed nothing"
    summary = next(c for c in nb.cells if c.get("id") == "where-you-stand")
    assert nb.cells[-1] is summary, f"{lesson}: the summary should be the last cell"
    text = _text(summary)
    assert f"Where you stand: 0 of {len(checks)} visible checks pass." in text, text
    for name in _exercises(nb):
        assert f"`{name}`: not done yet: still a stub" in text, (
            f"{lesson}: the summary does not list {name}:\n{text}"
        )
    assert "Still to do: " + ", ".join(f"`{name}`" for name in _exercises(nb)) + "." in text, text


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_graded_run_of_an_untouched_notebook_still_fails_every_check(lesson, monkeypatch):
    """While a notebook is graded a stub fails its checks as before: only the student's session changes."""
    nb = _run_student_notebook(lesson, monkeypatch, grading="autograde")
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            errors = [out for out in cell.outputs if out.output_type == "error"]
            assert errors and errors[0].ename == "NotImplementedError", f"{lesson}:{cell.id} did not fail"
            assert "not done yet" not in _text(cell)
    assert _text(nb.cells[-1]) == "", "the summary stays silent while a notebook is graded"


STUB_CELL = """
from attention_course.checks import diagnosed, where_you_stand

def mix(A, V):
    raise NotImplementedError()

with diagnosed("mix", mix):
    mix(1, 2)
"""


def test_a_stub_says_not_done_yet_only_outside_grading(monkeypatch, capsys, request):
    """In the student's session a stub's check prints a box, and any other failure a box that says FAILED;
    graded, both raise."""
    from attention_course import diagnosis

    saved = dict(diagnosis.CHECKS)  # the record is shared by name (checks.py imports it): empty it in place
    diagnosis.CHECKS.clear()
    request.addfinalizer(lambda: (diagnosis.CHECKS.clear(), diagnosis.CHECKS.update(saved)))
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    cell = {"__name__": "__main__"}
    exec(compile(STUB_CELL, "<cell>", "exec"), cell)
    assert "not done yet: `mix` is still a stub." in capsys.readouterr().out
    cell["where_you_stand"]("mix", "softmax")
    summary = capsys.readouterr().out
    assert "Where you stand: 0 of 1 visible checks pass." in summary
    assert "`mix`: not done yet: still a stub" in summary and "`softmax`: no check has run yet" in summary
    with cell["diagnosed"]("mix", cell["mix"]):  # raised outside a notebook function: not a stub
        raise NotImplementedError()
    shown = capsys.readouterr().out
    assert "FAILED: this check of `mix`" in shown and "is still a stub" not in shown, shown
    exec("def softmax(Z):\n    raise NotImplementedError('no kernel for this dtype')\n", cell)
    with cell["diagnosed"]("softmax", cell["softmax"]):  # an error that says what it cannot do is not a stub
        cell["softmax"](1)
    shown = capsys.readouterr().out
    assert (
        "FAILED: this check of `softmax`" in shown
        and "NotImplementedError: no kernel for this dtype" in shown
    )
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(NotImplementedError):
        with cell["diagnosed"]("softmax", cell["softmax"]):
            cell["softmax"](1)
    with pytest.raises(NotImplementedError):
        with cell["diagnosed"]("mix", cell["mix"]):
            cell["mix"](1, 2)
    capsys.readouterr()
    cell["where_you_stand"]("mix")
    assert capsys.readouterr().out == ""
