"""The analytic fidelity against the engine on real jobs: the wall time of a whole prediction in
each mode, the workload's build that both share, and the ratio with and without it. A benchmark:
it prints figures and asserts nothing.

Each job's scenario is predicted in one process, once to warm the imports and the build's memos,
then ``--runs`` times in each mode, the modes alternated; each figure is the best of its runs. The
build is timed by itself (``ovsim.api.build``) just before each prediction, which builds again.

    python bench/fidelity_speed.py                       # the GPT-3 175B bench and four published rows, about 3 minutes
    python bench/fidelity_speed.py --rows 145B megascale-175b-12288 --runs 1
    python bench/fidelity_speed.py --scenario my.yaml
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_jobs import rows_by_name

from ovsim import api
from ovsim.scenario import Scenario

BENCH = Path(__file__).resolve().parent / "gpt3-175b-tp8-pp8-h100.yaml"
DEFAULT_ROWS = ("llama3-16384-v2", "145B", "megascale-175b-12288", "mlperf31-gpt3-10752")


def timed(sc: Scenario, source: str, runs: int) -> dict[str, tuple[float, float]]:
    """Per mode, the best (whole prediction, its build alone) wall time in seconds over ``runs``."""
    api.predict(sc, mode="analytic")
    best: dict[str, tuple[float, float]] = {}
    for _ in range(runs):
        for mode in ("analytic", "simulate"):
            t0 = time.perf_counter()
            api.build(sc, source, None)
            build_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            api.predict(sc, mode=mode)
            whole_s = time.perf_counter() - t0
            if mode not in best or whole_s < best[mode][0]:
                best[mode] = (whole_s, build_s)
    return best


def line(name: str, best: dict[str, tuple[float, float]]) -> str:
    (a, ab), (s, sb) = best["analytic"], best["simulate"]
    return (f"{name:<26} {a:>8.3f} {s:>9.3f} {ab:>7.3f} {a - ab:>8.3f} {s - sb:>9.3f} {s / a:>6.1f}x "
            f"{(s - sb) / (a - ab):>6.1f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="*", default=list(DEFAULT_ROWS),
                        help="published rows (bench/published_jobs.py --help lists them)")
    parser.add_argument("--scenario", nargs="*", default=[str(BENCH)], help="scenario files")
    parser.add_argument("--runs", type=int, default=2, help="runs of each mode (best of them)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be 1 or more")
    known = rows_by_name()
    unknown = [r for r in args.rows if r not in known]
    if unknown:
        parser.error(f"unknown rows {unknown}; bench/published_jobs.py --help lists them")
    jobs: list[tuple[str, Scenario, str]] = [(Path(p).stem, api.load_scenario(p), p) for p in args.scenario]
    jobs += [(name, known[name].scenario(), name) for name in args.rows]
    print(f"{'job':<26} {'analytic':>8} {'simulate':>9} {'build':>7} {'analytic':>8} {'simulate':>9} "
          f"{'ratio':>7} {'ratio':>7}")
    print(f"{'':<26} {'whole s':>8} {'whole s':>9} {'s':>7} {'-build s':>8} {'-build s':>9} {'whole':>7} "
          f"{'-build':>7}")
    for name, sc, source in jobs:
        print(line(name, timed(sc, source, args.runs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
