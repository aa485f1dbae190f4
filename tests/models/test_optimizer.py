"""The optimizer step's passes (ovsim.models.training_emit.optimizer_passes) against byte counts
read from the frameworks' code: apex/PyTorch fused Adam, and Megatron-LM's mixed-precision
optimizer (megatron/core/optimizer/optimizer.py, clip_grads.py), never from the generator."""

from __future__ import annotations

import pytest
from training_cases import SMALL

from ovsim.errors import OvsimError
from ovsim.models.memory import memory_estimate
from ovsim.models.training import training_ops
from ovsim.models.training_spec import PRESETS, TrainingSpec
from ovsim.models.workload import CollectiveOpSpec, MemoryOp

GPT = PRESETS["gpt3-1.3b"]
LAYERS = SMALL["layers"]
# GPT-3 XL's parameters in SMALL's 8 layers: 12h^2 + 13h a layer (QKV, projection, two MLP
# matrices, their biases and two norms), and the tied embedding with learned positions.
PARAMS = LAYERS * (12 * GPT.hidden**2 + 13 * GPT.hidden) + (GPT.vocab + SMALL["seq_len"]) * GPT.hidden


def _step(ranks: int = 1, **kw: object) -> dict[str, float]:
    """Rank 0's optimizer passes of SMALL: bytes by pass name, in the order they run."""
    spec = TrainingSpec.model_validate({**SMALL, **kw})
    names = ("grad_copy", "unscale", "grad_norm", "optimizer", "param_copy", "zero_grad")
    return {o.name.split(".", 1)[1]: float(o.bytes) for o in training_ops(spec, ranks).ops
            if isinstance(o, MemoryOp) and o.name.split(".", 1)[1] in names}


def test_fused_adam_is_one_pass_of_28_bytes_a_parameter() -> None:
    """Master weight and both moments read and written (24 B), the BF16 gradient read and the BF16
    working copy written (2 + 2)."""
    assert _step() == pytest.approx({"optimizer": 28 * PARAMS}, rel=0.01)
    assert _step(optimizer="fused_adam") == _step(optimizer=True)
    assert _step(optimizer="none") == {} == _step(optimizer=False)


def test_megatron_in_fp16_copies_unscales_measures_steps_copies_back_and_zeroes() -> None:
    """FP16: the FP16 gradient copied to FP32 (2 + 4 B), unscaled in place (4 + 4), its norm read
    (4), Adam on FP32 gradients (24 + 4), the FP32 weights copied to FP16 (4 + 2), the FP16 gradient
    buffer zeroed (2): 26 bytes a parameter more than fused Adam's 28, in six passes."""
    step = _step(optimizer="megatron", precision="fp16")
    per_param = {"grad_copy": 6, "unscale": 8, "grad_norm": 4, "optimizer": 28, "param_copy": 6, "zero_grad": 2}
    assert list(step) == list(per_param)
    assert step == pytest.approx({k: v * PARAMS for k, v in per_param.items()}, rel=0.01)
    assert sum(step.values()) / PARAMS == pytest.approx(54, rel=0.01)


def test_megatron_in_bf16_skips_the_unscale_and_in_fp32_every_copy() -> None:
    """BF16 runs without a loss scaler; FP32 training has no 16-bit copies to make."""
    assert list(_step(optimizer="megatron", precision="bf16")) == [
        "grad_copy", "grad_norm", "optimizer", "param_copy", "zero_grad"]
    fp32 = _step(optimizer="megatron", precision="fp32")
    assert fp32 == pytest.approx({"grad_norm": 4 * PARAMS, "optimizer": 28 * PARAMS, "zero_grad": 4 * PARAMS},
                                 rel=0.01)


def test_the_distributed_optimizer_steps_its_shard_and_zeroes_the_whole_buffer() -> None:
    """With Megatron-LM's distributed optimizer every pass but the buffer's zeroing runs on the
    rank's 1/dp shard, and the parameter all-gathers wait for the FP16 copy they gather."""
    dp = 4
    kw = {"optimizer": "megatron", "precision": "fp16", "micro_batches": 2}
    whole = _step(dp, **kw)
    shard = _step(dp, **kw, parallel={"distributed_optimizer": True})
    assert shard["zero_grad"] == whole["zero_grad"]
    for name in ("grad_copy", "unscale", "grad_norm", "optimizer", "param_copy"):
        assert shard[name] == pytest.approx(whole[name] / dp)
    spec = TrainingSpec.model_validate({**SMALL, **kw, "parallel": {"distributed_optimizer": True}})
    gathers = [o for o in training_ops(spec, dp).ops if isinstance(o, CollectiveOpSpec) and o.kind == "all_gather"]
    assert gathers and all(g.after == ["s0.param_copy"] for g in gathers)


def test_megatron_s_optimizer_is_refused_with_fsdp() -> None:
    spec = TrainingSpec.model_validate({**SMALL, "optimizer": "megatron", "parallel": {"dp_mode": "fsdp"}})
    with pytest.raises(OvsimError, match="Megatron-LM's optimizer") as e:
        training_ops(spec, 4)
    assert e.value.field == "optimizer"


def test_megatron_s_fp32_main_gradients_are_in_the_memory_estimate() -> None:
    """Megatron-LM's distributed-optimizer documentation: 20 bytes a parameter with FP16 weights and
    gradients, 4 + 16/d with its distributed optimizer."""
    d = 4
    for parallel, per_param in (({}, 20.0), ({"distributed_optimizer": True}, 4 + 16 / d)):
        spec = TrainingSpec.model_validate({"model": "gpt3-1.3b", "precision": "fp16", "optimizer": "megatron",
                                            "parallel": parallel})
        est = memory_estimate(spec, d)
        psi = est.weights_bytes / 2
        assert (est.weights_bytes + est.gradients_bytes + est.optimizer_bytes) / psi == pytest.approx(per_param)
