"""The check harness: right answers pass, every known mistake is named, nothing hits stderr."""

from __future__ import annotations

import math

import pytest
import torch

import grader
from grader.registry import exercises

EXERCISES = exercises()

HERE = {"cpu", "cuda"} if torch.cuda.is_available() else {"cpu"}
# a trap that needs a device this machine lacks cannot be told apart here (e.g. a mask made on the CPU)
TRAPS = [(name, trap) for name, ex in EXERCISES.items() for trap in ex.traps if trap.needs in (None, *HERE)]


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_reference_passes_its_own_check(name, capfd):
    grader.check(name, EXERCISES[name].reference)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


@pytest.mark.parametrize("name, trap", TRAPS, ids=[f"{n}:{t.name}" for n, t in TRAPS])
def test_every_trap_fails_with_its_own_diagnosis(name, trap, capfd):
    with pytest.raises(AssertionError) as info:
        grader.check(name, trap.fn)
    message = str(info.value)
    assert f"Diagnosis: {trap.name}." in message, message
    assert trap.hint in message
    assert "Case:" in message and "What differs:" in message
    out, err = capfd.readouterr()
    assert out == "" and err == "", "the harness must never write to stdout/stderr"


ALTERNATIVES = {
    "project": [
        lambda X, W_q, W_k, W_v: tuple(torch.einsum("...td,de->...te", X, W) for W in (W_q, W_k, W_v)),
        lambda X, W_q, W_k, W_v: tuple(torch.matmul(X, W) for W in (W_q, W_k, W_v)),
    ],
    "scores": [
        lambda Q, K: torch.einsum("...qd,...kd->...qk", Q, K),
        lambda Q, K: Q @ K.mT,
        lambda Q, K: torch.matmul(Q, K.swapaxes(-1, -2)),
    ],
    "scaled_scores": [
        lambda Q, K: (Q / math.sqrt(Q.shape[-1])) @ K.mT,
        lambda Q, K: Q @ K.mT * Q.size(-1) ** -0.5,
    ],
    "apply_mask": [
        lambda S, allowed: torch.where(allowed, S, float("-inf")),
        lambda S, allowed: S.masked_fill(allowed.logical_not(), -math.inf),
    ],
    "softmax": [
        lambda Z, dim=-1: torch.nan_to_num(
            torch.exp(Z - Z.amax(dim, keepdim=True))
            / torch.exp(Z - Z.amax(dim, keepdim=True)).sum(dim, keepdim=True)
        ),
    ],
    "mix": [lambda A, V: torch.einsum("...qk,...kd->...qd", A, V)],
    "attention": [
        # any masking value that gives the same weights is right, if a query with no key gets zeros
        lambda Q, K, V, mask=None: (lambda A: (A @ V, A))(
            torch.softmax(
                (Q @ K.mT / math.sqrt(Q.shape[-1])).masked_fill(~mask, -1e9)
                if mask is not None
                else Q @ K.mT / math.sqrt(Q.shape[-1]),
                dim=-1,
            )
            * (mask.any(-1, keepdim=True) if mask is not None else 1)
        ),
    ],
    "causal_mask": [
        lambda T, device=None: (
            torch.arange(T, device=device)[:, None] >= torch.arange(T, device=device)[None, :]
        ),
    ],
}


@pytest.mark.parametrize("name, fn", [(n, f) for n, fs in ALTERNATIVES.items() for f in fs])
def test_correct_but_different_implementations_pass(name, fn):
    grader.check(name, fn)


def test_stub_gets_a_clear_not_implemented_message():
    def project(X, W_q, W_k, W_v):
        raise NotImplementedError()

    with pytest.raises(AssertionError, match="project is not implemented yet"):
        grader.check("project", project)


def test_float64_result_is_named():
    with pytest.raises(AssertionError, match="has dtype float64, expected float32"):
        grader.check("mix", lambda A, V: A.double() @ V.double())


