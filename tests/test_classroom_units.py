"""The classroom tool's parts, each on its own (fast: no kernel, no nbgrader run)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from grader import course
from grader.classroom import executors, grading, lessons, tamper_scan
from grader.classroom.progress import Progress
from grader.classroom.proxies import _changed_inputs, _write_back, decode, rebuild_error
from grader.classroom.sandbox import plain
from grader.classroom.trusted import plan, up_to_last_test
from grader.instructor import collect, feedback, report
from tests.procs import running

# ------------------------------------------------------------------ static signs of tampering


@pytest.mark.parametrize(
    ("code", "sign"),
    [
        ("import numpy as np\nnp.allclose = lambda *a, **k: True", "patches numpy.allclose"),
        ("import torch\ntorch.isclose = None", "patches torch.isclose"),
        ("from torch import testing as tt\ntt.assert_close = print", "patches torch.testing.assert_close"),
        ("import torch\ntorch.Tensor.any = lambda self: False", "patches torch.Tensor.any"),
        ("import math\nsetattr(math, 'isclose', max)", "patches math.isclose"),
        ("import builtins\nbuiltins.AssertionError = Warning", "patches builtins.AssertionError"),
        ("isinstance = lambda *a: True", "rebinds the built-in isinstance"),
        ("import sys\nsys.modules['grader'] = object()", "replaces a module in sys.modules"),
        ("import grader.lessons.l01_projection", "mentions the grading package (grader)"),
        ("open('../../gradebook.db', 'w')", "mentions the gradebook"),
        ("get_ipython().set_custom_exc((Exception,), print)", "changes how errors are reported"),
        ("import sys\nf = sys._getframe(1)", "inspects the caller's frames or memory"),
        (
            "%matplotlib inline\nimport numpy\nnumpy.testing.assert_allclose = None",
            "patches numpy.testing.assert_allclose",
        ),
        (
            "import importlib\nst = importlib.import_module('attention_course.explorers.stages')",
            "imports the explorers' internals (attention_course.explorers.stages)",
        ),
        (
            "ch = __import__('attention_course.explorers', fromlist=['choosing'])",
            "imports the explorers' internals (attention_course.explorers.choosing)",
        ),
        ("import builtins\nbuiltins.__import__ = print", "patches builtins.__import__"),
        ("name = 'tor' + 'ch'\nt = __import__(name)", "imports a module by a computed name"),
        # _posixsubprocess raises no audit event (the guard cannot see it start a program): the scan names it
        ("import _posixsubprocess\n_posixsubprocess.fork_exec", "starts other programs"),
        ("import os\nos.posix_spawnp('/bin/sh', ['sh'], {})", "starts other programs"),
    ],
)
def test_static_scan_names_each_sign(code, sign):
    assert sign in tamper_scan.scan([code])


def test_static_scan_leaves_honest_code_alone():
    honest = [
        "import torch\nimport math\n\ndef project(X, W_q, W_k, W_v):\n    total = sum([1, 2])\n    return X @ W_q, X @ W_k, X @ W_v",
        "import numpy as np\nA = np.zeros(3)\nA[0] = 1\nresult = {}\nresult['x'] = 2",
        "def broken(:\n    pass",  # a syntax error is not tampering
        # a standard module imported by the built-in function is not a change to the import system
        "def softmax(Z, dim=-1):\n    exp = __import__('math').exp\n    return Z.apply_(exp)",
        "import importlib\nnp = importlib.import_module('numpy')",
    ]
    assert tamper_scan.scan(honest) == []


# ------------------------------------------------------------------ the guard, in a process of its own


def _run_guarded(body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(course.ROOT)!r})
        from grader.classroom import guard
        protected = {str(tmp_path / "work")!r}
        guard.install(guard.policy([protected], write_only_in=[{str(tmp_path / "scratch")!r}],
                                   deny_imports=("grader",), strict=True))
        sys.meta_path.insert(0, guard.BlockImports(("grader",)))
        """
    ) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def test_guard_refuses_the_gradebook_the_work_folder_programs_and_grader(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "scratch").mkdir()
    (tmp_path / "work" / "gradebook.db").write_text("")
    body = """
    import os, sqlite3, subprocess
    checks = {
        "read work": lambda: open(os.path.join(protected, "gradebook.db")).read(),
        "sqlite": lambda: sqlite3.connect(os.path.join(protected, "gradebook.db")),
        "gradebook by name": lambda: open("/tmp/any/gradebook.db", "w"),
        "list work": lambda: os.listdir(protected),
        "write outside scratch": lambda: open(os.path.join(protected, "..", "x.txt"), "w"),
        "subprocess": lambda: subprocess.run(["true"]),
        "system": lambda: os.system("true"),
        "import grader": lambda: __import__("grader.lessons.l01_projection"),
        "signal a process": lambda: os.kill(1, 0),
    }
    for name, fn in checks.items():
        try:
            fn()
            print("ALLOWED", name)
        except (PermissionError, ImportError):
            print("refused", name)
    open(os.path.join(sys.argv[0] if False else protected + "/../scratch/ok.txt"), "w").write("fine")
    print("scratch ok")
    """
    out = _run_guarded(body, tmp_path)
    assert "ALLOWED" not in out.stdout, out.stdout + out.stderr
    assert out.stdout.count("refused") == 9 and "scratch ok" in out.stdout, out.stdout + out.stderr


# ------------------------------------------------------------------ values across the sandbox boundary


def test_plain_values_survive_the_way_back_from_the_sandbox():
    import numpy as np
    import torch

    from grader.classroom.sandbox import dump, load

    value = (
        torch.ones(2, device="meta"),
        {"a": np.float64(1.5), "b": [1, "x", None]},
        np.zeros(2),
        torch.Size([3]),
    )
    back = decode(load(dump(plain(value))))
    assert back[0].device.type == "meta" and back[1] == {"a": 1.5, "b": [1, "x", None]}
    assert type(back[2]).__name__ == "ndarray" and back[3] == (3,)


def _wire(tree: object, tail: bytes = b"") -> bytes:
    """A message as a sandbox could write it by hand: the wire's header, a JSON tree, tensors' bytes."""
    import json
    import struct

    doc = json.dumps(tree).encode()
    return b"ACW1" + struct.pack("<Q", len(doc)) + doc + tail


