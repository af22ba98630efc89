"""``python -m grader check-sources`` passes the course's lessons and names each broken rule.

Each rule of CONTRIBUTING.md is broken once, in a copy of lesson 04 in a temporary folder, and the
message must name the lesson, the cell (or file) and what to do.
"""

from __future__ import annotations

import re
import shutil

import nbformat
import pytest

from grader import course
from grader.cli import main
from grader.sources import check_lesson, check_sources
from tests.nbtools import ROOT

LESSON = "04_masking"
SOLUTION = ROOT / "solutions" / LESSON / f"{LESSON}.ipynb"


def test_the_solutions_follow_the_rules(capsys):
    assert main(["check-sources"]) == 0
    assert f"{len(course.lessons())} lessons follow the rules" in capsys.readouterr().out


def test_one_lesson_can_be_checked_alone(capsys):
    assert main(["check-sources", LESSON]) == 0
    assert "solutions/: 1 lessons follow the rules" in capsys.readouterr().out
    assert main(["check-sources", "99_nothing"]) == 2
    assert "no such lesson in solutions/: 99_nothing" in capsys.readouterr().out


def _cell(nb, cell_id):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def _rename(nb, grade_id, new):
    cell = _cell(nb, grade_id)
    cell.metadata["nbgrader"]["grade_id"] = cell.id = new


def _points(nb, grade_id, points):
    _cell(nb, grade_id).metadata["nbgrader"]["points"] = points


def _no_hidden(nb, grade_id):
    cell = _cell(nb, grade_id)
    cell.source = re.sub(r"### BEGIN HIDDEN TESTS\n.*?### END HIDDEN TESTS\n", "", cell.source, flags=re.S)


def _move(nb, cell_id, to):
    cell = _cell(nb, cell_id)
    nb.cells.remove(cell)
    nb.cells.insert(to, cell)


def _edit(nb, cell_id, old, new):
    cell = _cell(nb, cell_id)
    assert old in cell.source, (cell_id, old)
    cell.source = cell.source.replace(old, new, 1)


def _append(nb, cell_id, text):
    _cell(nb, cell_id).source += text


def _first_plain_code(nb):
    return next(c for c in nb.cells if c.cell_type == "code" and not c.metadata.get("nbgrader"))


def _plain(nb, text):
    _first_plain_code(nb).source += text


def _output(nb):
    cell = _first_plain_code(nb)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    cell.execution_count = 1


HIDDEN_APPLY = (
    '\n### BEGIN HIDDEN TESTS\nimport grader\ngrader.check("apply_mask", apply_mask)\n### END HIDDEN TESTS\n'
)

