"""A progress bar on stderr; what it names (a student's folder) is shown escaped (``jobs.one_line``)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from grader.classroom.jobs import one_line


class Progress:
    """``[#########.........]  45/300  12 failed  3.1 nb/min  eta 4m10s  last: ada/01_projection``

    Redraws in place on a terminal; elsewhere (a log file, CI) prints a line
    every ``every`` seconds and at the end.
    """

    def __init__(self, total: int, what: str = "graded", stream: TextIO | None = None, every: float = 10.0):
        self.total, self.what = total, what
        self.stream = stream or sys.stderr
        self.done = 0
        self.problems = 0
        self.start = time.perf_counter()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every
        self._last_print = 0.0
        self.last = ""

    def update(self, label: str = "", problem: bool = False) -> None:
        self.done += 1
        self.problems += int(problem)
        self.last = one_line(label)
        now = time.perf_counter()
        if self.tty or now - self._last_print >= self.every or self.done == self.total:
            self._last_print = now
            self._draw()

    def rate(self) -> float:
        """Items per minute so far."""
        elapsed = time.perf_counter() - self.start
        return 60.0 * self.done / elapsed if elapsed > 0 else 0.0

    def _draw(self) -> None:
        width = 24
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(width * frac) + "." * (width - int(width * frac))
        rate = self.rate()
        left = self.total - self.done
        eta = f"eta {_fmt(60 * left / rate)}" if rate > 0 and left else ""
        text = f"[{bar}] {self.done:>{len(str(self.total))}}/{self.total} {self.what}"
        if self.problems:
            text += f"  {self.problems} need a look"
        text += f"  {rate:.1f}/min  {eta}  {self.last}"
        if self.tty:
            self.stream.write("\r" + text[:150].ljust(150))
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.done != self.total:
            self.stream.write("\n")
            self.stream.flush()


def _fmt(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
