"""Diagnoses are right or absent, correct code earns full marks, stated rules are graded.

- every known mistake's own code is named as that mistake, and no other mistake
  reproduces it on every case (lessons 01-11);
- many correct ways to write each exercise of lessons 01-07 (loops, einsum, .item(),
  float64 inside, work on copies, other orders of random draws, prints and warnings)
  pass with no message;
- a call the lesson rules out fails with the rule's words, and the patched functions
  are restored afterwards;
- score_spread cannot be passed by a constant or a lookup;
- one mistake costs one exercise: self_attention and cross_attention are checked on
  top of the reference attention.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import textwrap
import warnings

import pytest
import torch

import grader
from grader.harness import outcomes, reproduces
from grader.registry import core, exercises, references

EXERCISES = exercises()
CORE = core()  # lessons 01-07
ref = references()
TRAPS = [(name, trap) for name, ex in EXERCISES.items() for trap in ex.traps]
NEG_INF = float("-inf")
# training a head takes seconds per run: its traps are told apart in tests/test_lesson10.py
SLOW = {"train_head"}


def _message(name: str, fn) -> str:
    with pytest.raises(AssertionError) as info:
        grader.check(name, fn)
    return str(info.value)


def _diagnosis(message: str) -> str | None:
    lines = [line for line in message.splitlines() if line.strip().startswith("Diagnosis: ")]
    assert len(lines) <= 1, message
    return lines[0].strip()[len("Diagnosis: ") :] if lines else None


# ------------------------------------------------------------------ every trap, by its own code


@pytest.mark.parametrize("name, trap", TRAPS, ids=[f"{n}:{t.name}" for n, t in TRAPS])
def test_a_mistakes_own_code_is_named_as_that_mistake(name, trap, capfd):
    message = _message(name, trap.fn)
    assert _diagnosis(message) == f"{trap.name}. {trap.hint}", message
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize(
    "name, trap",
    [(n, t) for n, t in TRAPS if n not in SLOW],
    ids=[f"{n}:{t.name}" for n, t in TRAPS if n not in SLOW],
)
def test_no_other_mistake_reproduces_it_on_every_case(name, trap):
    ex = EXERCISES[name]
    records, properties = outcomes(ex, trap.fn)
    for other in ex.traps:
        if other.name != trap.name:
            assert not reproduces(ex, other, records, properties), f"{trap.name!r} looks like {other.name!r}"


def test_every_mistake_of_lessons_01_to_07_carries_an_example():
    missing = [(n, t.name) for n, ex in CORE.items() for t in ex.traps if not t.example.strip()]
    assert not missing


# ------------------------------------------------------------------ diagnoses seen wrong before


def test_softmax_ignoring_dim_is_told_so():
    message = _message("softmax", lambda Z, dim=-1: ref.softmax(Z, dim=-1))
    assert _diagnosis(message).startswith("the dim argument is ignored"), message


def test_apply_mask_filling_zero_is_told_so():
    message = _message("apply_mask", lambda S, allowed: torch.where(allowed, S, torch.zeros_like(S)))
    assert _diagnosis(message).startswith("the blocked scores were filled with 0 instead of -inf"), message


def test_softmax_without_keepdim_reaches_its_diagnosis():
    def softmax(Z, dim=-1):
        e = torch.exp(Z - Z.max(dim=dim).values)
        return e / e.sum(dim=dim, keepdim=True)

    message = _message("softmax", softmax)
    assert _diagnosis(message).startswith("the max was subtracted without keepdim"), message


def test_a_mistake_seen_on_one_case_only_is_not_named():
    """Right on 2-D inputs, wrong in another way than any trap on batches: no name is given."""

    def scaled_scores(Q, K):
        S = Q @ K.mT / math.sqrt(Q.shape[-1])
        return S if Q.dim() == 2 else S * 1.5

    message = _message("scaled_scores", scaled_scores)
    assert _diagnosis(message) is None, message
    assert "entries differ" in message


@pytest.mark.parametrize(
    "name, fn, shapes",
    [
        ("project", lambda X, W_q, W_k, W_v: (W_q @ X, W_k @ X, W_v @ X), "(9, 8) and (5, 9)"),
        ("mix", lambda A, V: V.mT @ A, "(4, 7) and (5, 7)"),
    ],
    ids=["project", "mix"],
)
def test_a_shape_error_is_put_into_words_with_both_shapes(name, fn, shapes):
    message = _message(name, fn)
    assert "it raised RuntimeError" in message
    assert f"A matrix product A @ B was given shapes {shapes}" in message, message


# ------------------------------------------------------------------ correct code of every kind


def _noisy(fn):
    def noisy(*args, **kwargs):
        print("debugging:", [tuple(a.shape) for a in args if torch.is_tensor(a)])
        print("to stderr", file=sys.stderr)
        warnings.warn("a student's own warning", UserWarning, stacklevel=1)
        return fn(*args, **kwargs)

    return noisy


def _project_loop(X, W_q, W_k, W_v):
    rows = X.reshape(-1, X.shape[-1])
    out = []
    for W in (W_q, W_k, W_v):
        projected = torch.stack([row @ W for row in rows])  # one token at a time
        out.append(projected.reshape(*X.shape[:-1], W.shape[-1]))
    return tuple(out)


def _scores_columns(Q, K):
    S = torch.empty(*Q.shape[:-1], K.shape[-2], dtype=Q.dtype, device=Q.device)
    for j in range(K.shape[-2]):
        S[..., j] = (Q * K[..., j : j + 1, :]).sum(-1)  # query against key j
    return S


def _spread_keys_first(d_k, n, generator):
    k = torch.randn(n, d_k, generator=generator)
    q = torch.randn(n, d_k, generator=generator)
    dots = torch.einsum("nd,nd->n", q, k)
    return dots.std().item(), (dots / math.sqrt(d_k)).std().item()


def _spread_one_draw_float64(d_k, n, generator):
    qk = torch.randn(2, n, d_k, generator=generator, dtype=torch.float64)
    dots = (qk[0] * qk[1]).sum(-1)
    return float(dots.std()), float((dots / d_k**0.5).std())


def _spread_column_by_column(d_k, n, generator):
    dots = torch.zeros(n)
    for _ in range(d_k):
        dots += torch.randn(n, generator=generator) * torch.randn(n, generator=generator)
    values = dots.tolist()
    scaled = [v / math.sqrt(d_k) for v in values]
    return statistics.stdev(values), statistics.stdev(scaled)


def _causal_loop(T, device=None):
    m = torch.zeros(T, T, dtype=torch.bool, device=device)
    for i in range(T):
        m[i, : i + 1] = True
    return m


def _padding_loop(lengths, T):
    m = torch.zeros(len(lengths), 1, T, dtype=torch.bool, device=lengths.device)
    for b in range(len(lengths)):
        m[b, 0, : int(lengths[b])] = True
    return m


def _padding_item(lengths, T):
    rows = [[j < lengths[b].item() for j in range(T)] for b in range(lengths.shape[0])]
    return torch.tensor(rows, dtype=torch.bool, device=lengths.device).reshape(len(rows), 1, T)


def _apply_on_a_copy(S, allowed):
    out = S.clone()
    out.masked_fill_(~allowed, NEG_INF)  # in place, but on the copy
    return out


def _apply_index(S, allowed):
    out = S.clone()
    out[~allowed.expand_as(S)] = NEG_INF
    return out


def _softmax_rows_loop(Z, dim=-1):
    moved = Z.movedim(dim, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    rows = []
    for row in flat:
        top = row.max()
        if top.item() == NEG_INF:
            rows.append(torch.zeros_like(row))
            continue
        e = torch.exp(row - top)
        rows.append(e / e.sum())
    return torch.stack(rows).reshape(moved.shape).movedim(-1, dim)


def _softmax_float64(Z, dim=-1):
    z = Z.double()
    m = z.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0.0)
    e = (z - m).exp()
    total = e.sum(dim=dim, keepdim=True)
    return (e / total.clamp_min(1e-300)).to(Z.dtype)


def _softmax_logsumexp(Z, dim=-1):
    lse = torch.logsumexp(Z, dim=dim, keepdim=True)
    return torch.where(torch.isfinite(lse), torch.exp(Z - lse), torch.zeros_like(Z))


def _softmax_in_place_on_copy(Z, dim=-1):
    e = Z.clone()
    m = e.amax(dim=dim, keepdim=True)
    e.sub_(torch.where(torch.isfinite(m), m, torch.zeros_like(m))).exp_()
    return e.div_(e.sum(dim=dim, keepdim=True).clamp_min(torch.finfo(Z.dtype).tiny))


def _lookup_loops(query, keys, values, sharpness):
    d = len(query)
    names = list(keys)
    scores = []
    for name in names:
        dot = 0.0
        for q, k in zip(query, keys[name]):
            dot += q * k
        scores.append(sharpness * dot / d**0.5)
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = math.fsum(exps)
    weights = {name: e / total for name, e in zip(names, exps)}
    m = len(values[names[0]])
    output = [0.0] * m
    for name in names:
        for c in range(m):
            output[c] += weights[name] * values[name][c]
    return weights, output


def _mix_sum(A, V):
    return (A.unsqueeze(-1) * V.unsqueeze(-3)).sum(-2)  # sum over the keys of A[i, j] V[j]


def _course_softmax(S, dim=-1):
    m = S.amax(dim=dim, keepdim=True)
    e = torch.exp(S - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    total = e.sum(dim=dim, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def _attention_course(Q, K, V, mask=None):
    S = Q @ K.mT / math.sqrt(Q.shape[-1])
    if mask is not None:
        S = S.masked_fill(~mask, NEG_INF)
    A = _course_softmax(S)
    return A @ V, A


def _attention_nan_to_num(Q, K, V, mask=None):
    S = torch.einsum("...qd,...kd->...qk", Q, K) / Q.size(-1) ** 0.5
    if mask is not None:
        S = torch.where(mask, S, NEG_INF)
    A = torch.nan_to_num(torch.softmax(S, dim=-1))  # a query with no key: 0, not NaN
    return torch.einsum("...qk,...kd->...qd", A, V), A


def _attention_float64(Q, K, V, mask=None):
    O, A = _attention_course(Q.double(), K.double(), V.double(), mask)
    return O.to(Q.dtype), A.to(Q.dtype)


def _self_inline(X, W_q, W_k, W_v, causal=True):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    S = Q @ K.mT / math.sqrt(W_q.shape[-1])
    if causal:
        T = X.shape[-2]
        S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=X.device).tril(), NEG_INF)
    return torch.softmax(S, dim=-1) @ V


def _cross_einsum(X_dec, X_enc, W_q, W_k, W_v):
    Q = torch.einsum("...td,de->...te", X_dec, W_q)
    K, V = X_enc @ W_k, X_enc @ W_v
    A = torch.softmax(Q @ K.mT / math.sqrt(Q.shape[-1]), dim=-1)
    return A @ V


CORRECT = {
    "project": [
        _project_loop,
        lambda X, W_q, W_k, W_v: tuple((X.double() @ W.double()).to(X.dtype) for W in (W_q, W_k, W_v)),
        _noisy(
            lambda X, W_q, W_k, W_v: tuple(torch.einsum("...td,de->...te", X, W) for W in (W_q, W_k, W_v))
        ),
    ],
    "scores": [
        _scores_columns,
        lambda Q, K: (Q.unsqueeze(-2) * K.unsqueeze(-3)).sum(-1),
        lambda Q, K: (Q.double() @ K.double().mT).to(Q.dtype),
        _noisy(lambda Q, K: torch.einsum("...qd,...kd->...qk", Q, K)),
    ],
    "scaled_scores": [
        lambda Q, K: (Q / math.sqrt(Q.shape[-1])) @ K.mT,
        lambda Q, K: _scores_columns(Q, K) * Q.size(-1) ** -0.5,
        lambda Q, K: (Q.double() @ K.double().mT / math.sqrt(K.shape[-1])).to(Q.dtype),
        _noisy(
            lambda Q, K: (
                torch.einsum("...qd,...kd->...qk", Q, K) / torch.tensor(float(Q.shape[-1])).sqrt().item()
            )
        ),
    ],
    "score_spread": [
        _spread_keys_first,
        _spread_one_draw_float64,
        _spread_column_by_column,
        _noisy(ref.score_spread),
    ],
    "causal_mask": [
        _causal_loop,
        lambda T, device=None: torch.ones(T, T).tril().bool().to(device),
        lambda T, device=None: torch.tensor([[j <= i for j in range(T)] for i in range(T)], device=device),
        _noisy(
            lambda T, device=None: torch.arange(T, device=device)[:, None] >= torch.arange(T, device=device)
        ),
    ],
    "padding_mask": [
        _padding_loop,
        _padding_item,
        lambda lengths, T: (
            torch.arange(T, device=lengths.device).expand(len(lengths), T) < lengths[:, None]
        )[:, None],
        _noisy(
            lambda lengths, T: (torch.arange(T, device=lengths.device) < lengths.unsqueeze(-1)).unsqueeze(1)
        ),
    ],
    "apply_mask": [
        _apply_on_a_copy,
        _apply_index,
        lambda S, allowed: torch.where(allowed, S.double(), NEG_INF).to(S.dtype),
        _noisy(lambda S, allowed: S.masked_fill(allowed.logical_not(), -math.inf)),
    ],
    "softmax": [
        _softmax_rows_loop,
        _softmax_float64,
        _softmax_logsumexp,
        _softmax_in_place_on_copy,
        _noisy(ref.softmax),
    ],
    "soft_lookup": [_lookup_loops, _noisy(ref.soft_lookup)],
    "mix": [
        _mix_sum,
        lambda A, V: (A.double() @ V.double()).to(A.dtype),
        _noisy(lambda A, V: torch.einsum("...qk,...kd->...qd", A, V)),
    ],
    "attention": [_attention_course, _attention_nan_to_num, _attention_float64, _noisy(_attention_course)],
    "self_attention": [_self_inline, _noisy(_self_inline)],
    "cross_attention": [_cross_einsum, _noisy(_cross_einsum)],
}


def test_every_exercise_of_lessons_01_to_07_has_several_correct_variants():
    assert set(CORRECT) == set(CORE)
    assert all(len(fns) >= 2 for fns in CORRECT.values())


@pytest.mark.parametrize(
    "name, fn",
    [(n, f) for n, fs in CORRECT.items() for f in fs],
    ids=[f"{n}-{i}" for n, fs in CORRECT.items() for i in range(len(fs))],
)
def test_correct_code_of_every_kind_passes_silently(name, fn, capfd):
    grader.check(name, fn)
    assert capfd.readouterr() == ("", ""), "nothing the student's code prints may reach the cell's output"


# ------------------------------------------------------------------ rules the lessons state


def _namespace_function(source: str, name: str):
    space = {"torch": torch, "math": math}
    exec(textwrap.dedent(source), space)  # noqa: S102 - test code written here
    return space[name]


FORBIDDEN_SOFTMAX = {
    "torch.softmax": lambda Z, dim=-1: torch.nan_to_num(torch.softmax(Z, dim)),
    "torch.nn.functional.softmax": lambda Z, dim=-1: torch.nan_to_num(
        torch.nn.functional.softmax(Z, dim=dim)
    ),
    "torch.Tensor.softmax": lambda Z, dim=-1: torch.nan_to_num(Z.softmax(dim)),
    "torch.special.softmax": lambda Z, dim=-1: torch.nan_to_num(torch.special.softmax(Z, dim)),
    "torch.Tensor.log_softmax": lambda Z, dim=-1: torch.nan_to_num(Z.log_softmax(dim).exp()),
    "torch.log_softmax": lambda Z, dim=-1: torch.nan_to_num(torch.log_softmax(Z, dim).exp()),
    "torch.nn.Softmax": lambda Z, dim=-1: torch.nan_to_num(torch.nn.Softmax(dim=dim)(Z)),
    "a name imported from torch": _namespace_function(
        """
        from torch.nn.functional import softmax as sm

        def softmax(Z, dim=-1):
            return torch.nan_to_num(sm(Z, dim=dim))
        """,
        "softmax",
    ),
}


@pytest.mark.parametrize("how", sorted(FORBIDDEN_SOFTMAX))
def test_calling_torchs_softmax_fails_with_the_lessons_rule(how):
    originals = (torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax, torch.special.softmax)
    message = _message("softmax", FORBIDDEN_SOFTMAX[how])
    assert "which this exercise rules out" in message
    assert "The rule: Do not call torch.softmax" in message, message
    assert (
        torch.softmax,
        torch.Tensor.softmax,
        torch.nn.functional.softmax,
        torch.special.softmax,
    ) == originals
    assert torch.tensor([[0.0, 0.0]]).softmax(-1).tolist() == [[0.5, 0.5]]


def test_the_reference_may_use_what_the_student_may_not():
    """Only the student's own calls count: a trap or the reference calling torch.softmax is no offence."""
    grader.check("softmax", ref.softmax)
    message = _message("attention", lambda Q, K, V, mask=None: ref.attention(Q, K, V, mask)[::-1])
    assert "rules out" not in message


