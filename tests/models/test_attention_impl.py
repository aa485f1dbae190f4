"""Named attention kernels run at the efficiency their authors published: FlashAttention at
25-40% of the A100's dense 16-bit peak and FlashAttention-2 at 50-73% (Dao, FlashAttention-2,
arXiv 2307.08691, abstract), FlashAttention-2 at 35% on the H100 (Shah et al., FlashAttention-3,
arXiv 2407.08608, abstract). A GPU without a published figure for one refuses it."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ovsim.api import predict
from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters, load_calibration
from ovsim.hw.spec import GpuSpec, load_gpu, load_system
from ovsim.models import cost
from ovsim.models.op_specs import AttentionOp
from ovsim.models.workload import build_workload
from ovsim.scenario import Scenario

# The papers' ranges, as fractions of the dense 16-bit tensor peak.
PUBLISHED = {
    "a100-sxm4-40gb": {"flash1": (0.25, 0.40), "flash2": (0.50, 0.73)},
    "a100-sxm4-80gb": {"flash1": (0.25, 0.40), "flash2": (0.50, 0.73)},
    "h100-sxm5-80gb": {"flash2": (0.35, 0.35)},
    "h200-sxm": {"flash2": (0.35, 0.35)},
}


PARAMS_A100 = load_calibration(load_gpu("a100-sxm4-80gb"), "a100-sxm4-80gb").params


def _params(gpu_name: str) -> tuple[GpuSpec, Parameters]:
    gpu = load_gpu(gpu_name)
    return gpu, load_calibration(gpu, gpu_name).params


@pytest.mark.parametrize("gpu_name", sorted(PUBLISHED))
def test_a_big_attention_runs_inside_its_implementations_published_range(gpu_name: str) -> None:
    gpu, params = _params(gpu_name)
    # 8 x 32 heads x 32 query tiles of 128: 8,192 blocks, so the last wave's share is small.
    batch, heads, seq, dim = 8, 32, 4096, 128
    for impl, (low, high) in PUBLISHED[gpu_name].items():
        for backward in (False, True):
            d = cost.attention(batch, heads, seq, dim, "bf16", gpu, params, backward=backward,
                               efficiency=params.attention_eff(impl))
            rate = d.flops / (d.isolated_s - params.kernel_overhead_s)
            assert low * 0.97 <= rate / gpu.peak_flops_per_s("bf16") <= high * 1.001, (impl, backward)


def test_flash2_is_as_much_faster_than_flash1_as_their_published_rates_say() -> None:
    gpu, params = _params("a100-sxm4-80gb")
    t = {impl: cost.attention(4, 16, 2048, 64, "bf16", gpu, params, backward=True,
                              efficiency=params.attention_eff(impl)).isolated_s - params.kernel_overhead_s
         for impl in ("flash1", "flash2")}
    assert t["flash1"] / t["flash2"] == pytest.approx(0.615 / 0.325, rel=1e-6)


def test_an_attention_op_is_priced_at_its_implementations_efficiency_or_the_calibrations() -> None:
    """Through the workload build: no implementation at the calibration's efficiency for a block
    of queries over 16 tiles of keys (4,096 keys, half on average under the causal mask:
    attention_efficiency x 16 / (16 + attention_block_overhead_tiles)), flash2 at the H100's
    published 0.35, so the op takes that over 0.35 as long (less the fixed per-kernel overhead)."""
    gpu, params = _params("h100-sxm5-80gb")
    system = load_system("hgx-h100")
    shape = {"kind": "attention", "batch": 4, "heads": 16, "seq_len": 4096, "head_dim": 128}
    alone = {}
    for impl in (None, "flash2"):
        wl = build_workload([AttentionOp(name="a", implementation=impl, **shape)], gpu=gpu, system=system,
                            params=params, n_ranks=1)
        alone[impl] = wl.ops[0].kernel.isolated_s - params.kernel_overhead_s
    fused = params.attention_efficiency * 16 / (16 + params.attention_block_overhead_tiles)
    assert alone["flash2"] / alone[None] == pytest.approx(fused / 0.35, rel=1e-9)


@pytest.mark.parametrize("gpu_name", ["h100-sxm5-80gb", "a100-sxm4-80gb"])
def test_a_fused_kernels_time_follows_its_direction_keys_and_head(gpu_name: str) -> None:
    """Per FLOP: the backward at attention_backward_efficiency against the forward's; a block over
    64 tiles of keys against one over 16, by (n + overhead) / n; a head of 96 on the kernel of a
    head of 128 (the H100's cuDNN kernels), so 128 / 96 the time per FLOP. The A100 keeps one
    efficiency, no block overhead and no rounding (nothing measured there)."""
    from ovsim.models.cost import attention

    gpu, params = _params(gpu_name)

    def per_flop(**kw: Any) -> float:
        d = attention(kw.pop("batch", 4), kw.pop("heads", 16), kw.pop("seq", 4096), kw.pop("head_dim", 128), "bf16",
                      gpu, params, **kw)
        return (d.isolated_s - params.kernel_overhead_s) / d.flops

    c = params.attention_block_overhead_tiles
    backward = params.attention_backward_efficiency or params.attention_efficiency
    assert per_flop(backward=True) / per_flop() == pytest.approx(params.attention_efficiency / backward, rel=1e-9)
    # 4 x the sequence at a quarter of the batch: the same blocks, each over 4 x the keys.
    longer = per_flop(batch=1, seq=16384) / per_flop()
    assert longer == pytest.approx((64 + c) / 64 * 16 / (16 + c), rel=1e-9)
    # Heads of 96 at 4/3 the heads: the same FLOPs and blocks a wave.
    rounded = per_flop(heads=12, head_dim=96) / per_flop(heads=12, head_dim=128)
    assert rounded == pytest.approx(128 / 96 if gpu_name.startswith("h100") else 1.0, rel=1e-9)
    assert (c > 0) == gpu_name.startswith("h100")


def test_named_kernels_run_in_sixteen_bits() -> None:
    with pytest.raises(ValidationError, match="fp16 or bf16"):
        AttentionOp(name="a", kind="attention", batch=1, heads=8, seq_len=1024, head_dim=64, precision="fp32",
                    implementation="flash2")
    sc = _training("dgx-a100-hdr", "flash2")
    assert sc.training is not None
    sc = sc.model_copy(update={"training": sc.training.model_copy(update={"precision": "tf32"})})
    with pytest.raises(OvsimError, match="fp16 or bf16") as e:
        predict(sc, mode="analytic")
    assert e.value.field == "training.attention"


def test_an_implementation_without_a_published_figure_is_refused_by_name() -> None:
    gpu = load_gpu("h100-sxm5-80gb")
    params = load_calibration(gpu, "h100-sxm5-80gb").params
    op = AttentionOp(name="attn", kind="attention", batch=1, heads=8, seq_len=1024, head_dim=64,
                     implementation="flash1")
    with pytest.raises(OvsimError) as e:
        build_workload([op], gpu=gpu, system=load_system("hgx-h100"), params=params, n_ranks=1, source="s.yaml")
    assert e.value.field == "ops.attn.implementation"
    assert "flash1" in e.value.message and "H100" in e.value.message


def _training(system: str, attention: str) -> Scenario:
    return Scenario.model_validate({
        "schema": "ovsim.scenario/1", "name": "attn", "system": system, "nodes": 1,
        "training": {"model": {"layers": 2, "hidden": 1024, "heads": 16, "vocab": 50_264, "seq_len": 2048,
                               "gated_mlp": False},
                     "micro_batch_size": 2, "attention": attention, "parallel": {"dp": 8}},
    })


def test_a_training_scenario_names_its_attention_field_when_refused() -> None:
    with pytest.raises(OvsimError) as e:
        predict(_training("hgx-h100-ndr", "flash1"), mode="analytic")
    assert e.value.field == "training.attention"


def test_a_training_iteration_with_flash1_is_slower_by_its_attention_alone() -> None:
    """Only the attention kernels change: each takes the published rates' ratio longer alone, and
    the iteration (one compute stream) grows by about what they add."""
    res = {a: predict(_training("dgx-a100-hdr", a), mode="analytic") for a in ("flash", "flash1")}
    ops = {a: r.ops[(r.ops.kind == "attention") & (r.ops["rank"] == 0)] for a, r in res.items()}
    alone = {a: float(o.isolated_s.sum()) for a, o in ops.items()}
    ran = {a: float(o.duration_s.sum()) for a, o in ops.items()}
    overhead = 4 * PARAMS_A100.kernel_overhead_s  # two layers, forward and backward
    assert (alone["flash1"] - overhead) / (alone["flash"] - overhead) == pytest.approx(0.6 / 0.325, rel=1e-3)
    others = {a: float(r.ops[(r.ops.kind != "attention") & (r.ops["rank"] == 0)].isolated_s.sum())
              for a, r in res.items()}
    assert others["flash1"] == pytest.approx(others["flash"], rel=1e-9)
    grew = res["flash1"].summary()["makespan_s"] - res["flash"].summary()["makespan_s"]
    assert grew == pytest.approx(ran["flash1"] - ran["flash"], rel=0.1)
