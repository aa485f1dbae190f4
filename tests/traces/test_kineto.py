"""Kineto importer: real public traces checked against facts recorded independently of ovsim
(counts by a plain script over the files, and the files' own records) and hand-made traces for every mapping.
Bad input, the sliced parser and fuzzing: test_kineto_input.py."""

from __future__ import annotations

import gzip
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pytest
from kineto_events import HTA, NCCL_AR, TRACES, doc, kernel, launch, real, write
from shared_traces import traces

from ovsim.errors import OvsimError
from ovsim.hw.spec import known_gpus
from ovsim.traces.devices import spec_for_device_name
from ovsim.traces.kineto import load_kineto
from ovsim.traces.table import TraceBundle, validate_table

DLRM = "param/et_replay/tests/inputs/dlrm_kineto.tar.gz"


def comm_counts(b: TraceBundle) -> tuple[int, int]:
    """(kernels, NCCL/RCCL collective kernels) as counted apart from ovsim in the listing that comes
    with the shared traces (copies and memsets apart)."""
    k = b.kernels
    kernels = k[~k["kind"].isin(["copy", "memset"])]
    nccl = kernels[(kernels["kind"] == "collective") & kernels["name"].str.contains("nccl|rccl", regex=True)]
    return len(kernels), len(nccl)


# -- real traces ----------------------------------------------------------------------------------

# file, kernels, NCCL kernels, deviceProperties name, rank, world size, ovsim GPU spec (counted apart
# from ovsim, as above).
MANIFEST = [
    (f"{HTA}/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", 14, 0, "AMD Radeon Graphics", 0, None, None),
    (f"{HTA}/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz", 79, 0,
     "NVIDIA A100-PG509-200", 0, None, "a100-sxm4-40gb"),
    (f"{HTA}/df_index_resolver/df_index_resolver.json.gz", 19370, 2020, "Tesla V100-SXM2-32GB", 1, 2, "v100-sxm2"),
    (f"{HTA}/nccl_parser_config/nccl_data.json.gz", 2700, 21, "NVIDIA A100-PG509-200", 0, 2, "a100-sxm4-40gb"),
    (f"{HTA}/negative_queue_length_values_check/rank0.json.gz", 6080, 80, "NVIDIA A100-SXM4-80GB", 0, 16,
     "a100-sxm4-80gb"),
    (f"{HTA}/timeline_analysis/sampled_rank-0.json.gz", 1154, 10, None, 0, 128, None),
    (f"{HTA}/trace_diff/test/test.json.gz", 9876, 64, "Tesla V100-SXM2-16GB", 1, 2, "v100-sxm2"),
    # 74 comm kernels in that count: 1 NCCL AllGather + 73 PyTorch symmetric-memory multimem all-reduces.
    ("TraceLens/tests/traces/b200/eager_trace.json.gz", 768, 1, "NVIDIA B200", 0, 8, "b200"),
    ("TraceLens/tests/traces/h100/Falconsai_nsfw_image_detection__1016002.json.gz", 154, 0, "NVIDIA H100 80GB HBM3",
     0, None, "h100-sxm5-80gb"),
    ("TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", 1465, 0, "NVIDIA H100 80GB HBM3", 0,
     None, "h100-sxm5-80gb"),
    ("TraceLens/tests/traces/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz", 446, 0,
     "NVIDIA H100 80GB HBM3", 0, None, "h100-sxm5-80gb"),
    ("TraceLens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz", 60, 0, "NVIDIA H100 80GB HBM3", 0,
     None, "h100-sxm5-80gb"),
    ("TraceLens/tests/traces/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz", 4330, 0,
     "NVIDIA H100 80GB HBM3", 0, None, "h100-sxm5-80gb"),
    ("TraceLens/tests/traces/mi300/resnet_act_checkpoint.json.gz", 2995, 17, "AMD Instinct MI300X", 0, 8, "mi300x"),
]


@pytest.mark.parametrize(("rel", "kernels", "nccl", "gpu", "rank", "world", "spec"), MANIFEST,
                         ids=[Path(m[0]).name.split(".")[0][:30] for m in MANIFEST])
