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
