"""How low can a replay's overlapped-kernel error go on a trace? Prints, per shared trace with
communication, three figures that need no model:

- naive: the MAPE of predicting every scored kernel (overlapped, isolated duration from clean
  instances of its signature) by its isolated duration, as ``ovsim validate`` reports it;
- best constant: the MAPE of the best single slowdown factor for all of the trace's scored kernels,
  chosen with hindsight (a model that slows every overlapped kernel alike cannot do better);
- clean spread: the MAPE of predicting each clean (not overlapped) instance of a scored signature by
  the median of the other clean instances: the run-to-run spread of the isolated durations that
  every prediction inherits.

    python bench/replay_noise_floor.py TRACES
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ovsim.replay_kernels import COMPUTE_KINDS, SIGNATURE_SPREAD, KernelColumns, isolated_durations, overlap_flags
from ovsim.traces.load import load_trace
from ovsim.validate import TRACE_CASES


def figures(path: Path) -> tuple[int, float, float, float]:
    c = KernelColumns.of(load_trace([path]).kernels.reset_index(drop=True))
    overlapped = overlap_flags(c)
    iso, src = isolated_durations(c, overlapped)
    sel = np.flatnonzero(overlapped & (src == "signature") & (c.dur > 0))
    meas, base = c.dur[sel], iso[sel]
    naive = float(np.mean(np.abs(base - meas) / meas) * 100)
    best = min(float(np.mean(np.abs(f * base - meas) / meas) * 100) for f in np.linspace(0.3, 3.0, 541))
    sig = [f"{n}|{g}|{b}|{h}" for n, g, b, h in zip(c.name, c.grid.tolist(), c.block.tolist(), c.host_op,
                                                    strict=True)]
    scored = {sig[i] for i in sel}
    is_compute = np.array([k in COMPUTE_KINDS for k in c.kind], dtype=bool)
    clean: dict[str, list[int]] = {}
    for i in np.flatnonzero(is_compute & ~overlapped & (c.dur > 0)):
        if sig[i] in scored:
            clean.setdefault(sig[i], []).append(int(i))
    errs: list[float] = []
    for rows in clean.values():
        d = c.dur[rows]
        lo, hi = np.percentile(d, [10, 90])
        if len(d) < 3 or hi > SIGNATURE_SPREAD * lo:
            continue
        errs.extend(abs(float(np.median(np.delete(d, j))) - d[j]) / d[j] for j in range(len(d)))
    return len(sel), naive, best, float(np.mean(errs) * 100) if errs else float("nan")


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "traces"
    print(f"{'trace':<34} {'scored':>6} {'naive':>7} {'best constant':>14} {'clean spread':>13}")
    for rel, _ in TRACE_CASES:
        path = folder / rel
        if not path.exists():
            continue
        n, naive, best, spread = figures(path)
        print(f"{Path(rel).name[:34]:<34} {n:>6} {naive:>6.1f}% {best:>13.1f}% {spread:>12.1f}%")


if __name__ == "__main__":
    main()
