"""Calibration files: the loader's checks on the values a file gives."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from ovsim.errors import OvsimError
from ovsim.hw.calib import CALIB_DIR, VERSIONED_NAME, Parameters, load_calibration, read_calib_file
from ovsim.hw.spec import GpuSpec, load_gpu


def _write(path: Path, parameters: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"schema": "ovsim.calib/1", "gpu": "*", "version": 1,
                                    "provenance": {"kind": "test"}, "parameters": parameters,
                                    "sources": dict.fromkeys(parameters, "test")}))
    return path


@pytest.mark.parametrize("path", sorted(CALIB_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_values_are_in_range(path: Path) -> None:
    try:
        cf = read_calib_file(path)
    except OvsimError:
        # Only an old version no prediction loads may be unreadable; versions are never edited.
        newest = max(int(m["version"]) for p in CALIB_DIR.iterdir()
                     if (m := VERSIONED_NAME.match(p.name)) and m["stem"] == path.name.split(".v")[0])
        assert f".v{newest}." not in path.name
        return
    Parameters.model_validate(cf.parameters)


@pytest.mark.parametrize(
    ("parameters", "field", "message"),
    [
        ({"gemm_efficiency": {"fp16": -0.5}}, "parameters.gemm_efficiency.fp16", "greater than 0"),
        ({"gemm_efficiency": {"fp16": 0.0}}, "parameters.gemm_efficiency.fp16", "greater than 0"),
        ({"gemm_efficiency": {"fp16": 1.5}}, "parameters.gemm_efficiency.fp16", "less than or equal to 1"),
        ({"gemm_efficiency": {"fp16": float("nan")}}, "parameters.gemm_efficiency.fp16", "finite"),
        ({"attention_efficiency": 3.0}, "parameters.attention_efficiency", "less than or equal to 1"),
        ({"memory_kernel_efficiency": 0.0}, "parameters.memory_kernel_efficiency", "greater than 0"),
        ({"hbm_achievable_fraction": 2.0}, "parameters.hbm_achievable_fraction", "less than or equal to 1"),
        ({"hbm_mix_efficiency": -1.0}, "parameters.hbm_mix_efficiency", "greater than 0"),
        ({"kernel_overhead_s": -1e-6}, "parameters.kernel_overhead_s", "greater than or equal to 0"),
        ({"nccl_issue_fraction": 5.0}, "parameters.nccl_issue_fraction", "less than or equal to 1"),
        ({"nccl_hbm_weight": {"simple": -1.0}}, "parameters.nccl_hbm_weight.simple", "greater than 0"),
        ({"ce_link_efficiency": -0.5}, "parameters.ce_link_efficiency", "greater than 0"),
        ({"host_link_efficiency": 0.0}, "parameters.host_link_efficiency", "greater than 0"),
        ({"ce_latency_s": -1.0}, "parameters.ce_latency_s", "greater than or equal to 0"),
        ({"power_tensor_w": {"default": -100.0}}, "parameters.power_tensor_w.default", "greater than or equal to 0"),
        ({"nccl_fitted": {"all_reduce/ring/simple/4": {"latency_s": 1e-5, "bus_bandwidth_bytes_per_s": float("inf")}}},
         "parameters.nccl_fitted.all_reduce/ring/simple/4.bus_bandwidth_bytes_per_s", "finite"),
        ({"gemm_eficiency": {"fp16": 0.7}}, "parameters.gemm_eficiency", "Extra inputs"),
        ({"power_control_window_s": 0.07, "power_control_period_s": 0.0}, "parameters.power_control_period_s",
         "where a window is set"),
        ({"power_control_window_s": 0.01, "power_control_period_s": 0.02}, "parameters.power_control_period_s",
         "where a window is set"),
    ],
)
def test_a_value_out_of_range_names_its_file_and_parameter(tmp_path: Path, a100: GpuSpec, parameters: dict[str, Any],
                                                            field: str, message: str) -> None:
    bad = _write(tmp_path / "bad.v1.yaml", parameters)
    # A good file after it: the error still names the file that holds the value.
    good = _write(tmp_path / "good.v1.yaml", {"attention_efficiency": 0.5})
    with pytest.raises(OvsimError) as err:
        load_calibration(a100, "a100-sxm4-40gb", (str(bad), str(good)))
    assert (err.value.source, err.value.field) == (str(bad), field)
    assert message in err.value.message and "\n" not in err.value.one_line()


def test_values_in_range_load_on_top_of_the_shipped_file(tmp_path: Path, a100: GpuSpec) -> None:
    """Values at their range's edge load; a mapping merges key by key over the shipped file's (the
    BF16 efficiency stays the shipped one), and the file is listed after the shipped ones."""
    shipped = load_calibration(a100, "a100-sxm4-40gb")
    ok = _write(tmp_path / "ok.v1.yaml", {"gemm_efficiency": {"fp16": 1.0}, "nccl_issue_fraction": 0.0,
                                          "memory_kernel_efficiency": 1.2, "kernel_overhead_s": 0.0})
    calib = load_calibration(a100, "a100-sxm4-40gb", (str(ok),))
    params = calib.params
    assert params.gemm_eff("fp16") == 1.0 and params.memory_kernel_efficiency == 1.2
    assert params.kernel_overhead_s == 0.0 and shipped.params.kernel_overhead_s > 0
    assert params.gemm_eff("bf16") == shipped.params.gemm_eff("bf16") != 1.0
    assert calib.files == (*shipped.files, "ok.v1.yaml")


HISTORY = Path(__file__).resolve().parents[2] / "calibration" / "history"


@pytest.mark.parametrize("path", sorted(CALIB_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_files_are_the_newest_only_and_name_their_base_by_checksum(path: Path) -> None:
    """One version per GPU ships; it names its base (kept in calibration/history/) by a checksum
    that matches, and embeds no older provenance: a file holding its whole history grew to 10,598
    lines and made parsing most of a predict's start."""
    import hashlib

    stem = VERSIONED_NAME.match(path.name)["stem"]  # type: ignore[index]
    assert [p.name for p in CALIB_DIR.glob(f"{stem}.v*.yaml")] == [path.name]
    prov = read_calib_file(path).provenance
    assert "base_provenance" not in yaml.safe_dump(prov) and "previous_provenance" not in yaml.safe_dump(prov)
    assert len(path.read_text().splitlines()) < 1000
    if not HISTORY.is_dir():
        pytest.skip("calibration/history/ is in the repository, not the wheel")
    base = prov["base"]
    assert hashlib.sha256((HISTORY / base["file"]).read_bytes()).hexdigest() == base["sha256"]
    assert read_calib_file(HISTORY / base["file"]).version == base["version"]


