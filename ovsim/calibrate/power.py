"""The power fit: idle power and the activity weights, from power logs beside replays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ovsim.calibrate.inputs import PowerLog, TraceInput, _plain
from ovsim.errors import OvsimError
from ovsim.hw.calib import (
    Parameters,
)
from ovsim.hw.spec import load_gpu

# Weights of ovsim.hw.power.fit_power -> (the activity that identifies each, the calibration
# parameter it becomes).
_POWER_PARAMS = {"tensor_w": ("sm_tensor_fraction", "power_tensor_w"), "fp32_w": ("sm_fp32_fraction", "power_fp32_w"),
                 "memory_w": ("sm_memory_fraction", "power_memory_w"),
                 "hbm_w": ("hbm_bytes_per_s", "power_hbm_j_per_byte"),
                 "link_w": ("link_bytes_per_s", "power_link_j_per_byte")}


@dataclass(frozen=True)
class PowerSamples:
    """A trace's power samples beside the replay's activity (``ovsim.hw.power.FIT_COLUMNS``) and
    the shipped model's prediction at each (``predicted_w``)."""

    label: str
    log: str
    table: pd.DataFrame
    window_s: float


def _gpu_to_rank(tr: TraceInput, samples: pd.DataFrame, log: str) -> dict[int, int]:
    """Log GPU index -> trace rank, by the device each rank's kernels ran on."""
    k = tr.bundle.kernels
    out: dict[int, int] = {}
    for r in sorted(k["rank"].dropna().unique().tolist()):
        dev = k.loc[k["rank"] == r, "device"].dropna()
        if len(dev):
            d = int(dev.mode().iloc[0])
            if d in out:
                # Ranks of several hosts: one host's log cannot be told apart from another's.
                raise OvsimError(f"ranks {out[d]} and {int(r)} both ran on device {d} (several hosts): a power log "
                                 "covers one host; give it with a trace of that host's ranks", source=log,
                                 field="gpu")
            out[d] = int(r)
    gpus = sorted(set(samples["gpu"].tolist()))
    if not out and len(gpus) == 1 and k["rank"].nunique() == 1:
        out = {int(gpus[0]): int(k["rank"].iloc[0])}  # one GPU logged, one rank traced, no device ids
    if not set(out) & set(gpus):
        raise OvsimError(f"no GPU of the log ({', '.join(map(str, gpus))}) ran the trace (devices "
                         f"{', '.join(map(str, sorted(out))) or 'not recorded'})", source=log, field="gpu")
    return out


def power_samples(tr: TraceInput, log: PowerLog) -> PowerSamples:
    """The samples of ``log`` that fall inside the trace, each beside the activity of the trace's
    replay over the sensor's window (see the module docstring)."""
    from ovsim.replay import replay
    from ovsim.traces.power import align_samples, fit_table, offset_from_wall_clock, predicted_at, read_power_samples

    samples = read_power_samples(log.path)
    if samples.empty:
        raise OvsimError("the log has no power samples", source=log.path, field="power")
    if log.offset_s is not None:
        offset = log.offset_s
    elif tr.bundle.wall_origin_s is None:
        raise OvsimError(f"the trace {tr.label} records no wall clock to align the log with; give the trace time of "
                         "the log's first sample (--power-offset-s)", source=log.path, field="timestamp")
    else:
        offset = offset_from_wall_clock(samples, tr.bundle.wall_origin_s)
    window = log.window_s
    if window is None:
        steps = samples.groupby("gpu")["time_s"].diff().dropna()
        steps = steps[steps > 0]
        window = float(steps.median()) if len(steps) else 0.0
    k = tr.bundle.kernels
    start = float(k["start_s"].min())
    end = float((k["start_s"] + k["duration_s"]).max())
    # A sample averages the window before it: only windows wholly inside the trace are its activity.
    aligned = align_samples(samples, offset, start_s=start + window, end_s=end,
                            gpu_to_rank=_gpu_to_rank(tr, samples, log.path))
    if aligned.empty:
        t = samples["time_s"].to_numpy(float) + offset
        raise OvsimError(f"no sample falls inside the trace with its averaging window ({window:g} s): the log spans "
                         f"{t.min():.3f}..{t.max():.3f} s and the trace {start:.3f}..{end:.3f} s on the trace's clock "
                         "(nvidia-smi writes local time; give --power-offset-s)", source=log.path, field="timestamp")
    result = replay(tr.bundle, gpu=tr.gpu, counters=True, power=True)
    on_sim = aligned.assign(time_s=aligned["time_s"] - result.clock_offset_s)
    table = fit_table(on_sim, result.timeline.counters, window_s=window)
    table["predicted_w"] = predicted_at(on_sim, result.timeline.counters, "power_w", window)
    return PowerSamples(tr.label, Path(log.path).name, table, window)


def fit_power_logs(traces: Sequence[TraceInput], gpu: str, params: Parameters,
                   prepared: Sequence[PowerSamples] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fitted power parameters and the fit's record; raises when no trace has a power log or no
    sample falls inside its trace. ``prepared``: the traces' :func:`power_samples` (computed here
    when not given)."""
    from ovsim.hw.power import FIT_COLUMNS, fit_power, power_model

    data = list(prepared) if prepared is not None else [power_samples(tr, log) for tr in traces
                                                          for log in tr.power_logs]
    if not data:
        raise OvsimError("no power log given with the traces (--power-log)", field="power")
    spec = load_gpu(gpu)
    model = power_model(spec, params)
    table = pd.concat([d.table for d in data], ignore_index=True)
    fit = fit_power({c: table[c].to_numpy(float) for c in table.columns}, model, fit_idle=True)
    ok = np.isfinite(table[list(FIT_COLUMNS)].to_numpy(float)).all(axis=1)
    # Weights on bytes/s are written per byte, at the peak rate their activity is a fraction of.
    peak = {"hbm_w": model.hbm_peak_bytes_per_s, "link_w": model.link_peak_bytes_per_s}
    values: dict[str, Any] = {"power_idle_w": fit.params["idle_w"]}
    not_identifiable: list[str] = []
    for w, (activity, key) in _POWER_PARAMS.items():
        if not np.nanmax(np.abs(table.loc[ok, activity].to_numpy(float)), initial=0.0) > 0:
            not_identifiable.append(key)
            continue
        v = fit.params[w] / peak[w] if w in peak else fit.params[w]
        values[key] = {"default": v} if key == "power_tensor_w" else v
    meas = table.loc[ok, "power_w"].to_numpy(float)
    before = table.loc[ok, "predicted_w"].to_numpy(float)
    record = {
        "method": "least squares, non-negative weights (scipy least_squares), on samples beside the replay's "
                  "activity averaged over the sensor's window",
        "samples": fit.n_samples,
        "logs": [{"trace": d.label, "log": d.log, "samples": len(d.table), "window_s": d.window_s} for d in data],
        "fit_rmse_w": round(fit.rmse_w, 3),
        "fit_mape_pct": round(fit.mape_pct, 3),
        "shipped_model_mape_pct": round(float(np.nanmean(np.abs(before - meas) / np.maximum(meas, 1e-9)) * 100), 3),
        "not_identifiable": sorted(not_identifiable),
        "note": "fit error on the samples fitted; not a prediction error",
    }
    return _plain(values), record
