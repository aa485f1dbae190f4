"""The analytic fidelity's power and clock counters: each rank's board power and SM clock at every
start and end of its ops, from the ops running then, each at the clock the analytic power-limit
loop gave it (:mod:`ovsim.engine.power_analytic`), by the engine's arithmetic
(:meth:`PowerModel.board_power_w`).
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from ovsim.engine.power import CLOCK_COUNTER, POWER_COUNTER, PowerConfig
from ovsim.engine.power_analytic import OpTerms, dynamic_scale
from ovsim.engine.timeline import Timeline
from ovsim.hw.power import PowerModel
from ovsim.hw.spec import GpuSpec
from ovsim.models.ir import Workload, id_index


def _lanes(streams: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[np.ndarray]:
    """Row sets of one rank, each sorted by start, whose intervals do not overlap: its streams (a
    stream's ops follow one another), a stream split greedily where its ops overlap."""
    lanes: list[np.ndarray] = []
    for s in dict.fromkeys(streams.tolist()):
        rows = np.flatnonzero(streams == s)
        rows = rows[np.argsort(starts[rows], kind="stable")]
        if np.all(starts[rows[1:]] >= ends[rows[:-1]]):
            lanes.append(rows)
            continue
        free: list[float] = []  # each split lane's last end
        split: list[list[int]] = []
        for i in rows.tolist():
            j = next((j for j, t in enumerate(free) if starts[i] >= t), len(free))
            if j == len(free):
                free.append(0.0)
                split.append([])
            free[j] = float(ends[i])
            split[j].append(i)
        lanes.extend(np.array(x, dtype=np.int64) for x in split)
    return lanes


def _op_positions(ids: np.ndarray, workload: Workload) -> np.ndarray:
    """Each timeline row's op (its index in ``workload.ops``; -1: none, a flow's row). A timeline
    the analytic fidelity made lists the ops with rows first, in the workload's order (host gaps
    have none): only the rows after them are looked up by id, and by an index of every op's id
    only where one of theirs is an op's (at a million ops the index is a quarter of a GB)."""
    ops = workload.ops
    # Without host gaps, a range (a list holds an int object an op).
    gaps = any(op.kind == "delay" for op in ops)
    rows = [i for i, op in enumerate(ops) if op.kind != "delay"] if gaps else range(len(ops))
    listed = ids.tolist()
    head = len(rows) if listed[:len(rows)] == [ops[i].id for i in rows] else 0
    rest = listed[head:]
    if head and set(map(str, rest)).isdisjoint(map(attrgetter("id"), ops)):
        tail = [-1] * len(rest)
    else:
        index = id_index(ops)
        tail = [index.get(str(x), -1) for x in rest]
    first = np.arange(head, dtype=np.int64) if isinstance(rows, range) else np.array(rows[:head], dtype=np.int64)
    return np.concatenate([first, np.array(tail, dtype=np.int64)])


def _codes(values: np.ndarray) -> np.ndarray:
    """A number for each of ``values``, equal where the values are, in the order the values first
    appear (a stream's rows compared as numbers: as text, an array holds 4 bytes a character)."""
    listed = values.tolist()
    code = {v: i for i, v in enumerate(dict.fromkeys(listed))}
    return np.fromiter(map(code.__getitem__, listed), dtype=np.int64, count=len(listed))


def analytic_power(timeline: Timeline, workload: Workload, gpu: GpuSpec, cfg: PowerConfig,
                   clocks: np.ndarray | None = None, terms: OpTerms | None = None) -> dict[str, np.ndarray]:
    """``power_w`` and ``sm_clock_hz`` counters (columns of COUNTER_COLUMNS) for an analytic timeline: each
    rank's power is idle plus the isolated activity of whatever ops run, each at its own clock
    (``clocks``: per op of the workload, as :func:`throttled_durations` gives them)."""
    terms = terms if terms is not None else OpTerms.of(workload, gpu, cfg.model)
    # Each rank's samples, made by a function of their own: its arrays over every op go before the
    # columns are made (the analytic fidelity's peak at a million ops).
    return _counter_columns(_rank_samples(timeline, workload, cfg, clocks, terms), cfg.model.compute_clock_hz)


_Samples = tuple[np.ndarray, int, np.ndarray, np.ndarray]  # a rank's times, number, power (W) and clock fraction
_GONE: _Samples = (np.zeros(0), -1, np.zeros(0), np.zeros(0))


def _rank_samples(timeline: Timeline, workload: Workload, cfg: PowerConfig, clocks: np.ndarray | None,
                  terms: OpTerms) -> list[_Samples]:
    """Each rank's power and clock samples (:func:`_rank_power`), as :func:`analytic_power` takes them."""
    m = cfg.model
    pos = _op_positions(timeline.op_column("id"), workload)
    rank_all = timeline.op_column("rank")
    keep = (rank_all >= 0) & (pos >= 0)
    ranks = rank_all[keep]
    pos = pos[keep]
    starts = np.asarray(timeline.op_column("start_s"), dtype=float)[keep]
    ends = np.asarray(timeline.op_column("end_s"), dtype=float)[keep]
    streams = _codes(timeline.op_column("stream"))[keep]
    managed, top = cfg.managed, cfg.max_clock_fraction
    if managed:
        c = clocks[pos] if clocks is not None else np.full(pos.size, top)
    else:
        # Without a policy each op runs as calibrated.
        c = np.where(terms.tensor[pos], m.tensor_reference_clock_fraction, 1.0)
    # A compute-bound kernel moves its bytes at its own pace, as the clock solver takes it.
    by_kind = terms.index[pos]
    sm = dynamic_scale(m, c) * terms.kind_solver[by_kind, 0]
    hbm = terms.hbm_at(pos, c)
    link = terms.kind_solver[by_kind, 3]
    del by_kind
    windowed = managed and m.control_window_s > 0
    parts: list[_Samples] = []
    # Each rank's rows with a duration, ascending, grouped at once (a mask a rank cost ranks x rows).
    lasting = np.flatnonzero(ends > starts)
    by_rank = lasting[np.argsort(ranks[lasting], kind="stable")]
    bounds = np.searchsorted(ranks[by_rank], np.arange(workload.n_ranks + 1))
    for r in range(workload.n_ranks):
        mine = by_rank[bounds[r]:bounds[r + 1]]
        t, power_w, clock = _rank_power(m, mine, starts, ends, streams, sm, hbm, link, c,
                                        windowed=windowed, idle=(top if managed else 1.0))
        parts.append((t, r, power_w, clock))
    return parts


def _counter_columns(parts: list[_Samples], compute_clock_hz: float) -> dict[str, np.ndarray]:
    """The counter columns of each rank's samples ``parts``, each emptied once copied."""
    n = sum(2 * len(t) for t, _, _, _ in parts)
    time_s, rank, value = np.empty(n), np.empty(n, dtype=np.int64), np.empty(n)
    counter = np.empty(n, dtype=object)
    at = 0
    for i in range(len(parts)):
        t, r, power_w, clock = parts[i]
        parts[i] = _GONE
        k = 2 * len(t)
        time_s[at:at + k:2] = time_s[at + 1:at + k:2] = t
        rank[at:at + k] = r
        counter[at:at + k:2], counter[at + 1:at + k:2] = POWER_COUNTER, CLOCK_COUNTER
        value[at:at + k:2], value[at + 1:at + k:2] = power_w, clock * compute_clock_hz
        at += k
    return {"time_s": time_s, "rank": rank, "counter": counter, "value": value}


def _rank_power(m: PowerModel, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray, streams: np.ndarray,
                sm: np.ndarray, hbm: np.ndarray, link: np.ndarray, c: np.ndarray, *, windowed: bool,
                idle: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One rank's power and clock at 0 and at every start and end of its ops ``rows`` (of positive
    length): the board's power of the ops running then, at the lowest of their clocks. Between ops
    a windowed loop keeps the clock it last set (the op before's; before the first op, the first
    op's); without a window an idle GPU goes to ``idle`` (the top clock, or the calibration's)."""
    t = np.unique(np.concatenate([starts[rows], ends[rows]]))
    sm_sum, hbm_sum, link_sum = np.zeros(t.size), np.zeros(t.size), np.zeros(t.size)
    lowest = np.full(t.size, np.inf)
    running = np.zeros(t.size, dtype=bool)
    for lane in _lanes(streams[rows], starts[rows], ends[rows]):
        lane = rows[lane]
        i = np.searchsorted(starts[lane], t, side="right") - 1
        j = np.maximum(i, 0)
        on = (i >= 0) & (t < ends[lane][j])
        at = lane[j]
        sm_sum += np.where(on, sm[at], 0.0)
        hbm_sum += np.where(on, hbm[at], 0.0)
        link_sum += np.where(on, link[at], 0.0)
        lowest = np.where(on, np.minimum(lowest, c[at]), lowest)
        running |= on
    if windowed:
        first = float(c[rows[np.argmin(starts[rows])]]) if rows.size else idle
        # The clock of the last time anything ran, carried forward.
        last = np.maximum.accumulate(np.where(running, np.arange(t.size), -1))
        clock = np.where(last >= 0, lowest[np.maximum(last, 0)], first)
    else:
        first = idle
        clock = np.where(running, lowest, idle)
    t = np.concatenate([[0.0], t])
    clock = np.concatenate([[first], clock])
    zero = np.zeros(1)
    power_w = _board_power(m, clock, np.concatenate([zero, hbm_sum]), np.concatenate([zero, link_sum])) \
        + np.concatenate([zero, sm_sum])
    return t, power_w, clock


def _board_power(m: PowerModel, c: np.ndarray, hbm_bytes_per_s: np.ndarray, link_bytes_per_s: np.ndarray
                 ) -> np.ndarray:
    """:meth:`PowerModel.board_power_w` with no SM activity, at clock fractions ``c``."""
    hbm = hbm_bytes_per_s / m.hbm_peak_bytes_per_s
    lp = m.link_peak_bytes_per_s
    link = link_bytes_per_s / lp if lp > 0 else np.zeros_like(c)
    out: np.ndarray = (m.idle_static_w + m.idle_clock_w * dynamic_scale(m, c) + m.hbm_w * np.where(hbm < 1.0, hbm, 1.0)
                       + m.link_w * np.where(link < 1.0, link, 1.0))
    return out
