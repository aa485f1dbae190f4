"""The distributed optimizer's parameter gathers: at the parameters' width, after the step or
(``overlap_param_gather``, Megatron-LM's ``--overlap-param-gather``) from the iteration's start,
each layer's before its first forward."""

from __future__ import annotations

from typing import Any

import pytest
from training_cases import SMALL
from training_cases import predict_training as _predict

from ovsim.errors import OvsimError
from ovsim.models.training import training_ops
from ovsim.models.training_spec import TrainingSpec, params_per_rank
from ovsim.models.workload import CollectiveOpSpec

# Two stages of two chunks each, two replicas: 4 GPUs.
LAYOUT: dict[str, Any] = {"dp": 2, "pp": 2, "pipeline": "interleaved", "virtual_stages": 2,
                          "distributed_optimizer": True}


def _spec(**parallel: Any) -> TrainingSpec:
    return TrainingSpec.model_validate({**SMALL, "micro_batches": 4, "optimizer": "megatron",
                                        "parallel": {**LAYOUT, **parallel}})


def _held_bytes(spec: TrainingSpec, stage: int, element_bytes: int) -> float:
    return float(params_per_rank(spec, spec.shape(), 1, 2, stage) * element_bytes)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_stage_gathers_each_parameter_it_holds_once_at_16_bits(overlap: bool) -> None:
    """BF16 weights with Megatron-LM's optimizer: the gradients are reduce-scattered in FP32 (4
    bytes a parameter) and the updated weights gathered in BF16 (2 bytes), whichever way the
    gathers are placed; each stage moves what it holds."""
    spec = _spec(overlap_param_gather=overlap)
    ops = training_ops(spec, 4).ops
    for s in range(2):
        mine = [o for o in ops if isinstance(o, CollectiveOpSpec) and o.name.startswith(f"s{s}.")]
        reduced = sum(o.size_bytes for o in mine if o.kind == "reduce_scatter")
        gathered = sum(o.size_bytes for o in mine if o.kind == "all_gather")
        assert reduced == pytest.approx(_held_bytes(spec, s, 4))
        assert gathered == pytest.approx(_held_bytes(spec, s, 2))


def test_overlapped_gathers_start_the_iteration_in_forward_order_and_each_layer_waits_for_its_own() -> None:
    ops = training_ops(_spec(overlap_param_gather=True), 4).ops
    by_name = {o.name: o for o in ops}
    # 8 layers on 2 stages of 2 chunks: stage 0 runs layers 0-1 then 4-5, stage 1 layers 2-3 then 6-7.
    expected = {0: ["embed", "L0", "L1", "L4", "L5"], 1: ["L2", "L3", "L6", "L7", "head"]}
    for s, units in expected.items():
        dp = [o for o in ops if o.stream == "dp" and o.name.startswith(f"s{s}.")]
        gathers = [o for o in dp if o.name.startswith(f"s{s}.param_gather.")]
        assert [o.name.split(".")[2] for o in gathers] == units
        # First on the stream, waiting for nothing, and nothing gathered after the step.
        assert dp[:len(units)] == gathers and all(not o.after and not o.after_any for o in gathers)
    # The first forward op of each layer in its chunk's first micro-batch waits for the layer's
    # gather; a later micro-batch's does not.
    for layer in range(8):
        first = next(o for o in ops if o.name.startswith(f"F0.L{layer}.") and o.stream == "compute")
        s = 0 if layer in (0, 1, 4, 5) else 1
        assert f"s{s}.param_gather.L{layer}" in [*first.after, *first.after_any], first.name
        later = next(o for o in ops if o.name.startswith(f"F1.L{layer}.") and o.stream == "compute")
        assert not any("param_gather" in d for d in [*later.after, *later.after_any])
    assert "s0.param_gather.embed" in [*by_name["F0.embed"].after, *by_name["F0.embed"].after_any]


def test_overlapping_the_gathers_hides_at_most_their_own_time() -> None:
    """Beside the forward pass the gathers take time off the iteration, and never more than the
    exposed gathers took (their spans after the step, summed: the most overlap can hide)."""
    training = {**SMALL, "micro_batches": 4, "optimizer": "megatron", "parallel": {**LAYOUT}}
    exposed = _predict(training, mode="analytic")
    hidden = _predict({**training, "parallel": {**LAYOUT, "overlap_param_gather": True}}, mode="analytic")
    ops = exposed.timeline.ops
    gathers = ops[ops["name"].str.contains("param_gather") & (ops["kind"] != "flow")]
    gather_s = float((gathers["end_s"] - gathers["start_s"]).groupby(gathers["rank"]).sum().max())
    saved = exposed.timeline.makespan_s - hidden.timeline.makespan_s
    assert 0 < saved <= gather_s * (1 + 1e-9)


@pytest.mark.parametrize(("parallel", "missing"), [({"distributed_optimizer": False}, "distributed_optimizer"),
                                                   ({"overlap_grad_reduce": False}, "overlap_grad_reduce")])
def test_overlapping_the_gathers_needs_the_distributed_optimizer_with_overlapped_grads(
        parallel: dict[str, Any], missing: str) -> None:
    with pytest.raises(OvsimError, match=missing) as e:
        training_ops(_spec(overlap_param_gather=True, **parallel), 4)
    assert e.value.field == "parallel.overlap_param_gather"