def test_attention_may_not_call_scaled_dot_product_attention():
    def attention(Q, K, V, mask=None):
        O = torch.nn.functional.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
        return O, ref.attention(Q, K, V, mask)[1]

    message = _message("attention", attention)
    assert "Do not call torch.nn.functional.scaled_dot_product_attention" in message


def test_soft_lookup_is_plain_python():
    def soft_lookup(query, keys, values, sharpness):
        names = list(keys)
        s = torch.tensor(
            [sharpness * sum(q * k for q, k in zip(query, keys[n])) / math.sqrt(len(query)) for n in names]
        )
        w = torch.softmax(s.double(), -1).tolist()
        weights = dict(zip(names, w))
        return weights, [sum(weights[n] * values[n][c] for n in names) for c in range(len(values[names[0]]))]

    message = _message("soft_lookup", soft_lookup)
    assert "soft_lookup is plain Python" in message


# ------------------------------------------------------------------ score_spread is really measured


def test_score_spread_constant_fails():
    message = _message("score_spread", lambda d_k, n, generator: (math.sqrt(d_k), 1.0))
    assert "different seeds gave the same answer" in message, message


def test_score_spread_lookup_of_the_visible_answers_fails():
    seen = {(64, 20000): (8.0123, 1.0015), (1, 2000): (1.0021, 1.0021)}

    def score_spread(d_k, n, generator):
        return seen.get((d_k, n), (math.sqrt(d_k), 1.0))

    assert "gave the same answer" in _message("score_spread", score_spread)


