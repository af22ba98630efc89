"""The explorers as a student sees them: JupyterLab in headless Chromium, driven from the keyboard.

For the fixture notebook and every lesson in notebooks/ that uses the explorers
(with the exercises filled in, as a student who has done them), this starts
JupyterLab on a private copy, opens the notebook, runs all cells, checks that each
explorer renders, moves its controls with the keyboard and asserts that what is
displayed changes as it should. Screenshots go to test-artifacts/browser/.

Needs Chromium at /usr/bin/chromium (or $ATTENTION_COURSE_CHROMIUM) and the
``playwright`` package; ``.ci/install_browser.sh`` installs both. Skipped otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest

from tests.browser_support import (
    describe_page,
    kernel_dumps,
    module_chromium,
    running_lab,
    watch_console,
    why_no_browser,
)
from tests.nbtools import ROOT, filled, solution_sources

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ARTIFACTS = ROOT / "test-artifacts" / "browser"
FIXTURE = ROOT / "tests" / "fixtures" / "explorers_demo.ipynb"
TIMEOUT_MS = 180_000


def _explorer_names() -> list[str]:
    from attention_course import explorers

    return list(explorers.__all__)


EXPLORER_CALL = re.compile(r"(?<![\w.])(\w+\.)*(" + "|".join(_explorer_names()) + r")\(")


def _explorer_calls(path: Path) -> int:
    """How many code cells of a notebook show an explorer: each calls one, as its last line or inside
    ``display(...)`` (a lesson may wrap it, e.g. ``with demo(f): display(explorer(f))``)."""
    return sum(
        bool(EXPLORER_CALL.search(c.source))
        for c in nbformat.read(path, as_version=4).cells
        if c.cell_type == "code"
    )


def lessons_with_explorers() -> list[Path]:
    """Student notebooks that use the explorers."""
    return sorted(
        p for p in (ROOT / "notebooks").glob("*/*.ipynb") if "attention_course.explorers" in p.read_text()
    )


NOTEBOOKS = [pytest.param(FIXTURE, id="fixture")] + [
    pytest.param(p, id=p.parent.name) for p in lessons_with_explorers()
]


# ------------------------------------------------------------------ JupyterLab


def _prepare(path: Path, dest: Path) -> Path:
    """Copy a notebook into the private course folder; a lesson gets its exercises filled in."""
    if path == FIXTURE:
        target = dest / "fixture" / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
        return target
    lesson = path.parent.name
    target = dest / lesson / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(filled(path, solution_sources(lesson)), target)
    return target


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a free local port, rooted at a private folder; stopped afterwards."""
    why = why_no_browser()
    if why:
        pytest.skip(why)
    with running_lab(tmp_path_factory.mktemp("course"), tmp_path_factory.mktemp("jupyter")) as server:
        yield server


@pytest.fixture(scope="module")
def browser(lab, request):
    """Chromium, with the JupyterLab server running (the module's one Chromium, see tests/browser_support.py)."""
    return module_chromium(request)


@pytest.fixture(scope="module")
def bare_browser(request):
    """Chromium alone (no JupyterLab): for pages saved as files. The same Chromium as ``browser``."""
    return module_chromium(request)


# ------------------------------------------------------------------- helpers


class Shots:
    def __init__(self, prefix: str):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for old in ARTIFACTS.glob(f"{prefix}-[0-9][0-9]-*.png"):  # no screenshot left from an earlier run
            old.unlink()
        self.prefix, self.n = prefix, 0

    def __call__(self, target, what: str) -> None:
        self.n += 1
        target.screenshot(path=str(ARTIFACTS / f"{self.prefix}-{self.n:02d}-{what}.png"))


def _text(locator) -> str:
    return locator.inner_text(timeout=TIMEOUT_MS)


