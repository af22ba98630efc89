"""Lesson 11 measures what attention costs and computes it block by block.

The reference agrees with plain attention and scaled_dot_product_attention; the watch that
enforces "block by block" sees a full score matrix however it is made and never flags honest
blocks; the lesson computes the numbers its text states; graded through nbgrader, every known
mistake written as a student would write it loses the hidden points and is named, while other
correct ways (FlashAttention-1 style normalising, query tiles, a running logsumexp) get full marks.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import grader
from grader.lessons import l11_cost as ref
from grader.lessons.l11_cost import Rule, note_of, watched
from tests import attacks, wrong_versions
from tests.conftest import DEVICES
from tests.solutions import read_solution
from tests.tensors import draw, tol

LESSON = "11_cost"


# ------------------------------------------------------------------- the reference


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [1, 4, 5, 16, 64])
def test_tiled_attention_matches_plain_attention_and_sdpa(device, dtype, causal, block_size):
    T_q, T_k = (13, 13) if causal else (6, 17)
    Q = draw(2, 3, T_q, 8, seed=1, device=device, dtype=dtype)
    K = draw(2, 3, T_k, 8, seed=2, device=device, dtype=dtype)
    V = draw(2, 3, T_k, 5, seed=3, device=device, dtype=dtype)
    O = ref.tiled_attention(Q, K, V, block_size, causal=causal)
    assert O.shape == (2, 3, T_q, 5) and O.dtype == dtype and O.device.type == device
    torch.testing.assert_close(O, ref.plain_attention(Q, K, V, causal), **tol(dtype))
    torch.testing.assert_close(O, F.scaled_dot_product_attention(Q, K, V, is_causal=causal), **tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_tiled_attention_survives_scores_near_1000(device):
    Q, K = ref._near_1000(draw(2, 6, 4, seed=4, device=device), draw(2, 9, 4, seed=5, device=device))
    V = draw(2, 9, 3, seed=6, device=device)
    S = Q @ K.mT / math.sqrt(Q.shape[-1])
    assert S.min() > 990
    O = ref.tiled_attention(Q, K, V, 3)
    assert torch.isfinite(O).all()
    torch.testing.assert_close(O, F.scaled_dot_product_attention(Q, K, V), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shift", [0.0, 1000.0, -1000.0])
def test_online_softmax_stats_match_the_whole_row(device, shift):
    Z = draw(3, 5, 11, seed=7, device=device, dtype=torch.float64) * 3 + shift
    for block_size in (1, 3, 4, 11, 20):
        m, l = ref.online_softmax_stats(Z, block_size)
        torch.testing.assert_close(m, Z.amax(-1))
        torch.testing.assert_close(m + torch.log(l), torch.logsumexp(Z, -1))
    torch.testing.assert_close(
        torch.exp(Z - m[..., None]) / l[..., None], torch.softmax(Z, -1), rtol=1e-10, atol=1e-12
    )


# ------------------------------------------------------------------- the watch


def _matrix(T_q, T_k, *tensors):
    return [watched(t, Rule("matrix", T_q=T_q, T_k=T_k)) for t in tensors]


def test_the_watch_sees_a_full_score_matrix_however_it_is_made():
    Q, K, V = _matrix(6, 11, torch.randn(2, 6, 4), torch.randn(2, 11, 4), torch.randn(2, 11, 3))
    made = {
        "matmul": lambda: torch.softmax(Q @ K.mT, -1) @ V,
        "einsum": lambda: torch.einsum("bqk,bkd->bqd", torch.einsum("bqd,bkd->bqk", Q, K).softmax(-1), V),
        "one head at a time": lambda: torch.stack(
            [torch.softmax(Q[b] @ K[b].T, -1) @ V[b] for b in range(2)]
        ),
        "transposed": lambda: torch.softmax(K @ Q.mT, -2).mT @ V,
        "computed, then walked in blocks": lambda: sum(
            torch.softmax(Q @ K.mT, -1)[..., j : j + 4] @ V[..., j : j + 4, :] for j in range(0, 11, 4)
        ),
    }
    for how, fn in made.items():
        note = note_of(fn())
        assert note is not None and note[0] == "full", how
    note = note_of(F.scaled_dot_product_attention(Q, K, V))
    assert note is not None and note[0] == "sdpa"


def test_the_watch_lets_blocks_accumulate_in_place_without_a_false_alarm():
    Q, K, V = _matrix(6, 11, torch.randn(2, 6, 4), torch.randn(2, 11, 4), torch.randn(2, 11, 3))
    acc = torch.zeros(2, 6, 3)
    for j in range(0, 11, 4):
        acc += torch.softmax(Q @ K[..., j : j + 4, :].mT, -1) @ V[..., j : j + 4, :]
    assert note_of(acc) is None and note_of(ref.tiled_attention(Q, K, V, 4)) is None
    # a full matrix added in place still marks the accumulator
    acc.add_(torch.softmax(Q @ K.mT, -1) @ V)
    assert note_of(acc)[0] == "full"


def test_the_row_watch_allows_blocks_and_flags_whole_rows():
    Z = watched(torch.randn(3, 10), Rule("row", N=10))
    assert note_of(ref.online_softmax_stats(Z, 4)) is None
    assert note_of(Z.detach().clone()) is None, "the harness's copies are not computation"
    assert note_of(Z.amax(-1))[0] == "row"
    assert note_of(torch.logsumexp(Z.double(), -1))[0] == "row"
    free = watched(torch.randn(3, 10), None)
    assert note_of(free.amax(-1)) is None


def test_the_watch_writes_nothing_and_leaves_results_ordinary_to_compare(capfd):
    Q, K, V = _matrix(6, 11, torch.randn(6, 4), torch.randn(11, 4), torch.randn(11, 3))
    O = ref.tiled_attention(Q, K, V, 4)
    plain = ref._plain(O)
    assert type(plain) is torch.Tensor and torch.equal(plain, O.as_subclass(torch.Tensor))
    assert capfd.readouterr() == ("", "")


# ------------------------------------------------------- the lesson's own numbers


# `name = expression` lines: each expression is read back from the solution notebook once it has run
NOTEBOOK_VALUES = r"""
plain_bytes = {str(k): v for k, v in plain_bytes.items()}
plain_seconds = {str(k): v for k, v in plain_seconds.items()}
layer_gib = layer_bytes / 2**30
walk = walk
m_l = [m_direct, l_direct]
z = z
stats_z = [t.item() for t in online_softmax_stats(z, 4)]
o_blocks = o_blocks
o_direct = o_direct
rows = rows
tiled_bytes = {str(k): v for k, v in tiled_bytes.items()}
speed = speed
slider_warnings = exec('import warnings\nwith warnings.catch_warnings(record=True) as _w:\n    warnings.simplefilter("always")\n    show_block_size(2048)\n_n_warnings = len(_w)') or _n_warnings
"""


@pytest.mark.slow
def test_lesson_computes_the_numbers_it_states(record_property):
    values = read_solution(LESSON, NOTEBOOK_VALUES, record_property)

    # memory, measured: the largest tensor is the T x T matrix, 4x per doubling
    assert values["plain_bytes"] == {str(T): T * T * 4 for T in (256, 512, 1024, 2048)}
    assert all(s > 0 for s in values["plain_seconds"].values())
    assert values["layer_gib"] == 64
    # the online softmax by hand: m 3 -> 5 -> 6, factors exp(-2) and exp(-1), l after block 1 = 1.5853
    walk = values["walk"]
    assert [w[0] for w in walk] == [3.0, 5.0, 6.0]
    assert walk[0][1] == 0.0 and round(walk[1][1], 4) == 0.1353 and round(walk[2][1], 4) == 0.3679
    assert round(walk[0][2], 4) == 1.5853
    z = torch.tensor(values["z"])
    assert values["m_l"][0] == 6.0 == walk[-1][0]
    assert values["m_l"][1] == pytest.approx(walk[-1][2], rel=1e-6)
    assert values["m_l"][1] == pytest.approx(torch.exp(z - 6).sum().item(), rel=1e-6)
    assert values["stats_z"] == pytest.approx(values["m_l"], rel=1e-6)
    # the output rescales too: block by block equals softmax(z) @ V
    assert values["o_blocks"] == pytest.approx(values["o_direct"], abs=1e-5)
    # explore: same numbers as sdpa and plain attention, even with scores near 1000
    for name, causal, d_sdpa, d_plain, top in values["rows"]:
        assert d_sdpa < 1e-3 and d_plain < 1e-3, (name, causal, d_sdpa, d_plain)
        if "1000" in name:
            assert 900 < top < 1100
        else:
            assert d_sdpa < 1e-5
    # tiled memory: T x 128 floats, 2x per doubling
    assert values["tiled_bytes"] == {str(T): T * 128 * 4 for T in (256, 512, 1024, 2048)}
    assert set(values["speed"]) == {
        "plain attention",
        "your tiled attention (blocks of 128)",
        "scaled_dot_product_attention",
    }
    assert values["slider_warnings"] == 0


# --------------------------------------------------- student answers, through nbgrader

STATS = """
def online_softmax_stats(Z, block_size):
    m = torch.full(Z.shape[:-1], {start=float("-inf")}, dtype=Z.dtype, device=Z.device)
    l = torch.zeros(Z.shape[:-1], dtype=Z.dtype, device=Z.device)
    for start in range(0, {stop=Z.shape[-1]}, block_size):
        block = Z[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1))
        l = {update=l * torch.exp(m - m_new) + torch.exp(block - m_new[..., None]).sum(dim=-1)}
        m = m_new
    return m, l
