"""The ``ovsim`` command: a thin shell over :mod:`ovsim.api`.

Bad input prints one line (``ovsim: error: FILE: FIELD: message``) and exits with status 2; an
unexpected failure prints one line and exits with status 3 (set OVSIM_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from ovsim.errors import OvsimError
from ovsim.files import atomic_output
from ovsim.limits import MAX_COMBINATIONS, MAX_OPS


def _fmt_s(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    return f"{x * 1e3:.3f}"


def _table(result: Any, max_rows: int) -> str:
    s = result.summary()
    lines = [
        f"scenario   {s['scenario']}  ({s['mode']}, {s['schedule']})",
        f"system     {s['system']}: {s['ranks']} x {s['gpu']}"
        + (f" (one data-parallel replica of {s['simulated_ranks']} simulated, standing for all; the rows below "
           "are its ranks)" if s["simulated_ranks"] < s["ranks"] else ""),
        f"makespan   {_fmt_s(s['makespan_s'])} ms",
        f"compute    {_fmt_s(s['compute_s'])} ms per rank, {_fmt_s(s['compute_isolated_s'])} ms alone "
        f"({_slowdown_parts(s)})",
        *(["note       faster than alone: the isolated times hold at the clock the GPU's rates were calibrated "
           "at, and the power-limit loop ran above it (docs/power.md)"]
          if s.get("power_managed") and s["compute_slowdown"] < -0.005 else []),
        f"comm       {_fmt_s(s['comm_s'])} ms per rank, exposed {_fmt_s(s['exposed_comm_s'])} ms, "
        f"{s['comm_hidden_fraction'] * 100:.1f}% hidden under compute",
        *_power_lines(s, result.gpu.power.tdp_w, result.calibration.params.power_control_window_s),
        *_memory_lines(result),
        f"calibrated {', '.join(s['calibration_files'])}",
        "",
    ]
    streams = result.streams()
    if len(streams):
        lines.append(f"{'rank':>4} {'stream':<12} {'busy ms':>10} {'ops':>6}")
        for rec in streams.head(max_rows).itertuples(index=False):
            lines.append(f"{rec.rank:>4} {str(rec.stream)[:12]:<12} {_fmt_s(rec.busy_s):>10} {rec.ops:>6}")
        lines.append("")
    ops = result.timeline.ops
    ops = ops[ops["rank"] >= 0]
    header = f"{'op':<28} {'rank':>4} {'stream':<10} {'start ms':>10} {'dur ms':>10} {'alone ms':>10} " \
             f"{'slowdown':>8}  slowed by"
    lines.append(header)
    lines.append("-" * len(header))
    for rec in ops.head(max_rows).itertuples(index=False):
        lines.append(f"{str(rec.name)[:28]:<28} {rec.rank:>4} {str(rec.stream)[:10]:<10} {_fmt_s(rec.start_s):>10} "
                     f"{_fmt_s(rec.duration_s):>10} {_fmt_s(rec.isolated_s):>10} {rec.slowdown:>7.2f}x  "
                     f"{rec.slowed_by}")
    if len(ops) > max_rows:
        lines.append(f"... {len(ops) - max_rows} more ops (use --json for all)")
    return "\n".join(lines)


def _signed_pct(x: float) -> str:
    """A change in percent with its sign, never "-0.0%"."""
    return f"{round(x * 100, 1) + 0.0:+.1f}%"


def _slowdown_parts(s: dict[str, Any]) -> str:
    total, clock = s["compute_slowdown"], s["compute_clock_slowdown"]
    if abs(clock) < 5e-4:
        return _signed_pct(total)
    how = "lowered clock" if clock > 0 else "clock above the calibration's"
    return f"{_signed_pct(total)}: {_signed_pct(clock)} {how}, {_signed_pct(total - clock)} contention"


def _memory_lines(result: Any) -> list[str]:
    from ovsim.models.memory import USABLE_FRACTION

    est = result.memory()
    if est is None:
        return []
    cap = result.gpu.memory.capacity_bytes
    parts = [("model states", est.weights_bytes + est.gradients_bytes + est.optimizer_bytes),
             ("gathered", est.gathered_bytes), ("activations", est.activations_bytes), ("logits", est.logits_bytes)]
    if est.total_bytes > cap:
        verdict = "DOES NOT FIT: a real run would run out of memory"
    elif est.total_bytes > USABLE_FRACTION * cap:
        verdict = "tight: the estimate leaves out the CUDA context, workspaces and fragmentation (1-2 GB and more)"
    else:
        verdict = "fits"
    training = result.scenario.training
    stage = f"; pipeline stage {est.stage}" if training is not None and training.parallel.pp > 1 else ""
    return [f"memory     {est.total_bytes / 1e9:.1f} GB per GPU estimated ("
            + ", ".join(f"{name} {b / 1e9:.1f}" for name, b in parts if b > 0)
            + f"{stage}) of {cap / 1e9:.0f} GB: {verdict}"]


def _power_lines(s: dict[str, Any], tdp_w: float, window_s: float) -> list[str]:
    if "energy_j" not in s:
        return []
    settings = []
    if s["power_managed"]:
        settings.append(f"cap {s['power_cap_w']:g} W" if s["power_cap_w"] is not None
                        else f"default limit {s['power_limit_w']:g} W")
    if s["sm_clock_lock_hz"] is not None:
        settings.append(f"clock locked at {s['sm_clock_lock_hz'] / 1e6:g} MHz")
    if s["power_managed"] and s.get("power_start") == "idle":
        settings.append("from idle")
    # Unmanaged, every kernel runs at its calibrated rate whatever it draws; a real board would lower
    # its clock at its default limit.
    over = ([f"note       the peak is above the GPU's {tdp_w:g} W default power limit, where a real board lowers "
             f"its SM clock; without --no-power-management ovsim predicts that"]
            if not s["power_managed"] and s["peak_power_w"] > tdp_w else [])
    limit = s["power_limit_w"]
    if s["power_managed"] and window_s > 0 and s["peak_power_w"] > limit * (1 + 1e-6):
        over.append(f"note       the power-limit loop holds {limit:g} W on {window_s * 1e3:g} ms averages; within them "
                    f"the instantaneous peak can be above it")
    return [
        f"power      {s['avg_power_w']:.1f} W average, {s['peak_100ms_power_w']:.1f} W peak per GPU "
        f"(highest 100 ms average, as a board's sensor reports it; {s['peak_power_w']:.1f} W instantaneous); "
        f"SM clock {s['avg_sm_clock_hz'] / 1e6:.0f} MHz average, {s['min_sm_clock_hz'] / 1e6:.0f} MHz lowest "
        f"({', '.join(settings) or 'no power management'})",
        f"energy     {s['energy_j']:.4g} J per iteration (all GPUs), energy x delay {s['energy_delay_j_s']:.4g} J s",
        *over,
    ]


def _predict(args: argparse.Namespace) -> int:
    from ovsim.api import predict
    from ovsim.traces.perfetto import write_trace

    _check_output(args.timeline, "--timeline")
    _check_extension(args.timeline, "--timeline", (".json",), "a Perfetto (Chrome trace) JSON file")
    _check_plot(args.plot)
    # A value out of range that came from a flag is the flag's, not the scenario's power section.
    flags = {"power.cap_w": "--power-cap-w" if args.power_cap_w is not None else "",
             "power.sm_clock_hz": "--sm-clock-hz" if args.sm_clock_hz is not None else "",
             "power.start": "--power-start" if args.power_start is not None else ""}
    bar = _Progress(args.quiet or args.json)
    try:
        result = predict(args.scenario, mode=args.mode, power_cap_w=args.power_cap_w, sm_clock_hz=args.sm_clock_hz,
                         power_start=args.power_start, power_managed=False if args.no_power_management else None,
                         max_ops=args.max_ops, progress=bar.ops if bar.on else None)
    except OvsimError as e:
        if flags.get(e.field):
            raise OvsimError(e.message, source=e.source, field=flags[e.field]) from None
        raise
    finally:
        bar.done()
    if args.timeline:
        write_trace(result.timeline, args.timeline, label=result.scenario.name)
    if args.plot:
        from ovsim.plot import timeline_figure

        _save_plot(timeline_figure(result.timeline, title=f"{result.scenario.name} ({result.system.name})",
                                   max_ranks=args.plot_ranks), args.plot)
    if args.json:
        print(_json(result.to_json()))
    elif not args.quiet:
        print(_table(result, args.rows))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from ovsim.api import compare

    _check_plot(args.plot)
    bar = _Progress(args.quiet or args.json)
    bar.stage(f"predicting {len(args.scenarios)} scenarios")
    try:
        df = compare(args.scenarios, mode=args.mode, max_ops=args.max_ops)
    finally:
        bar.done()
    if args.plot:
        from ovsim.plot import compare_figure

        _save_plot(compare_figure(df), args.plot)
    if args.json:
        print(_json({"scenarios": df.to_dict(orient="records")}))
    elif not args.quiet:
        print(_compare_table(df))
    return 0


# (column, header, format) of the compare table; power columns appear when predictions carry them.
_COMPARE_COLUMNS: list[tuple[str, str, str]] = [
    ("makespan_s", "iter ms", "ms"), ("vs_first", "vs 1st", "pct"), ("compute_s", "compute ms", "ms"),
    ("compute_vs_first", "cmp vs 1st", "pct"), ("contention_slowdown", "contention", "pct"),
    ("compute_clock_slowdown", "clock", "pct"), ("comm_s", "comm ms", "ms"),
    ("exposed_comm_s", "exposed ms", "ms"),
    ("comm_hidden_fraction", "hidden", "frac"), ("power_limit_w", "limit W", "w"), ("avg_power_w", "avg W", "w"),
    ("peak_100ms_power_w", "peak W", "w"), ("energy_j", "energy J", "j"), ("memory_per_gpu_bytes", "mem GB", "gb"),
]
# The tables' peak is what a board's sensor shows (100 ms averages, as nvidia-smi reports it): the
# engine's instantaneous peak can sit far above the board's limit within a window, which the
# power-limit loop holds on averages (predict's text and --json give both).
_TABLE_NOTE = ("contention: compute time lost beside other work, against alone at the same SM clock; clock: compute "
               "time lost to an SM clock below the calibration's (power limit or lock), negative where the clock "
               "runs above it; peak W: the highest 100 ms "
               "average per GPU, as a board's sensor reports it")


def _split_slowdown(df: Any) -> Any:
    """The compute slowdown split into its contention and clock parts (they add up to it)."""
    if "compute_slowdown" in df.columns and "compute_clock_slowdown" in df.columns:
        return df.assign(contention_slowdown=df["compute_slowdown"] - df["compute_clock_slowdown"])
    return df


def _compare_table(df: Any) -> str:
    df = _split_slowdown(df)
    cols = [c for c in _COMPARE_COLUMNS if c[0] in df.columns]
    width = max(12, min(40, int(df["scenario"].str.len().max())))
    lines = [f"{'scenario':<{width}} {'schedule':<10} " + " ".join(f"{h:>10}" for _, h, _ in cols)]
    lines.append("-" * len(lines[0]))
    for rec in df.to_dict(orient="records"):
        cells = [_cell(rec.get(key), kind) for key, _, kind in cols]
        lines.append(f"{str(rec['scenario'])[:width]:<{width}} {str(rec['schedule'])[:10]:<10} " + " ".join(cells))
    return "\n".join([*lines, "", _TABLE_NOTE])


def _cell(x: Any, kind: str) -> str:
    """A number of the compare and sweep tables, ten wide."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return f"{'-':>10}"
    if kind == "ms":
        return f"{x * 1e3:>10.3f}"
    if kind == "pct":
        return f"{_signed_pct(x):>10}"
    if kind == "frac":
        return f"{x * 100:>9.1f}%"
    if kind == "j":
        return f"{x:>10.4g}"
    if kind == "gb":
        return f"{x / 1e9:>10.1f}"
    return f"{x:>10.1f}"


