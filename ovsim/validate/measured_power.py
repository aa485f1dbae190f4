"""The calibration harness's power and clock parts: board power and the clocks the power-limit loop sets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import load_gpu

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd



from ovsim.validate.check import Check
from ovsim.validate.datasets import fitted as fitted_sets
from ovsim.validate.datasets import one_experiment, sets
from ovsim.validate.measured import MEASURED_DATA
from ovsim.validate.measured_memory import harness_power_log

# Data sets whose power part the power checks predict, and their GPU spec and system.
MEASURED_POWER = sets("power", "set", "gpu", "system")
# Phase -> (the op it repeats, the power calibration fitted on it): the power of a fitted phase is
# a consistency check, every time and the power of the others predictions.
_POWER_PHASES: dict[str, tuple[dict[str, Any], bool]] = {
    "gemm_bf16_8192": ({"kind": "gemm", "m": 8192, "n": 8192, "k": 8192, "precision": "bf16"}, False),
    "gemm_fp8_8192": ({"kind": "gemm", "m": 8192, "n": 8192, "k": 8192, "precision": "fp8"}, False),
    "add_bf16_256M": ({"kind": "elementwise", "bytes": 3 * 2**29}, True),
}
# (GPU, phase) whose kernel's time the GPU's calibration was fitted on (the H200's memory-bound
# parameters come from the same add, measured in the overlap part): a consistency check.
_TIME_FITTED = {("h200-sxm", "add_bf16_256M")}
MEASURED_POWER_FIT = "measured power (calibration harness; calibration source)"
MEASURED_POWER_HELD_OUT = "measured power and clocks (calibration harness; predicted)"
_SETTLE_S = 1.0  # a phase's first second: the clock and the sensor settling


_REPEATS = 20  # kernels a steady phase is predicted as


def _repeated_at_limit(name: str, system: str, op: dict[str, Any], limit_w: float) -> dict[str, Any]:
    """``predict``'s summary of ``op`` repeated back to back on one GPU under a power cap."""
    from ovsim.api import predict
    from ovsim.scenario import Scenario

    sc = Scenario.model_validate({"name": name, "system": system, "ranks": 1,
                                  "ops": [{"name": f"k{i}", **op} for i in range(_REPEATS)]})
    return predict(sc, power_cap_w=limit_w, counters=False).summary()


def measured_power_checks(folder: Path = MEASURED_DATA) -> list[Check]:
    """The harness's steady power phases (a kernel repeated for seconds at the board's power limit)
    against ``predict`` of the same kernel repeated under the same limit: board power, the SM
    clock the cap solver settles on, and the time per kernel. Only the BF16 GEMM's and the add's
    power were fitted (``calibration/harness/fit_measured.py``), and the H200 add's time (its
    memory-bound parameters); the clocks and the other times never were."""
    from ovsim.traces.power import read_power_samples

    checks: list[Check] = []
    for rel, gpu, system in MEASURED_POWER:
        data = folder / rel
        log = harness_power_log(data)
        if log is None:
            continue
        samples = read_power_samples(log)
        limit = float(load_gpu(gpu).power.tdp_w)
        for phase, (op, fitted) in _POWER_PHASES.items():
            bundle = one_experiment(data, "power", phase)
            if bundle is None:
                continue
            k = bundle.kernels
            main = k[k["kind"] == ("gemm" if op["kind"] == "gemm" else "elementwise")]
            if bundle.wall_origin_s is None or main.empty:
                continue
            start = bundle.wall_origin_s + float(main["start_s"].min())
            end = bundle.wall_origin_s + float((main["start_s"] + main["duration_s"]).max())
            settled = main[main["start_s"] + bundle.wall_origin_s > start + _SETTLE_S]
            window = samples[(samples["wall_time_s"] > start + _SETTLE_S) & (samples["wall_time_s"] < end)]
            n = _REPEATS
            res = _repeated_at_limit(phase, system, op, limit)
            src = f"calibration/data/{rel} (power part, {phase}; {len(window)} samples)"
            what = f"{gpu}: {phase.replace('_', ' ')} at the {limit:.0f} W limit"
            checks.append(Check(f"{what}: power", MEASURED_POWER_FIT if fitted else MEASURED_POWER_HELD_OUT,
                                float(window["power_w"].mean()), float(res["avg_power_w"]), "W", 10.0, src))
            checks.append(Check(f"{what}: SM clock", MEASURED_POWER_HELD_OUT,
                                float(window["sm_clock_hz"].median()) / 1e6, float(res["avg_sm_clock_hz"]) / 1e6,
                                "MHz", 10.0, src, note="median of NVML's readings, which under the limit read up to "
                                "9% below the clock the SMs count (clock part); ovsim: time-weighted mean"))
            time_group = MEASURED_POWER_FIT if (gpu, phase) in _TIME_FITTED else MEASURED_POWER_HELD_OUT
            checks.append(Check(f"{what}: time per kernel", time_group,
                                float(settled["duration_s"].median()) * 1e3, float(res["makespan_s"]) / n * 1e3,
                                "ms", 10.0, src, note="median of the kernels after the first second"))
    return checks


