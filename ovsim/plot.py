"""Figures of a prediction, a replay, a comparison, a calibration and the validation suite.

What a person would rather look at than read (``--plot FILE`` on ``predict``, ``replay``,
``compare``, ``calibrate``, ``validate`` and ``sweep``; in a notebook each function returns a
matplotlib ``Figure``):

- :func:`timeline_figure`: one lane per rank and stream, each op coloured by kind; the part of an
  op's duration beyond its isolated time is hatched in the colour of what slowed it. Below, the
  resource counters the engine recorded (SM occupancy, HBM and link traffic, power and clock).
- :func:`replay_figure`: measured against predicted duration for the scored overlapped kernels
  (with the naive prediction beside them), and measured and predicted lanes of the first ranks
  under the exposed communication and hidden share, measured and predicted.
- :func:`compare_figure`: each scenario's time split into compute alone, compute slowdown,
  exposed communication and idle time; power and energy when tracked.
- :func:`validate_figure`: each check's error against its tolerance, pass or fail.
- :func:`calibration_figure`: for each quantity ``ovsim calibrate`` fitted, every point it used,
  measured against what the written parameters predict, with the prediction before the fit where
  the fit has one.

matplotlib is an optional dependency (``pip install 'ovsim[plot]'``); it is imported only here, and
figures are made without pyplot so that nothing depends on a display or on global state.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ovsim.engine.timeline import Timeline
from ovsim.errors import OvsimError
from ovsim.files import atomic_output

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ovsim.replay import ReplayResult
    from ovsim.validate import Check

# Colours by what an op is (matplotlib's tab10, colour-blind friendly enough to tell five apart).
KIND_COLORS = {
    "gemm": "#1f77b4", "attention": "#17becf",
    "elementwise": "#2ca02c", "norm": "#2ca02c", "softmax": "#2ca02c",
    "collective": "#ff7f0e", "transfer": "#ff7f0e",
    "copy": "#9467bd", "memset": "#9467bd",
    "generic": "#7f7f7f", "other": "#7f7f7f",
}
KIND_LABELS = {"#1f77b4": "GEMM", "#17becf": "attention", "#2ca02c": "memory-bound", "#ff7f0e": "communication",
               "#9467bd": "copy / memset", "#7f7f7f": "other"}
# What slowed an op (timeline.REASONS' labels), drawn as a hatch over the time it lost.
REASON_COLORS = {
    "waiting for SMs": "#d62728", "sharing SMs": "#e377c2", "sharing HBM": "#8c564b",
    "sharing links": "#bcbd22", "waiting for peers": "#7f7f7f", "lowered clock": "#17becf",
}
# Kinds drawn nowhere: a flow is the collective's data movement across ranks, already shown by
# the collective kernels on each rank; a delay is idle time by definition.
_HIDDEN_KINDS = ("flow", "delay")
_MAX_LANES = 48


_NO_MATPLOTLIB = "drawing needs matplotlib: pip install -e \".[plot]\" in a checkout, or pip install 'ovsim[plot]'"


def _figure(**kwargs: Any) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise OvsimError(_NO_MATPLOTLIB, field="plot") from None
    return Figure(**kwargs)


def check_path(path: str | Path) -> None:
    """Refuse a file format matplotlib cannot write, or a missing matplotlib, before any work."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise OvsimError(_NO_MATPLOTLIB, source=str(path), field="plot") from None
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in formats:
        raise OvsimError(f"cannot tell the image format from the name; end it in one of "
                         f"{', '.join('.' + f for f in sorted(formats))}", source=str(path), field="plot")


def save(fig: Figure, path: str | Path) -> None:
    """Write ``fig`` to ``path``, the format from its suffix (.png, .pdf, .svg, ...)."""
    check_path(path)
    try:
        with atomic_output(path) as tmp:
            fig.savefig(tmp, dpi=120, bbox_inches="tight")
    except OSError as e:
        raise OvsimError(f"cannot write: {e.strerror or e}", source=str(path), field="plot") from None


