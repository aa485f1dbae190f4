"""Schedule search: the best overlap schedule for a scenario, and why it wins (docs/tune.md).

    result = tune("examples/gemm-allreduce-h100x4-overlapped.yaml", objective="time")
    result.table          # ranked schedules: knob values, predicted time, energy, gain
    result.why            # one line per leader: what it hides, what it slows, and by what
    result.best_mapping   # the best schedule as a scenario mapping (write it as YAML)

The space is the schedule knobs the scenario leaves open (:func:`default_space`) or those a space
file names, each with its legal values; every combination is a candidate. The method:

1. Every candidate is built and validated; those that do not validate are dropped and counted,
   those whose training memory does not fit the GPU are kept out of the ranking and counted.
2. Every candidate is predicted with the analytic fidelity, where each op takes its isolated
   time; its objective there is the candidate's ``estimate`` (for time, without the power loop:
   :func:`analyze`), and its ops' isolated times, each sped up as much as the top SM clock speeds
   that op, and each kernel's wait for the SMs the dispatcher cannot give it yet
   (:func:`time_bound_s`), give its time ``bound``. Candidates that differ only in knobs the
   analytic prediction does not see (stream priority; for time, power settings too) share one
   prediction, made at the least urgent priority; the others take the bound without the wait,
   which holds at any priority.
   Contention (shared SMs, HBM, links) only adds time to ops, and with precedence the only
   constraint the longest path only grows with its ops' times, so no engine prediction of a
   candidate is faster than its bound (checked on every one the engine makes; a violation is
   counted; docs/tune.md gives the one exception known, by at most 0.11%). The estimate is not
   a bound: with the power loop, contention spreads a kernel's power and raises the clock (an
   H100 GEMM beside an all-reduce holding SMs: 9.70 ms with the engine, 10.09 ms analytic).
3. Candidates in order of their bound (for time; of their estimate for energy) are predicted
   with the engine, ``workers`` at a time, skipping those that cannot win: for time, a bound no
   better than the best the engine has found (exact pruning), or with a ``tolerance`` no better
   than the best less that share of the bound (the pick is then within that share of the best);
   for energy and energy x delay, which have no such bound, an estimate more than
   ``ESTIMATE_MARGIN`` above it (a heuristic). The search stops when none is left or after
   ``confirm_max`` engine predictions; ``stats`` says which, how many could still have won and,
   for time, by how much at most (``gap_pct``).
   A candidate that builds the same workload as one already predicted, with the same priority,
   carve-out and power settings, takes that prediction (:func:`workload_digest`).
4. A space of more than ``max_grid`` combinations is not enumerated: Optuna's TPE sampler picks
   ``max_grid`` of them on the estimate.
5. Under a time budget (``budget_s``; an analysis of a job of thousands of GPUs takes seconds), a
   grid whose analyses would take more than ``SAMPLING_SHARE`` of it, at what the scenario as
   given takes, is sampled instead; sampling stops at that share of what is left
   (``stats["sampling_stopped"]``) and the engine's confirmations when the budget is spent
   (``stats["stop"]``: "budget_s", or "confirm_max" at that count).

The scenario as given is always predicted with the engine: the gains are over it. In this
process, where it is analysed among the rest (not where sampling or a budget's check analysed it
before), its training iteration is analysed first and it is predicted right after, so that its
build takes their op specs and ops; else after the analyses.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ovsim.errors import OvsimError
from ovsim.models.build_memo import reusing_builds
from ovsim.models.training import release_training_build, reusing_training_ops
from ovsim.scenario import Scenario
from ovsim.sweep import base_mapping, scenario_at

# The candidates live in tune_candidates, the search's steps in tune_steps, the predictions in
# tune_predictions, the space in tune_space and the why-lines in tune_explain; the functions named
# in __all__ can still be imported from here.
from ovsim.tune_candidates import Candidate, candidates, check_space, point_text, take_analysis, validated_candidates
from ovsim.tune_explain import given_problem, knob_value, why_line
from ovsim.tune_predictions import (
    OBJECTIVE_FIELDS,
    Objective,
    analyze,
    objective_value,
    summarize,
    time_bound_s,
    workload_digest,
)
from ovsim.tune_space import default_space, read_space, value_at
from ovsim.tune_steps import Progress, Run, analyze_all, confirm, predict_given, sample
from ovsim.workers import executor

__all__ = ["OBJECTIVE_FIELDS", "Objective", "TuneResult", "analyze", "candidates", "default_space", "explain",
           "knob_value", "objective_value", "read_space", "scenario_yaml", "summarize", "time_bound_s", "tune",
           "value_at", "workload_digest"]

# An engine time below its bound by more than this share is a violation.
BOUND_TOLERANCE = 1e-6
# Time, by default: the pick is the best schedule in the space (``tolerance`` lets it be up to a share
# above, so that a candidate whose bound is within that share of the best found is not confirmed).
TIME_TOLERANCE = 0.0
MAX_GRID = 2000
# Under a time budget, the share of it that analysing (or sampling) the space may take; the rest
# is for the engine's confirmations.
SAMPLING_SHARE = 0.5


@dataclass
class TuneResult:
    """The ranked schedules the engine predicted (``table``), the best one's scenario mapping, one
    line per leader saying why it wins, and the search's counts (``stats``)."""

    table: pd.DataFrame
    best_mapping: dict[str, Any]
    why: list[str]
    stats: dict[str, Any]
    leaders: list[Candidate] = field(repr=False)
    given: Candidate = field(repr=False)


