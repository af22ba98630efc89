"""Lesson 09 (the KV cache): the reference against full causal attention, the lesson's numbers, grading."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import grader
from attention_course import data
from grader import course
from grader.lessons import l09_kv_cache as m
from tests import wrong_versions
from tests.conftest import DEVICES
from tests.nbtools import ROOT, cell_error, filled, run_in_kernel, solution_sources
from tests.solutions import read_solution
from tests.tensors import DTYPES, draw, tol

LESSON = "09_kv_cache"


# ------------------------------------------------------------------ reference vs full causal attention


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_cached_decoding_equals_causal_attention_position_by_position(device, dtype, batch):
    T, d_model, d_k, d_v = 9, 7, 5, 3
    X = draw(*batch, T, d_model, seed=1, device=device, dtype=dtype)
    W_q, W_k, W_v = (
        draw(d_model, d, seed=s, device=device, dtype=dtype) for s, d in ((2, d_k), (3, d_k), (4, d_v))
    )
    want = F.scaled_dot_product_attention(X @ W_q, X @ W_k, X @ W_v, is_causal=True)
    got = m.decode_with_cache(X, W_q, W_k, W_v)
    assert got.shape == (*batch, T, d_v) and got.device.type == device and got.dtype == dtype
    for t in range(T):
        torch.testing.assert_close(got[..., t, :], want[..., t, :], **tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_each_step_is_one_row_of_causal_attention_and_the_cache_is_k_and_v(device, dtype):
    T, d_model, d_k, d_v = 6, 8, 4, 5
    X = draw(2, T, d_model, seed=5, device=device, dtype=dtype)
    W_q, W_k, W_v = (
        draw(d_model, d, seed=s, device=device, dtype=dtype) for s, d in ((6, d_k), (7, d_k), (8, d_v))
    )
    want = F.scaled_dot_product_attention(X @ W_q, X @ W_k, X @ W_v, is_causal=True)
    K, V = m.empty_cache(X, d_k), m.empty_cache(X, d_v)
    assert K.shape == (2, 0, d_k) and K.device.type == device and K.dtype == dtype
    for t in range(T):
        o_t, K, V = m.kv_cache_step(X[:, t : t + 1], K, V, W_q, W_k, W_v)
        assert o_t.shape == (2, 1, d_v) and K.shape == (2, t + 1, d_k) and V.shape == (2, t + 1, d_v)
        torch.testing.assert_close(o_t[:, 0], want[:, t], **tol(dtype))
    torch.testing.assert_close(K, X @ W_k, **tol(dtype))
    torch.testing.assert_close(V, X @ W_v, **tol(dtype))


def test_kv_cache_bytes_matches_real_cache_tensors():
    """The formula equals numel * element_size of real per-layer caches, with K/V heads and a batch."""
    n_layers, n_kv, d_head, T, batch = 3, 2, 4, 5, 6
    for dtype in (torch.float16, torch.float32, torch.float64):
        caches = [
            torch.zeros(batch, n_kv, T, d_head, dtype=dtype) for _ in range(2 * n_layers)
        ]  # K and V per layer
        measured = sum(c.numel() * c.element_size() for c in caches)
        assert m.kv_cache_bytes(n_layers, n_kv, d_head, T, batch, torch.finfo(dtype).bits // 8) == measured
    assert m.kv_cache_bytes(32, 32, 128, 4096) == 2 * 2**30


# ------------------------------------------------------------------ the lesson's numbers


# `name = expression` lines: each expression is read back from the solution notebook once it has run
NOTEBOOK_VALUES = """
A_full = A_full
O_full = O_full
O_steps = O_steps
K_cache = K_cache
V_cache = V_cache
step_diff = step_diff
positions = positions
macs_without = macs_without
macs_with = macs_with
formulas_match = formulas_match
timed_positions = timed_positions
ms = [ms_without, ms_with]
totals = [total_without, total_with]
measured_bytes = measured_bytes
predicted_bytes = predicted_bytes
gib_at_32k = {str(k): v for k, v in gib_at_32k.items()}
A_sat = A_sat
generation_diff = generation_diff
sizes = [d, T_max]
device_diff = device_diff
"""


@pytest.fixture(scope="module")
def lesson_values():
    return read_solution(LESSON, NOTEBOOK_VALUES)


@pytest.mark.slow
def test_love_cats_step_by_step_equals_causal_attention(lesson_values):
    cats = data.love_cats()
    X, W_q, W_k, W_v = cats.X, cats.W_q, cats.W_k, cats.W_v
    want = F.scaled_dot_product_attention(X @ W_q, X @ W_k, X @ W_v, is_causal=True)
    torch.testing.assert_close(torch.tensor(lesson_values["O_full"]), want)
    torch.testing.assert_close(torch.tensor(lesson_values["O_steps"]), want)
    assert lesson_values["step_diff"] < 1e-6
    # the prose and the visible checks: rows [1, 2, 3], [2.00, 7.99, 0.00], [1.99, 7.48, 0.74]
    assert [[round(v, 2) for v in row] for row in want.tolist()] == [
        [1, 2, 3],
        [2.0, 7.99, 0.0],
        [1.99, 7.48, 0.74],
    ]
    A = torch.tensor(lesson_values["A_full"])
    assert [round(a, 2) for a in A[2].tolist()] == [0.01, 0.75, 0.24]
    assert [round(a, 2) for a in A[1, :2].tolist()] == [0.0, 1.0]
    # the cache's last state is lesson 01's K and V
    assert lesson_values["K_cache"] == (X @ W_k).tolist() == [[0, 1, 1], [4, 4, 0], [2, 3, 1]]
    assert lesson_values["V_cache"] == (X @ W_v).tolist() == [[1, 2, 3], [2, 8, 0], [2, 6, 3]]


@pytest.mark.slow
def test_measured_work_is_quadratic_without_and_linear_with_the_cache(lesson_values):
    d, T_max = lesson_values["sizes"]
    positions = lesson_values["positions"]
    assert positions == list(range(16, T_max + 1, 16))
    without = [t * d * 3 * d + t * t * 2 * d for t in positions]  # projections + scores + mix
    with_cache = [3 * d * d + t * 2 * d for t in positions]
    assert lesson_values["macs_without"] == without
    assert lesson_values["macs_with"] == with_cache
    assert lesson_values["formulas_match"] is True
    # linear: constant steps; quadratic: constant second differences
    steps = {b - a for a, b in zip(with_cache, with_cache[1:])}
    assert steps == {16 * 2 * d}
    second = {c - 2 * b + a for a, b, c in zip(without, without[1:], without[2:])}
    assert second == {2 * 16 * 16 * 2 * d}
    # rerunning the layer at position t costs exactly t cached steps: t * (3 d^2 + 2 t d)
    assert without == [t * w for t, w in zip(positions, with_cache)]
    total_without = sum(t * d * 3 * d + t * t * 2 * d for t in range(1, T_max + 1))
    total_with = sum(3 * d * d + t * 2 * d for t in range(1, T_max + 1))
    assert lesson_values["totals"] == [total_without, total_with]
    # timing: one number per timed position, all positive; at the longest context the cache is faster
    ms_without, ms_with = lesson_values["ms"]
    assert len(ms_without) == len(ms_with) == len(lesson_values["timed_positions"]) == 8
    assert min(ms_without + ms_with) > 0
    assert sum(ms_without[-2:]) > sum(ms_with[-2:])


@pytest.mark.slow
def test_measured_memory_is_two_tensors_per_token(lesson_values):
    d, T_max = lesson_values["sizes"]
    measured = lesson_values["measured_bytes"]
    assert measured == [2 * (t + 1) * d * 4 for t in range(T_max)]  # keys and values, float32
    assert lesson_values["predicted_bytes"] == measured
    assert measured[0] == 512
    assert lesson_values["gib_at_32k"] == {"32": 16.0, "8": 4.0, "1": 0.5}


@pytest.mark.slow
def test_explorers_match_causal_attention(lesson_values):
    sat = data.cat_sat()
    S = (sat.X @ sat.W_q) @ (sat.X @ sat.W_k).T / math.sqrt(2)
    A = torch.softmax(S.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf")), -1)
    torch.testing.assert_close(torch.tensor(lesson_values["A_sat"]), A)
    assert 0.45 <= A[4, 1] <= 0.55  # the last "the" finds "cat"
    assert lesson_values["generation_diff"] < 1e-6
    assert lesson_values["device_diff"] < 1e-5


# ------------------------------------------------------------------ grading through real nbgrader

STEP_OK = """
def kv_cache_step(x_t, K_cache, V_cache, W_q, W_k, W_v):
    q, k, v = x_t @ W_q, x_t @ W_k, x_t @ W_v
    K = torch.cat([K_cache, k], dim=-2)
    V = torch.cat([V_cache, v], dim=-2)
    S = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(S, dim=-1) @ V, K, V
