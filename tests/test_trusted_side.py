"""Attacks on the trusted side, the process outside the seal that decides every check: what a sandbox's
answer makes it build, what a notebook's shown results make nbgrader read, and the rules' watch.

Graded through the course's tool (``autograde.grade_job``); tests/test_plain_nbgrader.py grades the same
attacks (tests/attacks.py) through the ``nbgrader autograde`` command line.
"""

from __future__ import annotations

import os
from typing import Any

import nbformat
import pytest

from grader import course
from tests import attacks
from tests import test_seal as _seal
from tests.nbtools import filled, grading_work, solution_sources
from tests.test_seal import LESSON, needs_seal

gradebook = _seal.gradebook  # lesson 01's, built once for this module


def _correct_notebook(lesson: str) -> nbformat.NotebookNode:
    return filled(course.ROOT / "notebooks" / lesson / f"{lesson}.ipynb", solution_sources(lesson))


@pytest.fixture(scope="module")
def softmax_gradebook(tmp_path_factory):
    """A work folder whose gradebook knows lesson 05 (built once for this module)."""
    work = tmp_path_factory.mktemp("boundary-05")
    with grading_work(work, ["05_softmax"]) as template:
        yield template


@needs_seal
def test_an_answer_that_swells_outside_the_seal_costs_its_own_check_not_the_machine(softmax_gradebook):
    """The trusted process decides outside the seal and its cgroup. A softmax whose hidden answer is a
    zero-stride tensor of 3e9 elements (a hundred bytes through the pipe) made that process build 3 GB
    and more, past every cap of the notebook; now it has the notebook's cap, so the check that would
    make it whole fails (flagged) and a classmate graded next keeps full marks."""
    from grader.classroom.autograde import Job, Options, grade_job

    lesson = "05_softmax"
    nb = filled(
        course.ROOT / "notebooks" / lesson / f"{lesson}.ipynb",
        {**solution_sources(lesson), "ex05_softmax": attacks.EXPANDED_ANSWER},
    )
    options = Options(timeout=60, memory=1 << 30)
    attacker = grade_job(
        Job("swell_sam", lesson, nbformat.writes(nb).encode(), softmax_gradebook, options=options)
    )
    assert attacker.error is None, attacker.error
    scores = {c.grade_id: (c.score, c.points) for c in attacker.cells}
    assert scores["test05_softmax_overflow"][0] == 0, scores
    lost = {g for g, (score, points) in scores.items() if score < points}
    assert lost == {"test05_softmax_overflow"}, scores
    assert any("test05_softmax_overflow" in flag for flag in attacker.flags), attacker.flags
    victim_nb = filled(course.ROOT / "notebooks" / lesson / f"{lesson}.ipynb", solution_sources(lesson))
    victim = grade_job(
        Job("victim_val", lesson, nbformat.writes(victim_nb).encode(), softmax_gradebook, options=options)
    )
    assert victim.error is None and victim.score == victim.max_score, [
        (c.grade_id, c.score) for c in victim.cells
    ]


_ZERO_PROJECT = "def project(X, W_q, W_k, W_v):\n    z = torch.zeros(*X.shape[:-1], W_q.shape[-1], dtype=X.dtype)\n    return z, z, z\n"


@needs_seal
def test_a_result_above_a_cells_points_is_no_score_and_no_crash(gradebook):
    """nbgrader reads a number a test cell shows as its partial credit, and raises where it is above the
    cell's points. A notebook that shows 99 after every cell turned its wrong answer into "could not be
    graded" (and the run's exit status into a failure) on both paths; now it earns what its code earns."""
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    results = {}
    for name, extra in (("plain_pat", None), ("forger_fay", attacks.SCORE_FORGER)):
        nb = filled(course.ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", {"ex01_project": _ZERO_PROJECT})
        if extra:
            nb.cells.insert(1, nbformat.v4.new_code_cell(extra))
        results[name] = grade_job(
            Job(name, LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=30))
        )
    for name, result in results.items():
        assert result.error is None, (name, result.error)
    plain, forger = results["plain_pat"], results["forger_fay"]
    assert forger.score == plain.score < plain.max_score, (forger.score, plain.score)
    assert [(c.grade_id, c.score) for c in forger.cells] == [(c.grade_id, c.score) for c in plain.cells]


