"""A sweep's results folder (ovsim.sweep_journal): results kept as they finish, an interrupted sweep
resumed predicting only what is missing and giving the uninterrupted table, and a folder of
another sweep, of something else or with a damaged part refused with the file named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import ovsim.sweep as sweep_module
from ovsim.cli import main
from ovsim.errors import OvsimError
from ovsim.sweep import read_results, sweep

EXAMPLE = Path(__file__).parent.parent / "examples" / "gemm-allreduce-h100x4-priority.yaml"
AXES: dict[str, list[Any]] = {"ops.gemm.m": [2048, 4096, 8192], "knobs.comm_priority": ["normal", "high"]}


class Stop(Exception):
    """Stands for Ctrl-C part-way through a sweep."""


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the predictions the sweep makes (in this process)."""
    calls: list[int] = []
    real = sweep_module._predict_summary

    def counted(*a: Any) -> dict[str, Any]:
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(sweep_module, "_predict_summary", counted)
    return calls


@pytest.mark.parametrize("batch", [1, 100])
def test_an_interrupted_sweep_resumes_with_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           batch: int) -> None:
    whole = sweep(EXAMPLE, AXES)
    folder = tmp_path / "results"
    real_journal = sweep_module._journal

    def journal(*a: Any) -> Any:
        j = real_journal(*a)
        j.batch = batch  # 100: nothing is written until the sweep stops
        return j

    monkeypatch.setattr(sweep_module, "_journal", journal)

    def stop_after_four(done: int, total: int) -> None:
        if done == 4:
            raise Stop

    with pytest.raises(Stop):
        sweep(EXAMPLE, AXES, results=folder, progress=stop_after_four)
    assert len(list(folder.glob("part-*.parquet"))) == (4 if batch == 1 else 1)
    # The folder alone gives the rows finished so far.
    part_way = read_results(folder)
    pd.testing.assert_frame_equal(part_way, whole.iloc[:4])
    assert part_way.attrs["points"] == 6
    calls = _counting(monkeypatch)
    resumed = sweep(EXAMPLE, AXES, results=folder)
    assert len(calls) == 2  # only the two combinations not kept
    pd.testing.assert_frame_equal(resumed, whole)
    # Once complete, the folder alone gives the table.
    calls.clear()
    pd.testing.assert_frame_equal(sweep(EXAMPLE, AXES, results=folder), whole)
    assert calls == []
    pd.testing.assert_frame_equal(read_results(folder), whole)


def test_the_folder_alone_gives_the_table(tmp_path: Path) -> None:
    """Axis values JSON carries (None, floats, lists of text) come back as given."""
    axes: dict[str, list[Any]] = {"power.cap_w": [None, 300.0], "ops.gemm.precision": ["fp16", "bf16"]}
    whole = sweep(EXAMPLE, axes, results=tmp_path / "r", mode="analytic")
    back = read_results(tmp_path / "r")
    pd.testing.assert_frame_equal(back, whole)
    assert back["power.cap_w"].tolist() == [None, None, 300.0, 300.0]


def test_reading_what_is_not_a_results_folder_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(OvsimError, match=r"has no sweep\.json") as e:
        read_results(tmp_path)
    assert e.value.source == str(tmp_path)
    (tmp_path / "sweep.json").write_text(json.dumps({"fingerprint": "x", "points": 2}))
    with pytest.raises(OvsimError, match="names no axes") as e:
        read_results(tmp_path)
    assert e.value.field == "axes"
    (tmp_path / "sweep.json").write_text(json.dumps({"fingerprint": "x", "points": 3, "axes": [["a", [1, 2]]]}))
    with pytest.raises(OvsimError, match="make 2 combinations, not its 3"):
        read_results(tmp_path)


def test_a_folder_of_another_sweep_or_of_something_else_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    sweep(EXAMPLE, {"ops.gemm.m": [2048]}, results=folder)
    with pytest.raises(OvsimError, match="another sweep") as e:
        sweep(EXAMPLE, {"ops.gemm.m": [4096]}, results=folder)
    assert e.value.source == str(folder)
    with pytest.raises(OvsimError, match="another sweep"):
        sweep(EXAMPLE, {"ops.gemm.m": [2048]}, results=folder, mode="analytic")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(OvsimError, match=r"not empty and has no sweep\.json"):
        sweep(EXAMPLE, {"ops.gemm.m": [2048]}, results=other)
    # A file where the folder should be: said so, and the file left as it was.
    (tmp_path / "a.txt").write_text("mine")
    with pytest.raises(OvsimError, match="is a file: give a folder"):
        sweep(EXAMPLE, {"ops.gemm.m": [2048]}, results=tmp_path / "a.txt")
    assert (tmp_path / "a.txt").read_text() == "mine"


