"""The canonical kernel table: kernel kinds from names (ovsim.traces.table.classify), the checks on
its columns, and its parquet form (ovsim.traces.load)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from ovsim.errors import OvsimError
from ovsim.traces.load import read_table, write_table
from ovsim.traces.table import TraceBundle, classify, gemm_cluster, gemm_tile, make_table


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


def test_a_launch_that_could_not_have_run_is_unknown() -> None:
    """A zero or negative grid or block dimension, negative registers or shared memory: corrupt
    metadata becomes unknown, as a value of the wrong type does, rather than a shape to replay."""
    t = make_table({"rank": [0, 0, 0], "stream": [7, 7, 7], "name": ["a", "b", "c"], "start_s": [0.0, 1.0, 2.0],
                    "duration_s": [1.0, 1.0, 1.0], "grid_x": [-5, 0, 4], "block_x": [0, 128, -1],
                    "registers_per_thread": [-1, 0, 32], "shared_mem_bytes": [-100, 0, 5]})
    assert t["grid_x"].isna().tolist() == [True, True, False]
    assert t["block_x"].isna().tolist() == [True, False, True]
    assert t["registers_per_thread"].tolist()[1:] == [0, 32] and pd.isna(t["registers_per_thread"][0])
    assert t["shared_mem_bytes"].tolist()[1:] == [0, 5] and pd.isna(t["shared_mem_bytes"][0])


@pytest.mark.parametrize(("meta", "field"), [
    (b"{not json", "metadata"),
    (b"[1, 2]", "metadata"),
    (b'{"gpu_names": {"x": "H100"}}', "metadata.gpu_names"),
    (b'{"gpu_names": [1]}', "metadata.gpu_names"),
    (b'{"skipped": {"negative duration": "many"}}', "metadata.skipped"),
    (b'{"world_size": "8"}', "metadata.world_size"),
    (b'{"wall_origin_s": NaN}', "metadata.wall_origin_s"),
])
def test_a_table_with_broken_ovsim_metadata_is_one_line(tmp_path: Path, meta: bytes, field: str) -> None:
    path = tmp_path / "k.parquet"
    write_table(TraceBundle(kernels=make_table({"rank": [0], "stream": [7], "name": ["a"], "start_s": [0.0],
                                                "duration_s": [1.0]})), path)
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"ovsim": meta}), path)
    with pytest.raises(OvsimError) as err:
        read_table(path)
    assert (err.value.source, err.value.field) == (str(path), field) and "\n" not in err.value.one_line()


@pytest.mark.parametrize(("name", "tile"), [
    ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", (320, 128)),
    ("nvjet_sm90_qqtst_144x128_128x6_1x2_h_bz_coopA_NNT", (144, 128)),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_off_kernel",
     (128, 256)),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x256_64x3_tn_align8>(Params)", (128, 256)),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", None),  # no K and stages after the tile
    ("nvjet_sm90_persistent_kernel", None),
])
def test_gemm_tile_from_the_kernel_name(name: str, tile: tuple[int, int] | None) -> None:
    assert gemm_tile(name) == tile


@pytest.mark.parametrize(("name", "ctas"), [
    ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", 2),
    ("nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NNN", 2),
    ("nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT", 8),
    ("nvjet_sm90_tst_192x192_64x3_1x1_h_bz_coopB_NNN", 1),
    ("cutlass3x_sm90_tensorop_gemm_f16_f16_f32_void_f16_128x256x64_2x1x1_0_tnn_align8_warpspecialized_cooperative", 2),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_off_kernel", 1),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x256_64x3_tn_align8>(Params)", 1),
])
def test_gemm_cluster_from_the_kernel_name(name: str, ctas: int) -> None:
    """The cluster shape after the tile (nvjet's "_1x2_h_", CUTLASS 3's "_2x1x1_"); xmma's warpgroup
    shape and Ampere kernels name none."""
    assert gemm_cluster(name) == ctas

