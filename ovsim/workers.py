"""Worker processes that end with the process that started them.

A pool's workers otherwise outlive a parent killed by a signal it cannot catch (``kill -9``, an
out-of-memory kill) and go on working for nobody: measured, a sweep's worker ran 22 minutes after
its parent was gone. Every pool ovsim starts comes from :func:`worker_pool`; sweeps and schedule
searches can run on a Dask cluster instead (:func:`executor`).
"""

from __future__ import annotations

import importlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from ovsim.errors import OvsimError


def _watch_parent(parent_pid: int) -> None:
    """In a worker: end this process when its parent is gone (it is then re-parented), and end it
    quietly on Ctrl-C, which reaches the whole process group: the parent says "interrupted" once,
    and no worker prints a traceback."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def worker_pool(jobs: int) -> ProcessPoolExecutor | None:
    """A pool of ``jobs`` processes that end with this one; None for one job (run in process)."""
    if jobs <= 1:
        return None
    return ProcessPoolExecutor(max_workers=jobs, initializer=_watch_parent, initargs=(os.getpid(),))


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
