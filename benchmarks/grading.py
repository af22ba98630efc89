"""Grading throughput: the classroom tool against plain sequential ``nbgrader autograde``.

For each class size (default: 5 and 45 notebooks) it writes a class of submissions
made from the solutions (right answers, a named mistake, untouched notebooks, in
turn), then grades it both ways, in the same run, each time in a fresh work folder
with a fresh copy of the same gradebook:

- tool:  ``python -m grader grade --workers W`` (parallel, checks decided outside the kernel);
- plain: ``nbgrader autograde <lesson>`` for each lesson, one after another
  (nbgrader's own command with the course's configuration, one notebook at a time; its kernels
  are forked from the same warm processes as the tool's, started with its first notebook).

Both use the same per-cell timeout, and each rate counts the notebooks that side
really graded (its autograded copies), so a side that skips work gains nothing.
Prints one line per repetition and size, then the medians and their ratio per size.

Before a class counts, the tool grades each lesson's own solution (the proof that it can grade,
remembered per environment in a cache folder). The run starts with an empty cache of its own, so
the first repetition pays the proof, as a course's first run does; the table also shows that
first run alone.

    python benchmarks/grading.py                            # lesson 01, classes of 5 and 45, 3 repetitions
    python benchmarks/grading.py --sizes 5 --repeat 1
    python benchmarks/grading.py --lessons all --sizes 22
    python benchmarks/grading.py --busy 1                   # with a CPU-bound process beside (a busy laptop)

``--busy N`` keeps N CPU-bound processes (``while True: pass``) running through every run, both
sides alike. On Linux it also prints each side's CPU time per notebook (the whole machine's, so
only without ``--busy``), and the ratio that CPU time allows on this machine's cores.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KINDS = ("right answer", "named mistake", "untouched")


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["ATTENTION_COURSE_WORK"] = str(work)
    env["XDG_CACHE_HOME"] = str(work.parent / "cache")  # the tool's proofs: empty when the run starts
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _solutions(lesson: str) -> dict[str, str]:
    """The lesson's solution cells (markers removed), by grade id."""
    nb = nbformat.read(ROOT / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    return {
        c.metadata["nbgrader"]["grade_id"]: re.sub(
            r"^\s*### (BEGIN|END) SOLUTION\n", "", c.source, flags=re.M
        )
        for c in nb.cells
        if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")
    }


def _mistake(answers: dict[str, str]) -> dict[str, str]:
    """Lesson 01's best-known mistake (W_k for Q); other lessons answer right."""
    return {gid: src.replace("Q = X @ W_q", "Q = X @ W_k") for gid, src in answers.items()}


def write_class(release: Path, work: Path, lessons: list[str], size: int) -> None:
    """``size`` submissions in ``work``/submitted: lessons in turn, and for each a right answer,
    a mistake or the untouched notebook in turn."""
    for i in range(size):
        lesson = lessons[i % len(lessons)]
        kind = KINDS[(i // len(lessons)) % len(KINDS)]
        nb = nbformat.read(release / lesson / f"{lesson}.ipynb", as_version=4)
        answers = {} if kind == "untouched" else _solutions(lesson)
        if kind == "named mistake":
            answers = _mistake(answers)
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid in answers:
                cell.source = answers[gid]
        dest = work / "submitted" / f"s{i:03d}" / lesson / f"{lesson}.ipynb"
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dest)


def prepare(base: Path, lessons: list[str]) -> None:
    """Build the lessons' gradebook (and release) in ``base``."""
    os.environ["ATTENTION_COURSE_WORK"] = str(base)
    from grader import course

    course.build_notebooks(release_dir=base / "release", only=lessons)


def fresh(base: Path, dest: Path, lessons: list[str], size: int) -> None:
    """A work folder with the base gradebook and a class of ``size``, nothing graded."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copy(base / "gradebook.db", dest / "gradebook.db")
    write_class(base / "release", dest, lessons, size)


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


def busy_cpu() -> float | None:
    """CPU seconds the whole machine has spent busy since it started (Linux; None elsewhere). A
    side's delta counts every process it started, forked servers and kernels included (and, on a
    busy machine, others' work too: read it on a quiet one)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def count_graded(work: Path) -> int:
    """Notebooks graded in ``work``: their autograded copies."""
    return len(list((work / "autograded").glob("*/*/*.ipynb")))


def main() -> int:
    from grader import course

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lessons", default="01_projection", help="comma-separated lesson ids, or 'all'")
    parser.add_argument("--sizes", default="5,45", help="comma-separated class sizes (notebooks)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="tool workers (default: one per core)")
    parser.add_argument("--timeout", type=int, default=10, help="seconds per cell, both ways")
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes running beside every run")
    args = parser.parse_args()
    lessons = course.lessons() if args.lessons == "all" else args.lessons.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]

    tmp = Path(tempfile.mkdtemp(prefix="bench-grading-"))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        base = tmp / "base"
        prepare(base, lessons)
        from grader.classroom.grading import default_worker_count

        def tool_workers(size: int) -> int:
            return args.workers or default_worker_count(size)

        print(
            f"classes of {', '.join(map(str, sizes))} notebooks ({', '.join(lessons)}; "
            f"{' / '.join(KINDS)} in turn), tool workers "
            f"{', '.join(f'{tool_workers(n)} for {n}' for n in sizes)}, {os.cpu_count()} cores, "
            f"cell timeout {args.timeout} s, {args.busy} CPU-bound processes beside",
            flush=True,
        )
        rows: dict[int, list[dict]] = {size: [] for size in sizes}
        for i in range(args.repeat):
            for size in sizes:
                order = ("tool", "plain") if i % 2 == 0 else ("plain", "tool")
                row: dict = {}
                for kind in order:
                    work = tmp / f"{kind}-{size}-{i}"
                    fresh(base, work, lessons, size)
                    cpu_before = busy_cpu()
                    seconds = (
                        run_tool(work, lessons, args.workers, args.timeout)
                        if kind == "tool"
                        else run_plain(work, lessons, args.timeout)
                    )
                    cpu_after = busy_cpu()
                    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
                    graded = count_graded(work)
                    row[kind + "_cpu"] = cpu
                    row[kind] = 60.0 * graded / seconds
                    row[kind + "_graded"], row[kind + "_s"] = graded, seconds
                    shutil.rmtree(work, ignore_errors=True)
                rows[size].append(row)
                print(
                    f"  run {i + 1}, class of {size}: "
                    f"tool {row['tool']:.1f}/min ({row['tool_s']:.1f} s, {row['tool_graded']} graded)  "
                    f"plain {row['plain']:.1f}/min ({row['plain_s']:.1f} s, {row['plain_graded']} graded)",
                    flush=True,
                )
        print()
        print("| class | python -m grader grade (notebooks/min) | nbgrader autograde, sequential | ratio |")
        print("|---|---|---|---|")
        for size in sizes:
            tool = statistics.median(r["tool"] for r in rows[size])
            plain = statistics.median(r["plain"] for r in rows[size])
            short = [r for r in rows[size] if min(r["tool_graded"], r["plain_graded"]) < size]
            note = f" (some runs graded fewer than {size})" if short else ""
            print(f"| {size} notebooks{note} | {tool:.1f} | {plain:.1f} | {tool / plain:.2f}x |")
        cpu_rows = {
            size: [
                r
                for r in rows[size]
                if r["tool_cpu"] and r["plain_cpu"] and r["tool_graded"] and r["plain_graded"]
            ]
            for size in sizes
        }
        if all(cpu_rows.values()) and not args.busy:
            # a side cannot finish sooner than its CPU time spread over every core: on this machine the
            # tool's rate is at most cores x (its CPU per notebook against plain's wall per notebook)
            print("\nCPU time (whole machine, medians): what bounds the ratio on this machine")
            print("| class | tool CPU s/notebook | plain CPU s/notebook | plain cores busy | ratio at most |")
            print("|---|---|---|---|---|")
            cores = os.cpu_count() or 1
            for size, rs in cpu_rows.items():
                t_cpu = statistics.median(r["tool_cpu"] / r["tool_graded"] for r in rs)
                p_cpu = statistics.median(r["plain_cpu"] / r["plain_graded"] for r in rs)
                p_wall = statistics.median(r["plain_s"] / r["plain_graded"] for r in rs)
                print(
                    f"| {size} notebooks | {t_cpu:.2f} | {p_cpu:.2f} | {p_cpu / p_wall:.2f} | "
                    f"{cores * p_wall / t_cpu:.2f}x |"
                )
        first = rows[sizes[0]][0]
        print(
            f"\nfirst run of the course (the lesson's proof included), class of {sizes[0]}: "
            f"tool {first['tool']:.1f}/min against plain {first['plain']:.1f}/min "
            f"({first['tool'] / first['plain']:.2f}x)"
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
