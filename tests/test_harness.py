"""The check harness: right answers pass, every known mistake is named, nothing hits stderr."""

from __future__ import annotations

import math

import pytest
import torch

import grader
from grader.registry import exercises

EXERCISES = exercises()

# every trap, a mask made on the CPU too: the CPU's cases are tried again on 'meta', which stands in for a GPU
TRAPS = [(name, trap) for name, ex in EXERCISES.items() for trap in ex.traps]


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


def test_a_not_implemented_error_with_a_message_is_an_error_on_its_case():
    """Only a bare ``raise NotImplementedError()`` reads as "not implemented yet"; the student's own refusal is
    reported on the case it refused."""

    def mix(A, V):
        if A.dtype != torch.float32:
            raise NotImplementedError(f"mix only supports float32, got {A.dtype}")
        return A @ V

    with pytest.raises(AssertionError) as info:
        grader.check("mix", mix)
    message = str(info.value)
    assert "it raised NotImplementedError: mix only supports float32, got torch.float64" in message
    assert "Case:" in message and "not implemented yet" not in message


def test_a_stub_rebuilt_outside_the_notebook_is_still_a_stub():
    """The independent check rebuilds a student's bare NotImplementedError with an empty message."""

    def project(X, W_q, W_k, W_v):
        raise NotImplementedError("")

    with pytest.raises(AssertionError, match="project is not implemented yet"):
        grader.check("project", project)


# ------------------------------------------------------------------ the independent check (in this process)


class _InProcessSandbox:
    """The trusted side's handle on a sandbox that answers here: every message and answer crosses as data."""

    def __init__(self) -> None:

        from grader.classroom import sandbox

        self.gone = None
        self.changed: list[str] = []
        self.namespace = sandbox.new_namespace()

    def request(self, message, timeout, callbacks=None):
        from grader.classroom import sandbox

        message = message if isinstance(message, bytes) else sandbox.dump(message, copy=False)
        answer = sandbox.handle(sandbox.load(message, True), self.namespace, timeout)
        return sandbox.load(sandbox.dump(answer))


def _verdict(answer: str, test_id: str, test: str, names: list[str]) -> dict:
    """The independent check's verdict on one test cell, with ``answer`` as the student's solution cell."""
    from grader.classroom import trusted

    cells = [
        {"id": "setup", "kind": "context", "source": "import torch\n"},
        {"id": "answer", "kind": "solution", "source": ""},
        {"id": "check", "kind": "test", "grade_id": test_id, "source": test},
    ]
    student = [
        {"id": "setup", "kind": "other", "source": "import torch\n"},
        {"id": "answer", "kind": "other", "source": answer},
        {"id": "check", "kind": "test", "source": test},
    ]
    job = {"source_cells": cells, "student_cells": student, "graded_names": names, "cell_timeout": 30}
    return trusted.evaluate(job, _InProcessSandbox())["verdicts"][test_id]


MASK_CHECK = """
S = torch.randn(5, 5, generator=torch.Generator().manual_seed(0))
causal = torch.ones(5, 5, dtype=torch.bool).tril()
A = torch.softmax(apply_mask(S, causal), dim=-1)
assert (A[~causal] == 0).all(), "weights above the diagonal must be 0"
"""


def test_an_answer_that_opens_the_checks_own_mask_fails_it():
    opens = "def apply_mask(S, allowed):\n    allowed.fill_(True)\n    return S.clone()\n"
    verdict = _verdict(opens, "test04_apply_mask_softmax", MASK_CHECK, ["apply_mask"])
    assert verdict["passed"] is False
    assert "apply_mask changed its argument `allowed` in place" in verdict["message"]


def test_a_correct_answer_keeps_the_checks_inputs_and_passes():
    right = "def apply_mask(S, allowed):\n    return S.masked_fill(~allowed, float('-inf'))\n"
    assert _verdict(right, "test04_apply_mask_softmax", MASK_CHECK, ["apply_mask"]) == {"passed": True}


def test_a_value_that_is_not_data_fails_the_check_that_passes_it_on():
    """A student's object cannot travel back to the student's code: the check fails, it is never left to the
    notebook."""
    answer = (
        "class Cache:\n    pass\n\n\n"
        "def kv_cache_step(x_t, K_cache, V_cache, W_q, W_k, W_v):\n    return torch.zeros(1), Cache(), Cache()\n"
    )
    check = (
        "W = torch.eye(3)\nK_c, V_c = torch.zeros(0, 3), torch.zeros(0, 3)\n"
        "for t in range(3):\n    o_t, K_c, V_c = kv_cache_step(torch.ones(1, 3), K_c, V_c, W, W, W)\n"
    )
    verdict = _verdict(answer, "test09_kv_cache_step_values", check, ["kv_cache_step"])
    assert verdict["passed"] is False
    assert "kv_cache_step returned a Cache object; the check needs a tensor" in verdict["message"]


ROUNDTRIP = """
Y = torch.randn(2, 10, 512, generator=torch.Generator().manual_seed(0))
assert torch.equal(merge_heads(split_heads(Y, 8)), Y), "merge_heads(split_heads(Y, 8)) should give Y back"
"""


def test_a_check_of_merge_heads_splits_with_the_reference():
    """One mistake costs one exercise: a wrong split_heads does not cost merge_heads' round trip."""
    answer = (
        "def split_heads(X, n_heads):\n    return X.reshape(*X.shape[:-2], n_heads, X.shape[-2], -1)\n\n\n"
        "def merge_heads(X):\n    return X.transpose(-3, -2).reshape(*X.shape[:-3], X.shape[-2], -1)\n"
    )
    names = ["split_heads", "merge_heads"]
    assert _verdict(answer, "test08_merge_heads_roundtrip", ROUNDTRIP, names) == {"passed": True}
    wrong_merge = answer.replace("X.transpose(-3, -2).reshape", "X.reshape")
    assert _verdict(wrong_merge, "test08_merge_heads_roundtrip", ROUNDTRIP, names)["passed"] is False
