"""The Timeline: what a simulation (or an analytic prediction) says happened.

``ops`` has one row per op on a rank (kernels, collective kernels, copies) and one per flow
(``kind == "flow"``, ``rank == -1``), with these columns (times in seconds from the start):

=============== ======================================================================
id, name        op id (unique) and display name
kind            gemm, attention, elementwise, norm, softmax, generic, collective, transfer, flow
rank, stream    where it ran
launch_s        when its stream launched it
start_s, end_s  first block resident (or flow data start) and completion
duration_s      end_s - start_s
isolated_s      the cost model's time for the op alone
slowdown        duration_s / isolated_s
wait_sm_s       time lost because its blocks could not be resident (SMs held by others)
share_sm_s      time lost sharing SM issue throughput with co-resident blocks
share_hbm_s     time lost to a smaller HBM share than it asked for
share_link_s    time lost to a smaller link share (flows)
wait_peers_s    time a collective's kernel sat resident waiting for other ranks
clock_s         time lost to an SM clock below the one its isolated time assumes (power cap, clock lock);
                negative: gained on a clock above it
slowed_by       the largest of the six reasons above, or "" when within 1% of isolated
blocks, bytes   grid size; bytes moved (HBM bytes for kernels, bus bytes for flows)
=============== ======================================================================

``counters`` holds piecewise-constant samples ``time_s, rank, counter, value``; a value holds
until the next sample of the same (rank, counter), and of samples at one instant the last one
holds. Power counters: ``power_w`` (board power) and ``sm_clock_hz`` (see
:mod:`ovsim.engine.power`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain, repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from ovsim.models.ir import Op

OP_COLUMNS = [
    "id", "name", "kind", "rank", "stream", "launch_s", "start_s", "end_s", "duration_s", "isolated_s",
    "slowdown", "wait_sm_s", "share_sm_s", "share_hbm_s", "share_link_s", "wait_peers_s", "clock_s",
    "slowed_by", "blocks", "bytes",
]
COUNTER_COLUMNS = ["time_s", "rank", "counter", "value"]
REASONS = {
    "wait_sm_s": "waiting for SMs",
    "share_sm_s": "sharing SMs",
    "share_hbm_s": "sharing HBM",
    "share_link_s": "sharing links",
    "wait_peers_s": "waiting for peers",
    "clock_s": "lowered clock",
}
# A kernel within this fraction of its isolated time counts as not slowed.
SLOWED_THRESHOLD = 0.01


class Timeline:
    """A run's ops and counters (the module's docstring gives their columns). Built from columns
    (``op_data``, ``counter_data``: column name to array or list), it makes the frames on first
    use of :attr:`ops` or :attr:`counters`, and only then imports pandas: a prediction read
    through :meth:`op_column` and :meth:`counter_column` (a summary, the command's table) never
    needs them, and pandas' import was most of a small prediction's time. Built from frames, it
    reads them.

    A frame is made from the columns as given (so its types do not depend on what was read
    first), without copying them, unless another Timeline holds the same arrays (``shared``:
    :func:`on_ranks`, :meth:`with_counters`): then each frame copies, and a write into one
    Timeline's frame does not reach the other's."""

    __slots__ = ("_arrays", "_counter_data", "_counters", "_op_data", "_ops", "_shared")

    def __init__(self, ops: pd.DataFrame | None = None, counters: pd.DataFrame | None = None, *,
                 op_data: Mapping[str, Any] | None = None, counter_data: Mapping[str, Any] | None = None,
                 shared: bool = False) -> None:
        if (ops is None) == (op_data is None) or (counters is None) == (counter_data is None):
            raise TypeError("a Timeline takes ops or op_data, and counters or counter_data")
        self._ops, self._counters = ops, counters
        self._op_data = dict(op_data) if op_data is not None else None
        self._counter_data = dict(counter_data) if counter_data is not None else None
        # Columns read as arrays (op_column, counter_column), by ("op" | "counter", name).
        self._arrays: dict[tuple[str, str], np.ndarray] = {}
        self._shared = shared

    @property
    def ops(self) -> pd.DataFrame:
        if self._ops is None:
            import pandas as pd

            assert self._op_data is not None
            self._ops = pd.DataFrame({c: self._op_data[c] for c in OP_COLUMNS}, copy=self._shared)
            self._op_data = None  # the frame holds them now
            self._drop_arrays("op")
        return self._ops

    @property
    def counters(self) -> pd.DataFrame:
        if self._counters is None:
            import pandas as pd

            assert self._counter_data is not None
            self._counters = pd.DataFrame({c: self._counter_data[c] for c in COUNTER_COLUMNS},
                                          columns=COUNTER_COLUMNS, copy=self._shared)
            self._counter_data = None
            self._drop_arrays("counter")
        return self._counters

    def _drop_arrays(self, table: str) -> None:
        for key in [k for k in self._arrays if k[0] == table]:
            del self._arrays[key]

    @property
    def n_ops(self) -> int:
        """Rows of :attr:`ops`."""
        if self._ops is not None:
            return len(self._ops)
        assert self._op_data is not None
        return len(self._op_data["id"])

    def op_column(self, name: str) -> np.ndarray:
        """Column ``name`` of :attr:`ops` as an array (text as objects, a missing number as NaN),
        without making the frame."""
        return self._column("op", self._ops, self._op_data, name)

    def counter_column(self, name: str) -> np.ndarray:
        """Column ``name`` of :attr:`counters` as an array, without making the frame."""
        return self._column("counter", self._counters, self._counter_data, name)

    def _column(self, table: str, frame: pd.DataFrame | None, data: dict[str, Any] | None,
                name: str) -> np.ndarray:
        if frame is not None:
            return np.asarray(frame[name].to_numpy())
        assert data is not None
        hit = self._arrays.get((table, name))
        if hit is None:
            hit = self._arrays[(table, name)] = _as_array(name, data[name])
        return hit

    def op_data(self) -> dict[str, np.ndarray]:
        """Every column of :attr:`ops` by name, as :meth:`op_column` gives them: the Timeline's
        own arrays, not copies, so its frame copies them from now on (a Timeline made from them
        should say ``shared``)."""
        self._shared = True
        return {c: self.op_column(c) for c in OP_COLUMNS}

    def counter_data(self) -> dict[str, np.ndarray]:
        """Every column of :attr:`counters` by name, as :meth:`counter_column` gives them (shared
        as :meth:`op_data`'s)."""
        self._shared = True
        return {c: self.counter_column(c) for c in COUNTER_COLUMNS}

    def with_counters(self, counter_data: Mapping[str, Any]) -> Timeline:
        """The same ops with these counters; the two Timelines share the ops' columns."""
        self._shared = True
        if self._ops is not None:
            return Timeline(ops=self._ops, counter_data=counter_data, shared=True)
        return Timeline(op_data=self._op_data, counter_data=counter_data, shared=True)

    @property
    def makespan_s(self) -> float:
        # On the columns' arrays: a filtered copy of the frame cost a schedule search a sixth of
        # its time on small scenarios.
        if self.n_ops == 0:
            return 0.0
        keep = self.op_column("kind") != "flow"
        if not keep.any():
            return 0.0
        end = self.op_column("end_s").astype(float)[keep]
        launch = self.op_column("launch_s").astype(float)[keep]
        return float(end.max() - min(0.0, float(launch.min())))


# Columns that hold text, and whole numbers (the others hold real numbers).
_TEXT_COLUMNS = frozenset({"id", "name", "kind", "stream", "slowed_by", "counter"})
_INT_COLUMNS = frozenset({"rank", "blocks"})


def _as_array(name: str, values: Any) -> np.ndarray:
    """A column's values as an array: text as objects (as a frame's text columns read back), a
    number column with missing values as floats with NaN, an empty whole-number column as int64."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return values
    if name in _TEXT_COLUMNS:
        return np.asarray(values, dtype=object)
    out = np.asarray(values)
    if out.dtype == object:
        out = np.asarray(values, dtype=float)
    elif not len(out) and name in _INT_COLUMNS:
        out = out.astype(np.int64)
    return out


def on_ranks(tl: Timeline, ranks: Sequence[int]) -> Timeline:
    """``tl`` with rank ``ranks[r]`` in place of each rank r (a trace's numbers, or a job's under
    rank symmetry); flows keep -1. Frames stay frames (with any columns of their own); columns stay
    columns."""
    lookup = np.asarray(ranks, dtype=np.int64)

    def renumbered(r: np.ndarray) -> np.ndarray:
        r = np.asarray(r, dtype=np.int64)
        if not len(r):
            return r.copy()
        if int(r.max()) >= len(lookup):  # "clip" below would give it the last number
            raise ValueError(f"rank {int(r.max())} is beyond the {len(lookup)} ranks given")
        out = np.take(lookup, r, mode="clip")  # -1 (a flow) as 0, set below: no array of clipped ranks
        below = r < 0
        out[below] = r[below]
        return out

    shared = False
    if tl._ops is not None:
        ops = tl._ops.assign(rank=renumbered(tl._ops["rank"].to_numpy())) if len(tl._ops) else tl._ops
        op_part: dict[str, Any] = {"ops": ops}
    else:
        assert tl._op_data is not None
        rank = renumbered(tl.op_column("rank"))
        op_part = {"op_data": {**tl._op_data, "rank": rank if len(rank) else tl._op_data["rank"]}}
        shared = True
    if tl._counters is not None:
        c = tl._counters
        counter_part: dict[str, Any] = {"counters": c.assign(rank=renumbered(c["rank"].to_numpy())) if len(c) else c}
    else:
        assert tl._counter_data is not None
        rank = renumbered(tl.counter_column("rank"))
        counter_part = {"counter_data": {**tl._counter_data, "rank": rank if len(rank) else tl._counter_data["rank"]}}
        shared = True
    # The columns other than the ranks are the same arrays: each side's frame copies them.
    tl._shared = tl._shared or shared
    return Timeline(**op_part, **counter_part, shared=shared)


def op_columns(ops: Sequence[Op], flows: Sequence[tuple[str, float]]) -> dict[str, Any]:
    """The columns the ops themselves give a Timeline (id, name, kind, rank, stream, blocks, bytes),
    as the engine and the analytic fidelity lay them out: one row per op of ``ops``, then one per
    flow of ``flows`` (its group and bus bytes). Every column goes straight into an array: at a
    million ops each list of Python numbers costs tens of megabytes, and a text column kept as a
    list is held twice once read as an array (:meth:`Timeline.op_column`)."""
    n, nf = len(ops), len(flows)
    groups = [group for group, _ in flows]

    def text(field: str, flow_values: Iterable[str]) -> np.ndarray:
        # By attrgetter: a field's values read in C rather than by the interpreter's loop.
        return np.fromiter(chain(map(attrgetter(field), ops), flow_values), dtype=object, count=n + nf)

    return {
        "id": text("id", (f"flow:{group}" for group in groups)),
        "name": text("name", groups),
        "kind": text("kind", repeat("flow", nf)),
        "rank": np.concatenate([np.fromiter(map(attrgetter("rank"), ops), dtype=np.int64, count=n),
                                np.full(nf, -1, dtype=np.int64)]),
        "stream": text("stream", repeat("", nf)),
        "blocks": np.concatenate([
            np.fromiter((op.kernel.blocks if op.kernel is not None else 0 for op in ops), dtype=np.int64, count=n),
            np.zeros(nf, dtype=np.int64)]),
        "bytes": np.concatenate([
            np.fromiter((op.flow.bytes if op.flow is not None else (op.kernel.hbm_bytes if op.kernel else 0.0)
                         for op in ops), dtype=float, count=n),
            np.array([size for _, size in flows], dtype=float)]),
    }


def timeline_from_rows(rows: list[dict[str, Any]] | pd.DataFrame | Mapping[str, Any],
                       counters: list[dict[str, Any]] | pd.DataFrame | Mapping[str, Any], *,
                       shared: bool = False) -> Timeline:
    """A Timeline from op rows (dicts, a frame with those columns, or a mapping of column name to
    array) and counter samples (dicts, a frame or a mapping of columns); the derived columns
    (duration, slowdown, the split of time lost, slowed_by) are computed here, on arrays. From
    mappings it makes no frame (:class:`Timeline`); a frame is built once, later, without copying
    its columns: a frame's column operations copy the whole frame (a million ops: gigabytes).
    ``shared``: the columns are another Timeline's too (:class:`Timeline`)."""
    given = [c for c in OP_COLUMNS if c not in ("duration_s", "slowdown", "slowed_by")]
    src: Mapping[str, Any]
    if isinstance(rows, Mapping):
        src = rows
        n = len(next(iter(rows.values()))) if rows else 0
    else:
        import pandas as pd

        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows, columns=given)
        src = {c: frame[c].array for c in frame.columns}
        n = len(frame)

    def column(c: str) -> Any:
        return src[c] if c in src else np.full(n, np.nan)

    start = np.asarray(column("start_s"), dtype=float)
    iso = np.asarray(column("isolated_s"), dtype=float)
    duration = np.asarray(column("end_s"), dtype=float) - start
    with np.errstate(divide="ignore", invalid="ignore"):
        slowdown = duration / np.where(iso > 0, iso, np.nan)
    slowdown[np.isnan(slowdown)] = 1.0
    derived: dict[str, Any] = {"duration_s": duration, "slowdown": slowdown}
    derived.update(_lost_time(duration, iso, column))
    op_data = {c: derived[c] if c in derived else column(c) for c in OP_COLUMNS}
    if isinstance(counters, Mapping):
        return Timeline(op_data=op_data, counter_data=counters, shared=shared)
    if isinstance(counters, list) and not counters:
        return Timeline(op_data=op_data, counter_data={c: [] for c in COUNTER_COLUMNS}, shared=shared)
    import pandas as pd

    return Timeline(op_data=op_data, counters=pd.DataFrame(counters, columns=COUNTER_COLUMNS), shared=shared)


def _lost_time(duration: np.ndarray, iso: np.ndarray, column: Callable[[str], Any]) -> dict[str, Any]:
    """The time each op lost, split by reason (one column each), and ``slowed_by``.

    The raw reasons integrate where progress was lost; they are rescaled so that they split the
    time lost, duration - isolated, in the same proportions (a kernel pushed into an extra wave
    loses a whole wave although its blocks were short of SMs only during the first one).
    Producers that never lose time to a reason may leave its column out. A clock above the
    calibration's gains time: clock_s is negative then, and kept as it integrated; the other
    reasons split what is left of duration - isolated. Column by column, each changed in place:
    a reason no op lost time to is a column of zeros never written, which holds no memory until
    read (four of the six in an analytic timeline: 32 bytes an op)."""
    n = len(duration)
    names = list(REASONS)
    raw: dict[str, np.ndarray | None] = {}
    for c in names:
        given = np.asarray(column(c), dtype=float)
        if c != "clock_s" and not given.any():  # NaN counts as lost time here, and is zeroed below
            raw[c] = None
            continue
        mine = np.array(given, dtype=float)
        mine[np.isnan(mine)] = 0.0
        raw[c] = mine
    clock = raw["clock_s"]
    assert clock is not None
    net = duration - iso
    slowed = net > SLOWED_THRESHOLD * iso
    gained = np.where(clock <= 0.0, clock, 0.0)
    # A kernel further ahead than its integrated gain (wave edges, round-off): all of its lead is
    # the clock's, nothing was lost.
    gained = np.where(net >= gained, gained, net)
    gained = np.where(gained < -1e-9 * iso, gained, 0.0)  # round-off is no gain
    lost_to = [a for a in raw.values() if a is not None]
    total = np.zeros(n)
    for a in lost_to:  # in the reasons' order, as a row sum adds them; a zero column adds nothing
        a[a < 0.0] = 0.0
        total += a
    # Each array an op's float is 8 MB at a million ops: in place, each freed once read.
    scale = np.subtract(net, gained, out=net)
    scale[~(scale >= 0.0)] = 0.0  # the time lost
    with np.errstate(divide="ignore", invalid="ignore"):
        scale /= np.where(total > 0, total, np.nan)
    del total
    scale[np.isnan(scale)] = 0.0
    for a in lost_to:
        a *= scale
    del scale
    clock += gained
    del gained
    top, largest = _largest(names, raw, n)
    out: dict[str, Any] = {"slowed_by": np.where(slowed & (largest > 0), top, "")}
    for c in names:
        split = raw[c]
        out[c] = split if split is not None else np.zeros(n)
    return out


def _largest(names: list[str], raw: dict[str, np.ndarray | None], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per op, the reason (by its REASONS text) that lost it the most time, the first of equals,
    and that time (NaN where any reason's is: as an (ops, reasons) array's argmax and max give
    them). Every reason but the clock is at least 0, so a column of zeros (None) after the first
    never leads."""
    first = raw[names[0]]
    largest = first.copy() if first is not None else np.zeros(n)
    which = np.zeros(n, dtype=np.int64)
    for j, c in enumerate(names[1:], start=1):
        a = raw[c]
        if a is None:
            continue
        ahead = (a > largest) | (np.isnan(a) & ~np.isnan(largest))
        which[ahead] = j
        np.copyto(largest, a, where=ahead)
    return np.array([REASONS[c] for c in names], dtype=object)[which], largest
