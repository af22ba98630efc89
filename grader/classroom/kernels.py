"""How a student's kernel is started: forked from the zygote, or as a guarded subprocess.

nbclient asks its kernel manager to launch ``python -m ipykernel_launcher -f
<connection file>``. ``GuardedKernelManager`` launches the same kernel but (a)
forks it from the worker's zygote when there is one, so torch is already
imported, and (b) in every case applies the memory cap and the guard's audit
hook before any student code runs, with an environment that does not point at
the course's work folder.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.manager import AsyncKernelManager

# variables a student kernel must not see (they lead to the real gradebook)
SCRUBBED_ENV = ("ATTENTION_COURSE_WORK", "JPY_PARENT_PID")


@dataclass
class KernelSettings:
    """What the next kernel of this worker gets (set by the job before nbgrader runs)."""

    zygote: Any = None  # a grader.classroom.zygote.Zygote, or None for plain subprocess kernels
    memory: int | None = None
    guard: dict = field(default_factory=dict)
    log: str | None = None
    pids: list[int] = field(default_factory=list)  # kernels started for the current job
    env: dict = field(default_factory=dict)  # extra environment (private TMPDIR, IPYTHONDIR)
    threads: int = 1  # torch threads per kernel (several kernels share the machine)


SETTINGS = KernelSettings()


def kernel_env(env: dict[str, str] | None) -> dict[str, str]:
    clean = dict(env if env is not None else os.environ)
    for name in SCRUBBED_ENV:
        clean.pop(name, None)
    clean.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    return clean


def _ipykernel_args(cmd: list[str]) -> list[str] | None:
    """The arguments after ``-m ipykernel_launcher`` (None if this is not an IPython kernel)."""
    for i in range(len(cmd) - 1):
        if cmd[i] == "-m" and cmd[i + 1] in ("ipykernel_launcher", "ipykernel"):
            return cmd[i + 2 :]
    return None


class GuardedKernelManager(AsyncKernelManager):
    """An AsyncKernelManager whose kernels are capped, guarded and (when possible) forked."""

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        args = _ipykernel_args(kernel_cmd)
        settings = SETTINGS
        env = kernel_env(kw.get("env"))
        env.update(settings.env)
        if args is not None and settings.zygote is not None:
            process = settings.zygote.fork(
                "kernel",
                argv=args,
                cwd=str(kw.get("cwd") or os.getcwd()),
                env=env,
                memory=settings.memory,
                guard=settings.guard,
                log=settings.log,
                threads=settings.threads,
            )
            prov = self.provisioner
            assert prov is not None
            prov.process = process
            prov.pid = process.pid
            prov.pgid = process.pid
            prov.cwd = kw.get("cwd")
            settings.pids.append(process.pid)
            self._reconcile_connection_info(prov.connection_info)
            return
        if settings.threads:
            env.setdefault("OMP_NUM_THREADS", str(settings.threads))
            env.setdefault("MKL_NUM_THREADS", str(settings.threads))
        if args is not None:
            spec = json.dumps({"memory": settings.memory, "guard": settings.guard})
            kernel_cmd = [sys.executable, "-m", "grader.classroom.kernel_launcher", spec, *args]
        kw["env"] = env
        await super()._async_launch_kernel(kernel_cmd, **kw)
        prov = self.provisioner
        if prov is not None and prov.pid:
            settings.pids.append(prov.pid)
