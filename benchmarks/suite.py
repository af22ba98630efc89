"""Where the test suite spends its time: seconds per test file and the slowest fixtures.

    python benchmarks/suite.py [pytest arguments ...]      # default: the whole suite

Runs pytest once (as configured: on every CPU, up to 4 workers, see tests/conftest.py) with a
JUnit XML report and ``--durations=0``, then prints the wall time, the number of workers, and per
test file the number of tests and their summed time (set-up included), with each file's share of
the summed time of all tests: the baseline on the same run that says what a change to that file
would save. The slowest set-ups are the fixtures a worker pays for once, such as grading the
simulated class. pytest's whole output is kept in test-artifacts/suite-pytest.log.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "test-artifacts" / "suite-pytest.log"
SETUP = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")


def main(args: list[str]) -> int:
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "--durations=0", f"--junitxml={report}", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        per_file: dict[str, list[float]] = defaultdict(list)
        if report.exists():
            for case in ET.parse(report).iter("testcase"):
                name = case.get("classname", "").replace(".", "/") + ".py"
                per_file[name].append(float(case.get("time", 0)))
    setups = []
    for line in proc.stdout.splitlines():
        m = SETUP.match(line)
        if m and m.group(2) == "setup":
            setups.append((float(m.group(1)), m.group(3)))
    workers = re.search(r"^test workers: (\d+)", proc.stdout, re.M)
    summed = sum(sum(times) for times in per_file.values()) or 1.0
    print(f"suite wall time: {wall:.0f} s (pytest exit code {proc.returncode})")
    count = workers.group(1) if workers else "?"
    print(f"workers: {count}; summed test time {summed:.0f} s ({summed / wall:.1f}x the wall time)")
    print(f"\n{'test file':<44} {'tests':>6} {'seconds':>9} {'share':>6}")
    for name, times in sorted(per_file.items(), key=lambda kv: -sum(kv[1])):
        total = sum(times)
        print(f"{name:<44} {len(times):>6} {total:>9.1f} {total / summed:>6.0%}")
    print("\nslowest set-ups (fixtures, paid once per scope):")
    for seconds, test in sorted(setups, reverse=True)[:10]:
        print(f"  {seconds:8.1f} s  {test}")
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text(proc.stdout + proc.stderr)
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    print("\n" + "\n".join(failed + proc.stdout.splitlines()[-1:]))
    print(f"(pytest's whole output: {LOG.relative_to(ROOT)})")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
