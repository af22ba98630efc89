"""Before hand-in, the visible checks tell a student with a bug what the grade will say.

In a student's session (NBGRADER_EXECUTION unset) a failed visible check reports and goes on:
its message, with the mistake named when one fits, is printed in a box, Run All reaches the
last cell, and "Where you stand" lists the failure. The lessons' stated rules (lesson 05's "no
torch.softmax", lesson 07's "no scaled_dot_product_attention") are watched there too. While a
notebook is graded, a failing check raises in its cell as it always has.

Every test runs a student notebook top to bottom in a real kernel.
"""

from __future__ import annotations

import textwrap

import nbformat
import pytest

from tests.class_sim.fair import UNSCALED_ATTENTION
from tests.nbtools import ROOT, filled, run_in_kernel, solution_sources


def _code(source: str) -> str:
    return textwrap.dedent(source).strip() + "\n"


# one wrong function per lesson, the rest the model solutions: (its grade id, its code, a check cell it
# fails, words of that check's message, the mistake the message names)
WRONG = {
    "03_scaling": (
        "ex03_scaled_scores",
        _code("""
            def scaled_scores(Q, K):
                return Q @ K.mT / Q.shape[-1]
        """),
        "test03_scaled_scores_values",
        "is not what the lesson computes by hand",
        "divided by d_k instead of sqrt(d_k)",
    ),
    "04_masking": (
        "ex04_apply_mask",
        _code("""
            def apply_mask(S, allowed):
                return S.masked_fill(~allowed, -1e9)
        """),
        "test04_apply_mask_values",
        "apply_mask",
        "a large finite number (-1e9) instead of -inf",
    ),
    "05_softmax": (
        "ex05_softmax",
        _code("""
            def softmax(Z, dim=-1):
                e = torch.exp(Z - Z.amax(dim=dim, keepdim=True))
                return e / e.sum(dim=dim, keepdim=True)
        """),
        "test05_softmax_masked_row",
        "In an all -inf row the max is -inf",
        "a fully masked row gives NaN",
    ),
    "06_mixing": (
        "ex06_mix",
        _code("""
            def mix(A, V):
                return A
        """),
        "test06_mix_values",
        "mix returned the weights themselves",
        "the weights were returned instead of A V",
    ),
    "07_one_head": (
        "ex07_attention",
        UNSCALED_ATTENTION,
        "test07_attention_values",
        "is not what the lesson computes by hand",
        "the scores are not scaled",
    ),
}

# lesson 05's softmax written with torch's own: right numbers, a broken rule
TENSOR_SOFTMAX = _code("""
    def softmax(Z, dim=-1):
        return Z.softmax(dim).nan_to_num(0.0)
""")
TORCH_LOOKUP = _code("""
    def soft_lookup(query, keys, values, sharpness):
        names = list(keys)
        q = torch.tensor(query, dtype=torch.float64)
        K = torch.tensor([keys[n] for n in names], dtype=torch.float64)
        w = torch.softmax(sharpness * (K @ q) / math.sqrt(len(query)), dim=0)
        Vs = torch.tensor([values[n] for n in names], dtype=torch.float64)
        return {n: float(w[i]) for i, n in enumerate(names)}, (w @ Vs).tolist()
""")
SOFTMAX_RULE = (
    "softmax calls torch.Tensor.softmax, which this exercise rules out. The rule: Do not call torch.softmax"
)

# correct code written other ways: a loop, einsum, logsumexp
OTHER_WAYS = {
    "05_softmax": {
        "ex05_softmax": _code("""
            def softmax(Z, dim=-1):
                moved = Z.movedim(dim, -1)
                rows = moved.reshape(-1, moved.shape[-1])
                out = torch.zeros_like(rows)
                for i in range(rows.shape[0]):             # one row at a time
                    row = rows[i]
                    if torch.isinf(row).all():
                        continue                           # nothing to look at: zeros
                    e = torch.exp(row - torch.logsumexp(row, dim=0))
                    out[i] = e
                return out.reshape(moved.shape).movedim(-1, dim)
        """),
    },
    "07_one_head": {
        "ex07_attention": _code("""
            def attention(Q, K, V, mask=None):
                S = torch.einsum("...qd,...kd->...qk", Q, K) / Q.shape[-1] ** 0.5
                if mask is not None:
                    S = torch.where(mask, S, torch.full_like(S, float("-inf")))
                m = S.amax(dim=-1, keepdim=True)
                m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
                e = torch.exp(S - m)
                total = e.sum(dim=-1, keepdim=True)
                A = e / torch.where(total > 0, total, torch.ones_like(total))
                return torch.einsum("...qk,...kd->...qd", A, V), A
        """),
    },
}