def _wait_change(read, old, timeout_s: float = 60.0):
    """Poll ``read()`` until it differs from ``old``; returns the new value."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        new = read()
        if new != old:
            return new
        time.sleep(0.1)
    raise AssertionError(f"the display did not change (still {old!r})")


def _wait_for(read, predicate, timeout_s: float = 60.0):
    deadline = time.time() + timeout_s
    value = read()
    while not predicate(value):
        if time.time() > deadline:
            raise AssertionError(f"timed out; last value: {value!r}")
        time.sleep(0.1)
        value = read()
    return value


def _entropy(readout: str) -> float:
    return float(re.search(r"entropy ([\d.]+) nats", readout).group(1))


def _d_k(readout: str) -> int:
    return int(re.search(r"d_k = (\d+)", readout).group(1))


def _shut_down_kernels(lab) -> None:
    """Stop every kernel the server runs (each notebook gets a fresh one)."""
    headers = {"Authorization": f"token {lab['token']}"}
    with urllib.request.urlopen(urllib.request.Request(f"{lab['base']}/api/sessions", headers=headers)) as r:
        sessions = json.load(r)
    for session in sessions:
        url = f"{lab['base']}/api/sessions/{session['id']}"
        urllib.request.urlopen(urllib.request.Request(url, headers=headers, method="DELETE")).close()


STARTED = """() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputArea-prompt')]
    .some(e => /\\[(\\*|\\d+)\\]/.test(e.textContent))"""


IDLE = "() => (document.querySelector('#jp-main-statusbar')?.innerText || '').includes('| Idle')"
DONE = "() => [...document.querySelectorAll('.jp-InputArea-prompt')].every(e => !e.textContent.includes('*'))"


@contextmanager
def _reported(page, lab: dict, failure_shot: str):
    """A browser test's steps on ``page``: on a failure, a full-page screenshot ``failure_shot`` (a name in
    test-artifacts/browser/) and what the page, the server and the kernels show, added to the error; at
    the end the page is closed and every kernel stopped (each notebook gets a fresh one)."""
    try:
        yield
    except Exception as error:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / failure_shot), full_page=True)
        error.add_note(describe_page(page, lab.get("log")))
        error.add_note("where the kernels are:\n" + kernel_dumps(lab["dumps"], lab["runtime"]))
        raise
    finally:
        page.close()
        _shut_down_kernels(lab)


def _open(page, lab: dict, workspace: str, rel: str):
    """Open the notebook ``rel`` in a workspace of its own, reset (no tabs restored from notebooks
    opened before), and wait for its kernel: the notebook's panel."""
    watch_console(page)
    page.goto(f"{lab['base']}/lab/workspaces/{workspace}/tree/{rel}?reset&token={lab['token']}")
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    panel.locator(".jp-Cell").first.wait_for()
    page.wait_for_function(IDLE)
    return panel


def _run_all_to_the_explorers(page, expected: int) -> None:
    """Run All, then wait for ``expected`` explorers (at least one), every cell done, the kernel idle."""
    _run_all(page)
    page.wait_for_function(
        "n => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .ac-explorer').length >= n",
        arg=max(1, expected),
        timeout=TIMEOUT_MS,
    )
    page.wait_for_function(DONE, timeout=TIMEOUT_MS)
    page.wait_for_function(IDLE)


def _run_all(page) -> None:
    """Run > Run All Cells, from the menu as a student does; once more if no cell has started 30 s
    later (a menu click that the page, still settling, did not take; no cell is run twice)."""
    for attempt in range(2):
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        try:
            page.wait_for_function(STARTED, timeout=30_000)
            return
        except Exception:  # noqa: BLE001 - playwright's TimeoutError: no cell queued or run
            if attempt:
                raise


# ---------------------------------------------------------- per-explorer checks


def check_head_dimension(ex, shot) -> None:
    readout = ex.locator(".ac-readout")
    img = ex.locator("img.ac-figure")
    handle = ex.locator(".ac-d_k [role=slider]").first
    handle.focus()
    handle.press("Home")
    at_1 = _wait_for(lambda: _text(readout), lambda t: _d_k(t) == 1)
    assert "scaling changes nothing" in at_1
    shot(ex, "d_k-1")
    src = img.get_attribute("src")
    entropies = {1: _entropy(at_1)}
    while _d_k(_text(readout)) < 64:  # PageUp jumps several steps; Arrow keys one
        before = _text(readout)
        handle.press("PageUp" if _d_k(before) <= 59 else "ArrowRight")
        now = _wait_change(lambda: _text(readout), before)
        entropies[_d_k(now)] = _entropy(now)
    at_64 = _text(readout)
    assert _d_k(at_64) == 64, at_64
    assert img.get_attribute("src") != src, "the figure did not change"
    shot(ex, "d_k-64-unscaled")
    assert entropies[64] < entropies[1], f"entropy should fall as d_k grows unscaled: {entropies}"
    assert entropies[64] < 0.2 and "Saturated" in at_64, at_64
    toggle = ex.locator("button.ac-scale")
    toggle.focus()
    toggle.press("Space")
    scaled = _wait_for(lambda: _text(readout), lambda t: "scaled by 1/sqrt(d_k)" in t)
    assert _entropy(scaled) > 1.0, scaled
    assert "ON" in toggle.inner_text(), "the toggle says its state in words"
    shot(ex, "d_k-64-scaled")
    handle.focus()
    handle.press("End")
    _wait_for(lambda: _text(readout), lambda t: _d_k(t) == 128)
    shot(ex, "d_k-128")
    row = ex.locator(".ac-row select")
    for which in (0, -1):
        before = _text(readout)
        options = row.locator("option").all_inner_texts()
        row.select_option(label=options[which])
        if _text(readout) == before:
            _wait_change(lambda: _text(readout), before)
        shot(ex, f"row-{options[which]}")
    before = _text(readout)
    ex.locator("button.ac-resample").press("Enter")
    _wait_change(lambda: _text(readout), before)
    shot(ex, "resampled")


