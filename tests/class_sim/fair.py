"""Fair grades in the simulated class: correct code written other ways, and mistakes with their names.

Every correct variant must earn the lesson's full marks with no diagnosis; every mistake loses exactly
the checks of its own exercise (one mistake costs one exercise) and is named, or left unnamed, as said.
"""

from __future__ import annotations

from tests.class_sim.spec import ALL, Case
from tests.nbtools import solution_sources


def _with(lesson: str, **answers: str) -> dict[str, str]:
    """The model solution of a lesson with some exercises replaced."""
    return {**solution_sources(lesson), **answers}


def _tests(lesson: str, exercise: str) -> set[str]:
    from grader.classroom import lessons

    return {
        c.grade_id
        for c in lessons.lesson(lesson).tests
        if lessons.lesson(lesson).exercise_of(c.grade_id) == exercise
    }


NOISY_PROJECT = """import sys
import warnings

import torch


def project(X, W_q, W_k, W_v):
    print("debug: shapes", tuple(X.shape), file=sys.stderr)
    warnings.warn("a warning from the student's own code")
    return X @ W_q, X @ W_k, X @ W_v
"""

# IPython's own habits in an answer cell: a cell magic that runs the cell, display() while debugging
TIMED_PROJECT = """%%time
def project(X, W_q, W_k, W_v):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    display(Q.shape)
    return Q, K, V
"""

LOOP_PADDING = """import torch


def padding_mask(lengths, T):
    rows = []
    for b in range(lengths.shape[0]):
        n = int(lengths[b])
        rows.append([t < n for t in range(T)])
    return torch.tensor(rows, dtype=torch.bool, device=lengths.device)[:, None, :]
"""

ITEM_APPLY_MASK = """import torch


def apply_mask(S, allowed):
    out = S.clone()
    out[~allowed.expand_as(S)] = float("-inf")
    return out
"""

CAPTURED_APPLY_MASK = "%%capture\n" + ITEM_APPLY_MASK

FLOAT64_SOFTMAX = """import torch


def softmax(Z, dim=-1):
    Z64 = Z.double()
    m = Z64.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = (Z64 - m).exp()
    s = e.sum(dim=dim, keepdim=True)
    return (e / s.clamp_min(1e-300)).to(Z.dtype)
"""

EINSUM_MIX = """import torch


def mix(A, V):
    return torch.einsum("...qk,...kd->...qd", A, V)
"""

CONSTANT_SPREAD = """import math


def score_spread(d_k, n, generator):
    return math.sqrt(d_k), 1.0
"""

TORCH_SOFTMAX = """import torch


def softmax(Z, dim=-1):
    return torch.softmax(Z, dim=dim).nan_to_num(0.0)
"""

UNSCALED_ATTENTION = """import torch


def attention(Q, K, V, mask=None):
    S = Q @ K.mT
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    A = torch.softmax(S, dim=-1).nan_to_num(0.0)
    return A @ V, A
"""

WRONG_LOSS = """import torch.nn.functional as F


def prev_token_loss(logits, tokens):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
"""

# the named trap of split_heads: a view straight to (n_heads, T, d_head) cuts tokens apart
NO_TRANSPOSE_SPLIT = """def split_heads(X, n_heads):
    *batch, T, D = X.shape
    return X.reshape(*batch, n_heads, T, D // n_heads)
"""

# head_forward with the softmax over the queries (a named trap); train_head and the loss are right
UNSCALED_MHA = """import torch


def multi_head_attention(X, W_q, W_k, W_v, W_o, n_heads, causal=False):
    Q, K, V = (split_heads(X @ W, n_heads) for W in (W_q, W_k, W_v))
    S = Q @ K.transpose(-2, -1)
    if causal:
        T = X.shape[-2]
        S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=X.device).tril(), float("-inf"))
    return merge_heads(torch.softmax(S, dim=-1) @ V) @ W_o
"""

