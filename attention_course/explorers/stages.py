"""One attention head in stages, and the arithmetic of any cell in words (no widgets, no plots).

Shared by the stage stepper, the cell explainer and the pipeline view: the stages of
the head on a small example (the student's functions where they run, each missing
step worked out inline), whose function made each step, and every cell's arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from .choosing import Choice, StudentFunctionError, banner_html, choose, fallback
from .compare import Difference, compare, is_empty, looks_words, same, sum_words, weight_guesses
from .numeric import fmt, fmt_list

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
    differences: dict[str, Difference] = field(default_factory=dict)

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
        return f"{tok}({i})" if twice else tok  # positions count from 0, as in the lessons

    @property
    def first_difference(self) -> Difference | None:
        """The first stage, in the head's order, whose shown matrix departs from the lesson's arithmetic."""
        return next(iter(self.differences.values()), None)

    def yours(self, key: str) -> bool:
        """Whether the student's own function made the matrix ``key``."""
        c = self.choices.get(self.made_by.get(key, ""))
        return c is not None and c.yours

    def stage_number(self, key: str) -> str:
        """How the stage stepper names the stage that shows matrix ``key`` ("stage 2, scaled")."""
        if key in ("Q", "K", "V"):
            return f"{key} (before stage 1)"
        shown = {"allowed": "masked"}.get(key, key)
        for n, s in enumerate(self.stages(), 1):
            if s.key == shown:
                return f"stage {n}, {s.title}" + (": the causal mask" if key == "allowed" else "")
        return key

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
    or not the student's is worked out here, inline. Each function gets copies of its
    inputs, so one that changes them in place cannot alter what the explorer shows.
    When ``attention`` is the student's own, its (O, A) are shown for the last two stages.
    """
    choices = dict(choices or {})

    def yours(name: str) -> Callable | None:
        c = choices.get(name)
        return c.fn if c is not None and c.yours else None

    made_by = {"Q": "project", "K": "project", "V": "project", "S": "scores", "scaled": "scaled_scores"}
    if yours("project"):
        Q, K, V = (_tensor64(t) for t in yours("project")(X.clone(), W_q.clone(), W_k.clone(), W_v.clone()))
    else:
        X64 = _tensor64(X)  # (T, d_model) times (d_model, d_k | d_v)
        Q, K, V = X64 @ _tensor64(W_q), X64 @ _tensor64(W_k), X64 @ _tensor64(W_v)
    S = _tensor64(yours("scores")(Q.clone(), K.clone())) if yours("scores") else Q @ K.mT  # (T, T)
    if yours("scaled_scores"):
        scaled = _tensor64(yours("scaled_scores")(Q.clone(), K.clone()))
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
            masked = _tensor64(yours("apply_mask")(scaled.clone(), allowed.clone()))
        else:
            masked = scaled.masked_fill(~allowed, -math.inf)
        made_by.update(allowed="causal_mask", masked="apply_mask")
    if yours("softmax"):
        A = _tensor64(yours("softmax")(masked.clone(), dim=-1))
    else:
        A = torch.softmax(masked, dim=-1).nan_to_num(nan=0.0)  # a row with no allowed key: zeros
    O = _tensor64(yours("mix")(A.clone(), V.clone())) if yours("mix") else A @ V
    made_by.update(A="softmax", O="mix")
    if yours("attention"):
        mask = None if allowed is None else allowed.clone()
        O, A = (_tensor64(t) for t in yours("attention")(Q.clone(), K.clone(), V.clone(), mask=mask))
        made_by.update(A="attention", O="attention")
    feats = tuple(features) if features else tuple(f"x{c}" for c in range(X.shape[-1]))
    identity_v = W_v.shape[0] == W_v.shape[1] and torch.equal(W_v, torch.eye(W_v.shape[0], dtype=W_v.dtype))
    value_names = feats if (features and identity_v) else tuple(f"d{c}" for c in range(V.shape[-1]))
    st = Stages(
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
    st.differences.update(_differences(st))
    return st


def _soft(Z: torch.Tensor) -> torch.Tensor:
    """Softmax of each row, a row with no allowed key giving zeros (the course's contract). Rows only:
    the student package holds no function that answers an exercise (``python -m grader release``)."""
    return torch.softmax(Z, dim=-1).nan_to_num(nan=0.0)


def _expected(st: Stages) -> dict[str, torch.Tensor]:
    """What the lesson's arithmetic gives for each stage from the stages shown before it."""
    want = {"Q": st.X @ st.W_q, "K": st.X @ st.W_k, "V": st.X @ st.W_v, "S": st.Q @ st.K.mT}
    want["scaled"] = st.Q @ st.K.mT / math.sqrt(st.d_k)
    before = st.scaled
    if st.causal:
        want["allowed"] = torch.ones(st.T, st.T).tril().bool()  # key j <= query i
        want["masked"] = st.scaled.masked_fill(~st.allowed, -math.inf)
        before = st.masked
    want["A"] = _soft(before)
    want["O"] = st.A @ st.V
    return want


def _guesses(st: Stages) -> dict[str, torch.Tensor]:
    """The weights some usual mistakes give on this example, named."""
    S, d = st.Q @ st.K.mT, st.d_k
    scaled = S / math.sqrt(d)
    allowed = st.allowed

    def mask(Z):
        return Z if allowed is None else Z.masked_fill(~allowed, -math.inf)

    out = {}
    if st.made_by.get("A") == "attention":
        out["the 1/sqrt(d_k) scaling is left out (softmax of the raw scores)"] = _soft(mask(S))
        out["the scores are divided by d_k instead of sqrt(d_k)"] = _soft(mask(S / d))
        if allowed is not None:
            out["the mask is not applied"] = _soft(scaled)
            out["the mask is inverted (True taken as 'blocked')"] = _soft(
                scaled.masked_fill(allowed, -math.inf)
            )
            out["the mask is applied after the softmax, so rows no longer sum to 1"] = _soft(scaled) * allowed
            out["hidden scores are set to 0 instead of -inf"] = _soft(scaled.masked_fill(~allowed, 0.0))
    out["softmax runs down the columns (dim -2) instead of along each row"] = _soft(
        (st.masked if st.causal else st.scaled).mT
    ).mT
    return out


def _differences(st: Stages) -> dict[str, Difference]:
    """Every shown stage that departs from the lesson's arithmetic on the stages shown before it, in order."""
    want = _expected(st)
    shown = {
        "Q": st.Q,
        "K": st.K,
        "V": st.V,
        "S": st.S,
        "scaled": st.scaled,
        "allowed": st.allowed,
        "masked": st.masked,
        "A": st.A,
        "O": st.O,
    }
    root = math.sqrt(st.d_k)
    hints = {
        1 / root: f"as if divided by d_k = {st.d_k} rather than sqrt({st.d_k}) = {root:.3g}",
        root: "as if not divided by sqrt(d_k) at all",
        float(st.d_k): "as if multiplied by sqrt(d_k) rather than divided",
    }
    out = {}
    for key, expected in want.items():
        got = shown[key]
        cols = st.value_names if key in ("V", "O") else None

        def name(ix, key=key, cols=cols):
            i, j = ix
            if key in ("Q", "K", "V", "O"):
                col = cols[j] if cols else f"d{j}"
                return f"{key}[{st.label(i)}, {col}]"
            if key == "allowed":
                return f"query {i} '{st.label(i)}' looking at key {j} '{st.label(j)}'"
            return f"{key}[{st.label(i)}, {st.label(j)}]"

        what = {"A": "weight", "O": "output", "Q": "entry", "K": "entry", "V": "entry"}.get(key, "score")
        diff = compare(
            key,
            st.stage_number(key),
            got,
            expected,
            st.made_by.get(key, ""),
            st.yours(key),
            name,
            what,
            hints if key in ("scaled",) else None,
        )
        if diff is None:
            continue
        if key == "A":
            guess = weight_guesses(_guesses(st), got)
            if guess:
                diff = replace(diff, words=f"{diff.words}; these are the weights you get when {guess}")
        out[key] = diff
    return out


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


# -------------------------------------------------------- arithmetic, in words


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


SPANS = {  # the stages whose arithmetic an explanation of a cell of each matrix walks through
    "Q": ("Q",),
    "K": ("K",),
    "V": ("V",),
    "S": ("S",),
    "scaled": ("scaled",),
    "masked": ("allowed", "scaled", "masked"),
    "A": ("A",),
    "O": ("O",),
}


def check_line(st: Stages, key: str, got: float, want: float, dp: int = 2) -> str:
    """Whether the number a cell shows is the number its arithmetic gives, and if not, where that starts.

    Said only where the student's function made the cell or one it is built from in
    this arithmetic; the built-in arithmetic on built-in inputs needs no check.
    """
    span = SPANS.get(key, (key,))
    makers = [st.made_by.get(k, "") for k in span]
    yours = [m for k, m in zip(span, makers) if st.yours(k)]
    if same(got, want) or (math.isfinite(got) and math.isclose(got, want, abs_tol=10 ** (-dp - 1))):
        return f"your `{st.made_by.get(key)}` gave {fmt(got, dp)} here: it matches." if st.yours(key) else ""
    if st.yours(key):
        return f"your `{st.made_by[key]}` gave {fmt(got, dp)} here, but the arithmetic above gives {fmt(want, dp)}."
    start = next((st.differences[k] for k in span if k in st.differences), None)
    where = f": the difference starts at {start.title}{start.by}" if start is not None else ""
    if not (yours or start):
        return ""
    return f"this cell shows {fmt(got, dp)}, but the arithmetic above gives {fmt(want, dp)}{where}."


def mask_line(st: Stages, i: int, j: int, scaled: float) -> tuple[str, float]:
    """What the mask shown does to score (i, j), in words, and the score it leaves (positions count from 0)."""
    name, key = st.label(i), st.label(j)
    after = j > i
    order = (
        f"'{key}' (position {j}) comes after '{name}' (position {i})"
        if after
        else f"'{key}' (position {j}) is not after '{name}' (position {i})"
    )
    if bool(st.allowed[i, j]) and not after:
        return f"mask: {order}: allowed, the score stays {fmt(scaled)}", scaled
    if not bool(st.allowed[i, j]) and after:
        return f"mask: {order}: not allowed, the score becomes -inf", -math.inf
    if after:
        return (
            f"mask: {order}, yet the mask shown allows it: the score stays {fmt(scaled)} "
            "(the lesson's causal mask hides it)",
            scaled,
        )
    return (
        f"mask: {order}, yet the mask shown hides it: the score becomes -inf (the lesson's causal mask allows it)",
        -math.inf,
    )


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
            matrix, i, j, title, lines, want, (), check_line(st, matrix, M[i, j].item(), want, 2)
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
        else:
            line, value = mask_line(st, i, j, scaled)
            lines.append(line)
        inputs = tuple(("Q", i, c) for c in range(st.d_k)) + tuple(("K", j, c) for c in range(st.d_k))
        title = f"S[{name}, {key}]: how well the query of '{name}' matches the key of '{key}'"
        check = check_line(st, "masked" if st.causal else "scaled", st.masked[i, j].item(), value, 2)
        return Explanation("S", i, j, title, tuple(lines), value, inputs, check)

    if matrix == "A":
        key = st.label(j)
        row = st.masked[i].tolist()
        shifted, top, exps, total, weights = _softmax_steps(row)
        where = "S / sqrt(d_k), masked" if st.causal else "S / sqrt(d_k)"
        lines = [
            f"row '{name}' of {where}: {fmt_list(row)}",
            f"minus the row max {fmt(top)}: {fmt_list(shifted)}"
            if total > 0
            else "every score is -inf: no row max",
            f"exp(x - max): {fmt_list(exps, 3)}",
            f"row sum: {' + '.join(fmt(e, 3) for e in exps)} = {fmt(total, 3)}",
        ]
        if total > 0:
            lines.append(
                f"/ row sum: A[{name}, {key}] = {fmt(exps[j], 3)} / {fmt(total, 3)} = {fmt(weights[j], 3)}"
            )
        else:
            lines.append("every key is masked: the whole row is 0, never NaN, and so is the output row")
        lines.append(f"the whole row: {fmt_list(weights, 3)} ({sum_words(weights)})")
        if not math.isfinite(row[j]):
            lines.append(f"'{key}' is masked: exp(-inf) = 0, so it gets no attention at all")
        inputs = tuple(("S", i, c) for c in range(st.T))
        title = f"A[{name}, {key}]: the share of its attention '{name}' gives to '{key}'"
        check = check_line(st, "A", st.A[i, j].item(), weights[j], 3)
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
    return Explanation("O", i, j, title, lines, want, inputs, check_line(st, "O", st.O[i, j].item(), want, 2))


def explain_row(st: Stages, i: int) -> list[str]:
    """Follow one token's row through every matrix, in words and numbers read from the matrices shown."""
    name = st.label(i)
    a = st.A[i].tolist()
    o = st.O[i].tolist()
    lines = [
        f"Following '{name}' (query {i}; positions count from 0 to {st.T - 1})",
        f"its query q_{name} = {fmt_list(st.Q[i].tolist())}",
        f"raw scores q_{name} . k_j: {fmt_list(st.S[i].tolist())}",
        f"scaled by 1/sqrt({st.d_k}): {fmt_list(st.scaled[i].tolist())}",
    ]
    if st.causal:
        lines.append(f"after the causal mask: {fmt_list(st.masked[i].tolist())}")
    labels = [st.label(j) for j in range(st.T)]
    lines.append(f"weights A: {fmt_list(a, 3)} ({sum_words(a)}): {looks_words(name, a, labels)}")
    if is_empty(o):
        lines.append(f"output O: {fmt_list(o)}: all 0")
    else:
        big = max(range(len(o)), key=lambda c: abs(o[c]) if math.isfinite(o[c]) else -1.0)
        lines.append(f"output O: {fmt_list(o)}: largest along '{st.value_names[big]}'")
    return lines  # where the head first departs from the lesson: in the banner (``_sources``)


def difference_html(st: Stages) -> str:
    """Where the head first departs from the lesson, for a saved copy (the live banner says it on screen)."""
    diff = st.first_difference
    return "" if diff is None else f"<p style='color:#a33c00'>{_code(diff.line())}</p>"


# ----------------------------------------------- whose function made each step


LESSON_OF = {
    "project": "lesson 01",
    "scores": "lesson 02",
    "scaled_scores": "lesson 03",
    "causal_mask": "lesson 04",
    "apply_mask": "lesson 04",
    "softmax": "lesson 05",
    "mix": "lesson 06",
    "attention": "lesson 07",
}


def _stage_choices(funcs: dict) -> dict[str, Choice]:
    return {name: choose(name, fn) for name, fn in funcs.items() if fn is not None}


def _stages(example: str, causal, choices: dict[str, Choice]) -> Stages:
    """The stages, with the built-in version standing in for any of the student's functions that fails."""
    while True:
        try:
            return example_stages(example, causal, choices)
        except StudentFunctionError as error:
            choices[error.name] = fallback(error)


def _sources(st: Stages, choices: dict[str, Choice], lead: str = "") -> tuple[str, str]:
    """Banner HTML and figure footer: whose function made each step (built-ins named, with their lesson),
    and where the head first departs from the lesson: said once, here, across the explorer's width.

    ``lead``: HTML that opens the banner's line (the example's name).
    """
    steps = ["scaled_scores"]
    if not ("attention" in choices and choices["attention"].yours):
        steps += (["causal_mask", "apply_mask"] if st.causal else []) + ["softmax", "mix"]
    builtin = [n for n in steps if n not in choices]
    more = []
    if builtin:
        names = ", ".join(f"<code>{n}</code> ({LESSON_OF[n]})" for n in builtin)
        more.append(f"<div class='ac-source ac-source-builtin'><b>[built-in]</b> {names}</div>")
    diff = st.first_difference
    if diff is not None:
        more.append(
            "<div class='ac-source ac-difference' style='color:#a33c00'><b>[differs]</b> "
            + _code(diff.line())
            + "</div>"
        )
    html_out = banner_html(list(choices.values()), more, lead)
    footer = "  |  ".join(
        [f"{c.name}: {c.source}" for c in choices.values()] + [f"{n}: built-in" for n in builtin]
    )
    return html_out, footer


def _code(text: str) -> str:
    """Text as HTML, `name` shown as code."""
    import html
    import re

    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
