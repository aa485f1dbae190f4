"""Held-out checks on transformer layers and training steps as PyTorch runs them on one GPU.

``calibration/harness/layers.py`` ran, on an H200 under its 700 W limit, back to back for seconds:

- one rank's share of a transformer layer, forward and backward (two layers stacked), at the shapes
  of published training runs: llm-foundry's MPT models (the whole layer: FSDP), GPT-3 175B, a 22B
  model and Llama 3 405B over 8 tensor-parallel ranks (BF16, PyTorch's fused attention); and the
  SC'21 and 22B runs of Megatron-LM in FP16 with its unfused attention of the time (``baddbmm``, a
  fused causal softmax, dropout on the probabilities, ``bmm``);
- whole MPT models' training steps under PyTorch's automatic mixed precision: FP32 parameters, the
  forward and PyTorch's cross entropy under BF16 autocast, the backward, a fused AdamW step.

Each shape is predicted as a scenario of the same shape on one rank of the GPU's system (a tensor
parallel layer as its rank 0, with communication off; a step with data parallelism 1) at the
board's limit, and its median time over the iterations run back to back is the reference, within
10% (the held-out bar for kernel time). Nothing in the shipped calibration was fitted on these
runs. What the rows show is in docs/calibration.md, "Layers and steps as PyTorch runs them".
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovsim.errors import OvsimError
from ovsim.validate.datasets import sets

if TYPE_CHECKING:
    import pandas as pd

    from ovsim.api import Result
    from ovsim.scenario import Scenario
    from ovsim.validate.check import Check

# Data sets of layers.py's runs, their GPU spec and the system a rank of it is predicted on.
MEASURED_LAYERS = sets("layers", "set", "gpu", "system")
MEASURED_LAYERS_GROUP = ("measured transformer layers and training steps as PyTorch runs them on one GPU (calibration "
                         "harness layers.py; held out but for the fused attention kernels' efficiency, fitted on the "
                         "first layers set's kernels)")
TOLERANCE_PCT = 10.0
# The unfused rows are held out of every fit, but the form of their softmax's price was chosen
# looking at them (docs/calibration.md).
UNFUSED_NOTE = "; the fused softmax's priced form was chosen on these rows (no parameter fitted)"
# MPT's vocabulary (llm-foundry's recipes), which layers.py's whole models use.
STEP_VOCAB = 50_368


def read_run(run: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A data set's tables (``layers.parquet``, every part's, long format) and its parts' manifests."""
    import pandas as pd

    path, man = run / "layers.parquet", run / "manifest.json"
    for p in (path, man):
        if not p.is_file():
            raise OvsimError("missing (a layers.py data set holds layers.parquet and manifest.json)", source=str(p))
    return pd.read_parquet(path), json.loads(man.read_text())


def shape_scenario(shape: dict[str, Any], steps: bool, system: str) -> Scenario:
    """The scenario whose rank 0 runs what ``shape`` measured: a tensor-parallel layer's share with
    communication off, or a whole model's step on one GPU."""
    from ovsim.scenario import Scenario

    tp = int(shape.get("tp", 1))
    heads = int(shape["q_heads"]) * tp
    if int(shape["hidden"]) != heads * int(shape["head_dim"]):
        raise OvsimError(f"hidden {shape['hidden']} is not heads {heads} x head_dim {shape['head_dim']}: ovsim's "
                         "model derives the head size from them", field=f"shapes.{shape['name']}")
    model = {"layers": shape["layers"], "hidden": shape["hidden"], "heads": heads,
             "kv_heads": int(shape["kv_heads"]) * tp, "ffn_hidden": int(shape["ffn"]) * tp,
             "seq_len": shape["seq"], "gated_mlp": shape["gated"], "tied_embeddings": True}
    training: dict[str, Any] = {"micro_batch_size": shape["micro_batch"], "micro_batches": 1,
                                "precision": shape.get("dtype", "bf16"), "attention": shape.get("attention", "flash")}
    if steps:
        # The steps ran under BF16 autocast with FP32 parameters and PyTorch's cross entropy.
        training |= {"model": {**model, "vocab": STEP_VOCAB}, "precision": "amp_bf16", "optimizer": "fused_adam",
                     "loss": "pytorch", "parallel": {"dp": 1}}
    else:
        training |= {"model": model, "optimizer": "none", "embedding_and_head": False, "communication": False,
                     "parallel": {"tp": tp}}
    return Scenario.model_validate({"schema": "ovsim.scenario/1", "name": shape["name"], "system": system,
                                    "ranks": tp, "schedule": "overlapped", "training": training})


