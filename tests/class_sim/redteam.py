"""Red-team submissions: code that reaches for what it must not, with a wrong answer it hopes to hide.

Each lesson 01 attack hands in ``Q = X @ W_k`` (worth the shapes check only, 1 of 7 points) plus an
attack. Under the seal none of them can reach the course's files, another submission, the network or
outlive its notebook; none earns a point it did not write, and none gets instructor code into its
feedback. Two more answer an exercise with glue around the explorers' own computation of one head
(``stages.compute_stages`` fed the exercise's arguments as "your" steps): while a notebook is graded
the explorers' internals do not exist, so the glue earns nothing, and it is flagged.
"""

from __future__ import annotations

from tests.class_sim.spec import ALL, HIDDEN01, L1, V01, Case, _wk

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

try:  # in a session of its own where that is not refused, else in a group of its own
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
except PermissionError:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], process_group=0)
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


# the explorers' stepper run with the student's "choices" for its steps: what it computes is the answer
GLUE = """
import importlib

import torch

_stages = importlib.import_module("attention_course.explorers.stages")
_choosing = importlib.import_module("attention_course.explorers.choosing")


def _run(causal=False, **steps):
    choices = {k: _choosing.Choice(k, f, "yours", "") for k, f in steps.items()}
    z = torch.zeros(1, 1, dtype=torch.float64)
    return _stages.compute_stages(["a"], z, z, z, z, causal=causal, choices=choices)
"""

GLUED_ATTENTION = (
    GLUE
    + """

def attention(Q, K, V, mask=None):
    steps = {"project": lambda *a: (Q, K, V)}
    if mask is not None:
        steps["causal_mask"] = lambda T: mask
    st = _run(causal=mask is not None, **steps)
    return st.O.to(Q.device, Q.dtype), st.A.to(Q.device, Q.dtype)
"""
)

GLUED_MIX = (
    GLUE
    + """

def mix(A, V):
    z = torch.zeros(*A.shape[:-1], 1, dtype=torch.float64)
    keys = torch.zeros(A.shape[-1], 1, dtype=torch.float64)
    st = _run(project=lambda *a: (z, keys, V), softmax=lambda S, dim=-1: A)
    return st.O.to(V.device, torch.promote_types(A.dtype, V.dtype))
"""
)

INTERNALS = "imports the explorers' internals (attention_course.explorers.stages)"


def glue_cases() -> list[Case]:
    """Exercises answered by the explorers' computation: nothing earned (9 points of 07, all 7 of 06 before)."""
    return [
        Case(
            f"r{lesson[:2]}_explorer_glue",
            lesson,
            f"{name} answered by glue around the explorers' stage computation",
            {f"ex{lesson[:2]}_{name}": source},
            fails=ALL,
            flags=(INTERNALS,),
            score=0,
        )
        for lesson, name, source in (
            ("07_one_head", "attention", GLUED_ATTENTION),
            ("06_mixing", "mix", GLUED_MIX),
        )
    ]


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
    ] + glue_cases()


__all__ = ["HIDDEN01", "cases"]