def check_sharpness(ex, shot) -> None:
    readout = ex.locator(".ac-readout")
    swatch = ex.locator(".ac-swatch")
    colour = swatch.get_attribute("title")
    handle = ex.locator(".ac-sharpness [role=slider]").first
    handle.focus()
    before = _text(readout)
    shot(ex, "sharpness-start")
    handle.press("Home")
    _wait_for(lambda: _text(readout), lambda t: re.search(r"sharpness 0\b", t))
    shot(ex, "sharpness-0")
    before = _text(readout)
    handle.press("End")
    after = _wait_change(lambda: _text(readout), before)
    assert "sharpness 30" in after, after
    assert swatch.get_attribute("title") != colour, "the swatch did not change with sharpness"
    assert "Almost a hard look-up" in after
    shot(ex, "sharpness-30")
    preset = ex.locator("button.ac-preset", has_text="query [0.0, 1.0]")
    preset.focus()
    preset.press("Enter")
    now = _wait_for(lambda: _text(readout), lambda t: "query [0, 1]" in t)
    assert "'green'" in now, now
    shot(ex, "preset-green")
    last = ex.locator("button.ac-preset").last
    last.focus()
    last.press("Enter")
    now = _wait_change(lambda: _text(readout), now)
    shot(ex, "preset-last")
    for name in ("query_x", "query_y"):
        slider = ex.locator(f".ac-{name} [role=slider]").first
        for key in ("Home", "End"):
            slider.focus()
            slider.press(key)
            now = _wait_change(lambda: _text(readout), now)
            shot(ex, f"{name}-{'first' if key == 'Home' else 'last'}")


def check_stage_stepper(ex, shot) -> None:
    name = ex.locator(".ac-stage-name")
    readout = ex.locator(".ac-readout")
    handle = ex.locator(".ac-stage [role=slider]").first
    handle.focus()
    handle.press("Home")
    first = _wait_for(lambda: _text(name), lambda t: t.startswith("1."))
    shot(ex, "stage-1")
    handle.press("ArrowRight")
    second = _wait_change(lambda: _text(name), first)
    assert second.startswith("2.") and "scaled" in second, second
    handle.press("End")
    last = _wait_for(lambda: _text(name), lambda t: "output" in t)
    shot(ex, "stage-last")
    row = _text(readout)
    buttons = ex.locator(".ac-query button")
    buttons.first.focus()
    buttons.first.press("Enter")
    moved = _wait_change(lambda: _text(readout), row)
    assert moved.startswith("O["), moved
    assert last
    shot(ex, "query-first")
    buttons.last.focus()
    buttons.last.press("Enter")
    _wait_change(lambda: _text(readout), moved)
    shot(ex, "query-last")


def check_cell_explainer(ex, shot) -> None:
    explanation = ex.locator(".ac-explanation")
    cells = ex.locator(".ac-cell")
    assert cells.count() >= 6 * 9
    a_cells = ex.locator("[class*='ac-cell-A-']")
    target = a_cells.nth(a_cells.count() - 2)
    assert "=" in (target.get_attribute("title") or ""), "pointing at a cell shows its arithmetic"
    before = _text(explanation)
    target.click()
    text = _wait_change(lambda: _text(explanation), before)
    assert "exp(x - max)" in text and "/ row sum" in text, text
    shot(ex, "explain-A")
    s_cell = ex.locator("[class*='ac-cell-S-']").nth(1)
    s_cell.focus()
    s_cell.press("Enter")
    text = _wait_for(lambda: _text(explanation), lambda t: t.lstrip().startswith("S["))
    assert "sqrt(d_k)" in text, text
    assert re.search(r"q_\S+ \. k_\S+ = ", text), text
    shot(ex, "explain-S")
    story = ex.locator(".ac-row-story")
    before = _text(story)
    follow = ex.locator(".ac-follow button").first
    follow.focus()
    follow.press("Enter")
    first = _wait_change(lambda: _text(story), before)
    assert "Following" in first
    shot(ex, "follow-first")
    last = ex.locator(".ac-follow button").last
    last.focus()
    last.press("Enter")
    _wait_change(lambda: _text(story), first)
    shot(ex, "follow-last")


