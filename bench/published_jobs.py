"""Published training jobs at their real size, predicted by ovsim and set against the throughput the
papers measured. A benchmark: it prints figures and times, and asserts nothing.

Megatron-LM's weak-scaling table (Narayanan et al., "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", SC'21, arXiv 2104.04473, table 1): GPT models of 1.7B to 1T
parameters on up to 3,072 A100-SXM4-80GB in DGX A100 nodes with eight 200 Gb/s HDR InfiniBand NICs
each (Selene), FP16 mixed precision, sequence 2048, vocabulary 51,200, full activation
recomputation, the interleaved 1F1B schedule where the run set a virtual stage size. Each row's
layout (tensor, pipeline and data parallelism, micro-batch and global batch, layers per virtual
stage) is the one the paper's own script ran (NVIDIA/Megatron-LM, examples/sc21/run_table_1.sh),
and so is its data parallelism: PyTorch's DDP for 1.7B-18B, which reduces gradient buckets beside
the backward pass, and Megatron-LM's "local" DDP from 39B up, which all-reduces every gradient
after the pipeline's forward and backward (``allreduce_gradients()`` in that era's
megatron/training.py; ovsim's ``overlap_grad_reduce: false``).
Throughput per GPU is the paper's count of an iteration's FLOPs (its equation 3, which counts
the recomputed forward pass) over the iteration's time and the GPU count:

    F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))

    python bench/published_jobs.py                 # 1.7B-18B simulated, about 3 s
    python bench/published_jobs.py --rows 39B 76B 145B --mode analytic   # about 15 s, 0.8 GB
    python bench/published_jobs.py --rows 310B 530B 1T --mode analytic   # about 5 minutes, 12 GB
    python bench/published_jobs.py --figure-18 --mode analytic   # scatter-gather on and off, about a minute

Every row runs with unfused attention, as Megatron-LM ran before FlashAttention, which is also
what equation 3 counts (the whole s x s of QK^T and PV, no causal skipping). The rows from 310B
up simulate 0.7-3.3 million ops (one rank of each pipeline stage: hundreds of micro-batches
through 16-64 stages) and are not run by default.

Llama 3 405B's pre-training at 8K context (Grattafiori et al., "The Llama 3 Herd of Models",
arXiv 2407.21783, table 4): 8,192 and 16,384 H100 in TP8 x CP1 x PP16 x DP64 and DP128, sequences
of 8,192 tokens, 16M tokens a batch (32 and 16 sequences a data-parallel replica), 430 and 400
TFLOP/s per GPU (43% and 41% BF16 MFU); 126 layers, one fewer on the first and the last pipeline
stage (its section 3.3.2). Throughput per GPU counts model FLOPs as MFU does (Chowdhery et al.,
PaLM, appendix B): 6 N + 12 L h s a token, N the parameters outside the input embedding. What the
paper does not say is run as a stated assumption, never fitted: its interleaved schedule's
virtual stages (each row names v; 1 is plain 1F1B), BF16 with FlashAttention and sequence
parallelism, one sequence a micro-batch, and the optimizer state sharded over data parallelism
as Megatron-LM's distributed optimizer does (gradients reduce-scattered, parameters all-gathered
after the step; the run's FSDP also sharded its gradients, which ovsim does not model together
with pipeline parallelism); the nodes are HGX H100 with eight 400 Gb/s NICs (the paper's RoCE
fabric runs 400 Gb/s a GPU too).

    python bench/published_jobs.py --rows llama3-16384-v2 --mode analytic   # about 5 s, 0.4 GB

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (arXiv
2205.05198, table 5), on the same Selene nodes with the Megatron-LM of 2022: 22B, 175B, 530B and 1T
GPT models (their table 3: TP 8, PP 1, 8, 35 and 64, the 175B and 530B interleaved with three model
chunks a stage, one sequence a micro-batch but the 22B's four, no data parallelism), each with full
recomputation and with the paper's method (sequence parallelism and selective recomputation),
against the published iteration time; throughput counts model FLOPs (the paper's equation 7).

    python bench/published_jobs.py --rows k22B-full k22B-present k175B-full k175B-present --mode analytic
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from dataclasses import dataclass

from ovsim import api
from ovsim.errors import OvsimError
from ovsim.models.training_spec import PRESETS, layer_params
from ovsim.scenario import Mode, Scenario

SEQ = 2048
VOCAB = 51_200
GPUS_PER_NODE = 8


def parallel_layout(tp: int, pp: int, dp: int, virtual_stages: int, **more: object) -> dict[str, object]:
    """A row's ``training.parallel``: interleaved 1F1B where it sets virtual stages, plain otherwise."""
    layout: dict[str, object] = {"tp": tp, "pp": pp, "dp": dp,
                                 "pipeline": "interleaved" if virtual_stages > 1 else "1f1b", **more}
    if virtual_stages > 1:
        layout["virtual_stages"] = virtual_stages
    return layout


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
    # run_table_1.sh's DDP: "torch" (PyTorch DDP, buckets reduced beside backward) or "local"
    # (Megatron-LM's own, every gradient all-reduced after the pipeline's backward).
    ddp: str = "local"

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

    def scenario(self) -> Scenario:
        return Scenario.model_validate({
            "schema": "ovsim.scenario/1", "name": f"megatron-table1-{self.name}", "system": "dgx-a100-hdr",
            "nodes": self.nodes, "schedule": "overlapped",
            "training": {
                "model": {"layers": self.layers, "hidden": self.hidden, "heads": self.heads, "vocab": VOCAB,
                          "seq_len": SEQ, "gated_mlp": False, "tied_embeddings": True},
                "micro_batch_size": self.micro_batch, "micro_batches": self.micro_batches, "precision": "fp16",
                "recompute": True, "attention": "unfused",
                "parallel": parallel_layout(self.tp, self.pp, self.dp, self.virtual_stages, sequence_parallel=False,
                                            overlap_grad_reduce=self.ddp == "torch"),
            },
        })