# what breaks the rule, and words of the message that must name it
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
        "test05_apply_mask_values: a test cell's id should start with test04_",
    ),
    "a test cell whose id names no function of the lesson": (
        lambda nb: (
            _rename(nb, "test04_apply_mask_values", "test04_values"),
            _edit(nb, "test04_values", 'diagnosed("apply_mask", apply_mask)', 'diagnosed("mix", mix)'),
        ),
        "test04_values: a test cell's id should be test04_<function>_<aspect>",
    ),
    "points that the heading does not state": (
        lambda nb: _points(nb, "test04_apply_mask_values", 3),
        "### 7c. `apply_mask` (6 points): states 6 points, its test cells carry 7",
    ),
    "a test cell under no heading that states points": (
        lambda nb: _move(nb, "test04_causal_mask_shape", 3),
        "test04_causal_mask_shape: lies under no heading that states points",
    ),
    "a title that does not show the total": (
        lambda nb: _edit(nb, "md-01", "**Points: ", "**Points: 1"),
        "first cell: should be the title, showing '**Points: ",
    ),
    "a test cell without points": (
        lambda nb: _points(nb, "test04_padding_mask_values", 0.5),
        "test04_padding_mask_values: should carry whole points above 0",
    ),
    "a test cell without its docstring": (
        lambda nb: setattr(_cell(nb, "test04_causal_mask_values"), "source", "assert True"),
        'test04_causal_mask_values: should open with a """Check that ...""" docstring',
    ),
    "a test cell that is not an Autograded tests cell": (
        lambda nb: _cell(nb, "test04_apply_mask_values").metadata["nbgrader"].update(locked=False),
        "test04_apply_mask_values: should be an 'Autograded tests' cell",
    ),
    "an answer cell that is graded as a test": (
        lambda nb: _cell(nb, "ex04_apply_mask").metadata["nbgrader"].update(grade=True, points=1),
        "ex04_apply_mask: should be an 'Autograded answer' cell",
    ),
    "an answer cell that defines a helper too": (
        lambda nb: _append(nb, "ex04_apply_mask", "\n\ndef fill(S):\n    return S\n"),
        "ex04_apply_mask: defines fill() too: an answer cell defines its graded function alone",
    ),
    "an answer cell without its solution block": (
        lambda nb: _edit(nb, "ex04_apply_mask", "### END SOLUTION", ""),
        "ex04_apply_mask: should hold the model solution between ### BEGIN SOLUTION and ### END SOLUTION",
    ),
    "an answer cell that does not define its function": (
        lambda nb: _edit(nb, "ex04_apply_mask", "def apply_mask(", "def applymask("),
        "ex04_apply_mask: does not define apply_mask()",
    ),
    "an exercise without its answer cell": (
        lambda nb: nb.cells.remove(_cell(nb, "ex04_padding_mask")),
        "padding_mask: no answer cell ex04_padding_mask",
    ),
    "a visible check outside diagnosed": (
        lambda nb: _edit(nb, "test04_apply_mask_values", '"""\nwith', '"""\nassert apply_mask\nwith'),
        'test04_apply_mask_values: line 2 runs outside `with diagnosed("apply_mask", apply_mask):`',
    ),
    "a visible check diagnosed as another function": (
        lambda nb: _edit(
            nb,
            "test04_apply_mask_values",
            'diagnosed("apply_mask", apply_mask)',
            'diagnosed("mask", apply_mask)',
        ),
        'test04_apply_mask_values: diagnosed("mask", apply_mask) should be diagnosed("apply_mask", apply_mask)',
    ),
    "an exercise without a visible check": (
        lambda nb: (
            [
                nb.cells.remove(_cell(nb, cell_id))
                for cell_id in ("test04_apply_mask_values", "test04_apply_mask_softmax")
            ],
            setattr(
                _cell(nb, "test04_apply_mask_hidden"),
                "source",
                _cell(nb, "test04_apply_mask_hidden").source.split("with ")[0],
            ),
        ),
        "apply_mask: no visible check (a test04_apply_mask_* cell with a `with diagnosed(...)` block)",
    ),
    "diagnosed never imported": (
        lambda nb: _edit(nb, "code-02", "diagnosed, ", ""),
        "test04_causal_mask_shape: uses diagnosed before any cell imports it",
    ),
    "a hidden check removed": (
        lambda nb: _no_hidden(nb, "test04_padding_mask_hidden"),
        'padding_mask: no hidden check calling grader.check("padding_mask", padding_mask)',
    ),
    "a hidden check in a visible check's cell": (
        lambda nb: _append(nb, "test04_apply_mask_values", HIDDEN_APPLY),
        "test04_apply_mask_values: the hidden check of apply_mask is one block, in the cell test04_apply_mask_hidden",
    ),
    "a hidden check of another function": (
        lambda nb: _edit(
            nb,
            "test04_apply_mask_hidden",
            'grader.check("apply_mask", apply_mask)',
            'grader.check("causal_mask", causal_mask)',
        ),
        'test04_apply_mask_hidden: its hidden block should call grader.check("apply_mask", apply_mask)',
    ),
    "a hidden block left open": (
        lambda nb: _edit(nb, "test04_apply_mask_hidden", "### END HIDDEN TESTS", ""),
        "test04_apply_mask_hidden: a ### BEGIN HIDDEN TESTS without its ### END HIDDEN TESTS",
    ),
    "a hidden block outside a test cell": (
        lambda nb: _plain(nb, HIDDEN_APPLY),
        "holds a hidden test block: only a test cell (Autograded tests) may",
    ),
    "grader imported outside a hidden block": (
        lambda nb: _append(nb, "test04_apply_mask_values", "\nimport grader\n"),
        "test04_apply_mask_values: names grader outside a hidden test block",
    ),
    "a solution block outside an answer cell": (
        lambda nb: _plain(nb, "\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n"),
        "holds a solution block: only an answer cell (Autograded answer) may",
    ),
    "the Colab cell moved down": (
        lambda nb: _move(nb, "colab-setup", len(nb.cells) - 1),
        "first code cell: should be the Colab setup cell: run `python -m grader.platforms apply`",
    ),
    "outputs kept": (_output, "has outputs: clear them (Edit > Clear Outputs of All Cells) and save"),
    "the summary moved up": (
        lambda nb: _move(nb, "where-you-stand", 5),
        "last cell: should be the code cell 'where-you-stand'",
    ),
    "the summary without an exercise": (
        lambda nb: _edit(nb, "where-you-stand", ', "apply_mask"', ""),
        'where-you-stand: should call where_you_stand("causal_mask", "padding_mask", "apply_mask")',
    ),
    "the summary in another order": (
        lambda nb: _edit(
            nb, "where-you-stand", '"causal_mask", "padding_mask"', '"padding_mask", "causal_mask"'
        ),
        "every graded function, in the order of the answer cells",
    ),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_broken_rule_is_named(what, tmp_path):
    assert check_lesson(SOLUTION) == []
    nb = nbformat.read(SOLUTION, as_version=4)
    breaking, expected = BROKEN[what]
    breaking(nb)
    path = tmp_path / f"{LESSON}.ipynb"
    nbformat.write(nb, path)
    problems = check_lesson(path)
    assert any(p.startswith(f"{LESSON}: ") and expected in p for p in problems), problems


