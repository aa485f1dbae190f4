"""Held-out checks on a real framework's kernels beside communication-like kernels.

The calibration harness's ``framework`` part (calibration/harness/framework.py) runs the kernels of
one GPT-2 layer as PyTorch 2.11 launches them on an H100 and an H200 (layer norm forward and
backward, GELU, dropout, softmax, residual adds, a bias-gradient reduction, a multi-tensor optimizer
step, FP32 GEMMs, attention, and one- and few-block elementwise kernels of about a microsecond), each
alone and then beside one long channel kernel (copy loops of 1 to 32 channels, a reduce loop of 8,
and 8 channels that only poll flags in L2). Nothing in the shipped calibration was fitted on these
experiments (the copy engines' weight and the warps' bound come from the same data sets' kernels
beside copies and alone), so replaying them with it predicts every overlapped kernel held out.

Each row pools one kernel's overlapped instances on one GPU over every channel configuration and
data set, and passes at the held-out replay bar (10% MAPE, and a third of naive). What the rows
show, and which kernels the model misses, is in docs/real-kernels.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ovsim.traces.table import TraceBundle, validate_table
from ovsim.validate.datasets import experiments, fitted, sets
from ovsim.workers import worker_pool

if TYPE_CHECKING:
    from ovsim.validate.check import Check

# Data sets of the framework part, and their GPU spec.
FRAMEWORK_SETS = sets("framework", "set", "gpu")
FRAMEWORK_GROUP = ("measured framework kernels beside channels (calibration harness framework part; "
                   "predicted: nothing fitted on these experiments)")
GPU_NAMES = {"h100-sxm5-80gb": "NVIDIA H100 80GB HBM3", "h200-sxm": "NVIDIA H200"}


def framework_experiments(folder: Path, rel: str, gpu: str) -> list[tuple[str, TraceBundle]]:
    """(experiment label, kernel table) of every experiment of a data set's ``framework`` part."""
    path = folder / rel / "tables" / "framework.parquet"
    if not path.is_file():
        return []
    merged = pd.read_parquet(path)
    out = []
    for label, g in merged.groupby("experiment", sort=True):
        table = validate_table(g.drop(columns="experiment").reset_index(drop=True), f"{rel}/{label}")
        out.append((str(label), TraceBundle(kernels=table, gpu_names={0: GPU_NAMES.get(gpu, gpu)})))
    return out


def framework_checks(folder: Path, workers: int = 1, on_stage: Callable[[str], None] | None = None) -> list[Check]:
    """One row per framework kernel and GPU: its overlapped instances over the GPU's data sets of
    ``FRAMEWORK_SETS``, replayed held out (see the module docstring)."""
    from ovsim.calibrate import TraceInput
    from ovsim.validate.check import Check
    from ovsim.validate.measured import pooled, replay_row

    by_victim: dict[str, list[TraceInput]] = {}
    sources: dict[str, list[str]] = {}
    for rel, gpu in FRAMEWORK_SETS:
        for label, bundle in framework_experiments(folder, rel, gpu):
            victim = f"{gpu.split('-')[0]} framework: {label.split('__', 1)[0]}"
            by_victim.setdefault(victim, []).append(TraceInput(bundle=bundle, label=label, gpu=gpu))
            if rel not in sources.setdefault(victim, []):
                sources[victim].append(rel)
    if not by_victim:
        return []
    if on_stage is not None:
        on_stage(f"replaying {sum(len(v) for v in by_victim.values())} framework experiments")
    names = sorted(by_victim)
    jobs = min(workers, len(names))
    pool = worker_pool(jobs)
    with pool or nullcontext():
        run = pool.map if pool is not None else map
        pools = list(run(pooled, [by_victim[v] for v in names], itertools.repeat({})))
    checks = []
    for victim, series in zip(names, pools, strict=True):
        row = replay_row(series)
        if row is None:
            continue
        n, mape, naive, bar = row
        checks.append(Check(f"{victim} ({n} kernels)", FRAMEWORK_GROUP, bar, mape, "% MAPE", 0.0,
                            ", ".join(f"calibration/data/{r}" for r in sources[victim]), rule="at_most",
                            note=f"naive {naive:.1f}%; beside copy channels (1-32), a reduce loop (8) and polling "
                                 "channels (8); the shipped calibration, fitted on none of these"))
    return checks


COPY_GROUP = ("measured framework kernels beside copy engines (calibration harness framework_copy part; "
              "held out: the copy engines' parameters fitted on another data set)")
COPY_FIT_GROUP = ("measured framework kernels beside copy engines (calibration harness framework_copy part; the data "
                  "set the copy engines' weight is fitted on)")
# The data set the copy-engine parameters are fitted on (calibration/harness/fit_copy_engine.py;
# marked "fit" in the registry); the others of FRAMEWORK_SETS are held out.
COPY_FIT_SET = next(iter(fitted("framework").values()), "")


