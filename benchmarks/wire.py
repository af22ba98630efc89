"""What one message between the trusted side and the sandbox costs: the wire's format against the one before it.

Each message is made and read back as it crosses a pipe while a class is graded: from the sandbox (a value of
``plain``: the wire's JSON and bytes, against ``torch.save`` read with ``torch.load(weights_only=True)``) and to
it (the wire without copies, against ``pickle``). The messages are those of a lesson 10 training loop that calls
the reference once per sequence (the call, its value, the backward pass's gradients) and a lesson 01 answer.
Both ways run side by side, in turn, in one process; it prints the median microseconds of each and their ratio,
for the first round (cold) and for the rest.

    python benchmarks/wire.py
    python benchmarks/wire.py --repeat 2000
"""

from __future__ import annotations

import argparse
import io
import pickle
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.classroom.wire import dump, load, plain  # noqa: E402


def messages() -> dict[str, tuple[object, bool]]:
    """name -> (message, whether the sandbox sends it)."""
    g = torch.Generator().manual_seed(0)
    params = {k: torch.randn(16, 8, generator=g) for k in ("W_q", "W_k", "W_v")}
    params["W_o"] = torch.randn(8, 8, generator=g)
    X = torch.randn(64, 8, 16, generator=g)
    logits, A = torch.randn(8, 8, generator=g), torch.rand(8, 8, generator=g)
    return {
        "lesson 10: head_forward called (sandbox)": (
            {
                "callback": "head_forward",
                "args": plain((params, X[3])),
                "kwargs": {},
                "needs_grad": [0, 1, 2, 3],
            },
            True,
        ),
        "lesson 10: its value (trusted side)": ({"value": plain((logits, A)), "key": 1}, False),
        "lesson 10: the backward pass (sandbox)": ({"backward": 1, "grads": plain([logits, None])}, True),
        "lesson 10: the gradients (trusted side)": ({"value": plain(list(params.values()))}, False),
        "lesson 01: an answer (sandbox)": (
            {"value": plain(tuple(torch.randn(2, 5, 4, generator=g) for _ in range(3))), "args": plain((X,))},
            True,
        ),
    }


def before(message: object, from_sandbox: bool) -> object:
    if from_sandbox:
        buf = io.BytesIO()
        torch.save(message, buf)
        return torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    return pickle.loads(pickle.dumps(message))


def now(message: object, from_sandbox: bool) -> object:
    return load(dump(message, copy=from_sandbox), trusted=not from_sandbox)


def timed(fn, message: object, from_sandbox: bool) -> float:
    start = time.perf_counter()
    fn(message, from_sandbox)
    return (time.perf_counter() - start) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=500)
    args = parser.parse_args()
    print("| message | before (us) | wire (us) | ratio | first round: before / wire (us) |")
    print("|---|---|---|---|---|")
    for name, (message, from_sandbox) in messages().items():
        times: dict[str, list[float]] = {"before": [], "now": []}
        for i in range(args.repeat):
            order = (("before", before), ("now", now)) if i % 2 == 0 else (("now", now), ("before", before))
            for key, fn in order:
                times[key].append(timed(fn, message, from_sandbox))
        b, w = statistics.median(times["before"][1:]), statistics.median(times["now"][1:])
        print(
            f"| {name} | {b:.0f} | {w:.0f} | {b / w:.1f}x | {times['before'][0]:.0f} / {times['now'][0]:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