"""


stats_answer = wrong_versions.answer_maker(STATS)


STATS_WHOLE_ROW = """
def online_softmax_stats(Z, block_size):
    m = Z.amax(dim=-1)
    return m, torch.exp(Z - m[..., None]).sum(dim=-1)
"""

TILED = """
def tiled_attention(Q, K, V, block_size, causal=False):
    T_q, T_k = Q.shape[-2], K.shape[-2]
    m = torch.full((*Q.shape[:-1], 1), float("-inf"), dtype=Q.dtype, device=Q.device)
    l = torch.zeros((*Q.shape[:-1], 1), dtype=Q.dtype, device=Q.device)
    acc = torch.zeros((*Q.shape[:-1], V.shape[-1]), dtype=Q.dtype, device=Q.device)
    rows = torch.arange(T_q, device=Q.device)[:, None]
    for start in range(0, {stop=T_k}, block_size):
        K_b = K[..., start:start + block_size, :]
        V_b = V[..., start:start + block_size, :]
        S_b = Q @ K_b.transpose(-2, -1) / {scale=math.sqrt(Q.shape[-1])}
        if causal:
            cols = torch.arange({first=start}, {first} + K_b.shape[-2], device=Q.device)[None, :]
            S_b = S_b.masked_fill(cols > rows, float("-inf"))
        m_new = torch.maximum(m, S_b.amax(dim=-1, keepdim=True))
        factor = {factor=torch.exp(m - m_new)}
        P = {P=torch.exp(S_b - m_new)}
        l = l * factor + P.sum(dim=-1, keepdim=True)
        acc = acc * factor + P @ V_b
        {inside=pass}
        m = m_new
    return {result=acc / l}
