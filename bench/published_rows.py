"""The published training jobs ``published_jobs.py`` runs: each row's model, layout, batch and the
throughput its source measured, with the scenario ovsim predicts it from.

- Megatron-LM's weak-scaling table (Narayanan et al., "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", SC'21, arXiv 2104.04473, table 1), in TFLOP/s per GPU
  as the paper counts them (its equation 3).
- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (arXiv
  2205.05198, tables 3 and 5), iteration times as model TFLOP/s per GPU (its equation 7).
- Llama 3 405B's pre-training (arXiv 2407.21783, table 4), model TFLOP/s per GPU.
- llm-foundry's MPT throughput tables (mosaicml/llm-foundry scripts/train/benchmarking/README.md):
  tokens a second per GPU, FSDP.
- NeMo's pre-training performance summary (NVIDIA/NeMo docs/source/performance/performance_summary.md,
  NeMo 24.07, DGX H100, FP8): tokens a second per GPU.
- The FlashAttention repository's training-speed table (Dao-AILab/flash-attention, training/README.md):
  GPT-3 models of 125M to 2.7B on 8 A100 80 GB, tokens a second (per GPU here).
- MegaScale's strong-scaling table (arXiv 2402.15627: Megatron-LM's 175B on 256 to 12,288 GPUs)
  is in megascale_rows.py, model TFLOP/s per GPU.
- NVIDIA's MLPerf Training v3.1 GPT-3 175B runs (512 to 10,752 H100) are in mlperf_rows.py, tokens
  a second per GPU.

What each source does not say is a stated assumption in its row class, never fitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ovsim.models.training_spec import PRESETS, layer_params
from ovsim.scenario import Scenario
from ovsim.validate.training import TABLE_5_22B

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


class _FlopsCounted(Protocol):
    @property
    def gpus(self) -> int: ...

    def flops(self) -> float: ...


class ModelFlopsRow:
    """A row whose throughput is model TFLOP/s a GPU: an iteration's FLOPs as its source counts
    them (each row's ``flops``) over the iteration's time and the GPUs."""

    unit = "TFLOP/s"

    def throughput(self: _FlopsCounted, iteration_s: float) -> float:
        return self.flops() / iteration_s / self.gpus / 1e12


@dataclass(frozen=True)
class Row(ModelFlopsRow):
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

    @property
    def published(self) -> float:
        return self.published_tflops_per_gpu

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
                "recompute": True, "attention": "unfused", "optimizer": "megatron", "loss": "megatron",
                # The paper's code (April 2021) reduced a column-parallel linear's data gradient
                # after its weight gradient (Megatron-LM's asynchronous all-reduce came that
                # autumn) and blocked on each pipeline transfer (batch_p2p_sync): docs/training.md.
                "parallel": parallel_layout(self.tp, self.pp, self.dp, self.virtual_stages, sequence_parallel=False,
                                            overlap_grad_reduce=self.ddp == "torch", tp_dgrad_overlap=False,
                                            overlap_p2p_comm=False),
            },
        })


@dataclass(frozen=True)
class RecomputeRow(ModelFlopsRow):
    """A row of Korthikanti et al.'s table 5 (arXiv 2205.05198): one model of their table 3 with full
    recomputation, or with the paper's own method (sequence parallelism and selective recomputation).
    With ``dp`` > 1 (their section 6.3's 530B on 2,240 GPUs) the batch is a replica's, and the
    gradients are all-reduced after the backward, not overlapped with it, as the paper says."""

    model: str
    layers: int
    hidden: int
    heads: int
    pp: int
    virtual_stages: int
    batch: int  # a replica's: one sequence a micro-batch but the 22B's four
    present_work: bool
    published_iteration_s: float
    micro_batch: int = 1
    dp: int = 1

    @property
    def name(self) -> str:
        return f"k{self.model}-{'present' if self.present_work else 'full'}" + (f"-dp{self.dp}" if self.dp > 1 else "")

    tp: int = 8

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def micro_batches(self) -> int:
        return self.batch // self.micro_batch

    @property
    def published(self) -> float:
        """Model FLOPs a second and GPU at the published iteration time (MFU x 312 TFLOP/s)."""
        return self.throughput(self.published_iteration_s)

    def flops(self) -> float:
        """The model FLOPs of an iteration (the paper's equation 7, which MFU counts)."""
        b, s, l_, h, v = self.batch * self.dp, SEQ, self.layers, self.hidden, VOCAB
        return 72 * b * s * l_ * h * h * (1 + s / (6 * h) + v / (12 * l_ * h))

    def scenario(self) -> Scenario:
        # Megatron-LM of 2022 blocked on each pipeline transfer (overlapping them came in May 2023).
        parallel = parallel_layout(self.tp, self.pp, self.dp, self.virtual_stages,
                                   sequence_parallel=self.present_work, overlap_grad_reduce=False,
                                   overlap_p2p_comm=False)
        return Scenario.model_validate({
            "schema": "ovsim.scenario/1", "name": f"korthikanti-table5-{self.name}", "system": "dgx-a100-hdr",
            "nodes": self.pp * self.dp, "schedule": "overlapped",
            "training": {
                "model": {"layers": self.layers, "hidden": self.hidden, "heads": self.heads, "vocab": VOCAB,
                          "seq_len": SEQ, "gated_mlp": False, "tied_embeddings": True},
                "micro_batch_size": self.micro_batch, "micro_batches": self.batch // self.micro_batch,
                "precision": "fp16", "recompute": "selective" if self.present_work else "full",
                "attention": "unfused", "optimizer": "megatron", "loss": "megatron", "parallel": parallel,
            },
        })


# Korthikanti et al.'s table 3 (the 175B and 530B on the interleaved schedule with three model chunks
# a stage) and table 5's iteration times.
RECOMPUTE_ROWS = [
    RecomputeRow(name, layers, hidden, heads, pp, v, batch, present, seconds, mbs)
    for name, layers, hidden, heads, pp, v, batch, mbs, times in (
        ("22B", 48, 6144, 64, 1, 1, 4, 4, (TABLE_5_22B["full"], TABLE_5_22B["present"])),
        ("175B", 96, 12288, 96, 8, 3, 64, 1, (18.13, 13.75)),
        ("530B", 105, 20480, 128, 35, 3, 280, 1, (49.05, 37.83)),
        ("1T", 128, 25600, 160, 64, 1, 512, 1, (94.42, 71.49)))
    for present, seconds in ((False, times[0]), (True, times[1]))] + [
    # Section 6.3: the 530B on 2,240 GPUs (8-way data parallelism), 39.15 s against 37.83 s alone.
    RecomputeRow("530B", 105, 20480, 128, 35, 3, 280, True, 39.15, dp=8)]


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
class LlamaRow(ModelFlopsRow):
    """A row of Llama 3's table 4, with the virtual stages assumed (see the docstring): at 8K
    context, or at 128K with context parallelism (``cp``)."""

    gpus: int
    virtual_stages: int
    published_tflops_per_gpu: float
    tp: int = 8
    pp: int = 16
    cp: int = 1
    cp_comm: str = "all_gather"  # the paper's (its section 3.3.2)
    seq: int = 8192
    micro_batch: int = 1

    @property
    def name(self) -> str:
        return f"llama3-{self.gpus}{f'-cp{self.cp}' if self.cp > 1 else ''}-v{self.virtual_stages}"

    @property
    def sequences(self) -> int:
        """Sequences a batch of 16M tokens holds."""
        return 2**24 // self.seq

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.cp * self.pp)

    @property
    def micro_batches(self) -> int:
        return self.sequences // (self.dp * self.micro_batch)

    @property
    def published(self) -> float:
        return self.published_tflops_per_gpu

    def flops(self) -> float:
        """Model FLOPs of an iteration as MFU counts them (PaLM, appendix B)."""
        m = PRESETS["llama3-405b"]
        n = m.layers * layer_params(m, 1) + m.vocab * m.hidden
        return (6 * n + 12 * m.layers * m.hidden * self.seq) * self.sequences * self.seq

    def scenario(self) -> Scenario:
        # Gradients accumulated and reduce-scattered in FP32 (the paper's section 3.3.2, "Numerical
        # stability"); ranks in its order of parallelism, [TP, CP, PP, DP] innermost first (the same
        # section), not Megatron-LM's (with TP 8 a node either way, the order moves nothing).
        parallel = parallel_layout(self.tp, self.pp, self.dp, self.virtual_stages, sequence_parallel=True,
                                   distributed_optimizer=True, grad_reduce_fp32=True, rank_order="tp-cp-pp-dp",
                                   **({"cp": self.cp, "cp_comm": self.cp_comm} if self.cp > 1 else {}))
        return Scenario.model_validate({
            "schema": "ovsim.scenario/1", "name": f"llama3-405b-{self.name}", "system": "hgx-h100-ndr",
            "nodes": self.gpus // GPUS_PER_NODE, "schedule": "overlapped",
            "training": {"model": "llama3-405b", "seq_len": self.seq, "micro_batch_size": self.micro_batch,
                         "micro_batches": self.micro_batches, "precision": "bf16", "parallel": parallel},
        })


# Table 4's two 8K-context rows (430 and 400 TFLOP/s per GPU), each with 1, 2 and 4 virtual stages,
# and its 128K-context row (TP 8 x CP 16 x PP 16 x DP 8, sequences of 131,072 tokens, 380).
LLAMA_ROWS = [LlamaRow(g, v, tflops) for g, tflops in ((8192, 430), (16384, 400)) for v in (1, 2, 4)] + [
    LlamaRow(16384, v, 380, cp=16, seq=131_072) for v in (1, 2, 4)]


# MPT (mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml): layers, d_model, heads; expansion
# ratio 4, vocabulary 50,368, tied embeddings, learned positions (no ALiBi), biases, LayerNorm.
_MPT = {"125m": (12, 768, 12), "350m": (24, 1024, 16), "760m": (24, 1536, 12),
        "1b": (24, 2048, 16), "3b": (32, 2560, 20), "7b": (32, 4096, 32), "13b": (40, 5120, 40),
        "30b": (48, 7168, 56), "70b": (80, 8192, 64)}


@dataclass(frozen=True)
class FoundryRow:
    """A row of llm-foundry's MPT throughput tables: FSDP FULL_SHARD over every GPU, BF16 with
    llm-foundry's Triton FlashAttention (``attn_impl: triton`` in the MPT recipes and in
    submit_benchmarks.py of that time), priced as ``flash`` since no paper gives that kernel's rate
    (bench/attention_seq_sweeps.py infers it from these tables), activation checkpointing as the
    row says (ovsim's full recomputation), gradient accumulation over ``accum`` micro-batches.
    Its step: Composer's DecoupledAdamW after gradient-norm clipping (the MPT recipes,
    scripts/train/yamls/pretrain/mpt-*.yaml: ``decoupled_adamw``, weight decay 0,
    ``gradient_clipping`` by norm; ovsim's ``optimizer: composer``). Assumed where the source is
    silent: gradients reduced in BF16 (ovsim's 16-bit wire; scripts/train/benchmarking/
    submit_benchmarks.py set ``fsdp_config.mixed_precision`` to PURE, which reduces in BF16, in its
    early versions and left Composer's DEFAULT, which reduces in FP32, in later ones), A100 nodes of 8 GPUs
    with eight 200 Gb/s NICs (the tables' 1600 Gbps RoCE), one H100 node (only single-node H100 rows
    are run: the tables give no H100 interconnect)."""

    model: str
    gpu: str  # a100 | h100
    seq: int
    gpus: int
    micro_batch: int
    accum: int
    recompute: bool
    published_tokens_per_s: float
    precision: str = "bf16"
    tp: int = 1
    pp: int = 1
    virtual_stages: int = 1
    unit = "tok/s"

    @property
    def name(self) -> str:
        return f"mpt-{self.model}-{self.gpu}-{self.gpus}g-s{self.seq}{'-ckpt' if self.recompute else ''}"

    @property
    def dp(self) -> int:
        return self.gpus

    @property
    def micro_batches(self) -> int:
        return self.accum

    @property
    def published(self) -> float:
        return self.published_tokens_per_s

    def throughput(self, iteration_s: float) -> float:
        return self.micro_batch * self.accum * self.gpus * self.seq / iteration_s / self.gpus

    def scenario(self) -> Scenario:
        layers, hidden, heads = _MPT[self.model]
        system = "dgx-a100-hdr" if self.gpu == "a100" else "hgx-h100-ndr"
        return Scenario.model_validate({
            "schema": "ovsim.scenario/1", "name": f"llm-foundry-{self.name}", "system": system,
            "nodes": max(1, self.gpus // GPUS_PER_NODE), "schedule": "overlapped",
            "training": {
                "model": {"layers": layers, "hidden": hidden, "heads": heads, "vocab": 50_368, "seq_len": self.seq,
                          "gated_mlp": False, "tied_embeddings": True},
                "micro_batch_size": self.micro_batch, "micro_batches": self.accum, "precision": self.precision,
                "recompute": self.recompute, "attention": "flash", "optimizer": "composer",
                "parallel": {"dp": self.gpus, "dp_mode": "fsdp"},
            },
        })


# llm-foundry's tables (README.md at 061f2c7): A100 80 GB (amp_bf16) and single-node H100 80 GB BF16 rows.
FOUNDRY_ROWS = [
    FoundryRow("30b", "a100", 2048, 8, 3, 21, True, 916),
    FoundryRow("13b", "a100", 2048, 8, 2, 3, False, 2262),
    FoundryRow("7b", "a100", 4096, 8, 16, 2, True, 3684),
    FoundryRow("7b", "a100", 2048, 8, 6, 2, False, 4641),
    FoundryRow("1b", "a100", 2048, 8, 14, 4, False, 20513),
    FoundryRow("30b", "h100", 2048, 8, 3, 21, True, 2002),
    FoundryRow("13b", "h100", 4096, 8, 10, 3, True, 4717),
    FoundryRow("13b", "h100", 2048, 8, 2, 1, False, 4792),
    FoundryRow("7b", "h100", 4096, 8, 16, 2, True, 8611),
    FoundryRow("7b", "h100", 2048, 8, 6, 1, False, 10643),
]


# The same tables' sequence-length sweeps at a fixed model: every row of 8 GPUs, no activation
# checkpointing and sequences of 2K or more, of every model with at least three such rows
# (model, sequence, micro-batch, accumulation, tokens a second per GPU). They tell the attention
# kernel's rate apart from the rest (bench/attention_seq_sweeps.py); below 2K attention is a few
# percent of an iteration and says little of its rate. The MPT recipes of that time
# ran llm-foundry's Triton FlashAttention (``attn_impl: triton`` in scripts/train/yamls/pretrain/
# mpt-*.yaml and in submit_benchmarks.py's default).
_SWEEPS = {
    "a100": (("125m", 2048, 40, 2, 142830), ("125m", 2048, 32, 2, 141737), ("125m", 4096, 16, 2, 118396),
             ("125m", 8192, 8, 2, 90392), ("125m", 16384, 4, 2, 60040), ("125m", 32768, 2, 2, 36407),
             ("125m", 65536, 1, 2, 20368),
             ("350m", 2048, 32, 2, 58782), ("350m", 4096, 16, 2, 49555), ("350m", 8192, 8, 2, 36569),
             ("350m", 16384, 4, 2, 23559), ("350m", 32768, 2, 2, 13652), ("350m", 65536, 1, 2, 7524),
             ("760m", 2048, 24, 2, 32434), ("760m", 4096, 12, 2, 27351), ("760m", 8192, 6, 2, 20933),
             ("760m", 16384, 3, 2, 14274), ("760m", 32768, 1, 2, 8802),
             ("1b", 2048, 14, 4, 20513), ("1b", 4096, 7, 4, 17807), ("1b", 8192, 3, 4, 13814),
             ("1b", 16384, 2, 4, 9956), ("1b", 32768, 1, 4, 6275),
             ("3b", 2048, 10, 2, 10811), ("3b", 4096, 5, 6, 9457), ("3b", 8192, 3, 6, 7695),
             ("3b", 16384, 1, 6, 5529)),
    "h100": (("760m", 2048, 24, 2, 63147), ("760m", 4096, 12, 2, 55459), ("760m", 8192, 6, 2, 41825),
             ("760m", 16384, 3, 2, 27815), ("760m", 32768, 1, 2, 16291),
             ("1b", 2048, 14, 1, 45455), ("1b", 4096, 7, 4, 38535), ("1b", 8192, 3, 4, 29157),
             ("1b", 16384, 2, 4, 19649), ("1b", 32768, 1, 4, 12025),
             ("3b", 4096, 5, 6, 20964), ("3b", 8192, 3, 6, 16578), ("3b", 16384, 1, 6, 11152)),
}
FOUNDRY_SEQ_SWEEPS = [FoundryRow(model, gpu, seq, 8, mb, accum, False, tokens)
                      for gpu, rows in _SWEEPS.items() for model, seq, mb, accum, tokens in rows]

@dataclass(frozen=True)
class NemoRow:
    """A row of NeMo 24.07's pre-training table (DGX H100, FP8 with Transformer Engine): TP, PP and
    virtual stages as listed, data parallelism over the rest, sequence parallelism with TP,
    Megatron's distributed optimizer. Assumed where the table is silent: no activation
    recomputation, no tensor-parallel communication overlap (ovsim's ``tp_overlap: none``), the
    optimizer's parameters gathered after the step (with ``overlap_param_gather``, NeMo's
    ``overlap_param_sync``, the rows read +21.9% to +32.6% where they read +21.4% to +32.1%), 8
    NICs of 400 Gb/s a node, FlashAttention-style fused attention, and context parallelism where
    the table lists it as ring attention (Megatron-LM's default exchange). Ranks sit in
    Megatron-LM's order, pipeline stages outermost (ovsim's default ``rank_order``), as NeMo's
    Megatron-core lays them out."""

    model: str  # an ovsim preset
    gpus: int
    global_batch: int
    micro_batch: int
    tp: int
    pp: int
    virtual_stages: int
    published_tokens_per_s: float
    cp: int = 1  # context parallelism: ring attention, Megatron-LM's default exchange
    unit = "tok/s"

    @property
    def name(self) -> str:
        return f"nemo-{self.model}-{self.gpus}g"

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.cp * self.pp)

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def published(self) -> float:
        return self.published_tokens_per_s

    def throughput(self, iteration_s: float) -> float:
        return self.global_batch * PRESETS[self.model].seq_len / iteration_s / self.gpus

    def scenario(self) -> Scenario:
        parallel = parallel_layout(self.tp, self.pp, self.dp, self.virtual_stages,
                                   sequence_parallel=self.tp > 1, distributed_optimizer=True,
                                   **({"cp": self.cp} if self.cp > 1 else {}))
        return Scenario.model_validate({
            "schema": "ovsim.scenario/1", "name": self.name, "system": "hgx-h100-ndr",
            "nodes": max(1, self.gpus // GPUS_PER_NODE), "schedule": "overlapped",
            "training": {"model": self.model, "micro_batch_size": self.micro_batch,
                         "micro_batches": self.micro_batches, "precision": "fp8", "parallel": parallel},
        })


# NeMo 24.07's table (performance_summary.md at 070a0bb): the rows whose model ovsim has as a preset.
NEMO_ROWS = [
    NemoRow("gpt3-175b", 128, 256, 1, 4, 8, 6, 726),
    NemoRow("gpt3-175b", 512, 2048, 2, 4, 8, 6, 782),
    NemoRow("llama2-7b", 8, 128, 1, 1, 1, 1, 16847),
    NemoRow("llama2-13b", 16, 128, 1, 1, 4, 10, 8646),
    NemoRow("llama2-70b", 64, 128, 1, 4, 4, 20, 1707),
    NemoRow("llama3-8b", 8, 128, 1, 1, 1, 1, 12036, cp=2),
    NemoRow("llama3-70b", 64, 128, 1, 4, 4, 5, 1533, cp=2),
]


class _FlashModel(NamedTuple):
    layers: int
    hidden: int
    heads: int
    micro_batch_seqs: int  # sequences a GPU runs at once on an 80 GB A100
    global_batch_seqs: int  # sequences an optimizer step takes, over the 8 GPUs


# GPT-3-shaped models of Dao-AILab/flash-attention's training scripts (training/configs/experiment/pile/
# gpt3{s,m,l,xl}-flash.yaml, gpt3-2.7B-flash-hdim128.yaml; training/configs/model/gpt2model/gpt2-{small,medium}
# for the two smallest), the 2.7B at head dimension 128.
_FLASH = {"125m": _FlashModel(12, 768, 12, 32, 256), "355m": _FlashModel(24, 1024, 16, 16, 256),
          "760m": _FlashModel(24, 1536, 16, 16, 256), "1.3b": _FlashModel(24, 2048, 16, 8, 512),
          "2.7b": _FlashModel(32, 2560, 20, 4, 512)}


@dataclass(frozen=True)
class FlashRow:
    """A row of the FlashAttention repository's training-speed table (Dao-AILab/flash-attention,
    training/README.md, "Training speed": GPT-3 models of 125M to 2.7B on one node of 8 A100 80 GB
    SXM4, 400 W, NVLink; throughput in tokens a second for the node). The runs are that repository's
    scripts: PyTorch Lightning's DDP over the 8 GPUs, BF16, sequences of 2,048, FlashAttention (the
    first, ``attention: flash1``: the table's 2.7B row is the "up to 189 TFLOPs/sec per A100" of the
    README, by its FLOP formula, where FlashAttention-2's abstract gives up to 225), fused
    matmul + bias (+ GELU) and fused dropout + residual + LayerNorm kernels, Apex's fused cross
    entropy, no activation checkpointing, gradient accumulation to the global batch (DDP's
    all-reduce on the last micro-batch only), vocabulary 50,257 padded to 50,264, learned positions,
    tied embeddings. Their step: Apex's FusedAdam for the two smallest; for the rest PyTorch's
    ZeroRedundancyOptimizer around AdamW, which all-reduces the gradients as DDP does, steps an
    eighth of the parameters on each GPU and broadcasts them back: run here as DDP with a fused
    Adam step of every parameter on every GPU (the step and the broadcast are each under 1% of
    these iterations). Assumed where the scripts are silent: gradients reduced at the wire width
    of BF16 training (Lightning's BF16 keeps FP32 weights, so they were likely reduced in FP32;
    the reduction overlaps the last backward)."""

    model: str
    published_tokens_per_s_node: float
    gpus: int = 8
    tp: int = 1
    pp: int = 1
    virtual_stages: int = 1
    seq: int = 2048
    unit = "tok/s"

    @property
    def name(self) -> str:
        return f"flash-gpt3-{self.model}"

    @property
    def dp(self) -> int:
        return self.gpus

    @property
    def micro_batch(self) -> int:
        return _FLASH[self.model].micro_batch_seqs

    @property
    def micro_batches(self) -> int:
        return _FLASH[self.model].global_batch_seqs // (self.gpus * self.micro_batch)

    @property
    def published(self) -> float:
        return self.published_tokens_per_s_node / self.gpus

    def throughput(self, iteration_s: float) -> float:
        return _FLASH[self.model].global_batch_seqs * self.seq / iteration_s / self.gpus

    def scenario(self) -> Scenario:
        layers, hidden, heads, _, _ = _FLASH[self.model]
        return Scenario.model_validate({
            "schema": "ovsim.scenario/1", "name": self.name, "system": "dgx-a100-hdr", "nodes": 1,
            "schedule": "overlapped",
            "training": {
                "model": {"layers": layers, "hidden": hidden, "heads": heads, "vocab": 50_264, "seq_len": self.seq,
                          "gated_mlp": False, "tied_embeddings": True},
                "micro_batch_size": self.micro_batch, "micro_batches": self.micro_batches, "precision": "bf16",
                "recompute": False, "attention": "flash1", "optimizer": "fused_adam",
                "parallel": {"dp": self.gpus, "dp_mode": "ddp"},
            },
        })


# The README's table (training/README.md at the version that reports 189 TFLOP/s per A100, 60.6% MFU).
FLASH_ROWS = [FlashRow("125m", 1_310_000), FlashRow("355m", 503_000), FlashRow("760m", 245_000),
              FlashRow("1.3b", 169_000), FlashRow("2.7b", 85_000)]