def test_a_cached_file_is_read_again_once_it_changes(tmp_path: Path) -> None:
    p = _write(tmp_path / "x.v1.yaml", {"kernel_overhead_s": 1e-6})
    first = read_calib_file(p)
    first.parameters["kernel_overhead_s"] = 5.0  # an edit by the caller must not reach the cache
    assert read_calib_file(p).parameters["kernel_overhead_s"] == 1e-6
    _write(p, {"kernel_overhead_s": 2.5e-6})
    assert read_calib_file(p).parameters["kernel_overhead_s"] == 2.5e-6


def test_a_merged_calibration_is_shared_until_a_file_changes(tmp_path: Path) -> None:
    gpu = load_gpu("h100-sxm5-80gb")
    extra = _write(tmp_path / "h100-sxm5-80gb.v1.yaml", {"kernel_overhead_s": 1e-6})
    first = load_calibration(gpu, "h100-sxm5-80gb", (str(extra),))
    assert load_calibration(gpu, "h100-sxm5-80gb", (str(extra),)) is first
    assert first.params.kernel_overhead_s == 1e-6
    # A rewrite of the same size keeps neither the modification time nor the merged result.
    _write(extra, {"kernel_overhead_s": 2e-6})
    os.utime(extra, ns=(extra.stat().st_atime_ns, extra.stat().st_mtime_ns + 10**9))
    again = load_calibration(gpu, "h100-sxm5-80gb", (str(extra),))
    assert again is not first and again.params.kernel_overhead_s == 2e-6
    # A file for another GPU is refused on every load, not only the first.
    other = _write(tmp_path / "other.v1.yaml", {"kernel_overhead_s": 1e-6})
    other.write_text(other.read_text().replace("gpu: '*'", "gpu: a100-sxm4-80gb"))
    for _ in range(2):
        with pytest.raises(OvsimError, match="not 'H100"):
            load_calibration(gpu, "h100-sxm5-80gb", (str(other),))


def test_a_folders_newest_file_follows_new_versions_at_once_and_later(tmp_path: Path) -> None:
    """A version written just after a lookup is found (the folder changed within its clock tick),
    and so is one written to a folder whose cached lookup is old."""
    from ovsim.hw.calib import newest_file

    _write(tmp_path / "g.v1.yaml", {"kernel_overhead_s": 1e-6})
    assert newest_file("g", tmp_path) == tmp_path / "g.v1.yaml"
    _write(tmp_path / "g.v2.yaml", {"kernel_overhead_s": 1e-6})
    assert newest_file("g", tmp_path) == tmp_path / "g.v2.yaml"
    old = tmp_path.stat().st_mtime_ns - 10 * 10**9
    os.utime(tmp_path, ns=(old, old))
    assert newest_file("g", tmp_path) == tmp_path / "g.v2.yaml"  # cached for this folder state
    _write(tmp_path / "g.v3.yaml", {"kernel_overhead_s": 1e-6})
    assert newest_file("g", tmp_path) == tmp_path / "g.v3.yaml"
    (tmp_path / "g.v3.yaml").unlink()
    assert newest_file("g", tmp_path) == tmp_path / "g.v2.yaml"
    assert newest_file("g", tmp_path / "nowhere") is None


def test_a_calibration_path_is_the_file_the_system_opens(tmp_path: Path) -> None:
    """A path through a link and "..", and a link repointed to a file of the same size and time:
    the parameters are those of the file the path leads to now."""
    gpu = load_gpu("h100-sxm5-80gb")
    (tmp_path / "real" / "dir").mkdir(parents=True)
    (tmp_path / "cal").mkdir()
    _write(tmp_path / "real" / "x.yaml", {"kernel_overhead_s": 1e-6})
    _write(tmp_path / "cal" / "x.yaml", {"kernel_overhead_s": 9e-6})
    (tmp_path / "cal" / "link").symlink_to(tmp_path / "real" / "dir")
    through = str(tmp_path / "cal" / "link" / ".." / "x.yaml")  # the system reads real/x.yaml
    assert load_calibration(gpu, "h100-sxm5-80gb", (through,)).params.kernel_overhead_s == 1e-6
    a = _write(tmp_path / "a.yaml", {"kernel_overhead_s": 3e-6})
    b = _write(tmp_path / "b.yaml", {"kernel_overhead_s": 4e-6})
    os.utime(b, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns))
    assert a.stat().st_size == b.stat().st_size
    link = tmp_path / "current.yaml"
    link.symlink_to(a)
    assert load_calibration(gpu, "h100-sxm5-80gb", (str(link),)).params.kernel_overhead_s == 3e-6
    link.unlink()
    link.symlink_to(b)
    assert load_calibration(gpu, "h100-sxm5-80gb", (str(link),)).params.kernel_overhead_s == 4e-6
