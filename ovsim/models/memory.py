"""How much GPU memory one rank of a training iteration holds at its peak: an estimate in closed
form, so that a what-if study can tell a configuration that would run out of memory.

Model states (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC'20, section 3.1): with Adam in mixed precision (FP16, BF16, FP8 training with 16-bit
weights) a parameter costs 2 bytes of weight, 2 of gradient and 12 of optimizer state (FP32 master
weight, momentum, variance); in FP32/TF32 training 4 + 4 + 8. 16 bytes either way. The
distributed optimizer (ZeRO-1) shards the optimizer state over the data-parallel ranks (Megatron-LM's
optimizer adds its FP32 main gradients to it); FSDP / ZeRO-3
shards all three over the data-parallel ranks and holds, besides, the unsharded 16-bit weights of
the layers being gathered (the layer computing and ``fsdp_prefetch`` ahead) and one unsharded
layer's gradients before their reduce-scatter; DeepSpeed's ZeRO-3 (``fsdp_impl: zero3``) also its
reduce bucket, ``zero3_bucket_elements`` of gradients at the wire's width, allocated whole.

Activations (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
MLSys 2023, section 4): per layer and micro-batch, with s tokens, b sequences, hidden h, t-way
tensor parallelism, ``sbh (10 + 24/t + 5as/(ht))`` bytes for GPT's layer, 16-bit activations;
with sequence parallelism everything divides by t, ``sbh/t (34 + 5as/h)``; with full
recomputation only the layer's input, ``2sbh`` (over t with sequence parallelism); with selective
recomputation everything but the ``5as/h`` term (the paper's section 4.3; its equation 6 with
sequence parallelism). Generalised
here, term by term as the paper derives them, to grouped-query attention (K and V of ``kv/a`` the
size) and to any MLP width and gated MLPs (both FC1 halves stored). Fused (flash) attention stores
no s x s scores, so the ``5as/h`` term (scores, probabilities, dropout mask) counts only for
unfused attention (``TrainingSpec.attention``). The
loss keeps FP32 logits, ``4sbv/t`` (the paper's output-layer term). With pipeline parallelism a
stage holds the activations of every micro-batch whose forward has run and whose backward has
not: counted from the schedule ovsim runs (:func:`ovsim.models.pipeline.stage_order`), not from a
formula. With context parallelism a rank holds its 1/cp of each sequence's tokens (s counts those);
the keys and values it gathers for one layer's attention live only while that layer computes.

Under PyTorch's autocast (``precision: amp_bf16 | amp_fp16``) the weights, gradients and moments are
FP32 (4 + 4 + 8 bytes), the weights' 16-bit copies autocast caches are held with the weights, and
each layer's two norm inputs, on the FP32 residual stream, take 2 bytes an element more.

Not counted: the CUDA context and library workspaces (about 0.5-2 GB), allocator fragmentation,
communication buffers, DDP's gradient buckets (views of the gradients), input data. The estimate
is therefore a lower bound on what a framework would reserve.
"""

from __future__ import annotations

from dataclasses import dataclass

from ovsim.models.pipeline import stage_order
from ovsim.models.training_amp import cast_weights
from ovsim.models.training_layout import layout
from ovsim.models.training_spec import (
    ModelShape,
    TrainingSpec,
    activation_element_bytes,
    chunk_layers,
    gradient_element_bytes,
    layer_params,
    rank_tokens,
    stage_embedding_params,
    stage_layers,
)

# The share of a GPU's memory a configuration may take by this estimate and still be expected to
# run: the rest is for what it leaves out (CUDA context, workspaces, fragmentation; 1-2 GB and more).
USABLE_FRACTION = 0.9


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one rank of the most loaded pipeline stage holds at its peak."""

    stage: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    # FSDP: the unsharded weights of the layers being gathered and one layer's unsharded gradients.
    gathered_bytes: float
    activations_bytes: float
    # The loss's FP32 logits (last stage).
    logits_bytes: float
    # Micro-batch forward passes (of one model chunk each) whose activations the stage holds at once.
    in_flight: int

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.gathered_bytes
                + self.activations_bytes + self.logits_bytes)


def layer_activation_bytes(m: ModelShape, tokens: int, tp: int, sequence_parallel: bool, recompute: str,
                           act_bytes: int = 2, unfused_attention: bool = False) -> float:
    """Activation bytes one layer keeps for its backward, per micro-batch of ``tokens`` (s x b)
    tokens on one tensor-parallel rank (Korthikanti et al. 2023, generalised; module docstring).
    ``recompute`` is ``none``, ``full`` or ``selective`` (which keeps no s x s attention matrices).
    ``act_bytes`` scales the 16-bit figures (4: FP32 training)."""
    sbh = float(tokens) * m.hidden
    scale = act_bytes / 2
    split = tp if sequence_parallel else 1
    if recompute == "full":
        return 2 * sbh * scale / split
    unfused_attention = unfused_attention and recompute != "selective"
    r = m.kv / m.heads
    g = 2 if m.gated_mlp else 1
    f = m.ffn / m.hidden
    # Outside the tensor-parallel regions: both norms' inputs (4), the QKV and FC1 inputs (2 + 2),
    # two dropout masks of a byte (2).
    replicated = 10.0
    # Inside: Q (2), K and V (2r each), the projection's input (2), the activation's input(s)
    # (2gf) and FC2's input (2f), in units of sbh.
    parallel = 2 + 4 * r + 2 + (2 * g + 2) * f
    if unfused_attention:
        # Scores and probabilities (2 bytes each) and the dropout mask (1) of every head's s x s.
        parallel += 5 * m.heads * m.seq_len / m.hidden
    if sequence_parallel:
        return sbh * scale * (replicated + parallel) / tp
    return sbh * scale * (replicated + parallel / tp)


def _in_flight(pipeline: str, p: int, s: int, m: int, v: int, chunks: list[int]) -> tuple[int, int]:
    """(the most micro-batch chunks stage ``s`` holds at once, the most layers' activations it holds
    at once), replaying its schedule with each chunk's own layers (``chunks``, in model order)."""
    held = peak = layers = peak_layers = 0
    for phase, _, c in stage_order(pipeline, p, s, m, v):
        sign = 1 if phase == "F" else -1
        held += sign
        layers += sign * chunks[c * p + s]
        peak = max(peak, held)
        peak_layers = max(peak_layers, layers)
    return peak, peak_layers


