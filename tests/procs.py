"""What /proc says of a process (Linux): whether it still runs, and its parent."""

from __future__ import annotations

from pathlib import Path


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state, parent, ...), [] if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def running(pid: int) -> bool:
    """Whether the process exists and has not ended (a zombie has: it waits only to be reaped)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def parent(pid: int | None) -> int | None:
    fields = _stat(pid) if pid else []
    return int(fields[1]) if len(fields) > 1 else None
