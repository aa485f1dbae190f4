"""``calibrate``: the fits in order, their points, and the calibration file written with provenance."""

from __future__ import annotations

import datetime as _dt
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from ovsim.calibrate.collectives import _collective_rows, collective_time_s, fit_collectives
from ovsim.calibrate.contention import (
    SM_FRACTIONS,
    ContentionData,
    contention_data,
    contention_slowdown,
    contention_time_s,
    fit_contention,
    held,
)
from ovsim.calibrate.gemm import fit_gemm, gemm_points, gemm_shapes, gemm_time_s, library_gemm_times
from ovsim.calibrate.inputs import GPU_SPECIFIC, POINT_COLUMNS, QUANTITIES, FitReport, TraceInput, _plain
from ovsim.calibrate.memory import fit_memory, memory_points, memory_time_s
from ovsim.calibrate.overhead import fit_overhead, overhead_points
from ovsim.calibrate.power import PowerSamples, fit_power_logs, power_samples
from ovsim.errors import OvsimError
from ovsim.files import atomic_output
from ovsim.hw.calib import (
    CALIB_DIR,
    VERSIONED_NAME,
    Parameters,
    newest_file,
    read_calib_file,
    shipped_parameters,
)
from ovsim.hw.spec import gpu_file, load_gpu


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fit_points(quantity: str, traces: Sequence[TraceInput], params: Parameters, values: dict[str, Any], *,
               contention: Sequence[ContentionData] | None = None,
               power: Sequence[PowerSamples] | None = None, gemm_frame: str = "grid") -> pd.DataFrame:
    """The measured points the fit of ``quantity`` used, each beside what ``params`` with the fitted
    ``values`` on top predict for it (columns :data:`POINT_COLUMNS`). ``params`` are the ones the fit
    started from; ``contention`` and ``power``: the prepared data of those fits, in trace order."""
    p = params.merged(values)
    rows: list[tuple[str, str, str, str, float, float, float]] = []

    def add(group: str, trace: str, unit: str, measured: Any, fitted: Any, baseline: Any = None) -> None:
        m, f = np.asarray(measured, dtype=float), np.asarray(fitted, dtype=float)
        b = np.full(len(m), np.nan) if baseline is None else np.asarray(baseline, dtype=float)
        rows.extend((quantity, group, trace, unit, float(x), float(y), float(z))
                    for x, y, z in zip(m, f, b, strict=True))

    if quantity == "overhead":
        for label, timed in overhead_points(traces)[0].items():
            t = [d for d, cls in timed if cls == "elementwise"]
            add("elementwise", label, "s", t, [p.kernel_overhead_s] * len(t))
    elif quantity == "gemm" and gemm_frame == "scenario":
        for tr in traces:
            gpu = load_gpu(tr.gpu)
            for prec, problems in sorted(gemm_shapes([tr]).items()):
                scored = [r[:5] for r in problems if r[5] and prec in values.get("gemm_efficiency", {})]
                if scored:
                    add(prec, tr.label, "s", [r[4] for r in scored], library_gemm_times(scored, prec, gpu, p))
    elif quantity == "gemm":
        for tr in traces:
            aligned_eff, unaligned_eff = values.get("gemm_efficiency", {}), values.get("gemm_unaligned_efficiency", {})
            for prec, gemms in sorted(gemm_points([tr]).items()):
                for aligned, group, fitted in ((True, prec, aligned_eff), (False, f"{prec} unaligned", unaligned_eff)):
                    rows_of = [g for g in gemms if g[4] == aligned]
                    if prec not in fitted or not rows_of:
                        continue
                    arr = np.array([g[:4] for g in rows_of], dtype=float)
                    inverse = 1.0 / p.gemm_eff(prec, aligned)
                    add(group, tr.label, "s", arr[:, 0],
                        gemm_time_s(arr[:, 1], arr[:, 2], inverse, p.gemm_tile_s(prec), p.kernel_overhead_s))
    elif quantity == "memory":
        fitted_classes = ({"elementwise"} if "memory_kernel_efficiency" in values else set()) | \
            set(values.get("memory_kind_efficiency", {}))
        for tr in traces:
            for cls, streams in sorted(memory_points([tr])[0].items()):
                if cls in fitted_classes:
                    arr = np.array(streams, dtype=float)
                    add(cls, tr.label, "s", arr[:, 0],
                        memory_time_s(arr[:, 1], p.hbm_achievable_fraction * p.memory_eff(cls), p.kernel_overhead_s))
    elif quantity == "collectives":
        for tr in traces:
            for key, sizes in _collective_rows(tr.bundle).items():
                fit = values.get("nccl_fitted", {}).get(key)
                if fit is not None:
                    arr = np.array(sizes, dtype=float)
                    add(key, tr.label, "s", arr[:, 1],
                        collective_time_s(arr[:, 0], fit["latency_s"], fit["bus_bandwidth_bytes_per_s"]))
    elif quantity == "contention":
        data = contention if contention is not None else [contention_data(tr) for tr in traces]
        j = SM_FRACTIONS.index(p.replay_collective_sm_fraction)
        pressure, fraction = values.get("nccl_memory_pressure", {}), values.get("replay_hbm_fraction", {})
        for d in data:
            slow = np.array([contention_slowdown(k, held(ps, j), pressure, fraction, params, m)
                             for k, ps, m in d.config])
            kinds = [k for k, _, _ in d.config]
            pred = contention_time_s(d, j, slow) if len(slow) else np.empty(0)
            for kind in sorted(set(kinds)):
                sel = np.array([k == kind for k in kinds])
                add(kind, d.label, "s", d.measured_s[sel], pred[sel], d.isolated_s[sel])
    elif quantity == "power":
        from ovsim.hw.power import fit_table_power_w, power_model

        # A power fit is of one GPU (GPU_SPECIFIC): every trace ran on it.
        model = power_model(load_gpu(traces[0].gpu), p)
        for s in power if power is not None else [power_samples(tr, log) for tr in traces for log in tr.power_logs]:
            cols = {c: s.table[c].to_numpy(dtype=float) for c in s.table.columns}
            add(s.log, s.label, "W", cols["power_w"], fit_table_power_w(cols, model), cols["predicted_w"])
    else:
        raise OvsimError(f"unknown quantity '{quantity}' (known: {', '.join(QUANTITIES)})", field="fit")
    frame = pd.DataFrame(rows, columns=list(POINT_COLUMNS))
    kept: pd.DataFrame = frame[np.isfinite(frame["measured"]) & np.isfinite(frame["fitted"])].reset_index(drop=True)
    return kept


