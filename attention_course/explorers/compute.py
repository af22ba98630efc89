"""The pure computation behind the explorers: numbers and text, no widgets, no plots.

Everything an explorer shows is computed here first, so it can be tested without a
browser: the head-dimension sample and its entropy, the colour soft dictionary, the
stages of one attention head and the term-by-term arithmetic of any cell.

Each view runs the student's functions where they are given; where one is missing
(a stub, or not written yet) the view works that step out inline, as part of the
view. There is deliberately no stand-alone version of any exercise here: nothing a
student could call in place of writing their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .backend import Choice

# ------------------------------------------------------------------ formatting


def fmt(x: float, dp: int = 2) -> str:
    """A number as the lessons write it: -inf, whole numbers without decimals, else ``dp`` places."""
    x = float(x)
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    if math.isnan(x):
        return "nan"
    if abs(x - round(x)) < 1e-9:
        return str(int(round(x)))
    text = f"{x:.{dp}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def fmt_list(xs: Sequence[float], dp: int = 2) -> str:
    return "[" + ", ".join(fmt(x, dp) for x in xs) + "]"


# --------------------------------------------------------------------- entropy


def entropy(weights: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Shannon entropy (in nats) of each distribution along ``dim``; 0 log 0 counts as 0.

    Shapes: weights (..., n) -> (...). A one-hot row gives 0, a uniform row over n keys ln(n).
    """
    w = weights.detach().to(torch.float64)
    logs = torch.where(w > 0, torch.log(w.clamp_min(1e-300)), torch.zeros_like(w))
    return (-(w * logs).sum(dim=dim)).clamp_min(0.0)


# -------------------------------------------------------------- head dimension

HEAD_TOKENS = ("a", "small", "cat", "sat", "on", "the", "warm", "mat")
D_K_MAX = 128
SATURATED = 0.2  # nats: below this a row is "near one-hot" (about 1.1 keys share it)
CURVE_D_K = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # log-spaced: the entropy curve's points
HEAD_SEED = 4
HEAD_ROW = 5  # "the": saturates at d_k = 64 unscaled with this seed


def draw_head_vectors(seed: int, T: int = len(HEAD_TOKENS), d_max: int = D_K_MAX):
    """Seeded queries and keys with unit-variance components; a d_k view uses the first d_k columns.

    Shapes: -> Q (T, d_max), K (T, d_max).
    """
    g = torch.Generator().manual_seed(int(seed))
    return torch.randn(T, d_max, generator=g), torch.randn(T, d_max, generator=g)


@dataclass(frozen=True)
class HeadView:
    """One setting of the head-dimension explorer, computed.

    Shapes: raw, scaled, weights (T, T); row_weights (T,).
    """

    d_k: int
    scale: bool
    seed: int
    row: int
    tokens: tuple[str, ...]
    raw: torch.Tensor
    scaled: torch.Tensor
    weights: torch.Tensor
    raw_std: float
    scaled_std: float
    row_weights: list[float]
    row_entropy: float
    mean_entropy: float

    @property
    def shown(self) -> torch.Tensor:
        """The scores that go into softmax: scaled when the toggle is on."""
        return self.scaled if self.scale else self.raw

    @property
    def top(self) -> tuple[str, float]:
        j = max(range(len(self.row_weights)), key=self.row_weights.__getitem__)
        return self.tokens[j], self.row_weights[j]

    @property
    def effective_keys(self) -> float:
        """exp(entropy): how many keys the row spreads over (1 = one-hot, T = uniform)."""
        return math.exp(self.row_entropy)

    @property
    def saturated(self) -> bool:
        return self.row_entropy < SATURATED

    def summary(self) -> str:
        """The readout in words, with a hint that invites the next move."""
        name, w = self.top
        T = len(self.tokens)
        lines = [
            f"d_k = {self.d_k}, {'scaled by 1/sqrt(d_k)' if self.scale else 'not scaled'} (seed {self.seed})",
            f"score spread: raw std {self.raw_std:.2f}, scaled std {self.scaled_std:.2f}",
            f"row '{self.tokens[self.row]}': entropy {self.row_entropy:.3f} nats "
            f"(about {self.effective_keys:.1f} of {T} keys; uniform would be {math.log(T):.2f}), "
            f"top weight {w:.2f} on '{name}'",
        ]
        if self.d_k == 1:
            lines.append("At d_k = 1, sqrt(d_k) = 1: scaling changes nothing. Drag d_k up.")
        elif self.saturated and not self.scale:
            lines.append(
                "Saturated: one key takes almost all the weight, and softmax's gradient almost vanishes. "
                "Turn on scaling."
            )
        elif self.saturated:
            lines.append(
                "Still peaked even though scaled: this sample has one clear winner. Try another sample."
            )
        elif self.scale:
            lines.append("Scaled: the spread stays near 1 whatever d_k is, so the weights stay spread out.")
        else:
            lines.append("Not saturated yet: drag d_k up and watch the spread and the entropy.")
        return "\n".join(lines)


