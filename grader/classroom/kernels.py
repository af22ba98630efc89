"""How a student's kernel is started while a notebook is graded: forked from the fork server, in its boundary.

nbclient asks its kernel manager to launch ``python -m ipykernel_launcher -f
<connection file>``. While a notebook is graded, ``GuardedKernelManager`` has the
worker's fork server fork that kernel instead (torch already imported): the sealed
fork server where bubblewrap works, so the kernel starts in a boundary of its own
(``grader.classroom.boundary``) and talks over IPC sockets in a folder bound into
the seal, as it has no network; in every case with the memory cap and the guard's
audit hook in place before any student code runs, and an environment that does not
point at the course's work folder. No other kernel grades: outside a grading run
(``nbgrader validate`` of an instructor's source) the kernel starts as Jupyter starts it.

Plain ``nbgrader autograde`` (and the formgrader's Autograde button) uses the
same manager through the course's ``nbgrader_config.py``, with the same fork
servers, started at its first notebook and kept for the rest of the run: there
the sealed kernel works in a copy of the autograded folder inside the seal.
"""

from __future__ import annotations

import os
import stat
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

from grader.classroom.servers import kernel_env
from grader.classroom.trees import remove_tree


@dataclass
class KernelSettings:
    """What the next kernel of this worker gets (set by the job before nbgrader runs)."""

    fork_server: Any = None  # a grader.classroom.fork_client.ForkServer; None when not grading
    memory: int | None = None
    guard: dict = field(default_factory=dict)
    log: str | None = None
    # the current job's kernels: each knows how to kill itself (and what it started)
    handles: list[Any] = field(default_factory=list)
    env: dict = field(default_factory=dict)  # extra environment (private TMPDIR, IPYTHONDIR)
    threads: int = 1  # torch threads per kernel (several kernels share the machine)
    sealed: bool = False  # forked from the sealed fork server (set by the notebook's lifecycle)
    area: str | None = None  # a writable folder the seal shows, for connection files and IPC sockets
    cwd: str | None = None  # where the kernel works, if not nbclient's folder (plain nbgrader's sealed copy)


SETTINGS = KernelSettings()


def kill_all() -> None:
    """Kill every kernel started for the current job (and whatever they started).

    Never by a bare process id that may have been given to another process since (Linux reuses
    them, after 32,768 on many machines): a forked kernel is killed through its pidfd (its fork
    server then ends its process group), a sealed one through its fork server.
    """
    for handle in list(SETTINGS.handles):
        handle.kill()


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
    """An AsyncKernelManager whose grading kernels are forked by the fork server: sealed, capped, guarded."""

    # both: AsyncKernelManager's own client_factory default does not follow client_class
    client_class = DottedObjectName("grader.classroom.kernels.GuardedKernelClient")
    client_factory = Type(klass="grader.classroom.kernels.GuardedKernelClient")

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._sealed_dir: str | None = None
        if SETTINGS.sealed:  # forked inside the seal: its connection file and sockets in the area it shows
            self._sealed_dir = tempfile.mkdtemp(prefix="kernel-", dir=SETTINGS.area)
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
            if self._sealed_dir:
                remove_tree(self._sealed_dir)

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
        settings = SETTINGS
        if settings.fork_server is None:
            if self.sealed or settings.guard:  # every kernel that grades has a boundary: the fork server's
                raise RuntimeError("a grading kernel is forked from its fork server, and none is set")
            await super()._async_launch_kernel(kernel_cmd, **kw)  # not grading (``nbgrader validate``)
            return
        args = _ipykernel_args(kernel_cmd)
        if args is None:
            raise RuntimeError(f"notebooks are graded with the IPython kernel only, not {kernel_cmd[:3]}")
        if self.sealed != bool(getattr(settings.fork_server, "sealed", False)):
            raise RuntimeError("a sealed kernel needs a sealed fork server (and a plain one a plain one)")
        env = kernel_env(kw.get("env"))
        env.update(settings.env)
        cwd = settings.cwd or os.path.realpath(str(kw.get("cwd") or os.getcwd()))
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
