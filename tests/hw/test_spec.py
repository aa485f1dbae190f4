"""The shipped GPU and system spec files, and the loader's checks on them.

Derived checks compare the spec numbers with figures that do not come from the same table: the tensor-core
throughput per SM per clock that follows from the SM design (A100: 4 tensor cores x 256 FP16 FMA x 2 = 2048
FLOP/clk; H100: 4 x 512 x 2 = 4096), and NVLink totals from the link count.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pydantic
import pytest
import yaml

from ovsim.errors import OvsimError
from ovsim.hw import spec, validation
from ovsim.hw.spec import (
    GPU_SECTIONS,
    SPEC_DIR,
    GpuSpec,
    SystemSpec,
    known_gpus,
    known_systems,
    load_gpu,
    load_system,
)

SHIPPED_GPUS = sorted(p.stem for p in (SPEC_DIR / "gpus").glob("*.yaml"))
SHIPPED_SYSTEMS = sorted(p.stem for p in (SPEC_DIR / "systems").glob("*.yaml"))

EXPECTED_GPUS = {
    "a100-sxm4-40gb",
    "a100-sxm4-80gb",
    "a40",
    "b200",
    "h100-sxm5-80gb",
    "h200-sxm",
    "mi250x-gcd",
    "mi300x",
    "v100-sxm2",
}
EXPECTED_SYSTEMS = {
    "a100x4",
    "a40x4-pcie",
    "dgx-a100",
    "dgx-a100-80gb",
    "h100x4",
    "h100x8-pcie",
    "hgx-h100",
    "hgx-h200",
    "mi250x-8gcd",
    "v100x8-dgx1",
}


def _clear_caches() -> None:
    spec._index.cache_clear()
    spec._load_gpu_path.cache_clear()
    spec._load_system_path.cache_clear()


@pytest.fixture(autouse=True)
def _only_shipped_specs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts from the shipped spec folders, whatever the caller's environment says."""
    monkeypatch.delenv("OVSIM_SPEC_PATH", raising=False)
    _clear_caches()
    yield
    _clear_caches()


