"""Colab: the setup cell, the badges, and a lesson run on a simulated Colab runtime, offline.

Colab is simulated by a kernel that imports a stand-in ``google.colab`` at start (as
Colab's kernel does) and cannot see this checkout's packages; the course is "downloaded"
from a local zip laid out like GitHub's archive of the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from attention_course import colab
from grader import course, platforms
from tests.nbtools import ROOT, filled, run_in_kernel, solution_sources

LESSON = "01_projection"
EXAMPLE = platforms.Settings("https://github.com/example-org/attention-course", "spring-2027")

SITECUSTOMIZE = '''
"""Make this interpreter look like a Google Colab runtime."""
import os
import sys

# Colab's kernel has never seen the course: hide this checkout's editable install.
hidden = os.environ.get("HIDE_COURSE_CHECKOUT", "")
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path[:] = [p for p in sys.path if not hidden or os.path.abspath(p or ".") != hidden]

import google.colab  # noqa: E402,F401 - Colab's kernel imports it at start
'''

OUTPUT_MODULE = '''
"""Stand-in for google.colab.output: records that the custom widget manager was enabled."""
import os


def enable_custom_widget_manager():
    with open(os.environ["FAKE_COLAB_LOG"], "a") as log:
        log.write("enable_custom_widget_manager\\n")
'''


# ----------------------------------------------------------------- fixtures


@pytest.fixture
def fake_colab(tmp_path):
    """A folder that, on PYTHONPATH, turns any Python started with it into a simulated Colab runtime."""
    root = tmp_path / "colab_runtime"
    (root / "google" / "colab").mkdir(parents=True)
    (root / "google" / "__init__.py").write_text("")
    (root / "google" / "colab" / "__init__.py").write_text('"""Stand-in for Colab\'s package."""\n')
    (root / "google" / "colab" / "output.py").write_text(OUTPUT_MODULE)
    (root / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return root


@pytest.fixture
def course_zip(tmp_path):
    """The repository as GitHub's archive would serve it, plus things the cell must ignore."""
    path = tmp_path / "attention-course-spring-2027.zip"
    top = "attention-course-spring-2027/"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(top, "")
        for folder in ("attention_course", "data", "grader"):
            for file in sorted((ROOT / folder).rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts:
                    z.write(file, top + file.relative_to(ROOT).as_posix())
        z.write(ROOT / "README.md", top + "README.md")
        z.writestr(top + "data/../../escaped.txt", "must not be written outside the course folder")
    return path


def colab_env(fake_colab: Path, home: Path, source: Path | str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NBGRADER", "ATTENTION_COURSE"))}
    env.update(
        PYTHONPATH=str(fake_colab),
        HIDE_COURSE_CHECKOUT=str(ROOT),
        HOME=str(home),
        ATTENTION_COURSE_SOURCE=str(source),
        FAKE_COLAB_LOG=str(home / "colab.log"),
        **extra,
    )
    return env


def run_python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True)


# ----------------------------------------------------------------- the setup cell, alone


def test_setup_cell_is_generated_from_the_setting():
    source = platforms.setup_cell_source(EXAMPLE)
    compile(source, "setup cell", "exec")
    assert source.startswith("# @title "), "Colab shows a titled, folded form for the cell"
    assert 'fetch_course("https://github.com/example-org/attention-course", "spring-2027")' in source
    assert 'if "google.colab" in sys.modules and not os.environ.get("NBGRADER_EXECUTION"):' in source
    assert "pip install" not in source, "Colab already has torch, numpy, matplotlib, ipywidgets: install none"
    cell = platforms.setup_cell(EXAMPLE)
    assert cell.id == "colab-setup" and cell.metadata["cellView"] == "form"
    assert cell.metadata["nbgrader"]["locked"] and not cell.metadata["nbgrader"]["grade"]


def test_setup_cell_does_nothing_outside_colab(tmp_path, course_zip):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBGRADER")}
    env.update(HOME=str(tmp_path), ATTENTION_COURSE_SOURCE=str(course_zip))
    result = run_python(platforms.setup_cell_source(EXAMPLE), env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""
    assert not (tmp_path / ".attention-course").exists(), "nothing may be downloaded outside Colab"


@pytest.mark.parametrize("mode", ["autograde", "validate"])
def test_setup_cell_does_nothing_while_nbgrader_runs_it_even_on_colab(tmp_path, fake_colab, course_zip, mode):
    env = colab_env(fake_colab, tmp_path, course_zip, NBGRADER_EXECUTION=mode)
    result = run_python(platforms.setup_cell_source(EXAMPLE), env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""
    assert not (tmp_path / ".attention-course").exists()


def test_setup_cell_on_colab_fetches_only_helpers_and_data(tmp_path, fake_colab, course_zip):
    env = colab_env(fake_colab, tmp_path, course_zip)
    probe = (
        "\nimport attention_course, attention_course.data as d, importlib.util\n"
        "print('FROM', attention_course.__file__)\n"
        "print('CATS', d.love_cats().tokens)\n"
        "print('GRADER', importlib.util.find_spec('grader'))\n"
    )
    result = run_python(platforms.setup_cell_source(EXAMPLE) + probe, env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    home = tmp_path / ".attention-course" / "spring-2027"
    assert f"Course helpers and data ready in {home}." in result.stdout
    assert f"FROM {home / 'attention_course' / '__init__.py'}" in result.stdout
    assert "CATS ['I', 'love', 'cats']" in result.stdout
    assert "GRADER None" in result.stdout, "the grader is not part of what a student gets"
    assert sorted(p.name for p in home.iterdir()) == [".complete", "attention_course", "data"]
    assert (
        not (tmp_path / "escaped.txt").exists()
        and not (tmp_path / ".attention-course" / "escaped.txt").exists()
    )
    # ipywidgets 8 in this environment: the custom widget manager had to be turned on
    assert (tmp_path / "colab.log").read_text() == "enable_custom_widget_manager\n"


def test_running_the_setup_cell_again_uses_what_it_fetched(tmp_path, fake_colab, course_zip):
    """After a runtime restart the cell runs again: no second download (the source may be gone)."""
    env = colab_env(fake_colab, tmp_path, course_zip)
    first = run_python(platforms.setup_cell_source(EXAMPLE), env, tmp_path)
    assert first.returncode == 0, first.stderr
    course_zip.unlink()
    again = run_python(platforms.setup_cell_source(EXAMPLE) + "\nimport attention_course.data", env, tmp_path)
    assert again.returncode == 0, again.stderr
    assert "Course helpers and data ready" in again.stdout


def test_setup_cell_says_what_to_do_when_the_download_fails(tmp_path, fake_colab):
    env = colab_env(fake_colab, tmp_path, (tmp_path / "nowhere.zip").as_uri())
    result = run_python(platforms.setup_cell_source(EXAMPLE), env, tmp_path)
    assert result.returncode != 0
    assert "Could not download the course from file://" in result.stderr
    assert "Check that this runtime is connected to the internet" in result.stderr
    assert not (tmp_path / ".attention-course" / "spring-2027" / ".complete").exists()


def test_student_helpers_need_nothing_colab_lacks():
    """Colab ships PyTorch, NumPy, matplotlib, ipywidgets and IPython: the helpers import nothing else."""
    import ast

    colab_has = {"torch", "numpy", "matplotlib", "ipywidgets", "IPython", "google", "attention_course"}
    for path in sorted((ROOT / "attention_course").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in colab_has, f"{path.name} imports {name}"


def test_fetch_course_reads_a_folder_too(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(colab.SOURCE_ENV, str(ROOT))
    monkeypatch.setattr(sys, "path", list(sys.path))
    home = Path(colab.fetch_course(EXAMPLE.repository, "main"))
    assert home == tmp_path / ".attention-course" / "main" and sys.path[0] == str(home)
    assert (home / "data" / "love_cats.json").is_file() and (home / "attention_course" / "colab.py").is_file()
    assert not (home / "grader").exists()


# ----------------------------------------------------------------- widgets


@pytest.fixture
def in_colab(monkeypatch, tmp_path):
    """google.colab importable and imported, with a stand-in output module that records calls."""
    import types

    calls = []
    google = types.ModuleType("google")
    package = types.ModuleType("google.colab")
    output = types.ModuleType("google.colab.output")
    output.enable_custom_widget_manager = lambda: calls.append("enabled")
    package.output = output
    google.colab = package
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", package)
    monkeypatch.setitem(sys.modules, "google.colab.output", output)
    monkeypatch.setitem(colab._custom_widget_manager, "on", False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    return calls


def test_colab_with_ipywidgets_8_turns_on_the_custom_widget_manager_once(in_colab, monkeypatch):
    import ipywidgets

    monkeypatch.setattr(ipywidgets, "__version__", "8.1.9")
    assert colab.on_colab()
    assert colab.enable_widgets() and colab.enable_widgets()
    assert in_colab == ["enabled"]


def test_colab_with_its_own_ipywidgets_7_needs_nothing(in_colab, monkeypatch):
    import ipywidgets

    monkeypatch.setattr(ipywidgets, "__version__", "7.7.1")
    assert colab.enable_widgets()
    assert in_colab == [], "the custom manager breaks some core widgets under ipywidgets 7"


def test_no_live_widgets_while_graded_or_where_colab_refuses_the_manager(in_colab, monkeypatch):
    import ipywidgets

    monkeypatch.setattr(ipywidgets, "__version__", "8.1.9")
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    assert not colab.enable_widgets() and in_colab == []
    monkeypatch.delenv("NBGRADER_EXECUTION")

    def refuse():
        raise RuntimeError("no custom widget manager here")

    monkeypatch.setattr(sys.modules["google.colab.output"], "enable_custom_widget_manager", refuse)
    assert not colab.enable_widgets(), "explorers then show their static pictures"


def test_outside_colab_widgets_need_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert not colab.on_colab() and colab.enable_widgets()


# ----------------------------------------------------------------- badges and applying to lessons


def test_badges_open_the_student_notebook_on_colab_and_binder():
    line = platforms.badges(EXAMPLE, "03_scaling")
    assert line == (
        "[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        "(https://colab.research.google.com/github/example-org/attention-course/blob/spring-2027/"
        "notebooks/03_scaling/03_scaling.ipynb) "
        "[![Launch Binder](https://mybinder.org/badge_logo.svg)]"
        "(https://mybinder.org/v2/gh/example-org/attention-course/spring-2027"
        "?urlpath=lab%2Ftree%2Fnotebooks%2F03_scaling%2F03_scaling.ipynb)"
    )
    table = platforms.lesson_table(EXAMPLE)
    for lesson in course.lessons():
        assert f"blob/spring-2027/notebooks/{lesson}/{lesson}.ipynb" in table


@pytest.mark.parametrize(
    "address", ["https://gitlab.com/a/b", "git@github.com:a/b.git", "https://github.com/only-owner"]
)
def test_the_setting_must_be_a_github_repository(address):
    with pytest.raises(ValueError, match="GitHub address"):
        platforms.Settings(address)


def test_the_setting_is_read_from_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.attention-course]\nrepository = "https://github.com/example-org/attention-course.git"\n'
    )
    assert platforms.settings(tmp_path) == platforms.Settings(
        "https://github.com/example-org/attention-course"
    )
    assert platforms.settings().repository.startswith("https://github.com/")


@pytest.fixture
def lessons_copy(tmp_path):
    """A copy of the course's solutions/ to apply the platforms to."""
    root = tmp_path / "course"
    shutil.copytree(ROOT / "solutions", root / "solutions")
    return root


def test_apply_puts_badges_and_setup_cell_in_every_lesson_and_is_idempotent(lessons_copy):
    changed = platforms.apply(lessons_copy, EXAMPLE)
    files = sorted((lessons_copy / "solutions").glob("*/*.ipynb"))
    assert changed == files
    snapshot = {p: p.read_bytes() for p in files}
    assert platforms.apply(lessons_copy, EXAMPLE) == [], "a second run changes nothing"
    assert {p: p.read_bytes() for p in files} == snapshot
    assert platforms.problems(lessons_copy, EXAMPLE, folders=("solutions",)) == []

    for path in files:
        original = nbformat.read(ROOT / "solutions" / path.parent.name / path.name, as_version=4)
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        title = nb.cells[0].source
        assert title.count("colab-badge.svg") == 1 and title.count("badge_logo.svg") == 1
        assert title.splitlines()[0] == original.cells[0].source.splitlines()[0], "the title stays first"
        assert platforms.badges(EXAMPLE, path.stem) in title
        assert nb.cells[1].id == "colab-setup" and nb.cells[1].source == platforms.setup_cell_source(EXAMPLE)
        rest = [c.source for c in original.cells[1:] if c.get("id") != "colab-setup"]
        assert [c.source for c in nb.cells[2:]] == rest, "nothing else moves"
        total = sum(c.metadata.get("nbgrader", {}).get("points", 0) for c in nb.cells)
        assert f"**Points: {total}**" in title


def test_apply_refreshes_a_changed_setting_without_duplicating(lessons_copy):
    platforms.apply(lessons_copy, platforms.Settings("https://github.com/old-owner/old-name"))
    platforms.apply(lessons_copy, EXAMPLE)
    for path in sorted((lessons_copy / "solutions").glob("*/*.ipynb")):
        text = path.read_text()
        assert "old-owner" not in text
        nb = nbformat.read(path, as_version=4)
        assert [c.id for c in nb.cells].count("colab-setup") == 1
        assert nb.cells[0].source.count("colab-badge.svg") == 1
    assert platforms.problems(lessons_copy, EXAMPLE, folders=("solutions",)) == []
    assert platforms.problems(
        lessons_copy, platforms.Settings("https://github.com/x/y"), folders=("solutions",)
    )


def test_every_lesson_carries_the_current_badges_and_setup_cell():
    """solutions/ and notebooks/ follow the setting (else: `python -m grader.platforms apply`, then build)."""
    assert platforms.problems() == []


# ----------------------------------------------------------------- a lesson, end to end


def _colab_like_download(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """What File > Download > Download .ipynb gives back: outputs kept, Colab's metadata added."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    nb.metadata["colab"] = {"provenance": [], "name": f"{LESSON}.ipynb"}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nb.metadata["accelerator"] = "GPU"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            cell.metadata["colab"] = {"base_uri": "https://localhost:8080/"}
            cell.metadata["outputId"] = f"{i:08x}-0000-0000-0000-000000000000"
    return nb


@pytest.mark.slow
def test_a_lesson_runs_on_simulated_colab_and_its_download_is_graded_in_full(
    tmp_path, fake_colab, course_zip, monkeypatch
):

    # an instructor's course with the platforms applied, built by nbgrader
    course_root = tmp_path / "course"
    shutil.copytree(ROOT / "solutions" / LESSON, course_root / "solutions" / LESSON)
    shutil.copy(ROOT / "nbgrader_config.py", course_root / "nbgrader_config.py")
    platforms.apply(course_root, EXAMPLE)
    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(tmp_path / "work"))
    release = tmp_path / "release"
    course.build_notebooks(course_root, release_dir=release, only=[LESSON])
    student = nbformat.read(release / LESSON / f"{LESSON}.ipynb", as_version=4)
    setup = student.cells[1]
    assert setup.id == "colab-setup" and setup.source == platforms.setup_cell_source(EXAMPLE)
    assert setup.metadata["cellView"] == "form" and setup.metadata["jupyter"]["source_hidden"]
    assert setup.metadata.get("editable") is False and setup.metadata.get("deletable") is False

    # a student opens it on Colab (nothing of this checkout visible), does the work, runs it all
    content = tmp_path / "content"
    content.mkdir()
    nbformat.write(
        filled(release / LESSON / f"{LESSON}.ipynb", solution_sources(LESSON)), content / "lesson.ipynb"
    )
    nb = nbformat.read(content / "lesson.ipynb", as_version=4)
    with monkeypatch.context() as m:
        for key, value in colab_env(fake_colab, tmp_path / "home", course_zip).items():
            m.setenv(key, value)
        m.delenv("ATTENTION_COURSE_WORK")
        (tmp_path / "home").mkdir()
        nb.cells.append(
            nbformat.v4.new_code_cell("import attention_course, sys; print(attention_course.__file__)")
        )
        run_in_kernel(nb, content)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", f"{cell.id}: {out.get('ename')}: {out.get('evalue')}"
            assert not (out.output_type == "stream" and out.name == "stderr"), f"{cell.id}: {out.text}"
    assert "Course helpers and data ready" in nb.cells[1].outputs[0].text
    fetched = tmp_path / "home" / ".attention-course" / "spring-2027"
    assert nb.cells[-1].outputs[0].text.strip() == str(fetched / "attention_course" / "__init__.py")
    nb.cells.pop()

    # ... downloads it and hands it in: nbgrader grades it like any other submission
    dest = course.submission_path(LESSON, "colab_student")
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(_colab_like_download(nb), dest)
    result = course.autograde(LESSON, "colab_student", root=course_root)
    assert result["max_score"] > 0 and result["score"] == result["max_score"], result["grades"]
    graded = nbformat.read(course.autograded_path(LESSON, "colab_student"), as_version=4)
    assert graded.cells[1].outputs == [], "while grading, the setup cell does nothing and prints nothing"
