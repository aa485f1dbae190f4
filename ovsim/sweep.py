"""Parameter sweeps: one scenario, axes of values, every combination predicted.

    sweep("examples/training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml",
          {"training.micro_batch_size": [1, 2, 4], "power.cap_w": [None, 250, 150]})

gives a DataFrame with one row per combination (the first axis varies slowest): the axes' values,
then :meth:`ovsim.api.Result.summary` of that prediction (makespan, compute slowdown, exposed
communication, power, energy, ...).

An axis is a path into the scenario's mapping as its YAML file spells it: keys joined by dots, a
list item by its index (``ops.0.m``) or, in a list of named items such as ``ops``, by its name
(``ops.gemm.m``). A mapping on the way that the file leaves out is created (``power.cap_w`` on a
scenario without a ``power`` section). Every combination is validated before any is predicted; a
bad one names the scenario, the axis and the value.

Predictions are independent, so ``workers`` > 1 runs them in that many processes; the result is
the same, row for row, as with one.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from ovsim.api import predict
from ovsim.errors import OvsimError
from ovsim.hw.spec import read_yaml
from ovsim.limits import MAX_COMBINATIONS
from ovsim.models.build_memo import reusing_builds
from ovsim.models.training import reusing_training_ops
from ovsim.scenario import Mode, Scenario, check_mode, scenario_error, scenario_from_mapping
from ovsim.sweep_journal import MANIFEST, Journal, fingerprint, kept_summaries, read_manifest
from ovsim.workers import executor

Progress = Callable[[int, int], None]


def _set(data: Any, path: str, value: Any) -> Any:
    """A copy of ``data`` with ``path`` set to ``value`` (the input is not changed)."""
    head, _, rest = path.partition(".")
    if isinstance(data, list):
        index = _index(data, head, path)
        out = list(data)
        out[index] = _set(out[index], rest, value) if rest else value
        return out
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"'{head}' is inside a {type(data).__name__}, not a mapping or a list")
    if not head:
        raise ValueError("an empty key")
    out_map = dict(data)
    out_map[head] = _set(out_map.get(head), rest, value) if rest else value
    return out_map


def _index(items: list[Any], key: str, path: str) -> int:
    if key.lstrip("-").isdigit():
        i = int(key)
        if not 0 <= i < len(items):
            raise ValueError(f"no item {i} in a list of {len(items)}")
        return i
    names = [it.get("name") for it in items if isinstance(it, dict)]
    if key not in names:
        known = ", ".join(str(n) for n in names if n is not None) or "none"
        raise ValueError(f"no item named '{key}' (named: {known})")
    return names.index(key)


def base_mapping(scenario: str | Path | Scenario) -> tuple[dict[str, Any], Path | None, str]:
    if isinstance(scenario, Scenario):
        return scenario.model_dump(mode="json", by_alias=True, exclude_unset=True), None, scenario.name
    path = Path(scenario)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise OvsimError("expected a mapping at the top level", source=str(path))
    return data, path, str(path)


def _check_axes(axes: Mapping[str, Sequence[Any]], source: str) -> None:
    if not axes:
        raise OvsimError("no axes to sweep", source=source, field="axes")
    for name, values in axes.items():
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or len(values) == 0:
            raise OvsimError("expected a non-empty list of values", source=source, field=name)


def points(scenario: str | Path | Scenario, axes: Mapping[str, Sequence[Any]]) -> list[tuple[dict[str, Any], Scenario]]:
    """Every combination of the axes' values (the first axis slowest) and its validated scenario."""
    data, path, source = base_mapping(scenario)
    _check_axes(axes, source)
    knob = _training_knob_without_model(data, axes)
    if knob is not None:
        raise OvsimError(_NO_TRAINING.format(knob), source=source, field=knob)
    out = []
    for combo in itertools.product(*axes.values()):
        point = dict(zip(axes, combo, strict=True))
        edited: Any = data
        for name, value in point.items():
            try:
                edited = _set(edited, name, value)
            except ValueError as e:
                raise OvsimError(str(e), source=source, field=name) from None
        try:
            sc = scenario_at(edited, path, source)
        except OvsimError as e:
            raise _of_point(e, point, source) from None
        out.append((point, sc))
    return out


