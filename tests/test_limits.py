"""Runaway work is refused before it starts, and a sweep's workers end with their parent."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ovsim.api import predict
from ovsim.cli import main
from ovsim.errors import OvsimError
from ovsim.sweep import sweep

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gemm-allreduce-h100x4-priority.yaml"


def _repeated(tmp_path: Path, repeat: int) -> Path:
    p = tmp_path / "big.yaml"
    p.write_text(EXAMPLE.read_text().replace("    stream: comm\n", f"    stream: comm\n    repeat: {repeat}\n"))
    return p


def test_a_huge_repeat_is_refused_at_once_with_its_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # It used to grow memory by about 10 MB/s with nothing printed.
    start = time.perf_counter()
    assert main(["predict", str(_repeated(tmp_path, 10**9)), "--quiet"]) == 2
    assert time.perf_counter() - start < 5
    err = capsys.readouterr().err
    # 4 ranks x (1 GEMM + 1e9 all-reduces)
    assert "4,000,000,004 ops" in err and "--max-ops 4000000004" in err


def test_the_limit_is_the_callers(tmp_path: Path) -> None:
    p = _repeated(tmp_path, 3)  # 4 x (1 + 3) = 16 ops
    with pytest.raises(OvsimError, match="16 ops"):
        predict(p, mode="analytic", max_ops=15)
    assert len(predict(p, mode="analytic", max_ops=16).workload.ops) == 16


def test_too_many_combinations_are_refused_before_any_is_built(capsys: pytest.CaptureFixture[str]) -> None:
    # 100 x 100 x 100 values once ran for minutes and reached 4.9 GB.
    values = ",".join(str(v) for v in range(1, 102))
    args = ["sweep", str(EXAMPLE), "--axis", f"ops.gemm.m={values}", "--axis", f"ops.gemm.n={values[:-4]}", "--quiet"]
    start = time.perf_counter()
    assert main(args) == 2
    assert time.perf_counter() - start < 5
    assert "10,100 combinations" in capsys.readouterr().err  # 101 x 100
    with pytest.raises(OvsimError, match=r"6 combinations.*--max-combinations 6"):
        sweep(EXAMPLE, {"ops.gemm.m": [1, 2, 3], "ops.gemm.n": [1, 2]}, max_combinations=5)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) is gone as far as work goes.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1].split()[0] != "Z"


def _two_workers(parent: subprocess.Popen[str] | subprocess.Popen[bytes]) -> list[int]:
    """The parent's worker processes, once it has started two (within a minute)."""
    deadline = time.monotonic() + 60
    while len(workers := _children(parent.pid)) < 2:
        assert time.monotonic() < deadline and parent.poll() is None, "the workers never started"
        time.sleep(0.2)
    return workers


def _all_end(workers: list[int]) -> None:
    deadline = time.monotonic() + 10
    while any(_alive(w) for w in workers):
        assert time.monotonic() < deadline, "a worker outlived its parent by 10 s"
        time.sleep(0.2)


