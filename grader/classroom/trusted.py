"""The trusted side of a verdict: the lesson's own code and tests, the student's functions at arm's length.

nbgrader runs the student's code and the hidden tests in one kernel, so a
verdict reached there can be faked (patch ``torch.isclose``, plant a fake
``grader`` module, swallow exceptions ...). Here every test cell is decided
again in a process the student's code never ran in:

- the lesson's context cells (worked examples, data) and its test cells run
  from the instructor's source notebook, in order, up to the last test cell;
- every function the student writes is a *proxy*: calling it sends the
  arguments to the sandbox, which runs the student's own cells (in step with
  the notebook, so each test sees the code written above it) and sends back
  only data (tensors, numbers, strings, containers), read as data only
  (``wire.load``);
- ``grader.check`` and the reference run here, untouched; a rule such as "do
  not call torch.softmax" is watched in the sandbox (``proxy.forbidding``);
- while a check holds ``proxy.substituted({"attention": reference})``, the
  student's code that calls ``attention`` calls back here instead: the
  sandbox sends the arguments, this process runs the reference and answers
  with the value (plain data again), so one mistake costs one exercise.

A verdict records whether the failure came from a hidden-test block (which
only this process runs) or from the part of the cell the kernel runs too.

The sandbox's handle, the proxies and the values they carry are in
``grader.classroom.proxies``.

Entry point: ``main(job_path, to_sandbox, from_sandbox, sandbox_pid)``, called
by the fork server in a freshly forked process. The answer is written as JSON to
the job's ``result_path``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import warnings
from collections.abc import Iterator
from typing import Any

from grader.classroom import guard
from grader.classroom.proxies import Proxy, Sandbox, SandboxGone, Unverifiable, _message, decode
from grader.classroom.sandbox import CANARY, compile_cell, new_namespace

# ------------------------------------------------------------------ the evaluation


def plan(source_cells: list[dict], student_cells: list[dict]) -> list[tuple[dict, list[dict]]]:
    """Pair each source cell with the student cells the sandbox must run before it.

    A test cell is found among the student's by grade id (one each, once repaired: the one the kernel
    runs), another source cell by cell id, else grade id, else source (pasted cells, and nbformat 4.4's,
    have ids of their own). One the student deleted, or moved below the test cell after it, inherits
    the position of the source cell before it. Test cells never run in the sandbox."""
    position = {("id", c.get("id")): i for i, c in enumerate(student_cells)}
    for i, c in reversed(list(enumerate(student_cells))):  # the first of equal ones wins
        kind = "test" if c["kind"] == "test" else "grade"
        position.update({(kind, c.get("grade_id")): i, ("source", c["source"].strip()): i})
    tests = [i for i, c in enumerate(student_cells) if c["kind"] == "test"]
    done = last = 0
    steps = []
    for cell in source_cells:
        if cell["kind"] == "solution":
            continue
        gid, by_id, source = cell.get("grade_id"), ("id", cell["id"]), ("source", cell["source"].strip())
        keys = [("test", gid), by_id] if cell["kind"] == "test" else [by_id, ("grade", gid), source]
        here = next((position[k] for k in keys if k[1] and k in position), None)
        nearest = min((t for t in tests if t >= last), default=len(student_cells))
        if cell["kind"] != "test" and (here or 0) > nearest:
            here = None  # below the next test cell (moved there): as if deleted
        upto = last if here is None else max(here + 1, last)
        batch = [c for c in student_cells[done:upto] if c["kind"] != "test"]
        done = max(done, upto)
        last = upto
        steps.append((cell, batch))
    rest = [c for c in student_cells[done:] if c["kind"] != "test"]
    if rest:
        steps.append(({"kind": "end", "id": None, "source": ""}, rest))
    return steps


def up_to_last_test(steps: list[tuple[dict, list[dict]]]) -> list[tuple[dict, list[dict]]]:
    """The plan's steps up to its last test cell: what follows (demos, timings, explorers) decides nothing."""
    return steps[: max((i + 1 for i, (cell, _) in enumerate(steps) if cell["kind"] == "test"), default=0)]


def diagnosis(error: BaseException) -> str | None:
    """The name of the known mistake a check named, if any: set by the course's own checks on the error they
    raise (``mistake``), never read from its message, which holds the student's own error text too."""
    name = getattr(error, "mistake", None)
    return name if isinstance(name, str) and name else None


