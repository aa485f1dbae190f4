"""A training iteration's layer blocks copied from the first of their kind
(ovsim.models.training_blocks) and their ops made from their source's (ovsim.models.workload_copies).

The golden result is the iteration emitted and built spec by spec, as before copies existed: every
spec and every op must come out the same, and a build alone object for object as pickle sees it
(a schedule search digests pickled ops). Within the build memos, where ops of an earlier build are
taken and an op's description may be an earlier build's equal dict, the ops and their digests must
be the same."""

from __future__ import annotations

import copy
import pickle
from functools import cache, partial
from typing import Any

import pytest

from ovsim import api
from ovsim.errors import OvsimError
from ovsim.models import training, workload, workload_copies
from ovsim.models.build_memo import reusing_builds
from ovsim.models.op_specs import SpecCopy
from ovsim.models.workload import CollectiveOpSpec, GemmOp, MemoryOp, build_workload
from ovsim.scenario import Scenario, load_scenario
from ovsim.tune_predictions import _digest

SMALL = {"model": "gpt3-1.3b", "layers": 4, "micro_batch_size": 1, "micro_batches": 4, "precision": "bf16"}

JOBS: dict[str, dict[str, Any]] = {
    "fsdp": {"system": "a100x4", "training": {**SMALL, "parallel": {"dp_mode": "fsdp", "fsdp_prefetch": 1}}},
    "zero3": {"system": "a100x4", "training": {**SMALL, "parallel": {"dp_mode": "fsdp", "fsdp_impl": "zero3"}}},
    "ddp-buckets": {"system": "a100x4", "training": {**SMALL, "parallel": {"bucket_bytes": 4e6}}},
    "ddp-after-backward": {"system": "a100x4", "training": {**SMALL, "parallel": {"overlap_grad_reduce": False}}},
    "distributed-optimizer": {"system": "a100x4", "training": {
        **SMALL, "optimizer": "megatron", "loss": "megatron",
        "parallel": {"distributed_optimizer": True}}},
    "parameters-gathered-beside-the-forward": {"system": "hgx-h100", "training": {
        **SMALL, "layers": 8, "optimizer": "megatron", "parallel": {
            "pp": 2, "dp": 4, "pipeline": "interleaved", "virtual_stages": 2, "distributed_optimizer": True,
            "overlap_param_gather": True}}},
    "tp-sp-pp-1f1b": {"system": "hgx-h100", "training": {
        **SMALL, "parallel": {"tp": 2, "pp": 2, "sequence_parallel": True, "pipeline": "1f1b"}}},
    "interleaved-full-recompute": {"system": "hgx-h100", "training": {
        **SMALL, "layers": 8, "recompute": "full",
        "parallel": {"tp": 2, "pp": 2, "pipeline": "interleaved", "virtual_stages": 2}}},
    "gpipe-selective-unfused": {"system": "hgx-h100", "training": {
        **SMALL, "recompute": "selective", "attention": "unfused", "parallel": {"tp": 2, "pp": 2,
                                                                                     "pipeline": "gpipe"}}},
    "chunked-fp8": {"system": "hgx-h100", "training": {
        **SMALL, "precision": "fp8", "parallel": {"tp": 4, "sequence_parallel": True, "tp_overlap": "chunked",
                                                  "tp_chunks": 2}}},
    "copy-engine-tp": {"system": "hgx-h100", "training": {
        **SMALL, "parallel": {"tp": 4, "sequence_parallel": True, "tp_overlap": "copy_engine", "tp_chunks": 2}}},
    "every-rank": {"system": "hgx-h100", "knobs": {"rank_symmetry": False}, "training": {
        **SMALL, "parallel": {"tp": 2, "pp": 2, "pipeline": "1f1b"}}},
    "sequential": {"system": "hgx-h100", "schedule": "sequential", "training": {
        **SMALL, "parallel": {"tp": 2, "pp": 2, "pipeline": "interleaved", "virtual_stages": 2}}},
    "no-communication": {"system": "hgx-h100", "training": {
        **SMALL, "communication": False, "parallel": {"tp": 2, "pp": 2, "pipeline": "1f1b"}}},
    "two-nodes": {"system": "hgx-h100-ndr", "nodes": 2, "training": {
        **SMALL, "parallel": {"tp": 8, "pp": 2, "sequence_parallel": True}}},
}


