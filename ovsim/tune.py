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
3. Candidates in order of their estimate are predicted with the engine, ``workers`` at a time,
   skipping those that cannot win: for time, a bound no better than the best the engine has found
   (exact pruning), or with a ``tolerance`` no better than the best less that share of the bound
   (the pick is then within that share of the best); for energy and energy x delay, which have no
   such bound, an estimate more than ``ESTIMATE_MARGIN`` above it (a heuristic). The search stops
   when none is left or after ``confirm_max`` engine predictions; ``stats`` says which, and how
   many could still have won.
   A candidate that builds the same workload as one already predicted, with the same priority,
   carve-out and power settings, takes that prediction (:func:`workload_digest`).
4. A space of more than ``max_grid`` combinations is not enumerated: Optuna's TPE sampler picks
   ``max_grid`` of them on the estimate.
5. Under a time budget (``budget_s``; an analysis of a job of thousands of GPUs takes seconds), a
   grid whose analyses would take more than ``SAMPLING_SHARE`` of it, at what the scenario as
   given takes, is sampled instead; sampling stops at that share of what is left
   (``stats["sampling_stopped"]``) and the engine's confirmations when the budget is spent
   (``stats["stop"]``: "budget_s", or "confirm_max" at that count).

The scenario as given is always predicted with the engine: the gains are over it.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ovsim.api import build
from ovsim.errors import OvsimError
from ovsim.models.build_memo import reusing_builds
from ovsim.models.training import reusing_training_ops
from ovsim.scenario import Scenario
from ovsim.sweep import base_mapping, edited, scenario_at

# The predictions live in tune_predictions, the space in tune_space and the why-lines in
# tune_explain; the functions named in __all__ can still be imported from here.
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
from ovsim.workers import executor

__all__ = ["OBJECTIVE_FIELDS", "Objective", "TuneResult", "analyze", "candidates", "default_space", "explain",
           "knob_value", "objective_value", "read_space", "scenario_yaml", "summarize", "time_bound_s", "tune",
           "value_at", "workload_digest"]

# A knob that matters only while another has one of some values: a combination that sets it
# elsewhere, other than to its first value, repeats another candidate and is not searched.
CONDITIONS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "training.parallel.tp_chunks": ("training.parallel.tp_overlap", ("chunked", "copy_engine")),
    "knobs.comm_priority": ("schedule", ("overlapped",)),
    "training.parallel.bucket_bytes": ("training.parallel.overlap_grad_reduce", (True,)),
}
# An engine time below its bound by more than this share is a violation.
BOUND_TOLERANCE = 1e-6
# Knobs the analytic fidelity does not see (it shares no resource, so stream priority changes
# nothing): candidates that differ only in them share one analysis.
ANALYTIC_BLIND = ("knobs.comm_priority",)
# The power settings, which a time search's analytic prediction leaves out (analyze).
POWER_KNOBS = ("power.cap_w", "power.sm_clock_hz")
# Time, by default: the pick is the best schedule in the space (``tolerance`` lets it be up to a share
# above, so that a candidate whose bound is within that share of the best found is not confirmed).
TIME_TOLERANCE = 0.0
# Energy objectives: a candidate whose estimate is this much above the best found is not confirmed.
ESTIMATE_MARGIN = 0.05
MAX_GRID = 2000
# Under a time budget, the share of it that analysing (or sampling) the space may take; the rest
# is for the engine's confirmations.
SAMPLING_SHARE = 0.5
# progress(what, done, total): how far a step of the search has got.
Progress = Callable[[str, int, int], None]


@dataclass
class Candidate:
    """One schedule: its knob values, its scenario mapping and scenario, the analytic summary
    (``analytic``; its objective ``estimate``, and the time ``bound_s``) and the engine's."""

    point: dict[str, Any]
    mapping: dict[str, Any]
    scenario: Scenario
    estimate: float = math.nan
    bound_s: float = math.nan
    analytic: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)

    def could_win(self, best: float, objective: Objective, tolerance: float = 0.0) -> bool:
        """Whether the engine could find this candidate better than ``best`` by more than
        ``tolerance`` (a share of the candidate's own time; time only)."""
        if not math.isfinite(self.estimate):
            return False
        if objective == "time":
            return self.bound_s * (1.0 + tolerance) < best
        return self.estimate < best * (1.0 + ESTIMATE_MARGIN)


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