def _time_unit(span_s: float) -> tuple[float, str]:
    """A scale and unit that puts ``span_s`` between about 1 and 1000 on the axis."""
    for scale, unit in ((1e6, "us"), (1e3, "ms")):
        if span_s * scale < 1e4:
            return scale, unit
    return 1.0, "s"


def _lane_order(ops: pd.DataFrame, max_ranks: int) -> tuple[list[tuple[int, str]], list[int]]:
    """Lanes (rank, stream) for the first ``max_ranks`` ranks, streams in order of first use."""
    ranks = sorted(int(r) for r in ops["rank"].unique())
    shown = ranks[:max_ranks]
    lanes: list[tuple[int, str]] = []
    for r in shown:
        g = ops[ops["rank"] == r].sort_values("start_s", kind="stable")
        lanes += [(r, str(s)) for s in dict.fromkeys(g["stream"].astype(str))]
    return lanes[:_MAX_LANES], ranks


def _bars(ax: Axes, y: float, height: float, starts: np.ndarray, widths: np.ndarray, color: str,
          **kwargs: Any) -> None:
    if len(starts):
        spans = list(zip(starts.tolist(), widths.tolist(), strict=True))
        ax.broken_barh(spans, (y - height / 2, height), facecolors=color, linewidth=0, **kwargs)


def _draw_lanes(ax: Axes, lanes: list[tuple[Any, str, pd.DataFrame]], scale: float, *,
                lost: bool) -> tuple[set[str], set[str]]:
    """One horizontal lane per entry (label, stream, ops with start_s, duration_s, kind and, when
    ``lost``, isolated_s and slowed_by). Returns the kind colours and reasons drawn."""
    kinds: set[str] = set()
    reasons: set[str] = set()
    for i, (_, _, ops) in enumerate(lanes):
        start = ops["start_s"].to_numpy(float) * scale
        dur = ops["duration_s"].to_numpy(float) * scale
        color = ops["kind"].map(KIND_COLORS).fillna(KIND_COLORS["other"]).to_numpy(str)
        for c in np.unique(color):
            m = color == c
            _bars(ax, i, 0.8, start[m], dur[m], str(c))
            kinds.add(str(c))
        if not lost:
            continue
        slowed = ops["slowed_by"].astype(str).to_numpy(str)
        gone = np.clip(dur - ops["isolated_s"].to_numpy(float) * scale, 0.0, None)
        for reason in np.unique(slowed[slowed != ""]):
            m = (slowed == reason) & (gone > 0)
            rc = REASON_COLORS.get(str(reason), "#000000")
            # The lost time is drawn at the op's end: where in the op it was lost is not recorded,
            # how much is.
            _bars(ax, i, 0.8, start[m] + dur[m] - gone[m], gone[m], "none", edgecolor=rc, hatch="////")
            reasons.add(str(reason))
    ax.set_yticks(range(len(lanes)), [str(label) for label, _, _ in lanes])
    ax.set_ylim(max(len(lanes), 1) - 0.5, -0.5)
    ax.grid(axis="x", alpha=0.3)
    return kinds, reasons


def _legend(ax: Axes, kinds: set[str], reasons: set[str]) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, label=KIND_LABELS[c]) for c in KIND_LABELS if c in kinds]
    handles += [Patch(facecolor="white", edgecolor=REASON_COLORS.get(r, "#000000"), hatch="////",
                      label=f"slowed: {r}") for r in REASON_COLORS if r in reasons]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)