# (column, header, format) of the sweep table, after the axes.
_SWEEP_COLUMNS: list[tuple[str, str, str]] = [
    ("makespan_s", "iter ms", "ms"), ("compute_s", "compute ms", "ms"), ("contention_slowdown", "contention", "pct"),
    ("compute_clock_slowdown", "clock", "pct"), ("comm_s", "comm ms", "ms"), ("exposed_comm_s", "exposed ms", "ms"),
    ("comm_hidden_fraction", "hidden", "frac"),
    ("power_limit_w", "limit W", "w"), ("avg_power_w", "avg W", "w"), ("peak_100ms_power_w", "peak W", "w"),
    ("energy_j", "energy J", "j"), ("memory_per_gpu_bytes", "mem GB", "gb"),
]


def _sweep_table(df: Any, axes: list[str]) -> str:
    df = _split_slowdown(df)
    cols = [c for c in _SWEEP_COLUMNS if c[0] in df.columns]
    widths = [max(len(a), *(len(str(v)) for v in df[a])) for a in axes]
    head = " ".join(f"{a:<{w}}" for a, w in zip(axes, widths, strict=True))
    lines = [head + " " + " ".join(f"{h:>10}" for _, h, _ in cols)]
    lines.append("-" * len(lines[0]))
    for rec in df.to_dict(orient="records"):
        vals = " ".join(f"{rec[a]!s:<{w}}" for a, w in zip(axes, widths, strict=True))
        cells = [_cell(rec.get(key), kind) for key, _, kind in cols]
        lines.append(vals + " " + " ".join(cells))
    return "\n".join([*lines, "", _TABLE_NOTE])