# A sweep's worker once went on for 22 minutes after its parent was killed. Each sweep combination
# takes about 30 s (30,000 all-reduces on 4 ranks), so a worker left behind would still be
# predicting when the deadline passes. validate's, the studies' and the framework checks' pools come
# from the same place as the sweep's (ovsim.workers): a worker busy for a minute must go too.
_KILLED_PARENTS = {
    "sweep": "from ovsim.sweep import sweep; import sys; "
             "sweep(sys.argv[1], {'ops.gemm.m': [1024, 2048, 4096]}, workers=2)",
    "any pool": "import time; from ovsim.workers import worker_pool; pool = worker_pool(2); "
                "futures = [pool.submit(time.sleep, 60) for _ in range(2)]; time.sleep(60)",
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and ps --ppid")
@pytest.mark.parametrize("parent_code", list(_KILLED_PARENTS.values()), ids=list(_KILLED_PARENTS))
def test_workers_end_when_their_parent_is_killed(tmp_path: Path, parent_code: str) -> None:
    parent = subprocess.Popen([sys.executable, "-c", parent_code, str(_repeated(tmp_path, 30000))])
    try:
        workers = _two_workers(parent)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        _all_end(workers)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_no_module_starts_a_pool_of_its_own() -> None:
    """Every process pool comes from ovsim.workers.worker_pool, which ties it to its parent."""
    root = Path(__file__).resolve().parents[1] / "ovsim"
    offenders = [p.name for p in root.rglob("*.py")
                 if p.name != "workers.py" and "ProcessPoolExecutor(" in p.read_text()]
    assert offenders == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and ps --ppid")
def test_ctrl_c_ends_the_sweep_and_its_workers(tmp_path: Path) -> None:
    """Ctrl-C on a terminal interrupts the whole foreground process group: the command exits 130
    with one line and leaves no worker predicting."""
    parent = subprocess.Popen([sys.executable, "-m", "ovsim.cli", "sweep", str(_repeated(tmp_path, 30000)),
                               "--axis", "ops.gemm.m=1024,2048,4096", "--workers", "2", "--quiet"],
                              start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        workers = _two_workers(parent)
        os.killpg(parent.pid, signal.SIGINT)
        _, err = parent.communicate(timeout=20)
        assert parent.returncode == 130 and err.strip().splitlines()[-1] == "ovsim: interrupted"
        _all_end(workers)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)


@pytest.mark.parametrize("ctrl_c", [True, False])
def test_workers_gone_at_a_ctrl_c_read_as_interrupted(ctrl_c: bool, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C ends a pool's workers at once, and the pool can report them gone (BrokenProcessPool)
    before the command has taken its own interrupt: the command still exits 130 with one line. A
    pool broken with no Ctrl-C stays an internal error."""
    import threading
    from concurrent.futures.process import BrokenProcessPool

    cli_main = importlib.import_module("ovsim.cli.main")  # the package's `main` is the function

    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))

    def broken(_args: object) -> None:
        if ctrl_c:  # the interrupt arrives just after the pool's report
            timer.start()
        raise BrokenProcessPool("A process in the process pool was terminated abruptly")

    monkeypatch.setattr(cli_main, "_refuse_clobber", broken)
    try:
        code = main(["predict", str(EXAMPLE), "--quiet"])
        if ctrl_c:  # a Ctrl-C the command did not take, however late, is taken here
            timer.join()
            time.sleep(0.1)
    except KeyboardInterrupt:
        code = -1
    err = capsys.readouterr().err.strip().splitlines()
    if ctrl_c:
        assert code == 130 and err == ["ovsim: interrupted"]
    else:
        assert code == 3 and len(err) == 1 and err[0].startswith("ovsim: internal error: BrokenProcessPool")


@pytest.mark.parametrize(("old", "new"), [
    ("size_bytes: 896.0e6", "size_bytes: 1.0e27"),  # an all-reduce of 4e15 s
    ("    m: 8192\n", "    m: 8000000000000000\n"),  # a GEMM of about 7e9 s
])
def test_an_op_of_years_is_refused_with_its_name(tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str,
                                                 new: str) -> None:
    # An all-reduce of 1e27 bytes once ended in an internal error (a window of the power-limit loop
    # rounded to 0 s beside it) and, without the loop, in a makespan of 4e21 ms.
    text = EXAMPLE.read_text()
    assert old in text
    p = tmp_path / "huge.yaml"
    p.write_text(text.replace(old, new))
    for mode in ("simulate", "analytic"):
        assert main(["predict", str(p), "--mode", mode, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "over the longest op" in err and str(p) in err
        assert ("ops.allreduce" if "size_bytes" in old else "ops.gemm") in err


def test_a_long_op_below_the_limit_runs(tmp_path: Path) -> None:
    # 1e19 bytes on the wire: about 4e7 s at the bus bandwidth of hundreds of GB/s, under 1e9 s.
    p = tmp_path / "long.yaml"
    p.write_text(EXAMPLE.read_text().replace("size_bytes: 896.0e6", "size_bytes: 1.0e19"))
    assert 1e6 < predict(p, mode="analytic").timeline.makespan_s < 1e9


def test_an_op_of_years_is_refused_in_every_build_of_a_search() -> None:
    # A schedule search's builds share priced kernels (build_memo): the first build once kept the
    # GEMM's price before refusing it, and the next build, with other knobs, took it unchecked.
    from ovsim.api import build
    from ovsim.models.build_memo import reusing_builds
    from ovsim.scenario import Scenario

    def scenario(channels: int) -> Scenario:
        return Scenario.model_validate({"name": "big", "system": "h100x4", "knobs": {"nccl_channels": channels},
                                        "ops": [{"name": "g", "kind": "gemm", "m": 10**9, "n": 10**9, "k": 10**9},
                                                {"name": "ar", "kind": "all_reduce", "size_bytes": 1e6,
                                                 "after": ["g"]}]})

    with reusing_builds():
        for channels in (2, 4):
            with pytest.raises(OvsimError, match=r"ops\.g: takes .* over the longest op"):
                build(scenario(channels), "big")