def _steps(counters: pd.DataFrame, name: str, rank: int, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    """A piecewise-constant counter as step points; of samples at one instant the last holds."""
    c = counters[(counters["counter"] == name) & (counters["rank"] == rank)]
    c = c.drop_duplicates("time_s", keep="last").sort_values("time_s", kind="stable")
    t = c["time_s"].to_numpy(float)
    v = c["value"].to_numpy(float)
    if len(t) and t[-1] < end_s:
        t, v = np.append(t, end_s), np.append(v, v[-1])
    return t, v


# Counter panels: (title, y label, [(counter, scale)]); the first counter of a panel that the
# timeline has decides whether the panel is drawn.
_COUNTER_PANELS: tuple[tuple[str, str, tuple[tuple[str, float], ...]], ...] = (
    ("SMs holding blocks", "fraction", (("sm_busy_fraction", 1.0),)),
    ("HBM traffic", "GB/s", (("hbm_bytes_per_s", 1e-9),)),
    ("link traffic out", "GB/s", (("link_out_bytes_per_s", 1e-9),)),
    ("board power", "W", (("power_w", 1.0),)),
    ("SM clock", "MHz", (("sm_clock_hz", 1e-6),)),
)


def _ranks_label(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def timeline_figure(timeline: Timeline, *, title: str = "", max_ranks: int = 4) -> Figure:
    """Lanes of every stream of the first ``max_ranks`` ranks, slowed time hatched by reason, and
    the recorded resource counters below (one line per shown rank)."""
    if max_ranks < 1:
        raise OvsimError(f"must be at least 1, got {max_ranks}", field="max_ranks")
    ops = timeline.ops[~timeline.ops["kind"].isin(_HIDDEN_KINDS) & (timeline.ops["rank"] >= 0)]
    lane_keys, ranks = _lane_order(ops, max_ranks)
    end_s = max(timeline.makespan_s, float(ops["end_s"].max()) if len(ops) else 0.0)
    scale, unit = _time_unit(end_s)
    counters = timeline.counters
    shown = sorted({r for r, _ in lane_keys})
    panels = [p for p in _COUNTER_PANELS
              if len(counters) and counters["counter"].isin([c for c, _ in p[2]]).any()]
    heights = [max(1.5, 0.32 * len(lane_keys) + 0.6)] + [1.1] * len(panels)
    fig = _figure(figsize=(12, sum(heights) + 0.9), layout="constrained")
    axes = fig.subplots(1 + len(panels), 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": heights})[:, 0]
    lanes = [(f"r{r} {s}", s, ops[(ops["rank"] == r) & (ops["stream"].astype(str) == s)]) for r, s in lane_keys]
    kinds, reasons = _draw_lanes(axes[0], lanes, scale, lost=True)
    _legend(axes[0], kinds, reasons)
    more = f" ({_ranks_label(shown)} of {len(ranks)})" if len(shown) < len(ranks) else ""
    axes[0].set_title((title or "predicted timeline") + more, loc="left")
    for ax, (name, ylabel, series) in zip(axes[1:], panels, strict=True):
        for counter, factor in series:
            # Ranks doing the same work have the same counters: one line for all of them, so that
            # no rank's line hides behind another's.
            lines: dict[tuple[bytes, bytes], tuple[np.ndarray, np.ndarray, list[int]]] = {}
            for r in shown:
                t, v = _steps(counters, counter, r, end_s)
                if len(t):
                    lines.setdefault((t.tobytes(), v.tobytes()), (t, v, []))[2].append(r)
            for t, v, rs in lines.values():
                ax.plot(t * scale, v * factor, drawstyle="steps-post", linewidth=1.0,
                        label=_ranks_label(rs) if len(shown) > 1 else None)
        ax.set_ylabel(ylabel)
        ax.set_title(name, loc="left", fontsize="small")
        ax.grid(alpha=0.3)
        if name == "SMs holding blocks":
            ax.set_ylim(0, 1.05)
        else:
            # From zero: an axis fitted to the data makes a 1% dip in clock or power look like a fall;
            # headroom above, so that a line at its maximum does not hide in the frame.
            top = float(ax.dataLim.y1) if np.isfinite(ax.dataLim.y1) else 0.0
            ax.set_ylim(0, top * 1.08 if top > 0 else 1.0)
        if len(shown) > 1:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    axes[-1].set_xlabel(f"time ({unit})")
    start_s = min(0.0, float(ops["start_s"].min())) if len(ops) else 0.0
    axes[-1].set_xlim(start_s * scale, end_s * scale if end_s > start_s else 1.0)
    return fig


def leaders_figure(timelines: Sequence[tuple[str, Timeline]], *, title: str = "") -> Figure:
    """The first rank's streams under each schedule (``ovsim tune --plot``), one panel each on one
    time axis, slowed time hatched by reason."""
    if not timelines:
        raise OvsimError("no schedules to draw", field="timelines")
    panels = []
    for label, tl in timelines:
        ops = tl.ops[~tl.ops["kind"].isin(_HIDDEN_KINDS) & (tl.ops["rank"] >= 0)]
        lane_keys, _ = _lane_order(ops, 1)
        panels.append((label, [(f"r{r} {st}", st, ops[(ops["rank"] == r) & (ops["stream"].astype(str) == st)])
                               for r, st in lane_keys], tl.makespan_s))
    scale, unit = _time_unit(max(end for _, _, end in panels))
    heights = [max(1.0, 0.32 * len(lanes) + 0.5) for _, lanes, _ in panels]
    fig = _figure(figsize=(12, sum(heights) + 0.9), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    kinds: set[str] = set()
    reasons: set[str] = set()
    for ax, (label, lanes, end) in zip(axes, panels, strict=True):
        k, r = _draw_lanes(ax, lanes, scale, lost=True)
        kinds |= k
        reasons |= r
        ax.set_title(f"{label}: {end * scale:.4g} {unit}", loc="left", fontsize="small")
    _legend(axes[0], kinds, reasons)
    if title:
        fig.suptitle(title, x=0.01, ha="left")
    axes[-1].set_xlabel(f"time ({unit})")
    return fig


def _pct(x: float) -> str:
    return f"{x:.1f}%" if math.isfinite(x) else "-"


def _comm_line(s: dict[str, Any]) -> str:
    """A replay summary's exposed communication (ms, all ranks) and hidden share, measured and predicted."""
    return (f"exposed comm, all ranks: measured {s['exposed_comm_measured_s'] * 1e3:.3f} ms, predicted "
            f"{s['exposed_comm_predicted_s'] * 1e3:.3f} ms; hidden under compute: measured "
            f"{_pct(s['hidden_pct_measured'])}, predicted {_pct(s['hidden_pct_predicted'])}")


def replay_figure(result: ReplayResult, *, title: str = "", max_ranks: int = 2) -> Figure:
    """Left: measured against predicted duration of every scored overlapped kernel, and against
    the naive prediction (its isolated duration); points on the diagonal are exact. Right: the
    measured and predicted lanes of the first ``max_ranks`` ranks, one above the other, titled
    with the exposed communication and its hidden share, measured and predicted."""
    if max_ranks < 1:
        raise OvsimError(f"must be at least 1, got {max_ranks}", field="max_ranks")
    k = result.kernels
    s = result.summary
    fig = _figure(figsize=(15, 6), layout="constrained")
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})
    scored = k[k["overlapped"] & (k["isolated_source"] == "signature")]
    meas = scored["measured_duration_s"].to_numpy(float) * 1e6
    for col, label, style in (("isolated_s", f"naive (alone): MAPE {_pct(s['naive_mape_pct'])}, weighted "
                                             f"{_pct(s['naive_weighted_error_pct'])}", "x"),
                              ("predicted_duration_s", f"ovsim: MAPE {_pct(s['mape_pct'])}, weighted "
                                                       f"{_pct(s['weighted_error_pct'])}", "o")):
        left.scatter(meas, scored[col].to_numpy(float) * 1e6, s=14, marker=style, alpha=0.6, label=label)
    if len(meas):
        lo = float(np.nanmin(meas)) / 2
        hi = float(np.nanmax(meas)) * 2
        left.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
        left.set_xscale("log")
        left.set_yscale("log")
    left.set_xlabel("measured duration (us)")
    left.set_ylabel("predicted duration (us)")
    left.set_title(f"{len(meas)} scored overlapped kernels", loc="left")
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize="small")

    ranks = sorted(int(r) for r in k["rank"].unique())
    shown = ranks[:max_ranks]
    t0 = float(min(k["measured_start_s"].min(), k["predicted_start_s"].min())) if len(k) else 0.0
    lanes: list[tuple[Any, str, pd.DataFrame]] = []
    for r in shown:
        kr = k[k["rank"] == r]
        for stream in dict.fromkeys(kr.sort_values("measured_start_s", kind="stable")["stream"].astype(str)):
            ks = kr[kr["stream"].astype(str) == stream]
            for which in ("measured", "predicted"):
                lane = pd.DataFrame({"start_s": ks[f"{which}_start_s"].to_numpy(float) - t0,
                                     "duration_s": ks[f"{which}_duration_s"].to_numpy(float),
                                     "kind": ks["kind"].to_numpy(str)})
                lanes.append((f"r{r} s{stream} {which}", stream, lane.dropna()))
    lanes = lanes[:_MAX_LANES]
    end = max((float((ln["start_s"] + ln["duration_s"]).max()) for _, _, ln in lanes if len(ln)), default=0.0)
    scale, unit = _time_unit(end)
    kinds, _ = _draw_lanes(right, lanes, scale, lost=False)
    _legend(right, kinds, set())
    more = f" ({_ranks_label(shown)} of {len(ranks)})" if len(shown) < len(ranks) else ""
    right.set_title(f"measured and predicted{more}; span error {s['span_error_pct']:+.1f}%\n{_comm_line(s)}",
                    loc="left")
    right.set_xlabel(f"time from the first kernel ({unit})")
    right.set_xlim(0, end * scale if end > 0 else 1.0)
    fig.suptitle(title or f"replay on {s['gpu']}", x=0.01, ha="left")
    return fig


def compare_figure(df: pd.DataFrame, *, title: str = "") -> Figure:
    """One bar per scenario of :func:`ovsim.api.compare`'s table: compute alone, the compute
    slowdown, exposed communication and idle time per rank, stacked to the makespan; beside it,
    average and peak power and the energy when the predictions tracked power."""
    if df.empty:
        raise OvsimError("no scenarios to draw", field="scenarios")
    names = [str(n) for n in df["scenario"]]
    x = np.arange(len(df))
    makespan = df["makespan_s"].to_numpy(float)
    scale, unit = _time_unit(float(np.nanmax(makespan)) if len(makespan) else 0.0)
    compute = df["compute_s"].to_numpy(float)
    # Compute that ran faster than "alone" (which is at the calibration clock; a run at a higher
    # clock beats it) is drawn as it ran, with no slowdown: the stack must add up to the makespan.
    alone = np.minimum(df["compute_isolated_s"].to_numpy(float), compute)
    slowdown = compute - alone
    exposed = df["exposed_comm_s"].to_numpy(float)
    idle = np.clip(makespan - compute - exposed, 0.0, None)
    power = "avg_power_w" in df.columns and bool(df["avg_power_w"].notna().any())
    fig = _figure(figsize=(max(7.0, 1.4 * len(df) + 3) * (2 if power else 1), 4.8), layout="constrained")
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
    fig = _figure(figsize=(11, 0.42 * len(checks) + 1.4), layout="constrained")
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
    fig = _figure(figsize=(6 * len(panels) / 2 + 4, 4.2), layout="constrained")
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
        ax.set_title(name, loc="left")
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
    fig = _figure(figsize=(4.6 * cols, 4.2 * rows + 0.4), layout="constrained")
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
