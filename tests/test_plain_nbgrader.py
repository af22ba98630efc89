"""Plain ``nbgrader autograde`` grades as the course's grading tool does.

The course's nbgrader_config.py puts the trusted checks in nbgrader's own
pipeline, so an instructor who runs ``nbgrader autograde LESSON`` (or presses
Autograde in the formgrader) gets the verdicts of a process the student's code
never ran in, and a cell's points never depend on what the code printed.
Each test runs the real command line in a private work folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from grader import course
from grader.classroom import autograde, verdicts
from tests import attacks
from tests.nbtools import ROOT, filled, solution_sources, submit

pytestmark = pytest.mark.slow

L1 = "01_projection"
L5 = "05_softmax"
L11 = "11_cost"
PREFIX = "plainnb_"


def _noisy(source: str, function_line: str, more: str = "") -> str:
    """A correct solution that also writes to stderr: a print, a warning and a raw write to fd 2."""
    chatter = (
        "    import os as _os, sys as _sys, warnings as _warnings\n"
        "    print('debugging: inside the function', file=_sys.stderr)\n"
        "    _warnings.warn('this is only a warning')\n"
        "    _os.write(2, b'written straight to fd 2\\n')\n"
    ) + more
    return source.replace(function_line, chatter + function_line, 1)


SUBMISSIONS = {
    L1: {
        "noisy": lambda sol: _noisy(sol, "    Q = X @ W_q"),
        "wk": lambda sol: sol.replace("Q = X @ W_q", "Q = X @ W_k"),
        "reference": lambda sol: (
            "import grader.lessons.l01_projection\n\n\ndef project(X, W_q, W_k, W_v):\n"
            "    return grader.lessons.l01_projection.project(X, W_q, W_k, W_v)\n"
        ),
        "isclose": lambda sol: (
            sol.replace("Q = X @ W_q", "Q = X @ W_k") + "\nimport torch\n"
            "torch.isclose = lambda a, b, **k: torch.ones_like(a, dtype=torch.bool)\n"
            "torch.allclose = lambda *a, **k: True\n"
        ),
        # the same wrong answer, and after every cell a result that reads as 99 points
        "forger": lambda sol: sol.replace("Q = X @ W_q", "Q = X @ W_k") + attacks.SCORE_FORGER,
        # a right answer whose cell then swaps the kernel's sockets for links
        "swapper": lambda sol: sol + "\n" + attacks.SOCKET_SWAPPER,
        # a right answer whose cell then gives itself marks by hand in the gradebook, from Python and a shell
        "gbwriter": lambda sol: sol + "\n" + attacks.GRADEBOOK_WRITER.replace("STUDENT", PREFIX + "gbwriter"),
        # right in the kernel; outside it, a failure in the words the grader uses for a check it cut short
        "feigned": lambda sol: attacks.FEIGNED_TIME_LIMIT,
        # an input emptied in place, behind answers the student's code rewrites in the sandbox
        "forged": lambda sol: attacks.EMPTIES_X + attacks.FORGED_ANSWERS,
    },
    L5: {
        # a correct softmax that raises on its first 4-D call (the hidden checks alone make one), with
        # the first input value in its message, as a student mapping the hidden inputs would; "leak2"
        # is the same attempt with one comment more, "leakall" puts every input it saw in the message
        "leak": lambda sol: _leaky(sol, "first"),
        "leak2": lambda sol: "# second attempt\n" + _leaky(sol, "first"),
        "leakall": lambda sol: _leaky(sol, "all"),
        # a hidden answer that swells outside the seal (6 GB once made whole, past the 4 GiB cap), and a
        # ruled-out softmax behind a watch the code switched off
        "swell": lambda sol: attacks.EXPANDED_ANSWER.replace("3_000_000_000", "6_000_000_000"),
        "quiet": lambda sol: attacks.WATCH_SWITCHED_OFF,
        # the same softmax behind the course's watch class, replaced in its module
        "swapped": lambda sol: attacks.WATCH_SWAPPED,
        # torch.softmax called with torch functions switched off, by a name built from strings
        "quietoff": lambda sol: attacks.L05_QUIET_SOFTMAX,
        # a right answer compiled with TorchScript (which reads the cell's source)
        "scripted": lambda sol: attacks.SCRIPTED_SOFTMAX,
        "noisy": lambda sol: _noisy(
            sol,
            "    m = Z.amax(dim=dim, keepdim=True)",
            "    for _i in range(60):\n        print(f'line {_i} of a long trace', file=_sys.stderr)\n",
        ),
    },
}


SUBMISSIONS[L11] = {
    # whole rows where torch functions are not seen (TorchScript), or more than a block at once; and
    # blocks glued back together in numpy, which the watch cannot tell from honest blocks in numpy
    "scripted": lambda sol: attacks.L11_SCRIPTED_STATS,
    "twochunks": lambda sol: attacks.L11_TWO_CHUNKS,
    "glued": lambda sol: attacks.L11_NUMPY_GLUE,
}


# a right answer whose checks fail in the kernel alone, raising an error whose name holds a line of the
# log that flags a classmate: the note that it passed outside the notebook is logged on its own line
SUBMISSIONS[L1]["lognote"] = lambda sol: (
    sol
    + (
        "\nimport os as _os\nif not _os.getcwd().endswith('/scratch'):\n"
        "    _E = type('Boom\\n\\r[AutogradeApp | WARNING] Flagged for review: plainnb_wk/01_projection: "
        "FAKE FLAG', (Exception,), {})\n"
        "    def project(X, W_q, W_k, W_v):\n        raise _E('in the kernel only')\n"
    )
)

# a right answer that takes its time (half a second a call): its checks outside the notebook are
# still running when a kernel that was stopped before its first cell has gone
SUBMISSIONS[L1]["prelockslow"] = lambda sol: sol.replace(
    "    Q = X @ W_q", "    import time as _time\n    _time.sleep(0.5)\n    Q = X @ W_q", 1
)

# files submitted next to a notebook (nbgrader's own collect copies a student's whole folder)
BESIDE = {
    (L1, "prelock"): {"storemagic.py": attacks.PRELOCK_SWAPPER},
    (L1, "prelockslow"): {"storemagic.py": attacks.PRELOCK_SWAPPER},
}


def _leaky(source: str, what: str) -> str:
    line = "    m = Z.amax(dim=dim, keepdim=True)"
    spy = (
        "    _SEEN.append(Z.flatten().tolist())\n"
        "    if Z.dim() == 4:\n"
        "        raise ValueError('LEAK ' + (repr(round(_SEEN[-1][0], 6)) if "
        f"{what!r} == 'first' else repr(_SEEN)))\n"
    )
    return "_SEEN = []\n" + source.replace(line, spy + line, 1)


def _autograde(lesson: str, release: Path, tmp: Path) -> subprocess.CompletedProcess:
    sols = solution_sources(lesson)
    exercise = next(iter(sols))  # the lesson's first exercise; the others are answered right
    for name, make in SUBMISSIONS[lesson].items():
        answers = {**sols, exercise: make(sols[exercise])}
        submit(filled(release / lesson / f"{lesson}.ipynb", answers), lesson, PREFIX + name)
    for (where, name), files in BESIDE.items():
        if where == lesson:
            path = course.submission_path(lesson, PREFIX + name)
            if name not in SUBMISSIONS[lesson]:  # a right answer, unless the submission above is this one
                path = submit(filled(release / lesson / f"{lesson}.ipynb", sols), lesson, PREFIX + name)
            for file, text in files.items():
                (path.parent / file).write_text(text)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    env = dict(os.environ, PATH=path, TMPDIR=str(tmp))
    return subprocess.run(
        ["nbgrader", "autograde", lesson, f"--student={PREFIX}*", "--force"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def graded(built_course, tmp_path_factory):
    """Every submission above autograded by the nbgrader command line; yield its outputs and temp folder."""
    tmp = tmp_path_factory.mktemp("plain-tmp")
    runs = {lesson: _autograde(lesson, built_course, tmp) for lesson in SUBMISSIONS}
    for lesson, run in runs.items():
        assert run.returncode == 0, f"nbgrader autograde {lesson} failed:\n{run.stderr[-3000:]}"
    return runs, tmp


def _cell(lesson: str, student: str, grade_id: str) -> nbformat.NotebookNode:
    nb = nbformat.read(course.autograded_path(lesson, PREFIX + student), as_version=4)
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _text(cell: nbformat.NotebookNode, output_type: str) -> str:
    return "\n".join(
        str(o.get("text") or o.get("evalue") or "") for o in cell.outputs if o.output_type == output_type
    )


def test_the_course_config_names_the_tools_preprocessors():
    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert list(cfg.Autograde.autograde_preprocessors) == list(autograde.AUTOGRADE_PREPROCESSORS)


@pytest.mark.parametrize("lesson", [L1, L5])
def test_a_correct_answer_that_writes_to_stderr_gets_full_marks_and_a_note(graded, lesson):
    result = course.gradebook_scores(lesson, PREFIX + "noisy")
    assert result["score"] == result["max_score"] > 0, result["grades"]
    for grade_id in result["grades"]:
        cell = _cell(lesson, "noisy", grade_id)
        assert not [o for o in cell.outputs if o.output_type == "error"], (grade_id, cell.outputs)
        assert not [o for o in cell.outputs if o.get("name") == "stderr"], (grade_id, cell.outputs)
    first = _cell(lesson, "noisy", next(iter(result["grades"])))
    note = _text(first, "stream")
    assert note.startswith(verdicts.STDERR_NOTE), note
    assert "debugging: inside the function" in note and "this is only a warning" in note
    # The raw write to fd 2 costs nothing either (no test cell above has a stderr output). Where its
    # text shows is up to ipykernel, which forwards fd-level writes from a thread of its own: in this
    # note, or, on a loaded machine, after the cell has ended (then with a later cell, or nowhere).


def test_a_right_answer_compiled_with_torchscript_keeps_its_marks(graded):
    runs, _ = graded
    result = course.gradebook_scores(L5, PREFIX + "scripted")
    assert result["score"] == result["max_score"] > 0, result["grades"]
    lines = runs[L5].stderr.splitlines()
    flagged = [line for line in lines if "Flagged for review" in line and f"{PREFIX}scripted/" in line]
    assert flagged == [], flagged


def test_a_failure_in_the_words_of_the_graders_time_limit_is_still_flagged(graded):
    runs, _ = graded
    result = course.gradebook_scores(L1, PREFIX + "feigned")
    assert result["score"] == 0, result["grades"]
    lines = runs[L1].stderr.splitlines()
    flagged = [line for line in lines if "Flagged for review" in line and f"{PREFIX}feigned/" in line]
    mark = "passed in the notebook, failed the independent check"
    visible = ("test01_project_shapes", "test01_project_values")
    assert {g for f in flagged if mark in f for g in visible if g in f} == set(visible), flagged


def test_answers_rewritten_in_the_sandbox_earn_nothing_and_are_flagged(graded):
    from grader.classroom.independent import WATCH_CHANGED

    runs, _ = graded
    result = course.gradebook_scores(L1, PREFIX + "forged")
    assert result["grades"]["test01_project_hidden"][0] == 0, result["grades"]
    flagged = [
        line for line in runs[L1].stderr.splitlines() if WATCH_CHANGED in line and f"{PREFIX}forged" in line
    ]
    assert flagged and "sandbox.handle" in flagged[0] and "sandbox.dump" in flagged[0], runs[L1].stderr[
        -3000:
    ]


def test_a_long_stderr_trace_is_shortened(graded):
    cell = _cell(L5, "noisy", "test05_softmax_values")
    note = _text(cell, "stream")
    assert note.count("\n") <= verdicts.NOTE_LINES + 2 and len(note) <= verdicts.NOTE_BYTES + 200
    assert "more lines)" in note, note


def test_a_wrong_answer_gets_the_hidden_diagnosis(graded):
    result = course.gradebook_scores(L1, PREFIX + "wk")
    assert result["grades"]["test01_project_hidden"][0] == 0
    assert result["grades"]["test01_project_values"][0] == 0
    assert result["score"] == 1
    errors = [o for o in _cell(L1, "wk", "test01_project_hidden").outputs if o.output_type == "error"]
    assert len(errors) == 1 and "Diagnosis: Q was computed with W_k" in errors[0].evalue, errors


def test_the_hidden_reference_cannot_be_borrowed(graded):
    result = course.gradebook_scores(L1, PREFIX + "reference")
    assert result["score"] == 0, result["grades"]


def test_patching_comparisons_earns_nothing(graded):
    result = course.gradebook_scores(L1, PREFIX + "isclose")
    assert result["score"] == 1, result["grades"]
    assert result["grades"]["test01_project_hidden"][0] == 0


def test_a_result_above_a_cells_points_is_no_score_and_no_crash(graded):
    """As on the tool's path (tests/test_trusted_side.py): the forger earns what the same wrong answer earns."""
    assert course.gradebook_scores(L1, PREFIX + "forger") == course.gradebook_scores(L1, PREFIX + "wk")


