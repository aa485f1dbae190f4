"""What a training iteration is: the model's shape (presets with their sources), the parallel
layout (data, tensor, pipeline; DDP or FSDP; tensor-parallel overlap), the batch and precision,
and the parameter and gradient counts that follow from them. :mod:`ovsim.models.training` turns
a :class:`TrainingSpec` into ops."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError, model_validator

from ovsim.errors import OvsimError
from ovsim.hw.inputs import InputModel
from ovsim.hw.spec import AttentionImplementation
from ovsim.hw.validation import validation_error
from ovsim.units import MIB

TrainPrecision = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "amp_bf16", "amp_fp16"]
# PyTorch's automatic mixed precision (torch.autocast): FP32 parameters, gradients and optimizer
# state, each linear and the attention run in the 16-bit type named, the norms, the residual stream
# and the loss in FP32 (docs/training.md, "PyTorch's automatic mixed precision").
AUTOCAST: dict[str, Literal["bf16", "fp16"]] = {"amp_bf16": "bf16", "amp_fp16": "fp16"}


class ModelShape(InputModel):
    """A decoder-only transformer's dimensions."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    # Key/value heads (grouped-query attention); None: as many as query heads.
    kv_heads: PositiveInt | None = None
    # MLP inner size; None: 4 x hidden.
    ffn_hidden: PositiveInt | None = None
    vocab: PositiveInt = 50257
    seq_len: PositiveInt = 2048
    # SwiGLU-style MLP: FC1 produces two ffn_hidden-wide halves.
    gated_mlp: bool = False
    # Output head shares the embedding matrix (GPT-3) or has its own (LLaMA).
    tied_embeddings: bool = True
    source: str = ""

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @model_validator(mode="after")
    def _consistent(self) -> ModelShape:
        if self.hidden % self.heads:
            raise ValueError(f"hidden size {self.hidden} is not a multiple of the {self.heads} heads")
        if self.heads % self.kv:
            raise ValueError(f"{self.heads} heads are not a multiple of the {self.kv} key/value heads")
        return self


_GPT3 = "Brown et al., Language Models are Few-Shot Learners, 2020, table 2.1"
_LLAMA2 = "Touvron et al., Llama 2, 2023, table 1 and the released config.json (ffn, kv heads)"
_LLAMA3 = "Grattafiori et al., The Llama 3 Herd of Models, arXiv 2407.21783, table 3 (pre-training at 8K context)"

# GPT-3 XL lists 24 heads of 128 in table 2.1, which does not divide 2048; implementations
# (Megatron-LM's examples, the seed study's DeepSpeed runs) use 16 heads of 128.
PRESETS: dict[str, ModelShape] = {
    "gpt3-1.3b": ModelShape(layers=24, hidden=2048, heads=16, source=_GPT3 + " (16 heads, see above)"),
    "gpt3-2.7b": ModelShape(layers=32, hidden=2560, heads=32, source=_GPT3),
    "gpt3-6.7b": ModelShape(layers=32, hidden=4096, heads=32, source=_GPT3),
    "gpt3-13b": ModelShape(layers=40, hidden=5120, heads=40, source=_GPT3 + " (hidden 5120 as implemented)"),
    "gpt3-175b": ModelShape(layers=96, hidden=12288, heads=96, source=_GPT3),
    "llama2-7b": ModelShape(layers=32, hidden=4096, heads=32, ffn_hidden=11008, vocab=32000, seq_len=4096,
                            gated_mlp=True, tied_embeddings=False, source=_LLAMA2),
    "llama2-13b": ModelShape(layers=40, hidden=5120, heads=40, ffn_hidden=13824, vocab=32000, seq_len=4096,
                             gated_mlp=True, tied_embeddings=False, source=_LLAMA2),
    "llama2-70b": ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=32000,
                             seq_len=4096, gated_mlp=True, tied_embeddings=False, source=_LLAMA2),
    "llama3-8b": ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
                            seq_len=8192, gated_mlp=True, tied_embeddings=False, source=_LLAMA3),
    "llama3-70b": ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256,
                             seq_len=8192, gated_mlp=True, tied_embeddings=False, source=_LLAMA3),
    "llama3-405b": ModelShape(layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256,
                              seq_len=8192, gated_mlp=True, tied_embeddings=False, source=_LLAMA3),
}
ALIASES = {"gpt3-xl": "gpt3-1.3b"}


