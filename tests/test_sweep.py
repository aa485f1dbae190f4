"""Sweeps (ovsim.sweep) and ``ovsim sweep``: each point is the prediction of the scenario with its
fields set by hand, combinations come in order, processes change nothing, and a bad axis is one
line naming the scenario, the axis and the value."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from ovsim.api import predict
from ovsim.cli import main
from ovsim.cli.common import TABLE_NOTE
from ovsim.errors import OvsimError
from ovsim.scenario import load_scenario
from ovsim.sweep import _set, points, sweep

EXAMPLES = Path(__file__).parent.parent / "examples"
EXAMPLE = EXAMPLES / "gemm-allreduce-h100x4-priority.yaml"


def test_set_returns_a_copy_and_finds_list_items_by_index_or_name() -> None:
    data = {"ops": [{"name": "g", "m": 1}, {"name": "ar", "size_bytes": 2}], "knobs": {"a": 1}}
    before = copy.deepcopy(data)
    assert _set(data, "ops.g.m", 5)["ops"][0] == {"name": "g", "m": 5}
    assert _set(data, "ops.1.size_bytes", 7)["ops"][1] == {"name": "ar", "size_bytes": 7}
    assert _set(data, "power.cap_w", 300)["power"] == {"cap_w": 300}  # a missing mapping is made
    assert _set(data, "knobs", None)["knobs"] is None
    assert data == before
    for path, words in (("ops.5.m", "no item 5 in a list of 2"), ("ops.gemm.m", "no item named 'gemm' (named: g, ar)"),
                        ("knobs.a.b", "'b' is inside a int"), ("knobs..a", "an empty key")):
        with pytest.raises(ValueError, match=re.escape(words)):
            _set(data, path, 1)


def test_each_point_is_the_scenario_with_its_fields_set_by_hand(tmp_path: Path) -> None:
    df = sweep(EXAMPLE, {"ops.gemm.m": [2048, 4096], "knobs.comm_priority": ["normal", "high"]})
    assert df[["ops.gemm.m", "knobs.comm_priority"]].values.tolist() == [
        [2048, "normal"], [2048, "high"], [4096, "normal"], [4096, "high"]]
    # The same point written as a file of its own (the example with m and the priority edited).
    text = EXAMPLE.read_text().replace("    m: 8192", "    m: 4096").replace("comm_priority: high",
                                                                               "comm_priority: normal")
    own = tmp_path / "own.yaml"
    own.write_text(text)
    expected = predict(own).summary()
    row = df.iloc[2]
    for key in ("makespan_s", "compute_s", "exposed_comm_s", "avg_power_w", "energy_j"):
        assert row[key] == expected[key]
    # A smaller GEMM takes less time; high priority puts the all-reduce beside the GEMM, hiding some of it.
    assert df["compute_isolated_s"].iloc[0] < df["compute_isolated_s"].iloc[2]
    assert (df["exposed_comm_s"].iloc[[1, 3]].to_numpy() < df["exposed_comm_s"].iloc[[0, 2]].to_numpy()).all()


def test_a_power_cap_axis_keeps_none_and_slows_with_the_cap() -> None:
    """None sets no cap: the loop holds the A100's 400 W default limit, which lets this iteration's
    GEMM run at the top clock (its all-reduce half keeps the window's average low); 300 W nearly
    (within 1%); 150 W slows it."""
    df = sweep(EXAMPLES / "gemm-allreduce-a100x4-overlapped.yaml", {"power.cap_w": [None, 300, 150]})
    assert df["power.cap_w"].tolist() == [None, 300, 150]
    assert df["power_cap_w"].tolist()[1:] == [300, 150]
    assert df["power_cap_w"].isna().tolist()[0]
    assert df["power_limit_w"].tolist() == [400, 300, 150]
    makespan = df["makespan_s"].tolist()
    assert makespan[0] <= makespan[1] <= 1.01 * makespan[0] and makespan[1] * 1.05 < makespan[2]


def test_processes_change_nothing() -> None:
    axes = {"ops.gemm.k": [1024, 8192], "knobs.comm_priority": ["normal", "high"]}
    assert sweep(EXAMPLE, axes, workers=2).equals(sweep(EXAMPLE, axes, workers=1))


def test_a_scenario_object_sweeps_like_its_file() -> None:
    axes = {"ops.allreduce.size_bytes": [1.0e8, 4.0e8]}
    a = sweep(load_scenario(EXAMPLE), axes)
    b = sweep(EXAMPLE, axes)
    assert a["makespan_s"].tolist() == b["makespan_s"].tolist()
    assert a["makespan_s"].iloc[0] < a["makespan_s"].iloc[1]


def test_progress_counts_every_point() -> None:
    seen: list[tuple[int, int]] = []
    sweep(EXAMPLE, {"ops.gemm.n": [1024, 2048, 4096]}, mode="analytic", progress=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 3), (2, 3), (3, 3)]


@pytest.mark.parametrize(("axes", "field", "words"), [
    ({}, "axes", "no axes to sweep"),
    ({"ops.gemm.m": []}, "ops.gemm.m", "expected a non-empty list of values"),
    ({"ops.gemm.m": "4096"}, "ops.gemm.m", "expected a non-empty list of values"),
    ({"ops.gemm.mm": [1]}, "ops.gemm.mm=1", "ops.gemm: unknown field 'mm'; did you mean 'm'?"),
    ({"ops.conv.m": [1]}, "ops.conv.m", "no item named 'conv' (named: gemm, allreduce)"),
    ({"ops.gemm.m": [4096, -1]}, "ops.gemm.m=-1", "ops.gemm.m: Input should be greater than 0"),
    ({"power.cap_w": [50]}, "power.cap_w=50", "power.cap_w: 50 W"),
    # A training knob on a list of ops: not "training.model: Field required" for a section never written.
    ({"training.micro_batch_size": [2]}, "training.micro_batch_size", "the scenario has no training iteration"),
])
def test_a_bad_axis_names_the_scenario_the_axis_and_the_value(axes: dict[str, list[object]], field: str,
                                                              words: str) -> None:
    with pytest.raises(OvsimError) as err:
        sweep(EXAMPLE, axes)
    assert err.value.source == str(EXAMPLE) and err.value.field == field
    assert words in err.value.message


def test_every_combination_is_checked_before_any_is_predicted() -> None:
    # points() is the validation step; a bad last value fails it without predicting the first.
    with pytest.raises(OvsimError, match=re.escape("ops.gemm.m=0")):
        points(EXAMPLE, {"ops.gemm.m": [1024, 0]})
    with pytest.raises(OvsimError, match="workers"):
        sweep(EXAMPLE, {"ops.gemm.m": [1024]}, workers=-1)


def test_sweep_command_table_json_and_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "s.csv"
    args = ["sweep", str(EXAMPLE), "--axis", "ops.gemm.m=1024,2048", "--axis", "power.cap_w=null,400",
            "--mode", "analytic"]
    assert main([*args, "--csv", str(csv)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["ops.gemm.m", "power.cap_w", "iter"]
    assert out[-2:] == ["", TABLE_NOTE]
    assert [line.split()[:2] for line in out[2:-2]] == [["1024", "null"], ["1024", "400"], ["2048", "null"],
                                                        ["2048", "400"]]
    assert csv.read_text().splitlines()[0].startswith("ops.gemm.m,power.cap_w,scenario,")
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert doc["axes"] == ["ops.gemm.m", "power.cap_w"]
    assert [(p["ops.gemm.m"], p["power.cap_w"]) for p in doc["points"]] == [(1024, None), (1024, 400), (2048, None),
                                                                            (2048, 400)]


@pytest.mark.parametrize(("axis", "value"), [
    ("ops.gemm.tile=[64,64,32],[128,128,32]", [[64, 64, 32], [128, 128, 32]]),
    ("ops.allreduce.size_bytes=1e8,2.5e8", [1.0e8, 2.5e8]),
    ("knobs.comm_priority=high", ["high"]),
])
def test_axis_values_read_as_a_scenario_file_would(axis: str, value: list[object],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(EXAMPLE), "--axis", axis, "--mode", "analytic", "--json"]) == 0
    path = axis.split("=")[0]
    assert [p[path] for p in json.loads(capsys.readouterr().out)["points"]] == value


def test_none_is_text_as_in_a_scenario_file(capsys: pytest.CaptureFixture[str]) -> None:
    """YAML reads ``none`` as text, so an enum value such as ``tp_overlap: none`` can be swept;
    ``null`` stays null."""
    scenario = EXAMPLES / "training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml"
    from ovsim.cli.sweep import axis_value as _axis_value

    assert _axis_value("none", "x=none") == "none"
    assert _axis_value("null", "x=null") is None and _axis_value("~", "x=~") is None
    assert main(["sweep", str(scenario), "--axis", "training.parallel.tp_overlap=none", "--mode", "analytic",
                 "--json"]) == 0
    assert [p["training.parallel.tp_overlap"] for p in json.loads(capsys.readouterr().out)["points"]] == ["none"]


@pytest.mark.parametrize(("axis", "words"), [
    ("ops.gemm.m", "--axis: expected PATH=VALUE[,VALUE...], got 'ops.gemm.m'"),
    ("ops.gemm.m=1,,2", "--axis: an empty value in 'ops.gemm.m=1,,2'"),
    ("ops.gemm.tile=[64,64", "--axis: unbalanced brackets"),
    ("ops.gemm.m=inf", "--axis: 'inf' is not a finite number"),
    ("ops.gemm.x=1", "ops.gemm.x=1: ops.gemm.x: Extra inputs are not permitted"),
])
def test_sweep_command_bad_axis_is_one_line(axis: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(EXAMPLE), "--axis", axis]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "Traceback" not in err


@pytest.mark.parametrize("second", ["power.cap_w=300", "power.cap_w =300", " power.cap_w= 300"])
def test_an_axis_given_twice_is_refused_however_spaced(second: str, capsys: pytest.CaptureFixture[str]) -> None:
    # The second spelling once replaced the first axis's values without a word.
    assert main(["sweep", str(EXAMPLE), "--axis", "power.cap_w=500", "--axis", second]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--axis: 'power.cap_w' is given twice" in err


@pytest.mark.parametrize("workers", [1, 2])
def test_an_error_in_a_file_the_scenario_names_keeps_that_files_name(tmp_path: Path, workers: int) -> None:
    (tmp_path / "bad.v1.yaml").write_text("schema: ovsim.calib/1\ngpu: '*'\nversion: 1\nprovenance: {}\n"
                                          "parameters: {attention_efficiency: 2.0}\nsources: {}\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(EXAMPLE.read_text() + "calibration: [bad.v1.yaml]\n")
    with pytest.raises(OvsimError) as err:
        sweep(scenario, {"ops.gemm.m": [1024, 2048]}, workers=workers)
    assert (err.value.source, err.value.field) == (str(scenario), "ops.gemm.m=1024")
    assert err.value.message.startswith(f"{tmp_path / 'bad.v1.yaml'}: sources: ")