def test_real_trace_matches_manifest(rel: str, kernels: int, nccl: int, gpu: str | None, rank: int,
                                     world: int | None, spec: str | None) -> None:
    b = load_kineto(real(rel))
    validate_table(b.kernels)
    assert comm_counts(b) == (kernels, nccl)
    assert b.world_size == world
    assert list(b.sources) == [rank]
    assert b.kernels["rank"].unique().tolist() == [rank]
    assert b.gpu_names == ({rank: gpu} if gpu else {})
    if gpu:
        assert spec_for_device_name(gpu) == spec
    assert b.skipped == {}
    k = b.kernels
    # Rows come sorted by start; a launch call precedes its activity (Kineto puts both on the host clock).
    assert k["start_s"].is_monotonic_increasing
    launched = k["launch_s"].notna()
    assert (k.loc[launched, "launch_s"] <= k.loc[launched, "start_s"] + 1e-6).all()
    assert launched.mean() > 0.6


def test_dlrm_archive_has_all_eight_ranks_with_their_collectives() -> None:
    b = load_kineto(real(DLRM))
    k = b.kernels
    assert b.world_size == 8
    assert sorted(b.sources) == list(range(8))
    for r, src in b.sources.items():
        # Each member's distributedInfo.rank agrees with the worker number in its name.
        assert f"worker{r}_step_12" in src
    per_rank = {0: 245, 1: 310, 2: 246, 3: 315, 4: 251, 5: 245, 6: 246, 7: 246}
    for r, n in per_rank.items():
        rows = k[k["rank"] == r]
        assert len(rows[~rows["kind"].isin(["copy", "memset"])]) == n
        coll = rows[rows["kind"] == "collective"]
        assert coll["collective"].value_counts().to_dict() == {"send_recv": 5, "all_reduce": 3}
        assert set(coll["algorithm"]) == {"ring"}
        assert set(coll.loc[coll["collective"] == "send_recv", "protocol"]) == {"Simple"}
        assert set(coll.loc[coll["collective"] == "all_reduce", "dtype"]) == {"float32"}
    assert set(b.gpu_names.values()) == {"Tesla V100-SXM2-32GB"}
    # This older Kineto wrote no collective metadata, so there are no sizes and no sequence numbers.
    assert k.loc[k["kind"] == "collective", "message_bytes"].isna().all()
    assert k["seq"].isna().all()


def _extract(archive: Path, dest: Path) -> list[Path]:
    """The archive's trace files, written flat into dest."""
    out = []
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            handle = tar.extractfile(m) if m.isfile() and m.name.endswith(".json") else None
            if handle is not None:
                out.append(dest / Path(m.name).name)
                out[-1].write_bytes(handle.read())
    return sorted(out)


def test_dlrm_folder_reads_like_the_archive(tmp_path: Path) -> None:
    archive = real(DLRM)
    files = _extract(archive, tmp_path)
    from_folder = load_kineto(files[0].parent)
    from_archive = load_kineto(archive)
    pd.testing.assert_frame_equal(from_folder.kernels, from_archive.kernels)
    assert from_folder.gpu_names == from_archive.gpu_names


def test_folder_missing_a_rank_file_names_the_rank(tmp_path: Path) -> None:
    files = _extract(real(DLRM), tmp_path)
    gone = next(f for f in files if "worker5_" in f.name)
    gone.unlink()
    with pytest.raises(OvsimError) as e:
        load_kineto(gone.parent)
    assert e.value.field == "distributedInfo.world_size"
    assert "rank(s) 5" in e.value.message


def test_folder_with_two_files_of_one_rank_names_both(tmp_path: Path) -> None:
    files = _extract(real(DLRM), tmp_path)
    twin = files[0].with_name("copy_of_" + files[0].name)
    shutil.copy(files[0], twin)
    with pytest.raises(OvsimError) as e:
        load_kineto(files[0].parent)
    assert files[0].name in e.value.message and twin.name in e.value.message
    assert e.value.field == "distributedInfo.rank"


