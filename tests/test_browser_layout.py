"""Every explorer fits a projector: JupyterLab in a 1280 x 720 window (headless Chromium).

For every lesson in notebooks/ that uses the explorers (its exercises filled in, as a
student who has done them), this opens the notebook in JupyterLab's default layout (file
browser open) at 1280 x 720, runs all cells and measures each explorer on screen:

- its box is at most one screen (720 px) tall, in its first state and in the states its
  controls lead to (every stage, a padded sequence, the weights, each kind of cell clicked);
- in the pipeline view and the cell explainer, the arithmetic a click shows lies inside
  the part of the notebook on screen, with the explorer scrolled to the top of the
  screen and to its bottom, for a cell of every matrix (nothing to scroll to read it);
- the pipeline view lights the direct sources of a clicked weight, and the earlier ones
  only once "show earlier sources" is ticked.

Screenshots go to test-artifacts/browser/ (``layout-*``). Uses the JupyterLab and Chromium
fixtures of tests/test_browser.py (skipped without them).
"""

from __future__ import annotations

import pytest

from tests.test_browser import (  # noqa: F401  (lab, browser: fixtures)
    TIMEOUT_MS,
    Shots,
    _explorer_calls,
    _open,
    _prepare,
    _reported,
    _run_all_to_the_explorers,
    _text,
    _wait_change,
    _wait_for,
    browser,
    lab,
    lessons_with_explorers,
)

pytestmark = [pytest.mark.slow, pytest.mark.browser]

SCREEN = {"width": 1280, "height": 720}  # a projector at 100% zoom
ONE_SCREEN_PX = 720

# The part of the page where the notebook shows: its scrolling area, cut to the window.
VISIBLE_AREA = """el => {
    let s = el.parentElement;
    while (s && s !== document.body) {
        const o = getComputedStyle(s).overflowY;
        if ((o === 'auto' || o === 'scroll') && s.scrollHeight > s.clientHeight + 1) break;
        s = s.parentElement;
    }
    const r = s && s !== document.body ? s.getBoundingClientRect()
        : {top: 0, bottom: innerHeight, left: 0, right: innerWidth};
    return {top: Math.max(r.top, 0), bottom: Math.min(r.bottom, innerHeight),
            left: Math.max(r.left, 0), right: Math.min(r.right, innerWidth)};
}"""

SCROLL_TO = "(e, where) => e.scrollIntoView({block: where, inline: 'nearest'})"


def _box(locator) -> dict:
    box = locator.bounding_box()
    assert box is not None, "not on the page"
    return box


class Fit:
    """The heights an explorer reached, state by state, and a check that each fits one screen."""

    def __init__(self, ex, kind: str, shot):
        self.ex, self.kind, self.shot, self.heights = ex, kind, shot, {}

    def __call__(self, state: str) -> None:
        height = _box(self.ex)["height"]
        self.heights[state] = round(height)
        assert height <= ONE_SCREEN_PX, (
            f"{self.kind} is {height:.0f} px tall ({state}): more than one {ONE_SCREEN_PX} px screen; "
            f"heights so far: {self.heights}"
        )


def _inside(box: dict, area: dict) -> bool:
    return (
        box["y"] >= area["top"] - 1
        and box["y"] + box["height"] <= area["bottom"] + 1
        and box["x"] >= area["left"] - 1
        and box["x"] + box["width"] <= area["right"] + 1
    )