# -- candidates ------------------------------------------------------------------------------------

def _redundant(point: Mapping[str, Any], space: Mapping[str, Sequence[Any]]) -> bool:
    return any(knob in point and point[knob] != space[knob][0] and point.get(on, values[0]) not in values
               for knob, (on, values) in CONDITIONS.items())


# A scenario's mapping as read, its file (None: given in Python) and its name for messages
# (sweep.base_mapping): read once per search, not once per candidate.
Base = tuple[dict[str, Any], Path | None, str]


def candidates(scenario: Scenario | str | Path, space: Mapping[str, Sequence[Any]],
               points: Sequence[dict[str, Any]] | None = None) -> tuple[list[Candidate], dict[str, Any]]:
    """The space's combinations (or ``points``) as validated candidates, and the counts of those
    dropped: ``invalid`` (the scenario does not validate; ``invalid_example`` says why for one) and
    ``redundant`` (a knob set where it does not matter)."""
    return _candidates(base_mapping(scenario), space, points)


def _candidates(base: Base, space: Mapping[str, Sequence[Any]],
                points: Sequence[dict[str, Any]] | None = None) -> tuple[list[Candidate], dict[str, Any]]:
    data, path, source = base
    out: list[Candidate] = []
    dropped: dict[str, Any] = {"invalid": 0, "redundant": 0, "invalid_example": ""}
    combos = points if points is not None else (dict(zip(space, c, strict=True))
                                                for c in itertools.product(*space.values()))
    for point in combos:
        if _redundant(point, space):
            dropped["redundant"] += 1
            continue
        try:
            mapping = edited(data, point)
            out.append(Candidate(point=dict(point), mapping=mapping, scenario=scenario_at(mapping, path, source)))
        except (OvsimError, ValueError) as e:
            dropped["invalid"] += 1
            dropped["invalid_example"] = dropped["invalid_example"] or f"{_point_text(point)}: {_message(e)}"
    return out, dropped


def _message(e: Exception) -> str:
    return e.one_line() if isinstance(e, OvsimError) else str(e)


def _point_text(point: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in point.items())


def check_space(base: Base, space: Mapping[str, Sequence[Any]], source: str) -> None:
    """Refuse a space a user wrote with a knob path the scenario has no place for, or a value that
    is illegal on its own (the scenario as given with only that knob changed does not validate or
    does not build): a one-line error naming the space's file and the knob. Values legal alone but
    not together are dropped from the search and counted."""
    data, path, name = base
    for knob, values in space.items():
        for value in values:
            try:
                sc = scenario_at(edited(data, {knob: value}), path, name)
                build(sc, name)
            except (OvsimError, ValueError) as e:
                reason = e.message if isinstance(e, OvsimError) else str(e)
                raise OvsimError(f"{value!r}: {reason}", source=source, field=knob) from None


# -- predictions -----------------------------------------------------------------------------------

