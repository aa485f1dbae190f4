"""PyTorch's automatic mixed precision (precision amp_bf16 / amp_fp16): byte counts written here
from what autocast runs (its op lists in PyTorch's CUDA AMP documentation: linears and attention in
16 bits; layer_norm, and so the residual stream, and the loss in FP32; FP32 parameters and
gradients), never from the generator."""

from __future__ import annotations

import pytest
from training_cases import SMALL

from ovsim.errors import OvsimError
from ovsim.models.memory import memory_estimate
from ovsim.models.training import training_ops
from ovsim.models.training_spec import PRESETS, TrainingSpec
from ovsim.models.workload import CollectiveOpSpec, GemmOp, MemoryOp

GPT = PRESETS["gpt3-1.3b"]
H = GPT.hidden
AMP = {**SMALL, "precision": "amp_bf16", "loss": "pytorch"}
T = SMALL["micro_batch_size"] * SMALL["seq_len"]
E = T * H  # elements of the residual stream
WEIGHTS = 12 * H * H  # a layer's four matrices (QKV 3h^2, projection h^2, FC1 and FC2 4h^2 each)
BIASES = 9 * H  # theirs (3h, h, 4h, h)
VH = GPT.vocab * H  # the embedding table, tied to the head


def _mem(spec: dict, ranks: int = 1) -> dict[str, float]:
    ops = training_ops(TrainingSpec.model_validate(spec), ranks).ops
    return {o.name: float(o.bytes) for o in ops if isinstance(o, MemoryOp) and (o.ranks == "all" or 0 in o.ranks)}


def _layer_bytes(mem: dict[str, float], prefix: str, skip_act: bool = True) -> float:
    """A layer's memory-bound bytes under ``prefix`` (``F0.L3.``), its activation (priced as in
    16-bit training, checked apart) left out."""
    return sum(b for n, b in mem.items() if n.startswith(prefix) and not (skip_act and ".act" in n))


def test_a_layer_forward_under_autocast_moves_its_fp32_stream_and_casts() -> None:
    """Weights and biases cast once (4 + 2 B each), two FP32 norms (4 + 4), two casts of their
    outputs to BF16 (4 + 2), two residual adds of a BF16 output to the FP32 stream (4 + 2 + 4): 48 B
    an element of the stream, where BF16 training's norms and residual move 18."""
    mem = _mem(AMP)
    assert _layer_bytes(mem, "F0.L3.") == pytest.approx(6 * (WEIGHTS + BIASES) + 48 * E, rel=1e-9)
    bf16 = _mem(SMALL)
    assert _layer_bytes(bf16, "F0.L3.") == pytest.approx(18 * E, rel=1e-9)
    # The activation (GELU over the 4h-wide FC1 output, in and out at 16 bits) is the same.
    assert mem["F0.L3.act"] == bf16["F0.L3.act"] == pytest.approx(2 * 2 * 4 * E)


def test_a_layer_backward_casts_gradients_both_ways_and_accumulates_after_the_first() -> None:
    """Four stream gradients cast (FP32 to BF16 before FC2 and the projection, BF16 to FP32 after
    FC1 and QKV: 6 B each), two FP32 norm backwards and two FP32 sums of the branches' gradients
    (12 B each): 72 B an element. Each weight's BF16 gradient cast to FP32 (6 B), and from the
    second micro-batch added to the accumulated FP32 gradient (4 + 4 + 4)."""
    mem = _mem({**AMP, "micro_batches": 2})
    first, second = _layer_bytes(mem, "B0.L3."), _layer_bytes(mem, "B1.L3.")
    assert first == pytest.approx(72 * E + 6 * WEIGHTS, rel=1e-9)
    assert second == pytest.approx(72 * E + 18 * WEIGHTS, rel=1e-9)


def test_the_gemms_run_in_bf16_with_the_flops_of_bf16_training() -> None:
    def gemms(spec: dict) -> list[tuple[str, int, int, int, str]]:
        ops = training_ops(TrainingSpec.model_validate(spec), 1).ops
        return [(o.name, o.m, o.n, o.k, o.precision) for o in ops if isinstance(o, GemmOp)]

    assert gemms(AMP) == gemms(SMALL)
    assert {g[-1] for g in gemms({**AMP, "precision": "amp_fp16"})} == {"fp16"}


def test_pytorch_cross_entropy_moves_26_bytes_a_logit_in_five_passes() -> None:
    """The kernels' types in the profile (cunn_SoftMaxForward<BFloat16, float, BFloat16>, NLL on
    float): forward, log-softmax in BF16 (2 + 2 B) and its cast to FP32 (2 + 4); backward, the FP32
    gradient zeroed (4), cast to BF16 (4 + 2), log-softmax's backward in BF16 (2 + 2 + 2)."""
    mem = _mem(AMP)
    logits = T * GPT.vocab
    loss = {n: b / logits for n, b in mem.items() if ".loss." in n}
    assert loss == pytest.approx({"F0.loss.log_softmax": 4, "F0.loss.cast": 6, "B0.loss.fill": 4,
                                  "B0.loss.cast": 6, "B0.loss.log_softmax_bwd": 6})


def test_the_embedding_writes_fp32_and_the_tied_table_sums_two_fp32_gradients() -> None:
    """Forward: the FP32 rows read and the FP32 stream written (4 + 4 B an element). Backward: the
    dense FP32 table gradient zeroed (4 B a table element), the stream's gradient scattered (4 + 4
    an element), the head's and the embedding's FP32 gradients summed (4 + 4 + 4 a table element),
    and from the second micro-batch added to the accumulated one (12)."""
    mem = _mem({**AMP, "micro_batches": 2})
    assert mem["F0.embed"] == pytest.approx(8 * E)
    assert mem["B0.embed.bwd"] == pytest.approx(8 * E)
    assert mem["B0.embed.grad.fill"] == pytest.approx(4 * VH)
    assert mem["B0.embed.grad.sum"] == mem["B1.embed.grad.sum"] == pytest.approx(12 * VH)
    assert "B0.embed.grad.accumulate" not in mem and mem["B1.embed.grad.accumulate"] == pytest.approx(12 * VH)


