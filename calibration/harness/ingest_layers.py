"""Turn ``layers.py`` runs into one committed data set.

    python calibration/harness/ingest_layers.py --dest calibration/data/<gpu>/<date> PART=RUN_DIR [PART=RUN_DIR ...]

Each ``RUN_DIR`` is one ``layers.py --out`` folder, named here as a part (``layers`` for layers,
``steps`` for ``--steps``; ``layers_repeat``, ``layers_long`` ... for further runs). Writes under
DEST:

- ``layers.parquet``: every part's tables in one file (zstd), told apart by the columns ``part``
  and ``table`` (``iterations``: milliseconds per phase of each timed iteration; ``kernels``: the
  profiler's kernels; ``annotations``: its GPU ranges; ``nvml``: the clock, power and temperature
  samples), the other columns those of the table's rows;
- ``manifest.json``: each part's manifest as ``layers.py`` wrote it, its shapes completed with the
  fields added to ``LayerShape`` after the run (``attention``, ``dtype``: what the run did;
  ``tp``: read from the shape's name);
- ``PROVENANCE.json``: GPU, driver, harness commit and command of each part, and the size and
  SHA-256 of every file written and of every file read.

A folder without a manifest or a table stops with a one-line message naming it; nothing is
written over an existing DEST unless ``--force``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import pandas as pd

TABLES = ("iterations", "kernels", "annotations", "nvml")


def _sha256(p: Path) -> str:
    with p.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# Fields of layers.py's shapes added after its first runs, with what those runs did.
_EARLIER = {"attention": "flash", "dtype": "bf16"}


def _completed(shape: dict[str, Any]) -> dict[str, Any]:
    """A shape with every field of today's ``LayerShape``: a run from before a field was added ran
    what it now defaults to, and its tensor-parallel degree is the ``-tpN`` in its name."""
    out = {**_EARLIER, **shape}
    if "tp" not in out:
        m = re.search(r"-tp(\d+)", shape["name"])
        out["tp"] = int(m.group(1)) if m else 1
    return out


def read_part(part: str, run: Path) -> tuple[pd.DataFrame, dict[str, Any], dict[str, Any]]:
    """One run's tables (long format), its manifest and the checksums of what was read."""
    if not (run / "manifest.json").is_file():
        raise SystemExit(f"{run}: no manifest.json (not a layers.py output folder)")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["shapes"] = [_completed(s) for s in manifest.get("shapes", [])]
    frames, read = [], {"manifest.json": {"bytes": (run / "manifest.json").stat().st_size,
                                          "sha256": _sha256(run / "manifest.json")}}
    for table in TABLES:
        path = run / f"{table}.parquet"
        if not path.is_file():
            raise SystemExit(f"{path}: missing")
        frames.append(pd.read_parquet(path).assign(part=part, table=table))
        read[path.name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    return pd.concat(frames, ignore_index=True), manifest, read


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, required=True)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("runs", nargs="+", help="PART=RUN_DIR")
    args = ap.parse_args()
    if args.dest.exists() and not args.force:
        raise SystemExit(f"{args.dest}: exists (--force replaces it)")
    frames, manifests, provenance_parts = [], {}, {}
    for item in args.runs:
        part, sep, folder = item.partition("=")
        if not sep or not part or part in manifests:
            raise SystemExit(f"{item}: expected PART=RUN_DIR with a part named once")
        table, manifest, read = read_part(part, Path(folder))
        frames.append(table)
        manifests[part] = manifest
        provenance_parts[part] = {"gpu": manifest.get("gpu"), "smi_before": manifest.get("smi_before"),
                                  "harness_commit": manifest.get("commit"), "started": manifest.get("started"),
                                  "what": manifest.get("what", "layers"), "read": read}
    args.dest.mkdir(parents=True, exist_ok=True)
    data = pd.concat(frames, ignore_index=True)
    data.to_parquet(args.dest / "layers.parquet", index=False, compression="zstd")
    (args.dest / "manifest.json").write_text(json.dumps(manifests, indent=1) + "\n")
    written = [args.dest / "layers.parquet", args.dest / "manifest.json"]
    provenance = {"parts": provenance_parts,
                  "command": "python3 calibration/harness/layers.py --out RUN [--steps] [--only ...], "
                             "then calibration/harness/ingest_layers.py",
                  "files": {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in written}}
    (args.dest / "PROVENANCE.json").write_text(json.dumps(provenance, indent=1) + "\n")
    print(f"{args.dest}: {len(data)} rows of {', '.join(manifests)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
