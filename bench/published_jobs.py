"""Published training jobs at their real size, predicted by ovsim and set against the throughput the
papers measured. A benchmark: it prints figures and times, and asserts nothing. The rows and their
sources are in published_rows.py.

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
    python bench/published_jobs.py --rows 145B --mode analytic --write-scenario 145b.yaml   # for ovsim's commands

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

    python bench/published_jobs.py --rows llama3-16384-v2 --mode analytic   # about 6 s, 0.2 GB

Its 128K-context row: 16,384 H100 in TP8 x CP16 x PP16 x DP8, sequences of 131,072 tokens (16 a
replica), 380 TFLOP/s per GPU, counted as above (what the paper's own count of attention is, it
does not say); context parallelism as the paper's section 3.3.2 describes it, keys and values
all-gathered (``training.parallel.cp``).

    python bench/published_jobs.py --rows llama3-16384-cp16-v2 --mode analytic   # about 2 s, 0.2 GB

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (arXiv
2205.05198, table 5), on the same Selene nodes with the Megatron-LM of 2022: 22B, 175B, 530B and 1T
GPT models (their table 3: TP 8, PP 1, 8, 35 and 64, the 175B and 530B interleaved with three model
chunks a stage, one sequence a micro-batch but the 22B's four, no data parallelism), each with full
recomputation and with the paper's method (sequence parallelism and selective recomputation),
against the published iteration time; throughput counts model FLOPs (the paper's equation 7).

    python bench/published_jobs.py --rows k22B-full k22B-present k175B-full k175B-present --mode analytic

llm-foundry's MPT tables (FSDP on A100 80 GB and H100, tokens a second per GPU) and NeMo 24.07's
(DGX H100, FP8):

    python bench/published_jobs.py --rows foundry --mode analytic   # every llm-foundry row
    python bench/published_jobs.py --rows nemo --mode analytic      # every NeMo row

The FlashAttention repository's training table (Dao-AILab/flash-attention, training/README.md,
"Training speed"): GPT-3 models of 125M to 2.7B trained by its own scripts on 8 A100 80 GB, the
kernels fused and nothing recomputed or sharded (published_rows.FlashRow):

    python bench/published_jobs.py --rows flash                     # every row, simulated, about 6 s

MegaScale's strong-scaling table (Jiang et al., NSDI'24, arXiv 2402.15627, table 2, and table 3's
baseline): Megatron-LM of January 2023 training a 175B GPT on 256 to 12,288 Ampere GPUs
(megascale_rows.py names what the paper leaves unsaid):

    python bench/published_jobs.py --rows megascale --mode analytic  # every row, about a minute

NVIDIA's MLPerf Training v3.1 GPT-3 175B runs (mlcommons/training_results_v3.1: 512 to 10,752 H100
in FP8, each step's time logged; mlperf_rows.py names the configuration and what is assumed):

    python bench/published_jobs.py --rows mlperf --mode analytic     # every row, about a minute, 1.1 GB

NeMo's long-sequence table (the NeMo Framework user guide 24.12: Llama 2 7B in FP8 on DGX H100 at
4K to 1M tokens a sequence, context parallelism from 32K; nemo_long_rows.py names what is assumed):

    python bench/published_jobs.py --rows nemo-long --mode analytic  # every row, about 10 s

``--breakdown`` adds, under each row, where rank 0's time goes (its GEMMs, attention and
memory-bound kernels on the compute stream at the clocks the power limit leaves them, its kernels
on other streams, FSDP's post-backward copies, and the time its communication streams are busy,
waits for peers included) beside the iteration the published throughput implies.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import yaml
from megascale_rows import MEGASCALE_ROWS, MegaScaleRow
from mlperf_rows import MLPERF_ROWS, MlperfRow
from nemo_long_rows import NEMO_LONG_ROWS, NemoLongRow
from published_rows import (
    FLASH_ROWS,
    FOUNDRY_ROWS,
    LLAMA_ROWS,
    NEMO_ROWS,
    RECOMPUTE_ROWS,
    ROWS,
    FlashRow,
    FoundryRow,
    LlamaRow,
    NemoRow,
    RecomputeRow,
    Row,
)

from ovsim import api
from ovsim.errors import OvsimError
from ovsim.metrics import COMM_KINDS, NON_COMPUTE, stream_busy
from ovsim.scenario import Mode

AnyRow = Row | LlamaRow | RecomputeRow | FoundryRow | NemoRow | FlashRow | MegaScaleRow | MlperfRow | NemoLongRow
DEFAULT_ROWS = ["1.7B", "3.6B", "7.5B", "18B"]
GROUPS = {"foundry": [r.name for r in FOUNDRY_ROWS], "nemo": [r.name for r in NEMO_ROWS],
          "korthikanti": [r.name for r in RECOMPUTE_ROWS], "flash": [r.name for r in FLASH_ROWS],
          "megascale": [r.name for r in MEGASCALE_ROWS], "mlperf": [r.name for r in MLPERF_ROWS],
          "nemo-long": [r.name for r in NEMO_LONG_ROWS]}


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


def breakdown(res: api.Result, iteration_s: float, published_iteration_s: float) -> str:
    """Rank 0's compute-stream kernel time by kind, its kernels on other streams (FSDP's
    post-backward copies) and its communication streams' busy time, beside the iteration ovsim
    predicts and the one the published throughput implies."""
    ops = res.timeline.ops
    ops = ops[(ops["rank"] == 0) & (ops["kind"] != "flow")]
    main = ops["stream"].isin(["compute", "main"])
    seconds = (ops["end_s"] - ops["start_s"])[main].groupby(ops.loc[main, "kind"]).sum()
    memory = sum(float(seconds.get(k, 0.0)) for k in ("elementwise", "norm", "softmax"))
    comm_streams = set(ops.loc[ops["kind"].isin(COMM_KINDS), "stream"])
    beside = ops[~main & ~ops["stream"].isin(comm_streams) & ~ops["kind"].isin(NON_COMPUTE)]
    busy = stream_busy(ops)
    comm_s = float(busy.loc[busy["stream"].isin(comm_streams), "busy_s"].sum())
    return (f"{'':>28} rank 0: GEMMs {float(seconds.get('gemm', 0.0)):.3f} s, attention "
            f"{float(seconds.get('attention', 0.0)):.3f} s, memory-bound {memory:.3f} s, kernels beside them "
            f"{float((beside['end_s'] - beside['start_s']).sum()):.3f} s, communication streams busy {comm_s:.3f} s; "
            f"iteration {iteration_s:.3f} s, published {published_iteration_s:.3f} s")


def write_scenario(rows: list[AnyRow], mode: Mode, path: str) -> int:
    """The row's scenario as a YAML file (in ``mode``), for ``ovsim predict``, ``sweep`` or ``tune``."""
    if len(rows) != 1:
        raise SystemExit(f"--write-scenario takes one row, got {len(rows)}")
    sc = rows[0].scenario().model_copy(update={"mode": mode})
    text = yaml.safe_dump(sc.model_dump(mode="json", exclude_none=True, by_alias=True), sort_keys=False)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# {rows[0].name}, written by bench/published_jobs.py (its docstring names the source)\n{text}")
    print(f"{rows[0].name}: scenario written to {path}")
    return 0


