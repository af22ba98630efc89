"""Removing folders that student code could write in: any depth, links never followed, never raising.

``shutil.rmtree`` walks with file descriptors and removes links, not what they point at. A student's
process can leave a tree thousands of folders deep, where it raises ``RecursionError`` even with
``ignore_errors`` (which ignores only ``OSError``); ``rm -rf`` removes what is left, walking such trees
with file descriptors too. Where grading is not root, folders the student's code made read-only are
made writable again first. A tree none of these can remove is left for the next run's clean-up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time

RM_SECONDS = 300  # the longest one removal may take (a tree of millions of files)


def remove_tree(path: str | os.PathLike) -> None:
    """Remove ``path`` and everything below it, as far as it can, without ever raising."""
    try:
        if shutil.rmtree.avoids_symlink_attacks:  # no process to start (milliseconds, four per notebook)
            with contextlib.suppress(Exception):  # RecursionError, a link at path...: rm -rf below
                shutil.rmtree(path)
        # not root: student code ran as this user and may have made folders read-only (chmod follows no link)
        own = os.geteuid() != 0 and os.path.isdir(path) and not os.path.islink(path)
        commands = [["chmod", "-R", "u+rwx"], ["rm", "-rf"]] if own else [["rm", "-rf"]]
        for attempt in range(3):  # processes being killed may still add to it for a moment
            if not os.path.lexists(path):
                return
            if attempt:
                time.sleep(0.1 * attempt)
            for name, *args in commands:
                subprocess.run(
                    [shutil.which(name, path="/usr/bin:/bin") or name, *args, "--", os.fspath(path)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=RM_SECONDS,
                    check=False,
                )
    except Exception:  # noqa: BLE001 - whatever is left, the next run's clean-up tries again
        pass
