"""Run the lessons where students are: Google Colab, Binder, any JupyterLab.

Every lesson's first code cell carries a copy of ``fetch_course`` and, on Google
Colab only, calls it and then ``setup()``: Colab already has PyTorch, NumPy,
matplotlib and ipywidgets, so the cell fetches just what it lacks -- these
helpers and the course's data/ -- and installs nothing with pip. In JupyterLab,
on Binder and whenever nbgrader runs a notebook, that cell does nothing.

Explorers (``attention_course.explorers``) render as live widgets on Colab:
``setup()`` turns on Colab's custom widget manager where ipywidgets 8 needs it;
where widgets cannot render, an explorer shows its static picture instead.
"""

from __future__ import annotations

import os
import sys

#: Overrides where ``fetch_course`` reads the course from: a folder, or a .zip file or URL.
SOURCE_ENV = "ATTENTION_COURSE_SOURCE"

_custom_widget_manager = {"on": False}


def on_colab() -> bool:
    """True inside a Google Colab runtime (its kernel imports ``google.colab`` at start)."""
    return "google.colab" in sys.modules


def graded() -> bool:
    """True while nbgrader runs the notebook (``NBGRADER_EXECUTION`` is autograde or validate)."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def fetch_course(repository, branch="main"):
    """Put the course's helpers (attention_course/) and data/ on sys.path; return their folder.

    Reads ``<repository>/archive/refs/heads/<branch>.zip`` once per runtime, or the
    folder, .zip file or URL named by ATTENTION_COURSE_SOURCE, and keeps only
    attention_course/ and data/. Standard library only: lessons carry a copy of it.
    """
    import importlib
    import io
    import os
    import shutil
    import sys
    import urllib.request
    import zipfile

    wanted = ("attention_course", "data")
    home = os.path.join(os.path.expanduser("~"), ".attention-course", branch.replace("/", "-"))
    done = os.path.join(home, ".complete")
    if not os.path.exists(done):
        source = os.environ.get("ATTENTION_COURSE_SOURCE") or (
            repository.rstrip("/") + "/archive/refs/heads/" + branch + ".zip"
        )
        shutil.rmtree(home, ignore_errors=True)
        os.makedirs(home)
        if os.path.isdir(source):
            for name in wanted:
                shutil.copytree(
                    os.path.join(source, name),
                    os.path.join(home, name),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                )
        else:
            try:
                if "://" in source:
                    with urllib.request.urlopen(source, timeout=60) as response:
                        payload = response.read()
                else:
                    with open(source, "rb") as file:
                        payload = file.read()
            except OSError as error:
                raise RuntimeError(
                    f"Could not download the course from {source} ({error}). "
                    "Check that this runtime is connected to the internet, then run this cell again."
                ) from None
            with zipfile.ZipFile(io.BytesIO(payload)) as archive:
                names = archive.namelist()
                marker = "attention_course/__init__.py"
                found = [n for n in names if n == marker or n.endswith("/" + marker)]
                if not found:
                    raise RuntimeError(f"{source} does not hold the course (no {marker} in it).")
                prefix = min(found, key=len)[: -len(marker)]
                for name in names:
                    parts = name[len(prefix) :].split("/")
                    if not name.startswith(prefix) or name.endswith("/") or parts[0] not in wanted:
                        continue
                    if any(part in ("", ".", "..") for part in parts):
                        continue
                    target = os.path.join(home, *parts)
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    with open(target, "wb") as file:
                        file.write(archive.read(name))
        open(done, "w").close()
    if home not in sys.path:
        sys.path.insert(0, home)
    importlib.invalidate_caches()
    return home


def enable_widgets() -> bool:
    """Whether live widgets can render here (False while nbgrader runs the notebook).

    On Colab with ipywidgets 8 this first turns on Colab's custom widget manager,
    which ipywidgets 8 needs there; Colab's own ipywidgets 7 renders without it
    (and the custom manager would break some of its core widgets).
    """
    if graded():
        return False
    try:
        import ipywidgets
    except ImportError:
        return False
    if not on_colab():
        return True
    major = int(str(getattr(ipywidgets, "__version__", "7")).split(".")[0])
    if major < 8:
        return True
    if not _custom_widget_manager["on"]:
        try:
            from google.colab import output

            output.enable_custom_widget_manager()
        except Exception:  # noqa: BLE001 - any failure means: explorers show static pictures
            return False
        _custom_widget_manager["on"] = True
    return True


def setup() -> str:
    """After ``fetch_course`` on Colab: make widgets render and say where the helpers are."""
    import attention_course

    folder = os.path.dirname(os.path.dirname(os.path.abspath(attention_course.__file__)))
    live = enable_widgets()
    print(
        f"Course helpers and data ready in {folder}."
        + ("" if live else " Explorers will show static pictures instead of sliders.")
    )
    return folder