def _shipped_data(kind: str, stem: str) -> dict[str, Any]:
    data = yaml.safe_load((SPEC_DIR / kind / f"{stem}.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _per_sm_per_clock(gpu: GpuSpec, precision: str) -> float:
    return gpu.peak_flops_per_s(precision) / (gpu.sm.count * gpu.clocks.compute_clock_hz)


# --- every shipped file loads --------------------------------------------------------------------------


def test_expected_files_are_shipped() -> None:
    assert set(SHIPPED_GPUS) >= EXPECTED_GPUS
    assert set(SHIPPED_SYSTEMS) >= EXPECTED_SYSTEMS
    assert set(known_gpus()) == set(SHIPPED_GPUS)
    assert set(known_systems()) == set(SHIPPED_SYSTEMS)


@pytest.mark.parametrize("stem", SHIPPED_GPUS)
def test_shipped_gpu_loads(stem: str) -> None:
    gpu = load_gpu(stem)
    assert isinstance(gpu, GpuSpec)
    assert stem == gpu.name.lower(), "file stem must be the lower-cased name"
    for section in GPU_SECTIONS:
        assert gpu.sources[section].strip()
    assert set(gpu.compute.tensor_precisions) <= set(gpu.compute.peak_flops_per_s)
    # The name and every alias lead back to the same file.
    for key in [gpu.name, *gpu.aliases]:
        assert load_gpu(key) == gpu, key


@pytest.mark.parametrize("stem", SHIPPED_GPUS)
def test_shipped_gpu_is_plausible(stem: str) -> None:
    gpu = load_gpu(stem)
    assert gpu.sm.warp_size == (64 if gpu.vendor == "amd" else 32)
    assert gpu.sm.max_threads_per_sm % gpu.sm.warp_size == 0
    assert gpu.sm.registers_per_sm % gpu.sm.register_alloc_unit == 0
    assert gpu.memory.l2_bytes < gpu.memory.capacity_bytes
    # Dense tensor/matrix rates are at least the plain FP32 rate.
    for precision in gpu.compute.tensor_precisions:
        if precision != "fp64":
            assert gpu.peak_flops_per_s(precision) >= gpu.peak_flops_per_s("fp32"), precision


def test_names_and_aliases_are_unique_across_files() -> None:
    owner: dict[str, str] = {}
    for stem in SHIPPED_GPUS:
        gpu = load_gpu(stem)
        for key in {spec._norm(k) for k in [stem, gpu.name, *gpu.aliases]}:
            assert owner.setdefault(key, stem) == stem, f"{key!r} names both {owner[key]} and {stem}"


@pytest.mark.parametrize("stem", SHIPPED_SYSTEMS)
def test_shipped_system_loads_and_its_gpu_exists(stem: str) -> None:
    system = load_system(stem)
    assert isinstance(system, SystemSpec)
    assert stem == system.name.lower()
    gpu = load_gpu(system.gpu)
    assert system.gpu_count >= 2
    if system.nvls:
        assert system.topology == "nvswitch" and gpu.vendor == "nvidia"
    if system.topology in ("nvswitch", "mesh"):
        assert gpu.links.count > 0


# --- the loader rejects bad files -----------------------------------------------------------------------


def test_unknown_top_level_key_is_rejected(tmp_path: Path) -> None:
    data = _shipped_data("gpus", "a100-sxm4-40gb")
    data["l2_size_typo"] = 1
    path = _write(tmp_path / "x.yaml", data)
    with pytest.raises(OvsimError) as err:
        load_gpu(str(path))
    assert err.value.field == "l2_size_typo"
    assert "l2_size_typo" in str(err.value) and str(path) in str(err.value)


def test_unknown_nested_key_is_rejected(tmp_path: Path) -> None:
    data = _shipped_data("gpus", "a100-sxm4-40gb")
    data["sm"]["max_warps_per_sm"] = 64
    path = _write(tmp_path / "x.yaml", data)
    with pytest.raises(OvsimError) as err:
        load_gpu(str(path))
    assert err.value.field == "sm.max_warps_per_sm"


def test_unknown_system_key_is_rejected(tmp_path: Path) -> None:
    data = _shipped_data("systems", "dgx-a100")
    data["links_per_pairs"] = 2
    path = _write(tmp_path / "x.yaml", data)
    with pytest.raises(OvsimError) as err:
        load_system(str(path))
    assert err.value.field == "links_per_pairs"


@pytest.mark.parametrize("section", GPU_SECTIONS)
def test_missing_source_section_is_rejected(tmp_path: Path, section: str) -> None:
    data = _shipped_data("gpus", "a100-sxm4-40gb")
    del data["sources"][section]
    path = _write(tmp_path / "x.yaml", data)
    with pytest.raises(OvsimError, match=rf"sources must cite every section; missing {section}"):
        load_gpu(str(path))


def test_blank_source_text_is_rejected(tmp_path: Path) -> None:
    data = _shipped_data("gpus", "h100-sxm5-80gb")
    data["sources"]["links"] = "   "
    path = _write(tmp_path / "x.yaml", data)
    with pytest.raises(OvsimError, match="missing links"):
        load_gpu(str(path))


def test_inconsistent_power_is_rejected(tmp_path: Path) -> None:
    data = _shipped_data("gpus", "a40")
    data["power"]["idle_w"] = data["power"]["min_power_limit_w"] + 1
    path = _write(tmp_path / "x.yaml", data)
    with pytest.raises(OvsimError, match="idle_w < min_power_limit_w"):
        load_gpu(str(path))


def test_non_utf8_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(OvsimError) as err:
        load_gpu(str(path))
    assert err.value.source == str(path)
    assert "not UTF-8" in err.value.one_line() and "0xff" in err.value.one_line()


def test_nan_and_inf_in_a_spec_are_rejected(tmp_path: Path) -> None:
    data = _shipped_data("gpus", "a100-sxm4-40gb")
    data["memory"]["bandwidth_bytes_per_s"] = float("inf")
    path = _write(tmp_path / "x.yaml", data)
    with pytest.raises(OvsimError) as err:
        load_gpu(str(path))
    assert err.value.field == "memory.bandwidth_bytes_per_s" and "finite" in err.value.message


class _Inline(pydantic.BaseModel):
    gpu: str
    gpu_count: pydantic.PositiveInt


class _Pick(pydantic.BaseModel):
    system: str | _Inline
    ranks: Literal["all"] | list[pydantic.NonNegativeInt] = "all"

    @pydantic.model_validator(mode="after")
    def _check(self) -> _Pick:
        if self.ranks == [7]:
            raise ValueError("rank 7 is unlucky")
        return self


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        # The alternative that got furthest says what is wrong, without the type step in the field.
        ({"system": {"gpu": "x", "gpu_count": 0}}, "system.gpu_count", "greater than 0"),
        ({"system": "a", "ranks": [-1]}, "ranks.0", "greater than or equal to 0"),
        # Every alternative failed on type: each is named.
        ({"system": 5}, "system", "valid string, or Input should be a valid dictionary or instance of _Inline"),
        # A validator's own message, without pydantic's "Value error, " prefix.
        ({"system": "a", "ranks": [7]}, "", "rank 7 is unlucky"),
    ],
)
def test_validation_error_names_the_field_that_is_wrong(data: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        _Pick.model_validate(data)
    e = validation.validation_error(err.value, "f.yaml")
    assert (e.field, e.source) == (field, "f.yaml")
    assert message in e.message and "Value error" not in e.message and "\n" not in e.one_line()


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(OvsimError) as err:
        load_gpu("Z9000")
    assert err.value.field == "gpu"
    assert "a100-sxm4-40gb" in err.value.message


# --- lookup by the names traces use ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("A100-PG509-200", "A100-SXM4-40GB"),
        ("NVIDIA A100-PG509-200", "A100-SXM4-40GB"),
        ("a100 pg509 200", "A100-SXM4-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
        ("NVIDIA H200", "H200-SXM"),
        ("NVIDIA B200", "B200"),
        ("Tesla V100-SXM2-32GB", "V100-SXM2"),
        ("Tesla V100-SXM2-16GB", "V100-SXM2"),
        ("AMD Instinct MI300X", "MI300X"),
        ("NVIDIA A40", "A40"),
    ],
)
def test_alias_lookup(name: str, expected: str) -> None:
    assert load_gpu(name).name == expected