def test_nccl_kernel_message_size_from_record_param_comms() -> None:
    b = load_kineto(real(f"{HTA}/nccl_parser_config/nccl_data.json.gz"))
    k = b.kernels
    # The trace's own record of this kernel (Kineto's kernel args): In msg nelems 6637568, dtype Float.
    row = k[k["correlation"] == 60047].iloc[0]
    assert row["name"].startswith("ncclKernel_AllReduce_RING_LL_Sum_float")
    assert (row["collective"], row["algorithm"], row["protocol"], row["dtype"]) == ("all_reduce", "ring", "LL",
                                                                                   "float32")
    assert row["message_bytes"] == 6637568 * 4 == 26_550_272
    assert (row["group_size"], row["process_group"]) == (2, "0")
    assert row["stream"] == 40 and row["grid_x"] == 8 and row["block_x"] == 544
    assert row["registers_per_thread"] == 96 and row["shared_mem_bytes"] == 87568
    coll = k[k["kind"] == "collective"]
    assert coll["message_bytes"].notna().all()
    assert coll["collective"].value_counts().to_dict() == {"all_reduce": 15, "broadcast": 6}


def test_b200_all_gather_size_is_the_per_rank_input() -> None:
    b = load_kineto(real("TraceLens/tests/traces/b200/eager_trace.json.gz"))
    row = b.kernels[b.kernels["name"].str.startswith("ncclDevKernel_AllGather")].iloc[0]
    # _allgather_base with In msg nelems 25136 and Out msg nelems 201088 = 8 x 25136, bfloat16.
    assert (row["collective"], row["dtype"], row["group_size"]) == ("all_gather", "bfloat16", 8)
    assert row["message_bytes"] == 25136 * 2


def test_rocm_trace_copy_direction_and_device_from_args() -> None:
    b = load_kineto(real(f"{HTA}/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"))
    copies = b.kernels[b.kernels["kind"] == "copy"]
    assert copies["copy_kind"].tolist() == ["HtoD", "HtoD"]
    assert set(b.kernels["device"]) == {2}


def test_alexnet_stream_waits_point_at_the_recorded_kernel() -> None:
    b = load_kineto(real(f"{HTA}/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"))
    assert b.syncs is not None
    s, k = b.syncs, b.kernels
    assert list(s.columns[:4]) == ["rank", "waiting_stream", "waiting_after_s", "recorded_correlation"]
    # First wait: stream 20 waits (cudaStreamWaitEvent at 1695835585751487 us) on an event recorded on
    # stream 7 after the max-pool kernel with correlation 5144 had been launched.
    first = s.iloc[0]
    assert (first["waiting_stream"], first["recorded_stream"], first["recorded_correlation"]) == (20, 7, 5144)
    assert first["waiting_after_s"] == pytest.approx(1695835585.751488, abs=1e-6)
    recorded = k.set_index("correlation").loc[s["recorded_correlation"].tolist()]
    assert (recorded["stream"].to_numpy() == s["recorded_stream"].to_numpy()).all()
    assert (recorded["launch_s"].to_numpy() <= s["waiting_after_s"].to_numpy()).all()


# -- hand-made traces ------------------------------------------------------------------------------

def test_rows_map_every_field(tmp_path: Path) -> None:
    events = [
        kernel(ts=100.0, dur=10.0, corr=1), launch(1, 95.0),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
         "ts": 120.0, "dur": 4.0, "args": {"device": 0, "stream": 7, "correlation": 2, "bytes": 4096}},
        launch(2, 110.0, name="cudaMemcpyAsync"),
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 130.0, "dur": 1.0,
         "args": {"device": 0, "stream": 7, "correlation": 3, "bytes": 64}},
    ]
    b = load_kineto(write(tmp_path / "t.json", doc(events)))
    k = b.kernels
    assert k["kind"].tolist() == ["gemm", "copy", "memset"]
    g = k.iloc[0]
    assert (g["grid_x"], g["grid_y"], g["grid_z"], g["block_x"], g["block_y"], g["block_z"]) == (4, 2, 1, 128, 1, 1)
    assert (g["registers_per_thread"], g["shared_mem_bytes"], g["device"], g["stream"]) == (32, 1024, 0, 7)
    assert g["start_s"] == pytest.approx(100e-6) and g["duration_s"] == pytest.approx(10e-6)
    assert g["launch_s"] == pytest.approx(95e-6)
    assert pd.isna(g["bytes"]) and pd.isna(k.iloc[0]["seq"])
    assert k["copy_kind"].tolist() == ["", "HtoD", ""]
    assert k["bytes"].tolist()[1:] == [4096.0, 64.0]
    assert k["launch_s"].iloc[1] == pytest.approx(110e-6) and pd.isna(k["launch_s"].iloc[2])
    assert b.gpu_names == {0: "NVIDIA H100 80GB HBM3"} and b.world_size is None and b.syncs is None


