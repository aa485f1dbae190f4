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


def _mem(spec: dict, ranks: int = 1) -> dict[str, float]:
    ops = training_ops(TrainingSpec.model_validate(spec), ranks).ops
    return {o.name: float(o.bytes) for o in ops if isinstance(o, MemoryOp) and (o.ranks == "all" or 0 in o.ranks)}


def _layer_bytes(mem: dict[str, float], prefix: str, skip_act: bool = True) -> float:
    """A layer's memory-bound bytes under ``prefix`` (``F0.L3.``), its activation (priced as in
    16-bit training, checked apart) left out."""
    return sum(b for n, b in mem.items() if n.startswith(prefix) and not (skip_act and ".act" in n))


def test_a_layer_forward_under_autocast_moves_its_fp32_stream_and_casts() -> None:
    """Weights cast once (4 + 2 B each), two FP32 norms (4 + 4), two casts of their outputs to BF16
    (4 + 2), two residual adds of a BF16 output to the FP32 stream (4 + 2 + 4): 48 B an element of
    the stream, where BF16 training's norms and residual move 18."""
    mem = _mem(AMP)
    assert _layer_bytes(mem, "F0.L3.") == pytest.approx(6 * WEIGHTS + 48 * E, rel=1e-9)
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


def test_pytorch_cross_entropy_moves_32_bytes_a_logit_in_five_passes() -> None:
    """Forward: log-softmax from BF16 logits to FP32 (2 + 4 B), a copy of the log-probabilities
    (4 + 4). Backward: the FP32 gradient zeroed (4), cast to BF16 (4 + 2), log-softmax's backward
    (BF16 gradient and FP32 log-probabilities in, BF16 gradient out: 2 + 4 + 2)."""
    mem = _mem(AMP)
    logits = T * GPT.vocab
    loss = {n.split(".", 2)[2]: b / logits for n, b in mem.items() if ".loss." in n}
    assert loss == pytest.approx({"log_softmax": 6, "copy": 8, "fill": 4, "cast": 6, "log_softmax_bwd": 8})


def test_ddp_reduces_fp32_gradients_and_fused_adam_writes_no_16_bit_copy() -> None:
    """Every gradient crosses the wire once at 4 bytes (DDP's buckets over the last micro-batch);
    fused AdamW on FP32 parameters reads and writes the weight and both moments and reads the
    gradient: 28 B a parameter, no 16-bit working copy."""
    spec = {**AMP, "parallel": {"dp": 2}}
    ops = training_ops(TrainingSpec.model_validate(spec), 2).ops
    params = 8 * (12 * H * H + 13 * H) + (GPT.vocab + SMALL["seq_len"]) * H
    buckets = sum(o.size_bytes for o in ops if isinstance(o, CollectiveOpSpec) and ".bucket" in o.name)
    # As in BF16 training, the learned positions' gradient is not bucketed (test_training.py).
    assert buckets == pytest.approx(4 * (params - SMALL["seq_len"] * H), rel=1e-9)
    step = [o for o in ops if isinstance(o, MemoryOp) and o.name.endswith(".optimizer")]
    assert float(step[0].bytes) == pytest.approx(28 * params, rel=1e-9)


def test_memory_holds_16_bytes_a_parameter_and_the_fp32_stream() -> None:
    """ZeRO's 16 bytes a parameter as 4 + 4 + 8 (FP32 weight, gradient, moments); each layer keeps
    its two norms' FP32 inputs (2 sbh more than 16-bit ones each) and its weights' BF16 copies."""
    amp = memory_estimate(TrainingSpec.model_validate(AMP), 1)
    bf16 = memory_estimate(TrainingSpec.model_validate(SMALL), 1)
    params = 8 * (12 * H * H + 13 * H) + (GPT.vocab + SMALL["seq_len"]) * H
    assert amp.weights_bytes + amp.gradients_bytes + amp.optimizer_bytes == pytest.approx(16 * params)
    assert amp.weights_bytes == pytest.approx(4 * params)
    extra = 8 * (4 * E + 2 * (12 * H * H + 9 * H))
    assert amp.activations_bytes - bf16.activations_bytes == pytest.approx(extra)


@pytest.mark.parametrize(("over", "field"), [
    ({"parallel": {"tp": 2}}, "parallel.tp"),
    ({"parallel": {"pp": 2}, "micro_batches": 2}, "parallel.pp"),
    ({"parallel": {"dp_mode": "fsdp"}}, "parallel.dp_mode"),
    ({"optimizer": "megatron"}, "optimizer"),
    ({"attention": "unfused"}, "attention"),
])
def test_autocast_is_refused_where_frameworks_hold_16_bit_parameters(over: dict, field: str) -> None:
    with pytest.raises(OvsimError, match="autocast") as e:
        training_ops(TrainingSpec.model_validate({**AMP, **over}), 2)
    assert e.value.field == field


def test_pytorch_loss_needs_autocast() -> None:
    with pytest.raises(OvsimError, match="autocast") as e:
        training_ops(TrainingSpec.model_validate({**SMALL, "loss": "pytorch"}), 1)
    assert e.value.field == "loss"
