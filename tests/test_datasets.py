"""The registry of measured data sets (calibration/data/datasets.yaml, ovsim.validate.datasets)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ovsim.cli import main
from ovsim.errors import OvsimError
from ovsim.validate import datasets

ROOT = Path(__file__).resolve().parents[1]


def test_every_registered_data_set_is_a_folder_of_the_repository() -> None:
    reg = datasets.entries
    families = ("overlap", "gemm", "shapes", "hbm", "copy", "power", "clock", "clock_shares", "smloss", "dispatch",
                "framework", "framework_copy", "shaping")
    for family in families:
        assert reg(family), family
        for e in reg(family):
            assert (ROOT / "calibration" / "data" / e["set"]).is_dir(), e
            assert (ROOT / "ovsim" / "hw" / "specs" / "gpus" / f"{e['gpu']}.yaml").is_file(), e


def test_each_fitted_family_names_one_set_per_gpu() -> None:
    assert set(datasets.fitted("smloss")) == {"h100-sxm5-80gb", "h200-sxm"}
    assert list(datasets.fitted("framework").values()) == ["h100-sxm5-80gb/2026-11-27-d"]


def test_without_the_data_validate_measured_says_where_to_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OVSIM_DATA", str(tmp_path))
    with pytest.raises(OvsimError, match="set OVSIM_DATA"):
        datasets.require()
    assert main(["validate", "--measured"]) == 2
    assert "OVSIM_DATA" in capsys.readouterr().err


def test_a_registry_entry_without_a_gpu_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "datasets.yaml").write_text("overlap:\n  - {set: h100-sxm5-80gb/x}\n")
    monkeypatch.setenv("OVSIM_DATA", str(tmp_path))
    with pytest.raises(OvsimError, match="needs 'set' and 'gpu'") as e:
        datasets.entries("overlap")
    assert e.value.field == "overlap.0"