@needs_seal
def test_a_watch_switched_off_by_names_no_scan_can_read_is_flagged(softmax_gradebook):
    """The rules are watched in the student's own process: code that replaces the course's watch (names
    built from strings, so the source scan sees nothing) made a ruled-out `torch.softmax` earn full marks
    without a word. A call the course makes after the student's code ran, which the watch must see,
    now flags it for review; a correct classmate is not flagged."""
    from grader.classroom.autograde import Job, Options, grade_job
    from grader.classroom.independent import WATCH_OFF

    lesson = "05_softmax"
    path = course.ROOT / "notebooks" / lesson / f"{lesson}.ipynb"
    results = {}
    for student, answers in (
        ("quiet_quinn", {**solution_sources(lesson), "ex05_softmax": attacks.WATCH_SWITCHED_OFF}),
        ("honest_hal", solution_sources(lesson)),
    ):
        nb = nbformat.writes(filled(path, answers)).encode()
        results[student] = grade_job(Job(student, lesson, nb, softmax_gradebook, options=Options(timeout=60)))
        assert results[student].error is None, results[student].error
    assert WATCH_OFF in results["quiet_quinn"].flags, results["quiet_quinn"].flags
    assert (
        results["honest_hal"].flags == [] and results["honest_hal"].score == results["honest_hal"].max_score
    )


@needs_seal
def test_a_watch_replaced_in_its_module_is_put_back_for_the_checks(softmax_gradebook):
    """Code that replaced the course's watch class in its module (by a name built from strings, blind
    only while the student's own function runs, so the canary saw nothing) made a ruled-out
    `torch.softmax` earn 16/16. The sandbox keeps the watch as loaded and puts it back before every
    call: the rule costs what it costs, and the change is flagged for review."""
    from grader.classroom.autograde import Job, Options, grade_job
    from grader.classroom.independent import WATCH_CHANGED, WATCH_OFF

    lesson = "05_softmax"
    answers = {**solution_sources(lesson), "ex05_softmax": attacks.WATCH_SWAPPED}
    nb = nbformat.writes(filled(course.ROOT / "notebooks" / lesson / f"{lesson}.ipynb", answers)).encode()
    swapped = grade_job(Job("swapped_sid", lesson, nb, softmax_gradebook, options=Options(timeout=60)))
    assert swapped.error is None, swapped.error
    assert swapped.score < swapped.max_score, [(c.grade_id, c.score) for c in swapped.cells]
    assert any("rules out" in (c.message or "") for c in swapped.cells), [c.message for c in swapped.cells]
    assert any(f.startswith(WATCH_CHANGED) and "CallWatch" in f for f in swapped.flags), swapped.flags
    assert WATCH_OFF not in swapped.flags, swapped.flags


def test_widget_state_a_kernel_leaves_is_not_kept_in_the_graded_notebook():
    """A kernel can open widgets with state of any size, which nbclient saves in the notebook's metadata
    (a 40 MB state made a 40 MB graded notebook); outputs are capped per cell, and this state is dropped."""
    from grader.classroom.cells import CapOutputs

    nb = _correct_notebook(LESSON)
    state = {"state": {"x": {"model_name": "HTMLModel", "state": {"value": "x" * 5_000_000}}}}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": state}
    capped, _ = CapOutputs().preprocess(nb, {})
    assert "widgets" not in capped.metadata
    assert len(nbformat.writes(capped)) < 1_000_000


@needs_seal
def test_a_kernel_cannot_swap_its_sockets_for_links_the_grader_would_follow(gradebook):
    """The kernel's sockets are files in a folder bound into the seal, read by the grading process from
    outside it (root, where grading runs as root). Student code replaced them with links to a socket the
    seal hides, and that process connected to it hundreds of times. Once the kernel has bound them, and
    before any student code runs, the folder is root's and read-only: the swap fails, the notebook is
    graded as usual."""
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    nb = _correct_notebook(LESSON)
    nb.cells.insert(1, nbformat.v4.new_code_cell(attacks.SOCKET_SWAPPER))
    result = grade_job(
        Job("swap_sid", LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=30))
    )
    assert result.error is None and result.score == result.max_score, (result.error, result.score)
    printed = nbformat.reads(result.notebook.decode(), as_version=4).cells[1].outputs
    text = "".join(o.get("text", "") for o in printed)
    if os.geteuid() == 0:  # elsewhere the kernel is the grading user itself, and reaches nothing it could not
        assert "KEPT" in text and "SWAPPED" not in text, text