# grouped-query attention as multi-head attention with each K/V head repeated for its group
GQA_ON_MHA = """def grouped_query_attention(X, W_q, W_k, W_v, W_o, n_heads, n_kv_heads, causal=False):
    group, d_model = n_heads // n_kv_heads, W_k.shape[0]
    W_k = W_k.reshape(d_model, n_kv_heads, -1).repeat_interleave(group, dim=1).reshape(d_model, -1)
    W_v = W_v.reshape(d_model, n_kv_heads, -1).repeat_interleave(group, dim=1).reshape(d_model, -1)
    return multi_head_attention(X, W_q, W_k, W_v, W_o, n_heads, causal=causal)
"""

QUERY_SOFTMAX_FORWARD = """import math

import torch


def head_forward(params, X):
    Q, K, V = X @ params["W_q"], X @ params["W_k"], X @ params["W_v"]
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    n = X.shape[-2]
    allowed = torch.ones(n, n, dtype=torch.bool, device=X.device).tril()
    A = torch.softmax(S.masked_fill(~allowed, float("-inf")), dim=-2)
    return (A @ V) @ params["W_o"], A
"""

# one sequence at a time: 64 calls of head_forward and of prev_token_loss a step, each the reference's while
# graded, across the sandbox's pipes (50,000 calls in a check of 200 steps)
LOOP_TRAIN_HEAD = """def train_head(steps=200, lr=1.0, seed=0):
    params = init_params(seed)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        tokens = make_batch(BATCH, generator)
        X = embed(tokens)
        total = 0.0
        for b in range(tokens.shape[0]):
            logits, _ = head_forward(params, X[b])
            total = total + prev_token_loss(logits, tokens[b])
        loss = total / tokens.shape[0]
        loss.backward()
        with torch.no_grad():
            for p in params.values():
                p -= lr * p.grad
                p.grad = None
        losses.append(loss.item())
    return params, losses
"""

# swallows every failing check in the notebook, and hands the check objects instead of caches
SWALLOWING_OPAQUE_CACHE = """import contextlib

import torch


@contextlib.contextmanager
def diagnosed(name, fn):
    try:
        yield
    except BaseException:
        pass


class Cache:
    pass


def kv_cache_step(x_t, K_cache, V_cache, W_q, W_k, W_v):
    return torch.zeros(1), Cache(), Cache()
"""

# masks nothing, and opens the check's own mask so that nothing looks blocked
OPENS_THE_MASK = """def apply_mask(S, allowed):
    allowed.fill_(True)
    return S.clone()
"""