def head_view(
    Q_pool: torch.Tensor,
    K_pool: torch.Tensor,
    d_k: int,
    scale: bool,
    row: int = HEAD_ROW,
    seed: int = HEAD_SEED,
    scaled_scores: Callable | None = None,
    softmax: Callable | None = None,
    tokens: Sequence[str] = HEAD_TOKENS,
) -> HeadView:
    """Raw and scaled scores of the first d_k dimensions, the softmax weights and their entropy.

    ``scaled_scores`` and ``softmax`` are the student's (None: worked out here).
    """
    Q, K = Q_pool[:, :d_k], K_pool[:, :d_k]  # (T, d_k)
    raw = (Q @ K.T).double()  # (T, T): q_i . k_j
    if scaled_scores is not None:
        scaled = _as_double(scaled_scores(Q, K))  # (T, T): the student's function
    else:
        scaled = raw / math.sqrt(d_k)
    shown = scaled if scale else raw
    if softmax is not None:
        weights = _as_double(softmax(shown, dim=-1))  # (T, T)
    else:
        weights = torch.softmax(shown, dim=-1)  # no row of this sample is masked
    H = entropy(weights)  # (T,)
    return HeadView(
        d_k=int(d_k),
        scale=bool(scale),
        seed=int(seed),
        row=int(row),
        tokens=tuple(tokens),
        raw=raw,
        scaled=scaled,
        weights=weights,
        raw_std=raw.std().item(),
        scaled_std=scaled.std().item(),
        row_weights=weights[row].tolist(),
        row_entropy=H[row].item(),
        mean_entropy=H.mean().item(),
    )


def expected_entropy(
    d_values: Sequence[int],
    scaled_scores: Callable | None = None,
    softmax: Callable | None = None,
    T: int = len(HEAD_TOKENS),
    n: int = 128,
    seed: int = 2024,
) -> tuple[list[float], list[float]]:
    """Average row entropy over n random samples, unscaled and scaled, for each d_k.

    Shapes: per d_k, Q and K (n, T, d_k) -> weights (n, T, T) -> entropy (n, T) -> one mean.
    ``scaled_scores`` and ``softmax`` are the student's (None: worked out here).
    """
    g = torch.Generator().manual_seed(seed)
    Qs = torch.randn(n, T, max(d_values), generator=g)
    Ks = torch.randn(n, T, max(d_values), generator=g)
    unscaled, scaled = [], []
    for d in d_values:
        Q, K = Qs[..., :d], Ks[..., :d]
        raw = Q @ K.transpose(-2, -1)  # (n, T, T)
        by_root = scaled_scores(Q, K) if scaled_scores is not None else raw / math.sqrt(d)
        for S, into in ((raw, unscaled), (by_root, scaled)):
            W = softmax(S, dim=-1) if softmax is not None else torch.softmax(S, dim=-1)
            into.append(entropy(_as_double(W)).mean().item())
    return unscaled, scaled


def spread_line(d_k: int, seed: int, score_spread: Callable | None = None, n: int = 2000) -> str:
    """One line of the readout: the std of n raw and scaled dot products at this d_k.

    ``score_spread`` is the student's (None: the spread is measured here).
    """
    g = torch.Generator().manual_seed(int(seed))
    if score_spread is not None:
        raw, scaled = score_spread(d_k, n, g)
        who = "your"
    else:
        q, k = torch.randn(n, d_k, generator=g), torch.randn(n, d_k, generator=g)  # (n, d_k)
        raw = (q * k).sum(-1).std().item()
        scaled, who = raw / math.sqrt(d_k), "the built-in"
    return f"{who} score_spread({d_k}, n={n}): raw std {raw:.2f}, scaled std {scaled:.2f}"