def test_launching_operator_shapes_types_and_call(tmp_path: Path) -> None:
    """Two kernels of one operator call (linked by External id) share its shapes, types and id; a
    kernel of an older trace, whose External id is its correlation, gets the innermost operator
    enclosing its launch call on the launching thread; a kernel outside any operator gets none."""
    def op(name: str, ts: float, dur: float, ext: int, dims: Any, types: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 10, "tid": 11, "ts": ts, "dur": dur,
                "args": {"External id": ext, "Input Dims": dims, "Input type": types}}
    events = [
        op("aten::add", 10.0, 20.0, 500, [[4, 8], [4, 8], []], ["float", "float", "Scalar"]),
        kernel("add_a", 100.0, corr=1), launch(1, 12.0, ext=500),
        kernel("add_b", 120.0, corr=2), launch(2, 20.0, ext=500),
        op("aten::linear", 40.0, 20.0, 600, [[2, 3], [5, 3]], ["c10::BFloat16", "c10::BFloat16"]),
        op("aten::mm", 42.0, 10.0, 601, [[2, 3], [3, 5]], ["c10::BFloat16", "c10::BFloat16"]),
        kernel("mm", 140.0, corr=3), launch(3, 45.0, ext=3),
        kernel("lone", 160.0, corr=4), launch(4, 80.0, ext=4),
    ]
    k = load_kineto(write(tmp_path / "t.json", doc(events))).kernels
    assert k["host_op"].tolist() == ["aten::add[[4, 8], [4, 8], []]"] * 2 + ["aten::mm[[2, 3], [3, 5]]", ""]
    assert k["host_types"].tolist() == ["['float', 'float', 'Scalar']"] * 2 + \
        ["['c10::BFloat16', 'c10::BFloat16']", ""]
    assert k["host_op_id"].tolist()[:3] == [500, 500, 601] and pd.isna(k["host_op_id"].iloc[3])


def test_operator_records_that_differ_in_any_value_keep_their_own_text(tmp_path: Path) -> None:
    """Equal operator records share one text; records differing only in an int against a float
    shape, or in their types (or having none), keep their own (the importer keys texts by the
    records' JSON)."""
    def op(ts: float, ext: int, dims: Any, types: Any) -> dict[str, Any]:
        args: dict[str, Any] = {"External id": ext, "Input Dims": dims}
        if types is not None:
            args["Input type"] = types
        return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 11, "ts": ts, "dur": 5.0,
                "args": args}
    records = [([[2, 3]], ["float"]), ([[2.0, 3]], ["float"]), ([[2, 3]], None), ([[2, 3]], ["double"]),
               ([[2, 3]], ["float"])]
    events: list[dict[str, Any]] = []
    for i, (dims, types) in enumerate(records):
        events += [op(10.0 * i, 700 + i, dims, types), kernel(f"k{i}", 100.0 + 10 * i, corr=i + 1),
                   launch(i + 1, 10.0 * i + 1, ext=700 + i)]
    k = load_kineto(write(tmp_path / "t.json", doc(events))).kernels
    assert k["host_op"].tolist() == ["aten::mm[[2, 3]]", "aten::mm[[2.0, 3]]"] + ["aten::mm[[2, 3]]"] * 3
    assert k["host_types"].tolist() == ["['float']", "['float']", "", "['double']", "['float']"]
    assert k["host_op_id"].tolist() == [700, 701, 702, 703, 704]


