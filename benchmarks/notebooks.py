"""Time every lesson top to bottom in a real kernel (kernel start included), as a student runs it.

    python benchmarks/notebooks.py [--repeat 3] [--solutions] [lesson ...]

What runs is the student's notebook (``notebooks/``) with the model answers in its exercise
cells: what a student who has done the work meets on Run All. ``--solutions`` times the
instructor's notebooks (``solutions/``) instead, whose test cells also run the hidden checks
(several trainings in lesson 10), which no student's notebook holds.

Each round runs a baseline notebook (kernel start + the lessons' setup imports,
the floor no lesson can beat) and then every lesson, interleaved, so that a busy
machine slows both alike. The first round is the cold one (nothing cached yet:
what a student's first run costs) and is shown on its own; the median is over the
``--repeat`` rounds after it. Prints, per lesson, the cold seconds, the median
seconds, the median's ratio to the baseline's, and whether it meets the target
of 5 s or less per lesson.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BASELINE = nbformat.v4.new_notebook(
    cells=[nbformat.v4.new_code_cell("import torch\nfrom attention_course import data\ndata.love_cats()")]
)


def run(nb: nbformat.NotebookNode, cwd: Path) -> float:
    """Seconds to run ``nb`` in a new kernel working in ``cwd``. The kernel talks over IPC sockets
    in a private folder, as the course's grading kernels and the tests' do (a TCP kernel would warn,
    once per run, that it has no encryption)."""
    from jupyter_client.manager import AsyncKernelManager

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-kernel-") as sockets:
        km = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "ipc"))
        client = NotebookClient(nb, km=km, timeout=300, resources={"metadata": {"path": str(cwd)}})
        client.owns_km = True  # shut the kernel down at the end (nbclient keeps a given manager's kernel)
        client.execute()
    return time.perf_counter() - start


def notebook(lesson: str, solutions: bool) -> tuple[nbformat.NotebookNode, Path]:
    """The notebook to time and its folder: the student's with the model answers, or the instructor's."""
    from grader.classroom.lessons import answered

    if solutions:
        path = ROOT / "solutions" / lesson / f"{lesson}.ipynb"
        return nbformat.read(path, as_version=4), path.parent
    path = ROOT / "notebooks" / lesson / f"{lesson}.ipynb"
    return nbformat.reads(answered(lesson).decode(), as_version=4), path.parent


def main() -> int:
    from grader.course import lessons

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="*", help="lesson ids (default: all)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--solutions", action="store_true", help="the instructor's notebooks, hidden checks too"
    )
    args = parser.parse_args()
    chosen = args.lessons or lessons()
    times: dict[str, list[float]] = {"(baseline)": []}
    for _ in range(1 + args.repeat):  # the cold round, then the repeats
        times["(baseline)"].append(run(nbformat.from_dict(BASELINE), ROOT))
        for lesson in chosen:
            times.setdefault(lesson, []).append(run(*notebook(lesson, args.solutions)))
    base = statistics.median(times["(baseline)"][1:])
    print(
        "the instructor's notebooks, hidden checks included"
        if args.solutions
        else "the students' notebooks with the model answers (what Run All costs a student who has done the work)"
    )
    print(
        f"{'notebook':<20} {'cold s':>7} {'median s':>9} {'x baseline':>11} {'<= 5 s':>7}"
        f"   (median of {args.repeat} runs after the cold one)"
    )
    for name, ts in times.items():
        med = statistics.median(ts[1:])
        print(f"{name:<20} {ts[0]:>7.2f} {med:>9.2f} {med / base:>11.2f} {'yes' if med <= 5 else 'NO':>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
