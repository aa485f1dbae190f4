"""Builds of one op list within reusing_builds() share what no knob changes: the op count, the
validation and the analytic plan's order (ovsim.models.ir.Structure). The reference is each
workload built, validated and planned alone, outside the memo."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from ovsim.api import build
from ovsim.engine.analytic import Plan, analytic_timeline
from ovsim.errors import OvsimError
from ovsim.models.build_memo import reusing_builds
from ovsim.models.training import reusing_training_ops
from ovsim.scenario import Scenario, load_scenario
from ovsim.tune_predictions import _digest

ROOT = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = ROOT / "gemm-allreduce-h100x4-overlapped.yaml"
TRAINING = ROOT / "training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml"
PIPELINE = ROOT / "training-gpt3-13b-pp4-1f1b-h100x4.yaml"


def _knobs(sc: Scenario, **update: object) -> Scenario:
    return sc.model_copy(update={"knobs": sc.knobs.model_copy(update=update)})


def _plan_fields(plan: Plan) -> tuple[object, ...]:
    return plan.order, plan.members, plan.preds, plan.delay_s, plan.code


def test_builds_of_one_list_share_its_structure_and_plan() -> None:
    sc = load_scenario(TRAINING)
    variants = [_knobs(sc, nccl_channels=c, sm_carveout=k) for c in (None, 4) for k in (0, 16)]
    alone = [build(v)[0] for v in variants]
    with reusing_training_ops(), reusing_builds():
        shared = [build(v)[0] for v in variants]
        plans = [Plan.of(wl) for wl in shared]
    assert all(wl.structure is shared[0].structure for wl in shared) and shared[0].structure is not None
    # The first plan's lists serve the others: their very objects.
    assert all(all(a is b for a, b in zip(_plan_fields(plans[0]), _plan_fields(p), strict=True)) for p in plans)
    for wl, a, p in zip(shared, alone, plans, strict=True):
        assert a.structure is None
        assert p.workload is wl
        assert _plan_fields(p) == _plan_fields(Plan.of(a))  # what the workload alone plans
        assert wl.ops == a.ops and wl.streams == a.streams
        assert analytic_timeline(wl, plan=p).makespan_s == analytic_timeline(a).makespan_s
    # The knobs change the collectives' times: the shared order is read with each one's own.
    assert len({analytic_timeline(wl, plan=p).makespan_s for wl, p in zip(shared, plans, strict=True)}) > 1


def test_another_list_has_another_structure_and_an_equal_one_the_same() -> None:
    sc = load_scenario(TRAINING)
    other = sc.model_copy(update={"training": sc.training.model_copy(update={
        "parallel": sc.training.parallel.model_copy(update={"fsdp_prefetch": 2})})})
    with reusing_training_ops(), reusing_builds():
        first, second = build(sc)[0], build(other)[0]
    assert first.structure is not second.structure
    ops = load_scenario(EXAMPLE)
    with reusing_builds():
        a = build(ops)[0]
        # The scenario read again: other spec objects, equal in value and order.
        b = build(load_scenario(EXAMPLE))[0]
    assert a.structure is b.structure
    assert [op.id for op in a.ops] == [op.id for op in b.ops]


def test_a_workload_whose_ops_are_changed_after_the_build_has_no_structure() -> None:
    sc = load_scenario(PIPELINE)
    # Without communication the stages wait for each other's ops: dependencies added to the ops
    # the list built (models.training), so their order is not the list's.
    quiet = sc.model_copy(update={"training": sc.training.model_copy(update={"communication": False})})
    sequential = sc.model_copy(update={"schedule": "sequential"})  # its sends block: ops restreamed
    with reusing_training_ops(), reusing_builds():
        built = [build(quiet)[0], build(sequential)[0]]
    assert all(wl.structure is None for wl in built)


def test_a_list_that_fails_to_validate_fails_every_build() -> None:
    data = {"schema": "ovsim.scenario/1", "name": "cycle", "system": "h100x4",
            "ops": [{"name": "a", "kind": "elementwise", "bytes": 1e6, "after": ["b"]},
                    {"name": "b", "kind": "elementwise", "bytes": 1e6, "after": ["a"]}]}
    sc = Scenario.model_validate(data)
    with reusing_builds():
        for channels in (None, 4):
            with pytest.raises(OvsimError, match="dependency cycle"):
                build(_knobs(sc, nccl_channels=channels))


def test_a_list_counted_before_is_still_held_to_each_builds_limit() -> None:
    sc = load_scenario(EXAMPLE)
    with reusing_builds():
        n = len(build(sc)[0].ops)
        with pytest.raises(OvsimError, match="over the limit"):
            build(sc, max_ops=n - 1)
        assert len(build(sc, max_ops=n)[0].ops) == n


def test_a_structure_goes_to_another_process_without_its_plan() -> None:
    with reusing_builds():
        wl = build(load_scenario(EXAMPLE))[0]
        Plan.of(wl)
    assert wl.structure is not None and wl.structure.plan is not None
    copy = pickle.loads(pickle.dumps(wl))
    assert copy.structure is not None and copy.structure.plan is None
    assert copy == wl


def test_a_workload_digest_is_that_of_the_workload_built_alone() -> None:
    """A digest reuses what its structure's workloads share; each still equals the digest of the
    same workload built alone, and two lists that differ in one dependency digest differently."""
    sc = load_scenario(TRAINING)
    variants = [_knobs(sc, nccl_channels=c) for c in (None, 4)]
    alone = [_digest(build(v)[0]) for v in variants]
    with reusing_training_ops(), reusing_builds():
        shared = [build(v)[0] for v in variants]
        digests = [_digest(wl) for wl in shared]
    assert shared[0].structure is not None and shared[0].structure.digest
    assert digests == alone and digests[0] != digests[1]
    ops = load_scenario(EXAMPLE)
    data = ops.model_dump(mode="json", exclude_unset=True)
    # The same ops, the all-reduce after the GEMM: one dependency more.
    after = {**data, "ops": [{**op, "after": ["gemm"]} if op["name"] == "allreduce" else op for op in data["ops"]]}
    with reusing_builds():
        first = build(ops)[0]
        _digest(first)
        second = build(Scenario.model_validate(after))[0]
        assert first.structure is not second.structure
        assert _digest(second) != _digest(first)
    assert _digest(second) == _digest(build(Scenario.model_validate(after))[0])