def test_a_damaged_part_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    sweep(EXAMPLE, {"ops.gemm.m": [2048, 4096]}, results=folder)
    part = sorted(folder.glob("part-*.parquet"))[0]
    part.write_bytes(b"not parquet")
    with pytest.raises(OvsimError, match="not a readable part") as e:
        sweep(EXAMPLE, {"ops.gemm.m": [2048, 4096]}, results=folder)
    assert e.value.source == str(part)


def test_sweep_command_keeps_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "r"
    args = ["sweep", str(EXAMPLE), "--axis", "ops.gemm.m=2048,4096", "--results", str(folder), "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["results"] == {"folder": str(folder), "read_back": 0, "predicted": 2}
    assert (folder / "sweep.json").is_file() and list(folder.glob("part-*.parquet"))
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["points"] == first["points"]
    assert again["results"] == {"folder": str(folder), "read_back": 2, "predicted": 0}
    assert main(args[:-1]) == 0
    assert f"results    {folder}: 2 of 2 combinations read back, 0 predicted" in capsys.readouterr().out


def test_the_sweep_bar_counts_and_says_the_time_left(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from ovsim.cli import common

    clock = iter([100.0, 102.0, 104.0])
    monkeypatch.setattr(common.time, "monotonic", lambda: next(clock))
    bar = common.Progress(quiet=False)
    bar.on = True  # as on a terminal
    bar.count("sweeping", 10, 110, "combinations")  # resumed: 10 were already done
    bar.count("sweeping", 30, 110, "combinations")  # 20 in 2 s: 80 left take 8 s
    err = capsys.readouterr().err
    assert "sweeping [##" in err and "30/110 combinations, 8 s left" in err
    bar.count("sweeping", 110, 110, "combinations")
    assert capsys.readouterr().err.endswith("[" + "#" * 30 + "] 110/110 combinations")


def test_the_same_axes_in_another_order_are_another_sweep(tmp_path: Path) -> None:
    """The combinations are numbered in the axes' order, so a folder of one order cannot serve the
    other (it would hand each row another's result)."""
    folder = tmp_path / "results"
    sweep(EXAMPLE, AXES, results=folder)
    with pytest.raises(OvsimError, match="another sweep"):
        sweep(EXAMPLE, dict(reversed(list(AXES.items()))), results=folder)


def test_a_result_kept_twice_alike_is_one_and_unlike_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    whole = sweep(EXAMPLE, {"ops.gemm.m": [2048, 4096]}, results=folder)
    part = sorted(folder.glob("part-*.parquet"))[0]
    df = pd.read_parquet(part)
    df.to_parquet(folder / "part-000100.parquet", index=False)  # a part written again
    pd.testing.assert_frame_equal(sweep(EXAMPLE, {"ops.gemm.m": [2048, 4096]}, results=folder), whole)
    df.assign(summary=df["summary"].str.replace('"makespan_s": ', '"makespan_s": 1', regex=False)).to_parquet(
        folder / "part-000100.parquet", index=False)
    with pytest.raises(OvsimError, match="kept twice with different results"):
        sweep(EXAMPLE, {"ops.gemm.m": [2048, 4096]}, results=folder)
    df.assign(summary="[1]").to_parquet(folder / "part-000100.parquet", index=False)
    with pytest.raises(OvsimError, match=r"not a summary \(a JSON object\)"):
        sweep(EXAMPLE, {"ops.gemm.m": [2048, 4096]}, results=folder)


def test_a_manifest_that_is_not_an_object_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "sweep.json").write_text("[]")
    with pytest.raises(OvsimError, match="another sweep") as e:
        sweep(EXAMPLE, {"ops.gemm.m": [2048]}, results=folder)
    assert e.value.source == str(folder)