@pytest.mark.parametrize(("name", "expected"), [
    ("Memcpy HtoD (Pageable -> Device)", "HtoD"), ("Memcpy DtoH (Device -> Pinned)", "DtoH"),
    ("Memcpy DtoD (Device -> Device)", "DtoD"), ("Memcpy PtoP (Device -> Device)", "PtoP"),
    ("Memcpy HtoH (Pinned -> Pinned)", "HtoH"), ("Memcpy (Unknown)", "")])
def test_copy_kind_from_the_memcpy_name(tmp_path: Path, name: str, expected: str) -> None:
    ev = {"ph": "X", "cat": "gpu_memcpy", "name": name, "pid": 0, "tid": 7, "ts": 1.0, "dur": 1.0,
          "args": {"stream": 7, "correlation": 1, "bytes": 8}}
    assert load_kineto(write(tmp_path / "t.json", doc([ev]))).kernels["copy_kind"].tolist() == [expected]


def test_category_spellings_and_fallbacks_to_pid_and_tid(tmp_path: Path) -> None:
    plain = {"ph": "X", "name": "some_custom_op_kernel", "pid": 1, "tid": 13, "ts": 5.0, "dur": 1.0}
    events = [{**plain, "cat": "Kernel"}, {**plain, "cat": "Memcpy", "name": "Memcpy DtoD (Device -> Device)"},
              {**plain, "cat": "Memset", "name": "Memset (Device)"}, {**plain, "cat": "GPU_MEMCPY"},
              {**plain, "cat": "cpu_op"}, {**plain, "cat": "python_function"}]
    b = load_kineto(write(tmp_path / "t.json", doc(events)))
    k = b.kernels
    # Unknown kernel names are elementwise compute; the copy category wins over the name.
    assert k["kind"].tolist() == ["elementwise", "copy", "memset", "copy"]
    assert set(k["device"]) == {1} and set(k["stream"]) == {13}
    assert k["correlation"].isna().all() and k["launch_s"].isna().all()
    assert b.gpu_names == {0: "NVIDIA A100-SXM4-80GB"}


def test_launch_from_the_driver_api_too(tmp_path: Path) -> None:
    events = [kernel(corr=5), launch(5, 90.0, name="cuLaunchKernelEx", cat="cuda_driver")]
    assert load_kineto(write(tmp_path / "t.json", doc(events))).kernels["launch_s"].iloc[0] == pytest.approx(90e-6)


def test_ranks_share_the_earliest_base_time(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    base = 1_700_000_000_000_000_000
    write(folder / "a.json", doc([kernel(ts=100.0), launch(1, 90.0)], rank=0, world=2, base=base + 5_000_000_000))
    write(folder / "b.json.gz", doc([kernel(ts=100.0), launch(1, 90.0)], rank=1, world=2, base=base), gz=True)
    b = load_kineto(folder)
    k = b.kernels.set_index("rank")
    assert k.loc[1, "start_s"] == pytest.approx(100e-6)
    assert k.loc[0, "start_s"] == pytest.approx(5 + 100e-6)
    assert k.loc[0, "launch_s"] == pytest.approx(5 + 90e-6)
    assert b.world_size == 2 and sorted(b.sources) == [0, 1]


def test_wall_clock_origin_and_software_versions(tmp_path: Path) -> None:
    """The table's time 0 is the earliest base on the wall clock; versions come from the metadata,
    and ranks that disagree list both."""
    folder = tmp_path / "run"
    folder.mkdir()
    base = 1_700_000_000_000_000_000
    write(folder / "a.json", doc([kernel()], rank=0, world=2, base=base + 5_000_000_000, cuda_driver_version=12090,
                                 cuda_runtime_version=12040))
    b1 = doc([kernel()], rank=1, world=2, base=base, cuda_driver_version=12080, cuda_runtime_version=12040)
    b1["distributedInfo"]["nccl_version"] = "2.21.5"
    write(folder / "b.json", b1)
    b = load_kineto(folder)
    assert b.wall_origin_s == pytest.approx(1_700_000_000.0)
    assert b.versions == {"cuda_driver_version": "12090, 12080", "cuda_runtime_version": "12040",
                          "nccl_version": "2.21.5"}


def test_epoch_timestamps_are_their_own_wall_clock(tmp_path: Path) -> None:
    """Older Kineto writes epoch microseconds and no base: the origin is 0; a relative trace
    without a base has no wall clock."""
    assert load_kineto(write(tmp_path / "old.json", doc([kernel(ts=1.7e15)]))).wall_origin_s == 0.0
    assert load_kineto(write(tmp_path / "rel.json", doc([kernel(ts=100.0)]))).wall_origin_s is None


def test_rank_from_the_file_name_when_distributed_info_is_missing(tmp_path: Path) -> None:
    b = load_kineto(write(tmp_path / "trace_rank3.json", doc([kernel()], rank=None)))
    assert list(b.sources) == [3] and b.kernels["rank"].tolist() == [3]
    b = load_kineto(write(tmp_path / "trace.json", doc([kernel()], rank=None)))
    assert list(b.sources) == [0]


def test_a_folder_file_with_no_rank_at_all_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "a.json", doc([kernel()], rank=0))
    write(tmp_path / "b.json", doc([kernel()], rank=None))
    with pytest.raises(OvsimError) as e:
        load_kineto(tmp_path)
    assert e.value.source.endswith("b.json") and e.value.field == "distributedInfo.rank"


