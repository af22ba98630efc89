"""Before hand-in, the visible checks tell a student with a bug what the grade will say.

In a student's session (NBGRADER_EXECUTION unset) a failed visible check reports and goes on:
its message, with the mistake named when one fits, is printed in a box, Run All reaches the
last cell, and "Where you stand" lists the failure. The lessons' stated rules (lesson 05's "no
torch.softmax", lesson 07's "no scaled_dot_product_attention") are watched there too. While a
notebook is graded, a failing check raises in its cell as it always has.

The lessons' example cells and explorers report the same way (``demo``): with any one function still a
stub, raising, or returning wrong shapes, Run All reaches the last cell of every lesson. The visible checks
also see what the lessons' own data cannot (scores divided by sqrt(d_v) where d_k = d_v) and hold every
function to the rules the lessons state (results keep the inputs' dtype; inputs are not changed in place).

Every test runs a student notebook top to bottom in a real kernel.
"""

from __future__ import annotations

import re
import textwrap

import nbformat
import pytest

from grader import course
from tests.class_sim.fair import UNSCALED_ATTENTION
from tests.nbtools import ROOT, filled, grading_work, run_in_kernel, solution_sources


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
def test_lesson_11_work_on_more_than_a_block_fails_its_visible_check_as_graded(monkeypatch):
    """Right numbers from all but one entry of a row at once, or from a fused kernel under a private name:
    the hidden checks fail them, and the visible check before hand-in says so, with what the watch saw."""
    from tests import attacks

    answers = {
        "ex11_online_softmax_stats": attacks.L11_TWO_CHUNKS,
        "ex11_tiled_attention": attacks.L11_FUSED_TILED,
    }
    nb = _run("11_cost", answers, monkeypatch, grading=None)
    _ran_to_the_end("11_cost", nb)
    stats = " ".join(_stdout(_cell(nb, "test11_online_softmax_stats_hidden")).replace("|", " ").split())
    assert "FAILED: this check of `online_softmax_stats`" in stats, stats
    assert "9 entries of a row at once, more than block_size = 3" in stats, stats
    tiled = " ".join(_stdout(_cell(nb, "test11_tiled_attention_hidden")).replace("|", " ").split())
    assert "FAILED: this check of `tiled_attention`" in tiled, tiled
    assert "it called _scaled_dot_product_flash_attention_for_cpu" in tiled, tiled


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


# ------------------------------------------------------------------ one broken function, Run All to the end

# every exercise of every lesson, as (lesson, its answer cell)
EXERCISE_CELLS = [(lesson, gid) for lesson in course.lessons() for gid in solution_sources(lesson)]

# the three ways one function is broken, the others being the model solutions: still a stub, raising an error
# of its own, returning every tensor with one column too many (a number as a tensor of two, a list one longer)
STUB = "def {name}(*args, **kwargs):\n    raise NotImplementedError()\n"
RAISES = "def {name}(*args, **kwargs):\n    raise ValueError('a bug in {name}')\n"
MISSHAPEN = """

import torch as _torch


def _misshapen(x):
    if isinstance(x, _torch.Tensor):
        return _torch.cat([x, x[..., :1]], dim=-1) if x.dim() else x.reshape(1, 1)
    if isinstance(x, tuple):
        return tuple(_misshapen(v) for v in x)
    if isinstance(x, list):
        return [_misshapen(v) for v in x] + ([_misshapen(x[-1])] if x else [0.0])
    if isinstance(x, dict):
        return {{k: _misshapen(v) for k, v in x.items()}}
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return _torch.tensor([x, x])
    return x


_right_{name} = {name}


def {name}(*args, **kwargs):
    return _misshapen(_right_{name}(*args, **kwargs))
"""


def _broken(lesson: str, grade_id: str, kind: str) -> str:
    name = grade_id.split("_", 1)[1]
    if kind == "stub":
        return STUB.format(name=name)
    if kind == "raises":
        return RAISES.format(name=name)
    return solution_sources(lesson)[grade_id] + MISSHAPEN.format(name=name)


def _demo_names(source: str) -> set[str]:
    """The functions a cell's ``demo(...)`` calls name."""
    return {n.strip() for args in re.findall(r"\bdemo\(([^)]*)\)", source) for n in args.split(",")}