def _run(lesson: str, answers: dict[str, str], monkeypatch, grading: str | None) -> nbformat.NotebookNode:
    """The student notebook with the model solutions, some replaced by ``answers``, run top to bottom."""
    if grading is None:
        monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    else:
        monkeypatch.setenv("NBGRADER_EXECUTION", grading)  # the kernel inherits it, as under nbgrader
    path = ROOT / "notebooks" / lesson / f"{lesson}.ipynb"
    nb = filled(path, {**solution_sources(lesson), **answers})
    run_in_kernel(nb, path.parent, timeout=300, allow_errors=True)
    return nb


def _cell(nb: nbformat.NotebookNode, grade_id: str):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def _errors(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.output_type == "error"]


def _summary(nb: nbformat.NotebookNode) -> str:
    summary = nb.cells[-1]
    assert summary.get("id") == "where-you-stand", "the summary should be the last cell"
    return _stdout(summary)


def _ran_to_the_end(lesson: str, nb: nbformat.NotebookNode) -> None:
    for cell in nb.cells:
        for error in _errors(cell):
            raise AssertionError(f"{lesson}:{cell.id} stopped Run All: {error.ename}: {error.evalue}")
    assert _summary(nb).startswith("Where you stand: "), f"{lesson}: the last cell did not run"


@pytest.mark.slow
@pytest.mark.parametrize("lesson", list(WRONG))
def test_a_wrong_function_is_reported_and_run_all_reaches_the_summary(lesson, monkeypatch):
    """One wrong function: its check shows the failure in a box, the notebook runs on, the summary names it."""
    grade_id, source, check, words, mistake = WRONG[lesson]
    name = grade_id.split("_", 1)[1]
    nb = _run(lesson, {grade_id: source}, monkeypatch, grading=None)
    _ran_to_the_end(lesson, nb)
    shown = _stdout(_cell(nb, check))
    assert f"FAILED: this check of `{name}`" in shown, f"{lesson}:{check} shows no failure:\n{shown}"
    flat = " ".join(shown.replace("|", " ").split())  # the box's text, its lines joined
    assert words in flat and f"Diagnosis: {mistake}." in flat, f"{lesson}:{check}:\n{shown}"
    assert "Graded as it is, this check fails." in flat
    summary = _summary(nb)
    assert f"[ ] `{name}`: FAILED: " in summary and "the first failure says: " in summary, summary
    assert f"Still to do: `{name}`" in summary, summary
    assert "This is not a grade." in summary and "hidden checks" in summary, summary
    for cell in nb.cells:
        if cell.cell_type == "code" and "from attention_course.explorers import" in cell.source:
            assert cell.outputs, f"{lesson}:{cell.id}: the explorer showed nothing"


@pytest.mark.slow
@pytest.mark.parametrize("lesson", list(WRONG))
def test_graded_the_same_wrong_function_raises_in_its_check_cell(lesson, monkeypatch):
    """While graded nothing is swallowed: the failing check raises its message, with the diagnosis."""
    grade_id, source, check, words, mistake = WRONG[lesson]
    nb = _run(lesson, {grade_id: source}, monkeypatch, grading="autograde")
    errors = _errors(_cell(nb, check))
    assert errors and errors[0].ename == "AssertionError", f"{lesson}:{check} did not fail: {errors}"
    assert words in errors[0].evalue and f"Diagnosis: {mistake}." in errors[0].evalue, errors[0].evalue
    assert "FAILED: this check" not in _stdout(_cell(nb, check))
    assert _summary(nb) == "", "the summary stays silent while a notebook is graded"


