"""Ctrl-C ends a command with one line: a pool's worker ends quietly, even one that the Ctrl-C
reaches before its handler is in place, and an error the interrupt caused is the interrupt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_limits import _alive, _all_end

from ovsim.cli import main
from ovsim.workers import _watch_parent, _worker_context

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gemm-allreduce-h100x4-priority.yaml"


def _late_watch(parent_pid: int, running: Any, ready: Any) -> None:
    running.set()
    time.sleep(1.0)  # the moment between a worker's start and its initializer, drawn out
    _watch_parent(parent_pid)
    ready.set()
    time.sleep(30)


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_ctrl_c_before_the_workers_handler_prints_nothing(method: str, capfd: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C reached a worker still starting: it raised KeyboardInterrupt there, and the worker
    printed a traceback (exit 1) under the parent's "ovsim: interrupted" (seen once in CI). A forked
    worker holds that Ctrl-C until its handler is in place and then ends with 130; a spawned one
    holds or ignores it, and a fork server's may miss it: each ends with 130 by the next."""
    if sys.platform == "darwin" and method == "fork":
        pytest.skip("fork is unsafe on macOS")
    handler = signal.getsignal(signal.SIGINT)
    started_by: Any = _worker_context(method)  # typeshed's BaseContext names no Process
    running, ready = started_by.Event(), started_by.Event()
    process = started_by.Process(target=_late_watch, args=(os.getpid(), running, ready))
    process.start()
    try:
        if method == "forkserver":
            # Its child has the server's signals until it runs (workers._HeldStart): a Ctrl-C
            # while it unpickles its task still prints a traceback.
            assert running.wait(60)
        os.kill(process.pid, signal.SIGINT)
        deadline = time.monotonic() + 60
        while process.is_alive() and not ready.wait(0.1):
            assert time.monotonic() < deadline, "the worker never put its handler in place"
        if process.is_alive():  # born ignoring the first, or it came before a fork server's child had its own
            assert method != "fork"
            os.kill(process.pid, signal.SIGINT)
        process.join(60)
        assert process.exitcode == 130
        assert "KeyboardInterrupt" not in capfd.readouterr().err
    finally:
        if process.is_alive():
            process.kill()
    # The parent's own Ctrl-C was held or ignored only while it started the worker.
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    assert signal.getsignal(signal.SIGINT) is handler


def test_an_error_while_a_ctrl_c_is_handled_is_the_interrupt(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C that cut short the start of a pool's manager thread left the pool's ``with`` a
    thread it cannot join: its RuntimeError reported an internal error (exit 3) where the user had
    pressed Ctrl-C (seen with a Ctrl-C at a sweep's first moment)."""
    def cut_short(args: object) -> int:
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("cannot join thread before it is started")

    monkeypatch.setattr("ovsim.cli.sweep.run_sweep", cut_short)
    assert main(["sweep", str(EXAMPLE), "--axis", "ops.gemm.m=1024", "--quiet"]) == 130
    assert capsys.readouterr().err.strip() == "ovsim: interrupted"


def test_an_error_of_its_own_is_still_an_internal_error(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    def fails(args: object) -> int:
        try:
            raise ValueError("handled")
        except ValueError:
            raise RuntimeError("a bug") from None

    monkeypatch.setattr("ovsim.cli.sweep.run_sweep", fails)
    monkeypatch.delenv("OVSIM_DEBUG", raising=False)
    assert main(["sweep", str(EXAMPLE), "--axis", "ops.gemm.m=1024", "--quiet"]) == 3
    assert "internal error: RuntimeError: a bug" in capsys.readouterr().err


_POOL_THAT_NAMES_ITS_WORKERS = """
import multiprocessing, sys, time
from ovsim.workers import worker_pool
multiprocessing.set_start_method(sys.argv[1])
pool = worker_pool(2)
futures = [pool.submit(time.sleep, 60) for _ in range(2)]
while len(pool._processes) < 2:
    time.sleep(0.1)
print(*pool._processes, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawned_workers_end_when_their_parent_is_killed(method: str) -> None:
    """Under ``forkserver`` (Python 3.14's default on Linux) a worker's parent is the fork server,
    not the pool's process: the watch compared its parent with the pool's process and ended every
    worker at once; and the server outlives a killed pool's process. (``fork``: test_limits.py.)"""
    parent = subprocess.Popen([sys.executable, "-c", _POOL_THAT_NAMES_ITS_WORKERS, method],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        time.sleep(2)  # the workers have started their 60-s sleeps
        assert len(workers) == 2 and all(_alive(w) for w in workers)
        parent.kill()
        parent.wait()
        _all_end(workers)
    finally:
        if parent.poll() is None:
            parent.kill()
        if parent.stdout is not None:
            parent.stdout.close()
