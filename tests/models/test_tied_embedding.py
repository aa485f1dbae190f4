"""A tied embedding across the pipeline's ends: Megatron-LM all-reduces the word embedding's
gradient over each pair of first and last pipeline ranks (``_allreduce_embedding_grads``, its
embedding group) after the data-parallel reduction and before the optimizer step."""

from __future__ import annotations

from typing import Any

import pytest
from training_cases import SMALL
from training_cases import predict_training as _predict

from ovsim.models.training import training_ops
from ovsim.models.training_spec import TrainingSpec
from ovsim.models.workload import CollectiveOpSpec

# GPT-3 1.3B's shape (tied embeddings): vocabulary 50,257 and hidden 2,048 (Brown et al., 2020).
VOCAB, HIDDEN = 50257, 2048


def _spec(**parallel: Any) -> TrainingSpec:
    return TrainingSpec.model_validate({**SMALL, "micro_batches": 4,
                                        "parallel": {"dp": 2, "pp": 2, **parallel}})


def _sums(spec: TrainingSpec, ranks: int) -> list[CollectiveOpSpec]:
    return [o for o in training_ops(spec, ranks).ops
            if isinstance(o, CollectiveOpSpec) and o.name.startswith("embedding_grad_sum")]


@pytest.mark.parametrize(("optimizer", "element_bytes"), [("fused_adam", 2), ("megatron", 4)])
def test_each_first_and_last_pair_sums_the_embeddings_gradient_once(optimizer: str, element_bytes: int) -> None:
    """TP 2 x PP 2 x DP 2 on 8 GPUs: four pairs, each a first-stage rank and the last-stage rank
    of the same replica and tensor-parallel rank, summing vocabulary x hidden / tp elements at the
    width the gradients are reduced at (Megatron-LM's optimizer reduces BF16 gradients in FP32)."""
    spec = TrainingSpec.model_validate({**SMALL, "micro_batches": 4, "optimizer": optimizer,
                                        "parallel": {"dp": 2, "pp": 2, "tp": 2}})
    sums = _sums(spec, 8)
    # Ranks are (stage x dp + replica) x tp + tensor-parallel rank (Megatron-LM's order, whose
    # embedding group pairs each pipeline group's first and last rank: 0 and 4 here).
    assert sorted(tuple(o.ranks) for o in sums) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert all(o.kind == "all_reduce" and o.stream == "dp" for o in sums)
    assert {o.size_bytes for o in sums} == {float(VOCAB * HIDDEN // 2 * element_bytes)}


@pytest.mark.parametrize("training", [
    {"parallel": {"dp": 4, "pp": 1}},                    # one stage holds both copies
    {"model": "llama2-13b", "parallel": {"dp": 2, "pp": 2}},  # untied: two matrices of their own
    {"embedding_and_head": False, "parallel": {"dp": 2, "pp": 2}},
    {"communication": False, "parallel": {"dp": 2, "pp": 2}},
])
def test_no_sum_where_no_copy_sits_apart(training: dict[str, Any]) -> None:
    spec = TrainingSpec.model_validate({**SMALL, "micro_batches": 4, **training})
    assert _sums(spec, 4) == []


def test_the_step_of_both_ends_waits_for_the_sum_and_the_sum_for_the_buckets() -> None:
    """Simulated: on the first and the last stage the sum starts after the stage's last bucket
    has been reduced, and the optimizer's first pass after the sum ends."""
    res = _predict({**SMALL, "micro_batches": 4, "parallel": {"dp": 2, "pp": 2}})
    ops = res.timeline.ops
    ops = ops[ops["kind"] != "flow"]
    for rank in (0, 2):  # the first and the last stage of replica 0 (tp 1: rank = stage x dp)
        mine = ops[ops["rank"] == rank]
        total = mine[mine["name"].str.startswith("embedding_grad_sum")]
        assert len(total) == 1
        buckets = mine[mine["name"].str.contains(r"\.bucket\d")]
        step = mine[mine["name"].str.contains(r"^s\d\.optimizer")]
        assert len(buckets) and len(step)
        assert total["start_s"].iloc[0] >= buckets["end_s"].max() - 1e-12
        assert step["start_s"].min() >= total["end_s"].iloc[0] - 1e-12
