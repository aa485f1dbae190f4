"""Builds within reusing_builds() share kernel demands and NCCL plans (ovsim.models.build_memo),
and build what they would alone: the reference is each build made outside the memo."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import ovsim.models.training as training_module
from ovsim.api import build
from ovsim.models import build_memo
from ovsim.models.build_memo import reusing_builds
from ovsim.models.training import keep_training_build, release_training_build, reusing_training_ops
from ovsim.scenario import Scenario, load_scenario
from ovsim.tune_predictions import _digest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gemm-allreduce-h100x4-overlapped.yaml"
TRAINING = Path(__file__).resolve().parents[2] / "examples" / "training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml"


def _variants(sc: Scenario, pads: tuple[int, ...] = (0, 65536), priorities: tuple[str, ...] = ("normal",),
              offloads: tuple[bool, ...] = (False,)) -> list[Scenario]:
    """The scenario with each combination of the knobs a demand, a plan or an op depends on."""
    out = []
    for carve, pad, channels, priority, offload in itertools.product((0, 16), pads, (None, 4), priorities, offloads):
        knobs = sc.knobs.model_copy(update={"sm_carveout": carve, "occupancy_shaping_smem_bytes": pad,
                                            "nccl_channels": channels, "comm_priority": priority,
                                            "ce_offload": offload})
        out.append(sc.model_copy(update={"knobs": knobs}))
    return out


# The FSDP example's attention kernel fills the A100's shared memory: no padding fits beside it.
@pytest.mark.parametrize(("path", "pads"), [(EXAMPLE, (0, 65536)), (TRAINING, (0,))], ids=["gemm-allreduce", "fsdp"])
def test_memo_builds_what_each_build_makes_alone(path: Path, pads: tuple[int, ...]) -> None:
    variants = _variants(load_scenario(path), pads, ("normal", "high"), (False, True))
    alone = [build(v)[0] for v in variants]
    # Each variant after each other (the same specs, other knobs), and the training iteration's
    # specs made once for all of them, as a schedule search builds them.
    with reusing_training_ops(), reusing_builds():
        shared = [build(v)[0] for v in variants] + [build(v)[0] for v in reversed(variants)]
    for a, b in zip(alone + alone[::-1], shared, strict=True):
        assert a.ops == b.ops  # every field the engine reads (ids, dependencies, streams, demands)
        assert [op.info for op in a.ops] == [op.info for op in b.ops]
        assert a.streams == b.streams


def test_a_build_of_the_same_specs_takes_the_ops_its_knobs_leave_alone() -> None:
    sc = load_scenario(EXAMPLE)

    def knobs(**update: object) -> Scenario:
        return sc.model_copy(update={"knobs": sc.knobs.model_copy(update={"nccl_channels": None, **update})})

    with reusing_builds():
        first, again = build(knobs())[0], build(knobs())[0]
        by_channels, by_priority = build(knobs(nccl_channels=4))[0], build(knobs(comm_priority="high"))[0]
        # The scenario read again: equal specs, other objects, whose ops the list before made.
        reread = build(load_scenario(EXAMPLE).model_copy(update={"knobs": knobs().knobs}))[0]
    comm = {op.id for op in first.ops if op.kind == "collective"}
    assert comm and len(comm) < len(first.ops)
    assert all(a is b for a, b in zip(first.ops, again.ops, strict=True))
    assert all(a is b for a, b in zip(first.ops, reread.ops, strict=True))
    # Four channels change the collectives' plans and nothing else: the rest are the same ops.
    assert all((a is b) == (a.id not in comm) for a, b in zip(first.ops, by_channels.ops, strict=True))
    assert [op.flow for op in by_channels.ops if op.id in comm] != [op.flow for op in first.ops if op.id in comm]
    # A stream priority changes no op, only the streams.
    assert all(a is b for a, b in zip(first.ops, by_priority.ops, strict=True))
    assert by_priority.streams != first.streams
    # Outside the memo every build makes its own.
    assert not any(a is b for a, b in zip(build(knobs())[0].ops, first.ops, strict=True))


def test_memo_shares_a_demand_between_builds_with_the_same_knobs_only() -> None:
    sc = load_scenario(EXAMPLE)
    plain, carved = _variants(sc)[0], _variants(sc)[4]
    with reusing_builds():
        first, again, other = build(plain)[0], build(plain)[0], build(carved)[0]
    gemm = [next(op.kernel for op in wl.ops if op.kind == "gemm") for wl in (first, again, other)]
    assert gemm[0] is gemm[1]  # priced once, taken by the second build
    assert gemm[2] is not gemm[0] and gemm[2] != gemm[0]  # 16 SMs carved out: priced again
    # Outside the memo every build prices its own.
    assert build(plain)[0].ops[0].kernel is not first.ops[0].kernel


def test_memo_is_emptied_past_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build_memo, "MEMO_MAX_ENTRIES", 0)
    sc = _variants(load_scenario(EXAMPLE))[0]
    with reusing_builds():
        first = build(sc)[0]
        again = build(sc)[0]
    assert first.ops[0].kernel is not again.ops[0].kernel
    assert first.ops[0].kernel == again.ops[0].kernel


def test_expansions_past_their_size_start_no_table(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = load_scenario(EXAMPLE)
    channels = sc.model_copy(update={"knobs": sc.knobs.model_copy(update={"nccl_channels": 4})})
    # As many ops as the list has specs: the first build's tables are kept (none is full before
    # it), and past them no new one starts.
    monkeypatch.setattr(build_memo, "EXPANSIONS_MAX_OPS", len(sc.ops))
    with reusing_builds():
        first, again = build(sc)[0], build(sc)[0]
        other, other_again = build(channels)[0], build(channels)[0]
    assert first.ops == again.ops and all(a is b for a, b in zip(first.ops, again.ops, strict=True))
    comm = {op.id for op in first.ops if op.kind == "collective"}
    # Four channels: the kernels' ops are the kept ones, the collectives' are made every time.
    assert all((a is b) == (a.id not in comm) for a, b in zip(first.ops, other.ops, strict=True))
    assert not any(a is b for a, b in zip(other.ops, other_again.ops, strict=True) if a.id in comm)
    assert other.ops == other_again.ops


def test_a_list_of_more_specs_than_expansions_hold_is_not_held(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = load_scenario(EXAMPLE)
    monkeypatch.setattr(build_memo, "EXPANSIONS_MAX_OPS", len(sc.ops) - 1)
    with reusing_builds():
        first, again = build(sc)[0], build(sc)[0]
        memo = build_memo._MEMO.get()
        assert memo is not None and memo.expanded_from == () and not memo.expansions
    assert first.ops == again.ops and not any(a is b for a, b in zip(first.ops, again.ops, strict=True))


def _parallel(sc: Scenario, **update: object) -> Scenario:
    assert sc.training is not None
    parallel = sc.training.parallel.model_copy(update=update)
    return sc.model_copy(update={"training": sc.training.model_copy(update={"parallel": parallel})})


def _prefetch(sc: Scenario, depth: int) -> Scenario:
    return _parallel(sc, fsdp_prefetch=depth)


@pytest.mark.parametrize("keep", [True, False])
def test_a_kept_iteration_is_built_from_its_ops_after_others(keep: bool) -> None:
    """keep_training_build keeps the last iteration's op specs and ops beside those of the
    iterations built after it: built again, it takes them (the same objects) and builds what it
    builds alone. Not kept, it is made again; release_training_build lets the last go, not it."""
    sc = load_scenario(TRAINING)
    alone = build(sc)[0]
    with reusing_training_ops(), reusing_builds():
        first = build(sc)[0]
        if keep:
            keep_training_build()
        build(_prefetch(sc, 0))
        last = build(_prefetch(sc, 2))[0]
        again = build(sc)[0]
        build(_prefetch(sc, 2))
        release_training_build()
        memo, held = build_memo._MEMO.get(), training_module._REUSED.get()
        assert memo is not None and memo.expansions is None and held is not None and held.last is None
        after_release = build(_prefetch(sc, 2))[0]
        kept_still = build(sc)[0]
    assert again.ops == alone.ops and again.streams == alone.streams
    assert all(a is b for a, b in zip(first.ops, again.ops, strict=True)) == keep
    assert after_release.ops == last.ops
    assert all(a is b for a, b in zip(first.ops, kept_still.ops, strict=True)) == keep


def test_an_iteration_of_more_than_half_the_ops_expansions_hold_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept, a list's ops share the expansions' size with the last list's: one of more than half
    of it is not kept (its specs are, and its ops are made again)."""
    sc = load_scenario(TRAINING)
    with reusing_training_ops(), reusing_builds():
        first = build(sc)[0]
        monkeypatch.setattr(build_memo, "EXPANSIONS_MAX_OPS", 2 * len(first.ops) - 1)
        keep_training_build()
        memo = build_memo._MEMO.get()
        assert memo is not None and memo.kept is None
        build(_prefetch(sc, 0))
        again = build(sc)[0]
    assert again.ops == first.ops