class ParallelSpec(InputModel):
    """How ranks split the model, TP innermost, then context parallelism, then as ``rank_order``
    says: rank = ((stage * dp + dp_index) * cp + cp_index) * tp + tp_index by default."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # Data-parallel degree; None: whatever the ranks leave after tp x cp x pp.
    dp: PositiveInt | None = None
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    # Context-parallel degree: each of cp ranks holds 1/cp of every sequence, as two of its 2 x cp
    # chunks (the i-th and the (2cp - 1 - i)-th) so that causal attention loads the ranks evenly,
    # and exchanges keys and values with the others as ``cp_comm`` says. A replica's cp ranks reduce
    # their gradients with the data-parallel ones (Megatron-LM's data-parallel group with context
    # parallelism).
    cp: PositiveInt = 1
    # Where ranks sit, innermost first (:class:`Layout`). "tp-cp-dp-pp": a stage's replicas side by
    # side, pipeline stages outermost, as Megatron-LM (its default order "tp-cp-ep-dp-pp" in
    # ``initialize_model_parallel``; NeMo's too), DeepSpeed's pipeline topology and torchtitan's
    # device mesh lay them out. "tp-cp-pp-dp": a replica's stages side by side, data parallelism
    # outermost, as Llama 3's pre-training did (arXiv 2407.21783, section 3.3.2) and Megatron-LM
    # with ``--use-tp-pp-dp-mapping``. With tp x cp below a node, the first keeps a stage's
    # data-parallel collectives partly on the node's NVLink and sends pipeline transfers across
    # nodes; the second, the reverse.
    rank_order: Literal["tp-cp-dp-pp", "tp-cp-pp-dp"] = "tp-cp-dp-pp"
    # How a context-parallel rank gets the other ranks' keys and values (ovsim.models.training_cp):
    # "p2p", ring attention, blocks passed round beside the attention's steps (Megatron-LM's and
    # Transformer Engine's default); "all_gather", gathered before the attention (Llama 3's);
    # "a2a", the sequence's split traded for a split of the heads and back (DeepSpeed-Ulysses).
    cp_comm: Literal["p2p", "all_gather", "a2a"] = "p2p"
    dp_mode: Literal["ddp", "fsdp"] = "ddp"
    # Megatron-LM's distributed optimizer (ZeRO-1, ``--use-distributed-optimizer``), with DDP:
    # each gradient bucket is reduce-scattered instead of all-reduced, each rank steps its 1/dp of
    # the optimizer state, and the updated parameters are all-gathered a bucket at a time after it.
    distributed_optimizer: bool = False
    bucket_bytes: PositiveFloat = 25 * MIB
    first_bucket_bytes: PositiveFloat = 1 * MIB
    # DDP: reduce each gradient bucket as soon as backward fills it, beside the backward still
    # running (PyTorch DDP; Megatron-LM's ``--overlap-grad-reduce``); False: all of a stage's
    # gradients in one collective after its last backward, as Megatron-LM does without that flag
    # (its default; in 2021 its "local" DDP, ``allreduce_gradients()`` after the pipeline's
    # forward and backward in ``megatron/training.py``).
    overlap_grad_reduce: bool = True
    # With the distributed optimizer: gather the updated parameters beside the next forward pass,
    # each layer's before its first forward, in forward order from the iteration's start
    # (Megatron-LM's ``--overlap-param-gather``, NeMo's ``overlap_param_sync``, which Megatron-LM
    # allows only with ``--overlap-grad-reduce``); False: after the step, exposed (its default).
    overlap_param_gather: bool = False
    # DDP's gradients accumulated over micro-batches and reduced in FP32 (Megatron-LM's
    # ``--accumulate-allreduce-grads-in-fp32``; Llama 3's pre-training, arXiv 2407.21783, section
    # 3.3.2) or at the wire's width (False); None: Megatron-LM's default, FP32 under its optimizer
    # with BF16 or FP8 weights (gradient_element_bytes).
    grad_reduce_fp32: bool | None = None
    # All-gathers FSDP issues ahead of the layer computing (1 = PyTorch's forward/backward prefetch).
    fsdp_prefetch: int = Field(default=1, ge=0)
    # The copy kernels FSDP runs around its collectives (docs/training.md, "FSDP's copies"):
    # "fsdp1", PyTorch's FullyShardedDataParallel (a layer's gradients concatenated into its flat
    # gradient, then pre-divided before the reduce-scatter); "fsdp2", PyTorch's fully_shard
    # (gathered parameters copied out of the all-gather buffer, gradients copied into the
    # reduce-scatter buffer; divided only in FP16); "zero3", DeepSpeed's ZeRO stage 3 (gathered
    # parameters rebuilt on its all-gather stream, gradients copied into its contiguous reduce
    # bucket beside the backward, the bucket interleaved and divided before its reduce-scatter);
    # "none": none.
    fsdp_impl: Literal["fsdp1", "fsdp2", "zero3", "none"] = "fsdp1"
    # zero3: the elements of gradients its reduce bucket holds before it is reduce-scattered
    # (DeepSpeed's reduce_bucket_size, 5e8 by default).
    zero3_bucket_elements: PositiveInt = 500_000_000
    sequence_parallel: bool = False
    tp_overlap: Literal["none", "chunked", "copy_engine"] = "none"
    # A column-parallel linear's backward reduces its data gradient (all-reduce, or with sequence
    # parallelism reduce-scatter) beside its weight-gradient GEMM, as Megatron-LM has since late
    # 2021 (``async_tensor_model_parallel_allreduce``, then ``LinearWithGradAccumulationAndAsync
    # Communication``). False: after both of its GEMMs, and the next op waits for it, as the
    # conjugate operator's backward all-reduce ran before that (Megatron-LM of Narayanan et al.,
    # SC'21: ``copy_to_tensor_model_parallel_region``).
    tp_dgrad_overlap: bool = True
    # Pieces per decomposed collective + GEMM; None: the TP degree.
    tp_chunks: PositiveInt | None = None
    pipeline: Literal["gpipe", "1f1b", "interleaved"] = "1f1b"
    # With tp > 1 and no sequence parallelism, each tensor-parallel rank sends its 1/tp of the
    # activation to the next stage, whose group all-gathers it: Megatron-LM's default (turned off
    # by ``--no-scatter-gather-tensors-in-pipeline``; Narayanan et al., SC'21, figure 18). False:
    # every rank sends the whole activation.
    pipeline_scatter_gather: bool = True
    # Model chunks per pipeline rank (interleaved 1F1B).
    virtual_stages: PositiveInt = 1
    # Under the overlapped schedule, pipeline transfers run on their own streams beside compute,
    # and a stage waits for a received tensor only where it uses it (Megatron-LM's
    # ``--overlap-p2p-communication`` for the interleaved schedule, since May 2023 (pull request
    # 331); NeMo's GPT-3 and Llama recipes set it). False: they block, as Megatron-LM's batched
    # send/recv with its device synchronization does otherwise (its non-interleaved schedule
    # always): a transfer starts once both ends reach its exchange, and neither rank goes on
    # until it and the work issued before it are done (ovsim.models.training_p2p). The
    # sequential schedule always blocks.
    overlap_p2p_comm: bool = True


class TrainingSpec(InputModel):
    """One training iteration: see docs/training.md."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # A preset name (``gpt3-1.3b`` ... ``llama3-405b``) or the dimensions themselves.
    model: str | ModelShape
    # Overrides of the model's dimensions.
    layers: PositiveInt | None = None
    hidden: PositiveInt | None = None
    heads: PositiveInt | None = None
    kv_heads: PositiveInt | None = None
    ffn_hidden: PositiveInt | None = None
    vocab: PositiveInt | None = None
    seq_len: PositiveInt | None = None
    micro_batch_size: PositiveInt = 1
    # Micro-batches per iteration and data-parallel replica: gradient accumulation steps, or the
    # pipeline's micro-batches.
    micro_batches: PositiveInt = 1
    precision: TrainPrecision = "bf16"
    # Activation recomputation. true or "full": every layer's forward runs again before its backward.
    # "selective": only the core attention's forward (QK^T, softmax, dropout, PV; with flash, its
    # kernel) runs again, just before its backward (Korthikanti et al., arXiv 2205.05198, Megatron-LM's
    # --recompute-granularity selective). false or "none": nothing is recomputed.
    recompute: bool | Literal["none", "full", "selective"] = False
    # flash: one fused attention kernel (FlashAttention), causal blocks skipped, no s x s scores in
    # memory. unfused: the core attention frameworks ran before it (Megatron-LM's until 2022):
    # batched GEMMs for QK^T and PV over the whole s x s, a fused scale-mask-softmax and a dropout
    # on the probabilities, each moving the s x s scores through HBM.
    # flash1, flash2: FlashAttention and FlashAttention-2 by name, each at the efficiency its authors
    # published for the GPU (a GPU without one refuses it); flash: a fused kernel at the GPU
    # calibration's attention_efficiency.
    attention: Literal["flash", AttentionImplementation, "unfused"] = "flash"
    # The cross-entropy loss over the logits. fused: one kernel reads the 16-bit logits and writes
    # their gradient (a fused cross entropy). megatron: Megatron-LM's vocab-parallel cross entropy
    # on FP32 logits, a pass each (ovsim.models.training_emit.LOSS_PASSES). pytorch: PyTorch's
    # F.cross_entropy, log-softmax to FP32 and NLL, a pass each (PYTORCH_LOSS_PASSES).
    loss: Literal["fused", "megatron", "pytorch"] = "fused"
    # The optimizer step over this rank's parameters (memory-bound). true or "fused_adam": one fused
    # Adam pass (apex/PyTorch fused AdamW). "megatron": Megatron-LM's mixed-precision optimizer
    # around it, with its passes over the gradients and weights. "composer": Composer's
    # DecoupledAdamW (llm-foundry), PyTorch ops a pass each, after gradient-norm clipping
    # (ovsim.models.training_emit.optimizer_passes). false or "none": no step.
    optimizer: bool | Literal["none", "fused_adam", "megatron", "composer"] = True
    # Embedding on the first stage, LM head and loss on the last; false studies a uniform pipeline.
    embedding_and_head: bool = True
    # false drops every collective and send/recv (the compute-only reference; stages still wait
    # for each other).
    communication: bool = True
    parallel: ParallelSpec = Field(default_factory=ParallelSpec)

    @property
    def recompute_mode(self) -> Literal["none", "full", "selective"]:
        """What ``recompute`` asks for, with the boolean spellings resolved."""
        if self.recompute is True or self.recompute == "full":
            return "full"
        return "selective" if self.recompute == "selective" else "none"

    @property
    def optimizer_mode(self) -> Literal["none", "fused_adam", "megatron", "composer"]:
        """What ``optimizer`` asks for, with the boolean spellings resolved."""
        if self.optimizer is True:
            return "fused_adam"
        return "none" if self.optimizer is False else self.optimizer

    @property
    def attention_kernel(self) -> AttentionImplementation | None:
        """The attention kernel ``attention`` names (flash1, flash2); None for ``flash`` (a fused
        kernel at the calibration's efficiency) and ``unfused``."""
        a = self.attention
        return None if a == "flash" or a == "unfused" else a

    @property
    def autocast(self) -> bool:
        """Whether the iteration runs under PyTorch's automatic mixed precision (``amp_*``)."""
        return self.precision in AUTOCAST

    @property
    def compute_precision(self) -> Literal["fp32", "tf32", "fp16", "bf16", "fp8"]:
        """The precision the linears' GEMMs run in: under autocast, the 16-bit type it names."""
        p = self.precision
        return AUTOCAST[p] if p == "amp_bf16" or p == "amp_fp16" else p

    @property
    def attention_precision(self) -> Literal["fp32", "tf32", "fp16", "bf16"]:
        """The precision the core attention runs in: FP8 recipes (Transformer Engine) keep it in 16
        bits, and autocast runs it in its 16-bit type."""
        p = self.compute_precision
        return "bf16" if p == "fp8" else p

    def shape(self) -> ModelShape:
        if isinstance(self.model, ModelShape):
            base = self.model
        else:
            key = ALIASES.get(self.model.lower(), self.model.lower())
            if key not in PRESETS:
                raise OvsimError(f"unknown model '{self.model}'; presets: {', '.join(PRESETS)}", field="model")
            base = PRESETS[key]
        over = {k: getattr(self, k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
                                               "seq_len") if getattr(self, k) is not None}
        if not over:
            return base
        try:
            return ModelShape.model_validate({**base.model_dump(), **over})
        except ValidationError as e:
            err = validation_error(e, "")
            raise OvsimError(err.message, field="model") from None


