"""The calibration harness's kernels beside communication, replayed: the contention model held out."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovsim.hw.calib import shipped_parameters
from ovsim.workers import worker_pool

if TYPE_CHECKING:

    from ovsim.calibrate import ContentionData, TraceInput


from ovsim.validate.check import Check
from ovsim.validate.datasets import data_root, experiment_inputs, part_file, sets
from ovsim.validate.traces import held_out_bar

# The calibration harness's measured data sets (calibration/data/ in a checkout, or OVSIM_DATA).
MEASURED_DATA = data_root()
# Data sets whose overlap part the contention checks replay, and their GPU spec: the first is
# folded (leave one victim kernel out), the others predicted from a fit on it (the registry,
# calibration/data/registry.yaml, says what each holds).
MEASURED_OVERLAP = sets("overlap", "set", "gpu")
MEASURED = "measured kernels beside communication (calibration harness; held out)"
# The harness's channel kernels hold every block's SM for the whole kernel (its per-block records).
HARNESS_SM_FRACTION = 1.0


def _victim(label: str) -> str:
    """The kernel an overlap experiment measured (its label is ``<victim>__<channels>__...``)."""
    return label.split("__", 1)[0]


def scored(tr: TraceInput, overrides: dict[str, Any] | None) -> tuple[list[float], list[float], list[float]]:
    """(measured, predicted, isolated) durations of a trace's scored kernels, replayed with ``overrides``."""
    from ovsim.replay import replay

    k = replay(tr.bundle, gpu=tr.gpu, counters=False, overrides=overrides).kernels
    sel = k["overlapped"] & (k["isolated_source"] == "signature")
    return (k.loc[sel, "measured_duration_s"].tolist(), k.loc[sel, "predicted_duration_s"].tolist(),
            k.loc[sel, "isolated_s"].tolist())


def _fitted(inputs: Sequence[TraceInput], prepared: Sequence[ContentionData], leave_out: str | None) -> dict[str, Any]:
    """Contention parameters fitted on the ``inputs`` of every victim kernel but ``leave_out``."""
    from ovsim.calibrate import fit_contention

    keep = [i for i, tr in enumerate(inputs) if _victim(tr.label) != leave_out]
    params = shipped_parameters(inputs[0].gpu)
    # The harness's records show every channel block resident for its whole kernel, as NCCL's are.
    overrides, _ = fit_contention([inputs[i] for i in keep], params, [prepared[i] for i in keep],
                                  sm_fraction=HARNESS_SM_FRACTION)
    return overrides


def pooled(targets: Sequence[TraceInput], overrides: dict[str, Any]) -> list[list[float]]:
    """(measured, predicted, isolated) durations of the scored kernels of every trace in ``targets``."""
    out: list[list[float]] = [[], [], []]
    for tr in targets:
        for acc, xs in zip(out, scored(tr, overrides), strict=True):
            acc.extend(xs)
    return out


def _measured_fold(victim: str, inputs: Sequence[TraceInput], prepared: Sequence[ContentionData]
                   ) -> list[list[float]]:
    """``victim``'s experiments replayed with contention fitted on every other victim's."""
    return pooled([tr for tr in inputs if _victim(tr.label) == victim], _fitted(inputs, prepared, victim))


def replay_row(pooled: Sequence[Sequence[float]]) -> tuple[int, float, float, float] | None:
    """(kernels, ovsim MAPE, naive MAPE, bar) of pooled (measured, predicted, isolated) durations
    of a held-out replay row (:func:`held_out_bar`); None without kernels."""
    import numpy as np

    from ovsim.replay_score import mape_pct

    meas, pred, iso = (np.asarray(x, dtype=float) for x in pooled)
    if not len(meas):
        return None
    naive = mape_pct(iso, meas)
    return len(meas), mape_pct(pred, meas), naive, held_out_bar(naive)


def measured_checks(folder: Path = MEASURED_DATA, workers: int = 1,
                    on_stage: Callable[[str], None] | None = None) -> list[Check]:
    """The harness's kernels measured beside communication-like kernels, predicted with contention
    parameters fitted on other measurements.

    On the first data set of ``MEASURED_OVERLAP``, leave one victim kernel out: the contention
    parameters are fitted (``ovsim calibrate``'s fit) on the experiments of every other victim, and
    the victim's experiments are replayed with them. On each further data set (another GPU), the
    fit is on all of the first data set's experiments, which never saw that GPU. Each row pools a
    victim's overlapped instances: its MAPE passes at 10% or less and at most a third of the naive
    MAPE (the held-out targets of ``trace_checks``).
    """
    from ovsim.calibrate import contention_data

    sets = [(gpu, rel) for rel, gpu in MEASURED_OVERLAP if part_file(folder / rel, "overlap").exists()]
    if not sets:
        return []
    inputs = [experiment_inputs(folder / rel, "overlap", gpu) for gpu, rel in sets]
    base = inputs[0]
    victims = sorted({_victim(tr.label) for tr in base})
    jobs = min(workers, len(victims))
    pool = worker_pool(jobs)
    rows: list[tuple[tuple[str, str], str, list[list[float]], str]] = []
    with pool or nullcontext():
        run = pool.map if pool is not None else map
        if on_stage is not None:
            on_stage(f"replaying {len(base)} harness experiments without contention")
        prepared = list(run(contention_data, base))
        if on_stage is not None:
            on_stage(f"{len(victims)} folds, one victim kernel left out of each")
        folds = run(_measured_fold, victims, itertools.repeat(base), itertools.repeat(prepared))
        rows += [(sets[0], v, pool_v, f"fitted on {len(victims) - 1} other victim kernels' experiments, not this one's")
                 for v, pool_v in zip(victims, folds, strict=True)]
        if len(sets) > 1:
            every = _fitted(base, prepared, None)
            for s, trs in zip(sets[1:], inputs[1:], strict=True):
                names = sorted({_victim(tr.label) for tr in trs})
                pools = run(pooled, [[tr for tr in trs if _victim(tr.label) == v] for v in names],
                             itertools.repeat(every))
                rows += [(s, v, x, f"fitted on every experiment of calibration/data/{sets[0][1]}")
                         for v, x in zip(names, pools, strict=True)]
    checks: list[Check] = []
    for (gpu, rel), victim, series, note in rows:
        row = replay_row(series)
        if row is None:
            continue
        n, mape, naive, bar = row
        label = f"{gpu} {rel.rsplit('/', 1)[-1]}"
        checks.append(Check(f"{label}: {victim} ({n} kernels)", MEASURED, bar, mape, "% MAPE", 0.0,
                            f"calibration/data/{rel}", rule="at_most", note=f"naive {naive:.1f}%; {note}"))
    return checks