@pytest.mark.parametrize("dtype", ["qint8", "quint8", "qint32", "quint4x2", "float8_e4m3fn", "bits8"])
def test_the_wire_builds_no_tensor_of_a_dtype_it_does_not_carry(dtype):
    """A qint8 tensor built from a sandbox's bytes ended the trusted process (a segmentation fault): every
    check of the notebook 'could not be run outside the notebook', unflagged. Such bytes are refused."""
    from grader.classroom.wire import load

    with pytest.raises(ValueError, match="do not fit"):
        load(_wire(["d", "value", ["T", 0, dtype, [1], "cpu", False, 1]], b"\0"))


def test_the_wire_builds_no_dict_whose_keys_share_a_hash():
    """20,000 int keys of one hash (multiples of 2**61 - 1) took 6 s to read and 12 s more to decode, a
    notebook's time limit for a few MB; a key whose hash can be chosen is refused, and plain keys come."""
    from grader.classroom.wire import dump, load

    p = (1 << 61) - 1
    with pytest.raises(ValueError, match="hash"):
        load(_wire(["d", "value", ["d"] + [x for k in range(1, 20_001) for x in (k * p, 0)]]))
    with pytest.raises(ValueError, match="hash"):
        load(_wire(["d", 0.5, 1]))
    value = {"W_q": 1, 2: None, (1, "x"): True, None: 3, -5: "y"}
    assert load(dump(plain(value))) == value


def test_rebuilt_errors_keep_type_and_message():
    e = rebuild_error({"type": "NotImplementedError", "module": "builtins", "message": ""})
    assert isinstance(e, NotImplementedError)
    e = rebuild_error({"type": "RuntimeError", "module": "builtins", "message": "shape mismatch"})
    assert type(e) is RuntimeError and str(e) == "shape mismatch"
    e = rebuild_error({"type": "StudentError", "module": "__main__", "message": "x"})
    assert type(e).__name__ == "StudentError" and isinstance(e, Exception)


def test_a_value_from_the_sandbox_comes_without_state_of_its_own_and_a_loop_is_opaque():
    """``torch.load`` gives a tensor the attributes its answer names: one that made ``__reduce_ex__`` a number
    could not be handed back to the student's next call, and the check fell back on the notebook's own
    verdict ("checked in the notebook only"). A list that holds itself made the trusted side recurse until
    it ended, and every check read "time limit". Both now come as data."""
    import torch

    t = torch.arange(3.0)
    t.__dict__["__reduce_eX__"] = 5  # renamed in the bytes below: saving it under its own name would fail
    buffer = io.BytesIO()
    torch.save({"value": t}, buffer, _use_new_zipfile_serialization=False)
    answer = buffer.getvalue().replace(b"__reduce_eX__", b"__reduce_ex__")
    loaded = torch.load(io.BytesIO(answer), weights_only=True)["value"]
    assert vars(loaded) == {"__reduce_ex__": 5}  # as the answer said
    value = decode(loaded)
    assert not vars(value) and value.tolist() == [0.0, 1.0, 2.0]
    __import__("pickle").dumps(value)
    loop: list = []
    loop.append(loop)
    assert "deeply nested value" in repr(decode(loop, "`Q` is"))


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA device here")
def test_an_expanded_answer_of_another_shape_is_not_made_whole_on_the_gpu():
    """A student's function hands its arguments back after the call (to catch changes made in place).
    One that handed back an input swapped for an expanded tensor of another shape (a few bytes through the
    pipe) had it moved to the input's GPU, where it was made whole: 8 GiB of GPU memory, which no cap of
    the notebook's counts. It is a change the check reports, and nothing that size is made."""
    import torch

    X = torch.zeros(4, 3, device="cuda")
    swapped = torch.zeros(1).expand(1 << 31)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.max_memory_allocated()
    assert "changed its argument `X` in place" in _changed_inputs("project", (X,), [swapped])
    _write_back((X,), [swapped])
    assert torch.cuda.max_memory_allocated() - before < 1 << 20
    assert X.shape == (4, 3)


def test_plan_runs_student_cells_in_step_with_the_lesson():
    src = [
        {"id": "setup", "kind": "context", "source": ""},
        {"id": "ex", "kind": "solution", "source": ""},
        {"id": "t1", "kind": "test", "grade_id": "t1", "source": ""},
        {"id": "later", "kind": "context", "source": ""},
        {"id": "t2", "kind": "test", "grade_id": "t2", "source": ""},
    ]
    stu = [
        {"id": "setup", "kind": "other", "source": ""},
        {"id": "mine", "kind": "other", "source": ""},  # added by the student
        {"id": "ex", "kind": "other", "source": ""},
        {"id": "t1", "kind": "test", "source": ""},
        {"id": "scratch", "kind": "other", "source": ""},
        {"id": "t2", "kind": "test", "source": ""},
        {"id": "end", "kind": "other", "source": ""},
    ]
    steps = [(cell["id"], [c["id"] for c in batch]) for cell, batch in plan(src, stu)]
    assert steps == [
        ("setup", ["setup"]),
        ("t1", ["mine", "ex"]),
        ("later", []),  # the student deleted it: it runs on the trusted side only
        ("t2", ["scratch"]),
        (None, ["end"]),
    ]


# a lesson's cells as plan() takes them: a setup cell, an answer, a test, a demo, a test
LESSON_CELLS = [
    {"id": "setup", "kind": "context", "source": "import torch"},
    {"id": "ex", "kind": "solution", "grade_id": "ex", "source": "def f(): ..."},
    {"id": "t1", "kind": "test", "grade_id": "t1", "source": "assert f()"},
    {"id": "later", "kind": "context", "source": "show(f)"},
    {"id": "t2", "kind": "test", "grade_id": "t2", "source": "assert f() == 1"},
]


def test_plan_finds_the_lessons_cells_in_a_notebook_whose_cell_ids_are_new():
    """Cells pasted into a new notebook, or a notebook saved without cell ids (nbformat 4.4), have ids
    the lesson never gave: every cell of the student's was run after the last test cell, and a right
    answer scored 0, flagged as "passed in the notebook, failed the independent check". The lesson's
    cells are found by grade id, else by their source, and the plan is the one the lesson's ids give."""
    src = LESSON_CELLS
    stu = [
        {"kind": "other", "source": "import torch\n"},
        {"kind": "other", "source": "x = 1"},  # added by the student
        {"kind": "other", "grade_id": "ex", "source": "def f():\n    return 1"},
        {"kind": "test", "grade_id": "t1", "source": "assert f()"},
        {"kind": "other", "source": "show(f)"},
        {"kind": "test", "grade_id": "t2", "source": "assert f() == 1"},
        {"kind": "other", "source": "y = 2"},
    ]
    for ids in ([f"cell-{i}" for i in range(len(stu))], [f"{i:08x}" for i in range(len(stu))]):
        cells = [dict(c, id=i) for c, i in zip(stu, ids)]
        steps = [(cell["id"], [c["id"] for c in batch]) for cell, batch in plan(src, cells)]
        assert steps == [
            ("setup", [ids[0]]),
            ("t1", [ids[1], ids[2]]),
            ("later", [ids[4]]),
            ("t2", []),
            (None, [ids[6]]),
        ], steps


