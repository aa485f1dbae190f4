"""What a harness run measured, read off its per-block records and kernel tables (no GPU needed).

- :func:`residency`: per launch, the most blocks that were resident on one SM at once and the
  median block time, from the blocks' own %globaltimer stamps. Across the ``shaping`` part's
  occupancies this is how one kernel's per-block speed depends on how many of its blocks share an
  SM, the quantity the engine's SM sharing assumes.
- :func:`dispatch_order`: whether a later kernel's blocks started before an earlier kernel had
  placed all of its own (``dispatch`` part): with equal priorities the leftover policy says never;
  with a higher priority, a later kernel that needs an empty SM starts early only if the scheduler
  holds the earlier kernel's blocks back until an SM drains.
- :func:`profiled_window`: the wall-clock span of an experiment's profiled activity, what power
  samples are lined up against.
- :func:`overlap_slowdowns`: per experiment and kernel signature, the median duration of the
  instances no collective (or, for the ``copy`` part, no copy) overlapped against those one did.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from ovsim import replay_kernels
from ovsim.replay_kernels import COMPUTE_KINDS, KernelColumns
from ovsim.traces.table import validate_table

BLOCK_COLUMNS = ("kernel", "launch", "block", "smid", "start_ns", "end_ns")


class HarnessDataError(ValueError):
    """A harness file that cannot be read as written; the message names the file and the field."""


def _read_csv(p: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A harness CSV file that must have ``columns``."""
    try:
        df = pd.read_csv(p)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise HarnessDataError(f"{p}: cannot read as CSV ({e})") from e
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise HarnessDataError(f"{p}: no column {', '.join(missing)}")
    return df


def read_blocks(path: str | Path) -> pd.DataFrame:
    """A ``<experiment>.blocks.csv`` file; rows whose block never wrote its record are refused."""
    p = Path(path)
    df = _read_csv(p, BLOCK_COLUMNS)
    for c in BLOCK_COLUMNS[1:]:
        if not pd.api.types.is_integer_dtype(df[c]):
            raise HarnessDataError(f"{p}: column {c} holds non-integers")
    unwritten = df[(df["start_ns"] <= 0) | (df["end_ns"] < df["start_ns"])]
    if len(unwritten):
        r = unwritten.iloc[0]
        raise HarnessDataError(f"{p}: start_ns/end_ns: block {r['block']} of {r['kernel']} launch {r['launch']} "
                               f"has no valid record ({len(unwritten)} such blocks)")
    return df[list(BLOCK_COLUMNS)]


def max_resident(starts_ns: np.ndarray, ends_ns: np.ndarray) -> int:
    """Most intervals open at once; an interval ending when another starts does not overlap it."""
    if len(starts_ns) == 0:
        return 0
    # Ends sort before starts at the same instant.
    t = np.concatenate([np.asarray(ends_ns), np.asarray(starts_ns)])
    step = np.concatenate([-np.ones(len(ends_ns), int), np.ones(len(starts_ns), int)])
    order = np.lexsort((step, t))
    return int(np.max(np.cumsum(step[order])))


def residency(blocks: pd.DataFrame) -> pd.DataFrame:
    """Per (kernel, launch): blocks, SMs used, the most blocks resident on one SM at once, the
    median block time and the launch's span (first start to last end), in seconds."""
    rows = []
    for (kernel, launch), g in blocks.groupby(["kernel", "launch"], sort=True):
        per_sm = [max_resident(s["start_ns"].to_numpy(), s["end_ns"].to_numpy()) for _, s in g.groupby("smid")]
        dur = (g["end_ns"] - g["start_ns"]).to_numpy(dtype=float) * 1e-9
        rows.append({"kernel": kernel, "launch": int(cast(float, launch)), "blocks": len(g), "sms": g["smid"].nunique(),
                     "max_resident_per_sm": max(per_sm), "block_s_median": float(np.median(dur)),
                     "span_s": float(g["end_ns"].max() - g["start_ns"].min()) * 1e-9})
    return pd.DataFrame(rows)


