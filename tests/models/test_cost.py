"""Occupancy closed forms (the CUDA occupancy calculator's rules) on shipped specs."""

from __future__ import annotations

import pytest

from ovsim.hw.spec import load_gpu
from ovsim.models.cost import blocks_per_sm
from ovsim.models.ir import BlockShape


@pytest.mark.parametrize(("gpu", "block", "expected"), [
    # V100: 2048 threads / 256 = 8; 65536 registers / (256 x 32) = 8; no shared memory and no
    # per-block reservation, so shared memory sets no limit.
    ("v100-sxm2", BlockShape(256, 32, 0), 8),
    # A100: 64-thread blocks stop at the 32-block limit before threads (32) or registers (64) do.
    ("a100-sxm4-40gb", BlockShape(64, 16, 0), 32),
    # H100: 100 KB + 1 KB reserved per block in 228 KB: two blocks.
    ("h100-sxm5-80gb", BlockShape(128, 32, 100_000), 2),
])
def test_blocks_per_sm(gpu: str, block: BlockShape, expected: int) -> None:
    assert blocks_per_sm(block, load_gpu(gpu)) == expected