def tune(scenario: str | Path | Scenario, *, space: Mapping[str, Sequence[Any]] | None = None,
         objective: Objective = "time", top: int = 5, workers: int = 1, confirm_max: int = 50,
         max_grid: int = MAX_GRID, seed: int = 0, space_source: str = "space",
         scheduler: str | None = None, budget_s: float | None = None, tolerance: float = TIME_TOLERANCE,
         progress: Progress | None = None) -> TuneResult:
    """Search ``space`` (default: :func:`default_space`) for the schedule that minimises
    ``objective`` (the module docstring says how); ``top`` leaders are ranked and explained.
    ``workers``: predictions at once (1: in this process; 0: one process per core); ``scheduler``:
    a Dask scheduler's address, to run them on its cluster (:func:`ovsim.workers.executor`; give
    the cluster's worker count as ``workers``). ``budget_s``: the search's wall-clock budget
    (step 5 of the module docstring). ``tolerance``: for time, how far above the best schedule in
    the space the pick may be (step 3; 0: the best itself). ``progress(what, done, total)`` is told
    how far each step has got."""
    if objective not in OBJECTIVE_FIELDS:
        raise OvsimError(f"must be one of {', '.join(OBJECTIVE_FIELDS)}, got '{objective}'", field="objective")
    if budget_s is not None and not (isinstance(budget_s, int | float) and budget_s > 0):
        raise OvsimError(f"must be a positive number of seconds, got {budget_s}", field="budget_s")
    if not (isinstance(tolerance, int | float) and 0.0 <= tolerance < 1.0):
        raise OvsimError(f"must be a share from 0 (the best itself) to below 1, got {tolerance}", field="tolerance")
    if tolerance > 0 and objective != "time":
        # Energy has no bound to hold a tolerance to: its pruning is ESTIMATE_MARGIN's heuristic.
        raise OvsimError(f"applies to --objective time only (got {objective})", field="tolerance")
    started = time.monotonic()
    run = Run(objective, tolerance=float(tolerance),
               deadline=started + budget_s if budget_s is not None else math.inf, progress=progress)
    # The candidates' builds share their kernels' prices and collectives' plans (in this process).
    with reusing_builds():
        return _search(scenario, space, run, top=top, workers=workers, confirm_max=confirm_max, max_grid=max_grid,
                       seed=seed, space_source=space_source, scheduler=scheduler, budget_s=budget_s,
                       started=started)


