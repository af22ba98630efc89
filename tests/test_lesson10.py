"""Lesson 10 trains a head in front of the student.

The reference agrees with independent implementations; the lesson computes the numbers its text
states, and trains in a few seconds; graded through nbgrader, every known mistake written as a
student would write it loses the hidden points and is named, while other correct ways (einsum,
a hand-written log-softmax, Adam instead of plain gradient descent) get full marks.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.nn.functional as F

from grader.lessons import l10_learning as ref
from tests import wrong_versions
from tests.conftest import DEVICES
from tests.solutions import read_solution
from tests.tensors import draw

LESSON = "10_learning"


# ------------------------------------------------------------------- the reference


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_head_forward_matches_scaled_dot_product_attention(device, dtype, batch):
    X = draw(*batch, 7, 9, seed=1, device=device, dtype=dtype)
    params = {
        name: draw(*shape, seed=2 + i, device=device, dtype=dtype)
        for i, (name, shape) in enumerate(
            {"W_q": (9, 5), "W_k": (9, 5), "W_v": (9, 4), "W_o": (4, 6)}.items()
        )
    }
    logits, A = ref.head_forward(params, X)
    Q, K, V = X @ params["W_q"], X @ params["W_k"], X @ params["W_v"]
    want = F.scaled_dot_product_attention(Q, K, V, is_causal=True) @ params["W_o"]
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}
    torch.testing.assert_close(logits, want, **tol)
    assert logits.shape == (*batch, 7, 6) and A.shape == (*batch, 7, 7)
    assert logits.device.type == device and logits.dtype == dtype
    assert (A.triu(1) == 0).all(), "no weight on later positions"
    torch.testing.assert_close(A.sum(-1), torch.ones(*batch, 7, dtype=dtype, device=device), **tol)


@pytest.mark.parametrize("device", DEVICES)
def test_prev_token_loss_is_the_mean_minus_log_probability_of_the_previous_token(device):
    logits = draw(4, 8, 8, seed=3, device=device, dtype=torch.float64)
    tokens = torch.randint(0, 8, (4, 8), generator=torch.Generator().manual_seed(4)).to(device)
    log_p = torch.log_softmax(logits, dim=-1)
    by_hand = -sum(log_p[b, t, tokens[b, t - 1]] for b in range(4) for t in range(1, 8)) / (4 * 7)
    torch.testing.assert_close(ref.prev_token_loss(logits, tokens), by_hand)
    uniform = ref.prev_token_loss(torch.zeros(4, 8, 8, device=device), tokens)
    assert math.isclose(uniform.item(), math.log(8), rel_tol=1e-6)


def test_toy_task_inputs():
    tokens = ref.make_batch(5, torch.Generator().manual_seed(0))
    assert tokens.shape == (5, 8) and tokens.dtype == torch.int64 and 0 <= tokens.min() <= tokens.max() < 8
    X = ref.embed(tokens)
    assert X.shape == (5, 8, 16)
    assert (X.sum(-1) == 2).all(), "one letter and one position per row"
    assert (X[..., :8].argmax(-1) == tokens).all()
    assert (X[..., 8:].argmax(-1) == torch.arange(8)).all()
    params = ref.init_params(0)
    assert {k: tuple(v.shape) for k, v in params.items()} == {
        "W_q": (16, 8),
        "W_k": (16, 8),
        "W_v": (16, 8),
        "W_o": (8, 8),
    }
    assert all(p.requires_grad and p.is_leaf for p in params.values())
    assert torch.equal(ref.init_params(3)["W_q"], ref.init_params(3)["W_q"])


def test_reference_training_learns_the_pattern_for_every_seed_in_seconds(record_property):
    seconds = []
    for seed in range(5):
        start = time.perf_counter()
        params, losses = ref._train.__wrapped__(200, 1.0, seed)  # uncached: a real training run
        seconds.append(time.perf_counter() - start)
        seen = ref.pattern(params)
        assert seen["previous"] >= 0.99 and seen["accuracy"] >= 0.99, (seed, seen)
        assert len(losses) == 200 and losses[-1] < 0.05 < 2.0 < losses[0]
    record_property("train_head_200_steps_seconds", max(seconds))
    print(f"\nreference train_head(200 steps): {min(seconds):.2f} to {max(seconds):.2f} s")
    assert max(seconds) < 30, "the training lesson must train in well under 30 s on a CPU"


def test_a_malformed_training_result_says_what_to_return():
    params, losses = ref.train_head(200, 1.0, 1)
    cases = {
        "two things: (params, losses)": params,
        "keys W_q, W_k, W_v, W_o": ({"W_q": params["W_q"]}, losses),
        "one per training step (use loss.item())": (params, [object()]),
        "one loss per step (200)": (params, losses[:10]),
    }
    for expected, got in cases.items():
        problem = ref._compare_training((params, losses), got, "seed=1")
        assert problem is not None and expected in problem, (expected, problem)


def test_a_run_that_learns_passes_whatever_its_exact_weights():
    """Other seeds, optimisers and learning rates reach other weights: behaviour is what is graded."""
    mine = ref._train(200, 1.0, 1)
    other = ref._train(300, 0.5, 4)
    assert not torch.equal(mine[0]["W_q"], other[0]["W_q"])
    assert ref._compare_training(mine, other[:1] + (other[1][:200],), "seed=1") is None


# ------------------------------------------------------- the lesson's own numbers


# `name = expression` lines: each expression is read back from the solution notebook once it has run
NOTEBOOK_VALUES = r"""
chance = chance_loss
demo_tokens = demo_tokens
X_shape = list(X_demo.shape)
n_params = n_params
A0 = A0.detach()
loss0 = loss0.item()
loss0_again = prev_token_loss(logits0, tokens0).item()
loss_after_step = loss_after_step
grad_ratio = [grad_ratio.min().item(), grad_ratio.max().item()]
patterns = {str(k): v for k, v in patterns.items()}
snapshot_rows = snapshots[200].sum(-1)
best_key = best_key[1:]
named = named
trained_pattern = read_pattern(trained)
blind_accuracy = blind_accuracy
blind_by_position = blind_by_position
lr_small = read_pattern(train_head(lr=0.1)[0])['previous']
lr_huge_last_loss_finite = math.isfinite(train_head(lr=30.0)[1][-1])
helpers = [make_batch(4, torch.Generator().manual_seed(7)).tolist(), embed(demo_tokens).tolist(), {k: v.tolist() for k, v in init_params(5).items()}]
train_seconds = (lambda t0: (train_head(), __import__('time').perf_counter() - t0)[1])(__import__('time').perf_counter())
slider_warnings = exec('import warnings\nwith warnings.catch_warnings(record=True) as _w:\n    warnings.simplefilter("always")\n    train_and_show(30.0)\n_n_warnings = len(_w)') or _n_warnings
"""


@pytest.mark.slow
def test_lesson_computes_the_numbers_it_states(record_property):
    values = read_solution(LESSON, NOTEBOOK_VALUES, record_property)
    record_property("train_head_seconds", values["train_seconds"])
    print(f"train_head() took {values['train_seconds']:.2f} s")
    assert values["train_seconds"] < 30

    # the task and the model
    assert values["chance"] == pytest.approx(math.log(8))
    assert values["X_shape"] == [3, 8, 16]
    assert values["n_params"] == 16 * 8 * 3 + 8 * 8 == 448
    # the lesson's helpers are the grader's (the hidden check trains with the same recipe)
    batch, X_demo, init5 = values["helpers"]
    assert batch == ref.make_batch(4, torch.Generator().manual_seed(7)).tolist()
    assert X_demo == ref.embed(torch.tensor(values["demo_tokens"])).tolist()
    assert init5 == {k: v.tolist() for k, v in ref.init_params(5).items()}
    # the untrained head spreads its weight: row t gives each of its t + 1 positions about 1 / (t + 1)
    A0 = torch.tensor(values["A0"])
    for t in range(8):
        assert (A0[t, t + 1 :] == 0).all()
        assert (A0[t, : t + 1] - 1 / (t + 1)).abs().max() < 0.1, A0[t]
    # worked loss, one step downhill, backward twice = twice the gradient
    assert values["loss0"] == pytest.approx(values["loss0_again"], abs=1e-6)
    assert values["loss_after_step"] < values["loss0"]
    assert values["grad_ratio"] == [2.0, 2.0]
    # the pattern appears between steps 25 and 100, then sharpens
    p = values["patterns"]
    assert p["0"]["weight"] < 0.3 and p["25"]["weight"] < 0.3
    assert p["100"]["weight"] > 0.7 and p["100"]["accuracy"] >= 0.99
    assert p["200"]["previous"] == 1.0 and p["200"]["weight"] > p["100"]["weight"]
    assert all(abs(s - 1) < 1e-5 for s in values["snapshot_rows"])
    # the trained weights: look one step back, copy the letter
    assert values["best_key"] == list(range(7))
    assert values["named"] == list(range(8)), "each fetched letter votes for itself"
    expected = ref.pattern(ref.train_head(200, 1.0, 0)[0])
    for key, value in expected.items():
        assert values["trained_pattern"][key] == pytest.approx(value, abs=1e-6), key
    # without positions: right at position 1, far less often later on
    assert values["blind_by_position"][0] > 0.9
    assert values["blind_accuracy"] < 0.7 and values["blind_by_position"][-1] < 0.5
    # the learning-rate slider's claims
    assert values["lr_small"] < 0.9
    assert values["lr_huge_last_loss_finite"] is False
    assert values["slider_warnings"] == 0


# --------------------------------------------------- student answers, through nbgrader

HEAD = """
def head_forward(params, X):
    Q, K, V = X @ params["W_q"], X @ params["W_k"], X @ params["W_v"]
    S = Q @ K.transpose(-2, -1) / {scale=math.sqrt(Q.shape[-1])}
    n = X.shape[-2]
    allowed = torch.ones(n, n, dtype=torch.bool, device=X.device).tril()
    {mask=S = S.masked_fill(~allowed, float("-inf"))}
    A = torch.softmax(S, dim={dim=-1})
    return {logits=(A @ V) @ params["W_o"]}, A
