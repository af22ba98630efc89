"""The fork server outside the seal: fork_server's loop, with the role that decides the checks.

``python -m grader.classroom.trusted_server [--trusted-only]`` runs grader/classroom/fork_server.py's
server with one more role, ``trusted``: the process that re-decides every test cell outside the
kernel with the lesson's own tests (grader/classroom/trusted.py). It needs the grading package, which
no process inside the seal can import, so it lives here. Unsealed, this server forks the kernels and
sandboxes too; beside a sealed one it forks trusted processes only (``--trusted-only``) and loads the
checks once for all of them instead of the kernel.
"""

from __future__ import annotations

import contextlib
import os
import sys

from grader.classroom import fork_server

# what a trusted-only server imports once, before it forks
PRELOAD_TRUSTED = tuple(
    "torch numpy IPython attention_course.data grader.harness grader.registry grader.classroom.trusted".split()
)


def _run_trusted_sealed(req: dict) -> None:
    """Evaluate against a sandbox that lives in the seal (reached through named pipes)."""
    from grader.classroom import trusted

    class SealedSandbox(trusted.Sandbox):
        """The sandbox's pid means nothing here: ending it closes its pipes (the worker kills the rest)."""

        def kill(self, why: str) -> None:
            self.gone = self.gone or why
            for fd in (self.wfd, self.rfd):
                with contextlib.suppress(OSError):
                    os.close(fd)

    trusted.Sandbox = SealedSandbox  # this process exists for this one evaluation
    rfd, wfd = fork_server._open_pipes(req["pipes"], sandbox_side=False)
    trusted.main(req["job"], wfd, rfd, 0)


def _run_trusted(req: dict) -> None:
    """Fork the sandbox first, then evaluate."""
    if req.get("pipes"):
        _run_trusted_sealed(req)
        return
    to_sandbox_r, to_sandbox_w = os.pipe()
    from_sandbox_r, from_sandbox_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(to_sandbox_w)
        os.close(from_sandbox_r)
        os.setsid()  # a scheduling group of its own, as every child of a fork server
        fork_server._die_with_parent()
        from grader.classroom import sandbox

        try:
            sandbox.serve(to_sandbox_r, from_sandbox_w, req["sandbox"])
        finally:
            os._exit(0)
    os.close(to_sandbox_r)
    os.close(from_sandbox_w)
    from grader.classroom import trusted

    trusted.main(req["job"], to_sandbox_w, from_sandbox_r, pid)


def _load_checks() -> None:
    for name in PRELOAD_TRUSTED:
        with contextlib.suppress(Exception):  # a missing optional module only costs speed
            __import__(name)
    with contextlib.suppress(Exception):  # a trusted process then reports what is wrong
        sys.modules["grader.registry"].exercises()  # every lesson's checks, imported once


def main() -> None:
    fork_server.ROLES["trusted"] = _run_trusted
    fork_server.serve(_load_checks)


if __name__ == "__main__":
    main()
