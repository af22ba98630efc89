"""The student bundle holds no answer: its helpers pass no hidden check, and leaning on them is flagged."""

from __future__ import annotations

import textwrap

import pytest

import grader
from attention_course.explorers import choosing
from grader import course
from grader.classroom import tamper_scan
from grader.instructor import release

# the working versions the explorers used to ship, by the names a student could import them under
FORMER_BUILTINS = (
    "project",
    "scores",
    "scaled_scores",
    "score_spread",
    "causal_mask",
    "apply_mask",
    "softmax",
    "mix",
    "attention",
    "soft_lookup",
)


def _points(name: str, code: str) -> int:
    """What a solution cell made of ``code`` earns on the hidden check of ``name`` (1: full marks)."""
    namespace: dict = {}
    try:
        exec(code, namespace)  # noqa: S102 - the cell a student would hand in
    except ImportError:
        return 0
    try:
        grader.check(name, namespace[name])
    except AssertionError:
        return 0
    return 1


def _stub(*args, **kwargs):
    raise NotImplementedError()


@pytest.mark.parametrize("name", FORMER_BUILTINS)
def test_importing_a_former_builtin_earns_nothing_and_is_flagged(name):
    code = f"from attention_course.explorers.backend import builtin_{name} as {name}"
    assert _points(name, code) == 0
    assert f"uses the course's helper code as an answer ({name})" in tamper_scan.scan([code])
    # what an explorer runs in place of a stub is no function a student can hand in either
    stand_in = choosing.choose(name, _stub).fn
    with pytest.raises(AssertionError, match="should be a function"):
        grader.check(name, stand_in)


@pytest.mark.parametrize(
    "code",
    [
        "import attention_course.explorers.compute as c\nmix = lambda A, V: c.helper(A, V)",
        "from attention_course.explorers import compute\n\ndef mix(A, V):\n    return compute.helper(A, V)\n",
        "import attention_course\nmix = attention_course.explorers.widgets.helper",
    ],
)
def test_a_graded_function_wrapped_around_the_helpers_is_flagged(code):
    assert "uses the course's helper code as an answer (mix)" in tamper_scan.scan([code])


def test_the_lessons_own_use_of_the_helpers_is_not_flagged():
    cells = [
        "from attention_course import data\nfrom attention_course.checks import expect_shape, is_implemented",
        "from attention_course.explorers import stage_stepper\nstage_stepper(attention=attention)",
        "def project(X, W_q, W_k, W_v):\n    return X @ W_q, X @ W_k, X @ W_v",
    ]
    assert tamper_scan.scan(cells) == []


@pytest.mark.slow
def test_no_callable_of_the_released_helpers_passes_a_hidden_check():
    files = release.bundle_files(course.ROOT / "notebooks")
    timings: dict = {}
    problems = release.answers_in(files, timings)
    assert problems == []
    assert timings["callables"] > 100, "the proof reached the helpers' functions, classes and methods"
    assert timings["checks"] >= 25, "every lesson's hidden checks were tried"
    assert timings["seconds"] < 120, f"the proof took {timings['seconds']:.0f} s"


PLANTED = """
import functools

import torch

TOOLS = {"mix": lambda A, V: A @ V}
scores = functools.partial(lambda Q, K, scale: Q @ K.transpose(-2, -1) * scale, scale=1.0)


class Shortcuts:
    @staticmethod
    def causal(T, device=None):
        return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def _maker():
    def cross(X_dec, X_enc, W_q, W_k, W_v):
        Q, K, V = X_dec @ W_q, X_enc @ W_k, X_enc @ W_v
        return torch.softmax(Q @ K.mT / Q.shape[-1] ** 0.5, dim=-1) @ V

    return cross
"""


@pytest.mark.slow
def test_release_refuses_a_bundle_with_a_planted_answer(tmp_path, monkeypatch):
    files = release.bundle_files(course.ROOT / "notebooks")
    root = f"{release.BUNDLE_NAME}/attention_course"
    files[f"{root}/shortcuts.py"] = textwrap.dedent(PLANTED).encode()
    # a name the file check cannot read: only importing the bundle on its own finds it
    files[f"{root}/leaky.py"] = b"import importlib\n\nreference = importlib.import_module('gra' + 'der')\n"
    monkeypatch.setattr(release, "bundle_files", lambda notebooks_dir: files)
    out = tmp_path / "bundle.zip"
    path, problems = release.make_bundle(course.ROOT / "notebooks", out)
    assert path is None and not out.exists(), "nothing is written"
    text = "\n".join(problems)
    for name, exercise in (
        ("attention_course.shortcuts.TOOLS['mix']", "mix"),
        ("attention_course.shortcuts.scores", "scores"),
        ("attention_course.shortcuts.Shortcuts.causal", "causal_mask"),
        ("attention_course.shortcuts._maker.<locals>.cross", "cross_attention"),
    ):
        assert f"{name} passes the hidden check of {exercise}" in text, text
    assert "attention_course.leaky cannot be imported without the grading package" in text
    assert len(problems) == 5, text
