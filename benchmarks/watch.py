"""What the rules' watch costs a hidden check: every call of it with the dispatcher's eyes on and off.

    python benchmarks/watch.py                    # 7 rounds
    python benchmarks/watch.py --rounds 15 --busy 1

A lesson with a rule (05: no torch.softmax; 07: no scaled_dot_product_attention; 11: block by block)
runs the student's function under ``attention_course.watch.CallWatch`` for every hidden case. The watch
sees torch functions and, where there is a rule, every aten operation at the dispatcher (``_Below``).
This script calls each lesson's reference on its hidden cases, as the sandbox does, three ways side by
side in each round: with no watch, with the torch-function watch alone (the dispatcher's eyes taken
off), and with the whole watch. It prints the median seconds of one lesson's hidden cases and the
ratio against the function watch alone. The first round is a fresh process's first call (cold
caches), reported apart; ``--busy N`` runs N processes spinning beside it (a laptop is rarely idle).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LESSONS = {  # lesson: (exercise, forbidden names)
    "05_softmax": ("softmax", "SOFTMAX_FAMILY"),
    "07_one_head": ("attention", "NO_SDPA"),
    "11_cost": ("tiled_attention", None),
}
WAYS = ("no watch", "function watch", "whole watch")


def _spin() -> None:
    while True:
        pass


def one_round(lesson: str) -> dict[str, float]:
    """Seconds for one pass over the lesson's hidden cases, each way."""
    import importlib

    import torch

    from attention_course import watch

    module = importlib.import_module(f"grader.lessons.l{lesson[:2]}_{lesson[3:]}")
    exercise, forbidden = LESSONS[lesson]
    names = list(getattr(module, forbidden)) if forbidden else []
    fn = getattr(module, exercise)
    cases = getattr(module, exercise.upper()).cases(torch.device("cpu"))
    seconds = {}
    below = watch.CallWatch.__enter__
    for way in WAYS:
        if way == "function watch":
            watch.CallWatch.__enter__ = lambda self: watch.TorchFunctionMode.__enter__(self) or self
        start = time.perf_counter()
        for case in cases:
            if way == "no watch":
                fn(*case.args, **case.kwargs)
                continue
            with watch.CallWatch(names, (case.args, case.kwargs)) as seen:
                value = fn(*case.args, **case.kwargs)
            seen.verdict(value)
        seconds[way] = time.perf_counter() - start
        watch.CallWatch.__enter__ = below
    return seconds


def _cold(lesson: str) -> dict[str, float]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); sys.argv = sys.argv[:1]\n"
        "from benchmarks.watch import one_round\n"
        f"print(json.dumps(one_round({lesson!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, check=True)
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--busy", type=int, default=0, help="processes spinning beside the benchmark")
    args = parser.parse_args()
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    try:
        print(f"{'lesson':<12} {'round':<6} " + " ".join(f"{w:>15}" for w in WAYS) + "   whole / function")
        for lesson in LESSONS:
            cold = _cold(lesson)
            print(
                f"{lesson:<12} {'cold':<6} "
                + " ".join(f"{cold[w] * 1e3:>12.1f} ms" for w in WAYS)
                + f"   {cold['whole watch'] / cold['function watch']:.2f}x"
            )
            one_round(lesson)  # warm-up
            rounds = [one_round(lesson) for _ in range(args.rounds)]
            median = {w: statistics.median(r[w] for r in rounds) for w in WAYS}
            print(
                f"{lesson:<12} {'warm':<6} "
                + " ".join(f"{median[w] * 1e3:>12.1f} ms" for w in WAYS)
                + f"   {median['whole watch'] / median['function watch']:.2f}x (median of {args.rounds})"
            )
    finally:
        for p in spinners:
            p.terminate()


if __name__ == "__main__":
    main()