@dataclass(frozen=True)
class RecomputeRow:
    """A row of Korthikanti et al.'s table 5 (arXiv 2205.05198): one model of their table 3 with full
    recomputation, or with the paper's own method (sequence parallelism and selective recomputation)."""

    model: str
    layers: int
    hidden: int
    heads: int
    pp: int
    virtual_stages: int
    batch: int  # one sequence a micro-batch but the 22B's four, no data parallelism
    present_work: bool
    published_iteration_s: float
    micro_batch: int = 1

    @property
    def name(self) -> str:
        return f"k{self.model}-{'present' if self.present_work else 'full'}"

    tp: int = 8
    dp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def micro_batches(self) -> int:
        return self.batch // self.micro_batch

    @property
    def published_tflops_per_gpu(self) -> float:
        """Model FLOPs a second and GPU at the published iteration time (MFU x 312 TFLOP/s)."""
        return self.flops() / self.published_iteration_s / self.gpus / 1e12

    def flops(self) -> float:
        """The model FLOPs of an iteration (the paper's equation 7, which MFU counts)."""
        b, s, l_, h, v = self.batch, SEQ, self.layers, self.hidden, VOCAB
        return 72 * b * s * l_ * h * h * (1 + s / (6 * h) + v / (12 * l_ * h))

    def scenario(self) -> Scenario:
        parallel = parallel_layout(self.tp, self.pp, self.dp, self.virtual_stages,
                                   sequence_parallel=self.present_work)
        return Scenario.model_validate({
            "schema": "ovsim.scenario/1", "name": f"korthikanti-table5-{self.name}", "system": "dgx-a100-hdr",
            "nodes": self.pp, "schedule": "overlapped",
            "training": {
                "model": {"layers": self.layers, "hidden": self.hidden, "heads": self.heads, "vocab": VOCAB,
                          "seq_len": SEQ, "gated_mlp": False, "tied_embeddings": True},
                "micro_batch_size": self.micro_batch, "micro_batches": self.batch // self.micro_batch,
                "precision": "fp16", "recompute": "selective" if self.present_work else "full",
                "attention": "unfused", "parallel": parallel,
            },
        })


