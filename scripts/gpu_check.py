#!/usr/bin/env python3
"""Run the CUDA half of the device-parametrised tests and print a short report.

    python scripts/gpu_check.py                # on a machine with an NVIDIA GPU and a CUDA build of PyTorch
    python scripts/gpu_check.py --device cpu   # the same checks on the CPU, to try the script anywhere

It runs every test parametrised over ``tests.conftest.DEVICES`` for that device (the
reference, the solution notebooks' code, every known mistake, device and dtype slips,
float16 and bfloat16 cases), then times grading each exercise's reference on the CPU
and on the device. ``--only EXPR`` narrows the tests (a pytest -k expression); extra
arguments after ``--`` go to pytest.

Exit status: 0 when every selected test passed; 1 when one failed (or none ran);
77 when there is no CUDA device here (nothing was run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402

NO_CUDA = 77


class Tally:
    """A pytest plugin that counts outcomes per test file."""

    def __init__(self) -> None:
        self.files: dict[str, dict[str, int]] = {}
        self.failures: list[str] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
            return
        counts = self.files.setdefault(report.nodeid.split("::")[0], {"passed": 0, "failed": 0, "skipped": 0})
        counts[report.outcome] += 1
        if report.outcome == "failed":
            self.failures.append(report.nodeid)

    def total(self, outcome: str) -> int:
        return sum(c[outcome] for c in self.files.values())


def describe(device: str) -> str:
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return (
            f"{props.name}, compute capability {props.major}.{props.minor}, "
            f"{props.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"bfloat16 {'supported' if torch.cuda.is_bf16_supported() else 'NOT supported'}"
        )
    return f"CPU; torch {torch.__version__}"


def grading_times(devices: list[str]) -> list[str]:
    """Milliseconds to grade each exercise's reference on each device (after one warm-up round)."""
    from grader.harness import check_exercise
    from grader.registry import exercises

    lines = []
    for name, ex in exercises().items():
        row = []
        for device in devices:
            check_exercise(ex, ex.reference, on=[device])  # warm-up: kernels, caches
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            check_exercise(ex, ex.reference, on=[device])
            if device == "cuda":
                torch.cuda.synchronize()
            row.append(f"{device} {1000 * (time.perf_counter() - start):7.1f} ms")
        lines.append(f"  {name:<24} " + "   ".join(row))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--only", metavar="EXPR", help="a further pytest -k expression, e.g. softmax")
    parser.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    args = parser.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        print(
            f"No CUDA device here (torch {torch.__version__}, {build}): nothing to check.\n"
            "Run this on a machine with an NVIDIA GPU and a CUDA build of PyTorch, "
            "or try the same checks on the CPU with --device cpu."
        )
        return NO_CUDA

    print(f"gpu check on {describe(args.device)}")
    tally = Tally()
    start = time.perf_counter()
    pytest.main(
        [
            str(ROOT / "tests"),
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            f"{args.device} and not report_script" + (f" and ({args.only})" if args.only else ""),
            *args.pytest_args,
        ],
        plugins=[tally],
    )
    took = time.perf_counter() - start

    print(f"\ndevice-parametrised tests on {args.device}:")
    for file, counts in sorted(tally.files.items()):
        print(
            f"  {file:<32} {counts['passed']:4d} passed {counts['failed']:3d} failed {counts['skipped']:3d} skipped"
        )
    for nodeid in tally.failures:
        print(f"  FAILED {nodeid}")
    print("\ngrading each exercise's reference:")
    devices = ["cpu"] if args.device == "cpu" else ["cpu", "cuda"]
    for line in grading_times(devices):
        print(line)
    passed, failed, skipped = (tally.total(o) for o in ("passed", "failed", "skipped"))
    print(f"\n{passed} passed, {failed} failed, {skipped} skipped on {args.device} in {took:.0f} s")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
