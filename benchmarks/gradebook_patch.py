"""What ``gradebooks.reuse_engines`` (the one change to how nbgrader opens its gradebook) buys.

Grades the same class with ``python -m grader grade`` twice per repetition, side by side in
alternating order: as it runs, and with nbgrader's gradebook opened as nbgrader opens it
(``ATTENTION_COURSE_NBGRADER_AS_IS=1``). Each run starts from a fresh work folder and an empty
proof cache of its own (a course's first run). Prints each pair, the medians and the share of a
run's time the change saves; the rule it is kept by: at least a fifth.

    python benchmarks/gradebook_patch.py                  # lesson 01, a class of 45, 5 repetitions
    python benchmarks/gradebook_patch.py --size 5 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grading  # noqa: E402 - benchmarks/grading.py: the class, the work folders, the tool's run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lessons", default="01_projection")
    parser.add_argument("--size", type=int, default=45)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=10)
    args = parser.parse_args()
    lessons = args.lessons.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="bench-gradebook-"))
    seconds: dict[str, list[float]] = {"patched": [], "as nbgrader": []}
    try:
        base = tmp / "base"
        grading.prepare(base, lessons)
        for i in range(args.repeat):
            order = ("patched", "as nbgrader") if i % 2 == 0 else ("as nbgrader", "patched")
            line, pair, whole = [], {}, True
            for kind in order:
                work = tmp / f"{i}-{kind.replace(' ', '-')}"
                grading.fresh(base, work, lessons, args.size)
                shutil.rmtree(tmp / "cache", ignore_errors=True)
                if kind == "as nbgrader":
                    os.environ["ATTENTION_COURSE_NBGRADER_AS_IS"] = "1"
                try:
                    took = grading.run_tool(work, lessons, 0, args.timeout)
                finally:
                    os.environ.pop("ATTENTION_COURSE_NBGRADER_AS_IS", None)
                graded = grading.count_graded(work)
                whole = whole and graded == args.size
                pair[kind] = took
                line.append(f"{kind} {took:.1f} s ({graded} graded)")
                shutil.rmtree(work, ignore_errors=True)
            if whole:  # a run that graded less did less work: the pair is left out
                for kind, took in pair.items():
                    seconds[kind].append(took)
            print(f"  run {i + 1}: " + ", ".join(line) + ("" if whole else "  (left out)"), flush=True)
        if not seconds["patched"]:
            print("no repetition graded the whole class both ways")
            return 1
        patched = statistics.median(seconds["patched"])
        plain = statistics.median(seconds["as nbgrader"])
        saved = 1 - patched / plain
        print(f"class of {args.size}: median {patched:.1f} s patched, {plain:.1f} s as nbgrader opens it")
        print(f"the patch saves {saved:.0%} of a run's time (kept only if at least 20%)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
