"""Lesson 07 computes the brief's numbers in front of the student, and grades one attention head
through nbgrader: every known mistake loses the hidden points and is named; other correct ways pass."""

from __future__ import annotations

import json
import re

import nbformat
import pytest

from tests import wrong_versions
from tests.nbtools import ROOT, run_in_kernel
from tests.solutions import read_solution
from tests.tensors import BRIEF_A, BRIEF_O, rounded

pytestmark = pytest.mark.slow

LESSON = "07_one_head"


# `name = expression` lines: each expression is read back from the solution notebook once it has run
NOTEBOOK_VALUES = """
S = S
S_scaled = S_scaled
A_cats = A_cats
O_cats = O_cats
attention_O = attention(Q, K, V)[0]
attention_A = attention(Q, K, V)[1]
self_free = self_attention(X, W_q, W_k, W_v, causal=False)
walk_weights = walk_weights
walk_output = walk_output
predict_shapes = [tuple(A_p.shape), tuple((A_p @ V_p).shape)]
first_output = (A_first @ V)[0]
sdpa_diff = max((attention(Q_r, K_r, V_r, m)[0] - F.scaled_dot_product_attention(Q_r, K_r, V_r, attn_mask=m)).abs().max().item() for m in (None, allowed_r))
random_A_shape = tuple(attention(Q_r, K_r, V_r, allowed_r)[1].shape)
loop_diff = loop_diff
A_cross_shape = tuple(A_cross.shape)
A_cross_sums = A_cross.sum(dim=-1)
cross_O_shape = tuple(cross_attention(X_dec, X_enc, milk.W_q, milk.W_k, milk.W_v).shape)
the_weights = the_weights
the_output = the_output
A_sat = A_sat
O_sat = O_sat
cat_share = cat_share
top_feature = top_feature
self_sat = self_attention(sat.X, sat.W_q, sat.W_k, sat.W_v)
costs = {str(T): list(c) for T, c in costs.items()}
growth = growth
"""


def test_one_head_numbers_from_the_brief():
    values = read_solution(LESSON, NOTEBOOK_VALUES)
    # the whole pipeline on "I love cats"
    assert values["S"] == [[2, 4, 4], [4, 16, 12], [4, 12, 10]]
    assert rounded(values["S_scaled"]) == [[1.15, 2.31, 2.31], [2.31, 9.24, 6.93], [2.31, 6.93, 5.77]]
    for A in (values["A_cats"], values["attention_A"]):
        assert rounded(A) == BRIEF_A
    for O in (values["O_cats"], values["attention_O"], values["self_free"]):
        assert rounded(O) == BRIEF_O
    # stage by stage for "cats": weights [0.007, 0.755, 0.238], output [1.99, 7.48, 0.74]
    assert [round(w, 3) for w in values["walk_weights"]] == [0.007, 0.755, 0.238]
    assert [round(o, 2) for o in values["walk_output"]] == [1.99, 7.48, 0.74]
    # pause and predict: shapes, and the first causal token copies its own value
    assert values["predict_shapes"] == [[2, 3, 10, 12], [2, 3, 10, 8]]
    assert values["first_output"] == [1, 2, 3]
    # agreement with torch's scaled_dot_product_attention on random batched inputs, T_q != T_k
    assert values["sdpa_diff"] < 1e-5
    assert values["random_A_shape"] == [2, 3, 5, 7]
    # every position at once: the loop over queries gives the same numbers
    assert values["loop_diff"] == 0
    # cross-attention: 6 decoder rows, 4 encoder rows -> weights 6x4 whose rows sum to 1
    assert values["A_cross_shape"] == [6, 4]
    assert all(abs(s - 1) < 1e-6 for s in values["A_cross_sums"])
    assert values["cross_O_shape"] == [6, 6]
    # capstone: the last "the" gives about half of its attention to "cat", its output is mostly "thing"
    assert 0.45 <= values["the_weights"][1] <= 0.55
    assert 0.45 <= values["cat_share"] <= 0.55
    assert values["A_sat"][4][1] == max(values["A_sat"][4])
    assert all(values["A_sat"][i][j] == 0 for i in range(5) for j in range(i + 1, 5))
    thing, *others = values["O_sat"][4]
    assert thing > 0.45 and thing > max(others), values["O_sat"][4]
    assert values["top_feature"] == "thing"
    assert [round(x, 6) for x in values["the_output"]] == [round(x, 6) for x in values["O_sat"][4]]
    assert rounded(values["self_sat"], 5) == rounded(values["O_sat"], 5)
    # cost: double the length, four times the entries, the memory and the work
    assert values["growth"] == [4.0] * 9
    assert values["costs"]["1024"][0] == 1024 * 1024
    assert values["costs"]["2048"][1] == 16.0