def test_the_kernels_widget_state_is_not_collected_while_grading(tmp_path):
    """The executor keeps no copy of the widget state a kernel sends: a kernel that sent 400 MB of it
    made the grading process hold gigabytes (and fail that student's job) before any cap applied."""
    from grader.classroom.autograde import GuardedExecute

    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("import ipywidgets as W\nw = W.HTML('x' * 2_000_000)\ndisplay(w)")]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    executor = GuardedExecute(timeout=60)
    executor.preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert nb.cells[0].outputs, "the widget was displayed"
    assert executor.widget_state == {} and "widgets" not in nb.metadata


@pytest.fixture(scope="module")
def cost_gradebook(tmp_path_factory):
    """A work folder whose gradebook knows lesson 11 (built once for this module)."""
    with grading_work(tmp_path_factory.mktemp("boundary-11"), ["11_cost"]) as template:
        yield template


def _graded_11(student: str, gradebook: Any, stats: str, tiled: str | None = None) -> Any:
    """Lesson 11 graded by the course's tool with these answers (the solution's where None)."""
    from grader.classroom.autograde import Job, Options, grade_job

    lesson = "11_cost"
    answers = {**solution_sources(lesson), "ex11_online_softmax_stats": stats}
    if tiled is not None:
        answers["ex11_tiled_attention"] = tiled
    nb = nbformat.writes(filled(course.ROOT / "notebooks" / lesson / f"{lesson}.ipynb", answers)).encode()
    return grade_job(Job(student, lesson, nb, gradebook, options=Options(timeout=60)))


@needs_seal
def test_lesson_11_rules_hold_below_torch_functions_in_the_sandbox(cost_gradebook):
    """A fused kernel under a private name earned 12/12 (the watch saw torch functions only); blocks glued
    back together in numpy earned it too, unflagged. In the sandbox the watch now sees every aten
    operation: the kernel fails the rule; numpy, where it cannot follow, is flagged for a person."""
    from grader.classroom.independent import WATCH_REVIEW

    result = _graded_11("fused_sid", cost_gradebook, attacks.L11_NUMPY_GLUE, attacks.L11_FUSED_TILED)
    assert result.error is None, result.error
    scores = {c.grade_id: c.score for c in result.cells}
    assert (
        scores["test11_tiled_attention_hidden"] == 0 and scores["test11_online_softmax_stats_hidden"] == 3
    ), scores
    hidden = next(c for c in result.cells if c.grade_id == "test11_tiled_attention_hidden")
    assert "_scaled_dot_product_flash_attention_for_cpu" in (hidden.message or ""), hidden.message
    assert [f for f in result.flags if f.startswith(WATCH_REVIEW)] == [
        f"{WATCH_REVIEW}: online_softmax_stats computed its result outside torch from values of its inputs "
        "taken out (numpy, lists, numbers), where the watch cannot tell whether they were read one block at a time"
    ], result.flags
    # honest blocks, started from numbers made with torch.tensor (no operator shows them made on 'meta')
    honest = _graded_11("honest_sid", cost_gradebook, HONEST_TENSOR_START)
    assert honest.score == honest.max_score and honest.flags == [], (honest.score, honest.flags)


@needs_seal
def test_a_sandbox_that_stops_reading_fails_its_own_checks_by_their_deadline(cost_gradebook):
    """A sandbox that answered a call and then stopped reading its pipe (shrunk to a page) held the trusted
    side's next request, larger than the pipe, until all the checks' time was over: every check of the
    notebook then read "could not be run outside the notebook" and it was not verified. A request must
    now be taken in whole by its call's deadline too: the checks it cuts fail, saying the student's code
    did not finish, and the others keep their points."""
    from grader.classroom.autograde import Job, Options, grade_job

    lesson = "11_cost"
    sols = solution_sources(lesson)
    answers = {**sols, "ex11_tiled_attention": sols["ex11_tiled_attention"] + "\n" + attacks.STOPS_READING}
    nb = nbformat.writes(filled(course.ROOT / "notebooks" / lesson / f"{lesson}.ipynb", answers)).encode()
    options = Options(timeout=5, notebook_timeout=60)
    result = grade_job(Job("stuck_stu", lesson, nb, cost_gradebook, options=options))
    assert result.error is None and result.status != "not verified", (result.status, result.error)
    scores = {c.grade_id: (c.score, c.points) for c in result.cells}
    assert all(s == p for g, (s, p) in scores.items() if "online_softmax_stats" in g), scores
    cut = [c for c in result.cells if c.score < c.points]
    assert {c.grade_id for c in cut} == {"test11_tiled_attention_sdpa", "test11_tiled_attention_hidden"}, (
        scores
    )
    assert all("did not finish within 10 s" in c.message for c in cut), [c.message for c in cut]