"""


tiled_answer = wrong_versions.answer_maker(TILED)


TILED_FULL = """
def tiled_attention(Q, K, V, block_size, causal=False):
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if causal:
        T_q, T_k = S.shape[-2:]
        S = S.masked_fill(~torch.ones(T_q, T_k, dtype=torch.bool, device=S.device).tril(), float("-inf"))
    return torch.softmax(S, dim=-1) @ V
"""

TILED_SDPA = """
def tiled_attention(Q, K, V, block_size, causal=False):
    return F.scaled_dot_product_attention(Q, K, V, is_causal=causal)
"""

# right whenever a row has a score above 0: only rows whose scores are all far below 0 show it
TILED_MAX_FROM_ZERO = tiled_answer().replace('float("-inf"), dtype=Q.dtype', "0.0, dtype=Q.dtype")
assert TILED_MAX_FROM_ZERO != tiled_answer()

STATS_CELL, TILED_CELL = "ex11_online_softmax_stats", "ex11_tiled_attention"

# {student: [(answer, diagnosis), ...]}: one wrong version of each function
WRONG_SUBMISSIONS = wrong_versions.wrong_submissions(
    LESSON,
    {
        "no_rescale": [
            (
                stats_answer(update="l + torch.exp(block - m_new[..., None]).sum(dim=-1)"),
                "the running sum is not rescaled when the max changes",
            ),
            (tiled_answer(factor="1.0"), "the running sum and output are not rescaled when the max changes"),
        ],
        "no_max": [
            (
                stats_answer(update="l + torch.exp(block).sum(dim=-1)"),
                "the running max is not subtracted (overflow)",
            ),
            (tiled_answer(factor="1.0", P="torch.exp(S_b)"), "the running max is not subtracted (overflow)"),
        ],
        "upside_down_divided_inside": [
            (
                stats_answer(
                    update="l * torch.exp(m_new - m) + torch.exp(block - m_new[..., None]).sum(dim=-1)"
                ),
                "the rescale factor is upside down",
            ),
            (
                tiled_answer(inside="acc = acc / l", result="acc"),
                "the output was divided by the sum inside the loop",
            ),
        ],
        "max_from_zero_local_mask": [
            (stats_answer(start="0.0"), "the running max started at 0 instead of -inf"),
            (tiled_answer(first="0"), "the causal mask uses positions inside the block"),
        ],
        "last_block_dropped": [
            (
                stats_answer(stop="Z.shape[-1] // block_size * block_size"),
                "the last partial block is dropped",
            ),
            (tiled_answer(stop="T_k // block_size * block_size"), "the last partial block is dropped"),
        ],
        "whole_rows_full_matrix": [
            (STATS_WHOLE_ROW, "the whole row was read at once"),
            (TILED_FULL, "the full score matrix was formed"),
        ],
        "unscaled": [
            (tiled_answer(scale="1"), "the scores are not scaled"),
        ],
        "sdpa": [
            (TILED_SDPA, "scaled_dot_product_attention was called"),
        ],
        "tiled_max_from_zero": [
            (TILED_MAX_FROM_ZERO, "the running max started at 0 instead of -inf"),
        ],
    },
)


def test_every_known_mistake_has_a_student_answer_here():
    named = {(cell, d) for checks in WRONG_SUBMISSIONS.values() for cell, _, d in checks.values()}
    from grader.registry import exercises

    for name in ("online_softmax_stats", "tiled_attention"):
        for trap in exercises()[name].traps:
            assert (f"ex11_{name}", trap.name) in named, (
                f"no submission exercises the {name} trap {trap.name!r}"
            )


@pytest.mark.parametrize(
    "name, source, diagnosis",
    [
        (cell.removeprefix("ex11_"), answer, diagnosis)
        for checks in WRONG_SUBMISSIONS.values()
        for cell, answer, diagnosis in checks.values()
    ],
)
def test_student_answers_are_named_in_process(name, source, diagnosis):
    wrong_versions.assert_named_in_process(name, wrong_versions.answer_function(source, name), diagnosis)


FLASH_1 = """
def tiled_attention(Q, K, V, block_size, causal=False):
    # FlashAttention-1 style: keep O normalised after every block
    O = torch.zeros(*Q.shape[:-1], V.shape[-1], dtype=Q.dtype, device=Q.device)
    m = torch.full((*Q.shape[:-1], 1), -math.inf, dtype=Q.dtype, device=Q.device)
    l = torch.zeros_like(m)
    q_pos = torch.arange(Q.shape[-2], device=Q.device)
    k_pos = torch.arange(K.shape[-2], device=Q.device)
    for K_b, V_b, j in zip(K.split(block_size, -2), V.split(block_size, -2), k_pos.split(block_size)):
        S = torch.einsum("...qd,...kd->...qk", Q, K_b) * Q.shape[-1] ** -0.5
        if causal:
            S = torch.where(j[None, :] <= q_pos[:, None], S, -math.inf)
        m_new = torch.maximum(m, S.max(dim=-1, keepdim=True).values)
        P = (S - m_new).exp()
        l_new = l * (m - m_new).exp() + P.sum(-1, keepdim=True)
        O = (O * l * (m - m_new).exp() + P @ V_b) / l_new
        m, l = m_new, l_new
    return O