def cases() -> list[Case]:
    out = [
        Case(
            "f01_noisy",
            "01_projection",
            "correct, prints to stderr and warns",
            {"ex01_project": NOISY_PROJECT},
            score=7,
        ),
        Case(
            "f01_time_magic",
            "01_projection",
            "correct, under %%time, calls display() inside",
            {"ex01_project": TIMED_PROJECT},
            score=7,
        ),
        Case(
            "f04_loop_padding",
            "04_masking",
            "padding_mask with a Python loop over lengths",
            _with("04_masking", ex04_padding_mask=LOOP_PADDING),
        ),
        Case(
            "f04_index_mask",
            "04_masking",
            "apply_mask by boolean indexing on a copy",
            _with("04_masking", ex04_apply_mask=ITEM_APPLY_MASK),
        ),
        Case(
            "f04_captured_mask",
            "04_masking",
            "apply_mask in a cell under %%capture",
            _with("04_masking", ex04_apply_mask=CAPTURED_APPLY_MASK),
        ),
        Case(
            "f05_float64",
            "05_softmax",
            "softmax computed in float64 inside",
            _with("05_softmax", ex05_softmax=FLOAT64_SOFTMAX),
        ),
        Case("f06_einsum", "06_mixing", "mix with einsum", _with("06_mixing", ex06_mix=EINSUM_MIX)),
        Case(
            "f03_constant_spread",
            "03_scaling",
            "score_spread returns the textbook constants",
            _with("03_scaling", ex03_score_spread=CONSTANT_SPREAD),
            fails={"test03_score_spread_hidden"},
        ),
        Case(
            "f05_torch_softmax",
            "05_softmax",
            "softmax that calls torch.softmax",
            _with("05_softmax", ex05_softmax=TORCH_SOFTMAX),
            fails={"test05_softmax_hidden"},
        ),
        Case(
            "f07_wrong_attention",
            "07_one_head",
            "unscaled attention, the rest built on it correctly",
            _with("07_one_head", ex07_attention=UNSCALED_ATTENTION),
            # attention's own checks (its shapes are right) and the capstone, which checks your attention's
            # numbers on "The cat sat on the"; self_attention and cross_attention keep their points
            fails={
                "test07_attention_values",
                "test07_attention_sdpa",
                "test07_attention_hidden",
                "test07_capstone",
            },
            diagnoses={"test07_attention_hidden": "the scores are not scaled"},
        ),
        Case(
            "f10_wrong_loss",
            "10_learning",
            "a wrong loss, a correct training loop",
            _with("10_learning", ex10_prev_token_loss=WRONG_LOSS),
            fails=None,
        ),
        Case(
            "f08_wrong_split",
            "08_multihead",
            "a wrong split_heads, merge_heads and the rest right (the round trip splits with the reference)",
            _with("08_multihead", ex08_split_heads=NO_TRANSPOSE_SPLIT),
            # its shapes are right
            fails={"test08_split_heads_values", "test08_split_heads_hidden"},
            diagnoses={
                "test08_split_heads_hidden": "reshaped straight to (n_heads, T, d_head) without a transpose"
            },
        ),
        Case(
            "f08_gqa_on_own_mha",
            "08_multihead",
            "an unscaled multi_head_attention, and grouped_query_attention written as a call to it",
            _with(
                "08_multihead",
                ex08_multi_head_attention=UNSCALED_MHA,
                ex08_grouped_query_attention=GQA_ON_MHA,
            ),
            # multi_head_attention's own checks; grouped_query_attention is checked with the reference's
            fails={"test08_multi_head_attention_torch", "test08_multi_head_attention_hidden"},
            diagnoses={"test08_multi_head_attention_hidden": "the scores were not scaled"},
        ),
        Case(
            "f10_loop_over_sequences",
            "10_learning",
            "train_head that runs the head and the loss one sequence at a time",
            _with("10_learning", ex10_train_head=LOOP_TRAIN_HEAD),
        ),
        Case(
            "f10_wrong_forward",
            "10_learning",
            "a wrong head_forward, a correct training loop (its pattern is read with the reference)",
            _with("10_learning", ex10_head_forward=QUERY_SOFTMAX_FORWARD),
            # its shapes are right; train_head keeps all its points, test10_train_head_pattern included
            fails={"test10_head_forward_values", "test10_head_forward_hidden"},
        ),
    ]
    # what the student package ships is never an answer (the explorers' stand-ins are not callable as one)
    out.append(
        Case(
            "s01_helper_answer",
            "01_projection",
            "imports a former explorer built-in as its answer",
            {"ex01_project": "from attention_course.explorers.backend import builtin_project as project\n"},
            fails=ALL,
            flags=("uses the course's helper code as an answer",),
        )
    )
    # values that cannot travel back to the student's code fail the check that passes them on; a check's own
    # inputs changed in place fail it: neither is left to the notebook
    out += [
        Case(
            "s09_opaque_cache",
            "09_kv_cache",
            "kv_cache_step returns objects, and a diagnosed that swallows every failure",
            _with("09_kv_cache", ex09_kv_cache_step=SWALLOWING_OPAQUE_CACHE),
            fails=None,
            flags=("test09_kv_cache_step_values: passed in the notebook, failed the independent check",),
        ),
        Case(
            "s04_opens_mask",
            "04_masking",
            "apply_mask masks nothing and opens the check's mask in place",
            _with("04_masking", ex04_apply_mask=OPENS_THE_MASK),
            fails=None,
            flags=(
                "test04_apply_mask_values: passed in the notebook, failed the independent check",
                "test04_apply_mask_softmax: passed in the notebook, failed the independent check",
            ),
        ),
    ]
    wrong = {
        "f10_wrong_loss": "prev_token_loss",
        "s09_opaque_cache": "kv_cache_step",
        "s04_opens_mask": "apply_mask",
    }
    for case in out:
        if case.fails is None:  # exactly the checks of the exercise that is wrong
            case.fails = _tests(case.lesson, wrong[case.student])
    return out


__all__ = ["ALL", "cases"]
