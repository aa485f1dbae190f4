"""Layers and steps as PyTorch runs them on one GPU (calibration/harness/layers.py's data sets,
ovsim.validate.measured_layers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ovsim import api
from ovsim.errors import OvsimError
from ovsim.validate import datasets
from ovsim.validate.measured import MEASURED_DATA
from ovsim.validate.measured_layers import (
    MEASURED_LAYERS,
    MEASURED_LAYERS_GROUP,
    STEP_VOCAB,
    measured_layer_checks,
    predicted_phases_s,
    read_run,
    shape_scenario,
)


def _manifests() -> list[tuple[str, dict]]:
    return [(part, m) for rel, _, _ in MEASURED_LAYERS
            for part, m in json.loads((MEASURED_DATA / rel / "manifest.json").read_text()).items()]


def test_every_layers_data_set_is_registered_as_read_by_these_checks() -> None:
    assert {rel for rel, _, _ in MEASURED_LAYERS} == {"h200-sxm/2026-12-04", "h200-sxm/2026-12-04-b",
                                                  "h200-sxm/2026-12-04-c", "h200-sxm/2026-12-04-d"}
    roles = datasets.roles()
    assert all("layers" in roles[rel] for rel, _, _ in MEASURED_LAYERS)


def test_each_layer_scenario_runs_the_measured_layers_gemm_flops() -> None:
    """Rank 0's forward GEMMs of the scenario do the FLOPs of the layer layers.py built, written out
    here from its shapes: its four linear layers (2 x tokens x in x out each) and, with Megatron-LM's
    unfused attention, the batched QK^T and PV over every head's whole s x s (2 x 2 b heads s^2 d)."""
    seen = 0
    for _, man in _manifests():
        if man.get("what") == "steps":
            continue
        for s in man["shapes"]:
            tokens = s["micro_batch"] * s["seq"]
            q, kv, d, h, f = s["q_heads"], s["kv_heads"], s["head_dim"], s["hidden"], s["ffn"]
            outs = ((h, (q + 2 * kv) * d), (q * d, h), (h, f * (2 if s["gated"] else 1)), (f, h))
            expected = sum(2.0 * tokens * i * o for i, o in outs)
            if s["attention"] == "unfused":
                expected += 2 * 2.0 * s["micro_batch"] * q * s["seq"] ** 2 * d
            expected *= s["layers"]
            wl, *_ = api.build(shape_scenario(s, False, "hgx-h200"))
            got = sum(o.kernel.flops for o in wl.ops if o.rank == 0 and o.kind == "gemm" and o.name.startswith("F0."))
            assert got == pytest.approx(expected, rel=1e-12), s["name"]
            seen += 1
    assert seen == 27  # 7 shapes and 6 unfused, each on two machines, and one for a minute


def test_the_layer_checks_cover_every_measured_shape() -> None:
    checks = measured_layer_checks(MEASURED_DATA)
    shapes = sum(len(m["shapes"]) for _, m in _manifests())
    assert len(checks) == shapes == 37
    assert {c.group for c in checks} == {MEASURED_LAYERS_GROUP}
    assert all(c.unit == "ms" and c.tolerance_pct == 10.0 for c in checks)
    # Every layer (BF16 with PyTorch's fused attention, measured twice and for a minute; FP16 with
    # Megatron-LM's unfused attention): ovsim's kernels at the clocks the 700 W limit leaves them
    # come within 9% (-1.7% to +8.8%). The unfused ones came 5-28% slow while their fused softmax
    # took the eager softmax's efficiency (docs/calibration.md). The fused ones came within 6%
    # (-2.5% to +5.2%) while their attention was priced 10-50% fast (at 0.6 of the peak both
    # ways); priced as the kernels were measured, the slow clock ovsim's power gives them under
    # the limit no longer cancels against it (docs/calibration.md, "Fused attention, measured").
    layers = [c for c in checks if "(steps" not in c.name]
    assert len(layers) == 27 and all(abs(c.error_pct) < 9 for c in layers), [
        (c.name, round(c.error_pct, 1)) for c in layers if abs(c.error_pct) >= 9]
    # The AMP steps, predicted as autocast runs them (precision amp_bf16, loss pytorch): within 9%
    # (+3.5% to +8.6%; +0.1% to +5.2% with the attention priced fast, as above). Priced as BF16
    # training with a fused loss, before autocast was modelled, they came 2.6-10.5% fast.
    steps = [c for c in checks if "(steps" in c.name]
    assert len(steps) == 10 and all(abs(c.error_pct) < 9 for c in steps), [
        (c.name, round(c.error_pct, 1)) for c in steps if abs(c.error_pct) >= 9]


def test_a_step_scenario_is_the_whole_model_on_one_gpu() -> None:
    """A steps shape predicts a model with its vocabulary, embedding, head, loss and optimizer step
    on one rank; a layer shape has no step, and a phase the prediction lacks is an error."""
    (_, man), = [(p, m) for p, m in _manifests() if p == "steps"]
    shape = man["shapes"][0]
    sc = shape_scenario(shape, True, "hgx-h200")
    assert sc.ranks == 1 and sc.training is not None
    assert sc.training.shape().vocab == STEP_VOCAB and sc.training.optimizer_mode == "fused_adam"
    ops = api.predict(sc, counters=False).timeline.ops
    assert set(predicted_phases_s(ops, ("fwd", "bwd", "step"), shape["name"])) == {"fwd", "bwd", "step"}
    assert sc.training.precision == "amp_bf16" and sc.training.loss == "pytorch"
    assert {"F0.embed", "F0.head", "F0.loss.log_softmax", "B0.loss.log_softmax_bwd", "s0.optimizer"} <= set(ops["name"])
    layer_ops = api.predict(shape_scenario(shape, False, "hgx-h200"), counters=False).timeline.ops
    with pytest.raises(OvsimError, match="no s0"):
        predicted_phases_s(layer_ops, ("fwd", "bwd", "step"), shape["name"])


def test_a_data_set_without_its_files_is_named(tmp_path: Path) -> None:
    with pytest.raises(OvsimError, match=r"layers\.parquet"):
        read_run(tmp_path)


def test_a_shape_whose_heads_do_not_divide_its_width_is_refused() -> None:
    (_, man), *_ = _manifests()
    bad = {**man["shapes"][0], "head_dim": 100}
    with pytest.raises(OvsimError, match="head_dim"):
        shape_scenario(bad, False, "hgx-h200")