"""
DECODE_OK = """
def decode_with_cache(X, W_q, W_k, W_v):
    K = X.new_zeros(*X.shape[:-2], 0, W_k.shape[-1])
    V = X.new_zeros(*X.shape[:-2], 0, W_v.shape[-1])
    outs = []
    for t in range(X.shape[-2]):
        x = X[..., t:t + 1, :]
        q = x @ W_q
        K = torch.cat([K, x @ W_k], dim=-2)
        V = torch.cat([V, x @ W_v], dim=-2)
        S = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])
        outs.append(torch.softmax(S, dim=-1) @ V)
    return torch.cat(outs, dim=-2)
"""
BYTES_OK = """
def kv_cache_bytes(n_layers, n_kv_heads, d_head, n_tokens, batch=1, bytes_per_value=2):
    return 2 * n_layers * n_kv_heads * d_head * n_tokens * batch * bytes_per_value
"""
INIT = """    K = X.new_zeros(*X.shape[:-2], 0, W_k.shape[-1])
    V = X.new_zeros(*X.shape[:-2], 0, W_v.shape[-1])
"""


def edit(src: str, *changes: tuple[str, str]) -> str:
    for old, new in changes:
        assert old in src, old
        src = src.replace(old, new)
    return src


# student code for every trap, keyed by function, then trap name
TRAP_CODE = {
    "kv_cache_step": {
        "the cache grew along the feature dimension (dim=-1) instead of the token dimension (dim=-2)": edit(
            STEP_OK, ("dim=-2)", "dim=-1)")
        ),
        "the cache grew along dim 0 instead of the token dimension (dim=-2)": edit(
            STEP_OK, ("dim=-2)", "dim=0)")
        ),
        "the new key and value went in front of the cache": edit(
            STEP_OK, ("[K_cache, k]", "[k, K_cache]"), ("[V_cache, v]", "[v, V_cache]")
        ),
        "the query did not look at its own key (attended before appending)": edit(
            STEP_OK, ("q @ K.transpose", "q @ K_cache.transpose"), ("@ V, K, V", "@ V_cache, K, V")
        ),
        "the caches were returned in the wrong order": edit(STEP_OK, ("@ V, K, V", "@ V, V, K")),
        "the scores were scaled by sqrt(d_model) instead of sqrt(d_k)": edit(
            STEP_OK, ("math.sqrt(q.shape[-1])", "math.sqrt(x_t.shape[-1])")
        ),
        "the scores were scaled by sqrt(number of keys) instead of sqrt(d_k)": edit(
            STEP_OK, ("math.sqrt(q.shape[-1])", "math.sqrt(K.shape[-2])")
        ),
        "the scores were scaled by sqrt(d_v) instead of sqrt(d_k)": edit(
            STEP_OK, ("math.sqrt(q.shape[-1])", "math.sqrt(v.shape[-1])")
        ),
    },
    "decode_with_cache": {
        "the causal limit was forgotten: every token saw the whole sequence": edit(
            DECODE_OK,
            (INIT, "    K, V = X @ W_k, X @ W_v\n"),
            (
                "        K = torch.cat([K, x @ W_k], dim=-2)\n        V = torch.cat([V, x @ W_v], dim=-2)\n",
                "",
            ),
        ),
        "the cache was not carried from step to step (each token saw only itself)": edit(
            DECODE_OK,
            (INIT, ""),
            ("        q = x @ W_q\n", "        q = x @ W_q\n" + INIT.replace("    ", "        ")),
        ),
        "the step outputs were joined along dim 0 instead of the token dimension (dim=-2)": edit(
            DECODE_OK, ("torch.cat(outs, dim=-2)", "torch.cat(outs, dim=0)")
        ),
        "only the last step's output was returned": edit(DECODE_OK, ("torch.cat(outs, dim=-2)", "outs[-1]")),
        "the scores were scaled by sqrt(d_model) instead of sqrt(d_k)": edit(
            DECODE_OK, ("math.sqrt(q.shape[-1])", "math.sqrt(X.shape[-1])")
        ),
        "the scores were scaled by sqrt(d_v) instead of sqrt(d_k)": edit(
            DECODE_OK, ("math.sqrt(q.shape[-1])", "math.sqrt(V.shape[-1])")
        ),
    },
    "kv_cache_bytes": {
        "only the keys were counted": edit(BYTES_OK, ("return 2 * ", "return ")),
        "bytes_per_value was ignored (numbers counted, not bytes)": edit(
            BYTES_OK, (" * bytes_per_value", "")
        ),
        "the batch was ignored": edit(BYTES_OK, (" * batch", "")),
        "only one layer was counted": edit(BYTES_OK, (" * n_layers", "")),
    },
}
(
    test_every_trap_of_the_lesson_has_student_code,
    test_trap_code_is_diagnosed_by_the_harness,
    test_trap_submission_loses_hidden_points_with_named_diagnosis,
) = wrong_versions.trap_code_tests(LESSON, TRAP_CODE)


ALTERNATIVE = {
    # attention by PyTorch's fused kernel; the cache grows with torch.concat
    "ex09_kv_cache_step": """
