"""Schedule search's candidates (:mod:`ovsim.tune`): the space's combinations as validated
scenarios, what each carries through the search (its analysis, bound and engine prediction), and
the keys by which candidates share an analysis or an engine prediction."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ovsim.api import build
from ovsim.errors import OvsimError
from ovsim.scenario import Scenario
from ovsim.sweep import base_mapping, edited, scenario_at
from ovsim.tune_predictions import Objective, objective_value

# A knob that matters only while another has one of some values: a combination that sets it
# elsewhere, other than to its off value (_off_value), repeats another candidate and is not searched.
CONDITIONS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "training.parallel.tp_chunks": ("training.parallel.tp_overlap", ("chunked", "copy_engine")),
    "knobs.comm_priority": ("schedule", ("overlapped",)),
    "training.parallel.bucket_bytes": ("training.parallel.overlap_grad_reduce", (True,)),
    "training.parallel.overlap_param_gather": ("training.parallel.distributed_optimizer", (True,)),
}
# Where a conditional knob's scenario value is not legal without its condition, the value it takes
# there (the scenario's overlapped gathers make no scenario without the distributed optimizer). A
# combination that sets it otherwise there is counted as redundant: it cannot run, and the one
# with this value stands for it.
OFF_VALUES: dict[str, Any] = {"training.parallel.overlap_param_gather": False}
# Knobs the analytic fidelity does not see (it shares no resource, so stream priority changes
# nothing): candidates that differ only in them share one analysis.
ANALYTIC_BLIND = ("knobs.comm_priority",)
# The power settings, which a time search's analytic prediction leaves out (analyze).
POWER_KNOBS = ("power.cap_w", "power.sm_clock_hz")
# Energy objectives: a candidate whose estimate is this much above the best found is not confirmed.
ESTIMATE_MARGIN = 0.05


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


def _off_value(knob: str, space: Mapping[str, Sequence[Any]]) -> Any:
    """The value a conditional knob takes where its condition fails: :data:`OFF_VALUES`'s, else
    the space's first (the scenario's own)."""
    return OFF_VALUES.get(knob, space[knob][0])


def _redundant(point: Mapping[str, Any], space: Mapping[str, Sequence[Any]]) -> bool:
    return any(knob in point and point[knob] != _off_value(knob, space)
               and point.get(on, values[0]) not in values
               for knob, (on, values) in CONDITIONS.items())


def one_knob_changed(point: Mapping[str, Any], knob: str, value: Any, space: Mapping[str, Sequence[Any]]
                     ) -> dict[str, Any]:
    """``point`` with ``knob`` set to ``value``, and what the change means for the knobs that count
    only under another's values (:data:`CONDITIONS`): a change that turns such a knob on also
    sets its condition to the first of the space's values under which it counts (overlapped
    gathers take the distributed optimizer with them), and a change of the condition that leaves
    it out sets it to its off value (without the distributed optimizer, no overlapped gathers).
    A search's first trials are these changes, so that none of them is a combination dropped as
    redundant."""
    out = {**point, knob: value}
    for k, (on, values) in CONDITIONS.items():
        if k not in out or on not in out or out[on] in values:
            continue
        off = _off_value(k, space)
        if out[k] == off:
            continue
        if k == knob:
            out[on] = next((v for v in space[on] if v in values), out[on])
        elif off in space[k]:
            out[k] = off
    return out


# A scenario's mapping as read, its file (None: given in Python) and its name for messages
# (sweep.base_mapping): read once per search, not once per candidate.
Base = tuple[dict[str, Any], Path | None, str]


def candidates(scenario: Scenario | str | Path, space: Mapping[str, Sequence[Any]],
               points: Sequence[dict[str, Any]] | None = None) -> tuple[list[Candidate], dict[str, Any]]:
    """The space's combinations (or ``points``) as validated candidates, and the counts of those
    dropped: ``invalid`` (the scenario does not validate; ``invalid_example`` says why for one) and
    ``redundant`` (a knob set where it does not matter)."""
    return validated_candidates(base_mapping(scenario), space, points)


def validated_candidates(base: Base, space: Mapping[str, Sequence[Any]],
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
            dropped["invalid_example"] = dropped["invalid_example"] or f"{point_text(point)}: {_message(e)}"
    return out, dropped


def _message(e: Exception) -> str:
    return e.one_line() if isinstance(e, OvsimError) else str(e)


def point_text(point: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in point.items())


def check_space(base: Base, space: Mapping[str, Sequence[Any]], source: str, builds: bool = True) -> None:
    """Refuse a space a user wrote with a knob path the scenario has no place for, or a value that
    is illegal on its own (the scenario as given with only that knob changed does not validate or,
    with ``builds``, does not build): a one-line error naming the space's file and the knob. Values
    legal alone but not together are dropped from the search and counted."""
    data, path, name = base
    for knob, values in space.items():
        for value in values:
            try:
                sc = scenario_at(edited(data, {knob: value}), path, name)
                if builds:
                    build(sc, name)
            except (OvsimError, ValueError) as e:
                reason = e.message if isinstance(e, OvsimError) else str(e)
                raise OvsimError(f"{value!r}: {reason}", source=source, field=knob) from None


def same_priority(c: Candidate, analysed: Candidate) -> bool:
    """Whether ``c`` runs its collectives at the priority of the candidate whose analysis it
    shares: the time bound (tune_predictions.dispatch_release_s) holds only at that priority."""
    return all(c.point.get(k) == analysed.point.get(k) for k in ANALYTIC_BLIND)


def point_key(c: Candidate, keep: Callable[[str], bool]) -> str:
    """The candidate's values of the knobs ``keep`` selects, as a key."""
    return repr(sorted((k, repr(v)) for k, v in c.point.items() if keep(k)))


def take_analysis(c: Candidate, s: dict[str, Any], objective: Objective, same_priority: bool = True) -> None:
    """``s``: the analysis ``c`` takes; ``same_priority``: made at ``c``'s stream priorities
    (else its bound is the one that holds at any priority)."""
    c.analytic, c.estimate = s, objective_value(s, objective)
    c.bound_s = float(s.get("bound_s" if same_priority else "bound_any_priority_s", math.inf))


def engine_key(c: Candidate) -> tuple[object, ...] | None:
    """What the engine predicts a candidate from: its workload (:func:`workload_digest`, from its
    analysis), the knobs an analysis does not see, its carve-out (the machine's) and its power
    settings. Candidates with one key have one engine prediction. None: not analysed."""
    digest = c.analytic.get("workload")
    if digest is None:
        return None
    blind = tuple(repr(c.point.get(k)) for k in (*ANALYTIC_BLIND, *POWER_KNOBS))
    return digest, blind, c.scenario.knobs.sm_carveout, repr(c.scenario.power)