# Data sets of the harness's clock part (each kernel with the SM clock its probes counted).
MEASURED_CLOCK = sets("clock", "set", "gpu", "system")
_CLOCK_PHASES = {f"gemm_{p}_8192x8192x8192": {"kind": "gemm", "m": 8192, "n": 8192, "k": 8192, "precision": p}
                 for p in ("bf16", "fp8", "tf32")}
MEASURED_CLOCK_FIT = "measured clocks (calibration harness clock part; calibration source)"


def _clock_sets(folder: Path, clock_sets: tuple[tuple[str, ...], ...] = MEASURED_CLOCK
                ) -> Iterator[tuple[str, str, str, pd.DataFrame, float]]:
    """Each clock part data set of ``clock_sets`` that ``folder`` holds: its folder, GPU, system,
    kernels with their counted clocks, and the GPU's default power limit."""
    import pandas as pd

    for rel, gpu, system in clock_sets:
        path = folder / rel / "clock.parquet"
        if path.is_file():
            yield rel, gpu, system, pd.read_parquet(path), float(load_gpu(gpu).power.tdp_w)


def measured_clock_checks(folder: Path = MEASURED_DATA) -> list[Check]:
    """The clock part's GEMMs, run back to back at the board's power limit, against ``predict`` of
    the same GEMM repeated under the limit: the SM clock the SMs counted (after the phase's first
    second) and the time per kernel. The saturation clocks were fitted on these kernels' times and
    each precision's tensor power weight on its phase, so every row is a consistency check."""
    checks: list[Check] = []
    for rel, gpu, system, pts, limit in _clock_sets(folder):
        for phase, op in _CLOCK_PHASES.items():
            g = pts[pts["experiment"] == phase]
            if g.empty:
                continue
            g = g[g["name"] == g["name"].value_counts().index[0]]
            steady = g[g["start_s"] > float(g["start_s"].min()) + _SETTLE_S]
            n = _REPEATS
            res = _repeated_at_limit(phase, system, op, limit)
            src = f"calibration/data/{rel} (clock part, {phase}; {len(steady)} kernels)"
            what = f"{gpu}: gemm {op['precision']} 8192 at the {limit:.0f} W limit"
            checks.append(Check(f"{what}: counted SM clock", MEASURED_CLOCK_FIT,
                                float(steady["sm_clock_hz"].median()) / 1e6, float(res["avg_sm_clock_hz"]) / 1e6,
                                "MHz", 10.0, src, note="median over the kernels after the first second"))
            checks.append(Check(f"{what}: time per kernel", MEASURED_CLOCK_FIT,
                                float(steady["duration_s"].median()) * 1e3, float(res["makespan_s"]) / n * 1e3,
                                "ms", 10.0, src, note="median of the kernels after the first second"))
    return checks


