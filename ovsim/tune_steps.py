"""Schedule search's steps (:mod:`ovsim.tune`): analysing the candidates, sampling a space too
large to enumerate, and confirming with the engine those that could still win."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ovsim.errors import OvsimError
from ovsim.gcpause import paused_gc
from ovsim.models.training import keep_training_build
from ovsim.tune_candidates import (
    ANALYTIC_BLIND,
    POWER_KNOBS,
    Base,
    Candidate,
    engine_key,
    one_knob_changed,
    point_key,
    same_priority,
    take_analysis,
    validated_candidates,
)
from ovsim.tune_predictions import Objective, analyze, objective_value, summarize

# progress(what, done, total): how far a step of the search has got.
Progress = Callable[[str, int, int], None]


@dataclass
class Run:
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


def mapped(fn: Any, cands: Sequence[Candidate], pool: Any, *args: Any) -> Iterator[dict[str, Any]]:
    """``fn`` of each candidate's scenario, in order, as each comes."""
    scenarios = [c.scenario for c in cands]
    return iter((pool.map if pool is not None else map)(fn, scenarios, *(itertools.repeat(a) for a in args)))


def analyze_all(cands: Sequence[Candidate], run: Run, given: Candidate | None = None) -> int:
    """Analyse the candidates: one of each group that differs only in knobs the analytic fidelity
    does not see (``ANALYTIC_BLIND``) stands for the group; returns the analyses made. With
    ``given`` (the scenario as given; in this process, within ``reusing_training_ops``), its
    training iteration is analysed first and it is predicted by the engine right after
    (:func:`predict_given`), while its build can take that iteration's op specs and ops; and the
    iteration of the candidate the engine will confirm first so far is kept
    (``keep_training_build``) for that prediction's build. A fresh build was 8% of an engine
    prediction over the benchmark."""
    groups = _analysis_groups(cands, run)
    first = _training(given) if given is not None else None
    # Candidates of one training iteration analysed one after another reuse its op specs
    # (reusing_training_ops holds the last); the order of analyses changes nothing else. The
    # least urgent priority stands for a group: its bound sees the SMs its collectives wait for.
    todo = sorted(((min(g, key=lambda c: c.point.get("knobs.comm_priority") == "high"), g)
                   for g in groups if not g[0].analytic),
                  key=lambda rg: (_training(rg[0]) != first, _training(rg[0])))
    # Analyses make no garbage cycles (as a build), while the ops and specs they keep grow: the
    # cyclic collector's passes between them cost 2-6% of a search.
    with paused_gc():
        _analyze_in_order(todo, run, given)
    return len(todo)


def _analyze_in_order(todo: list[tuple[Candidate, list[Candidate]]], run: Run, given: Candidate | None) -> None:
    results = mapped(analyze, [rep for rep, _ in todo], run.pool, run.objective)
    order, leader = confirm_order(run.objective), None
    for i, ((rep, group), s) in enumerate(zip(todo, results, strict=True), 1):
        for c in group:
            take_analysis(c, s, run.objective, same_priority(c, rep))
        run.tell("analysing", i, len(todo))
        if given is None:
            continue
        if any(c is given for c in group):
            predict_given(given, run)
        lead = min((c for c in group if c is not given and math.isfinite(c.estimate)), key=order, default=None)
        if lead is not None and (leader is None or order(lead) < order(leader)):
            leader = lead
            keep_training_build()


def _analysis_groups(cands: Sequence[Candidate], run: Run) -> list[list[Candidate]]:
    """The candidates in groups that differ only in knobs an analysis does not see; a group one of
    which was analysed already (the scenario as given) takes its analysis."""
    blind = run.blind()
    groups: dict[str, list[Candidate]] = {}
    for c in cands:
        groups.setdefault(point_key(c, lambda k: k not in blind), []).append(c)
    for group in groups.values():
        done = next((c for c in group if c.analytic), None)
        if done is not None:
            for c in group:
                take_analysis(c, done.analytic, run.objective, same_priority(c, done))
    return list(groups.values())


def _training(c: Candidate) -> str:
    return point_key(c, lambda k: k.startswith("training."))


def confirm_order(objective: Objective) -> Callable[[Candidate], tuple[float, float]]:
    """The order in which :func:`confirm` predicts candidates: for time by their bound, then
    estimate; else by their estimate."""
    if objective == "time":
        return lambda c: (c.bound_s, c.estimate)
    return lambda c: (c.estimate, 0.0)


def predict_given(given: Candidate, run: Run) -> None:
    """Predict the scenario as given with the engine, ``run.engine_s`` the time that takes."""
    t0 = time.monotonic()
    predict_engine([given], run.pool)
    run.engine_s = time.monotonic() - t0


def predict_engine(cands: Sequence[Candidate], pool: Any) -> None:
    for c, s in zip(cands, mapped(summarize, cands, pool, "simulate"), strict=True):
        c.engine = s


