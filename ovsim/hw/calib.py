"""Calibration: every fitted or assumed model constant, in versioned YAML files with provenance.

Specs (:mod:`ovsim.hw.spec`) hold hardware facts; this module holds what a model needs beyond them
(efficiencies, contention weights, latencies). Files live in ``hw/calib/``: ``default.v<N>.yaml``
applies to every GPU and ``<gpu-file-stem>.v<N>.yaml`` overrides it for one part; the newest
version of each is used unless a scenario names files. Old versions are never edited; a fit writes
a new version. Each parameter carries its own source, and each file its provenance, so a
prediction can say exactly which numbers it used.
"""

from __future__ import annotations

import functools
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, ValidationInfo, field_validator

from ovsim.errors import OvsimError
from ovsim.hw.spec import AttentionImplementation, GpuSpec, gpu_file, load_gpu, read_yaml
from ovsim.hw.validation import validation_error

CALIB_DIR = Path(__file__).parent / "calib"


# A share of a peak rate: zero would divide by zero, more than the peak is not a rate the part has.
Fraction = Annotated[float, Field(gt=0, le=1)]


def _each(v: dict[str, float], ok: Callable[[float], bool], what: str) -> dict[str, float]:
    """``v`` if every value passes ``ok``; else the error names the key and what was expected."""
    for k, x in v.items():
        if not ok(x):
            raise ValueError(f"{k}: {what}, got {x}")
    return v


def _protocols(v: dict[str, float]) -> dict[str, float]:
    """``v`` if every key is an NCCL protocol."""
    for k in v:
        if k not in ("ll", "ll128", "simple"):
            raise ValueError(f"{k}: keys are NCCL protocols (ll, ll128, simple)")
    return v


