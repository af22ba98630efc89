"""Lesson 10, attention that learns: hidden reference, seeded cases and known mistakes.

The toy task: sequences of ``T = 8`` random letters from ``a``-``h``; at every position
``t >= 1`` the model must name the letter at position ``t - 1``. One causal head can solve it
only by *looking at the previous token*, a pattern we can read off its attention weights.

Each token's input row is its letter and its position, both one-hot:
``X = [one_hot(token, 8) | one_hot(position, 8)]``, so ``d_model = 16``. The head has the three
projections of lessons 01-07 plus ``W_o (d_v, vocab)``, which turns its output row into one score
(logit) per letter.

``train_head`` is graded on what the trained head does, not on its weights: on a fresh batch its
largest attention weight must sit on the previous token and it must name the previous letter.
A failed training run is sorted by its behaviour (the loss rose, fell then blew up, never fell,
the head looks at itself, no pattern formed), and each behaviour is a named diagnosis.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F

from grader.harness import Case, Exercise, Trap
from grader.lessons._common import gen, randn

VOCAB = "abcdefgh"
N_VOCAB = len(VOCAB)  # 8 letters
T = 8  # tokens per sequence
D_MODEL = N_VOCAB + T  # one-hot letter + one-hot position = 16
D_K = 8
D_V = 8
BATCH = 64
INIT_STD = 0.3

# learned: on a fresh batch, the largest weight of at least this share of rows t >= 1 is on t - 1,
# and at least this share of positions t >= 1 name the letter at t - 1
PATTERN_BAR = 0.9
ACCURACY_BAR = 0.9
EVAL_SEED, EVAL_N = 2024, 256


# ----------------------------------------------------------------- the toy task


def make_batch(n: int, generator: torch.Generator) -> torch.Tensor:
    """n sequences of T random letters (as integers 0-7). Shapes: -> tokens (n, T) int64."""
    return torch.randint(0, N_VOCAB, (n, T), generator=generator)


def embed(tokens: torch.Tensor) -> torch.Tensor:
    """One-hot letter next to one-hot position. Shapes: tokens (..., T) -> X (..., T, 16) float32."""
    letter = F.one_hot(tokens, N_VOCAB).float()  # (..., T, 8)
    where = torch.eye(tokens.shape[-1], T, device=tokens.device)  # (T, 8): row t is position t
    position = where.expand(*tokens.shape, T)  # (..., T, 8)
    return torch.cat([letter, position], dim=-1)


def init_params(seed: int, d_k: int = D_K, d_v: int = D_V) -> dict[str, torch.Tensor]:
    """Small random weights that require gradients. Shapes: W_q, W_k (16, d_k), W_v (16, d_v), W_o (d_v, 8)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"W_q": (D_MODEL, d_k), "W_k": (D_MODEL, d_k), "W_v": (D_MODEL, d_v), "W_o": (d_v, N_VOCAB)}
    return {
        name: (torch.randn(*shape, generator=g) * INIT_STD).requires_grad_() for name, shape in shapes.items()
    }


# ------------------------------------------------------------------- reference


