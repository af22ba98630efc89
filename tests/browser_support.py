"""Headless Chromium for the browser tests: one Playwright and one browser per test module, shared.

Playwright's sync API cannot start while another of its instances runs in the same
thread, and while one runs ``asyncio.run`` fails in that thread. So every fixture of
a test module that needs Chromium calls :func:`module_chromium`, which starts one
browser the first time and closes it when the module's tests are done (before any
other module's tests run). Each test opens its own page (``browser.new_page()``), which
is a fresh browser context: no cookies or storage shared between tests.

:func:`running_lab` starts the JupyterLab server the tests (the ``lab`` fixture of
tests/test_browser.py) and tests/browser_clicks.py drive; :func:`launch_chromium`
starts Chromium as both do. Neither needs pytest.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("ATTENTION_COURSE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-dev-shm-usage"]
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


def launch_chromium(playwright):
    """Headless Chromium at ``CHROMIUM``, started by a running (sync) Playwright."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


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
        browser = launch_chromium(playwright)
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# JupyterLab's settings for the test server: no news or update checks (no network), every cell
# of a notebook in the page (no windowing: a cell scrolled out of view still holds its outputs).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}


@contextmanager
def running_lab(root: Path, home: Path) -> Iterator[dict]:
    """A JupyterLab server on a free local port, rooted at ``root``, its configuration, settings,
    runtime files, IPython folder and log in ``home``; stopped on leaving.

    Yields ``base`` (the server's URL), ``token``, ``root``, ``log`` (the server's log file),
    ``dumps`` (where its kernels write their threads on SIGUSR1, see :func:`kernel_dumps`) and
    ``runtime`` (its runtime folder, which every one of its kernels' command lines holds).
    """
    settings = home / "settings"
    for plugin, values in LAB_SETTINGS.items():
        target = settings / f"{plugin}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    token = secrets.token_hex(16)
    port = _free_port()
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        IPYTHONDIR=str(home / "ipython"),  # its kernels' own input history, not the one all tests share
    )
    env.pop("NBGRADER_EXECUTION", None)
    prepare_kernel_dumps(home / "ipython", home / "dumps")
    log = open(home / "lab.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            f"--port={port}",
            "--ServerApp.ip=127.0.0.1",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            "--ServerApp.open_browser=False",
            f"--ServerApp.root_dir={root}",
        ],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("JupyterLab did not start:\n" + (home / "lab.log").read_text()[-3000:])
            time.sleep(0.5)
        yield {
            "base": base,
            "token": token,
            "root": root,
            "log": home / "lab.log",
            "dumps": home / "dumps",
            "runtime": str(home / "runtime"),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


PAGE_STATE = """() => {
    const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
    const status = (document.querySelector('#jp-main-statusbar') || {}).innerText || '(no status bar)';
    const dialog = (document.querySelector('.jp-Dialog') || {}).innerText || '';
    if (!panel) return {status, dialog, cells: [], explorers: 0};
    const cells = [...panel.querySelectorAll('.jp-CodeCell')].map((cell, i) => {
        const prompt = ((cell.querySelector('.jp-InputArea-prompt') || {}).textContent || '').trim();
        const source = ((cell.querySelector('.jp-InputArea-editor') || {}).innerText || '').trim().split('\\n')[0];
        const bad = [...cell.querySelectorAll(
            "[data-mime-type='application/vnd.jupyter.stderr'], .jp-RenderedText[data-mime-type='application/vnd.jupyter.error']"
        )].map(e => e.innerText.trim().slice(-400));
        const widgets = [...cell.querySelectorAll(
            "[data-mime-type='application/vnd.jupyter.widget-view+json']"
        )].map(e => e.querySelector('.ac-explorer') ? 'explorer'
            : (e.innerText.trim().slice(0, 120) || `empty (${e.childElementCount} children)`));
        return {i, prompt, source: source.slice(0, 60), bad, widgets};
    });
    return {status, dialog, cells, explorers: panel.querySelectorAll('.ac-explorer').length};
}"""


# An IPython start-up file for the test server's kernels: on SIGUSR1 a kernel writes where each of
# its threads is (faulthandler) to a file of its own, so that a test can say where a cell is stuck.
DUMP_ON_SIGNAL = """import faulthandler as _fh, os as _os, signal as _signal
_fh.register(_signal.SIGUSR1, file=open(_os.path.join({folder!r}, f"kernel-{{_os.getpid()}}.txt"), "w"), all_threads=True)
del _fh, _os, _signal
"""


def prepare_kernel_dumps(ipython_dir: Path, folder: Path) -> None:
    """Make the kernels of a server with this IPYTHONDIR dump their threads to ``folder`` on SIGUSR1."""
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    (startup / "00-dump-threads-on-sigusr1.py").write_text(DUMP_ON_SIGNAL.format(folder=str(folder)))


def kernel_dumps(folder: Path, marker: str) -> str:
    """Where every running kernel whose command line holds ``marker`` is stuck: each is sent SIGUSR1
    and its dump read back (faulthandler writes from its signal handler: a kernel stuck in C code
    answers too)."""
    import os
    import signal
    import time

    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "ipykernel_launcher" in cmd and marker in cmd:
            pids.append(int(entry.name))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            pass
    time.sleep(1.0)
    parts = []
    for pid in pids:
        dump = folder / f"kernel-{pid}.txt"
        text = dump.read_text(errors="replace") if dump.exists() else "(no dump)"
        parts.append(f"kernel {pid}:\n{text[-6000:]}")
    return "\n".join(parts) or "(no kernel running)"


_CONSOLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def watch_console(page) -> None:
    """Keep the page's console errors and warnings (a widget view that failed to render says so
    there, not on the page) for ``describe_page``."""
    seen = _CONSOLE.setdefault(page, [])
    page.on(
        "console",
        lambda m: seen.append(f"{m.type}: {m.text[:300]}") if m.type in ("error", "warning") else None,
    )


def describe_page(page, log: Path | None = None) -> str:
    """What a failed browser test saw: the status bar, each code cell's prompt (``[*]``: still
    running, ``[ ]``: never run) and any error it shows, the explorers rendered, the end of the
    server's log. For the failure message, where a screenshot cannot be seen."""
    try:
        state = page.evaluate(PAGE_STATE)
    except Exception as error:  # noqa: BLE001 - the page itself is gone
        return f"(the page could not be read: {type(error).__name__}: {error})"
    lines = [
        f"status bar: {' '.join(state['status'].split())!r}",
        f"explorers rendered: {state['explorers']}",
    ]
    if state["dialog"]:
        lines.append(f"dialog open: {' '.join(state['dialog'].split())[:300]!r}")
    for cell in state["cells"]:
        lines.append(f"  cell {cell['i']:2d} {cell['prompt'] or '[ ]':7s} {cell['source']!r}")
        lines += [f"      shows: {text!r}" for text in cell["bad"]]
        lines += [f"      widget output: {text!r}" for text in cell["widgets"] if text != "explorer"]
    console = _CONSOLE.get(page, [])
    if console:
        lines.append("the browser's console (errors and warnings, last 10):")
        lines += ["  " + text for text in console[-10:]]
    if log is not None and log.exists():
        lines.append("end of the server's log:")
        lines += ["  " + line for line in log.read_text(errors="replace").splitlines()[-25:]]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def chromium(request):
    """Headless Chromium (no JupyterLab): the one of this test module."""
    return module_chromium(request)
