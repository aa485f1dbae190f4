"""Where a framework makes communication synchronous under the overlapped schedule: the tensor-
parallel data gradient's reduction after its weight gradient (``tp_dgrad_overlap: false``, the
conjugate operator of Megatron-LM's 2021 code) and blocking pipeline transfers
(``overlap_p2p_comm: false``, Megatron-LM's batched send/recv with its device synchronization).

The golden values are the sequential schedule's, a separate path (every op of a rank on one
stream, in program order): where nothing else can overlap, a synchronous collective under the
overlapped schedule must cost what it costs there, to the last bit."""

from __future__ import annotations

from typing import Any

import pytest
from training_cases import SMALL, predict_training

from ovsim.api import build
from ovsim.errors import OvsimError
from ovsim.metrics import rank_overlap
from ovsim.models.ir import Workload
from ovsim.models.training import training_ops
from ovsim.models.training_spec import TrainingSpec
from ovsim.scenario import Scenario


def _makespan(training: dict[str, Any], schedule: str, mode: str) -> float:
    r = predict_training(training, schedule=schedule, mode=mode, power_managed=False)
    return float(r.timeline.makespan_s)


@pytest.mark.parametrize("mode", ["analytic", "simulate"])
@pytest.mark.parametrize("head", [True, False])
def test_a_data_gradient_reduced_after_its_weight_gradient_hides_nothing(mode: str, head: bool) -> None:
    """Tensor parallelism alone (no data or pipeline parallelism): with the reduction after the
    weight gradient nothing is left to overlap, so the overlapped schedule runs as the
    sequential one and no collective runs beside compute on any rank; Megatron-LM's later
    asynchronous reduction (the default) hides some of it behind the weight gradient."""
    base = {**SMALL, "layers": 4, "micro_batches": 2, "embedding_and_head": head, "parallel": {"tp": 4}}
    sync = {**base, "parallel": {"tp": 4, "tp_dgrad_overlap": False}}
    sequential = _makespan(base, "sequential", mode)
    assert _makespan(sync, "overlapped", mode) == pytest.approx(sequential, rel=1e-12)
    r = predict_training(sync, mode=mode, power_managed=False)
    assert all(x.overlapped_s == 0.0 for x in rank_overlap(r.timeline))
    assert _makespan(base, "overlapped", mode) < sequential


def test_a_data_gradient_reduced_after_its_weight_gradient_follows_it() -> None:
    """The op order itself: each column-parallel linear's reduction waits for its weight-gradient
    GEMM, and the op after it for the reduction."""
    spec = TrainingSpec.model_validate({**SMALL, "layers": 2, "parallel": {"tp": 4, "tp_dgrad_overlap": False}})
    wl = _workload(spec, 4)
    by_id = {op.id: op for op in wl.ops}
    ids = [op.id for op in wl.ops if op.rank == 0]
    reductions = [i for i in ids if ".dgrad.ar" in i or ".head.all_reduce" in i]
    # qkv and fc1 of each layer's backward, and the head's
    assert len(reductions) == 2 * 2 + 1
    for red in reductions:
        linear = red.split(".dgrad.ar")[0] if ".dgrad.ar" in red else red.split(".all_reduce")[0]
        assert any(d.startswith(f"{linear}.wgrad") for d in by_id[red].deps)
        after = [op for op in wl.ops if op.rank == 0 and red in op.deps]
        assert after and all(op.stream == "compute" for op in after)


def test_the_synchronous_reduction_is_refused_beside_decomposed_tp_overlap() -> None:
    training = {**SMALL, "parallel": {"tp": 4, "sequence_parallel": True, "tp_overlap": "chunked",
                                      "tp_dgrad_overlap": False}}
    with pytest.raises(OvsimError) as e:
        predict_training(training)
    assert e.value.field == "training.parallel.tp_dgrad_overlap"