def rank_tokens(spec: TrainingSpec, m: ModelShape) -> int:
    """Tokens of a micro-batch on one rank: its sequences', split over the context-parallel ranks."""
    return spec.micro_batch_size * m.seq_len // spec.parallel.cp


def rank_heads(m: ModelShape, tp: int) -> tuple[int, int]:
    """Query and key/value heads of one tensor-parallel rank (tp divides both: :func:`layout`)."""
    return m.heads // tp, m.kv // tp


def heads_split_over(m: ModelShape, tp: int, cp: int) -> bool:
    """Whether a tensor-parallel rank's query and key/value heads divide over ``cp`` ranks, as
    Ulysses's exchange (``cp_comm: a2a``) splits them."""
    return all(h % cp == 0 for h in rank_heads(m, tp))


def wire_element_bytes(precision: str) -> int:
    """Bytes per element of gradients and gathered parameters on the wire: fp32 for fp32/tf32
    training and under autocast (FP32 parameters and gradients), 16-bit otherwise (FP8 training
    keeps 16-bit weights and gradients)."""
    return 4 if precision in ("fp32", "tf32") or precision in AUTOCAST else 2


def gradient_element_bytes(spec: TrainingSpec) -> int:
    """Bytes per element of the gradients DDP accumulates and reduces: FP32 where
    ``grad_reduce_fp32`` says so; else the wire's width, except under Megatron-LM's optimizer with
    BF16 or FP8 weights, which accumulates and reduces them in FP32 (its arguments.py sets
    ``accumulate_allreduce_grads_in_fp32`` for BF16; FP16 keeps them 16-bit)."""
    fp32 = spec.parallel.grad_reduce_fp32
    if fp32 is None:
        fp32 = spec.optimizer_mode == "megatron" and spec.precision in ("bf16", "fp8")
    return 4 if fp32 else wire_element_bytes(spec.precision)


