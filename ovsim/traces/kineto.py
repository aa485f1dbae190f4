"""Import PyTorch profiler (Kineto) Chrome-trace JSON into the canonical kernel table.

``load_kineto(path)`` reads one ``.json`` or ``.json.gz`` file, a folder of rank files (``*.json``,
``*.json.gz``, e.g. ``<worker>.<ts>.pt.trace.json``; not searched recursively), or a ``.tar.gz`` /
``.tgz`` / ``.tar`` archive of such files.

Rows
    Complete events (``ph: "X"``) of category ``kernel``, ``gpu_memcpy`` or ``gpu_memset`` (in any
    case; ``Kernel``, ``Memcpy`` and ``Memset`` too). ``device`` is ``args.device`` (else ``pid``),
    ``stream`` is ``args.stream`` (else ``tid``). Kernels are classified by name; copies are ``copy``
    with the direction from the name (``Memcpy HtoD (Pageable -> Device)`` -> ``HtoD``, else ROCm's
    ``args.kind``), memsets are ``memset``. ``shared_mem_bytes`` is Kineto's ``shared memory`` (static
    plus dynamic). Rows come out sorted by rank and start time.

Ranks and world size
    A file's rank is ``distributedInfo.rank``; without one, a ``rank<N>`` in the file name; without
    that, 0 if it is the only file. Two files of one rank, files that disagree on
    ``distributedInfo.world_size``, a rank outside the world size, and (for a folder or archive with
    more than one file) a rank of the world size with no file are errors: replaying part of a run as
    if it were all of it would give a wrong answer without saying so. A single file of a multi-rank
    run is fine: it is that rank's view.

Clock
    ``ts`` and ``dur`` are microseconds relative to ``baseTimeNanoseconds`` (absolute, for older
    Kineto that writes no base). Files whose bases differ are shifted to the earliest base so that
    all ranks share one clock; a file without a base counts as base 0. Durations are exact; start
    times of absolute (epoch) traces are float seconds near 1.7e9, so resolved to about 0.24 us.
    ``TraceBundle.wall_origin_s`` is the wall time of the table's 0 (the earliest base; 0 for
    epoch traces), which puts power logs on the trace's clock.

Versions
    ``cuda_runtime_version``, ``cuda_driver_version``, ``cupti_version``, the HIP and roctracer
    versions and ``distributedInfo.nccl_version``/``backend`` as the metadata writes them
    (``TraceBundle.versions``; ranks that disagree list each value).

Launch
    ``launch_s`` is the start of the ``cuda_runtime`` / ``cuda_driver`` event (``cudaLaunchKernel``,
    ``cudaMemcpyAsync``, ...) with the same ``args.correlation`` in the same file, NaN if none.

Collectives
    NCCL/RCCL kernels get collective, algorithm, protocol and dtype from the kernel name, then what
    ``record_param_comms`` recorded overrides and completes them: from the kernel's own args (Kineto
    copies them there), else from the ``record_param_comms`` op whose ``External id`` is the
    kernel's or its launch call's, else from the innermost one enclosing the launch call on the same
    thread. Any kernel whose own args carry a known ``Collective name`` is a collective.
    ``message_bytes`` is ``In msg nelems`` x the element size: the collective's *input buffer on one
    rank*. That is the shard for all_gather (its output is group size times larger), the whole
    buffer that is reduced for reduce_scatter and all_reduce, the buffer for broadcast and the send
    buffer for all_to_all. With only ``Out msg nelems`` known, the input follows by the same rule.
    ``seq`` is the ``Seq`` arg where the trace has one, otherwise NA (replay numbers them in order).

Syncs
    ``cuda_sync`` events of newer Kineto that record a stream waiting on an event
    (``wait_on_stream``, ``wait_on_cuda_event_record_corr_id``) become ``TraceBundle.syncs``:
    ``rank``, ``waiting_stream`` (the stream that waits), ``waiting_after_s`` (host time of the
    wait call), ``recorded_correlation`` (correlation of the last activity launched on the recording
    stream before the ``cudaEventRecord`` call: the activity the wait depends on) and
    ``recorded_stream``. A wait on an event recorded on an idle stream orders nothing and is left
    out. ``syncs`` is None when no wait is left.

Bad input
    Every problem is an :class:`OvsimError` naming the file and the field, or a row left out and
    counted in ``TraceBundle.skipped`` (missing ``ts``/``dur``/``name``/stream, negative duration,
    longer than 1e9 us, malformed fields). Values of the wrong type in optional fields become unknown.

Speed
    The ``traceEvents`` array is parsed in slices of a few MB cut between events (each slice is
    checked by parsing it, so a cut inside a string cannot go unnoticed), and only GPU rows, launch
    times and collective metadata are kept, so parsed objects of one slice at a time are alive.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ovsim.errors import OvsimError
from ovsim.gcpause import paused_gc
from ovsim.traces.json_slices import (
    trace_inputs,
)
from ovsim.traces.kineto_file import FileData, parse_file
from ovsim.traces.table import (
    TraceBundle,
    make_table,
    merge_versions,
)

_RANK_IN_NAME = re.compile(r"(?<![a-z])rank[-_.]?(\d{1,9})(?!\d)", re.IGNORECASE)

__all__ = ["load_kineto"]

# -- putting the files together --------------------------------------------------------------------

def _assign_ranks(files: list[FileData], path: Path) -> list[int]:
    multi = len(files) > 1
    ranks: list[int] = []
    owner: dict[int, str] = {}
    for f in files:
        rank = f.rank
        if rank is None:
            m = _RANK_IN_NAME.search(f.name)
            if m:
                rank = int(m.group(1))
            elif not multi:
                rank = 0
            else:
                raise OvsimError("no rank: the file has no distributedInfo.rank and its name no rank<N>",
                                 source=f.source, field="distributedInfo.rank")
        if rank in owner:
            raise OvsimError(f"rank {rank} appears in both {owner[rank]} and {f.source}", source=str(path),
                             field="distributedInfo.rank")
        owner[rank] = f.source
        ranks.append(rank)
    sizes = {f.world_size for f in files if f.world_size is not None}
    if len(sizes) > 1:
        raise OvsimError(f"the files disagree on the world size ({sorted(sizes)})", source=str(path),
                         field="distributedInfo.world_size")
    if sizes:
        world = sizes.pop()
        for f, rank in zip(files, ranks, strict=True):
            if rank >= world:
                raise OvsimError(f"rank {rank} is outside the world size {world}", source=f.source,
                                 field="distributedInfo.rank")
        missing = sorted(set(range(world)) - set(ranks))
        if multi and missing:
            shown = ", ".join(map(str, missing[:16])) + (", ..." if len(missing) > 16 else "")
            raise OvsimError(f"world size is {world} but there is no file for rank(s) {shown}", source=str(path),
                             field="distributedInfo.world_size")
    return ranks


def load_kineto(path: str | Path) -> TraceBundle:
    """Read a Kineto trace file, folder of rank files, or archive of them (see the module docstring)."""
    p = Path(path)
    if not p.exists():
        raise OvsimError("no such file or folder", source=str(p))
    files: list[FileData] = []
    with paused_gc():
        for item in trace_inputs(p):
            files.append(parse_file(*item))
            # Drop this file's bytes before the next file is read.
            del item
    ranks = _assign_ranks(files, p)
    bases = [f.base_ns for f in files]
    known = [b for b in bases if b is not None]
    origin = min(known) if known else 0
    offsets = [((b if b is not None else 0) - origin) / 1e9 if known else 0.0 for b in bases]

    # Each file's rows are sorted by start, so joining the files in rank order sorts the table.
    order = sorted(range(len(files)), key=lambda i: ranks[i])
    parts: dict[str, list[Any]] = {}
    for i in order:
        f = files[i]
        for k, v in f.columns.items():
            parts.setdefault(k, []).append(v)
        parts.setdefault("rank", []).append(np.full(f.n, ranks[i], dtype=np.int64))
        parts.setdefault("offset", []).append(np.full(f.n, offsets[i]))
        f.columns = {}
    columns: dict[str, Any] = {}
    for k in list(parts):
        chunks = parts.pop(k)
        if isinstance(chunks[0], np.ndarray):
            columns[k] = np.concatenate(chunks)
        elif isinstance(chunks[0], pd.arrays.IntegerArray):
            columns[k] = pd.concat([pd.Series(c) for c in chunks], ignore_index=True)
        else:
            columns[k] = [x for c in chunks for x in c]
    offset = columns.pop("offset")
    columns["start_s"] = columns.pop("ts_us") / 1e6 + offset
    columns["launch_s"] = columns.pop("launch_us") / 1e6 + offset
    table = make_table(columns, str(p))
    del columns

    skipped: Counter[str] = Counter()
    for f in files:
        skipped.update(f.skipped)
    gpu_names = {rank: f.gpu_name for f, rank in zip(files, ranks, strict=True) if f.gpu_name is not None}
    sizes = [f.world_size for f in files if f.world_size is not None]
    return TraceBundle(
        kernels=table, gpu_names=dict(sorted(gpu_names.items())), world_size=sizes[0] if sizes else None,
        sources=dict(sorted((r, f.source) for f, r in zip(files, ranks, strict=True))),
        skipped={k: v for k, v in sorted(skipped.items())},
        syncs=_syncs_frame(files, ranks, offsets), wall_origin_s=_wall_origin(known, table),
        versions=merge_versions([f.versions for f in files]))


def _wall_origin(bases_ns: list[int], table: pd.DataFrame) -> float | None:
    """Wall time of the table's time 0: the earliest base, or 0 for timestamps that are already
    epoch microseconds (older Kineto; any start after 2001 cannot be a relative time)."""
    if bases_ns:
        return min(bases_ns) / 1e9
    if len(table) and float(table["start_s"].min()) > 1e9:
        return 0.0
    return None


def _syncs_frame(files: list[FileData], ranks: list[int], offsets: list[float]) -> pd.DataFrame | None:
    rows = [(rank, stream, ts / 1e6 + off, corr, rec_stream)
            for f, rank, off in zip(files, ranks, offsets, strict=True)
            for stream, ts, corr, rec_stream in f.syncs]
    if not rows:
        return None
    rank, stream, after, corr, rec_stream = zip(*rows, strict=True)
    frame = pd.DataFrame({
        "rank": pd.array(rank, dtype="Int64"), "waiting_stream": pd.array(stream, dtype="Int64"),
        "waiting_after_s": np.array(after, dtype=np.float64), "recorded_correlation": pd.array(corr, dtype="Int64"),
        "recorded_stream": pd.array(rec_stream, dtype="Int64"),
    })
    return frame.sort_values(["rank", "waiting_after_s"], kind="stable").reset_index(drop=True)
