"""The passes frameworks run around the model's kernels, against byte counts read from their code,
never from the generator: the optimizer step (ovsim.models.training_emit.optimizer_passes; apex or
PyTorch fused Adam, and Megatron-LM's mixed-precision optimizer, megatron/core/optimizer/optimizer.py
and clip_grads.py) and the cross-entropy loss (Megatron-LM's vocab_parallel_cross_entropy,
megatron/core/tensor_parallel/cross_entropy.py)."""

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
    names = ("grad_copy", "unscale", "grad_norm", "grad_clip", "optimizer", "param_copy", "zero_grad")
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


def test_megatron_in_bf16_accumulates_fp32_gradients_and_in_fp32_copies_nothing() -> None:
    """BF16: Megatron-LM accumulates the gradients in FP32 (accumulate_allreduce_grads_in_fp32), so
    .float() copies nothing and no loss scaler unscales them; the FP32 buffer is zeroed (4 B). FP32
    training has no 16-bit copies to make."""
    bf16 = _step(optimizer="megatron", precision="bf16")
    assert bf16 == pytest.approx({"grad_norm": 4 * PARAMS, "optimizer": 28 * PARAMS, "param_copy": 6 * PARAMS,
                                  "zero_grad": 4 * PARAMS}, rel=0.01)
    assert list(bf16) == ["grad_norm", "optimizer", "param_copy", "zero_grad"]
    fp32 = _step(optimizer="megatron", precision="fp32")
    assert fp32 == pytest.approx({"grad_norm": 4 * PARAMS, "optimizer": 28 * PARAMS, "zero_grad": 4 * PARAMS},
                                 rel=0.01)


def test_megatron_in_bf16_reduces_fp32_gradients() -> None:
    """DDP's all-reduces carry the FP32 gradients: 4 B a parameter, twice fused Adam's BF16 ones."""
    def reduced(**kw: object) -> float:
        spec = TrainingSpec.model_validate({**SMALL, "precision": "bf16", **kw})
        return sum(o.size_bytes for o in training_ops(spec, 2).ops
                   if isinstance(o, CollectiveOpSpec) and o.name.startswith("s0.bucket"))
    assert reduced() == pytest.approx(2 * PARAMS, rel=0.01)
    assert reduced(optimizer="megatron") == pytest.approx(4 * PARAMS, rel=0.01)


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
    ops = training_ops(spec, dp).ops
    gathers = [o for o in ops if isinstance(o, CollectiveOpSpec) and o.kind == "all_gather"]
    assert gathers and all(g.after == ["s0.param_copy"] for g in gathers)
    # The next iteration zeroes its gradients once the updated parameters are back.
    zero = next(o for o in ops if o.name == "s0.zero_grad")
    assert set(zero.after_any) >= {g.name for g in gathers}


def test_megatron_s_optimizer_is_refused_with_fsdp() -> None:
    spec = TrainingSpec.model_validate({**SMALL, "optimizer": "megatron", "parallel": {"dp_mode": "fsdp"}})
    with pytest.raises(OvsimError, match="Megatron-LM's optimizer") as e:
        training_ops(spec, 4)
    assert e.value.field == "optimizer"


def test_megatron_s_gradients_are_in_the_memory_estimate() -> None:
    """Megatron-LM's distributed-optimizer documentation, bytes a parameter: 20 with FP16 weights
    and gradients (FP32 main gradients beside them), 4 + 16/d with its distributed optimizer; 18 with
    BF16 weights and FP32 gradients, 6 + 12/d."""
    d = 4
    psi = 12 * GPT.layers * GPT.hidden**2 + 13 * GPT.layers * GPT.hidden + (GPT.vocab + GPT.seq_len) * GPT.hidden
    for precision, parallel, per_param in (("fp16", {}, 20.0), ("fp16", {"distributed_optimizer": True}, 4 + 16 / d),
                                           ("bf16", {}, 18.0), ("bf16", {"distributed_optimizer": True}, 6 + 12 / d)):
        spec = TrainingSpec.model_validate({"model": "gpt3-1.3b", "precision": precision, "optimizer": "megatron",
                                            "parallel": parallel})
        est = memory_estimate(spec, d)
        total = est.weights_bytes + est.gradients_bytes + est.optimizer_bytes
        assert total / psi == pytest.approx(per_param, rel=0.005), (precision, parallel)


def _loss(tp: int = 1, **kw: object) -> dict[str, float]:
    """Rank 0's loss kernels of SMALL on ``tp`` ranks: bytes by name (micro-batch 0)."""
    spec = TrainingSpec.model_validate({**SMALL, "parallel": {"tp": tp}, **kw})
    return {o.name: float(o.bytes) for o in training_ops(spec, tp).ops
            if isinstance(o, MemoryOp) and ".loss" in o.name and 0 in o.ranks}


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_s_cross_entropy_runs_on_fp32_logits_pass_by_pass(tp: int) -> None:
    """On the rank's T x V/t logits: cast to FP32 (2 + 4 B), row max (4), subtract (4 + 4), exp (4 + 4),
    row sum (4), divide (4 + 4); backward: times the loss gradient (4 + 4), cast back (4 + 2). The fused
    loss reads the 16-bit logits and writes their gradient, 3 x 2 B an element."""
    elements = SMALL["micro_batch_size"] * SMALL["seq_len"] * (GPT.vocab // tp)
    per_element = {"F0.loss.cast": 6, "F0.loss.max": 4, "F0.loss.sub": 8, "F0.loss.exp": 8, "F0.loss.sum": 4,
                   "F0.loss.div": 8, "B0.loss.mul": 8, "B0.loss.cast_back": 6}
    assert _loss(tp, loss="megatron") == pytest.approx({k: v * elements for k, v in per_element.items()})
    assert _loss(tp) == pytest.approx({"F0.loss": 6 * elements})


def test_megatron_s_cross_entropy_casts_nothing_in_fp32_training() -> None:
    elements = SMALL["micro_batch_size"] * SMALL["seq_len"] * GPT.vocab
    per_element = {"F0.loss.max": 4, "F0.loss.sub": 8, "F0.loss.exp": 8, "F0.loss.sum": 4, "F0.loss.div": 8,
                   "B0.loss.mul": 8}
    assert _loss(loss="megatron", precision="fp32") == pytest.approx(
        {k: v * elements for k, v in per_element.items()})


def test_composer_s_step_clips_then_runs_adamw_op_by_op_on_the_fsdp_shard() -> None:
    """llm-foundry's step on FSDP's 1/dp shard of FP32 parameters: the gradients' norm read (4 B)
    and their scaling in place (4 + 4), then Composer's DecoupledAdamW without weight decay: the
    moments' scale and update (8 + 12, 8 + 12), the denominator's square root, division and
    epsilon (3 x 8) and the weight's update (16): 92 B a parameter where fused Adam moves 28."""
    dp = 4
    step = _step(dp, optimizer="composer", parallel={"dp_mode": "fsdp"})
    assert list(step) == ["grad_norm", "grad_clip", "optimizer"]
    assert step == pytest.approx({"grad_norm": 4 * PARAMS / dp, "grad_clip": 8 * PARAMS / dp,
                                  "optimizer": 80 * PARAMS / dp}, rel=0.01)
