"""The published overlap studies' setups as scenarios, predicted by ovsim: what ``ovsim validate
--studies``, ``bench/overlap_study.py`` and the notebooks set against the published figures.

- **Lee et al.**, arXiv 2507.03114 (ISPASS 2025), as a secondary reading note of the paper
  describes its runs: GPT-3 1.3B to 13B and LLaMA2-13B trained with FSDP and with pipeline
  parallelism, on 4x A100 and 4x H100, FP16, batch 8 to 64. Published: compute kernels overlapped
  with communication run 18.9% slower on average (at most 40%), and sequential execution is 10.2%
  slower than overlapped on average (at most 26.6%).
- **Cui & Pericas**, arXiv 2606.09200: a GEMM (8192^3, 64x64x32 tiles) beside an 896 MB all-reduce
  on 4x A100 and 4x H100; communication priority plus occupancy shaping (shared-memory padding of
  the GEMM's blocks) cut total time by up to 25.5%.

The sequential figure of Lee et al. is not a sequential run but accounted from the overlapped one
(:func:`ovsim.api.accounted_sequential_s`); both are reported.

Both studies measured boards at their default power limit: neither says it was changed, and an
A100 or H100 SXM cannot be set above its TDP (Lee et al.'s cap sweep starts from "unlimited", the
default). So every configuration here runs the board's power-limit loop at the GPU's TDP
(:func:`default_limit_w`, docs/power.md), and the compute slowdown is the study's own: overlapped
compute against the sequential run's compute at the same limit.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import pandas as pd

from ovsim.api import accounted_sequential_s, predict
from ovsim.errors import OvsimError
from ovsim.hw.spec import load_gpu, load_system
from ovsim.models.memory import USABLE_FRACTION
from ovsim.scenario import Scenario
from ovsim.workers import worker_pool

LEE_MODELS = ("gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "llama2-13b")
LEE_SYSTEMS = ("a100x4", "h100x4")
LEE_BATCHES = (8, 16, 32, 64)
# FSDP as DeepSpeed's ZeRO-3 runs it (the reading note names DeepSpeed for FSDP and Megatron-LM for
# the pipeline); and a 4-stage 1F1B pipeline over the global batch split into 8 micro-batches.
LEE_PARALLEL: dict[str, dict[str, Any]] = {"fsdp": {"dp_mode": "fsdp", "fsdp_impl": "zero3"},
                                           "pp": {"pp": 4, "pipeline": "1f1b"}}
PP_MICRO_BATCHES = 8


def default_limit_w(system: str) -> float:
    """The default board power limit (the TDP) of ``system``'s GPUs, which the studies ran at."""
    return float(load_gpu(load_system(system).gpu).power.tdp_w)


# How the reading note's "batch size" becomes a configuration (it does not say whether per GPU or
# global, nor the micro-batch, sequence length or recomputation):
# - "literal": FSDP runs the batch as one micro-batch per GPU; the pipeline splits it into 8
#   micro-batches; the model's own sequence length; no recomputation. Most of these configurations
#   would not fit in the GPUs' memory (ovsim.models.memory).
# - "fits": the same batch per GPU (FSDP) or per pipeline, run as a framework user would make it fit:
#   FSDP takes the largest power-of-two micro-batch whose estimated memory is at most
#   USABLE_FRACTION (ovsim.models.memory) of the GPU's and accumulates gradients over the rest
#   (ZeRO-3 gathers every layer each micro-batch); the pipeline keeps its 8 micro-batches; full
#   recomputation only where nothing fits without it; a configuration that fits in no way (GPT-3
#   13B's 16 bytes a parameter of model states alone exceed a 40 GB A100 under 4-way sharding) is
#   not run.
READINGS = ("literal", "fits")


