"""Worker processes that end with the process that started them.

A pool's workers otherwise outlive a parent killed by a signal it cannot catch (``kill -9``, an
out-of-memory kill) and go on working for nobody: measured, a sweep's worker ran 22 minutes after
its parent was gone. Every pool ovsim starts comes from :func:`worker_pool`; sweeps and schedule
searches can run on a Dask cluster instead (:func:`executor`).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import context, forkserver
from typing import Any

from ovsim.errors import OvsimError

_HOLDS_SIGNALS = hasattr(signal, "pthread_sigmask")


def _watch_parent(parent_pid: int) -> None:
    """In a worker: end this process when its parent is gone, and end it quietly on Ctrl-C, which
    reaches the whole process group: the parent says "interrupted" once, and no worker prints a
    traceback. A Ctrl-C that came before this ran was held or ignored (:class:`_HeldStart`).

    A worker whose parent is gone is re-parented. Under ``forkserver`` its parent is the server,
    which outlives a killed pool's process: there the worker watches that process itself."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    if _HOLDS_SIGNALS:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    born_under = os.getppid()
    if born_under != parent_pid and not _running(parent_pid):
        os._exit(1)  # the pool's process ended before this worker had started

    def watch() -> None:
        while os.getppid() == born_under and (born_under == parent_pid or _running(parent_pid)):
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


class _HeldStart:
    """A worker process that keeps quiet about a Ctrl-C before :func:`_watch_parent` has put its
    handler in place. Without this, a Ctrl-C in the moment between a worker's start and its
    initializer raised KeyboardInterrupt there: the worker printed a traceback under the parent's
    one line.

    - ``fork``: the worker is born with Ctrl-C blocked, so one that comes meanwhile waits and then
      ends it; the parent's own waits, pending, for the moment of the fork.
    - ``spawn``: a fresh interpreter keeps an ignored signal but not a blocked one, so the parent
      ignores Ctrl-C while it starts the worker, and a Ctrl-C in that moment may reach neither.
      The parent then ends with the next one, and the worker with its parent.
    - ``forkserver``: the worker's signals are the fork server's, whoever started it. The server
      is started outside the moment Ctrl-C is ignored (else it, and every process it forks for
      anyone, would ignore Ctrl-C for good), and a KeyboardInterrupt in the worker's run before
      the handler ends it quietly; one in the moment before its run (unpickling its task) still
      prints one.
    """

    def start(self) -> None:
        method = self._start_method  # type: ignore[attr-defined]
        if method == "forkserver":
            forkserver.ensure_running()
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        ignore = (method == "spawn" and threading.current_thread() is threading.main_thread()
                  and signal.getsignal(signal.SIGINT) is not None)  # None: a handler not Python's
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignore else None
        try:
            super().start()  # type: ignore[misc]
        finally:
            if ignore:
                signal.signal(signal.SIGINT, handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def run(self) -> None:
        try:
            super().run()  # type: ignore[misc]
        except KeyboardInterrupt:
            os._exit(130)


# Classes at module level: a spawned worker's process object is pickled by name.
if _HOLDS_SIGNALS:
    class _HeldFork(_HeldStart, context.ForkProcess):
        pass

    class _HeldSpawn(_HeldStart, context.SpawnProcess):
        pass

    class _HeldForkServer(_HeldStart, context.ForkServerProcess):
        pass

    class _HeldForkContext(context.ForkContext):
        Process = _HeldFork

    class _HeldSpawnContext(context.SpawnContext):
        Process = _HeldSpawn

    class _HeldForkServerContext(context.ForkServerContext):
        Process = _HeldForkServer

    _HELD = {"fork": _HeldForkContext, "spawn": _HeldSpawnContext, "forkserver": _HeldForkServerContext}


def _worker_context(method: str | None = None) -> context.BaseContext:
    """The context of start ``method`` (the default one when None), its processes started with
    Ctrl-C held (:class:`_HeldStart`)."""
    chosen = multiprocessing.get_context(method)
    if not _HOLDS_SIGNALS:
        return chosen
    return _HELD[chosen.get_start_method()]()


def _running(pid: int) -> bool:
    """Whether process ``pid`` is there and not a zombie (killed, not yet reaped: gone as far as
    work goes). Only a forkserver's worker asks, on a POSIX system (on Windows, ``os.kill`` with
    0 would send a Ctrl-C)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[-1][:1] != "Z"
    except OSError:  # no /proc (macOS): there and, as far as can be told, running
        return True


def worker_pool(jobs: int) -> ProcessPoolExecutor | None:
    """A pool of ``jobs`` processes that end with this one; None for one job (run in process)."""
    if jobs <= 1:
        return None
    return ProcessPoolExecutor(max_workers=jobs, mp_context=_worker_context(), initializer=_watch_parent,
                               initargs=(os.getpid(),))


class ClusterPool:
    """Predictions on a Dask cluster (``dask.distributed``), with the part of
    :class:`~concurrent.futures.Executor` that sweeps and searches use: ``map`` gives the results in
    the order asked, an exception where its call raised; ``shutdown`` cancels what has not run.

    The cluster's workers need ovsim installed, and the files a scenario names (calibration files,
    a system file) at the same paths: a shared filesystem or the same image."""

    def __init__(self, address: str) -> None:
        try:
            # distributed ships without type hints: its client is used as Any.
            client_class: Any = importlib.import_module("distributed").Client
        except ImportError:
            raise OvsimError("a cluster scheduler needs Dask's distributed: pip install -e \".[cluster]\"",
                             field="--scheduler") from None
        try:
            self._client: Any = client_class(address, timeout=10)
        except (OSError, TimeoutError) as e:
            raise OvsimError(f"cannot reach the Dask scheduler at {address}: {e}", field="--scheduler") from None
        self._futures: list[Any] = []

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any]) -> Iterator[Any]:
        futures = [self._client.submit(fn, *args, pure=False) for args in zip(*iterables, strict=False)]
        self._futures += futures
        return (f.result() for f in futures)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            self._client.cancel([f for f in self._futures if not f.done()])
        self._client.close()

    def __enter__(self) -> ClusterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def executor(jobs: int, scheduler: str | None = None) -> ProcessPoolExecutor | ClusterPool | None:
    """Where predictions run: on the Dask cluster whose scheduler is at ``scheduler`` (an address
    such as ``tcp://10.0.0.1:8786``, or ``OVSIM_SCHEDULER`` when None), else :func:`worker_pool`."""
    address = scheduler or os.environ.get("OVSIM_SCHEDULER")
    if address:
        return ClusterPool(address)
    return worker_pool(jobs)
