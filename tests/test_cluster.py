"""Sweeps and schedule searches on a Dask cluster (--scheduler): the same results as in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ovsim.cli import main
from ovsim.sweep import sweep
from ovsim.tune import tune

distributed = pytest.importorskip("distributed")

A100 = Path(__file__).resolve().parents[1] / "examples" / "gemm-allreduce-a100x4-overlapped.yaml"
AXES = {"knobs.comm_priority": ["normal", "high"], "knobs.sm_carveout": [0, 16]}


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A local cluster of two worker processes: predictions cross a process boundary, pickled, as
    on a real cluster."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def test_a_sweep_on_a_cluster_equals_the_sweep_in_process(scheduler: str) -> None:
    here = sweep(A100, AXES)
    there = sweep(A100, AXES, scheduler=scheduler)
    assert there.equals(here)


def test_a_schedule_search_on_a_cluster_picks_what_it_picks_in_process(scheduler: str) -> None:
    here = tune(A100, space=AXES)
    there = tune(A100, space=AXES, scheduler=scheduler, workers=2)
    assert there.table["makespan_s"].iloc[0] == here.table["makespan_s"].iloc[0]


def test_the_command_line_takes_the_scheduler(scheduler: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(A100), "--axis", "knobs.sm_carveout=0,16", "--scheduler", scheduler, "--json"]) == 0
    assert '"knobs.sm_carveout": 16' in capsys.readouterr().out
