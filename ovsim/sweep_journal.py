"""A sweep's results kept in a folder as they finish, so that an interrupted sweep resumes.

The folder holds ``sweep.json``, what identifies the sweep (a fingerprint of the scenario's
mapping, the axes in their order, the fidelity, the op limit, ovsim's version, and the system, GPU
and calibration parameters the combinations resolve to; the point count; the axes, from which
:func:`ovsim.sweep.read_results` makes the table), and parquet parts ``part-NNNNNN.parquet``
of two columns: the combination's index in the grid (``point``) and its prediction's summary as
JSON (``summary``, whose numbers JSON carries exactly). A part is written whole or not at all, under
a name no other part has (``ovsim.files.atomic_output``, exclusive: two processes never overwrite
one another's), every ``batch`` results and every ``FLUSH_S`` seconds, and once more when the
sweep stops, finished, failed or interrupted: a killed process loses at most what came since the
last part.

Run again with the same folder, a sweep reads the parts, predicts only the combinations not in
them, and returns the same table as one uninterrupted run. A folder that holds another sweep is
refused rather than mixed in.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ovsim.errors import OvsimError
from ovsim.files import atomic_output

MANIFEST = "sweep.json"
# Seconds between parts while results come in.
FLUSH_S = 10.0


def fingerprint(base: Mapping[str, Any], axes: Mapping[str, Sequence[Any]], mode: str | None, max_ops: int | None,
                resolved: Sequence[str]) -> str:
    """What a sweep's results depend on, hashed: the scenario's mapping, the axes in their order
    (which numbers the combinations), the fidelity, the op limit, ovsim's version and ``resolved``,
    the system, GPU and calibration each combination resolves to (as text)."""
    from ovsim import __version__

    h = hashlib.sha256()
    h.update(json.dumps([base, [[k, list(v)] for k, v in axes.items()], mode, max_ops, __version__],
                        sort_keys=True, default=str).encode())
    for text in resolved:
        h.update(text.encode())
    return h.hexdigest()


class Journal:
    """The results of one sweep in ``folder`` (module docstring)."""

    def __init__(self, folder: str | Path, print_: str, n_points: int, batch: int,
                 axes: Mapping[str, Sequence[Any]] | None = None) -> None:
        self.folder = Path(folder)
        self.n_points = n_points
        self.batch = max(1, batch)
        self.pending: list[tuple[int, str]] = []
        self.last_flush = time.monotonic()
        manifest = self.folder / MANIFEST
        if self.folder.exists() and not self.folder.is_dir():
            raise OvsimError("is a file: give a folder (new or a sweep's results) to keep the results in",
                             source=str(self.folder), field="results")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if not manifest.exists():
                if any(p.name != MANIFEST and not _temporary(p) for p in self.folder.iterdir()):
                    raise OvsimError(f"is not empty and has no {MANIFEST}: not a sweep's results folder",
                                     source=str(self.folder), field="results")
                # Made only if absent: of two sweeps starting on one empty folder, one takes it and
                # the other reads what it wrote.
                try:
                    with atomic_output(manifest, exclusive=True) as tmp:
                        tmp.write_text(json.dumps({"fingerprint": print_, "points": n_points,
                                                   "axes": [[k, list(v)] for k, v in (axes or {}).items()]},
                                                  default=_as_text))
                except OvsimError:
                    if not manifest.exists():
                        raise
            held = json.loads(manifest.read_text())
        except OSError as e:
            raise OvsimError(f"cannot use: {e.strerror}", source=str(self.folder), field="results") from None
        except json.JSONDecodeError:
            raise OvsimError("is not readable JSON", source=str(manifest), field="fingerprint") from None
        if not isinstance(held, dict) or held.get("fingerprint") != print_:
            raise OvsimError("holds the results of another sweep (scenario, axes or their order, mode, system, "
                             "calibration or ovsim's version differ); give an empty folder or the same sweep",
                             source=str(self.folder), field="results")

    def done(self) -> dict[int, dict[str, Any]]:
        """Summaries already in the folder, by point."""
        return kept_summaries(self.folder, self.n_points)

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

        pending, self.pending = self.pending, []
        df = pd.DataFrame({"point": [p for p, _ in pending], "summary": [s for _, s in pending]})
        n = 1 + max((int(p.stem.split("-")[1]) for p in self.folder.glob("part-*.parquet")), default=0)
        while True:
            path = self.folder / f"part-{n:06d}.parquet"
            try:
                with atomic_output(path, exclusive=True) as tmp:
                    df.to_parquet(tmp, index=False)
                break
            except OvsimError:
                if not path.exists():
                    raise
                n += 1  # another process took that number
            except OSError as e:
                raise OvsimError(f"cannot write: {e.strerror}", source=str(path), field="results") from None
        self.last_flush = time.monotonic()


def kept_summaries(folder: Path, n_points: int) -> dict[int, dict[str, Any]]:
    """The summaries a sweep's results ``folder`` keeps, by point (of ``n_points``)."""
    import pandas as pd

    out: dict[int, dict[str, Any]] = {}
    for part in sorted(folder.glob("part-*.parquet")):
        try:
            df = pd.read_parquet(part)
            rows = list(zip(df["point"].tolist(), df["summary"].tolist(), strict=True))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise OvsimError(f"not a readable part of a sweep ({type(e).__name__})", source=str(part),
                             field="summary") from None
        for point, text in rows:
            if not (isinstance(point, int) and 0 <= point < n_points):
                raise OvsimError(f"point {point!r} is not one of the sweep's {n_points}", source=str(part),
                                 field="point")
            try:
                summary = json.loads(text)
            except (TypeError, ValueError):
                summary = None
            if not isinstance(summary, dict):
                raise OvsimError(f"point {point}: not a summary (a JSON object)", source=str(part),
                                 field="summary")
            # The same result kept twice (a part written again after an interruption) is one.
            if out.setdefault(point, summary) != summary:
                raise OvsimError(f"point {point} is kept twice with different results", source=str(part),
                                 field="point")
    return out


def read_manifest(folder: Path) -> dict[str, Any]:
    """A results folder's ``sweep.json``: its fingerprint, point count and axes."""
    manifest = folder / MANIFEST
    try:
        held = json.loads(manifest.read_text())
    except FileNotFoundError:
        raise OvsimError(f"has no {MANIFEST}: not a sweep's results folder", source=str(folder),
                         field="results") from None
    except OSError as e:
        raise OvsimError(f"cannot read: {e.strerror}", source=str(manifest), field="results") from None
    except json.JSONDecodeError:
        raise OvsimError("is not readable JSON", source=str(manifest), field="fingerprint") from None
    if not isinstance(held, dict) or not isinstance(held.get("points"), int):
        raise OvsimError("is not a sweep's manifest (no point count)", source=str(manifest), field="points")
    return held


def _temporary(p: Path) -> bool:
    """A file being written before it takes its name (``ovsim.files.atomic_output``), or left so by
    a killed process."""
    return p.name.startswith(".")


def _as_text(x: Any) -> Any:
    """An axis value JSON does not take, for the manifest: a numpy scalar as its number, anything
    else as its text (the fingerprint's way: the sweep ran on it, so it is not refused here)."""
    return x.item() if hasattr(x, "item") else str(x)


def _plain(x: Any) -> Any:
    """A numpy scalar as the Python number JSON takes (a summary holds numbers, text, None, bools
    and lists of text; anything else is refused rather than kept as something it was not)."""
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"a sweep summary holds a {type(x).__name__}, which its results folder cannot keep")