def confirm(cands: Sequence[Candidate], run: Run, confirm_max: int) -> dict[str, Any]:
    """Predict with the engine, ``run.jobs`` at a time, the candidates that could still beat the
    best found (step 3): for time in order of their bound (which sees the SMs kernels wait for,
    where the estimate does not), else of their estimate. A candidate whose workload and settings
    another has been predicted with takes that prediction. Returns how many it predicted, how many
    took another's, whether it stopped before the end (``stop``: at ``confirm_max`` or at the time
    budget), how many that could have won it left and, for time, by how much at most
    (``gap_pct``: the best found over the least bound left, less 1; 0 when none is left)."""
    objective, jobs = run.objective, run.jobs
    ranked = sorted((c for c in cands if math.isfinite(c.estimate) and not c.engine), key=confirm_order(objective))
    best = min((objective_value(c.engine, objective) for c in cands if c.engine), default=math.inf)
    seen: dict[tuple[object, ...], Candidate] = {}
    for c in cands:
        if c.engine and (key := engine_key(c)) is not None:
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
            key = engine_key(c)
            if _took_shared(c, key, seen):
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
        predict_engine(batch, run.pool)
        for c in batch:
            if (key := engine_key(c)) is not None:
                seen.setdefault(key, c)
        done += len(batch)
        best = min([best, *(objective_value(c.engine, objective) for c in batch)])
        run.tell("predicting with the engine", done,
                 min(confirm_max, done + count_could_win(ranked, best, objective, run.tolerance)))
    # Those left that share a prediction made take it before they are counted.
    for c in ranked:
        if not c.engine and _took_shared(c, engine_key(c), seen):
            shared += 1
            best = min(best, objective_value(c.engine, objective))
    left = count_could_win(ranked, best, objective, run.tolerance)
    return {"engine_predictions": done, "engine_shared": shared, "stop": stop if left > 0 else "",
            "could_still_win": left, "gap_pct": gap_pct(ranked, best, objective)}


def _took_shared(c: Candidate, key: tuple[object, ...] | None, seen: dict[tuple[object, ...], Candidate]) -> bool:
    """Whether ``c`` took the engine prediction already made of a candidate with its key
    (:func:`engine_key`)."""
    if key is None or key not in seen:
        return False
    c.engine = dict(seen[key].engine)
    return True


def gap_pct(ranked: Sequence[Candidate], best: float, objective: Objective) -> float:
    """For time, how far above the best schedule in the space ``best`` may be: no candidate of
    ``ranked`` (those with an analysis) the engine has not predicted is faster than its bound (0:
    none is left below ``best``; NaN for energy, which has no bound)."""
    if objective != "time":
        return math.nan
    least = min((c.bound_s for c in ranked if not c.engine), default=math.inf)
    return max(0.0, 100.0 * (best / least - 1.0)) if least > 0 else math.inf


def count_could_win(ranked: Sequence[Candidate], best: float, objective: Objective, tolerance: float) -> int:
    return sum(1 for c in ranked if not c.engine and c.could_win(best, objective, tolerance))


def trials_due(done: int, trials: int, elapsed_s: float, timeout_s: float | None) -> int:
    """The trials sampling will have run when it stops: all, or under a timeout as many as fit
    at the pace so far (the progress bar's total, so that its time left is the budget's)."""
    if timeout_s is None or done == 0 or elapsed_s <= 0:
        return trials
    return max(done, min(trials, int(done * timeout_s / elapsed_s)))


def sample(base: Base, space: Mapping[str, Sequence[Any]], given_point: Mapping[str, Any], run: Run,
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
            found, lost = validated_candidates(base, space, [{k: space[k][j] for k, j in zip(keys, ix, strict=True)}])
            dropped["invalid"] += lost["invalid"]
            dropped["redundant"] += lost["redundant"]
            dropped["invalid_example"] = dropped["invalid_example"] or lost["invalid_example"]
            seen[ix] = found[0] if found else None
            if found:
                seeing = tuple(j for k, j in zip(keys, ix, strict=True) if k not in blind)
                if seeing not in analyses:
                    analyses[seeing] = (found[0], analyze(found[0].scenario, run.objective))
                rep, s = analyses[seeing]
                take_analysis(found[0], s, run.objective, same_priority(found[0], rep))
        ran.append(ix)
        run.tell("sampling", len(ran), trials_due(len(ran), trials, time.monotonic() - t0, timeout_s))
        c = seen[ix]
        return c.estimate if c is not None else math.inf

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    start = {k: next((j for j, v in enumerate(space[k]) if v == given_point.get(k)), 0) for k in keys}
    study.enqueue_trial(start)
    given = {k: space[k][j] for k, j in start.items()}
    for k in keys:
        for j in range(len(space[k])):
            if j != start[k]:
                changed = one_knob_changed(given, k, space[k][j], space)
                study.enqueue_trial({kk: space[kk].index(v) for kk, v in changed.items()})
    t0 = time.monotonic()
    study.optimize(value, n_trials=trials, timeout=timeout_s)
    counts = {"trials": len(ran), "analyses": len(analyses), "sampling_stopped": len(ran) < trials}
    return [c for c in seen.values() if c is not None], dropped, counts