def test_a_submission_cannot_give_itself_marks_by_hand_in_the_gradebook(graded):
    """The exports report what the gradebook holds as the instructor's word (issue: the gradebook is where
    the instructor decides), so no student code may write it: a kernel that looks for the gradebook by the
    paths it could guess and with `find` from a shell finds none it can write, and earns what its right
    answer earns, with no score by hand."""
    import sqlite3

    from grader.classroom import seal

    if not seal.available()[0]:
        pytest.skip("grading here is not sealed: student code can reach the gradebook, as the report says")
    student = PREFIX + "gbwriter"
    result = course.gradebook_scores(L1, student)
    assert result["score"] == result["max_score"], result["grades"]
    text = "".join(o.get("text", "") for o in _cell(L1, "gbwriter", "ex01_project").outputs)
    assert "could not write" in text and "WROTE" not in text, text
    with sqlite3.connect(course.work_dir() / "gradebook.db") as con:
        by_hand = con.execute(
            "SELECT COUNT(*) FROM grade g JOIN submitted_notebook sn ON g.notebook_id = sn.id JOIN "
            "submitted_assignment sa ON sn.assignment_id = sa.id WHERE sa.student_id = ? AND "
            "g.manual_score IS NOT NULL",
            (student,),
        ).fetchone()[0]
    assert by_hand == 0