@needs_seal
def test_lesson_11_code_that_reaches_its_watch_or_writes_from_another_thread_in_the_sandbox(cost_gradebook):
    """The call's watch told there is no rule, through the dispatcher's mode stack: full marks. Whole rows
    written from another thread into the tensors the call returns: full marks, unflagged. In the sandbox
    the first now fails the rule; the second, which the watch cannot follow, is flagged for a person."""
    from grader.classroom.independent import WATCH_REVIEW

    result = _graded_11("reaching_rae", cost_gradebook, attacks.L11_THREAD_INTO_HELD, attacks.L11_GRAB_WATCH)
    assert result.error is None, result.error
    scores = {c.grade_id: c.score for c in result.cells}
    assert scores["test11_tiled_attention_hidden"] == 0, scores
    assert scores["test11_online_softmax_stats_hidden"] == 3, scores
    hidden = next(c for c in result.cells if c.grade_id == "test11_tiled_attention_hidden")
    assert "it changed the watch that checks the rule while it ran" in (hidden.message or ""), hidden.message
    review = [f for f in result.flags if f.startswith(WATCH_REVIEW)]
    assert any(
        "online_softmax_stats returned a tensor of shape" in f and "another thread" in f for f in review
    )
    assert any("tiled_attention changed the rules' watch while it ran" in f for f in review), review
    # honest answers that write in place (each write changes bytes the watch saw written)
    from tests.test_lesson11 import IN_PLACE_STATS, IN_PLACE_TILED

    honest = _graded_11("in_place_ivy", cost_gradebook, IN_PLACE_STATS, IN_PLACE_TILED)
    assert honest.score == honest.max_score and honest.flags == [], (honest.score, honest.flags)


HONEST_TENSOR_START = """
def online_softmax_stats(Z, block_size):
    m = torch.tensor(float("-inf"), dtype=Z.dtype, device=Z.device)
    l = torch.tensor(0.0, dtype=Z.dtype, device=Z.device)
    for start in range(0, Z.shape[-1], block_size):
        block = Z[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new[..., None]).sum(dim=-1)
        m = m_new
    return m, l
"""


@pytest.mark.parametrize(
    "code",
    [
        "from torch.utils._python_dispatch import _get_current_dispatch_mode\n_get_current_dispatch_mode().watch.rule = None",
        "@torch.library.custom_op('mine::blend', mutates_args=())\ndef blend(x: torch.Tensor) -> torch.Tensor: ...",
        "w = torch._C._get_function_stack_at(0)",
        "torch._C._autograd._unsafe_set_version_counter(out, 0)",
    ],
)
def test_code_that_reaches_the_watch_or_hides_work_in_its_own_operator_is_flagged_for_review(code):
    """The watch object is reachable from the student's process (its verdict can be blinded), and an
    operator of the student's own runs where no mode looks: both are flagged by what the code names."""
    from grader.classroom import tamper_scan

    assert "turns off the course's watch on torch calls (the lesson's rules)" in tamper_scan.scan([code])