def test_score_spread_reseeding_from_the_seed_fails():
    def score_spread(d_k, n, generator):
        torch.manual_seed(generator.initial_seed())
        dots = (torch.randn(n, d_k) * torch.randn(n, d_k)).sum(-1)
        return dots.std().item(), (dots / math.sqrt(d_k)).std().item()

    assert "do not re-seed it" in _message("score_spread", score_spread)


def test_score_spread_with_two_samples_breaks_the_exact_relation():
    def score_spread(d_k, n, generator):
        raw = ref.score_spread(d_k, n, generator)[0]
        return raw, ref.score_spread(d_k, n, generator)[1]  # scaled from a second, different sample

    message = _message("score_spread", score_spread)
    assert "should be exactly sqrt(d_k)" in message


def test_score_spread_tolerance_follows_the_sample_size():
    from grader.lessons.l03_scaling import spread_standard_error

    # d_k = 1: a product of two normals has kurtosis 9, so sd(s) / sigma = sqrt(8 / 4n)
    assert spread_standard_error(1, 20000) == pytest.approx(math.sqrt(2 / 20000))
    # large d_k: nearly normal (kurtosis 3), sd(s) / sigma -> sqrt(1 / 2n)
    assert spread_standard_error(10**6, 20000) == pytest.approx(math.sqrt(1 / 40000), rel=1e-4)
    # an estimate 5 % off at d_k = 64 with 30000 samples is about 10 standard errors away: refused
    message = _message("score_spread", lambda d_k, n, g: tuple(1.05 * x for x in ref.score_spread(d_k, n, g)))
    assert "give or take" in message


