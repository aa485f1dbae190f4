"""Checks of a training framework's layer and iteration times, against published measurements.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (arXiv
2205.05198, MLSys 2023) timed one transformer layer of a 22B GPT model (hidden 6144, 64 heads,
sequence 2048, vocabulary 51,200, micro-batch 4, tensor parallelism 8 on one DGX A100 80 GB node,
mixed precision, Megatron-LM of 2022 with unfused attention) in five configurations (their table
4), and the whole 48-layer iteration (batch 4, no data or pipeline parallelism) with full
recomputation and with their method, sequence parallelism and selective recomputation (table 5).

ovsim predicts each row from the shipped calibration; nothing was fitted on them. A layer's time is
read off the simulated timeline: its forward from the start of its first op to the start of the
next layer's, its backward (recomputation included) from the end of the next layer's backward to
the end of its own. The overhead rows compare each configuration's combined forward and backward
time with the baseline's (no recomputation, no sequence parallelism), a ratio that the kernels'
absolute speed leaves almost untouched: they check what the configurations run, the absolute rows
how fast it runs. What the rows show is in docs/training.md ("Checked against published layer
times").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from ovsim.validate.check import Check

TRAINING_GROUP = "published (training layer and iteration times, A100; not fitted)"
SOURCE = "Korthikanti et al., arXiv 2205.05198"
# The layer timed: one in the middle of the 48, away from the embedding and the head.
LAYER = 24


@dataclass(frozen=True)
class LayerRow:
    """One row of table 4: a configuration and its published times of one layer (ms)."""

    label: str
    recompute: str
    sequence_parallel: bool
    forward_ms: float
    backward_ms: float

    @property
    def combined_ms(self) -> float:
        return self.forward_ms + self.backward_ms


TABLE_4 = [
    LayerRow("baseline, no recomputation", "none", False, 7.7, 11.9),
    LayerRow("sequence parallelism", "none", True, 7.2, 11.8),
    LayerRow("full recomputation", "full", False, 7.7, 19.5),
    LayerRow("selective recomputation", "selective", False, 7.7, 13.2),
    LayerRow("selective recomputation and sequence parallelism", "selective", True, 7.2, 13.1),
]
# Table 5, the 22B row: iteration times (s) with full recomputation and with the paper's method.
TABLE_5_22B = {"full": 1.42, "present": 1.10}


def scenario_22b(recompute: str, sequence_parallel: bool) -> Any:
    """Korthikanti et al.'s 22B configuration (their table 3) as a scenario."""
    from ovsim.scenario import Scenario

    return Scenario.model_validate({
        "schema": "ovsim.scenario/1", "name": f"korthikanti-22b-{recompute}{'-sp' if sequence_parallel else ''}",
        "system": "dgx-a100-hdr", "nodes": 1, "schedule": "overlapped",
        "training": {
            "model": {"layers": 48, "hidden": 6144, "heads": 64, "vocab": 51200, "seq_len": 2048,
                      "gated_mlp": False, "tied_embeddings": True},
            "micro_batch_size": 4, "micro_batches": 1, "precision": "fp16", "recompute": recompute,
            "attention": "unfused", "optimizer": "megatron", "loss": "megatron",
            "parallel": {"tp": 8, "sequence_parallel": sequence_parallel},
        },
    })


def layer_times_s(ops: pd.DataFrame, layer: int, rank: int = 0, micro_batch: int = 0) -> tuple[float, float]:
    """(forward, backward) seconds of ``layer`` on ``rank`` in a predicted timeline (``Timeline.ops``):
    the forward from its first op's start to the next layer's first op's start, the backward
    (with whatever is recomputed for it) from the end of the next layer's backward to the end of
    its own."""
    own = ops[ops["rank"] == rank]
    start = dict(zip(own["name"], own["start_s"].to_numpy(float), strict=True))
    end = dict(zip(own["name"], own["end_s"].to_numpy(float), strict=True))
    f, b = f"F{micro_batch}.L", f"B{micro_batch}.L"
    forward = start[f"{f}{layer + 1}.norm1"] - start[f"{f}{layer}.norm1"]
    backward = end[f"{b}{layer}.norm1.bwd"] - end[f"{b}{layer + 1}.norm1.bwd"]
    return float(forward), float(backward)


def training_checks() -> list[Check]:
    from ovsim.api import predict
    from ovsim.validate.check import Check

    combined: dict[str, float] = {}
    iteration: dict[str, float] = {}
    for row in TABLE_4:
        res = predict(scenario_22b(row.recompute, row.sequence_parallel), counters=False)
        forward, backward = layer_times_s(res.timeline.ops, LAYER)
        combined[row.label] = (forward + backward) * 1e3
        if (row.recompute, row.sequence_parallel) == ("full", False):
            iteration["full"] = res.timeline.makespan_s
        if (row.recompute, row.sequence_parallel) == ("selective", True):
            iteration["present"] = res.timeline.makespan_s
    table = f"{SOURCE}, table 4 (one layer of the 22B model, 8x A100 80 GB, TP 8)"
    base = TABLE_4[0]
    checks = [Check(f"22B layer forward + backward, {r.label}", TRAINING_GROUP, r.combined_ms, combined[r.label],
                    "ms", 10.0, table) for r in TABLE_4]
    checks += [Check(f"22B layer time over the baseline's, {r.label}", TRAINING_GROUP,
                     r.combined_ms / base.combined_ms, combined[r.label] / combined[base.label], "x", 3.0, table,
                     note="the configuration's published overhead; the ratio leaves the kernels' speed out")
               for r in TABLE_4[1:]]
    checks += [Check(f"22B iteration, {'full recomputation' if k == 'full' else 'sequence parallel + selective'}",
                     TRAINING_GROUP, TABLE_5_22B[k], iteration[k], "s", 10.0,
                     f"{SOURCE}, table 5 (48 layers, batch 4, 8x A100 80 GB, TP 8)") for k in ("full", "present")]
    return checks