# ----------------------------------------------------------- example cells run the functions inside demo

# example cells added to lesson 04 (example-1, example-2, ...), and what check-sources says of them
EXAMPLES_OUTSIDE_DEMO = {
    "a call": (
        ["S_try = apply_mask(torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool))"],
        "example-1: line 1 uses apply_mask outside demo: put it inside `with demo(apply_mask):`",
    ),
    "a function handed to another": (
        ["if is_implemented(causal_mask, 3):\n    print('ready')"],
        "example-1: line 1 uses causal_mask outside demo",
    ),
    "a helper of an earlier cell, called": (
        ["def masked(S):\n    return apply_mask(S, causal_mask(S.shape[-1]))", "masked(torch.zeros(3, 3))"],
        "example-2: line 1 uses masked (which runs causal_mask, apply_mask) outside demo: "
        "put it inside `with demo(causal_mask, apply_mask):`",
    ),
    "a demo that names another function": (
        ["with demo(causal_mask):\n    apply_mask(torch.zeros(2, 2), causal_mask(2))"],
        "example-1: line 2 uses apply_mask inside a demo(...) that does not name apply_mask",
    ),
}
EXAMPLES_IN_DEMO = {
    "with demo": ["with demo(causal_mask, apply_mask):\n    apply_mask(torch.zeros(2, 2), causal_mask(2))"],
    "a function decorated with demo": [
        "@demo(causal_mask)\ndef show(T=3):\n    print(causal_mask(T))",
        "show(3)",
    ],
    "a helper called inside demo": [
        "def masked(S):\n    return apply_mask(S, causal_mask(S.shape[-1]))",
        "with demo(causal_mask, apply_mask):\n    masked(torch.zeros(3, 3))",
    ],
    "only names and strings": ['print(torch.softmax(torch.zeros(2), dim=-1), "apply_mask")'],
}


def _with_examples(nb, sources):
    """The notebook with one code cell per source (ids example-1, example-2, ...) before its summary."""
    at = nb.cells.index(_cell(nb, "where-you-stand")) - 1
    for i, source in enumerate(sources, start=1):
        nb.cells.insert(at, nbformat.v4.new_code_cell(source, id=f"example-{i}"))
        at += 1


@pytest.mark.parametrize("what", sorted(EXAMPLES_OUTSIDE_DEMO))
def test_an_example_using_a_function_outside_demo_is_named(what, copy):
    """Run All stops at the first broken function an example cell runs outside demo: check-sources says where."""
    sources, expected = EXAMPLES_OUTSIDE_DEMO[what]
    _rewrite(copy / "solutions" / LESSON / f"{LESSON}.ipynb", lambda nb: _with_examples(nb, sources))
    problems = check_sources(copy)
    assert any(p.startswith(f"{LESSON}: {expected}") for p in problems), problems


@pytest.mark.parametrize("what", sorted(EXAMPLES_IN_DEMO))
def test_an_example_using_the_functions_inside_demo_passes(what, tmp_path):
    nb = nbformat.read(SOLUTION, as_version=4)
    _with_examples(nb, EXAMPLES_IN_DEMO[what])
    nbformat.write(nb, tmp_path / f"{LESSON}.ipynb")
    assert check_lesson(tmp_path / f"{LESSON}.ipynb") == []


# ----------------------------------------------------------- the lesson's files around its notebook


@pytest.fixture
def copy(tmp_path):
    """A course folder holding lesson 04: its solution and student notebooks (the course's own code)."""
    for folder in ("solutions", "notebooks"):
        shutil.copytree(ROOT / folder / LESSON, tmp_path / folder / LESSON)
    assert check_sources(tmp_path) == []
    return tmp_path


def _with_module(root, edit=lambda text: text):
    """The copy gets grader/lessons/ of its own, holding lesson 04's module as ``edit`` leaves it."""
    lessons = root / "grader" / "lessons"
    lessons.mkdir(parents=True)
    text = (ROOT / "grader" / "lessons" / f"l{LESSON}.py").read_text()
    (lessons / f"l{LESSON}.py").write_text(edit(text))


def _rewrite(path, change):
    nb = nbformat.read(path, as_version=4)
    change(nb)
    nbformat.write(nb, path)