def _exec(source: str, label: str, namespace: dict) -> BaseException | None:
    try:
        code = compile_cell(source, label)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(code, namespace)
    except BaseException as e:  # noqa: BLE001 - recorded as the verdict
        return e
    return None


_DIAGNOSED = re.compile(r"diagnosed\(\s*[\"'](\w+)[\"']")


def checked_exercise(cell: dict, known: dict) -> str | None:
    """The exercise a test cell checks: named by its grade id, else by the cell's ``diagnosed("name", ...)``."""
    if cell.get("kind") != "test":
        return None
    gid = str(cell.get("grade_id") or "")
    name = max((n for n in known if gid.split("_", 1)[-1].startswith(n + "_")), key=len, default=None)
    if name is None:
        found = _DIAGNOSED.search(str(cell.get("source") or ""))
        name = found.group(1) if found and found.group(1) in known else None
    return name


@contextlib.contextmanager
def _own_exercise_alone(cell: dict, namespace: dict, graded: list[str]) -> Iterator[None]:
    """While a test cell of exercise E runs, every other graded function is the reference.

    Inside E's proxy calls, the functions E uses call the reference (``Exercise.uses``); in the cell
    itself, and in the lesson's helpers it calls (lesson 10's ``read_pattern`` calls ``head_forward``),
    the names E uses and the lesson's other exercises are the reference versions. One mistake costs
    one exercise in the visible checks too: ``merge_heads``' round trip runs on the reference
    ``split_heads``, ``train_head``'s pattern is read with the reference ``head_forward``.
    """
    from grader.registry import exercises

    known = exercises()
    name = checked_exercise(cell, known)
    proxy = namespace.get(name) if name else None
    if name is None or not isinstance(proxy, Proxy):
        yield
        return
    swapped: dict[str, Any] = {n: known[n].reference for n in graded if n != name and n in known}
    swapped.update({n: fn for n, fn in known[name].uses.items() if n != name})
    missing = object()
    saved = {n: namespace.get(n, missing) for n in swapped}
    namespace.update(swapped)
    try:
        with proxy.substituted(known[name].uses) if known[name].uses else contextlib.nullcontext():
            yield
    finally:
        for n, before in saved.items():
            if namespace.get(n, missing) is swapped[n]:
                if before is missing:
                    namespace.pop(n, None)
                else:
                    namespace[n] = before


def evaluate(job: dict, sandbox: Sandbox) -> dict:
    """Run the plan; return the verdict of every test cell."""
    timeout = float(job.get("cell_timeout", 60))
    names = list(job.get("graded_names", []))
    namespace = new_namespace()
    verdicts: dict[str, dict] = {}

    def sync_names() -> None:
        try:
            kinds = sandbox.request(("names", names), timeout + 5).get("names")
        except SandboxGone:
            kinds = {n: "callable" for n in names}  # calls will fail with the reason
        for name in names:
            kind = kinds.get(name, "missing") if isinstance(kinds, dict) else "missing"
            if kind == "callable":
                namespace[name] = Proxy(sandbox, name, timeout)
            elif kind == "missing":
                namespace.pop(name, None)
            else:
                try:
                    value = sandbox.request(("get", name), timeout + 5).get("value")
                    namespace[name] = decode(value, f"`{name}` is")
                except SandboxGone:
                    namespace.pop(name, None)

    timings: dict[str, float] = {"sandbox": 0.0, "trusted cells": 0.0}
    for cell, batch in up_to_last_test(plan(job["source_cells"], job["student_cells"])):
        if batch:
            cells = [(f"<student cell {c.get('id') or '?'}>", c["source"]) for c in batch]
            t = time.perf_counter()
            with contextlib.suppress(SandboxGone):  # its cells' errors decide nothing; a later call says why
                sandbox.request(("run", cells), timeout * len(cells) + 5)
            timings["sandbox"] += time.perf_counter() - t
        sync_names()
        label = f"<{cell.get('grade_id') or cell['id']}>"
        t = time.perf_counter()
        sandbox.changed = []
        with _own_exercise_alone(cell, namespace, names):
            error = _exec(cell["source"], label, namespace)
        timings["trusted cells"] += time.perf_counter() - t
        if cell["kind"] == "test":
            if error is None and sandbox.changed:
                # a check passes only on the inputs it gave: an answer that changed them in place fails it
                gid, why = cell["grade_id"], sandbox.changed[0]
                verdicts[gid] = dict(passed=False, ename="AssertionError", message=why, in_place=True)
            elif error is None:
                verdicts[cell["grade_id"]] = {"passed": True}
            elif isinstance(error, Unverifiable):
                verdicts[cell["grade_id"]] = {"passed": None, "message": str(error)}
            else:
                message = _message(error)
                verdicts[cell["grade_id"]] = {
                    "passed": False,
                    "ename": type(error).__name__[:100],
                    "message": message,
                    "diagnosis": diagnosis(error) if isinstance(error, AssertionError) else None,
                    "hidden": _failed_line(error, label) in _hidden_lines(cell["source"]),
                    "gone": sandbox.gone,  # why the sandbox was ended, in the trusted side's words (or None)
                }
    return {
        "verdicts": verdicts,
        "watch_off": _watch_switched_off(sandbox, timeout),  # first: the watch as the student's code left it
        **_watch_changed(sandbox, timeout),
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }


def _watch_changed(sandbox: Sandbox, timeout: float) -> dict[str, list[str]]:
    """What the student's code changed in the rules' watch in its process (put back before every call),
    and what the watch could not decide about the student's calls (for a person to look at)."""
    try:
        answer = sandbox.request(("watch changed",), timeout + 5)
        return {key: [str(v)[:300] for v in (answer.get(name) or [])[:_KEPT]] for key, name in _WATCH_KEYS}
    except Exception:  # noqa: BLE001 - a sandbox gone, or broken by the student: the canary says the rest
        return {}


_WATCH_KEYS = (("watch_changed", "value"), ("watch_review", "review"))
# what the sandbox says (the watch's notes) is the student's to make: this many at most, each cut
# (every note becomes a flag, and all of it is written out and read back by the worker)
_KEPT = 20


def _watch_switched_off(sandbox: Sandbox, timeout: float) -> bool:
    """Whether the rules' watch (in the student's process: best effort) misses a ruled-out call made after their code."""
    canary = f"def {CANARY}(Z):\n    import torch\n    return torch.softmax(torch.as_tensor(Z), -1)\n"
    try:
        sandbox.request(("run", [("<the watch's canary>", canary)]), timeout + 5)
        with (proxy := Proxy(sandbox, CANARY, timeout)).forbidding(["torch.softmax"]) as calls:
            proxy([[0.0, 1.0]])
    except SandboxGone:
        return False
    except Exception:  # noqa: BLE001 - a canary the student's code broke says as much as a silent one
        return True
    return "torch.softmax" not in calls


def _hidden_lines(source: str) -> set[int]:
    """Line numbers (from 1) of a test cell's hidden-test blocks, markers included."""
    lines, inside = set(), False
    for number, line in enumerate(source.splitlines(), 1):
        if line.strip() == "### BEGIN HIDDEN TESTS":
            inside = True
        if inside:
            lines.add(number)
        if line.strip() == "### END HIDDEN TESTS":
            inside = False
    return lines


def _failed_line(error: BaseException, label: str) -> int | None:
    """The line of the cell where the error left the cell's own code."""
    tb = error.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == label:
            line = tb.tb_lineno
            break
        tb = tb.tb_next
    return line


def main(job_path: str, to_sandbox: int, from_sandbox: int, sandbox_pid: int) -> None:
    start = time.perf_counter()
    # the lesson's visible checks decide here as they do while graded: a failure raises, never a note
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    with open(job_path) as f:
        job = json.load(f)
    # outside the seal and its cgroup, what a sandbox's answer or a callback makes this process build (an
    # expanded tensor made whole, a reference run on huge inputs) has the notebook's cap
    guard.limit_memory(job.get("memory"), beyond_now=True)
    sandbox = Sandbox(to_sandbox, from_sandbox, sandbox_pid, float(job.get("seconds") or "inf"))
    from grader.lessons._common import salted

    try:
        with salted(int(job.get("salt") or 0)):  # this submission's own hidden inputs
            result = evaluate(job, sandbox)
    finally:
        sandbox.kill("finished")
    result["seconds"] = round(time.perf_counter() - start, 3)
    tmp = job["result_path"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, job["result_path"])
