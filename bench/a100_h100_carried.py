"""Do the H100's contention parameters hold on the A100? Carry them over and score the A100's data.

Every A100 contention parameter ships at 0, so replay on the A100 is the naive prediction. The
H100's were fitted on H100 probes alone (calibration/data/h100-sxm5-80gb), so none of the A100's
real data was used to fit them: carrying them to the A100 and replaying the shared A100 traces and
Echo's 404 kernels is a held-out test of whether the mechanisms transfer. Each group of mechanisms
is carried alone, then all together:

- SM sharing: ``replay_collective_sm_fraction`` (a collective's kernel holds its blocks' SMs);
- HBM sharing: ``nccl_memory_pressure`` and ``replay_hbm_fraction`` (a collective's and a
  replayed GEMM's share of HBM);
- loaded latency: ``hbm_latency_*``, ``memory_warp_bytes_per_s`` and ``gemm_load_share`` (HBM's
  latency rising with its load slows a kernel that waits on memory);
- issue headroom: ``memory_sm_headroom`` and ``copy_engine_hbm_weight``.

Scores: the time-weighted error (sum |predicted - measured| over sum measured) of each trace's
scored overlapped kernels, and for Echo the mean absolute percentage error and the share within
5% of the 2-GPU duration, each beside the naive prediction (docs/real-kernels.md).

    python bench/a100_h100_carried.py [--traces TRACES]     # about 15 s
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ovsim.hw.calib import shipped_parameters
from ovsim.replay import replay
from ovsim.traces.load import load_trace
from ovsim.validate import echo

TRACES = (("HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz", "a100-sxm4-80gb"),
          ("HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz", "a100-sxm4-40gb"),
          ("HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz", "a100-sxm4-80gb"))
GROUPS = {
    "SM sharing": ("replay_collective_sm_fraction",),
    "HBM sharing": ("nccl_memory_pressure", "replay_hbm_fraction"),
    "loaded latency": ("hbm_latency_capacity", "hbm_latency_exponent", "hbm_latency_collective_wait",
                       "memory_warp_bytes_per_s", "gemm_load_share"),
    "issue headroom": ("memory_sm_headroom", "copy_engine_hbm_weight"),
}


def carried(names: tuple[str, ...]) -> dict[str, Any]:
    """The shipped H100 values of the parameters ``names``, as replay's overrides take them."""
    h100 = shipped_parameters("h100-sxm5-80gb")
    return {n: getattr(h100, n) for n in names}


def trace_scores(path: Path, gpu: str, overrides: dict[str, Any]) -> tuple[float, float]:
    """The trace's time-weighted error with ``overrides``, and the naive prediction's (%)."""
    s = replay(load_trace([path]), gpu=gpu, counters=False, overrides=overrides).summary
    return float(s["weighted_error_pct"]), float(s["naive_weighted_error_pct"])


def echo_scores(folder: Path, overrides: dict[str, Any]) -> echo.EchoScore:
    """Echo's overlapped kernels (ovsim.validate.echo) replayed with ``overrides``."""
    rows, pred = echo.predict(folder / echo.ECHO_FILE, overrides)
    return echo.score(pred, rows["measured_s"].to_numpy(dtype=float))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces")
    args = ap.parse_args()
    missing = [rel for rel, _ in TRACES if not (args.traces / rel).exists()]
    if missing or not (args.traces / echo.ECHO_FILE).exists():
        print(f"{args.traces}: missing {missing or [echo.ECHO_FILE]}", file=sys.stderr)
        return 1
    variants = {"A100 as shipped": {}, **{g: carried(n) for g, n in GROUPS.items()},
                "all carried": carried(tuple(n for names in GROUPS.values() for n in names))}
    names = [Path(rel).name for rel, _ in TRACES]
    print(f"{'H100 parameters':<18}" + "".join(f"{n:>24}" for n in names) + f"{'Echo MAPE':>11}{'within 5%':>11}")
    naive: list[float] = []
    for label, overrides in variants.items():
        cells = []
        for rel, gpu in TRACES:
            got, base = trace_scores(args.traces / rel, gpu, overrides)
            cells.append(got)
            if len(naive) < len(TRACES):
                naive.append(base)
        e = echo_scores(args.traces, overrides)
        print(f"{label:<18}" + "".join(f"{c:>23.2f}%" for c in cells) + f"{e.mape_pct:>10.2f}%{e.within_5_pct:>10.1f}%")
    rows = echo.load_echo(args.traces / echo.ECHO_FILE)
    alone = echo.score(rows["alone_s"].to_numpy(dtype=float), rows["measured_s"].to_numpy(dtype=float))
    print(f"{'naive':<18}" + "".join(f"{c:>23.2f}%" for c in naive) + f"{alone.mape_pct:>10.2f}%"
          f"{alone.within_5_pct:>10.1f}%")
    print("time-weighted error of each trace's scored overlapped kernels; Echo: its 404 overlapped kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
