"""The stage stepper, the mask explorer and the pipeline view in real JupyterLab (headless Chromium).

A notebook with the three explorers is run in a page 1280 px wide; each control is
moved from the keyboard and the picture must change; every text of an explorer must
be at least 11 px (computed font sizes, and the figure shown at its natural size).
Screenshots of the first and last state of each control go to test-artifacts/browser/.
Uses the JupyterLab and Chromium fixtures of tests/test_browser.py (skipped without them).
"""

from __future__ import annotations

import re

import nbformat
import pytest

from tests.test_browser import (  # noqa: F401  (lab, browser: fixtures)
    IDLE,
    TIMEOUT_MS,
    Shots,
    _open,
    _reported,
    _run_all,
    _text,
    _wait_change,
    _wait_for,
    browser,
    check_readable,
    figure_text_px,
    lab,
)

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CELLS = [
    "from attention_course.explorers import mask_explorer, pipeline_view, stage_stepper",
    'stage_stepper(example="cat_sat")',
    "mask_explorer()",
    "pipeline_view()",
]

SMALLEST_TEXT = """ex => {
  const sizes = [];
  const walk = document.createTreeWalker(ex, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const node = walk.currentNode;
    if (!node.textContent.trim()) continue;
    const el = node.parentElement;
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || getComputedStyle(el).visibility === 'hidden') continue;
    sizes.push([parseFloat(getComputedStyle(el).fontSize), node.textContent.trim().slice(0, 30)]);
  }
  sizes.sort((a, b) => a[0] - b[0]);
  return sizes.slice(0, 3);
}"""

FIGURE_SCALE = """ex => [...ex.querySelectorAll('img.ac-figure')].map(
  img => img.getBoundingClientRect().width / img.naturalWidth)"""


def assert_text_large_enough(ex) -> None:
    smallest = ex.evaluate(SMALLEST_TEXT)
    assert smallest and smallest[0][0] >= 11, f"text smaller than 11 px: {smallest}"
    for scale in ex.evaluate(FIGURE_SCALE):
        assert scale >= 0.99, f"the figure is shrunk to {scale:.0%}: its text falls below 11 px"
        assert scale <= 1.01, f"the figure is stretched to {scale:.0%}: a blurred bitmap"


def check_stage_stepper(ex, shot) -> None:
    name = ex.locator(".ac-stage-name")
    img = ex.locator("img.ac-figure")
    handle = ex.locator(".ac-stage [role=slider]").first
    handle.focus()
    handle.press("Home")
    first = _wait_for(lambda: _text(name), lambda t: t.startswith("1."))
    assert "scaling: OFF" in first, first
    shot(ex, "stage-first")
    src = img.get_attribute("src")
    handle.press("ArrowRight")
    second = _wait_change(lambda: _text(name), first)
    assert "scaling: ON" in second, second
    assert _wait_change(lambda: img.get_attribute("src"), src)
    handle.press("End")
    _wait_for(lambda: _text(name), lambda t: "output" in t)
    shot(ex, "stage-last")
    readout = ex.locator(".ac-readout")
    row = _text(readout)
    buttons = ex.locator(".ac-query button")
    buttons.first.focus()
    buttons.first.press("Enter")
    moved = _wait_change(lambda: _text(readout), row)
    assert moved.startswith("O[")
    shot(ex, "query-first")
    buttons.last.focus()
    buttons.last.press("Enter")
    _wait_change(lambda: _text(readout), moved)
    shot(ex, "query-last")
    assert_text_large_enough(ex)


def _hidden(ex, b: int) -> int:
    return ex.locator(f".ac-sequence-{b} .ac-score.ac-hidden").count()


