"""Keep a committed data set compactly: each part's kernel tables in one file, raw traces only where
a fit reads them.

    python calibration/harness/merge_tables.py calibration/data/<gpu>/<date> [...] [--dry-run]

- ``tables/<part>/<experiment>.parquet`` (one file an experiment, as ingest.py wrote them before
  ``--merged-tables``) become ``tables/<part>.parquet`` (ovsim.traces.load.write_tables: zstd, the
  experiment in a column, each experiment's trace metadata kept), read back and checked equal to
  every file before any is removed;
- ``raw/<part>/`` traces are removed except the power part's, which fit_power_clock.py reads (the
  kernel tables hold what the others were imported to);
- PROVENANCE.json keeps every removed file's size and SHA-256, says where it went, and lists the
  merged files'.

The same fitted values come out (``fit_measured.py --dry-run`` and the other fits before and
after), and ``ovsim validate --measured`` gives the same checks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from ingest import RAW_READ, _sha256

from ovsim.errors import OvsimError
from ovsim.traces.load import read_table, read_tables, write_tables

HOW = ("merged with ovsim.traces.load.write_tables (zstd, column experiment, each experiment's trace metadata "
       "kept); read back equal (kernels and metadata) before the files were removed")


def merge_part(folder: Path, dry_run: bool) -> tuple[int, Path]:
    """Merge one part's tables (``folder`` = tables/<part>); returns (files merged, merged file)."""
    files = sorted(folder.glob("*.parquet"))
    out = folder.parent / f"{folder.name}.parquet"
    bundles = {p.stem: read_table(p) for p in files}
    if dry_run:
        return len(files), out
    write_tables(bundles, out)
    back = read_tables(out)
    for label, b in bundles.items():
        got = back[label]
        if not (got.kernels.equals(b.kernels) and (got.gpu_names, got.world_size, got.sources, got.skipped,
                                                   got.wall_origin_s, got.versions)
                == (b.gpu_names, b.world_size, b.sources, b.skipped, b.wall_origin_s, b.versions)):
            out.unlink()
            raise SystemExit(f"{folder / (label + '.parquet')}: the merged table does not read back the same")
    shutil.rmtree(folder)
    return len(files), out


def compact(run: Path, dry_run: bool) -> None:
    prov_path = run / "PROVENANCE.json"
    prov = json.loads(prov_path.read_text()) if prov_path.is_file() else {"files": {}}
    files = prov.setdefault("files", {})
    tables = run / "tables"
    for folder in sorted(p for p in tables.iterdir() if p.is_dir()) if tables.is_dir() else []:
        names = [f"tables/{folder.name}/{p.name}" for p in sorted(folder.glob("*.parquet"))]
        n, out = merge_part(folder, dry_run)
        print(f"{run}: {n} tables of {folder.name} -> {out.name}")
        if dry_run:
            continue
        rel = f"tables/{out.name}"
        for name in names:
            files.setdefault(name, {})["merged_into"] = rel
        files[rel] = {"bytes": out.stat().st_size, "sha256": _sha256(out),
                      "merged_from": {"files": n, "how": HOW}}
    raw = run / "raw"
    for part in sorted(p for p in raw.iterdir() if p.is_dir()) if raw.is_dir() else []:
        if part.name in RAW_READ:
            continue
        gone = sorted(part.rglob("*"))
        print(f"{run}: removing {len(gone)} raw traces of {part.name}")
        if dry_run:
            continue
        for p in gone:
            if p.is_file():
                files.setdefault(str(p.relative_to(run)), {})["removed"] = (
                    f"no fit reads it; its kernels are in tables/{part.name}.parquet")
        shutil.rmtree(part)
    if not dry_run and raw.is_dir() and any(raw.iterdir()):
        prov["raw_traces"] = f"kept for the part(s) a fit reads ({', '.join(RAW_READ)}); the others removed"
    elif not dry_run and raw.is_dir():
        raw.rmdir()
        prov["raw_traces"] = "removed: no fit reads them"
    if not dry_run:
        prov_path.write_text(json.dumps(prov, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("runs", nargs="+", type=Path, help="data set folders (calibration/data/<gpu>/<date>)")
    ap.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")
    args = ap.parse_args(argv)
    for run in args.runs:
        if not run.is_dir():
            print(f"{run}: no such data set folder", file=sys.stderr)
            return 1
        try:
            compact(run, args.dry_run)
        except OvsimError as e:
            print(e, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