@dataclass
class _Run:
    """What the steps of one search share: the objective, where predictions run and how many at
    once, when its time budget ends (``time.monotonic`` seconds; infinite: no budget) and whom to
    tell how far it has got."""

    objective: Objective
    tolerance: float = 0.0
    pool: Any = None
    jobs: int = 1
    deadline: float = math.inf
    progress: Progress | None = None
    engine_s: float = 0.0  # what the engine took on the scenario as given

    def tell(self, what: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(what, done, total)

    def blind(self) -> tuple[str, ...]:
        """The knobs an analysis does not see: candidates differing only in them share one."""
        return ANALYTIC_BLIND + (POWER_KNOBS if self.objective == "time" else ())


def _mapped(fn: Any, cands: Sequence[Candidate], pool: Any, *args: Any) -> Iterator[dict[str, Any]]:
    """``fn`` of each candidate's scenario, in order, as each comes."""
    scenarios = [c.scenario for c in cands]
    return iter((pool.map if pool is not None else map)(fn, scenarios, *(itertools.repeat(a) for a in args)))


def _analyze(cands: Sequence[Candidate], run: _Run) -> int:
    """Analyse the candidates: one of each group that differs only in knobs the analytic fidelity
    does not see (``ANALYTIC_BLIND``) stands for the group; returns the analyses made."""
    blind = run.blind()
    groups: dict[str, list[Candidate]] = {}
    for c in cands:
        groups.setdefault(_point_key(c, lambda k: k not in blind), []).append(c)
    for group in groups.values():  # one already analysed (the scenario as given) stands for its group
        done = next((c for c in group if c.analytic), None)
        if done is not None:
            for c in group:
                _analyzed(c, done.analytic, run.objective, _same_priority(c, done))
    # Candidates of one training iteration analysed one after another reuse its op specs
    # (reusing_training_ops holds the last); the order of analyses changes nothing else. The
    # least urgent priority stands for a group: its bound sees the SMs its collectives wait for.
    todo = sorted(((min(g, key=lambda c: c.point.get("knobs.comm_priority") == "high"), g)
                   for g in groups.values() if not g[0].analytic),
                  key=lambda rg: _point_key(rg[0], lambda k: k.startswith("training.")))
    results = _mapped(analyze, [rep for rep, _ in todo], run.pool, run.objective)
    for i, ((rep, group), s) in enumerate(zip(todo, results, strict=True), 1):
        for c in group:
            _analyzed(c, s, run.objective, _same_priority(c, rep))
        run.tell("analysing", i, len(todo))
    return len(todo)


def _same_priority(c: Candidate, analysed: Candidate) -> bool:
    """Whether ``c`` runs its collectives at the priority of the candidate whose analysis it
    shares: the time bound (tune_predictions.dispatch_release_s) holds only at that priority."""
    return all(c.point.get(k) == analysed.point.get(k) for k in ANALYTIC_BLIND)


def _point_key(c: Candidate, keep: Callable[[str], bool]) -> str:
    """The candidate's values of the knobs ``keep`` selects, as a key."""
    return repr(sorted((k, repr(v)) for k, v in c.point.items() if keep(k)))


def _analyzed(c: Candidate, s: dict[str, Any], objective: Objective, same_priority: bool = True) -> None:
    """``s``: the analysis ``c`` takes; ``same_priority``: made at ``c``'s stream priorities
    (else its bound is the one that holds at any priority)."""
    c.analytic, c.estimate = s, objective_value(s, objective)
    c.bound_s = float(s.get("bound_s" if same_priority else "bound_any_priority_s", math.inf))


def _engine(cands: Sequence[Candidate], pool: Any) -> None:
    for c, s in zip(cands, _mapped(summarize, cands, pool, "simulate"), strict=True):
        c.engine = s


def _engine_key(c: Candidate) -> tuple[object, ...] | None:
    """What the engine predicts a candidate from: its workload (:func:`workload_digest`, from its
    analysis), the knobs an analysis does not see, its carve-out (the machine's) and its power
    settings. Candidates with one key have one engine prediction. None: not analysed."""
    digest = c.analytic.get("workload")
    if digest is None:
        return None
    blind = tuple(repr(c.point.get(k)) for k in (*ANALYTIC_BLIND, *POWER_KNOBS))
    return digest, blind, c.scenario.knobs.sm_carveout, repr(c.scenario.power)


def _confirm(cands: Sequence[Candidate], run: _Run, confirm_max: int) -> dict[str, Any]:
    """Predict with the engine, in order of their estimate and ``run.jobs`` at a time, the
    candidates that could still beat the best found (step 3); a candidate whose workload and
    settings another has been predicted with takes that prediction. Returns how many it predicted,
    how many took another's, whether it stopped before the end (``stop``: at ``confirm_max`` or at
    the time budget), and how many that could have won it left."""
    objective, jobs = run.objective, run.jobs
    ranked = sorted((c for c in cands if math.isfinite(c.estimate) and not c.engine), key=lambda c: c.estimate)
    best = min((objective_value(c.engine, objective) for c in cands if c.engine), default=math.inf)
    seen: dict[tuple[object, ...], Candidate] = {}
    for c in cands:
        if c.engine and (key := _engine_key(c)) is not None:
            seen.setdefault(key, c)
    done = shared = 0
    stop = ""
    while True:
        if done >= confirm_max:
            stop = "confirm_max"
            break
        batch: list[Candidate] = []
        keys: set[tuple[object, ...]] = set()
        for c in ranked:
            if c.engine or not c.could_win(best, objective, run.tolerance):
                continue
            key = _engine_key(c)
            if key is not None and key in seen:
                c.engine = dict(seen[key].engine)
                shared += 1
                best = min(best, objective_value(c.engine, objective))
            elif (key is None or key not in keys) and len(batch) < min(jobs, confirm_max - done):
                batch.append(c)
                if key is not None:
                    keys.add(key)
        if not batch:
            break
        # A batch that would end past the deadline (at the given's pace) is not started; the
        # predictions other candidates already had are taken all the same.
        if time.monotonic() + run.engine_s >= run.deadline:
            stop = "budget_s"
            break
        _engine(batch, run.pool)
        for c in batch:
            if (key := _engine_key(c)) is not None:
                seen.setdefault(key, c)
        done += len(batch)
        best = min([best, *(objective_value(c.engine, objective) for c in batch)])
        run.tell("predicting with the engine", done,
                 min(confirm_max, done + _could_win(ranked, best, objective, run.tolerance)))
    left = _could_win(ranked, best, objective, run.tolerance)
    return {"engine_predictions": done, "engine_shared": shared, "stop": stop if left > 0 else "",
            "could_still_win": left}


def _could_win(ranked: Sequence[Candidate], best: float, objective: Objective, tolerance: float) -> int:
    return sum(1 for c in ranked if not c.engine and c.could_win(best, objective, tolerance))


def _trials_due(done: int, trials: int, elapsed_s: float, timeout_s: float | None) -> int:
    """The trials sampling will have run when it stops: all, or under a timeout as many as fit
    at the pace so far (the progress bar's total, so that its time left is the budget's)."""
    if timeout_s is None or done == 0 or elapsed_s <= 0:
        return trials
    return max(done, min(trials, int(done * timeout_s / elapsed_s)))


def _sampled(base: Base, space: Mapping[str, Sequence[Any]], given_point: Mapping[str, Any], run: _Run,
             trials: int, seed: int, timeout_s: float | None
             ) -> tuple[list[Candidate], dict[str, Any], dict[str, Any]]:
    """Up to ``trials`` distinct candidates of a space too large to enumerate (or to analyse within
    the time budget), chosen by Optuna's TPE sampler on the estimate within ``timeout_s``; the
    counts of the combinations it drew that were dropped (as :func:`candidates` counts them); and
    the trials run, the analyses made and whether the timeout stopped it. The first trials are
    the scenario as given (its knob values ``given_point``; a knob's first value where the space
    lacks the given one) and each change of one knob from it, so that a search cut short has
    tried those before it samples. A trial may repeat a combination; combinations that differ
    only in knobs an analysis does not see share one analysis."""
    try:
        import optuna  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        n = math.prod(len(v) for v in space.values())
        raise OvsimError(f"{n:,} combinations, over --max-grid {trials:,}: sampling them needs Optuna (pip install "
                         "-e \".[tune]\"); or raise --max-grid to search them all, or give a smaller --space",
                         field="space") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    keys = list(space)
    seen: dict[tuple[int, ...], Candidate | None] = {}
    analyses: dict[tuple[int, ...], tuple[Candidate, dict[str, Any]]] = {}  # the analysed, its analysis
    blind = run.blind()
    dropped: dict[str, Any] = {"invalid": 0, "redundant": 0, "invalid_example": ""}
    ran: list[tuple[int, ...]] = []

    def value(trial: Any) -> float:
        ix = tuple(trial.suggest_categorical(k, list(range(len(space[k])))) for k in keys)
        if ix not in seen:
            found, lost = _candidates(base, space, [{k: space[k][j] for k, j in zip(keys, ix, strict=True)}])
            dropped["invalid"] += lost["invalid"]
            dropped["redundant"] += lost["redundant"]
            dropped["invalid_example"] = dropped["invalid_example"] or lost["invalid_example"]
            seen[ix] = found[0] if found else None
            if found:
                seeing = tuple(j for k, j in zip(keys, ix, strict=True) if k not in blind)
                if seeing not in analyses:
                    analyses[seeing] = (found[0], analyze(found[0].scenario, run.objective))
                rep, s = analyses[seeing]
                _analyzed(found[0], s, run.objective, _same_priority(found[0], rep))
        ran.append(ix)
        run.tell("sampling", len(ran), _trials_due(len(ran), trials, time.monotonic() - t0, timeout_s))
        c = seen[ix]
        return c.estimate if c is not None else math.inf

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    start = {k: next((j for j, v in enumerate(space[k]) if v == given_point.get(k)), 0) for k in keys}
    study.enqueue_trial(start)
    for k in keys:
        for j in range(len(space[k])):
            if j != start[k]:
                study.enqueue_trial({**start, k: j})
    t0 = time.monotonic()
    study.optimize(value, n_trials=trials, timeout=timeout_s)
    counts = {"trials": len(ran), "analyses": len(analyses), "sampling_stopped": len(ran) < trials}
    return [c for c in seen.values() if c is not None], dropped, counts


# -- the search ------------------------------------------------------------------------------------

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
    run = _Run(objective, tolerance=float(tolerance),
               deadline=started + budget_s if budget_s is not None else math.inf, progress=progress)
    # The candidates' builds share their kernels' prices and collectives' plans (in this process).
    with reusing_builds():
        return _search(scenario, space, run, top=top, workers=workers, confirm_max=confirm_max, max_grid=max_grid,
                       seed=seed, space_source=space_source, scheduler=scheduler, budget_s=budget_s,
                       started=started)


def _search(scenario: str | Path | Scenario, space: Mapping[str, Sequence[Any]] | None, run: _Run, *, top: int,
            workers: int, confirm_max: int, max_grid: int, seed: int, space_source: str, scheduler: str | None,
            budget_s: float | None, started: float) -> TuneResult:
    """:func:`tune`'s steps once its arguments are checked."""
    objective = run.objective
    base = base_mapping(scenario)
    data, path, source = base
    given_sc = scenario if isinstance(scenario, Scenario) else scenario_at(data, path, source)
    if space is not None:
        check_space(base, space, space_source)
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
            cands, dropped, counts = _sampled(base, space, given_point, run, min(max_grid, n_grid), seed,
                                              max(0.0, SAMPLING_SHARE * left_s) if math.isfinite(left_s) else None)
        else:
            cands, dropped = _candidates(base, space)
        given = _given(cands, data, given_sc, space)
        if given_analysis is not None and not given.analytic:
            _analyzed(given, given_analysis, objective)
    run.jobs = min(workers, max(1, len(cands)))
    run.pool = executor(run.jobs, scheduler)
    with run.pool or nullcontext():
        # In process, the candidates' analyses reuse one training iteration's op specs; processes
        # of a pool make their own, and none is held through the engine's predictions.
        t0 = time.monotonic()
        with reusing_training_ops() if run.pool is None else nullcontext():
            n_analytic = counts.pop("analyses") + (given_analysis is not None) + _analyze(cands, run)
        analysis_s = time.monotonic() - t0
        t0 = time.monotonic()
        _engine([given], run.pool)
        run.engine_s = time.monotonic() - t0
        confirmed = _confirm(cands, run, confirm_max)
    confirmed["engine_predictions"] += 1
    stats = {"objective": objective, "tolerance": run.tolerance, "space": {k: list(v) for k, v in space.items()},
             "grid": n_grid,
             "sampled": sampled, **counts, "candidates": len(cands), "given_added": _outside(given.point, space),
             **dropped,
             "unfit": sum(1 for c in cands if c.analytic.get("fits_memory") is False),
             "failed": sum(1 for c in cands if "error" in c.analytic or "error" in c.engine),
             "failed_example": next((f"{_point_text(c.point)}: {c.analytic.get('error') or c.engine['error']}"
                                     for c in cands if "error" in c.analytic or "error" in c.engine), ""),
             "analytic_predictions": n_analytic, **confirmed, "budget_s": budget_s,
             "elapsed_s": time.monotonic() - started,
             # Wall seconds of the analyses (after any sampling) and of the given's engine prediction:
             # together, the least a search that analyses the space and confirms one schedule takes.
             "analysis_s": analysis_s, "given_engine_s": run.engine_s}
    return _result(cands, given, space, objective, top, stats)


def _grid_too_slow(sc: Scenario, space: Mapping[str, Sequence[Any]], run: _Run, n_grid: int,
                   workers: int) -> tuple[bool, dict[str, Any]]:
    """Whether analysing the whole grid, ``workers`` at a time, would take more than
    ``SAMPLING_SHARE`` of the time budget at what the analysis of the scenario as given takes;
    and that analysis."""
    t0 = time.monotonic()
    given = analyze(sc, run.objective)
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
        raise OvsimError(f"no schedule searched fits memory or could be predicted; the scenario as given: "
                         f"{stats['given_problem']}", field="scenario")
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
