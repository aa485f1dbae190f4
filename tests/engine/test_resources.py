"""A resource registered with the rate solver (ovsim.engine.resources): a test "L2" that kernels load
per HBM byte, shared with HBM by weighted max-min, against closed forms."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from ovsim.engine.machine import GpuModel, MachineModel, build_machine
from ovsim.engine.resources import KernelResource
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import SystemSpec, load_gpu
from ovsim.models.ir import BlockShape, KernelDemand, Op, StreamSpec, Workload

GPU = load_gpu("a100-sxm4-80gb")  # no HBM latency law: HBM is a plain max-min channel
PARAMS = load_calibration(GPU, "a100-sxm4-80gb").params
SYSTEM = SystemSpec.model_validate({"schema": "ovsim.system/1", "name": "t", "gpu": "a100-sxm4-80gb",
                                    "gpu_count": 1, "topology": "nvswitch", "sources": {"t": "test"}})
HBM_BYTES = 4e9
BLOCKS = 108  # one wave: every block resident from the start


def streaming(tag: str) -> KernelDemand:
    """A kernel whose blocks could pull far more than HBM gives (block time 1 us for 37 MB each):
    alone it moves HBM_BYTES at HBM's rate. ``tag`` (its flops, which nothing here prices) tells
    the resource which kernel it is."""
    return KernelDemand(blocks=BLOCKS, block=BlockShape(256, 32, 0), block_time_s=1e-6, issue_fraction=0.25,
                        hbm_bytes=HBM_BYTES, flops=1.0 if tag == "a" else 0.0, isolated_s=1e-6,
                        clock_sensitive=False)


def machine(l2_share: float | None) -> MachineModel:
    """The A100 with, where ``l2_share`` is given, an L2 of that share of HBM's capacity that
    kernel "a" (flops 1) loads one byte per HBM byte and kernel "b" does not load at all."""
    m = build_machine(SYSTEM, GPU, PARAMS, n_ranks=1)
    if l2_share is None:
        return m

    def capacity(g: GpuModel) -> float:
        return l2_share * g.hbm_bytes_per_s

    def per_byte(k: KernelDemand) -> float:
        return 1.0 if k.flops == 1.0 else 0.0

    return dataclasses.replace(m, kernel_resources=(KernelResource("l2", capacity, per_byte),))


def run(m: MachineModel, tags: tuple[str, ...], counters: bool = False) -> pd.DataFrame:
    ops = tuple(Op(f"k{t}", f"k{t}", "generic", 0, f"s{t}", kernel=streaming(t)) for t in tags)
    wl = Workload(ops=ops, streams=tuple(StreamSpec(0, f"s{t}") for t in tags), n_ranks=1)
    tl = Engine(wl, m, EngineOptions(check_invariants=True, counters=counters)).run()
    return tl.ops.set_index("id")


def duration(df: pd.DataFrame, op: str) -> float:
    return float(df.loc[op, "end_s"] - df.loc[op, "start_s"])


def test_a_kernel_alone_moves_at_the_slower_of_hbm_and_the_resource() -> None:
    hbm = machine(None).gpus[0].hbm_bytes_per_s
    base = duration(run(machine(None), ("a",)), "ka")
    assert base == pytest.approx(HBM_BYTES / hbm, rel=1e-6)
    # An L2 of half HBM's bandwidth, one byte of it per HBM byte: half the rate.
    assert duration(run(machine(0.5), ("a",)), "ka") == pytest.approx(2 * base, rel=1e-6)
    # One of twice HBM's bandwidth never binds.
    assert duration(run(machine(2.0), ("a",)), "ka") == pytest.approx(base, rel=1e-6)


def test_max_min_shares_hbm_and_the_resource_among_kernels() -> None:
    """HBM C, an L2 of C/4 that only "a" loads. Max-min: "a" is held at C/4 by the L2 and "b"
    takes the 3C/4 of HBM left, so "b" ends at 4H/3C; "a" stays at C/4 after, ending at 4H/C.
    Without the L2 both share HBM fairly, C/2 each, and end together at 2H/C."""
    c = machine(None).gpus[0].hbm_bytes_per_s
    shared = run(machine(0.25), ("a", "b"), counters=True)
    assert duration(shared, "kb") == pytest.approx(4 * HBM_BYTES / (3 * c), rel=1e-6)
    assert duration(shared, "ka") == pytest.approx(4 * HBM_BYTES / c, rel=1e-6)
    plain = run(machine(None), ("a", "b"))
    assert duration(plain, "ka") == pytest.approx(2 * HBM_BYTES / c, rel=1e-6)
    assert duration(plain, "kb") == pytest.approx(2 * HBM_BYTES / c, rel=1e-6)


def test_the_resource_has_a_counter_of_its_load() -> None:
    c = machine(None).gpus[0].hbm_bytes_per_s
    tl = Engine(Workload(ops=(Op("ka", "ka", "generic", 0, "s", kernel=streaming("a")),),
                         streams=(StreamSpec(0, "s"),), n_ranks=1),
                machine(0.5), EngineOptions(counters=True)).run()
    l2 = tl.counters[tl.counters["counter"] == "l2_bytes_per_s"]
    assert l2["value"].max() == pytest.approx(0.5 * c, rel=1e-9)
    assert l2["value"].iloc[-1] == 0.0  # nothing loads it once the kernel is done


@pytest.mark.parametrize("name", ["hbm", "link", "egress", "link_out", ""])
def test_a_resource_may_not_take_a_name_the_engine_uses(name: str) -> None:
    with pytest.raises(ValueError, match="a name of its own"):
        KernelResource(name, lambda g: 1.0, lambda k: 1.0)


def test_two_resources_of_one_name_are_refused() -> None:
    l2 = KernelResource("l2", lambda g: 1.0, lambda k: 1.0)
    with pytest.raises(ValueError, match="'l2' is registered twice"):
        dataclasses.replace(machine(None), kernel_resources=(l2, l2))
