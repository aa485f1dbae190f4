"""Figures of tables: a comparison of scenarios, a sweep, the validation suite and a calibration
(``--plot FILE`` on ``compare``, ``sweep``, ``validate`` and ``calibrate``; in a notebook each
function returns a matplotlib ``Figure``). Drawn as :mod:`ovsim.plot`'s timelines are.

- :func:`compare_figure`: each scenario's time split into compute alone, compute slowdown,
  exposed communication and idle time; power and energy when tracked.
- :func:`sweep_figure`: the sweep's figures against its axes.
- :func:`validate_figure`: each check's error against its tolerance, pass or fail.
- :func:`calibration_figure`: for each quantity ``ovsim calibrate`` fitted, every point it used,
  measured against what the written parameters predict, with the prediction before the fit where
  the fit has one.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ovsim.errors import OvsimError
from ovsim.plot import KIND_COLORS, REASON_COLORS, new_figure, time_unit

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ovsim.validate import Check


def compare_figure(df: pd.DataFrame, *, title: str = "") -> Figure:
    """One bar per scenario of :func:`ovsim.api.compare`'s table: compute alone, the compute
    slowdown, exposed communication and idle time per rank, stacked to the makespan; beside it,
    average and peak power and the energy when the predictions tracked power."""
    if df.empty:
        raise OvsimError("no scenarios to draw", field="scenarios")
    names = [str(n) for n in df["scenario"]]
    x = np.arange(len(df))
    makespan = df["makespan_s"].to_numpy(float)
    scale, unit = time_unit(float(np.nanmax(makespan)) if len(makespan) else 0.0)
    compute = df["compute_s"].to_numpy(float)
    # Compute that ran faster than "alone" (which is at the calibration clock; a run at a higher
    # clock beats it) is drawn as it ran, with no slowdown: the stack must add up to the makespan.
    alone = np.minimum(df["compute_isolated_s"].to_numpy(float), compute)
    slowdown = compute - alone
    exposed = df["exposed_comm_s"].to_numpy(float)
    idle = np.clip(makespan - compute - exposed, 0.0, None)
    power = "avg_power_w" in df.columns and bool(df["avg_power_w"].notna().any())
    fig = new_figure(figsize=(max(7.0, 1.4 * len(df) + 3) * (2 if power else 1), 4.8), layout="constrained")
    axes = fig.subplots(1, 2 if power else 1, squeeze=False)[0]
    ax = axes[0]
    bottom = np.zeros(len(df))
    for part, label, color in ((alone, "compute alone", KIND_COLORS["gemm"]),
                               (slowdown, "compute slowdown", REASON_COLORS["waiting for SMs"]),
                               (exposed, "exposed communication", KIND_COLORS["collective"]),
                               (idle, "idle / other", "#c7c7c7")):
        ax.bar(x, part * scale, bottom=bottom * scale, color=color, label=label, width=0.6)
        bottom = bottom + part
    # One number of decimals for every bar (4 significant digits on the longest, at least 2 on the
    # shortest), and room above the highest stack for its label: compute on several streams at
    # once stacks above the makespan.
    shown = makespan[np.isfinite(makespan) & (makespan > 0)] * scale
    decimals = 0
    if shown.size:
        decimals = max(0, 3 - math.floor(math.log10(float(shown.max()))),
                       min(6, 1 - math.floor(math.log10(float(shown.min())))))
    for xi, m in zip(x, makespan, strict=True):
        ax.annotate(f"{m * scale:.{decimals}f}", (xi, m * scale), ha="center", va="bottom", fontsize="small")
    highest = np.fmax(bottom, makespan) * scale
    if np.isfinite(highest).any() and np.nanmax(highest) > 0:
        ax.set_ylim(0, float(np.nanmax(highest)) * 1.1)
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel(f"per rank ({unit})")
    ax.set_title("makespan", loc="left")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    if power:
        _power_panel(axes[1], df, x, names)
    if title:
        fig.suptitle(title, x=0.01, ha="left")
    return fig


def _power_panel(pax: Axes, df: pd.DataFrame, x: np.ndarray, names: list[str]) -> None:
    """compare_figure's second panel: average and peak power per GPU, energy above the bars."""
    w = 0.35
    pax.bar(x - w / 2, df["avg_power_w"].to_numpy(float), width=w, label="average", color="#9467bd")
    # The board's figure (highest 100 ms average), not the engine's instantaneous peak, which can
    # sit far above the power limit within a control window.
    peak = df["peak_100ms_power_w"].to_numpy(float)
    pax.bar(x + w / 2, peak, width=w, label="peak (100 ms)", color="#c5b0d5")
    pax.set_xticks(x, names, rotation=20, ha="right")
    pax.set_ylabel("W per GPU")
    pax.set_title("power per GPU (energy per iteration, all GPUs, above the bars)", loc="left")
    for xi, e, p in zip(x, df["energy_j"].to_numpy(float), peak, strict=True):
        if math.isfinite(e):
            pax.annotate(f"{e:,.0f} J" if e >= 100 else f"{e:.3g} J", (xi, p), ha="center", va="bottom",
                         fontsize="small")
    # Room above the bars for their labels and, above those, the legend.
    if np.isfinite(peak).any() and np.nanmax(peak) > 0:
        pax.set_ylim(0, float(np.nanmax(peak)) * 1.25)
    pax.legend(fontsize="small", loc="upper right", ncol=2)
    pax.grid(axis="y", alpha=0.3)