# --- derived checks against independent published numbers ------------------------------------------------


@pytest.mark.parametrize("stem", ["a100-sxm4-40gb", "a100-sxm4-80gb"])
def test_a100_tensor_rate_per_sm(stem: str) -> None:
    gpu = load_gpu(stem)
    # 312e12 / (108 * 1.41e9) = 2048.9: 4 tensor cores x 256 FMA/clk x 2 FLOP.
    assert _per_sm_per_clock(gpu, "bf16") == pytest.approx(2048, rel=0.01)
    assert _per_sm_per_clock(gpu, "fp16") == pytest.approx(2048, rel=0.01)


@pytest.mark.parametrize("stem", ["h100-sxm5-80gb", "h200-sxm"])
def test_hopper_tensor_rate_per_sm(stem: str) -> None:
    gpu = load_gpu(stem)
    # 989.4e12 / (132 * 1.83e9) = 4096: 4 tensor cores x 512 FMA/clk x 2 FLOP; FP8 twice that.
    assert _per_sm_per_clock(gpu, "bf16") == pytest.approx(4096, rel=0.01)
    assert _per_sm_per_clock(gpu, "fp8") == pytest.approx(8192, rel=0.01)


def test_v100_tensor_rate_per_sm() -> None:
    # 8 tensor cores x 64 FMA/clk x 2 FLOP = 1024 FLOP/clk/SM.
    assert _per_sm_per_clock(load_gpu("v100-sxm2"), "fp16") == pytest.approx(1024, rel=0.01)


@pytest.mark.parametrize(("stem", "expected"), [("mi250x-gcd", 1024), ("mi300x", 2048)])
def test_amd_matrix_rate_per_cu(stem: str, expected: int) -> None:
    # CDNA2: 1024 dense FP16 FLOP/clk/CU; CDNA3: 2048.
    assert _per_sm_per_clock(load_gpu(stem), "bf16") == pytest.approx(expected, rel=0.01)


def test_mi250x_gcd_is_half_a_module() -> None:
    gcd = load_gpu("mi250x-gcd")
    assert 2 * gcd.sm.count == 220
    assert 2 * gcd.peak_flops_per_s("bf16") == pytest.approx(383e12, rel=0.01)
    assert 2 * gcd.memory.capacity_bytes == pytest.approx(128e9)


