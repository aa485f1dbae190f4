"""The op specs a scenario lists (a GEMM shape, an all-reduce size...) and the schedule knobs,
as validated input; :mod:`ovsim.models.workload` turns them into the per-rank workload.

An op spec names its kind and parameters, the stream it goes on, the ranks that run it and the ops
it must follow (``after``, by name, on the same rank).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from ovsim.hw.inputs import InputModel
from ovsim.hw.spec import AttentionImplementation, Precision
from ovsim.models import nccl_params

# A stream's name; "" would be a stream no table can show.
StreamName = Annotated[str, Field(min_length=1)]
# A negative zero is zero: equal specs then make ops equal bit for bit (a workload's digest pickles
# the floats an op copies from its spec, and -0.0 == 0.0 let a build take one for the other).
NonNegativeFloat = Annotated[float, Field(ge=0), AfterValidator(lambda v: v + 0.0)]
# The streams FSDP's copies run on beside the compute stream: its post-backward work (PyTorch FSDP's
# post-backward stream, DeepSpeed's reduce-and-partition stream), whose kernels wait for the backward
# that made the gradients rather than for the all-gathers queued before them; and
# DeepSpeed's all-gather stream, where gathered parameters are copied out. A framework makes them on
# its own, so a scenario's stream priorities need not name them.
FSDP_POST_STREAM = "dp_post"
FSDP_GATHER_STREAM = "dp_gather"
FRAMEWORK_STREAMS = frozenset({FSDP_POST_STREAM, FSDP_GATHER_STREAM})


class _OpBase(InputModel):
    # .nan and .inf are refused: an infinite delay or size would never finish simulating.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    stream: StreamName = "compute"
    # "all", or the list of ranks that run this op (for a collective: its group); an empty list
    # would drop the op without a word.
    ranks: Literal["all"] | Annotated[list[NonNegativeInt], Field(min_length=1)] = "all"
    after: list[str] = Field(default_factory=list)
    # Like ``after``, but each name binds only on the ranks where that op runs (a send waits for
    # the sender's compute, its receive for the receiver's); a name that runs on none of this op's
    # ranks is an error.
    after_any: list[str] = Field(default_factory=list)
    # Host-side gap before launch once the op is ready.
    delay_s: NonNegativeFloat = 0.0
    repeat: PositiveInt = 1


_Spec = TypeVar("_Spec", bound=_OpBase)
# Pydantic's record of the fields given, shared by generated specs of one kind given the same fields.
_FIELDS_SETS: dict[tuple[type, frozenset[str]], set[str]] = {}


def generated(spec: _Spec) -> _Spec:
    """``spec``, made by one of ovsim's generators (a training iteration makes hundreds of thousands
    of specs, all held while its workload is built), with pydantic's record of the fields given
    shared among the specs of its kind given the same fields: 728 of a spec's 1,560 bytes. Sharing
    is safe on frozen models: pydantic adds to the record only on assignment, which they refuse,
    and copies it before it changes a copy's."""
    fields_set = spec.__pydantic_fields_set__
    key = (type(spec), frozenset(fields_set))
    shared = _FIELDS_SETS.setdefault(key, fields_set)
    if shared is not fields_set:
        object.__setattr__(spec, "__pydantic_fields_set__", shared)
    return spec