def dispatch_order(blocks: pd.DataFrame, first: str, second: str) -> dict[str, float | int | bool]:
    """How the ``second`` kernel's blocks were placed against the ``first``'s (one launch each).

    ``first_blocks_started_after_second`` counts the first kernel's blocks that started after the
    second kernel's first block: 0 when the second waited for the first to place all its blocks
    (leftover policy, or a scheduler that lets lower-priority blocks fill the room the
    higher-priority kernel cannot use), many when the second kernel went ahead of them.
    ``second_wait_s`` is from the first kernel's first block to the second's first block."""
    f = blocks[blocks["kernel"] == first]
    s = blocks[blocks["kernel"] == second]
    if f.empty or s.empty:
        raise HarnessDataError(f"kernel: need blocks of both {first} ({len(f)}) and {second} ({len(s)})")
    second_start = int(s["start_ns"].min())
    after = int((f["start_ns"] > second_start).sum())
    return {"first_blocks": len(f), "second_blocks": len(s),
            "first_blocks_started_after_second": after,
            "second_went_ahead": after > 0,
            "second_wait_s": (second_start - int(f["start_ns"].min())) * 1e-9,
            "first_last_start_s": (int(f["start_ns"].max()) - int(f["start_ns"].min())) * 1e-9,
            "second_span_s": (int(s["end_ns"].max()) - second_start) * 1e-9}


# "other": the smloss part's SM-holding probe, which the importer classifies as neither.
OVERLAPPERS = ("collective", "copy", "other")


def overlap_flags(kernels: pd.DataFrame, overlapper: str = "collective") -> np.ndarray:
    """Whether each kernel is a compute kernel that ran while a kernel of kind ``overlapper`` (a
    collective, a copy for the ``copy`` part's copy-engine transfers, or the ``smloss`` part's
    SM-holding probe, kind "other") of its rank was running:
    replay's rule (the one the contention fit uses), applied per device."""
    if overlapper not in OVERLAPPERS:
        raise ValueError(f"overlapper: {overlapper!r}, expected one of {', '.join(OVERLAPPERS)}")
    k = kernels.reset_index(drop=True)
    out = np.zeros(len(k), dtype=bool)
    device = k["device"].fillna(-1) if "device" in k.columns else pd.Series(0, index=k.index)
    for rows in k.groupby(device).indices.values():
        cols = KernelColumns.of(validate_table(k.iloc[rows]))
        if overlapper != "collective":
            # Replay's rule looks for collectives: the overlapper's rows play them, and the
            # collectives (none in a copy or smloss experiment) take the overlapper's kind.
            cols = replace(cols, kind=["collective" if x == overlapper else overlapper if x == "collective" else x
                                       for x in cols.kind])
        out[rows] = replay_kernels.overlap_flags(cols)
    return out


def overlap_slowdowns(kernels: pd.DataFrame, by: tuple[str, ...] = ("experiment",),
                      overlapper: str = "collective") -> pd.DataFrame:
    """Per group and signature (name, grid, block): instances alone and overlapped (by a kernel of
    kind ``overlapper``), their median durations, and the ratio overlapped / alone (NaN without both)."""
    rows = []
    for key, g in kernels.groupby(list(by), sort=True):
        g = g.reset_index(drop=True)
        flags = overlap_flags(g, overlapper)
        comp = g[g["kind"].isin(COMPUTE_KINDS)]
        sig_cols = [c for c in ("name", "grid_x", "grid_y", "grid_z", "block_x") if c in g.columns]
        for sig, s in comp.groupby(sig_cols, sort=True, dropna=False):
            ov = flags[s.index.to_numpy()]
            alone = s.loc[~ov, "duration_s"].to_numpy(dtype=float)
            over = s.loc[ov, "duration_s"].to_numpy(dtype=float)
            a = float(np.median(alone)) if len(alone) else float("nan")
            o = float(np.median(over)) if len(over) else float("nan")
            keys = key if isinstance(key, tuple) else (key,)
            rows.append({**dict(zip(by, keys, strict=True)), "name": sig[0] if isinstance(sig, tuple) else sig,
                         "alone_n": len(alone), "overlapped_n": len(over), "alone_s_median": a,
                         "overlapped_s_median": o, "slowdown": o / a if len(alone) and len(over) else float("nan")})
    return pd.DataFrame(rows)