def check_click_shows_arithmetic_on_screen(ex, kind: str, cells: list[str], shot) -> None:
    """For each cell (its class): with the explorer at the top of the screen and at its bottom, clicking the
    cell shows that cell's arithmetic (titled as its tooltip is) inside the notebook's part of the screen."""
    explanation = ex.locator(".ac-explanation")
    for where in ("start", "end"):
        for cls in cells:
            ex.evaluate(SCROLL_TO, where)
            cell = ex.locator(f".{cls}")
            title = (cell.get_attribute("title") or "").splitlines()[0]
            assert title, f"{cls} has no tooltip naming its arithmetic"
            cell.click()
            _wait_for(lambda: _text(explanation), lambda t, title=title: t.lstrip().startswith(title))
            area = ex.evaluate(VISIBLE_AREA)
            box, clicked = _box(explanation), _box(cell)
            assert _inside(clicked, area), f"{kind}: the click scrolled {cls} off the screen"
            assert _inside(box, area), (
                f"{kind}, explorer scrolled to its {where}: after a click on {cls} the arithmetic lies at "
                f"y {box['y']:.0f}..{box['y'] + box['height']:.0f}, the screen shows the notebook at "
                f"y {area['top']:.0f}..{area['bottom']:.0f} (explorer {_box(ex)['height']:.0f} px tall)"
            )
        shot(ex, f"click-{where}")


def drive_pipeline(ex, fit: Fit, shot) -> None:
    fit("first")
    T = ex.locator(".ac-grid-K .ac-cell").count() // 2
    cells = [  # a cell of every stage, the corners of X, K and V
        "ac-cell-X-0-0",
        f"ac-cell-X-{T - 1}-3",
        "ac-cell-Q-0-1",
        f"ac-cell-K-{T - 1}-1",
        f"ac-cell-V-{T - 1}-3",
        "ac-cell-S-0-0",
        "ac-cell-scaled-0-2",
        f"ac-cell-masked-0-{T - 1}",
        "ac-cell-A-0-1",
        "ac-cell-O-0-3",
    ]
    check_click_shows_arithmetic_on_screen(ex, "pipeline view", cells, shot)
    fit("after clicks")
    # A weight: its direct sources lit (solid), the earlier ones only once asked for (dashed).
    ex.locator(".ac-cell-A-0-1").click()
    _wait_for(lambda: _text(ex.locator(".ac-explanation")), lambda t: t.lstrip().startswith("A["))
    x_cell = ex.locator(".ac-cell-X-0-0")
    style = "e => getComputedStyle(e).borderTopStyle"
    _wait_for(lambda: ex.locator(".ac-cell-masked-0-0").evaluate(style), lambda s: s == "solid")
    assert (
        x_cell.evaluate(style) in ("none", "hidden", "")
        or x_cell.evaluate("e => parseFloat(getComputedStyle(e).borderTopWidth)") < 2
    ), "an earlier source (X) is lit before it is asked for"
    toggle = ex.locator(".ac-earlier")
    toggle.focus()
    toggle.press("Space")
    _wait_for(lambda: x_cell.evaluate(style), lambda s: s == "dashed")
    shot(ex, "earlier-sources")
    fit("earlier sources shown")


def drive_explainer(ex, fit: Fit, shot) -> None:
    fit("first")
    T = ex.locator(".ac-follow button").count()
    cells = [  # a corner of every matrix
        "ac-cell-Q-0-0",
        f"ac-cell-K-{T - 1}-1",
        "ac-cell-V-0-0",
        f"ac-cell-S-{T - 1}-0",
        "ac-cell-A-0-0",
        f"ac-cell-O-{T - 1}-1",
    ]
    check_click_shows_arithmetic_on_screen(ex, "cell explainer", cells, shot)
    fit("after clicks")
    for n in (0, T - 1):
        button = ex.locator(".ac-follow button").nth(n)
        button.focus()
        button.press("Enter")
        fit(f"following token {n}")