def _search(scenario: str | Path | Scenario, space: Mapping[str, Sequence[Any]] | None, run: Run, *, top: int,
            workers: int, confirm_max: int, max_grid: int, seed: int, space_source: str, scheduler: str | None,
            budget_s: float | None, started: float) -> TuneResult:
    """:func:`tune`'s steps once its arguments are checked."""
    objective = run.objective
    base = base_mapping(scenario)
    data, path, source = base
    given_sc = scenario if isinstance(scenario, Scenario) else scenario_at(data, path, source)
    # A space written by hand is checked value by value: each must validate now, and where a
    # candidate's analysis fails, each must build (below; building them all first took 14% of a
    # small search's time).
    written = space
    if written is not None:
        check_space(base, written, space_source, builds=False)
    # Candidates that differ only in knobs build the same training iteration's op specs: made once.
    with reusing_training_ops():
        space = dict(space) if space is not None else default_space(given_sc, objective)
        if not space:
            raise OvsimError("the scenario leaves no schedule knob open (nothing to overlap); name the knobs to "
                             "search in a space file (--space)", source=source, field="space")
        n_grid = math.prod(len(v) for v in space.values())
        workers = workers or os.cpu_count() or 1
        sampled, given_analysis = n_grid > max_grid, None
        if not sampled and budget_s is not None:
            sampled, given_analysis = _grid_too_slow(given_sc, space, run, n_grid, workers)
        counts: dict[str, Any] = {"trials": 0, "analyses": 0, "sampling_stopped": False}
        if sampled:
            left_s = run.deadline - time.monotonic()
            given_point = {k: value_at(given_sc, k) for k in space}
            cands, dropped, counts = sample(base, space, given_point, run, min(max_grid, n_grid), seed,
                                              max(0.0, SAMPLING_SHARE * left_s) if math.isfinite(left_s) else None)
        else:
            cands, dropped = validated_candidates(base, space)
        given = _given(cands, data, given_sc, space)
        if given_analysis is not None and not given.analytic:
            take_analysis(given, given_analysis, objective)
    run.jobs = min(workers, max(1, len(cands)))
    run.pool = executor(run.jobs, scheduler)
    # In process, the candidates' analyses reuse one training iteration's op specs, and that of
    # the candidate to confirm first is kept for its engine prediction (the one analysed last goes
    # before the engine's confirmations); processes of a pool make their own.
    with run.pool or nullcontext(), reusing_training_ops() if run.pool is None else nullcontext():
        t0 = time.monotonic()
        n_analytic = counts.pop("analyses") + (given_analysis is not None) + analyze_all(
            cands, run, given if run.pool is None else None)
        analysis_s = time.monotonic() - t0 - run.engine_s
        release_training_build()
        if written is not None and any("error" in c.analytic for c in cands):
            check_space(base, written, space_source)
        if not given.engine:
            predict_given(given, run)
        confirmed = confirm(cands, run, confirm_max)
    confirmed["engine_predictions"] += 1
    stats = {"objective": objective, "tolerance": run.tolerance, "space": {k: list(v) for k, v in space.items()},
             "grid": n_grid,
             "sampled": sampled, **counts, "candidates": len(cands), "given_added": _outside(given.point, space),
             **dropped,
             "unfit": sum(1 for c in cands if c.analytic.get("fits_memory") is False),
             "failed": sum(1 for c in cands if "error" in c.analytic or "error" in c.engine),
             "failed_example": next((f"{point_text(c.point)}: {c.analytic.get('error') or c.engine['error']}"
                                     for c in cands if "error" in c.analytic or "error" in c.engine), ""),
             "analytic_predictions": n_analytic, **confirmed, "budget_s": budget_s,
             "elapsed_s": time.monotonic() - started,
             # Wall seconds of the analyses (after any sampling) and of the given's engine prediction:
             # together, the least a search that analyses the space and confirms one schedule takes.
             "analysis_s": analysis_s, "given_engine_s": run.engine_s}
    return _result(cands, given, space, objective, top, stats)


def _grid_too_slow(sc: Scenario, space: Mapping[str, Sequence[Any]], run: Run, n_grid: int,
                   workers: int) -> tuple[bool, dict[str, Any]]:
    """Whether analysing the whole grid, ``workers`` at a time, would take more than
    ``SAMPLING_SHARE`` of the time budget at what the analysis of the scenario as given takes;
    and that analysis."""
    t0 = time.monotonic()
    # Analysed whole even where it cannot fit memory: the others may, and the pace is theirs.
    given = analyze(sc, run.objective, memory_first=False)
    each_s = time.monotonic() - t0
    analyses = n_grid / math.prod(len(space[k]) for k in run.blind() if k in space)
    return analyses * each_s / workers > SAMPLING_SHARE * (run.deadline - t0), given