@pytest.mark.parametrize(
    ("stem", "per_direction"),
    [
        ("h100-sxm5-80gb", 450e9),
        ("h200-sxm", 450e9),
        ("a100-sxm4-40gb", 300e9),
        ("v100-sxm2", 150e9),
        ("b200", 900e9),
    ],
)
def test_nvlink_total_per_direction(stem: str, per_direction: float) -> None:
    assert load_gpu(stem).links.bandwidth_bytes_per_s == pytest.approx(per_direction)


def test_a40_bridge_is_112_5_gb_s_bidirectional() -> None:
    assert 2 * load_gpu("a40").links.bandwidth_bytes_per_s == pytest.approx(112.5e9)


# --- adding parts without touching the package -----------------------------------------------------------


def test_spec_path_adds_a_gpu_and_a_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "site-specs"
    gpu = _shipped_data("gpus", "a100-sxm4-40gb")
    gpu.update(name="Lab-GPU-9000", aliases=["My Lab GPU"])
    _write(folder / "gpus" / "lab-gpu-9000.yaml", gpu)
    flat = dict(gpu, name="Flat-GPU", aliases=[])
    _write(folder / "flat-gpu.yaml", flat)
    system = _shipped_data("systems", "a100x4")
    system.update(name="Lab-Node", gpu="my lab gpu")
    _write(folder / "systems" / "lab-node.yaml", system)

    with pytest.raises(OvsimError):
        load_gpu("My Lab GPU")

    monkeypatch.setenv("OVSIM_SPEC_PATH", str(folder))
    _clear_caches()
    assert load_gpu("My Lab GPU").name == "Lab-GPU-9000"
    assert load_gpu("flat-gpu").name == "Flat-GPU"
    assert {"lab-gpu-9000", "flat-gpu"} <= set(known_gpus())
    node = load_system("lab-node")
    assert load_gpu(node.gpu).name == "Lab-GPU-9000"
    # Shipped parts are still found, and a flat GPU file is not mistaken for a system.
    assert load_gpu("h100-sxm5-80gb").name == "H100-SXM5-80GB"
    assert "flat-gpu" not in known_systems()
    assert "lab-node" not in known_gpus()


def test_compute_capability_reads_the_sm_architecture() -> None:
    assert spec.load_gpu("h100-sxm5-80gb").compute_capability == 90
    assert spec.load_gpu("b200").compute_capability == 100
    assert spec.load_gpu("v100-sxm2").compute_capability == 70
    assert spec.load_gpu("mi300x").compute_capability is None  # a gfx target


def test_a_plain_launch_fills_a_tier_one_sm_per_tpc_before_the_second_ones() -> None:
    """The H200's measured order (calibration/data/h200-sxm/2026-11-27-e, clusters.json): SMs 124,
    126, 128, 130 (one TPC each of units 10-13), then 125-131, then one SM of each TPC across
    GPCs 0-7 in turn; GPC 0's four TPCs run out after four rounds."""
    placement = load_gpu("h200-sxm").sm.placement
    assert placement is not None
    fill = placement.plain_fill()
    assert len(fill) == 132 and sorted(fill) == sorted(
        u for u, sms in enumerate(placement.unit_sms()) for _ in range(sms))
    assert fill[:16] == (10, 11, 12, 13, 10, 11, 12, 13, 0, 1, 2, 3, 4, 5, 6, 7)
    assert fill[8 + 32:8 + 39] == (1, 2, 3, 4, 5, 6, 7)


@pytest.mark.parametrize(("change", "message"), [
    ({"unit_tpcs": [4, 8, 8, 8, 8, 8, 8, 8, 1, 1, 1, 1, 1, 2]}, "placement units hold 134 SMs"),
    ({"fill_tiers": [[10, 11, 12, 13], [0, 1, 2, 3, 4, 5, 6, 7]]}, "must name each of the 14 units once"),
])
def test_a_placement_that_does_not_match_the_sms_is_rejected(tmp_path: Path, change: dict[str, Any],
                                                            message: str) -> None:
    data = _shipped_data("gpus", "h200-sxm")
    data["sm"]["placement"] = {**data["sm"]["placement"], **change}
    path = _write(tmp_path / "x.yaml", data)
    with pytest.raises(OvsimError, match=message):
        load_gpu(str(path))