class Parameters(BaseModel):
    """Model constants. Defaults here are only placeholders for the schema: values come from files.

    Each is checked for the range its meaning allows, so that a typo in a calibration file (a
    negative efficiency, a percentage for a fraction) is an error naming it, not a prediction that
    runs faster than the hardware or never finishes."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # Fraction of the dense tensor peak a large, well-shaped GEMM reaches, per precision.
    gemm_efficiency: dict[str, Fraction] = Field(default_factory=lambda: {"default": 0.8})
    # Time each wave of GEMM tiles spends beside its main loop (pipeline fill, epilogue), per
    # precision ("default" for the others); with it, gemm_efficiency is the main loop's. It is what
    # makes short-K and small GEMMs less efficient than tiles and waves alone say. Fitted by
    # `ovsim calibrate --fit gemm`; 0 where no fit says otherwise.
    gemm_tile_overhead_s: dict[str, float] = Field(default_factory=dict)
    # Main-loop efficiency of GEMMs whose n or k is not a multiple of 16 bytes, per precision: the
    # libraries run them on narrower-load kernels (CUTLASS's align1, align2), measured at a tenth of
    # the aligned efficiency on H100 traces. A precision not listed takes gemm_efficiency. Fitted
    # by `ovsim calibrate --fit gemm`.
    gemm_unaligned_efficiency: dict[str, Fraction] = Field(default_factory=dict)
    # The main-loop efficiency of a GEMM kernel of one's own (a scenario op with a `tile`): a plain
    # WMMA kernel reaches a fraction of what the vendor library's kernels do (measured: 15% of the
    # FP16 peak on an H100 against cuBLAS's 80%). Per precision; a precision not listed takes
    # gemm_efficiency (the A100s: not measured). An op's own `efficiency` overrides it.
    own_gemm_efficiency: dict[str, Fraction] = Field(default_factory=dict)
    # The L2-to-SM bandwidth a GEMM kernel of one's own reads its operand tiles at (bytes/s): each
    # BM x BN tile reads K x (BM + BN) operand elements from L2, which bounds a small-tile WMMA
    # kernel (measured: 64x64 to 128x64 tiles on an H200 at 4.7-5.1 TB/s, whatever their FLOP rate).
    # None: no such bound (GPUs without the measurement). Library kernels are not held to it: they
    # share loads across a cluster (TMA multicast) and are calibrated as they run.
    own_gemm_l2_bytes_per_s: Annotated[float, Field(gt=0)] | None = None
    # Each SM's own path from L2 for those reads (bytes/s): the reads take bytes x (1 / the L2
    # bandwidth above + 1 / (SMs in use x this)), so a kernel on fewer SMs reads slower, though
    # less than in proportion (measured: the 64x64 WMMA kernel x1.62 with half an H200's SMs held).
    # None: the reads do not depend on the SMs in use.
    own_gemm_l2_sm_bytes_per_s: Annotated[float, Field(gt=0)] | None = None
    # The fraction of the dense tensor peak a fused (flash) attention kernel reaches (at the GPU's
    # compute clock) over long rows of keys: scenarios' `attention: flash`, an attention op without
    # an implementation; forward, and backward too where the next is None.
    attention_efficiency: Fraction = 0.6
    # The same for the backward kernel (its 2.5x the forward's work, with the kernels that prepare
    # and convert its gradients), where it was measured apart (calibration/attention/fit_measured.py).
    attention_backward_efficiency: Fraction | None = None
    # What a block spends beyond its loop (forward, a block of queries loading them and writing
    # its output; backward, a block of keys, its gradients), in tiles of 128 of the tokens it
    # loops over: a block looping over n tiles runs at n / (n + this) of the efficiency above. 0:
    # nothing (GPUs without the measurement).
    attention_block_overhead_tiles: float = Field(default=0.0, ge=0)
    # The head size the kernel's tiles round a head up to (cuDNN's Hopper kernels run a head of 96
    # on their 128 tile); 1: none.
    attention_head_dim_multiple: PositiveInt = 1
    # The same for named implementations ("flash1", "flash2"), per GPU, from their authors'
    # published rates (calibration/attention/published_rates.py). A GPU without a figure for an
    # implementation refuses it rather than guess.
    attention_impl_efficiency: dict[AttentionImplementation, Fraction] = Field(default_factory=dict)
    # Fraction of achievable HBM bandwidth a streaming (elementwise, norm, softmax) kernel reaches;
    # above 1 where a kernel beats the bandwidth test that set the achievable fraction.
    memory_kernel_efficiency: float = Field(default=0.9, gt=0, le=1.5)
    # The same per kind of memory-bound kernel ("norm", "softmax"), for kinds that reach
    # less than streaming elementwise work (rows read more than once); `ovsim calibrate --fit
    # memory` writes the kinds its traces support. A kind not listed takes memory_kernel_efficiency.
    memory_kind_efficiency: dict[str, float] = Field(default_factory=dict)
    # The share of a memory-bound kernel's time at the compute clock that follows the SM clock, per
    # kind ("elementwise", "norm", "softmax"): at clock fraction c its time is
    # t · ((1 - share) + share / c) (reductions and index math run on the SMs, the streaming on
    # HBM's clock). A kind not listed does not follow the clock. Measured by the calibration
    # harness's clock part where a GPU's file says so.
    memory_kind_clock_share: dict[str, float] = Field(default_factory=dict)
    # Fraction of the HBM peak any mix of traffic can reach; the HBM channel's capacity.
    hbm_achievable_fraction: Fraction = 0.9
    # HBM's loaded latency (ovsim.engine.channel.latency_slowdowns): it grows with the total
    # utilization U of the peak as (1 - U / hbm_latency_capacity) ** -hbm_latency_exponent, and a
    # user's time waiting on memory grows with it. 0 (the schema default): no latency law, HBM is
    # only a bandwidth shared max-min fair. Measured by the calibration harness's overlap part
    # (memory-bound kernels beside copy loops) where a GPU's file says so.
    hbm_latency_capacity: float = Field(default=0.0, ge=0.0, le=10.0)
    hbm_latency_exponent: float = Field(default=1.0, gt=0.0, le=20.0)
    # The share of an SM collective's (a channel's copy loop's) time alone that waits on memory;
    # memory-bound kernels wait 1 - memory_kind_clock_share of theirs, compute-bound ones none.
    hbm_latency_collective_wait: float = Field(default=0.5, ge=0.0, le=1.0)
    # Capacity factor applied to HBM while a communication flow and a kernel share it.
    hbm_mix_efficiency: Fraction = 1.0
    # Launch, prologue and epilogue time of every kernel.
    kernel_overhead_s: float = Field(default=2e-6, ge=0, lt=1e-3)
    # Least share of an SM's issue throughput a memory-bound block uses, at full residency.
    memory_issue_floor: float = Field(default=0.1, ge=0, le=1)
    # How much faster than its HBM lets it a memory-bound kernel's blocks could move data: on a
    # 1/headroom share of the SMs it still reaches the bandwidth it reached on all of them. 1 (the
    # schema default) makes its time follow its SMs; measured by the calibration harness's smloss
    # part where a GPU's file says so.
    memory_sm_headroom: float = Field(default=1.0, ge=1.0, le=16.0)
    # Share of an SM's issue throughput one NCCL block uses.
    nccl_issue_fraction: float = Field(default=0.5, ge=0, le=1)
    # The most of an SM's issue throughput one block of a compute-bound kernel can use, per warp of
    # the block (capped at the whole SM), when fewer of its kernel's blocks share the SM than fit
    # (occupancy shaping, a last wave, an SM shared with other kernels). None (the schema default):
    # a block never runs faster than at its kernel's full residency. Measured by the calibration
    # harness's shaping part where a GPU's file says so.
    block_issue_share_per_warp: float | None = Field(default=None, gt=0, le=1)
    # The share of a GEMM tile's time, with tiles on every SM, that goes with how many SMs run
    # GEMM tiles: the memory system the SMs load their operands through is shared, so a tile on
    # fewer of them runs faster, 1 / (1 - share * (1 - the fraction of SMs running tiles)) times.
    # 0 (the schema default): a tile's pace is its SM's alone. Measured by the calibration
    # harness's smloss part (cuBLAS's GEMMs beside 1 to 66 held SMs) where a GPU's file says so.
    gemm_load_share: float = Field(default=0.0, ge=0.0, lt=1.0)
    # Weight of copy-engine traffic (copies, copy-engine collectives) in HBM's max-min share,
    # against 1 for a kernel. Under 1 the copy engines yield bandwidth to SM traffic, and the
    # latency law counts only the bandwidth they are left: a kernel streaming at HBM's rate keeps
    # it and stalls the copy, while one that asks little meets a loaded memory. 1 (the schema
    # default): copies share HBM fairly and the law counts their full rate. Measured by the
    # calibration harness's framework_copy part where a GPU's file says so.
    copy_engine_hbm_weight: float = Field(default=1.0, gt=0.0, le=1.0)
    # Little's law for memory-bound kernels: each resident warp keeps a few hundred bytes in flight
    # for about one memory latency, so a kernel of few warps moves at most this many bytes per
    # second per warp whatever HBM could give it (a one-block kernel, a reduction over 24 blocks).
    # Replay prices such a kernel's traffic at that rate: it leaves HBM to others and, far from
    # saturating HBM alone, meets a loaded memory beside them. 0 (the schema default): every
    # memory-bound kernel is taken to move data at HBM's achievable rate. Measured with Nsight
    # Compute (the calibration harness's framework_ncu part) where a GPU's file says so.
    memory_warp_bytes_per_s: float = Field(default=0.0, ge=0.0, le=1e11)
    # Weight of a collective's traffic in HBM's max-min share, per NCCL protocol.
    nccl_hbm_weight: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=lambda: {"ll": 1.0, "ll128": 1.0, "simple": 1.0})
    # Share of HBM capacity each resident block (channel) of an SM collective keeps busy beyond the
    # data it moves (flag polling, L2 and crossbar traffic), per protocol; "default" covers any
    # other (RCCL, unknown). A collective's total is at most 0.9. Fitted by `ovsim calibrate` from
    # kernels measured alone and beside communication.
    nccl_memory_pressure: dict[str, float] = Field(default_factory=dict)
    # Replay only: HBM traffic of a compute-bound kernel kind, as a fraction of what the achievable
    # bandwidth moves in its isolated time (a trace records no bytes). Memory-bound kinds move
    # `memory_kernel_efficiency` of it. Fitted with the pressure above.
    replay_hbm_fraction: dict[str, float] = Field(default_factory=dict)
    # Replay only: the share of a traced collective kernel's grid that holds SMs for the whole
    # measured collective. 1 is NCCL's design (one block per channel, sharing its SM with no compute
    # block); less stands for blocks that leave early (a channel with no work left, a p2p channel
    # waiting on a peer), which a kernel record does not show. Fitted with the pressure above.
    replay_collective_sm_fraction: float = Field(default=1.0, ge=0.0, le=1.0)
    # Measured collective cost that replaces NCCL's own model for exactly this collective, keyed
    # "op/algorithm/protocol/ranks": latency_s and bus_bandwidth_bytes_per_s (`ovsim calibrate`).
    nccl_fitted: dict[str, dict[str, float]] = Field(default_factory=dict)
    # A GPU's measured ring collectives within one node, per NCCL protocol, against NCCL's own cost
    # model: the time a ring collective takes beyond the model's latency, one per collective (the
    # A100's all-gather and reduce-scatter, 7 ring steps, add about what its all-reduce, 14, does),
    # and the share of the model's bus bandwidth reached. None listed (the schema default): NCCL's
    # model as it is. Fitted on a published nccl-tests sweep where a GPU's file says so
    # (calibration/nccl/fit_published_sweeps.py).
    nccl_ring_added_latency_s: dict[str, float] = Field(default_factory=dict)
    nccl_ring_bus_efficiency: dict[str, float] = Field(default_factory=dict)
    # The same for NVLS (NVLink SHARP, Simple only) within one node; 0 and 1 (the schema defaults):
    # NCCL's model as it is.
    nccl_nvls_added_latency_s: float = Field(default=0.0, ge=0.0, lt=1e-2)
    nccl_nvls_bus_efficiency: float = Field(default=1.0, gt=0.0, le=1.0)
    # The communicator size the costs above were measured on: they apply to collectives over exactly
    # that many ranks of one node (the published sweeps are of whole 8-GPU nodes; what fewer ranks
    # pay was not measured). 0 (the schema default): to none.
    nccl_node_ranks: int = Field(default=0, ge=0, le=1024)

    @field_validator("hbm_latency_capacity")
    @classmethod
    def _latency_capacity(cls, v: float) -> float:
        if v != 0.0 and v <= 1.0:
            raise ValueError("0 (no latency law) or a multiple of the HBM peak above 1")
        return v

    @field_validator("nccl_memory_pressure")
    @classmethod
    def _pressure_range(cls, v: dict[str, float]) -> dict[str, float]:
        return _each(v, lambda x: 0.0 <= x < 1.0, "a share of HBM capacity in [0, 1)")

    @field_validator("gemm_tile_overhead_s")
    @classmethod
    def _tile_time(cls, v: dict[str, float]) -> dict[str, float]:
        return _each(v, lambda x: 0.0 <= x < 1e-3, "seconds per wave of tiles in [0, 1 ms)")

    @field_validator("memory_kind_efficiency")
    @classmethod
    def _memory_eff(cls, v: dict[str, float]) -> dict[str, float]:
        return _each(v, lambda x: 0.0 < x <= 1.5, "a fraction of the achievable HBM bandwidth in (0, 1.5]")

    @field_validator("memory_kind_clock_share")
    @classmethod
    def _clock_share(cls, v: dict[str, float]) -> dict[str, float]:
        return _each(v, lambda x: 0.0 <= x <= 1.0, "a share of the kernel's time in [0, 1]")

    @field_validator("replay_hbm_fraction")
    @classmethod
    def _fraction_range(cls, v: dict[str, float]) -> dict[str, float]:
        return _each(v, lambda x: 0.0 <= x <= 1.0, "a fraction in [0, 1]")

    @field_validator("nccl_ring_added_latency_s")
    @classmethod
    def _added_latency(cls, v: dict[str, float]) -> dict[str, float]:
        return _each(_protocols(v), lambda x: 0.0 <= x < 1e-2, "seconds in [0, 10 ms)")

    @field_validator("nccl_ring_bus_efficiency")
    @classmethod
    def _ring_efficiency(cls, v: dict[str, float]) -> dict[str, float]:
        return _each(_protocols(v), lambda x: 0.0 < x <= 1.0, "a share of NCCL's modelled bus bandwidth in (0, 1]")

    @field_validator("nccl_fitted")
    @classmethod
    def _fitted(cls, v: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for k, x in v.items():
            if len(k.split("/")) != 4:
                raise ValueError(f"{k}: keys are op/algorithm/protocol/ranks")
            latency, bandwidth = x.get("latency_s", -1.0), x.get("bus_bandwidth_bytes_per_s", 0.0)
            if not (0 <= latency < math.inf and 0 < bandwidth < math.inf):
                raise ValueError(f"{k}: needs a finite latency_s >= 0 and bus_bandwidth_bytes_per_s > 0")
        return v
    # Copy-engine transfers reach this fraction of the link's per-direction bandwidth.
    ce_link_efficiency: Fraction = 0.83
    # Copy-engine local device-to-device copies reach this fraction of achievable HBM bandwidth
    # (they read and write, so half of it moves as copied bytes).
    ce_local_efficiency: Fraction = 0.8
    ce_latency_s: float = Field(default=1e-5, ge=0)
    host_link_efficiency: Fraction = 0.8
    # Power model (ovsim.hw.power). SM weights are the dynamic power of every SM doing that work at
    # the compute clock; a missing weight is derived from the TDP (see power.power_model).
    # Idle power in place of the GPU spec's (fitted to a power log by ovsim calibrate).
    power_idle_w: float | None = Field(default=None, ge=0)
    # Idle power at the minimum SM clock. Given, power_idle_w is the idle power at the maximum
    # clock and the part between them follows the clock as dynamic power does; None: idle power
    # is one number at every clock.
    power_idle_min_clock_w: float | None = Field(default=None, ge=0)
    power_tensor_w: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    power_fp32_w: float | None = Field(default=None, ge=0)
    power_memory_w: float | None = Field(default=None, ge=0)
    power_fp32_fraction_of_tensor: float = Field(default=0.6, ge=0)
    power_memory_fraction_of_tensor: float = Field(default=0.2, ge=0)
    power_hbm_j_per_byte: float = Field(default=31.2e-12, ge=0)
    power_link_j_per_byte: float = Field(default=24e-12, ge=0)
    power_knee_clock_fraction: float = Field(default=0.6, gt=0, lt=1)
    power_knee_voltage_fraction: float = Field(default=0.65, gt=0, le=1)
    power_tensor_reference_clock_fraction: float = Field(default=1.0, gt=0)
    # The SM clock above which a tensor kernel's rate stops following the clock (something off the
    # SM clock, L2 or HBM, limits it there), by precision, "default" for the rest. None given: its
    # rate follows the clock all the way up.
    power_tensor_saturation_clock_hz: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    power_clock_step_hz: float = Field(default=15e6, ge=0)
    # The board's power-limit loop: every control period it sets the SM clock from the power the
    # last window of activity drew, so phases much shorter than the window share one clock. A
    # window of 0 re-solves the clock at every event from the activity of the moment.
    power_control_window_s: float = Field(default=0.0, ge=0)
    power_control_period_s: float = Field(default=0.0, ge=0)

    @field_validator("power_control_period_s")
    @classmethod
    def _control_period(cls, p: float, info: ValidationInfo) -> float:
        w = info.data.get("power_control_window_s", 0.0)
        if w > 0 and not 0 < p <= w:
            raise ValueError(f"must be in (0, power_control_window_s = {w:g}] where a window is set, got {p:g}")
        return p

    def gemm_eff(self, precision: str, aligned: bool = True) -> float:
        if not aligned and precision in self.gemm_unaligned_efficiency:
            return self.gemm_unaligned_efficiency[precision]
        return self.gemm_efficiency.get(precision, self.gemm_efficiency.get("default", 0.8))

    def own_gemm_eff(self, precision: str, aligned: bool = True) -> float:
        """The main-loop efficiency of a tiled GEMM kernel of one's own (not the library's). BF16
        and FP16 take each other's value where only one was measured: the same tensor cores and peak."""
        twin = {"bf16": "fp16", "fp16": "bf16"}.get(precision, precision)
        own = self.own_gemm_efficiency
        return own.get(precision, own.get(twin, self.gemm_eff(precision, aligned)))

    def attention_eff(self, implementation: AttentionImplementation | None, gpu_name: str = "this GPU",
                      backward: bool = False) -> float:
        """The efficiency of attention ``implementation`` on ``gpu_name`` (None: a fused kernel at
        ``attention_efficiency``, or backward at ``attention_backward_efficiency`` where known)."""
        if implementation is None:
            if backward and self.attention_backward_efficiency is not None:
                return self.attention_backward_efficiency
            return self.attention_efficiency
        efficiency = self.attention_impl_efficiency.get(implementation)
        if efficiency is not None:
            return efficiency
        known = ", ".join(sorted(self.attention_impl_efficiency)) or "none"
        raise OvsimError(f"no published efficiency of {implementation} on {gpu_name} (it has: {known}); "
                         "use flash for a fused kernel at the calibration's attention_efficiency",
                         field="implementation")

    def memory_eff(self, kind: str) -> float:
        return self.memory_kind_efficiency.get(kind, self.memory_kernel_efficiency)

    def gemm_tile_s(self, precision: str) -> float:
        return self.gemm_tile_overhead_s.get(precision, self.gemm_tile_overhead_s.get("default", 0.0))

    def merged(self, overrides: dict[str, Any]) -> Parameters:
        """These parameters with ``overrides`` on top (mapping-valued ones merged key by key), as a
        calibration file on top of another would give."""
        data = self.model_dump()
        for k, v in overrides.items():
            data[k] = {**data[k], **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
        return Parameters.model_validate(data)


# The most of HBM's capacity one collective's pressure takes, whatever its blocks.
PRESSURE_MAX = 0.9


def collective_pressure(pressure: dict[str, float], weights: dict[str, float], protocol: str) -> tuple[float, float]:
    """(share of HBM capacity per resident block, max-min weight) of a resident SM collective of
    ``protocol``, from ``nccl_memory_pressure`` and ``nccl_hbm_weight``: a protocol without its own
    share takes "default", one without its own weight 1."""
    p = protocol.lower()
    return pressure.get(p, pressure.get("default", 0.0)), weights.get(p, 1.0)


class CalibFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_id: str = Field(alias="schema", pattern=r"^ovsim\.calib/1$")
    gpu: str  # "*" for every GPU, else a GPU spec file stem
    version: int = Field(ge=1)
    provenance: dict[str, Any]
    parameters: dict[str, Any]
    sources: dict[str, str]


@dataclass(frozen=True)
class Calibration:
    params: Parameters
    files: tuple[str, ...]  # "name vN" of every file merged, in order

    @property
    def summary(self) -> list[str]:
        return list(self.files)


# A calibration file's name: <stem>.v<version>.yaml.
VERSIONED_NAME = re.compile(r"^(?P<stem>.+)\.v(?P<version>\d+)\.yaml$")


def newest_file(stem: str, folder: Path) -> Path | None:
    """The newest version of calibration ``stem`` in ``folder``, if any. Cached while the folder's
    entries are unchanged (its modification time moves when a file is added, removed or renamed):
    a sweep or a schedule search looks the files up for every prediction. The key holds the
    change time too, which copying tools cannot set back as they can the modification time, and
    the folder itself (device, inode). A folder changed in the last two seconds is listed again:
    the times move in clock ticks, coarser than two writes."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < 2_000_000_000:
        return _newest_listed(stem, folder)
    return _newest_cached(stem, str(folder), (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))


@functools.lru_cache(maxsize=256)
def _newest_cached(stem: str, folder_name: str, state: tuple[int, int, int, int]) -> Path | None:
    return _newest_listed(stem, Path(folder_name))


def _newest_listed(stem: str, folder: Path) -> Path | None:
    best: tuple[int, Path] | None = None
    if not folder.is_dir():
        return None
    for p in folder.iterdir():
        m = VERSIONED_NAME.match(p.name)
        if m and m["stem"] == stem:
            v = int(m["version"])
            if best is None or v > best[0]:
                best = (v, p)
    return best[1] if best else None


def _extra_file(path: Path, gpu_file_stem: str) -> Path:
    if not path.is_dir():
        return path
    newest = newest_file(gpu_file_stem, path) or newest_file("default", path)
    if newest is None:
        raise OvsimError(f"no {gpu_file_stem}.vN.yaml or default.vN.yaml in this folder", source=str(path),
                         field="calibration")
    return newest


def read_calib_file(path: Path) -> CalibFile:
    """A calibration file, parsed and checked; cached while the file is unchanged (a sweep or a
    notebook loads the same files for every run)."""
    try:
        st = path.stat()
    except OSError:
        return _read_calib_file(path)  # reports the missing or unreadable file
    # A deep copy: callers may edit what they are given without changing the cached file.
    return _read_cached(str(path.resolve()), st.st_mtime_ns, st.st_size).model_copy(deep=True)


@functools.lru_cache(maxsize=64)
def _read_cached(path: str, mtime_ns: int, size: int) -> CalibFile:
    return _read_calib_file(Path(path))


def _read_calib_file(path: Path) -> CalibFile:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise OvsimError("expected a mapping at the top level", source=str(path))
    try:
        cf = CalibFile.model_validate(data)
    except ValidationError as e:
        raise validation_error(e, str(path)) from None
    unsourced = [k for k in cf.parameters if not cf.sources.get(k, "").strip()]
    if unsourced:
        raise OvsimError(f"parameters without a source: {', '.join(unsourced)}", source=str(path),
                         field="sources")
    return cf


def load_calibration(gpu: GpuSpec, gpu_file_stem: str, extra: tuple[str, ...] = ()) -> Calibration:
    """Merge the newest default file, the GPU's own file, then `extra` files in order. A folder in
    `extra` stands for the newest version in it of the GPU's file (what `ovsim calibrate -o
    FOLDER` writes), else of `default`.

    The result is cached while the files are unchanged, and shared: a sweep or a schedule search
    loads the same files for every prediction (a twelfth of a small search's time went to reading
    and checking them again). Change parameters with :meth:`Parameters.merged`, not in place."""
    paths: list[Path] = []
    default = newest_file("default", CALIB_DIR)
    if default is None:
        raise OvsimError("no default calibration file shipped", source=str(CALIB_DIR))
    paths.append(default)
    own = newest_file(gpu_file_stem, CALIB_DIR)
    if own is not None:
        paths.append(own)
    paths.extend(_extra_file(Path(p), gpu_file_stem) for p in extra)
    try:
        # Each file by the path given, made absolute but not normalised (the system resolves links
        # and ".." in it as it opens it), and by what it is (device, inode, time, size): resolving
        # the path instead cost 50 us a file, for every prediction of a sweep or a search.
        here = os.getcwd()
        stats = tuple((os.path.join(here, q), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
                      for q in paths for st in [q.stat()])
    except OSError:
        return _merged(tuple(paths), gpu.name, gpu_file_stem)  # reports the missing or unreadable file
    return _merged_cached(stats, gpu.name, gpu_file_stem)


@functools.lru_cache(maxsize=64)
def _merged_cached(stats: tuple[tuple[str, int, int, int, int], ...], gpu_name: str,
                   gpu_file_stem: str) -> Calibration:
    return _merged(tuple(Path(s[0]) for s in stats), gpu_name, gpu_file_stem)


def _merged(paths: tuple[Path, ...], gpu_name: str, gpu_file_stem: str) -> Calibration:
    merged: dict[str, Any] = {}
    names: list[str] = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            cf = _read_calib_file(p)  # reports the missing or unreadable file
        else:
            cf = _read_cached(str(p.resolve()), st.st_mtime_ns, st.st_size)  # read only: no copy
        if cf.gpu not in ("*", gpu_file_stem) and cf.gpu.lower() != gpu_name.lower():
            raise OvsimError(f"calibration is for GPU '{cf.gpu}', not '{gpu_name}'", source=str(p), field="gpu")
        try:
            # Each file on its own, so that a bad value is reported in the file that holds it.
            Parameters.model_validate(cf.parameters)
        except ValidationError as e:
            err = validation_error(e, str(p))
            raise OvsimError(err.message, source=str(p), field=f"parameters.{err.field}".rstrip(".")) from None
        for k, v in cf.parameters.items():
            if isinstance(v, dict) and isinstance(merged.get(k), dict):
                merged[k] = {**merged[k], **v}
            else:
                merged[k] = v
        names.append(f"{p.name}")
    try:
        params = Parameters.model_validate(merged)
    except ValidationError as e:
        raise validation_error(e, paths[-1].name) from None
    return Calibration(params=params, files=tuple(names))


def shipped_parameters(gpu_name: str) -> Parameters:
    """The parameters of a GPU's shipped calibration (the newest default file and its own, merged)."""
    return load_calibration(load_gpu(gpu_name), gpu_file(gpu_name).stem).params
