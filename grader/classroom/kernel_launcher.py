"""Start an IPython kernel with the memory cap and the guard in place (no fork server).

Usage (by GuardedKernelManager): ``python -m grader.classroom.kernel_launcher SPEC -f CONN``
(``course_runtime.kernel_launcher`` inside the seal, see grader.classroom.seal)
where SPEC is JSON ``{"memory": bytes or null, "guard": policy}``.
"""

from __future__ import annotations

import contextlib
import json
import sys

if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    # torch loads its native libraries with ctypes, which the guard then refuses: import it first
    with contextlib.suppress(ImportError):
        import torch  # noqa: F401
    from . import guard  # relative: inside the seal this package is course_runtime

    guard.limit_memory(spec.get("memory"))
    guard.install(spec.get("guard") or {})
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(sys.argv[2:])
    app.start()