def activation_element_bytes(precision: str) -> int:
    """Bytes per element of the linears' and the attention's outputs: 16-bit under autocast too
    (its FP32 residual stream is the emitter's, :mod:`ovsim.models.training_emit`)."""
    return 4 if precision in ("fp32", "tf32") else 2


def act_elements(m: ModelShape, tokens: int, fc1_out: int) -> int:
    """Elements the MLP's activation reads and writes: FC1's ``fc1_out``-wide output over
    ``tokens``, and its result (half as wide where the MLP is gated)."""
    f = tokens * fc1_out
    return f + f // (2 if m.gated_mlp else 1)


def layer_matrices(m: ModelShape, tp: int) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear of a layer on one TP rank, in forward order."""
    h, a = m.hidden, m.heads
    qkv_out = h + 2 * h * m.kv // a
    g = 2 if m.gated_mlp else 1
    return {"qkv": (h, qkv_out // tp), "proj": (h // tp, h), "fc1": (h, g * m.ffn // tp), "fc2": (m.ffn // tp, h)}


def layer_params(m: ModelShape, tp: int) -> int:
    """Parameters of one layer on one TP rank (matrices, biases and norms)."""
    mats = layer_matrices(m, tp)
    weights = sum(i * o for i, o in mats.values())
    small = 4 * m.hidden + sum(o for _, o in mats.values())
    return weights + small


def chunk_layers(layers: int, chunks: int) -> list[int]:
    """Layers of each model chunk in model order (a pipeline stage's, or an interleaved pipeline's
    virtual stage's: chunk ``c * pp + s`` runs on stage ``s``), for ``chunks`` at most ``layers``.

    As even as possible, the chunks differing by one layer at most, and the lighter ones at the two
    ends, taken alternately from the first and the last inward: the ends also hold the embedding
    and the LM head with its loss. That is how Llama 3 405B's 126 layers ran on 16 stages, one layer
    fewer on the first and the last (Grattafiori et al., "The Llama 3 Herd of Models", arXiv
    2407.21783, section 3.3.2). A model that splits evenly gets equal chunks."""
    base = -(-layers // chunks)
    counts = [base] * chunks
    for i in range(base * chunks - layers):
        counts[i // 2 if i % 2 == 0 else chunks - 1 - i // 2] -= 1
    return counts


def stage_layers(spec: TrainingSpec, m: ModelShape, pp: int, stage: int) -> int:
    """Layers pipeline stage ``stage`` holds over its virtual stages (:func:`chunk_layers`)."""
    v = spec.parallel.virtual_stages
    counts = chunk_layers(m.layers, pp * v)
    return sum(counts[c * pp + stage] for c in range(v))


def input_embedding_params(m: ModelShape, tp: int) -> int:
    """The first stage's embedding parameters on a rank: its share of the table and, where the
    model learns positions (those with tied embeddings here), the whole position table."""
    return m.vocab * m.hidden // tp + (m.seq_len * m.hidden if m.tied_embeddings else 0)


def holds_head(m: ModelShape, pp: int) -> bool:
    """Whether the last stage holds a head of its own: an untied one, or a copy of a tied head's
    table on a last stage other than the first (Megatron-LM keeps one there)."""
    return not m.tied_embeddings or pp > 1


def stage_embedding_params(spec: TrainingSpec, m: ModelShape, tp: int, pp: int, stage: int) -> int:
    """Embedding and head parameters a rank of ``stage`` holds: the input embedding (and learned
    positions) on the first stage, the head on the last (:func:`holds_head`)."""
    if not spec.embedding_and_head:
        return 0
    head = m.vocab * m.hidden // tp if stage == pp - 1 and holds_head(m, pp) else 0
    return (input_embedding_params(m, tp) if stage == 0 else 0) + head


def params_per_rank(spec: TrainingSpec, m: ModelShape, tp: int, pp: int, stage: int | None = None) -> int:
    """Parameters a rank of pipeline stage ``stage`` holds; None: the stage that holds fewest."""
    stages = range(pp) if stage is None else (stage,)
    return min(stage_layers(spec, m, pp, s) * layer_params(m, tp) + stage_embedding_params(spec, m, tp, pp, s)
               for s in stages)


def grad_bytes_per_rank(spec: TrainingSpec, m: ModelShape, tp: int, pp: int) -> float:
    return float(params_per_rank(spec, m, tp, pp) * gradient_element_bytes(spec))