def test_in_place_change_of_an_input_is_reported():
    def apply_mask(S, allowed):
        return S.masked_fill_(~allowed, float("-inf"))

    with pytest.raises(AssertionError, match="changed its input number 1 in place"):
        grader.check("apply_mask", apply_mask)


def test_shape_message_names_both_shapes():
    with pytest.raises(AssertionError, match=r"has shape \(7, 5\), expected \(5, 7\)") as info:
        grader.check("scores", lambda Q, K: K @ Q.T)
    assert "last two dimensions are swapped" in str(info.value)


def test_warnings_from_student_code_do_not_reach_stderr(capfd):
    import warnings

    def scores(Q, K):
        warnings.warn("noisy student code", UserWarning, stacklevel=1)
        return Q @ K.mT

    grader.check("scores", scores)
    assert capfd.readouterr().err == ""


def test_unknown_exercise():
    with pytest.raises(KeyError):
        grader.check("nope", print)


@pytest.mark.parametrize(
    "student, expected",
    [
        (lambda X, W_q, W_k, W_v: None, "project should return 3 things (Q, K, V), but it returned None"),
        (
            lambda X, W_q, W_k, W_v: tuple((X @ W).numpy() for W in (W_q, W_k, W_v)),
            "Q should be a torch.Tensor, but it is ndarray",
        ),
        (
            lambda X, W_q, W_k, W_v: (X @ W_q, X @ W_k),
            "project should return 3 things (Q, K, V), but it returned 2 things",
        ),
        (
            lambda X, W_q, W_k, W_v: (X @ W_q, X @ W_k, (X @ W_v)[..., :2]),
            "V has shape (5, 2), expected (5, 4)",
        ),
        (
            lambda X, W_q, W_k, W_v: (_ for _ in ()).throw(ValueError("bad idea")),
            "it raised ValueError: bad idea",
        ),
        (lambda X, W_q, W_k, W_v: (X.T @ W_q, X @ W_k, X @ W_v), "it raised RuntimeError"),
    ],
    ids=["None", "numpy", "two-things", "wrong-shape", "raises", "shape-error"],
)
def test_bad_results_give_a_clear_message(student, expected, capfd):
    with pytest.raises(AssertionError) as info:
        grader.check("project", student)
    assert expected in str(info.value)
    assert "Inputs: X (5, 9) float32 on cpu" in str(info.value), "the message names the input shapes"
    assert capfd.readouterr().err == ""


def test_mix_returning_numpy_names_the_type():
    with pytest.raises(AssertionError, match="The result of mix should be a torch.Tensor, but it is ndarray"):
        grader.check("mix", lambda A, V: (A @ V).numpy())


def test_overflow_is_named_whatever_its_wording():
    def soft_lookup(query, keys, values, sharpness):
        raw = {
            n: sharpness * sum(q * k for q, k in zip(query, key)) / math.sqrt(len(query))
            for n, key in keys.items()
        }
        exps = {n: math.e**s for n, s in raw.items()}  # OverflowError: (34, 'Numerical result out of range')
        total = sum(exps.values())
        w = {n: e / total for n, e in exps.items()}
        return w, [sum(w[n] * values[n][i] for n in keys) for i in range(len(next(iter(values.values()))))]

    with pytest.raises(AssertionError, match="Diagnosis: naive softmax that overflows"):
        grader.check("soft_lookup", soft_lookup)


def test_float_mask_is_told_masks_are_boolean():
    with pytest.raises(AssertionError, match=r"expected bool \(a mask is boolean"):
        grader.check("causal_mask", lambda T, device=None: torch.ones(T, T, device=device).tril())


def test_a_course_helper_is_never_an_answer():
    """A graded name bound to (or wrapping) the student package's own code earns nothing, whatever it computes."""
    import functools

    from attention_course import checks

    for fn in (checks.expect_shape, functools.partial(checks.expect_shape)):
        with pytest.raises(AssertionError, match="course's helper code"):
            grader.check("mix", fn)
