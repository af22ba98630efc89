#!/usr/bin/env bash
# Install what the browser tests (tests/test_browser.py) need: Debian's chromium and the
# Python `playwright` package (driving /usr/bin/chromium; no `playwright install`); and Debian's
# bubblewrap, which seals student code while grading (tests/test_seal.py).
# Never fails: where something cannot be installed it says so, and those tests skip.
set -u
cd "$(dirname "$0")/.."

PLAYWRIGHT="playwright==1.65.2"

say() { echo "[install_browser] $*"; }

if [ -x /usr/bin/chromium ]; then
    say "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null | head -n 1)"
elif command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != "0" ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            SUDO="sudo -n"
        else
            say "not root and no password-less sudo: cannot apt-get install chromium (browser tests will skip)"
        fi
    fi
    if [ "$(id -u)" = "0" ] || [ -n "$SUDO" ]; then
        if $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null; then
            say "installed $(/usr/bin/chromium --version 2>/dev/null | head -n 1)"
        else
            say "apt-get could not install chromium (browser tests will skip)"
        fi
    fi
else
    say "no apt-get here: install Chromium at /usr/bin/chromium yourself, or the browser tests skip"
fi

# bubblewrap: the operating-system boundary around student code while grading (grader/classroom/seal.py).
# Never fails: without it grading falls back to the in-process guard and says "not sealed".
if command -v bwrap >/dev/null 2>&1; then
    say "bubblewrap already installed: $(bwrap --version 2>/dev/null | head -n 1)"
elif command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = "0" ] || sudo -n true 2>/dev/null; }; then
    SUDO=""
    [ "$(id -u)" = "0" ] || SUDO="sudo -n"
    if DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
        || { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bubblewrap >/dev/null; }; then
        say "installed $(bwrap --version 2>/dev/null | head -n 1)"
    else
        say "apt-get could not install bubblewrap (grading runs not sealed; the seal tests skip)"
    fi
else
    say "no apt-get (or no root): install bubblewrap yourself, or grading runs not sealed"
fi

# The course's virtual environment (quickstart.py fills it; creating it first is harmless).
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv || say "could not create .venv"
fi
if [ -x .venv/bin/python ]; then
    if .venv/bin/python -c "import playwright" 2>/dev/null; then
        say "playwright already installed in .venv"
    elif .venv/bin/python -m pip install --quiet "$PLAYWRIGHT"; then
        say "installed $PLAYWRIGHT into .venv (it drives /usr/bin/chromium; no browser download)"
    else
        say "pip could not install $PLAYWRIGHT (browser tests will skip)"
    fi
fi
exit 0