def _outside(point: Mapping[str, Any], space: Mapping[str, Sequence[Any]]) -> bool:
    """Whether a knob of ``point`` has a value its space does not list."""
    return any(not any(v == x for x in space[k]) for k, v in point.items())


def _given(cands: list[Candidate], data: dict[str, Any], sc: Scenario,
           space: Mapping[str, Sequence[Any]]) -> Candidate:
    """The candidate that is the scenario as given, added to ``cands`` if the space leaves it out."""
    point = {k: value_at(sc, k) for k in space}
    for c in cands:
        if c.point == point:
            return c
    c = Candidate(point=point, mapping=data, scenario=sc)
    cands.append(c)
    return c


def _result(cands: list[Candidate], given: Candidate, space: Mapping[str, Sequence[Any]], objective: Objective,
            top: int, stats: dict[str, Any]) -> TuneResult:
    done = [c for c in cands if c.engine and math.isfinite(objective_value(c.engine, objective))]
    # Ties go to the scenario as given, then to the fewest changes: a change that gains nothing is
    # no advice.
    done.sort(key=lambda c: (objective_value(c.engine, objective), c is not given,
                             sum(given.point.get(k) != v for k, v in c.point.items())))
    given_ok = math.isfinite(objective_value(given.engine, objective))
    stats["given_problem"] = "" if given_ok else _given_problem(given)
    if not done:
        least = min((c.analytic.get("memory_per_gpu_bytes", math.inf) for c in cands), default=math.inf)
        least_text = f", the least needing {least / 1e9:.1f} GB a GPU" if math.isfinite(least) else ""
        raise OvsimError(f"no schedule searched fits memory or could be predicted ({stats['unfit']} of "
                         f"{stats['candidates']} do not fit{least_text}; {stats['failed']} failed); the "
                         f"scenario as given: {stats['given_problem']}", field="scenario")
    base = objective_value(given.engine, objective)
    rows = []
    for rank, c in enumerate(done, 1):
        value = objective_value(c.engine, objective)
        rows.append({"rank": rank, **{k: c.point.get(k) for k in space}, "makespan_s": c.engine["makespan_s"],
                     "energy_j": c.engine.get("energy_j", math.nan), "objective": value, "estimate": c.estimate,
                     "bound_s": c.bound_s,
                     "change_pct": 100.0 * (value / base - 1.0) if math.isfinite(base) else math.nan,
                     "gain_pct": 100.0 * (base / value - 1.0) if math.isfinite(base) else math.nan,
                     "as_given": c is given})
    stats["bound_violations"] = sum(1 for c in done if c.engine["makespan_s"] < c.bound_s * (1 - BOUND_TOLERANCE))
    leaders = done[:top]
    table = pd.DataFrame(rows)
    for k in space:
        values = [row[k] for row in rows]
        if None in values and any(v is not None for v in values):
            # None beside numbers stays None and the numbers whole, not NaN and floats; other
            # columns keep the type pandas gives them (a boolean stays a boolean).
            table[k] = pd.Series(values, dtype=object)
    return TuneResult(table=table, best_mapping=done[0].mapping,
                      why=[explain(c, given, objective) for c in leaders], stats=stats, leaders=leaders,
                      given=given)


def _given_problem(given: Candidate) -> str:
    return given_problem(given.engine)


def explain(c: Candidate, given: Candidate, objective: Objective) -> str:
    """One line: how the leader differs from the scenario as given, what it hides, what it slows
    and by what (SMs, HBM, links, the clock)."""
    return why_line(c.point, c.engine, given.point, given.engine, objective)


def scenario_yaml(mapping: Mapping[str, Any], scenario_path: str | Path | None, out_path: str | Path) -> str:
    """A candidate's scenario as YAML to be written at ``out_path``: its calibration files, which
    the scenario names relative to its own file, named relative to the new one."""
    import yaml

    data = dict(mapping)
    if scenario_path is not None and data.get("calibration"):
        here, there = Path(scenario_path).resolve().parent, Path(out_path).resolve().parent
        data["calibration"] = [c if Path(c).is_absolute() else os.path.relpath(here / c, there)
                               for c in data["calibration"]]
    text: str = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return text
