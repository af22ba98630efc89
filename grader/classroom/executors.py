"""The one seam between a grading run and the machines that do the work.

An executor takes a function and a list of jobs and yields ``(job, result)``
pairs as they finish, in any order, where ``result`` is the function's return
value or the exception that stopped it. Two implementations:

- ``LocalExecutor``: worker processes on this machine (default: one per core);
- ``DaskExecutor``: a Dask distributed cluster (a scheduler address, or a local
  cluster for trying it out), for classes that outgrow one machine. Workers
  need the course installed and ``ATTENTION_COURSE_WORK`` is not needed there:
  a job carries everything it reads and the result everything it wrote.

Both keep a bounded number of jobs in flight, so a class of 2,000 never sits
in memory as pickled jobs.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
from collections.abc import Callable, Iterable, Iterator
from typing import Any

_END = object()

# a folder of a local run's own, named to its workers in their environment: each keeps what it
# writes for itself alone there (its private gradebook), and it goes when the run closes, even
# where the workers could not clean up (they are stopped, not asked to end)
RUN_AREA = "ATTENTION_COURSE_RUN_AREA"


class JobTimeout(TimeoutError):
    """A job ran past the run's deadline for one job: its worker was stopped."""


def default_workers() -> int:
    """One worker per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


# beside its notebooks' kernels and checks' processes, a local run needs its servers and coordinator, and each
# worker: what it may add to its data (``WORKER_DATA``: a kernel's messages, which zmq takes whole, are the
# notebook's to size) and its checks' trusted process; and the least a cap is lowered to (lesson 11's
# solution needs 0.5 GiB in its kernel or its checks' process)
WORKER_DATA = 768 << 20
RUN_RESERVE, WORKER_RESERVE, MEMORY_FLOOR = 768 << 20, WORKER_DATA + (256 << 20), 1 << 30


def fit_memory(workers: int, memory: int | None, free: int | None) -> tuple[int, int | None, str]:
    """Workers and a memory cap per notebook process whose sum the machine holds (``free`` bytes, from
    ``available_memory``): out of memory, Linux kills the largest process, which can be a
    classmate's kernel. The cap is lowered first, down to ``MEMORY_FLOOR``, then workers go; returns
    them, the cap and a sentence on what changed ("" if nothing)."""

    def cap(n: int) -> int:  # each of n notebooks has a kernel and a checks' process
        return (free - RUN_RESERVE - n * WORKER_RESERVE) // (2 * n) if free is not None else 1 << 62

    if memory is None or cap(workers) >= memory:
        return workers, memory, ""
    fewer = workers
    while fewer > 1 and cap(fewer) < MEMORY_FLOOR:
        fewer -= 1
    # in steps of 256 MiB, so that the lesson's proof (it holds for a cap) holds for the next run too
    lowered, gib = max(cap(fewer) >> 28 << 28, 1 << 28), 1 << 30
    note = f"Memory: {free / gib:.1f} GiB free, so {fewer} worker{'s' * (fewer > 1)}"
    note += f" (not {workers})" * (fewer < workers)
    note += f" and a cap of {lowered / gib:.2f} GiB per notebook process (not {memory / gib:.2f})"
    note += "; below 1 GiB a notebook may run out where it would not elsewhere" * (cap(fewer) < MEMORY_FLOOR)
    return fewer, lowered, note + "."


def available_memory() -> int | None:
    """The bytes a grading run may still take here: what the machine has available, or less where a
    memory cgroup this process is in (a container's, or one above it) is nearer its limit, counting the
    page cache it could drop as free. None where Linux does not say."""
    try:
        free = int(re.search(r"^MemAvailable:\s*(\d+) kB", open("/proc/meminfo").read(), re.M)[1]) << 10
        lines = open("/proc/self/cgroup").read().splitlines()
    except (OSError, TypeError):
        return None
    for _, controllers, path in (line.split(":", 2) for line in lines):
        v1 = "memory" in controllers.split(",")  # else v2's one hierarchy, or another v1 controller's
        names = ("limit_in_bytes", "usage_in_bytes", "total_") if v1 else ("max", "current", "")
        parts = path.strip("/").split("/")
        for i in range(len(parts) + 1 if v1 or not controllers else 0):  # this cgroup and those above
            folder = "/".join([f"/sys/fs/cgroup/{controllers}" if v1 else "/sys/fs/cgroup", *parts[:i]])
            with contextlib.suppress(OSError, ValueError, KeyError):  # no such file, or no limit ("max")
                limit, used = (int(open(f"{folder}/memory.{name}").read()) for name in names[:2])
                cache = dict(row.split() for row in open(f"{folder}/memory.stat"))[names[2] + "inactive_file"]
                free = min(free, limit - used + int(cache))
    return max(0, free)


class Executor:
    """Interface: ``run(fn, jobs)`` yields ``(job, result or exception)`` as jobs finish."""

    workers: int = 1

    def run(
        self, fn: Callable[[Any], Any], jobs: Iterable[Any], deadline: float | None = None
    ) -> Iterator[tuple[Any, Any]]:
        """``deadline``: the most seconds one job may run; past it the job's result is a
        ``JobTimeout`` and its worker is replaced (where the executor can stop one)."""
        raise NotImplementedError

    def start(self, jobs: int | None = None) -> None:
        """Start the workers ``jobs`` will need now, before the first job (default: as jobs come)."""

    def helper(self) -> Any:
        """A process of its own beside the workers for work the coordinator hands off (a
        ``concurrent.futures`` executor of one process), where starting one costs nothing
        the coordinator would not pay itself; None where it would."""
        return None

    def close(self) -> None:
        """Stop every worker now (also used on Ctrl-C)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _let_the_forkserver_go() -> None:
    """Close a forked worker's copy of the forkserver's "alive" pipe (multiprocessing hands one to
    every process it forks). The forkserver ends when no process holds that pipe open; if workers
    held it, a killed coordinator would leave the forkserver running, and so the workers, who end
    only when it does."""
    with contextlib.suppress(AttributeError, OSError):
        from multiprocessing import forkserver

        fd, forkserver._forkserver._forkserver_alive_fd = forkserver._forkserver._forkserver_alive_fd, None
        if fd is not None:
            os.close(fd)


def _init_worker(
    initializer: Callable[[], None] | None,
    coordinator: int | None = None,
    area: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> None:
    import signal

    if env is not None:  # forked from the shared forkserver: take the environment of the run, not its own
        os.environ.clear()
        os.environ.update(env)
        if cwd:
            os.chdir(cwd)
        _let_the_forkserver_go()
    if area is not None:
        os.environ[RUN_AREA] = area

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle
    try:  # and if the coordinator is killed, its workers go too (Linux): with it, or with its forkserver
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort
        pass
    else:  # killed before the line above: the signal will never come, so go now
        parent = os.getppid()
        if coordinator is not None and coordinator not in (parent, _parent_of(parent)):
            os._exit(1)
    if initializer is not None:
        initializer()
    # what this worker may add to its data from now on (soft: the fork servers it starts lift it); past it,
    # the worker ends, and only its own job counts that (``run``)
    with contextlib.suppress(OSError, StopIteration), open("/proc/self/status") as status:
        cap = WORKER_DATA + next(int(ln.split()[1]) << 10 for ln in status if ln.startswith("VmData:"))
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        resource.setrlimit(
            resource.RLIMIT_DATA, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard)
        )


def _ready() -> None:
    """A job that does nothing: it makes a worker start (and run its initializer) at once."""


_FORKED_POOLS = 0  # local executors whose workers come from the forkserver, not yet closed


def _stop_the_forkserver() -> None:
    """End multiprocessing's forkserver, so that the next pool's workers come from a new one, forked
    from the coordinator as it is then (its code, umask, limits, streams), and nothing is left
    listening for forks between runs."""
    with contextlib.suppress(AttributeError, OSError, ChildProcessError):
        import signal
        from multiprocessing import forkserver

        pid = forkserver._forkserver._forkserver_pid
        if pid is not None:
            # it holds nothing to save (its workers are gone), and a clean exit would cost it most
            # of a second of CPU tearing down the modules it preloaded, while the run waits for it
            os.kill(pid, signal.SIGKILL)
        forkserver._forkserver._stop()  # reaps it and removes its socket


class LocalExecutor(Executor):
    """A pool of worker processes on this machine, which start clean.

    One worker is spawned: it starts at once, and loads what it needs while it warms up. Two or
    more are forked from multiprocessing's forkserver, which has imported ``preload`` once for all
    of them (nbgrader: about 0.7 s of CPU that each worker would otherwise spend on its own); each
    takes the environment and folder of the run that makes the pool, not the forkserver's, and
    the forkserver ends when the last executor that uses it closes.
    """

    def __init__(
        self,
        workers: int | None = None,
        initializer: Callable[[], None] | None = None,
        preload: tuple[str, ...] = (),
    ):
        self.workers = workers or default_workers()
        self._initializer = initializer
        self._preload = tuple(preload)
        self._pool = None
        self._forked = False
        self._helper = None
        self._area: str | None = None

    def _context(self) -> tuple[Any, tuple]:
        """The multiprocessing context new processes come from, and their ``_init_worker`` arguments
        (without the initializer)."""
        import multiprocessing

        if self.workers >= 2 and self._preload and "forkserver" in multiprocessing.get_all_start_methods():
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(list(self._preload))  # read when the forkserver starts
            if not self._forked:
                global _FORKED_POOLS
                self._forked, _FORKED_POOLS = True, _FORKED_POOLS + 1
            return context, (os.getpid(), self._run_area(), dict(os.environ), os.getcwd())
        return multiprocessing.get_context("spawn"), (os.getpid(), self._run_area())

    def _run_area(self) -> str:
        if self._area is None:
            import tempfile

            self._area = tempfile.mkdtemp(prefix="classroom-run-")
        return self._area

    def _new_pool(self):
        from concurrent.futures import ProcessPoolExecutor

        context, args = self._context()
        return ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=context,
            initializer=_init_worker,
            initargs=(self._initializer, *args),
        )

    def helper(self) -> Any:
        """One more process forked from the workers' forkserver, so it has what they preloaded
        (nbgrader) without loading it, and none of their warm-up (no fork servers); None where the
        workers are spawned (a spawned helper would load all that anew). Closed with the workers."""
        if self._helper is None:
            context, args = self._context()
            if context.get_start_method() != "forkserver":
                return None
            from concurrent.futures import ProcessPoolExecutor

            self._helper = ProcessPoolExecutor(
                max_workers=1, mp_context=context, initializer=_init_worker, initargs=(None, *args)
            )
        return self._helper

    def start(self, jobs: int | None = None) -> None:
        """Start the workers now: each warms up (its initializer) while the caller still prepares jobs."""
        if self._pool is None:
            self._pool = self._new_pool()
            # each waiting job spawns one more worker, up to the pool's size
            for _ in range(min(self.workers, jobs or self.workers)):
                self._pool.submit(_ready)

    def run(
        self, fn: Callable[[Any], Any], jobs: Iterable[Any], deadline: float | None = None
    ) -> Iterator[tuple[Any, Any]]:
        import time
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        source = iter(jobs)
        pending: list[Any] = []
        suspects: list[Any] = []  # jobs in flight when a worker died beside others: each runs again alone
        attempts: dict[int, int] = {}
        in_flight: dict[Any, Any] = {}
        running_since: dict[Any, float] = {}  # when each future was first seen running
        if self._pool is None:
            self._pool = self._new_pool()
        window = 2 * self.workers
        while True:
            while len(in_flight) < (1 if suspects else window):
                # (an ended iterator stays ended)
                job = suspects.pop() if suspects else pending.pop() if pending else next(source, _END)
                if job is _END:
                    break
                try:
                    in_flight[self._pool.submit(fn, job)] = job
                except BrokenProcessPool:  # a worker died before any job of ours ran (while warming up)
                    self._pool.shutdown(wait=False, cancel_futures=True)
                    self._pool = self._new_pool()
                    in_flight[self._pool.submit(fn, job)] = job
            if not in_flight:
                break
            done, _ = wait(list(in_flight), timeout=1.0 if deadline else None, return_when=FIRST_COMPLETED)
            broken = []
            if deadline and not done:
                late = self._late(in_flight, running_since, deadline, time.monotonic())
                if late:
                    for fut in late:
                        yield (
                            in_flight.pop(fut),
                            JobTimeout(f"could not be graded: timed out after {deadline:.0f} s"),
                        )
                    # a worker cannot be stopped alone: the others' jobs start again, not counted as attempts
                    pending += list(in_flight.values())
                    in_flight.clear()
                    running_since.clear()
                    self._stop_pools([self._pool])
                    self._pool = self._new_pool()
                    continue
            for fut in done:
                running_since.pop(fut, None)
                job = in_flight.pop(fut)
                try:
                    outcome = fut.result()
                except BrokenProcessPool:
                    broken.append(job)
                    continue
                except BaseException as e:  # noqa: BLE001 - the job's own failure is its result
                    outcome = e
                yield job, outcome  # (the caller may stop taking results here: nothing is swallowed)
            if broken:
                # a worker died (killed, out of its memory): a new pool. Which job ended it cannot be told beside
                # others, so each runs again alone, and only a job that ends its worker alone counts it (twice:
                # it could not be graded), never a classmate's graded beside it
                broken += list(in_flight.values())
                in_flight.clear()
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = self._new_pool()
                if len(broken) > 1:
                    suspects += broken
                    continue
                attempts[id(broken[0])] = n = attempts.get(id(broken[0]), 0) + 1
                if n >= 2:
                    yield (
                        broken[0],
                        RuntimeError("the worker process died twice while grading this submission"),
                    )
                else:
                    suspects += broken

    @staticmethod
    def _late(in_flight: dict, running_since: dict, deadline: float, now: float) -> list:
        """The futures running for longer than ``deadline`` (a future counts from when it is seen
        running: queued ones wait their turn)."""
        return [f for f in in_flight if f.running() and now - running_since.setdefault(f, now) > deadline]

    @staticmethod
    def _stop_pools(pools: list) -> None:
        """Stop these pools' worker processes now (terminated, then killed if they linger)."""
        processes = [p for pool in pools for p in (getattr(pool, "_processes", None) or {}).values()]
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            with contextlib.suppress(Exception):
                p.terminate()
        for p in processes:
            p.join(timeout=10)
        for p in processes:  # one that would not end: it must not keep the forkserver (below) waiting
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

    def close(self) -> None:
        self._stop_pools([p for p in (self._pool, self._helper) if p is not None])
        self._pool = self._helper = None
        self._remove_run_area()
        if self._forked:
            global _FORKED_POOLS
            self._forked, _FORKED_POOLS = False, _FORKED_POOLS - 1
            if _FORKED_POOLS == 0:
                _stop_the_forkserver()

    def _remove_run_area(self) -> None:
        if self._area is not None:
            from grader.classroom.trees import remove_tree

            remove_tree(self._area)
            self._area = None


