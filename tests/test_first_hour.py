"""The README's replay, import and calibrate commands run as written on the shipped sample trace."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ovsim.cli import main

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "examples" / "traces" / "h100-gemm-beside-16-channels.json.gz"


def test_the_readme_runs_its_commands_on_the_sample_trace() -> None:
    readme = (ROOT / "README.md").read_text()
    assert f"T=examples/traces/{TRACE.name}" in readme
    for command in ("ovsim replay $T --timeline replay.json", "ovsim replay $T --gpu h100-sxm5-80gb --json",
                    "ovsim import examples/traces/ -o kernels.parquet",
                    "ovsim calibrate examples/traces/ --gpu h100-sxm5-80gb -o mycalib/",
                    "ovsim replay $T --calibration mycalib/"):
        assert command in readme


def test_replay_import_and_calibrate_on_the_sample_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["replay", str(TRACE), "--gpu", "h100-sxm5-80gb", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    # The trace: the GEMM four times alone, four times beside the 16 channels (all four scored).
    assert summary["scored_kernels"] == 4 and summary["mape_pct"] < summary["naive_mape_pct"]
    # A run's ranks in subfolders are found.
    nested = tmp_path / "run" / "rank0"
    nested.mkdir(parents=True)
    shutil.copy(TRACE, nested / TRACE.name)
    assert main(["import", str(tmp_path / "run"), "-o", str(tmp_path / "k.parquet"), "--quiet"]) == 0
    assert main(["calibrate", "examples/traces/", "--gpu", "h100-sxm5-80gb", "-o", str(tmp_path / "mycalib"),
                 "--fit", "contention"]) == 0
    (written,) = (tmp_path / "mycalib").glob("h100-sxm5-80gb.v*.yaml")
    capsys.readouterr()
    assert main(["replay", str(TRACE), "--calibration", str(written), "--quiet"]) == 0
    # Run twice, the folder holds two versions; the folder stands for the newest, and says so.
    assert main(["calibrate", "examples/traces/", "--gpu", "h100-sxm5-80gb", "-o", str(tmp_path / "mycalib"),
                 "--fit", "contention", "--quiet"]) == 0
    newest = max((tmp_path / "mycalib").glob("h100-sxm5-80gb.v*.yaml"), key=lambda p: int(p.stem.split(".v")[1]))
    assert newest != written
    capsys.readouterr()
    assert main(["replay", str(TRACE), "--calibration", str(tmp_path / "mycalib")]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("calibrated ")]
    assert line.endswith(f".yaml, {newest.name}")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["replay", str(TRACE), "--calibration", str(empty)]) == 2
    assert "no h100-sxm5-80gb.vN.yaml or default.vN.yaml in this folder" in capsys.readouterr().err


def test_the_readme_command_table_runs_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each example of the README's table of commands, run from a copy of the examples: exit 0 (the
    validate row, 1: out of the box a check misses, as the README says)."""
    import shlex

    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    rows = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `")]
    cells = [line.split("|")[2].strip() for line in rows]
    commands = [c.strip("`") for c in cells if c.startswith("`ovsim ")]
    assert len(commands) == 9
    for command in commands:
        args = shlex.split(command)[1:]
        expected = 1 if args[0] == "validate" else 0
        assert main([*args, "--quiet"] if args[0] not in ("specs", "compare", "sweep") else args) == expected, command
        capsys.readouterr()