def validate_figure(checks: Sequence[Check], *, title: str = "") -> Figure:
    """Each check's error (predicted against reference, %) as a bar, green when it passes and red
    when it fails, with its tolerance as a grey band; a range or band check shows its allowed interval."""
    if not checks:
        raise OvsimError("no checks to draw", field="checks")
    fig = new_figure(figsize=(11, 0.42 * len(checks) + 1.4), layout="constrained")
    ax = fig.subplots()
    y = np.arange(len(checks))
    # The axis spans the errors and the bounded bands; "at most the reference" is unbounded below
    # and would squeeze everything else against the right edge.
    seen = [0.0]
    for i, c in enumerate(checks):
        err = c.error_pct
        if c.rule == "within":
            ax.barh(i, 2 * c.tolerance_pct, left=-c.tolerance_pct, height=0.8, color="#e5e5e5")
            seen += [-c.tolerance_pct, c.tolerance_pct]
        elif c.rule == "range" and c.reference:
            lo = (c.low - c.reference) / c.reference * 100
            ax.barh(i, -lo, left=lo, height=0.8, color="#e5e5e5")
            seen.append(lo)
        elif c.rule == "band" and c.reference:
            lo, hi = ((b - c.reference) / c.reference * 100 for b in (c.low, c.high))
            ax.barh(i, hi - lo, left=lo, height=0.8, color="#e5e5e5")
            seen += [lo, hi]
        elif c.rule == "at_most":
            ax.barh(i, -1e4, left=0.0, height=0.8, color="#e5e5e5")
        if math.isfinite(err):
            seen.append(err)
            ax.barh(i, err, height=0.5, color="#2ca02c" if c.passed else "#d62728")
        else:
            ax.annotate("no value", (0, i), va="center", fontsize="small", color="#d62728")
    ax.axvline(0, color="black", linewidth=0.8)
    pad = 0.05 * (max(seen) - min(seen)) or 1.0
    ax.set_xlim(min(seen) - pad, max(seen) + pad)
    # Names whole, wrapped: two checks cut at the same length could not be told apart.
    ax.set_yticks(y, [textwrap.fill(c.name, 60) for c in checks], fontsize="small")
    ax.set_ylim(len(checks) - 0.5, -0.5)
    ax.set_xlabel("error against the reference (%); grey: allowed")
    passed = sum(c.passed for c in checks)
    ax.set_title(title or f"validation: {passed} of {len(checks)} checks pass", loc="left")
    ax.grid(axis="x", alpha=0.3)
    return fig


