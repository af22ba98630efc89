"""Grading throughput: the classroom tool against plain sequential ``nbgrader autograde``.

Grades the simulated class (tests/class_sim) both ways, in the same run, on
the same submissions, each time in a fresh work folder with a fresh copy of the
same gradebook:

- tool:  ``python -m grader grade --workers W`` (parallel, independent checks);
- plain: ``nbgrader autograde <lesson>`` for each lesson, one after another
  (nbgrader's own command, one kernel per notebook, one notebook at a time).

Both use the same per-cell timeout. The endless-loop submissions are left out
by default (they measure the timeout, not the grader). Prints a table of
notebooks per minute per repetition, and the medians and their ratio.

    python benchmarks/grading.py                     # lesson 01's simulated class, 3 repetitions
    python benchmarks/grading.py --lessons all --repeat 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["ATTENTION_COURSE_WORK"] = str(work)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def prepare(base: Path, lessons: list[str] | None, loops: bool) -> tuple[list[str], int]:
    """Build the gradebook and write the simulated class into ``base``; return (lessons, notebooks)."""
    os.environ["ATTENTION_COURSE_WORK"] = str(base)
    from grader import course
    from tests.class_sim import spec

    release = base / "release"
    cases = [c for c in spec.cases(base) if loops or not c.short_timeout]
    if lessons:
        cases = [c for c in cases if c.lesson in lessons]
    used = sorted({c.lesson for c in cases})
    course.build_notebooks(release_dir=release, only=used)
    spec.materialize(cases, release)
    return used, len(cases)


def fresh(base: Path, dest: Path) -> None:
    """A work folder with the base gradebook and submissions, and nothing graded."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copy(base / "gradebook.db", dest / "gradebook.db")
    shutil.copytree(base / "submitted", dest / "submitted")


def run_tool(work: Path, lessons: list[str], workers: int, timeout: int) -> float:
    cmd = [sys.executable, "-m", "grader", "grade", *lessons, "--quiet", "--timeout", str(timeout)]
    if workers:
        cmd += ["--workers", str(workers)]
    start = time.perf_counter()
    subprocess.run(
        cmd, cwd=ROOT, env=_env(work), check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - start


def run_plain(work: Path, lessons: list[str], timeout: int) -> float:
    nbgrader = str(Path(sys.executable).parent / "nbgrader")
    start = time.perf_counter()
    for lesson in lessons:
        subprocess.run(
            [nbgrader, "autograde", lesson, "--force", f"--Execute.timeout={timeout}"],
            cwd=ROOT,
            env=_env(work),
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    return time.perf_counter() - start


def count_graded(work: Path) -> int:
    return len(list((work / "autograded").glob("*/*/*.ipynb")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lessons", default="01_projection", help="comma-separated lesson ids, or 'all'")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="tool workers (default: one per core)")
    parser.add_argument("--timeout", type=int, default=10, help="seconds per cell, both ways")
    parser.add_argument("--loops", action="store_true", help="include the endless-loop submissions")
    args = parser.parse_args()
    lessons = None if args.lessons == "all" else args.lessons.split(",")

    tmp = Path(tempfile.mkdtemp(prefix="bench-grading-"))
    try:
        base = tmp / "base"
        used, n = prepare(base, lessons, args.loops)
        from grader.classroom.executors import default_workers

        workers = args.workers or default_workers()
        print(
            f"{n} notebooks ({', '.join(used)}), {workers} tool workers, {os.cpu_count()} cores, "
            f"cell timeout {args.timeout} s"
        )
        rows = []
        for i in range(args.repeat):
            order = ("tool", "plain") if i % 2 == 0 else ("plain", "tool")
            rate = {}
            for kind in order:
                work = tmp / f"{kind}-{i}"
                fresh(base, work)
                seconds = (
                    run_tool(work, used, args.workers, args.timeout)
                    if kind == "tool"
                    else run_plain(work, used, args.timeout)
                )
                graded = count_graded(work)
                rate[kind] = 60.0 * n / seconds
                rate[kind + "_graded"] = graded
                rate[kind + "_s"] = seconds
                shutil.rmtree(work, ignore_errors=True)
            rows.append(rate)
            print(
                f"  run {i + 1}: tool {rate['tool']:.1f}/min ({rate['tool_s']:.0f} s, {rate['tool_graded']} graded)  "
                f"plain {rate['plain']:.1f}/min ({rate['plain_s']:.0f} s, {rate['plain_graded']} graded)",
                flush=True,
            )
        tool = statistics.median(r["tool"] for r in rows)
        plain = statistics.median(r["plain"] for r in rows)
        print()
        print("| grader | notebooks/minute (median) |")
        print("|---|---|")
        print(f"| python -m grader grade ({workers} workers) | {tool:.1f} |")
        print(f"| nbgrader autograde (sequential) | {plain:.1f} |")
        print(f"| ratio | {tool / plain:.2f}x |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
