"""NeMo's long-sequence table: Llama 2 7B pre-trained on DGX H100 at 4K to 1M tokens a sequence,
with context parallelism from 32K up.

Source: NVIDIA NeMo Framework user guide 24.12, "Long Sequence Performance", table "LLAMA2-7B
(FP8)" (docs/source/performance/performance_long_sequence.md in NVIDIA/NeMo): for each sequence
length the GPUs (as many as the sequence has thousands of tokens), the layout with context
parallelism (TP, PP, DP, CP) and its model TFLOP/s per GPU, beside the best layout found without
it (not given) and that one's TFLOP/s. Model FLOPs are NeMo's own count for Llama 2 of that time
(nemo/utils/flops_formulas.py, ``llama2``): a token costs L h^2 (12 + 12 g/a + 18 f/h + 12 s/h +
6 V/(L h)) FLOPs, attention counted over the whole s x s (no causal half); NeMo 24.07's
performance table divides its model TFLOP/s by its tokens a second at exactly that count (LLAMA2-7B
at 4,096 tokens: 776 TFLOP/s and 16,847 tokens a second, 4.606e10 FLOPs a token, where the count
gives 4.609e10).

What the table leaves unsaid is run as a stated assumption, never fitted: the batch holds 4M tokens
at every length (NeMo's B200 table beside it does: 512 sequences of 8K down to 4 of 1M), one
sequence a micro-batch, FP8 linears with BF16 attention (Transformer Engine), sequence parallelism
with TP, Megatron-LM's distributed optimizer, no recomputation, ring attention (Megatron-LM's
default exchange), HGX H100 nodes with eight 400 Gb/s NICs.
"""

from __future__ import annotations

from dataclasses import dataclass

from published_rows import GPUS_PER_NODE, ModelFlopsRow, parallel_layout

from ovsim.models.training_spec import PRESETS
from ovsim.scenario import Scenario

BATCH_TOKENS = 4 * 2**20


@dataclass(frozen=True)
class NemoLongRow(ModelFlopsRow):
    """A row of the table: the sequence (thousands of tokens), the layout and the TFLOP/s."""

    seq_k: int
    tp: int
    pp: int
    dp: int
    cp: int
    published_tflops_per_gpu: float
    micro_batch: int = 1

    @property
    def name(self) -> str:
        return f"nemo-long-{self.seq_k}k"

    @property
    def seq(self) -> int:
        return self.seq_k * 1024

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def virtual_stages(self) -> int:
        return 1

    @property
    def global_batch(self) -> int:
        return BATCH_TOKENS // self.seq

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def published(self) -> float:
        return self.published_tflops_per_gpu

    def flops(self) -> float:
        """An iteration's model FLOPs as NeMo counts them for Llama 2 (the module docstring)."""
        m, s = PRESETS["llama2-7b"], self.seq
        per_token = m.layers * m.hidden**2 * (12 + 12 * m.kv / m.heads + 18 * m.ffn / m.hidden + 12 * s / m.hidden
                                              + 6 * m.vocab / (m.layers * m.hidden))
        return per_token * s * self.global_batch

    def scenario(self) -> Scenario:
        parallel = parallel_layout(self.tp, self.pp, self.dp, self.virtual_stages, sequence_parallel=self.tp > 1,
                                   distributed_optimizer=True, **({"cp": self.cp} if self.cp > 1 else {}))
        return Scenario.model_validate({
            "schema": "ovsim.scenario/1", "name": self.name, "system": "hgx-h100-ndr",
            "nodes": max(1, self.gpus // GPUS_PER_NODE), "ranks": self.gpus, "schedule": "overlapped",
            "training": {"model": "llama2-7b", "seq_len": self.seq, "micro_batch_size": self.micro_batch,
                         "micro_batches": self.micro_batches, "precision": "fp8", "parallel": parallel},
        })


# The table's rows with context parallelism (and the three shorter ones, which run without it).
NEMO_LONG_ROWS = [
    NemoLongRow(4, 1, 1, 4, 1, 768),
    NemoLongRow(8, 1, 2, 4, 1, 730),
    NemoLongRow(16, 2, 1, 8, 1, 660),
    NemoLongRow(32, 2, 1, 8, 2, 610),
    NemoLongRow(64, 4, 1, 8, 2, 574),
    NemoLongRow(128, 4, 1, 8, 4, 555),
    NemoLongRow(256, 4, 1, 8, 8, 549),
    NemoLongRow(512, 8, 1, 4, 16, 549),
    NemoLongRow(1024, 8, 1, 4, 32, 536),
]