def test_plan_keeps_each_test_where_the_kernel_runs_it():
    """Found by its source, a lesson cell the student moved below the tests (cut and pasted: a new id)
    took the tests after it down with it: they were checked after every cell of the student's, so a wrong
    answer fixed at the end earned their points and a right one followed by a scratch variant lost them.
    And a test was found by its cell id, which a plain cell below the tests could carry (the test itself
    given another): the test is found by its grade id, where the kernel runs it."""
    src = LESSON_CELLS
    moved = [
        {"id": "setup", "kind": "other", "source": "import torch"},
        {"id": "ex", "kind": "other", "grade_id": "ex", "source": "def f(): return 0"},
        {"id": "t1", "kind": "test", "grade_id": "t1", "source": "assert f()"},
        {"id": "t2", "kind": "test", "grade_id": "t2", "source": "assert f() == 1"},
        {"id": "fix", "kind": "other", "source": "def f(): return 1"},
        {"id": "pasted", "kind": "other", "source": "show(f)"},  # the lesson's cell "later", moved
    ]
    steps = [(cell["id"], [c["id"] for c in batch]) for cell, batch in plan(src, moved)]
    assert steps == [
        ("setup", ["setup"]),
        ("t1", ["ex"]),
        ("later", []),
        ("t2", []),
        (None, ["fix", "pasted"]),
    ]
    stolen = [dict(c, id="other") if c["id"] == "t1" else c for c in moved[:4]]
    stolen.append(
        {"id": "t1", "kind": "other", "source": "def f(): return 1"}
    )  # the test's id, on a plain cell
    steps = [(cell["id"], [c["id"] for c in batch]) for cell, batch in plan(src, stolen)]
    assert steps == [("setup", ["setup"]), ("t1", ["ex"]), ("later", []), ("t2", []), (None, ["t1"])]


def test_nothing_after_the_last_test_cell_is_run_again_outside_the_notebook():
    """A lesson ends with demos that time the student's function on long inputs (lesson 11 times
    tiled_attention at T = 2048). They decide no check, and the kernel runs them: the trusted side and
    the sandbox ran them a second time, watched, which tripled the grading time of a slow honest answer."""
    src = [
        {"id": "setup", "kind": "context", "source": ""},
        {"id": "t1", "kind": "test", "grade_id": "t1", "source": ""},
        {"id": "timing", "kind": "context", "source": ""},
        {"id": "t2", "kind": "test", "grade_id": "t2", "source": ""},
        {"id": "demo", "kind": "context", "source": ""},
        {"id": "explorer", "kind": "context", "source": ""},
    ]
    stu = [{"id": c["id"], "kind": c["kind"] if c["kind"] == "test" else "other", "source": ""} for c in src]
    stu.insert(4, {"id": "mine", "kind": "other", "source": ""})  # the student's own, after the last test
    steps = [(cell["id"], [c["id"] for c in batch]) for cell, batch in up_to_last_test(plan(src, stu))]
    assert steps == [("setup", ["setup"]), ("t1", []), ("timing", ["timing"]), ("t2", [])]
    assert up_to_last_test(plan(src[:1], stu[:1])) == []


# IPython changes these plain-Python cells (or they are not Python): the sandbox and the trusted process
# must then run what IPython runs, as the kernel does
IPYTHON_CELLS = [
    "\nx = 1",  # leading blank line: line numbers move up
    "  # note\n  x = 1",  # a common indent, removed
    's = """a\n   \nb"""',  # a line of blanks inside a string: emptied
    "x = 1\n...",  # "..." on the second line: a continuation prompt, stripped
    "y = [1][\n    ...: 2]",  # an IPython continuation prompt on the second line
    "In [1]: x = 2",  # an IPython prompt (and valid Python: an annotation)
    'def f():\n    """\n    >>> f()\n    """\n    return 1',  # a doctest prompt
    "%time x = 3",
    "%%time\nx = 4",
    "x = !echo hi",
    "x?",
    "x = (1,\n2",  # not Python at all
]


def test_a_cell_run_outside_the_kernel_is_the_cell_ipython_runs():
    """The sandbox and the trusted process compile a cell without IPython's transforms only where they
    would change nothing: on every lesson cell and on cells IPython does change, the code is the same."""
    from grader.classroom.sandbox import compile_cell, python_source

    sources = [c.source for les in lessons.all_lessons() for c in les.cells] + IPYTHON_CELLS
    for source in sources:
        try:
            want = compile(python_source(source), "cell", "exec")
        except SyntaxError as e:
            with pytest.raises(SyntaxError) as got:
                compile_cell(source, "cell")
            assert got.value.msg == e.msg, source
            continue
        assert compile_cell(source, "cell") == want, source
    assert compile_cell("x = 1", "cell") == compile("x = 1", "cell", "exec")


# ------------------------------------------------------------------ collecting an LMS export