def check_mask_explorer(ex, shot) -> None:
    readout = ex.locator(".ac-readout")
    assert _hidden(ex, 1) == 25 - 12, "length 3 with the causal mask leaves 12 of 25 scores"
    handle = ex.locator(".ac-length-1 [role=slider]").first
    handle.focus()
    handle.press("Home")
    text = _wait_for(lambda: _text(readout), lambda t: "sequence 2 (b = 1) has length 0" in t)
    assert "see nothing at all" in text
    assert _hidden(ex, 1) == 25
    shot(ex, "length-first")
    handle.press("End")
    _wait_for(lambda: _text(readout), lambda t: "sequence 2 (b = 1) has length 5" in t)
    assert _hidden(ex, 1) == 10, "no padding: only the 10 cells above the diagonal are hidden"
    shot(ex, "length-last")
    t_handle = ex.locator(".ac-T [role=slider]").first
    t_handle.focus()
    t_handle.press("Home")
    _wait_for(lambda: _text(readout), lambda t: "causal mask (T = 1)" in t)
    shot(ex, "T-first")
    t_handle.press("End")
    _wait_for(lambda: _text(readout), lambda t: "causal mask (T = 5)" in t)
    shot(ex, "T-last")
    show = ex.locator(".ac-show button")
    show.first.focus()
    show.first.press("Enter")
    shot(ex, "show-first")
    show.last.focus()
    show.last.press("Enter")
    _wait_for(lambda: _text(readout), lambda t: "becomes exactly 0 after softmax" in t)
    shot(ex, "show-last")
    assert_text_large_enough(ex)


def check_pipeline(ex, shot) -> None:
    explanation = ex.locator(".ac-explanation")
    before = _text(explanation)
    assert before.lstrip().startswith("A["), before
    shot(ex, "cell-first")
    cell = ex.locator(".ac-cell-O-0-0")
    cell.focus()
    cell.press("Enter")
    text = _wait_change(lambda: _text(explanation), before)
    assert text.lstrip().startswith("O[") and re.search(r"= [\d.-]+", text), text
    lit = ex.locator(".ac-cell-A-0-1")
    _wait_for(lambda: lit.evaluate("e => getComputedStyle(e).borderTopStyle"), lambda s: s == "solid")
    shot(ex, "cell-last")
    buttons = ex.locator(".ac-query button")
    buttons.first.focus()
    buttons.first.press("Enter")
    _wait_for(lambda: _text(explanation), lambda t: "O[The(0)" in t)
    shot(ex, "query-first")
    buttons.last.focus()
    buttons.last.press("Enter")
    _wait_for(lambda: _text(explanation), lambda t: "O[the(4)" in t)
    shot(ex, "query-last")
    assert_text_large_enough(ex)


STAGE_CHECKS = {
    "ac-stage-stepper": check_stage_stepper,
    "ac-mask-explorer": check_mask_explorer,
    "ac-pipeline": check_pipeline,
}


def test_stage_explorers_render_and_respond_in_jupyterlab(lab, browser):  # noqa: F811
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(c) for c in CELLS],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
        },
    )
    target = lab["root"] / "stages" / "stage_explorers.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    rel = target.relative_to(lab["root"]).as_posix()
    prefix = target.stem
    shot = Shots(prefix)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    with _reported(page, lab, f"{prefix}-failure.png"):
        panel = _open(page, lab, prefix, rel)
        _run_all(page)
        page.wait_for_function(
            "() => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .ac-explorer').length >= 3",
            timeout=TIMEOUT_MS,
        )
        page.wait_for_function(IDLE)
        stderr = panel.locator("[data-mime-type='application/vnd.jupyter.stderr']")
        assert stderr.count() == 0, "a cell wrote to stderr:\n" + "\n".join(stderr.all_inner_texts())
        explorers = panel.locator(".ac-explorer")
        figure_px = figure_text_px()
        kinds = []
        for n in range(explorers.count()):
            ex = explorers.nth(n)
            ex.scroll_into_view_if_needed()
            kind = next(k for k in STAGE_CHECKS if k in (ex.get_attribute("class") or "").split())
            kinds.append(kind)
            STAGE_CHECKS[kind](ex, lambda t, what, k=kind: shot(t, f"{k.removeprefix('ac-')}-{what}"))
            check_readable(ex, kind, figure_px)  # nothing under 11 px, cut off or past the output area
        assert sorted(kinds) == sorted(STAGE_CHECKS), kinds
        assert not errors, f"JavaScript errors: {errors}"
