"""Replay every shared real trace that has communication and print the validation figures.

For each trace: the compute kernels that overlapped communication and could be scored, ovsim's
MAPE on them, the naive (no contention) MAPE, the MAPE of a constant-slowdown oracle (every scored
kernel's isolated duration times the median measured slowdown of the trace, a bound on what any
model that predicts one slowdown per trace can reach), the median measured and predicted slowdown,
and the span error. The traces are read where the project expects them (shared/traces in the folder
that holds the repository).

    python bench/replay_shared_traces.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from ovsim.errors import OvsimError
from ovsim.replay import replay
from ovsim.traces.load import load_trace
from ovsim.validate import TRACE_CASES

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"

def main() -> int:
    if not TRACES.exists():
        print(f"shared traces not found at {TRACES}; nothing to replay")
        return 0
    print(f"{'trace':<32} {'gpu':<15} {'ranks':>5} {'scored':>6} {'ovsim':>7} {'naive':>7} {'oracle':>7} "
          f"{'meas x':>7} {'pred x':>7} {'span':>7} {'s':>5}")
    for rel, gpu in TRACE_CASES:
        path = TRACES / rel
        t0 = time.perf_counter()
        try:
            r = replay(load_trace(path), gpu=gpu, counters=False)
        except OvsimError as e:
            print(f"{path.name:<32} error: {e.one_line()}")
            continue
        k = r.kernels
        s = k[k["overlapped"] & (k["isolated_source"] == "signature")]
        meas = s["measured_duration_s"].to_numpy(float)
        iso = s["isolated_s"].to_numpy(float)
        pred = s["predicted_duration_s"].to_numpy(float)
        med = float(np.median(meas / iso)) if len(s) else float("nan")
        oracle = float(np.mean(np.abs(med * iso - meas) / meas) * 100) if len(s) else float("nan")
        sm = r.summary
        print(f"{path.name[:32]:<32} {sm['gpu']:<15} {sm['ranks']:>5} {sm['scored_kernels']:>6} "
              f"{sm['mape_pct']:>6.1f}% {sm['naive_mape_pct']:>6.1f}% {oracle:>6.1f}% {med:>7.3f} "
              f"{float(np.median(pred / iso)) if len(s) else float('nan'):>7.3f} {sm['span_error_pct']:>+6.1f}% "
              f"{time.perf_counter() - t0:>5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