class DaskExecutor(Executor):
    """Run jobs on a Dask distributed cluster.

    ``address``: a running scheduler (``tcp://host:8786``); without one, a local
    cluster of ``workers`` single-threaded worker processes is started.
    """

    def __init__(self, address: str | None = None, workers: int | None = None):
        from distributed import Client, LocalCluster

        self._cluster = None
        if address:
            self._client = Client(address)
        else:
            self._cluster = LocalCluster(
                n_workers=workers or default_workers(),
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                memory_limit=0,
            )
            self._client = Client(self._cluster)
        self.workers = max(1, len(self._client.scheduler_info().get("workers", {})) or (workers or 1))

    def run(
        self, fn: Callable[[Any], Any], jobs: Iterable[Any], deadline: float | None = None
    ) -> Iterator[tuple[Any, Any]]:
        """(``deadline`` is not enforced on a cluster: each job's own deadlines, per notebook and per
        request to a fork server, still hold there.)"""
        from distributed import as_completed

        source = iter(jobs)
        window = 2 * self.workers
        futures = {}
        first = []
        while len(first) < window:
            job = next(source, _END)
            if job is _END:
                break
            fut = self._client.submit(fn, job, pure=False)
            futures[fut.key] = job
            first.append(fut)
        stream = as_completed(first)
        for fut in stream:
            job = futures.pop(fut.key)
            try:
                outcome = fut.result()
            except BaseException as e:  # noqa: BLE001 - the job's own failure is its result
                outcome = e
            yield job, outcome
            fut.release()
            nxt = next(source, _END)
            if nxt is not _END:
                new = self._client.submit(fn, nxt, pure=False)
                futures[new.key] = nxt
                stream.add(new)

    def close(self) -> None:
        try:
            self._client.close()
        finally:
            if self._cluster is not None:
                self._cluster.close()


def make(
    kind: str = "local",
    workers: int | None = None,
    address: str | None = None,
    initializer=None,
    preload: tuple[str, ...] = (),
) -> Executor:
    """An executor by name: ``local`` or ``dask`` (``initializer`` and ``preload``: local only)."""
    if kind == "local":
        return LocalExecutor(workers, initializer, preload)
    if kind == "dask":
        return DaskExecutor(address, workers)
    raise ValueError(f"unknown executor {kind!r} (use 'local' or 'dask')")
