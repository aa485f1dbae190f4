"""Scenario files: a workload on a system under a schedule, validated by pydantic.

See docs/scenario.md for the schema with examples. In short::

    schema: ovsim.scenario/1
    name: gemm-allreduce
    system: a100x4                 # a system spec name or path, or an inline mapping
    ranks: 4                       # optional: use fewer GPUs than the system has
    mode: simulate                 # or analytic
    schedule: overlapped           # or sequential
    knobs: {comm_priority: high, occupancy_shaping_smem_bytes: 65536}
    streams: {compute: 0, comm: 0} # CUDA priorities, lower is higher
    calibration: []                # extra calibration files, applied after the shipped ones
    ops:
      - {name: gemm, kind: gemm, m: 8192, n: 8192, k: 8192, precision: fp16}
      - {name: ar, kind: all_reduce, size_bytes: 896e6}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError, model_validator

from ovsim.errors import OvsimError
from ovsim.hw.inputs import InputModel
from ovsim.hw.power import PowerSettings
from ovsim.hw.spec import NetworkSpec, SystemSpec, read_yaml
from ovsim.hw.validation import validation_error
from ovsim.models.op_specs import Knobs, OpSpec, Schedule
from ovsim.models.training_spec import TrainingSpec

Mode = Literal["simulate", "analytic"]
MODES: tuple[Mode, ...] = ("simulate", "analytic")


def check_mode(mode: object) -> None:
    """Refuse a fidelity other than the two (None: the scenario's own), as the CLI's --mode does."""
    if mode is not None and mode not in MODES:
        raise OvsimError(f"unknown mode {mode!r}; expected 'simulate' or 'analytic'", field="mode")


class InlineSystem(InputModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    gpu: str
    gpu_count: PositiveInt
    topology: Literal["nvswitch", "mesh", "pcie"] = "nvswitch"
    links_per_pair: NonNegativeInt = 0
    nccl_ring_channels: PositiveInt | None = None
    nvls: bool = False
    nodes: PositiveInt = 1
    network: NetworkSpec | None = None

    def to_spec(self) -> SystemSpec:
        name = f"{self.gpu_count}x {self.gpu}" if self.nodes == 1 else f"{self.nodes}x {self.gpu_count}x {self.gpu}"
        return SystemSpec.model_validate({
            "schema": "ovsim.system/1", "name": name, **self.model_dump(),
            "sources": {"topology": "given inline by the scenario"},
        })


class Scenario(InputModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)

    schema_id: Literal["ovsim.scenario/1"] = Field(default="ovsim.scenario/1", alias="schema")
    name: str = "scenario"
    description: str = ""
    system: str | InlineSystem
    # How many of the system's nodes run the scenario (a system with a network); absent: the system's own count.
    nodes: PositiveInt | None = None
    ranks: PositiveInt | None = None
    mode: Mode = "simulate"
    schedule: Schedule = "overlapped"
    knobs: Knobs = Field(default_factory=Knobs)
    streams: dict[str, int] = Field(default_factory=dict)
    calibration: list[str] = Field(default_factory=list)
    # Board power limit and locked SM clock (docs/power.md); absent: the power-limit loop at the
    # GPU's default limit.
    power: PowerSettings | None = None
    # Either a list of ops or a training iteration (docs/training.md), not both.
    ops: list[OpSpec] = Field(default_factory=list)
    training: TrainingSpec | None = None

    @model_validator(mode="after")
    def _one_workload(self) -> Scenario:
        if self.training is None and not self.ops:
            raise ValueError("give ops (a list of at least one op) or training")
        if self.training is not None and self.ops:
            raise ValueError("give ops or training, not both")
        return self


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; any problem is a one-line OvsimError naming file and field."""
    p = Path(path)
    data = read_yaml(p)
    if isinstance(data, dict) and "traceEvents" in data:
        raise OvsimError("a trace (it has traceEvents), not a scenario; replay it with `ovsim replay`", source=str(p))
    if not isinstance(data, dict):
        raise OvsimError("expected a mapping at the top level", source=str(p))
    try:
        return scenario_from_mapping(data, p)
    except ValidationError as e:
        raise scenario_error(e, str(p), data) from None


def scenario_error(e: ValidationError, source: str, data: dict[str, Any]) -> OvsimError:
    """A scenario's validation error in one line, an op's field named as ``--axis`` names it: by
    the op's name (``ops.allreduce.size_bytes``, where pydantic says
    ``ops.1.all_reduce.size_bytes``: its position and the kind it took it for), or by its position
    where the name would not do (``ops.1.size_bytes``)."""
    err = validation_error(e, source, Scenario)
    parts = err.field.split(".")
    ops = data.get("ops")
    if len(parts) < 2 or parts[0] != "ops" or not parts[1].isdigit() or not isinstance(ops, list):
        return err
    i = int(parts[1])
    op = ops[i] if i < len(ops) else None
    rest = parts[2:]
    if rest and isinstance(op, dict) and rest[0] == op.get("kind"):
        rest = rest[1:]
    name = op.get("name") if isinstance(op, dict) else None
    # A name the axis syntax would read otherwise (a position, a path, a value), or that another op
    # has too, gives way to the position.
    if (not isinstance(name, str) or not name or name.lstrip("-").isdigit() or any(c in name for c in ".=,")
            or sum(1 for o in ops if isinstance(o, dict) and o.get("name") == name) != 1):
        name = str(i)
    return OvsimError(err.message, source=err.source, field=".".join(["ops", name, *rest]))


def scenario_from_mapping(data: dict[str, Any], path: Path) -> Scenario:
    """A scenario from a file's parsed mapping (raises pydantic's ValidationError): relative
    calibration paths are relative to the file."""
    sc = Scenario.model_validate(data)
    cal = [str((path.parent / c) if not Path(c).is_absolute() else Path(c)) for c in sc.calibration]
    return sc.model_copy(update={"calibration": cal})