def _built(sc: Scenario, monkeypatch: pytest.MonkeyPatch, copy_blocks: bool) -> tuple[training.TrainingOps, Any]:
    """The scenario's generated specs and workload, with layer blocks copied or each emitted."""
    made: list[training.TrainingOps] = []
    real = training.training_ops

    def spy(*args: Any, **kw: Any) -> training.TrainingOps:
        made.append(real(*args, **{**kw, "copy_blocks": copy_blocks}))
        return made[-1]

    with monkeypatch.context() as m:
        m.setattr(training, "training_ops", spy)
        wl = api.build(sc, sc.name)[0]
    return made[-1], wl


@pytest.mark.parametrize("name", sorted(JOBS))
def test_copied_blocks_make_the_specs_and_ops_emitted_ones_do(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = Scenario.model_validate({"name": name, **JOBS[name]})
    gen, wl = _built(sc, monkeypatch, copy_blocks=True)
    plain, wl_plain = _built(sc, monkeypatch, copy_blocks=False)
    assert gen.copies and not plain.copies
    assert len(gen.ops) == len(plain.ops)
    for copied, emitted in zip(gen.ops, plain.ops, strict=True):
        assert type(copied) is type(emitted)
        assert copied.__dict__ == emitted.__dict__
        assert copied.__pydantic_fields_set__ == emitted.__pydantic_fields_set__
    assert wl.ops == wl_plain.ops
    assert pickle.dumps(wl) == pickle.dumps(wl_plain)


def test_the_examples_come_out_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    for path in ("examples/training-gpt3-13b-pp4-1f1b-h100x4.yaml",
                 "examples/training-llama2-70b-tp8-chunked-hgx-h100.yaml"):
        sc = load_scenario(path)
        gen, wl = _built(sc, monkeypatch, copy_blocks=True)
        _, wl_plain = _built(sc, monkeypatch, copy_blocks=False)
        assert gen.copies, path
        assert pickle.dumps(wl) == pickle.dumps(wl_plain), path


def test_builds_within_the_memos_come_out_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """A search's builds one after another: another micro-batch count (another list, whose specs
    the last list's ops partly serve) and other knobs (the same list)."""
    job = JOBS["tp-sp-pp-1f1b"]
    variants = [{**job, "training": {**job["training"], "micro_batches": mbs}, "knobs": knobs}
                for mbs in (2, 3) for knobs in ({}, {"nccl_channels": 4}, {"sm_carveout": 8})]
    scenarios = [Scenario.model_validate({"name": "v", **v}) for v in variants]
    digests: dict[bool, list[tuple[Any, str]]] = {}
    for copy_blocks in (True, False):
        with monkeypatch.context() as m, training.reusing_training_ops(), reusing_builds():
            m.setattr(training, "training_ops", partial(training.training_ops, copy_blocks=copy_blocks))
            built = [api.build(sc, sc.name)[0] for sc in scenarios]
        digests[copy_blocks] = [(wl.ops, _digest(wl)) for wl in built]
    assert digests[True] == digests[False]


# A small op list: b0 and b1 are alike but for their names and what they follow.
def _specs(size_b1: float = 1e6, ranks_x1: list[int] | None = None) -> list[Any]:
    return [
        MemoryOp(name="x0", kind="elementwise", bytes=1e6, ranks=[0, 1]),
        MemoryOp(name="x1", kind="elementwise", bytes=1e6, ranks=ranks_x1 or [0, 1]),
        GemmOp(name="b0.g", kind="gemm", m=512, n=512, k=512, ranks=[0, 1], after=["x0"]),
        CollectiveOpSpec(name="b0.ar", kind="all_reduce", size_bytes=1e6, ranks=[0, 1], after=["b0.g"], stream="tp"),
        GemmOp(name="b1.g", kind="gemm", m=512, n=512, k=512, ranks=[0, 1], after=["x1"]),
        CollectiveOpSpec(name="b1.ar", kind="all_reduce", size_bytes=size_b1, ranks=[0, 1], after=["b1.g"],
                         stream="tp"),
    ]


@cache
def _machine() -> tuple[Any, Any, Any]:
    sc = Scenario.model_validate({"name": "t", "system": "h100x4", "ranks": 2,
                                  "ops": [{"name": "x", "kind": "elementwise", "bytes": 1e6}]})
    _, system, gpu, calib = api.build(sc, sc.name)
    return system, gpu, calib.params


def _build(specs: list[Any], copies: list[tuple[int, int, int]]) -> Any:
    system, gpu, params = _machine()
    return build_workload(specs, gpu=gpu, system=system, params=params, n_ranks=2, copies=copies)


# Each variant's specs expanded (not copied): x0, x1, b0's two, and b1's the copy cannot take.
EXPANDED = {"exact": 4, "another size": 5, "follows an op elsewhere": 5, "another class": 6}


def _variant(variant: str) -> list[Any]:
    """The small op list of a variant of :data:`EXPANDED`."""
    specs = {"exact": partial(_specs), "another size": partial(_specs, size_b1=2e6),
             "follows an op elsewhere": partial(_specs, ranks_x1=[1]), "another class": partial(_specs)}[variant]()
    if variant == "another class":  # b1.g, and so b1.ar that follows it, cannot be b0's
        specs[4] = MemoryOp(name="b1.g", kind="elementwise", bytes=1e6, ranks=[0, 1], after=["x1"])
    if variant == "follows an op elsewhere":  # b1.g then follows x1 on rank 1 alone
        specs[2] = GemmOp(name="b0.g", kind="gemm", m=512, n=512, k=512, ranks=[0, 1], after_any=["x0"])
        specs[4] = GemmOp(name="b1.g", kind="gemm", m=512, n=512, k=512, ranks=[0, 1], after_any=["x1"])
    return specs


def _expansions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the specs the builds expand from here on (rather than copy), in order."""
    expanded: list[str] = []
    real = workload._expand
    monkeypatch.setattr(workload, "_expand", lambda spec, *a: expanded.append(spec.name) or real(spec, *a))
    return expanded


@pytest.mark.parametrize("variant", sorted(EXPANDED))
def test_a_copy_is_taken_only_where_it_is_exact(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ops come out as built spec by spec whatever the copies claim; where the claim holds, they
    are made from the source's (ids, dependencies and the collective's flow renamed)."""
    specs = _variant(variant)
    plain = _build(specs, [])
    expanded = _expansions(monkeypatch)
    copied = _build(specs, [(4, 2, 2)])
    assert len(expanded) == EXPANDED[variant], expanded
    assert pickle.dumps(copied) == pickle.dumps(plain)
    ar = [op for op in copied.ops if op.name == "b1.ar"]
    assert [op.id for op in ar] == ["b1.ar@r0", "b1.ar@r1"]
    assert ar[0].flow is ar[1].flow and ar[0].flow.group == "b1.ar"
    assert [op.deps for op in ar] == [("b1.g@r0",), ("b1.g@r1",)]


def test_a_copy_must_follow_its_source() -> None:
    with pytest.raises(ValueError, match="does not follow"):
        _build(_specs(), [(2, 4, 2)])


def test_a_copy_of_an_unknown_dependency_is_refused_as_any_spec() -> None:
    specs = _specs()
    specs[4] = GemmOp(name="b1.g", kind="gemm", m=512, n=512, k=512, ranks=[0, 1], after_any=["nowhere"])
    with pytest.raises(OvsimError, match="unknown op 'nowhere'"):
        _build(specs, [(4, 2, 2)])


def _as_copies(specs: list[Any]) -> list[Any]:
    """``specs`` with b1's two as copies of b0's (SpecCopy): their own names and dependencies."""
    out = list(specs)
    for i in (4, 5):
        out[i] = SpecCopy(specs[i - 2], specs[i].name, specs[i].after, specs[i].after_any)
    return out


@pytest.mark.parametrize(("variant", "n_expanded"), [("exact", 4), ("follows an op elsewhere", 5)])
def test_copies_held_as_copies_build_as_the_specs_they_make(variant: str, n_expanded: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A copied spec held as a SpecCopy builds the ops its made spec does: copied from its
    source's where the copy is exact, else expanded from the spec it makes."""
    specs = _variant(variant)
    plain = _build(specs, [])
    expanded = _expansions(monkeypatch)
    held = _as_copies(specs)
    assert held[4].made() == specs[4] and held[5].made() == specs[5]
    assert pickle.dumps(_build(held, [(4, 2, 2)])) == pickle.dumps(plain)
    assert len(expanded) == n_expanded, expanded


def test_a_spec_copy_reads_its_sources_fields_but_not_its_dunders() -> None:
    source = _specs()[3]
    held = SpecCopy(source, "b1.ar", ["b1.g"], [])
    assert (held.name, held.after, held.size_bytes, held.stream, held.ranks) == ("b1.ar", ["b1.g"], 1e6, "tp", [0, 1])
    twin = copy.deepcopy(held)  # a copy of the SpecCopy, not its source's __deepcopy__
    assert isinstance(twin, SpecCopy) and twin.name == "b1.ar" and twin.made() == held.made()
    assert pickle.loads(pickle.dumps(held)).made() == held.made()
    for other in ("no_such_field", "model_dump"):  # a model method would answer with the source's name
        with pytest.raises(AttributeError):
            getattr(held, other)


def test_an_iteration_holds_its_copies_as_copies() -> None:
    gen = training.training_ops(Scenario.model_validate({"name": "j", **JOBS["tp-sp-pp-1f1b"]}).training, 4)
    held = [i for i, s in enumerate(gen.specs) if isinstance(s, SpecCopy)]
    assert held and held == [i for first, _, count in gen.copies for i in range(first, first + count)]
    assert gen.ops is gen.ops  # made once: a search's builds compare the specs by identity
    assert not any(isinstance(s, SpecCopy) for s in gen.ops)


@pytest.mark.parametrize(("variant", "n_expanded"), [
    ("holds another spec", 5),  # b1.ar holds an all-reduce of another size: b1.g alone is copied
    ("follows another inside", 5),  # b1.ar follows x1, where b0.ar follows b0.g, the block's own
])
def test_a_block_that_is_not_an_exact_copy_goes_spec_by_spec(variant: str, n_expanded: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A block whose copy differs from its source in one spec is not made by the source block's
    template: each spec is copied where it alone is exact, the rest expanded, as built spec by spec."""
    specs = _specs()
    held = _as_copies(specs)
    if variant == "holds another spec":
        other = CollectiveOpSpec(name="o", kind="all_reduce", size_bytes=2e6, ranks=[0, 1], stream="tp")
        specs[5] = CollectiveOpSpec(name="b1.ar", kind="all_reduce", size_bytes=2e6, ranks=[0, 1], after=["b1.g"],
                                    stream="tp")
        held[5] = SpecCopy(other, "b1.ar", ["b1.g"], [])
    else:
        specs[5] = CollectiveOpSpec(name="b1.ar", kind="all_reduce", size_bytes=1e6, ranks=[0, 1], after=["x1"],
                                    stream="tp")
        held[5] = SpecCopy(specs[3], "b1.ar", ["x1"], [])
    plain = _build(specs, [])
    expanded = _expansions(monkeypatch)
    assert pickle.dumps(_build(held, [(4, 2, 2)])) == pickle.dumps(plain)
    assert len(expanded) == n_expanded and expanded[-1] == "b1.ar", expanded


def test_an_iterations_blocks_are_made_by_their_sources_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every copied block of a training iteration is made whole from its source block's template
    (a call a block, not a spec: the build's cost), none spec by spec."""
    sc = Scenario.model_validate({"name": "j", **JOBS["interleaved-full-recompute"]})
    blocks: list[bool] = []
    real = workload_copies.OpCopier._block
    monkeypatch.setattr(workload_copies.OpCopier, "_block",
                        lambda self, *a: blocks.append(real(self, *a)) or blocks[-1])
    spec_by_spec = _counted(monkeypatch, workload_copies, "_renamed_ops")
    gen, _ = _built(sc, monkeypatch, copy_blocks=True)
    assert blocks and all(blocks) and len(blocks) == len(gen.copies)
    assert spec_by_spec == []


def _counted(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[object]:
    """The calls to ``module.name`` from here on."""
    calls: list[object] = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: calls.append(a) or real(*a))
    return calls