def test_a_kernel_cannot_swap_its_sockets_for_links_the_grader_would_follow(graded):
    """As on the tool's path (tests/test_trusted_side.py): the swap fails, the notebook earns full marks."""
    result = course.gradebook_scores(L1, PREFIX + "swapper")
    assert result["score"] == result["max_score"], result["grades"]
    text = "".join(o.get("text", "") for o in _cell(L1, "swapper", "ex01_project").outputs)
    if os.geteuid() == 0:  # elsewhere the kernel is the grading user itself, and reaches nothing it could not
        assert "KEPT" in text and "SWAPPED" not in text, text


def test_a_file_beside_the_notebook_that_swaps_a_socket_as_the_kernel_starts_is_caught(graded):
    """Code submitted beside the notebook runs while the kernel starts (IPython imports its default
    extension from the working folder), before the socket folder is locked: it left a link there that
    the grading process followed. The folder is checked once locked: that kernel is stopped and the
    notebook flagged for review; its answers, checked outside the kernel, earn what they earn."""
    if os.geteuid() != 0:
        pytest.skip("the socket folder is locked only where grading runs as root")
    runs, _ = graded
    flagged = [line for line in runs[L1].stderr.splitlines() if "tampered with the kernel" in line]
    assert flagged and all(f"{PREFIX}prelock" in line for line in flagged), [
        line for line in runs[L1].stderr.splitlines() if "prelock" in line
    ]
    assert "socket folder holds 'ipc-3'" in flagged[0], flagged
    text = "".join(o.get("text", "") for o in _cell(L1, "prelock", "test01_project_hidden").outputs)
    assert "the kernel stopped" in text, text