# Validated generated specs by their class and fields but name and dependencies, each the
# template of the specs made like it (a training iteration repeats each layer's ops over layers
# and micro-batches). One generator's, for as long as it makes specs.
Templates = dict[tuple[object, ...], "_OpBase"]
# Bound once: _copied() sets four slots on each of a training iteration's 100,000s of specs, each
# through its own descriptor (object.__setattr__ looks each up by name: renamed() took 1.5 us, now 1.1).
_new_object = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def made(templates: Templates, cls: type[_Spec], name: str, deps: dict[str, list[str]], ranks: list[int],
         **fields: Any) -> _Spec:
    """A generated spec of ``cls`` named ``name`` on ``ranks`` following ``deps`` (``after``
    and/or ``after_any``), as ``generated(cls(name=name, ranks=ranks, **deps, **fields))`` would
    make it. The first spec of its kind and fields is validated and kept in ``templates``; the
    rest copy its validated fields and set their own name and dependencies, which ovsim's
    generators make (a name is never empty, a dependency a name): validation is most of a
    generated spec's cost, 3.6 million of them in a Llama 3 405B iteration without rank
    symmetry."""
    key = (cls, tuple(deps), tuple(ranks), tuple(fields.items()))
    try:
        template = templates.get(key)
    except TypeError:  # a field of unhashable value: validated each time
        return generated(cls(name=name, ranks=ranks, **deps, **fields))
    if template is None:
        spec = generated(cls(name=name, ranks=ranks, **deps, **fields))
        templates[key] = spec
        return spec
    return _copied(cls, template, {**template.__dict__, "name": name, **deps})


def renamed(spec: _Spec, name: str, after: list[str], after_any: list[str]) -> _Spec:
    """A copy of the generated ``spec`` named ``name`` following ``after`` and ``after_any``, as
    :func:`made` makes it from the same fields (from ``spec``'s validated fields instead of a
    template's): a training iteration's layer blocks repeated over layers and micro-batches are
    copied whole (:mod:`ovsim.models.training_blocks`)."""
    return _copied(type(spec), spec, {**spec.__dict__, "name": name, "after": after, "after_any": after_any})


class SpecCopy:
    """A spec that copies ``source`` (a generated spec) but for its ``name`` and dependencies,
    before it is made: a training iteration's copied layer blocks hold one per spec
    (:mod:`ovsim.models.training_blocks`), which a build turns into ops from its source's without
    making the spec (:func:`ovsim.models.workload.build_workload`). About 200 bytes with its name,
    where a made spec takes about 650 (its fields' dict): 2 GB of Megatron-LM's 1T row. Any other
    field reads as its source's (nothing else: no model method); :meth:`made` makes the spec
    :func:`renamed` would."""

    __slots__ = ("after", "after_any", "name", "source")

    def __init__(self, source: _OpBase, name: str, after: list[str], after_any: list[str]) -> None:
        self.source = source
        self.name = name
        self.after = after
        self.after_any = after_any

    def __getattr__(self, field: str) -> Any:
        # Only the spec's fields: a method (model_dump) would answer with the source's name, and a
        # dunder (copy's __deepcopy__, pickle's) is the object's own.
        if field.startswith("__") or field in SpecCopy.__slots__ or field not in type(self.source).model_fields:
            raise AttributeError(field)
        return getattr(self.source, field)

    def made(self) -> _OpBase:
        """The spec itself, as :func:`renamed` makes it."""
        return renamed(self.source, self.name, self.after, self.after_any)


def spec_of(spec: _OpBase | SpecCopy) -> _OpBase:
    """``spec`` made, where it is a :class:`SpecCopy`."""
    return spec.made() if isinstance(spec, SpecCopy) else spec


def base_spec(spec: _OpBase | SpecCopy) -> _OpBase:
    """The spec whose fields ``spec`` holds but for its name and dependencies: its source, where it
    is a :class:`SpecCopy`."""
    return spec.source if isinstance(spec, SpecCopy) else spec


def _copied(cls: type[_Spec], source: _OpBase, fields: dict[str, Any]) -> _Spec:
    """A spec of ``cls`` (``source``'s class) holding ``fields``, validated ones (``source``'s, a
    name and dependencies changed): what pydantic's model_construct sets, without its pass over
    the fields' defaults (``source``'s values hold them), and ``source``'s record of the fields
    given."""
    spec = _new_object(cls)
    _set_dict(spec, fields)
    _set_fields_set(spec, source.__pydantic_fields_set__)
    _set_extra(spec, None)
    _set_private(spec, None)
    return spec