# ------------------------------------------------------------------ one mistake costs one exercise


def _wrong_attention(Q, K, V, mask=None):
    O, A = ref.attention(Q, K, V, mask)
    return A, O  # the student's attention returns its results the wrong way round


def test_self_and_cross_attention_are_checked_on_top_of_the_reference_attention():
    space = {"torch": torch, "math": math, "attention": _wrong_attention}
    exec(
        textwrap.dedent(
            """
            def self_attention(X, W_q, W_k, W_v, causal=True):
                Q, K, V = X @ W_q, X @ W_k, X @ W_v
                T = X.shape[-2]
                mask = torch.ones(T, T, dtype=torch.bool, device=X.device).tril() if causal else None
                return attention(Q, K, V, mask)[0]

            def cross_attention(X_dec, X_enc, W_q, W_k, W_v):
                return attention(X_dec @ W_q, X_enc @ W_k, X_enc @ W_v)[0]
            """
        ),
        space,
    )
    assert "is not right yet" in _message("attention", space["attention"])
    grader.check("self_attention", space["self_attention"])
    grader.check("cross_attention", space["cross_attention"])
    assert space["attention"] is _wrong_attention, "the student's own attention is put back afterwards"


def test_self_attention_still_answers_for_its_own_mistakes():
    space = {"torch": torch, "math": math, "attention": ref.attention}
    exec(
        textwrap.dedent(
            """
            def self_attention(X, W_q, W_k, W_v, causal=True):
                Q, K, V = X @ W_q, X @ W_k, X @ W_v
                return attention(Q, K, V)[0]   # the causal flag is ignored
            """
        ),
        space,
    )
    message = _message("self_attention", space["self_attention"])
    assert _diagnosis(message).startswith("the causal flag is ignored or reversed"), message