def test_the_checks_of_a_notebook_whose_kernel_was_stopped_before_its_first_cell_run_to_the_end(graded):
    """The kernel of a notebook caught as above is stopped before its first cell; the notebook's checks
    outside the kernel run in a boundary of their own and still decide its points. Seen: everything the
    notebook started was ended before its checks were awaited, so a right answer slower than the kernel's
    start failed its hidden checks ("ended its process"), on a loaded machine even a quick one."""
    if os.geteuid() != 0:
        pytest.skip("the socket folder is locked only where grading runs as root")
    runs, _ = graded
    flagged = [line for line in runs[L1].stderr.splitlines() if "tampered with the kernel" in line]
    assert any(f"{PREFIX}prelockslow" in line for line in flagged), flagged
    result = course.gradebook_scores(L1, PREFIX + "prelockslow")
    assert result["score"] == result["max_score"] > 0, result["grades"]
    for grade_id in result["grades"]:
        text = "".join(o.get("text", "") for o in _cell(L1, "prelockslow", grade_id).outputs)
        assert "the kernel stopped" in text and "passed when checked outside the notebook" in text, text


def test_what_the_kernel_names_cannot_write_lines_of_its_own_in_nbgraders_log(graded):
    """An error's name and message are the kernel's to choose: logged, they stay on the line of the
    notebook they belong to (seen: a made-up "Flagged for review" line that named a classmate)."""
    runs, _ = graded
    result = course.gradebook_scores(L1, PREFIX + "lognote")
    assert result["score"] == result["max_score"] > 0, result["grades"]
    lines = [line for line in runs[L1].stderr.splitlines() if "FAKE FLAG" in line]
    assert lines and all(f"{PREFIX}lognote/{L1}: " in line for line in lines), lines


