"""calibration/harness/layers.py's host-side logic (its GPU work runs on the GPU's machine only)."""

from __future__ import annotations

import re
from typing import Any

import layers
import megatron_attention
import pytest


def test_every_shape_is_one_ranks_share_of_a_model_ovsim_can_build() -> None:
    """ovsim derives the head size from the width and the heads, and the rank's share from the TP
    degree, which each name states."""
    for s in layers.SHAPES + layers.STEP_SHAPES + layers.QUICK:
        assert s.hidden == s.q_heads * s.tp * s.head_dim, s.name
        assert s.q_heads % s.kv_heads == 0, s.name
        m = re.search(r"-tp(\d+)", s.name)
        assert s.tp == (int(m.group(1)) if m else 1), s.name
        assert s.dtype in layers.DTYPES and s.attention in ("flash", "unfused"), s.name


@pytest.mark.parametrize("outcome, kept", [({"fwd_max_abs": 2e-4, "bwd_max_abs": 4e-4}, True),
                                           ({"fwd_max_abs": 2e-4, "bwd_max_abs": 0.3}, False),
                                           (RuntimeError("no Triton"), False)])
def test_unfused_shapes_run_only_once_their_softmax_matches_pytorchs(
        monkeypatch: pytest.MonkeyPatch, outcome: Any, kept: bool) -> None:
    def check(torch: Any, dev: Any) -> dict[str, float]:
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(megatron_attention, "check", check)
    manifest: dict[str, Any] = {"errors": {}}
    got = layers.unfused_checked(None, None, layers.QUICK, manifest)
    unfused = {s.name for s in layers.QUICK if s.attention == "unfused"}
    assert unfused and ({s.name for s in got} >= unfused) == kept
    assert len(got) == len(layers.QUICK) - (0 if kept else len(unfused))
    assert (set(manifest["errors"]) == unfused) != kept


def test_the_profiled_kernels_are_the_last_runs_ones() -> None:
    """Of 2 warm runs and 3 recorded ones that each launch the same 4 kernels, the last 12 kernels
    and the ranges from the first of them on; all of them where the count does not divide."""
    kernels = [{"ts_us": float(t), "name": f"k{t % 4}"} for t in range(20)]
    ranges = [{"ts_us": 3.0, "name": "F.qkv"}, {"ts_us": 9.0, "name": "F.qkv"}]
    got, kept_ranges = layers.last_runs(list(reversed(kernels)), ranges, warm=2, n=3)
    assert [k["ts_us"] for k in got] == [float(t) for t in range(8, 20)]
    assert kept_ranges == [ranges[1]]
    assert layers.last_runs(kernels[:19], ranges, warm=2, n=3) == (kernels[:19], ranges)
    assert layers.last_runs(kernels, ranges, warm=0, n=1) == (kernels, ranges)


def test_median_of_an_iterations_phases() -> None:
    its = [{"condition": "sustained", "iteration": i, "fwd_ms": f, "bwd_ms": 2 * f} for i, f in enumerate((1, 3, 2))]
    assert layers.median_ms(its) == 6.0