# ------------------------------------------------------------------ the visible checks name mistakes too


def test_mistakes_doc_and_visible_outputs_are_current():
    from grader import mistakes

    for path, fresh in ((mistakes.DOC, mistakes.markdown()), (mistakes.JSON, mistakes.json_text())):
        committed = path.read_text()
        if not mistakes.current(committed, fresh):
            assert committed == fresh, f"{path.name} is out of date: run python -m grader.mistakes"


def test_the_generated_files_are_compared_up_to_the_cpus_last_digits():
    """A float32 digit that differs between CPUs is no change; a changed number, word or count is."""
    from grader import mistakes

    seen = "the first at [0, 0, 0]: expected -0.162691, got 0.0605623."
    assert mistakes.current(seen, seen.replace("0.0605623", "0.0605621"))
    assert mistakes.current('{"o":[1.234567e-05]}', '{"o":[1.234569e-05]}')
    assert not mistakes.current(seen, seen.replace("0.0605623", "0.0615623"))
    assert not mistakes.current(seen, seen.replace("[0, 0, 0]", "[0, 0, 1]"))
    assert not mistakes.current(seen, seen.replace("expected", "wanted"))
    assert not mistakes.current(seen, seen + " 1.5")


def test_the_doc_lists_every_exercise_and_mistake():
    from grader import mistakes

    text = mistakes.DOC.read_text()
    for name, ex in EXERCISES.items():
        assert f"`{name}({ex.signature})`" in text
        for trap in ex.traps:
            assert f"### {trap.name}\n" in text
    assert "**Rule.** Do not call torch.softmax" in text