def _as_double(t) -> torch.Tensor:
    return torch.as_tensor(t).detach().to("cpu", torch.float64)


# ------------------------------------------------------------ colour dictionary


@dataclass(frozen=True)
class ColourView:
    """One setting of the colour soft dictionary, computed (plain Python numbers)."""

    query: tuple[float, ...]
    keys: dict[str, tuple[float, ...]]
    values: dict[str, tuple[float, ...]]
    sharpness: float
    scores: dict[str, float]
    weights: dict[str, float]
    output: tuple[float, ...]

    @property
    def rgb(self) -> tuple[int, int, int]:
        """The blended colour: (red, green) amounts, no blue, clipped to 0..255."""
        r, g = (self.output + (0.0, 0.0))[:2]
        return (_clip(r), _clip(g), 0)

    @property
    def hex(self) -> str:
        return "#{:02x}{:02x}{:02x}".format(*self.rgb)

    def summary(self) -> str:
        names = list(self.keys)
        top = max(names, key=self.weights.__getitem__)
        lines = [
            f"query {fmt_list(self.query)}, sharpness {fmt(self.sharpness, 2)}",
            "scores = sharpness * (query . key) / sqrt(2): "
            + ", ".join(f"{n} {self.scores[n]:.2f}" for n in names),
            "weights: " + ", ".join(f"{n} {self.weights[n]:.2f}" for n in names),
            f"blend: [{self.output[0]:.0f}, {self.output[1]:.0f}] (red, green amounts) = colour {self.hex}",
        ]
        w = self.weights[top]
        if w > 0.9:
            lines.append(f"Almost a hard look-up: '{top}' takes {w:.0%}. Lower the sharpness to blend.")
        elif w < 1.5 / len(names):
            lines.append("Nearly an even blend: raise the sharpness to pick a winner.")
        else:
            lines.append(f"'{top}' leads with {w:.0%}; the others still colour the blend.")
        return "\n".join(lines)


def _clip(x: float) -> int:
    return int(round(min(255.0, max(0.0, float(x)))))


def colour_scores(
    query: Sequence[float], keys: dict[str, Sequence[float]], sharpness: float
) -> dict[str, float]:
    """score(name) = sharpness * (query . key) / sqrt(len(query))."""
    d = len(query)
    return {n: sharpness * sum(q * k for q, k in zip(query, key)) / math.sqrt(d) for n, key in keys.items()}


def colour_view(
    query: Sequence[float],
    keys: dict[str, Sequence[float]],
    values: dict[str, Sequence[float]],
    sharpness: float,
    soft_lookup: Callable | None = None,
) -> ColourView:
    """Weights and blended colour of one soft look-up, with the scores that led to them.

    ``soft_lookup`` is the student's (None: the look-up is worked out here).
    """
    query = [float(q) for q in query]
    keys = {n: [float(x) for x in k] for n, k in keys.items()}
    values = {n: [float(x) for x in v] for n, v in values.items()}
    scores = colour_scores(query, keys, float(sharpness))
    if soft_lookup is not None:
        weights, output = soft_lookup(query, keys, values, float(sharpness))
    else:
        weights = _colour_weights(scores)
        width = len(next(iter(values.values())))
        output = [sum(weights[n] * values[n][c] for n in keys) for c in range(width)]
    return ColourView(
        query=tuple(query),
        keys={n: tuple(k) for n, k in keys.items()},
        values={n: tuple(v) for n, v in values.items()},
        sharpness=float(sharpness),
        scores=scores,
        weights={n: float(weights[n]) for n in keys},
        output=tuple(float(x) for x in output),
    )


def _colour_weights(scores: dict[str, float]) -> dict[str, float]:
    """The explorer's weights from its scores (softmax over the keys, largest score first subtracted)."""
    top = max(scores.values())
    exps = {n: math.exp(x - top) for n, x in scores.items()}
    total = sum(exps.values())
    return {n: e / total for n, e in exps.items()}


def colour_curves(
    query: Sequence[float],
    keys: dict[str, Sequence[float]],
    values: dict[str, Sequence[float]],
    grid: Sequence[float],
    soft_lookup: Callable | None = None,
) -> dict[str, list[float]]:
    """Each key's weight as the sharpness runs over ``grid`` (``soft_lookup``: the student's, or None)."""
    curves: dict[str, list[float]] = {n: [] for n in keys}
    for s in grid:
        if soft_lookup is not None:
            weights, _ = soft_lookup(list(query), dict(keys), dict(values), float(s))
        else:
            weights = _colour_weights(colour_scores(query, keys, float(s)))
        for n in keys:
            curves[n].append(float(weights[n]))
    return curves


