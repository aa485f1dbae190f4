"""How low can a replay's overlapped-kernel error go on a trace? Prints, per shared trace with
communication, figures that need no model (:mod:`ovsim.replay_floor` defines them):

- naive: the MAPE and the time-weighted error of predicting every scored kernel by its isolated
  duration, as ``ovsim validate`` reports them;
- best constant: the MAPE of the best single slowdown factor, chosen with hindsight;
- clean spread: the run-to-run spread of the isolated durations that every prediction inherits;
- repeat: each scored kernel predicted from the measured slowdown of the other overlapped
  instances of its signature beside the same collectives (leave one out), on the kernels that
  have such a repeat: how far a model that got each kind of kernel beside each collective right
  could go, with the naive figures on the same kernels beside it.

    python bench/replay_noise_floor.py TRACES
"""

from __future__ import annotations

import sys
from pathlib import Path

from ovsim.replay_floor import floor
from ovsim.traces.load import load_trace
from ovsim.validate import TRACE_CASES


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "traces"
    print(f"{'':<30} {'':>6} {'naive':>15} {'best':>7} {'clean':>7} | {'repeat (leave one out)':^44}")
    print(f"{'trace':<30} {'scored':>6} {'MAPE':>7} {'weighted':>8} {'const.':>7} {'spread':>7} | "
          f"{'kernels':>7} {'time':>5} {'naive w.':>9} {'repeat w.':>9} {'naive':>6} {'repeat':>6}")
    for rel, _ in TRACE_CASES:
        path = folder / rel
        if not path.exists():
            continue
        f = floor(load_trace([path]).kernels)
        print(f"{Path(rel).name[:30]:<30} {f.scored:>6} {f.naive_mape_pct:>6.1f}% {f.naive_weighted_pct:>7.1f}% "
              f"{f.best_constant_mape_pct:>6.1f}% {f.clean_spread_pct:>6.1f}% | {f.repeated:>7} "
              f"{f.repeated_time_share * 100:>4.0f}% {f.repeat_naive_weighted_pct:>8.1f}% "
              f"{f.repeat_weighted_pct:>8.1f}% {f.repeat_naive_mape_pct:>5.1f}% {f.repeat_mape_pct:>5.1f}%")
    print("(repeat columns: the weighted error and the MAPE on the repeated kernels alone)")


if __name__ == "__main__":
    main()
