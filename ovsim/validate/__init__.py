"""The validation suite behind ``ovsim validate``: published figures reproduced, and replays of real
traces, each with its reference, ovsim's value, the error and a pass/fail against a stated tolerance.

The shipped contention parameters were fitted on the shared traces (``calibration/contention/``),
so a replay with the shipped calibration is a fit and is labelled so; the held-out figure for each
trace refits them on every other trace first (leave one trace out). A fit error is never reported
as a prediction error.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ovsim.errors import OvsimError
from ovsim.validate.check import GB, GIB, Check
from ovsim.validate.echo import echo_checks
from ovsim.validate.framework import copy_checks, framework_checks
from ovsim.validate.measured import (
    HARNESS_SM_FRACTION,
    MEASURED,
    MEASURED_DATA,
    MEASURED_OVERLAP,
    measured_checks,
    pooled,
    replay_row,
    scored,
)
from ovsim.validate.measured_gemm import (
    GEMM_AT_TOP_CLOCK,
    MEASURED_GEMM,
    MEASURED_GEMM_GROUP,
    MEASURED_GEMM_PRECISIONS,
    MEASURED_SHAPES,
    MEASURED_SHAPES_GROUP,
    SHAPE_EXPERIMENTS,
    measured_gemm_checks,
    measured_gemm_points,
    measured_shape_checks,
    measured_shape_points,
)
from ovsim.validate.measured_layers import MEASURED_LAYERS, MEASURED_LAYERS_GROUP, measured_layer_checks
from ovsim.validate.measured_memory import (
    COPY_ASSUMED_EFFICIENCY,
    COPY_DIRECTIONS,
    HARNESS_CHANNEL_HBM_PER_BYTE,
    HARNESS_CHANNEL_PASS_BYTES,
    HARNESS_MEMORY_VICTIM_BYTES,
    HARNESS_MEMORY_VICTIM_KIND,
    HBM_TOLERANCE_PCT,
    MEASURED_COPY,
    MEASURED_COPY_GROUP,
    MEASURED_HBM,
    MEASURED_HBM_FIT,
    MEASURED_HBM_HELD_OUT,
    channel_pass_s,
    copy_scenario_s,
    harness_experiments,
    harness_power_log,
    hbm_sharing_points,
    hbm_sharing_scenario,
    measured_copy_checks,
    measured_copy_times,
    measured_hbm_checks,
)
from ovsim.validate.measured_own_power import (
    MEASURED_OWN_HELD,
    MEASURED_OWN_HELD_FIT,
    MEASURED_OWN_HELD_GROUP,
    MEASURED_OWN_POWER,
    MEASURED_OWN_POWER_HELD_OUT,
    MEASURED_OWN_TILES,
    MEASURED_OWN_TILES_ALONE,
    MEASURED_OWN_TILES_FIT,
    measured_own_power_checks,
)
from ovsim.validate.measured_power import (
    CLOCK_MEMORY_KINDS,
    CLOCK_STEADY_HZ,
    MEASURED_CLOCK,
    MEASURED_CLOCK_FIT,
    MEASURED_CLOCK_MIX,
    MEASURED_CLOCK_SHARE_FIT,
    MEASURED_CLOCK_SHARE_HELD_OUT,
    MEASURED_CLOCK_SHARE_MIX,
    MEASURED_CLOCK_SHARE_MIX_HELD_OUT,
    MEASURED_CLOCK_SHARES,
    MEASURED_POWER,
    MEASURED_POWER_FIT,
    MEASURED_POWER_HELD_OUT,
    clock_end_ratio,
    clock_memory_points,
    measured_clock_checks,
    measured_clock_mix_checks,
    measured_clock_share_checks,
    measured_power_checks,
)
from ovsim.validate.measured_sm import (
    MEASURED_DISPATCH,
    MEASURED_DISPATCH_GROUP,
    MEASURED_SMLOSS,
    MEASURED_SMLOSS_FIT_GROUP,
    MEASURED_SMLOSS_GROUP,
    SMLOSS_LOAD_FIT,
    measured_dispatch_checks,
    measured_smloss_checks,
    smloss_bundle,
    smloss_scored,
)
from ovsim.validate.network import network_checks
from ovsim.validate.node import node_checks
from ovsim.validate.published import (
    CONSISTENCY,
    FIT,
    HELD_OUT,
    POWER_CONSISTENCY,
    POWER_PREDICTED,
    PREDICTED,
    best_gemm_tflops,
    power_checks,
    published_checks,
)
from ovsim.validate.shaping import shaping_checks
from ovsim.validate.study import STUDY, study_checks
from ovsim.validate.traces import (
    GEMM_CASES,
    MAMF_EFFICIENCY,
    MEMORY_CASES,
    MEMORY_TOLERANCE_PCT,
    SCENARIO_GEMM,
    TRACE_CASES,
    gemm_checks,
    held_out_bar,
    memory_checks,
    trace_checks,
)
from ovsim.validate.training import training_checks

__all__ = [
    "CLOCK_MEMORY_KINDS",
    "CLOCK_STEADY_HZ",
    "CONSISTENCY",
    "COPY_ASSUMED_EFFICIENCY",
    "COPY_DIRECTIONS",
    "FIT",
    "GB",
    "GEMM_AT_TOP_CLOCK",
    "GEMM_CASES",
    "GIB",
    "HARNESS_CHANNEL_HBM_PER_BYTE",
    "HARNESS_CHANNEL_PASS_BYTES",
    "HARNESS_MEMORY_VICTIM_BYTES",
    "HARNESS_MEMORY_VICTIM_KIND",
    "HARNESS_SM_FRACTION",
    "HBM_TOLERANCE_PCT",
    "HELD_OUT",
    "MAMF_EFFICIENCY",
    "MEASURED",
    "MEASURED_CLOCK",
    "MEASURED_CLOCK_FIT",
    "MEASURED_CLOCK_MIX",
    "MEASURED_CLOCK_SHARES",
    "MEASURED_CLOCK_SHARE_FIT",
    "MEASURED_CLOCK_SHARE_HELD_OUT",
    "MEASURED_CLOCK_SHARE_MIX",
    "MEASURED_CLOCK_SHARE_MIX_HELD_OUT",
    "MEASURED_COPY",
    "MEASURED_COPY_GROUP",
    "MEASURED_DATA",
    "MEASURED_DISPATCH",
    "MEASURED_DISPATCH_GROUP",
    "MEASURED_GEMM",
    "MEASURED_GEMM_GROUP",
    "MEASURED_GEMM_PRECISIONS",
    "MEASURED_HBM",
    "MEASURED_HBM_FIT",
    "MEASURED_HBM_HELD_OUT",
    "MEASURED_LAYERS",
    "MEASURED_LAYERS_GROUP",
    "MEASURED_OVERLAP",
    "MEASURED_OWN_HELD",
    "MEASURED_OWN_HELD_FIT",
    "MEASURED_OWN_HELD_GROUP",
    "MEASURED_OWN_POWER",
    "MEASURED_OWN_POWER_HELD_OUT",
    "MEASURED_OWN_TILES",
    "MEASURED_OWN_TILES_ALONE",
    "MEASURED_OWN_TILES_FIT",
    "MEASURED_POWER",
    "MEASURED_POWER_FIT",
    "MEASURED_POWER_HELD_OUT",
    "MEASURED_SHAPES",
    "MEASURED_SHAPES_GROUP",
    "MEASURED_SMLOSS",
    "MEASURED_SMLOSS_FIT_GROUP",
    "MEASURED_SMLOSS_GROUP",
    "MEMORY_CASES",
    "MEMORY_TOLERANCE_PCT",
    "POWER_CONSISTENCY",
    "POWER_PREDICTED",
    "PREDICTED",
    "SCENARIO_GEMM",
    "SHAPE_EXPERIMENTS",
    "SMLOSS_LOAD_FIT",
    "STUDY",
    "TRACE_CASES",
    "Check",
    "best_gemm_tflops",
    "channel_pass_s",
    "clock_end_ratio",
    "clock_memory_points",
    "copy_scenario_s",
    "gemm_checks",
    "harness_experiments",
    "harness_power_log",
    "hbm_sharing_points",
    "hbm_sharing_scenario",
    "held_out_bar",
    "measured_checks",
    "measured_clock_checks",
    "measured_clock_mix_checks",
    "measured_clock_share_checks",
    "measured_copy_checks",
    "measured_copy_times",
    "measured_dispatch_checks",
    "measured_gemm_checks",
    "measured_gemm_points",
    "measured_hbm_checks",
    "measured_layer_checks",
    "measured_own_power_checks",
    "measured_power_checks",
    "measured_shape_checks",
    "measured_shape_points",
    "measured_smloss_checks",
    "memory_checks",
    "pooled",
    "power_checks",
    "published_checks",
    "replay_row",
    "run",
    "scored",
    "smloss_bundle",
    "smloss_scored",
    "study_checks",
    "trace_checks",
]


def run(traces: Path | None, on_trace: Callable[[str], None] | None = None, workers: int = 1,
        studies: bool = False, measured: bool = False) -> list[Check]:
    """Every check: published figures and power, with ``studies`` the overlap studies' figures, with
    ``measured`` the calibration harness's kernels beside communication (:func:`measured_checks`),
    and with ``traces`` the shared traces replayed (their folds, the measured folds and the studies'
    configurations in ``workers`` processes when more than 1; 0: one per CPU core)."""
    if workers < 0:
        raise OvsimError(f"must be 0 (one per core) or more, got {workers}", field="workers")
    workers = workers or os.cpu_count() or 1
    if traces is not None:
        known = [rel for rel, _ in TRACE_CASES] + [rel for rels in MEMORY_CASES.values() for rel in rels]
        if not any((traces / rel).exists() for rel in known):
            # A wrong folder would otherwise pass with the trace checks silently left out.
            raise OvsimError(f"none of the {len(set(known))} shared traces is in this folder (looked for e.g. "
                             f"{known[-1]})", source=str(traces), field="traces")
    if measured:
        # Refused before any work: a missing data folder would leave the measured checks out.
        from ovsim.validate.datasets import require

        root = require()
        if root != MEASURED_DATA:
            # The families' data sets were read from the registry when this module was imported.
            raise OvsimError(f"OVSIM_DATA points at {root}, but the measured checks were set up from "
                             f"{MEASURED_DATA}: set it before importing ovsim.validate", field="--measured")
    checks = published_checks() + node_checks() + network_checks() + training_checks() + power_checks()
    if studies:
        checks += study_checks(workers, on_trace)
    if measured:
        checks += (measured_checks(MEASURED_DATA, workers, on_trace) + measured_power_checks(MEASURED_DATA)
                   + measured_clock_checks(MEASURED_DATA) + measured_clock_share_checks(MEASURED_DATA)
                   + measured_clock_mix_checks(MEASURED_DATA) + measured_own_power_checks(MEASURED_DATA)
                   + measured_layer_checks(MEASURED_DATA)
                   + measured_gemm_checks(MEASURED_DATA) + measured_shape_checks(MEASURED_DATA)
                   + measured_copy_checks(MEASURED_DATA) + measured_dispatch_checks(MEASURED_DATA)
                   + measured_hbm_checks(MEASURED_DATA) + measured_smloss_checks(MEASURED_DATA, workers)
                   + shaping_checks(MEASURED_DATA)
                   + framework_checks(MEASURED_DATA, workers, on_trace) + copy_checks(MEASURED_DATA))
    if traces is not None:
        checks += (trace_checks(traces, on_trace, workers) + memory_checks(traces, on_trace)
                   + gemm_checks(traces, on_trace) + echo_checks(traces))
    # Each group together, in the order groups first appear (the held-out kernel-model rows come
    # after the fit rows of the trace replays otherwise).
    first = {g: i for i, g in enumerate(dict.fromkeys(c.group for c in checks))}
    return sorted(checks, key=lambda c: first[c.group])