def _visible_traps():
    from attention_course.diagnosis import _stored

    stored = _stored()
    return [
        (n, t)
        for n, ex in CORE.items()
        for t in ex.traps
        if t.name in {s["name"] for s in stored[n]["traps"]}
    ]


@pytest.mark.parametrize("name, trap", _visible_traps(), ids=[f"{n}:{t.name}" for n, t in _visible_traps()])
def test_the_visible_diagnosis_names_the_mistake_or_nothing(name, trap):
    from attention_course.diagnosis import diagnose

    assert diagnose(name, trap.fn) in (None, (trap.name, trap.hint))


def test_every_mistake_stored_for_the_visible_checks_is_named_there():
    from attention_course.diagnosis import _stored, diagnose

    for name, entry in _stored().items():
        named = {diagnose(name, t.fn) for t in CORE[name].traps} - {None}
        assert {(t["name"], t["hint"]) for t in entry["traps"]} <= named, name
        assert entry["traps"] or name in ("causal_mask",), (
            f"no mistake of {name} can be named on its visible inputs"
        )


@pytest.mark.parametrize("name, fn", [(n, fs[0]) for n, fs in CORRECT.items()], ids=list(CORRECT))
def test_the_visible_diagnosis_never_names_correct_code(name, fn):
    from attention_course.diagnosis import diagnose

    assert diagnose(name, fn) is None