_MAX_SWEEP_LINES = 12
# (column, title, scale, unit) of the sweep panels; energy only when the predictions tracked power.
_SWEEP_PANELS: tuple[tuple[str, str, float, str], ...] = (
    ("makespan_s", "makespan", 1e3, "ms"),
    # Split where the table has the clock's part (ovsim.sweep's does): contention at the same
    # clock, and what a lower clock cost; the total for a table without it.
    ("compute_contention_slowdown", "compute slowdown by contention (same clock)", 100.0, "%"),
    ("compute_clock_slowdown", "compute slowdown by the clock", 100.0, "%"),
    ("compute_slowdown", "compute slowdown (vs alone)", 100.0, "%"),
    ("exposed_comm_s", "exposed communication", 1e3, "ms per rank"),
    ("energy_j", "energy per iteration", 1.0, "J, all GPUs"),
)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float | np.integer | np.floating) and not isinstance(x, bool | np.bool_)


def sweep_figure(df: pd.DataFrame, axes: Sequence[str], *, title: str = "") -> Figure:
    """:func:`ovsim.sweep.sweep`'s table against its first axis (a number line when every value is
    a number, else one position per value), one line per combination of the other axes."""
    if df.empty or not axes:
        raise OvsimError("no sweep points to draw", field="points")
    missing = [a for a in axes if a not in df.columns]
    if missing:
        raise OvsimError(f"not a column of the sweep: {', '.join(missing)}", field="axes")
    x_axis, others = axes[0], list(axes[1:])
    xs = list(dict.fromkeys(df[x_axis].tolist()))
    numeric = all(_is_number(v) for v in xs)
    groups = list(df.groupby(others, sort=False, dropna=False)) if others else [((), df)]
    if {"compute_slowdown", "compute_clock_slowdown"} <= set(df.columns):
        df = df.assign(compute_contention_slowdown=df["compute_slowdown"] - df["compute_clock_slowdown"])
        df = df.drop(columns="compute_slowdown")
        groups = list(df.groupby(others, sort=False, dropna=False)) if others else [((), df)]
    panels = [p for p in _SWEEP_PANELS if p[0] in df.columns and df[p[0]].notna().any()]
    fig = new_figure(figsize=(6 * len(panels) / 2 + 4, 4.2), layout="constrained")
    axs = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (col, name, factor, unit) in zip(axs, panels, strict=True):
        for key, g in groups[:_MAX_SWEEP_LINES]:
            pos = g[x_axis].tolist() if numeric else [xs.index(v) for v in g[x_axis]]
            keys = key if isinstance(key, tuple) else (key,)
            label = ", ".join(f"{a}={v}" for a, v in zip(others, keys, strict=True)) or None
            ax.plot(pos, g[col].to_numpy(float) * factor, marker="o", markersize=4, label=label)
        if not numeric:
            ax.set_xticks(range(len(xs)), [str(v) for v in xs], rotation=20, ha="right")
        ax.set_xlabel(x_axis)
        ax.set_ylabel(unit)
        # Zero in view: a fitted axis makes a 1% change look like a 100% one.
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, 0.0), max(hi, 0.0))
        # Wrapped: a panel is 3-4 inches wide, and a long title runs into the next panel's.
        ax.set_title(textwrap.fill(name, 26), loc="left")
        ax.grid(alpha=0.3)
    if others:
        more = f" (first {_MAX_SWEEP_LINES} of {len(groups)})" if len(groups) > _MAX_SWEEP_LINES else ""
        axs[-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False,
                       title=f"lines{more}")
    if title:
        fig.suptitle(title, x=0.01, ha="left")
    return fig


_MAX_POINT_GROUPS = 8
# How each fit's reference prediction is named (calibrate's POINT_COLUMNS "baseline").
_BASELINE_LABELS = {"contention": "naive (isolated time)", "power": "before the fit"}


