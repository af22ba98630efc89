"""Removing folders that student code could write in: any depth, links never followed, never raising.

A student's process can leave a tree thousands of folders deep, where Python's recursive
``shutil.rmtree`` raises ``RecursionError`` even with ``ignore_errors`` (it ignores only
``OSError``), and paths grow past ``PATH_MAX``. ``rm -rf`` walks such trees with file
descriptors and removes links, not what they point at; a tree it cannot remove is left for the
next run's clean-up and costs nothing else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

RM_SECONDS = 300  # the longest one removal may take (a tree of millions of files)


def remove_tree(path: str | os.PathLike) -> None:
    """Remove ``path`` and everything below it, as far as it can, without ever raising."""
    try:
        if not os.path.lexists(path):
            return
        rm = shutil.which("rm", path="/usr/bin:/bin") or "rm"
        for attempt in range(3):  # processes being killed may still add to it for a moment
            if attempt:
                time.sleep(0.1 * attempt)
            subprocess.run(
                [rm, "-rf", "--", os.fspath(path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=RM_SECONDS,
                check=False,
            )
            if not os.path.lexists(path):
                return
    except Exception:  # noqa: BLE001 - whatever is left, the next run's clean-up tries again
        pass
