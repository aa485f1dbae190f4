"""Builds within reusing_builds() share kernel demands and NCCL plans (ovsim.models.build_memo),
and build what they would alone: the reference is each build made outside the memo."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ovsim.api import build
from ovsim.models import build_memo
from ovsim.models.build_memo import reusing_builds
from ovsim.scenario import Scenario, load_scenario

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gemm-allreduce-h100x4-overlapped.yaml"
TRAINING = Path(__file__).resolve().parents[2] / "examples" / "training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml"


def _variants(sc: Scenario, pads: tuple[int, ...] = (0, 65536)) -> list[Scenario]:
    """The scenario with each combination of the knobs a demand or a plan depends on."""
    out = []
    for carve, pad, channels in itertools.product((0, 16), pads, (None, 4)):
        knobs = sc.knobs.model_copy(update={"sm_carveout": carve, "occupancy_shaping_smem_bytes": pad,
                                            "nccl_channels": channels})
        out.append(sc.model_copy(update={"knobs": knobs}))
    return out


# The FSDP example's attention kernel fills the A100's shared memory: no padding fits beside it.
@pytest.mark.parametrize(("path", "pads"), [(EXAMPLE, (0, 65536)), (TRAINING, (0,))], ids=["gemm-allreduce", "fsdp"])
def test_memo_builds_what_each_build_makes_alone(path: Path, pads: tuple[int, ...]) -> None:
    variants = _variants(load_scenario(path), pads)
    alone = [build(v)[0] for v in variants]
    with reusing_builds():
        shared = [build(v)[0] for v in variants] + [build(v)[0] for v in reversed(variants)]
    for a, b in zip(alone + alone[::-1], shared, strict=True):
        assert [(op.id, op.kernel, op.flow) for op in a.ops] == [(op.id, op.kernel, op.flow) for op in b.ops]
        assert a.streams == b.streams


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