def comm_trace(kernel_args: dict[str, Any], *, extra: list[dict[str, Any]] | None = None,
               name: str = NCCL_AR) -> list[dict[str, Any]]:
    return [kernel(name, ts=500.0, stream=20, corr=77, **kernel_args), launch(77, 400.0, ext=900), *(extra or [])]


def rpc(ext: int, ts: float, dur: float, tid: int = 11, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 10, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": ext, "Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000,
                     "Group size": 4, "dtype": "BFloat16", "Process Group Name": "7", **args}}


def test_collective_metadata_on_the_kernel(tmp_path: Path) -> None:
    meta = {"Collective name": "allreduce", "In msg nelems": 10, "Out msg nelems": 10, "Group size": 2,
            "dtype": "Half", "Process Group Name": "0", "Seq": 12}
    row = load_kineto(write(tmp_path / "t.json", doc(comm_trace(meta)))).kernels.iloc[0]
    assert (row["kind"], row["collective"], row["dtype"], row["message_bytes"]) == ("collective", "all_reduce",
                                                                                  "float16", 20.0)
    assert (row["group_size"], row["process_group"], row["seq"]) == (2, "0", 12)
    assert (row["algorithm"], row["protocol"]) == ("ring", "LL")


@pytest.mark.parametrize("link", ["kernel external id", "launch external id", "launch inside the op"])
def test_collective_metadata_from_record_param_comms(tmp_path: Path, link: str) -> None:
    if link == "kernel external id":
        extra = [rpc(77, 0.0, 1.0, tid=99)]
    elif link == "launch external id":
        extra = [rpc(900, 0.0, 1.0, tid=99)]
    else:
        # Two nested ops enclose the launch at 400 us on its thread; the inner one describes it.
        extra = [rpc(1, 300.0, 200.0, **{"In msg nelems": 1}), rpc(2, 390.0, 20.0, Seq=3),
                 rpc(3, 402.0, 5.0, **{"In msg nelems": 5})]
    row = load_kineto(write(tmp_path / "t.json", doc(comm_trace({}, extra=extra)))).kernels.iloc[0]
    assert (row["collective"], row["dtype"], row["group_size"], row["process_group"]) == ("all_reduce", "bfloat16",
                                                                                        4, "7")
    assert row["message_bytes"] == 2000.0
    if link == "launch inside the op":
        assert row["seq"] == 3
    else:
        assert pd.isna(row["seq"])


def test_without_metadata_a_collective_keeps_what_its_name_says(tmp_path: Path) -> None:
    unrelated = rpc(5, 0.0, 1.0, tid=99)
    row = load_kineto(write(tmp_path / "t.json", doc(comm_trace({}, extra=[unrelated])))).kernels.iloc[0]
    assert (row["collective"], row["dtype"]) == ("all_reduce", "float32")
    assert pd.isna(row["message_bytes"]) and pd.isna(row["group_size"]) and row["process_group"] == ""