def _sweep(args: argparse.Namespace) -> int:
    from ovsim.sweep import sweep

    _check_output(args.csv, "--csv")
    _check_extension(args.csv, "--csv", (".csv",), "CSV")
    _check_plot(args.plot)
    axes: dict[str, list[Any]] = {}
    for item in args.axis:
        path, sep, values = item.partition("=")
        if not sep or not path.strip() or not values.strip():
            raise OvsimError(f"expected PATH=VALUE[,VALUE...], got '{item}'", field="--axis")
        if path in axes:
            raise OvsimError(f"'{path}' is given twice", field="--axis")
        axes[path.strip()] = [_axis_value(v, item) for v in _split_values(values, item)]
    bar = _Progress(args.quiet or args.json)
    n = math.prod(len(v) for v in axes.values())
    bar.stage(f"predicting {n} combinations")
    try:
        df = sweep(args.scenario, axes, mode=args.mode, workers=args.workers, max_ops=args.max_ops,
                   max_combinations=args.max_combinations,
                   progress=(lambda done, total: bar.stage(f"predicted {done}/{total} combinations"))
                   if bar.on else None)
    finally:
        bar.done()
    if args.csv:
        try:
            with atomic_output(args.csv) as tmp:
                df.to_csv(tmp, index=False)
        except OSError as e:
            raise OvsimError(f"cannot write: {e.strerror}", source=args.csv, field="--csv") from None
    if args.plot:
        from ovsim.plot import sweep_figure

        _save_plot(sweep_figure(df, list(axes), title=str(args.scenario)), args.plot)
    if args.json:
        print(_json({"axes": list(axes), "points": df.to_dict(orient="records")}))
    elif not args.quiet:
        print(_sweep_table(df, list(axes)))
    return 0