"""

QUERY_TILES = """
def tiled_attention(Q, K, V, block_size, causal=False):
    # tiles of queries too, as FlashAttention does
    out = []
    for qs in range(0, Q.shape[-2], block_size):
        Q_t = Q[..., qs:qs + block_size, :]
        m = l = acc = None
        for ks in range(0, K.shape[-2], block_size):
            S = Q_t @ K[..., ks:ks + block_size, :].mT / math.sqrt(Q.shape[-1])
            if causal:
                r = torch.arange(qs, qs + Q_t.shape[-2], device=Q.device)[:, None]
                c = torch.arange(ks, ks + S.shape[-1], device=Q.device)[None, :]
                S = S.masked_fill(c > r, float("-inf"))
            top = S.amax(-1, keepdim=True)
            m_new = top if m is None else torch.maximum(m, top)
            P = torch.exp(S - m_new)
            if m is None:
                l, acc = P.sum(-1, keepdim=True), P @ V[..., ks:ks + block_size, :]
            else:
                a = torch.exp(m - m_new)
                l, acc = l * a + P.sum(-1, keepdim=True), acc * a + P @ V[..., ks:ks + block_size, :]
            m = m_new
        out.append(acc / l)
    return torch.cat(out, dim=-2)
"""

RUNNING_LOGSUMEXP = """
def online_softmax_stats(Z, block_size):
    lse = m = None
    for block in Z.split(block_size, dim=-1):
        block_lse, block_max = torch.logsumexp(block, dim=-1), block.amax(dim=-1)
        lse = block_lse if lse is None else torch.logaddexp(lse, block_lse)
        m = block_max if m is None else torch.maximum(m, block_max)
    return m, torch.exp(lse - m)
"""

RIGHT_SUBMISSIONS = {
    "flash1_logsumexp": {TILED_CELL: FLASH_1, STATS_CELL: RUNNING_LOGSUMEXP},
    "query_tiles": {TILED_CELL: QUERY_TILES},
}
(
    test_wrong_versions_lose_hidden_points_and_are_named,
    test_correct_but_different_versions_get_full_marks,
) = wrong_versions.submission_tests(LESSON, WRONG_SUBMISSIONS, RIGHT_SUBMISSIONS, right_with_solutions=True)


@pytest.mark.parametrize(
    "name, source",
    [
        ("tiled_attention", FLASH_1),
        ("tiled_attention", QUERY_TILES),
        ("online_softmax_stats", RUNNING_LOGSUMEXP),
    ],
)
def test_other_correct_ways_pass_in_process(name, source):
    grader.check(name, wrong_versions.answer_function(source, name))


# ------------------------------------------------- the watch cannot be left behind


def _whole_rows(first_lines: str, indent: str = "    ") -> str:
    """online_softmax_stats that reads whole rows of Z after ``first_lines`` made a copy of it."""
    return (
        "\ndef online_softmax_stats(Z, block_size):\n"
        + first_lines
        + f"{indent}m = Z.amax(dim=-1)\n{indent}return m, torch.exp(Z - m[..., None]).sum(dim=-1)\n"
    )


def _plain_copies(body: str) -> str:
    """tiled_attention that turns its watched inputs into plain tensors, then runs ``body``."""
    return (
        "\ndef tiled_attention(Q, K, V, block_size, causal=False):\n"
        "    with torch._C.DisableTorchFunctionSubclass():\n"
        "        Q, K, V = (t.as_subclass(torch.Tensor) for t in (Q, K, V))\n" + body
    )


FULL_MATRIX = """    S = (Q @ K.mT).double() / math.sqrt(Q.shape[-1])
    if causal:
        S = S.masked_fill(~torch.ones(S.shape[-2:], dtype=torch.bool, device=S.device).tril(), float("-inf"))
    return (torch.softmax(S, dim=-1) @ V.double()).to(Q.dtype)