@pytest.mark.slow
def test_softmax_with_torchs_own_softmax_fails_its_visible_checks_with_the_rule(monkeypatch):
    """Right numbers through a call the lesson rules out: every softmax check says the rule; not done."""
    answers = {"ex05_softmax": TENSOR_SOFTMAX, "ex05_soft_lookup": TORCH_LOOKUP}
    nb = _run("05_softmax", answers, monkeypatch, grading=None)
    _ran_to_the_end("05_softmax", nb)
    for check in ("test05_softmax_values", "test05_softmax_overflow", "test05_softmax_masked_row"):
        flat = " ".join(_stdout(_cell(nb, check)).replace("|", " ").split())
        assert "FAILED: this check of `softmax`" in flat and SOFTMAX_RULE in flat, f"{check}:\n{flat}"
        assert "build it from torch.exp" in flat and "the hidden check of `softmax` fails" in flat, flat
    flat = " ".join(_stdout(_cell(nb, "test05_soft_lookup_colours")).replace("|", " ").split())
    assert "soft_lookup calls torch.tensor" in flat, flat
    assert "The rule: soft_lookup is plain Python: lists, dicts and math (math.exp), no torch." in flat, flat
    summary = _summary(nb)
    assert "[x]" not in summary and "its visible checks pass" not in summary, summary
    assert "[ ] `softmax`: FAILED: 0 of 4 checks pass; the first failure says: " + SOFTMAX_RULE in summary
    assert "[ ] `soft_lookup`: FAILED: " in summary and "Still to do: `softmax`, `soft_lookup`." in summary


@pytest.mark.slow
def test_graded_the_rule_is_left_to_the_hidden_check(monkeypatch):
    """While graded the visible checks run as before: a rule is the hidden check's to fail (as the lesson
    says), so torch's softmax with the right numbers passes the visible checks and prints nothing."""
    nb = _run("05_softmax", {"ex05_softmax": TENSOR_SOFTMAX}, monkeypatch, grading="autograde")
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            assert not _errors(cell), f"{cell.id}: {_errors(cell)}"
            assert "FAILED" not in _stdout(cell)


@pytest.mark.slow
@pytest.mark.parametrize("lesson", list(OTHER_WAYS))
def test_correct_code_written_other_ways_passes_every_visible_check(lesson, monkeypatch):
    """A loop or einsum instead of the model solution: every check passes, nothing is called a failure."""
    nb = _run(lesson, OTHER_WAYS[lesson], monkeypatch, grading=None)
    _ran_to_the_end(lesson, nb)
    checks = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    for cell in checks:
        assert "FAILED" not in _stdout(cell), f"{lesson}:{cell.id}:\n{_stdout(cell)}"
    summary = _summary(nb)
    assert f"Where you stand: {len(checks)} of {len(checks)} visible checks pass." in summary, summary
    assert "Every exercise passes its visible checks." in summary and "FAILED" not in summary, summary
    assert "This is not a grade." in summary, summary


# ------------------------------------------------------------------ the same, in this process


@pytest.fixture
def session(monkeypatch, request):
    """A student's session: NBGRADER_EXECUTION unset and an empty record of checks (restored after)."""
    from attention_course import diagnosis

    saved = dict(diagnosis.CHECKS)  # shared by name (checks.py imports it): empty it in place
    diagnosis.CHECKS.clear()
    request.addfinalizer(lambda: (diagnosis.CHECKS.clear(), diagnosis.CHECKS.update(saved)))
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    return {"__name__": "__main__"}  # a notebook's namespace


def _cell_run(namespace: dict, source: str) -> None:
    exec(compile(_code(source), "<cell>", "exec"), namespace)


def test_the_rules_come_from_the_lessons_exercises():
    """mistakes.json carries every exercise's forbidden functions and the rules' words, as the lessons state them."""
    from attention_course.diagnosis import stated_rules
    from grader.registry import exercises

    stated = {name: ex for name, ex in exercises().items() if ex.forbidden}
    assert {"softmax", "soft_lookup", "attention", "self_attention", "cross_attention"} <= set(stated)
    for name, ex in exercises().items():
        assert stated_rules(name) == (dict(ex.forbidden), sorted(ex.uses) if ex.forbidden else []), name