def test_a_visible_check_gains_the_diagnosis(monkeypatch):
    """Graded, the failing check raises with the mistake named (a student's session shows it in a box:
    tests/test_visible_checks.py)."""
    from attention_course.checks import diagnosed, expect_values

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")

    def softmax(Z, dim=-1):
        e = torch.exp(Z - Z.amax(dim=dim, keepdim=True))
        return e / e.sum(dim=dim, keepdim=True)

    with pytest.raises(AssertionError) as info:
        with diagnosed("softmax", softmax):
            expect_values(softmax(torch.tensor([[0.0, NEG_INF], [NEG_INF, NEG_INF]])), [[1, 0], [0, 0]], "W")
    assert "Diagnosis: a fully masked row gives NaN." in str(info.value)


def test_a_visible_shape_error_names_both_shapes(monkeypatch):
    from attention_course.checks import diagnosed

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")

    def scores(Q, K):
        return Q @ K

    with pytest.raises(AssertionError) as info:
        with diagnosed("scores", scores):
            scores(torch.ones(2, 4, 5), torch.ones(2, 6, 5))
    message = str(info.value)
    assert "A matrix product A @ B was given shapes (2, 4, 5) and (2, 6, 5)" in message
    assert "Diagnosis: K was not transposed." in message


def test_torch_mm_on_a_batch_is_put_into_words_as_a_rank_not_a_shape_mismatch(monkeypatch):
    """torch.mm given a batch: the shapes fit, and the fix is @ (it told the student to look for a transpose)."""
    from attention_course.checks import diagnosed

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")

    def project(X, W_q, W_k, W_v):
        return torch.mm(X, W_q), torch.mm(X, W_k), torch.mm(X, W_v)

    with pytest.raises(AssertionError) as info:
        with diagnosed("project", project):
            project(torch.ones(2, 3, 4), *[torch.ones(4, 3)] * 3)
    message = str(info.value)
    assert "torch.mm multiplies 2-D matrices only" in message and "Use A @ B" in message, message
    assert "(2, 3, 4) and (4, 3)" in message and "transpose" not in message, message


def test_a_flipped_mask_filled_with_minus_1e9_is_named_in_the_students_own_idiom():
    """masked_fill(allowed, -1e9) gives what S + allowed * -1e9 gives: the visible check named the mistake
    as "(1 - mask) * -1e9 with the opposite polarity", an idiom the student never wrote."""
    from attention_course.diagnosis import diagnose

    for source in ("S.masked_fill(allowed, -1e9)", "S + allowed.float() * -1e9"):
        apply_mask = eval(f"lambda S, allowed: {source}")
        name, hint = diagnose("apply_mask", apply_mask)
        assert name == "the mask polarity is inverted, and the fill is -1e9 instead of -inf", (source, name)
        assert "fill where allowed is False, and with -inf" in hint, hint