"""


head_answer = wrong_versions.answer_maker(HEAD)


LOSS = """
def prev_token_loss(logits, tokens):
    guesses = {guesses=logits[..., 1:, :]}
    answers = {answers=tokens[..., :-1]}
    return F.cross_entropy({scores=guesses.reshape(-1, logits.shape[-1])}, answers.reshape(-1){extra=})
"""


loss_answer = wrong_versions.answer_maker(LOSS)


TRAIN = """
def train_head(steps=200, lr=1.0, seed=0):
    params = init_params(seed)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        tokens = make_batch(BATCH, generator)
        logits, _ = head_forward(params, embed(tokens))
        loss = prev_token_loss(logits, tokens)
        loss.backward()
        with torch.no_grad():
            for name, p in params.items():
{update}
        losses.append(loss.item())
    return params, losses
"""


def train_answer(update="p -= lr * p.grad\np.grad = None"):
    return TRAIN.format(update="\n".join(" " * 16 + line for line in update.splitlines()))


# Each submission carries one wrong version of each function it names. train_head is graded on its
# own: its hidden check runs it on the reference head_forward and prev_token_loss, so a wrong loss costs
# only the loss's points; a loop that computes its own (unshifted) loss is still named.
# {student: [(answer, diagnosis), ...]}, each answer defining one function
WRONG_SUBMISSIONS = wrong_versions.wrong_submissions(
    LESSON,
    {
        "nomask_summed_ascent": [
            (head_answer(mask="pass"), "no causal mask: the head looks at the future"),
            (loss_answer(extra=', reduction="sum"'), "the losses were summed instead of averaged"),
            (train_answer("p += lr * p.grad\np.grad = None"), "the loss rose instead of falling"),
        ],
        "unscaled_unshifted": [
            (head_answer(scale="1"), "the scores are not scaled"),
            (
                loss_answer(guesses="logits", answers="tokens"),
                "the targets are not shifted: every position names its own token",
            ),
            (  # a loop that computes the unshifted loss itself
                train_answer().replace(
                    "loss = prev_token_loss(logits, tokens)",
                    "loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))",
                ),
                "the head learned to look at the current token",
            ),
        ],
        "dim2_nextword_rebinding": [
            (head_answer(dim="-2"), "the softmax runs over dim -2"),
            (
                loss_answer(guesses="logits[..., :-1, :]", answers="tokens[..., 1:]"),
                "shifted the wrong way: every position names the next token",
            ),
            (train_answer("p = p - lr * p.grad\np.grad = None"), "the loss never fell"),
        ],
        "no_wo_softmax_first": [
            (head_answer(logits="A @ V"), "W_o was not applied"),
            (
                loss_answer(scores="torch.softmax(guesses.reshape(-1, logits.shape[-1]), dim=-1)"),
                "the softmax was applied before cross_entropy",
            ),
        ],
        "no_reset": [
            (train_answer("p -= lr * p.grad"), "the loss fell, then blew up"),
        ],
        "only_values_trained": [
            (
                train_answer('if name in ("W_v", "W_o"):\n    p -= lr * p.grad\np.grad = None'),
                "the loss fell but no attention pattern formed",
            ),
        ],
        "rolled_targets": [
            (
                loss_answer(guesses="logits", answers="tokens.roll(1, dims=-1)"),
                "torch.roll wrapped the last token around to position 0",
            ),
        ],
        "scaled_by_dv": [
            (
                head_answer(scale="math.sqrt(V.shape[-1])"),
                "the scores are divided by sqrt(d_v) instead of sqrt(d_k)",
            ),
        ],
    },
)


def _run_answer(source: str, name: str):
    helpers = {
        "init_params": ref.init_params,
        "make_batch": ref.make_batch,
        "embed": ref.embed,
        "BATCH": ref.BATCH,
    }
    return wrong_versions.answer_function(source, name, helpers)


def test_every_known_mistake_has_a_student_answer_here():
    named = {d for checks in WRONG_SUBMISSIONS.values() for _, _, d in checks.values()}
    from grader.registry import exercises

    for name in ("head_forward", "prev_token_loss", "train_head"):
        for trap in exercises()[name].traps:
            assert trap.name in named, f"no submission exercises the {name} trap {trap.name!r}"


@pytest.mark.parametrize(
    "name, source, diagnosis",
    [
        (cell.removeprefix("ex10_"), answer, diagnosis)
        for checks in WRONG_SUBMISSIONS.values()
        for cell, answer, diagnosis in checks.values()
        if cell != "ex10_train_head"
    ],
    ids=lambda x: x if isinstance(x, str) and len(x) < 60 and "\n" not in x else "",
)
def test_student_answers_are_named_in_process(name, source, diagnosis):
    wrong_versions.assert_named_in_process(name, _run_answer(source, name), diagnosis)


@pytest.mark.parametrize(
    "update",
    [
        "p -= 0.2 * p.grad\np.grad = None",
        "p -= 20 * lr * p.grad\np.grad = None",
        "p -= 0.05 * p.grad\np.grad = None",
    ],
    ids=["step too small", "step too large", "step far too small"],
)
def test_a_wrong_step_size_is_named_as_no_other_mistake(update):
    """A loop that resets every gradient and trains every tensor, with its own step size: its run leaves no
    pattern, blows up or barely moves, as the runs of three named mistakes do, and it made none of them (it
    was told that only W_v and W_o were trained, to reset its gradients, or that its weights never changed)."""
    from grader import check

    loop = _run_answer(train_answer(update), "train_head")
    loop.__globals__.update(head_forward=ref.head_forward, prev_token_loss=ref.prev_token_loss)
    with pytest.raises(AssertionError) as failed:
        check("train_head", loop)
    said = str(failed.value)
    assert "Its loss went from" in said and "Diagnosis" not in said, said[-600:]


RIGHT_SUBMISSIONS = {
    "einsum_logsoftmax_adam": {
        "ex10_head_forward": """
