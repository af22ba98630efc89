"""Grade versions of a lesson's exercises through nbgrader, or through ``grader.check`` in this process.

The lesson tests share these steps: put some answers into the student notebook, submit it,
autograde it with nbgrader, and read what each hidden test cell scored and said.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import grader
from grader import course
from tests.nbtools import cell_error, filled, solution_sources, submit

# {hidden test cell id: (solution cell id, answer source, the mistake it must be named as, or None)}
Checks = dict[str, tuple[str, str, str | None]]


def wrong_submissions(lesson: str, wrong: dict[str, list[tuple[str, str | None]]]) -> dict[str, Checks]:
    """``{student: [(answer, diagnosis), ...]}`` as ``{student: checks}``.

    An answer defines one function: it goes into that function's cell ``exNN_<function>``, whose hidden test
    is ``testNN_<function>_hidden``.
    """
    number = lesson[:2]
    submissions: dict[str, Checks] = {}
    for student, answers in wrong.items():
        checks: Checks = {}
        for answer, diagnosis in answers:
            name = re.search(r"^def (\w+)\(", answer, re.M).group(1)
            checks[f"test{number}_{name}_hidden"] = (f"ex{number}_{name}", answer, diagnosis)
        submissions[student] = checks
    return submissions


# a slot of an answer template: {name=the right code} the first time, {name} after that
_SLOT = re.compile(r"\{(\w+)=([^{}]*)\}")


def answer_maker(template: str) -> Callable[..., str]:
    """Student answers from ``template``: each slot holds the right code unless a keyword changes it."""
    right = dict(_SLOT.findall(template))
    plain = _SLOT.sub(lambda m: "{" + m.group(1) + "}", template)

    def answer(**changes: str) -> str:
        assert set(changes) <= set(right), sorted(set(changes) - set(right))
        return plain.format(**(right | changes))

    return answer


def grade(
    lesson: str, student: str, answers: dict[str, str], built_course: Path, *, with_solutions: bool = True
) -> dict:
    """Submit the student notebook with ``answers`` in their cells and autograde it with nbgrader.

    The other answer cells hold the model solution (``with_solutions``) or stay as released.
    Returns ``course.autograde``'s result: ``{"score", "max_score", "grades"}``.
    """
    cells = (solution_sources(lesson) if with_solutions else {}) | answers
    submit(filled(built_course / lesson / f"{lesson}.ipynb", cells), lesson, student)
    return course.autograde(lesson, student)


def assert_wrong_versions_lose_hidden_points(
    lesson: str, student: str, checks: Checks, built_course: Path, *, with_solutions: bool = True
) -> None:
    """Each hidden test of ``checks`` scores 0, says what differs and names the expected mistake."""
    answers = {cell: answer for cell, answer, _ in checks.values()}
    grades = grade(lesson, student, answers, built_course, with_solutions=with_solutions)["grades"]
    for hidden, (_, _, diagnosis) in checks.items():
        assert grades[hidden][0] == 0 < grades[hidden][1], (hidden, grades)
        message = cell_error(course.autograded_path(lesson, student), hidden)
        assert "What differs:" in message, message
        if diagnosis is not None:
            assert f"Diagnosis: {diagnosis}." in message, message


def assert_traps_named(
    lesson: str,
    student: str,
    answers: dict[str, str],
    hidden: dict[str, int],
    diagnoses: dict[str, str],
    visible: dict[str, str],
    built_course: Path,
) -> None:
    """Submit ``answers`` over the model solution and read each hidden and visible test's grade.

    Each hidden test of ``hidden`` ({test: points}) named in ``diagnoses`` scores 0 and names its
    mistake; the others keep all their points. Each test of ``visible`` scores 0 and its message holds
    the phrase ``visible[test]``.
    """
    grades = grade(lesson, student, answers, built_course)["grades"]
    graded = course.autograded_path(lesson, student)
    for test_id, points in hidden.items():
        if test_id in diagnoses:
            assert grades[test_id] == (0, points), (test_id, grades)
            message = cell_error(graded, test_id)
            assert f"Diagnosis: {diagnoses[test_id]}." in message, message
        else:  # an untouched solution keeps its points
            assert grades[test_id] == (points, points), (test_id, grades)
    for test_id, phrase in visible.items():
        assert grades[test_id][0] == 0, (test_id, grades)
        assert phrase in cell_error(graded, test_id), cell_error(graded, test_id)


def named_traps_test(
    lesson: str,
    traps: dict[str, tuple[dict[str, str], dict[str, str]]],
    hidden: dict[str, int],
    visible: dict[str, dict[str, str]],
) -> Callable:
    """A lesson's slow test of its trap submissions, for its test module to bind to a test_* name.

    ``traps``: {student: (answers, {hidden test: diagnosis})}; ``visible``: {student: {visible test: phrase}}
    (see ``assert_traps_named``).
    """

    @pytest.mark.slow
    @pytest.mark.parametrize("student", sorted(traps))
    def test_each_trap_loses_its_hidden_points_and_is_named(student: str, built_course: Path) -> None:
        answers, diagnoses = traps[student]
        assert_traps_named(lesson, student, answers, hidden, diagnoses, visible[student], built_course)

    return test_each_trap_loses_its_hidden_points_and_is_named


def assert_full_marks(
    lesson: str, student: str, answers: dict[str, str], built_course: Path, *, with_solutions: bool = False
) -> dict:
    """The submission earns every point of the lesson; returns the result."""
    result = grade(lesson, student, answers, built_course, with_solutions=with_solutions)
    assert result["score"] == result["max_score"] > 0, result["grades"]
    return result


def answer_function(source: str, name: str, namespace: dict[str, Any] | None = None) -> Any:
    """The function ``name`` that an answer's source defines (with torch, math and F at hand)."""
    scope = {"torch": torch, "math": math, "F": F, **(namespace or {})}
    exec(source, scope)
    return scope[name]