"""

LAUNDERED = {
    "a numpy round trip": (
        "online_softmax_stats",
        _whole_rows("    Z = torch.from_numpy(Z.detach().cpu().numpy()).to(Z.device)\n"),
        "took a tensor of shape (10,) out of torch at once",
    ),
    "tolist": (
        "online_softmax_stats",
        _whole_rows("    Z = torch.tensor(Z.tolist(), dtype=Z.dtype, device=Z.device)\n"),
        "`tolist` took a tensor",
    ),
    "whole rows of a plain copy": (
        "online_softmax_stats",
        _whole_rows(
            "    with torch._C.DisableTorchFunctionSubclass():\n        Z = Z.as_subclass(torch.Tensor)\n"
        ),
        "Diagnosis: the whole row was read at once",
    ),
    "no torch function watching at all": (
        "online_softmax_stats",
        _whole_rows(
            "    with torch._C.DisableTorchFunction():\n        Z = Z.as_subclass(torch.Tensor)\n",
            indent="        ",
        ),
        "without the watch seeing its inputs being read",
    ),
    "a full matrix of plain copies": (
        "tiled_attention",
        _plain_copies(FULL_MATRIX),
        "Diagnosis: the full score matrix was formed",
    ),
    "sdpa on plain copies": (
        "tiled_attention",
        _plain_copies("    return F.scaled_dot_product_attention(Q, K, V, is_causal=causal)\n"),
        "Diagnosis: scaled_dot_product_attention was called",
    ),
}


def _fails_saying(name: str, source: str, words: str) -> None:
    with pytest.raises(AssertionError) as failed:
        grader.check(name, wrong_versions.answer_function(source, name))
    assert words in str(failed.value), str(failed.value)


@pytest.mark.parametrize("how", list(LAUNDERED))
def test_turning_the_watched_inputs_into_plain_data_fails_the_hidden_check(how):
    _fails_saying(*LAUNDERED[how])


def _tiled(prologue: str, scale: str, result: str) -> str:
    """The lesson's tiled_attention loop, after ``prologue``, with ``scale`` on each block's scores."""
    return (
        "\ndef tiled_attention(Q, K, V, block_size, causal=False):\n"
        + prologue
        + """    m = torch.full((*Q.shape[:-1], 1), float("-inf"), dtype=Q.dtype, device=Q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros((*Q.shape[:-1], V.shape[-1]), dtype=Q.dtype, device=Q.device)
    rows = torch.arange(Q.shape[-2], device=Q.device)[:, None]
    for start in range(0, K.shape[-2], block_size):
        K_b, V_b = K[..., start:start + block_size, :], V[..., start:start + block_size, :]
        S_b = Q @ K_b.mT"""
        + scale
        + """
        if causal:
            cols = torch.arange(start, start + K_b.shape[-2], device=Q.device)[None, :]
            S_b = S_b.masked_fill(cols > rows, float("-inf"))
        m_new = torch.maximum(m, S_b.amax(dim=-1, keepdim=True))
        factor, P = torch.exp(m - m_new), torch.exp(S_b - m_new)
        l, acc, m = l * factor + P.sum(dim=-1, keepdim=True), acc * factor + P @ V_b, m_new
"""
        + f"    return {result}\n"
    )


TILED_F64 = _tiled(
    "    dtype = Q.dtype\n    Q, K, V = Q.double(), K.double(), V.double()\n",
    " / math.sqrt(Q.shape[-1])",
    "(acc / l).to(dtype)",
)

STATS_F64 = """
def online_softmax_stats(Z, block_size):
    dtype, Z = Z.dtype, Z.double()
    m = torch.full(Z.shape[:-1], float("-inf"), dtype=Z.dtype, device=Z.device)
    l = torch.zeros_like(m)
    for block in Z.split(block_size, dim=-1):
        m_new = torch.maximum(m, block.amax(dim=-1))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new[..., None]).sum(dim=-1)
        m = m_new
    return m.to(dtype), l.to(dtype)
"""

SCALED_FIRST = _tiled(
    "    # scale the queries once, then blocks of keys as in the lesson (float32 rounds differently)\n"
    "    Q = Q / math.sqrt(Q.shape[-1])\n",
    "",
    "acc / l",
)

BLOCK_TOLIST = """
def online_softmax_stats(Z, block_size):
    # each block read into Python numbers, one at a time, then back into torch
    rows = Z.reshape(-1, Z.shape[-1])
    ms, ls = [], []
    for row in rows:
        m, l = float("-inf"), 0.0
        for start in range(0, Z.shape[-1], block_size):
            block = row[start:start + block_size].tolist()
            m_new = max(m, max(block))
            l = l * math.exp(m - m_new) + sum(math.exp(z - m_new) for z in block)
            m = m_new
        ms.append(m)
        ls.append(l)
    shape = Z.shape[:-1]
    m_t = torch.tensor(ms, dtype=Z.dtype, device=Z.device).reshape(shape)
    return m_t, torch.tensor(ls, dtype=Z.dtype, device=Z.device).reshape(shape)
