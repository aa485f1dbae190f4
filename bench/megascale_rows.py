"""Megatron-LM's rows of MegaScale's strong-scaling table: GPT 175B on 256 to 12,288 A100s.

Source: Jiang et al., "MegaScale: Scaling Large Language Model Training to More Than 10,000 GPUs",
NSDI'24, arXiv 2402.15627, section 6.1, tables 1 and 2. The baseline is Megatron-LM at commit
285068c8 (2023-01-11) on ByteDance's cluster of NVIDIA Ampere GPUs, eight to a server with eight
200 Gb/s NICs wired one to each of eight switches (multi-rail, a three-layer Clos with no
oversubscription; networking optimizations on for both systems). The 175B: 96 layers, hidden
12,288, 128 heads, sequences of 2,048, vocabulary 64,000, TP 8 x PP 8, the interleaved schedule
with six virtual stages; a batch of 768 sequences on 256-1,024 GPUs and 6,144 on 3,072-12,288.
Table 2 gives each run's iteration time; its MFU (53.0% down to 41.2%) is the paper's model FLOPs
(Korthikanti et al.'s equation 7: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)), which gives its
throughput's 1.077e12 FLOPs a token) over 312 TFLOP/s.

What the paper leaves unsaid is run as a stated assumption, never fitted: A100-SXM4-80GB in
DGX-like nodes (``dgx-a100-hdr``: the same eight 200 Gb/s NICs a node, on InfiniBand where the
cluster ran RoCE), BF16 with Megatron-LM's mixed-precision optimizer (gradients reduced in FP32),
one sequence a micro-batch, sequence parallelism with selective recomputation (Megatron-LM's
recipe for the 175B since Korthikanti et al.), the distributed optimizer (the paper names the data
parallel gradient reduce-scatter as an iteration's last collective), reduced after the pipeline's
backward (that commit had no overlapped gradient reduction; the paper's section 3.2 names the
first all-gather and the last reduce-scatter as what Megatron-LM leaves exposed), Megatron-LM's
default unfused attention (its FlashAttention option, NVIDIA/Megatron-LM pull request 267, came
about then and was off unless asked for), tied embeddings, and pipeline transfers that block both
ends (the commit predates ``--overlap-p2p-communication``, pull request 331 of May 2023). The
ablation's baseline (table 3: Megatron-LM at 47.7% MFU on 256 GPUs and a batch of 256, the
paper's networking optimizations on) is a row too, its iteration time the one that MFU gives.
"""

from __future__ import annotations

from dataclasses import dataclass

from published_rows import GPUS_PER_NODE, ModelFlopsRow, parallel_layout

from ovsim.scenario import Scenario

LAYERS, HIDDEN, HEADS, SEQ, VOCAB = 96, 12_288, 128, 2_048, 64_000


@dataclass(frozen=True)
class MegaScaleRow(ModelFlopsRow):
    """A Megatron-LM row of MegaScale's table 2: the GPUs, the batch and the iteration time."""

    gpus: int
    global_batch: int
    published_iteration_s: float
    tp: int = 8
    pp: int = 8
    virtual_stages: int = 6
    micro_batch: int = 1

    @property
    def name(self) -> str:
        return f"megascale-175b-{self.gpus}" + ("" if self.global_batch in (768, 6144) else f"-b{self.global_batch}")

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def published(self) -> float:
        """Model TFLOP/s a GPU at the published iteration time (the table's MFU x 312)."""
        return self.throughput(self.published_iteration_s)

    def flops(self) -> float:
        """An iteration's model FLOPs (Korthikanti et al.'s equation 7, which the paper's MFU counts)."""
        b, s, l_, h, v = self.global_batch, SEQ, LAYERS, HIDDEN, VOCAB
        return 72 * b * s * l_ * h * h * (1 + s / (6 * h) + v / (12 * l_ * h))

    def scenario(self) -> Scenario:
        parallel = parallel_layout(self.tp, self.pp, self.dp, self.virtual_stages, sequence_parallel=True,
                                   distributed_optimizer=True, overlap_grad_reduce=False, overlap_p2p_comm=False)
        return Scenario.model_validate({
            "schema": "ovsim.scenario/1", "name": self.name, "system": "dgx-a100-hdr",
            "nodes": self.gpus // GPUS_PER_NODE, "schedule": "overlapped",
            "training": {
                "model": {"layers": LAYERS, "hidden": HIDDEN, "heads": HEADS, "vocab": VOCAB, "seq_len": SEQ,
                          "gated_mlp": False, "tied_embeddings": True},
                "micro_batch_size": self.micro_batch, "micro_batches": self.micro_batches, "precision": "bf16",
                "recompute": "selective", "attention": "unfused", "optimizer": "megatron", "loss": "megatron",
                "parallel": parallel,
            },
        })


A100_PEAK_FLOPS = 312e12  # dense BF16, the peak the paper's MFU is of


def at_mfu(gpus: int, batch: int, mfu: float) -> MegaScaleRow:
    """The row of a run published as its MFU only: its iteration time at that MFU."""
    row = MegaScaleRow(gpus, batch, 1.0)
    return MegaScaleRow(gpus, batch, row.flops() / (mfu * A100_PEAK_FLOPS * gpus))


# Table 2's Megatron-LM rows (GPUs, batch, iteration time in s), then table 3's baseline.
MEGASCALE_ROWS = [MegaScaleRow(g, b, t) for g, b, t in (
    (256, 768, 40.0), (512, 768, 21.2), (768, 768, 15.2), (1024, 768, 11.9),
    (3072, 6144, 29.02), (6144, 6144, 14.78), (8192, 6144, 12.24), (12288, 6144, 8.57))] + [at_mfu(256, 256, 0.477)]
