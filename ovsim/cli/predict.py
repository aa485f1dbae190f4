"""``ovsim predict`` and ``ovsim compare``."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from ovsim.cli.common import (
    TABLE_NOTE,
    Progress,
    cell_text,
    check_extension,
    check_output,
    check_plot,
    fmt_s,
    json_text,
    save_plot,
    signed_pct,
    split_slowdown,
    written_text,
)
from ovsim.errors import OvsimError


def _gpus(ranks: int, total: int, gpu: str) -> str:
    """The GPUs a run uses: "8 x GPU", or on a system of more "2 of its 4 GPU"."""
    return f"{ranks} x {gpu}" if ranks >= total else f"{ranks} of its {total} {gpu}"


def _comm_line(s: dict[str, Any]) -> str:
    """The summary's communication line. Its kernels' durations are summed over the rank's streams
    (a pipeline's sends and receives run at once), while exposed and hidden time are of the span in
    which any of them ran: that span is named where the two differ, so that the figures add up."""
    summed, busy = fmt_s(s["comm_s"]), fmt_s(s["exposed_comm_s"] + s["hidden_comm_s"])
    span = f" ({busy} ms with any running)" if busy != summed else ""
    return (f"comm       {summed} ms per rank{span}, exposed {fmt_s(s['exposed_comm_s'])} ms, "
            f"{s['comm_hidden_fraction'] * 100:.1f}% {'of that ' if span else ''}hidden under compute")


def _table(result: Any, max_rows: int) -> str:
    s = result.summary()
    lines = [
        f"scenario   {s['scenario']}  ({s['mode']}, {s['schedule']})",
        f"system     {s['system']}: {_gpus(s['ranks'], result.system.total_gpus, s['gpu'])}"
        + (f" ({s['simulated_ranks']} simulated, standing for all by rank symmetry; the rows below are "
           "theirs)" if s["simulated_ranks"] < s["ranks"] else ""),
        f"makespan   {fmt_s(s['makespan_s'])} ms",
        f"compute    {fmt_s(s['compute_s'])} ms per rank, {fmt_s(s['compute_isolated_s'])} ms alone "
        f"({_slowdown_parts(s)})",
        *(["note       faster than alone: the isolated times hold at the clock the GPU's rates were calibrated "
           "at, and the power-limit loop ran above it (docs/power.md)"]
          if s.get("power_managed") and s["compute_slowdown"] < -0.005 else []),
        _comm_line(s),
        *_power_lines(s, result.gpu.power.tdp_w, result.calibration.params.power_control_window_s),
        *_memory_lines(result),
        f"calibrated {', '.join(s['calibration_files'])}",
        "",
    ]
    streams = result.stream_rows()
    if streams:
        lines.append(f"{'rank':>4} {'stream':<12} {'busy ms':>10} {'ops':>6}")
        for rec in streams[:max_rows]:
            lines.append(f"{rec['rank']:>4} {str(rec['stream'])[:12]:<12} {fmt_s(rec['busy_s']):>10} {rec['ops']:>6}")
        lines.append("")
    # From the timeline's columns: the table needs no frame (nor pandas).
    tl = result.timeline
    rows = np.flatnonzero(tl.op_column("rank") >= 0)
    rows = rows[np.argsort(tl.op_column("start_s")[rows], kind="stable")]  # as a timeline reads
    header = f"{'op':<28} {'rank':>4} {'stream':<10} {'start ms':>10} {'dur ms':>10} {'alone ms':>10} " \
             f"{'slowdown':>8}  slowed by"
    lines.append(header)
    lines.append("-" * len(header))
    shown = rows[:max_rows]
    cols = {c: tl.op_column(c)[shown].tolist() for c in ("name", "rank", "stream", "start_s", "duration_s",
                                                           "isolated_s", "slowdown", "slowed_by")}
    for i in range(len(shown)):
        lines.append(f"{str(cols['name'][i])[:28]:<28} {cols['rank'][i]:>4} {str(cols['stream'][i])[:10]:<10} "
                     f"{fmt_s(cols['start_s'][i]):>10} {fmt_s(cols['duration_s'][i]):>10} "
                     f"{fmt_s(cols['isolated_s'][i]):>10} {cols['slowdown'][i]:>7.2f}x  {cols['slowed_by'][i]}")
    if len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more ops (use --json for all)")
    return "\n".join(lines)


def _slowdown_parts(s: dict[str, Any]) -> str:
    total, clock = s["compute_slowdown"], s["compute_clock_slowdown"]
    if abs(clock) < 5e-4:
        return signed_pct(total)
    how = "lowered clock" if clock > 0 else "clock above the calibration's"
    return f"{signed_pct(total)}: {signed_pct(clock)} {how}, {signed_pct(total - clock)} contention"


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
    over = ([f"note       the instantaneous peak is above the GPU's {tdp_w:g} W default power limit, where a real "
             f"board lowers its SM clock; without --no-power-management ovsim predicts that"]
            if not s["power_managed"] and s["peak_power_w"] > tdp_w else [])
    limit = s["power_limit_w"]
    if s["power_managed"] and window_s > 0 and s["peak_power_w"] > limit * (1 + 1e-6):
        # The loop looks back: after idle, the last window's average lets a burst run at a high
        # clock for up to a window, as the boards' measured walk-downs from idle do.
        over.append(f"note       the instantaneous peak is above the {limit:g} W limit: the power-limit loop holds the "
                    f"average over the last {window_s * 1e3:g} ms at it, and a burst after idle runs above it until "
                    f"that window fills (docs/power.md)")
    return [
        f"power      {s['avg_power_w']:.1f} W average per GPU, {s['peak_100ms_power_w']:.1f} W over its highest "
        f"100 ms (a board's reading's interval; the iteration repeated), {s['peak_power_w']:.1f} W instantaneous",
        f"clock      SM {s['avg_sm_clock_hz'] / 1e6:.0f} MHz average, {s['min_sm_clock_hz'] / 1e6:.0f} MHz lowest "
        f"({', '.join(settings) or 'no power management'})",
        f"energy     {s['energy_j']:.4g} J per iteration (all GPUs), energy x delay {s['energy_delay_j_s']:.4g} J s",
        *over,
    ]


def run_predict(args: argparse.Namespace) -> int:
    from ovsim.api import predict
    from ovsim.traces.perfetto import write_trace

    check_output(args.timeline, "--timeline")
    check_extension(args.timeline, "--timeline", (".json",), "a Perfetto (Chrome trace) JSON file")
    check_plot(args.plot)
    if args.all_ranks and not (args.json or args.timeline):
        # The table is rank 0's and the simulated ranks' either way: the flag alone would do nothing.
        raise OvsimError("widens --json's ops and --timeline to every rank; give one of them", field="--all-ranks")
    # A value out of range that came from a flag is the flag's, not the scenario's power section.
    flags = {"power.cap_w": "--power-cap-w" if args.power_cap_w is not None else "",
             "power.sm_clock_hz": "--sm-clock-hz" if args.sm_clock_hz is not None else "",
             "power.start": "--power-start" if args.power_start is not None else ""}
    bar = Progress(args.quiet or args.json)
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
    if args.all_ranks:
        _check_expansion(result, args.max_ops, args.scenario)
    if args.timeline:
        write_trace(result.expanded_timeline() if args.all_ranks else result.timeline, args.timeline,
                    label=result.scenario.name)
    if args.plot:
        from ovsim.plot import timeline_figure

        save_plot(timeline_figure(result.timeline, title=f"{result.scenario.name} ({result.system.name})",
                                   max_ranks=args.plot_ranks), args.plot)
    if args.json:
        print(json_text(result.to_json(all_ranks=args.all_ranks)))
    elif not args.quiet:
        print(_table(result, args.rows))
        written = written_text(args.timeline, args.plot)
        if written:
            print(written)
    return 0


def _check_expansion(result: Any, max_ops: int | None, source: str) -> None:
    """Refuse --all-ranks where the job's rows would pass the op limit: rank symmetry is what let a
    job of thousands of GPUs run, and writing every rank out would undo it."""
    from ovsim.limits import MAX_OPS

    limit = MAX_OPS if max_ops is None else max_ops
    rows = result.expanded_rows
    n = result.workload.n_ranks
    if rows > limit:
        raise OvsimError(f"every rank of the job is {rows:,} rows, over the limit of {limit:,}; pass a larger "
                         f"--max-ops, or leave out --all-ranks for the {n} rank{'s' if n > 1 else ''} simulated",
                         source=source, field="--all-ranks")


def run_compare(args: argparse.Namespace) -> int:
    from ovsim.api import compare

    check_plot(args.plot)
    bar = Progress(args.quiet or args.json)
    bar.stage(f"predicting {len(args.scenarios)} scenarios")
    try:
        df = compare(args.scenarios, mode=args.mode, max_ops=args.max_ops)
    finally:
        bar.done()
    if args.plot:
        from ovsim.plot_tables import compare_figure

        save_plot(compare_figure(df), args.plot)
    if args.json:
        print(json_text({"scenarios": df.to_dict(orient="records")}))
    elif not args.quiet:
        print(_compare_table(df, [str(f) for f in args.scenarios]))
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


def _compare_table(df: Any, files: list[str]) -> str:
    """The compare table, a row per scenario named as its file names it, or by the file given
    (``files``, in the rows' order) where two names, as shown, would read the same (``ovsim tune
    -o`` keeps the scenario's name)."""
    df = split_slowdown(df)
    cols = [c for c in _COMPARE_COLUMNS if c[0] in df.columns]
    width = max(12, min(40, int(df["scenario"].str.len().max())))
    labels = [str(name)[:width] for name in df["scenario"]]
    if len(set(labels)) < len(labels):
        labels = files
        width = max(12, *(len(f) for f in files))
    lines = [f"{'scenario':<{width}} {'schedule':<10} " + " ".join(f"{h:>10}" for _, h, _ in cols)]
    lines.append("-" * len(lines[0]))
    for label, rec in zip(labels, df.to_dict(orient="records"), strict=True):
        cells = [cell_text(rec.get(key), kind) for key, _, kind in cols]
        lines.append(f"{label:<{width}} {str(rec['schedule'])[:10]:<10} " + " ".join(cells))
    return "\n".join([*lines, "", TABLE_NOTE])