# Korthikanti et al.'s table 3 (the 175B and 530B on the interleaved schedule with three model chunks
# a stage) and table 5's iteration times.
RECOMPUTE_ROWS = [
    RecomputeRow(name, layers, hidden, heads, pp, v, batch, present, seconds, mbs)
    for name, layers, hidden, heads, pp, v, batch, mbs, times in (
        ("22B", 48, 6144, 64, 1, 1, 4, 4, (1.42, 1.10)),
        ("175B", 96, 12288, 96, 8, 3, 64, 1, (18.13, 13.75)),
        ("530B", 105, 20480, 128, 35, 3, 280, 1, (49.05, 37.83)),
        ("1T", 128, 25600, 160, 64, 1, 512, 1, (94.42, 71.49)))
    for present, seconds in ((False, times[0]), (True, times[1]))]


# Table 1 (published teraFLOP/s per GPU) with run_table_1.sh's layouts.
ROWS = [
    Row("1.7B", 24, 2304, 24, 1, 1, 16, 512, 4, None, 137, ddp="torch"),
    Row("3.6B", 30, 3072, 32, 2, 1, 16, 512, 8, None, 138, ddp="torch"),
    Row("7.5B", 36, 4096, 32, 4, 1, 16, 512, 16, None, 142, ddp="torch"),
    Row("18B", 40, 6144, 48, 8, 1, 8, 1024, 32, None, 135, ddp="torch"),
    Row("39B", 48, 8192, 64, 8, 2, 4, 1536, 64, None, 138),
    Row("76B", 60, 10240, 80, 8, 4, 2, 1792, 128, 5, 140),
    Row("145B", 80, 12288, 96, 8, 8, 2, 2304, 192, 5, 148),
    Row("310B", 96, 16384, 128, 8, 16, 1, 2160, 240, 3, 155),
    Row("530B", 105, 20480, 128, 8, 35, 1, 2520, 315, 1, 163),
    Row("1T", 128, 25600, 160, 8, 64, 1, 3072, 384, None, 163),
]


@dataclass(frozen=True)
class LlamaRow:
    """A row of Llama 3's table 4 at 8K context, with the virtual stages assumed (see the docstring)."""

    gpus: int
    virtual_stages: int
    published_tflops_per_gpu: float
    tp: int = 8
    pp: int = 16
    micro_batch: int = 1
    sequences: int = 2048  # 16M tokens a batch of 8,192-token sequences

    @property
    def name(self) -> str:
        return f"llama3-{self.gpus}-v{self.virtual_stages}"

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def micro_batches(self) -> int:
        return self.sequences // (self.dp * self.micro_batch)

    def flops(self) -> float:
        """Model FLOPs of an iteration as MFU counts them (PaLM, appendix B)."""
        m = PRESETS["llama3-405b"]
        n = m.layers * layer_params(m, 1) + m.vocab * m.hidden
        return (6 * n + 12 * m.layers * m.hidden * m.seq_len) * self.sequences * m.seq_len

    def scenario(self) -> Scenario:
        parallel = parallel_layout(self.tp, self.pp, self.dp, self.virtual_stages, sequence_parallel=True,
                                   distributed_optimizer=True)
        return Scenario.model_validate({
            "schema": "ovsim.scenario/1", "name": f"llama3-405b-{self.name}", "system": "hgx-h100-ndr",
            "nodes": self.gpus // GPUS_PER_NODE, "schedule": "overlapped",
            "training": {"model": "llama3-405b", "micro_batch_size": self.micro_batch,
                         "micro_batches": self.micro_batches, "precision": "bf16", "parallel": parallel},
        })