def test_a_notebook_named_unlike_its_folder_is_named(copy):
    (copy / "solutions" / LESSON / f"{LESSON}.ipynb").rename(copy / "solutions" / LESSON / "masking.ipynb")
    assert check_sources(copy) == [
        f"{LESSON}: solutions/{LESSON}/masking.ipynb: a lesson is solutions/NN_topic/NN_topic.ipynb "
        "(two digits, folder and file named alike): every tool skips this notebook"
    ]


def test_a_lesson_number_used_twice_is_named(copy):
    other = copy / "solutions" / "04_masks"
    other.mkdir()
    shutil.copy(SOLUTION, other / "04_masks.ipynb")
    problems = check_sources(copy)
    assert any("lesson number 04 is used by ['04_masking', '04_masks']" in p for p in problems), problems


def test_a_lesson_without_its_module_is_named(copy):
    (copy / "grader" / "lessons").mkdir(parents=True)
    problems = check_sources(copy)
    assert f"{LESSON}: grader/lessons/l{LESSON}.py: missing: it holds the lesson's reference" in problems[0]


def test_a_lesson_module_without_exercises_is_named(copy):
    _with_module(copy, lambda text: text.replace("EXERCISES", "ALL"))
    problems = check_sources(copy)
    assert any(f"grader/lessons/l{LESSON}.py: defines no EXERCISES" in p for p in problems), problems


def test_a_lesson_module_importing_a_later_lesson_is_named(copy):
    _with_module(copy, lambda text: text + "\nfrom grader.lessons.l05_softmax import softmax  # noqa\n")
    problems = check_sources(copy)
    assert (
        f"{LESSON}: grader/lessons/l{LESSON}.py: imports grader.lessons.l05_softmax; a lesson module imports "
        "only grader.harness, grader.lessons._common and earlier lessons"
    ) in problems


def test_a_missing_student_version_is_named(copy):
    shutil.rmtree(copy / "notebooks")
    assert check_sources(copy) == [
        f"{LESSON}: notebooks/{LESSON}/{LESSON}.ipynb: missing: run `python -m grader build` and commit notebooks/"
    ]


def test_a_stale_student_version_is_named(copy):
    _rewrite(copy / "solutions" / LESSON / f"{LESSON}.ipynb", lambda nb: _plain(nb, "\nprint('new')\n"))
    problems = check_sources(copy)
    assert len(problems) == 1 and problems[0].startswith(
        f"{LESSON}: notebooks/{LESSON}/{LESSON}.ipynb: cell "
    )
    assert problems[0].endswith("is stale: run `python -m grader build` and commit notebooks/")
    _rewrite(
        copy / "solutions" / LESSON / f"{LESSON}.ipynb",
        lambda nb: nb.cells.insert(3, nbformat.v4.new_markdown_cell("new")),
    )
    assert any("its cells are not the solution's" in p for p in check_sources(copy))


def test_stale_badges_and_colab_cell_are_named(copy):
    def stale(nb):
        _edit(nb, "md-01", "colab-badge.svg", "old-badge.svg")
        _edit(nb, "colab-setup", "does nothing", "does little")

    _rewrite(copy / "solutions" / LESSON / f"{LESSON}.ipynb", stale)
    problems = check_sources(copy)
    fix = "run `python -m grader.platforms apply`"
    assert f"{LESSON}: first cell: lacks the current Colab and Binder badges: {fix}" in problems
    assert f"{LESSON}: first code cell: is not the current Colab setup cell: {fix}" in problems


def test_a_stale_mistakes_doc_is_named(copy):
    (copy / "docs").mkdir()
    (copy / "docs" / "mistakes.md").write_text((ROOT / "docs" / "mistakes.md").read_text() + "\nextra\n")
    assert check_sources(copy) == ["course: docs/mistakes.md: out of date: run `python -m grader.mistakes`"]


def test_fix_ids_gives_each_nbgrader_cell_its_grade_id(copy):
    """A cell made in JupyterLab gets a random id; --fix-ids sets it to the grade id."""
    from grader.sources import fix_cell_ids

    path = copy / "solutions" / LESSON / f"{LESSON}.ipynb"
    _rewrite(path, lambda nb: setattr(_cell(nb, "ex04_apply_mask"), "id", "3f2a9c1e"))
    assert any("ex04_apply_mask: cell id '3f2a9c1e' differs" in p for p in check_sources(copy))
    assert fix_cell_ids(copy) == [f"{LESSON}: 1 cell ids set to their grade ids"]
    assert _cell(nbformat.read(path, as_version=4), "ex04_apply_mask").id == "ex04_apply_mask"
    assert check_sources(copy) == []