def _explorer_names_the_shape(lesson: str, cell, name: str) -> None:
    """An explorer given a function of the wrong shape draws the built-in version (its saved picture and
    readout, no example box) and says, in the saved copy too, what the function returned."""
    assert "EXAMPLE STOPPED" not in _stdout(cell), (
        f"{lesson}:{cell.id}: the explorer stopped:\n{_stdout(cell)}"
    )
    saved = " ".join(
        str(o.get("data", {}).get(mime, "")) for o in cell.outputs for mime in ("text/html", "text/plain")
    )
    assert "ac-static-readout" in saved, f"{lesson}:{cell.id}: no picture or readout of the built-in version"
    said = " ".join(re.sub(r"</?code>", "`", saved).split())
    assert re.search(rf"your `{name}` returned [^.]* here, where [^.]* was expected", said), (
        f"{lesson}:{cell.id}: the wrong shape is not named: {said[:600]}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["stub", "raises", "misshapen"])
@pytest.mark.parametrize("lesson, grade_id", EXERCISE_CELLS, ids=[g for _, g in EXERCISE_CELLS])
def test_one_broken_function_is_reported_and_run_all_reaches_the_last_cell(
    lesson, grade_id, kind, monkeypatch
):
    """One function a stub, raising, or returning wrong shapes, the rest right: no cell stops Run All (the
    explorers and the summary included), the summary says the function is not done, and each example cell
    that runs it says in a box which function failed."""
    name = grade_id.split("_", 1)[1]
    nb = _run(lesson, {grade_id: _broken(lesson, grade_id, kind)}, monkeypatch, grading=None)
    _ran_to_the_end(lesson, nb)
    summary = _summary(nb)
    if kind == "stub":
        assert f"[ ] `{name}`: not done yet: still a stub" in summary, summary
    else:
        assert f"[ ] `{name}`: FAILED: " in summary, summary
    shown = "\n".join(_stdout(c) for c in nb.cells)
    if kind == "raises":
        assert f"ValueError: a bug in {name}" in shown, f"{lesson}: the error is never shown"
    for cell in nb.cells:
        if cell.cell_type == "code" and "from attention_course.explorers import" in cell.source:
            assert cell.outputs, f"{lesson}:{cell.id}: the explorer showed nothing"
        examples = cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade")
        if kind == "misshapen" and examples and name in _demo_names(cell.source):
            if "from attention_course.explorers import" in cell.source:
                _explorer_names_the_shape(lesson, cell, name)
        if kind == "raises" and examples and name in _demo_names(cell.source):
            if "from attention_course.explorers import" in cell.source:
                continue  # an explorer shows its built-in version, and says so in its banner
            flat = " ".join(_stdout(cell).replace("|", " ").split())
            assert f"EXAMPLE STOPPED: your `{name}` raised an error" in flat, f"{lesson}:{cell.id}:\n{flat}"
            assert f"ValueError: a bug in {name}" in flat and "The cells below still run." in flat, flat


@pytest.mark.slow
def test_an_example_cell_reports_a_raising_function_only_in_a_students_session(monkeypatch):
    """Lesson 06's slider cell with a mix that raises: a box naming mix, then the cells below; graded, the
    cell raises the error itself, as it always did."""
    answers = {"ex06_mix": RAISES.format(name="mix")}
    nb = _run("06_mixing", answers, monkeypatch, grading=None)
    flat = " ".join(_stdout(_code_cell(nb, "code-21")).replace("|", " ").split())
    assert "EXAMPLE STOPPED: your `mix` raised an error" in flat, flat
    assert (
        "ValueError: a bug in mix" in flat
        and "Raised in `mix`, at: raise ValueError('a bug in mix')." in flat
    )
    assert "This cell will work once `mix` is fixed; its checks say what is wrong." in flat, flat
    _ran_to_the_end("06_mixing", nb)
    graded = _run("06_mixing", answers, monkeypatch, grading="autograde")
    errors = _errors(_code_cell(graded, "code-21"))
    assert errors and errors[0].ename == "ValueError" and errors[0].evalue == "a bug in mix", errors
    assert "EXAMPLE STOPPED" not in _stdout(_code_cell(graded, "code-21"))


def _code_cell(nb: nbformat.NotebookNode, cell_id: str):
    return next(c for c in nb.cells if c.get("id") == cell_id)


# ------------------------------------------------------------------ sqrt(d_v), dtypes, inputs changed in place

# the scores divided by sqrt(d_v) instead of sqrt(d_k): {lesson: (answers, {check that fails: function},
# checks on data with d_k = d_v, which cannot see it)}
SCALED_BY_DV = {
    "07_one_head": (
        {
            "ex07_attention": _code("""
                def attention(Q, K, V, mask=None):
                    S = Q @ K.mT / math.sqrt(V.shape[-1])
                    if mask is not None:
                        S = S.masked_fill(~mask, float("-inf"))
                    A = torch.softmax(S, dim=-1).nan_to_num(0.0)
                    return A @ V, A
            """),
            "ex07_self_attention": _code("""
                def self_attention(X, W_q, W_k, W_v, causal=True):
                    Q, K, V = X @ W_q, X @ W_k, X @ W_v
                    S = Q @ K.mT / math.sqrt(V.shape[-1])
                    if causal:
                        T = X.shape[-2]
                        S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
                    return torch.softmax(S, dim=-1) @ V
            """),
            "ex07_cross_attention": _code("""
                def cross_attention(X_dec, X_enc, W_q, W_k, W_v):
                    Q, K, V = X_dec @ W_q, X_enc @ W_k, X_enc @ W_v
                    return torch.softmax(Q @ K.mT / math.sqrt(V.shape[-1]), dim=-1) @ V
            """),
        },
        {
            "test07_attention_sdpa": "attention",
            "test07_self_attention_hidden": "self_attention",
            "test07_cross_attention_hidden": "cross_attention",
        },
        ["test07_attention_values", "test07_self_attention_values", "test07_cross_attention_shapes"],
    ),
    "09_kv_cache": (
        {
            "ex09_kv_cache_step": _code("""
                def kv_cache_step(x_t, K_cache, V_cache, W_q, W_k, W_v):
                    q, k, v = x_t @ W_q, x_t @ W_k, x_t @ W_v
                    K, V = torch.cat([K_cache, k], dim=-2), torch.cat([V_cache, v], dim=-2)
                    return torch.softmax(q @ K.mT / math.sqrt(V.shape[-1]), dim=-1) @ V, K, V
            """)
        },
        {"test09_kv_cache_step_hidden": "kv_cache_step"},
        ["test09_kv_cache_step_shapes", "test09_kv_cache_step_values"],
    ),
    "10_learning": (
        {
            "ex10_head_forward": _code("""
                def head_forward(params, X):
                    Q, K, V = X @ params["W_q"], X @ params["W_k"], X @ params["W_v"]
                    S = Q @ K.mT / math.sqrt(V.shape[-1])
                    T = X.shape[-2]
                    S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
                    A = torch.softmax(S, dim=-1)
                    return (A @ V) @ params["W_o"], A
            """)
        },
        {"test10_head_forward_hidden": "head_forward"},
        ["test10_head_forward_shapes", "test10_head_forward_values"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("lesson", list(SCALED_BY_DV))
def test_scores_divided_by_sqrt_d_v_fail_a_visible_check(lesson, monkeypatch):
    """The lesson's own data has d_k = d_v, where sqrt(d_v) gives the right numbers: those checks pass. A check
    with d_k != d_v fails it before hand-in (and names it in lesson 07, whose visible checks name mistakes)."""
    answers, failing, blind = SCALED_BY_DV[lesson]
    nb = _run(lesson, answers, monkeypatch, grading=None)
    _ran_to_the_end(lesson, nb)
    for check in blind:
        assert "FAILED" not in _stdout(_cell(nb, check)), f"{lesson}:{check}:\n{_stdout(_cell(nb, check))}"
    for check, name in failing.items():
        flat = " ".join(_stdout(_cell(nb, check)).replace("|", " ").split())
        assert f"FAILED: this check of `{name}`" in flat, f"{lesson}:{check}:\n{flat}"
        if lesson == "07_one_head":
            assert "Diagnosis: the scores are divided by sqrt(d_v) instead of sqrt(d_k)." in flat, flat
        assert f"[ ] `{name}`: FAILED: " in _summary(nb), _summary(nb)


@pytest.mark.slow
def test_a_scale_fixed_at_sqrt_8_fails_the_check_against_torchs_attention(monkeypatch):
    """test07_attention_sdpa compared with scaled_dot_product_attention on heads of size 8 only, where a scale
    written as math.sqrt(8) is right: its 2 points were earned by an attention that is wrong on every other size."""
    fixed = _code("""
        def attention(Q, K, V, mask=None):
            S = Q @ K.mT / math.sqrt(8)
            if mask is not None:
                S = S.masked_fill(~mask, float("-inf"))
            A = torch.softmax(S, dim=-1).nan_to_num(0.0)
            return A @ V, A
    """)
    nb = _run("07_one_head", {"ex07_attention": fixed}, monkeypatch, grading=None)
    _ran_to_the_end("07_one_head", nb)
    flat = " ".join(_stdout(_cell(nb, "test07_attention_sdpa")).replace("|", " ").split())
    assert "FAILED: this check of `attention`" in flat and "scaled_dot_product_attention" in flat, flat


def test_a_mask_fixed_at_8_positions_fails_a_visible_check_of_head_forward(monkeypatch):
    """Every visible check of lesson 10 ran sequences of 8 positions, where a causal mask built (8, 8) is right:
    a head_forward that hard-codes it passed them all and lost the hidden check's 3 points."""
    fixed = _code("""
        def head_forward(params, X):
            Q, K, V = X @ params["W_q"], X @ params["W_k"], X @ params["W_v"]
            S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
            allowed = torch.ones(8, 8, dtype=torch.bool, device=X.device).tril()
            A = torch.softmax(S.masked_fill(~allowed, float("-inf")), dim=-1)
            return (A @ V) @ params["W_o"], A
    """)
    nb = _run("10_learning", {"ex10_head_forward": fixed}, monkeypatch, grading=None)
    _ran_to_the_end("10_learning", nb)
    for gid in ("test10_head_forward_shapes", "test10_head_forward_values"):
        assert "FAILED" not in _stdout(_cell(nb, gid)), _stdout(_cell(nb, gid))
    flat = " ".join(_stdout(_cell(nb, "test10_head_forward_hidden")).replace("|", " ").split())
    assert "FAILED: this check of `head_forward`" in flat and "(5)" in flat and "(8)" in flat, flat


# a function right on the batches the visible checks ran (2-D and 3-D) whose axes are hard-coded, so that a
# 4-D batch fails the hidden check: (lesson, grade id of the answer, its code, the check that now says so)
def _fails_its_check_and_runs_on(lesson: str, grade_id: str, source: str, check: str, monkeypatch) -> None:
    """The student notebook with ``source`` for ``grade_id``: ``check`` shows the failure in a box, Run All
    reaches the summary, which lists the function as failed."""
    nb = _run(lesson, {grade_id: source}, monkeypatch, grading=None)
    _ran_to_the_end(lesson, nb)
    name = grade_id.split("_", 1)[1]
    flat = " ".join(_stdout(_cell(nb, check)).replace("|", " ").split())
    assert f"FAILED: this check of `{name}`" in flat, flat
    assert f"[ ] `{name}`: FAILED: " in _summary(nb), _summary(nb)


FIXED_AXES = [
    (
        "08_multihead",
        "ex08_split_heads",
        _code("""
            def split_heads(X, n_heads):
                T, D = X.shape[-2], X.shape[-1]
                if X.dim() == 2:
                    return X.reshape(T, n_heads, D // n_heads).transpose(0, 1)
                return X.reshape(X.shape[0], T, n_heads, D // n_heads).transpose(1, 2)
        """),
        "test08_split_heads_hidden",
    ),
    (
        "08_multihead",
        "ex08_merge_heads",
        _code("""
            def merge_heads(X):
                if X.dim() == 3:
                    H, T, d = X.shape
                    return X.transpose(0, 1).reshape(T, H * d)
                B, H, T, d = X.shape
                return X.transpose(1, 2).reshape(B, T, H * d)
        """),
        "test08_merge_heads_hidden",
    ),
    (
        "09_kv_cache",
        "ex09_kv_cache_step",
        _code("""
            def kv_cache_step(x_t, K_cache, V_cache, W_q, W_k, W_v):
                q, k, v = x_t @ W_q, x_t @ W_k, x_t @ W_v
                axis = 1 if x_t.dim() > 2 else 0
                K, V = torch.cat([K_cache, k], dim=axis), torch.cat([V_cache, v], dim=axis)
                return torch.softmax(q @ K.mT / math.sqrt(q.shape[-1]), dim=-1) @ V, K, V
        """),
        "test09_kv_cache_step_hidden",
    ),
    (
        "01_projection",
        "ex01_project",
        _code("""
            def project(X, W_q, W_k, W_v):
                if X.dim() == 3:
                    return tuple(torch.bmm(X, W.expand(X.shape[0], *W.shape)) for W in (W_q, W_k, W_v))
                return X.mm(W_q), X.mm(W_k), X.mm(W_v)
        """),
        "test01_project_hidden",
    ),
    (
        "02_scoring",
        "ex02_scores",
        _code("""
            def scores(Q, K):
                if Q.dim() == 3:
                    return torch.bmm(Q, K.transpose(1, 2))
                return torch.mm(Q, K.t())
        """),
        "test02_scores_hidden",
    ),
    (
        "03_scaling",
        "ex03_scaled_scores",
        _code("""
            def scaled_scores(Q, K):
                K_t = K.transpose(1, 2) if K.dim() == 3 else K.T
                return Q @ K_t / Q.shape[-1] ** 0.5
        """),
        "test03_scaled_scores_hidden",
    ),
    (
        "04_masking",
        "ex04_apply_mask",
        _code("""
            def apply_mask(S, allowed):
                shape = S.shape[-2:] if S.dim() == 2 else (S.shape[0], *S.shape[-2:])
                return torch.where(allowed.expand(*shape), S, torch.full_like(S, float("-inf")))
        """),
        "test04_apply_mask_hidden",
    ),
    (
        "05_softmax",
        "ex05_softmax",
        _code("""
            def softmax(Z, dim=-1):
                Z = Z.movedim(dim, -1)
                if Z.dim() == 3:  # a batch: one matrix at a time
                    return torch.stack([softmax(z) for z in Z]).movedim(-1, dim)
                rows, cols = Z.shape
                m = Z.amax(dim=1, keepdim=True)
                e = torch.exp(Z - torch.where(torch.isinf(m), torch.zeros_like(m), m))
                s = e.sum(dim=1, keepdim=True)
                return torch.where(s > 0, e / s, torch.zeros_like(e)).movedim(-1, dim)
        """),
        "test05_softmax_hidden",
    ),
    (
        "06_mixing",
        "ex06_mix",
        _code("""
            def mix(A, V):
                return torch.bmm(A, V) if A.dim() == 3 else torch.mm(A, V)
        """),
        "test06_mix_hidden",
    ),
    (
        "08_multihead",
        "ex08_multi_head_attention",
        _code("""
            def multi_head_attention(X, W_q, W_k, W_v, W_o, n_heads, causal=False):
                if X.dim() == 2:
                    return multi_head_attention(X[None], W_q, W_k, W_v, W_o, n_heads, causal)[0]
                B, T, _ = X.shape
                Q, K, V = ((X @ W).view(B, T, n_heads, -1).transpose(1, 2) for W in (W_q, W_k, W_v))
                O, _ = one_head(Q, K, V, causal=causal)
                return O.transpose(1, 2).reshape(B, T, -1) @ W_o
        """),
        "test08_multi_head_attention_hidden",
    ),
    (
        "08_multihead",
        "ex08_grouped_query_attention",
        _code("""
            def grouped_query_attention(X, W_q, W_k, W_v, W_o, n_heads, n_kv_heads, causal=False):
                if X.dim() == 2:
                    return grouped_query_attention(X[None], W_q, W_k, W_v, W_o, n_heads, n_kv_heads, causal)[0]
                B, T, _ = X.shape
                Q = (X @ W_q).view(B, T, n_heads, -1).transpose(1, 2)
                K, V = ((X @ W).view(B, T, n_kv_heads, -1).transpose(1, 2) for W in (W_k, W_v))
                group = n_heads // n_kv_heads
                O, _ = one_head(Q, K.repeat_interleave(group, 1), V.repeat_interleave(group, 1), causal=causal)
                return O.transpose(1, 2).reshape(B, T, -1) @ W_o
        """),
        "test08_grouped_query_attention_hidden",
    ),
    (
        "07_one_head",
        "ex07_attention",
        _code("""
            def attention(Q, K, V, mask=None):
                K_t = K.transpose(1, 2) if K.dim() == 3 else K.T
                S = Q @ K_t / math.sqrt(Q.shape[-1])
                if mask is not None:
                    S = S.masked_fill(~mask, float("-inf"))
                A = torch.softmax(S, dim=-1).nan_to_num(0.0)
                return A @ V, A
        """),
        "test07_attention_hidden",
    ),
    (
        "09_kv_cache",
        "ex09_decode_with_cache",
        _code("""
            def decode_with_cache(X, W_q, W_k, W_v):
                if X.dim() == 2:
                    return decode_with_cache(X[None], W_q, W_k, W_v)[0]
                B = X.shape[0]
                K_cache, V_cache = X.new_zeros(B, 0, W_k.shape[-1]), X.new_zeros(B, 0, W_v.shape[-1])
                outputs = []
                for t in range(X.shape[1]):
                    o_t, K_cache, V_cache = kv_cache_step(X[:, t : t + 1], K_cache, V_cache, W_q, W_k, W_v)
                    outputs.append(o_t)
                return torch.cat(outputs, dim=1)
        """),
        "test09_decode_with_cache_hidden",
    ),
    (
        "11_cost",
        "ex11_tiled_attention",
        _code("""
            def tiled_attention(Q, K, V, block_size, causal=False):
                T_q, T_k = Q.shape[-2], K.shape[-2]
                lead = (T_q,) if Q.dim() == 2 else (Q.shape[0], T_q)  # one batch axis at most
                m = torch.full((*lead, 1), float("-inf"), dtype=Q.dtype, device=Q.device)
                l = torch.zeros((*lead, 1), dtype=Q.dtype, device=Q.device)
                acc = torch.zeros((*lead, V.shape[-1]), dtype=Q.dtype, device=Q.device)
                rows = torch.arange(T_q, device=Q.device)[:, None]
                for start in range(0, T_k, block_size):
                    K_b, V_b = K[..., start : start + block_size, :], V[..., start : start + block_size, :]
                    S_b = Q @ K_b.transpose(-2, -1) / math.sqrt(Q.shape[-1])
                    if causal:
                        cols = torch.arange(start, start + K_b.shape[-2], device=Q.device)[None, :]
                        S_b = S_b.masked_fill(cols > rows, float("-inf"))
                    m_new = torch.maximum(m, S_b.amax(dim=-1, keepdim=True))
                    factor, P = torch.exp(m - m_new), torch.exp(S_b - m_new)
                    l = l * factor + P.sum(dim=-1, keepdim=True)
                    acc = acc * factor + P @ V_b
                    m = m_new
                return acc / l
        """),
        "test11_tiled_attention_hidden",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("lesson, grade_id, source, check", FIXED_AXES, ids=[c[1] for c in FIXED_AXES])
def test_axes_fixed_for_2_d_and_3_d_fail_a_visible_check_on_a_4_d_batch(
    lesson, grade_id, source, check, monkeypatch
):
    """The visible checks ran batches of one leading axis at most; these functions lost the hidden check's
    points on a 4-D batch (every tensor exercise's hidden cases have one) while its visible part passed (and,
    but for lessons 07, 09's decode_with_cache and 11, every other visible check too). It runs one now."""
    _fails_its_check_and_runs_on(lesson, grade_id, source, check, monkeypatch)


# a function with the right numbers that breaks a rule the lesson states: (lesson, answers, the check that
# fails, words of its message, the other checks of the function, which pass)
RULES = [
    (
        "01_projection",
        {
            "ex01_project": "def project(X, W_q, W_k, W_v):\n    return tuple((X @ W).double() for W in (W_q, W_k, W_v))\n"
        },
        "test01_project_hidden",
        "project returned a float64 tensor for float32 inputs: results keep the dtype of the inputs",
        ["test01_project_shapes", "test01_project_values"],
    ),
    (
        "02_scoring",
        {"ex02_scores": "def scores(Q, K):\n    return (Q @ K.mT).float()\n"},
        "test02_scores_hidden",
        "scores returned a float32 tensor for float64 inputs: results keep the dtype of the inputs",
        ["test02_scores_shapes", "test02_scores_values"],
    ),
    (
        "09_kv_cache",
        {
            "ex09_kv_cache_step": _code("""
                def kv_cache_step(x_t, K_cache, V_cache, W_q, W_k, W_v):
                    q, k, v = x_t @ W_q, x_t @ W_k, x_t @ W_v
                    K, V = torch.cat([K_cache, k], dim=-2), torch.cat([V_cache, v], dim=-2)
                    K_cache.zero_()                 # "free" the old cache: it is the caller's tensor
                    V_cache.zero_()
                    return torch.softmax(q @ K.mT / math.sqrt(q.shape[-1]), dim=-1) @ V, K, V
            """)
        },
        "test09_kv_cache_step_hidden",
        "kv_cache_step changed its argument `K_cache` in place",
        [],  # its shapes and values checks fail on this too, as graded (``IN_PLACE`` below)
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("lesson, answers, check, words, others", RULES, ids=[r[0] for r in RULES])
def test_a_broken_dtype_or_in_place_rule_fails_a_visible_check(
    lesson, answers, check, words, others, monkeypatch
):
    """Right numbers, a rule broken (float64 out of float32 in, float32 out of float64 in, the caller's cache
    changed in place): the visible check of the hidden cell says so, as the hidden check will."""
    nb = _run(lesson, answers, monkeypatch, grading=None)
    _ran_to_the_end(lesson, nb)
    name = next(iter(answers)).split("_", 1)[1]
    flat = " ".join(_stdout(_cell(nb, check)).replace("|", " ").split())
    assert f"FAILED: this check of `{name}`" in flat and words in flat, f"{lesson}:{check}:\n{flat}"
    for other in others:
        assert "FAILED" not in _stdout(_cell(nb, other)), f"{lesson}:{other}:\n{_stdout(_cell(nb, other))}"
    assert f"[ ] `{name}`: FAILED: " in _summary(nb), _summary(nb)


# right numbers from a function that changes what a check gives it in place: (lesson, its answer, the words
# of the first check that fails). Graded, every check whose calls changed their inputs fails; in a student's
# session the visible checks said "passed" for most of them, and the grade flagged them as tampering
IN_PLACE = [
    (
        "03_scaling",
        {
            "ex03_scaled_scores": "def scaled_scores(Q, K):\n    Q.div_(Q.shape[-1] ** 0.5)\n    return Q @ K.mT\n"
        },
        "scaled_scores changed its argument `Q` in place",
    ),
    (
        "05_softmax",
        {
            "ex05_softmax": _code("""
                def softmax(Z, dim=-1):
                    m = Z.amax(dim=dim, keepdim=True)
                    Z -= torch.where(torch.isfinite(m), m, torch.zeros_like(m))
                    Z.exp_()
                    s = Z.sum(dim=dim, keepdim=True)
                    return Z / torch.where(s > 0, s, torch.ones_like(s))
            """)
        },
        "softmax changed its argument `Z` in place",
    ),
    next((lesson, answers, words) for lesson, answers, _, words, _ in RULES if lesson == "09_kv_cache"),
]


@pytest.mark.slow
@pytest.mark.parametrize("lesson, answers, words", IN_PLACE, ids=[c[0] for c in IN_PLACE])
def test_inputs_changed_in_place_fail_the_visible_checks_the_grade_fails(
    lesson, answers, words, monkeypatch, tmp_path
):
    """What a student's session says before hand-in is what the grade says: every check of the function whose
    calls changed the check's inputs fails in both, with the same words, and the grade's flag says why."""
    from grader.classroom import lessons
    from grader.classroom.autograde import Job, Options, grade_job

    name = next(iter(answers)).split("_", 1)[1]
    les = lessons.lesson(lesson)
    checks = [c.grade_id for c in les.tests if les.exercise_of(c.grade_id) == name]
    nb = _run(lesson, answers, monkeypatch, grading=None)
    _ran_to_the_end(lesson, nb)
    said = {gid: " ".join(_stdout(_cell(nb, gid)).replace("|", " ").split()) for gid in checks}
    failed = {gid for gid, text in said.items() if f"FAILED: this check of `{name}`" in text}
    assert failed and words in said[min(failed, key=checks.index)], said
    submitted = filled(
        ROOT / "notebooks" / lesson / f"{lesson}.ipynb", {**solution_sources(lesson), **answers}
    )
    with grading_work(tmp_path, [lesson]) as template:
        result = grade_job(
            Job("in_place", lesson, nbformat.writes(submitted).encode(), template, options=Options())
        )
    assert result.error is None, result.error
    lost = {c.grade_id for c in result.cells if c.score < c.points}
    assert lost == failed, (lost, failed)
    assert any(words in c.message for c in result.cells), [c.message for c in result.cells]
    assert result.flags and all(f.endswith(", its inputs changed in place") for f in result.flags), (
        result.flags
    )


def test_an_example_cell_names_the_function_whose_result_it_could_not_use(session, capsys, monkeypatch):
    """A mask of the wrong shape makes the right apply_mask raise: the box blames the mask, whose visible check
    failed, says where the error was raised, and the cell's next line still runs; graded, the error is raised."""
    _cell_run(
        session,
        """
        import torch
        from attention_course.checks import demo, diagnosed, expect_shape

        def causal_mask(T):
            return torch.ones(T, T + 1, dtype=torch.bool).tril()

        def apply_mask(S, allowed):
            return S.masked_fill(~allowed, float("-inf"))

        with diagnosed("causal_mask", causal_mask):
            expect_shape(causal_mask(5), (5, 5), "causal_mask(5)")
        with demo(causal_mask, apply_mask):
            apply_mask(torch.zeros(5, 5), causal_mask(5))
        reached = True
        """,
    )
    flat = " ".join(capsys.readouterr().out.replace("|", " ").split())
    assert session["reached"], "the cell stopped"
    assert "EXAMPLE STOPPED: this cell could not use what your `causal_mask` returned" in flat, flat
    assert "RuntimeError: The size of tensor a (6) must match the size of tensor b (5)" in flat, flat
    assert "This cell will work once `causal_mask` is fixed; its checks say what is wrong." in flat, flat
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(RuntimeError, match="must match the size"):
        _cell_run(
            session, "with demo(causal_mask, apply_mask):\n    apply_mask(torch.zeros(5, 5), causal_mask(5))"
        )
    assert capsys.readouterr().out == ""


def test_the_rule_helpers_say_which_dtype_and_which_argument():
    """expect_dtype_follows tries the inputs as given and in float64; expect_inputs_unchanged names the
    argument changed in place and returns the result; right functions pass both."""
    import torch

    from attention_course.checks import expect_dtype_follows, expect_inputs_unchanged

    A, V, allowed = torch.rand(2, 3), torch.rand(3, 4), torch.ones(2, 3, dtype=torch.bool)
    expect_dtype_follows(lambda A, V: A @ V, A, V)
    for wrong, words in (
        (lambda A, V: (A @ V).double(), "returned a float64 tensor for float32 inputs"),
        (lambda A, V: (A @ V).float(), "returned a float32 tensor for float64 inputs"),
    ):
        with pytest.raises(AssertionError, match=words):
            expect_dtype_follows(wrong, A, V)

    def apply_mask(S, allowed):
        return S.masked_fill_(~allowed, float("-inf"))

    assert expect_inputs_unchanged(lambda S, allowed: S.masked_fill(~allowed, 0.0), A, allowed).shape == (
        2,
        3,
    )
    with pytest.raises(AssertionError, match="apply_mask changed its argument `S` in place"):
        expect_inputs_unchanged(apply_mask, A.clone(), ~allowed)


# a function with the right numbers on the CPU that makes its result on the CPU whatever the device of its
# inputs: (lesson, answers, the check that fails, words of its message, the other checks, which pass)
DEVICES = [
    (
        "04_masking",
        {
            "ex04_causal_mask": "def causal_mask(T, device=None):\n    return torch.ones(T, T, dtype=torch.bool).tril()\n"
        },
        "test04_causal_mask_hidden",
        "causal_mask(3, device='meta'), with its inputs on the 'meta' device, returned a tensor on cpu: the "
        "result was made on the wrong device",
        ["test04_causal_mask_shape", "test04_causal_mask_values"],
    ),
    (
        "04_masking",
        {
            "ex04_padding_mask": "def padding_mask(lengths, T):\n"
            "    return (torch.arange(T)[None, :] < lengths[:, None])[:, None, :]\n"
        },
        "test04_padding_mask_hidden",
        'mixed two devices: PyTorch says "Tensor on device meta is not on the expected device cpu!"',
        ["test04_padding_mask_shape", "test04_padding_mask_values"],
    ),
    (
        "06_mixing",
        {
            "ex06_mix": _code("""
                def mix(A, V):
                    out = torch.zeros(*A.shape[:-1], V.shape[-1], dtype=V.dtype)    # on the CPU, always
                    for j in range(V.shape[-2]):
                        out = out + A[..., :, j:j + 1] * V[..., j:j + 1, :]
                    return out
            """)
        },
        "test06_mix_hidden",
        "mix(<(3, 3) tensor on meta>, <(3, 3) tensor on meta>), with its inputs on the 'meta' device, "
        "mixed two devices",
        ["test06_mix_shapes", "test06_mix_values"],
    ),
    (
        "11_cost",
        {
            "ex11_tiled_attention": solution_sources("11_cost")["ex11_tiled_attention"].replace(
                'float("-inf"), dtype=Q.dtype, device=Q.device)', 'float("-inf"), dtype=Q.dtype)'
            )
        },
        "test11_tiled_attention_hidden",
        "tiled_attention(<(10, 4) tensor on meta>, <(10, 4) tensor on meta>, <(10, 4) tensor on meta>, 3), "
        "with its inputs on the 'meta' device, mixed two devices",
        ["test11_tiled_attention_small", "test11_tiled_attention_sdpa"],
    ),
    (  # an empty cache made on the CPU: the first torch.cat with a token's keys mixes the devices
        "09_kv_cache",
        {
            "ex09_decode_with_cache": solution_sources("09_kv_cache")["ex09_decode_with_cache"]
            .replace(
                "X.new_zeros(*X.shape[:-2], 0, W_k.shape[-1])",
                "torch.zeros(*X.shape[:-2], 0, W_k.shape[-1], dtype=X.dtype)",
            )
            .replace(
                "X.new_zeros(*X.shape[:-2], 0, W_v.shape[-1])",
                "torch.zeros(*X.shape[:-2], 0, W_v.shape[-1], dtype=X.dtype)",
            )
        },
        "test09_decode_with_cache_hidden",
        "with its inputs on the 'meta' device, mixed two devices",
        ["test09_decode_with_cache_causal"],
    ),
    (  # the causal mask of the head made without device=
        "10_learning",
        {
            "ex10_head_forward": solution_sources("10_learning")["ex10_head_forward"].replace(
                "torch.ones(n, n, dtype=torch.bool, device=X.device)", "torch.ones(n, n, dtype=torch.bool)"
            )
        },
        "test10_head_forward_hidden",
        "with its inputs on the 'meta' device, mixed two devices",
        ["test10_head_forward_shapes", "test10_head_forward_values"],
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "lesson, answers, check, words, others", DEVICES, ids=[next(iter(d[1])) for d in DEVICES]
)
def test_a_result_made_on_the_wrong_device_fails_a_visible_check_on_any_machine(
    lesson, answers, check, words, others, monkeypatch
):
    """Right numbers on the CPU, the result made on the CPU whatever the inputs' device: with no GPU, the
    visible check of the hidden cell tries the function on PyTorch's 'meta' device and says so; the other
    checks of the function pass. (Graded, the hidden check tries 'meta' too: tests/test_lesson04.py.)"""
    assert answers != {k: solution_sources(lesson)[k] for k in answers}, "the mistake was not put in"
    nb = _run(lesson, answers, monkeypatch, grading=None)
    _ran_to_the_end(lesson, nb)
    name = next(iter(answers)).split("_", 1)[1]
    flat = " ".join(_stdout(_cell(nb, check)).replace("|", " ").split())
    assert f"FAILED: this check of `{name}`" in flat and words in flat, f"{lesson}:{check}:\n{flat}"
    assert f"Graded, the hidden check of `{name}` fails on this too, on any machine." in flat, flat
    assert "Diagnosis" not in flat, flat  # on the CPU its numbers are right: no other mistake is named
    for other in others:
        assert "FAILED" not in _stdout(_cell(nb, other)), f"{lesson}:{other}:\n{_stdout(_cell(nb, other))}"
    assert (
        f"[ ] `{name}`: FAILED: {len(others)} of {len(others) + 1} checks pass; the first failure says: the result "
        "was made on the wrong " in (" ".join(_summary(nb).split()))
    ), _summary(nb)


def test_the_device_helper_judges_only_what_meta_can_show(session, capsys, monkeypatch):
    """Loops that read values (int(t), .item(), printing) cannot run on 'meta' and are not judged; what such
    a function prints of a 'meta' tensor is not shown; a tensor made on the CPU is named; graded, nothing
    is tried here (the hidden check tries 'meta' itself, and only it takes the points)."""
    import torch

    from attention_course.checks import expect_device_follows
    from attention_course.diagnosis import DeviceNotFollowed

    lengths = torch.tensor([2, 1])

    def loop_padding(lengths, T):
        print("lengths:", lengths)
        rows = [[[t < int(lengths[b]) for t in range(T)]] for b in range(lengths.shape[0])]
        return torch.tensor(rows, device=lengths.device)

    def where_with_a_scalar(S, allowed):
        return torch.where(allowed, S, torch.tensor(float("-inf")))  # a 0-dim CPU tensor: fine on any device

    def on_the_cpu(S, allowed):
        return torch.where(allowed, S, float("-inf")) + torch.zeros(
            S.shape[-1]
        )  # the zeros: on the CPU, always

    expect_device_follows(loop_padding, lengths, 3)
    expect_device_follows(where_with_a_scalar, torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
    assert capsys.readouterr().out == "", "what the function printed of a 'meta' tensor was shown"
    with pytest.raises(
        DeviceNotFollowed, match=r"on_the_cpu\(<\(2, 3\) tensor on meta>, <\(2, 3\) tensor on meta>\)"
    ):
        expect_device_follows(on_the_cpu, torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    expect_device_follows(on_the_cpu, torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))


_NO_COMPILER = """
import sys, torch
from attention_course.checks import expect_device_follows
from attention_course.diagnosis import DeviceNotFollowed

def apply_mask(S, allowed):  # a Python reference on 'meta' (masked_fill), and a division by a number
    return S.masked_fill(~allowed, float("-inf")) / 2.0

def made_on_the_cpu(S, allowed):
    return S.masked_fill(~allowed, float("-inf")) + torch.zeros(S.shape)

expect_device_follows(apply_mask, torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
try:
    expect_device_follows(made_on_the_cpu, torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
    print("not caught")
except DeviceNotFollowed as e:
    print("caught:", str(e).split(":")[0])
print("torch._dynamo loaded:", "torch._dynamo" in sys.modules)
"""


def test_the_device_check_loads_no_compiler():
    """'meta' runs many operations through PyTorch's Python references, whose first call would import
    torch._dynamo (about 0.7 s of every lesson's Run All); the check gives the same verdicts without it."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _NO_COMPILER], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert (
        "caught: made_on_the_cpu(<(2, 3) tensor on meta>, <(2, 3) tensor on meta>), with its inputs on the 'meta' device, mixed two devices"
        in run.stdout
    ), run.stdout
    assert "torch._dynamo loaded: False" in run.stdout, run.stdout


# ------------------------------------------------------------------ named mistakes the visible checks missed


def _solution_with(lesson: str, grade_id: str, *swaps: tuple[str, str]) -> str:
    """The lesson's own solution of ``grade_id`` with each (old, new) swapped in (each must be there)."""
    source = solution_sources(lesson)[grade_id]
    for old, new in swaps:
        assert old in source, (grade_id, old)
        source = source.replace(old, new)
    return source


# a student's function making one of the lesson's named mistakes (docs/mistakes.md), which loses hidden
# points: (lesson, its grade id, its code, the visible check it fails now)
NAMED_MISTAKES = [
    (
        "03_scaling",
        "ex03_scaled_scores",
        "def scaled_scores(Q, K):\n    return Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[1])\n",
        "test03_scaled_scores_hidden",
    ),
    (
        "03_scaling",
        "ex03_score_spread",
        _code("""
            def score_spread(d_k, n, generator):
                q, k = torch.randn(n, d_k), torch.randn(n, d_k)
                raw = (q * k).sum(dim=-1).std().item()
                return raw, raw / math.sqrt(d_k)
        """),
        "test03_score_spread_hidden",
    ),
    (
        "05_softmax",
        "ex05_softmax",
        _code("""
            def softmax(Z, dim=-1):
                m = Z.amax(dim=-1, keepdim=True)
                e = torch.exp(Z - torch.where(torch.isinf(m), torch.zeros_like(m), m))
                total = e.sum(dim=-1, keepdim=True)
                return e / torch.where(total > 0, total, torch.ones_like(total))
        """),
        "test05_softmax_hidden",
    ),
    (
        "07_one_head",
        "ex07_attention",
        _code("""
            def attention(Q, K, V, mask=None):
                S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
                if mask is not None:
                    S = S.masked_fill(~mask, float("-inf"))
                A = torch.softmax(S, dim=-1)
                return A @ V, A
        """),
        "test07_attention_hidden",
    ),
    (
        "08_multihead",
        "ex08_multi_head_attention",
        _code("""
            def multi_head_attention(X, W_q, W_k, W_v, W_o, n_heads, causal=False):
                Q, K, V = (split_heads(X @ W, n_heads) for W in (W_q, W_k, W_v))
                A = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1)
                return merge_heads(A @ V) @ W_o
        """),
        "test08_multi_head_attention_hidden",
    ),
    (
        "08_multihead",
        "ex08_grouped_query_attention",
        _code("""
            def grouped_query_attention(X, W_q, W_k, W_v, W_o, n_heads, n_kv_heads, causal=False):
                Q = split_heads(X @ W_q, n_heads)
                K, V = (split_heads(X @ W, n_kv_heads).repeat_interleave(n_heads // n_kv_heads, dim=-3) for W in (W_k, W_v))
                S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
                T = S.shape[-1]
                S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=S.device).tril(), float("-inf"))
                return merge_heads(torch.softmax(S, dim=-1) @ V) @ W_o
        """),
        "test08_grouped_query_attention_hidden",
    ),
    (
        "09_kv_cache",
        "ex09_kv_cache_bytes",
        _code("""
            def kv_cache_bytes(n_layers, n_kv_heads, d_head, n_tokens, batch=1, bytes_per_value=2):
                return 2 * n_layers * n_kv_heads * d_head * n_tokens * bytes_per_value
        """),
        "test09_kv_cache_bytes_hidden",
    ),
    (
        "11_cost",
        "ex11_online_softmax_stats",
        _solution_with(
            "11_cost",
            "ex11_online_softmax_stats",
            ('torch.full(Z.shape[:-1], float("-inf"), dtype', "torch.zeros(Z.shape[:-1], dtype"),
        ),
        "test11_online_softmax_stats_hidden",
    ),
    (
        "11_cost",
        "ex11_tiled_attention",
        _solution_with(
            "11_cost",
            "ex11_tiled_attention",
            ('torch.full((*Q.shape[:-1], 1), float("-inf"), dtype', "torch.zeros((*Q.shape[:-1], 1), dtype"),
        ),
        "test11_tiled_attention_hidden",
    ),
    (
        "11_cost",
        "ex11_tiled_attention",
        _solution_with(
            "11_cost",
            "ex11_tiled_attention",
            ("factor = torch.exp(m - m_new)", "factor = torch.ones_like(m)"),
            ("P = torch.exp(S_b - m_new)", "P = torch.exp(S_b)"),
        ),
        "test11_tiled_attention_hidden",
    ),
]
NAMED_MISTAKE_IDS = [
    "scaled_scores: d_k from shape[1]",
    "score_spread: the generator not used",
    "softmax: dim ignored",
    "attention: NaN for a query with no allowed key",
    "multi_head_attention: causal never masks",
    "grouped_query_attention: every call masks",
    "kv_cache_bytes: batch ignored",
    "online_softmax_stats: max starts at 0",
    "tiled_attention: max starts at 0",
    "tiled_attention: max not subtracted",
]


@pytest.mark.slow
@pytest.mark.parametrize("lesson, grade_id, source, check", NAMED_MISTAKES, ids=NAMED_MISTAKE_IDS)
def test_a_named_mistake_that_passed_every_visible_check_fails_one(
    lesson, grade_id, source, check, monkeypatch
):
    """Each of these mistakes is one the lesson names and the hidden check fails, yet every visible check
    passed it: the lesson's own inputs are 2-D, sort along the last axis, never mask a whole row, never ask
    for a batch of caches, and keep scores far from -1000 and +1000. The hidden cell's visible part tries
    each of those now."""
    _fails_its_check_and_runs_on(lesson, grade_id, source, check, monkeypatch)
