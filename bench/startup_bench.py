"""Start-up of ``ovsim predict``: how long a fresh process takes to reach the simulation, and the
whole command, on the README's example. Each figure is the median over fresh processes (a warm
file cache and the modules' bytecode cached, as installed: the first run is not counted).

    python bench/startup_bench.py              # 7 runs each
    python bench/startup_bench.py --runs 15 --scenario examples/training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml

Budget (issue): ``predict`` of the README example starts in under 0.3 s before simulating.
"Before simulating" is a fresh process that imports the command's modules, reads the scenario, its
system, GPU and calibration files and builds the workload: timed from its launch to that point
(the process prints the time it got there), not to its exit, which is the interpreter's clean-up
after the work; the heavy modules it loaded on the way are listed. The whole command is timed to
its exit.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README_EXAMPLE = REPO / "examples" / "gemm-allreduce-h100x4-priority.yaml"

# What the command does up to the simulation: its modules, the scenario read and the workload built.
_READY = """
import sys
from ovsim.cli.main import main  # noqa: F401  (the command's own imports)
from ovsim.cli.predict import run_predict  # noqa: F401
from ovsim.api import build
from ovsim.scenario import load_scenario
build(load_scenario(sys.argv[1]), sys.argv[1])
import time
print(time.time(), time.process_time())  # ready: when, and the CPU spent to get there
heavy = [m for m in ("pandas", "pyarrow", "scipy", "networkx", "matplotlib") if m in sys.modules]
print(",".join(heavy) or "-")
"""


# As an installed package runs: its modules' bytecode cached (pip compiles it at install; the
# warm-up run writes it for a source checkout), which PYTHONDONTWRITEBYTECODE would prevent.
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _run(cmd: list[str], until_ready: bool = False) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of one fresh process: CPU time (user + system, from the child's
    rusage) is what a loaded machine blurs least. ``until_ready``: up to the time and CPU the
    process prints on its first line, when it is ready to simulate; its exit (the interpreter's
    own clean-up, 60-90 ms) is not before simulating, and the rest of its stdout is returned."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched, t = time.time(), time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_ENV)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        raise SystemExit(f"{' '.join(cmd[:3])} failed: {last}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if not until_ready:
        return wall, cpu, out.stdout
    ready, rest = out.stdout.split("\n", 1)
    ready_at, ready_cpu = (float(x) for x in ready.split())
    return ready_at - launched, ready_cpu, rest


def _medians(cmd: list[str], runs: int, until_ready: bool) -> tuple[float, float, float, str]:
    """Median wall, best wall and median CPU seconds over ``runs`` fresh processes, after one
    not counted (it warms the file cache and writes the bytecode)."""
    _run(cmd, until_ready)
    results = [_run(cmd, until_ready) for _ in range(runs)]
    walls = [w for w, _, _ in results]
    return (statistics.median(walls), min(walls), statistics.median(c for _, c, _ in results),
            results[-1][2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=7, help="fresh processes per figure (default 7)")
    ap.add_argument("--scenario", type=Path, default=README_EXAMPLE, help="scenario to predict")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    py = sys.executable
    rows = [
        ("python, no imports", [py, "-c", "pass"]),
        ("ready to simulate", [py, "-c", _READY, str(args.scenario)]),
        ("ovsim predict, whole command", [py, "-m", "ovsim.cli", "predict", str(args.scenario)]),
    ]
    print(f"scenario: {args.scenario.name}; {args.runs} fresh processes each")
    print(f"{'':<30} {'median wall s':>13} {'best wall s':>11} {'median CPU s':>12}")
    heavy = ""
    for label, cmd in rows:
        med, best, cpu, out = _medians(cmd, args.runs, until_ready=label == "ready to simulate")
        if label == "ready to simulate":
            heavy = out.strip()
        print(f"{label:<30} {med:>13.3f} {best:>11.3f} {cpu:>12.3f}")
    print(f"heavy modules loaded before simulating: {heavy or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
