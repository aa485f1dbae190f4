"""Figures of a prediction's and a replay's timelines, and what every figure is drawn with.

What a person would rather look at than read (``--plot FILE`` on ``predict``, ``replay``,
``compare``, ``calibrate``, ``validate`` and ``sweep``; in a notebook each function returns a
matplotlib ``Figure``):

- :func:`timeline_figure`: one lane per rank and stream, each op coloured by kind; the part of an
  op's duration beyond its isolated time is hatched in the colour of what slowed it. Below, the
  resource counters the engine recorded (SM occupancy, HBM and link traffic, power and clock).
- :func:`replay_figure`: measured against predicted duration for the scored overlapped kernels
  (with the naive prediction beside them), and measured and predicted lanes of the first ranks
  under the exposed communication and hidden share, measured and predicted.
- :func:`leaders_figure`: the timelines of a schedule search's leaders side by side.

The figures of tables (``compare``, ``sweep``, ``validate``, ``calibrate``) are in
:mod:`ovsim.plot_tables`; this module holds what both draw with (colours, the time unit, saving).

matplotlib is an optional dependency (``pip install 'ovsim[plot]'``); it is imported only here, and
figures are made without pyplot so that nothing depends on a display or on global state.
"""

from __future__ import annotations

import math
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


def new_figure(**kwargs: Any) -> Figure:
    """A matplotlib figure made without pyplot (a one-line error without matplotlib)."""
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


def time_unit(span_s: float) -> tuple[float, str]:
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
    scale, unit = time_unit(end_s)
    counters = timeline.counters
    shown = sorted({r for r, _ in lane_keys})
    panels = [p for p in _COUNTER_PANELS
              if len(counters) and counters["counter"].isin([c for c, _ in p[2]]).any()]
    heights = [max(1.5, 0.32 * len(lane_keys) + 0.6)] + [1.1] * len(panels)
    fig = new_figure(figsize=(12, sum(heights) + 0.9), layout="constrained")
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
    scale, unit = time_unit(max(end for _, _, end in panels))
    heights = [max(1.0, 0.32 * len(lanes) + 0.5) for _, lanes, _ in panels]
    fig = new_figure(figsize=(12, sum(heights) + 0.9), layout="constrained")
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
    fig = new_figure(figsize=(15, 6), layout="constrained")
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
    scale, unit = time_unit(end)
    kinds, _ = _draw_lanes(right, lanes, scale, lost=False)
    _legend(right, kinds, set())
    more = f" ({_ranks_label(shown)} of {len(ranks)})" if len(shown) < len(ranks) else ""
    right.set_title(f"measured and predicted{more}; span error {s['span_error_pct']:+.1f}%\n{_comm_line(s)}",
                    loc="left")
    right.set_xlabel(f"time from the first kernel ({unit})")
    right.set_xlim(0, end * scale if end > 0 else 1.0)
    fig.suptitle(title or f"replay on {s['gpu']}", x=0.01, ha="left")
    return fig
