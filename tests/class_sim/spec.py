"""The simulated class: every submission, and what grading it must give.

Lesson 01 is covered in full: different correct implementations, each trap,
blank, syntax errors, endless loops, memory hogs, sys.exit, os._exit, a killed
and a crashed kernel, deleted and edited test cells, files that are not
notebooks, and every tampering attempt (patched comparisons, faked or replaced
checks and reference, gradebook writes). Every other lesson that exists gets a
correct and a blank submission, and lessons 02-06 a diagnosed trap or two.

Expectations are the test cells that must score 0 (``fails``; the expected
score is the lesson's total minus their points), the status, the diagnosis
each hidden check must name, and substrings the flags must contain.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from grader import course
from grader.classroom import lessons
from tests.nbtools import filled, solution_sources

ALL = "all"


@dataclass
class Case:
    student: str
    lesson: str
    what: str
    answers: dict[str, str] | None = None  # solution grade id -> source (None: the notebook as handed out)
    raw: bytes | None = None  # a file that is not a notebook
    edit: Callable[[nbformat.NotebookNode], None] | None = None
    fails: set[str] | str = field(default_factory=set)
    status: str = "graded"
    # another status the same run may end in (a kernel at its memory cap can also die outright when a
    # thread of its own cannot allocate); the score is the same either way
    also: tuple[str, ...] = ()
    diagnoses: dict[str, str | None] = field(default_factory=dict)
    flags: tuple[str, ...] = ()  # substrings that must appear among the flags (none: no flag at all)
    notes: tuple[str, ...] = ()
    score: float | None = None  # the total, where the spec states it outright
    short_timeout: bool = False  # graded in the run with a short cell timeout (endless loops)

    def failing(self) -> set[str]:
        tests = {c.grade_id for c in lessons.lesson(self.lesson).tests}
        return set(tests) if self.fails == ALL else set(self.fails)

    def expected_score(self) -> float:
        les = lessons.lesson(self.lesson)
        fails = self.failing()
        return sum(c.points for c in les.tests if c.grade_id not in fails)


# ------------------------------------------------------------------ lesson 01

L1 = "01_projection"
V01 = {"test01_project_values", "test01_project_hidden"}
HIDDEN01 = "test01_project_hidden"


def _sol01() -> str:
    return solution_sources(L1)["ex01_project"]


def _wk() -> str:
    return _sol01().replace("Q = X @ W_q", "Q = X @ W_k")


def _def(body: str) -> str:
    return (
        "import torch\n\n\ndef project(X, W_q, W_k, W_v):\n"
        + "\n".join("    " + ln for ln in body.strip().splitlines())
        + "\n"
    )


def _add_cell_before(grade_id: str, source: str) -> Callable:
    def edit(nb: nbformat.NotebookNode) -> None:
        i = next(
            i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id
        )
        nb.cells.insert(i, nbformat.v4.new_code_cell(source))

    return edit


def _append_cells(*sources: str) -> Callable:
    def edit(nb: nbformat.NotebookNode) -> None:
        nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]

    return edit


def _delete(*grade_ids: str) -> Callable:
    def edit(nb: nbformat.NotebookNode) -> None:
        nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") not in grade_ids]

    return edit


def _replace_source(grade_id: str, source: str) -> Callable:
    def edit(nb: nbformat.NotebookNode) -> None:
        for c in nb.cells:
            if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
                c.source = source

    return edit


GRADEBOOK_WRITE = """
import os
import sqlite3

for path in ("../../../gradebook.db", os.path.join(os.environ.get("ATTENTION_COURSE_WORK", "."), "gradebook.db"),
             os.path.join("{work}", "gradebook.db")):
    try:
        con = sqlite3.connect(path)
        con.execute("UPDATE grade SET manual_score = 100")
        con.commit()
    except Exception as e:
        print("could not write", path, type(e).__name__)
"""

READ_REFERENCE = """
import pathlib

import attention_course

try:
    _src = (pathlib.Path(attention_course.__file__).parent.parent / "grader" / "lessons" / "l01_projection.py").read_text()
    _ns = {}
    exec(_src, _ns)
    project = _ns["project"]