READABILITY = """ex => {
    const area = ex.closest('.jp-OutputArea-output') || ex;
    const edge = area.getBoundingClientRect();
    const small = [], clipped = [];
    for (const el of ex.querySelectorAll('*')) {
        const style = getComputedStyle(el);
        const box = el.getBoundingClientRect();
        if (style.display === 'none' || style.visibility === 'hidden' || box.width === 0 || box.height === 0) continue;
        const text = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
        const label = (el.className && el.className.baseVal === undefined ? el.className : el.tagName) + ': ' + text.slice(0, 40);
        if (text && parseFloat(style.fontSize) < 11) small.push(style.fontSize + ' ' + label);
        if (box.right > edge.right + 1 || box.left < edge.left - 1) clipped.push('past the output area: ' + label);
        if (text && (style.overflow === 'hidden' || style.textOverflow === 'ellipsis') && el.scrollWidth > el.clientWidth + 1)
            clipped.push('cut inside its box: ' + label);
    }
    const figures = [...ex.querySelectorAll('img.ac-figure')].map(i => i.getBoundingClientRect().width / i.naturalWidth);
    return {small, clipped, figures, overflow: ex.scrollWidth > ex.clientWidth + 1};
}"""


def figure_text_px() -> dict[str, float]:
    """The smallest figure text of each kind of explorer, in pixels at the picture's natural size."""
    from attention_course import explorers
    from attention_course.explorers import drawing

    out = {}
    for make in (explorers.head_dimension_explorer, explorers.sharpness_explorer, explorers.stage_stepper):
        ex = make()
        out[f"ac-{ex.kind}"] = drawing.min_text_px(ex.figure.ff.fig)
    return out


def check_readable(ex, kind: str, figure_px: dict[str, float]) -> None:
    """Every text at least 11 px, nothing cut or past the output area, each figure at its natural size."""
    found = ex.evaluate(READABILITY)
    assert not found["small"], f"{kind}: text under 11 px: {found['small'][:8]}"
    assert not found["clipped"] and not found["overflow"], f"{kind}: cut off: {found['clipped'][:8]}"
    for scale in found["figures"]:
        assert 0.99 <= scale <= 1.01, (
            f"{kind}: the figure is shown at {scale:.0%} of its size (blurred or shrunk)"
        )
        assert kind in figure_px, f"{kind}: a figure whose text size figure_text_px does not know"
        shown = figure_px[kind] * scale
        assert shown >= 11, f"{kind}: figure text shown at {shown:.1f} px (picture scaled by {scale:.2f})"


CHECKS = {
    "ac-head-dimension": check_head_dimension,
    "ac-sharpness": check_sharpness,
    "ac-stage-stepper": check_stage_stepper,
    "ac-cell-explainer": check_cell_explainer,
}


def all_checks() -> dict:
    """These checks, and those of the mask explorer and the pipeline view (kept next to their own tests)."""
    from tests.test_browser_stages import STAGE_CHECKS  # imported late: that module imports this one

    return {**CHECKS, **STAGE_CHECKS}


# ---------------------------------------------------------------------- test


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_explorers_render_and_respond_in_jupyterlab(lab, browser, notebook):
    target = _prepare(notebook, lab["root"])
    rel = target.relative_to(lab["root"]).as_posix()
    prefix = target.stem
    shot = Shots(prefix)
    page = browser.new_page(viewport={"width": 1280, "height": 1000})  # a projector's width, at 100% zoom
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    with _reported(page, lab, f"{prefix}-failure.png"):
        panel = _open(page, lab, prefix, rel)
        expected = _explorer_calls(target)
        _run_all_to_the_explorers(page, expected)
        stderr = panel.locator("[data-mime-type='application/vnd.jupyter.stderr']")
        assert stderr.count() == 0, "a cell wrote to stderr:\n" + "\n".join(stderr.all_inner_texts())
        explorers = panel.locator(".ac-explorer")
        hidden = panel.evaluate(
            """p => [...p.querySelectorAll('.jp-OutputArea-child')].filter(c =>
                c.offsetParent !== null && (c.querySelector('.ac-static') ||
                (c.querySelector('.jp-RenderedImage img') && c.nextElementSibling &&
                 c.nextElementSibling.querySelector('.ac-static-readout')))).length"""
        )
        assert hidden == 0, "the saved picture shows next to the live explorer: the student sees it twice"
        figure_px = figure_text_px()
        checks = all_checks()
        kinds = []
        for n in range(explorers.count()):
            ex = explorers.nth(n)
            ex.scroll_into_view_if_needed()
            cls = (ex.get_attribute("class") or "").split()
            kind = next((c for c in cls if c.startswith("ac-") and c != "ac-explorer"), "ac-explorer")
            kinds.append(kind)
            shot(ex, kind.removeprefix("ac-"))
            check_readable(ex, kind, figure_px)
            if kind in checks:
                rendered = ex.locator("img.ac-figure, .ac-cell, .ac-mask-picture")
                assert rendered.count() > 0, "the explorer did not render"
                checks[kind](ex, lambda t, what, k=kind, n=n: shot(t, f"{k.removeprefix('ac-')}{n}-{what}"))
                check_readable(ex, kind, figure_px)
        assert kinds, "no explorer on the page"
        if notebook == FIXTURE:
            assert set(CHECKS) <= set(kinds), kinds
        assert not errors, f"JavaScript errors: {errors}"