def head_forward(params: dict[str, torch.Tensor], X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One causal attention head, then W_o: a score (logit) per letter at every position.

    Shapes: X (..., T, d_model), W_q and W_k (d_model, d_k), W_v (d_model, d_v), W_o (d_v, vocab)
    -> logits (..., T, vocab), A (..., T, T).
    """
    Q, K, V = X @ params["W_q"], X @ params["W_k"], X @ params["W_v"]
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., T, T)
    n = X.shape[-2]
    allowed = torch.ones(n, n, dtype=torch.bool, device=X.device).tril()
    A = torch.softmax(S.masked_fill(~allowed, float("-inf")), dim=-1)  # (..., T, T)
    return (A @ V) @ params["W_o"], A  # (..., T, vocab), (..., T, T)


def prev_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of naming, at every position t >= 1, the token at t - 1.

    Shapes: logits (..., T, vocab), tokens (..., T) int64 -> a 0-dim tensor.
    """
    guesses = logits[..., 1:, :]  # positions 1 .. T-1
    targets = tokens[..., :-1]  # the tokens one step earlier: 0 .. T-2
    return F.cross_entropy(guesses.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@contextmanager
def _one_thread() -> Iterator[None]:
    """Tiny tensors train fastest on one thread (and steadily when the cores are busy)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@lru_cache(maxsize=32)  # runs are deterministic: a check that needs one twice trains it once
def _train(
    steps: int,
    lr: float,
    seed: int,
    *,
    sign: float = 1.0,
    reset: bool = True,
    update: tuple[str, ...] = ("W_q", "W_k", "W_v", "W_o"),
    shift: int = 1,
    no_op: bool = False,
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Plain gradient descent on the toy task; the keyword arguments build the known mistakes."""
    params = init_params(seed)
    g = torch.Generator().manual_seed(seed)
    losses = []
    with _one_thread():
        for _ in range(steps):
            tokens = make_batch(BATCH, g)
            logits, _ = head_forward(params, embed(tokens))
            if shift == 1:
                loss = prev_token_loss(logits, tokens)
            else:  # shift 0: every position names its own token
                loss = F.cross_entropy(logits.reshape(-1, N_VOCAB), tokens.reshape(-1))
            loss.backward()
            with torch.no_grad():
                for name, p in params.items():
                    if name in update and not no_op:
                        p -= sign * lr * p.grad  # step against the gradient
                    if reset:
                        p.grad = None  # the next backward() starts from zero
            losses.append(loss.item())
    return params, losses


def train_head(
    steps: int = 200, lr: float = 1.0, seed: int = 0
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Train the head by gradient descent on fresh batches; return the weights and the loss of every step.

    Shapes: -> params {W_q, W_k (16, d_k), W_v (16, d_v), W_o (d_v, 8)}, losses: a list of `steps` floats.
    """
    return _train(steps, lr, seed)


# ---------------------------------------------------------- reading the pattern


def pattern(params: dict[str, torch.Tensor], n: int = EVAL_N, seed: int = EVAL_SEED) -> dict[str, float]:
    """What a head does on a fresh batch: where its largest weight sits, and how often it is right.

    ``previous``/``itself``: share of rows t >= 1 whose largest weight is on t - 1 / on t;
    ``weight``: mean weight on t - 1; ``accuracy``: share of positions t >= 1 naming the token at t - 1.
    """
    tokens = make_batch(n, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        weights = {k: v.detach().to("cpu", torch.float32) for k, v in params.items()}
        logits, A = head_forward(weights, embed(tokens))
    rows = torch.arange(1, T)
    top = A[:, 1:, :].argmax(dim=-1)  # (n, T-1)
    return {
        "previous": (top == rows - 1).float().mean().item(),
        "itself": (top == rows).float().mean().item(),
        "weight": A[:, rows, rows - 1].mean().item(),
        "accuracy": (logits[:, 1:].argmax(dim=-1) == tokens[:, :-1]).float().mean().item(),
    }


# ---------------------------------------------------------------- train_head check


def _behaviour(result) -> tuple[str, str]:
    """(kind, description) of a training run, judged by what it did; kind 'bad' for a malformed result."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        return "bad", "train_head should return two things: (params, losses)."
    params, losses = result
    if not isinstance(params, dict) or set(params) != {"W_q", "W_k", "W_v", "W_o"}:
        keys = sorted(params) if isinstance(params, dict) else type(params).__name__
        return "bad", f"params should be a dict with the keys W_q, W_k, W_v, W_o; got {keys}."
    if not all(isinstance(p, torch.Tensor) for p in params.values()):
        return "bad", "every entry of params should be a torch.Tensor."
    try:
        losses = [float(x) for x in losses]
    except (TypeError, ValueError, RuntimeError):
        return "bad", "losses should be a list of numbers, one per training step (use loss.item())."
    if not losses:
        return "bad", "losses is empty: append loss.item() at every step."
    finite = all(bool(torch.isfinite(p).all()) for p in params.values())
    try:
        seen = pattern(params) if finite else None
    except Exception as e:  # noqa: BLE001 - wrong shapes: reported, not raised
        return "bad", f"the returned weights do not fit the head ({type(e).__name__}: {e})."
    first, last = losses[0], losses[-1]
    prefix = []
    for x in losses:
        if not math.isfinite(x):
            break
        prefix.append(x)
    low = min(prefix) if prefix else first
    blown = len(prefix) < len(losses) or not finite
    summary = (
        f"Its loss went from {first:.3g} (first step) down to {low:.3g} (lowest) and ended at {last:.3g}."
    )
    if seen is not None:
        summary = (
            f"On {EVAL_N} fresh sequences its largest weight sits on the previous token in "
            f"{seen['previous']:.0%} of rows (needs {PATTERN_BAR:.0%}), and it names the previous letter at "
            f"{seen['accuracy']:.0%} of positions (needs {ACCURACY_BAR:.0%}). " + summary
        )
    if seen is not None and seen["previous"] >= PATTERN_BAR and seen["accuracy"] >= ACCURACY_BAR:
        return "learned", summary
    if low > 0.9 * first:
        if blown or last > 1.1 * first:
            return "rose", summary
        return "flat", summary
    if blown or last > (first + low) / 2:
        return "blew up", summary
    if seen is not None and seen["itself"] >= PATTERN_BAR:
        return "itself", summary
    return "no pattern", summary


# A mistake's run (a trap's) is named only where the student's run is that run, step by step: the same
# losses for the first steps both keep finite. A run of the same kind can have another cause (a step
# too small also leaves no pattern; one too large blows up with every gradient reset).
TRAP_STEPS, TRAP_RTOL = 20, 1e-3


def _same_start(want: list, got: list) -> bool:
    pairs = []
    for x, y in zip(want[:TRAP_STEPS], got[:TRAP_STEPS]):
        if not (math.isfinite(float(x)) and math.isfinite(float(y))):
            break
        pairs.append((float(x), float(y)))
    return bool(pairs) and all(math.isclose(x, y, rel_tol=TRAP_RTOL) for x, y in pairs)


def _compare_training(expected, got, label: str) -> str | None:
    kind, description = _behaviour(got)
    if kind == "bad":
        return description
    want, _ = _behaviour(expected)
    n_want = len(expected[1]) if isinstance(expected, (tuple, list)) and len(expected) == 2 else None
    if n_want is not None and len(got[1]) != n_want:
        return f"losses has {len(got[1])} entries; it should hold one loss per step ({n_want})."
    if kind == want:
        if want == "learned" or _same_start(expected[1], got[1]):
            return None
        return f"the run is {kind!r}, as this mistake's is, but its losses differ from the first steps on."
    if want == "learned":
        return "the trained head does not look at the previous token. " + description
    return f"the run {kind!r} is not the run {want!r}. " + description


def _training_cases(device: torch.device) -> list[Case]:
    if device.type != "cpu":
        return []  # a head this small trains fastest on the CPU: one check is enough
    return [Case(f"steps=200, lr=1.0, seed={s}", (), {"steps": 200, "lr": 1.0, "seed": s}) for s in (1, 3)]


TRAIN_HEAD = Exercise(
    name="train_head",
    signature="steps, lr, seed",
    reference=train_head,
    cases=_training_cases,
    # the training loop is graded on its own: the forward pass and the loss are the reference's
    uses={"head_forward": head_forward, "prev_token_loss": prev_token_loss},
    compare=_compare_training,
    traps=[
        Trap(
            "the loss rose instead of falling",
            "Gradient descent steps against the gradient: p -= lr * p.grad (not +=).",
            lambda steps=200, lr=1.0, seed=0: _train(steps, lr, seed, sign=-1.0),
        ),
        Trap(
            "the loss fell, then blew up",
            "backward() adds into p.grad: reset every gradient after each step (p.grad = None, "
            "or p.grad.zero_(), or optimizer.zero_grad()), or each step repeats all the old ones.",
            lambda steps=200, lr=1.0, seed=0: _train(steps, lr, seed, reset=False),
        ),
        Trap(
            "the loss never fell",
            "The weights never changed: update the tensors in params in place inside torch.no_grad() "
            "(p -= lr * p.grad; `p = p - lr * p.grad` only renames p).",
            lambda steps=200, lr=1.0, seed=0: _train(steps, lr, seed, no_op=True),
        ),
        Trap(
            "the head learned to look at the current token",
            "The loss asked every position for its own token: the target at position t is the token at t - 1 "
            "(logits[..., 1:, :] against tokens[..., :-1]).",
            lambda steps=200, lr=1.0, seed=0: _train(steps, lr, seed, shift=0),
        ),
        Trap(
            "the loss fell but no attention pattern formed",
            "Only W_v and W_o were trained: the head can only find the previous token if W_q and W_k "
            "are updated too (every tensor in params).",
            lambda steps=200, lr=1.0, seed=0: _train(steps, lr, seed, update=("W_v", "W_o")),
        ),
    ],
)

# -------------------------------------------------------------- head_forward check

# T_h tokens, d_model, d_k, d_v, vocabulary, batch, heads: all different
TH, DM, DK, DV, NV, B, H = 6, 9, 5, 4, 7, 2, 3


def _head_cases(device: torch.device) -> list[Case]:
    cases = []
    for i, (kind, batch, dtype) in enumerate(
        [
            ("2-D", (), torch.float32),
            ("batched 3-D", (B,), torch.float64),
            ("batched 4-D (batch, heads)", (B, H), torch.float32),
        ]
    ):
        X = randn(*batch, TH, DM, seed=1000 + i, device=device, dtype=dtype)
        shapes = {"W_q": (DM, DK), "W_k": (DM, DK), "W_v": (DM, DV), "W_o": (DV, NV)}
        params = {
            name: randn(*shape, seed=1010 + 10 * i + j, device=device, dtype=dtype)
            for j, (name, shape) in enumerate(shapes.items())
        }
        label = f"{kind}, {str(dtype).replace('torch.', '')} on {device.type}"
        cases.append(Case(label, (params, X)))
    return cases


def _head_variant(*, causal=True, scale=True, dim=-1, project=True, scale_by_dv=False):
    def forward(params, X):
        Q, K, V = X @ params["W_q"], X @ params["W_k"], X @ params["W_v"]
        width = V.shape[-1] if scale_by_dv else Q.shape[-1]
        S = Q @ K.transpose(-2, -1) / (math.sqrt(width) if scale else 1.0)
        if causal:
            n = X.shape[-2]
            S = S.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=X.device).tril(), float("-inf"))
        A = torch.softmax(S, dim=dim)
        O = A @ V
        return (O @ params["W_o"] if project else O), A

    return forward


HEAD_FORWARD = Exercise(
    reference=head_forward,
    cases=_head_cases,
    output_names=("logits", "A"),
    traps=[
        Trap(
            "no causal mask: the head looks at the future",
            "Position t may only look at positions j <= t: fill -inf above the diagonal before the softmax "
            "(torch.ones(T, T, dtype=torch.bool).tril() is True where looking is allowed).",
            _head_variant(causal=False),
        ),
        Trap(
            "the scores are not scaled",
            "Divide Q K^T by sqrt(d_k) (Q.shape[-1]) before the mask and the softmax.",
            _head_variant(scale=False),
        ),
        Trap(
            "the softmax runs over dim -2",
            "Each query's weights over the keys sum to 1: softmax over the last dimension.",
            _head_variant(dim=-2),
        ),
        Trap(
            "W_o was not applied",
            "The head's output row (d_v numbers) becomes one score per letter through W_o: logits = (A @ V) @ W_o.",
            _head_variant(project=False),
        ),
        Trap(
            "the scores are divided by sqrt(d_v) instead of sqrt(d_k)",
            "Divide Q K^T by sqrt(d_k), the width of Q and K (Q.shape[-1]); the values' width d_v plays no "
            "part in the scores.",
            _head_variant(scale_by_dv=True),
            example="S = Q @ K.transpose(-2, -1) / math.sqrt(V.shape[-1])",
        ),
    ],
)

# ------------------------------------------------------------ prev_token_loss check


def _loss_cases(device: torch.device) -> list[Case]:
    cases = []
    for i, (kind, batch, dtype) in enumerate(
        [
            ("2-D (one sequence)", (), torch.float64),
            ("batched 3-D", (5,), torch.float32),
            ("4-D", (B, H), torch.float64),
        ]
    ):
        logits = randn(*batch, TH, NV, seed=1100 + i, device=device, dtype=dtype) * 2
        tokens = torch.randint(0, NV, (*batch, TH), generator=gen(1110 + i)).to(device)
        label = f"{kind}, {str(dtype).replace('torch.', '')} on {device.type}"
        cases.append(Case(label, (logits, tokens)))
    return cases


def _ce(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)


PREV_TOKEN_LOSS = Exercise(
    reference=prev_token_loss,
    cases=_loss_cases,
    traps=[
        *[
            Trap(
                "the targets are not shifted: every position names its own token",
                "At position t the answer is the token at t - 1: compare logits[..., 1:, :] with tokens[..., :-1].",
                own,
            )
            for own in (
                lambda logits, tokens: _ce(logits, tokens),
                lambda logits, tokens: _ce(logits[..., 1:, :], tokens[..., 1:]),  # both cut, neither shifted
                lambda logits, tokens: _ce(logits[..., :-1, :], tokens[..., :-1]),
            )
        ],
        Trap(
            "shifted the wrong way: every position names the next token",
            "A causal head cannot see the next token. Position t names the token at t - 1: "
            "logits[..., 1:, :] against tokens[..., :-1].",
            lambda logits, tokens: _ce(logits[..., :-1, :], tokens[..., 1:]),
        ),
        Trap(
            "torch.roll wrapped the last token around to position 0",
            "Position 0 has no previous token: drop it (logits[..., 1:, :]) instead of rolling the targets.",
            lambda logits, tokens: _ce(logits, tokens.roll(1, dims=-1)),
        ),
        Trap(
            "the softmax was applied before cross_entropy",
            "F.cross_entropy takes raw scores (logits) and applies log-softmax itself: do not softmax first.",
            lambda logits, tokens: _ce(torch.softmax(logits[..., 1:, :], dim=-1), tokens[..., :-1]),
        ),
        Trap(
            "the losses were summed instead of averaged",
            "Take the mean over every position and sequence (F.cross_entropy's default), so the loss "
            "does not grow with the batch and the learning rate keeps its meaning.",
            lambda logits, tokens: _ce(logits[..., 1:, :], tokens[..., :-1], reduction="sum"),
        ),
    ],
)

EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (HEAD_FORWARD, PREV_TOKEN_LOSS, TRAIN_HEAD)}