# A GemmOp's fields that describe its kernel's block (cost.gemm's arguments), and all the fields
# given only with a tile.
GEMM_BLOCK_FIELDS = ("threads", "registers_per_thread", "stages")
GEMM_TILE_FIELDS = (*GEMM_BLOCK_FIELDS, "efficiency")


class GemmOp(_OpBase):
    kind: Literal["gemm"]
    m: PositiveInt
    n: PositiveInt
    k: PositiveInt
    precision: Precision = "bf16"
    # None: the fastest of the library kernels ovsim knows (ovsim.models.gemm_library.best_gemm), as a
    # library's heuristic picks one; the block fields then stay unset. With a tile, the block
    # fields not given take ovsim.models.cost.gemm's defaults (256 threads, 128 registers per
    # thread, 3 stages).
    tile: tuple[PositiveInt, PositiveInt, PositiveInt] | None = None
    threads: PositiveInt | None = None
    registers_per_thread: PositiveInt | None = None
    stages: PositiveInt | None = None
    # Your kernel's main-loop share of the tensor peak; None: the calibration's own_gemm_efficiency
    # (a plain WMMA kernel, measured); "library": the library's (a cuBLAS or CUTLASS kernel of this tile).
    efficiency: Annotated[float, Field(gt=0, le=1)] | Literal["library"] | None = None
    batch: PositiveInt = 1
    # None: without a tile, the library's choice among ovsim.models.gemm_library.LIBRARY_SPLITS_K; with a
    # tile, no split.
    split_k: PositiveInt | None = None

    @model_validator(mode="after")
    def _block_needs_tile(self) -> GemmOp:
        given = [f for f in GEMM_TILE_FIELDS if getattr(self, f) is not None]
        if self.tile is None and given:
            raise ValueError(f"{given[0]} describes a kernel of your own: give its tile too (without one, the "
                             "library kernel is chosen whole)")
        return self


# The precisions the named attention kernels run in.
SIXTEEN_BIT = ("fp16", "bf16")


class AttentionOp(_OpBase):
    kind: Literal["attention"]
    batch: PositiveInt
    heads: PositiveInt
    seq_len: PositiveInt
    head_dim: PositiveInt
    # The keys' length where it is not the queries' (seq_len): a context-parallel rank's queries
    # against the whole gathered sequence. Causal, half the seq_len x kv_len products are masked
    # either way: a context-parallel rank's two chunks of 2 x cp do half together.
    kv_len: PositiveInt | None = None
    precision: Precision = "bf16"
    causal: bool = True
    backward: bool = False
    # None: a fused kernel at the calibration's attention_efficiency.
    implementation: AttentionImplementation | None = None
    # A later step of ring attention (context parallelism, ovsim.models.training_cp): these
    # seq_len queries against kv_len keys on some ranks, twice the queries against half the keys
    # on the others (the same products); the ring's step runs at the slower one's pace, and so is
    # priced.
    ring_step: bool = False

    @model_validator(mode="after")
    def _named_kernels_run_in_16_bits(self) -> AttentionOp:
        if self.implementation is not None and self.precision not in SIXTEEN_BIT:
            raise ValueError(f"{self.implementation} runs in fp16 or bf16, not {self.precision}")
        if self.ring_step and (self.causal or self.kv_len is None or self.kv_len % 2):
            raise ValueError("a ring step is unmasked and names an even kv_len (half of it is the other shape's keys)")
        return self


class MemoryOp(_OpBase):
    kind: Literal["elementwise", "norm", "softmax"]
    bytes: PositiveFloat
    flops: NonNegativeFloat = 0.0
    threads: PositiveInt = 256
    blocks: PositiveInt | None = None
    # A grid-stride kernel (fused norms, multi-tensor optimizers): one full wave of blocks loops
    # over the data, instead of one block per few thousand elements.
    grid_stride: bool = False


