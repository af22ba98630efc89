"""The classroom tool's parts, each on its own (fast: no kernel, no nbgrader run)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from grader import course
from grader.classroom import collect, feedback, lessons, report, static
from grader.classroom.progress import Progress
from grader.classroom.sandbox import plain
from grader.classroom.trusted import decode, plan, rebuild_error

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
        ("import grader.reference", "mentions the grading package (grader)"),
        ("open('../../gradebook.db', 'w')", "mentions the gradebook"),
        ("get_ipython().set_custom_exc((Exception,), print)", "changes how errors are reported"),
        ("import sys\nf = sys._getframe(1)", "inspects the caller's frames or memory"),
        (
            "%matplotlib inline\nimport numpy\nnumpy.testing.assert_allclose = None",
            "patches numpy.testing.assert_allclose",
        ),
    ],
)
def test_static_scan_names_each_sign(code, sign):
    assert sign in static.scan([code])


def test_static_scan_leaves_honest_code_alone():
    honest = [
        "import torch\nimport math\n\ndef project(X, W_q, W_k, W_v):\n    total = sum([1, 2])\n    return X @ W_q, X @ W_k, X @ W_v",
        "import numpy as np\nA = np.zeros(3)\nA[0] = 1\nresult = {}\nresult['x'] = 2",
        "def broken(:\n    pass",  # a syntax error is not tampering
    ]
    assert static.scan(honest) == []


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
        "import grader": lambda: __import__("grader.reference"),
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


def test_plain_values_survive_weights_only_loading():
    import numpy as np
    import torch

    from grader.classroom.sandbox import dump

    value = (
        torch.ones(2, device="meta"),
        {"a": np.float64(1.5), "b": [1, "x", None]},
        np.zeros(2),
        torch.Size([3]),
    )
    buf = io.BytesIO(dump(plain(value)))
    back = decode(torch.load(buf, weights_only=True))
    assert back[0].device.type == "meta" and back[1] == {"a": 1.5, "b": [1, "x", None]}
    assert type(back[2]).__name__ == "ndarray" and back[3] == (3,)


def test_rebuilt_errors_keep_type_and_message():
    e = rebuild_error({"type": "NotImplementedError", "module": "builtins", "message": ""})
    assert isinstance(e, NotImplementedError)
    e = rebuild_error({"type": "RuntimeError", "module": "builtins", "message": "shape mismatch"})
    assert type(e) is RuntimeError and str(e) == "shape mismatch"
    e = rebuild_error({"type": "StudentError", "module": "__main__", "message": "x"})
    assert type(e).__name__ == "StudentError" and isinstance(e, Exception)


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
