"""The hidden reference agrees with independent implementations and with the brief."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attention_course import data
from grader.registry import references
from tests.conftest import DEVICES
from tests.tensors import BRIEF_COLOURS, DTYPES, draw, tol

ref = references()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_attention_matches_sdpa_without_mask_with_cross_shapes(device, dtype, batch):
    Q = draw(*batch, 5, 3, seed=1, device=device, dtype=dtype)
    K = draw(*batch, 7, 3, seed=2, device=device, dtype=dtype)
    V = draw(*batch, 7, 4, seed=3, device=device, dtype=dtype)
    O, A = ref.attention(Q, K, V)
    assert O.shape == (*batch, 5, 4) and A.shape == (*batch, 5, 7)
    assert O.device.type == device and O.dtype == dtype
    torch.testing.assert_close(O, F.scaled_dot_product_attention(Q, K, V), **tol(dtype, float32_atol=1e-6))
    torch.testing.assert_close(
        A.sum(-1), torch.ones(*batch, 5, dtype=dtype, device=device), **tol(dtype, float32_atol=1e-6)
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_matches_sdpa_causal_and_boolean_masks(device, dtype):
    Q, K, V = (draw(2, 3, 6, d, seed=s, device=device, dtype=dtype) for s, d in ((4, 5), (5, 5), (6, 2)))
    causal = ref.causal_mask(6, device)
    O, _ = ref.attention(Q, K, V, causal)
    torch.testing.assert_close(
        O, F.scaled_dot_product_attention(Q, K, V, is_causal=True), **tol(dtype, float32_atol=1e-6)
    )
    torch.testing.assert_close(
        O, F.scaled_dot_product_attention(Q, K, V, attn_mask=causal), **tol(dtype, float32_atol=1e-6)
    )
    pad = ref.padding_mask(torch.tensor([6, 2], device=device), 6)[:, None]  # (B, 1, 1, T)
    O, A = ref.attention(Q, K, V, pad)
    torch.testing.assert_close(
        O, F.scaled_dot_product_attention(Q, K, V, attn_mask=pad), **tol(dtype, float32_atol=1e-6)
    )
    assert (A[1, ..., 2:] == 0).all(), "padding gets exactly zero weight"


@pytest.mark.parametrize("device", DEVICES)
def test_self_and_cross_attention_match_sdpa(device):
    X = draw(2, 5, 6, seed=7, device=device, dtype=torch.float64)
    X_enc = draw(2, 4, 6, seed=8, device=device, dtype=torch.float64)
    W_q, W_k, W_v = (draw(6, d, seed=9 + d, device=device, dtype=torch.float64) for d in (3, 3, 2))
    want = F.scaled_dot_product_attention(X @ W_q, X @ W_k, X @ W_v, is_causal=True)
    torch.testing.assert_close(ref.self_attention(X, W_q, W_k, W_v), want)
    want = F.scaled_dot_product_attention(X @ W_q, X @ W_k, X @ W_v)
    torch.testing.assert_close(ref.self_attention(X, W_q, W_k, W_v, causal=False), want)
    want = F.scaled_dot_product_attention(X @ W_q, X_enc @ W_k, X_enc @ W_v)
    out = ref.cross_attention(X, X_enc, W_q, W_k, W_v)
    assert out.shape == (2, 5, 2)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_matches_torch_and_survives_overflow_and_dead_rows(device, dtype):
    Z = draw(2, 3, 5, 7, seed=11, device=device, dtype=dtype)
    torch.testing.assert_close(ref.softmax(Z), torch.softmax(Z, -1), **tol(dtype, float32_atol=1e-6))
    torch.testing.assert_close(ref.softmax(Z, dim=-2), torch.softmax(Z, -2), **tol(dtype, float32_atol=1e-6))
    big = Z + 1000
    assert torch.isfinite(ref.softmax(big)).all()
    torch.testing.assert_close(ref.softmax(big), torch.softmax(big, -1), **tol(dtype, float32_atol=1e-6))
    dead = Z.clone()
    dead[0, 0, 2] = float("-inf")
    out = ref.softmax(dead)
    assert (out[0, 0, 2] == 0).all() and not torch.isnan(out).any()


def test_masks():
    assert ref.causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert ref.causal_mask(2, "meta").device.type == "meta"
    pad = ref.padding_mask(torch.tensor([2, 0, 3]), 3)
    assert pad.shape == (3, 1, 3) and pad.dtype == torch.bool
    assert pad[:, 0].tolist() == [[True, True, False], [False, False, False], [True, True, True]]
    S = torch.zeros(2, 2)
    assert ref.apply_mask(S, ref.causal_mask(2)).tolist() == [[0.0, float("-inf")], [0.0, 0.0]]


def test_love_cats_numbers_from_the_brief():
    ex = data.love_cats()
    Q, K, V = ref.project(ex.X, ex.W_q, ex.W_k, ex.W_v)
    assert Q.tolist() == [[1, 0, 2], [2, 2, 2], [2, 1, 3]]
    assert K.tolist() == [[0, 1, 1], [4, 4, 0], [2, 3, 1]]
    assert V.tolist() == [[1, 2, 3], [2, 8, 0], [2, 6, 3]]
    assert ref.scores(Q, K).tolist() == [[2, 4, 4], [4, 16, 12], [4, 12, 10]]
    scaled = ref.scaled_scores(Q, K)
    torch.testing.assert_close(
        scaled.round(decimals=2), torch.tensor([[1.15, 2.31, 2.31], [2.31, 9.24, 6.93], [2.31, 6.93, 5.77]])
    )
    O, A = ref.attention(Q, K, V)
    torch.testing.assert_close(
        A.round(decimals=2), torch.tensor([[0.14, 0.43, 0.43], [0.00, 0.91, 0.09], [0.01, 0.75, 0.24]])
    )
    torch.testing.assert_close(
        O.round(decimals=2), torch.tensor([[1.86, 6.32, 1.70], [2.00, 7.81, 0.27], [1.99, 7.48, 0.74]])
    )
    unscaled = ref.softmax(ref.scores(Q, K))
    torch.testing.assert_close(unscaled[1].round(decimals=2), torch.tensor([0.00, 0.98, 0.02]))
    # outputs stay within each column's range of V
    assert (O >= V.min(0).values).all() and (O <= V.max(0).values).all()


def test_cat_sat_the_gives_cat_about_half():
    ex = data.cat_sat()
    Q, K, V = ref.project(ex.X, ex.W_q, ex.W_k, ex.W_v)
    _, A = ref.attention(Q, K, V, ref.causal_mask(5))
    S = ref.scores(Q, K)
    assert S[4].argmax().item() == 1  # "cat"
    assert 0.45 <= A[4, 1].item() <= 0.55
    O = ref.mix(A, V)
    assert O[4].argmax().item() == ex.features.index("thing")


def test_milk_tied_and_independent_dimensions():
    ex = data.milk()
    # exactly 0 in NumPy (float64, the brief's setting); within rounding in torch
    Q = ex.X.double().numpy() @ ex.W_q.double().numpy()
    assert abs(Q @ Q.T - (Q @ Q.T).T).max() == 0
    S_tied = ref.scores(ex.X @ ex.W_q, ex.X @ ex.W_q)
    assert (S_tied - S_tied.T).abs().max().item() < 1e-5
    S = ref.scores(ex.X @ ex.W_q, ex.X @ ex.W_k)
    assert (S - S.T).abs().max().item() > 0.1
    for d_k, d_v in ((6, 6), (2, 6), (6, 2)):
        O, A = ref.attention(ex.X @ ex.W_q[:, :d_k], ex.X @ ex.W_k[:, :d_k], ex.X @ ex.W_v[:, :d_v])
        assert A.shape == (6, 6) and O.shape == (6, d_v)
    enc = ex.X[:4]
    _, A = ref.attention(ex.X @ ex.W_q, enc @ ex.W_k, enc @ ex.W_v)
    assert A.shape == (6, 4)
    torch.testing.assert_close(A.sum(-1), torch.ones(6))


@pytest.mark.parametrize("sharpness, weights, output", BRIEF_COLOURS)
def test_soft_lookup_colours(sharpness, weights, output):
    d = data.colours()
    w, out = ref.soft_lookup(d.query, d.keys, d.values, sharpness)
    assert [round(w[k], 2) for k in ("red", "green", "orange")] == list(weights)
    assert all(abs(a - b) <= 1 for a, b in zip(out, output)), out


def test_score_spread_is_sqrt_dk_then_one():
    for d_k in (1, 64):
        raw, scaled = ref.score_spread(d_k, 20000, torch.Generator().manual_seed(0))
        assert math.isclose(raw, math.sqrt(d_k), rel_tol=0.05)
        assert math.isclose(scaled, 1.0, rel_tol=0.05)