def _naive_guarded_softmax(Z, dim=-1):
    e = torch.exp(Z)
    s = e.sum(dim=dim, keepdim=True)
    return torch.where(s > 0, e / s, torch.zeros_like(e))


def _mha_never_causal(X, W_q, W_k, W_v, W_o, n_heads, causal=False):
    return ref.multi_head_attention(X, W_q, W_k, W_v, W_o, n_heads, causal=False)


def _gqa_always_causal(X, W_q, W_k, W_v, W_o, n_heads, n_kv_heads, causal=False):
    return ref.grouped_query_attention(X, W_q, W_k, W_v, W_o, n_heads, n_kv_heads, causal=True)


def _loss_both_cut(logits, tokens):
    V = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits[..., 1:, :].reshape(-1, V), tokens[..., 1:].reshape(-1))


@pytest.mark.parametrize(
    "name, fn, mistake",
    [
        ("softmax", _naive_guarded_softmax, "naive softmax that overflows"),
        ("multi_head_attention", _mha_never_causal, "the causal flag is ignored: no call masks it"),
        (
            "grouped_query_attention",
            _gqa_always_causal,
            "the causal flag is ignored: every call masks the future",
        ),
        (
            "prev_token_loss",
            _loss_both_cut,
            "the targets are not shifted: every position names its own token",
        ),
    ],
    ids=["guarded naive softmax", "mha never causal", "gqa always causal", "loss with both cut"],
)
def test_a_listed_mistake_written_another_way_is_named(name, fn, mistake):
    """Each of these makes a mistake docs/mistakes.md lists, in a form its trap did not cover: the check failed
    them with no name (a naive softmax guarded against empty rows, a causal flag ignored rather than reversed,
    a loss that cuts the first position from both logits and targets)."""
    assert _diagnosis(_message(name, fn)).startswith(mistake + ". ")


def test_a_batched_product_that_does_not_fit_is_not_called_element_by_element():
    """Q @ K.T on batches fails on a batch axis, in PyTorch's words for element-by-element operations: the
    explanation said two tensors were "combined element by element", a product is named now where the call was
    watched, and .T on a batched tensor is among the likely causes where it was not (a sandboxed function)."""
    from attention_course.diagnosis import explain_shape_error, watch_shapes

    Q, K = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    said = []
    for watched in (True, False):
        with pytest.raises(RuntimeError) as info, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyTorch's own note that .T on 3-D tensors is deprecated
            with watch_shapes() if watched else contextlib.nullcontext():
                Q @ K.T
        said.append(explain_shape_error(info.value))
    assert said[0].startswith("A matrix product A @ B was given shapes (2, 3, 4) and (4, 3, 2)"), said[0]
    assert "element by element" not in said[1] and ".T or transpose(0, 1) on a batched tensor" in said[1], (
        said[1]
    )


def test_a_stub_still_says_it_is_not_implemented(monkeypatch):
    from attention_course.checks import diagnosed

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")

    def mix(A, V):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        with diagnosed("mix", mix):
            mix(torch.ones(2, 2), torch.ones(2, 2))


def test_a_query_with_no_key_at_all_gets_a_zero_output():
    """The contract's extreme case: an empty cache (no key at all) gives zeros, as an all-masked row does."""
    O, A = ref.attention(torch.ones(2, 1, 4), torch.ones(2, 0, 4), torch.ones(2, 0, 3))
    assert A.shape == (2, 1, 0) and O.tolist() == [[[0.0, 0.0, 0.0]]] * 2
    mask = torch.tensor([[False, False], [True, False]])
    O, A = ref.attention(torch.ones(2, 4), torch.ones(2, 4), torch.ones(2, 3), mask)
    assert A[0].tolist() == [0.0, 0.0] and O[0].tolist() == [0.0, 0.0, 0.0] and A[1].tolist() == [1.0, 0.0]
