"""A result made on the wrong device loses its hidden points on every grader, GPU or not, on both paths.

Each function of ``tests/test_visible_checks.py``'s ``DEVICES`` has the right numbers on the CPU and
makes its result on the CPU whatever its inputs' device (a mask without ``device=``, positions made
by ``torch.arange(T)``, an accumulator made by ``torch.zeros`` without ``device=``). Its visible check
names it before hand-in; graded, its hidden check tries the CPU's cases again on PyTorch's 'meta'
device, which stands in for a GPU, so the grade is the same on this CPU-only machine as on one with
CUDA. Graded by the course's tool (``python -m grader grade``'s engine) and by nbgrader's own API
(what ``nbgrader autograde`` and the formgrader's button run), every other check keeps its points.
"""

from __future__ import annotations

import pytest

from grader import course
from grader.classroom import grading
from grader.classroom.jobs import Options
from tests.nbtools import cell_error, filled, solution_sources, submit
from tests.test_visible_checks import DEVICES

pytestmark = pytest.mark.slow

# the mistake named where the lesson has one for it (lesson 04's masks)
NAMED = dict.fromkeys(("ex04_causal_mask", "ex04_padding_mask"), "the mask was made on the wrong device")
PATHS = ("tool", "nbgrader")


def _student(path: str, answers: dict) -> str:
    return f"device_{path}_{next(iter(answers)).split('_', 1)[1]}"


@pytest.fixture(scope="module")
def graded(built_course):
    """Every wrong-device submission graded both ways: {(path, student): scores from the gradebook}."""
    for path in PATHS:
        for lesson, answers, *_ in DEVICES:
            nb = filled(built_course / lesson / f"{lesson}.ipynb", solution_sources(lesson) | answers)
            submit(nb, lesson, _student(path, answers))
    scores = {}
    tool = [_student("tool", answers) for _, answers, *_ in DEVICES]
    lessons = sorted({lesson for lesson, *_ in DEVICES})
    summary = grading.grade(lessons, tool, options=Options(timeout=60), workers=2, progress=False, force=True)
    assert summary.graded == len(tool) and not summary.failed and not summary.cannot_grade, summary
    for lesson, answers, *_ in DEVICES:
        student = _student("tool", answers)
        scores[("tool", student)] = course.gradebook_scores(lesson, student)
        student = _student("nbgrader", answers)
        scores[("nbgrader", student)] = course.autograde(lesson, student)
    return scores


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "lesson, answers, check, words, others", DEVICES, ids=[next(iter(d[1])) for d in DEVICES]
)
def test_a_result_made_on_the_wrong_device_loses_its_hidden_points_on_a_cpu_only_grader(
    graded, path, lesson, answers, check, words, others
):
    student = _student(path, answers)
    grades = graded[(path, student)]["grades"]
    assert grades[check][0] == 0 < grades[check][1], (check, grades)
    for test_id, (score, points) in grades.items():
        if test_id != check:
            assert score == points, (
                f"{test_id} lost points for a device mistake of another function: {grades}"
            )
    message = cell_error(course.autograded_path(lesson, student), check)
    assert "'meta' stands in for a GPU" in message, message
    assert "the result was made on the wrong device" in message or "mixed two devices" in message, message
    named = NAMED.get(next(iter(answers)))
    if named:
        assert f"Diagnosis: {named}." in message, message
    else:
        assert "Diagnosis:" not in message, message  # no trap of the lesson does this: none is named
