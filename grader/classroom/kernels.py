"""How a student's kernel is started: sealed in bubblewrap, forked from the fork server, capped and guarded.

nbclient asks its kernel manager to launch ``python -m ipykernel_launcher -f
<connection file>``. ``GuardedKernelManager`` launches the same kernel but
(a) inside the seal (``grader.classroom.seal``) when bubblewrap works here:
the kernel then talks over IPC sockets in a folder bound into the seal, as it
has no network; (b) forked from the worker's fork server when there is one, so
torch is already imported (a sealed fork server when sealed); (c) in every case
with the memory cap and the guard's audit hook in place before any student
code runs, and an environment that does not point at the course's work folder.

Plain ``nbgrader autograde`` (and the formgrader's Autograde button) uses the
same manager through the course's ``nbgrader_config.py``, with the same fork
servers, started at its first notebook and kept for the rest of the run: there
the sealed kernel works in a copy of the autograded folder inside the seal.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from queue import Empty
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from traitlets import DottedObjectName, Type, default

from grader.classroom import seal
from grader.classroom.servers import kernel_env
from grader.classroom.trees import remove_tree


@dataclass
class KernelSettings:
    """What the next kernel of this worker gets (set by the job before nbgrader runs)."""

    fork_server: Any = None  # a grader.classroom.fork_client.ForkServer, or None for plain subprocess kernels
    memory: int | None = None
    guard: dict = field(default_factory=dict)
    log: str | None = None
    # the current job's kernels: each knows how to kill itself (and what it started)
    handles: list[Any] = field(default_factory=list)
    env: dict = field(default_factory=dict)  # extra environment (private TMPDIR, IPYTHONDIR)
    threads: int = 1  # torch threads per kernel (several kernels share the machine)
    sealed: bool | None = None  # None: seal whenever seal.available() says it can
    area: str | None = None  # a writable folder the seal shows, for connection files and IPC sockets
    cwd: str | None = None  # where the kernel works, if not nbclient's folder (plain nbgrader's sealed copy)


SETTINGS = KernelSettings()


def kill_all() -> None:
    """Kill every kernel started for the current job (and whatever they started).

    Never by a bare process id that may have been given to another process since (Linux reuses
    them, after 32,768 on many machines): a forked kernel is killed through its pidfd (its fork
    server then ends its process group), a sealed one through its fork server, and a kernel this
    process started itself only while it has not been reaped (its id still its own).
    """
    for handle in list(SETTINGS.handles):
        handle.kill()


class _OwnKernel:
    """A kernel process started here (``subprocess.Popen``): killed, with its process group, only while
    it is ours to reap (a process not waited for keeps its id)."""

    def __init__(self, process: Any):
        self.process = process

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                self.process.kill()


def _ipykernel_args(cmd: list[str]) -> list[str] | None:
    """The arguments after ``-m ipykernel_launcher`` (None if this is not an IPython kernel)."""
    for i in range(len(cmd) - 1):
        if cmd[i] == "-m" and cmd[i + 1] in ("ipykernel_launcher", "ipykernel"):
            return cmd[i + 2 :]
    return None


class SteppedShellChannel(AsyncZMQSocketChannel):
    """A shell channel that waits for a message in steps of at most half a second.

    While nbclient waits on the shell socket for a cell's reply, it sends the kernel an Output
    widget's updates on that same socket; the send can take the socket's (edge-triggered) wake-up,
    and a single wait then sleeps through the reply until its timeout -- the cell's timeout, 60 s
    or more, after which the reply is read as if nothing happened (nbclient issue #312). Seen as
    runs of a few seconds taking 60 or 120 s. Each step ends with a real look at the socket.
    """

    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 0.5 if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return await super().get_msg(timeout=min(0.5, left))
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise


class KernelTampered(RuntimeError):
    """Code run while the kernel started changed what the grading process reads from it: stopped, flagged.

    Raised by ``GuardedExecute`` before the first cell, not while the client starts (where nbclient
    would log it as an error of the run)."""


MESSAGE_BYTES = 16 << 20  # the most of one part of a kernel's message (its content) the worker takes


class GuardedKernelClient(AsyncKernelClient):
    """The client nbclient gets for a grading kernel: ready as soon as the kernel has answered, and
    never asleep on a reply that has come (``SteppedShellChannel``).

    jupyter_client's ``wait_for_ready`` ends by reading IOPub until 0.2 s pass without a
    message: a fixed 0.2 s per notebook. This one takes only what IOPub already holds. What
    comes later (the status messages of the ``kernel_info`` request) is skipped by nbclient,
    which reads each cell's outputs by the id of that cell's request.
    """

    shell_channel_class = Type(SteppedShellChannel)
    # why the kernel cannot be trusted to run the notebook (GuardedExecute stops it)
    tampered: str | None = None

    @default("context")
    def _default_context(self) -> zmq.asyncio.Context:
        # the client connects while the kernel is still starting; zmq retries a refused connection
        # every 100 ms by default, which cost each kernel 0.1-0.2 s of waiting for its first reply
        context = super()._context_default()
        context.setsockopt(zmq.RECONNECT_IVL, 5)
        context.setsockopt(zmq.MAXMSGSIZE, MESSAGE_BYTES)  # a bigger part of a message is never parsed here
        return context

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        while True:
            self.kernel_info()
            try:
                msg = await self.shell_channel.get_msg(timeout=1)
            except Empty:
                pass
            else:
                if msg["msg_type"] == "kernel_info_reply":
                    try:  # IOPub is connected once a message of the request comes through it
                        await self.iopub_channel.get_msg(timeout=0.2)
                    except Empty:
                        pass
                    else:
                        self._handle_kernel_info_reply(msg)
                        break
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")
        while True:
            try:
                await self.iopub_channel.get_msg(timeout=0)
            except Empty:
                break
        # the kernel has bound every socket: its folder becomes root's and read-only, so that code run
        # later cannot put a link where a socket was (root would follow it); code run while the kernel
        # started (it imports from its working folder) could have, so the folder must hold only those
        folder = getattr(self.parent, "_sealed_dir", None)
        if folder and os.geteuid() == 0:
            os.chown(folder, 0, 0)
            os.chmod(folder, 0o755)
            for entry in os.scandir(folder):
                mode = entry.stat(follow_symlinks=False).st_mode
                expected = (
                    stat.S_ISSOCK(mode) if entry.name.startswith("ipc-") else entry.name == "kernel.json"
                )
                if not (expected and not stat.S_ISLNK(mode)):
                    self.tampered = (
                        f"the kernel's socket folder holds {entry.name!r}, which the kernel did not make"
                    )


class GuardedKernelManager(AsyncKernelManager):
    """An AsyncKernelManager whose kernels are sealed, capped, guarded and (when possible) forked."""

    # both: AsyncKernelManager's own client_factory default does not follow client_class
    client_class = DottedObjectName("grader.classroom.kernels.GuardedKernelClient")
    client_factory = Type(klass="grader.classroom.kernels.GuardedKernelClient")

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._sealed_dir: str | None = None
        self._own_area: str | None = None
        sealed = seal.available()[0] if SETTINGS.sealed is None else SETTINGS.sealed
        if sealed:  # inside the seal
            area = SETTINGS.area
            if area is None or not os.path.isdir(area):
                area = self._own_area = tempfile.mkdtemp(prefix="sealed-kernel-", dir=seal.short_tmp())
            self._sealed_dir = tempfile.mkdtemp(prefix="kernel-", dir=area)
            # no network in the seal: the kernel's sockets are files in a folder it can see
            self.transport = "ipc"
            self.ip = os.path.join(self._sealed_dir, "ipc")
            self.connection_file = os.path.join(self._sealed_dir, "kernel.json")

    @property
    def sealed(self) -> bool:
        return self._sealed_dir is not None

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            for folder in (self._own_area, self._sealed_dir):
                if folder:
                    remove_tree(folder)

    cleanup_resources = _async_cleanup_resources

    async def _async_finish_shutdown(
        self, waittime: float | None = None, pollinterval: float = 0.1, restart: bool = False
    ) -> None:
        # a grading kernel ends within milliseconds of its shutdown request: look every 10 ms, not 100
        await super()._async_finish_shutdown(waittime, min(pollinterval, 0.01), restart)

    finish_shutdown = _async_finish_shutdown

    async def _async_shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        if now and not restart and self.owns_kernel and self.has_kernel and self.provisioner is not None:
            # stopped at once (a grading run's kernel, whose outputs have all come): killed, not
            # interrupted first and watched until it is gone; the job then kills what is left of it
            self.shutting_down = True
            self.stop_restarter()
            await self.provisioner.kill()
            await self._async_cleanup_resources()
            return
        await super()._async_shutdown_kernel(now=now, restart=restart)

    shutdown_kernel = _async_shutdown_kernel

    async def _async_wait(self, pollinterval: float = 0.1) -> None:
        # the same for a killed kernel (``Execute.shutdown_kernel = "immediate"``)
        await super()._async_wait(min(pollinterval, 0.01))

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        args = _ipykernel_args(kernel_cmd)
        settings = SETTINGS
        env = kernel_env(kw.get("env"))
        env.update(settings.env)
        cwd = settings.cwd or os.path.realpath(str(kw.get("cwd") or os.getcwd()))
        if args is not None and settings.fork_server is not None:
            if self.sealed != bool(getattr(settings.fork_server, "sealed", False)):
                raise RuntimeError("a sealed kernel needs a sealed fork server (and a plain one a plain one)")
            process = settings.fork_server.fork(
                "kernel",
                argv=args,
                cwd=cwd,
                env=env,
                memory=settings.memory,
                guard=settings.guard,
                log=settings.log,
                threads=settings.threads,
                # sealed: what the notebook's boundary hands to its unprivileged user
                writable=[cwd, self._sealed_dir, env.get("TMPDIR")] if self.sealed else [],
            )
            prov = self.provisioner
            assert prov is not None
            prov.process = process
            prov.pid = process.pid
            prov.cwd = kw.get("cwd")
            # signals go to the process itself (its pidfd, or in the seal through the fork server), never to
            # a group by number: the fork server ends the kernel's process group when the kernel ends
            prov.pgid = None
            settings.handles.append(process)
            self._reconcile_connection_info(prov.connection_info)
            return
        if settings.threads:
            env.setdefault("OMP_NUM_THREADS", str(settings.threads))
            env.setdefault("MKL_NUM_THREADS", str(settings.threads))
        if args is not None:
            spec = json.dumps({"memory": settings.memory, "guard": settings.guard})
            package = seal.RUNTIME_PACKAGE if self.sealed else "grader.classroom"
            kernel_cmd = [sys.executable, "-m", f"{package}.kernel_launcher", spec, *args]
        if self.sealed:
            writable = [cwd, self._sealed_dir]
            tmp = env.get("TMPDIR")
            if tmp and os.path.isdir(tmp):
                writable.append(tmp)
            else:
                env["TMPDIR"] = "/tmp"  # the seal's private /tmp
            kernel_cmd = seal.command(kernel_cmd, writable=writable, cwd=cwd, env=env)
            env = seal.sealed_env(env)
        kw["env"] = env
        await super()._async_launch_kernel(kernel_cmd, **kw)
        prov = self.provisioner
        if prov is not None and getattr(prov, "process", None) is not None:
            settings.handles.append(_OwnKernel(prov.process))
