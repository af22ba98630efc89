"""Run All in JupyterLab before writing anything: every explorer shows, and the lesson says what is left.

Each student notebook that uses the explorers is opened as handed out (every exercise still a
stub) in JupyterLab in headless Chromium; Run All is chosen from the Run menu. The visible
checks say "not done yet" instead of stopping the run, so every explorer cell runs and shows
its labelled built-in version, and the last cell lists what is still to do. Slow: one
JupyterLab, one kernel per lesson. Screenshots go to test-artifacts/browser/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from tests.test_browser import (  # noqa: F401 - lab and browser are fixtures
    ARTIFACTS,
    IDLE,
    TIMEOUT_MS,
    _open,
    _reported,
    _run_all,
    browser,
    lab,
    lessons_with_explorers,
)

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _explorer_cells(path: Path) -> int:
    return sum(
        "from attention_course.explorers import" in c.source
        for c in nbformat.read(path, as_version=4).cells
        if c.cell_type == "code"
    )


@pytest.mark.parametrize("notebook", [pytest.param(p, id=p.parent.name) for p in lessons_with_explorers()])
def test_run_all_with_nothing_implemented_shows_every_explorer(lab, browser, notebook):  # noqa: F811
    lesson = notebook.parent.name
    target = lab["root"] / f"untouched-{lesson}" / notebook.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(notebook, target)
    rel = target.relative_to(lab["root"]).as_posix()
    expected = _explorer_cells(target)
    assert expected, f"{lesson} has no explorer cell"
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    with _reported(page, lab, f"runall-untouched-{lesson}-failure.png"):
        panel = _open(page, lab, f"untouched-{lesson}", rel)
        _run_all(page)
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output')]"
            ".some(e => e.innerText.includes('Where you stand:'))",
            timeout=TIMEOUT_MS,
        )
        page.wait_for_function(IDLE)
        explorers = panel.locator(".ac-explorer")
        assert explorers.count() == expected, (
            f"{explorers.count()} explorers shown for {expected} explorer cells"
        )
        for n in range(expected):
            ex = explorers.nth(n)
            ex.scroll_into_view_if_needed()
            shown = ex.locator("img, table, .ac-cell").count() > 0 and len(ex.inner_text()) > 40
            assert shown, f"explorer {n} did not render: {ex.inner_text()[:200]!r}"
        errors = panel.locator("[data-mime-type='application/vnd.jupyter.stderr']")
        assert errors.count() == 0, "a cell wrote to stderr:\n" + "\n".join(errors.all_inner_texts())
        outputs = "\n".join(panel.locator(".jp-OutputArea-output").all_inner_texts())
        assert "not done yet: `" in outputs
        assert "Still to do: `" in outputs
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"runall-untouched-{lesson}.png"))