def calibrate(traces: Sequence[TraceInput], gpu: str, *, quantities: Sequence[str] | None = None,
              on_step: Callable[[str], None] | None = None, points: bool = False,
              sm_fraction: float | None = None, gemm_frame: str = "grid") -> FitReport:
    """Fit ``quantities`` (default: every one the traces support) for ``gpu`` ("*" for parameters
    that apply to any GPU, from traces of several GPUs). With ``points``, the report also holds
    every fitted point beside what the written parameters predict for it (:func:`fit_points`).
    ``sm_fraction`` fixes the contention fit's share of a collective's grid holding SMs
    (:func:`fit_contention`); ``gemm_frame`` is :func:`fit_gemm`'s frame."""
    if not traces:
        raise OvsimError("no traces to calibrate on", field="traces")
    if gpu != "*":
        for tr in traces:
            if tr.gpu != gpu:
                raise OvsimError(f"trace ran on {tr.gpu}, not {gpu}; calibrate one GPU at a time or use --gpu '*' "
                                 "for the GPU-independent contention parameters", source=tr.source or tr.label,
                                 field="gpu")
    wanted = list(quantities) if quantities else list(QUANTITIES)
    for q in wanted:
        if q not in QUANTITIES:
            raise OvsimError(f"unknown quantity '{q}' (known: {', '.join(QUANTITIES)})", field="fit")
    if gpu == "*":
        for q in GPU_SPECIFIC:
            if q in wanted:
                if quantities:
                    raise OvsimError(f"{q} belongs to one GPU: name the GPU", field="fit")
                wanted.remove(q)
    ref = gpu if gpu != "*" else traces[0].gpu
    params = shipped_parameters(ref)
    report = FitReport()
    # Data the fits and their points share (each costs replays of every trace).
    prepared: dict[str, Any] = {}

    def contention_fit() -> tuple[dict[str, Any], dict[str, Any]]:
        prepared["contention"] = [contention_data(tr) for tr in traces]
        return fit_contention(traces, params, prepared["contention"], sm_fraction)

    def power_fit() -> tuple[dict[str, Any], dict[str, Any]]:
        prepared["power"] = [power_samples(tr, log) for tr in traces for log in tr.power_logs]
        return fit_power_logs(traces, ref, params, prepared["power"])

    fitters: dict[str, Callable[[], tuple[dict[str, Any], dict[str, Any]]]] = {
        "contention": contention_fit,
        "collectives": lambda: fit_collectives(traces),
        "overhead": lambda: fit_overhead(traces),
        "gemm": lambda: fit_gemm(traces, params, gemm_frame),
        "memory": lambda: fit_memory(traces, params),
        "power": power_fit,
    }
    frames: list[pd.DataFrame] = []
    for q in wanted:
        if on_step is not None:
            on_step(q)
        try:
            values, record = fitters[q]()
        except OvsimError as e:
            if quantities:  # asked for by name: missing data is an error
                raise
            report.skipped[q] = e.message
            continue
        if points:
            frames.append(fit_points(q, traces, params, values, contention=prepared.get("contention"),
                                     power=prepared.get("power"), gemm_frame=gemm_frame))
        report.parameters.update(values)
        report.fits[q] = record
        # Later fits (gemm, memory: QUANTITIES puts overhead first) build on what was just fitted.
        params = params.merged(values)
        for k in values:
            report.sources[k] = f"fit: ovsim calibrate ({q}); see provenance.fits.{q}"
    if not report.parameters:
        why = "; ".join(f"{q}: {m}" for q, m in report.skipped.items())
        raise OvsimError(f"nothing could be fitted from these traces ({why})", field="traces")
    if points:
        report.points = (pd.concat(frames, ignore_index=True) if frames
                         else pd.DataFrame(columns=list(POINT_COLUMNS)))
    return report


