"""Worker processes that end with the process that started them.

A pool's workers otherwise outlive a parent killed by a signal it cannot catch (``kill -9``, an
out-of-memory kill) and go on working for nobody: measured, a sweep's worker ran 22 minutes after
its parent was gone. Every pool ovsim starts comes from :func:`worker_pool`.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor


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