def test_while_an_iteration_is_kept_the_last_is_held_within_what_it_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept set and the last stay within REUSE_MAX_SPECS specs: with one micro-batch's
    iteration kept, a two micro-batches' one of more specs than the limit leaves is made and not
    held (and, kept no longer, it is)."""
    sc = load_scenario(TRAINING)
    assert sc.training is not None
    one, two = (sc.model_copy(update={"training": sc.training.model_copy(update={"micro_batches": n})}) for n in (1, 2))
    with reusing_training_ops(), reusing_builds():
        first = build(one)[0]
        held = training_module._REUSED.get()
        assert held is not None and held.last is not None
        small = len(held.last[1].ops)  # specs
        monkeypatch.setattr(training_module, "REUSE_MAX_SPECS", 2 * small)
        keep_training_build()
        build(two)
        assert held.kept is not None and held.last is None
        assert build(one)[0].ops == first.ops and held.last is held.kept  # the kept one is taken
        build(two)
        keep_training_build()  # the last is not held: nothing is kept, not the one kept before
        memo = build_memo._MEMO.get()
        assert held.kept is None and memo is not None and memo.kept is None
    with reusing_training_ops(), reusing_builds():
        build(two)
        held = training_module._REUSED.get()
        assert held is not None and held.last is not None


def test_leaving_the_specs_context_lets_the_kept_ops_go() -> None:
    """An outer reusing_builds() outlives a reusing_training_ops() that kept a list: the memo's
    kept ops go with it, and the lists after get the whole size again."""
    sc = load_scenario(TRAINING)
    with reusing_builds():
        with reusing_training_ops():
            build(sc)
            keep_training_build()
            memo = build_memo._MEMO.get()
            assert memo is not None and memo.kept is not None
        assert memo.kept is None
        build(_prefetch(sc, 0))
        assert memo.expansions is not None and memo.expansions.cap == build_memo.EXPANSIONS_MAX_OPS


NODES = Path(__file__).resolve().parents[2] / "examples" / "training-llama2-70b-tp8-dp4-4nodes-h100.yaml"


def test_an_iteration_made_again_takes_the_ops_of_the_specs_it_shares_with_the_last() -> None:
    """Another bucket size or chunk count makes another list of specs, most of them equal to the
    last list's: a build of it takes their ops (the same objects) and builds what it builds
    alone, with the workload digest of that build (the schedule search's shared predictions),
    on a system at another node count too."""
    sc = load_scenario(NODES)
    variants = [_parallel(sc, bucket_bytes=b, tp_overlap=o) for o in ("none", "chunked")
                for b in (5 * 2**20, 25 * 2**20, 100 * 2**20)]
    variants += [v.model_copy(update={"knobs": v.knobs.model_copy(update={"nccl_channels": 8})}) for v in variants]
    alone = [build(v)[0] for v in variants]
    with reusing_training_ops(), reusing_builds():
        shared = [build(v)[0] for v in variants[::-1]][::-1]
    taken = 0
    for i, (a, b) in enumerate(zip(alone, shared, strict=True)):
        assert a.ops == b.ops and [op.info for op in a.ops] == [op.info for op in b.ops]
        assert _digest(a) == _digest(b)
        after = shared[i - 1] if i > 0 else None  # built just before it
        if after is not None and variants[i].knobs == variants[i - 1].knobs:
            taken += sum(op is other for op, other in zip(b.ops, after.ops, strict=False))
    assert taken > 0


def test_an_op_whose_predecessor_repeats_or_runs_elsewhere_is_made_again() -> None:
    """An op equal in value to the last list's is made again where an op it follows repeats
    another number of times or runs on other ranks: its dependencies name other ops."""
    sc = load_scenario(EXAMPLE)
    gemm, allreduce = sc.ops
    follows = [gemm.model_copy(update={"repeat": 2}), allreduce.model_copy(update={"repeat": 2, "after": ["gemm"]})]
    before_ops = follows
    lists = [[follows[0].model_copy(update={"repeat": 3}), follows[1]],
             [follows[0].model_copy(update={"ranks": [0, 1]}), follows[1].model_copy(update={"after": [],
                                                                                              "after_any": ["gemm"]})],
             [follows[0].model_copy(update={"ranks": [0]}), follows[1].model_copy(update={"after": [],
                                                                                           "after_any": ["gemm"]})]]
    with reusing_builds():
        before = build(sc.model_copy(update={"ops": before_ops}))[0]
        built = [build(sc.model_copy(update={"ops": ops}))[0] for ops in lists]
    alone = [build(sc.model_copy(update={"ops": ops}))[0] for ops in lists]
    assert [wl.ops for wl in built] == [wl.ops for wl in alone]
    # The all-reduce's ops of the first two lists follow other GEMM ops than those before them.
    for wl, prev in ((built[0], before), (built[2], built[1])):
        assert {op.id for op in wl.ops if op.name.startswith("allreduce")}
        assert not any(op is b for op in wl.ops if op.name.startswith("allreduce") for b in prev.ops)


def _ops_variants() -> list[Scenario]:
    """Op lists whose ops a build takes from the list before: a negative zero delay (equal to zero
    in value), and a GEMM copied from another (one stream string object for both) beside specs
    read again from the file (other string objects)."""
    out = []
    for m in (4096, 2048):
        sc = load_scenario(EXAMPLE)
        gemm, allreduce = sc.ops
        copy = gemm.model_copy(update={"name": "gemm2", "m": m})
        out.append(sc.model_copy(update={"ops": [gemm, allreduce, copy]}))
    sc = load_scenario(EXAMPLE)
    gemm, allreduce = sc.ops
    out.append(sc.model_copy(update={"ops": [type(gemm).model_validate({**gemm.model_dump(), "delay_s": -0.0}),
                                             allreduce]}))
    return out


def test_ops_taken_from_another_list_keep_the_digest_of_the_build_alone() -> None:
    """A workload's digest pickles its ops, so it sees which ops share an object and the sign of
    a zero: ops taken from the list before, beside ops made anew, must share what a build alone
    shares (streams interned, a negative zero made zero, the same system object)."""
    variants = _ops_variants()
    with reusing_builds():
        shared = [build(v)[0] for v in variants]
    for v, wl in zip(variants, shared, strict=True):
        alone = build(v)[0]
        assert wl.ops == alone.ops and _digest(wl) == _digest(alone)
    assert variants[2].ops[0].delay_s == 0.0 and str(variants[2].ops[0].delay_s) == "0.0"


def test_a_system_copied_again_is_not_mixed_with_its_earlier_copy() -> None:
    """Collectives' parts are shared by the system's identity: a list built again on an equal copy
    of its system (its node count's copy made again) neither takes the tables made on the first
    copy nor carries from them, so its digest is that of the build alone."""
    import ovsim.api as api

    sc = load_scenario(NODES)

    def variant(bucket_mib: int, channels: int | None) -> Scenario:
        scn = _parallel(sc, bucket_bytes=bucket_mib * 2**20)
        return scn.model_copy(update={"knobs": scn.knobs.model_copy(update={"nccl_channels": channels})})

    with reusing_training_ops(), reusing_builds():
        build(variant(25, 8))
        build(variant(25, None))
        build(variant(5, None))
        api._SYSTEMS.clear()  # as when more systems and node counts than it holds came between
        shared = build(variant(5, 8))[0]
    alone = build(variant(5, 8))[0]
    assert shared.ops == alone.ops and _digest(shared) == _digest(alone)
