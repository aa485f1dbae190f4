"""bench/layer_times.py: the rows and one shape's breakdown print from the data sets."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import layer_times
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return layer_times


def test_the_rows_and_a_breakdown_print(bench, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert "37 of 37 within 10%" in out and "ovsim's SM clock" in out
    assert bench.main(["--kernels", "sc21-1.7b-unfused_s2048_mb16"]) == 0
    out = capsys.readouterr().out
    # The forward ops of the profiled iterations, each against ovsim's op of the same name.
    for op in ("F.qkv", "F.attn", "F.proj", "F.fc1", "F.act", "F.fc2"):
        assert op in out
    with pytest.raises(SystemExit, match="no data set measured nonesuch"):
        bench.main(["--kernels", "nonesuch"])


def test_kernels_are_classed_by_name(bench) -> None:  # type: ignore[no-untyped-def]
    assert bench.kernel_class("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16") == "attention"
    assert bench.kernel_class("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    assert bench.kernel_class("void at::native::cunn_SoftMaxForward<8>") == "softmax and loss"
    assert bench.kernel_class("fwd") == bench.kernel_class("bwd") == "softmax and loss"  # the harness's Triton
    assert bench.kernel_class("void at::native::fused_dropout_kernel_vec<c10::Half>") == "other"


def test_ovsim_ops_are_classed_as_the_kernels_are(bench) -> None:  # type: ignore[no-untyped-def]
    assert bench.op_class("F0.L0.qkv", "gemm") == "gemm"
    assert bench.op_class("F0.L0.attn.softmax", "elementwise") == "softmax and loss"
    assert bench.op_class("F0.loss", "softmax") == "softmax and loss"
    assert bench.op_class("F0.loss.log_softmax", "elementwise") == "softmax and loss"
    assert bench.op_class("B0.loss.cast", "elementwise") == "other"  # a copy kernel, as measured
    assert bench.op_class("s0.optimizer", "elementwise") == "optimizer"
    assert bench.kernel_class("void at::native::vectorized_layer_norm_kernel<float>") == "norm"
    assert bench.kernel_class("void at::native::FillFunctor<float>") == "other"