# Table 4's two 8K-context rows (430 and 400 TFLOP/s per GPU), each with 1, 2 and 4 virtual stages.
LLAMA_ROWS = [LlamaRow(g, v, tflops) for g, tflops in ((8192, 430), (16384, 400)) for v in (1, 2, 4)]
DEFAULT_ROWS = ["1.7B", "3.6B", "7.5B", "18B"]


def peak_rss_gb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**30 if sys.platform == "darwin" else rss / 2**20


def figure_18(mode: Mode, max_ops: int) -> None:
    """The paper's figure 18 configuration (run_figure_18.sh: GPT 175B, TP8 x PP12 on 12 DGX A100,
    4 virtual stages, micro-batch 1, batch 12-60, local DDP) with and without scatter-gather
    pipeline transfers: the iteration's speed-up ovsim predicts for the optimisation."""
    print(f"figure 18 ({mode}): batch, iteration with / without scatter-gather, speed-up")
    for batch in (12, 24, 36, 48, 60):
        times = []
        for scatter_gather in (True, False):
            row = Row("175B", 96, 12288, 96, 8, 12, 1, batch, 12, 2, 0.0)
            sc = row.scenario()
            assert sc.training is not None
            parallel = sc.training.parallel.model_copy(update={"pipeline_scatter_gather": scatter_gather})
            sc = sc.model_copy(update={"training": sc.training.model_copy(update={"parallel": parallel})})
            times.append(api.predict(sc, mode=mode, max_ops=max_ops).timeline.makespan_s)
        print(f"{batch:>5} {times[0]:8.3f} s {times[1]:8.3f} s {times[1] / times[0] - 1:+7.1%}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    every: list[Row | LlamaRow | RecomputeRow] = [*ROWS, *LLAMA_ROWS, *RECOMPUTE_ROWS]
    ap.add_argument("--rows", nargs="+", default=DEFAULT_ROWS, choices=[r.name for r in every])
    ap.add_argument("--mode", choices=["analytic", "simulate"], default="simulate")
    ap.add_argument("--max-ops", type=int, default=4_000_000)
    ap.add_argument("--figure-18", action="store_true",
                    help="instead of the rows: the paper's figure 18 configuration with and without scatter-gather")
    args = ap.parse_args(argv)
    if args.figure_18:
        figure_18(args.mode, args.max_ops)
        return 0
    print(f"mode: {args.mode}; ops: those simulated (rank symmetry); memory: whether the estimate fits "
          "80 GB a GPU; wall s and peak GB: this process's")
    print(f"{'row':>15} {'GPUs':>6} {'tp x pp x dp':>12} {'mb x m':>7} {'v':>2} {'ops':>8} {'iter s':>7} "
          f"{'TFLOP/s':>8} {'published':>9} {'error':>7} {'memory':>7} {'wall s':>7} {'peak GB':>7}")
    for row in [r for r in every if r.name in args.rows]:
        t0 = time.perf_counter()
        try:
            res = api.predict(row.scenario(), mode=args.mode, max_ops=args.max_ops)
        except OvsimError as e:
            print(f"{row.name:>15} {row.gpus:>6}  not run: {e}")
            continue
        wall = time.perf_counter() - t0
        iteration_s = res.timeline.makespan_s
        tflops = row.flops() / iteration_s / row.gpus / 1e12
        err = tflops / row.published_tflops_per_gpu - 1
        layout = f"{row.tp}x{row.pp}x{row.dp}"
        # The estimate's verdict on 80 GB (docs/training.md, "What ovsim predict reports").
        memory = "fits" if res.summary().get("fits_memory") else "over"
        print(f"{row.name:>15} {row.gpus:>6} {layout:>12} {row.micro_batch:>2} x {row.micro_batches:<3} "
              f"{row.virtual_stages:>2} {len(res.workload.ops):>8} {iteration_s:7.2f} {tflops:8.1f} "
              f"{row.published_tflops_per_gpu:9.0f} {err:+7.1%} {memory:>7} {wall:7.1f} {peak_rss_gb():7.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