NB = json.dumps(
    {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {"nbgrader": {"grade_id": "ex01_project"}},
                "source": "",
                "outputs": [],
                "execution_count": None,
            }
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
).encode()


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def test_collect_reads_every_lms_layout_and_drops_nothing(tmp_path):
    export = {
        "smithjane_12345_67890_01_projection.ipynb": NB,  # Canvas
        "smithjane_12345_67891_01_projection-1.ipynb": NB,  # Canvas, a later attempt
        "doejohn_LATE_22345_77890_01_projection.ipynb": NB,
        "Ada Lovelace_555_assignsubmission_file_/01_projection.ipynb": NB,  # Moodle
        "Ada Lovelace_555_assignsubmission_file_/.ipynb_checkpoints/01_projection-checkpoint.ipynb": NB,
        "Lesson 1_bob99_attempt_2024-03-01-10-00-00_01_projection.ipynb": NB,  # Blackboard
        "Lesson 1_bob99_attempt_2024-03-02-10-00-00_01_projection.ipynb": NB,
        "Lesson 1_bob99_attempt_2024-03-02-10-00-00.txt": b"submission details",
        "grace/01_projection.ipynb": NB,  # per-student folders
        "linus/renamed_homework.ipynb": NB,  # lesson recognised from the cells inside
        "alan_turing.zip": _zip({"01_projection.ipynb": NB, "notes.pdf": b"%PDF"}),  # nested zip
        "__MACOSX/._x": b"",
        ".DS_Store": b"",
        "orphan.ipynb": NB,
        "karl/untitled.ipynb": b"{not json",
        "edsger_01_projection.ipynb": NB,
        "broken.zip": b"PK not really",
    }
    path = tmp_path / "export.zip"
    path.write_bytes(_zip(export))
    dest = tmp_path / "submitted"
    rep = collect.collect(path, lesson_ids=["01_projection", "02_scoring"], dest_root=dest)
    # every file of the export is accounted for exactly once
    sources = [o.source for o in rep.outcomes]
    assert len(sources) == len(set(sources))
    assert len(sources) == len(export) + 1  # alan_turing.zip holds two files; broken.zip is one outcome
    placed = {(o.student, o.lesson) for o in rep.by("placed")}
    assert placed == {
        ("smithjane", "01_projection"),
        ("doejohn", "01_projection"),
        ("ada_lovelace", "01_projection"),
        ("bob99", "01_projection"),
        ("grace", "01_projection"),
        ("linus", "01_projection"),
        ("alan_turing", "01_projection"),
        ("edsger", "01_projection"),
    }
    superseded = {o.source.split("!")[-1] for o in rep.by("superseded")}
    assert superseded == {
        "smithjane_12345_67890_01_projection.ipynb",
        "Lesson 1_bob99_attempt_2024-03-01-10-00-00_01_projection.ipynb",
    }
    unmatched = {o.source.split("!")[-1]: o.reason for o in rep.by("unmatched")}
    assert set(unmatched) == {"orphan.ipynb", "karl/untitled.ipynb", "broken.zip"}
    assert "whose" in unmatched["orphan.ipynb"]
    ignored = {o.source.split("!")[-1]: o.reason for o in rep.by("ignored")}
    assert (
        "checkpoint"
        in ignored[
            "Ada Lovelace_555_assignsubmission_file_/.ipynb_checkpoints/01_projection-checkpoint.ipynb"
        ]
    )
    assert "not a notebook" in ignored["notes.pdf"]
    # placed where nbgrader looks, the Blackboard attempt time kept for late penalties
    assert (dest / "bob99" / "01_projection" / "01_projection.ipynb").read_bytes() == NB
    assert (dest / "bob99" / "01_projection" / "timestamp.txt").read_text().startswith("2024-03-02 10:00:00")
    assert "late" in next(o.reason for o in rep.by("placed") if o.student == "doejohn")
    assert "Not matched" in rep.format()


def test_collect_maps_lms_names_through_a_roster(tmp_path):
    (tmp_path / "roster.csv").write_text(
        "id,name,email\ns001,Jane Smith,jsmith@uni.edu\ns002,Ada Lovelace,ada@uni.edu\n"
    )
    path = tmp_path / "export.zip"
    path.write_bytes(
        _zip(
            {
                "Jane Smith_1_assignsubmission_file_/01_projection.ipynb": NB,
                "Ada Lovelace_2_assignsubmission_file_/01_projection.ipynb": NB,
                "Mallory Eve_3_assignsubmission_file_/01_projection.ipynb": NB,
            }
        )
    )
    rep = collect.collect(
        path, roster=tmp_path / "roster.csv", lesson_ids=["01_projection"], dest_root=tmp_path / "s"
    )
    assert {o.student for o in rep.by("placed")} == {"s001", "s002"}
    assert "not on the roster" in rep.by("unmatched")[0].reason


def test_collect_keeps_a_later_submission_already_collected(tmp_path):
    dest = tmp_path / "s" / "bob99" / "01_projection"
    dest.mkdir(parents=True)
    (dest / "01_projection.ipynb").write_text("newer")
    (dest / "timestamp.txt").write_text("2024-04-01 00:00:00")
    path = tmp_path / "export.zip"
    path.write_bytes(_zip({"L1_bob99_attempt_2024-03-02-10-00-00_01_projection.ipynb": NB}))
    rep = collect.collect(path, lesson_ids=["01_projection"], dest_root=tmp_path / "s")
    assert rep.by("superseded") and (dest / "01_projection.ipynb").read_text() == "newer"


# ------------------------------------------------------------------ feedback and report


def test_leak_check_reads_the_page_as_a_student_would():
    les = lessons.lesson("01_projection")
    line = next(ln for ln in les.hidden_lines() if "grader.check" in ln)
    highlighted = "".join(f'<span class="n">{ch}</span>' for ch in line)  # syntax highlighting splits tokens
    assert feedback.leaks(f"<div>{highlighted}</div>", "01_projection")
    assert feedback.leaks("<pre>### BEGIN HIDDEN TESTS</pre>", "01_projection")
    assert not feedback.leaks("<p>Diagnosis: Q was computed with W_k.</p>", "01_projection")
    # a student's own code may contain what a hidden test contains: that is not a leak
    assert not feedback.leaks(f"<pre>{line}</pre>", "01_projection", student_code=line)


def test_class_report_numbers_from_records(tmp_path):
    def rec(student, scores, diag=None, status="graded", flags=(), seconds=1.0):
        cells = [
            {
                "grade_id": f"t{i}",
                "exercise": "project",
                "points": 2.0,
                "score": s,
                "diagnosis": diag if i == 1 else None,
            }
            for i, s in enumerate(scores)
        ]
        return {
            "student": student,
            "lesson": "01_projection",
            "status": status,
            "cells": cells,
            "flags": list(flags),
            "score": sum(scores),
            "max_score": 4.0,
            "seconds": seconds,
        }

    records = [
        rec("a", [2, 2]),
        rec("b", [2, 0], diag="Q was computed with W_k", seconds=9),
        rec("c", [2, 0], diag="Q was computed with W_k", flags=("patches numpy.allclose",)),
        rec("d", [0, 0], status="kernel died"),
    ]
    rep = report.build(records)
    (ex,) = rep.exercises
    assert (ex.submissions, ex.passed, ex.pass_rate) == (4, 1, 0.25)
    assert rep.misconceptions == [("project", "Q was computed with W_k", 2)]
    assert rep.flagged[0]["student"] == "c" and rep.problems[0]["status"] == "kernel died"
    assert rep.slowest[0]["student"] == "b"
    png = report.chart(rep, tmp_path / "chart.png")
    assert png.stat().st_size > 10_000
    assert "| `project` | Q was computed with W_k | 2 |" in report.markdown(rep)


