"""A sweep's results kept in a folder as they finish, so that an interrupted sweep resumes.

The folder holds ``sweep.json``, what identifies the sweep (a fingerprint of the scenario's
mapping, the axes, the fidelity, the op limit, the calibration files any combination reads, and
the shipped calibration versions), and parquet parts ``part-NNNNNN.parquet`` of two columns: the
combination's index in the grid (``point``) and its prediction's summary as JSON (``summary``,
whose numbers JSON carries exactly). A part is written whole or not at all (a temporary file,
then a rename), every ``batch`` results and every ``FLUSH_S`` seconds, and once more when the sweep
stops, finished, failed or interrupted: a killed process loses at most what came since the last part.

Run again with the same folder, a sweep reads the parts, predicts only the combinations not in
them, and returns the same table as one uninterrupted run. A folder that holds another sweep is
refused rather than mixed in.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ovsim.errors import OvsimError

MANIFEST = "sweep.json"
# Seconds between parts while results come in.
FLUSH_S = 10.0


def fingerprint(base: Mapping[str, Any], axes: Mapping[str, Sequence[Any]], mode: str | None, max_ops: int | None,
                calibration_files: Sequence[str]) -> str:
    """What a sweep's results depend on, hashed: the scenario's mapping, the axes, the fidelity, the
    op limit, the bytes of the calibration files its combinations name, and the shipped calibration
    files' names (their versions)."""
    from ovsim.hw.calib import CALIB_DIR

    h = hashlib.sha256()
    h.update(json.dumps([base, {k: list(v) for k, v in axes.items()}, mode, max_ops], sort_keys=True,
                        default=str).encode())
    for f in sorted(set(calibration_files)):
        h.update(f.encode())
        try:
            h.update(Path(f).read_bytes())
        except OSError:
            h.update(b"(unreadable)")  # the prediction itself will say so
    h.update(" ".join(sorted(p.name for p in CALIB_DIR.glob("*.yaml"))).encode())
    return h.hexdigest()


class Journal:
    """The results of one sweep in ``folder`` (module docstring)."""

    def __init__(self, folder: str | Path, print_: str, n_points: int, batch: int) -> None:
        self.folder = Path(folder)
        self.n_points = n_points
        self.batch = max(1, batch)
        self.pending: list[tuple[int, str]] = []
        self.last_flush = time.monotonic()
        manifest = self.folder / MANIFEST
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if manifest.exists():
                held = json.loads(manifest.read_text()).get("fingerprint")
                if held != print_:
                    raise OvsimError("holds the results of another sweep (scenario, axes, mode or calibration "
                                     "differ); give an empty folder or the same sweep", source=str(self.folder),
                                     field="results")
            elif any(self.folder.iterdir()):
                raise OvsimError(f"is not empty and has no {MANIFEST}: not a sweep's results folder",
                                 source=str(self.folder), field="results")
            else:
                _write_atomic(manifest, json.dumps({"fingerprint": print_, "points": n_points}).encode())
        except OSError as e:
            raise OvsimError(f"cannot use: {e.strerror}", source=str(self.folder), field="results") from None
        except json.JSONDecodeError:
            raise OvsimError("is not readable JSON", source=str(manifest), field="fingerprint") from None

    def done(self) -> dict[int, dict[str, Any]]:
        """Summaries already in the folder, by point."""
        import pandas as pd

        out: dict[int, dict[str, Any]] = {}
        for part in sorted(self.folder.glob("part-*.parquet")):
            try:
                df = pd.read_parquet(part)
                rows = zip(df["point"].tolist(), df["summary"].tolist(), strict=True)
                for point, text in rows:
                    if not (isinstance(point, int) and 0 <= point < self.n_points) or point in out:
                        raise OvsimError(f"point {point!r} is out of range or repeated", source=str(part),
                                         field="point")
                    out[point] = json.loads(text)
            except (OSError, ValueError, KeyError) as e:
                raise OvsimError(f"not a readable part of a sweep ({type(e).__name__})", source=str(part),
                                 field="summary") from None
        return out

    def add(self, point: int, summary: Mapping[str, Any]) -> None:
        """Keep one result; write a part when a batch is full or the last part is old enough."""
        self.pending.append((point, json.dumps(summary, allow_nan=True, default=_plain)))
        if len(self.pending) >= self.batch or time.monotonic() - self.last_flush >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Write what is kept as one part."""
        if not self.pending:
            return
        import pandas as pd

        n = 1 + max((int(p.stem.split("-")[1]) for p in self.folder.glob("part-*.parquet")), default=0)
        df = pd.DataFrame({"point": [p for p, _ in self.pending], "summary": [s for _, s in self.pending]})
        path = self.folder / f"part-{n:06d}.parquet"
        tmp = path.with_suffix(".tmp")
        try:
            df.to_parquet(tmp, index=False)
            os.replace(tmp, path)
        except OSError as e:
            raise OvsimError(f"cannot write: {e.strerror}", source=str(path), field="results") from None
        self.pending = []
        self.last_flush = time.monotonic()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _plain(x: Any) -> Any:
    """A numpy scalar as the Python number JSON takes (a summary holds numbers, text, None, bools
    and lists of text; anything else is refused rather than kept as something it was not)."""
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"a sweep summary holds a {type(x).__name__}, which its results folder cannot keep")