def assert_named_in_process(name: str, fn: Any, diagnosis: str) -> None:
    """``grader.check`` fails ``fn`` and names the mistake ``diagnosis``."""
    with pytest.raises(AssertionError) as info:
        grader.check(name, fn)
    assert f"Diagnosis: {diagnosis}." in str(info.value), str(info.value)


def submission_tests(
    lesson: str,
    wrong: dict[str, Checks],
    right: dict[str, dict[str, str]],
    *,
    right_with_solutions: bool = False,
) -> tuple[Callable, Callable]:
    """A lesson's two slow nbgrader tests, for its test module to bind to test_* names.

    ``wrong``: {student: checks} (see ``assert_wrong_versions_lose_hidden_points``); ``right``:
    {student: answers} that must earn full marks.
    """

    @pytest.mark.slow
    @pytest.mark.parametrize("student", sorted(wrong))
    def test_wrong_versions_lose_hidden_points_and_are_named(student: str, built_course: Path) -> None:
        assert_wrong_versions_lose_hidden_points(lesson, student, wrong[student], built_course)

    @pytest.mark.slow
    @pytest.mark.parametrize("student", sorted(right))
    def test_correct_but_different_versions_get_full_marks(student: str, built_course: Path) -> None:
        assert_full_marks(lesson, student, right[student], built_course, with_solutions=right_with_solutions)

    return (
        test_wrong_versions_lose_hidden_points_and_are_named,
        test_correct_but_different_versions_get_full_marks,
    )


def alternative_tests(lesson: str, answers: dict[str, str], max_score: float) -> tuple[Callable, Callable]:
    """Two tests of one correct but different version of every exercise, for a test module to bind.

    Through nbgrader (slow) it earns all ``max_score`` points; in this process (and on CUDA when
    present) each of its functions passes ``grader.check``.
    """

    @pytest.mark.slow
    def test_correct_but_different_implementation_gets_full_marks(built_course: Path) -> None:
        result = assert_full_marks(lesson, f"alternative{lesson[:2]}", answers, built_course)
        assert result["max_score"] == max_score, result

    def test_correct_but_different_implementations_pass_the_harness() -> None:
        scope = {"torch": torch, "math": math, "F": F}
        for source in answers.values():
            exec(source, scope)
        for cell in answers:
            name = cell.split("_", 1)[1]
            grader.check(name, scope[name])

    return (
        test_correct_but_different_implementation_gets_full_marks,
        test_correct_but_different_implementations_pass_the_harness,
    )


# ------------------------------------------------------------- one submission per known mistake

# {function: {mistake name: the source of a student's function that makes it}}
TrapCode = dict[str, dict[str, str]]


def trap_code_tests(lesson: str, trap_code: TrapCode) -> tuple[Callable, ...]:
    """The three tests of a lesson's hand-written mistakes, for its test module to bind to test_* names.

    1. every known mistake of each function has a student version, and only those;
    2. ``grader.check`` names each version as its mistake (fast, without nbgrader);
    3. (slow) submission i, every function answered with its i-th mistake, loses each hidden test's
       points through nbgrader with the mistake named.
    """
    from grader.registry import exercises

    number = lesson[:2]

    def test_every_trap_of_the_lesson_has_student_code() -> None:
        for name, traps in trap_code.items():
            assert sorted(traps) == sorted(t.name for t in exercises()[name].traps), name

    def test_trap_code_is_diagnosed_by_the_harness() -> None:
        for name, traps in trap_code.items():
            for trap, source in traps.items():
                assert_named_in_process(name, answer_function(source, name), trap)

    submissions = []
    for i in range(max(len(traps) for traps in trap_code.values())):
        checks: Checks = {}
        for name, traps in trap_code.items():
            trap = sorted(traps)[i % len(traps)]
            checks[f"test{number}_{name}_hidden"] = (f"ex{number}_{name}", traps[trap], trap)
        submissions.append(checks)

    @pytest.mark.slow
    @pytest.mark.parametrize("i", range(len(submissions)))
    def test_trap_submission_loses_hidden_points_with_named_diagnosis(i: int, built_course: Path) -> None:
        assert_wrong_versions_lose_hidden_points(
            lesson, f"traps{number}_{i}", submissions[i], built_course, with_solutions=False
        )

    return (
        test_every_trap_of_the_lesson_has_student_code,
        test_trap_code_is_diagnosed_by_the_harness,
        test_trap_submission_loses_hidden_points_with_named_diagnosis,
    )