# --------------------------------------------------------- one head, in stages


@dataclass(frozen=True)
class Stage:
    """One step of the stage stepper: a matrix, its name and the formula that made it."""

    key: str  # "S", "scaled", "masked", "A", "O"
    title: str
    formula: str
    matrix: torch.Tensor  # (T, T) or (T, d_v)
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Stages:
    """Every matrix of one attention head on a small example, float64 on the CPU.

    Shapes: X (T, d_model), Q and K (T, d_k), V (T, d_v), S, scaled, masked and A (T, T), O (T, d_v).
    ``made_by`` says which function produced each matrix; ``choices`` whose version it was.
    """

    title: str
    tokens: tuple[str, ...]
    features: tuple[str, ...]
    value_names: tuple[str, ...]
    X: torch.Tensor
    W_q: torch.Tensor
    W_k: torch.Tensor
    W_v: torch.Tensor
    Q: torch.Tensor
    K: torch.Tensor
    V: torch.Tensor
    S: torch.Tensor
    scaled: torch.Tensor
    allowed: torch.Tensor | None
    masked: torch.Tensor
    A: torch.Tensor
    O: torch.Tensor
    choices: dict[str, Choice] = field(default_factory=dict)
    made_by: dict[str, str] = field(default_factory=dict)

    @property
    def T(self) -> int:
        return len(self.tokens)

    @property
    def d_k(self) -> int:
        return self.Q.shape[-1]

    @property
    def causal(self) -> bool:
        return self.allowed is not None

    def label(self, i: int) -> str:
        """A token's name, with its position when the name occurs twice ("the" twice in "The cat sat on the")."""
        tok = self.tokens[i]
        twice = sum(t.lower() == tok.lower() for t in self.tokens) > 1
        return f"{tok}({i + 1})" if twice else tok

    def stages(self) -> list[Stage]:
        keys = tuple(self.label(j) for j in range(self.T))
        out = [
            Stage("S", "raw dot products", "S = Q K^T", self.S, keys),
            Stage("scaled", "scaled", f"S / sqrt(d_k) = S / sqrt({self.d_k})", self.scaled, keys),
        ]
        if self.causal:
            out.append(
                Stage(
                    "masked", "masked", "causal mask: -inf where key j comes after query i", self.masked, keys
                )
            )
        out.append(Stage("A", "weights", "A = softmax of each row", self.A, keys))
        out.append(Stage("O", "output", "O = A V", self.O, self.value_names))
        return out


def _tensor64(t) -> torch.Tensor:
    return torch.as_tensor(t).detach().to("cpu", torch.float64)