def test_the_head_casts_its_input_weight_and_gradients() -> None:
    """The FP32 stream and the FP32 table cast to BF16 for the head's GEMM (4 + 2 B each), the
    input's gradient cast back and the weight's cast to FP32 (4 + 2); a tied head accumulates
    nowhere but at the embedding (above)."""
    mem = _mem({**AMP, "micro_batches": 2})
    assert mem["F0.head.cast"] == mem["B0.head.gcast"] == pytest.approx(6 * E)
    assert mem["F0.head.weight.cast"] == mem["B1.head.wgrad.cast"] == pytest.approx(6 * VH)
    assert not any(n.startswith("B1.head") and "accumulate" in n for n in mem)


def test_ddp_reduces_fp32_gradients_and_fused_adam_writes_no_16_bit_copy() -> None:
    """Every gradient crosses the wire once at 4 bytes (DDP's buckets over the last micro-batch);
    fused AdamW on FP32 parameters reads and writes the weight and both moments and reads the
    gradient: 28 B a parameter, no 16-bit working copy."""
    spec = {**AMP, "parallel": {"dp": 2}}
    ops = training_ops(TrainingSpec.model_validate(spec), 2).ops
    params = 8 * (12 * H * H + 13 * H) + (GPT.vocab + SMALL["seq_len"]) * H
    buckets = sum(o.size_bytes for o in ops if isinstance(o, CollectiveOpSpec) and ".bucket" in o.name)
    assert buckets == pytest.approx(4 * params, rel=1e-9)
    step = [o for o in ops if isinstance(o, MemoryOp) and o.name.endswith(".optimizer")]
    assert float(step[0].bytes) == pytest.approx(28 * params, rel=1e-9)


def test_memory_holds_16_bytes_a_parameter_the_cast_weights_and_the_fp32_stream() -> None:
    """ZeRO's 16 bytes a parameter as 4 + 4 + 8 (FP32 weight, gradient, moments), and autocast's
    cache of the BF16 copies of every layer's weights and biases and of the head (2 B each), held
    until the forward and loss end. Each layer keeps its two norms' FP32 inputs (2 sbh more than
    16-bit ones each); under full recomputation its FP32 input (2 sbh more), and the one layer
    recomputed all of it."""
    def est(**kw: object):  # type: ignore[no-untyped-def]
        return memory_estimate(TrainingSpec.model_validate({**AMP, **kw}), 1)

    def bf16(**kw: object):  # type: ignore[no-untyped-def]
        return memory_estimate(TrainingSpec.model_validate({**SMALL, **kw}), 1)

    params = 8 * (12 * H * H + 13 * H) + (GPT.vocab + SMALL["seq_len"]) * H
    cache = 2 * (8 * (WEIGHTS + BIASES) + VH)
    amp = est()
    assert amp.weights_bytes == pytest.approx(4 * params + cache)
    assert amp.gradients_bytes + amp.optimizer_bytes == pytest.approx(12 * params)
    assert amp.activations_bytes - bf16().activations_bytes == pytest.approx(8 * 4 * E)
    full = est(recompute="full")
    assert full.weights_bytes == pytest.approx(4 * params + cache)
    assert full.activations_bytes - bf16(recompute="full").activations_bytes == pytest.approx(8 * 2 * E + 4 * E)


def test_fp16_autocast_checks_the_gradients_for_infinities() -> None:
    """GradScaler's _amp_foreach_non_finite_check_and_unscale_ reads and writes every FP32
    gradient (8 B a parameter) before fused AdamW, which takes the scale itself; BF16 runs no
    scaler."""
    def step(precision: str) -> dict[str, float]:
        ops = training_ops(TrainingSpec.model_validate({**AMP, "precision": precision}), 1).ops
        return {o.name: float(o.bytes) for o in ops if isinstance(o, MemoryOp) and o.name.startswith("s0.")}

    params = 8 * (12 * H * H + 13 * H) + (GPT.vocab + SMALL["seq_len"]) * H
    assert step("amp_fp16") == pytest.approx({"s0.unscale": 8 * params, "s0.optimizer": 28 * params})
    assert step("amp_bf16") == pytest.approx({"s0.optimizer": 28 * params})


@pytest.mark.parametrize(("over", "field"), [
    ({"parallel": {"tp": 2}}, "parallel.tp"),
    ({"parallel": {"pp": 2}, "micro_batches": 2}, "parallel.pp"),
    ({"parallel": {"dp_mode": "fsdp"}}, "parallel.dp_mode"),
    ({"optimizer": "megatron"}, "optimizer"),
    ({"attention": "unfused"}, "attention"),
    ({"parallel": {"distributed_optimizer": True}}, "parallel.distributed_optimizer"),
])
def test_autocast_is_refused_where_frameworks_hold_16_bit_parameters(over: dict, field: str) -> None:
    with pytest.raises(OvsimError, match="autocast") as e:
        training_ops(TrainingSpec.model_validate({**AMP, **over}), 2)
    assert e.value.field == field


def test_pytorch_loss_needs_autocast() -> None:
    with pytest.raises(OvsimError, match="autocast") as e:
        training_ops(TrainingSpec.model_validate({**SMALL, "loss": "pytorch"}), 1)
    assert e.value.field == "loss"
