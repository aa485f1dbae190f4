"""Open any supported trace: the format is chosen from the path, or named."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from ovsim.errors import OvsimError
from ovsim.files import atomic_output
from ovsim.traces import FORMATS
from ovsim.traces.table import TraceBundle, merge_versions, validate_table

Format = Literal["auto", "kineto", "nsys-sqlite", "nsys-csv", "parquet"]


def detect_format(path: Path) -> str:
    name = path.name.lower()
    if path.is_dir() or name.endswith((".json", ".json.gz", ".tar.gz", ".tgz", ".tar")):
        return "kineto"
    if name.endswith((".sqlite", ".sqlite3", ".db")):
        return "nsys-sqlite"
    if name.endswith(".csv"):
        return "nsys-csv"
    if name.endswith(".parquet"):
        return "parquet"
    raise OvsimError("cannot tell the trace format from the name; pass --format "
                     "(kineto, nsys-sqlite, nsys-csv, parquet)", source=str(path), field="format")


def _load_one(path: Path, fmt: str) -> TraceBundle:
    if not path.exists():
        raise OvsimError("no such file or folder", source=str(path))
    kind = detect_format(path) if fmt == "auto" else fmt
    if kind == "kineto":
        from ovsim.traces.kineto import load_kineto
        return load_kineto(path)
    if kind == "nsys-sqlite":
        from ovsim.traces.nsys import load_nsys_sqlite
        return load_nsys_sqlite(path)
    if kind == "nsys-csv":
        from ovsim.traces.nsys_csv import load_nsys_csv
        return load_nsys_csv(path)
    if kind == "parquet":
        return read_table(path)
    raise OvsimError(f"unknown format '{fmt}'; expected one of {', '.join(FORMATS)}", source=str(path),
                     field="format")


def load_trace(paths: str | Path | Sequence[str | Path], fmt: str = "auto") -> TraceBundle:
    """One bundle from one trace, or from several files that are different ranks of one run."""
    items = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    if not items:
        raise OvsimError("no trace given", field="path")
    bundles = [_load_one(p, fmt) for p in items]
    if len(bundles) == 1:
        return bundles[0]
    seen: dict[int, str] = {}
    for p, b in zip(items, bundles, strict=True):
        for r in b.kernels["rank"].dropna().unique():
            if int(r) in seen:
                raise OvsimError(f"rank {int(r)} appears in both {seen[int(r)]} and {p}", source=str(p), field="rank")
            seen[int(r)] = str(p)
    skipped: dict[str, int] = {}
    for b in bundles:
        for k, v in b.skipped.items():
            skipped[k] = skipped.get(k, 0) + v
    syncs = [b.syncs for b in bundles if b.syncs is not None]
    sizes = {b.world_size for b in bundles if b.world_size is not None}
    return TraceBundle(
        kernels=pd.concat([b.kernels for b in bundles], ignore_index=True),
        gpu_names={r: n for b in bundles for r, n in b.gpu_names.items()},
        world_size=max(sizes) if sizes else None,
        sources={r: s for b in bundles for r, s in b.sources.items()},
        skipped=skipped,
        syncs=pd.concat(syncs, ignore_index=True) if syncs else None,
        # Files on different clocks have no one wall-clock origin.
        wall_origin_s=origins.pop() if len(origins := {b.wall_origin_s for b in bundles}) == 1 else None,
        versions=merge_versions([b.versions for b in bundles]),
    )


def write_table(bundle: TraceBundle, path: str | Path, *, compression: str = "snappy") -> None:
    """Save the canonical table as parquet, with the GPU names and sources in its metadata
    (``compression``: any codec pyarrow writes; readers need nothing to tell them which)."""
    _write_parquet(bundle.kernels, {"schema": "ovsim.kernels/1", **_bundle_meta(bundle)}, path, compression)


def _bundle_meta(bundle: TraceBundle) -> dict[str, Any]:
    return {"gpu_names": bundle.gpu_names, "world_size": bundle.world_size, "sources": bundle.sources,
            "skipped": bundle.skipped, "wall_origin_s": bundle.wall_origin_s, "versions": bundle.versions}


def _write_parquet(frame: pd.DataFrame, doc: dict[str, Any], path: str | Path, compression: str) -> None:
    """``frame`` as parquet at ``path`` (written whole or not at all), ``doc`` as JSON under the
    metadata key ``ovsim``."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"ovsim"] = json.dumps(doc).encode()
    try:
        with atomic_output(path) as tmp:
            pq.write_table(table.replace_schema_metadata(meta), str(tmp), compression=compression)
    except OSError as e:
        raise OvsimError(f"cannot write: {e}", source=str(path), field="output") from None


EXPERIMENT = "experiment"