def drive_mask(ex, fit: Fit, shot) -> None:
    fit("first")
    readout = ex.locator(".ac-readout")
    handle = ex.locator(".ac-length-2 [role=slider]").first
    handle.focus()
    handle.press("Home")
    _wait_for(lambda: _text(readout), lambda t: "has length 0" in t)
    fit("a sequence of length 0")
    for b in range(ex.locator(".ac-sequence").count()):  # every key padding: the widest tables there are
        slider = ex.locator(f".ac-length-{b} [role=slider]").first
        slider.focus()
        slider.press("Home")
        _wait_for(lambda b=b: _text(readout), lambda t, b=b: f"sequence {b + 1} (b = {b}) has length 0" in t)
    fit("every sequence of length 0")
    show = ex.locator(".ac-show button").last
    show.focus()
    show.press("Enter")
    _wait_for(lambda: _text(readout), lambda t: "weights:" in t)
    fit("softmax weights")
    shot(ex, "weights")
    # each length slider sits by the sequence it changes: in one panel with it, right above its table
    for b in range(ex.locator(".ac-sequence").count()):
        slider = _box(ex.locator(f".ac-length-{b}"))
        table = _box(ex.locator(f".ac-sequence-panel-{b} .ac-sequence-{b} table"))
        assert 0 <= table["y"] - (slider["y"] + slider["height"]) <= 40, (
            f"length slider {b + 1} is not right above sequence {b + 1}: {slider} vs {table}"
        )
        overlap = min(slider["x"] + slider["width"], table["x"] + table["width"]) - max(
            slider["x"], table["x"]
        )
        assert overlap >= 0.5 * slider["width"], f"length slider {b + 1} is not over sequence {b + 1}"


def drive_stepper(ex, fit: Fit, shot) -> None:
    handle = ex.locator(".ac-stage [role=slider]").first
    name = ex.locator(".ac-stage-name")
    handle.focus()
    handle.press("Home")
    _wait_for(lambda: _text(name), lambda t: t.startswith("1."))
    fit("stage 1")
    last = round(float(handle.get_attribute("aria-valuemax") or 5))
    for k in range(2, last + 1):
        handle.press("ArrowRight")
        _wait_for(lambda: _text(name), lambda t, k=k: t.startswith(f"{k}."))
        fit(f"stage {k}")
    shot(ex, "last-stage")


def drive_other(ex, fit: Fit, shot) -> None:
    fit("first")
    slider = ex.locator("[role=slider]").first
    readout = ex.locator(".ac-readout")
    for key in ("Home", "End"):
        before = _text(readout)
        slider.focus()
        slider.press(key)
        _wait_change(lambda: _text(readout), before)
        fit(f"first slider at {key}")


DRIVERS = {
    "ac-pipeline": drive_pipeline,
    "ac-cell-explainer": drive_explainer,
    "ac-mask-explorer": drive_mask,
    "ac-stage-stepper": drive_stepper,
    "ac-head-dimension": drive_other,
    "ac-sharpness": drive_other,
}

LESSONS = [pytest.param(p, id=p.parent.name) for p in lessons_with_explorers()]


@pytest.mark.parametrize("notebook", LESSONS)
def test_every_explorer_fits_one_projector_screen(lab, browser, notebook):  # noqa: F811
    target = _prepare(notebook, lab["root"])
    rel = target.relative_to(lab["root"]).as_posix()
    prefix = f"layout-{target.stem}"
    shot = Shots(prefix)
    page = browser.new_page(viewport=SCREEN)
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    with _reported(page, lab, f"{prefix}-failure.png"):
        panel = _open(page, lab, prefix, rel)
        expected = _explorer_calls(target)
        assert expected, "no explorer in this lesson"
        _run_all_to_the_explorers(page, expected)
        explorers = panel.locator(".ac-explorer")
        assert explorers.count() == expected, f"{explorers.count()} explorers shown for {expected} calls"
        driven = []
        for n in range(explorers.count()):
            ex = explorers.nth(n)
            ex.scroll_into_view_if_needed()
            kind = next(k for k in DRIVERS if k in (ex.get_attribute("class") or "").split())
            driven.append(kind)
            name = kind.removeprefix("ac-")
            fit = Fit(ex, name, shot)
            DRIVERS[kind](ex, fit, lambda t, what, name=name, n=n: shot(t, f"{name}{n}-{what}"))
        assert not errors, f"JavaScript errors: {errors}"
