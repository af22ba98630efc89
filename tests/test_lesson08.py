"""Lesson 08 (multi-head attention): the reference against PyTorch, the lesson's numbers, grading."""

from __future__ import annotations

import re

import nbformat
import pytest
import torch
import torch.nn.functional as F

import grader
from attention_course import data
from grader import course
from grader.lessons import l08_multihead as m
from tests import wrong_versions
from tests.conftest import DEVICES
from tests.nbtools import ROOT, cell_error
from tests.solutions import read_solution
from tests.tensors import DTYPES, draw, tol

LESSON = "08_multihead"


def torch_mha(W_q, W_k, W_v, W_o, n_heads):
    """torch.nn.MultiheadAttention holding our weights (it stores them as (out, in))."""
    d_model = W_q.shape[0]
    layer = torch.nn.MultiheadAttention(
        d_model, n_heads, bias=False, batch_first=True, device=W_q.device, dtype=W_q.dtype
    )
    with torch.no_grad():
        layer.in_proj_weight.copy_(torch.cat([W_q, W_k, W_v], dim=1).T)
        layer.out_proj.weight.copy_(W_o.T)
    return layer


# ------------------------------------------------------------------ reference vs independent implementations


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_attention_matches_torch_multihead_attention(device, dtype, causal):
    d_model, n_heads, T = 24, 4, 7
    X = draw(3, T, d_model, seed=1, device=device, dtype=dtype)
    W_q, W_k, W_v, W_o = (
        draw(d_model, d_model, seed=s, device=device, dtype=dtype, scale=d_model**-0.5) for s in (2, 3, 4, 5)
    )
    blocked = ~torch.ones(
        T, T, dtype=torch.bool, device=device
    ).tril()  # nn.MultiheadAttention: True = blocked
    with torch.no_grad():
        want = torch_mha(W_q, W_k, W_v, W_o, n_heads)(
            X, X, X, need_weights=False, attn_mask=blocked if causal else None
        )[0]
    got = m.multi_head_attention(X, W_q, W_k, W_v, W_o, n_heads, causal=causal)
    assert got.device.type == device and got.dtype == dtype
    torch.testing.assert_close(got, want, **tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_multi_head_attention_with_d_k_not_d_v_matches_sdpa(device, dtype, batch):
    d_model, H, d_k, d_v, d_out, T = 10, 3, 4, 6, 5, 7
    X = draw(*batch, T, d_model, seed=6, device=device, dtype=dtype)
    W_q, W_k = (draw(d_model, H * d_k, seed=s, device=device, dtype=dtype) for s in (7, 8))
    W_v, W_o = (
        draw(d_model, H * d_v, seed=9, device=device, dtype=dtype),
        draw(H * d_v, d_out, seed=10, device=device, dtype=dtype),
    )
    heads = lambda M: M.unflatten(-1, (H, -1)).movedim(-2, -3)  # (..., T, H*d) -> (..., H, T, d)
    O = F.scaled_dot_product_attention(heads(X @ W_q), heads(X @ W_k), heads(X @ W_v), is_causal=True)
    want = O.movedim(-3, -2).flatten(-2) @ W_o
    got = m.multi_head_attention(X, W_q, W_k, W_v, W_o, H, causal=True)
    assert got.shape == (*batch, T, d_out)
    torch.testing.assert_close(got, want, **tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_heads, n_kv_heads", [(8, 2), (6, 3), (4, 1), (4, 4)])
def test_grouped_query_attention_matches_sdpa_enable_gqa(device, dtype, n_heads, n_kv_heads):
    d_model, d_k, d_v, T = 16, 4, 3, 6
    X = draw(2, T, d_model, seed=11, device=device, dtype=dtype)
    W_q = draw(d_model, n_heads * d_k, seed=12, device=device, dtype=dtype)
    W_k = draw(d_model, n_kv_heads * d_k, seed=13, device=device, dtype=dtype)
    W_v = draw(d_model, n_kv_heads * d_v, seed=14, device=device, dtype=dtype)
    W_o = draw(n_heads * d_v, d_model, seed=15, device=device, dtype=dtype)
    heads = lambda M, n: M.view(2, T, n, -1).transpose(1, 2)
    Q, K, V = heads(X @ W_q, n_heads), heads(X @ W_k, n_kv_heads), heads(X @ W_v, n_kv_heads)
    O = F.scaled_dot_product_attention(Q, K, V, is_causal=True, enable_gqa=True)
    want = O.transpose(1, 2).reshape(2, T, -1) @ W_o
    torch.testing.assert_close(
        m.grouped_query_attention(X, W_q, W_k, W_v, W_o, n_heads, n_kv_heads, causal=True), want, **tol(dtype)
    )
    # the same by repeating K/V heads by hand, without enable_gqa
    g = n_heads // n_kv_heads
    O2 = F.scaled_dot_product_attention(
        Q, K.repeat_interleave(g, 1), V.repeat_interleave(g, 1), is_causal=True
    )
    torch.testing.assert_close(O2.transpose(1, 2).reshape(2, T, -1) @ W_o, want, **tol(dtype))


def test_grouped_query_attention_with_all_kv_heads_is_multi_head_attention():
    X = draw(2, 5, 12, seed=16, device="cpu", dtype=torch.float64)
    W = [draw(12, 12, seed=s, device="cpu", dtype=torch.float64) for s in (17, 18, 19, 20)]
    torch.testing.assert_close(m.grouped_query_attention(X, *W, 3, 3), m.multi_head_attention(X, *W, 3))


def test_split_heads_takes_blocks_of_columns_and_merge_heads_undoes_it():
    X = draw(2, 3, 5, 12, seed=21, device="cpu", dtype=torch.float32)
    heads = m.split_heads(X, 4)
    assert heads.shape == (2, 3, 4, 5, 3)
    for h in range(4):
        assert torch.equal(heads[..., h, :, :], X[..., 3 * h : 3 * (h + 1)])
    assert torch.equal(m.merge_heads(heads), X)


# ------------------------------------------------------------------ the lesson's numbers


# `name = expression` lines: each expression is read back from the solution notebook once it has run
NOTEBOOK_VALUES = """
A_one_the = A_one[4]
O_one_the = O_one[4]
O_concat = O_concat
A_heads_small = torch.stack(weights)
row_heads = row.view(3, 4)
per_head_1 = per_head[1]
shapes = [tuple(t.shape) for t in (Q, Q_heads, A_heads, O_heads, O_merged, O_mha)]
head3_diff = head3_diff
sum_diff = sum_diff
n_params = n_params
macs = [macs_one, macs_eight, weights_one, weights_eight]
interleave = kv_head.repeat_interleave(4)
tiled = kv_head.repeat(4)
kv_table = {str(k): v for k, v in kv_table.items()}
mha_sat = multi_head_attention(X_sat, W_q3, W_k3, W_v3, W_o3, 3, causal=True)
device_diff = device_diff
"""


@pytest.fixture(scope="module")
def lesson_values():
    return read_solution(LESSON, NOTEBOOK_VALUES)


def _causal_sdpa(X, W_q, W_k, W_v):
    return F.scaled_dot_product_attention(X @ W_q, X @ W_k, X @ W_v, is_causal=True)


@pytest.mark.slow
def test_one_head_blends_the_two_answers(lesson_values):
    sat = data.cat_sat()
    W_q = torch.tensor([[0.0, 0], [0, 0], [4, 4], [0, 0]])
    W_k = torch.tensor([[1.0, 0], [0, 0], [0, 0], [0, 1]])
    want = _causal_sdpa(sat.X, W_q, W_k, torch.eye(4))[4]  # values = the features
    torch.testing.assert_close(torch.tensor(lesson_values["O_one_the"]), want)
    A = torch.tensor(lesson_values["A_one_the"])
    assert [round(a, 2) for a in A.tolist()] == [
        0.46,
        0.46,
        0.03,
        0.03,
        0.03,
    ]  # "about 0.46 to cat and to The"
    assert [round(o, 2) for o in want.tolist()] == [0.46, 0.03, 0.51, 0.46]


@pytest.mark.slow
def test_three_heads_keep_the_answers_apart(lesson_values):
    sat = data.cat_sat()
    cols = {0: ([2], [0]), 1: ([2], [3]), 2: ([1], [0])}  # head: (query feature, key feature)
    outs, weights = [], []
    for h in range(3):
        W_q, W_k = torch.zeros(4, 1), torch.zeros(4, 1)
        W_q[cols[h][0][0], 0], W_k[cols[h][1][0], 0] = 4.0, 1.0
        S = (sat.X @ W_q) @ (sat.X @ W_k).T
        A = torch.softmax(S.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf")), -1)
        outs.append(A @ sat.X)
        weights.append(A)
    torch.testing.assert_close(torch.tensor(lesson_values["O_concat"]), torch.cat(outs, -1))
    torch.testing.assert_close(torch.tensor(lesson_values["A_heads_small"]), torch.stack(weights))
    # the prose: noun head fetches "cat" (thing 0.93), start head "The" (first token 0.93), subject head: sat -> cat 0.96
    assert round(outs[0][4, 0].item(), 2) == 0.93
    assert round(outs[1][4, 3].item(), 2) == 0.93
    assert round(weights[2][2, 1].item(), 2) == 0.96
    # the explorer runs the student's multi_head_attention with W_o = I: the concatenation itself
    torch.testing.assert_close(torch.tensor(lesson_values["mha_sat"]), torch.cat(outs, -1))


@pytest.mark.slow
def test_worked_example_shapes_and_checks(lesson_values):
    assert lesson_values["row_heads"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert lesson_values["per_head_1"] == [[4, 5, 6, 7], [16, 17, 18, 19]]
    assert lesson_values["shapes"] == [[10, 512], [8, 10, 64], [8, 10, 10], [8, 10, 64], [10, 512], [10, 512]]
    assert lesson_values["head3_diff"] < 1e-5
    assert lesson_values["sum_diff"] < 1e-4
    assert lesson_values["n_params"] == 4 * 512 * 512 == 1_048_576
    assert lesson_values["macs"] == [51_200, 51_200, 100, 800]
    assert lesson_values["interleave"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert lesson_values["tiled"] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert lesson_values["kv_table"] == {
        "8": [524_288, 1024],
        "4": [262_144, 512],
        "2": [131_072, 256],
        "1": [65_536, 128],
    }
    assert lesson_values["device_diff"] < 1e-4


# ------------------------------------------------------------------ grading through real nbgrader

SPLIT_OK = """
def split_heads(X, n_heads):
    *batch, T, D = X.shape
    return X.reshape(*batch, T, n_heads, D // n_heads).transpose(-3, -2)
"""
MERGE_OK = """
def merge_heads(X):
    *batch, H, T, d = X.shape
    return X.transpose(-3, -2).reshape(*batch, T, H * d)
"""
# the heads' attention, merged and projected: how both answers below end once Q, K, V are split into heads
HEADS_TAIL = """
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if causal:
        T = X.shape[-2]
        S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=X.device).tril(), float("-inf"))
    O = torch.softmax(S, dim=-1) @ V
    *b, H, T, d = O.shape
    return O.transpose(-3, -2).reshape(*b, T, H * d) @ W_o
"""
MHA_OK = (
    """
def multi_head_attention(X, W_q, W_k, W_v, W_o, n_heads, causal=False):
    def split(M):
        *b, T, D = M.shape
        return M.reshape(*b, T, n_heads, D // n_heads).transpose(-3, -2)
    Q, K, V = split(X @ W_q), split(X @ W_k), split(X @ W_v)"""
    + HEADS_TAIL
)
GQA_OK = (
    """
def grouped_query_attention(X, W_q, W_k, W_v, W_o, n_heads, n_kv_heads, causal=False):
    def split(M, n):
        *b, T, D = M.shape
        return M.reshape(*b, T, n, D // n).transpose(-3, -2)
    g = n_heads // n_kv_heads
    Q = split(X @ W_q, n_heads)
    K, V = split(X @ W_k, n_kv_heads), split(X @ W_v, n_kv_heads)
    K, V = K.repeat_interleave(g, dim=-3), V.repeat_interleave(g, dim=-3)"""
    + HEADS_TAIL
)


def edit(src: str, *changes: tuple[str, str]) -> str:
    for old, new in changes:
        assert old in src, old
        src = src.replace(old, new)
    return src


SPLIT_CALL = "M.reshape(*b, T, n_heads, D // n_heads).transpose(-3, -2)"
MERGE_CALL = "O.transpose(-3, -2).reshape(*b, T, H * d)"
SCALE = "/ math.sqrt(Q.shape[-1])"
CAUSAL = "if causal:"

# student code for every trap, keyed by (function, trap name)
TRAP_CODE = {
    "split_heads": {
        "reshaped straight to (n_heads, T, d_head) without a transpose": edit(
            SPLIT_OK,
            (
                "X.reshape(*batch, T, n_heads, D // n_heads).transpose(-3, -2)",
                "X.reshape(*batch, n_heads, T, D // n_heads)",
            ),
        ),
        "the heads axis was not moved in front of the tokens": edit(SPLIT_OK, (".transpose(-3, -2)", "")),
        "n_heads was used as the size of a head": edit(
            SPLIT_OK, ("X.reshape(*batch, T, n_heads, D // n_heads)", "X.view(*batch, T, -1, n_heads)")
        ),
        "heads were made of interleaved columns (d_head, n_heads) instead of blocks": edit(
            SPLIT_OK,
            (
                "X.reshape(*batch, T, n_heads, D // n_heads)",
                "X.reshape(*batch, T, D // n_heads, n_heads).transpose(-1, -2)",
            ),
        ),
        "transpose(0, 1) instead of transpose(-3, -2)": edit(
            SPLIT_OK, ("transpose(-3, -2)", "transpose(0, 1)")
        ),
    },
    "merge_heads": {
        ".view after a transpose": edit(MERGE_OK, (".reshape(", ".view(")),
        "reshaped straight back without moving the heads behind the tokens": edit(
            MERGE_OK, (".transpose(-3, -2)", "")
        ),
        "the heads were interleaved (d_head, n_heads) instead of concatenated": edit(
            MERGE_OK, (".transpose(-3, -2)", ".movedim(-3, -1)")
        ),
        "the heads were summed instead of concatenated": "def merge_heads(X):\n    return X.sum(dim=-3)\n",
        "the heads were averaged instead of concatenated": "def merge_heads(X):\n    return X.mean(dim=-3)\n",
    },
    "multi_head_attention": {
        "the output projection W_o was left out": edit(MHA_OK, (" @ W_o", "")),
        "the heads were never split (one big head)": edit(
            MHA_OK,
            (
                "Q, K, V = split(X @ W_q), split(X @ W_k), split(X @ W_v)",
                "Q, K, V = X @ W_q, X @ W_k, X @ W_v",
            ),
            (
                "    *b, H, T, d = O.shape\n    return O.transpose(-3, -2).reshape(*b, T, H * d) @ W_o",
                "    return O @ W_o",
            ),
        ),
        "the scores were scaled by sqrt(n_heads * d_head) instead of sqrt(d_head)": edit(
            MHA_OK, (SCALE, "/ math.sqrt(W_q.shape[-1])")
        ),
        "the scores were scaled by sqrt(d_model) instead of sqrt(d_head)": edit(
            MHA_OK, (SCALE, "/ math.sqrt(X.shape[-1])")
        ),
        "the scores were not scaled": edit(MHA_OK, (SCALE, "")),
        "heads split with a reshape straight to (n_heads, T, d_head)": edit(
            MHA_OK, (SPLIT_CALL, "M.reshape(*b, n_heads, T, D // n_heads)")
        ),
        "heads merged with a reshape straight back, without the transpose": edit(
            MHA_OK, (MERGE_CALL, "O.reshape(*b, T, H * d)")
        ),
        "heads made of interleaved columns instead of blocks": edit(
            MHA_OK,
            (SPLIT_CALL, "M.reshape(*b, T, D // n_heads, n_heads).transpose(-1, -2).transpose(-3, -2)"),
            (MERGE_CALL, "O.movedim(-3, -1).reshape(*b, T, H * d)"),
        ),
        "the causal flag is ignored or reversed": edit(MHA_OK, (CAUSAL, "if not causal:")),
        "the causal flag is ignored: every call masks the future": edit(MHA_OK, (CAUSAL, "if True:")),
        "the causal flag is ignored: no call masks it": edit(MHA_OK, (CAUSAL, "if False:")),
    },
    "grouped_query_attention": {
        "K/V heads were tiled (repeat) instead of grouped (repeat_interleave)": edit(
            GQA_OK,
            (
                "K, V = K.repeat_interleave(g, dim=-3), V.repeat_interleave(g, dim=-3)",
                "reps = [1] * (K.dim() - 3) + [g, 1, 1]\n    K, V = K.repeat(*reps), V.repeat(*reps)",
            ),
        ),
        "the output projection W_o was left out": edit(GQA_OK, (" @ W_o", "")),
        "the scores were scaled by sqrt(n_heads * d_head) instead of sqrt(d_head)": edit(
            GQA_OK, (SCALE, "/ math.sqrt(W_q.shape[-1])")
        ),
        "the scores were scaled by sqrt(d_model) instead of sqrt(d_head)": edit(
            GQA_OK, (SCALE, "/ math.sqrt(X.shape[-1])")
        ),
        "the scores were not scaled": edit(GQA_OK, (SCALE, "")),
        "heads split with a reshape straight to (n_heads, T, d_head)": edit(
            GQA_OK, ("M.reshape(*b, T, n, D // n).transpose(-3, -2)", "M.reshape(*b, n, T, D // n)")
        ),
        "heads merged with a reshape straight back, without the transpose": edit(
            GQA_OK, (MERGE_CALL, "O.reshape(*b, T, H * d)")
        ),
        "the causal flag is ignored or reversed": edit(GQA_OK, (CAUSAL, "if not causal:")),
        "the causal flag is ignored: every call masks the future": edit(GQA_OK, (CAUSAL, "if True:")),
        "the causal flag is ignored: no call masks it": edit(GQA_OK, (CAUSAL, "if False:")),
    },
}
(
    test_every_trap_of_the_lesson_has_student_code,
    test_trap_code_is_diagnosed_by_the_harness,
    test_trap_submission_loses_hidden_points_with_named_diagnosis,
) = wrong_versions.trap_code_tests(LESSON, TRAP_CODE)


ALTERNATIVE = {
    "ex08_split_heads": """
def split_heads(X, n_heads):
    return X.unflatten(-1, (n_heads, -1)).movedim(-2, -3)
""",
    "ex08_merge_heads": """
def merge_heads(X):
    return X.movedim(-3, -2).flatten(-2)
""",
    "ex08_multi_head_attention": """
def multi_head_attention(X, W_q, W_k, W_v, W_o, n_heads, causal=False):
    Q, K, V = (split_heads(X @ W, n_heads) for W in (W_q, W_k, W_v))
    return merge_heads(F.scaled_dot_product_attention(Q, K, V, is_causal=causal)) @ W_o
""",
    "ex08_grouped_query_attention": """
def grouped_query_attention(X, W_q, W_k, W_v, W_o, n_heads, n_kv_heads, causal=False):
    Q = torch.einsum("...td,dhk->...htk", X, W_q.unflatten(-1, (n_heads, -1)))
    K = torch.einsum("...td,dhk->...htk", X, W_k.unflatten(-1, (n_kv_heads, -1)))
    V = torch.einsum("...td,dhk->...htk", X, W_v.unflatten(-1, (n_kv_heads, -1)))
    O = F.scaled_dot_product_attention(Q, K, V, is_causal=causal, enable_gqa=True)
    return torch.einsum("...htv,hvo->...to", O, W_o.unflatten(0, (n_heads, -1)))
""",
}
(
    test_correct_but_different_implementation_gets_full_marks,
    test_correct_but_different_implementations_pass_the_harness,
) = wrong_versions.alternative_tests(LESSON, ALTERNATIVE, max_score=20)


# ------------------------------------------------------------------ the dtype rule, before hand-in and graded

MHA_FLOAT32 = edit(  # right numbers in float32; float64 inputs come back float32
    MHA_OK,
    (
        "return O.transpose(-3, -2).reshape(*b, T, H * d) @ W_o",
        "return (O.transpose(-3, -2).reshape(*b, T, H * d) @ W_o).float()",
    ),
)
# the lesson's numbers with its dtype kept, written as students write them: each head in a loop, or einsum
RIGHT = {
    "loops": {
        "ex08_multi_head_attention": """
def multi_head_attention(X, W_q, W_k, W_v, W_o, n_heads, causal=False):
    d_k, d_v, T = W_q.shape[-1] // n_heads, W_v.shape[-1] // n_heads, X.shape[-2]
    heads = []
    for h in range(n_heads):
        Q = X @ W_q[:, h * d_k:(h + 1) * d_k]
        K = X @ W_k[:, h * d_k:(h + 1) * d_k]
        V = X @ W_v[:, h * d_v:(h + 1) * d_v]
        S = Q @ K.transpose(-2, -1) / math.sqrt(d_k)
        if causal:
            S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=X.device).tril(), float("-inf"))
        heads.append(torch.softmax(S, dim=-1) @ V)
    return torch.cat(heads, dim=-1) @ W_o
""",
        "ex08_grouped_query_attention": """
def grouped_query_attention(X, W_q, W_k, W_v, W_o, n_heads, n_kv_heads, causal=False):
    d_k, d_v, T = W_q.shape[-1] // n_heads, W_v.shape[-1] // n_kv_heads, X.shape[-2]
    heads = []
    for h in range(n_heads):
        g = h // (n_heads // n_kv_heads)
        Q = X @ W_q[:, h * d_k:(h + 1) * d_k]
        K = X @ W_k[:, g * d_k:(g + 1) * d_k]
        V = X @ W_v[:, g * d_v:(g + 1) * d_v]
        S = Q @ K.transpose(-2, -1) / math.sqrt(d_k)
        if causal:
            S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=X.device).tril(), float("-inf"))
        heads.append(torch.softmax(S, dim=-1) @ V)
    return torch.cat(heads, dim=-1) @ W_o
""",
    },
    "einsum": {
        "ex08_multi_head_attention": """
def multi_head_attention(X, W_q, W_k, W_v, W_o, n_heads, causal=False):
    Q, K, V = (torch.einsum("...td,dhk->...htk", X, W.unflatten(-1, (n_heads, -1))) for W in (W_q, W_k, W_v))
    S = torch.einsum("...hqk,...hsk->...hqs", Q, K) / math.sqrt(Q.shape[-1])
    if causal:
        T = X.shape[-2]
        S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=X.device).tril(), float("-inf"))
    O = torch.einsum("...hqs,...hsv->...hqv", torch.softmax(S, dim=-1), V)
    return torch.einsum("...htv,hvo->...to", O, W_o.unflatten(0, (n_heads, -1)))
""",
        "ex08_grouped_query_attention": ALTERNATIVE["ex08_grouped_query_attention"],
    },
}
VISIBLE = {  # the visible check cells of each function
    "multi_head_attention": ["test08_multi_head_attention_torch", "test08_multi_head_attention_hidden"],
    "grouped_query_attention": [
        "test08_grouped_query_attention_sdpa",
        "test08_grouped_query_attention_hidden",
    ],
}


@pytest.fixture
def student_session(monkeypatch):
    """The lesson's setup cell run in a student's session (NBGRADER_EXECUTION unset; checks recorded afresh)."""
    from attention_course import diagnosis

    saved = dict(diagnosis.CHECKS)
    diagnosis.CHECKS.clear()
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    nb = nbformat.read(ROOT / "solutions" / LESSON / f"{LESSON}.ipynb", as_version=4)
    cells = {c.get("id"): c.source for c in nb.cells}
    setup = next(c.source for c in nb.cells if "from attention_course.checks import demo" in c.source)
    namespace = {"__name__": "__main__"}
    exec(setup, namespace)
    yield (
        namespace,
        {
            cell: re.sub(r"### BEGIN HIDDEN TESTS\n.*?### END HIDDEN TESTS\n", "", cells[cell], flags=re.S)
            for cells_of in VISIBLE.values()
            for cell in cells_of
        },
    )
    diagnosis.CHECKS.clear()
    diagnosis.CHECKS.update(saved)


def test_a_float32_cast_fails_the_visible_dtype_check_naming_the_dtype(student_session, capsys, monkeypatch):
    """Right numbers, float64 in and float32 out: before hand-in the visible check says so, in the words of
    the rule; graded, it raises, and the hidden check names the dtype too."""
    namespace, visible = student_session
    exec(MHA_FLOAT32, namespace)
    exec(visible["test08_multi_head_attention_torch"], namespace)  # float32 inputs: the numbers are right
    assert "FAILED" not in capsys.readouterr().out
    exec(visible["test08_multi_head_attention_hidden"], namespace)
    flat = " ".join(capsys.readouterr().out.replace("|", " ").split())
    assert "FAILED: this check of `multi_head_attention`" in flat, flat
    assert "multi_head_attention returned a float32 tensor for float64 inputs" in flat, flat
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(AssertionError, match="returned a float32 tensor for float64 inputs"):
        exec(visible["test08_multi_head_attention_hidden"], namespace)
    with pytest.raises(
        AssertionError, match=r"has dtype float32, expected float64 \(the dtype of the inputs\)"
    ):
        grader.check(
            "multi_head_attention", wrong_versions.answer_function(MHA_FLOAT32, "multi_head_attention")
        )


@pytest.mark.parametrize("way", sorted(RIGHT))
def test_right_versions_pass_the_visible_dtype_checks_and_the_hidden_ones(way, student_session, capsys):
    namespace, visible = student_session
    for cell, source in RIGHT[way].items():
        name = cell.removeprefix("ex08_")
        exec(source, namespace)
        grader.check(name, namespace[name])
        for check in VISIBLE[name]:
            exec(visible[check], namespace)
            out = capsys.readouterr().out
            assert "FAILED" not in out, f"{way} {check}:\n{out}"


@pytest.mark.slow
def test_a_float32_cast_loses_the_hidden_points_naming_the_dtype(built_course):
    result = wrong_versions.grade(
        LESSON, "float32_08", {"ex08_multi_head_attention": MHA_FLOAT32}, built_course
    )
    grades = result["grades"]
    assert grades["test08_multi_head_attention_torch"] == (2, 2), grades  # float32 inputs: right
    assert grades["test08_multi_head_attention_hidden"] == (0, 4), grades
    assert result["score"] == result["max_score"] - 4, result
    message = cell_error(course.autograded_path(LESSON, "float32_08"), "test08_multi_head_attention_hidden")
    assert "has dtype float32, expected float64 (the dtype of the inputs)" in message, message


@pytest.mark.slow
@pytest.mark.parametrize("way", sorted(RIGHT))
def test_right_versions_in_loops_or_einsum_get_full_marks(way, built_course):
    wrong_versions.assert_full_marks(LESSON, f"{way}08", RIGHT[way], built_course, with_solutions=True)
