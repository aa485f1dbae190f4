"""``ovsim calibrate``, ``ovsim validate`` and ``ovsim specs``."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ovsim.cli.common import (
    Progress,
    check_gpu,
    check_output,
    check_plot,
    errors_of_flag,
    json_text,
    rows_text,
    save_plot,
)
from ovsim.cli.replay import _check_strict
from ovsim.errors import OvsimError


def run_calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ovsim.calibrate import PowerLog, calibrate, output_path, trace_input, write_calibration
    from ovsim.traces.power import read_power_samples

    if args.gpu != "*":
        check_gpu(args.gpu)
    # The file name and an existing version are refused before the fit, not after it.
    out, _ = output_path(Path(args.output), args.gpu)
    check_output(str(out), "--output", make_folders=True)
    if out.exists():
        raise OvsimError("exists: calibration files are never edited; write a new version", source=str(out),
                         field="--output")
    check_plot(args.plot)
    bar = Progress(args.quiet or args.json)
    assumed: dict[str, str] = {}
    for item in args.trace_gpu or []:
        name, sep, gpu = item.rpartition("=")
        if not sep or not name or not gpu:
            raise OvsimError(f"expected TRACE=GPU, got '{item}'", field="--trace-gpu")
        if name not in args.traces and not any(Path(t).name == name for t in args.traces):
            raise OvsimError(f"'{name}' is not one of the traces given", field="--trace-gpu")
        check_gpu(gpu, "--trace-gpu")
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
        with errors_of_flag("--power-log"):
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
        from ovsim.plot_tables import calibration_figure

        save_plot(calibration_figure(report.points, title=f"{path.name}: fitted against measured (fit error, on the "
                                                           "points fitted)"), args.plot)
    if args.json:
        print(json_text({"file": str(path), "parameters": report.parameters, "fits": report.fits,
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


def run_validate(args: argparse.Namespace) -> int:
    import os
    import sys
    from pathlib import Path

    if args.data is not None:
        data = Path(args.data).resolve()
        if not data.is_dir():
            raise OvsimError("not a folder", source=str(args.data), field="data")
        if "ovsim.validate" in sys.modules and os.environ.get("OVSIM_DATA") != str(data):
            # The checks' data sets are read from the registry when ovsim.validate is imported.
            raise OvsimError("give --data before anything in this process imported ovsim.validate, or set "
                             "OVSIM_DATA", source=str(args.data), field="data")
        os.environ["OVSIM_DATA"] = str(data)
    from ovsim.validate import run

    check_plot(args.plot)
    bar = Progress(args.quiet or args.json)
    traces = Path(args.traces) if args.traces is not None else None
    if traces is not None and not traces.is_dir():
        raise OvsimError("not a folder", source=str(traces), field="traces")
    bar.stage("published figures")
    try:
        checks = run(traces, on_trace=bar.stage, workers=args.workers, studies=args.studies, measured=args.measured)
    finally:
        bar.done()
    if args.plot:
        from ovsim.plot_tables import validate_figure

        save_plot(validate_figure(checks), args.plot)
    passed = sum(c.passed for c in checks)
    if args.json:
        print(json_text({"checks": [c.to_json() for c in checks], "passed": passed, "total": len(checks)}))
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
            error = f"{c.shown_error_pct:>+7.1f}%" if c.shown_error_pct is not None else f"{'':>8}"
            print(f"{name:<58} {c.reference:>10.2f} {c.predicted:>10.2f} {error} {tol:>6}  "
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


def run_specs(args: argparse.Namespace) -> int:
    from ovsim.hw.spec import known_gpus, known_systems, load_gpu, load_system

    gpus = [_gpu_row(load_gpu(n), n) for n in known_gpus()]
    systems = [{"system": n, "gpu": s.gpu, "nodes": s.nodes, "gpus per node": s.gpu_count, "topology": s.topology,
                "NIC GB/s per GPU": round(s.nic_bytes_per_s_per_gpu / 1e9, 1) if s.network else None}
               for n in known_systems() for s in [load_system(n)]]
    if args.json:
        print(json_text({"gpus": gpus, "systems": systems}))
        return 0
    print(rows_text(gpus))
    print("max GHz: top SM clock; BF16 TF: dense BF16 peak as the vendor quotes it; HBM TB/s: peak; "
          "link GB/s: NVLink or xGMI per direction, all links; TDP W: default board power limit")
    print("NIC GB/s per GPU: a GPU's share of its node's NICs per direction, at the line rate (multi-node systems)")
    print()
    print(rows_text(systems))
    return 0


def _gpu_row(g: Any, stem: str) -> dict[str, Any]:
    bf16 = g.compute.peak_flops_per_s.get("bf16")
    return {"gpu": stem, "arch": g.architecture, "SMs": g.sm.count, "max GHz": round(g.clocks.max_sm_clock_hz / 1e9, 3),
            "BF16 TF": round(bf16 / 1e12, 1) if bf16 else None,
            "HBM GB": round(g.memory.capacity_bytes / 1e9, 1),
            "HBM TB/s": round(g.memory.bandwidth_bytes_per_s / 1e12, 2),
            "link GB/s": round(g.links.bandwidth_bytes_per_s / 1e9, 1),
            "TDP W": round(g.power.tdp_w)}