except Exception:
    pass
"""


def lesson01(work: Path) -> list[Case]:
    sol, wk = _sol01(), _wk()
    c = []
    e = "ex01_project"
    # different correct implementations
    c += [
        Case("c01_reference", L1, "the reference solution", {e: sol}, score=7),
        Case(
            "c01_matmul",
            L1,
            "torch.matmul",
            {e: _def("return torch.matmul(X, W_q), torch.matmul(X, W_k), torch.matmul(X, W_v)")},
        ),
        Case(
            "c01_einsum",
            L1,
            "einsum over the feature axis",
            {e: _def("f = lambda W: torch.einsum('...td,dk->...tk', X, W)\nreturn f(W_q), f(W_k), f(W_v)")},
        ),
        Case(
            "c01_fused",
            L1,
            "one fused product, then split",
            {
                e: _def(
                    "W = torch.cat([W_q, W_k, W_v], dim=-1)\nQKV = X @ W\n"
                    "return tuple(QKV.split([W_q.shape[-1], W_k.shape[-1], W_v.shape[-1]], dim=-1))"
                )
            },
        ),
        Case(
            "c01_method",
            L1,
            "tensor methods",
            {e: _def("return X.matmul(W_q), X.matmul(W_k), X.matmul(W_v)")},
        ),
        Case(
            "c01_linear",
            L1,
            "F.linear with transposed weights",
            {
                e: _def(
                    "import torch.nn.functional as F\nreturn F.linear(X, W_q.mT), F.linear(X, W_k.mT), F.linear(X, W_v.mT)"
                )
            },
        ),
        Case(
            "c01_tensordot",
            L1,
            "tensordot",
            {
                e: _def(
                    "t = lambda W: torch.tensordot(X, W, dims=([X.dim() - 1], [0]))\nreturn t(W_q), t(W_k), t(W_v)"
                )
            },
        ),
        Case(
            "c01_helper_cell",
            L1,
            "uses a helper from a cell the student added above",
            {e: _def("return _times(X, W_q), _times(X, W_k), _times(X, W_v)")},
            edit=_add_cell_before(e, "def _times(a, b):\n    return a @ b\n"),
        ),
        Case(
            "c01_scratch",
            L1,
            "extra scratch cells that print and plot",
            {e: sol},
            edit=_append_cells(
                "print(project(X, W_q, W_k, W_v)[0])",
                "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
            ),
        ),
    ]
    # traps
    c += [
        Case(
            "c01_trap_wk",
            L1,
            "Q computed with W_k",
            {e: wk},
            fails=V01,
            diagnoses={HIDDEN01: "Q was computed with W_k"},
            score=1,
        ),
        Case(
            "c01_trap_swap",
            L1,
            "Q and K swapped",
            {e: _def("return X @ W_k, X @ W_q, X @ W_v")},
            fails=V01,
            diagnoses={HIDDEN01: "Q and K are swapped"},
            score=1,
        ),
        # the hidden cell's visible batch check errors before the hidden check runs: no diagnosis
        Case(
            "c01_trap_side",
            L1,
            "multiplies from the wrong side",
            {e: _def("return W_q.mT @ X, W_k.mT @ X, W_v.mT @ X")},
            fails=ALL,
            diagnoses={HIDDEN01: "the matrices multiply from the wrong side"},
            score=0,
        ),
        Case(
            "c01_wrong_scale",
            L1,
            "a wrong answer no trap names",
            {e: _def("return 2 * (X @ W_q), X @ W_k, X @ W_v")},
            fails=V01,
            diagnoses={HIDDEN01: None},
        ),
        Case(
            "c01_2d_only",
            L1,
            "works on 2-D inputs only",
            {e: _def("if X.dim() != 2:\n    raise ValueError('2-D only')\nreturn X @ W_q, X @ W_k, X @ W_v")},
            fails={HIDDEN01},
            score=3,
        ),
        Case(
            "c01_dtype",
            L1,
            "returns float64 whatever the input",
            {e: _def("return (X @ W_q).double(), (X @ W_k).double(), (X @ W_v).double()")},
            fails={HIDDEN01},
            score=3,
        ),
    ]
    # broken submissions
    c += [
        Case("c01_blank", L1, "handed in untouched", None, fails=ALL, status="not attempted", score=0),
        Case(
            "c01_syntax",
            L1,
            "a missing colon",
            {e: "def project(X, W_q, W_k, W_v)\n    return X @ W_q, X @ W_k, X @ W_v\n"},
            fails=ALL,
            status="syntax error",
            score=0,
        ),
        Case(
            "c01_indent",
            L1,
            "an indentation error",
            {e: "def project(X, W_q, W_k, W_v):\nreturn X @ W_q, X @ W_k, X @ W_v\n"},
            fails=ALL,
            status="syntax error",
        ),
        Case(
            "c01_loop_top",
            L1,
            "an endless loop after a correct definition",
            {e: sol + "\nwhile True:\n    pass\n"},
            status="timed out",
            short_timeout=True,
            score=7,
        ),
        Case(
            "c01_loop_fn",
            L1,
            "an endless loop inside the function",
            {e: _def("while True:\n    pass")},
            fails=ALL,
            status="timed out",
            short_timeout=True,
        ),
        Case(
            "c01_memory",
            L1,
            "allocates until the memory cap",
            {e: _def("hog = []\nwhile True:\n    hog.append(torch.empty(250_000_000))")},
            fails=ALL,
            status="out of memory",
            # the kernel can die before it reports, and on a loaded machine the notebook's time can run out
            # first: each is a clean failure with no points, which is what this case is about
            also=("kernel died", "timed out"),
        ),
        Case(
            "c01_memory_top",
            L1,
            "a correct definition, then a memory hog",
            {e: sol + ("\nhog = []\nwhile True:\n    hog.append(torch.empty(50_000_000))\n")},
            status="out of memory",
            score=7,
        ),
        Case(
            "c01_sysexit",
            L1,
            "sys.exit before the definition",
            {e: "import sys\nsys.exit(1)\n" + sol},
            fails=ALL,
            status="exited",
        ),
        Case(
            "c01_sysexit_after",
            L1,
            "sys.exit after a correct definition",
            {e: sol + "\nimport sys\nsys.exit(0)\n"},
            status="exited",
            score=7,
        ),
        Case(
            "c01_os_exit",
            L1,
            "os._exit inside the function",
            {e: _def("import os\nos._exit(0)")},
            fails=ALL,
            status="kernel died",
            score=0,
        ),
        Case(
            "c01_kill",
            L1,
            "kills its own kernel",
            {e: sol + "\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"},
            fails=ALL,
            status="kernel died",
        ),
        Case(
            "c01_segfault",
            L1,
            "crashes the interpreter",
            {e: sol + "\nimport ctypes\nctypes.string_at(0)\n"},
            fails=ALL,
            status="kernel died",
            flags=("loads native code (ctypes)",),
        ),
        Case(
            "c01_deleted_test",
            L1,
            "deleted a test cell",
            {e: sol},
            edit=_delete("test01_project_values"),
            notes=("test01_project_values: test cell deleted",),
            score=7,
        ),
        Case(
            "c01_deleted_tests",
            L1,
            "deleted every test cell, wrong answer",
            {e: wk},
            edit=_delete("test01_project_shapes", "test01_project_values", HIDDEN01),
            fails=V01,
            notes=("test01_project_hidden: test cell deleted",),
            score=1,
        ),
        Case(
            "c01_edited_test",
            L1,
            "emptied the hidden test cell, wrong answer",
            {e: wk},
            edit=_replace_source(HIDDEN01, '"""Check nothing."""\npass\n'),
            fails=V01,
            notes=("test01_project_hidden: test cell edited",),
            score=1,
        ),
        Case(
            "c01_invalid_json",
            L1,
            "a truncated file",
            raw=b'{"cells": [{"cell_type": "code", "sour',
            fails=ALL,
            status="invalid notebook",
            score=0,
        ),
        Case(
            "c01_not_a_notebook",
            L1,
            "JSON that is not a notebook",
            raw=b'{"hello": "world"}',
            fails=ALL,
            status="invalid notebook",
        ),
        Case("c01_empty_file", L1, "an empty file", raw=b"", fails=ALL, status="invalid notebook"),
    ]
    # tampering: a wrong answer (W_k for Q) dressed up to pass; shapes are right, so 1 point is earned
    t = []
    tamper = [
        (
            "t01_numpy_allclose",
            "patches numpy.allclose",
            "import numpy as np\nnp.allclose = lambda *a, **k: True\n",
            ("patches numpy.allclose",),
        ),
        (
            "t01_torch_isclose",
            "patches torch.isclose and torch.allclose",
            "import torch\ntorch.isclose = lambda a, b, **k: torch.ones_like(a, dtype=torch.bool)\n"
            "torch.allclose = lambda *a, **k: True\n",
            ("patches torch.isclose",),
        ),
        (
            "t01_tensor_any",
            "patches torch.Tensor.any",
            "import torch\ntorch.Tensor.any = lambda self, *a, **k: torch.tensor(False)\n",
            (
                "patches torch.Tensor.any",
                "test01_project_values: passed in the notebook",
            ),
        ),
        (
            "t01_testing",
            "patches torch.testing.assert_close",
            "import torch.testing\ntorch.testing.assert_close = lambda *a, **k: None\n",
            ("patches torch.testing.assert_close",),
        ),
        (
            "t01_math_isclose",
            "patches math.isclose",
            "import math\nmath.isclose = lambda *a, **k: True\n",
            ("patches math.isclose",),
        ),
        (
            "t01_builtins_assert",
            "replaces builtins.AssertionError",
            "import builtins\nbuiltins.AssertionError = Warning\n",
            ("patches builtins.AssertionError",),
        ),
        (
            "t01_isinstance",
            "patches builtins.isinstance",
            "import builtins\n_real = builtins.isinstance\n"
            "builtins.isinstance = lambda o, t: True if t is complex else _real(o, t)\n",
            ("patches builtins.isinstance",),
        ),
        (
            "t01_fake_grader",
            "plants a fake grader module",
            "import sys, types\nsys.modules['grader'] = types.SimpleNamespace(check=lambda *a, **k: None)\n",
            ("replaces a module in sys.modules",),
        ),
        (
            "t01_replace_check",
            "replaces grader.check",
            "try:\n    import grader\n    grader.check = lambda *a, **k: None\nexcept ImportError:\n    pass\n",
            ("mentions the grading package",),
        ),
        (
            "t01_replace_reference",
            "swaps the reference for its own function",
            "try:\n    import grader.registry\n    grader.registry.exercises()['project'].reference = project\n"
            "except ImportError:\n    pass\n",
            ("mentions the grading package",),
        ),
        (
            "t01_read_reference",
            "reads the hidden reference from disk",
            READ_REFERENCE,
            ("mentions the grading package",),
        ),
        (
            "t01_gradebook",
            "tries to write the gradebook",
            GRADEBOOK_WRITE.replace("{work}", str(work)),
            ("mentions the gradebook",),
        ),
        (
            "t01_custom_exc",
            "swallows exceptions with an IPython handler",
            "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)\n",
            ("changes how errors are reported",),
        ),
    ]
    for student, what, code, flags in tamper:
        t.append(Case(student, L1, what, {e: wk + "\n" + code}, fails=V01, flags=flags, score=1))
    t.append(
        Case(
            "t01_correct_but_patches",
            L1,
            "a correct answer that also patches numpy",
            {e: sol + "\nimport numpy as np\nnp.allclose = lambda *a, **k: True\n"},
            flags=("patches numpy.allclose",),
            score=7,
        )
    )
    return c + t


# ------------------------------------------------------------------ other lessons


TRAPS = {
    "02_scoring": [
        (
            "c02_trap_kqt",
            "K Q^T",
            {"ex02_scores": "import torch\n\n\ndef scores(Q, K):\n    return K @ Q.transpose(-2, -1)\n"},
            {"test02_scores_shapes", "test02_scores_values", "test02_scores_hidden"},
            {"test02_scores_hidden": "K Q^T instead of Q K^T"},
        ),
        (
            "c02_trap_dot_t",
            ".T on a batch",
            {"ex02_scores": "def scores(Q, K):\n    return Q @ K.T\n"},
            {"test02_scores_shapes", "test02_scores_hidden"},
            {"test02_scores_hidden": ".T on a batched tensor"},
        ),
    ],
    "03_scaling": [
        (
            "c03_trap_dk",
            "divides by d_k",
            {
                "ex03_scaled_scores": "def scaled_scores(Q, K):\n    return Q @ K.transpose(-2, -1) / Q.shape[-1]\n"
            },
            {"test03_scaled_scores_values", "test03_scaled_scores_hidden"},
            {"test03_scaled_scores_hidden": "divided by d_k instead of sqrt(d_k)"},
        ),
    ],
    "04_masking": [
        (
            "c04_trap_polarity",
            "inverted causal mask",
            {
                "ex04_causal_mask": "import torch\n\n\ndef causal_mask(T, device=None):\n"
                "    return ~torch.ones(T, T, dtype=torch.bool, device=device).tril()\n"
            },
            {"test04_causal_mask_values", "test04_causal_mask_hidden"},
            {"test04_causal_mask_hidden": "the mask polarity is inverted (True = blocked)"},
        ),
        (
            "c04_trap_multiply",
            "multiplies by the mask",
            {"ex04_apply_mask": "def apply_mask(S, allowed):\n    return S * allowed\n"},
            {"test04_apply_mask_values", "test04_apply_mask_softmax", "test04_apply_mask_hidden"},
            {"test04_apply_mask_hidden": "the scores were multiplied by the mask"},
        ),
    ],
    "05_softmax": [
        (
            "c05_trap_dim",
            "softmax over dim -2",
            {
                "ex05_softmax": "import torch\n\n\ndef softmax(Z, dim=-1):\n"
                "    m = Z.amax(dim=-2, keepdim=True)\n"
                "    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))\n"
                "    e = torch.exp(Z - m)\n"
                "    total = e.sum(dim=-2, keepdim=True)\n"
                "    return torch.where(total > 0, e / torch.where(total > 0, total, 1), 0)\n"
            },
            {
                "test05_softmax_values",
                "test05_softmax_overflow",
                "test05_softmax_masked_row",
                "test05_softmax_hidden",
            },
            {"test05_softmax_hidden": "softmax over dim -2 (the queries) instead of the keys"},
        ),
    ],
    "11_cost": [
        (
            "c11_laundered_inputs",
            "whole rows after a numpy round trip; the full matrix after DisableTorchFunctionSubclass",
            {
                "ex11_online_softmax_stats": "def online_softmax_stats(Z, block_size):\n"
                "    Z = torch.from_numpy(Z.detach().cpu().numpy()).to(Z.device)\n"
                "    m = Z.amax(dim=-1)\n"
                "    return m, torch.exp(Z - m[..., None]).sum(dim=-1)\n",
                "ex11_tiled_attention": "def tiled_attention(Q, K, V, block_size, causal=False):\n"
                "    with torch._C.DisableTorchFunctionSubclass():\n"
                "        Q, K, V = (t.as_subclass(torch.Tensor) for t in (Q, K, V))\n"
                "    S = Q @ K.mT / math.sqrt(Q.shape[-1])\n"
                "    if causal:\n"
                "        keep = torch.ones(S.shape[-2:], dtype=torch.bool, device=S.device).tril()\n"
                "        S = S.masked_fill(~keep, float('-inf'))\n"
                "    return torch.softmax(S, dim=-1) @ V\n",
            },
            {
                "test11_online_softmax_stats_hidden",
                "test11_tiled_attention_sdpa",
                "test11_tiled_attention_hidden",
            },
            {
                "test11_online_softmax_stats_hidden": None,
                "test11_tiled_attention_hidden": "the full score matrix was formed",
            },
        ),
        (
            "c11_float64_inside",
            "correct: tiled_attention and online_softmax_stats computed in float64 inside",
            {
                "ex11_online_softmax_stats": "def online_softmax_stats(Z, block_size):\n"
                "    dtype, Z = Z.dtype, Z.double()\n"
                "    m = torch.full(Z.shape[:-1], float('-inf'), dtype=Z.dtype, device=Z.device)\n"
                "    l = torch.zeros_like(m)\n"
                "    for block in Z.split(block_size, dim=-1):\n"
                "        m_new = torch.maximum(m, block.amax(dim=-1))\n"
                "        l = l * torch.exp(m - m_new) + torch.exp(block - m_new[..., None]).sum(dim=-1)\n"
                "        m = m_new\n"
                "    return m.to(dtype), l.to(dtype)\n",
                "ex11_tiled_attention": "def tiled_attention(Q, K, V, block_size, causal=False):\n"
                "    dtype, Q, K, V = Q.dtype, Q.double(), K.double(), V.double()\n"
                "    m = torch.full((*Q.shape[:-1], 1), float('-inf'), dtype=Q.dtype, device=Q.device)\n"
                "    l = torch.zeros_like(m)\n"
                "    acc = torch.zeros((*Q.shape[:-1], V.shape[-1]), dtype=Q.dtype, device=Q.device)\n"
                "    rows = torch.arange(Q.shape[-2], device=Q.device)[:, None]\n"
                "    for start in range(0, K.shape[-2], block_size):\n"
                "        K_b, V_b = K[..., start:start + block_size, :], V[..., start:start + block_size, :]\n"
                "        S_b = Q @ K_b.mT / math.sqrt(Q.shape[-1])\n"
                "        if causal:\n"
                "            cols = torch.arange(start, start + K_b.shape[-2], device=Q.device)[None, :]\n"
                "            S_b = S_b.masked_fill(cols > rows, float('-inf'))\n"
                "        m_new = torch.maximum(m, S_b.amax(dim=-1, keepdim=True))\n"
                "        factor, P = torch.exp(m - m_new), torch.exp(S_b - m_new)\n"
                "        l, acc, m = l * factor + P.sum(dim=-1, keepdim=True), acc * factor + P @ V_b, m_new\n"
                "    return (acc / l).to(dtype)\n",
            },
            set(),
            {},
        ),
    ],
    "06_mixing": [
        (
            "c06_trap_weights",
            "returns the weights",
            {"ex06_mix": "def mix(A, V):\n    return A\n"},
            ALL,
            {"test06_mix_hidden": "the weights were returned instead of A V"},
        ),
    ],
}


def other_lessons() -> list[Case]:
    out = []
    for lesson in course.lessons():
        if lesson == L1:
            continue
        num = lesson[:2]
        out.append(Case(f"c{num}_correct", lesson, "the reference solution", solution_sources(lesson)))
        out.append(
            Case(f"c{num}_blank", lesson, "handed in untouched", None, fails=ALL, status="not attempted")
        )
        for student, what, answers, fails, diagnoses in TRAPS.get(lesson, []):
            # the trap in one exercise, every other exercise of the lesson done right
            full = {**solution_sources(lesson), **answers}
            out.append(Case(student, lesson, what, full, fails=fails, diagnoses=diagnoses))
    return out


def cases(work: Path) -> list[Case]:
    from tests.class_sim import crafts, fair, redteam

    return lesson01(work) + other_lessons() + fair.cases() + crafts.cases() + redteam.cases()


# ------------------------------------------------------------------ writing the submissions


def notebook_bytes(case: Case, release_dir: Path) -> bytes:
    if case.raw is not None:
        return case.raw
    path = release_dir / case.lesson / f"{case.lesson}.ipynb"
    nb = filled(path, case.answers or {})
    if case.edit is not None:
        case.edit(nb)
    return nbformat.writes(nb).encode()


def materialize(all_cases: list[Case], release_dir: Path) -> None:
    """Write every case where nbgrader expects it (``<work>/submitted/<student>/<lesson>/``)."""
    for case in all_cases:
        dest = course.submission_path(case.lesson, case.student)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(notebook_bytes(case, release_dir))


def describe(all_cases: list[Case]) -> str:
    """The class as a table (for a reader of a failing test)."""
    return json.dumps(
        [{"student": c.student, "lesson": c.lesson, "what": c.what, "status": c.status} for c in all_cases],
        indent=1,
    )
