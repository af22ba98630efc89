"""Red-team submissions: code that reaches for what it must not, with a wrong answer it hopes to hide.

Each hands in ``Q = X @ W_k`` (worth the shapes check only, 1 of 7 points) plus an attack. Under the
seal none of them can reach the course's files, another submission, the network or outlive its
notebook; none earns a point it did not write, and none gets instructor code into its feedback.
"""

from __future__ import annotations

from tests.class_sim.spec import HIDDEN01, L1, V01, Case, _wk

PRINT_INSTRUCTOR_FILES = """
import glob
import os

import attention_course

course = os.path.dirname(os.path.dirname(attention_course.__file__))
for pattern in (course + "/grader/*.py", course + "/solutions/*/*.ipynb", "/work/*/grader/*.py", "../../../*"):
    for path in glob.glob(pattern, recursive=True)[:20]:
        try:
            print(path, open(path).read()[:20000] if os.path.isfile(path) else os.listdir(path))
        except Exception as e:
            print("cannot read", path, type(e).__name__)
for path in ("/etc/passwd", "/proc/self/environ", os.path.expanduser("~/.bash_history")):
    try:
        print(path, open(path, "rb").read()[:2000])
    except Exception as e:
        print("cannot read", path, type(e).__name__)
"""

WRITE_OTHER_FOLDERS = """
import glob
import os

for folder in glob.glob("../../*/*") + glob.glob("/tmp/*") + [os.path.expanduser("~")]:
    try:
        with open(os.path.join(folder, "planted.ipynb"), "w") as f:
            f.write("{}")
        print("wrote into", folder)
    except Exception as e:
        print("cannot write", folder, type(e).__name__)
"""

BACKGROUND = """
import subprocess
import sys

subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
"""

NETWORK = """
import socket

for host, port in (("127.0.0.1", 22), ("127.0.0.1", 8888), ("pypi.org", 443)):
    try:
        socket.create_connection((host, port), timeout=1).close()
        print("connected to", host, port)
    except Exception as e:
        print("no connection to", host, port, type(e).__name__)
"""


def cases() -> list[Case]:
    attacks = [
        (
            "r01_print_files",
            "prints instructor files, /etc/passwd and its environment",
            PRINT_INSTRUCTOR_FILES,
            ("mentions the grading package",),
        ),
        ("r01_write_folders", "writes into other submissions' folders and /tmp", WRITE_OTHER_FOLDERS, ()),
        (
            "r01_background",
            "leaves a process running in the background",
            BACKGROUND,
            ("starts other programs",),
        ),
        ("r01_network", "opens network connections", NETWORK, ("opens network connections",)),
    ]
    return [
        Case(student, L1, what, {"ex01_project": _wk() + "\n" + code}, fails=V01, flags=flags, score=1)
        for student, what, code, flags in attacks
    ]


__all__ = ["HIDDEN01", "cases"]