def _split_values(text: str, item: str) -> list[str]:
    """Comma-separated values; a comma inside brackets belongs to a list value ([64, 64, 32])."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if depth < 0:
            raise OvsimError(f"unbalanced brackets in '{item}'", field="--axis")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise OvsimError(f"unbalanced brackets in '{item}'", field="--axis")
    out.append(cur)
    if any(not v.strip() for v in out):
        raise OvsimError(f"an empty value in '{item}'", field="--axis")
    return [v.strip() for v in out]


def _axis_value(text: str, item: str) -> Any:
    """A value as a scenario file would hold it: null, true/false, a number (1e8 too, which YAML
    reads as a string), a [list] or {mapping} in YAML flow style, or else the text. ``none`` is
    text, as in YAML (an enum value such as ``tp_overlap: none``); only ``null`` and ``~`` are null."""
    import yaml

    low = text.lower()
    if low in ("null", "~"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            x = kind(text)
        except ValueError:
            continue
        if isinstance(x, float) and not math.isfinite(x):
            raise OvsimError(f"'{text}' is not a finite number in '{item}'", field="--axis")
        return x
    if text[0] in "[{":
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            raise OvsimError(f"cannot read '{text}' in '{item}' as a YAML list or mapping", field="--axis") from None
    return text


def _pct(x: float) -> str:
    return f"{x:.1f}%" if math.isfinite(x) else "-"


def _replay_table(result: Any, max_rows: int) -> str:
    s = result.summary
    lines = [
        f"trace      {', '.join(s['sources'].values()) or '-'}",
        f"gpu        {s['gpu']}, {s['ranks']} rank(s), {s['kernels']} activities "
        f"({s['compute_kernels']} compute, {s['collective_kernels']} collective)",
        f"overlap    {s['overlapped_compute_kernels']} compute kernels overlapped communication; "
        f"{s['scored_kernels']} scored, {s['unscored_no_isolated_source']} without an isolated duration",
        f"MAPE       ovsim {_pct(s['mape_pct'])}   naive (no contention) {_pct(s['naive_mape_pct'])}",
        f"weighted   ovsim {_pct(s['weighted_error_pct'])}   naive {_pct(s['naive_weighted_error_pct'])}   "
        "(sum of |error| over sum of measured time)",
        f"comm       exposed, all ranks: measured {_fmt_s(s['exposed_comm_measured_s'])} ms, predicted "
        f"{_fmt_s(s['exposed_comm_predicted_s'])} ms; hidden under compute: measured {_pct(s['hidden_pct_measured'])}, "
        f"predicted {_pct(s['hidden_pct_predicted'])}",
        f"span       measured {_fmt_s(s['measured_span_s'])} ms, predicted {_fmt_s(s['predicted_span_s'])} ms "
        f"({s['span_error_pct']:+.1f}%)",
    ]
    if s["skipped"]:
        lines.append("skipped    " + _skipped_text(s["skipped"]))
    lines.append(f"calibrated {', '.join(s['calibration_files'])}")
    k = result.kernels
    k = k[k["overlapped"]]
    if len(k):
        lines += ["", f"{'overlapped kernel':<40} {'rank':>4} {'measured ms':>11} {'predicted ms':>12} "
                      f"{'alone ms':>9}  isolated from"]
        for rec in k.head(max_rows).itertuples(index=False):
            lines.append(f"{str(rec.name)[:40]:<40} {rec.rank:>4} {_fmt_s(rec.measured_duration_s):>11} "
                         f"{_fmt_s(rec.predicted_duration_s):>12} {_fmt_s(rec.isolated_s):>9}  {rec.isolated_source}")
        if len(k) > max_rows:
            lines.append(f"... {len(k) - max_rows} more (use --json for all)")
        lines += ["", "isolated from: where 'alone' comes from, never the kernel's own overlapped run. signature: "
                      "the median of the same kernel (name, launch, operator shapes) where it ran without "
                      "communication (scored); ambiguous: those runs disagree, one launch for several problem sizes "
                      "(the median, not scored); none: no such run (its measured time, not scored)"]
    return "\n".join(lines)


class _Progress:
    """A one-line progress display on stderr, only when it is a terminal and output is not quiet."""

    def __init__(self, quiet: bool) -> None:
        self.on = not quiet and sys.stderr.isatty()
        self.shown = False

    def stage(self, text: str) -> None:
        if self.on:
            sys.stderr.write(f"\r\033[K{text}")
            sys.stderr.flush()
            self.shown = True

    def ops(self, done: int, total: int) -> None:
        width = 30
        fill = int(width * done / total) if total else width
        self.stage(f"simulating [{'#' * fill}{'.' * (width - fill)}] {done}/{total} ops")

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _skipped_text(skipped: dict[str, int]) -> str:
    """What the importer skipped, as "N reason, ..." ("" when nothing)."""
    return ", ".join(f"{v} {r}" for r, v in sorted(skipped.items()))


def _check_strict(bundle: Any, source: str, strict: bool) -> None:
    """With ``--strict``, an event the importer skipped (malformed, or of a kind it cannot use) is an
    error rather than a count in the summary."""
    if strict and bundle.skipped:
        raise OvsimError(f"skipped events ({_skipped_text(bundle.skipped)}); without --strict they are left out "
                         "and counted", source=source, field="--strict")


def _replay(args: argparse.Namespace) -> int:
    from ovsim.replay import replay
    from ovsim.traces.load import load_trace
    from ovsim.traces.perfetto import replay_trace_events, write_json

    _check_gpu(args.gpu)
    _check_output(args.timeline, "--timeline")
    _check_extension(args.timeline, "--timeline", (".json",), "a Perfetto (Chrome trace) JSON file")
    _check_plot(args.plot)
    bar = _Progress(args.quiet or args.json)
    bar.stage(f"reading {', '.join(args.traces)}")
    try:
        bundle = load_trace(args.traces, args.format)
        _check_strict(bundle, ", ".join(args.traces), args.strict)
        bar.stage("building the workload")
        result = replay(bundle, gpu=args.gpu, counters=False, progress=bar.ops if bar.on else None,
                        calibration=args.calibration or ())
    except OvsimError as e:
        # Problems found past the importer (a kernel's launch, the span) concern the traces given.
        raise e.located(", ".join(args.traces)) from None
    finally:
        bar.done()
    if args.timeline:
        write_json(replay_trace_events(result.kernels), args.timeline)
    if args.plot:
        from ovsim.plot import replay_figure

        _save_plot(replay_figure(result, title=f"replay of {', '.join(args.traces)}", max_ranks=args.plot_ranks),
                   args.plot)
    if args.json:
        print(_json(result.to_json()))
    elif not args.quiet:
        print(_replay_table(result, args.rows))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ovsim.calibrate import PowerLog, calibrate, output_path, trace_input, write_calibration
    from ovsim.traces.power import read_power_samples

    if args.gpu != "*":
        _check_gpu(args.gpu)
    # The file name and an existing version are refused before the fit, not after it.
    out, _ = output_path(Path(args.output), args.gpu)
    _check_output(str(out), "--output", make_folders=True)
    if out.exists():
        raise OvsimError("exists: calibration files are never edited; write a new version", source=str(out),
                         field="--output")
    _check_plot(args.plot)
    bar = _Progress(args.quiet or args.json)
    assumed: dict[str, str] = {}
    for item in args.trace_gpu or []:
        name, sep, gpu = item.rpartition("=")
        if not sep or not name or not gpu:
            raise OvsimError(f"expected TRACE=GPU, got '{item}'", field="--trace-gpu")
        if name not in args.traces and not any(Path(t).name == name for t in args.traces):
            raise OvsimError(f"'{name}' is not one of the traces given", field="--trace-gpu")
        _check_gpu(gpu, "--trace-gpu")
        assumed[name] = gpu
    logs: dict[str, list[PowerLog]] = {}
    for item in args.power_log or []:
        name, sep, log = item.rpartition("=")
        if sep and not name:
            raise OvsimError(f"expected [TRACE=]LOG, got '{item}'", field="--power-log")
        if not sep and len(args.traces) > 1:
            raise OvsimError(f"name the trace of '{item}' (TRACE=LOG): there are {len(args.traces)} traces",
                             field="--power-log")
        if not Path(log).is_file():
            raise OvsimError("no such file", source=log, field="--power-log")
        # A log the user named must be one ovsim reads: say so before the fit, not in its report.
        with _flag("--power-log"):
            read_power_samples(log)
        trace = name or args.traces[0]
        if trace not in args.traces and not any(Path(t).name == trace for t in args.traces):
            raise OvsimError(f"'{trace}' is not one of the traces given", source=log, field="--power-log")
        logs.setdefault(trace, []).append(PowerLog(log, offset_s=args.power_offset_s, window_s=args.power_window_s))
    gpu = args.gpu
    try:
        inputs = []
        for t in args.traces:
            bar.stage(f"reading {t}")
            try:
                tr = trace_input([t], assumed.get(Path(t).name, assumed.get(t)),
                                 fallback_gpu=None if gpu == "*" else gpu)
            except OvsimError as e:
                raise e.located(t) from None
            _check_strict(tr.bundle, t, args.strict)
            if tr.bundle.kernels.empty:
                raise OvsimError("the trace has no GPU activity to fit", source=t, field="kernels")
            mine = logs.get(t, []) + (logs.get(Path(t).name, []) if Path(t).name != t else [])
            inputs.append(dataclasses.replace(tr, power_logs=tuple(mine)))
        quantities = [q.strip() for q in args.fit.split(",")] if args.fit else None
        report = calibrate(inputs, gpu, quantities=quantities, on_step=lambda q: bar.stage(f"fitting {q}"),
                           points=bool(args.plot), gemm_frame=args.gemm_frame)
        command = "ovsim calibrate " + " ".join(Path(t).name for t in args.traces) + f" --gpu {gpu}" + "".join(
            f" --power-log {Path(lg.path).name}" for tr in inputs for lg in tr.power_logs) + (
            f" --gemm-frame {args.gemm_frame}" if args.gemm_frame != "grid" else "")
        path = write_calibration(report, inputs, gpu, Path(args.output), command=command)
    finally:
        bar.done()
    if args.plot and report.points is not None:
        from ovsim.plot import calibration_figure

        _save_plot(calibration_figure(report.points, title=f"{path.name}: fitted against measured (fit error, on the "
                                                           "points fitted)"), args.plot)
    if args.json:
        print(_json({"file": str(path), "parameters": report.parameters, "fits": report.fits,
                     "skipped": report.skipped}))
    elif not args.quiet:
        print(f"wrote {path}")
        for k, v in report.parameters.items():
            print(f"  {k}: {v}")
        for q, why in report.skipped.items():
            print(f"  not fitted: {q}: {why}")
        rec = report.fits.get("contention")
        if rec:
            print("  contention fit error (traces fitted on; not a prediction error):")
            by_share = ", ".join(f"{f}: {e:.1f}%" for f, e in rec["mean_fit_mape_pct_by_sm_fraction"].items())
            print(f"    mean by share of a collective's blocks holding SMs: {by_share}")
            for label, naive in rec["naive_mape_pct"].items():
                print(f"    {label[:40]:<40} naive {naive:6.1f}%  fitted {rec['fit_mape_pct'][label]:6.1f}%")
        rec = report.fits.get("overhead")
        if rec:
            print(f"  overhead from {rec['points']} tiny elementwise kernels (p10-p90 {rec['p10_p90_us'][0]:g}-"
                  f"{rec['p10_p90_us'][1]:g} us); fit error {rec['fit_mape_pct']:.1f}% (fitted on; not a prediction "
                  "error)")
        rec = report.fits.get("gemm")
        for prec, r in (rec or {}).get("precisions", {}).items():
            if "fit_mape_pct" in r:
                print(f"  gemm {prec} from {r['points']} GEMMs ({r['note']}): fit error {r['fit_mape_pct']:.1f}% "
                      "(fitted on; not a prediction error)")
            u = r.get("unaligned", {})
            if "efficiency" in u:
                print(f"  gemm {prec} unaligned (n or k not on 16 bytes) from {u['points']} GEMMs: efficiency "
                      f"{u['efficiency']:g}; fit error {u['fit_mape_pct']:.1f}% (fitted on; not a prediction error)")
        rec = report.fits.get("memory")
        for cls, r in (rec or {}).get("classes", {}).items():
            if r.get("fitted"):
                print(f"  memory {cls} from {r['points']} kernels: {r['fraction_of_peak']:g} of the HBM peak; fit "
                      f"error {r['fit_mape_pct']:.1f}% (fitted on; not a prediction error)")
        rec = report.fits.get("power")
        if rec:
            print(f"  power fit error on {rec['samples']} samples (fitted on; not a prediction error): "
                  f"{rec['fit_mape_pct']:.1f}% MAPE, {rec['fit_rmse_w']:.1f} W RMS; shipped model "
                  f"{rec['shipped_model_mape_pct']:.1f}%")
            if rec["not_identifiable"]:
                print(f"    not fitted (no such activity in the samples): {', '.join(rec['not_identifiable'])}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from ovsim.traces.load import load_trace, write_table

    _check_output(args.output, "--output")
    if not args.output.lower().endswith((".parquet", ".pq")):
        # The canonical table is parquet only: a .csv name would hold parquet bytes.
        raise OvsimError("the kernel table is written as parquet; name it .parquet", source=args.output,
                         field="--output")
    bar = _Progress(args.quiet)
    bar.stage(f"reading {', '.join(args.traces)}")
    try:
        bundle = load_trace(args.traces, args.format)
        _check_strict(bundle, ", ".join(args.traces), args.strict)
        if bundle.kernels.empty:
            skipped = _skipped_text(bundle.skipped) or "nothing"
            raise OvsimError(f"no GPU activity left to write (skipped: {skipped})", source=", ".join(args.traces),
                             field="traceEvents")
        bar.stage(f"writing {args.output}")
        write_table(bundle, args.output)
    finally:
        bar.done()
    if not args.quiet:
        k = bundle.kernels
        skipped = _skipped_text(bundle.skipped) or "none"
        print(f"{len(k)} activities from {k['rank'].nunique()} rank(s) written to {args.output}; skipped: {skipped}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ovsim.validate import run

    _check_plot(args.plot)
    bar = _Progress(args.quiet or args.json)
    traces = Path(args.traces) if args.traces is not None else None
    if traces is not None and not traces.is_dir():
        raise OvsimError("not a folder", source=str(traces), field="traces")
    bar.stage("published figures")
    try:
        checks = run(traces, on_trace=bar.stage, workers=args.workers, studies=args.studies, measured=args.measured)
    finally:
        bar.done()
    if args.plot:
        from ovsim.plot import validate_figure

        _save_plot(validate_figure(checks), args.plot)
    passed = sum(c.passed for c in checks)
    if args.json:
        print(_json({"checks": [c.to_json() for c in checks], "passed": passed, "total": len(checks)}))
    elif not args.quiet:
        print(f"{'check':<58} {'reference':>10} {'ovsim':>10} {'error':>8} {'tol':>6}  result")
        group = ""
        for c in checks:
            if c.group != group:
                group = c.group
                print(f"-- {group}")
            tol = {"within": f"{c.tolerance_pct:.0f}%", "at_most": "<= ref", "range": f"({c.low:g}, ref]",
                   "band": f"{c.low:g}-{c.high:g}"}[c.rule]
            # A long name gets a line of its own, whole: cut, two rows could read the same.
            name = c.name if len(c.name) <= 58 else f"{c.name}\n{'':58}"
            print(f"{name:<58} {c.reference:>10.2f} {c.predicted:>10.2f} {c.error_pct:>+7.1f}% {tol:>6}  "
                  f"{'pass' if c.passed else 'FAIL'}  {c.unit}{'; ' + c.note if c.note else ''}")
        print(f"{passed} of {len(checks)} checks pass")
        if not args.studies:
            print("(no --studies: the overlap studies' configurations not run)")
        if not args.measured:
            print("(no --measured: the calibration harness's measured kernels not replayed)")
        if traces is None:
            print("(no --traces folder given: replays of real traces not run)")
    # Scripts rely on the status: a failing check is not a success, --quiet or not.
    return 0 if passed == len(checks) else 1


def _check_output(path: str | None, flag: str, *, make_folders: bool = False) -> None:
    """Refuse an output path that cannot be written before any work is done for it (a replay or a
    fit can take minutes)."""
    from pathlib import Path

    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise OvsimError("is a folder; give a file name", source=path, field=flag)
    folder = p.parent
    if make_folders:
        # The nearest existing ancestor must be a folder to create the rest in.
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise OvsimError(f"folder '{folder}' {what}", source=path, field=flag)
    # A read-only folder (for new folders: the existing one they would go in) says so now, with
    # nothing left behind.
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise OvsimError(f"cannot write in folder '{folder}': {e.strerror}", source=path, field=flag) from None


def _check_extension(path: str | None, flag: str, suffixes: tuple[str, ...], what: str) -> None:
    """An output's name must say its format: a trace named .csv would hold JSON."""
    if path is not None and not path.lower().endswith(suffixes):
        raise OvsimError(f"{flag} writes {what}; name it {' or '.join(suffixes)}", source=path, field=flag)