def compute_stages(
    tokens: Sequence[str],
    X: torch.Tensor,
    W_q: torch.Tensor,
    W_k: torch.Tensor,
    W_v: torch.Tensor,
    causal: bool,
    choices: dict[str, Choice] | None = None,
    features: Sequence[str] | None = None,
    title: str = "",
) -> Stages:
    """Run one head step by step with the chosen functions (the student's where they run).

    ``choices`` maps function names to :class:`Choice`; a step whose function is missing
    or not the student's is worked out here, inline. When ``attention`` is the
    student's own, its (O, A) are shown for the last two stages.
    """
    choices = dict(choices or {})

    def yours(name: str) -> Callable | None:
        c = choices.get(name)
        return c.fn if c is not None and c.yours else None

    made_by = {"Q": "project", "K": "project", "V": "project", "S": "scores", "scaled": "scaled_scores"}
    if yours("project"):
        Q, K, V = (_tensor64(t) for t in yours("project")(X, W_q, W_k, W_v))
    else:
        X64 = _tensor64(X)  # (T, d_model) times (d_model, d_k | d_v)
        Q, K, V = X64 @ _tensor64(W_q), X64 @ _tensor64(W_k), X64 @ _tensor64(W_v)
    S = _tensor64(yours("scores")(Q, K)) if yours("scores") else Q @ K.mT  # (T, T)
    if yours("scaled_scores"):
        scaled = _tensor64(yours("scaled_scores")(Q, K))
    else:
        scaled = Q @ K.mT / math.sqrt(Q.shape[-1])
    allowed = None
    masked = scaled
    if causal:
        T = len(tokens)
        if yours("causal_mask"):
            allowed = torch.as_tensor(yours("causal_mask")(T)).to("cpu", torch.bool)
        else:
            allowed = torch.ones(T, T).tril().bool()  # key j <= query i
        if yours("apply_mask"):
            masked = _tensor64(yours("apply_mask")(scaled, allowed))
        else:
            masked = scaled.masked_fill(~allowed, -math.inf)
        made_by["masked"] = "apply_mask"
    if yours("softmax"):
        A = _tensor64(yours("softmax")(masked, dim=-1))
    else:
        A = torch.softmax(masked, dim=-1).nan_to_num(nan=0.0)  # a row with no allowed key: zeros
    O = _tensor64(yours("mix")(A, V)) if yours("mix") else A @ V
    made_by.update(A="softmax", O="mix")
    if yours("attention"):
        O, A = (_tensor64(t) for t in yours("attention")(Q, K, V, mask=allowed))
        made_by.update(A="attention", O="attention")
    feats = tuple(features) if features else tuple(f"x{c}" for c in range(X.shape[-1]))
    identity_v = W_v.shape[0] == W_v.shape[1] and torch.equal(W_v, torch.eye(W_v.shape[0], dtype=W_v.dtype))
    value_names = feats if (features and identity_v) else tuple(f"d{c}" for c in range(V.shape[-1]))
    return Stages(
        title=title,
        tokens=tuple(tokens),
        features=feats,
        value_names=value_names,
        X=_tensor64(X),
        W_q=_tensor64(W_q),
        W_k=_tensor64(W_k),
        W_v=_tensor64(W_v),
        Q=Q,
        K=K,
        V=V,
        S=S,
        scaled=scaled,
        allowed=allowed,
        masked=masked,
        A=A,
        O=O,
        choices=choices,
        made_by=made_by,
    )


def example_stages(name: str, causal: bool | None = None, choices: dict[str, Choice] | None = None) -> Stages:
    """Stages of a course example: "love_cats" (no mask) or "cat_sat" (causal)."""
    from attention_course import data

    titles = {"love_cats": "I love cats", "cat_sat": "The cat sat on the"}
    if name not in titles:
        raise ValueError(f"unknown example {name!r}: choose one of {sorted(titles)}")
    ex = getattr(data, name)()
    if causal is None:
        causal = name == "cat_sat"
    return compute_stages(
        ex.tokens, ex.X, ex.W_q, ex.W_k, ex.W_v, causal, choices, features=ex.features, title=titles[name]
    )


# ------------------------------------------------------ arithmetic, in words


@dataclass(frozen=True)
class Explanation:
    """The arithmetic that made one cell, line by line, and which cells fed it."""

    matrix: str
    i: int
    j: int
    title: str
    lines: tuple[str, ...]
    value: float
    inputs: tuple[tuple[str, int, int], ...] = ()
    check: str = ""

    @property
    def text(self) -> str:
        return "\n".join((self.title, *self.lines, *((self.check,) if self.check else ())))


MATRICES = ("Q", "K", "V", "S", "A", "O")


def _terms(a: Sequence[float], b: Sequence[float], dp: int = 2) -> str:
    return " + ".join(f"{fmt(x, dp)}*{fmt(y, dp)}" for x, y in zip(a, b))


def _softmax_steps(row: Sequence[float]) -> tuple[list[float], float, list[float], float, list[float]]:
    """minus max, exp, sum, weights of one row in plain Python (-inf entries give 0)."""
    finite = [x for x in row if math.isfinite(x)]
    top = max(finite) if finite else 0.0
    shifted = [x - top if math.isfinite(x) else -math.inf for x in row]
    exps = [math.exp(x) if math.isfinite(x) else 0.0 for x in shifted]
    total = sum(exps)
    weights = [e / total if total > 0 else 0.0 for e in exps]
    return shifted, top, exps, total, weights


def _check_line(st: Stages, key: str, got: float, want: float, dp: int) -> str:
    maker = st.made_by.get(key)
    choice = st.choices.get(maker) if maker else None
    if choice is None or not choice.yours:
        return ""
    if math.isclose(got, want, rel_tol=1e-4, abs_tol=10 ** (-dp - 1)) or (
        math.isinf(got) and math.isinf(want) and (got > 0) == (want > 0)
    ):
        return f"your `{maker}` gave {fmt(got, dp)} here: it matches."
    return f"your `{maker}` gave {fmt(got, dp)} here, but the arithmetic above gives {fmt(want, dp)}."


