"""The build's shortcuts give what the plain path gives: an op's info is its spec's dump, a
collective's parts made once per spec and members are the parts made afresh, and a boolean is
refused wherever a number is expected (a field, a list's item, a mapping's value)."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import load_gpu, load_system
from ovsim.models.op_prices import collective_parts
from ovsim.models.op_specs import (
    AttentionOp,
    CollectiveOpSpec,
    CopyOp,
    DelayOp,
    GemmOp,
    KernelOp,
    Knobs,
    MemoryOp,
    SendRecvOp,
    generated,
)
from ovsim.models.workload import _shared_info, build_workload
from ovsim.scenario import Scenario

GPU = load_gpu("h100-sxm5-80gb")
SYSTEM = load_system("hgx-h100")
PARAMS = load_calibration(GPU, "h100-sxm5-80gb").params
PLACEMENT = {"name", "stream", "ranks", "after", "after_any", "delay_s", "repeat"}


def test_an_ops_info_is_its_specs_dump_without_the_placement() -> None:
    specs = [
        GemmOp(name="g", kind="gemm", m=64, n=128, k=256, tile=(64, 64, 32), threads=128, stages=3, efficiency=0.5,
               ranks=[0, 1], after=["x"], delay_s=1e-6, repeat=2),
        AttentionOp(name="a", kind="attention", batch=2, heads=4, seq_len=128, head_dim=64, causal=False),
        MemoryOp(name="m", kind="norm", bytes=1e6, blocks=8, grid_stride=True),
        KernelOp(name="k", kind="kernel", grid=4, threads=128, duration_s=1e-5, memory_wait=0.5),
        CollectiveOpSpec(name="c", kind="all_gather", size_bytes=1e6, protocol="ll128", channels=4),
        SendRecvOp(name="s", kind="send_recv", size_bytes=1e6, src=0, dst=1),
        CopyOp(name="cp", kind="copy", size_bytes=1e6, direction="d2d"),
        DelayOp(name="d", kind="delay", duration_s=1e-6),
    ]
    for spec in specs:
        info, _ = _shared_info(spec, {})
        assert info == spec.model_dump(exclude=PLACEMENT)
        assert list(info) == list(spec.model_dump(exclude=PLACEMENT))  # and in field order


def test_collectives_alike_but_for_name_share_parts_with_their_own_flow() -> None:
    ops = [
        CollectiveOpSpec(name="ar0", kind="all_reduce", size_bytes=1e8, ranks=[0, 1, 2, 3]),
        CollectiveOpSpec(name="ar1", kind="all_reduce", size_bytes=1e8, ranks=[0, 1, 2, 3], after=["ar0"]),
        CollectiveOpSpec(name="ar2", kind="all_reduce", size_bytes=1e8, ranks=[4, 5, 6, 7]),
        CollectiveOpSpec(name="ar3", kind="all_reduce", size_bytes=2e8, ranks=[0, 1, 2, 3], after=["ar1"]),
        CollectiveOpSpec(name="ag", kind="all_gather", size_bytes=1e8, ranks=[0, 1, 2, 3], after=["ar3"]),
        SendRecvOp(name="p0", kind="send_recv", size_bytes=1e6, src=0, dst=5),
        SendRecvOp(name="p1", kind="send_recv", size_bytes=1e6, src=0, dst=5, after=["p0"]),
        CollectiveOpSpec(name="rep", kind="all_reduce", size_bytes=1e8, ranks=[0, 1, 2, 3], repeat=2, after=["ag"]),
    ]
    wl = build_workload(ops, gpu=GPU, system=SYSTEM, params=PARAMS, n_ranks=8)
    by_spec = {s.name: s for s in ops}
    for op in wl.ops:
        spec = by_spec[op.name.split("#")[0]]
        members = [spec.src, spec.dst] if isinstance(spec, SendRecvOp) else list(spec.ranks)  # type: ignore[arg-type]
        kernel, flow, kind = collective_parts(spec, op.name, members, GPU, SYSTEM, PARAMS, Knobs())[op.rank]
        assert (op.kernel, op.flow, op.kind) == (kernel, flow, kind)
    groups = {op.name: op.flow.group for op in wl.ops if op.flow is not None}
    names = [n for n in by_spec if n != "rep"] + ["rep#0", "rep#1"]
    assert groups == {name: name for name in names}


@pytest.mark.parametrize(("field", "value", "named"), [
    ("m", True, "m"),
    ("tile", [64, True, 32], "tile.1"),
    ("ranks", [0, False], "ranks.1"),
    ("efficiency", True, "efficiency"),  # a number or "library": pydantic alone read true as 1.0
])
def test_a_boolean_is_refused_where_a_number_is_expected(field: str, value: object, named: str) -> None:
    fields: dict[str, object] = {"name": "g", "kind": "gemm", "m": 64, "n": 64, "k": 64, "tile": (64, 64, 32),
                                 field: value}
    with pytest.raises(ValidationError, match=re.escape(f"{named}: a number is expected")):
        GemmOp(**fields)  # type: ignore[arg-type]


def test_a_boolean_stream_priority_is_refused() -> None:
    base = {"name": "s", "system": "hgx-h100", "ops": [{"name": "g", "kind": "gemm", "m": 64, "n": 64, "k": 64}]}
    with pytest.raises(ValidationError, match=re.escape("streams.compute: a number is expected")):
        Scenario.model_validate({**base, "streams": {"compute": True}})


def test_made_once_parts_follow_rank_symmetry_and_the_nodes_their_members_span() -> None:
    """Parts made once per spec and members are the parts the plain path makes: under rank symmetry
    (narrowed to the simulated ranks, priced for the whole group), and with copy-engine offload,
    which takes a collective within a node and leaves one across nodes on NCCL's kernels."""
    from ovsim.models.workload import _simulated_parts

    two_nodes = load_system("hgx-h100-ndr").model_copy(update={"nodes": 2})
    gpu = load_gpu(two_nodes.gpu)
    params = load_calibration(gpu, "h100-sxm5-80gb").params
    knobs = Knobs(ce_offload=True)
    ops = [
        CollectiveOpSpec(name="in0", kind="all_gather", size_bytes=1e8, ranks=[0, 1, 2, 3]),
        CollectiveOpSpec(name="in1", kind="all_gather", size_bytes=1e8, ranks=[0, 1, 2, 3], after=["in0"]),
        CollectiveOpSpec(name="across", kind="all_gather", size_bytes=1e8, ranks=[0, 1, 8, 9], after=["in1"]),
        CollectiveOpSpec(name="dp", kind="all_reduce", size_bytes=1e8, ranks=list(range(16))),
    ]
    sim = {r: j for j, r in enumerate(range(8))}
    wl = build_workload(ops, gpu=gpu, system=two_nodes, params=params, n_ranks=16, knobs=knobs,
                        simulated=list(range(8)), stand_offsets=[0, 8])
    by_spec = {s.name: s for s in ops}
    for op in wl.ops:
        spec = by_spec[op.name]
        assert isinstance(spec, CollectiveOpSpec) and isinstance(spec.ranks, list)
        members = list(spec.ranks)
        parts = collective_parts(spec, op.name, members, gpu, two_nodes, params, knobs)
        plain = _simulated_parts(parts, sim, spec.name)
        assert (op.kernel, op.flow, op.kind) == plain[next(r for r in plain if sim[r] == op.rank)]
    flows = {op.name: op.flow for op in wl.ops}
    assert flows["in0"].uses_copy_engine and flows["in1"].uses_copy_engine  # type: ignore[union-attr]
    assert not flows["across"].uses_copy_engine  # type: ignore[union-attr]
    assert flows["dp"].group_size == 16 and len(flows["dp"].ranks) == 8  # type: ignore[union-attr]