# Where each measured phase is in a predicted timeline: rank 0's ops named so (forward, backward,
# optimizer step).
PHASE_PREFIXES = {"fwd": "F0.", "bwd": "B0.", "step": "s0."}


def predicted_phases_s(ops: pd.DataFrame, phases: Iterable[str], name: str) -> dict[str, float]:
    """Rank 0's span of each of ``phases`` in seconds; a phase with no ops is an error, not 0 s."""
    ops = ops[ops["rank"] == 0]
    out = {}
    for phase in phases:
        o = ops[ops["name"].str.startswith(PHASE_PREFIXES[phase])]
        if not len(o):
            raise OvsimError(f"the prediction has no {PHASE_PREFIXES[phase]}* ops for the measured {phase}",
                             field=f"shapes.{name}")
        out[phase] = float(o["end_s"].max() - o["start_s"].min())
    return out


def measured_phases_s(data: pd.DataFrame, part: str, name: str) -> tuple[dict[str, float], int]:
    """The median seconds of each phase over ``name``'s iterations back to back, and their count."""
    it = data[(data["part"] == part) & (data["table"] == "iterations") & (data["shape"] == name)
              & (data["condition"] == "sustained")]
    phases = {c[:-3]: float(it[c].median()) / 1e3 for c in ("fwd_ms", "bwd_ms", "step_ms")
              if c in it and it[c].notna().any()}
    return phases, len(it)


def _clock_note(data: pd.DataFrame, part: str, name: str, predicted_hz: float) -> str:
    """The board's clock and power as NVML sampled them, beside the clock ovsim's power loop gives:
    under the limit the time follows the energy, and the clock says whether its split is right."""
    s = data[(data["part"] == part) & (data["table"] == "nvml") & (data["label"] == f"{name}/sustained")]
    ovsim = f"; ovsim's SM clock {predicted_hz / 1e6:.0f} MHz on average"
    if not len(s) or "sm_mhz" not in s:
        return ovsim
    return f"; measured at {s['sm_mhz'].median():.0f} MHz, {s['power_w'].median():.0f} W (NVML medians){ovsim}"


def measured_layer_checks(folder: Path) -> list[Check]:
    """One row per data set, part and shape: the measured median of a layer's forward and backward
    (or a step's forward, backward and optimizer step) against ovsim's, within 10%."""
    from ovsim.api import predict
    from ovsim.validate.check import Check

    checks = []
    # Every shape was measured on two machines: each distinct scenario is predicted once.
    predicted: dict[str, Result] = {}
    for rel, gpu, system in MEASURED_LAYERS:
        if not (folder / rel / "layers.parquet").is_file():
            continue
        data, manifests = read_run(folder / rel)
        for part, man in manifests.items():
            steps = man.get("what") == "steps"
            for shape in man["shapes"]:
                measured, n = measured_phases_s(data, part, shape["name"])
                if shape["name"] in man.get("errors", {}) or not n:
                    continue
                scenario = shape_scenario(shape, steps, system)
                key = scenario.model_dump_json()
                if key not in predicted:
                    predicted[key] = predict(scenario, counters=False)
                res = predicted[key]
                pred = predicted_phases_s(res.timeline.ops, measured, shape["name"])
                parts = ", ".join(f"{p} {pred[p] * 1e3:.2f} ms against {m * 1e3:.2f}" for p, m in measured.items())
                what = "training step" if steps else "forward + backward"
                checks.append(Check(
                    f"{gpu} {shape['name']} ({part}): {what}", MEASURED_LAYERS_GROUP, sum(measured.values()) * 1e3,
                    sum(pred.values()) * 1e3, "ms", TOLERANCE_PCT, f"calibration/data/{rel} ({part})",
                    note=f"{parts}; median of {n} iterations back to back"
                         + _clock_note(data, part, shape["name"], float(res.summary()["avg_sm_clock_hz"]))
                         + (UNFUSED_NOTE if shape.get("attention") == "unfused" else "")))
    return checks
