"""Turn a harness run folder (``run.py --out RUN_DIR``) into a committed data set.

    python calibration/harness/ingest.py RUN_DIR --dest calibration/data/<gpu>/<date> [--raw-limit-mb 25]
        [--no-clock-tables]

Writes under DEST:

- ``tables/<part>.parquet``: each part's experiments' canonical kernel tables (ovsim's trace
  importer) in one file, the experiment in a column and each one's trace metadata (GPU name,
  wall-clock origin) kept (``ovsim.traces.load.write_tables``; ``ovsim.validate.datasets`` reads
  them): a few hundred short experiments would make as many files of a few KB; with
  ``--no-clock-tables`` none for the ``clock`` part, whose kernels ``clock.parquet`` holds with
  their clocks;
- ``blocks.parquet``: every per-block record (part, experiment, kernel, launch, block, SM, start, end);
- ``clock.parquet``: every kernel of the ``clock`` part with the SM clock its probes counted
  (part, experiment, name, start, duration, clock, how far the clock moved across its group), and
  ``probes.parquet`` the probes' own records (SM, start and end on the global timer, cycles);
- ``raw/<part>/<experiment>.json.gz``: the profiler traces themselves of the parts a fit reads them
  for (``RAW_READ``: the power part's, whose kernels and window fit_power_clock.py takes from
  them), when together they stay under ``--raw-limit-mb`` (otherwise left out, and PROVENANCE.json
  says so);
- ``windows.json``: each experiment's profiled span on the wall clock (``<part>/<label>``: [start,
  end], seconds since 1970, UTC), what power samples are placed against without the raw traces;
- ``manifest.json``, ``experiments.jsonl`` and ``ncu/metrics.csv`` as the run wrote them, and the
  power logs ``power.csv`` (and ``power_average.csv``) gzip-compressed as ``power.csv.gz`` (and
  ``power_average.csv.gz``): ovsim's power-log reader takes either;
- ``summary.json``: slowdowns of kernels overlapped with communication (in the ``copy`` part, with
  copies) against the same kernels alone, per-block residency of the shaped GEMM, and the dispatch
  probes' outcome (``analysis.py``);
- ``PROVENANCE.json``: the harness commit and GPU from the manifest, and the size and SHA-256 of
  every file written.

Parquet files are zstd-compressed (the per-block stamps delta-encoded too) and the power logs
gzip-compressed: a data set travels with the repository, and these shrink it by about half
(data sets ingested before, with snappy parquet and plain logs, read the same).

A folder that is not a complete run, or a trace the importer cannot read, stops with a one-line
message naming the file; nothing is written over an existing DEST unless ``--force``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from analysis import (
    HarnessDataError,
    clock_points,
    dispatch_order,
    overlap_slowdowns,
    profiled_window,
    read_blocks,
    read_clock_probes,
    residency,
)

from ovsim.errors import OvsimError
from ovsim.traces.load import load_trace, write_tables
from ovsim.traces.table import TraceBundle

# The parts whose kernels are compared alone and beside something, and what that something is.
PARQUET_COMPRESSION: Literal["zstd"] = "zstd"
SLOWDOWN_PARTS = {"overlap": "collective", "smloss": "other", "shaping": "collective", "copy": "copy",
                  "power": "collective", "framework": "collective", "framework_copy": "copy"}


class IngestError(Exception):
    pass


def _experiments(run: Path) -> list[dict[str, Any]]:
    out = []
    for listing in sorted(run.glob("*/experiments.jsonl")):
        for n, line in enumerate(listing.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                e = json.loads(line)
            except json.JSONDecodeError as err:
                raise IngestError(f"{listing}:{n}: not JSON ({err.msg})") from None
            if not isinstance(e, dict) or "label" not in e or "part" not in e:
                raise IngestError(f"{listing}:{n}: label/part: missing")
            e["_folder"] = listing.parent
            out.append(e)
    if not out and not any((run / name).is_file() for name in NCU_FILES):
        raise IngestError(f"{run}: no <part>/experiments.jsonl: not a harness run folder, or no part finished")
    # A part run twice into one folder (by a harness that appended) lists an experiment twice; its
    # trace and blocks are the last run's, so the last line describes them.
    last = {(e["part"], e["label"]): e for e in out}
    return list(last.values())


# The Nsight Compute parts' tables, kept as ncu wrote them (their parts list no experiments: a run of
# them alone is a data set too).
NCU_FILES = ("ncu/metrics.csv", "framework_ncu/metrics.csv", "own_tiles_ncu/metrics.csv")
# Parts whose raw traces a fit reads (fit_power_clock.py: a power phase's kernels and window).
RAW_READ = ("power",)


def _sha256(p: Path) -> str:
    with open(p, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def ingest(run: Path, dest: Path, *, raw_limit_bytes: int, force: bool = False,
           clock_tables: bool = True) -> dict[str, Any]:
    """Write the data set; returns the summary. It is built beside DEST and moved into place only
    when complete, so a run that stops with an error leaves DEST as it was."""
    if dest.exists() and any(dest.iterdir()) and not force:
        raise IngestError(f"{dest}: exists and is not empty; pass --force to write over it")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        summary = _build(run, partial, raw_limit_bytes, clock_tables)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    return summary


def _build(run: Path, dest: Path, raw_limit_bytes: int, clock_tables: bool) -> dict[str, Any]:
    manifest_path = run / "manifest.json"
    if not manifest_path.is_file():
        raise IngestError(f"{manifest_path}: missing: not a harness run folder")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as err:
        raise IngestError(f"{manifest_path}: not JSON ({err.msg})") from None
    experiments = _experiments(run)
    # Made here, not by the first file written: a run of the clock part alone without its tables
    # writes clock.parquet first.
    dest.mkdir(parents=True)

    traces: list[tuple[dict[str, Any], Path]] = []
    for e in experiments:
        trace = e["_folder"] / f"{e['label']}.json.gz"
        if not trace.is_file():
            raise IngestError(f"{trace}: missing (listed in {e['_folder'] / 'experiments.jsonl'})")
        traces.append((e, trace))

    tables: list[pd.DataFrame] = []
    by_part: dict[str, dict[str, TraceBundle]] = {}
    blocks: list[pd.DataFrame] = []
    clocks: list[pd.DataFrame] = []
    probes: list[pd.DataFrame] = []
    windows: dict[str, list[float]] = {}
    for e, trace in traces:
        try:
            bundle = load_trace(trace)
        except OvsimError as err:
            raise IngestError(str(err)) from None
        try:
            doc = json.loads(gzip.decompress(trace.read_bytes()))
            windows[f"{e['part']}/{e['label']}"] = list(profiled_window(doc))
        except HarnessDataError as err:
            raise IngestError(f"{trace}: {err}") from None
        except KeyError as err:
            raise IngestError(f"{trace}: {err.args[0]}: missing, so the experiment has no place on the wall clock") \
                from None
        # The trace's path inside the run, not on the machine that ingested it: the data set is
        # committed, and its raw traces (when kept) sit under raw/ at that path.
        bundle = replace(bundle, sources={k: f"{e['part']}/{trace.name}" for k in bundle.sources})
        if clock_tables or e["part"] != "clock":
            by_part.setdefault(e["part"], {})[e["label"]] = bundle
        tables.append(bundle.kernels.assign(part=e["part"], experiment=e["label"]))
        rec = e["_folder"] / f"{e['label']}.blocks.csv"
        if rec.is_file():
            try:
                b = read_blocks(rec)
            except HarnessDataError as err:
                raise IngestError(str(err)) from None
            # The profiler must have seen the harness's own kernels, or the slowdowns would be
            # computed with no collective beside them.
            missing = sorted(set(b["kernel"]) - set(bundle.kernels["name"]))
            if missing:
                raise IngestError(f"{trace}: name: no {', '.join(missing)} kernel in the trace, though "
                                  f"{rec.name} has its blocks: the profiler did not record the harness kernels")
            blocks.append(b.assign(part=e["part"], experiment=e["label"]))
        probe_file = e["_folder"] / f"{e['label']}.clock.csv"
        if probe_file.is_file():
            try:
                probe = read_clock_probes(probe_file)
                points = clock_points(bundle.kernels, probe)
            except HarnessDataError as err:
                raise IngestError(f"{probe_file}: {err}") from None
            clocks.append(points.assign(part=e["part"], experiment=e["label"]))
            probes.append(probe.assign(part=e["part"], experiment=e["label"]))
    for part, bundles in sorted(by_part.items()):
        (dest / "tables").mkdir(parents=True, exist_ok=True)
        write_tables(bundles, dest / "tables" / f"{part}.parquet", compression=PARQUET_COMPRESSION)
    all_blocks = pd.concat(blocks, ignore_index=True) if blocks else pd.DataFrame()
    if len(all_blocks):
        # The globaltimer stamps are large integers a few microseconds apart: delta encoding halves
        # the file beside zstd alone.
        ints = [c for c in all_blocks.columns if pd.api.types.is_integer_dtype(all_blocks[c])]
        all_blocks.to_parquet(dest / "blocks.parquet", index=False, compression=PARQUET_COMPRESSION,
                              use_dictionary=[c for c in all_blocks.columns if c not in ints],
                              column_encoding=dict.fromkeys(ints, "DELTA_BINARY_PACKED"))

    if clocks:
        pd.concat(clocks, ignore_index=True).to_parquet(dest / "clock.parquet", index=False,
                                                        compression=PARQUET_COMPRESSION)
        pd.concat(probes, ignore_index=True).to_parquet(dest / "probes.parquet", index=False,
                                                        compression=PARQUET_COMPRESSION)

    # The raw traces a fit reads: the rest are what the kernel tables were imported from.
    raw = [(e, t) for e, t in traces if e["part"] in RAW_READ]
    raw_total = sum(t.stat().st_size for _, t in raw)
    raw_kept = raw_total <= raw_limit_bytes
    if raw_kept:
        for e, trace in raw:
            target = dest / "raw" / e["part"] / trace.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(trace, target)
    with open(dest / "experiments.jsonl", "w") as f:
        for e in experiments:
            f.write(json.dumps({k: v for k, v in e.items() if k != "_folder"}) + "\n")
    (dest / "windows.json").write_text(json.dumps(windows, indent=1))
    for name in ("manifest.json", *NCU_FILES):
        if (run / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(run / name, dest / name)
    for name in ("power.csv", "power_average.csv"):
        if (run / name).is_file():
            # mtime=0: the same log always gives the same bytes, so its checksum names its content.
            with open(run / name, "rb") as src, open(dest / f"{name}.gz", "wb") as raw_out, \
                    gzip.GzipFile(filename=name, mode="wb", fileobj=raw_out, mtime=0) as dst:
                shutil.copyfileobj(src, dst)

    summary = summarize(pd.concat(tables, ignore_index=True), all_blocks, experiments) if tables else {}
    (dest / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    files = sorted(p for p in dest.rglob("*") if p.is_file() and p.name != "PROVENANCE.json")
    provenance = {
        "gpu": manifest.get("gpu"), "driver": manifest.get("driver"), "harness_commit": manifest.get("commit"),
        "date_utc": manifest.get("date_utc"), "command": "python calibration/harness/run.py, then ingest.py",
        "raw_traces": (f"kept for the part(s) a fit reads ({', '.join(RAW_READ)})" if raw_kept
                       else f"left out: {raw_total / 1e6:.1f} MB over the limit"),
        **({} if clock_tables else {"clock_tables": "left out: the clock part's kernels are in clock.parquet"}),
        "tables": "tables/<part>.parquet: one row per kernel, column experiment",
        "files": {str(p.relative_to(dest)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files},
    }
    (dest / "PROVENANCE.json").write_text(json.dumps(provenance, indent=1))
    return summary


def summarize(kernels: pd.DataFrame, blocks: pd.DataFrame, experiments: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    slowdowns = []
    for part, overlapper in SLOWDOWN_PARTS.items():
        sel = kernels[kernels["part"] == part]
        if overlapper == "other":
            # The SM-holding probe computes nothing; ovsim's importer files unknown names as
            # elementwise, which would make it a victim rather than what the victims ran beside.
            probe = sel["name"].astype(str).str.startswith("ovsim_probe_")
            sel = sel.assign(kind=sel["kind"].where(~probe, "other"))
        if len(sel):
            sd = overlap_slowdowns(sel, by=("part", "experiment"), overlapper=overlapper)
            if len(sd):
                slowdowns += sd[sd["overlapped_n"] > 0].to_dict("records")
    if slowdowns:
        out["slowdowns"] = sorted(slowdowns, key=lambda r: (r["part"], r["experiment"], str(r["name"])))
    if len(blocks):
        shaped = blocks[(blocks["part"] == "shaping") & (blocks["kernel"] == "ovsim_gemm_tile64")]
        rows = []
        for label, g in shaped.groupby("experiment", sort=True):
            r = residency(g)
            rows.append({"experiment": label, "max_resident_per_sm": int(r["max_resident_per_sm"].max()),
                         "block_s_median": float(r["block_s_median"].median()),
                         "span_s_median": float(r["span_s"].median())})
        if rows:
            out["shaping_residency"] = rows
        probes = []
        for label, g in blocks[blocks["part"] == "dispatch"].groupby("experiment", sort=True):
            second = "ovsim_probe_second" if (g["kernel"] == "ovsim_probe_second").any() else "ovsim_channel_copy"
            try:
                probes.append({"experiment": label, **dispatch_order(g, "ovsim_probe_first", second)})
            except HarnessDataError as err:
                raise IngestError(f"dispatch/{label}.blocks.csv: {err}") from None
        if probes:
            out["dispatch"] = probes
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the folder run.py --out wrote")
    ap.add_argument("--dest", type=Path, required=True, help="data set folder to write")
    ap.add_argument("--raw-limit-mb", type=float, default=25.0, help="keep the raw traces only under this total")
    ap.add_argument("--force", action="store_true", help="write over a non-empty DEST")
    ap.add_argument("--no-clock-tables", action="store_true",
                    help="write no kernel tables for the clock part (clock.parquet holds its kernels and clocks)")
    args = ap.parse_args(argv)
    try:
        summary = ingest(args.run, args.dest, raw_limit_bytes=int(args.raw_limit_mb * 1e6), force=args.force,
                         clock_tables=not args.no_clock_tables)
    except IngestError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for row in summary.get("slowdowns", []):
        print(f"{row['experiment']:<60} {row['name'][:40]:<40} x{row['slowdown']:.3f}")
    for row in summary.get("dispatch", []):
        print(f"{row['experiment']:<40} second went ahead: {row['second_went_ahead']} "
              f"(waited {row['second_wait_s'] * 1e3:.3f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