def beside_slowdowns(table: pd.DataFrame, gpu: str, overrides: dict[str, Any] | None = None, *,
                   beside: str = "copy", predict: bool = True) -> pd.DataFrame:
    """Per experiment of a merged table (column ``experiment``) and compute kernel: its median time
    alone, and its measured (and, with ``predict``, predicted) slowdown beside activities of kind
    ``beside`` (copies, or the channels' collectives).

    Replay takes the isolated time of a kernel that overlaps no collective from its own (here
    overlapped) measurement; the overlapped instances are given their kernel's median alone first,
    so the prediction starts from the time alone as for a collective's neighbours."""
    from ovsim.replay import replay
    from ovsim.replay_kernels import COMPUTE_KINDS

    rows = []
    for exp, g in table.groupby("experiment", sort=True):
        g = g.drop(columns="experiment").reset_index(drop=True)
        copies = g[g["kind"] == beside]
        cs, ce = copies["start_s"].to_numpy(), (copies["start_s"] + copies["duration_s"]).to_numpy()
        k = g[g["kind"].isin(COMPUTE_KINDS)]
        s, e = k["start_s"].to_numpy(), (k["start_s"] + k["duration_s"]).to_numpy()
        hit: np.ndarray = np.asarray(((cs[None, :] < e[:, None]) & (ce[None, :] > s[:, None])).any(axis=1))
        dur = g["duration_s"].to_numpy().copy()
        alone: dict[str, tuple[float, np.ndarray, np.ndarray]] = {}
        for name, idx in k.groupby("name").groups.items():
            m = k.index.get_indexer(idx)
            if hit[m].any() and (~hit[m]).any():
                a = float(np.median(dur[np.asarray(idx)[~hit[m]]]))
                alone[str(name)] = (a, np.asarray(idx)[hit[m]], dur[np.asarray(idx)[hit[m]]].copy())
                dur[np.asarray(idx)[hit[m]]] = a
        if not alone:
            continue
        pred = np.full(len(g), np.nan)
        if predict:
            bundle = TraceBundle(kernels=validate_table(g.assign(duration_s=dur), str(exp)),
                                 gpu_names={0: GPU_NAMES.get(gpu, gpu)})
            pred = replay(bundle, gpu=gpu, counters=False, overrides=overrides).kernels["predicted_duration_s"]\
                .to_numpy()
        for name, (a, over, measured) in alone.items():
            rows.append({"experiment": str(exp), "name": name, "alone_s": a,
                         "measured": float(np.median(measured)) / a, "predicted": float(np.median(pred[over])) / a})
    return pd.DataFrame(rows)


# (data set, GPU spec) of kernels beside copy engines; the copy-engine parameters were fitted on
# the first (the registry says what each holds).
COPY_SETS = sets("framework_copy", "set", "gpu")


def copy_table(folder: Path, rel: str) -> pd.DataFrame | None:
    """A data set's kernels beside copies, merged (column ``experiment``), or None."""
    merged = folder / rel / "tables" / "framework_copy.parquet"
    if merged.is_file():
        return pd.read_parquet(merged)
    parts = experiments(folder / rel, "copy", "*__*")
    if not parts:
        return None
    return pd.concat([b.kernels.assign(experiment=label) for label, b in parts.items()], ignore_index=True)


def copy_checks(folder: Path) -> list[Check]:
    """Per data set of ``COPY_SETS``: the kernels' slowdowns beside copies, predicted from their time
    alone with the shipped calibration, against the measured ones (MAPE; the held-out bar)."""
    from ovsim.replay_score import mape_pct
    from ovsim.validate.check import Check
    from ovsim.validate.traces import held_out_bar

    checks = []
    for rel, gpu in COPY_SETS:
        table = copy_table(folder, rel)
        if table is None:
            continue
        s = beside_slowdowns(table, gpu)
        if s.empty:
            continue
        measured = s["measured"].to_numpy()
        mape, naive = mape_pct(s["predicted"].to_numpy(), measured), mape_pct(np.ones(len(s)), measured)
        # The copy engines sharing HBM fairly and moving at their full rate in the latency law.
        fair = beside_slowdowns(table, gpu, {"copy_engine_hbm_weight": 1.0, "memory_warp_bytes_per_s": 0.0})
        fair_pct = mape_pct(fair["predicted"].to_numpy(), fair["measured"].to_numpy())
        fitted = rel == COPY_FIT_SET
        what = ("the copy engines' weight fitted here (a consistency check)" if fitted else
                f"held out: the copy engines' weight fitted on calibration/data/{COPY_FIT_SET}")
        checks.append(Check(f"{gpu} {rel.rsplit('/', 1)[-1]}: slowdowns beside copies ({len(s)} kernels)",
                            COPY_FIT_GROUP if fitted else COPY_GROUP, held_out_bar(naive), mape, "% MAPE", 0.0,
                            f"calibration/data/{rel}", rule="at_most",
                            note=f"naive (no slowdown) {naive:.1f}%; copies sharing HBM fairly (the model before) "
                                 f"{fair_pct:.1f}%; {what}"))
    return checks