def test_progress_bar_writes_rate_and_eta():
    out = io.StringIO()
    bar = Progress(4, stream=out, every=0)
    for i in range(4):
        bar.update(f"s{i}/01_projection", problem=i == 2)
    text = out.getvalue()
    assert "4/4 graded" in text and "1 need a look" in text and "/min" in text


def test_progress_bar_shows_a_folder_name_escaped():
    """A student folder's name is shown as the last one graded: a carriage return and a terminal's
    erase-line sequence in it wrote over the bar (a folder placed by hand; collect makes safe names)."""
    out = io.StringIO()
    Progress(1, stream=out, every=0).update("ev\r\x1b[2Kil/01_projection")
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue(), repr(out.getvalue())
    assert "ev\\r\\x1b[2Kil/01_projection" in out.getvalue()


def test_size_option_reads_units():
    from grader.cli import _size

    assert (
        _size("4G") == 4 << 30 and _size("512M") == 512 << 20 and _size("2GiB") == 2 << 30 and _size("0") == 0
    )


def test_lesson_reading_finds_graded_names_and_hidden_lines():
    les = lessons.lesson("01_projection")
    assert les.graded_names == ["project"]
    assert {c.grade_id for c in les.tests} == {
        "test01_project_shapes",
        "test01_project_values",
        "test01_project_hidden",
    }
    assert les.checks == {"test01_project_hidden": "project"}
    assert les.exercise_of("test01_project_values") == "project"
    assert 'grader.check("project", project)' in les.hidden_lines()
    assert les.max_score == 7


def test_cli_collect_reports_every_file(tmp_path, monkeypatch, capsys):
    from grader.cli import main

    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(tmp_path / "work"))
    export = tmp_path / "export.zip"
    export.write_bytes(_zip({"grace/01_projection.ipynb": NB, "orphan.ipynb": NB, ".DS_Store": b""}))
    code = main(["collect", str(export), "--lesson", "01_projection"])
    out = capsys.readouterr().out
    assert code == 1  # something was not matched: the instructor must look
    assert "Placed 1 submissions" in out and "orphan.ipynb" in out
    assert (tmp_path / "work" / "submitted" / "grace" / "01_projection" / "01_projection.ipynb").exists()
    assert list((tmp_path / "work" / "classroom").glob("collect-*.csv"))


# ------------------------------------------------------------------ a real Canvas export and its roster

ROSTER = (
    "name,sortable name,email,user id\n"
    'Jane Smith,"Smith, Jane",jsmith@uni.edu,12345\n'
    'John Doe,"Doe, John",jdoe@uni.edu,22345\n'
    'Ada Lovelace,"Lovelace, Ada",alovelace@uni.edu,31337\n'
    'Grace Hopper,"Hopper, Grace",ghopper@uni.edu,41000\n'
)


