"""Headless Chromium for the browser tests: one Playwright and one browser per test module, shared.

Playwright's sync API cannot start while another of its instances runs in the same
thread, and while one runs ``asyncio.run`` fails in that thread. So every fixture of
a test module that needs Chromium calls :func:`module_chromium`, which starts one
browser the first time and closes it when the module's tests are done (before any
other module's tests run). Each test opens its own page (``browser.new_page()``), which
is a fresh browser context: no cookies or storage shared between tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("ATTENTION_COURSE_CHROMIUM", "/usr/bin/chromium")
_KEY = pytest.StashKey[object]()


def why_no_browser() -> str | None:
    """Why the browser tests cannot run here (no Chromium, no playwright), or None."""
    if not Path(CHROMIUM).is_file():
        return f"no Chromium at {CHROMIUM}: run .ci/install_browser.sh (Debian's chromium) to enable the browser tests"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return (
            "the playwright package is not installed: run .ci/install_browser.sh to enable the browser tests"
        )
    return None


def module_chromium(request: pytest.FixtureRequest):
    """The Chromium of the requesting test module: started on first use, closed after the module's tests."""
    why = why_no_browser()
    if why:
        pytest.skip(why)
    module = request.node.getparent(pytest.Module) or request.node
    browser = module.stash.get(_KEY, None)
    if browser is not None:
        return browser
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-dev-shm-usage"],
        )
    except Exception as error:  # e.g. a Chromium that lacks its libraries here
        playwright.stop()
        pytest.skip(f"Chromium at {CHROMIUM} would not start ({type(error).__name__}): no browser tests here")

    def close() -> None:
        module.stash[_KEY] = None
        try:
            browser.close()
        finally:
            playwright.stop()

    module.stash[_KEY] = browser
    module.addfinalizer(close)
    return browser


@pytest.fixture(scope="module")
def chromium(request):
    """Headless Chromium (no JupyterLab): the one of this test module."""
    return module_chromium(request)
