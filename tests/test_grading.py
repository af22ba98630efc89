"""Grading end to end through real nbgrader: validate, autograde, scores, messages."""

from __future__ import annotations

import pytest

from grader import course
from tests.nbtools import ROOT, cell_error, filled, solution_sources, submit

pytestmark = pytest.mark.slow
LESSONS = course.lessons()


def _validator(invert: bool):
    from nbgrader.validator import Validator

    course.ensure_tools_on_path()
    return Validator(invert=invert)


@pytest.mark.parametrize("lesson", LESSONS)
def test_validate_passes_on_solutions(lesson):
    """nbgrader validate reports no failing test in the instructor's version."""
    results = _validator(invert=False).validate(str(ROOT / "solutions" / lesson / f"{lesson}.ipynb"))
    assert results == {}, results


@pytest.mark.parametrize("lesson", LESSONS)
def test_validate_inverted_fails_every_test_of_untouched_student_notebook(lesson, built_course):
    """Every test cell of the untouched student notebook fails (nothing passes by accident)."""
    results = _validator(invert=True).validate(str(ROOT / "notebooks" / lesson / f"{lesson}.ipynb"))
    assert "passed" not in results, [r["source"].splitlines()[0] for r in results["passed"]]


@pytest.mark.parametrize("lesson", LESSONS)
def test_solution_filled_submission_gets_full_marks(lesson, built_course):
    nb = filled(built_course / lesson / f"{lesson}.ipynb", solution_sources(lesson))
    submit(nb, lesson, "full_marks")
    result = course.autograde(lesson, "full_marks")
    assert result["max_score"] > 0
    assert result["score"] == result["max_score"], result["grades"]


@pytest.mark.parametrize("lesson", LESSONS)
def test_untouched_student_notebook_gets_zero(lesson, built_course):
    submit(built_course / lesson / f"{lesson}.ipynb", lesson, "blank")
    result = course.autograde(lesson, "blank")
    assert result["score"] == 0, result["grades"]
    errors = cell_error(course.autograded_path(lesson, "blank"), next(iter(result["grades"])))
    assert "NotImplementedError" in errors


def test_wrong_project_loses_hidden_points_and_says_what_differs(built_course):
    """W_k used for Q: the visible value check and the hidden check fail with a named diagnosis."""
    lesson = "01_projection"
    wrong = solution_sources(lesson)["ex01_project"].replace("Q = X @ W_q", "Q = X @ W_k")
    assert wrong != solution_sources(lesson)["ex01_project"]
    submit(filled(built_course / lesson / f"{lesson}.ipynb", {"ex01_project": wrong}), lesson, "wk_for_q")
    result = course.autograde(lesson, "wk_for_q")
    grades = result["grades"]
    assert grades["test01_project_shapes"] == (1, 1)  # shapes are still right
    assert grades["test01_project_values"][0] == 0
    assert grades["test01_project_hidden"] == (0, 4)
    message = cell_error(course.autograded_path(lesson, "wk_for_q"), "test01_project_hidden")
    assert "Q: " in message and "expected" in message and "got" in message, message
    assert "Diagnosis: Q was computed with W_k" in message, message
    visible = cell_error(course.autograded_path(lesson, "wk_for_q"), "test01_project_values")
    assert "First difference at [0, 0]: expected 1.00, got 0.00" in visible, visible


def test_bad_result_gets_zero_and_a_message_without_stopping_grading(built_course):
    """A project returning None scores 0 on each check it fails, with a readable message; grading completes."""
    lesson = "01_projection"
    bad = "def project(X, W_q, W_k, W_v):\n    return None\n"
    submit(filled(built_course / lesson / f"{lesson}.ipynb", {"ex01_project": bad}), lesson, "returns_none")
    result = course.autograde(lesson, "returns_none")
    assert result["score"] == 0, result["grades"]
    message = cell_error(course.autograded_path(lesson, "returns_none"), "test01_project_shapes")
    assert "project should return a tuple (Q, K, V)" in message, message
    # a second student graded after it still gets full marks
    submit(filled(built_course / lesson / f"{lesson}.ipynb", solution_sources(lesson)), lesson, "after_bad")
    assert course.autograde(lesson, "after_bad")["score"] == 7


def test_the_readmes_nbgrader_validate_of_a_source_passes(tmp_path):
    """``nbgrader validate solutions/...`` as the README has instructors run it (the course's
    nbgrader_config.py loaded): the instructor's source passes its hidden tests, which import grader."""
    import subprocess
    import sys
    from pathlib import Path

    course.ensure_tools_on_path()
    nbgrader = Path(sys.executable).parent / "nbgrader"
    source = "solutions/01_projection/01_projection.ipynb"
    done = subprocess.run(
        [str(nbgrader), "validate", source], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert "Success! Your notebook passes all the tests." in done.stdout, (
        done.stdout[-3000:] + done.stderr[-3000:]
    )