def _graded_01(template: bytes, student: str, extra: str, options: Any) -> Any:
    """Lesson 01 with the right answer and ``extra`` added to its cell, graded through the tool."""
    from grader.classroom.autograde import Job, grade_job

    sols = solution_sources(LESSON)
    answers = {**sols, "ex01_project": sols["ex01_project"] + "\n" + extra}
    nb = filled(course.ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", answers)
    return grade_job(Job(student, LESSON, nbformat.writes(nb).encode(), template, options=options))


@needs_seal
def test_answers_the_students_code_rewrites_in_the_sandbox_earn_nothing_and_are_flagged(
    gradebook, softmax_gradebook
):
    """The sandbox runs the student's code and sends the answers the checks read: what a call changed in
    place, which ruled-out functions it called. Code that swapped the sandbox's handler in its module, or
    the code of the function that packs an answer, rewrote them: an input emptied in place, or a call of
    torch.softmax, earned full marks, unflagged. The sandbox now answers with the functions it held before
    any student code ran, put back as loaded before each answer is made: the checks fail as without the
    rewrite, and the change is flagged."""
    from grader.classroom.autograde import Job, Options, grade_job
    from grader.classroom.independent import WATCH_CHANGED

    _, template = gradebook
    lesson = "05_softmax"
    sols = solution_sources(lesson)
    nb = filled(
        course.ROOT / "notebooks" / lesson / f"{lesson}.ipynb",
        {**sols, "ex05_softmax": attacks.RULED_OUT_SOFTMAX + attacks.FORGED_ANSWERS},
    )
    results = [
        _graded_01(
            template, "emptying_emma", attacks.EMPTIES_X + attacks.FORGED_ANSWERS, Options(timeout=30)
        ),
        grade_job(
            Job(
                "ruled_rita",
                lesson,
                nbformat.writes(nb).encode(),
                softmax_gradebook,
                options=Options(timeout=30),
            )
        ),
    ]
    for result, hidden in zip(results, ("test01_project_hidden", "test05_softmax_hidden")):
        assert result.error is None, result.error
        scores = {c.grade_id: c.score for c in result.cells}
        assert scores[hidden] == 0, scores
        changed = [f for f in result.flags if f.startswith(WATCH_CHANGED)]
        assert changed and "sandbox.handle" in changed[0] and "sandbox.dump" in changed[0], result.flags


@needs_seal
def test_an_answer_whose_bytes_the_students_code_rewrites_earns_nothing_and_is_flagged(softmax_gradebook):
    """The answers' bytes are made by the sandbox's ``wire`` module; code that rebound one of its functions
    to say that a call used no ruled-out function is put back before the answer is made, and flagged."""
    from grader.classroom.autograde import Job, Options, grade_job
    from grader.classroom.independent import WATCH_CHANGED

    lesson = "05_softmax"
    nb = filled(
        course.ROOT / "notebooks" / lesson / f"{lesson}.ipynb",
        {**solution_sources(lesson), "ex05_softmax": attacks.RULED_OUT_SOFTMAX + attacks.FORGED_WIRE},
    )
    job = Job(
        "wired_wanda", lesson, nbformat.writes(nb).encode(), softmax_gradebook, options=Options(timeout=30)
    )
    result = grade_job(job)
    assert result.error is None, result.error
    assert {c.grade_id: c.score for c in result.cells}["test05_softmax_hidden"] == 0
    changed = [f for f in result.flags if f.startswith(WATCH_CHANGED)]
    assert changed and "wire._tree" in changed[0], result.flags


@needs_seal
def test_a_sandbox_slow_to_answer_fails_its_own_checks_before_the_notebooks_limit(gradebook):
    """A sandbox that sends half an answer and stops, or answers every call just under its time limit,
    made the checks outlast the notebook: the notebook's limit then struck in the lesson's own first cell,
    and the submission was "could not be graded", blamed on the lesson. Each answer now comes whole by
    its call's deadline, and all the checks end by half the notebook's time: the checks they cut fail,
    saying the student's code did not finish, and the notebook is graded."""
    import time

    from grader.classroom.autograde import Options
    from tests.test_boundary import _next_classmate_keeps_full_marks

    _, template = gradebook
    for student, extra, options, why in (
        (
            "half_hal",
            attacks.HALF_ANSWER,
            Options(timeout=5, notebook_timeout=60),
            "the student's code did not finish within 10 s",  # a cell's limit and 5 s more
        ),
        (
            "slow_sol",
            attacks.SLOW_CALLS.replace("SECONDS", "4"),
            Options(timeout=5, notebook_timeout=40),
            "did not finish within the time all the checks of this notebook may take",
        ),
    ):
        start = time.monotonic()
        result = _graded_01(template, student, extra, options)
        assert time.monotonic() - start < options.notebook_timeout - 5, student
        assert result.error is None and result.status != "could not be graded", (student, result.error)
        cut = [c for c in result.cells if c.score < c.points]
        assert cut and all("did not finish" in c.message for c in cut), (student, result.cells)
        assert any(why in c.message for c in cut), (student, [c.message for c in cut])
    _next_classmate_keeps_full_marks(template)


@needs_seal
def test_what_a_sandbox_says_is_kept_short_by_the_trusted_side(gradebook):
    """The trusted side wrote all a sandbox's answers said into its verdicts: the same 40 MB error text
    fifty times after every cell, and two million notes on the rules' watch, made gigabytes on disk and in
    the worker (and a flag per note). It keeps twenty of each, cut short; the right answer keeps its
    marks and a classmate graded next keeps full marks."""
    from grader.classroom.autograde import Options
    from tests.test_boundary import _next_classmate_keeps_full_marks

    _, template = gradebook
    swollen = attacks.SWOLLEN_ANSWERS.replace("MEGABYTES", "4").replace("NOTES", "200_000")
    result = _graded_01(template, "swollen_sue", swollen, Options(timeout=30))
    assert result.error is None and result.score == result.max_score, (result.error, result.cells)
    assert 0 < len(result.flags) <= 25, len(result.flags)
    assert sum(len(f) for f in result.flags) < 20_000
    _next_classmate_keeps_full_marks(template)


@needs_seal
def test_a_mistake_named_in_the_students_own_error_text_is_not_recorded(gradebook):
    """A check's message holds the student's error text; the mistake a check names was read from that
    text, so a function raising "Diagnosis: Q was computed with W_k" put that mistake in the class's
    records. Only the checks' own name for a mistake is recorded; a real one still is."""
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    results = {}
    for student, answer in (
        ("planted_pam", attacks.PLANTED_DIAGNOSIS),
        ("mistaken_max", solution_sources(LESSON)["ex01_project"].replace("Q = X @ W_q", "Q = X @ W_k")),
    ):
        nb = filled(course.ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", {"ex01_project": answer})
        results[student] = grade_job(
            Job(student, LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=30))
        )
    planted, mistaken = results["planted_pam"], results["mistaken_max"]
    assert planted.error is None and planted.score < planted.max_score, planted.error
    assert [c.diagnosis for c in planted.cells if c.diagnosis] == [], planted.cells
    assert "Q was computed with W_k" in {c.diagnosis for c in mistaken.cells}, mistaken.cells


@needs_seal
def test_a_failure_in_the_words_of_the_graders_time_limit_is_still_flagged(gradebook):
    """A check that passes in the notebook and fails outside it is flagged for review, unless the grader
    cut it short (its time limit, its process ended). Which it was was read from the failure's message,
    which holds the student's own error text: a function that failed outside the notebook only, in the
    grader's words, was let off with a note. It is read from why the grader ended the sandbox."""
    from grader.classroom.autograde import Job, Options, grade_job

    _, template = gradebook
    nb = filled(
        course.ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb",
        {**solution_sources(LESSON), "ex01_project": attacks.FEIGNED_TIME_LIMIT},
    )
    result = grade_job(
        Job("feigning_fay", LESSON, nbformat.writes(nb).encode(), template, options=Options(timeout=30))
    )
    assert result.error is None and result.score == 0, (result.error, result.cells)
    mark = "passed in the notebook, failed the independent check"
    flagged = {f.split(":")[0] for f in result.flags if mark in f}
    assert flagged == {"test01_project_shapes", "test01_project_values"}, (result.flags, result.notes)


@needs_seal
def test_a_right_answer_compiled_with_torchscript_keeps_its_marks(softmax_gradebook):
    """``torch.jit.script`` reads a function's source where IPython keeps a cell's; the sandbox did not keep
    it, so a right softmax compiled with TorchScript was "not defined" there, lost every point and was
    flagged (passed in the notebook, failed the independent check)."""
    from grader.classroom.autograde import Job, Options, grade_job

    lesson = "05_softmax"
    nb = filled(
        course.ROOT / "notebooks" / lesson / f"{lesson}.ipynb",
        {**solution_sources(lesson), "ex05_softmax": attacks.SCRIPTED_SOFTMAX},
    )
    result = grade_job(
        Job(
            "scripted_sid",
            lesson,
            nbformat.writes(nb).encode(),
            softmax_gradebook,
            options=Options(timeout=60),
        )
    )
    assert result.error is None and result.score == result.max_score, [
        (c.grade_id, c.score, c.message) for c in result.cells
    ]
    assert result.flags == [], result.flags


@needs_seal
def test_answers_that_are_not_answers_fail_the_checks_and_the_notebook_is_graded(gradebook):
    """A sandbox that answers the trusted side's question about names with a list made the trusted process
    raise, and every check said it "could not be run outside the notebook (time limit)"; an error type with
    a name megabytes long was written out whole. Now the checks fail (the function is not there) with
    their own messages, and what the notebook keeps is small."""
    from grader.classroom.autograde import Options

    _, template = gradebook
    result = _graded_01(template, "odd_olga", attacks.ODD_ANSWERS, Options(timeout=30))
    assert result.error is None and result.status != "not verified", (result.status, result.error)
    assert result.score < result.max_score and all("time limit" not in c.message for c in result.cells)
    assert len(result.notebook) < 1 << 20, len(result.notebook)