"""


@pytest.mark.parametrize(
    "name, source",
    [
        ("tiled_attention", TILED_F64),
        ("tiled_attention", SCALED_FIRST),
        ("online_softmax_stats", STATS_F64),
        ("online_softmax_stats", BLOCK_TOLIST),
    ],
    ids=["tiled float64 inside", "tiled queries scaled first", "stats float64 inside", "stats block tolist"],
)
def test_float64_inside_and_other_roundings_pass(name, source):
    grader.check(name, wrong_versions.answer_function(source, name))


# ------------------------------------------------- every score far below 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_attention_survives_scores_near_minus_1000_and_a_max_from_0_does_not(device, causal):
    Q, K = ref._near_1000(
        draw(2, 9, 4, seed=8, device=device), draw(2, 9, 4, seed=9, device=device), shift=-1000.0
    )
    V = draw(2, 9, 3, seed=10, device=device)
    S = Q @ K.mT / math.sqrt(Q.shape[-1])
    assert S.max() < -990
    want = F.scaled_dot_product_attention(Q.double(), K.double(), V.double(), is_causal=causal).float()
    torch.testing.assert_close(ref.tiled_attention(Q, K, V, 4, causal=causal), want, rtol=1e-4, atol=1e-4)
    from_zero = wrong_versions.answer_function(TILED_MAX_FROM_ZERO, "tiled_attention")
    assert torch.isnan(from_zero(Q, K, V, 4, causal=causal)).all()  # exp(-1000 - 0) = 0 everywhere: 0 / 0


def test_the_watch_passes_the_reference_on_the_cases_near_minus_1000():
    cases = [c for c in ref.TILED_ATTENTION.cases(torch.device("cpu")) if "near -1000" in c.label]
    assert len(cases) == 2
    for case in cases:
        Q, K, V, block_size = case.args
        assert block_size < K.shape[-2]  # the watch is on: a full score matrix would be flagged
        O = ref.tiled_attention(*case.args, **case.kwargs)
        assert note_of(O) is None, case.label
        assert torch.isfinite(ref._plain(O)).all(), case.label


# ------------------------------------------- routes around a watch of torch functions alone

HIDDEN_ROUTES = {
    "a fused kernel under a private name": (
        "tiled_attention",
        attacks.L11_FUSED_TILED,
        "_scaled_dot_product_flash_attention_for_cpu",
    ),
    "whole rows in TorchScript": ("online_softmax_stats", attacks.L11_SCRIPTED_STATS, "whole rows of N = 10"),
    "torch functions switched off by a built name": (
        "tiled_attention",
        attacks.L11_QUIET_TILED,
        "switched torch functions off (torch._C.DisableTorchFunction)",
    ),
    "all but one entry at once": (
        "online_softmax_stats",
        attacks.L11_TWO_CHUNKS,
        "9 entries of a row at once, more than block_size = 4",
    ),
    "tiles of queries against all the keys": (
        "tiled_attention",
        attacks.L11_QUERY_TILES_ONLY,
        "scores of 11 keys at once, more than block_size = 4",
    ),
    "an operator of its own": (
        "tiled_attention",
        attacks.L11_CUSTOM_OP.replace("OPNAME", "course_test::blend"),
        "an operator of its own whose work the watch cannot see",
    ),
    "its own watch told there is no rule": (
        "tiled_attention",
        attacks.L11_GRAB_WATCH,
        "it changed the watch that checks the rule while it ran",
    ),
    "its own watch told it was given no rule": (
        "tiled_attention",
        attacks.L11_FORGED_WATCH,
        "it changed the watch that checks the rule while it ran",
    ),
    "its own watch's note of a fused kernel taken back": (
        "tiled_attention",
        attacks.L11_NOTE_TAKEN_BACK,
        "it changed the watch that checks the rule while it ran",
    ),
}


@pytest.mark.parametrize("how", list(HIDDEN_ROUTES))
def test_work_hidden_from_torch_functions_is_seen_at_the_dispatcher(how):
    """Each of these earned 12/12: the watch saw torch functions only. It now sees every aten operation."""
    _fails_saying(*HIDDEN_ROUTES[how])


def test_scores_of_more_keys_than_a_block_fail_and_blocks_of_other_sizes_the_case_holds_do_not():
    from attention_course.watch import CallWatch

    rule = Rule("matrix", T_q=7, T_k=16, block=4, free=(5, 6))
    Q, K, V = (
        watched(torch.randn(7, 5), rule),
        watched(torch.randn(16, 5), rule),
        watched(torch.randn(16, 6), rule),
    )
    for work, kind in (
        (lambda: Q @ K[:15].mT, "wide"),
        (lambda: Q[:1] @ K.mT, "wide"),  # one query against every key
        (lambda: torch.softmax(Q @ K[:4].mT, -1) @ V[:4], None),
        (lambda: K * 2.0 + K.mT.mT, None),  # the keys alone, whole: no scores
    ):
        with CallWatch((), ((Q, K, V, 4), {})) as seen:
            value = work()
        assert (seen.verdict(value) or (None,))[0] == kind, (kind, seen.verdict(value))


def test_blocks_taken_out_of_torch_are_flagged_for_review_not_failed():
    """numpy or Python numbers on blocks can be an honest online softmax (BLOCK_TOLIST) or blocks glued
    back into whole rows (L11_NUMPY_GLUE): the watch cannot tell, so both pass and both are left for a
    person to read; work that never went through torch at all fails."""
    from attention_course.watch import CallWatch

    for source in (BLOCK_TOLIST, attacks.L11_NUMPY_GLUE):
        fn = wrong_versions.answer_function(source, "online_softmax_stats")
        Z = watched(torch.randn(3, 10), Rule("row", N=10, block=4, free=(3,)))
        with CallWatch((), ((Z, 4), {})) as seen:
            value = fn(Z, 4)
        assert seen.verdict(value) is None and "cannot tell whether" in seen.review
        grader.check("online_softmax_stats", fn)
    Z = watched(torch.randn(3, 10), Rule("row", N=10, block=4, free=(3,)))
    with CallWatch((), ((Z, 4), {})) as seen:
        Z[..., :1] * 1
        value = (torch.zeros(3), torch.ones(3))
    assert seen.verdict(value)[0] == "unseen"


@pytest.mark.parametrize(
    "source",
    [
        attacks.L11_THREAD_LAUNDERED,
        attacks.L11_DISPATCH_OFF_LAUNDERED,
        attacks.L11_NUMPY_BUFFER,
        attacks.L11_THREAD_INTO_MADE,
        attacks.L11_THREAD_NUMPY_INTO_MADE,
    ],
    ids=[
        "another thread",
        "the dispatcher's watch off",
        "numpy written into a tensor made in torch",
        "another thread writing into a tensor made in the call",
        "another thread writing into it through numpy",
    ],
)
def test_work_hidden_from_both_watches_then_mixed_with_the_inputs_is_flagged_for_review(source):
    """Whole rows computed where neither watch looks, then made to read as computed from the inputs by one
    seen operation: the watch saw a tensor it never saw made meet the inputs, and leaves it to a person."""
    from attention_course.watch import CallWatch

    fn = wrong_versions.answer_function(source, "online_softmax_stats")
    Z = watched(torch.randn(3, 10), Rule("row", N=10, block=4, free=(3,)))
    with CallWatch((), ((Z, 4), {})) as seen:
        value = fn(Z, 4)
    assert seen.verdict(value) is None, seen.verdict(value)
    assert seen.review.startswith(
        "combined values of its inputs (`add`) with a tensor of shape (3,) made where"
    ), seen.review


def test_a_result_written_by_another_thread_after_the_watch_saw_it_is_flagged_for_review():
    """Whole rows computed on another thread and written into the tensors the call returns, which the
    watch last saw computed from a block of the inputs: it passed unflagged. The tensors' bytes changed
    where the watch did not look, and a person reads it."""
    from attention_course.watch import CallWatch

    fn = wrong_versions.answer_function(attacks.L11_THREAD_INTO_HELD, "online_softmax_stats")
    Z = watched(torch.randn(3, 10), Rule("row", N=10, block=4, free=(3,)))
    with CallWatch((), ((Z, 4), {})) as seen:
        value = fn(Z, 4)
    assert seen.verdict(value) is None, seen.verdict(value)
    assert (
        seen.review
        == "returned a tensor of shape (3,) written where the watch could not see it (another thread)"
    )


# honest answers that write in place: into their running statistics, a preallocated output, out=
IN_PLACE_STATS = """
def online_softmax_stats(Z, block_size):
    m = torch.full(Z.shape[:-1], float("-inf"), dtype=Z.dtype, device=Z.device)
    l = torch.zeros_like(m)
    for s in range(0, Z.shape[-1], block_size):
        b = Z[..., s:s + block_size]
        m_new = torch.maximum(m, b.amax(-1))
        l *= torch.exp(m - m_new)
        l += torch.exp(b - m_new[..., None]).sum(-1)
        torch.maximum(m, m_new, out=m)
    return m, l
