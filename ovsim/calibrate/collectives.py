"""The collectives fit: NCCL latency and bus bandwidth from collectives that ran without compute."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.optimize import nnls

from ovsim.calibrate.inputs import TraceInput
from ovsim.errors import OvsimError
from ovsim.models import nccl
from ovsim.replay import NCCL_OPS, protocol_key
from ovsim.replay_kernels import COMPUTE_KINDS, KernelColumns
from ovsim.traces.table import TraceBundle


def _collective_rows(bundle: TraceBundle) -> dict[str, list[tuple[float, float]]]:
    """(bus bytes, fastest duration) per message size of collectives that did not overlap compute."""
    df = bundle.kernels.reset_index(drop=True)
    c = KernelColumns.of(df)
    is_coll = np.array([k == "collective" for k in c.kind], dtype=bool)
    is_compute = np.array([k in COMPUTE_KINDS for k in c.kind], dtype=bool)
    out: dict[str, dict[float, float]] = {}
    for r in np.unique(c.rank):
        comp = np.flatnonzero(is_compute & (c.rank == r))
        cs, ce = c.start[comp], c.end[comp]
        for i in np.flatnonzero(is_coll & (c.rank == r)):
            op, size, n = c.collective[i], c.message_bytes[i], c.group_size[i]
            if op not in NCCL_OPS or not (math.isfinite(size) and size > 0 and math.isfinite(n) and n > 1):
                continue
            if np.any((cs < c.end[i]) & (ce > c.start[i])):
                continue
            algo = c.algorithm[i] or "unknown"
            key = f"{op}/{algo}/{protocol_key(c.protocol[i])}/{int(n)}"
            bus = size * nccl.bus_factor(op, int(n))  # type: ignore[arg-type]
            sizes = out.setdefault(key, {})
            sizes[bus] = min(sizes.get(bus, math.inf), float(c.dur[i]))
    return {k: sorted(v.items()) for k, v in out.items()}


def collective_time_s(bus_bytes: np.ndarray, latency_s: float, bus_bandwidth_bytes_per_s: float) -> np.ndarray:
    """The fitted time of a collective moving ``bus_bytes`` (bus bytes, as NCCL's tests count them)."""
    return np.asarray(latency_s + bus_bytes / bus_bandwidth_bytes_per_s)


def fit_collectives(traces: Sequence[TraceInput]) -> tuple[dict[str, Any], dict[str, Any]]:
    rows: dict[str, dict[float, float]] = {}
    for tr in traces:
        for key, pts in _collective_rows(tr.bundle).items():
            d = rows.setdefault(key, {})
            for b, t in pts:
                d[b] = min(d.get(b, math.inf), t)
    fitted: dict[str, dict[str, float]] = {}
    record: dict[str, Any] = {"method": "non-negative least squares of t = latency + bus_bytes / bandwidth on "
                                        "the fastest instance of each message size", "collectives": {}}
    for key, d in sorted(rows.items()):
        pts = sorted(d.items())
        if len(pts) < 2:
            record["collectives"][key] = {"points": len(pts), "fitted": False,
                                          "why": "one message size: latency and bandwidth cannot be told apart"}
            continue
        b_bytes = np.array([p[0] for p in pts])
        t_s = np.array([p[1] for p in pts])
        # Relative residuals: divide each row by its time so small messages count as much as large.
        coef, _ = nnls(np.stack([np.ones_like(b_bytes), b_bytes], axis=1) / t_s[:, None], np.ones_like(t_s))
        lat, inv_bw = float(coef[0]), float(coef[1])
        if inv_bw <= 0:
            record["collectives"][key] = {"points": len(pts), "fitted": False,
                                          "why": "no growth of time with size in the data"}
            continue
        pred = collective_time_s(b_bytes, lat, 1.0 / inv_bw)
        fitted[key] = {"latency_s": float(f"{lat:.4g}"), "bus_bandwidth_bytes_per_s": float(f"{1 / inv_bw:.4g}")}
        record["collectives"][key] = {
            "points": len(pts), "fitted": True, "bus_bytes_range": [float(b_bytes.min()), float(b_bytes.max())],
            "fit_mape_pct": round(float(np.mean(np.abs(pred - t_s) / t_s) * 100), 2)}
    if not fitted:
        why = "; ".join(f"{k}: {v['why']}" for k, v in record["collectives"].items()) or \
            "no collective of known message size ran without compute beside it"
        raise OvsimError(f"no collective could be fitted ({why})", field="collectives")
    return {"nccl_fitted": fitted}, record


def fit_node_sweep(points: Sequence[tuple[float, float]],
                   plan_of: Callable[[float], nccl.CollectivePlan]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A GPU's collective costs on one node from a published sweep of (size in bytes, bus bandwidth
    in GB/s), against NCCL's own model (``plan_of``: the size's plan, uncalibrated): per ring
    protocol ``nccl_ring_added_latency_s`` and ``nccl_ring_bus_efficiency``, for NVLS
    ``nccl_nvls_added_latency_s`` and ``nccl_nvls_bus_efficiency``, and the communicator size they
    hold for (``nccl_node_ranks``). Each (algorithm, protocol) is fitted on the sizes NCCL's model
    gives it: time = model latency + added latency + bus bytes / (model bus bandwidth x efficiency),
    non-negative least squares of relative residuals; an efficiency above 1 is held at 1."""
    groups: dict[tuple[str, str], list[tuple[float, float, nccl.CollectivePlan]]] = {}
    ranks: set[int] = set()
    for size, busbw_gb_s in points:
        if not (size > 0 and busbw_gb_s > 0):
            raise OvsimError(f"a sweep's sizes and bus bandwidths must be positive, got {size:g} B at "
                             f"{busbw_gb_s:g} GB/s", field="sweep")
        plan = plan_of(size)
        if plan.algorithm not in ("ring", "nvls") or plan.n_nodes > 1:
            continue
        ranks.add(plan.n_ranks)
        measured_s = plan.bus_bytes / (busbw_gb_s * 1e9)
        groups.setdefault((plan.algorithm, plan.protocol), []).append((size, measured_s, plan))
    values: dict[str, Any] = {}
    record: dict[str, Any] = {"method": "non-negative least squares of relative residuals: t - model latency = "
                                        "added latency + bus bytes / model bus bandwidth / efficiency, per "
                                        "algorithm and protocol over the sizes NCCL's model gives it", "groups": {}}
    for (algo, proto), rows in sorted(groups.items()):
        key = f"{algo}/{proto}"
        if len(rows) < 2:
            record["groups"][key] = {"points": len(rows), "fitted": False, "why": "fewer than two sizes"}
            continue
        t = np.array([r[1] for r in rows])
        ideal = np.array([p.bus_bytes / p.bus_bandwidth_bytes_per_s for _, _, p in rows])
        latency = np.array([p.latency_s for _, _, p in rows])
        coef, _ = nnls(np.stack([np.ones_like(t), ideal], axis=1) / t[:, None], (t - latency) / t)
        extra, inv_eff = float(coef[0]), float(coef[1])
        eff = 1.0 / inv_eff if inv_eff > 0 else math.inf
        if eff > 1.0:
            # Faster than NCCL's bandwidth is not a cost: hold it and refit the latency alone.
            eff = 1.0
            extra = max(0.0, float(np.sum((t - latency - ideal) / t**2) / np.sum(1.0 / t**2)))
        pred = latency + extra + ideal / eff
        added, efficiency = float(f"{extra:.4g}"), float(f"{eff:.4g}")
        if algo == "ring":
            values.setdefault("nccl_ring_added_latency_s", {})[proto] = added
            values.setdefault("nccl_ring_bus_efficiency", {})[proto] = efficiency
        else:
            values["nccl_nvls_added_latency_s"] = added
            values["nccl_nvls_bus_efficiency"] = efficiency
        record["groups"][key] = {
            "points": len(rows), "fitted": True, "sizes": [float(rows[0][0]), float(rows[-1][0])],
            "fit_mape_pct": round(float(np.mean(np.abs(pred - t) / t) * 100), 2),
            "model_mape_pct": round(float(np.mean(np.abs(latency + ideal - t) / t) * 100), 2)}
    if not values:
        raise OvsimError("no algorithm of the sweep has two sizes on a ring or NVLS within one node", field="sweep")
    if len(ranks) != 1:
        raise OvsimError(f"a sweep is of one communicator size, got {sorted(ranks)}", field="sweep")
    values["nccl_node_ranks"] = ranks.pop()
    return values, record
