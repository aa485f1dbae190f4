"""The knobs a schedule search (:mod:`ovsim.tune`) varies: the default space a scenario leaves
open, a knob's value in a scenario, and space files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ovsim.api import build
from ovsim.errors import OvsimError
from ovsim.models.op_specs import CollectiveOpSpec
from ovsim.models.training_spec import heads_split_over
from ovsim.scenario import Scenario
from ovsim.tune_predictions import Objective

__all__ = ["default_space", "read_space", "value_at"]

# Candidate values of the default space's knobs (docs/tune.md says why these).
NCCL_CHANNELS = (2, 4, 8, 16, 32)
SM_CARVEOUTS = (8, 16, 32)
SHAPING_SMEM_BYTES = (32 * 1024, 64 * 1024, 100 * 1024)
BUCKET_MIB = (1, 5, 25, 100)
FSDP_PREFETCH = (0, 1, 2)
TP_CHUNKS = (2, 4, 8)
CAP_FRACTIONS = (0.9, 0.8, 0.7, 0.6)
CLOCK_FRACTIONS = (0.9, 0.8, 0.7)


def default_space(sc: Scenario, objective: Objective = "time") -> dict[str, list[Any]]:
    """The schedule knobs ``sc`` leaves open, each with its candidate values, the scenario's own
    value first. Power caps and locked clocks are searched only when energy counts: below the
    default limit a run can only be slower."""
    wl, system, gpu, _ = build(sc, sc.name)
    space: dict[str, list[Any]] = {}
    if any(op.kind == "collective" for op in wl.ops):
        space["schedule"] = ["overlapped", "sequential"]
        space["knobs.comm_priority"] = ["normal", "high"]
        space["knobs.nccl_channels"] = [None, *NCCL_CHANNELS]
        space["knobs.sm_carveout"] = [0, *(c for c in SM_CARVEOUTS if c < gpu.sm.count // 2)]
        space["knobs.occupancy_shaping_smem_bytes"] = [0, *(b for b in SHAPING_SMEM_BYTES if _builds(sc, b))]
        if _gathers(sc):
            space["knobs.ce_offload"] = [False, True]
    space.update(_training_space(sc, system.gpu_count, wl.total_ranks))
    if objective != "time":
        p, c = gpu.power, gpu.clocks
        space["power.cap_w"] = [None, *(round(p.tdp_w * f) for f in CAP_FRACTIONS
                                        if p.tdp_w * f >= p.min_power_limit_w)]
        space["power.sm_clock_hz"] = [None, *(round(c.max_sm_clock_hz * f, -6) for f in CLOCK_FRACTIONS
                                              if c.max_sm_clock_hz * f >= c.min_sm_clock_hz)]
    return {path: _given_first(sc, path, values) for path, values in space.items()}


def _builds(sc: Scenario, shaping_smem_bytes: int) -> bool:
    """Whether every kernel of ``sc`` still launches with this much shaping padding (a kernel's
    own shared memory plus the padding must fit the GPU's per-block limit)."""
    try:
        build(sc.model_copy(update={"knobs": sc.knobs.model_copy(
            update={"occupancy_shaping_smem_bytes": shaping_smem_bytes})}), sc.name)
    except OvsimError:
        return False
    return True


def _gathers(sc: Scenario) -> bool:
    """Whether the scenario runs collectives copy engines can carry (all-gathers, all-to-alls)."""
    if sc.training is not None:
        return sc.training.parallel.dp_mode == "fsdp"
    return any(isinstance(op, CollectiveOpSpec) and op.kind in ("all_gather", "all_to_all") for op in sc.ops)


def _training_space(sc: Scenario, gpus_per_node: int, n_ranks: int) -> dict[str, list[Any]]:
    if sc.training is None:
        return {}
    p = sc.training.parallel
    space: dict[str, list[Any]] = {}
    if p.pp > 1 and n_ranks > p.tp * p.cp * p.pp and p.tp * p.cp < gpus_per_node < n_ranks:
        # Only here do the orders differ: a node holds several replicas of one stage (Megatron-LM's
        # order) or several stages of one replica (Llama 3's), and so which traffic crosses nodes.
        space["training.parallel.rank_order"] = ["tp-cp-dp-pp", "tp-cp-pp-dp"]
    if p.tp > 1:
        space["training.parallel.tp_overlap"] = ["none", "chunked", "copy_engine"]
        # None is the TP degree: the same pieces as a value equal to it.
        space["training.parallel.tp_chunks"] = [None, *(c for c in TP_CHUNKS if c != p.tp)]
    if p.cp > 1:
        a2a = heads_split_over(sc.training.shape(), p.tp, p.cp)
        space["training.parallel.cp_comm"] = ["p2p", "all_gather", *(["a2a"] if a2a else [])]
    if p.dp_mode == "fsdp":
        space["training.parallel.fsdp_prefetch"] = list(FSDP_PREFETCH)
    elif p.dp != 1 or p.cp > 1:  # context-parallel ranks reduce gradients together too
        if p.overlap_grad_reduce:
            # Without overlap every gradient goes in one collective after backward: no buckets.
            space["training.parallel.bucket_bytes"] = [m * 2**20 for m in BUCKET_MIB]
        space["training.parallel.distributed_optimizer"] = [False, True]
        if p.overlap_grad_reduce:
            # Its gathers beside the forward need the distributed optimizer (tune_candidates.CONDITIONS).
            space["training.parallel.overlap_param_gather"] = [False, True]
    return space


def value_at(sc: Scenario, path: str) -> Any:
    """The scenario's value at a knob path, as ``ovsim sweep`` spells it (a list item by its index
    or name: ``ops.gemm.m``); None where the scenario leaves it out."""
    data: Any = sc.model_dump(mode="json", by_alias=True)
    for key in path.split("."):
        if isinstance(data, list):
            named = [it for it in data if isinstance(it, dict) and it.get("name") == key]
            data = named[0] if named else (data[int(key)] if key.isdigit() and int(key) < len(data) else None)
        elif isinstance(data, dict):
            data = data.get(key)
        else:
            return None
    return data


def _given_first(sc: Scenario, path: str, values: Sequence[Any]) -> list[Any]:
    given = value_at(sc, path)
    return [given, *(v for v in values if v != given)]


def read_space(path: str | Path) -> dict[str, list[Any]]:
    """A space file: a mapping of knob paths (as ``ovsim sweep`` spells them) to lists of values."""
    from ovsim.hw.spec import read_yaml

    data = read_yaml(Path(path))
    if not isinstance(data, dict) or not data:
        raise OvsimError("expected a mapping of knob paths to lists of values", source=str(path))
    for key, values in data.items():
        if isinstance(values, dict):
            # A nested mapping (knobs: {nccl_channels: [...]}) where a dotted path is wanted.
            first = next(iter(values), "name")
            raise OvsimError(f"expected a non-empty list of values; a space names each knob by its dotted path, "
                             f"e.g. {key}.{first}: [...]", source=str(path), field=str(key))
        if not isinstance(values, list) or not values:
            raise OvsimError("expected a non-empty list of values", source=str(path), field=str(key))
    return {str(k): list(v) for k, v in data.items()}