def kv_cache_step(x_t, K_cache, V_cache, W_q, W_k, W_v):
    K = torch.concat((K_cache, x_t @ W_k), -2)
    V = torch.concat((V_cache, x_t @ W_v), -2)
    return F.scaled_dot_product_attention(x_t @ W_q, K, V), K, V
""",
    # recomputing without a cache gives the same numbers: right, only slower
    "ex09_decode_with_cache": """
def decode_with_cache(X, W_q, W_k, W_v):
    return F.scaled_dot_product_attention(X @ W_q, X @ W_k, X @ W_v, is_causal=True)
""",
    "ex09_kv_cache_bytes": """
def kv_cache_bytes(n_layers, n_kv_heads, d_head, n_tokens, batch=1, bytes_per_value=2):
    keys_and_values = 2
    return math.prod([keys_and_values, n_layers, n_kv_heads, d_head, n_tokens, batch, bytes_per_value])
""",
}
(
    test_correct_but_different_implementation_gets_full_marks,
    test_correct_but_different_implementations_pass_the_harness,
) = wrong_versions.alternative_tests(LESSON, ALTERNATIVE, max_score=15)


# ------------------------------------------------------------------ kv_cache_bytes returns an int

BYTES_NOT_INT = {
    "a float, from a true division": edit(BYTES_OK, ("return 2 * ", "return 4 / 2 * ")),
    "a float, from float()": edit(BYTES_OK, ("return 2 * ", "return float(2) * ")),
    "a tensor": edit(BYTES_OK, ("return 2 * ", "return torch.tensor(2.0) * ")),
    "a bool": edit(BYTES_OK, ("return 2 * ", "return True or 2 * ")),
}


@pytest.mark.parametrize("source", BYTES_NOT_INT.values(), ids=list(BYTES_NOT_INT))
def test_kv_cache_bytes_that_is_not_an_int_fails_the_hidden_check_naming_its_type(source):
    fn = wrong_versions.answer_function(source, "kv_cache_bytes")
    with pytest.raises(AssertionError) as info:
        grader.check("kv_cache_bytes", fn)
    message = str(info.value)
    kind = type(fn(32, 32, 128, 4096)).__name__.replace("Tensor", "torch.Tensor")
    assert "should return an int" in message and f"it returned a {kind}" in message, message


def test_kv_cache_bytes_as_a_numpy_or_python_int_passes():
    import numpy as np

    grader.check("kv_cache_bytes", wrong_versions.answer_function(BYTES_OK, "kv_cache_bytes"))
    grader.check("kv_cache_bytes", lambda *args, **kwargs: np.int64(m.kv_cache_bytes(*args, **kwargs)))


@pytest.mark.slow
def test_kv_cache_bytes_returning_a_float_loses_the_visible_and_hidden_points(built_course):
    student = "bytes_as_float"
    answers = {"ex09_kv_cache_bytes": BYTES_NOT_INT["a float, from float()"]}
    grades = wrong_versions.grade(LESSON, student, answers, built_course)["grades"]
    graded = course.autograded_path(LESSON, student)
    for test_id in ("test09_kv_cache_bytes_model", "test09_kv_cache_bytes_hidden"):
        assert grades[test_id][0] == 0 < grades[test_id][1], (test_id, grades)
        assert "should return an int" in cell_error(graded, test_id), cell_error(graded, test_id)
        assert "float" in cell_error(graded, test_id), cell_error(graded, test_id)
    assert grades["test09_kv_cache_step_hidden"] == (4, 4), grades


# ------------------------------------------------------------------ the measuring cells, for any correct step

STEP_EINSUM = """
def kv_cache_step(x_t, K_cache, V_cache, W_q, W_k, W_v):
    q = torch.einsum("...td,de->...te", x_t, W_q)
    K = torch.cat([K_cache, torch.einsum("...td,de->...te", x_t, W_k)], dim=-2)
    V = torch.cat([V_cache, torch.einsum("...td,de->...te", x_t, W_v)], dim=-2)
    A = torch.softmax(torch.einsum("...qd,...kd->...qk", q, K) / math.sqrt(q.shape[-1]), dim=-1)
    return torch.einsum("...qk,...kd->...qd", A, V), K, V