def _zip_at(files: dict[str, tuple[bytes, tuple]]) -> bytes:
    """A zip whose members carry the times an LMS recorded."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, (data, when) in files.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=when), data)
    return buf.getvalue()


def test_collect_matches_a_canvas_export_to_its_roster(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(tmp_path / "work"))
    (tmp_path / "roster.csv").write_text(ROSTER)
    on_time, late = (2026, 3, 1, 9, 30, 0), (2026, 3, 3, 18, 5, 8)  # zip times: 2 s steps
    export = tmp_path / "submissions.zip"
    export.write_bytes(
        _zip_at(
            {
                "smithjane_12345_901_03_scaling.ipynb": (NB, on_time),  # user id on the roster
                "doejohn_LATE_22345_902_03_scaling-1.ipynb": (NB, late),  # marked late by Canvas
                "lovelaceada_99999_903_Copy_of_03_scaling.ipynb": (NB, on_time),  # id unknown: name
                "Grace Hopper_41000_assignsubmission_file_/03_scaling.ipynb": (NB, on_time),  # Moodle
                "Copy of 03_scaling.ipynb": (NB, on_time),  # names nobody
                "03_scaling (1).ipynb": (NB, on_time),
                "final_03_scaling.ipynb": (NB, on_time),
            }
        )
    )
    dest = tmp_path / "s"
    rep = collect.collect(export, roster=tmp_path / "roster.csv", lesson_ids=["03_scaling"], dest_root=dest)
    placed = {o.source.split("!")[-1]: o.student for o in rep.by("placed")}
    assert placed == {
        "smithjane_12345_901_03_scaling.ipynb": "jsmith",
        "doejohn_LATE_22345_902_03_scaling-1.ipynb": "jdoe",
        "lovelaceada_99999_903_Copy_of_03_scaling.ipynb": "alovelace",
        "Grace Hopper_41000_assignsubmission_file_/03_scaling.ipynb": "ghopper",
    }
    unmatched = {o.source.split("!")[-1] for o in rep.by("unmatched")}
    assert unmatched == {"Copy of 03_scaling.ipynb", "03_scaling (1).ipynb", "final_03_scaling.ipynb"}
    assert not (dest / "copy_of").exists() and sorted(p.name for p in dest.iterdir()) == sorted(
        placed.values()
    )
    # the time recorded in the zip is the submission time nbgrader's late penalties read
    stamp = (dest / "jdoe" / "03_scaling" / "timestamp.txt").read_text()
    assert stamp.startswith("2026-03-03 18:05:08")
    assert "late" in next(o.reason for o in rep.by("placed") if o.student == "jdoe")
    assert (dest / "jsmith" / "03_scaling" / "timestamp.txt").read_text().startswith("2026-03-01 09:30:00")


def test_collect_never_records_a_late_file_as_on_time(tmp_path, monkeypatch):
    from nbgrader.api import Gradebook

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(work))
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}", "course") as gb:
        gb.add_assignment("03_scaling", duedate="2026-03-05 12:00:00")
    export = tmp_path / "submissions.zip"
    # the zip's time is before the due date (another time zone, a re-packed zip): Canvas says late
    export.write_bytes(_zip_at({"doejohn_LATE_22345_902_03_scaling.ipynb": (NB, (2026, 3, 5, 8, 0, 0))}))
    collect.collect(export, lesson_ids=["03_scaling"], dest_root=tmp_path / "s")
    stamp = (tmp_path / "s" / "doejohn" / "03_scaling" / "timestamp.txt").read_text()
    assert stamp.startswith("2026-03-05 12:00:01")


def test_roster_keys_never_pick_between_two_students(tmp_path):
    (tmp_path / "roster.csv").write_text("id,name\ns1,Ann Lee\ns2,Lee Ann\ns3,John Doe\ns4,John Doe\n")
    roster = collect.read_roster(tmp_path / "roster.csv")
    # a name as written wins over another student's name read the other way round
    assert roster.find(["annlee"]) == ("s1", "") and roster.find(["leeann"]) == ("s2", "")
    sid, why = roster.find(["johndoe"])
    assert sid is None and "several students on the roster (s3, s4)" in why


def test_a_canvas_gradebook_export_works_as_a_roster(tmp_path):
    (tmp_path / "grades.csv").write_text(
        "Student,ID,SIS User ID,SIS Login ID,Section,Lesson 3 (123)\n"
        "    Points Possible,,,,,9\n"
        '"Smith, Jane",12345,S-9,jsmith,A,9\n'
        '"Doe, John",22345,S-8,jdoe,A,4\n'
    )
    roster = collect.read_roster(tmp_path / "grades.csv")
    assert roster.find(["12345"]) == ("12345", "") and roster.find(["smithjane"]) == ("12345", "")
    assert roster.find(["jdoe"]) == ("22345", "") and roster.find(["johndoe"]) == ("22345", "")
    assert roster.find(["a"])[0] is None and roster.find(["9"])[0] is None  # sections and grades name nobody


# ------------------------------------------------------------------ cells matched to the release


def _student_nb():
    import nbformat

    return nbformat.read(course.ROOT / "notebooks" / "01_projection" / "01_projection.ipynb", as_version=4)


def _tests_of(nb) -> dict[str, tuple[float, str]]:
    out = {}
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade"):
            assert c.metadata.nbgrader["grade_id"] not in out, "a grade id is held twice"
            out[meta["grade_id"]] = (float(meta["points"]), c.source, bool(meta.get("solution")))
    return out


def _crafted(name: str):
    from tests.class_sim import crafts

    nb = _student_nb()
    edit = {
        "test to answer": crafts._test_to_answer,
        "renamed": crafts._rename,
        "duplicated test": crafts._duplicate_test,
        "duplicated answer": crafts._duplicate_answer,
        "points": crafts._points,
        "no metadata": crafts._strip_metadata,
        "forged": crafts._forged,
    }[name]
    edit(nb)
    return nb


@pytest.mark.parametrize(
    ("craft", "note"),
    [
        ("test to answer", "test01_project_hidden: test cell turned into an answer cell"),
        ("renamed", "grade id 'test01_project_values_mine' the release does not have was removed"),
        ("duplicated test", "test01_project_hidden: test cell duplicated (the copy was removed)"),
        ("duplicated answer", "ex01_project: answer cell duplicated (the copy runs as ordinary code)"),
        ("points", "test01_project_hidden: test cell points changed to 100"),
        ("no metadata", "test01_project_shapes: test cell nbgrader metadata removed (restored)"),
        ("forged", "grade id 'bonus' the release does not have was removed"),
    ],
)
def test_repair_gives_the_release_cells_and_points(craft, note):
    from nbgrader.nbgraderformat import MetadataValidator

    from grader.classroom import cells

    les = lessons.lesson("01_projection")
    nb = _crafted(craft)
    notes = cells.repair(nb, les.release)
    assert any(note in n for n in notes), notes
    MetadataValidator().validate_nb(nb)  # what stopped whole nbgrader runs
    release = {c.name: c for c in les.release if c.is_test}
    held = _tests_of(nb)
    # every test cell still there holds the release's source and points; none is an answer cell
    for gid, (points, source, solution) in held.items():
        assert gid in release and points == release[gid].points and not solution
        assert source in (release[gid].source, release[gid].student_source)
    # a test cell not there now is one nbgrader's restore puts back (RestoreCells.add_missing_grade_cells)
    if craft == "renamed":
        assert set(held) == {"test01_project_shapes"}
    else:
        assert set(held) == set(release)
    answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert [c.metadata.nbgrader["grade_id"] for c in answers] == ["ex01_project"]
    if craft == "duplicated answer":  # the copy still runs, as ordinary code
        assert sum(1 for c in nb.cells if "def project" in c.source) == 2


def test_test_cells_pasted_above_the_answer_leave_the_release_ones_after_it():
    """With no cell id of the lesson's to go by, the copy that runs is the one after the answer, as in the
    release: copies tried out above the answer ran before it was defined and scored 0 of 7."""
    from grader.classroom import cells
    from tests.class_sim import crafts

    nb = _student_nb()
    crafts._tests_pasted_above(nb)
    notes = cells.repair(nb, lessons.lesson("01_projection").release)
    gids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    tests = [i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade")]
    assert len(tests) == 3 and min(tests) > gids.index("ex01_project"), gids
    assert not any(c["id"].startswith("tried-first") for c in nb.cells)
    assert sum("test cell duplicated (the copy was removed)" in n for n in notes) == 3, notes


def test_an_untouched_submission_needs_no_repair():
    from grader.classroom import cells

    nb = _student_nb()
    before = json.dumps(nb, sort_keys=True)
    assert cells.repair(nb, lessons.lesson("01_projection").release) == []
    assert json.dumps(nb, sort_keys=True) == before


# ------------------------------------------------------------------ bounded outputs


def test_a_huge_print_is_cut_to_the_cap_with_a_note():
    import nbformat

    from grader.classroom import cells

    cell = nbformat.v4.new_code_cell("print('x' * 5_000_000)")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="x" * 5_000_000),
        nbformat.v4.new_output("stream", name="stderr", text="warning\n" * 100_000),
        nbformat.v4.new_output("display_data", data={"image/png": "A" * 3_000_000, "text/plain": "<Figure>"}),
        nbformat.v4.new_output(
            "error", ename="ValueError", evalue="v" * 1_000_000, traceback=["t" * 1_000_000]
        ),
    ]
    cut = cells.cap_outputs(cell, 64 * 1024)
    size = len(json.dumps(cell.outputs))
    assert size < 80 * 1024 and cut > 10_000_000  # of 10.8 MB
    kinds = [(o.output_type, o.get("name")) for o in cell.outputs]
    assert ("stream", "stderr") in kinds and ("error", None) in kinds  # what decides a grade stays
    assert (
        f"[output cut: {cut / 2**20:.1f} MB not shown; a cell keeps at most 64.0 KB]" in cell.outputs[-1].text
    )
    once = json.dumps(cell.outputs)
    assert (
        cells.cap_outputs(cell, 64 * 1024) == 0 and json.dumps(cell.outputs) == once
    )  # feedback re-reads it
    small = nbformat.v4.new_code_cell("print(1)")
    small.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    assert cells.cap_outputs(small) == 0 and small.outputs[0].text == "1\n" and len(small.outputs) == 1


# ------------------------------------------------------------------ export verifies the gradebook


def _gradebook_with(work: Path, scores: dict[str, dict[str, float]]) -> None:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{work / 'gradebook.db'}", "attention-step-by-step") as gb:
        gb.add_assignment("01_projection")
        gb.add_notebook("01_projection", "01_projection")
        for gid, points in (("t1", 2), ("t2", 4)):
            gb.add_grade_cell(gid, "01_projection", "01_projection", max_score=points, cell_type="code")
        for student, grades in scores.items():
            gb.add_student(student)
            gb.add_submission("01_projection", student)
            for gid, score in grades.items():
                g = gb.find_grade(gid, "01_projection", "01_projection", student)
                g.auto_score = score
            gb.db.commit()


def test_export_reports_the_tools_grades_and_names_what_was_changed_by_hand(tmp_path, monkeypatch):
    import csv as csv_module
    import sqlite3

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(work))
    _gradebook_with(work, {"ada": {"t1": 2, "t2": 0}, "bob": {"t1": 2, "t2": 4}, "eve": {"t1": 2, "t2": 4}})

    def record(student, t1, t2):
        cells_ = [
            {"grade_id": gid, "exercise": "project", "points": pts, "score": sc}
            for gid, pts, sc in (("t1", 2, t1), ("t2", 4, t2))
        ]
        return {
            "student": student,
            "lesson": "01_projection",
            "score": t1 + t2,
            "max_score": 6,
            "cells": cells_,
        }

    records = [record("ada", 2, 0), record("bob", 2, 4)]  # eve's row: not written by the tool
    rows, problems = report.verify(records)
    assert [(p["student"], p["problem"].split(" (")[0]) for p in problems] == [
        ("eve", "not written by the grading tool")
    ]
    # a submission the tool could not grade is listed too, never dropped
    from grader.classroom.autograde import JobResult

    grading.record_failure(JobResult("carl", "01_projection", "d", "grading failed", error="boom"), "x")
    (failed,) = grading.load_records(["01_projection"])
    assert (failed["student"], failed["status"], failed["max_score"]) == ("carl", "grading failed", 7)
    records.append({**failed, "max_score": 6})
    # the instructor gives ada the hidden check's points in the gradebook (as the formgrader writes them)
    with sqlite3.connect(work / "gradebook.db") as db:
        db.execute(
            "UPDATE grade SET manual_score = 4 WHERE cell_id IN (SELECT id FROM base_cell WHERE name = 't2') "
            "AND notebook_id IN (SELECT sn.id FROM submitted_notebook sn JOIN submitted_assignment sa "
            "ON sn.assignment_id = sa.id WHERE sa.student_id = 'ada')"
        )
    path, problems = report.grades_csv(tmp_path / "grades.csv", records)
    by_student = {r["student_id"]: r for r in csv_module.DictReader(path.open())}
    assert by_student["ada"]["raw_score"] == "6.0"  # the gradebook's: the instructor decides there
    assert by_student["ada"]["gradebook_check"] == "changed by hand: t2: 4 (tool: 0)"
    assert by_student["bob"]["gradebook_check"] == "" and by_student["bob"]["score"] == "6.0"
    assert (
        by_student["eve"]["score"] == ""
        and "not written by the grading tool" in by_student["eve"]["gradebook_check"]
    )
    assert by_student["carl"]["gradebook_check"] == "could not be graded: run grade again"
    assert {p["student"] for p in problems} == {"ada", "carl", "eve"}
    rep = report.build(records)
    rep.gradebook = problems
    md = report.markdown(rep)
    assert "## Gradebook check" in md and "| ada | 01_projection | changed by hand: t2: 4 (tool: 0) |" in md


def test_the_scans_graded_names_are_the_registrys_exercises():
    """The tamper scan reads the graded names from the lessons' sources (a worker never loads
    PyTorch for them); they must be exactly the exercises the hidden reference grades."""
    from grader.registry import exercises

    assert tamper_scan.graded_names() == frozenset(exercises())


def _in_a_new_python(script: str) -> str:
    """What ``script`` prints, run by a Python process of its own (one that has imported nothing yet)."""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=course.ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


def test_a_grading_run_starts_its_workers_before_it_loads_nbgrader_or_pytorch():
    """The coordinator hands out jobs, and a new worker starts its fork servers, without nbgrader or
    PyTorch loaded: each is loaded while the fork servers load PyTorch, not before."""
    script = (
        "import sys\n"
        "from grader import cli\n"
        "from grader.classroom import executors, grading, jobs, servers\n"
        "print(sorted(m for m in ('nbgrader', 'torch', 'nbconvert', 'nbclient') if m in sys.modules))"
    )
    assert _in_a_new_python(script) == "[]"


_FORKED_WORKERS_SCRIPT = r"""
import json, os, sys
from grader.classroom import executors, servers
from tests.procs import running
from tests.worker_facts import facts