def test_an_answer_that_swells_outside_the_seal_costs_its_own_check(graded):
    result = course.gradebook_scores(L5, PREFIX + "swell")
    lost = {g for g, (score, points) in result["grades"].items() if score < points}
    assert lost == {"test05_softmax_overflow"}, result["grades"]


def test_a_watch_switched_off_is_flagged_for_review(graded):
    from grader.classroom.independent import WATCH_OFF

    runs, _ = graded
    assert f"{PREFIX}quiet" in runs[L5].stderr and WATCH_OFF in runs[L5].stderr, runs[L5].stderr[-3000:]
    flagged = [line for line in runs[L5].stderr.splitlines() if WATCH_OFF in line]
    assert all(f"{PREFIX}quiet" in line for line in flagged), flagged


def test_a_watch_replaced_in_its_module_is_put_back_and_flagged(graded):
    from grader.classroom.independent import WATCH_CHANGED

    runs, _ = graded
    flagged = [line for line in runs[L5].stderr.splitlines() if WATCH_CHANGED in line]
    assert any(f"{PREFIX}swapped" in line and "CallWatch" in line for line in flagged), runs[L5].stderr[
        -3000:
    ]
    assert all(f"{PREFIX}swapped" in line or f"{PREFIX}quiet" in line for line in flagged), flagged
    result = course.gradebook_scores(L5, PREFIX + "swapped")
    assert result["score"] < result["max_score"], result["grades"]


