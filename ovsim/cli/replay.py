"""``ovsim replay`` and ``ovsim import``."""

from __future__ import annotations

import argparse
from typing import Any

from ovsim.cli.common import (
    Progress,
    check_extension,
    check_gpu,
    check_output,
    check_plot,
    fmt_s,
    json_text,
    pct_text,
    save_plot,
    skipped_text,
    written_text,
)
from ovsim.errors import OvsimError


def _replay_table(result: Any, max_rows: int) -> str:
    s = result.summary
    kinds = [f"{s['compute_kernels']} compute", f"{s['collective_kernels']} collective",
             *(f"{n} {kind}" for kind, n in s.get("other_kernels", {}).items())]
    lines = [
        f"trace      {', '.join(s['sources'].values()) or '-'}",
        f"gpu        {s['gpu']}, {s['ranks']} rank(s), {s['kernels']} activities ({', '.join(kinds)})",
        f"overlap    {s['overlapped_compute_kernels']} compute kernels overlapped communication; "
        f"{s['scored_kernels']} scored, {s['unscored_no_isolated_source']} without an isolated duration",
        f"MAPE       ovsim {pct_text(s['mape_pct'])}   naive (no contention) {pct_text(s['naive_mape_pct'])}",
        f"weighted   ovsim {pct_text(s['weighted_error_pct'])}   naive {pct_text(s['naive_weighted_error_pct'])}   "
        "(sum of |error| over sum of measured time)",
        f"comm       exposed, all ranks: measured {fmt_s(s['exposed_comm_measured_s'])} ms, predicted "
        f"{fmt_s(s['exposed_comm_predicted_s'])} ms; hidden under compute: measured "
        f"{pct_text(s['hidden_pct_measured'])}, predicted {pct_text(s['hidden_pct_predicted'])}",
        f"span       measured {fmt_s(s['measured_span_s'])} ms, predicted {fmt_s(s['predicted_span_s'])} ms "
        f"({s['span_error_pct']:+.1f}%)",
    ]
    if s["scored_faster_than_alone"]:
        lines.append(f"note       {s['scored_faster_than_alone']} scored kernel(s) ran over 1.5x faster than their "
                     "runs without communication: most likely another problem size behind the same launch, "
                     "whose error is the isolated time's, not contention's")
    if s["skipped"]:
        lines.append("skipped    " + skipped_text(s["skipped"]))
    lines.append(f"calibrated {', '.join(s['calibration_files'])}")
    k = result.kernels
    k = k[k["overlapped"]]
    if len(k):
        lines += ["", f"{'overlapped kernel':<40} {'rank':>4} {'measured ms':>11} {'predicted ms':>12} "
                      f"{'alone ms':>9}  isolated from"]
        for rec in k.head(max_rows).itertuples(index=False):
            lines.append(f"{str(rec.name)[:40]:<40} {rec.rank:>4} {fmt_s(rec.measured_duration_s):>11} "
                         f"{fmt_s(rec.predicted_duration_s):>12} {fmt_s(rec.isolated_s):>9}  {rec.isolated_source}")
        if len(k) > max_rows:
            lines.append(f"... {len(k) - max_rows} more (use --json for all)")
        lines += ["", "isolated from: where 'alone' comes from, never the kernel's own overlapped run. signature: "
                      "the median of the same kernel (name, launch, operator shapes) where it ran without "
                      "communication (scored); ambiguous: those runs disagree, one launch for several problem sizes "
                      "(the median, not scored); none: no such run (its measured time, not scored)"]
    return "\n".join(lines)


def _check_strict(bundle: Any, source: str, strict: bool) -> None:
    """With ``--strict``, an event the importer skipped (malformed, or of a kind it cannot use) is an
    error rather than a count in the summary."""
    if strict and bundle.skipped:
        raise OvsimError(f"skipped events ({skipped_text(bundle.skipped)}); without --strict they are left out "
                         "and counted", source=source, field="--strict")


def run_replay(args: argparse.Namespace) -> int:
    from ovsim.replay import replay
    from ovsim.traces.load import load_trace
    from ovsim.traces.perfetto import replay_trace_events, write_json

    check_gpu(args.gpu)
    check_output(args.timeline, "--timeline")
    check_extension(args.timeline, "--timeline", (".json",), "a Perfetto (Chrome trace) JSON file")
    check_plot(args.plot)
    bar = Progress(args.quiet or args.json)
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

        save_plot(replay_figure(result, title=f"replay of {', '.join(args.traces)}", max_ranks=args.plot_ranks),
                   args.plot)
    if args.json:
        print(json_text(result.to_json()))
    elif not args.quiet:
        print(_replay_table(result, args.rows))
        written = written_text(args.timeline, args.plot)
        if written:
            print(written)
    return 0


def run_import(args: argparse.Namespace) -> int:
    from ovsim.traces.load import load_trace, write_table

    check_output(args.output, "--output")
    if not args.output.lower().endswith((".parquet", ".pq")):
        # The canonical table is parquet only: a .csv name would hold parquet bytes.
        raise OvsimError("the kernel table is written as parquet; name it .parquet", source=args.output,
                         field="--output")
    bar = Progress(args.quiet)
    bar.stage(f"reading {', '.join(args.traces)}")
    try:
        bundle = load_trace(args.traces, args.format)
        _check_strict(bundle, ", ".join(args.traces), args.strict)
        if bundle.kernels.empty:
            skipped = skipped_text(bundle.skipped) or "nothing"
            raise OvsimError(f"no GPU activity left to write (skipped: {skipped})", source=", ".join(args.traces),
                             field="traceEvents")
        bar.stage(f"writing {args.output}")
        write_table(bundle, args.output)
    finally:
        bar.done()
    if not args.quiet:
        k = bundle.kernels
        skipped = skipped_text(bundle.skipped) or "none"
        print(f"{len(k)} activities from {k['rank'].nunique()} rank(s) written to {args.output}; skipped: {skipped}")
    return 0