def next_version(stem: str, folder: Path) -> int:
    """One more than the newest version of ``stem`` in ``folder`` and among the shipped files."""
    versions = [int(m["version"]) for d in (folder, CALIB_DIR) if d.is_dir() for p in d.iterdir()
                if (m := VERSIONED_NAME.match(p.name)) and m["stem"] == stem]
    return max(versions, default=0) + 1


def output_path(out: Path, gpu: str) -> tuple[Path, int]:
    """The file to write and its version: ``out`` itself when it is a ``<stem>.v<N>.yaml`` path, or
    the next version of the GPU's calibration inside ``out`` when it is a folder."""
    stem = "default" if gpu == "*" else gpu_file(gpu).stem
    if out.is_dir() or not out.suffix:
        version = next_version(stem, out)
        return out / f"{stem}.v{version}.yaml", version
    m = VERSIONED_NAME.match(out.name)
    if m is None:
        raise OvsimError("a calibration file is named <name>.v<version>.yaml (or give a folder)", source=str(out),
                         field="output")
    return out, int(m["version"])


def _holds(base: dict[str, Any], fitted: dict[str, Any]) -> bool:
    """Whether ``base`` already holds every fitted value; a mapping-valued one only for the keys the
    fit gave (a file on top merges such values key by key, so the others are not the fit's)."""
    def same(old: Any, new: Any) -> bool:
        if isinstance(new, dict) and isinstance(old, dict):
            return all(old.get(k) == v for k, v in new.items())
        return bool(old == new)

    return all(same(base.get(k), v) for k, v in fitted.items())