out = {"coordinator": os.getpid(), "runs": []}
for value, folder, umask in zip(("first", "second"), sys.argv[1:3], (0o022, 0o077)):
    os.environ["ATTENTION_COURSE_PROBE"] = value
    os.chdir(folder)
    os.umask(umask)
    for workers in (2, 1):
        with executors.LocalExecutor(workers, preload=servers.WORKER_MODULES) as ex:
            results = [r for _, r in ex.run(facts, ["ATTENTION_COURSE_PROBE"] * 4)]
        left = [p for p in {r["parent"] for r in results} if p != os.getpid() and running(p)]
        out["runs"].append([value, folder, umask, workers, results, left])
print(json.dumps(out))
"""


def test_two_workers_are_forked_with_nbgrader_loaded_and_take_the_environment_of_their_run(tmp_path):
    """Two workers or more come from multiprocessing's forkserver, which imported nbgrader once for
    all of them; each has the environment, folder and umask of the run that made its pool, and
    the forkserver ends with the pool, so the next run's workers come from a new one, forked
    from the coordinator as it is then. A single worker is spawned, as before."""
    folders = [tmp_path / "first", tmp_path / "second"]
    for folder in folders:
        folder.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", _FORKED_WORKERS_SCRIPT, *map(str, folders)],
        capture_output=True,
        text=True,
        cwd=course.ROOT,
        env={**os.environ, "PYTHONPATH": str(course.ROOT)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    forkservers = []
    for value, folder, umask, workers, results, left in out["runs"]:
        assert [r["variable"] for r in results] == [value] * 4, (workers, results)
        assert {r["folder"] for r in results} == {folder}, (workers, results)
        assert {r["umask"] for r in results} == {umask}, (workers, results)
        parents = {r["parent"] for r in results}
        if workers == 2:
            assert all(r["nbgrader loaded"] for r in results), results
            assert out["coordinator"] not in parents, "two workers were spawned, not forked"
            assert len(parents) == 1, f"one forkserver for the pool, not {parents}"
            assert not left, f"the forkserver {left} outlived its pool"
            forkservers += parents
        else:
            assert parents == {out["coordinator"]} and not any(r["nbgrader loaded"] for r in results)
    assert len(set(forkservers)) == 2, f"each run has a forkserver of its own, not {forkservers}"


@pytest.mark.parametrize("workers", [1, 2])
def test_a_local_run_leaves_no_private_gradebook_folder_behind(workers):
    """Each worker keeps its private gradebook in a folder of the run's own, whose name no student
    kernel is given; the run removes it when it closes, although its workers are stopped without
    cleaning up."""
    from grader.classroom import servers
    from tests.worker_facts import private_gradebook

    with executors.LocalExecutor(workers, preload=servers.WORKER_MODULES) as ex:
        paths = {Path(p) for _, p in ex.run(private_gradebook, range(2 * workers))}
        area = Path(ex._area)
        assert all(p.parent.parent == area and p.parent.is_dir() for p in paths), (area, paths)
        assert len({p.parent for p in paths}) <= workers
    assert not area.exists(), f"{area} outlived its run"
    assert executors.RUN_AREA not in servers.kernel_env({executors.RUN_AREA: str(area), "HOME": "/h"})


_KILLED_COORDINATOR_SCRIPT = r"""
import os, sys, threading, time
from grader.classroom import executors, servers
from tests.worker_facts import say_then_sleep