# The clock part's phases alternating a GEMM with a memory-bound kernel under the power limit, as
# scenario ops: the heater GEMM, then the victim as a scenario writes it (the add's three
# 2^28-element BF16 tensors; a layer norm or softmax reading and writing 16384x8192 BF16).
_MIX_GEMM = {"kind": "gemm", "m": 8192, "n": 8192, "k": 8192, "precision": "bf16"}
_MIX_VICTIMS: dict[str, dict[str, Any]] = {
    "add_bf16_256M__after_gemm": {"kind": "elementwise", "bytes": 3 * 2**29},
    "layernorm_bf16_16384x8192__after_gemm": {"kind": "norm", "bytes": 4 * 16384 * 8192},
    "softmax_bf16_16384x8192__after_gemm": {"kind": "softmax", "bytes": 4 * 16384 * 8192},
}
# Boards whose clock part also alternated the GEMM with the add at GEMM time shares of 10-90%
# (the power fit reads none of them).
MEASURED_CLOCK_SHARES = sets("clock_shares", "set", "gpu", "system")
_SHARE_VICTIMS = {f"add_bf16_256M__gemm_share_{p}": _MIX_VICTIMS["add_bf16_256M__after_gemm"] for p in (10, 25, 75, 90)}
_MIX_CYCLES = 5  # cycles a mixed phase is predicted as (repeated: the loop's steady state)
MEASURED_CLOCK_MIX = ("measured clocks, GEMM alternating with a memory-bound kernel (calibration harness clock "
                      "part; held out: the power-limit loop's window was fitted on the GEMM phases alone, and the "
                      "voltage floor on the GEMM-share phases)")
# The GEMM-share phases: the voltage floor was fitted on them (calibration/harness/fit_measured.py)
# on the boards marked ``fit`` in the registry; the others' are held out.
MEASURED_CLOCK_SHARE_MIX = ("measured clocks, GEMM alternating with the add at GEMM time shares of 10-90% "
                            "(calibration harness clock part; calibration source of the voltage floor)")
MEASURED_CLOCK_SHARE_MIX_HELD_OUT = ("measured clocks, GEMM alternating with the add at GEMM time shares of 10-90% "
                                     "(calibration harness clock part; held out: a board the voltage floor was "
                                     "not fitted on)")


def _runs(is_gemm: np.ndarray) -> tuple[int, int]:
    """Median lengths of the runs of GEMMs and of victims in a phase's kernel sequence."""
    import numpy as np

    change = np.flatnonzero(np.diff(is_gemm.astype(int)) != 0) + 1
    bounds = np.concatenate(([0], change, [len(is_gemm)]))
    lengths = np.diff(bounds)
    kinds = is_gemm[bounds[:-1]]
    # The first and last runs may be cut by the phase's edges.
    inner = slice(1, -1) if len(lengths) > 2 else slice(None)
    return int(np.median(lengths[inner][kinds[inner]])), int(np.median(lengths[inner][~kinds[inner]]))


def _clock_during(timeline: Any, ids: list[str]) -> float:
    """The SM clock averaged over the ops' running time (rank 0's clock counter)."""
    import numpy as np

    c = timeline.counters
    c = c[(c["counter"] == "sm_clock_hz") & (c["rank"] == 0)]
    at, value = c["time_s"].to_numpy(float), c["value"].to_numpy(float)
    ops = timeline.ops.set_index("id").loc[ids]
    total = weighted = 0.0
    for start, dur in zip(ops["start_s"].to_numpy(float), ops["duration_s"].to_numpy(float), strict=True):
        edges = np.concatenate(([start], at[(at > start) & (at < start + dur)], [start + dur]))
        idx = np.clip(np.searchsorted(at, edges[:-1], side="right") - 1, 0, len(value) - 1)
        weighted += float(np.sum(np.diff(edges) * value[idx]))
        total += dur
    return weighted / total


