"""Notebooks run for real, the student versions are clean and match a fresh build."""

from __future__ import annotations

import json
import re

import nbformat
import pytest

from grader import course
from tests.nbtools import ROOT, execute

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