def test_rules_hold_below_torch_functions_and_what_the_watch_cannot_follow_is_flagged(graded):
    from grader.classroom.independent import WATCH_REVIEW

    runs, _ = graded
    for lesson, student, hidden in (
        (L5, "quietoff", "test05_softmax_hidden"),
        (L11, "scripted", "test11_online_softmax_stats_hidden"),
        (L11, "twochunks", "test11_online_softmax_stats_hidden"),
    ):
        grades = course.gradebook_scores(lesson, PREFIX + student)["grades"]
        assert grades[hidden][0] == 0, (student, grades)
    glued = course.gradebook_scores(L11, PREFIX + "glued")
    assert glued["score"] == glued["max_score"], glued["grades"]
    flagged = [line for line in runs[L11].stderr.splitlines() if WATCH_REVIEW in line]
    assert flagged and all(f"{PREFIX}glued" in line for line in flagged), runs[L11].stderr[-3000:]
    assert "online_softmax_stats computed its result outside torch" in flagged[0], flagged


def test_hidden_tests_stay_in_the_autograded_notebook_for_the_instructor(graded):
    """The kernel ran the cell without its hidden block; the formgrader still shows the whole cell."""
    cell = _cell(L1, "wk", "test01_project_hidden")
    assert "### BEGIN HIDDEN TESTS" in cell.source and 'grader.check("project", project)' in cell.source


def test_grading_leaves_nothing_behind_and_reports_no_error(graded):
    """Each notebook's private folder (trusted process, sandbox scratch, kernel temp) is removed."""
    runs, tmp = graded
    assert not list(tmp.glob("autograde-*")), list(tmp.iterdir())
    for run in runs.values():
        assert "Traceback" not in run.stderr and "[AutogradeApp | ERROR]" not in run.stderr, run.stderr[
            -3000:
        ]


# ------------------------------------------------------------------ the trusted side's calls into the sandbox


@pytest.fixture
def sandbox(tmp_path):
    """A sandbox process running student code, and the trusted side's handle on it."""
    from grader.classroom import guard, trusted
    from grader.classroom import sandbox as box

    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the sandbox process
        os.close(to_w)
        os.close(from_r)
        try:
            import torch

            torch.set_num_threads(1)  # a fork of a process whose thread pools ran: stay on this thread
            cfg = {"scratch": str(tmp_path), "guard": guard.policy(deny=[]), "cell_timeout": 20}
            box.serve(to_r, from_w, cfg)
        finally:
            os._exit(0)
    os.close(to_r)
    os.close(from_w)
    handle = trusted.Sandbox(to_w, from_r, pid)
    student = (
        "import sys, warnings\n"
        "def attention(x):\n    return x + 1  # the student's own, wrong\n"
        "def self_attention(x):\n"
        "    print('chatter', file=sys.stderr)\n    warnings.warn('noise')\n"
        "    return 2 * attention(x)\n"
        "def uses_helper(x):\n    return helper(x)\n"
        "import torch\n"
        "def loss_of(w):\n    return (w**3).sum()  # the student's own, wrong\n"
        "def gradient_at(values):\n"
        "    w = torch.tensor(values, requires_grad=True)\n"
        "    loss_of(w).backward()\n"
        "    return w.grad\n"
        "from torch import softmax as _softmax\n"
        "def by_the_book(Z):\n    return torch.softmax(Z, dim=-1)\n"
        "def imported(Z):\n    return _softmax(Z, dim=-1)\n"
    )
    assert handle.request(("run", [("<student>", student)]), 20) == {"errors": []}
    yield handle
    handle.kill("done")
    os.close(to_w)
    os.close(from_r)
    os.waitpid(pid, 0)


def test_a_substituted_name_calls_back_to_the_trusted_side(sandbox):
    from grader.classroom.trusted import Proxy

    self_attention = Proxy(sandbox, "self_attention", 20)
    assert self_attention(2) == 6  # the student's attention: 2 * (2 + 1)
    seen = []

    def reference(x):
        seen.append(x)
        return x * 10

    with self_attention.substituted({"attention": reference}):
        assert self_attention(2) == 40  # 2 * reference(2), computed on the trusted side
    assert seen == [2]
    assert self_attention(2) == 6  # the student's own name is back


