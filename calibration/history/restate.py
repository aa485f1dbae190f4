"""Restate each shipped calibration file lean, and move superseded versions here.

Calibration files used to embed their base file's provenance (``base_provenance``), so each fit
copied the whole history before it: ``h100-sxm5-80gb.v23`` holds about 50 parameters in 10,598
lines, and parsing it was most of a ``predict``'s start. ``ovsim calibrate`` now names the base by
file and checksum instead. This script writes, for each GPU whose newest shipped file still
embeds history, the next version with the same parameters and sources and a provenance that keeps
the newest fit's own record (``base_fit``) and names that file by checksum; then it moves every
version but the newest out of ``ovsim/hw/calib/`` into this folder, which the wheel does not ship.

    python calibration/history/restate.py [--dry-run]

Nothing here changes a parameter: ``ovsim validate`` gives the same figures before and after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from ovsim import __version__
from ovsim.hw.calib import CALIB_DIR, VERSIONED_NAME, read_calib_file

HISTORY = Path(__file__).resolve().parent
EMBEDDED = ("base_provenance", "previous_provenance")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def versions(folder: Path) -> dict[str, list[tuple[int, Path]]]:
    out: dict[str, list[tuple[int, Path]]] = {}
    for p in folder.iterdir():
        if m := VERSIONED_NAME.match(p.name):
            out.setdefault(m["stem"], []).append((int(m["version"]), p))
    return {k: sorted(v) for k, v in out.items()}


def restated(path: Path) -> dict[str, Any] | None:
    """The lean next version of ``path``, or None when it embeds no history."""
    cf = read_calib_file(path)
    if not any(k in cf.provenance for k in EMBEDDED):
        return None
    own = {k: v for k, v in cf.provenance.items() if k not in EMBEDDED}
    return {
        "schema": "ovsim.calib/1",
        "gpu": cf.gpu,
        "version": cf.version + 1,
        "provenance": {
            "kind": f"restated: the parameters and sources of {path.name}, unchanged; its history is named, "
                    "not embedded",
            "date": dt.date.today().isoformat(),
            "ovsim_version": __version__,
            "command": "python calibration/history/restate.py",
            "base": {"file": path.name, "version": cf.version, "sha256": sha256(path),
                     "carried": "every parameter and source, unchanged"},
            "base_fit": own,
        },
        "parameters": cf.parameters,
        "sources": cf.sources,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    for stem, files in sorted(versions(CALIB_DIR).items()):
        newest_v, newest = files[-1]
        doc = restated(newest)
        if doc is not None:
            out = CALIB_DIR / f"{stem}.v{newest_v + 1}.yaml"
            print(f"{newest.name} -> {out.name}")
            if not args.dry_run:
                with open(out, "x", encoding="utf-8") as f:
                    yaml.safe_dump(doc, f, sort_keys=False, width=110)
                files.append((newest_v + 1, out))
        for _, p in files[:-1]:
            print(f"  {p.name} -> calibration/history/")
            if not args.dry_run:
                if (HISTORY / p.name).exists():
                    print(f"{HISTORY / p.name}: exists", file=sys.stderr)
                    return 1
                shutil.move(str(p), HISTORY / p.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
