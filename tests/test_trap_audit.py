"""Every mistake a lesson names fails a visible check before hand-in.

The README promises it: a student who makes one of the mistakes in ``docs/mistakes.md`` (the traps of
``grader/lessons/``) sees a visible check fail before handing in, instead of losing the hidden check's
points unwarned. For each trap, the student notebook with the model solutions and that trap's function
in place of its exercise runs top to bottom in a student's session, and "Where you stand" must list the
function as failed. A lesson author who adds a trap that no visible check catches sees it fail here.
"""

from __future__ import annotations

import pytest

from grader import course, registry
from tests.nbtools import ROOT, filled, run_in_kernel, solution_sources

LESSONS = {lesson[:2]: lesson for lesson in course.lessons()}

TRAPS = [
    pytest.param(LESSONS[registry.lesson_of(name)], name, index, id=f"{name}-{index}")
    for name, exercise in registry.exercises().items()
    for index in range(len(exercise.traps))
]


def _summary(lesson: str, name: str, index: int) -> str:
    """The last cell's output, after a run with trap ``index`` of ``name`` as the student's function."""
    grade_id = next(g for g in solution_sources(lesson) if g.split("_", 1)[1] == name)
    trap = (
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom grader import registry\n"
        f"{name} = registry.exercises()[{name!r}].traps[{index}].fn\n"
    )
    path = ROOT / "notebooks" / lesson / f"{lesson}.ipynb"
    nb = filled(path, {**solution_sources(lesson), grade_id: trap})
    run_in_kernel(nb, path.parent, timeout=300, allow_errors=True)
    last = nb.cells[-1]
    assert last.get("id") == "where-you-stand", "the summary should be the last cell"
    return "".join(o.get("text", "") for o in last.get("outputs", []) if o.output_type == "stream")


def test_every_exercise_with_traps_is_audited():
    assert len(TRAPS) == sum(len(e.traps) for e in registry.exercises().values()) > 100
    assert {p.values[0] for p in TRAPS} == set(LESSONS.values())


@pytest.mark.slow
@pytest.mark.parametrize(("lesson", "name", "index"), TRAPS)
def test_every_named_mistake_fails_a_visible_check(lesson, name, index, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)  # a student's session, not grading
    summary = _summary(lesson, name, index)
    mistake = registry.exercises()[name].traps[index].name
    assert summary.startswith("Where you stand: "), f"{lesson}: the last cell did not run"
    assert f"[ ] `{name}`: FAILED" in summary, (
        f"{mistake!r} passes every visible check of {lesson}:\n{summary}"
    )