def write_shipped(report: FitReport, traces: Sequence[TraceInput], gpu: str, command: str, *,
                  dry_run: bool = False) -> tuple[Path | None, str]:
    """Write ``report`` as the next shipped version of the GPU's calibration (``default`` for '*'),
    carrying the newest one over as its base; nothing when the newest already holds every fitted
    value, or on a dry run. Returns the file written (None if none) and what was done."""
    stem = "default" if gpu == "*" else gpu_file(gpu).stem
    base = newest_file(stem, CALIB_DIR)
    if base is not None and _holds(read_calib_file(base).parameters, report.parameters):
        return None, f"{base.name} already holds these values; nothing written"
    if dry_run:
        return None, "dry run; nothing written"
    path = write_calibration(report, traces, gpu, CALIB_DIR, command=command, base=base)
    return path, f"wrote {path.name}"


def write_calibration(report: FitReport, traces: Sequence[TraceInput], gpu: str, out: Path,
                      command: str = "", base: Path | None = None) -> Path:
    """Write ``report`` as a new calibration file; an existing file is never replaced. With
    ``base`` (an older version of the same file) the new version carries its parameters and
    sources over, the fitted ones replaced, so it stands alone as the newest version does."""
    from ovsim import __version__

    path, version = output_path(out, gpu)
    if path.exists():
        raise OvsimError("exists: calibration files are never edited; write a new version", source=str(path),
                         field="output")
    inputs = []
    for tr in traces:
        files = [{"path": Path(f).name, "sha256": _sha256(f)} for f in tr.files if Path(f).is_file()]
        entry: dict[str, Any] = {
            "trace": tr.label, "gpu": tr.gpu,
            "device_names": sorted(set(tr.bundle.gpu_names.values())) or ["not recorded"],
            "software_versions": dict(tr.bundle.versions) or "not recorded in the trace",
            "ranks": int(tr.bundle.kernels["rank"].nunique()), "files": files}
        if tr.power_logs:
            entry["power_logs"] = [{"path": Path(lg.path).name, "sha256": _sha256(lg.path), "offset_s": lg.offset_s
                                    if lg.offset_s is not None else "from wall clocks"} for lg in tr.power_logs]
        inputs.append(entry)
    parameters: dict[str, Any] = {}
    sources: dict[str, str] = {}
    carried: dict[str, Any] = {}
    if base is not None:
        old = read_calib_file(base)
        if old.gpu != gpu:
            raise OvsimError(f"base file is for GPU '{old.gpu}', not '{gpu}'", source=str(base), field="gpu")
        parameters.update(old.parameters)
        sources.update(old.sources)
        # The base by name and checksum, not embedded: embedding made each file carry its whole
        # history (a file of 50 parameters grew to 10,000 lines). Superseded versions are kept in
        # calibration/history/ of the repository.
        carried = {"base": {"file": base.name, "version": old.version, "sha256": _sha256(str(base)),
                            "carried": "every parameter not fitted here, unchanged"}}
    for name, value in report.parameters.items():
        kept = parameters.get(name)
        if isinstance(value, dict) and isinstance(kept, dict) and set(kept) - set(value):
            # A fit of some keys of a mapping (one precision, one protocol) keeps the base's other
            # keys, as the file stack would if both files were loaded; the source says which is which.
            parameters[name] = {**kept, **value}
            sources[name] = (f"{', '.join(map(str, value))}: {report.sources.get(name, 'fitted')}; "
                             f"{', '.join(map(str, sorted(set(kept) - set(value))))}: carried from the base "
                             f"({sources.get(name, 'no source given')})")
        else:
            parameters[name] = value
            if name in report.sources:
                sources[name] = report.sources[name]
    sources.update({k: v for k, v in report.sources.items() if k not in report.parameters})
    doc = {
        "schema": "ovsim.calib/1",
        "gpu": gpu,
        "version": version,
        "provenance": {
            # A script that writes published figures or fits on them has no traces.
            "kind": "fitted to traces by ovsim calibrate" if inputs else (
                "written by a calibration script: each parameter's source says what it rests on"),
            "date": _dt.date.today().isoformat(),
            "ovsim_version": __version__,
            "command": command or "ovsim calibrate",
            "traces": inputs,
            "fits": report.fits,
            "skipped": report.skipped,
            **carried,
        },
        "parameters": parameters,
        "sources": sources,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path, exclusive=True) as tmp, open(tmp, "w", encoding="utf-8") as f:
        yaml.safe_dump(_plain(doc), f, sort_keys=False, width=110)
    return path