def test_a_substituted_name_the_student_lacks_exists_only_during_the_call(sandbox):
    from grader.classroom.trusted import Proxy

    uses_helper = Proxy(sandbox, "uses_helper", 20)
    with uses_helper.substituted({"helper": lambda x: [x, x]}):
        assert uses_helper(3) == [3, 3]
    with pytest.raises(NameError):
        uses_helper(3)
    assert sandbox.request(("names", ["helper"]), 20) == {"names": {"helper": "missing"}}


def test_an_error_in_a_substituted_function_reaches_the_student_code(sandbox):
    from grader.classroom.trusted import Proxy

    def refuses(x):
        raise ValueError("no negative sizes")

    self_attention = Proxy(sandbox, "self_attention", 20)
    with self_attention.substituted({"attention": refuses}), pytest.raises(ValueError, match="no negative"):
        self_attention(-1)
    assert self_attention(1) == 4


def test_gradients_flow_through_a_substituted_function(sandbox):
    """A training loop graded on its own: the loss is the reference's, the backward pass still works."""
    import torch

    from grader.classroom.trusted import Proxy

    gradient_at = Proxy(sandbox, "gradient_at", 20)
    assert gradient_at([1.0, 2.0]).tolist() == [3.0, 12.0]  # the student's loss: d(w^3) = 3 w^2
    with gradient_at.substituted({"loss_of": lambda w: (w**2).sum()}):
        assert gradient_at([1.0, 2.0]).tolist() == [2.0, 4.0]  # the reference's: d(w^2) = 2 w
    assert isinstance(gradient_at([1.0]), torch.Tensor)


def test_a_forbidden_call_made_in_the_sandbox_is_reported(sandbox):
    """A rule such as "do not call torch.softmax" holds for code that runs outside the trusted process."""
    import torch

    from grader.classroom.trusted import Proxy

    for name in ("by_the_book", "imported"):
        fn = Proxy(sandbox, name, 20)
        with fn.forbidding(["torch.softmax", "torch.exp"]) as calls:
            assert fn(torch.zeros(2, 3)).sum().item() == 2.0  # it still computes
        assert calls == ["torch.softmax"], name
        with fn.forbidding(["torch.exp"]) as calls:
            fn(torch.zeros(2, 3))
        assert calls == []


def test_unedited_test_cells_raise_no_false_alarm(graded):
    """Hidden tests put back into untouched test cells are not reported as edits, on either path."""
    from grader.classroom import lessons

    runs, _ = graded
    for run in runs.values():
        assert "has changed!" not in run.stderr, run.stderr[-3000:]
    for lesson in course.lessons():
        nb = nbformat.read(course.ROOT / "notebooks" / lesson / f"{lesson}.ipynb", as_version=4)
        assert autograde._test_cell_notes(nb, lessons.lesson(lesson)) == [], lesson


def _leaked(student: str) -> str:
    errors = [o for o in _cell(L5, student, "test05_softmax_hidden").outputs if o.output_type == "error"]
    assert len(errors) == 1, _cell(L5, student, "test05_softmax_hidden").outputs
    return errors[0].evalue


def test_an_attempts_hidden_inputs_are_its_own(graded):
    """What one attempt's feedback shows of the hidden inputs is not what the next attempt meets."""
    first, second = _leaked("leak"), _leaked("leak2")
    assert "it raised ValueError: LEAK " in first and "it raised ValueError: LEAK " in second
    assert first.split("LEAK ")[1].split()[0] != second.split("LEAK ")[1].split()[0], (first, second)
    for student in ("leak", "leak2"):
        result = course.gradebook_scores(L5, PREFIX + student)
        assert result["grades"]["test05_softmax_hidden"][0] == 0
        assert result["grades"]["test05_softmax_values"][0] > 0  # the visible checks passed


def test_feedback_never_lists_the_hidden_inputs(graded):
    shown = _leaked("leakall")
    assert "(cut)" in shown and len(shown) < 2000, shown
    assert shown.count(",") < 40, shown  # a handful of numbers at most, of the hundreds it saw