@pytest.mark.parametrize(("coll", "out", "group", "expected"), [
    ("_allgather_base", 800, 8, 200.0), ("reduce_scatter", 100, 8, 1600.0), ("broadcast", 100, 8, 200.0)])
def test_input_size_per_rank_from_the_output_count(tmp_path: Path, coll: str, out: int, group: int,
                                                   expected: float) -> None:
    meta = {"Collective name": coll, "Out msg nelems": out, "Group size": group, "dtype": "BFloat16"}
    name = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    row = load_kineto(write(tmp_path / "t.json", doc(comm_trace(meta, name=name)))).kernels.iloc[0]
    assert row["message_bytes"] == expected


def test_a_kernel_carrying_collective_metadata_is_a_collective(tmp_path: Path) -> None:
    meta = {"Collective name": "allreduce", "In msg nelems": 64, "dtype": "BFloat16", "Group size": 8}
    name = "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)"
    row = load_kineto(write(tmp_path / "t.json", doc(comm_trace(meta, name=name)))).kernels.iloc[0]
    assert (row["kind"], row["collective"], row["message_bytes"]) == ("collective", "all_reduce", 128.0)


def test_stream_waits_become_syncs(tmp_path: Path) -> None:
    events = [kernel(ts=100.0, corr=1, stream=7), launch(1, 50.0),
              kernel(ts=130.0, corr=3, stream=7), launch(3, 70.0),
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventRecord", "pid": 10, "tid": 11, "ts": 60.0,
               "dur": 1.0, "args": {"correlation": 2}},
              {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 20, "ts": 62.0,
               "dur": 1.0, "args": {"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": 7,
                                    "wait_on_cuda_event_record_corr_id": 2, "stream": 20, "correlation": 4,
                                    "device": 0}},
              # Recorded on a stream that had launched nothing: no dependency.
              {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 20, "ts": 63.0,
               "dur": 1.0, "args": {"wait_on_stream": 9, "wait_on_cuda_event_record_corr_id": 2, "stream": 20}}]
    b = load_kineto(write(tmp_path / "t.json", doc(events)))
    assert b.syncs is not None
    assert b.syncs[["rank", "waiting_stream", "recorded_correlation", "recorded_stream"]].values.tolist() == \
        [[0, 20, 1, 7]]
    assert b.syncs["waiting_after_s"].iloc[0] == pytest.approx(62e-6)


# -- device names ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("reported", "spec"), [
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"), ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100-PG509-200", "a100-sxm4-40gb"), ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
    ("NVIDIA H200", "h200-sxm"), ("Tesla V100-SXM2-16GB", "v100-sxm2"), ("Tesla V100-SXM2-32GB", "v100-sxm2"),
    ("AMD Instinct MI300X", "mi300x"), ("NVIDIA B200", "b200"), ("NVIDIA A40", "a40"),
    ("AMD Instinct MI250X/MI250", "mi250x-gcd"),
    # Other parts, and variants with other clocks or SM counts: no spec rather than a wrong one.
    ("AMD Radeon Graphics", None), ("NVIDIA H100 PCIe", None), ("NVIDIA A100-PCIE-40GB", None),
    ("NVIDIA GeForce RTX 4090", None), ("", None), ("a100.yaml", None)])
def test_spec_for_device_name(reported: str, spec: str | None) -> None:
    assert spec_for_device_name(reported) == spec
    assert spec is None or spec in known_gpus()


def _device_names() -> Iterator[str]:
    for p in sorted(TRACES.rglob("*.json.gz")):
        # Every shared trace writes its metadata before traceEvents: parse only that head.
        with gzip.open(p) as f:
            head = f.read(1 << 16)
        cut = head.find(b'"traceEvents"')
        assert cut > 0, p
        props = orjson.loads(head[:cut] + b'"traceEvents": []}').get("deviceProperties", [])
        yield from {d["name"] for d in props}


def test_every_nvidia_or_instinct_name_in_the_shared_traces_has_a_spec() -> None:
    traces()
    names = set(_device_names())
    assert names >= {"NVIDIA A100-PG509-200", "NVIDIA B200", "AMD Instinct MI300X"}
    for name in names - {"AMD Radeon Graphics"}:
        assert spec_for_device_name(name) is not None, name