"""
IN_PLACE_TILED = """
def tiled_attention(Q, K, V, block_size, causal=False):
    out = torch.empty((*Q.shape[:-1], V.shape[-1]), dtype=Q.dtype, device=Q.device)
    rows = torch.arange(Q.shape[-2], device=Q.device)[:, None]
    m = torch.full((*Q.shape[:-1], 1), float("-inf"), dtype=Q.dtype, device=Q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros_like(out)
    for s in range(0, K.shape[-2], block_size):
        S = Q @ K[..., s:s + block_size, :].mT / math.sqrt(Q.shape[-1])
        if causal:
            S.masked_fill_(torch.arange(s, s + S.shape[-1], device=Q.device) > rows, float("-inf"))
        m_new = torch.maximum(m, S.amax(-1, keepdim=True))
        f = torch.exp(m - m_new).nan_to_num_(0.0)
        P = torch.exp(S - m_new).nan_to_num_(0.0)
        l.mul_(f).add_(P.sum(-1, keepdim=True))
        acc *= f
        acc += P @ V[..., s:s + block_size, :]
        m.copy_(m_new)
    out[...] = acc / l
    return out
"""


# honest answers the watch once misread: rows flattened to (batch, N); a block's factor computed by
# Tensor.apply_ (written in C++, not by an aten operation); each block's step in TorchScript, whose
# operations reach the dispatcher with the watch's own bookkeeping still watched
FLAT_STATS = """
def online_softmax_stats(Z, block_size):
    Zf = Z.reshape(-1, Z.shape[-1])
    m = torch.full(Zf.shape[:-1], float("-inf"), dtype=Z.dtype, device=Z.device)
    l = torch.zeros_like(m)
    for s in range(0, Z.shape[-1], block_size):
        b = Zf[:, s:s + block_size]
        m_new = torch.maximum(m, b.amax(-1))
        l = l * (m - m_new).apply_(math.exp) + torch.exp(b - m_new[:, None]).sum(-1)
        m = m_new
    return m.reshape(Z.shape[:-1]), l.reshape(Z.shape[:-1])
"""
SCRIPTED_STEP_TILED = '''
_cu = torch.jit.CompilationUnit("""
def step(m, l, acc, S, v):
    m_new = torch.maximum(m, S.amax(-1, keepdim=True))
    f = torch.exp(m - m_new).nan_to_num(0.0)
    P = torch.exp(S - m_new).nan_to_num(0.0)
    return m_new, l * f + P.sum(-1, keepdim=True), acc * f + P @ v
""")


def tiled_attention(Q, K, V, block_size, causal=False):
    m = torch.full((*Q.shape[:-1], 1), float("-inf"), dtype=Q.dtype, device=Q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros((*Q.shape[:-1], V.shape[-1]), dtype=Q.dtype, device=Q.device)
    rows = torch.arange(Q.shape[-2], device=Q.device)[:, None]
    for s in range(0, K.shape[-2], block_size):
        S = Q @ K[..., s:s + block_size, :].mT / math.sqrt(Q.shape[-1])
        if causal:
            S = S.masked_fill(torch.arange(s, s + S.shape[-1], device=Q.device) > rows, float("-inf"))
        m, l, acc = _cu.step(m, l, acc, S, V[..., s:s + block_size, :])
    return acc / l
'''


@pytest.mark.parametrize(
    "name, source",
    [
        ("online_softmax_stats", IN_PLACE_STATS),
        ("tiled_attention", IN_PLACE_TILED),
        ("online_softmax_stats", FLAT_STATS),
        ("tiled_attention", SCRIPTED_STEP_TILED),
    ],
    ids=["stats in place", "tiled in place", "stats on flattened rows, apply_", "tiled, a TorchScript step"],
)
def test_honest_answers_that_write_in_place_pass_with_nothing_to_review(name, source):
    """Writes in place bump a tensor's version above the dispatcher, after the watch saw the operation:
    they were taken for writes from another thread and flagged. The watch now compares the bytes it
    saw written with those there, and every hidden case passes clean."""
    from attention_course.watch import CallWatch
    from grader.lessons.l11_cost import _stats_cases, _tiled_cases

    fn = wrong_versions.answer_function(source, name)
    cases = (_stats_cases if name == "online_softmax_stats" else _tiled_cases)(torch.device("cpu"))
    for case in cases:
        with CallWatch((), (case.args, case.kwargs)) as seen:
            value = fn(*case.args, **case.kwargs)
        assert (seen.verdict(value), seen.review) == (None, None), case.label
    grader.check(name, fn)


# honest answers once failed by their shapes alone: the running max stacked with a block's max, or put
# beside a block's entries or scores (a size of block_size + 1); a block taken by an index tensor or index_select
STACKED_MAX_STATS = """
def online_softmax_stats(Z, block_size):
    m = torch.full(Z.shape[:-1], float("-inf"), dtype=Z.dtype, device=Z.device)
    l = torch.zeros(Z.shape[:-1], dtype=Z.dtype, device=Z.device)
    for s in range(0, Z.shape[-1], block_size):
        b = Z[..., s:s + block_size]
        mn = torch.stack([m, b.amax(-1)]).amax(0)
        l = l * torch.exp(m - mn) + torch.exp(b - mn[..., None]).sum(-1)
        m = mn
    return m, l
"""
MAX_BESIDE_BLOCK_STATS = STACKED_MAX_STATS.replace(
    "torch.stack([m, b.amax(-1)]).amax(0)", "torch.cat([m.unsqueeze(-1), b], dim=-1).amax(dim=-1)"
)
MAX_BESIDE_SCORES_TILED = """
def tiled_attention(Q, K, V, block_size, causal=False):
    T_q, T_k = Q.shape[-2], K.shape[-2]
    m = torch.full((*Q.shape[:-1], 1), float("-inf"), dtype=Q.dtype, device=Q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros((*Q.shape[:-1], V.shape[-1]), dtype=Q.dtype, device=Q.device)
    rows = torch.arange(T_q, device=Q.device)[:, None]
    for s in range(0, T_k, block_size):
        Kb, Vb = K[..., s:s + block_size, :], V[..., s:s + block_size, :]
        S = Q @ Kb.transpose(-2, -1) / math.sqrt(Q.shape[-1])
        if causal:
            S = S.masked_fill(torch.arange(s, s + Kb.shape[-2], device=Q.device)[None, :] > rows, float("-inf"))
        mn = torch.cat([m, S], dim=-1).amax(dim=-1, keepdim=True)
        a = torch.exp(m - mn)
        P = torch.exp(S - mn)
        l = a * l + P.sum(-1, keepdim=True)
        acc = a * acc + P @ Vb
        m = mn
    return acc / l
"""
INDEXED_BLOCKS_STATS = """
def online_softmax_stats(Z, block_size):
    N = Z.shape[-1]
    m = torch.full(Z.shape[:-1], float("-inf"), dtype=Z.dtype, device=Z.device)
    l = torch.zeros(Z.shape[:-1], dtype=Z.dtype, device=Z.device)
    for s in range(0, N, block_size):
        idx = torch.arange(s, min(s + block_size, N), device=Z.device)
        b = Z[..., idx]
        mn = torch.maximum(m, b.amax(-1))
        l = l * torch.exp(m - mn) + torch.exp(b - mn[..., None]).sum(-1)
        m = mn
    return m, l
"""
INDEX_SELECT_STATS = INDEXED_BLOCKS_STATS.replace("Z[..., idx]", "Z.index_select(-1, idx)")


@pytest.mark.parametrize(
    "name, source",
    [
        ("online_softmax_stats", STACKED_MAX_STATS),
        ("online_softmax_stats", MAX_BESIDE_BLOCK_STATS),
        ("tiled_attention", MAX_BESIDE_SCORES_TILED),
        ("online_softmax_stats", INDEXED_BLOCKS_STATS),
        ("online_softmax_stats", INDEX_SELECT_STATS),
    ],
    ids=[
        "running max stacked",
        "running max beside a block",
        "running max beside scores",
        "index",
        "index_select",
    ],
)
def test_a_running_statistic_beside_a_block_and_indexed_blocks_pass(name, source):
    """Right answers that respect the rule as the lesson states it: every hidden case passes."""
    grader.check(name, wrong_versions.answer_function(source, name))