def explain_cell(st: Stages, matrix: str, i: int, j: int) -> Explanation:
    """The exact arithmetic behind cell (i, j) of Q, K, V, S (scaled and masked), A or O."""
    if matrix not in MATRICES:
        raise ValueError(f"matrix must be one of {MATRICES}, not {matrix!r}")
    name = st.label(i)
    if matrix in ("Q", "K", "V"):
        W = {"Q": st.W_q, "K": st.W_k, "V": st.W_v}[matrix]
        M = {"Q": st.Q, "K": st.K, "V": st.V}[matrix]
        role = {"Q": "query", "K": "key", "V": "value"}[matrix]
        x, col = st.X[i].tolist(), W[:, j].tolist()
        want = sum(a * b for a, b in zip(x, col))
        cols = st.value_names if matrix == "V" else tuple(f"d{c}" for c in range(M.shape[-1]))
        lines = (
            f"x_{name} = {fmt_list(x)}  (features: {', '.join(st.features)})",
            f"W_{role[0]}[:, {j}] = {fmt_list(col)}",
            f"{matrix}[{name}, {cols[j]}] = x_{name} . W_{role[0]}[:, {j}] = {_terms(x, col)} = {fmt(want)}",
        )
        title = f"{matrix}[{name}, {cols[j]}]: the {role} of '{name}', dimension {j}"
        return Explanation(
            matrix, i, j, title, lines, want, (), _check_line(st, matrix, M[i, j].item(), want, 2)
        )

    if matrix == "S":
        key = st.label(j)
        q, k = st.Q[i].tolist(), st.K[j].tolist()
        raw = sum(a * b for a, b in zip(q, k))
        root = math.sqrt(st.d_k)
        scaled = raw / root
        lines = [
            f"q_{name} = {fmt_list(q)},  k_{key} = {fmt_list(k)}",
            f"q_{name} . k_{key} = {_terms(q, k)} = {fmt(raw)}",
            f"/ sqrt(d_k) = {fmt(raw)} / sqrt({st.d_k}) = {fmt(raw)} / {root:.3f} = {fmt(scaled)}",
        ]
        value = scaled
        if not st.causal:
            lines.append("no mask: every token may look at every token")
        elif bool(st.allowed[i, j]):
            lines.append(
                f"mask: '{key}' (position {j + 1}) is not after '{name}' (position {i + 1}): "
                f"allowed, the score stays {fmt(scaled)}"
            )
        else:
            value = -math.inf
            lines.append(
                f"mask: '{key}' (position {j + 1}) comes after '{name}' (position {i + 1}): "
                "not allowed, the score becomes -inf"
            )
        inputs = tuple(("Q", i, c) for c in range(st.d_k)) + tuple(("K", j, c) for c in range(st.d_k))
        title = f"S[{name}, {key}]: how well the query of '{name}' matches the key of '{key}'"
        check = _check_line(st, "masked" if st.causal else "scaled", st.masked[i, j].item(), value, 2)
        return Explanation("S", i, j, title, tuple(lines), value, inputs, check)

    if matrix == "A":
        key = st.label(j)
        row = st.masked[i].tolist()
        shifted, top, exps, total, weights = _softmax_steps(row)
        where = "S / sqrt(d_k), masked" if st.causal else "S / sqrt(d_k)"
        lines = [
            f"row '{name}' of {where}: {fmt_list(row)}",
            f"minus the row max {fmt(top)}: {fmt_list(shifted)}",
            f"exp(x - max): {fmt_list(exps, 3)}",
            f"row sum: {' + '.join(fmt(e, 3) for e in exps)} = {fmt(total, 3)}",
        ]
        if total > 0:
            lines.append(
                f"/ row sum: A[{name}, {key}] = {fmt(exps[j], 3)} / {fmt(total, 3)} = {fmt(weights[j], 3)}"
            )
        else:
            lines.append("every key is masked: the whole row is 0, never NaN")
        lines.append(f"the whole row: {fmt_list(weights, 3)} (sums to 1)")
        if not math.isfinite(row[j]):
            lines.append(f"'{key}' is masked: exp(-inf) = 0, so it gets no attention at all")
        inputs = tuple(("S", i, c) for c in range(st.T))
        title = f"A[{name}, {key}]: the share of its attention '{name}' gives to '{key}'"
        check = _check_line(st, "A", st.A[i, j].item(), weights[j], 3)
        return Explanation("A", i, j, title, tuple(lines), weights[j], inputs, check)

    # O
    col = st.value_names[j]
    a = st.A[i].tolist()
    v = st.V[:, j].tolist()
    want = sum(x * y for x, y in zip(a, v))
    keys = [st.label(c) for c in range(st.T)]
    lines = (
        f"row '{name}' of A: {fmt_list(a, 3)}",
        f"column {col} of V (one value per key {', '.join(keys)}): {fmt_list(v)}",
        f"O[{name}, {col}] = sum over keys j of A[{name}, j] * V[j, {col}]",
        f"  = {_terms(a, v, 3)}",
        f"  = {fmt(want)}",
        f"the whole output row of '{name}': {fmt_list(st.O[i].tolist())}",
    )
    inputs = tuple(("A", i, c) for c in range(st.T)) + tuple(("V", r, j) for r in range(st.T))
    title = f"O[{name}, {col}]: the weighted sum of the value rows, weighted by row '{name}' of A"
    return Explanation(
        "O", i, j, title, lines, want, inputs, _check_line(st, "O", st.O[i, j].item(), want, 2)
    )