PROBE_COLUMNS = ("launch", "smid", "start_ns", "end_ns", "sm_cycles")
CLOCK_PROBE = "ovsim_clock_probe"


def profiled_window(doc: dict[str, Any]) -> tuple[float, float]:
    """(start, end) in seconds since 1970 (UTC, the profiler's ``baseTimeNanoseconds`` clock) of an
    experiment's profiled activity in a Kineto trace document: its GPU kernels, or every span when it
    ran none (the idle power phase). Power samples are placed against this window."""
    base_s = float(doc["baseTimeNanoseconds"]) / 1e9
    spans = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    kernels = [e for e in spans if e.get("cat") == "kernel"]
    use = kernels or spans
    if not use:
        raise HarnessDataError("traceEvents: no span to place the experiment on the wall clock")
    return (base_s + min(float(e["ts"]) for e in use) / 1e6,
            base_s + max(float(e["ts"]) + float(e.get("dur", 0)) for e in use) / 1e6)


def read_clock_probes(path: str | Path) -> pd.DataFrame:
    """A ``<experiment>.clock.csv`` file (``clock`` part), with each probe's SM clock in Hz:
    cycles counted over its window of the global timer."""
    p = Path(path)
    df = _read_csv(p, PROBE_COLUMNS)
    bad = df[(df["end_ns"] <= df["start_ns"]) | (df["sm_cycles"] <= 0)]
    if len(bad):
        raise HarnessDataError(f"{p}: start_ns/end_ns/sm_cycles: probe {int(bad['launch'].iloc[0])} has no valid "
                               f"record ({len(bad)} such probes)")
    if not (df["launch"].to_numpy() == np.arange(len(df))).all():
        raise HarnessDataError(f"{p}: launch: probes are not numbered 0..{len(df) - 1} in order")
    return df.assign(sm_clock_hz=df["sm_cycles"] / ((df["end_ns"] - df["start_ns"]) * 1e-9))


def clock_points(kernels: pd.DataFrame, probes: pd.DataFrame) -> pd.DataFrame:
    """Each kernel of a ``clock`` experiment with the SM clock it ran at: the mean of the probes
    launched just before and just after it on its stream (the probes bracket every group of
    kernels, and nothing else runs on the stream). ``clock_step_hz`` is the difference of those two
    probes: how much the clock moved across the group. Kernels after the last probe are dropped."""
    k = kernels[~kernels["kind"].isin(("memset", "memcpy"))].sort_values("start_s", kind="stable")
    is_probe = (k["name"] == CLOCK_PROBE).to_numpy()
    if int(is_probe.sum()) != len(probes):
        raise HarnessDataError(f"name: {int(is_probe.sum())} {CLOCK_PROBE} kernels in the trace, {len(probes)} "
                               "probe records: the trace and the probe file are not of one experiment")
    if len(probes) < 2:
        return pd.DataFrame(columns=["name", "start_s", "duration_s", "sm_clock_hz", "clock_step_hz"])
    before = np.cumsum(is_probe) - 1  # the last probe launched before each kernel
    hz = probes["sm_clock_hz"].to_numpy(float)
    keep = ~is_probe & (before >= 0) & (before + 1 < len(hz))
    b = before[keep]
    return pd.DataFrame({"name": k["name"].to_numpy()[keep], "start_s": k["start_s"].to_numpy(float)[keep],
                         "duration_s": k["duration_s"].to_numpy(float)[keep],
                         "sm_clock_hz": 0.5 * (hz[b] + hz[b + 1]), "clock_step_hz": np.abs(hz[b + 1] - hz[b])})