def _check_plot(path: str | None) -> None:
    """A figure's file must be writable, its format known and matplotlib installed, before the work
    it draws."""
    if path is None:
        return
    from ovsim.plot import check_path

    _check_output(path, "--plot")
    with _flag("--plot"):
        check_path(path)


def _save_plot(fig: Any, path: str) -> None:
    from ovsim.plot import save

    with _flag("--plot"):
        save(fig, path)


def _check_gpu(name: str | None, flag: str = "--gpu") -> None:
    from ovsim.hw.spec import load_gpu

    if name is not None:
        with _flag(flag):
            load_gpu(name)


@contextlib.contextmanager
def _flag(flag: str) -> Iterator[None]:
    """An error inside is the flag's: the value came from it, whatever field the code that checked
    it names."""
    try:
        yield
    except OvsimError as e:
        raise OvsimError(e.message, source=e.source, field=flag) from None


class _Parser(argparse.ArgumentParser):
    """argparse with a usage error on one line, as every other error is (the usage is one --help
    away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"ovsim: error: {' '.join(message.split())} (see '{self.prog} --help')\n")


def _finite(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: '{text}'") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"must be a finite number, got '{text}'")
    return x


def _positive(text: str) -> float:
    x = _finite(text)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got '{text}'")
    return x


def _non_negative(text: str) -> float:
    x = _finite(text)
    if x < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got '{text}'")
    return x


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: '{text}'") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got '{text}'")
    return n


def _strict_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="an event the importer would skip (malformed, or of a kind it cannot use) is an error")


def _max_ops_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-ops", type=_at_least_one, default=MAX_OPS, metavar="N",
                   help=f"the most ops a scenario may expand to, after ranks and repeats (default {MAX_OPS:,}); "
                        "more is refused before any work")


def _at_least_one(text: str) -> int:
    n = _count(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got '{text}'")
    return n


def _file_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path")
    return text


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def _json(obj: Any) -> str:
    """One JSON object; a number that is not finite (a MAPE with nothing scored, a change against a
    zero baseline) is null, since NaN and Infinity are not JSON and strict readers refuse them."""
    return json.dumps(_nulled(obj), default=_json_default, allow_nan=False)


def _nulled(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _nulled(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_nulled(v) for v in x]
    if not isinstance(x, str | bytes | int) and hasattr(x, "item"):
        x = x.item()  # a numpy scalar
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _specs(args: argparse.Namespace) -> int:
    from ovsim.hw.spec import known_gpus, known_systems, load_gpu, load_system

    gpus = [_gpu_row(load_gpu(n), n) for n in known_gpus()]
    systems = [{"system": n, "gpu": s.gpu, "nodes": s.nodes, "gpus per node": s.gpu_count, "topology": s.topology,
                "NIC GB/s per GPU": round(s.nic_bytes_per_s_per_gpu / 1e9, 1) if s.network else None}
               for n in known_systems() for s in [load_system(n)]]
    if args.json:
        print(_json({"gpus": gpus, "systems": systems}))
        return 0
    print(_rows(gpus))
    print("max GHz: top SM clock; BF16 TF: dense BF16 peak as the vendor quotes it; HBM TB/s: peak; "
          "link GB/s: NVLink or xGMI per direction, all links; TDP W: default board power limit")
    print("NIC GB/s per GPU: a GPU's share of its node's NICs per direction, at the line rate (multi-node systems)")
    print()
    print(_rows(systems))
    return 0


def _gpu_row(g: Any, stem: str) -> dict[str, Any]:
    bf16 = g.compute.peak_flops_per_s.get("bf16")
    return {"gpu": stem, "arch": g.architecture, "SMs": g.sm.count, "max GHz": round(g.clocks.max_sm_clock_hz / 1e9, 3),
            "BF16 TF": round(bf16 / 1e12, 1) if bf16 else None,
            "HBM GB": round(g.memory.capacity_bytes / 1e9, 1),
            "HBM TB/s": round(g.memory.bandwidth_bytes_per_s / 1e12, 2),
            "link GB/s": round(g.links.bandwidth_bytes_per_s / 1e9, 1),
            "TDP W": round(g.power.tdp_w)}


def _rows(rows: list[dict[str, Any]]) -> str:
    """A plain table: the first column left-aligned, the others right."""
    cols = list(rows[0]) if rows else []
    cells = [[("-" if r[c] is None else str(r[c])) for c in cols] for r in rows]
    width = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]

    def line(xs: list[str]) -> str:
        return "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(xs, width, strict=True)))

    return "\n".join([line(cols), *(line(x) for x in cells)])


def parser() -> argparse.ArgumentParser:
    from ovsim import __version__

    p = _Parser(prog="ovsim", description="Predict compute-communication overlap on GPUs.",
                epilog="exit status: 0 success; 1 a check of 'ovsim validate' failed; 2 bad input, a usage "
                       "error or an output that cannot be written; 3 internal error; 130 interrupted")
    p.add_argument("--version", action="version", version=f"ovsim {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("predict", help="predict a scenario file")
    pr.add_argument("scenario", help="scenario YAML file")
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    pr.add_argument("--timeline", metavar="FILE", type=_file_name, help="write a Perfetto-loadable trace")
    pr.add_argument("--plot", metavar="FILE", type=_file_name,
                    help="draw the timeline (a lane per rank and stream, slowed time hatched by reason) and the "
                         "resource counters to FILE (PNG, PDF or SVG, from the name; needs matplotlib)")
    pr.add_argument("--plot-ranks", metavar="N", type=_at_least_one, default=4,
                    help="ranks drawn by --plot (default 4)")
    pr.add_argument("--mode", choices=["simulate", "analytic"], help="override the scenario's mode")
    pr.add_argument("--rows", type=_count, default=40, help="ops shown in the table (default 40)")
    pr.add_argument("--power-cap-w", type=_positive, metavar="W",
                    help="board power limit (as nvidia-smi -pl), within the GPU's settable range")
    pr.add_argument("--sm-clock-hz", type=_positive, metavar="HZ",
                    help="locked SM clock (as nvidia-smi -lgc), e.g. 1.2e9, within the GPU's clock range")
    pr.add_argument("--power-start", choices=["steady", "idle"],
                    help="where the power-limit loop starts: steady (default: the workload repeated, as a training "
                         "loop) or idle (a GPU that has idled, as a benchmark's first run)")
    pr.add_argument("--no-power-management", action="store_true",
                    help="no power-limit loop (by default it runs at the GPU's default limit): every kernel at its "
                         "calibrated rate, power only reported, as no real board runs")
    pr.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    _max_ops_flag(pr)
    pr.set_defaults(func=_predict)
    cp = sub.add_parser("compare", help="predict several scenarios and compare them side by side")
    cp.add_argument("scenarios", nargs="+", help="scenario YAML files; the first is the baseline")
    cp.add_argument("--mode", choices=["simulate", "analytic"], help="override the scenarios' mode")
    cp.add_argument("--json", action="store_true", help="print one JSON object")
    cp.add_argument("--plot", metavar="FILE", type=_file_name,
                    help="draw each scenario's makespan (compute alone, slowdown, exposed communication, idle) and "
                         "power to FILE (PNG, PDF or SVG, from the name; needs matplotlib)")
    cp.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    _max_ops_flag(cp)
    cp.set_defaults(func=_compare)
    sw = sub.add_parser("sweep", help="predict every combination of values of a scenario's fields")
    sw.add_argument("scenario", help="scenario YAML file")
    sw.add_argument("--axis", action="append", required=True, metavar="PATH=V1,V2,...",
                    help="a field of the scenario (keys joined by dots, a list item by index or name: "
                         "ops.gemm.m, training.micro_batch, power.cap_w, knobs.comm_priority) and its values "
                         "(null, true/false, numbers, text, [lists]); repeat for more axes, the first varying slowest")
    sw.add_argument("--mode", choices=["simulate", "analytic"], help="override the scenario's mode")
    sw.add_argument("--workers", type=_count, default=1, metavar="N",
                    help="processes to predict in (default 1; 0: one per CPU core)")
    sw.add_argument("--json", action="store_true", help="print one JSON object")
    sw.add_argument("--csv", metavar="FILE", type=_file_name, help="write the table, every summary column, as CSV")
    sw.add_argument("--plot", metavar="FILE", type=_file_name,
                    help="draw makespan, compute slowdown, exposed communication and energy against the first "
                         "axis, a line per combination of the others (PNG, PDF or SVG; needs matplotlib)")
    sw.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    _max_ops_flag(sw)
    sw.add_argument("--max-combinations", type=_at_least_one, default=MAX_COMBINATIONS, metavar="N",
                    help=f"the most combinations run (default {MAX_COMBINATIONS:,}); more is refused before any work")
    sw.set_defaults(func=_sweep)
    from ovsim.traces.load import FORMATS

    rp = sub.add_parser("replay", help="replay measured traces with contention and compare with the measurement")
    rp.add_argument("traces", nargs="+", help="trace files or folders (several files: ranks of one run)")
    rp.add_argument("--gpu", help="GPU spec name, when the trace's device name is unknown or to override it")
    rp.add_argument("--format", choices=FORMATS, default="auto", help="trace format (default: from the name)")
    rp.add_argument("--json", action="store_true", help="print one JSON object")
    rp.add_argument("--plot", metavar="FILE", type=_file_name,
                    help="draw predicted against measured durations and the measured and predicted lanes to FILE "
                         "(PNG, PDF or SVG, from the name; needs matplotlib)")
    rp.add_argument("--plot-ranks", metavar="N", type=_at_least_one, default=2,
                    help="ranks whose lanes --plot draws (default 2)")
    rp.add_argument("--timeline", metavar="FILE", type=_file_name,
                    help="write measured and predicted tracks as a Perfetto trace")
    rp.add_argument("--rows", type=_count, default=30, help="overlapped kernels shown in the table (default 30)")
    rp.add_argument("--calibration", action="append", metavar="FILE",
                    help="calibration file on top of the shipped ones (repeatable); a folder stands for the "
                         "newest version in it of the GPU's file, as `ovsim calibrate -o FOLDER` writes them")
    rp.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    _strict_flag(rp)
    rp.set_defaults(func=_replay)
    cb = sub.add_parser("calibrate", help="fit model parameters to real traces; write a new calibration file")
    cb.add_argument("traces", nargs="+", help="traces, one run each (a file, a folder or tarball of ranks)")
    cb.add_argument("--gpu", required=True,
                    help="GPU spec the file is for; '*' fits the GPU-independent contention parameters from traces "
                         "of any GPU")
    cb.add_argument("-o", "--output", required=True, type=_file_name,
                    help="file NAME.vN.yaml to write, or a folder (the GPU's next version is written there)")
    cb.add_argument("--fit", help="comma-separated quantities (contention, collectives, overhead, gemm, memory, "
                                  "power); default: every one the traces support, and an error if one named here "
                                  "cannot be fitted")
    # ovsim.calibrate.GEMM_FRAMES, spelled out: importing the fits here would slow every command.
    cb.add_argument("--gemm-frame", choices=("grid", "scenario"), default="grid",
                    help="where the GEMM fit prices each GEMM: at its measured grid (grid, the default: it "
                         "describes the traced kernels) or as a scenario GEMM of its problem on the library "
                         "kernel ovsim picks (scenario: the parameters for scenarios' GEMMs)")
    cb.add_argument("--trace-gpu", action="append", metavar="TRACE=GPU",
                    help="GPU spec of a trace that does not record its device (repeatable)")
    cb.add_argument("--power-log", action="append", metavar="[TRACE=]LOG",
                    help="power log (nvidia-smi CSV, dcgmi dmon, DCGM CSV) recorded during a trace's run; TRACE= "
                         "names the trace when there are several (repeatable)")
    cb.add_argument("--power-offset-s", type=_finite,
                    help="trace time of the power logs' first sample (default: from the wall clocks of both)")
    cb.add_argument("--power-window-s", type=_non_negative,
                    help="the power sensor's averaging window (default: the log's median sample interval)")
    cb.add_argument("--plot", metavar="FILE", type=_file_name,
                    help="draw every point each fit used, measured against fitted, to FILE (PNG, PDF or SVG, "
                         "from the name; needs matplotlib)")
    cb.add_argument("--json", action="store_true", help="print one JSON object")
    cb.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    _strict_flag(cb)
    cb.set_defaults(func=_calibrate)
    ip = sub.add_parser("import", help="convert traces to the canonical kernel table (parquet)")
    ip.add_argument("traces", nargs="+", help="trace files or folders")
    ip.add_argument("-o", "--output", required=True, type=_file_name, help="parquet file to write")
    ip.add_argument("--format", choices=FORMATS, default="auto", help="trace format (default: from the name)")
    ip.add_argument("--quiet", action="store_true", help="print nothing")
    _strict_flag(ip)
    ip.set_defaults(func=_import)
    vp = sub.add_parser("validate", help="reproduce published figures and replay real traces; one table")
    vp.add_argument("--traces", metavar="DIR", type=_file_name,
                    help="folder holding the shared real traces (their layout as published)")
    vp.add_argument("--studies", action="store_true",
                    help="also predict the published overlap studies' configurations (about eight minutes on one core)")
    vp.add_argument("--measured", action="store_true",
                    help="also replay the calibration harness's kernels measured beside communication-like kernels "
                         "(calibration/data/), held out: leave one victim kernel out, and another GPU; and check its "
                         "other measurements (power, clocks, GEMMs, copies, dispatch, HBM sharing) (about four "
                         "minutes with --workers 2)")
    vp.add_argument("--workers", type=_count, default=1, metavar="N",
                    help="processes to replay the held-out traces and measured kernels and predict the studies in "
                         "(default 1; 0: one per CPU core)")
    vp.add_argument("--json", action="store_true", help="print one JSON object")
    vp.add_argument("--plot", metavar="FILE", type=_file_name,
                    help="draw every check's error against its tolerance to FILE (PNG, PDF or SVG, from the name; "
                         "needs matplotlib)")
    vp.add_argument("--quiet", action="store_true", help="print nothing unless --json")
    vp.set_defaults(func=_validate)
    sp = sub.add_parser("specs", help="list the known GPUs (SMs, clock, peak, memory, links, power) and systems")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.set_defaults(func=_specs)
    return p


# Arguments naming files a command writes, and files or folders it reads.
_OUTPUTS = ("timeline", "plot", "csv", "output")
_INPUTS = ("scenario", "scenarios", "traces", "calibration", "power_log")


def _refuse_clobber(args: argparse.Namespace) -> None:
    """An output that is also an input of the same command would be lost when written (a
    scenario overwritten by its own timeline): refused before any work."""
    from pathlib import Path

    inputs: list[Path] = []
    for name in _INPUTS:
        value = getattr(args, name, None)
        for x in value if isinstance(value, list) else [value] if value else []:
            # --power-log takes [TRACE=]LOG.
            inputs.append(Path(x.split("=", 1)[-1] if name == "power_log" else x))
    for name in _OUTPUTS:
        out = getattr(args, name, None)
        if not out:
            continue
        target = Path(out).resolve()
        for src in inputs:
            if target == src.resolve() or (target.exists() and src.exists() and os.path.samefile(target, src)):
                raise OvsimError(f"is also an input of this command ({src}); write to another file", source=out,
                                 field=f"--{name}")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:
        # A usage error (one line, from _Parser) or --help: the status argparse chose, returned
        # like every other outcome.
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    try:
        _refuse_clobber(args)
        code: int = args.func(args)
        return code
    except OvsimError as e:
        print(f"ovsim: error: {e.one_line()}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader (head, less) went away: not an error; keep Python's flush at exit quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("ovsim: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # never a traceback for a user; the env var shows it to developers
        if os.environ.get("OVSIM_DEBUG"):
            raise
        print(f"ovsim: internal error: {type(e).__name__}: {' '.join(str(e).split())} "
              "(set OVSIM_DEBUG=1 for the traceback)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