"""
STEP_ELEMENTWISE = """
def kv_cache_step(x_t, K_cache, V_cache, W_q, W_k, W_v):
    q, k, v = x_t @ W_q, x_t @ W_k, x_t @ W_v
    K, V = torch.cat([K_cache, k], dim=-2), torch.cat([V_cache, v], dim=-2)
    w = torch.softmax((q * K).sum(-1) / math.sqrt(q.shape[-1]), dim=-1)   # (..., t + 1): one weight per key
    return (w[..., :, None] * V).sum(-2, keepdim=True), K, V
"""
# {way of writing kv_cache_step: (its source, what the measuring cells must say)}
STEPS = {
    "einsum": (STEP_EINSUM, "counts equal the formulas: True"),
    "scaled_dot_product_attention": (ALTERNATIVE["ex09_kv_cache_step"], "counts equal the formulas: True"),
    "elementwise products and sums": (STEP_ELEMENTWISE, "The counter sees matrix products only"),
}


def _run_all(answers: dict[str, str], cwd: Path) -> str:
    """Run All on the student notebook with the model solutions and ``answers``; the text it printed.

    Like Run All, the run stops (here: raises) at the first cell that fails; a failed visible check
    goes on, printing a box headed "FAILED" (the caller looks for it).
    """
    nb = filled(ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", solution_sources(LESSON) | answers)
    run_in_kernel(nb, cwd)
    return "".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.output_type == "stream"
    )


@pytest.mark.slow
@pytest.mark.parametrize("way", STEPS)
def test_measuring_cells_run_through_for_any_correct_kv_cache_step(way, tmp_path):
    """Run All reaches the end, and the count of a correct step is never called wrong."""
    source, says = STEPS[way]
    grader.check("kv_cache_step", wrong_versions.answer_function(source, "kv_cache_step"))  # it is correct
    printed = _run_all({"ex09_kv_cache_step": source}, tmp_path)
    assert says in printed, printed
    assert "FAILED: this check" not in printed, printed  # every visible check passed
    assert ": False" not in printed, printed
    assert "cached decoding of 64 tokens vs full causal attention" in printed, printed  # the last cells ran
