"""The public API on the bundled examples: both fidelities, their agreement, and the knobs."""

from __future__ import annotations

from pathlib import Path

import pytest

import ovsim
from ovsim.api import predict
from ovsim.scenario import load_scenario

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_predicts_in_both_modes(path: Path) -> None:
    for mode in ("simulate", "analytic"):
        result = predict(path, mode=mode)  # type: ignore[arg-type]
        ops = result.timeline.ops
        assert len(ops) > 0 and ops["end_s"].notna().all()
        assert result.summary()["makespan_s"] > 0
        assert result.summary()["calibration_files"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_sequential_schedules_agree_across_fidelities(path: Path) -> None:
    """With nothing overlapping and every kernel at its calibrated rate, the engine and the closed
    form must give the same timeline. Under the default power-limit loop both run the loop, the
    engine through tail waves that leave SMs idle, the closed form on isolated activity: within 1%
    (0.4% at most when this was written). A sequential pipeline still runs a send and a receive
    with the same peer together, as Megatron-LM batches them; the engine has them share HBM, the
    closed form prices each alone (a few microseconds a pair): within 0.1% there."""
    sc = load_scenario(path).model_copy(update={"schedule": "sequential"})
    sim = predict(sc, mode="simulate", power_managed=False).timeline.ops.set_index("id")
    ana = predict(sc, mode="analytic", power_managed=False).timeline.ops.set_index("id")
    assert sorted(sim.index) == sorted(ana.index)
    pipeline = sc.training is not None and sc.training.parallel.pp > 1
    for col in ("start_s", "end_s"):
        assert sim[col].to_numpy() == pytest.approx(ana.loc[sim.index, col].to_numpy(),
                                                    rel=1e-3 if pipeline else 1e-9, abs=1e-12)
    managed = [predict(sc, mode=m, counters=False).timeline.makespan_s for m in ("simulate", "analytic")]
    assert managed[1] == pytest.approx(managed[0], rel=0.01)


def test_package_exposes_predict() -> None:
    assert ovsim.predict is predict


def test_priority_hides_more_communication_than_plain_overlap() -> None:
    ex = Path(__file__).parent.parent / "examples"
    plain = predict(ex / "gemm-allreduce-h100x4-overlapped.yaml").summary()
    prio = predict(ex / "gemm-allreduce-h100x4-priority.yaml").summary()
    seq = predict(ex / "gemm-allreduce-h100x4-sequential.yaml").summary()
    assert prio["exposed_comm_s"] < plain["exposed_comm_s"]
    assert prio["makespan_s"] < seq["makespan_s"]


def test_compare_lines_up_scenarios_against_the_first() -> None:
    ex = Path(__file__).parent.parent / "examples"
    names = ["sequential", "overlapped", "priority"]
    df = ovsim.api.compare([ex / f"gemm-allreduce-h100x4-{n}.yaml" for n in names])
    assert list(df["scenario"]) == [f"gemm-allreduce-h100x4-{n}" for n in names]
    assert df["vs_first"].iloc[0] == 0.0
    # Each row is that scenario's own prediction.
    solo = predict(ex / "gemm-allreduce-h100x4-priority.yaml").summary()["makespan_s"]
    assert df["makespan_s"].iloc[2] == pytest.approx(solo, rel=1e-12)
    assert df["vs_first"].iloc[2] == pytest.approx(solo / df["makespan_s"].iloc[0] - 1)


def test_compare_against_a_baseline_with_no_compute_is_undefined_not_zero(tmp_path: Path) -> None:
    """A communication-only first scenario has no compute to compare with: the change is NaN (the
    table shows "-"), not a 0% that reads as "no change"."""
    comm = tmp_path / "comm.yaml"
    comm.write_text("system: h100x4\nops:\n  - {name: ar, kind: all_reduce, size_bytes: 1.0e8}\n")
    ex = Path(__file__).parent.parent / "examples"
    df = ovsim.api.compare([comm, ex / "gemm-allreduce-h100x4-overlapped.yaml"])
    assert df["compute_s"].iloc[0] == 0.0 and df["compute_s"].iloc[1] > 0
    assert df["compute_vs_first"].isna().all()
    assert df["vs_first"].iloc[1] > 0


def test_compare_needs_a_scenario() -> None:
    with pytest.raises(ovsim.errors.OvsimError):
        ovsim.api.compare([])


def test_accounted_sequential_follows_lee_et_al_definitions() -> None:
    # Lee et al. (arXiv 2507.03114, metric definitions via a secondary reading note of the paper):
    # E2E_ideal = E2E_overlapping - compute slowdown time; E2E_sequential = E2E_ideal + overlapped
    # communication time. Overlapped run 10 ms with 8 ms compute, sequential compute 7 ms, 3 ms of
    # communication under compute: 10 - (8 - 7) + 3 = 12 ms.
    over = {"makespan_s": 10e-3, "compute_s": 8e-3, "hidden_comm_s": 3e-3}
    seq = {"makespan_s": 14e-3, "compute_s": 7e-3, "hidden_comm_s": 0.0}
    assert ovsim.api.accounted_sequential_s(over, seq) == pytest.approx(12e-3)
    # A sequential run accounted against itself is its own iteration (nothing hidden, no slowdown).
    assert ovsim.api.accounted_sequential_s(seq, seq) == pytest.approx(14e-3)


def test_hidden_communication_is_what_overlapped_compute() -> None:
    ex = Path(__file__).parent.parent / "examples"
    seq = predict(ex / "gemm-allreduce-h100x4-sequential.yaml").summary()
    prio = predict(ex / "gemm-allreduce-h100x4-priority.yaml").summary()
    assert seq["hidden_comm_s"] == 0.0
    # With priority both start at once and run side by side: the shorter of the two is all hidden.
    assert prio["hidden_comm_s"] == pytest.approx(min(prio["compute_s"], prio["comm_s"]), rel=1e-6)
    assert prio["exposed_comm_s"] == pytest.approx(max(0.0, prio["comm_s"] - prio["compute_s"]), abs=1e-12)
    assert prio["hidden_comm_s"] + prio["exposed_comm_s"] == pytest.approx(prio["comm_s"], rel=1e-9)


def test_compare_accounts_the_sequential_time_against_the_first_scenario() -> None:
    ex = Path(__file__).parent.parent / "examples"
    df = ovsim.api.compare([ex / f"gemm-allreduce-h100x4-{n}.yaml" for n in ("sequential", "priority")])
    seq, prio = df.iloc[0], df.iloc[1]
    assert df["accounted_sequential_s"].iloc[0] == pytest.approx(seq["makespan_s"], rel=1e-12)
    expected = prio["makespan_s"] - (prio["compute_s"] - seq["compute_s"]) + prio["hidden_comm_s"]
    assert df["accounted_sequential_s"].iloc[1] == pytest.approx(expected, rel=1e-12)


def test_idle_time_is_zero_within_round_off_and_kept_above_it(tmp_path: Path) -> None:
    # Every rank busy end to end: the intervals' sums leave about 1e-19 s, which is 0 (it read
    # 8.67e-19 s). A host gap of 1 ms after both the GEMM and the all-reduce, before a last
    # kernel, is that much idle time on every rank.
    example = Path("examples/gemm-allreduce-h100x4-priority.yaml")
    assert predict(example, mode="analytic").summary()["idle_s"] == 0.0
    p = tmp_path / "gap.yaml"
    p.write_text(example.read_text() + "  - name: gap\n    kind: delay\n    duration_s: 1.0e-3\n    stream: compute\n"
                 "    after: [gemm, allreduce]\n  - name: tail\n    kind: elementwise\n    bytes: 1.0e6\n"
                 "    stream: compute\n    after: [gap]\n")
    assert predict(p, mode="analytic").summary()["idle_s"] == pytest.approx(1e-3, rel=1e-6)


def test_a_result_shows_in_one_short_line() -> None:
    """A notebook cell ending in a result shows what it is, not the kilobytes of its scenario,
    specs and calibration."""
    path = Path(__file__).parent.parent / "examples" / "gemm-allreduce-a100x4-overlapped.yaml"
    r = predict(path, mode="analytic")
    text = repr(r)
    assert "\n" not in text and len(text) < 300
    assert "gemm-allreduce-a100x4-overlapped" in text and f"{r.timeline.makespan_s:.6g}" in text


def test_json_records_are_python_values_with_none_for_what_json_lacks() -> None:
    """What the old path (a frame's records, then a walk nulling what is not finite) gave: floats
    and ints as Python's, inf, NaN and a missing text as None."""
    import json

    import numpy as np
    import pandas as pd

    from ovsim.api import json_records

    frame = pd.DataFrame({"name": ["a", None, "c"], "rank": np.array([0, 1, -1]),
                          "slowdown": [1.5, float("inf"), float("nan")], "blocks": np.array([132, 0, 7])})
    rows = json_records(list(frame.columns), lambda c: frame[c].to_numpy())
    assert rows == [{"name": "a", "rank": 0, "slowdown": 1.5, "blocks": 132},
                    {"name": None, "rank": 1, "slowdown": None, "blocks": 0},
                    {"name": "c", "rank": -1, "slowdown": None, "blocks": 7}]
    assert all(type(r["rank"]) is int and (r["slowdown"] is None or type(r["slowdown"]) is float) for r in rows)
    json.dumps(rows, allow_nan=False)  # strict JSON