def test_ops_of_alike_specs_share_one_info_and_others_keep_their_own() -> None:
    # A layer's GEMM in every layer and micro-batch: one info dict for all (the build's memory).
    specs = [GemmOp(name=f"g{i}", kind="gemm", m=64, n=128, k=256, after=[f"g{i - 1}"] if i else [])
             for i in range(3)]
    specs.append(GemmOp(name="other", kind="gemm", m=64, n=128, k=512, after=["g2"]))
    wl = build_workload(specs, gpu=GPU, system=SYSTEM, params=PARAMS, n_ranks=2)
    by_name = {}
    for op in wl.ops:
        by_name.setdefault(op.name, []).append(op)
    alike = [op.info for name in ("g0", "g1", "g2") for op in by_name[name]]
    assert all(info is alike[0] for info in alike)
    assert alike[0] == specs[0].model_dump(exclude=PLACEMENT)
    assert by_name["other"][0].info == specs[3].model_dump(exclude=PLACEMENT) and by_name["other"][0].info["k"] == 512


def test_generated_specs_share_their_fields_record_and_behave_as_made() -> None:
    made = [GemmOp(name=f"g{i}", kind="gemm", m=64, n=128, k=256, ranks=[0, 1]) for i in range(3)]
    shared = [generated(GemmOp(name=f"g{i}", kind="gemm", m=64, n=128, k=256, ranks=[0, 1])) for i in range(3)]
    assert shared == made
    assert all(s.__pydantic_fields_set__ is shared[0].__pydantic_fields_set__ for s in shared)
    assert [s.model_dump(exclude_unset=True) for s in shared] == [m.model_dump(exclude_unset=True) for m in made]
    # A copy with a change records it on its own: the siblings keep theirs.
    copy = shared[0].model_copy(update={"split_k": 2})
    assert "split_k" in copy.model_fields_set and "split_k" not in shared[1].model_fields_set
    with pytest.raises(ValidationError):
        shared[1].m = 8  # frozen: the shared record is never added to
    assert shared[1].model_fields_set == made[1].model_fields_set


def test_specs_made_from_a_template_are_the_specs_validation_makes() -> None:
    """made() validates the first spec of each kind and fields and copies it for the rest: each
    copy equals the spec pydantic validates from the same arguments, fields given included, and
    differs from its template only in name and dependencies."""
    from ovsim.models.op_specs import Templates, made

    templates: Templates = {}
    args = {"kind": "gemm", "m": 64, "n": 128, "k": 256, "stream": "compute"}
    first = made(templates, GemmOp, "g0", {"after_any": []}, [0, 1], **args)
    second = made(templates, GemmOp, "g1", {"after_any": ["g0"]}, [0, 1], **args)
    assert len(templates) == 1
    for spec, name, deps in ((first, "g0", []), (second, "g1", ["g0"])):
        fresh = GemmOp(name=name, ranks=[0, 1], after_any=deps, **args)
        assert spec == fresh
        assert spec.__pydantic_fields_set__ == fresh.__pydantic_fields_set__
    assert second.ranks == first.ranks and second.name == "g1" and second.after_any == ["g0"]
    # Other ranks, fields or dependency fields: another template.
    made(templates, GemmOp, "g2", {"after_any": []}, [2, 3], **args)
    made(templates, GemmOp, "g3", {"after": []}, [0, 1], **args)
    made(templates, GemmOp, "g4", {"after_any": []}, [0, 1], **{**args, "m": 128})
    assert len(templates) == 4
    # A first spec that fails validation fails as the plain model does.
    with pytest.raises(ValidationError):
        made(templates, GemmOp, "bad", {"after_any": []}, [0], **{**args, "m": 0})