def head_forward(params, X):
    Q, K = X @ params["W_q"], X @ params["W_k"]
    S = torch.einsum("...qd,...kd->...qk", Q, K) * Q.shape[-1] ** -0.5
    i = torch.arange(X.shape[-2], device=X.device)
    A = torch.where(i[:, None] >= i[None, :], S, float("-inf")).softmax(dim=-1)
    return torch.einsum("...qk,...kd->...qd", A, X @ params["W_v"]) @ params["W_o"], A
""",
        "ex10_prev_token_loss": """
def prev_token_loss(logits, tokens):
    log_p = torch.log_softmax(logits[..., 1:, :], dim=-1)
    return -log_p.gather(-1, tokens[..., :-1, None]).mean()
""",
        "ex10_train_head": """
def train_head(steps=200, lr=1.0, seed=0):
    params = init_params(seed)
    optimizer = torch.optim.Adam(params.values(), lr=0.05)    # another optimiser: other weights, same pattern
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        tokens = make_batch(BATCH, generator)
        loss = prev_token_loss(head_forward(params, embed(tokens))[0], tokens)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return params, losses
""",
    },
}
(
    test_wrong_versions_lose_hidden_points_and_are_named,
    test_correct_but_different_versions_get_full_marks,
) = wrong_versions.submission_tests(LESSON, WRONG_SUBMISSIONS, RIGHT_SUBMISSIONS)
