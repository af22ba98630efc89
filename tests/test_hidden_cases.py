"""Hidden cases a student cannot learn: inputs of each submission's own, feedback that shows one case.

The seeds of the hidden cases are shifted by a salt drawn from the course's secret, the lesson, the
student and the student's code (``course.case_salt``; ``grader.lessons._common.salted``), so a table of
answers to one attempt's inputs is of no use to the next; a message of the student's own is cut, so one
feedback page never lists the hidden inputs. Plain nbgrader's path is in test_plain_nbgrader.py.
"""

from __future__ import annotations

import math
import os
import stat
import subprocess
import sys

import nbformat
import pytest
import torch

from grader import check, course
from grader.harness import MAX_PROBLEM, check_exercise
from grader.lessons._common import salted
from grader.registry import exercises
from tests.nbtools import ROOT, filled, grading_work, solution_sources
from tests.test_seal import needs_seal

LESSON = "05_softmax"


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


def _inputs(name: str) -> list:
    return [(c.args, c.kwargs) for c in exercises()[name].cases(torch.device("cpu"))]


def test_the_secret_is_made_once_and_readable_by_the_instructor_alone(tmp_path):
    # several graders starting at once agree on one secret
    code = "from pathlib import Path; from grader import course; print(course.secret(Path(%r)).hex())"
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", code % str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    secrets = {run.communicate(timeout=60)[0].strip() for run in runs}
    assert len(secrets) == 1 and len(secrets.pop()) == 64
    (path,) = [p for p in tmp_path.iterdir()]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert course.secret(tmp_path) == bytes.fromhex(path.read_text())


def test_each_attempt_and_each_student_meet_their_own_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(tmp_path))
    code = ["def softmax(Z, dim=-1):\n    ...", "x = 1"]
    salt = course.case_salt(LESSON, "ada", code)
    assert course.case_salt(LESSON, "ada", code) == salt  # a regrade meets the same inputs
    assert course.case_salt(LESSON, "ada", [*code, "# again"]) != salt
    assert course.case_salt(LESSON, "bob", code) != salt
    assert course.case_salt("06_mixing", "ada", code) != salt
    (tmp_path / ".hidden-cases-secret").write_text(os.urandom(32).hex())  # another course, another term
    assert course.case_salt(LESSON, "ada", code) != salt


def test_every_exercise_with_random_inputs_draws_them_afresh_under_a_salt():
    moved = []
    for name in exercises():
        plain = _inputs(name)
        with salted(123456789):
            other = _inputs(name)
        floats = [t for t in _tensors(plain) if t.is_floating_point() and t.numel() > 1]
        if floats:
            pairs = zip(_tensors(plain), _tensors(other))
            if any(a.shape == b.shape and a.numel() > 1 and not torch.equal(a, b) for a, b in pairs):
                moved.append(name)
    with salted(5):
        lookups = _inputs("soft_lookup")
    assert lookups != _inputs("soft_lookup")
    unmoved = {
        name
        for name in exercises()
        if any(t.is_floating_point() and t.numel() > 1 for t in _tensors(_inputs(name)))
    } - set(moved)
    assert not unmoved, unmoved
    # outside grading the cases are the lesson's own (the docs' examples, the tests' expectations)
    assert _inputs("softmax")[0][0][0].equal(exercises()["softmax"].cases(torch.device("cpu"))[0].args[0])


def _table_of(inputs: list) -> dict[str, tuple]:
    """A cheat's table: the reference's answer to every hidden input it learnt, keyed by the input."""
    from grader.lessons.l05_softmax import soft_lookup

    return {repr(args): soft_lookup(*args) for args, _ in inputs}


def _lookup_from(table: dict[str, tuple]):
    def soft_lookup(query, keys, values, sharpness):
        if repr((query, keys, values, sharpness)) in table:
            return table[repr((query, keys, values, sharpness))]
        w = {n: 1 / len(keys) for n in keys}  # a guess for inputs it never saw
        return w, [sum(w[n] * values[n][i] for n in keys) for i in range(len(next(iter(values.values()))))]

    return soft_lookup


def test_a_table_of_one_attempts_hidden_answers_fails_the_next():
    first, second = 31337, 4242
    with salted(first):
        table = _table_of(_inputs("soft_lookup"))
        check("soft_lookup", _lookup_from(table))  # the attack works on the attempt it was learnt from
    with salted(second), pytest.raises(AssertionError, match="is not right yet"):
        check("soft_lookup", _lookup_from(table))


def test_a_students_long_error_text_is_cut_so_no_page_lists_the_inputs():
    seen: list = []

    def softmax(Z, dim=-1):
        seen.append(Z.flatten().tolist())
        if len(seen) == 6:
            raise ValueError("every input so far: " + repr(seen))
        m = Z.amax(dim=dim, keepdim=True)
        e = (Z - m).exp()
        return e / e.sum(dim=dim, keepdim=True)

    with pytest.raises(AssertionError) as failed:
        check_exercise(exercises()["softmax"], softmax, on=["cpu"])
    message = str(failed.value)
    assert "it raised ValueError: every input so far:" in message and "(cut)" in message
    assert len(message) < MAX_PROBLEM + 400
    assert not any(f"{x:.4f}"[:6] in message for x in seen[-1][:20] if abs(x) > 0.01), message


def test_a_message_that_cannot_be_printed_is_still_a_failure():
    class Mute(Exception):
        def __str__(self):
            raise RuntimeError("no")

    def softmax(Z, dim=-1):
        raise Mute()

    with pytest.raises(AssertionError, match="it raised Mute"):
        check_exercise(exercises()["softmax"], softmax, on=["cpu"])


# ------------------------------------------------------------------ the course's tool, sealed


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory):
    with grading_work(tmp_path_factory.mktemp("hidden-cases"), [LESSON]) as template:
        yield template


def _leaky(comment: str = "") -> bytes:
    sols = solution_sources(LESSON)
    spy = (
        "    if Z.dim() == 4:\n        raise ValueError('LEAK ' + repr(round(Z.flatten().tolist()[0], 6)))\n"
    )
    line = "    m = Z.amax(dim=dim, keepdim=True)"
    sols["ex05_softmax"] = comment + sols["ex05_softmax"].replace(line, spy + line, 1)
    nb = filled(ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", sols)
    return nbformat.writes(nb).encode()


def _graded(student: str, notebook: bytes, template: bytes) -> tuple[str, float]:
    from grader.classroom.autograde import Job, Options, grade_job

    result = grade_job(Job(student, LESSON, notebook, template, options=Options(timeout=60)))
    assert result.error is None, result.error
    (cell,) = [c for c in result.cells if c.grade_id == "test05_softmax_hidden"]
    assert cell.score == 0 and cell.trusted_passed is False, cell
    assert "it raised ValueError: LEAK " in cell.message, cell.message
    visible = [c for c in result.cells if c.grade_id == "test05_softmax_values"]
    assert visible[0].score == visible[0].points > 0, visible
    return cell.message.split("LEAK ")[1].split()[0], result.isolation


@pytest.mark.slow
@needs_seal
def test_graded_attempts_meet_inputs_of_their_own_and_a_regrade_the_same(gradebook):
    first, isolation = _graded("ada", _leaky(), gradebook)
    assert isolation == "sealed"
    again, _ = _graded("ada", _leaky(), gradebook)
    second, _ = _graded("ada", _leaky("# second attempt\n"), gradebook)
    other, _ = _graded("bob", _leaky(), gradebook)
    assert first == again, (first, again)
    assert len({first, second, other}) == 3, (first, second, other)
    assert all(math.isfinite(float(x)) for x in (first, second, other))