def measured_clock_mix_checks(folder: Path = MEASURED_DATA) -> list[Check]:
    """The clock part's phases that alternate GEMMs with a memory-bound kernel every few
    milliseconds at the board's power limit, against ``predict`` of the same alternation repeated
    under the limit: the SM clock the GEMMs and the victim ran at (medians after the phase's
    first second), and the GEMM's time. On the GPU both ran at one clock, between the GEMM's clock
    alone and the top, which a clock following each moment's power does not give."""
    from ovsim.api import predict
    from ovsim.scenario import Scenario

    checks: list[Check] = []
    voltage_sets = set(fitted_sets("clock_shares").values())
    sets = [(s, _MIX_VICTIMS) for s in _clock_sets(folder)]
    sets += [(s, {**_MIX_VICTIMS, **_SHARE_VICTIMS}) for s in _clock_sets(folder, MEASURED_CLOCK_SHARES)]
    for (rel, gpu, system, pts, limit), phases in sets:
        for phase, victim in phases.items():
            g = pts[pts["experiment"] == phase].sort_values("start_s")
            if g.empty:
                continue
            # cuBLAS's Hopper GEMMs are nvjet kernels; at high GEMM shares they outnumber the victim.
            counts = g["name"].value_counts()
            is_gemm = counts.index.str.contains("nvjet")
            if is_gemm.all() or not is_gemm.any():
                continue
            gemm_name, victim_name = counts.index[is_gemm][0], counts.index[~is_gemm][0]
            g = g[g["name"].isin([victim_name, gemm_name])]
            n_gemm, n_victim = _runs((g["name"] == gemm_name).to_numpy())
            steady = g[g["start_s"] > float(g["start_s"].min()) + _SETTLE_S]
            ops: list[dict[str, Any]] = []
            for c in range(_MIX_CYCLES):
                ops += [{"name": f"g{c}_{i}", **_MIX_GEMM} for i in range(n_gemm)]
                ops += [{"name": f"v{c}_{i}", **victim} for i in range(n_victim)]
            sc = Scenario.model_validate({"name": phase, "system": system, "ranks": 1, "ops": ops})
            r = predict(sc, power_cap_w=limit)
            tl = r.timeline
            gemm_ids = [f"{o['name']}@r0" for o in ops if o["name"].startswith("g")]
            victim_ids = [f"{o['name']}@r0" for o in ops if o["name"].startswith("v")]
            src = (f"calibration/data/{rel} (clock part, {phase}: {n_gemm} GEMMs then {n_victim} {victim['kind']} "
                   f"kernels, {len(steady)} kernels after the first second)")
            share = phase.rsplit("_", 1)[-1] if "gemm_share" in phase else None
            what = (f"{gpu} {rel.rsplit('/', 1)[-1]}: {phase.split('__')[0]} after {n_gemm} GEMMs"
                    + (f" ({share}% GEMM time)" if share else "") + f" at the {limit:.0f} W limit")
            gs, vs = steady[steady["name"] == gemm_name], steady[steady["name"] == victim_name]
            group = MEASURED_CLOCK_MIX if not share else (
                MEASURED_CLOCK_SHARE_MIX if rel in voltage_sets else MEASURED_CLOCK_SHARE_MIX_HELD_OUT)
            checks.append(Check(f"{what}: GEMM's counted SM clock", group,
                                float(gs["sm_clock_hz"].median()) / 1e6, _clock_during(tl, gemm_ids) / 1e6,
                                "MHz", 10.0, src, note="median over the GEMMs after the first second"))
            checks.append(Check(f"{what}: victim's counted SM clock", group,
                                float(vs["sm_clock_hz"].median()) / 1e6, _clock_during(tl, victim_ids) / 1e6,
                                "MHz", 10.0, src, note="median over the victim's kernels after the first second"))
            dur = tl.ops.set_index("id").loc[gemm_ids, "duration_s"]
            checks.append(Check(f"{what}: GEMM time", group,
                                float(gs["duration_s"].median()) * 1e3, float(dur.median()) * 1e3,
                                "ms", 10.0, src, note="median of the GEMMs after the first second"))
    return checks


