"""One reference per graded function, and the solution notebooks agree with it.

Each graded function has exactly one reference, in its lesson's module of grader/lessons; the
model solutions in solutions/ pass that lesson's hidden checks, and where a query has no key it
may look at, solution and reference alike give it all-zero weights and an all-zero output.
"""

from __future__ import annotations

import ast

import pytest
import torch

from grader.course import lessons
from grader.harness import check_exercise
from grader.registry import exercises, lesson_of, references
from tests.nbtools import ROOT
from tests.solutions import solution_functions

EXERCISES = exercises()
SOLUTIONS = {name: fn for lesson in lessons() for name, fn in solution_functions(lesson).items()}
ref = references()
NEG_INF = float("-inf")
# test files whose owners still keep a student-like version of a graded function under its own name


def test_every_exercise_has_one_solution_in_its_own_lesson():
    assert set(SOLUTIONS) == set(EXERCISES)
    for lesson in lessons():
        for name in solution_functions(lesson):
            assert lesson_of(name) == lesson[:2], (
                f"{name} is solved in {lesson} but graded in {lesson_of(name)}"
            )


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_solution_passes_its_hidden_check(name):
    check_exercise(EXERCISES[name], SOLUTIONS[name], on=["cpu"])


def test_a_query_with_no_allowed_key_is_checked_by_the_hidden_cases():
    cases = EXERCISES["attention"].cases(torch.device("cpu"))
    masks = [c.kwargs["mask"] for c in cases if c.kwargs.get("mask") is not None]
    assert any(bool((~m).all(dim=-1).any()) for m in masks)  # a mask row with nothing allowed


@pytest.mark.parametrize("source", ["reference", "solution"])
def test_a_query_with_no_allowed_key_gets_zero_weights_and_zero_output(source):
    attention = ref.attention if source == "reference" else SOLUTIONS["attention"]
    softmax = ref.softmax if source == "reference" else SOLUTIONS["softmax"]
    g = torch.Generator().manual_seed(5)
    Q, K, V = torch.randn(4, 3, generator=g), torch.randn(6, 3, generator=g), torch.randn(6, 2, generator=g)
    allowed = torch.ones(4, 6, dtype=torch.bool)
    allowed[2] = False  # query 2 may look at nothing
    O, A = attention(Q, K, V, allowed)
    assert A[2].tolist() == [0.0] * 6 and O[2].tolist() == [0.0] * 2, (A, O)
    assert torch.allclose(A.sum(-1)[[0, 1, 3]], torch.ones(3))
    Z = torch.tensor([[NEG_INF, NEG_INF, NEG_INF], [0.0, NEG_INF, 1.0]])
    W = softmax(Z)
    assert W[0].tolist() == [0.0, 0.0, 0.0] and not bool(W.isnan().any()), W


def _top_level_functions(path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


def test_no_module_outside_grader_lessons_defines_a_graded_function():
    """A copy of a reference (or of a model solution) drifts: tests load the solutions instead."""
    copies = []
    for folder in ("grader", "tests", "scripts", "benchmarks", "attention_course"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("grader/lessons/"):
                continue
            copies += [f"{rel}: {name}" for name in _top_level_functions(path) & set(EXERCISES)]
    assert not copies, copies


def test_each_reference_is_defined_once_in_its_lessons_module():
    for name, ex in EXERCISES.items():
        module = ex.reference.__module__
        assert module == f"grader.lessons.l{lesson_of(name)}_" + module.split("_", 1)[1], module
        homes = [
            p.name for p in (ROOT / "grader" / "lessons").glob("l*.py") if name in _top_level_functions(p)
        ]
        assert homes == [module.rsplit(".", 1)[1] + ".py"], (name, homes)