# ------------------------------------------------------------ student answers

ATTENTION = """
def attention(Q, K, V, mask=None):
    S = {scores=Q @ K.mT / math.sqrt(Q.shape[-1])}
    if mask is not None:
        S = S.masked_fill({hide=~mask}, float("-inf"))
    A = {softmax=torch.softmax(S, dim=-1)}
    O = A @ V
    return {result=O, A}
"""


attention_answer = wrong_versions.answer_maker(ATTENTION)


SELF = """
def self_attention(X, W_q, W_k, W_v, causal=True):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    S = Q @ K.mT / {scale=math.sqrt(Q.shape[-1])}
    if {use_mask=causal}:
        T = X.shape[-2]
        allowed = torch.ones(T, T, dtype=torch.bool, device=X.device).tril()
        S = S.masked_fill({hide=~allowed}, float("-inf"))
    return {softmax=torch.softmax(S, dim=-1)} @ V
"""


self_answer = wrong_versions.answer_maker(SELF)


CROSS = """
def cross_attention(X_dec, X_enc, W_q, W_k, W_v):
    Q, K, V = {source_q=X_dec} @ W_q, {source_kv=X_enc} @ W_k, {source_kv} @ W_v
    S = Q @ K.mT / {scale=math.sqrt(Q.shape[-1])}
    if {causal=False}:
        S = S.masked_fill(~torch.ones(S.shape[-2], S.shape[-1], dtype=torch.bool, device=S.device).tril(), float("-inf"))
    return torch.softmax(S, dim=-1) @ V
"""


cross_answer = wrong_versions.answer_maker(CROSS)


NAN_SAFE = "torch.softmax(S, dim=-1).nan_to_num(0.0)"  # a fully hidden row gives zeros (lesson 05)
SCALED_BY_DV = "the scores are divided by sqrt(d_v) instead of sqrt(d_k)"

# Each submission carries one wrong version of each function it names, so that one autograde run
# checks several diagnoses: {student: [(answer, expected diagnosis), ...]}.
WRONG_SUBMISSIONS = wrong_versions.wrong_submissions(
    LESSON,
    {
        "unscaled_dmodel_swapped": [
            (attention_answer(scores="Q @ K.mT"), "the scores are not scaled"),
            (self_answer(scale="math.sqrt(X.shape[-1])"), "the scores are divided by sqrt(d_model)"),
            (
                cross_answer(source_q="X_enc", source_kv="X_dec"),
                "queries and keys/values come from the wrong sequences",
            ),
        ],
        "dk_always_causal": [
            (
                attention_answer(scores="Q @ K.mT / Q.shape[-1]"),
                "the scores are divided by d_k instead of sqrt(d_k)",
            ),
            (self_answer(use_mask="True"), "the causal flag is ignored or reversed"),
            (cross_answer(causal="True"), "a causal mask was applied"),
        ],
        "dim2_inverted_unscaled": [
            (attention_answer(softmax="torch.softmax(S, dim=-2)"), "the softmax runs over dim -2"),
            (self_answer(hide="allowed", softmax=NAN_SAFE), "the causal mask polarity is inverted"),
            (cross_answer(scale="1"), "the scores are not scaled"),
        ],
        "inverted_unscaled": [
            (attention_answer(hide="mask", softmax=NAN_SAFE), "the mask polarity is inverted"),
            (self_answer(scale="1"), "the scores are not scaled"),
        ],
        "returns_A_O": [
            (attention_answer(result="A, O"), "the result is returned as (A, O)"),
        ],
        "returns_weights": [
            (attention_answer(result="A, A"), "the weights were returned instead of A V"),
        ],
        "k_q_transposed": [
            (attention_answer(scores="K @ Q.mT / math.sqrt(Q.shape[-1])"), "K Q^T instead of Q K^T"),
        ],
        "scaled_by_dv": [
            (attention_answer(scores="Q @ K.mT / math.sqrt(V.shape[-1])"), SCALED_BY_DV),
            (self_answer(scale="math.sqrt(V.shape[-1])"), SCALED_BY_DV),
            (cross_answer(scale="math.sqrt(V.shape[-1])"), SCALED_BY_DV),
        ],
    },
)