# The clock part's memory-bound kernels, by experiment prefix, as the kinds of
# ``memory_kind_clock_share`` they measure.
CLOCK_MEMORY_KINDS = {"add_": "elementwise", "layernorm_": "norm", "softmax_": "softmax"}
CLOCK_STEADY_HZ = 30e6  # a group whose probes differ by more ran while the clock moved: left out
# The slowest and fastest clocks a kernel ran at, as quantiles of its steady-clock instances.
_CLOCK_ENDS = 0.05
MEASURED_CLOCK_SHARE_FIT = "measured clocks, memory-bound kernels (calibration harness clock part; calibration source)"
MEASURED_CLOCK_SHARE_HELD_OUT = ("measured clocks, memory-bound kernels (calibration harness clock part; held out: "
                                 "the other GPU's share)")


def clock_memory_points(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per kind of ``CLOCK_MEMORY_KINDS``, (counted SM clock Hz, duration s) of the clock part's
    memory-bound kernel (its experiment's most frequent kernel) at each steady-clock instance, as
    far as ``folder`` (a data set) holds them."""
    import pandas as pd

    path = folder / "clock.parquet"
    if not path.is_file():
        return {}
    pts = pd.read_parquet(path)
    pts = pts[pts["clock_step_hz"] < CLOCK_STEADY_HZ]
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for prefix, kind in CLOCK_MEMORY_KINDS.items():
        g = pts[pts["experiment"].str.startswith(prefix)]
        if g.empty:
            continue
        g = g[g["name"] == g["name"].value_counts().index[0]]
        out[kind] = (g["sm_clock_hz"].to_numpy(float), g["duration_s"].to_numpy(float))
    return out


def clock_end_ratio(clock_hz: np.ndarray, duration_s: np.ndarray) -> tuple[float, float, float]:
    """(median clock of the slowest-clock instances, of the fastest, and the ratio of their median
    durations): how much longer the kernel took at its lowest clocks than at its highest."""
    import numpy as np

    lo, hi = np.quantile(clock_hz, [_CLOCK_ENDS, 1.0 - _CLOCK_ENDS])
    slow, fast = clock_hz <= lo, clock_hz >= hi
    return (float(np.median(clock_hz[slow])), float(np.median(clock_hz[fast])),
            float(np.median(duration_s[slow]) / np.median(duration_s[fast])))


def measured_clock_share_checks(folder: Path = MEASURED_DATA) -> list[Check]:
    """How much longer (in percent) the clock part's layer norm and softmax took at their lowest
    clocks than at their highest, against the clock share of each GPU's shipped calibration (fitted
    on these kernels: consistency) and of the other measured GPU's (held out); within 30% of the
    measured slowdown."""
    import numpy as np

    from ovsim.calibrate import memory_clock_time_s

    sets = [(rel, gpu, clock_memory_points(folder / rel)) for rel, gpu, _ in MEASURED_CLOCK]
    shares = {gpu: load_calibration(load_gpu(gpu), gpu).params.memory_kind_clock_share for _, gpu, _ in sets}
    checks: list[Check] = []
    for rel, gpu, points in sets:
        ref = load_gpu(gpu).clocks.compute_clock_hz
        for kind, (clk, dur) in points.items():
            lo, hi, measured = clock_end_ratio(clk, dur)
            src = (f"calibration/data/{rel} (clock part, {len(clk)} {kind} kernels at steady clocks; lowest and "
                   f"highest {_CLOCK_ENDS:.0%} of clocks)")
            for owner, group in [(gpu, MEASURED_CLOCK_SHARE_FIT)] + [
                    (o, MEASURED_CLOCK_SHARE_HELD_OUT) for _, o, _ in sets if o != gpu]:
                if kind not in shares[owner]:
                    continue
                share = shares[owner][kind]
                t = memory_clock_time_s(np.array([lo, hi]), 1.0, share, ref)
                checks.append(Check(
                    f"{gpu}: {kind} slower at {lo / 1e6:.0f} than at {hi / 1e6:.0f} MHz, {owner}'s clock share "
                    f"{share:.3f}", group, (measured - 1.0) * 100, float(t[0] / t[1] - 1.0) * 100, "%", 30.0, src,
                    note="a time that does not follow the clock: 0%"))
    return checks