@pytest.mark.parametrize("mode", ["analytic", "simulate"])
@pytest.mark.parametrize(("pipeline", "v"), [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_blocking_transfers_run_as_the_sequential_pipeline(pipeline: str, v: int, mode: str) -> None:
    """A pipeline alone: its transfers blocking under the overlapped schedule cost what the
    sequential schedule's do (its own tests bound them by each transfer's time); beside compute
    (the default) they may cost less, never more, with the power loop off."""
    parallel = {"pp": 4, "pipeline": pipeline, "virtual_stages": v}
    base = {**SMALL, "layers": 8, "micro_batches": 4, "embedding_and_head": False, "parallel": parallel}
    blocking = {**base, "parallel": {**parallel, "overlap_p2p_comm": False}}
    sequential = _makespan(base, "sequential", mode)
    assert _makespan(blocking, "overlapped", mode) == pytest.approx(sequential, rel=1e-12)
    if mode == "analytic":
        assert _makespan(base, "overlapped", mode) <= sequential * (1 + 1e-12)


@pytest.mark.parametrize("pipeline", ["1f1b", "gpipe"])
def test_a_blocking_exchange_synchronizes_the_device(pipeline: str) -> None:
    """With the distributed optimizer's parameters gathered beside the forward pass, each
    stream's first op after an exchange waits for the transfer and for the other streams' work
    issued before it (Megatron-LM's ``batch_p2p_sync``: torch.cuda.synchronize after the batched
    send/recv), such as a gather the next forward does not use. Checked on the sending ranks: in
    these schedules every op that waits for a rank's send is such a first op."""
    parallel = {"pp": 2, "pipeline": pipeline, "overlap_p2p_comm": False, "bucket_bytes": 4e6,
                "first_bucket_bytes": 1e6, "distributed_optimizer": True, "overlap_param_gather": True}
    spec = TrainingSpec.model_validate({**SMALL, "layers": 4, "micro_batches": 4, "parallel": parallel})
    wl = _workload(spec, 4)
    names = training_ops(spec, 4).p2p_items
    transfers = {op.id: op for op in wl.ops if op.name in names}
    assert transfers
    held = 0
    for rank in {op.rank for op in wl.ops}:
        mine = [op for op in wl.ops if op.rank == rank]
        sent = {i for i, t in transfers.items()
                if t.flow and t.flow.endpoints and t.flow.endpoints[0] == wl.job_rank(rank)}
        for k, op in enumerate(mine):
            if op.id in transfers or not sent.intersection(op.deps):
                continue
            # Every other stream's last op before it in the rank's order is among what it waits for.
            before = {o.stream: o.id for o in mine[:k] if o.id not in transfers and o.stream != op.stream}
            dp_before = [i for s, i in before.items() if s == "dp"]
            assert set(before.values()) <= _reached(op, wl), op.id
            held += bool(dp_before)
    assert held > 0  # some exchange did come after a gather was issued


def _reached(op: Any, wl: Workload) -> set[str]:
    """The ops ``op`` waits for, directly or through other ops."""
    by_id = {o.id: o for o in wl.ops}
    seen: set[str] = set()
    todo = list(op.deps)
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(by_id[d].deps)
    return seen


def _workload(spec: TrainingSpec, ranks: int) -> Workload:
    sc = Scenario.model_validate({"name": "t", "system": "a100x4", "ranks": ranks,
                                  "training": spec.model_dump(exclude_unset=True)})
    return build(sc)[0]


@pytest.mark.parametrize("schedule", ["overlapped", "sequential"])
def test_blocking_transfers_leave_the_ops_listed_after_what_they_wait_for(schedule: str) -> None:
    """The blocking's added waits point forward in the generator's list (a sender's next op waits
    for a transfer listed with its receiver's item); the ops are relisted so that every op comes
    after its dependencies and each collective's members after what any member waits for, the
    order the analytic plan and validation take without sorting."""
    from ovsim.engine.analytic import _listed_in_order

    parallel = {"pp": 4, "pipeline": "interleaved", "virtual_stages": 2, "overlap_p2p_comm": False}
    sc = Scenario.model_validate({"name": "t", "system": "a100x4", "schedule": schedule, "training": {
        **SMALL, "layers": 8, "micro_batches": 8, "parallel": parallel}})
    ops = build(sc)[0].ops
    at = {op.id: i for i, op in enumerate(ops)}
    assert all(at[d] < i for i, op in enumerate(ops) for d in op.deps)
    groups: dict[str, list[int]] = {}
    preds: list[Any] = []
    last: dict[tuple[int, str], int] = {}
    for i, op in enumerate(ops):
        if op.flow is not None:
            groups.setdefault(op.flow.group, []).append(i)
        before = last.get((op.rank, op.stream))
        last[(op.rank, op.stream)] = i
        preds.append([*([before] if before is not None else []), *(at[d] for d in op.deps)])
    assert _listed_in_order(preds, list(groups.values()))