def test_only_the_students_own_calls_break_a_rule(session, capsys):
    """The check's own torch.softmax and scaled_dot_product_attention, and a call inside the attention that
    self_attention uses (attention's own check judges it), are no offence; the student's are, by any name."""
    _cell_run(
        session,
        """
        import torch
        import torch.nn.functional as F
        from attention_course.checks import diagnosed, where_you_stand

        def softmax(Z, dim=-1):
            e = torch.exp(Z - Z.amax(dim=dim, keepdim=True))
            return e / e.sum(dim=dim, keepdim=True)

        def attention(Q, K, V, mask=None):
            return F.scaled_dot_product_attention(Q, K, V), None

        def self_attention(X):
            return attention(X, X, X)[0]

        with diagnosed("softmax", softmax):
            assert torch.allclose(softmax(torch.zeros(3)), torch.softmax(torch.zeros(3), dim=-1))
        with diagnosed("self_attention", self_attention):
            O = self_attention(torch.ones(2, 3))
            assert torch.allclose(O, F.scaled_dot_product_attention(*[torch.ones(2, 3)] * 3))
        """,
    )
    assert "FAILED" not in capsys.readouterr().out
    _cell_run(
        session,
        """
        with diagnosed("attention", attention):
            attention(torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 3))
        softmax = torch.softmax
        with diagnosed("softmax", softmax):
            softmax(torch.zeros(3), dim=-1)
        where_you_stand("softmax", "attention", "self_attention")
        """,
    )
    shown = " ".join(capsys.readouterr().out.replace("|", " ").split())
    assert "FAILED: this check of `attention`" in shown, shown
    assert "attention calls torch.nn.functional.scaled_dot_product_attention, which this exercise" in shown
    assert "softmax calls torch.softmax, which this exercise rules out." in shown, shown
    assert "[ ] `softmax`: FAILED: 1 of 2 checks pass" in shown and "[x] `self_attention`" in shown, shown


def test_a_failure_reports_and_goes_on_only_in_a_students_session(session, capsys, monkeypatch):
    """The box and the summary in a student's session; graded, the same check raises and nothing is printed."""
    _cell_run(
        session,
        """
        import torch
        from attention_course.checks import diagnosed, expect_values, where_you_stand

        def mix(A, V):
            return V @ A

        with diagnosed("mix", mix):
            expect_values(mix(torch.eye(2), torch.tensor([[1.0, 2.0], [3.0, 4.0]])), [[1, 2], [3, 5]], "O")
        reached = True
        where_you_stand("mix")
        """,
    )
    shown = capsys.readouterr().out
    assert session["reached"] and "FAILED: this check of `mix`" in shown, shown
    assert "O is not what the lesson computes by hand. First difference at [1, 1]" in shown, shown
    assert "Graded as it is, this check fails." in " ".join(shown.replace("|", " ").split())
    assert "[ ] `mix`: FAILED: 0 of 1 checks pass; the first failure says: O is not what" in shown
    assert "This is not a grade." in shown and "Every exercise passes" not in shown
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(AssertionError, match="First difference at"):
        _cell_run(
            session,
            """
            with diagnosed("mix", mix):
                expect_values(mix(torch.eye(2), torch.tensor([[1.0, 2.0], [3.0, 4.0]])), [[1, 2], [3, 5]], "O")
            """,
        )
    assert capsys.readouterr().out == ""


@pytest.mark.slow
def test_a_training_loop_that_never_updates_fails_lesson_10s_visible_check(monkeypatch):
    """`p = p - lr * p.grad` only renames p: the loss then moves by noise alone (about 0.01 in 30 steps),
    which the old check took for learning. Graded, the visible check now fails; before hand-in it says why."""
    from tests.test_lesson10 import train_answer

    answers = {"ex10_train_head": train_answer("p = p - lr * p.grad\np.grad = None")}
    graded = _run("10_learning", answers, monkeypatch, "autograde")
    errors = _errors(_cell(graded, "test10_train_head_runs"))
    assert errors and "the weights never changed" in errors[0].evalue, errors
    session = _run("10_learning", answers, monkeypatch, None)
    assert "the weights never changed" in _stdout(_cell(session, "test10_train_head_runs"))
    right = _run("10_learning", {}, monkeypatch, "autograde")
    assert not _errors(_cell(right, "test10_train_head_runs"))
