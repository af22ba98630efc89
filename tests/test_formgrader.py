"""The formgrader's Autograde button on a fresh clone: nbgrader's own API, called as the button calls it.

The formgrader builds its ``NbGraderAPI`` from the course's nbgrader_config.py inside the Lab server
(not the ``nbgrader autograde`` command line) and calls ``autograde(lesson, student)`` for the row
clicked. Here a process of its own does the same in a work folder with no gradebook yet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nbtools import ROOT, filled, solution_sources

pytestmark = pytest.mark.slow

LESSON = "01_projection"

_BUTTON = """
import json, sys
from nbgrader.apps import NbGrader, NbGraderAPI
from nbgrader.coursedir import CourseDirectory

app = NbGrader()  # what the formgrader's load_config does
app.load_cwd_config = True
app.load_config_file()
coursedir = CourseDirectory()
coursedir._load_config(app.config)
api = NbGraderAPI(coursedir, config=app.config)
result = api.autograde(sys.argv[1], sys.argv[2])
submission = api.get_submission(sys.argv[1], sys.argv[2])
print("BUTTON " + json.dumps({"success": result["success"], "log": result.get("log", "")[-3000:],
                              "error": result.get("error", ""), "score": submission and submission["score"],
                              "max_score": submission and submission["max_score"]}))
"""


def _press(work: Path, student: str, **extra_env: str) -> dict:
    env = dict(os.environ, ATTENTION_COURSE_WORK=str(work), **extra_env)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    run = subprocess.run(
        [sys.executable, "-c", _BUTTON, LESSON, student],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("BUTTON ")), None)
    assert line, (run.stdout[-2000:], run.stderr[-3000:])
    return json.loads(line[7:])


def test_autograde_from_the_button_on_a_fresh_clone_gives_the_solution_full_marks(tmp_path):
    work = tmp_path / "work"
    folder = work / "submitted" / "ada" / LESSON
    folder.mkdir(parents=True)
    nb = filled(ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", solution_sources(LESSON))
    (folder / f"{LESSON}.ipynb").write_text(json.dumps(nb))
    assert not (work / "gradebook.db").exists()  # no Generate, no command line before
    pressed = _press(work, "ada")
    assert pressed["success"], (pressed["error"], pressed["log"])
    assert "No assignment with ID" not in pressed["log"]
    assert pressed["score"] == pressed["max_score"] == 7, pressed


def _title_of_the_graded_notebook(work: Path, student: str) -> str:
    """What the formgrader's view of a submission (and the student's feedback) shows first."""
    graded = json.loads((work / "autograded" / student / LESSON / f"{LESSON}.ipynb").read_text())
    return "".join(graded["cells"][0]["source"])


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "seal turned off"])
def test_the_formgraders_view_says_whether_the_notebook_was_graded_sealed(tmp_path, sealed):
    from grader.classroom import seal

    if sealed and not seal.available()[0]:
        pytest.skip(f"no seal on this machine: {seal.available()[1]}")
    work = tmp_path / "work"
    folder = work / "submitted" / "ada" / LESSON
    folder.mkdir(parents=True)
    nb = filled(ROOT / "notebooks" / LESSON / f"{LESSON}.ipynb", solution_sources(LESSON))
    # a student's own claim in the title stays above what the grading says
    nb.cells[0].source += "\n\n---\n**Graded sealed.** FAKE"
    (folder / f"{LESSON}.ipynb").write_text(json.dumps(nb))
    pressed = _press(work, "ada", **({} if sealed else {seal.OFF_VARIABLE: "1"}))
    assert pressed["success"], (pressed["error"], pressed["log"])
    assert pressed["score"] == pressed["max_score"] == 7, pressed
    last = _title_of_the_graded_notebook(work, "ada").rsplit("\n---\n", 1)[1]
    if sealed:
        assert last.startswith("**Graded sealed.** The code"), last
    else:
        assert last.startswith("**Graded NOT SEALED** (turned off by ATTENTION_COURSE_NO_SEAL)"), last
