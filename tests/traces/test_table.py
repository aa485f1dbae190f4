"""Kernel kinds from names (ovsim.traces.table.classify)."""

from __future__ import annotations

import pytest

from ovsim.traces.table import classify


@pytest.mark.parametrize(("name", "kind"), [
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "collective"),
    ("ovsim_channel_copy", "collective"),
    ("ovsim_channel_reduce", "collective"),
    ("ovsim_gemm_tile64", "gemm"),
    ("ovsim_probe_first", "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NTN", "gemm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", "elementwise"),
])
def test_kind_from_the_kernel_name(name: str, kind: str) -> None:
    # The harness's channel kernels stand in for NCCL's, so a trace of them fits contention as
    # collectives; its probes and GEMM are ordinary kernels.
    assert classify(name) == kind
