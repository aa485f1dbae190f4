"""Random op lists built one after another within reusing_builds(), each edited from the one before
(a predecessor's repeats or ranks, a dependency, a class under the same name, a spec dropped or
added, a stream or a delay), every build compared with the same scenario built alone: the same
ops, infos and streams, the same workload digest and analytic plan, or the same error. The memo
carries ops (and, for a list equal to the last, its structure: ir.Structure) from list to list
(build_memo.Expansions.carry); the reference is each build made outside it."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from ovsim.api import build
from ovsim.engine.analytic import Plan
from ovsim.errors import OvsimError
from ovsim.models import build_memo
from ovsim.models.build_memo import reusing_builds
from ovsim.models.op_specs import Knobs, OpSpec
from ovsim.scenario import Scenario
from ovsim.tune_predictions import _digest

SPEC: TypeAdapter[Any] = TypeAdapter(OpSpec)
NAMES = [f"op{i}" for i in range(8)]


def _fields(rng: random.Random, name: str) -> dict[str, Any]:
    kind = rng.choice(["gemm", "elementwise", "all_reduce", "all_gather", "send_recv", "delay"])
    d: dict[str, Any] = {"name": name, "kind": kind, "stream": rng.choice(["compute", "comm", "side"])}
    if kind == "gemm":
        d.update(m=rng.choice([256, 512]), n=512, k=512)
    elif kind == "elementwise":
        d.update(bytes=rng.choice([1e6, 2e6]))
    elif kind in ("all_reduce", "all_gather"):
        d.update(size_bytes=rng.choice([1e6, 4e6]))
    elif kind == "send_recv":
        d.update(size_bytes=1e6, src=0, dst=rng.choice([1, 2]))
    else:
        d.update(duration_s=rng.choice([1e-6, 2e-6]))
    if kind != "send_recv":
        d["ranks"] = rng.choice(["all", "all", [0, 1], [0, 1, 2, 3], [1, 2]])
    d["repeat"] = rng.choice([1, 1, 2, 3])
    d["delay_s"] = rng.choice([0.0, 0.0, -0.0, 1e-6])
    return d


def _follow(rng: random.Random, d: dict[str, Any], names: list[str]) -> None:
    d["after"], d["after_any"] = [], []
    for _ in range(rng.randint(0, 2)):
        if names:
            (d["after"] if rng.random() < 0.5 else d["after_any"]).append(rng.choice(names))


def _edited(rng: random.Random, ds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ds = copy.deepcopy(ds)
    i = rng.randrange(len(ds))
    r = rng.random()
    if r < 0.2:
        ds[i]["ranks"] = rng.choice(["all", [0, 1], [1, 2, 3]]) if ds[i]["kind"] != "send_recv" else None
    elif r < 0.4:
        ds[i]["repeat"] = rng.choice([1, 2, 3])
    elif r < 0.55:
        _follow(rng, ds[i], [d["name"] for d in ds[:i]])
    elif r < 0.7:  # another class under the same name, following what it followed
        ds[i] = {**_fields(rng, ds[i]["name"]), "after": ds[i]["after"], "after_any": ds[i]["after_any"]}
    elif r < 0.8 and len(ds) > 2:  # dropped, with what follows it
        gone = ds.pop(i)["name"]
        for d in ds:
            d["after"] = [n for n in d["after"] if n != gone]
            d["after_any"] = [n for n in d["after_any"] if n != gone]
    elif r < 0.9:
        ds[i]["stream"] = rng.choice(["compute", "comm", "side"])
    else:
        ds[i]["delay_s"] = rng.choice([0.0, -0.0, 1e-6])
    return [{k: v for k, v in d.items() if v is not None} for d in ds]


def _outcome(sc: Scenario) -> tuple[object, ...]:
    try:
        wl = build(sc)[0]
    except OvsimError as e:
        return ("error", e.message, e.field)
    plan = Plan.of(wl)  # within the memo, the order another build of the list worked out (ir.Structure)
    return ("built", wl.ops, [op.info for op in wl.ops], wl.streams, _digest(wl),
            (plan.order, plan.members, plan.preds, plan.delay_s, plan.code))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_lists_built_in_turn_build_what_each_builds_alone(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    taken = [0, 0]  # specs whose ops a build took from the list before; builds that failed alone
    carry = build_memo.Expansions.carry

    def counted(self: build_memo.Expansions, prev: build_memo.Expansions, at: list[int]) -> None:
        taken[0] += sum(j >= 0 for j in at)
        carry(self, prev, at)

    monkeypatch.setattr(build_memo.Expansions, "carry", counted)
    names = rng.sample(NAMES, 6)
    ds: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        d = _fields(rng, name)
        _follow(rng, d, names[:i])
        ds.append(d)
    kept: dict[str, Any] = {}
    with reusing_builds():
        for _ in range(40):
            ds = _edited(rng, ds)
            specs = []
            for d in ds:
                try:
                    spec = SPEC.validate_python(d)
                except ValidationError:
                    continue
                # An unchanged spec is sometimes the very object, as an edited list keeps it.
                same = kept.get(spec.name)
                specs.append(same if same is not None and same == spec and rng.random() < 0.5 else spec)
            kept = {s.name: s for s in specs}
            knobs = Knobs(nccl_channels=rng.choice([None, 4]), ce_offload=rng.random() < 0.3,
                          comm_priority=rng.choice(["normal", "high"]))
            sc = Scenario(system="hgx-h100", ranks=4, schedule=rng.choice(["overlapped", "sequential"]),
                          knobs=knobs, ops=specs)
            got = _outcome(sc)
            token = build_memo._MEMO.set(None)
            try:
                alone = _outcome(sc)
            finally:
                build_memo._MEMO.reset(token)
            assert got == alone
            taken[1] += alone[0] == "error"
    # Most builds took ops from the list before, and some lists were refused (errors compared).
    assert taken[0] > 40 and 0 < taken[1] < 40
