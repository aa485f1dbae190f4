"""``ovsim calibrate``: fit model parameters to real traces and write them, with provenance, as a
new calibration file (docs/calibration.md: everything fitted lives in versioned calibration
files with provenance).

What is fitted, from what, and how
----------------------------------

``contention``
    ``nccl_memory_pressure`` (per NCCL protocol: the share of HBM a resident SM collective keeps
    busy beyond its data) and ``replay_hbm_fraction`` (per compute-bound kernel kind: the HBM
    traffic replay gives it, as a fraction of what the achievable bandwidth moves in its isolated
    time). Data: every compute kernel that overlapped a collective and whose isolated duration is
    known from instances of the same signature that did not overlap (exactly the kernels replay
    scores). Model: the engine's HBM channel for one kernel beside the resident collectives (the
    same weighted max-min sharing, :func:`ovsim.engine.channel.max_min_rates`), applied over the
    measured fraction of the kernel's time that a collective was resident. Memory-bound kinds move
    ``memory_kernel_efficiency`` of the bandwidth, which anchors the scale. Loss: the mean absolute
    percentage error of those kernels, each trace weighted equally, with a negligible penalty that
    prefers the least contention among equal fits. Method: scipy's differential evolution with a
    fixed seed (deterministic). The fit uses this one-kernel view of the engine; the figures that
    judge it (``ovsim validate``, leave-one-trace-out) run the full engine.

``collectives``
    ``nccl_fitted``: latency and bus bandwidth per (collective, algorithm, protocol, ranks) from
    collectives of known message size that did not overlap compute. A kernel's duration includes
    waiting for peers, so each message size contributes its fastest instance; ``t = latency +
    bus_bytes / bandwidth`` is fitted by non-negative least squares over the sizes. Two distinct
    sizes at least; the prediction uses the fit only for that exact collective and rank count.

``overhead``
    ``kernel_overhead_s``, the fixed time the cost model adds to every kernel, from elementwise
    kernels too small for their traffic to count (at most 0.1 us of it at the peak HBM bandwidth)
    that ran without communication and were their operator call's only kernel; see
    :func:`fit_overhead`. Fitted first, so the gemm and memory fits of the same call build on it.

``gemm``
    ``gemm_efficiency`` (of the main loop) and ``gemm_tile_overhead_s`` (fixed time per wave of
    tiles) per precision from GEMM kernels that ran without communication and whose launching
    operator records input shapes; see :func:`fit_gemm`.

``memory``
    ``memory_kernel_efficiency`` (streaming elementwise kernels), ``memory_kind_efficiency`` (norm,
    softmax) and, where streaming kernels were measured to move more than it allows,
    ``hbm_achievable_fraction``, from memory-bound kernels moving at least twice the L2 whose
    bytes the launching operator's input shapes and types give (:mod:`ovsim.traces.aten`); see
    :func:`fit_memory`.

``power``
    ``power_idle_w`` and the power weights (``power_tensor_w``, ``power_fp32_w``,
    ``power_memory_w``, ``power_hbm_j_per_byte``, ``power_link_j_per_byte``) from power logs of the
    traced runs (nvidia-smi, dcgmi dmon, DCGM CSV; :mod:`ovsim.traces.power`). Each trace is
    replayed with power tracked; its log is put on the trace's clock (from the wall clocks of both,
    or a given offset) and each sample is set beside the replay's activity averaged over the
    sensor's window (the log's median sample interval unless given). Least squares with
    non-negative weights (:func:`ovsim.hw.power.fit_power`); a weight whose activity never occurs
    in the samples is not identifiable and is not written.

Old calibration files are never edited: the output is a new file, and an existing one is refused.
"""

from __future__ import annotations

from ovsim.calibrate.clock import fit_clock_share, fit_control_window, memory_clock_time_s
from ovsim.calibrate.collectives import collective_time_s, fit_collectives
from ovsim.calibrate.contention import (
    MOVING_STEP,
    NO_CONTENTION,
    SM_FRACTION_MARGIN_PCT,
    SM_FRACTIONS,
    ContentionData,
    contention_data,
    contention_slowdown,
    contention_time_s,
    fit_contention,
    held,
)
from ovsim.calibrate.gemm import (
    GEMM_FRAMES,
    GEMM_MIN_UNALIGNED,
    MEMORY_L2_MULTIPLE,
    fit_gemm,
    fit_library_gemm,
    gemm_efficiency_at,
    gemm_mape,
    gemm_points,
    gemm_precision,
    gemm_shapes,
    gemm_time_s,
    library_gemm_errors,
    library_gemm_mape,
    library_gemm_times,
)
from ovsim.calibrate.inputs import (
    FRACTION_KINDS,
    GPU_SPECIFIC,
    POINT_COLUMNS,
    QUANTITIES,
    FitReport,
    PowerLog,
    TraceInput,
    trace_input,
)
from ovsim.calibrate.memory import (
    MEMORY_FITTED,
    MEMORY_MIN_POINTS,
    fit_memory,
    memory_mape,
    memory_points,
    memory_time_s,
    published_achievable_fraction,
)
from ovsim.calibrate.overhead import (
    OVERHEAD_MAX_BODY_S,
    OVERHEAD_MIN_POINTS,
    OVERHEAD_TRIM,
    fit_overhead,
    least_mape_constant,
    overhead_estimate,
    overhead_points,
    whole_microseconds,
)
from ovsim.calibrate.power import PowerSamples, fit_power_logs, power_samples
from ovsim.calibrate.runner import calibrate, fit_points, next_version, output_path, write_calibration, write_shipped

__all__ = [
    "FRACTION_KINDS",
    "GEMM_FRAMES",
    "GEMM_MIN_UNALIGNED",
    "GPU_SPECIFIC",
    "MEMORY_FITTED",
    "MEMORY_L2_MULTIPLE",
    "MEMORY_MIN_POINTS",
    "MOVING_STEP",
    "NO_CONTENTION",
    "OVERHEAD_MAX_BODY_S",
    "OVERHEAD_MIN_POINTS",
    "OVERHEAD_TRIM",
    "POINT_COLUMNS",
    "QUANTITIES",
    "SM_FRACTIONS",
    "SM_FRACTION_MARGIN_PCT",
    "ContentionData",
    "FitReport",
    "PowerLog",
    "PowerSamples",
    "TraceInput",
    "calibrate",
    "collective_time_s",
    "contention_data",
    "contention_slowdown",
    "contention_time_s",
    "fit_clock_share",
    "fit_collectives",
    "fit_contention",
    "fit_control_window",
    "fit_gemm",
    "fit_library_gemm",
    "fit_memory",
    "fit_overhead",
    "fit_points",
    "fit_power_logs",
    "gemm_efficiency_at",
    "gemm_mape",
    "gemm_points",
    "gemm_precision",
    "gemm_shapes",
    "gemm_time_s",
    "held",
    "least_mape_constant",
    "library_gemm_errors",
    "library_gemm_mape",
    "library_gemm_times",
    "memory_clock_time_s",
    "memory_mape",
    "memory_points",
    "memory_time_s",
    "next_version",
    "output_path",
    "overhead_estimate",
    "overhead_points",
    "power_samples",
    "published_achievable_fraction",
    "trace_input",
    "whole_microseconds",
    "write_calibration",
    "write_shipped",
]
