"""One wrong function, Run All in JupyterLab: every explorer shows, runs the student's function, and says where it differs.

Each lesson with explorers (03-07) is filled in with the model solutions but for one believable
mistake in a function every explorer of that lesson takes. Run All is chosen from the Run menu in
headless Chromium; the visible check of the wrong function fails in a box and the run goes on, so
every explorer below is reached. Each must label the function as the student's ("yours") and say
in words where its picture first differs from the lesson, and still fit one 720 px screen. Screenshots of every explorer at a
projector's 1280x720 and at 1280x900 go to test-artifacts/browser/ (``wrong-<lesson>-<n>-<size>``).
"""

from __future__ import annotations

import re

import nbformat
import pytest

from tests.nbtools import ROOT, filled, solution_sources
from tests.test_browser import (  # noqa: F401 - lab and browser are fixtures
    ARTIFACTS,
    TIMEOUT_MS,
    _explorer_calls,
    _open,
    _reported,
    _run_all_to_the_explorers,
    browser,
    lab,
)

pytestmark = [pytest.mark.slow, pytest.mark.browser]

# {lesson: (the function's cell, a wrong version of it)}: each is a mistake the lesson names
WRONG = {
    "03_scaling": (
        "ex03_scaled_scores",
        "def scaled_scores(Q, K):\n    return Q @ K.transpose(-2, -1) / Q.shape[-1]   # d_k, not sqrt(d_k)\n",
    ),
    "04_masking": (
        "ex04_causal_mask",
        "def causal_mask(T, device=None):\n"
        "    return torch.ones(T, T, dtype=torch.bool, device=device).triu()   # the future, not the past\n",
    ),
    "05_softmax": (
        "ex05_soft_lookup",
        "import math\n\n\n"
        "def soft_lookup(query, keys, values, sharpness):\n"
        "    scores = {k: sharpness * sum(q * x for q, x in zip(query, key)) for k, key in keys.items()}"
        "   # no / sqrt(d)\n"
        "    top = max(scores.values())\n"
        "    e = {k: math.exp(s - top) for k, s in scores.items()}\n"
        "    weights = {k: x / sum(e.values()) for k, x in e.items()}\n"
        "    width = len(next(iter(values.values())))\n"
        "    return weights, [sum(weights[k] * values[k][i] for k in keys) for i in range(width)]\n",
    ),
    "06_mixing": (
        "ex06_mix",
        "def mix(A, V):\n    return A.softmax(dim=-1) @ V   # softmax a second time\n",
    ),
    "07_one_head": (
        "ex07_attention",
        "import math\n\n\n"
        "def attention(Q, K, V, mask=None):\n"
        "    S = Q @ K.transpose(-2, -1)   # forgot / sqrt(d_k)\n"
        "    if mask is not None:\n"
        "        S = S.masked_fill(~mask, float('-inf'))\n"
        "    A = torch.softmax(S, dim=-1).nan_to_num(0.0)\n"
        "    return A @ V, A\n",
    ),
}

ONE_SCREEN_PX = 720  # a projector, as tests/test_browser_layout.py measures
# an explorer's parts and their heights, for a failure message
PARTS = """e => [...e.children].map(c => [(c.className.match(/ac-[\\w-]+/g) || [c.className.slice(0, 30)]).join(' '),
    Math.round(c.getBoundingClientRect().height)])"""
SIZES = {"720": {"width": 1280, "height": 720}, "900": {"width": 1280, "height": 900}}


@pytest.mark.parametrize("lesson", list(WRONG))
def test_run_all_with_one_wrong_function_shows_it_in_every_explorer(lab, browser, lesson):  # noqa: F811
    grade_id, source = WRONG[lesson]
    name = grade_id.split("_", 1)[1]
    notebook = ROOT / "notebooks" / lesson / f"{lesson}.ipynb"
    target = lab["root"] / f"wrong-{lesson}" / notebook.name
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(filled(notebook, {**solution_sources(lesson), grade_id: source}), target)
    rel = target.relative_to(lab["root"]).as_posix()
    expected = _explorer_calls(target)
    assert expected, f"{lesson} has no explorer"
    page = browser.new_page(viewport=SIZES["720"])
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    with _reported(page, lab, f"wrong-{lesson}-failure.png"):
        panel = _open(page, lab, f"wrong-{lesson}", rel)
        _run_all_to_the_explorers(page, expected)
        failed = panel.locator(".jp-OutputArea-output", has_text=f"FAILED: this check of `{name}`")
        assert failed.count() >= 1, f"no visible check of `{name}` says it failed"
        explorers = panel.locator(".ac-explorer")
        assert explorers.count() == expected, f"{explorers.count()} explorers shown for {expected} calls"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for size, viewport in SIZES.items():
            page.set_viewport_size(viewport)
            for n in range(expected):
                ex = explorers.nth(n)
                ex.scroll_into_view_if_needed()
                text = " ".join(ex.inner_text(timeout=TIMEOUT_MS).split())
                assert re.search(rf"\b{name}\b[^.]*\byours\b|\byour `?{name}`?", text), (
                    f"explorer {n} does not say it runs the student's `{name}`: {text[:400]!r}"
                )
                assert "differs from the lesson" in text or "First difference from the lesson" in text, (
                    f"explorer {n} does not say where `{name}` departs from the lesson: {text[:600]!r}"
                )
                ex.screenshot(path=str(ARTIFACTS / f"wrong-{lesson}-{n}-{size}.png"))
                height = ex.bounding_box()["height"]
                assert height <= ONE_SCREEN_PX, (
                    f"explorer {n} is {height:.0f} px tall with the wrong `{name}`: more than one "
                    f"{ONE_SCREEN_PX} px screen; its parts: {ex.evaluate(PARTS)}"
                )
        assert not errors, f"JavaScript errors: {errors}"