workers, when, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ex = executors.LocalExecutor(workers, preload=servers.WORKER_MODULES)
threading.Thread(target=lambda: list(ex.run(say_then_sleep, [folder] * workers)), daemon=True).start()
while ex._pool is None or len(ex._pool._processes or {}) < workers:  # started, not yet ready
    time.sleep(0.01)
while when == "grading" and len(os.listdir(folder)) < workers:  # each one running its job
    time.sleep(0.05)
print(*ex._pool._processes, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("when", ["starting", "grading"])
@pytest.mark.parametrize("workers", [1, 2])
def test_workers_end_when_their_coordinator_is_killed(workers, when, tmp_path):
    """A grading run killed outright (SIGKILL: no clean-up of its own) leaves no worker behind,
    whether the worker was spawned by it or forked from its forkserver, and whether it was still
    starting (before it could ask to go with its parent) or running a job."""
    import signal
    import time

    coordinator = subprocess.Popen(
        [sys.executable, "-c", _KILLED_COORDINATOR_SCRIPT, str(workers), when, str(tmp_path)],
        cwd=course.ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(course.ROOT)},
    )
    try:
        pids = [int(p) for p in coordinator.stdout.readline().split()]
    finally:
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait()
    assert len(pids) == workers, coordinator.stderr.read()
    assert when == "starting" or len(list(tmp_path.iterdir())) == workers
    deadline = time.monotonic() + 15
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if running(p)]
    for pid in left:  # the test leaves nothing behind either
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived the run"


def test_grading_processes_read_notebooks_without_building_the_iri_parser():
    """Importing ``grader`` keeps jsonschema from building its IRI grammar (about 0.9 s in every
    grading process); notebooks still validate, and a broken one is still refused."""
    script = (
        "import sys, grader, nbformat\n"
        f"nb = nbformat.read({str(course.ROOT / 'notebooks' / '01_projection' / '01_projection.ipynb')!r}, 4)\n"
        "nbformat.validate(nb)\n"
        "del nb.cells[0]['source']\n"
        "try:\n"
        "    nbformat.validate(nb)\n"
        "    print('broken notebook accepted')\n"
        "except nbformat.ValidationError:\n"
        "    print('valid, broken refused', sys.modules.get('rfc3987_syntax', 'never imported'))\n"
    )
    assert _in_a_new_python(script) == "valid, broken refused None"


def test_an_answer_is_read_whole_by_its_deadline_or_not_at_all():
    """The trusted side reads a sandbox's answer by a deadline: half a message, or a whole one sent once the
    deadline has passed, is a TimeoutError (a sandbox could stall it, or keep it reading, for ever)."""
    import time

    from grader.classroom.sandbox import receive, send

    r, w = os.pipe()
    try:
        send(w, b"a whole answer")
        assert receive(r, deadline=time.monotonic() + 5) == b"a whole answer"
        send(w, b"sent in time, read too late")
        with pytest.raises(TimeoutError):
            receive(r, deadline=time.monotonic() - 1)
        os.read(r, 1 << 16)
        os.write(w, (100).to_bytes(8, "little") + b"x" * 10)  # a length, and a tenth of the message
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            receive(r, deadline=start + 0.5)
        assert time.monotonic() - start < 3
    finally:
        os.close(r)
        os.close(w)


def test_a_name_of_the_students_error_type_is_cut_short():
    error = rebuild_error({"type": "E" * 1_000_000, "module": "__main__", "message": "no"})
    assert len(type(error).__name__) <= 100 and str(error) == "no"


def test_a_workers_gradebook_engine_reads_the_file_each_job_writes_not_the_last_ones(tmp_path):
    """A grading worker keeps one SQLAlchemy engine per gradebook (what nbgrader's statements compile to
    is kept), while each job replaces its gradebook file: a Gradebook opened after the replacement reads
    the new file, even where an earlier one was never closed."""
    script = textwrap.dedent(
        f"""
        import os, warnings
        warnings.simplefilter("ignore")
        import grader.classroom.preloaded
        from nbgrader.api import Gradebook, MissingEntry
        folder = "{tmp_path}"
        path, url = folder + "/gradebook.db", "sqlite:///" + folder + "/gradebook.db"
        for lesson in ("first", "second"):
            with Gradebook("sqlite:///" + folder + "/" + lesson + ".db") as gb:
                gb.add_assignment(lesson)
        os.rename(folder + "/first.db", path)
        left_open = Gradebook(url)
        left_open.find_assignment("first")
        left_open.db.commit()
        os.replace(folder + "/second.db", path)  # the next job's copy
        with Gradebook(url) as gb:
            print("same engine", gb.engine is left_open.engine)
            print("second", gb.find_assignment("second").name)
            try:
                gb.find_assignment("first")
                print("first still read")
            except MissingEntry:
                print("first gone")
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=course.ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[:3] == ["same engine True", "second second", "first gone"], run.stdout