RIGHT_SUBMISSIONS = {
    "einsum_where_minus_1e9": {
        "ex07_attention": """
def attention(Q, K, V, mask=None):
    S = torch.einsum("...qd,...kd->...qk", Q, K) * Q.size(-1) ** -0.5
    if mask is not None:
        S = torch.where(mask, S, float("-inf"))
    A = S.softmax(dim=-1).nan_to_num(0.0)   # a query with no allowed key: zeros, not NaN
    return torch.einsum("...qk,...kd->...qd", A, V), A
""",
        "ex07_self_attention": """
def self_attention(X, W_q, W_k, W_v, causal=True):
    Q, K, V = torch.matmul(X, W_q), torch.matmul(X, W_k), torch.matmul(X, W_v)
    S = torch.matmul(Q, K.swapaxes(-1, -2)) / math.sqrt(K.shape[-1])
    if causal:
        T = X.shape[-2]
        S = S.masked_fill(torch.triu(torch.ones(T, T, device=X.device), diagonal=1).bool(), -1e9)
    return torch.softmax(S, dim=-1) @ V
""",
        "ex07_cross_attention": """
def cross_attention(X_dec, X_enc, W_q, W_k, W_v):
    Q = torch.einsum("...td,de->...te", X_dec, W_q)
    K = torch.einsum("...td,de->...te", X_enc, W_k)
    V = torch.einsum("...td,de->...te", X_enc, W_v)
    return attention(Q, K, V, mask=None)[0]
""",
    },
    "masked_fill_minus_1e9_composed": {
        "ex07_attention": """
def attention(Q, K, V, mask=None):
    d_k = Q.shape[-1]
    S = Q @ K.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        S = S.masked_fill(mask.logical_not(), -1e9)   # any value that gives the same weights ...
    A = torch.softmax(S, dim=-1)
    if mask is not None:
        A = A * mask.any(dim=-1, keepdim=True)         # ... and zeros for a query with no allowed key
    return A @ V, A
""",
        "ex07_self_attention": """
def self_attention(X, W_q, W_k, W_v, causal=True):
    T = X.shape[-2]
    i = torch.arange(T, device=X.device)
    mask = (i[:, None] >= i[None, :]) if causal else None
    return attention(X @ W_q, X @ W_k, X @ W_v, mask)[0]
""",
        "ex07_cross_attention": """
def cross_attention(X_dec, X_enc, W_q, W_k, W_v):
    O, _ = attention(X_dec @ W_q, X_enc @ W_k, X_enc @ W_v)
    return O
""",
    },
}
(
    test_wrong_versions_lose_hidden_points_and_are_named,
    test_correct_but_different_versions_get_full_marks,
) = wrong_versions.submission_tests(LESSON, WRONG_SUBMISSIONS, RIGHT_SUBMISSIONS)


# ------------------------------------------- mistakes written the way students write them


REALISTIC = [
    (
        "attention",
        attention_answer(scores="K @ Q.mT / math.sqrt(Q.shape[-1])"),
        "K Q^T instead of Q K^T",
    ),
    ("attention", attention_answer(hide="mask"), "the mask polarity is inverted"),
    ("self_attention", self_answer(hide="allowed"), "the causal mask polarity is inverted"),
]


@pytest.mark.parametrize("name, source, diagnosis", REALISTIC, ids=[d for _, _, d in REALISTIC])
def test_mistakes_written_with_torch_softmax_are_named(name, source, diagnosis):
    wrong_versions.assert_named_in_process(name, wrong_versions.answer_function(source, name), diagnosis)


# ------------------------------------------- the capstone grades attention alone

# {student: (answers, the capstone's points, a phrase of its message or None)}
CAPSTONE = {
    # mixes the keys instead of the values: its weights are right, its output is not
    "capstone_attention_mixes_keys": (
        {"ex07_attention": attention_answer().replace("O = A @ V", "O = A @ K")},
        0,
        "O (the first thing attention returns) for 5 tokens with d_v = 4 has shape (5, 2)",
    ),
    # self_attention scaled by sqrt(d_model): its own checks fail, the capstone does not
    "capstone_only_self_attention_wrong": (
        {"ex07_self_attention": self_answer(scale="math.sqrt(X.shape[-1])")},
        2,
        None,
    ),
}