class KernelOp(_OpBase):
    """A kernel known by its launch configuration (as traces and ncu report it)."""

    kind: Literal["kernel"]
    grid: PositiveInt
    threads: PositiveInt
    registers_per_thread: NonNegativeInt = 32
    shared_mem_bytes: NonNegativeInt = 0
    flops: NonNegativeFloat = 0.0
    hbm_bytes: NonNegativeFloat = 0.0
    precision: Precision = "fp32"
    duration_s: PositiveFloat | None = None
    # The share of its time alone it waits on memory, for HBM's latency law (docs/design.md). None:
    # all of it if memory-bound, none if compute-bound.
    memory_wait: Annotated[float, Field(ge=0, le=1)] | None = None


# ring_exchange: every member sends size_bytes to the next member of its group and receives as many
# from the one before, at once (NCCL's sends and receives grouped; a ring attention step).
CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
                         "ring_exchange"]


class CollectiveOpSpec(_OpBase):
    kind: CollectiveKind
    stream: StreamName = "comm"
    # Bytes as nccl-tests counts them (for all_gather / reduce_scatter the whole gathered buffer).
    size_bytes: PositiveFloat
    algorithm: nccl_params.Algorithm | None = None
    protocol: nccl_params.Protocol | None = None
    channels: PositiveInt | None = None
    # "sm": NCCL kernels; "copy_engine": NCCL's copy-engine collectives (all_gather, all_to_all only).
    engine: Literal["sm", "copy_engine"] = "sm"


class SendRecvOp(_OpBase):
    kind: Literal["send_recv"]
    stream: StreamName = "comm"
    size_bytes: PositiveFloat
    src: NonNegativeInt
    dst: NonNegativeInt
    channels: PositiveInt | None = None


class CopyOp(_OpBase):
    """A cudaMemcpyAsync on a copy engine: device-local, to or from the host, or to a peer GPU."""

    kind: Literal["copy"]
    stream: StreamName = "copy"
    size_bytes: PositiveFloat
    direction: Literal["d2d", "h2d", "d2h", "peer"] = "d2d"
    peer: NonNegativeInt | None = None


class DelayOp(_OpBase):
    kind: Literal["delay"]
    duration_s: PositiveFloat


OpSpec = Annotated[
    GemmOp | AttentionOp | MemoryOp | KernelOp | CollectiveOpSpec | SendRecvOp | CopyOp | DelayOp,
    Field(discriminator="kind"),
]


class Knobs(InputModel):
    """Schedule knobs (docs/scenario.md): stream priority as CUDA's cudaStreamCreateWithPriority, occupancy
    shaping as Cui & Pericas (arXiv 2606.09200), NCCL_MIN/MAX_CTAS, SM carve-outs, copy-engine offload."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # "high" gives every stream that carries communication a higher priority than compute streams.
    comm_priority: Literal["normal", "high"] = "normal"
    # Extra dynamic shared memory per compute block, to cap its residency per SM.
    occupancy_shaping_smem_bytes: NonNegativeInt = 0
    # NCCL channel (CTA) count for every SM collective, like NCCL_MIN_CTAS = NCCL_MAX_CTAS.
    nccl_channels: PositiveInt | None = None
    # SMs kept free of compute kernels for communication (green contexts, cuBLASLt SM_COUNT_TARGET).
    sm_carveout: NonNegativeInt = 0
    # Run all-gathers (and all-to-alls) on copy engines instead of SMs.
    ce_offload: bool = False
    # A training iteration's data-parallel replicas, and a tensor-parallel group's ranks, run the
    # same ops: simulate one and stand it for all (docs/design.md, "Rank symmetry"); false: every rank.
    rank_symmetry: bool = True


Schedule = Literal["overlapped", "sequential"]

COMPUTE_KINDS = {"gemm", "attention", "elementwise", "norm", "softmax", "kernel"}