def all_rows() -> list[AnyRow]:
    """Every row this script runs, in its order."""
    return [*ROWS, *LLAMA_ROWS, *RECOMPUTE_ROWS, *FOUNDRY_ROWS, *NEMO_ROWS, *FLASH_ROWS, *MEGASCALE_ROWS, *MLPERF_ROWS,
            *NEMO_LONG_ROWS]


def rows_by_name() -> dict[str, AnyRow]:
    """Every row this script runs, by its name."""
    return {r.name: r for r in all_rows()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    every = all_rows()
    ap.add_argument("--rows", nargs="+", default=DEFAULT_ROWS, choices=[r.name for r in every] + list(GROUPS),
                    metavar="ROW", help="rows (" + ", ".join(r.name for r in every) + ") or groups ("
                    + ", ".join(GROUPS) + "); default: " + " ".join(DEFAULT_ROWS))
    ap.add_argument("--mode", choices=["analytic", "simulate"], default="simulate")
    ap.add_argument("--max-ops", type=int, default=4_000_000)
    ap.add_argument("--figure-18", action="store_true",
                    help="instead of the rows: the paper's figure 18 configuration with and without scatter-gather")
    ap.add_argument("--write-scenario", metavar="FILE",
                    help="instead of predicting: write the (one) row's scenario as YAML, to run ovsim's commands on it")
    ap.add_argument("--breakdown", action="store_true",
                    help="under each row, where rank 0's time goes beside the published iteration")
    args = ap.parse_args(argv)
    wanted = {n for name in args.rows for n in GROUPS.get(name, [name])}
    if args.figure_18:
        figure_18(args.mode, args.max_ops)
        return 0
    if args.write_scenario:
        return write_scenario([r for r in every if r.name in wanted], args.mode, args.write_scenario)
    print(f"mode: {args.mode}; ops: those simulated (rank symmetry); memory: whether the estimate fits "
          "80 GB a GPU; wall s and peak GB: this process's")
    print(f"{'row':>28} {'GPUs':>6} {'tp x pp x dp':>12} {'mb x m':>7} {'v':>2} {'ops':>8} {'iter s':>7} "
          f"{'per GPU':>16} {'published':>9} {'error':>7} {'memory':>7} {'wall s':>7} {'peak GB':>7}")
    for row in [r for r in every if r.name in wanted]:
        t0 = time.perf_counter()
        try:
            res = api.predict(row.scenario(), mode=args.mode, max_ops=args.max_ops)
        except OvsimError as e:
            print(f"{row.name:>28} {row.gpus:>6}  not run: {e}")
            continue
        wall = time.perf_counter() - t0
        iteration_s = res.timeline.makespan_s
        per_gpu = row.throughput(iteration_s)
        err = per_gpu / row.published - 1
        layout = f"{row.tp}x{row.pp}x{row.dp}"
        # The estimate's verdict on 80 GB (docs/training.md, "What ovsim predict reports").
        memory = "fits" if res.summary().get("fits_memory") else "over"
        print(f"{row.name:>28} {row.gpus:>6} {layout:>12} {row.micro_batch:>2} x {row.micro_batches:<3} "
              f"{row.virtual_stages:>2} {len(res.workload.ops):>8} {iteration_s:7.2f} {per_gpu:8.1f} {row.unit:>7} "
              f"{row.published:9.0f} {err:+7.1%} {memory:>7} {wall:7.1f} {peak_rss_gb():7.2f}", flush=True)
        if args.breakdown:
            print(breakdown(res, iteration_s, iteration_s * per_gpu / row.published), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
