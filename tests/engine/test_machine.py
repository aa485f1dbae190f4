"""The node's contended resources as the engine sees them (ovsim.engine.machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ovsim.engine.machine import GpuModel, build_machine
from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import load_gpu, load_system

CLUSTERS = Path(__file__).resolve().parents[2] / "calibration" / "data" / "h200-sxm" / "2026-11-27-e" / "clusters.json"


def _model(gpu_name: str, system: str) -> GpuModel:
    gpu = load_gpu(gpu_name)
    return build_machine(load_system(system), gpu, load_calibration(gpu, gpu_name).params).gpus[0]


def _lost_sms(run: dict) -> int:  # type: ignore[type-arg]
    """SMs the probe's 2-CTA clusters could not use beside the held ones: probe blocks that started
    only once the hold ended, less the held SMs."""
    starts = run["probe_start_us"]
    late = sum(1 for t in starts if t > min(starts) + 0.5 * run["probe_us"])
    return int(late - run["held_sms"])


def test_held_sms_strand_the_sms_measured_for_2_cta_clusters() -> None:
    """Golden from measurement (calibration/data/h200-sxm/2026-11-27-e, clusters.json): one block per
    SM in clusters of 2 beside 1 to 66 SMs held by a plainly launched kernel; the SMs the clusters
    lost beyond the held ones, 12 holds."""
    model = _model("h200-sxm", "hgx-h200")
    runs = [r for r in json.loads(CLUSTERS.read_text())["held"] if r["hold_launch"] == "plain" and r["cluster"] == 2]
    assert len(runs) == 12
    assert [model.stranded_sms(r["held_sms"], 2) for r in runs] == [_lost_sms(r) for r in runs]
    assert [_lost_sms(r) for r in runs] == [1, 2, 3, 4, 2, 0, 4, 8, 0, 8, 6, 2]


@pytest.mark.parametrize(("cluster", "largest"), [(1, 132), (2, 132), (4, 120), (8, 120), (16, 112)])
def test_an_idle_gpu_holds_the_clusters_the_occupancy_query_reports(cluster: int, largest: int) -> None:
    """cudaOccupancyMaxActiveClusters on the H200 (the same clusters.json): 132, 66, 30, 15 and 7
    clusters of 1, 2, 4, 8 and 16 one-block-per-SM CTAs, as SMs: whole clusters per unit."""
    model = _model("h200-sxm", "hgx-h200")
    assert model.sm_count - model.stranded_sms(0, cluster) == largest


def test_a_gpu_without_a_known_placement_strands_nothing() -> None:
    assert load_gpu("a100-sxm4-80gb").sm.placement is None
    assert _model("a100-sxm4-80gb", "dgx-a100-80gb").stranded_sms(4, 2) == 0
