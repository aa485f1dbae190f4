"""Why a schedule wins (:mod:`ovsim.tune`'s why-lines): what it changes against the scenario as
given, what it hides, what it slows and by what, from the two engine summaries."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ovsim.tune_predictions import LOST_TO, Objective, objective_value

__all__ = ["given_problem", "knob_value", "why_line"]


def given_problem(g: Mapping[str, Any]) -> str:
    """Why the scenario as given (its engine summary ``g``) has no objective: its prediction failed
    or it does not fit."""
    if "error" in g:
        return str(g["error"])
    return (f"its training memory, {g['memory_per_gpu_bytes'] / 1e9:.1f} GB per GPU, does not fit "
            f"{g['memory_capacity_bytes'] / 1e9:.0f} GB")


def knob_value(knob: str, v: Any) -> str:
    """A knob's value as the table and the why-lines print it (clocks in MHz; None: the default)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "default"
    if knob.endswith("_hz") and isinstance(v, int | float):
        return f"{v / 1e6:.0f} MHz"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _changes(point: Mapping[str, Any], given_point: Mapping[str, Any]) -> str:
    diff = [f"{k.rsplit('.', 1)[-1]}={knob_value(k, v)}" for k, v in point.items() if given_point.get(k) != v]
    return ", ".join(diff) or "as given"


def _ms(x: float) -> str:
    return f"{x * 1e3:.3g} ms"


def _lost_line(what: str, s: Mapping[str, Any], g: Mapping[str, Any], span_s: float) -> str | None:
    """What ``what`` (compute, comm) lost to contention against the scenario as given, by cause."""
    deltas = {name: s.get(f"{what}_lost_{col}", 0.0) - g.get(f"{what}_lost_{col}", 0.0)
              for col, name in LOST_TO.items()}
    big = sorted(((d, n) for n, d in deltas.items() if abs(d) > 1e-3 * span_s), key=lambda x: -abs(x[0]))
    if not big:
        return None
    label = "compute" if what == "compute" else "communication"
    return f"{label} " + ", ".join(f"{'+' if d > 0 else '-'}{_ms(abs(d))} {n}" for d, n in big)


def why_line(point: Mapping[str, Any], s: Mapping[str, Any], given_point: Mapping[str, Any],
             g: Mapping[str, Any], objective: Objective) -> str:
    """One line: how a schedule (its knob values ``point`` and engine summary ``s``) differs from
    the scenario as given (``given_point``, ``g``), what it hides, what it slows and by what (SMs,
    HBM, links, the clock)."""
    value, base = objective_value(s, objective), objective_value(g, objective)
    changes = _changes(point, given_point)
    if not math.isfinite(base):
        return f"{changes}: {objective} {value:.4g} (the scenario as given: {given_problem(g)})"
    parts = [f"{changes}: {objective} {100.0 * (value / base - 1.0):+.1f}%"]
    span = g["makespan_s"]
    hidden = g["exposed_comm_s"] - s["exposed_comm_s"]
    if abs(hidden) > 1e-3 * span:
        parts.append(f"{'hides' if hidden > 0 else 'exposes'} {_ms(abs(hidden))} more communication "
                     f"({_ms(g['exposed_comm_s'])} -> {_ms(s['exposed_comm_s'])} exposed)")
    alone = s["compute_isolated_s"] - g["compute_isolated_s"]
    if abs(alone) > 1e-3 * span:
        parts.append(f"compute alone {'+' if alone > 0 else '-'}{_ms(abs(alone))}")
    parts += [line for line in (_lost_line("compute", s, g, span), _lost_line("comm", s, g, span)) if line]
    if abs(s.get("avg_sm_clock_hz", 0.0) - g.get("avg_sm_clock_hz", 0.0)) >= 5e6:
        parts.append(f"clock {g['avg_sm_clock_hz'] / 1e6:.0f} -> {s['avg_sm_clock_hz'] / 1e6:.0f} MHz")
    if objective != "time" and "avg_power_w" in s:
        parts.append(f"power {g['avg_power_w']:.0f} -> {s['avg_power_w']:.0f} W")
    return "; ".join(parts)