@pytest.mark.parametrize("student", sorted(CAPSTONE))
def test_capstone_checks_attention_alone(student, built_course):
    from grader import course
    from tests.nbtools import cell_error

    answers, points, phrase = CAPSTONE[student]
    grades = wrong_versions.grade(LESSON, student, answers, built_course)["grades"]
    assert grades["test07_capstone"] == (points, 2), grades
    if phrase is not None:
        message = cell_error(course.autograded_path(LESSON, student), "test07_capstone")
        assert phrase in message, message
    else:  # the function that is wrong loses its own points
        assert grades["test07_self_attention_hidden"][0] == 0, grades


# ------------------------------------------- the cross-attention example says what its weights show


def run_showing(lesson: str, expressions: dict[str, str]) -> tuple[nbformat.NotebookNode, dict]:
    """A lesson's solution notebook run in a real kernel: its cells with their outputs, and the values of
    ``expressions`` read back from the same kernel (tensors as lists)."""
    path = ROOT / "solutions" / lesson / f"{lesson}.ipynb"
    nb = nbformat.read(path, as_version=4)
    probe = (
        "import json as _json\n"
        f"print('@@VALUES@@' + _json.dumps({{k: (lambda v: v.tolist() if hasattr(v, 'tolist') else v)(eval(e)) "
        f"for k, e in {expressions!r}.items()}}))"
    )
    nb.cells.append(nbformat.v4.new_code_cell(probe))
    run_in_kernel(nb, path.parent, timeout=300)
    text = "".join(o.get("text", "") for o in nb.cells.pop().outputs if o.output_type == "stream")
    return nb, json.loads(text.split("@@VALUES@@", 1)[1])


def stdout_of(nb: nbformat.NotebookNode, cell_id: str) -> str:
    cell = next(c for c in nb.cells if c.get("id") == cell_id)
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_the_cross_attention_example_says_what_its_weights_show():
    """Each English token's favourite source token, as printed, is the largest weight of its row of A_cross;
    the four tokens the text says find their translation do, with most of their weight."""
    nb, values = run_showing(
        LESSON,
        {"A": "A_cross", "rows": "milk.tokens", "columns": "enc_tokens", "translates": "source.translates"},
    )
    A, rows, columns = values["A"], values["rows"], values["columns"]
    printed = re.findall(r"'(\S+)' looks most at '(\S+)' \((\d\.\d\d)\)", stdout_of(nb, "code-19"))
    assert [token for token, _, _ in printed] == rows, stdout_of(nb, "code-19")
    for (token, favourite, weight), row in zip(printed, A):
        j = max(range(len(row)), key=row.__getitem__)
        assert favourite == columns[j] and weight == f"{row[j]:.2f}", (token, favourite, weight, row)
    assert columns == ["watashi-wa", "kappu-ni", "gyuunyuu-o", "sosoida"]
    assert values["translates"] == ["i", "cup", "milk", "poured"]
    text = next(c for c in nb.cells if c.get("id") == "md-20").source
    assert text.startswith(
        '"i", "poured", "milk" and "cup" each look most at the source token that translates'
    )
    for english, source in zip(values["translates"], columns):
        row = A[rows.index(english)]
        assert max(row) == row[columns.index(source)] > 0.5, (english, source, row)
    assert all(abs(sum(row) - 1) < 1e-6 for row in A) and len(A) == 6 and len(A[0]) == 4


def test_pytorchs_own_multi_head_attention_fails_with_the_rule():
    """One head of F.multi_head_attention_forward (identity projections, sizes padded, queries scaled
    back) is right on every hidden case and earned full marks; it is PyTorch's attention, ruled out with
    scaled_dot_product_attention. Through nn.MultiheadAttention it is the same call."""
    import torch

    import grader
    from tests import attacks

    attention = wrong_versions.answer_function(attacks.L07_MHA_FORWARD, "attention")
    Q, K, V = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    O, A = attention(Q, K, V)
    assert torch.allclose(O, torch.softmax(Q @ K.mT / 2, dim=-1) @ V, atol=1e-5)  # right, as written
    with pytest.raises(AssertionError) as failed:
        grader.check("attention", attention)
    said = str(failed.value)
    assert (
        "attention calls torch.nn.functional.multi_head_attention_forward, which this exercise rules out"
        in said
    )
    assert "build the head from its moves" in said

    def through_the_module(Q, K, V, mask=None):
        head = torch.nn.MultiheadAttention(Q.shape[-1], 1, bias=False).eval()
        O, A = head(Q.transpose(0, 1), K.transpose(0, 1), V.transpose(0, 1), need_weights=True)
        return O.transpose(0, 1), A

    with pytest.raises(AssertionError) as failed:
        grader.check("attention", through_the_module)
    assert "which this exercise rules out" in str(failed.value)