# ------------------------------------------------- the saved page, without a kernel or a network


LESSONS = [pytest.param(p, id=p.parent.name) for p in lessons_with_explorers()]


@pytest.mark.parametrize("notebook", LESSONS)
def test_the_executed_html_shows_every_explorers_picture_and_readout_offline(
    bare_browser, notebook, tmp_path
):
    """``jupyter nbconvert --to html --execute`` with its default options (widget state stored), read offline.

    One option is added: it waits up to 60 s, not 4 s, for a cell's last outputs, which a loaded test
    machine can deliver late (nbconvert would drop them without a word).
    """
    target = _prepare(notebook, tmp_path)
    env = dict(
        os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    env.pop("NBGRADER_EXECUTION", None)
    env["IPYTHONDIR"] = str(tmp_path / "ipython")  # its own input history, not the one all tests share
    done = subprocess.run(
        [
            *(sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", "--execute", target.name),
            *("--ExecutePreprocessor.iopub_timeout=60", "--ExecutePreprocessor.raise_on_iopub_timeout=True"),
        ],
        cwd=target.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    page = bare_browser.new_page(viewport={"width": 1280, "height": 900})
    asked: list[str] = []

    def offline(route):  # nothing from the network: a classroom without internet, or a sanitising viewer
        if route.request.url.startswith("file:") or route.request.url.startswith("data:"):
            route.continue_()
        else:
            asked.append(route.request.url)
            route.abort()

    page.route("**/*", offline)
    try:
        page.goto(target.with_suffix(".html").as_uri())
        page.wait_for_load_state("load")
        expected = _explorer_calls(target)
        found = page.evaluate(
            """() => [...document.querySelectorAll('.ac-static-label')].map(label => {
                const area = label.closest('.jp-OutputArea');
                const uid = [...label.classList].find(c => c.startsWith('ac-static-') && c.length > 16);
                const readout = area.querySelector('.ac-static-readout.' + uid);
                const imgs = [...area.querySelectorAll('img')].filter(i => !readout.contains(i));
                const box = e => e.getBoundingClientRect();
                return {
                    label: label.innerText,
                    labelShown: box(label).height > 0,
                    readout: readout ? readout.innerText : '',
                    readoutShown: readout ? box(readout).height > 0 : false,
                    pictures: imgs.map(i => [i.naturalWidth, i.naturalHeight, box(i).width, box(i).height]),
                    tables: readout ? readout.querySelectorAll('table').length : 0,
                };
            })"""
        )
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        areas = page.locator(".jp-OutputArea:has(.ac-static-label)")
        for n in range(areas.count()):
            areas.nth(n).screenshot(path=str(ARTIFACTS / f"{target.stem}-saved-html-{n}.png"))
        assert len(found) == expected, f"{len(found)} saved explorer pictures for {expected} explorers"
        for ex in found:
            assert (
                "Picture of the starting setting, saved with the notebook" in ex["label"] and ex["labelShown"]
            )
            assert ex["readoutShown"] and len(ex["readout"]) > 40, ex
            if ex["tables"]:  # the cell explainer: every matrix as a table
                continue
            assert ex["pictures"], f"no picture next to {ex['label']!r}"
            nw, nh, w, h = ex["pictures"][0]
            assert nw > 500 and nh > 250, "the picture did not load"
            assert w >= 0.98 * nw and h > 250, f"the picture is shown at {w:.0f} of its {nw} px"
        assert any("widget" in url or "require" in url for url in asked), (
            "the page should have asked for the widget JavaScript (and been refused): " + repr(asked)
        )
    finally:
        page.close()