def autocast_extra_bytes(m: ModelShape, tokens: int, mode: str) -> float:
    """What a layer under autocast keeps for its backward beyond Korthikanti et al.'s 16-bit count
    (tensor parallelism is refused with autocast): its two norms' inputs, the FP32 residual stream,
    at 4 bytes rather than 2 (``2sbh`` each more); under full recomputation its FP32 input
    (``2sbh`` more)."""
    sbh = float(tokens * m.hidden)
    return 2 * sbh if mode == "full" else 4 * sbh


def autocast_cache_bytes(spec: TrainingSpec, m: ModelShape) -> float:
    """Autocast's 16-bit copies of the weights it casts (2 bytes each: the layers' linears and the
    head), cached until the forward and loss leave its region, so held at the logits' peak
    whatever is recomputed; 0 without autocast."""
    if not spec.autocast:
        return 0.0
    return 2.0 * (m.layers * cast_weights(m) + (m.vocab * m.hidden if spec.embedding_and_head else 0))


def memory_estimate(spec: TrainingSpec, n_ranks: int) -> MemoryEstimate:
    """The peak memory of one rank of ``spec`` on ``n_ranks`` ranks: the pipeline stage that holds
    the most (see the module docstring for what is and is not counted)."""
    lay = layout(spec, n_ranks)
    m = spec.shape()
    par = spec.parallel
    p, v, tp = lay.pp, lay.v, lay.tp
    weight_b = 4 if spec.precision in ("fp32", "tf32") or spec.autocast else 2
    grad_b = gradient_element_bytes(spec)
    opt_b = (8 if weight_b == 4 else 12) if spec.optimizer_mode != "none" else 0
    if spec.optimizer_mode == "megatron" and grad_b == 2:
        # Megatron-LM's mixed-precision optimizer keeps FP32 main gradients beside FP16 ones (20
        # bytes a parameter, sharded with the state by its distributed optimizer; BF16 accumulates
        # the gradients in FP32, 18: Megatron-LM docs/source/api-guide/dist_optimizer.md).
        opt_b += 4
    fsdp = par.dp_mode == "fsdp" and lay.dp > 1
    shard = lay.dp if fsdp else 1
    # The distributed optimizer (ZeRO-1) shards the optimizer state alone.
    optimizer_shard = lay.dp if fsdp or par.distributed_optimizer else 1
    layer_p = layer_params(m, tp)
    # DeepSpeed's ZeRO-3 allocates its whole reduce bucket up front (its ipg buffer).
    bucket_bytes = par.zero3_bucket_elements * grad_b if par.fsdp_impl == "zero3" else 0.0
    chunks = chunk_layers(m.layers, p * v)
    tokens = rank_tokens(spec, m)
    act_b = activation_element_bytes(spec.precision)
    unfused = spec.attention == "unfused"
    mode = spec.recompute_mode
    per_layer = layer_activation_bytes(m, tokens, tp, par.sequence_parallel, mode, act_b, unfused)
    if spec.autocast:
        per_layer += autocast_extra_bytes(m, tokens, mode)
    # A layer in backward holds what was recomputed for it again for a moment: its whole activations
    # (full), or its attention's s x s matrices (selective, unfused attention).
    recomputed = 0.0
    if mode != "none":
        everything = layer_activation_bytes(m, tokens, tp, par.sequence_parallel, "none", act_b, unfused)
        if spec.autocast:
            everything += autocast_extra_bytes(m, tokens, "none")
        recomputed = everything - (per_layer if mode == "selective" else 0.0)
    best: MemoryEstimate | None = None
    for s in range(p):
        params = stage_layers(spec, m, p, s) * layer_p + stage_embedding_params(spec, m, tp, p, s)
        in_flight, layers_held = _in_flight(par.pipeline, p, s, spec.micro_batches, v, chunks)
        est = MemoryEstimate(
            stage=s,
            weights_bytes=params * weight_b / shard + autocast_cache_bytes(spec, m),
            gradients_bytes=params * grad_b / shard,
            optimizer_bytes=params * opt_b / optimizer_shard,
            gathered_bytes=((1 + par.fsdp_prefetch) * weight_b + grad_b) * layer_p + bucket_bytes if fsdp else 0.0,
            activations_bytes=layers_held * per_layer + recomputed,
            logits_bytes=4.0 * tokens * m.vocab / tp if spec.embedding_and_head and s == p - 1 else 0.0,
            in_flight=in_flight)
        if best is None or est.total_bytes > best.total_bytes:
            best = est
    assert best is not None  # p >= 1
    return best
