"""The independent checks of one notebook: every test cell decided outside its kernel.

What the trusted process (``grader.classroom.trusted``) is asked to decide, starting it (and, sealed,
the student's sandbox it calls), waiting for its verdicts, and stopping or discarding it. They run
while the notebook's kernel starts; ``GuardedExecute`` waits for them before the kernel's first cell.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader import course
from grader.classroom import guard, kernels, lessons, servers
from grader.classroom.context import _CONTEXT
from grader.classroom.jobs import Options, read_regular


def _checks_job(nb: Any) -> dict:
    """What the trusted process is asked to decide for this notebook: its code cells as they will
    run (test cells as nbgrader restores them, hidden blocks included), and the lesson's."""
    ctx = _CONTEXT
    lesson: lessons.Lesson = ctx["lesson"]
    student_cells = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        kind = "test" if meta.get("grade") and not meta.get("solution") else "other"
        student_cells.append(
            {
                "id": cell.get("id") or f"cell-{i}",
                "kind": kind,
                "grade_id": meta.get("grade_id"),
                "source": cell.source,
            }
        )
    return {
        "source_cells": [vars(c) for c in lesson.cells],
        "student_cells": student_cells,
        "graded_names": lesson.graded_names,
        "cell_timeout": ctx["options"].timeout,
        "memory": ctx["options"].memory,  # the trusted process's cap, as the notebook's
        "result_path": str(ctx["root"] / "trusted" / "result.json"),
        "salt": course.case_salt(
            lesson.id, ctx.get("student", ""), [ctx.get("submission") or repr(nb.cells)]
        ),
    }


@dataclass
class _RunningChecks:
    """A notebook's independent checks while they run: the trusted process, and (sealed) its sandbox."""

    trusted: Any
    sandbox: Any | None
    started: float  # time.perf_counter()
    until: float  # time.monotonic() by which they must end
    trusted_dir: Path


RESULT_CAP = 16 << 20  # bytes of the trusted process's verdicts read back (what it writes is far less)

WATCH_OFF = "the rules' watch missed a call it must see: this notebook's code may have switched it off"
WATCH_CHANGED = "changed the rules' watch in its own process (put back for every check)"
WATCH_REVIEW = "the rules' watch could not follow a call (best effort: read the code)"


def _finish_checks() -> None:
    """Wait for the independent checks started for this notebook (if any), and keep their verdicts."""
    ctx = _CONTEXT
    checks: _RunningChecks | None = ctx.pop("checks", None)
    if checks is None:
        return
    ctx["trusted"] = _await_trusted(ctx, checks)
    if (ctx["trusted"] or {}).get("watch_off"):
        ctx["flags"].append(WATCH_OFF)
    if (ctx["trusted"] or {}).get("watch_changed"):
        ctx["flags"].append(f"{WATCH_CHANGED}: {', '.join(sorted(set(ctx['trusted']['watch_changed']))[:6])}")
    for review in (ctx["trusted"] or {}).get("watch_review") or []:
        ctx["flags"].append(f"{WATCH_REVIEW}: {review}")
    ctx["phases"]["independent checks"] = round(time.perf_counter() - checks.started, 3)
    for k, v in ((ctx["trusted"] or {}).get("timings") or {}).items():
        ctx["phases"][f"  {k}"] = v


def _abandon_checks() -> None:
    """Stop the checks of a notebook that ends before they were awaited."""
    checks: _RunningChecks | None = _CONTEXT.pop("checks", None)
    _CONTEXT.pop("checks_job", None)
    if checks is not None:
        for proc in (checks.trusted, checks.sandbox):
            if proc is not None:
                proc.kill()


def _discard_checks() -> None:
    """Stop checks started on cells that are not the ones that will run, and clear what they left, so
    that new ones start as the first did (nothing of the old ones can reach the new verdicts)."""
    checks: _RunningChecks | None = _CONTEXT.get("checks")
    _abandon_checks()
    if checks is None:
        return
    for proc in (checks.trusted, checks.sandbox):
        if proc is not None:
            with contextlib.suppress(Exception):  # one that outlives SIGKILL goes with the job's folders
                proc.wait(timeout=10)
    for path in [checks.trusted_dir / "result.json", checks.trusted_dir / "result.json.tmp"]:
        path.unlink(missing_ok=True)
    box: Path = _CONTEXT.get("box", _CONTEXT["root"])
    for pipe in (box / "pipes").glob("*"):
        pipe.unlink(missing_ok=True)