def calibration_figure(points: pd.DataFrame, *, title: str = "") -> Figure:
    """One panel per fitted quantity of :attr:`ovsim.calibrate.FitReport.points`: each point's
    measured value against the value the written parameters give (log axes for times, µs; linear
    for watts), coloured by group, on the line of equality with a ±10% band; grey rings are the
    prediction the fit is judged against, where it has one. Each panel's title gives the fit
    error (on the points fitted: not a prediction error)."""
    need = {"quantity", "group", "unit", "measured", "fitted", "baseline"}
    if points is None or points.empty or not need <= set(points.columns):
        raise OvsimError("no fitted points to draw", field="points")
    quantities = list(dict.fromkeys(points["quantity"]))
    cols = min(3, len(quantities))
    rows = -(-len(quantities) // cols)
    fig = new_figure(figsize=(4.6 * cols, 4.2 * rows + 0.4), layout="constrained")
    axs = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax in axs[len(quantities):]:
        ax.set_visible(False)
    for ax, q in zip(axs, quantities, strict=False):
        d = points[points["quantity"] == q]
        watts = bool((d["unit"] == "W").all())
        scale, unit = (1.0, "W") if watts else (1e6, "µs")
        meas = d["measured"].to_numpy(float) * scale
        fit = d["fitted"].to_numpy(float) * scale
        base = d["baseline"].to_numpy(float) * scale
        has_base = np.isfinite(base)
        if has_base.any():
            ax.scatter(meas[has_base], base[has_base], s=18, facecolors="none", edgecolors="#b0b0b0",
                       linewidths=0.8, label=_BASELINE_LABELS.get(q, "before"), zorder=1)
        groups = d["group"].value_counts().index.tolist()
        shown, rest = groups[:_MAX_POINT_GROUPS], groups[_MAX_POINT_GROUPS:]
        for i, g in enumerate(shown + (["other"] if rest else [])):
            sel = (d["group"].isin(rest) if g == "other" else d["group"] == g).to_numpy()
            ax.scatter(meas[sel], fit[sel], s=12, color=f"C{i % 10}", label=f"{g[:40]} ({int(sel.sum())})", zorder=2)
        both = np.concatenate([meas, fit, base[has_base]])
        both = both[np.isfinite(both) & ((both > 0) | watts)]
        lo, hi = float(both.min()), float(both.max())
        if not watts:
            from matplotlib.ticker import FuncFormatter, NullFormatter

            lo, hi = lo / 1.5, hi * 1.5
            plain = FuncFormatter(lambda v, _: f"{v:g}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                # Plain numbers; the minor ticks labelled only within about a decade, where a log
                # axis has few major ticks (and would write them as 2x10^0).
                axis.set_major_formatter(plain)
                axis.set_minor_formatter(plain if hi / lo < 20 else NullFormatter())
        else:
            pad = 0.05 * (hi - lo) or 1.0
            lo, hi = lo - pad, hi + pad
        line = np.array([lo, hi])
        ax.plot(line, line, color="black", linewidth=0.8, zorder=0)
        ax.fill_between(line, line * 0.9, line * 1.1, color="#e5e5e5", zorder=0, label="±10%")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured ({unit})")
        ax.set_ylabel(f"fitted ({unit})")
        ok = meas != 0
        err = float(np.mean(np.abs(fit[ok] - meas[ok]) / np.abs(meas[ok])) * 100) if ok.any() else math.nan
        head = f"{q}: {len(d)} points, fit error {err:.1f}%"
        if has_base.any():
            okb = ok & has_base
            berr = float(np.mean(np.abs(base[okb] - meas[okb]) / np.abs(meas[okb])) * 100)
            head += f"\n{_BASELINE_LABELS.get(q, 'before')}: {berr:.1f}%"
        ax.set_title(head, loc="left", fontsize="medium")
        ax.legend(fontsize="x-small", loc="upper left")
        ax.grid(alpha=0.3)
    fig.suptitle(title or "calibration: fitted against measured (fit error, on the points fitted)",
                 x=0.01, ha="left")
    return fig