def lee_training(model: str, parallel: str, batch: int, layers: int = 0, *, reading: str = "literal",
                 system: str = "a100x4") -> dict[str, Any] | None:
    """The ``training`` section of one configuration of the matrix under a reading of
    ``READINGS`` (``layers`` 0: the model's own depth; fewer keep every layer's shapes and cut the
    count, and do not change the micro-batch the full depth needs). None: the configuration fits
    in no way ("fits" reading)."""
    if reading not in READINGS:
        raise OvsimError(f"unknown reading '{reading}'; one of {', '.join(READINGS)}", field="reading")
    if parallel not in LEE_PARALLEL:
        raise OvsimError(f"unknown layout '{parallel}'; one of {', '.join(LEE_PARALLEL)}", field="parallel")
    training: dict[str, Any] = {"model": model, "precision": "fp16", "parallel": LEE_PARALLEL[parallel]}
    if parallel == "fsdp":
        training["micro_batch_size"] = batch
    else:
        training.update(micro_batch_size=max(1, batch // PP_MICRO_BATCHES), micro_batches=PP_MICRO_BATCHES)
    if reading == "fits":
        found = _fitting(training, parallel, batch, system)
        if found is None:
            return None
        training = found
    if layers:
        training["layers"] = layers
    return training


def _memory_bytes(training: dict[str, Any], system: str) -> tuple[float, float]:
    """(estimated peak memory per GPU, the GPU's memory) of a configuration on ``system``, at the
    model's own depth whatever depth is simulated."""
    from ovsim.hw.spec import load_gpu, load_system
    from ovsim.models.memory import memory_estimate
    from ovsim.models.training_spec import TrainingSpec

    spec_sys = load_system(system)
    full = {k: v for k, v in training.items() if k != "layers"}
    total = memory_estimate(TrainingSpec.model_validate(full), spec_sys.total_gpus).total_bytes
    return total, load_gpu(spec_sys.gpu).memory.capacity_bytes


def _fitting(training: dict[str, Any], parallel: str, batch: int, system: str) -> dict[str, Any] | None:
    if parallel == "fsdp":
        sizes = [m for m in (2**i for i in range(batch.bit_length() - 1, -1, -1)) if batch % m == 0]
        options = [{**training, "micro_batch_size": m, "micro_batches": batch // m} for m in sizes]
    else:
        options = [training]
    for recompute in (False, True):
        for t in options:
            t = {**t, "recompute": recompute}
            total, capacity = _memory_bytes(t, system)
            if total <= USABLE_FRACTION * capacity:
                return t
    return None


def _pair(model: str, system: str, parallel: str, batch: int, layers: int, reading: str = "literal"
          ) -> dict[str, Any]:
    training = lee_training(model, parallel, batch, layers, reading=reading, system=system)
    head = {"model": model, "system": system, "parallel": parallel, "batch": batch}
    if training is None:
        nan = float("nan")
        return {**head, "micro_batch_size": 0, "micro_batches": 0, "recompute": False, "iteration_ms": nan,
                "compute_slowdown_pct": nan, "sequential_slower_pct": nan, "accounted_slower_pct": nan,
                "comm_hidden_pct": nan, "memory_per_gpu_gb": nan, "fits_memory": False}
    out = {}
    limit = default_limit_w(system)
    for schedule in ("overlapped", "sequential"):
        sc = Scenario.model_validate({"name": f"{model}-{parallel}-{system}-b{batch}", "system": system,
                                      "schedule": schedule, "training": training})
        out[schedule] = predict(sc, counters=False, power_cap_w=limit).summary()
    o, s = out["overlapped"], out["sequential"]
    return {**head, "micro_batch_size": training["micro_batch_size"],
            "micro_batches": training.get("micro_batches", 1),
            "recompute": training.get("recompute", False) not in (False, "none"),
            "iteration_ms": o["makespan_s"] * 1e3, "compute_slowdown_pct": (o["compute_s"] / s["compute_s"] - 1) * 100,
            "sequential_slower_pct": (s["makespan_s"] / o["makespan_s"] - 1) * 100,
            "accounted_slower_pct": (accounted_sequential_s(o, s) / o["makespan_s"] - 1) * 100,
            "comm_hidden_pct": o["comm_hidden_fraction"] * 100, **_memory(training, system)}


def _memory(training: dict[str, Any], system: str) -> dict[str, Any]:
    total, capacity = _memory_bytes(training, system)
    return {"memory_per_gpu_gb": total / 1e9, "fits_memory": total <= capacity}


def lee_matrix(layers: int = 0, batches: Sequence[int] = LEE_BATCHES, *, workers: int = 1,
               on_row: Callable[[dict[str, Any]], None] | None = None, reading: str = "literal") -> pd.DataFrame:
    """Every configuration of the matrix, overlapped and sequential at the default power limit: one
    row each with iteration time, compute slowdown (overlapped compute against the sequential
    run's), sequential slower than overlapped (simulated, and accounted as the
    study does) and the share of communication hidden, all in percent, and the estimated memory
    per GPU at the model's own depth and whether it fits (:mod:`ovsim.models.memory`), under a
    reading of ``READINGS``
    (the micro-batch, micro-batches and recomputation it gives are columns; a configuration that
    fits in no way has NaN figures). ``workers``: processes (1: this one; 0: one per CPU core);
    ``on_row`` is called with each row as it arrives, in order."""
    if reading not in READINGS:
        raise OvsimError(f"unknown reading '{reading}'; one of {', '.join(READINGS)}", field="reading")
    if workers < 0:
        raise OvsimError(f"must be 0 (one per core) or more, got {workers}", field="workers")
    configs = list(itertools.product(LEE_MODELS, LEE_SYSTEMS, LEE_PARALLEL, batches))
    jobs = min(workers or os.cpu_count() or 1, len(configs))
    pool = worker_pool(jobs)
    rows = []
    with pool or nullcontext():
        run = pool.map if pool is not None else map
        for row in run(_pair, *zip(*configs, strict=True), itertools.repeat(layers), itertools.repeat(reading)):
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return pd.DataFrame(rows)


CUI_SYSTEMS = ("a100x4", "h100x4")
# The padding of the bundled examples: one 64x64x32 GEMM block per SM, the rest of the SM's shared
# memory left to NCCL's blocks.
CUI_SHAPING_SMEM_BYTES = {"a100x4": 59392, "h100x4": 92160}
CUI_SCHEDULES = ("naive overlap", "priority", "priority + shaping", "sequential")


def cui_pericas_scenario(system: str, schedule: str, n: int = 8192) -> Scenario:
    """GEMM 8192 x ``n`` x 8192 (FP16, 64x64x32 tiles) beside an 896 MB all-reduce, under one of
    ``CUI_SCHEDULES``."""
    if schedule not in CUI_SCHEDULES:
        raise OvsimError(f"unknown schedule '{schedule}'; one of {', '.join(CUI_SCHEDULES)}", field="schedule")
    knobs = {"comm_priority": "high" if "priority" in schedule else "normal",
             "occupancy_shaping_smem_bytes": CUI_SHAPING_SMEM_BYTES[system] if "shaping" in schedule else 0}
    ops = [{"name": "gemm", "kind": "gemm", "m": 8192, "n": n, "k": 8192, "precision": "fp16", "stream": "compute",
            "tile": [64, 64, 32], "threads": 128, "registers_per_thread": 96, "stages": 3},
           {"name": "allreduce", "kind": "all_reduce", "size_bytes": 896e6, "stream": "comm"}]
    return Scenario.model_validate({
        "name": f"{system} gemm 8192x{n}x8192 {schedule}", "system": system,
        "schedule": "sequential" if schedule == "sequential" else "overlapped", "knobs": knobs,
        "streams": {"compute": 0, "comm": 0}, "ops": ops})


def cui_pericas(systems: Sequence[str] = CUI_SYSTEMS, n: int = 8192) -> pd.DataFrame:
    """One row per system and schedule at the GPUs' default power limit: iteration time and its
    change against naive overlap (%)."""
    rows = []
    for system in systems:
        limit = default_limit_w(system)
        ms = {s: predict(cui_pericas_scenario(system, s, n), counters=False,
                         power_cap_w=limit).summary()["makespan_s"] * 1e3 for s in CUI_SCHEDULES}
        rows += [{"system": system, "schedule": s, "iteration_ms": v,
                  "vs_naive_pct": (v / ms["naive overlap"] - 1) * 100} for s, v in ms.items()]
    return pd.DataFrame(rows)