def _start_checks(ctx: dict, job: dict) -> None:
    """Start the notebook's independent checks on ``job`` (``_checks_job``): fork the trusted process
    (and, sealed, the student's sandbox it talks to); ``_finish_checks`` waits for their verdicts.

    They run while the notebook's kernel starts (``GuardedExecute`` waits for them before the
    kernel runs its first cell): no student code runs in the kernel until the sandbox, the other
    process with the student's code, is gone.
    """
    started = time.perf_counter()
    opts: Options = ctx["options"]
    # the checks end before the notebook's limit (what the student's code was too slow to answer failed,
    # saying so), leaving its kernel a tenth of the time, 30 s at least (half at most); the sandbox's last
    # answer comes by four fifths of theirs, the rest is the trusted side's own work (references, diagnoses)
    left = ctx["deadline"] - time.monotonic()
    budget = min(
        max(30, opts.timeout * (len(ctx["lesson"].cells) + 4)), left - min(left / 2, max(30, left / 10))
    )
    trusted_dir: Path = ctx["root"] / "trusted"
    (trusted_dir / "job.json").write_text(json.dumps({**job, "seconds": max(1.0, budget * 0.8)}))
    ctx["checks_job"] = job
    root: Path = ctx["root"]
    box: Path = ctx.get("box", root)
    scratch = box / "scratch"
    sealed = box != root
    sandbox_policy = guard.policy(
        deny=ctx["deny"] + [str(root / "course"), str(trusted_dir)],
        write_only_in=[str(scratch), os.devnull],
        read_only_in=_sandbox_readable() + [str(scratch)] + (["/tmp/matplotlib"] if sealed else []),
        deny_imports=("grader",),
        strict=True,
    )
    sandbox_cfg = {
        "scratch": str(scratch),
        "memory": opts.memory,
        "cpu_seconds": max(int(budget), 0) + 30,
        "guard": sandbox_policy,
        "cell_timeout": opts.timeout,
    }
    box_proc = None
    pipes = None
    if sealed:  # the sandbox is forked in the seal; the trusted process outside talks to it by named pipes
        pipes = {name: str(box / "pipes" / name) for name in ("to_sandbox", "from_sandbox")}
        for path in pipes.values():
            os.mkfifo(path, 0o600)
        box_proc = servers.sealed().fork(
            "sandbox",
            cwd=str(scratch),
            env=_child_env(ctx),
            pipes=pipes,
            sandbox=sandbox_cfg,
            log=str(box / "sandbox.log"),
            threads=opts.threads,
            writable=[str(scratch)],
        )
    proc = servers.plain().fork(
        "trusted",
        cwd=str(trusted_dir),
        env=_child_env(ctx),
        job=str(trusted_dir / "job.json"),
        sandbox=sandbox_cfg,
        pipes=pipes,
        log=str(root / "trusted.log"),
        threads=opts.threads,
    )
    ctx["checks"] = _RunningChecks(proc, box_proc, started, time.monotonic() + budget, trusted_dir)


def _await_trusted(ctx: dict, checks: _RunningChecks) -> dict | None:
    """The trusted process's verdicts, once it has ended (None if it ran past its time)."""
    try:
        checks.trusted.wait(timeout=max(1, min(checks.until, ctx["deadline"]) - time.monotonic()))
    except Exception:  # noqa: BLE001 - took too long
        checks.trusted.kill()
        return None
    finally:
        if checks.sandbox is not None:
            checks.sandbox.kill()
    try:  # the trusted process caps what it writes; a file it did not write is not read
        return json.loads(read_regular(checks.trusted_dir / "result.json", RESULT_CAP))
    except (OSError, ValueError):
        return None


_READABLE: list[str] = []


def _sandbox_readable() -> list[str]:
    """Where a sandbox may read: the Python installation, the student helpers and data, system files."""
    if not _READABLE:
        import site
        import sysconfig

        paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sysconfig.get_paths()["stdlib"]}
        paths.update(site.getsitepackages())
        import attention_course

        helpers = Path(attention_course.__file__).resolve().parent
        paths.update({str(helpers), str(helpers.parent / "data")})
        home = Path.home()
        paths.update({str(home / ".cache" / "matplotlib"), str(home / ".config" / "matplotlib"), os.devnull})
        paths.update("/usr /lib /lib64 /etc /proc /sys /dev/urandom /dev/random /dev/zero".split())
        paths.update(str(p) for p in Path("/dev").glob("nvidia*"))  # CUDA
        if os.environ.get("ATTENTION_COURSE_DATA"):
            paths.add(os.environ["ATTENTION_COURSE_DATA"])
        _READABLE.extend(sorted(paths))
    return list(_READABLE)


def _child_env(ctx: dict) -> dict[str, str]:
    env = kernels.kernel_env(None)
    env["MPLBACKEND"] = "Agg"
    env["NBGRADER_EXECUTION"] = "autograde"
    env["TMPDIR"] = str(ctx.get("box", ctx["root"]) / "tmp")
    return env