def explain_row(st: Stages, i: int) -> list[str]:
    """Follow one token's row through every matrix, in words and numbers."""
    name = st.label(i)
    a = st.A[i].tolist()
    o = st.O[i].tolist()
    top = max(range(st.T), key=a.__getitem__)
    big = max(range(len(o)), key=lambda c: abs(o[c]))
    lines = [
        f"Following '{name}' (query {i + 1} of {st.T})",
        f"its query q_{name} = {fmt_list(st.Q[i].tolist())}",
        f"raw scores q_{name} . k_j: {fmt_list(st.S[i].tolist())}",
        f"scaled by 1/sqrt({st.d_k}): {fmt_list(st.scaled[i].tolist())}",
    ]
    if st.causal:
        lines.append(f"after the causal mask: {fmt_list(st.masked[i].tolist())}")
    lines += [
        f"weights A: {fmt_list(a, 3)}: '{name}' looks most at '{st.label(top)}' ({a[top]:.2f})",
        f"output O: {fmt_list(o)}: largest along '{st.value_names[big]}'",
    ]
    return lines


def stage_row_lines(st: Stages, stage: Stage, i: int) -> list[str]:
    """The arithmetic of row i at one stage of the stepper."""
    name = st.label(i)
    keys = [st.label(j) for j in range(st.T)]
    if stage.key == "S":
        q = st.Q[i].tolist()
        lines = [f"S[{name}, j] = q_{name} . k_j for every key j:"]
        for j, key in enumerate(keys):
            lines.append(f"  q_{name} . k_{key} = {_terms(q, st.K[j].tolist())} = {fmt(st.S[i, j].item())}")
        return lines
    if stage.key == "scaled":
        return [
            f"divide row '{name}' by sqrt(d_k) = sqrt({st.d_k}) = {math.sqrt(st.d_k):.3f}:",
            f"  {fmt_list(st.S[i].tolist())} / {math.sqrt(st.d_k):.3f} = {fmt_list(st.scaled[i].tolist())}",
        ]
    if stage.key == "masked":
        hidden = [keys[j] for j in range(st.T) if not bool(st.allowed[i, j])]
        what = (
            f"keys after '{name}' ({', '.join(hidden)}) become -inf" if hidden else "nothing comes after it"
        )
        return [f"causal mask: {what}:", f"  {fmt_list(st.masked[i].tolist())}"]
    if stage.key == "A":
        shifted, top, exps, total, weights = _softmax_steps(st.masked[i].tolist())
        best = max(range(st.T), key=lambda j: st.A[i, j].item())
        return [
            f"softmax of row '{name}': minus the max {fmt(top)}, exp, divide by the sum {fmt(total, 3)}:",
            f"  {fmt_list(st.A[i].tolist(), 3)}",
            f"'{name}' looks most at '{keys[best]}' ({st.A[i, best].item():.2f})",
        ]
    a = st.A[i].tolist()
    terms = " + ".join(f"{fmt(w, 3)}*v_{k}" for w, k in zip(a, keys))
    return [f"O[{name}] = {terms}", f"  = {fmt_list(st.O[i].tolist())}"]
