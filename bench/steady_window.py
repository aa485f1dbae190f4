"""The power-limit loop's steady start found two ways, on long workloads: the engine's warm-up run
(the workload simulated once from idle, the window its end leaves then starting the reported run)
against the window the analytic fidelity's loop leaves (``power_analytic.steady_window``, what
``predict`` uses from 10 control windows up, making the run again from the window it leaves
where that starts a GPU more than a clock step away), and an idle start beside them. A
benchmark: it prints each job's iteration time and energy from each start, their differences,
each start's clock and the window the run itself leaves, and the wall time; it asserts nothing.

    python bench/steady_window.py                  # examples, 2 of ovsim's own, 13 published rows: ~4 min
    python bench/steady_window.py --rows 18B flash-gpt3-1.3b --no-examples
    python bench/steady_window.py --rows 145B      # the Megatron-LM 145.6B row: ~3 minutes more

docs/power.md ("Steady state") reports its figures.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from published_jobs import GROUPS, AnyRow
from published_rows import FLASH_ROWS, FOUNDRY_ROWS, LLAMA_ROWS, NEMO_ROWS, RECOMPUTE_ROWS, ROWS

from ovsim import api
from ovsim.engine.machine import MachineModel, build_machine
from ovsim.engine.power import Period, PowerConfig, power_rows
from ovsim.engine.power_analytic import steady_window
from ovsim.engine.power_loop import same_start, start_clock
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.hw.power import PowerSettings
from ovsim.models.ir import Workload
from ovsim.scenario import Scenario, load_scenario

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [*sorted((ROOT / "examples").glob("training-*.yaml")), ROOT / "bench" / "gpt3-175b-tp8-pp8-h100.yaml"]
DEFAULT_ROWS = ["1.7B", "18B", "k22B-present", "mpt-13b-a100-8g-s2048", "mpt-1b-a100-8g-s2048",
                "mpt-13b-h100-8g-s2048", "mpt-7b-h100-8g-s2048", "nemo-llama2-13b-16g", "flash"]
# Workloads of ovsim's own whose last window is contended (an all-reduce beside streaming adds
# after a GEMM loop: the analytic fidelity, which shares nothing, finishes it three times sooner)
# or idle (a host gap after the last kernel).
OWN = {
    "gemms-then-allreduce-beside-adds": "name: contended-tail\nsystem: h100x4\nops:\n"
    "  - {name: g, kind: gemm, m: 8192, n: 8192, k: 8192, precision: bf16, repeat: 380}\n"
    "  - {name: a, kind: elementwise, bytes: 1.07e9, repeat: 60, after: [g]}\n"
    "  - {name: ar, kind: all_reduce, size_bytes: 2.0e9, after: [g], stream: comm}\n",
    "gemms-then-a-host-gap": "name: trailing\nsystem: hgx-h100\nranks: 1\nops:\n"
    "  - {name: g, kind: gemm, m: 8192, n: 8192, k: 8192, precision: bf16, repeat: 400}\n"
    "  - {name: d, kind: delay, duration_s: 0.05, after: [g]}\n",
}
History = dict[int, tuple[Period, ...]]


def _run(wl: Workload, machine: MachineModel, power: PowerConfig, idle_w: float,
         history: History | None) -> tuple[float, float, float, Engine]:
    """The engine's iteration time and energy from ``history`` (None: its own warm-up), the wall
    time, and the engine."""
    t0 = time.perf_counter()
    engine = Engine(wl, machine, EngineOptions(counters=True, power=power), power_history=history)
    tl = engine.run()
    energy = sum(r["energy_j"] for r in power_rows(tl, range(wl.n_ranks), idle_w, 1.0))
    return tl.makespan_s, energy, time.perf_counter() - t0, engine


def _clocks_mhz(power: PowerConfig, history: History, ranks: range) -> list[int]:
    return [round(start_clock(power, history.get(r, ())) * power.model.compute_clock_hz / 1e6) for r in ranks]


def compare(sc: Scenario, source: str) -> dict[str, Any] | None:
    """The three starts of one job; None where it runs no windowed loop."""
    wl, system, gpu, calib = api.build(sc, source)
    power = api.power_config(wl, gpu, calib, sc.power or PowerSettings())
    m = power.model
    if not power.managed or m.control_window_s <= 0:
        return None
    machine = build_machine(system, gpu, calib.params, n_ranks=wl.n_ranks, sm_carveout=sc.knobs.sm_carveout,
                            job_ranks=wl.job_ranks)
    t0 = time.perf_counter()
    window = steady_window(wl, gpu, power, min_windows=0.0)
    analytic_s = time.perf_counter() - t0
    assert window is not None
    ranks = range(wl.n_ranks)
    idle: History = {r: ((m.control_window_s, 0.0, 0.0, 0.0, 0.0, ()),) for r in ranks}
    idle_w = gpu.power.idle_w
    t_warm, e_warm, wall_warm, _ = _run(wl, machine, power, idle_w, None)
    t_an, e_an, wall_an, engine = _run(wl, machine, power, idle_w, window)
    t_idle, e_idle, _, _ = _run(wl, machine, power, idle_w, idle)
    left = engine.left_window()
    # What predict does: the run again from the window it left where the two start apart.
    again = not same_start(power, window, left)
    t_pred, e_pred, wall_again, _ = _run(wl, machine, power, idle_w, left) if again else (t_an, e_an, 0.0, engine)
    return {"windows": t_warm / m.control_window_s, "t_warm": t_warm, "dt_an": t_an / t_warm - 1,
            "de_an": e_an / e_warm - 1, "dt_idle": t_idle / t_warm - 1, "de_idle": e_idle / e_warm - 1,
            "clock_an": _clocks_mhz(power, window, ranks), "clock_left": _clocks_mhz(power, left, ranks),
            "again": again, "dt_pred": t_pred / t_warm - 1, "de_pred": e_pred / e_warm - 1,
            "wall_warm": wall_warm, "wall_pred": wall_an + analytic_s + wall_again}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    every: list[AnyRow] = [*ROWS, *LLAMA_ROWS, *RECOMPUTE_ROWS, *FOUNDRY_ROWS, *NEMO_ROWS, *FLASH_ROWS]
    ap.add_argument("--rows", nargs="+", default=DEFAULT_ROWS, metavar="ROW",
                    help="published rows (bench/published_jobs.py's names or groups), run simulated")
    ap.add_argument("--no-examples", action="store_true", help="leave out the examples and the GPT-3 175B bench")
    args = ap.parse_args(argv)
    wanted = {n for name in args.rows for n in GROUPS.get(name, [name])}
    jobs: list[tuple[str, Scenario, str]] = [] if args.no_examples else [
        (p.stem, load_scenario(p), str(p)) for p in EXAMPLES]
    if not args.no_examples:
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in OWN.items():
                path = Path(tmp) / f"{name}.yaml"
                path.write_text(text)
                jobs.append((name, load_scenario(path), name))
    jobs += [(r.name, r.scenario().model_copy(update={"mode": "simulate"}), r.name) for r in every if r.name in wanted]
    print("windows: the iteration over the control window; time and energy from the analytic window, as "
          "predict reports them (again: run again from the window the run left, the clocks being more than a "
          "step apart) and from idle, against the engine's warm-up; clocks (MHz, the lowest over the ranks): "
          "the analytic window's and the one the run leaves; wall s: the warm-up and its run, against predict's")
    print(f"{'job':>40} {'windows':>8} {'analytic: time':>14} {'energy':>9} {'again':>5} {'predict: time':>13} "
          f"{'energy':>9} {'idle: time':>11} {'energy':>9} {'clock':>6} {'left':>6} {'wall s':>13}")
    for name, sc, source in jobs:
        r = compare(sc, source)
        if r is None:
            print(f"{name:>40}  no windowed power loop")
            continue
        print(f"{name:>40} {r['windows']:8.1f} {r['dt_an']:+14.4%} {r['de_an']:+9.4%} {'yes' if r['again'] else '':>5} "
              f"{r['dt_pred']:+13.4%} {r['de_pred']:+9.4%} {r['dt_idle']:+11.4%} {r['de_idle']:+9.4%} "
              f"{min(r['clock_an']):6d} {min(r['clock_left']):6d} {r['wall_warm']:6.1f} {r['wall_pred']:6.1f}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
