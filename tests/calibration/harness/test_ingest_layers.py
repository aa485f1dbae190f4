"""calibration/harness/ingest_layers.py on hand-made layers.py output folders: what it writes, what it
refuses; and ovsim.validate.measured_layers reading the result."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from ingest_layers import main

from ovsim.validate.measured_layers import measured_phases_s, read_run

# A shape as layers.py wrote it before its `attention`, `dtype` and `tp` fields existed.
OLD_SHAPE = {"name": "gpt3-175b-tp8_s2048_mb1", "hidden": 12288, "q_heads": 12, "kv_heads": 12, "head_dim": 128,
             "ffn": 6144, "gated": False, "rms_norm": False, "seq": 2048, "micro_batch": 1, "layers": 2}


def make_run(root: Path, name: str, fwd_ms: list[float]) -> Path:
    run = root / name
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"gpu": "NVIDIA H200", "commit": "abc", "shapes": [OLD_SHAPE]}))
    pd.DataFrame({"shape": OLD_SHAPE["name"], "condition": "sustained", "iteration": range(len(fwd_ms)),
                  "fwd_ms": fwd_ms, "bwd_ms": [2 * x for x in fwd_ms]}).to_parquet(run / "iterations.parquet")
    pd.DataFrame({"shape": [OLD_SHAPE["name"]], "condition": ["sustained"], "name": ["nvjet_gemm"],
                  "ts_us": [0.0], "dur_us": [3000.0]}).to_parquet(run / "kernels.parquet")
    pd.DataFrame({"shape": [OLD_SHAPE["name"]], "condition": ["sustained"], "name": ["F.qkv"],
                  "ts_us": [0.0], "dur_us": [3000.0]}).to_parquet(run / "annotations.parquet")
    pd.DataFrame({"label": [f"{OLD_SHAPE['name']}/sustained"], "t_s": [1.0], "sm_mhz": [1500],
                  "power_w": [690.0], "temp_c": [60]}).to_parquet(run / "nvml.parquet")
    return run


def ingest(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["ingest_layers.py", *args])
    main()


def test_two_runs_become_one_data_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = make_run(tmp_path, "a", [3.0, 3.2, 3.1]), make_run(tmp_path, "b", [3.3, 3.3, 3.5])
    dest = tmp_path / "set"
    ingest(monkeypatch, "--dest", str(dest), f"layers={a}", f"layers_repeat={b}")
    data, manifests = read_run(dest)
    assert list(manifests) == ["layers", "layers_repeat"]
    # Fields added after the run: what it ran (flash attention, BF16) and the TP degree of its name.
    shape = manifests["layers"]["shapes"][0]
    assert (shape["attention"], shape["dtype"], shape["tp"]) == ("flash", "bf16", 8)
    assert set(data["table"]) == {"iterations", "kernels", "annotations", "nvml"}
    phases, n = measured_phases_s(data, "layers_repeat", OLD_SHAPE["name"])
    assert n == 3 and phases == pytest.approx({"fwd": 3.3e-3, "bwd": 6.6e-3})
    prov = json.loads((dest / "PROVENANCE.json").read_text())
    for name, entry in prov["files"].items():
        assert hashlib.sha256((dest / name).read_bytes()).hexdigest() == entry["sha256"]
    read = prov["parts"]["layers"]["read"]["iterations.parquet"]["sha256"]
    assert read == hashlib.sha256((a / "iterations.parquet").read_bytes()).hexdigest()


def test_a_folder_missing_a_table_or_an_existing_destination_is_refused(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(tmp_path, "a", [3.0])
    (run / "nvml.parquet").unlink()
    with pytest.raises(SystemExit, match=r"nvml\.parquet: missing"):
        ingest(monkeypatch, "--dest", str(tmp_path / "set"), f"layers={run}")
    assert not (tmp_path / "set").exists()
    with pytest.raises(SystemExit, match="exists"):
        ingest(monkeypatch, "--dest", str(tmp_path), f"layers={run}")
    with pytest.raises(SystemExit, match="PART=RUN_DIR"):
        ingest(monkeypatch, "--dest", str(tmp_path / "other"), str(run))