def write_tables(bundles: dict[str, TraceBundle], path: str | Path, *, compression: str = "zstd") -> None:
    """Save several runs' canonical tables as one parquet file (a data set's experiments of one
    kind: hundreds of short runs make as many files of a few KB otherwise), each run's rows
    marked by its label in column ``experiment`` and its bundle fields in the metadata."""
    frames = [b.kernels.assign(**{EXPERIMENT: label}) for label, b in sorted(bundles.items())]
    doc = {"schema": "ovsim.kernel-sets/1",
           "experiments": {label: _bundle_meta(b) for label, b in sorted(bundles.items())}}
    _write_parquet(pd.concat(frames, ignore_index=True), doc, path, compression)


def read_tables(path: str | Path) -> dict[str, TraceBundle]:
    """The runs :func:`write_tables` saved in ``path``, by label, each as :func:`read_table` would
    read it from a file of its own."""
    table = _read_parquet(path)
    doc = _json_metadata((table.schema.metadata or {}).get(b"ovsim"), str(path))
    experiments = doc.get("experiments") if isinstance(doc, dict) else None
    if not isinstance(experiments, dict) or EXPERIMENT not in table.column_names:
        raise OvsimError("not a table of several runs (no experiments in its metadata, or no experiment column)",
                         source=str(path), field="metadata.experiments")
    df = table.to_pandas()
    rows = df.groupby(EXPERIMENT, sort=False).indices
    unknown = sorted(set(map(str, rows)) - set(map(str, experiments)))
    if unknown:
        raise OvsimError(f"rows of experiment(s) {unknown[:3]} that the metadata does not list", source=str(path),
                         field=EXPERIMENT)
    out: dict[str, TraceBundle] = {}
    for label, m in experiments.items():
        source = f"{path} ({EXPERIMENT} {label})"
        meta = _checked_metadata(m, source)
        kernels = df.iloc[rows.get(label, [])].drop(columns=EXPERIMENT).reset_index(drop=True)
        out[str(label)] = TraceBundle(kernels=validate_table(kernels, source), **meta)
    return out


def read_table(path: str | Path) -> TraceBundle:
    table = _read_parquet(path)
    meta = _checked_metadata(_json_metadata((table.schema.metadata or {}).get(b"ovsim"), str(path)), str(path))
    return TraceBundle(kernels=validate_table(table.to_pandas(), str(path)), **meta)


def _read_parquet(path: str | Path) -> Any:
    """The parquet file at ``path`` as a pyarrow table; a file that is not one is a one-line error."""
    import pyarrow.parquet as pq

    try:
        return pq.read_table(str(path))
    except Exception as e:  # pyarrow raises several types for a file that is not parquet
        raise OvsimError(f"not a readable parquet file ({type(e).__name__})", source=str(path),
                         field="parquet") from None


def _json_metadata(raw: bytes | None, source: str) -> Any:
    """The JSON a writer here stored under the metadata key ``ovsim`` (``{}`` where there is none)."""
    import json

    try:
        return json.loads(raw) if raw else {}
    except ValueError as e:
        raise OvsimError(f"the ovsim metadata is not JSON ({e})", source=source, field="metadata") from None


def _checked_metadata(meta: Any, source: str) -> dict[str, Any]:
    """The bundle fields ``write_table`` stored in the parquet metadata (``meta``, its JSON read),
    checked: a file written by something else, or edited, must not turn into a wrong GPU or clock."""
    if not isinstance(meta, dict):
        raise OvsimError("the ovsim metadata is not an object", source=source, field="metadata")

    def mapping(key: str, value_type: type, by_rank: bool) -> dict[Any, Any]:
        m = meta.get(key) or {}
        try:
            ok = isinstance(m, dict) and all(isinstance(v, value_type) and not isinstance(v, bool) for v in m.values())
            out = {int(k) if by_rank else str(k): v for k, v in m.items()} if ok else None
        except ValueError:
            out = None
        if out is None:
            kind = "rank" if by_rank else "name"
            raise OvsimError(f"expected a mapping of {kind} to {value_type.__name__}", source=source,
                             field=f"metadata.{key}")
        return out

    def number(key: str, count: bool) -> Any:
        v = meta.get(key)
        ok = v is None or (not isinstance(v, bool) and isinstance(v, int if count else int | float)
                           and math.isfinite(v) and (v >= 1 or not count))
        if not ok:
            what = "a positive integer" if count else "a finite number"
            raise OvsimError(f"expected {what}, got {v!r}", source=source, field=f"metadata.{key}")
        return v

    return {"gpu_names": mapping("gpu_names", str, True), "sources": mapping("sources", str, True),
            "skipped": mapping("skipped", int, False), "versions": mapping("versions", str, False),
            "world_size": number("world_size", True), "wall_origin_s": number("wall_origin_s", False)}