def scenario_at(data: dict[str, Any], path: Path | None, source: str) -> Scenario:
    """The validated scenario of an edited mapping; ``path``: the file it came from (its relative
    calibration paths are relative to it), None for one given in Python."""
    try:
        return scenario_from_mapping(data, path) if path is not None else Scenario.model_validate(data)
    except ValidationError as e:
        raise scenario_error(e, source, data) from None


_NO_TRAINING = "the scenario has no training iteration (no 'training' section) for '{}' to set"


def _training_knob_without_model(data: Mapping[str, Any], names: Iterable[str]) -> str | None:
    """The first of ``names`` that sets a training knob where ``data`` has no training section and
    none of ``names`` gives it a model (the section it would make could not be read), else None."""
    names = list(names)
    if data.get("training") is not None or "training.model" in names:
        return None
    return next((k for k in names if k.split(".")[0] == "training"), None)


def edited(data: dict[str, Any], point: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with every path of ``point`` set to its value (raises ValueError). A training
    knob on a scenario without a training iteration is refused: the section it would make has
    no model."""
    knob = _training_knob_without_model(data, point)
    if knob is not None:
        raise ValueError(_NO_TRAINING.format(knob))
    out: Any = data
    for name, value in point.items():
        out = _set(out, name, value)
    return dict(out)


def _of_point(e: OvsimError, point: Mapping[str, Any], source: str) -> OvsimError:
    """``e`` said of the combination that raised it: the combination is the field, the error's own
    file (when another than the scenario: a calibration file it names) and field lead its message."""
    where = ", ".join(f"{k}={v!r}" for k, v in point.items())
    own = e.source if e.source != source else ""
    return OvsimError(": ".join(p for p in (own, e.field, e.message) if p), source=source, field=where)


def _predict_summary(sc: Scenario, mode: Mode | None, max_ops: int | None) -> dict[str, Any]:
    return predict(sc, mode=mode, counters=False, max_ops=max_ops).summary()


def sweep(scenario: str | Path | Scenario, axes: Mapping[str, Sequence[Any]], *, mode: Mode | None = None,
          workers: int = 1, progress: Progress | None = None, max_ops: int | None = None,
          max_combinations: int = MAX_COMBINATIONS, scheduler: str | None = None,
          results: str | Path | None = None) -> pd.DataFrame:
    """Predict every combination of ``axes`` on ``scenario``; one row each, the axes first.

    ``workers``: processes to run predictions in (1: this process; 0: one per CPU core);
    ``scheduler``: a Dask scheduler's address, to run them on its cluster instead
    (:func:`ovsim.workers.executor`; also ``OVSIM_SCHEDULER``).
    ``progress(done, total)`` is called as predictions finish. ``max_ops``: the most ops one
    combination may expand to (:func:`ovsim.api.predict`); ``max_combinations``: the most
    combinations run, checked before any is built. ``results``: a folder that keeps each result as
    it finishes (:mod:`ovsim.sweep_journal`); run again with it, the sweep predicts only what is
    not there yet, and the table's ``attrs["results_kept"]`` says how many it read back."""
    if workers < 0:
        raise OvsimError(f"must be 0 (one per core) or more, got {workers}", field="workers")
    check_mode(mode)
    source = scenario.name if isinstance(scenario, Scenario) else str(scenario)
    _check_axes(axes, source)
    n = math.prod(len(v) for v in axes.values())
    if n > max_combinations:
        raise OvsimError(f"{n:,} combinations, over the limit of {max_combinations:,}; to run them anyway, pass "
                         f"--max-combinations {n} (Python: max_combinations={n})", field="axes")
    grid = points(scenario, axes)
    n = len(grid)
    journal = _journal(results, scenario, axes, mode, max_ops, grid) if results is not None else None
    summaries: dict[int, dict[str, Any]] = journal.done() if journal is not None else {}
    kept = len(summaries)
    todo = [i for i in range(n) if i not in summaries]
    if progress is not None and summaries:
        progress(len(summaries), n)
    jobs = workers or os.cpu_count() or 1
    pool = executor(min(jobs, len(todo)), scheduler) if todo else None
    # In process, points that differ only in knobs build one training iteration's op specs once,
    # and share their kernels' prices and collectives' plans.
    with pool or reusing_training_ops(), reusing_builds():
        # The pool's map starts every prediction at once; the built-in one predicts each as it is
        # asked for. Either gives results in the grid's order.
        found = (pool.map if pool is not None else map)(_predict_summary, [grid[i][1] for i in todo],
                                                        itertools.repeat(mode), itertools.repeat(max_ops))
        try:
            for i in todo:
                try:
                    summaries[i] = next(found)
                except OvsimError as e:
                    raise _of_point(e, grid[i][0], source) from None
                if journal is not None:
                    journal.add(i, summaries[i])
                if progress is not None:
                    progress(len(summaries), n)
        except BaseException:
            # A failed combination or Ctrl-C: the queued predictions are not run; what finished is kept.
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            if journal is not None:
                with contextlib.suppress(OvsimError):
                    journal.flush()
            raise
    if journal is not None:
        journal.flush()
    out = _table(axes, [p for p, _ in grid], [summaries[i] for i in range(n)])
    if journal is not None:
        out.attrs["results_kept"] = kept  # read back from the folder, not predicted this time
    return out


def _table(axes: Iterable[str], combos: Sequence[Mapping[str, Any]], summaries: Sequence[Mapping[str, Any]]
           ) -> pd.DataFrame:
    """One row a combination: its axes' values, then its summary."""
    names = list(axes)
    df = pd.DataFrame(list(summaries))
    # The axes as given: a None stays None (no power cap), not a NaN in a float column.
    axis_columns = pd.DataFrame({a: pd.Series([c[a] for c in combos], dtype=object) for a in names})
    return pd.concat([axis_columns, df.drop(columns=[a for a in names if a in df.columns])], axis=1)


def read_results(results: str | Path) -> pd.DataFrame:
    """The table of the sweep whose results folder is ``results`` (``sweep(..., results=)``,
    ``ovsim sweep --results``), read from the folder alone: one row a combination it holds, in the
    grid's order, as :func:`sweep` gives it. A sweep stopped part-way gives the rows it finished;
    ``attrs["points"]`` is the sweep's combination count."""
    folder = Path(results)
    held = read_manifest(folder)
    axes = held.get("axes")
    if not (isinstance(axes, list) and all(isinstance(a, list) and len(a) == 2 and isinstance(a[0], str)
                                           and isinstance(a[1], list) for a in axes)):
        raise OvsimError("names no axes (a folder of an older ovsim): run the same sweep again with it to read it "
                         "back", source=str(folder / MANIFEST), field="axes")
    n = held["points"]
    grid = [dict(zip([a for a, _ in axes], combo, strict=True)) for combo in itertools.product(*(v for _, v in axes))]
    if len(grid) != n:
        raise OvsimError(f"its axes make {len(grid)} combinations, not its {n} points", source=str(folder / MANIFEST),
                         field="axes")
    summaries = kept_summaries(folder, n)
    done = sorted(summaries)
    out = _table([a for a, _ in axes], [grid[i] for i in done], [summaries[i] for i in done])
    out.attrs["points"] = n
    return out


def _journal(results: str | Path, scenario: str | Path | Scenario, axes: Mapping[str, Sequence[Any]],
             mode: Mode | None, max_ops: int | None, grid: list[tuple[dict[str, Any], Scenario]]) -> Journal:
    """The results folder of this sweep, a part written every hundredth of it (1-256 results)."""
    from ovsim.api import _resolve_system
    from ovsim.hw.calib import load_calibration

    base, _, source = base_mapping(scenario)
    resolved: dict[str, str] = {}
    for _, sc in grid:
        # What each combination is priced with, resolved once per system and calibration files.
        key = repr((sc.system, sc.nodes, sc.calibration))
        if key not in resolved:
            try:
                system, gpu, stem = _resolve_system(sc, source)
                params = load_calibration(gpu, stem, tuple(sc.calibration)).params
            except OvsimError:
                resolved[key] = key  # the prediction will say what is wrong
                continue
            resolved[key] = "\n".join(x.model_dump_json() for x in (system, gpu, params))
    return Journal(results, fingerprint(base, axes, mode, max_ops, list(resolved.values())), len(grid),
                   batch=min(256, max(1, len(grid) // 100)), axes=axes)
