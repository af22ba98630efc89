"""``python -m grader check-sources`` passes the course's solutions and names each broken rule."""

from __future__ import annotations

import re

import nbformat
import pytest

from grader.cli import main
from grader.sources import check_lesson
from tests.nbtools import ROOT

LESSON = "04_masking"


def test_the_solutions_follow_the_rules(capsys):
    assert main(["check-sources"]) == 0
    assert "11 lessons follow the rules" in capsys.readouterr().out


def _cell(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _rename(nb, grade_id, new):
    cell = _cell(nb, grade_id)
    cell.metadata["nbgrader"]["grade_id"] = cell.id = new


def _points(nb, grade_id, points):
    _cell(nb, grade_id).metadata["nbgrader"]["points"] = points


def _no_hidden(nb, grade_id):
    cell = _cell(nb, grade_id)
    cell.source = re.sub(r"### BEGIN HIDDEN TESTS\n.*?### END HIDDEN TESTS\n", "", cell.source, flags=re.S)


def _colab_last(nb):
    colab = next(c for c in nb.cells if "# @title Run me first" in c.source)
    nb.cells.remove(colab)
    nb.cells.append(colab)


BROKEN = {
    "a grade id used twice": (
        lambda nb: (
            _cell(nb, "test04_causal_mask_values")
            .metadata["nbgrader"]
            .update(grade_id="test04_causal_mask_shape")
        ),
        "test04_causal_mask_shape: grade id used twice",
    ),
    "an answer cell named for another lesson": (
        lambda nb: _rename(nb, "ex04_apply_mask", "ex05_apply_mask"),
        "ex05_apply_mask: an answer cell's id should be ex04_<function>",
    ),
    "a test cell named for another lesson": (
        lambda nb: _rename(nb, "test04_apply_mask_values", "test05_apply_mask_values"),
        "a test cell's id should start with test04_",
    ),
    "points that the heading does not state": (
        lambda nb: _points(nb, "test04_apply_mask_values", 3),
        "### 7c. `apply_mask` (6 points): states 6 points, its test cells carry 7",
    ),
    "a test cell without points": (
        lambda nb: _points(nb, "test04_padding_mask_values", 0.5),
        "test04_padding_mask_values: should carry whole points above 0",
    ),
    "a hidden check removed": (
        lambda nb: _no_hidden(nb, "test04_padding_mask_hidden"),
        'padding_mask: no hidden check calling grader.check("padding_mask", padding_mask)',
    ),
    "the Colab cell moved down": (_colab_last, "first code cell: should be the Colab setup cell"),
    "a test cell without its docstring": (
        lambda nb: setattr(_cell(nb, "test04_causal_mask_values"), "source", "assert True"),
        'test04_causal_mask_values: should open with a """Check that ...""" docstring',
    ),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_broken_rule_is_named(what, tmp_path):
    nb = nbformat.read(ROOT / "solutions" / LESSON / f"{LESSON}.ipynb", as_version=4)
    assert check_lesson(ROOT / "solutions" / LESSON / f"{LESSON}.ipynb") == []
    breaking, expected = BROKEN[what]
    breaking(nb)
    path = tmp_path / f"{LESSON}.ipynb"
    nbformat.write(nb, path)
    problems = check_lesson(path)
    assert any(expected in p for p in problems), problems


def test_fix_ids_gives_each_nbgrader_cell_its_grade_id(tmp_path):
    """A cell made in JupyterLab gets a random id; --fix-ids sets it to the grade id."""
    from grader.sources import check_sources, fix_cell_ids

    nb = nbformat.read(ROOT / "solutions" / LESSON / f"{LESSON}.ipynb", as_version=4)
    _cell(nb, "ex04_apply_mask").id = "3f2a9c1e"
    path = tmp_path / "solutions" / LESSON / f"{LESSON}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    assert any("ex04_apply_mask: cell id '3f2a9c1e' differs" in p for p in check_sources(tmp_path))
    assert fix_cell_ids(tmp_path) == [f"{LESSON}: 1 cell ids set to their grade ids"]
    assert _cell(nbformat.read(path, as_version=4), "ex04_apply_mask").id == "ex04_apply_mask"
    assert check_sources(tmp_path) == []
