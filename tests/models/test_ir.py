"""Workload validation: every problem is an OvsimError naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from ovsim.errors import OvsimError
from ovsim.models.ir import BlockShape, FlowDemand, KernelDemand, Op, StreamSpec, Workload

K = KernelDemand(blocks=1, block=BlockShape(128, 32, 0), block_time_s=1e-6, issue_fraction=1.0, hbm_bytes=0.0,
                 flops=0.0, isolated_s=1e-6)
STREAMS = (StreamSpec(0, "s"), StreamSpec(1, "s"))


def test_collective_a_rank_never_joins() -> None:
    flow = FlowDemand(group="ar", ranks=(0, 1), bytes=1e6, latency_s=0.0, rate_cap_bytes_per_s=1e9,
                      link_coeff=1.0, hbm_coeff=1.0)
    wl = Workload(ops=(Op("ar0", "ar", "collective", 0, "s", kernel=K, flow=flow),), streams=STREAMS, n_ranks=2)
    with pytest.raises(OvsimError, match=r"never joined by rank\(s\) \[1\]") as e:
        wl.validate("w.yaml")
    assert e.value.source == "w.yaml" and e.value.field == "ranks"


def test_cycle_names_the_ops() -> None:
    ops = (Op("a", "a", "generic", 0, "s", kernel=K, deps=("b",)), Op("b", "b", "generic", 1, "s", kernel=K,
                                                                       deps=("a",)))
    with pytest.raises(OvsimError, match="dependency cycle"):
        Workload(ops=ops, streams=STREAMS, n_ranks=2).validate()


def test_unknown_dependency_and_duplicate_id() -> None:
    with pytest.raises(OvsimError, match="unknown op 'zz'"):
        Workload(ops=(Op("a", "a", "generic", 0, "s", kernel=K, deps=("zz",)),), streams=STREAMS,
                 n_ranks=2).validate()
    with pytest.raises(OvsimError, match="duplicate op id 'a'"):
        Workload(ops=(Op("a", "a", "generic", 0, "s", kernel=K), Op("a", "a", "generic", 1, "s", kernel=K)),
                 streams=STREAMS, n_ranks=2).validate()


def test_a_renamed_flow_is_the_same_flow_under_another_name() -> None:
    import dataclasses

    flow = FlowDemand(group="ar", ranks=(0, 1), bytes=1e6, latency_s=2e-6, rate_cap_bytes_per_s=1e9,
                      link_coeff=0.5, hbm_coeff=1.5, pattern="all_pairs", group_size=8, net_coeff=0.25)
    renamed = flow.renamed("ar#2")
    assert renamed == dataclasses.replace(flow, group="ar#2")
    assert flow.group == "ar" and renamed.group == "ar#2"
    with pytest.raises(dataclasses.FrozenInstanceError):
        renamed.group = "x"  # type: ignore[misc]


def test_an_op_made_without_init_is_the_op_init_makes() -> None:
    """new_op sets each field itself: a field added to Op, or a __post_init__, must be added to it
    too, which this fails to remind."""
    import dataclasses
    import pickle

    from ovsim.models.ir import new_op

    assert [f.name for f in dataclasses.fields(Op)] == ["id", "name", "kind", "rank", "stream", "deps", "delay_s",
                                                        "kernel", "flow", "partition", "info"]
    assert not hasattr(Op, "__post_init__")
    flow = FlowDemand(group="ar", ranks=(0, 1), bytes=1e6, latency_s=0.0, rate_cap_bytes_per_s=1e9,
                      link_coeff=1.0, hbm_coeff=1.0)
    info: dict[str, object] = {"m": 8}
    args: tuple[Any, ...] = ("ar@r0", "ar", "collective", 0, "comm", ("x@r0",), 1e-6, K, flow, "any", info)
    made, init = new_op(*args), Op(*args)
    assert made == init and hash(made) == hash(init) and repr(made) == repr(init)
    assert pickle.loads(pickle.dumps(made)) == init
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.rank = 1  # type: ignore[misc]
