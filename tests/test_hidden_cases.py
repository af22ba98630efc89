"""Hidden cases a student cannot learn: inputs of each submission's own, feedback that shows one case.

The seeds of the hidden cases are shifted by a salt drawn from the course's secret, the lesson, the
student and the student's code (``course.case_salt``; ``grader.lessons._common.salted``), so a table of
answers to one attempt's inputs is of no use to the next; a message of the student's own is cut, so one
feedback page never lists the hidden inputs. Plain nbgrader's path is in test_plain_nbgrader.py.
"""

from __future__ import annotations

import copy
import dataclasses
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


# ------------------------------------------------------------------ tables of answers, lesson by lesson
#
# Each lesson's hidden inputs that were once the same for everyone (lesson 03's properties' generators,
# lesson 04's masks, lesson 05's colours) are drawn from the salt: a table of the reference's answers to
# every input one attempt met passes that attempt's check, and not the next one's.

SALT_A, SALT_B = 31337, 4242


def _fingerprint(x):
    """What a table keys an input by: every number of it, and a generator's whole state."""
    if isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype), x.device.type, tuple(x.shape), repr(x.tolist()))
    if isinstance(x, torch.Generator):
        return ("generator", bytes(x.get_state().tolist()))
    if isinstance(x, dict):
        return ("dict", tuple((k, _fingerprint(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_fingerprint(v) for v in x))
    return repr(x)


def _copy(x):
    return x.clone() if isinstance(x, torch.Tensor) else copy.deepcopy(x)


def _only(name: str, keep=lambda case: True):
    """The exercise, with only the cases ``keep`` keeps (its properties all there)."""
    ex = exercises()[name]
    return dataclasses.replace(ex, cases=lambda device: [c for c in ex.cases(device) if keep(c)])


def _learnt(ex, salt: int) -> dict:
    """The cheat's table: the reference's answer to every input (cases and properties) the check meets under salt."""
    table: dict = {}

    def recording(*args, **kwargs):
        key = _fingerprint((args, kwargs))  # before the reference draws from a generator
        table[key] = ex.reference(*args, **kwargs)
        return _copy(table[key])

    with salted(salt):
        check_exercise(ex, recording, on=["cpu"])
    assert table
    return table


def _table_cheat(table: dict, garbage):
    def cheat(*args, **kwargs):
        key = _fingerprint((args, kwargs))
        return _copy(table[key]) if key in table else garbage(*args, **kwargs)

    return cheat


def _passes(ex, fn, salt: int) -> bool:
    with salted(salt):
        try:
            check_exercise(ex, fn, on=["cpu"])
        except AssertionError as failed:
            assert "is not right yet" in str(failed), failed
            return False
    return True


def _meets(ex, salt: int) -> list:
    """Every input the check hands a function under salt: the cases', then the properties'."""
    seen: list = []

    def recording(*args, **kwargs):
        seen.append(_fingerprint((args, kwargs)))
        return ex.reference(*args, **kwargs)

    with salted(salt):
        check_exercise(ex, recording, on=["cpu"])
    return seen


def _drawn_per_salt(ex) -> None:
    """The same salt, the same inputs (a regrade); another salt, other inputs."""
    first = _meets(ex, SALT_A)
    assert _meets(ex, SALT_A) == first
    assert _meets(ex, SALT_B) != first


def _property_generators(salt: int) -> list:
    """The states of the generators lesson 03's properties hand score_spread under salt."""
    from grader.lessons.l03_scaling import score_spread

    states: list = []

    def recording(d_k, n, generator):
        states.append(bytes(generator.get_state().tolist()))
        return score_spread(d_k, n, generator)

    with salted(salt):
        for prop in exercises()["score_spread"].properties:
            assert prop.check(recording) is None
    return states


def test_lesson03_property_generators_are_drawn_from_the_salt():
    first = _property_generators(SALT_A)
    assert len(first) == 6 and _property_generators(SALT_A) == first
    other = _property_generators(SALT_B)
    assert not set(other) & set(first)
    assert not set(first) & set(_property_generators(0))  # not the lesson's own seeds either
    _drawn_per_salt(exercises()["score_spread"])


def test_lesson03_a_table_of_one_attempts_spreads_fails_the_next():
    ex = exercises()["score_spread"]
    # the textbook constants pass every case (the population itself) but no property: the table learnt
    # for one attempt's generators answered the properties, and does not for the next attempt's
    cheat = _table_cheat(_learnt(ex, SALT_A), lambda d_k, n, generator: (math.sqrt(d_k), 1.0))
    assert _passes(ex, cheat, SALT_A)
    assert not _passes(ex, cheat, SALT_B)
    with salted(SALT_B), pytest.raises(AssertionError, match="different seeds gave the same answer"):
        check_exercise(ex, cheat, on=["cpu"])


LESSON04_GARBAGE = {
    "causal_mask": lambda T, device=None: torch.zeros(T, T, dtype=torch.bool, device=device),
    "padding_mask": lambda lengths, T: torch.zeros(
        len(lengths), 1, T, dtype=torch.bool, device=lengths.device
    ),
    "apply_mask": lambda S, allowed: S.clone(),
}


@pytest.mark.parametrize("name", sorted(LESSON04_GARBAGE))
def test_lesson04_masks_are_drawn_from_the_salt(name):
    _drawn_per_salt(exercises()[name])
    masks = {}
    for salt in (SALT_A, SALT_B):
        with salted(salt):
            cases = exercises()[name].cases(torch.device("cpu"))
        # the masks themselves (or the sizes and lengths they are made of), not only the scores: for
        # apply_mask the padding masks (its random mask was drawn already, its causal mask stays)
        masks[salt] = [
            _fingerprint(c.args[-1]) if name == "apply_mask" else _fingerprint((c.args, c.kwargs))
            for c in cases
            if name != "apply_mask" or "padding mask" in c.label
        ]
    assert len(masks[SALT_A]) >= 2
    assert masks[SALT_A] != masks[SALT_B]


@pytest.mark.parametrize("name", sorted(LESSON04_GARBAGE))
def test_lesson04_a_table_of_one_attempts_masks_fails_the_next(name):
    ex = exercises()[name]
    cheat = _table_cheat(_learnt(ex, SALT_A), LESSON04_GARBAGE[name])
    assert _passes(ex, cheat, SALT_A)
    assert not _passes(ex, cheat, SALT_B)


def _fixed_once(case) -> bool:
    """soft_lookup's cases that were the same for everyone (all but the random-keys ones)."""
    return "random keys" not in case.label


def test_lesson05_colours_are_drawn_from_the_salt():
    ex = _only("soft_lookup", _fixed_once)
    assert len(ex.cases(torch.device("cpu"))) == 7
    _drawn_per_salt(ex)
    first, other = (_meets(ex, salt) for salt in (SALT_A, SALT_B))
    assert not set(first) & set(other)  # not one of these cases is the same


def test_lesson05_a_table_of_one_attempts_colours_fails_the_next():
    ex = _only("soft_lookup", _fixed_once)
    cheat = _table_cheat(_learnt(ex, SALT_A), _lookup_from({}))
    assert _passes(ex, cheat, SALT_A)
    assert not _passes(ex, cheat, SALT_B)


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


def test_inputs_held_in_a_dict_are_described_by_shape_never_printed():
    """Lesson 10's ``head_forward`` takes its weights in a dict: a failing check printed every weight of
    the hidden case in its "Inputs:" line (values the feedback page then listed)."""

    def head_forward(params, X):  # scaled by d_model where the lesson scales by d_k
        Q, K, V = X @ params["W_q"], X @ params["W_k"], X @ params["W_v"]
        n = X.shape[-2]
        S = (Q @ K.mT / math.sqrt(X.shape[-1])).masked_fill(
            ~torch.ones(n, n, dtype=torch.bool, device=X.device).tril(), float("-inf")
        )
        A = torch.softmax(S, -1)
        return A @ V @ params["W_o"], A

    with pytest.raises(AssertionError) as failed:
        check_exercise(exercises()["head_forward"], head_forward, on=["cpu"])
    inputs = next(line for line in str(failed.value).splitlines() if "Inputs:" in line)
    assert "tensor(" not in inputs and "W_q: (" in inputs and "float32 on cpu" in inputs, inputs


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


def _scores_over_root_8(Q, K):
    return Q @ K.transpose(-2, -1) / math.sqrt(8)


def _attend_over_root_8(Q, K, V, causal=False):
    S = _scores_over_root_8(Q, K)
    if causal:
        S = S.masked_fill(~torch.ones(S.shape[-2:], dtype=torch.bool, device=S.device).tril(), float("-inf"))
    return torch.softmax(S, dim=-1) @ V


def _attention_over_root_8(Q, K, V, mask=None):
    S = _scores_over_root_8(Q, K)
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    A = torch.nan_to_num(torch.softmax(S, dim=-1))  # a query with no allowed key: weights 0
    return A @ V, A


# the scale written as a number, sqrt(8): the head size of most hidden cases (and none of the lessons')
FIXED_SCALE = {
    "scaled_scores": _scores_over_root_8,
    "attention": _attention_over_root_8,
    "self_attention": lambda X, W_q, W_k, W_v, causal=True: _attend_over_root_8(
        X @ W_q, X @ W_k, X @ W_v, causal
    ),
    "cross_attention": lambda X_dec, X_enc, W_q, W_k, W_v: _attend_over_root_8(
        X_dec @ W_q, X_enc @ W_k, X_enc @ W_v
    ),
}


@pytest.mark.parametrize("name", sorted(FIXED_SCALE))
def test_a_scale_fixed_at_the_usual_head_size_fails_the_hidden_check(name):
    """An exercise that scales by sqrt(d_k) is checked with another head size too, so a scale written as
    sqrt(8) fails it (it earned every hidden point of lessons 03 and 07)."""
    with pytest.raises(AssertionError, match=r"d_k = 16"):
        check(name, FIXED_SCALE[name])
