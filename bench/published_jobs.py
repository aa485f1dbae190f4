"""Published training jobs at their real size, predicted by ovsim and set against the throughput the
papers measured. A benchmark: it prints figures and times, and asserts nothing.

Megatron-LM's weak-scaling table (Narayanan et al., "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", SC'21, arXiv 2104.04473, table 1): GPT models of 1.7B to 1T
parameters on up to 3,072 A100-SXM4-80GB in DGX A100 nodes with eight 200 Gb/s HDR InfiniBand NICs
each (Selene), FP16 mixed precision, sequence 2048, vocabulary 51,200, full activation
recomputation, the interleaved 1F1B schedule where the run set a virtual stage size. Each row's
layout (tensor, pipeline and data parallelism, micro-batch and global batch, layers per virtual
stage) is the one the paper's own script ran (NVIDIA/Megatron-LM, examples/sc21/run_table_1.sh).
Throughput per GPU is the paper's count of an iteration's FLOPs (its equation 3, which counts
the recomputed forward pass) over the iteration's time and the GPU count:

    F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))

    python bench/published_jobs.py                 # 1.7B-18B simulated, about 10 s
    python bench/published_jobs.py --rows 39B 76B 145B --mode analytic   # about 2 minutes, 3 GB

Every row runs with unfused attention, as Megatron-LM ran before FlashAttention, which is also
what equation 3 counts (the whole s x s of QK^T and PV, no causal skipping). The rows from 310B
up need more than two million ops and are not run by default.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from dataclasses import dataclass

from ovsim import api
from ovsim.errors import OvsimError
from ovsim.scenario import Scenario

SEQ = 2048
VOCAB = 51_200
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Row:
    """One row of the table: the model, the run's layout and the published throughput."""

    name: str
    layers: int
    hidden: int
    heads: int
    tp: int
    pp: int
    micro_batch: int
    global_batch: int
    nodes: int
    layers_per_virtual_stage: int | None  # None: plain 1F1B
    published_tflops_per_gpu: float

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def virtual_stages(self) -> int:
        if self.layers_per_virtual_stage is None:
            return 1
        return self.layers // self.pp // self.layers_per_virtual_stage

    def flops(self) -> float:
        """The paper's equation 3: an iteration's FLOPs with full recomputation."""
        b, s, l_, h, v = self.global_batch, SEQ, self.layers, self.hidden, VOCAB
        return 96 * b * s * l_ * h * h * (1 + s / (6 * h) + v / (16 * l_ * h))


# Table 1 (published teraFLOP/s per GPU) with run_table_1.sh's layouts.
ROWS = [
    Row("1.7B", 24, 2304, 24, 1, 1, 16, 512, 4, None, 137),
    Row("3.6B", 30, 3072, 32, 2, 1, 16, 512, 8, None, 138),
    Row("7.5B", 36, 4096, 32, 4, 1, 16, 512, 16, None, 142),
    Row("18B", 40, 6144, 48, 8, 1, 8, 1024, 32, None, 135),
    Row("39B", 48, 8192, 64, 8, 2, 4, 1536, 64, None, 138),
    Row("76B", 60, 10240, 80, 8, 4, 2, 1792, 128, 5, 140),
    Row("145B", 80, 12288, 96, 8, 8, 2, 2304, 192, 5, 148),
    Row("310B", 96, 16384, 128, 8, 16, 1, 2160, 240, 3, 155),
    Row("530B", 105, 20480, 128, 8, 35, 1, 2520, 315, 1, 163),
    Row("1T", 128, 25600, 160, 8, 64, 1, 3072, 384, None, 163),
]
DEFAULT_ROWS = ["1.7B", "3.6B", "7.5B", "18B"]


def scenario(row: Row) -> Scenario:
    parallel: dict[str, object] = {"tp": row.tp, "pp": row.pp, "dp": row.dp, "sequence_parallel": False,
                                   "pipeline": "interleaved" if row.virtual_stages > 1 else "1f1b"}
    if row.virtual_stages > 1:
        parallel["virtual_stages"] = row.virtual_stages
    return Scenario.model_validate({
        "schema": "ovsim.scenario/1", "name": f"megatron-table1-{row.name}", "system": "dgx-a100-hdr",
        "nodes": row.nodes, "schedule": "overlapped",
        "training": {
            "model": {"layers": row.layers, "hidden": row.hidden, "heads": row.heads, "vocab": VOCAB,
                      "seq_len": SEQ, "gated_mlp": False, "tied_embeddings": True},
            "micro_batch_size": row.micro_batch, "micro_batches": row.micro_batches, "precision": "fp16",
            "recompute": True, "attention": "unfused", "parallel": parallel,
        },
    })


def peak_rss_gb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**30 if sys.platform == "darwin" else rss / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="+", default=DEFAULT_ROWS, choices=[r.name for r in ROWS])
    ap.add_argument("--mode", choices=["analytic", "simulate"], default="simulate")
    ap.add_argument("--max-ops", type=int, default=2_000_000)
    args = ap.parse_args(argv)
    print(f"{'model':>6} {'GPUs':>5} {'tp x pp x dp':>12} {'mb x m':>7} {'v':>2} {'ops':>8} {'iter s':>7} "
          f"{'TFLOP/s':>8} {'published':>9} {'error':>7} {'wall s':>7} {'peak GB':>7}")
    for row in [r for r in ROWS if r.name in args.rows]:
        t0 = time.perf_counter()
        try:
            res = api.predict(scenario(row), mode=args.mode, max_ops=args.max_ops)
        except OvsimError as e:
            print(f"{row.name:>6} {row.gpus:>5}  not run: {e}")
            continue
        wall = time.perf_counter() - t0
        iteration_s = res.timeline.makespan_s
        tflops = row.flops() / iteration_s / row.gpus / 1e12
        err = tflops / row.published_tflops_per_gpu - 1
        layout = f"{row.tp}x{row.pp}x{row.dp}"
        print(f"{row.name:>6} {row.gpus:>5} {layout:>12} {row.micro_batch:>2} x {row.micro_batches:<3} "
              f"{row.virtual_stages:>2} {len(res.workload.ops):>8} {iteration_s:7.2f} {tflops:8.1f} "
              f"{row.published_tflops_per_gpu:9.0f} {err:+7.1%} {wall:7.1f} {peak_rss_gb():7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
