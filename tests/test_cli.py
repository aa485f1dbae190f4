"""The command line: output contracts and one-line errors for bad input (README.md, ``ovsim.cli``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from shared_traces import real

from ovsim.api import predict
from ovsim.cli import main

EXAMPLE = Path(__file__).parent.parent / "examples" / "gemm-allreduce-h100x4-priority.yaml"

GOOD = """\
schema: ovsim.scenario/1
system: h100x4
ops:
  - {name: g, kind: gemm, m: 4096, n: 4096, k: 4096}
  - {name: ar, kind: all_reduce, size_bytes: 1.0e8}
"""

TRAINING = """\
system: a100x4
training:
  model: gpt3-1.3b
  layers: 2
  heads: 16
  parallel: {tp: 2}
"""


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "makespan" in out and "allreduce" in out and "slowed by" in out


def test_the_comm_line_adds_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two all-reduces at once on streams of their own, beside a GEMM: their durations summed pass
    the span in which either ran, which the line then names; exposed and hidden time are of that
    span, so exposed is the span less the hidden share. With one stream of communication (the
    README's example) the two are one figure, printed once."""
    two = tmp_path / "two.yaml"
    two.write_text(GOOD + "  - {name: ar2, kind: all_reduce, size_bytes: 3.0e8, "
                   "stream: comm2}\n")
    assert main(["predict", str(two), "--mode", "analytic"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("comm "))
    words = line.replace("(", " ").replace("%", " ").split()
    summed, span, exposed, hidden = (float(words[i]) for i in (1, 5, 11, 13))
    assert words[6:10] == ["ms", "with", "any", "running),"] and summed > span
    assert exposed == pytest.approx(span * (1 - hidden / 100), abs=0.01 + span * 0.001)
    assert main(["predict", str(EXAMPLE)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("comm "))
    assert "running" not in line and "% hidden under compute" in line


def test_the_op_table_reads_as_a_timeline(capsys: pytest.CaptureFixture[str]) -> None:
    """Its rows in order of start, not in the workload's list order (where an FSDP gather issued
    for a later layer is listed before the current layer's kernels)."""
    example = EXAMPLE.parent / "training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml"
    assert main(["predict", str(example), "--mode", "analytic"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("op ")) + 2
    starts = [float(line[44:55]) for line in lines[first:] if line and not line.startswith("...")]
    assert len(starts) > 20 and starts == sorted(starts)


def test_the_system_line_says_how_many_of_its_gpus_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(EXAMPLE)]) == 0
    assert "system     H100x4: 4 x H100-SXM5-80GB\n" in capsys.readouterr().out
    two = tmp_path / "two.yaml"
    two.write_text(GOOD + "ranks: 2\n")
    assert main(["predict", str(two)]) == 0
    assert "system     H100x4: 2 of its 4 H100-SXM5-80GB\n" in capsys.readouterr().out


def test_json_is_one_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(EXAMPLE), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["ranks"] == 4
    assert {"name", "rank", "stream", "start_s", "duration_s", "slowed_by"} <= set(data["ops"][0])


def test_timeline_is_perfetto_loadable(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert main(["predict", str(EXAMPLE), "--timeline", str(out), "--quiet"]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    phases = {e["ph"] for e in events}
    assert {"X", "C", "M"} <= phases
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["pid"], int) and isinstance(e["tid"], int)
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"sm_busy_fraction", "hbm_bytes_per_s", "link_out_bytes_per_s"} <= counters
    slowed = [e for e in events if e["ph"] == "X" and "slowed_by" in e["args"]]
    assert slowed and all("[" in e["name"] for e in slowed)


def _bad(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ops: [\n  - {name: g", "YAML error"),
        (GOOD.replace("h100x4", "no-such-gpu-node"), "unknown system 'no-such-gpu-node'"),
        (GOOD.replace("size_bytes: 1.0e8", "size_bytes: -5"), "ops.ar.size_bytes"),
        (GOOD.replace("k: 4096}", "k: 4096, after: [ar]}").replace("1.0e8}", "1.0e8, after: [g]}"),
         "dependency cycle"),
        (GOOD.replace("1.0e8}", "1.0e8, ranks: [0, 7]}"), "rank 7"),
        (GOOD.replace("m: 4096", "m: 4096, colour: red"), "colour"),
        (TRAINING.replace("tp: 2", "tp: 3"), "training.parallel: tp 3 x pp 1 does not divide the 4 ranks"),
        (TRAINING.replace("tp: 2", "pp: 4").replace("layers: 2", "layers: 3"),
         "training.parallel.pp: 4 pipeline stages (pp 4 x virtual 1) for 3 layers"),
        (TRAINING.replace("tp: 2", "bucket_bytes: 1.0e12"), "training.parallel.bucket_bytes"),
        (TRAINING.replace("heads: 16", "heads: 15"),
         "training.model: hidden size 2048 is not a multiple of the 15 heads"),
        (TRAINING + "ops:\n  - {name: g, kind: gemm, m: 8, n: 8, k: 8}\n", ": give ops or training, not both"),
        (GOOD.replace("system: h100x4", "system: {gpu: h100-sxm5-80gb, gpu_count: 4, links_per_pair: -1}"),
         "system.links_per_pair: Input should be greater than or equal to 0"),
        (GOOD.replace("system: h100x4", "system: {gpu: h100-sxm5-80gb, gpu_count: 4, topology: mesh}"),
         "system: a mesh topology needs links_per_pair"),
        (GOOD.replace("system: h100x4", "system: {gpu: h100-sxm5-80gb, gpu_count: 0}"),
         "system.gpu_count: Input should be greater than 0"),
        (GOOD.replace("k: 4096}", "k: 4096, delay_s: .inf}"), "ops.g.delay_s: Input should be a finite number"),
        (GOOD.replace("size_bytes: 1.0e8", "size_bytes: .nan"), "ops.ar.size_bytes: Input should be a"),
        (TRAINING.replace("tp: 2", "bucket_bytes: .inf"), "training.parallel.bucket_bytes: Input should be a finite"),
        (GOOD.replace("k: 4096}", "k: 4096, ranks: []}"), "ops.g.ranks: List should have at least 1 item"),
        (GOOD.replace("k: 4096}", "k: 4096, ranks: [-1]}"), "ops.g.ranks.0: Input should be greater than"),
        (GOOD.replace("k: 4096}", "k: 4096, stream: ''}"), "ops.g.stream: String should have at least 1"),
        (GOOD.replace("k: 4096}", "k: 4096, split_k: 8192}"), "ops.g.split_k: split_k 8192 is more than k 4096"),
        (GOOD.replace("name: ar", "name: g"), "ops: op name 'g' is used twice"),
        (GOOD.replace("k: 4096}", "k: 4096, stages: 4}"), "stages describes a kernel of your own: give its tile too"),
        (GOOD.replace("system: h100x4", "system: {gpu: h100-sxm5-80gb, gpu_count: 16}"),
         "system.gpu_count: 16 H100-SXM5-80GB GPUs in one nvswitch domain: no H100-SXM5-80GB system joins more than 8"),
        (GOOD.replace("system: h100x4", "system: h100x4\nnodes: 2"), "nodes: 2 nodes of H100x4, which has no network"),
        (GOOD.replace("system: h100x4", "system: {gpu: h100-sxm5-80gb, gpu_count: 8, nodes: 2}"),
         "2 nodes need a network"),
        (GOOD.replace("system: h100x4", "system: hgx-h100-ndr\nranks: 16").replace(
            "ops:\n", "ops:\n  - {name: cp, kind: copy, direction: peer, size_bytes: 1.0e6, ranks: [0], peer: 8}\n"),
         "rank 8 is on another node"),
    ],
    ids=["yaml", "unknown-system", "negative-size", "cycle", "bad-rank", "unknown-key", "tp-ranks", "pp-layers",
         "bucket", "heads", "ops-and-training", "negative-links", "mesh-without-links", "no-gpus", "infinite-delay",
         "nan-size", "infinite-bucket", "no-ranks", "negative-rank", "unnamed-stream", "split-k-over-k",
         "duplicate-name", "block-without-tile", "nvswitch-domain", "nodes-without-network", "nodes-need-network",
         "copy-across-nodes"],
)
def test_bad_input_is_one_line_naming_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     text: str, expected: str) -> None:
    path = _bad(tmp_path, text)
    assert main(["predict", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ovsim: error: ")
    assert str(path) in err and expected in err


def test_unknown_gpu_in_inline_system(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _bad(tmp_path, GOOD.replace("system: h100x4", "system: {gpu: Z9000, gpu_count: 2}"))
    assert main(["predict", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown gpu 'Z9000'" in err and str(path) in err


def test_non_utf8_scenario_and_system_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "system.yaml"
    binary.write_bytes(b"\xff\xfe\x00gpu: x\n")
    assert main(["predict", str(binary)]) == 2
    err = capsys.readouterr().err
    assert err == f"ovsim: error: {binary}: not UTF-8 text (byte 0xff at offset 0); is it a YAML file?\n"
    # A system file named by the scenario: both files are named.
    path = _bad(tmp_path, GOOD.replace("system: h100x4", f"system: {binary}"))
    assert main(["predict", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ovsim: error: {path}: system: {binary}: not UTF-8") and err.count("\n") == 1


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "nowhere.yaml"]) == 2
    assert "nowhere.yaml: file not found" in capsys.readouterr().err


def test_collectives_joined_in_conflicting_orders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each rank can only join the all-reduce after an op that itself waits for the all-reduce."""
    text = GOOD + "  - {name: x, kind: all_reduce, size_bytes: 1.0e6, ranks: [0, 1], after: [y]}\n" \
                  "  - {name: y, kind: gemm, m: 128, n: 128, k: 128, ranks: [0, 1], stream: comm}\n"
    path = _bad(tmp_path, text)
    assert main(["predict", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "cycle" in err and err.count("\n") == 1


def test_console_script_exits_nonzero_without_traceback(tmp_path: Path) -> None:
    path = _bad(tmp_path, "schema: ovsim.scenario/1\nsystem: h100x4\nops: []\n")
    proc = subprocess.run([sys.executable, "-m", "ovsim.cli", "predict", str(path)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "ops" in proc.stderr


def test_the_command_writes_all_it_says_before_it_exits(tmp_path: Path) -> None:
    """The command freezes what it leaves out of the cyclic collector before it exits
    (cli.main.console): its printed JSON and the trace file it writes are whole, and the same as
    the in-process command's."""
    example = Path(__file__).resolve().parents[1] / "examples" / "gemm-allreduce-h100x4-priority.yaml"
    trace = tmp_path / "trace.json"
    proc = subprocess.run([sys.executable, "-m", "ovsim.cli", "predict", str(example), "--json", "--timeline",
                           str(trace)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert printed["summary"]["makespan_s"] == predict(example).summary()["makespan_s"]
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("ph") == "X") >= len(printed["ops"])


DLRM = "param/et_replay/tests/inputs/dlrm_kineto.tar.gz"


def test_replay_and_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dlrm = real(DLRM)
    timeline = tmp_path / "replay.json"
    assert main(["replay", str(dlrm), "--json", "--timeline", str(timeline)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["ranks"] == 8 and data["summary"]["collective_kernels"] == 64
    assert {"measured_start_s", "predicted_duration_s", "overlapped", "isolated_source"} <= set(data["kernels"][0])
    procs = {e["args"]["name"] for e in json.loads(timeline.read_text())["traceEvents"] if e["name"] == "process_name"}
    assert {"rank 0 measured", "rank 0 predicted", "rank 7 predicted"} <= procs
    table = tmp_path / "k.parquet"
    assert main(["import", str(dlrm), "-o", str(table), "--quiet"]) == 0
    assert main(["replay", str(table), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["summary"]["kernels"] == data["summary"]["kernels"]
    assert again["summary"]["mape_pct"] == pytest.approx(data["summary"]["mape_pct"])


def test_replay_names_every_kind_of_activity_it_counts(capsys: pytest.CaptureFixture[str]) -> None:
    """The sample trace's 26 activities: 12 GEMMs and an elementwise kernel, one NCCL kernel and 12
    memsets (its kernel table, kind by kind); the header's parts add up to its count."""
    trace = Path(__file__).parent.parent / "examples" / "traces" / "h100-gemm-beside-16-channels.json.gz"
    assert main(["replay", str(trace)]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("gpu "))
    assert "26 activities (13 compute, 1 collective, 12 memset)" in header


def test_replay_says_what_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = Path(__file__).parent.parent / "examples" / "traces" / "h100-gemm-beside-16-channels.json.gz"
    timeline = tmp_path / "replay.json"
    assert main(["replay", str(trace), "--timeline", str(timeline)]) == 0
    assert capsys.readouterr().out.endswith(f"\ntimeline written to {timeline}\n")
    assert json.loads(timeline.read_text())["traceEvents"]


@pytest.mark.parametrize("args", [["replay", "nope.json"], ["import", "nope.json", "-o", "x.parquet"],
                                  ["replay", "trace.unknownext"]])
def test_replay_bad_input_is_one_line(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trace.unknownext").write_text("{}")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ovsim: error:") and "\n" not in err and args[1] in err


def test_compare_prints_one_row_per_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    ex = EXAMPLE.parent
    files = [str(ex / f"gemm-allreduce-h100x4-{n}.yaml") for n in ("sequential", "priority")]
    assert main(["compare", *files]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "vs 1st" in out[0]
    assert out[2].startswith("gemm-allreduce-h100x4-sequential") and "+0.0%" in out[2]
    assert out[3].startswith("gemm-allreduce-h100x4-priority")
    assert main(["compare", *files, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # Each printed row is its scenario's makespan (ms) and its change against the first's.
    first, second = (s["makespan_s"] for s in data["scenarios"])
    assert first != second
    for line, makespan in ((out[2], first), (out[3], second)):
        assert line.split()[2:4] == [f"{makespan * 1e3:.3f}", f"{makespan / first - 1:+.1%}"]
    assert [s["scenario"] for s in data["scenarios"]] == ["gemm-allreduce-h100x4-sequential",
                                                          "gemm-allreduce-h100x4-priority"]


def test_compare_tells_scenarios_of_one_name_apart_by_their_files(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # `ovsim tune -o best.yaml` keeps the scenario's name: compared with the original, the two rows
    # once read the same.
    tuned = tmp_path / "best.yaml"
    tuned.write_text(EXAMPLE.read_text().replace("comm_priority: high", "comm_priority: normal"))
    assert main(["compare", str(EXAMPLE), str(tuned)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith(f"{EXAMPLE} ") and out[3].startswith(f"{tuned} ")
    assert out[0].startswith("scenario ") and len(out[1]) == len(out[0])


def test_compare_with_a_bad_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _bad(tmp_path, "system: h100x4\nops: []\n")
    assert main(["compare", str(EXAMPLE), str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err


@pytest.mark.parametrize(("args", "expected"), [
    (["predict"], "the following arguments are required: scenario"),
    (["predict", str(EXAMPLE), "--mode", "fast"], "argument --mode: invalid choice: 'fast'"),
    (["predict", str(EXAMPLE), "--rows", "-1"], "argument --rows: must not be negative, got '-1'"),
    (["predict", str(EXAMPLE), "--timeline", ""], "argument --timeline: empty path"),
    (["tune", str(EXAMPLE), "--max-grid", "-1"], "argument --max-grid: must be at least 1, got '-1'"),
    (["tune", str(EXAMPLE), "--top", "0"], "argument --top: must be at least 1, got '0'"),
    (["replay", "t.json", "--format", "xyz"], "argument --format: invalid choice: 'xyz'"),
    (["import", "t.json", "-o", " "], "argument -o/--output: empty path"),
    (["validate", "--traces", ""], "argument --traces: empty path"),
    (["calibrate", "t.json", "--gpu", "h100", "-o", "c", "--power-offset-s", "nan"],
     "argument --power-offset-s: must be a finite number, got 'nan'"),
    (["calibrate", "t.json", "--gpu", "h100", "-o", "c", "--power-window-s=-1"],
     "argument --power-window-s: must not be negative, got '-1'"),
    (["calibrate", "t.json", "--gpu", "h100", "-o", "c", "--power-window-s", "inf"],
     "argument --power-window-s: must be a finite number, got 'inf'"),
])
def test_usage_errors_are_one_line(args: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ovsim: error: {expected}")
    assert f"(see 'ovsim {args[0]} --help')" in err


@pytest.mark.parametrize(("args", "flag", "words"), [
    (["predict", str(EXAMPLE), "--timeline", "{d}/nowhere/t.json"], "--timeline",
     "folder '{d}/nowhere' does not exist"),
    (["predict", str(EXAMPLE), "--timeline", "{d}/file.txt/t.json"], "--timeline",
     "folder '{d}/file.txt' is a file, not a folder"),
    (["predict", str(EXAMPLE), "--timeline", "{d}"], "--timeline", "is a folder; give a file name"),
    (["replay", "{d}/never-read.json", "--timeline", "{d}/nowhere/t.json"], "--timeline",
     "folder '{d}/nowhere' does not exist"),
    (["import", "{d}/never-read.json", "-o", "{d}/nowhere/k.parquet"], "--output",
     "folder '{d}/nowhere' does not exist"),
    (["calibrate", "{d}/never-read.json", "--gpu", "h100-sxm5-80gb", "-o", "{d}/file.txt/c"], "--output",
     "folder '{d}/file.txt' is a file, not a folder"),
    (["calibrate", "{d}/never-read.json", "--gpu", "h100-sxm5-80gb", "-o", "{d}/h100.v1.yaml"], "--output",
     "exists: calibration files are never edited"),
    (["replay", "{d}/never-read.json", "--timeline", "{d}/t.csv"], "--timeline",
     "--timeline writes a Perfetto (Chrome trace) JSON file; name it .json"),
    (["sweep", "{d}/never-read.yaml", "--axis", "ops.gemm.m=1,2", "--csv", "{d}/s.parquet"], "--csv",
     "--csv writes CSV; name it .csv"),
    (["replay", "{d}/never-read.json", "--timeline", "/proc/t.json"], "--timeline", "cannot write in folder '/proc'"),
    (["calibrate", "{d}/never-read.json", "--gpu", "h100-sxm5-80gb", "-o", "{d}/cal", "--power-log", "{d}/file.txt"],
     "--power-log",
     "not a power log ovsim knows"),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], flag: str, words: str) -> None:
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "h100.v1.yaml").write_text("x")
    argv = [a.format(d=tmp_path) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    # Refused before the trace (which does not exist) is read.
    assert err.count("\n") == 1 and f": {flag}: {words.format(d=tmp_path)}" in err and "never-read" not in err


def test_gpu_flags_name_the_flag_and_the_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "run.json"
    trace.write_text(json.dumps({"traceEvents": []}))
    assert main(["replay", str(trace), "--gpu", "Z9000"]) == 2
    assert capsys.readouterr().err.startswith("ovsim: error: --gpu: unknown gpu 'Z9000'")
    out = str(tmp_path / "c")
    assert main(["calibrate", str(trace), "--gpu", "Z9000", "-o", out]) == 2
    assert capsys.readouterr().err.startswith("ovsim: error: --gpu: unknown gpu 'Z9000'")
    # A GPU for a trace that is not one of those given is refused, not ignored.
    assert main(["calibrate", str(trace), "--gpu", "h100-sxm5-80gb", "-o", out,
                 "--trace-gpu", "other.json=h100-sxm5-80gb"]) == 2
    assert "--trace-gpu: 'other.json' is not one of the traces given" in capsys.readouterr().err
    # A trace with no GPU activity: named, for replay and calibrate alike (calibrate crashed).
    assert main(["replay", str(trace), "--gpu", "h100-sxm5-80gb"]) == 2
    assert capsys.readouterr().err == f"ovsim: error: {trace}: kernels: the trace has no GPU activity to replay\n"
    assert main(["calibrate", str(trace), "--gpu", "h100-sxm5-80gb", "-o", out]) == 2
    assert capsys.readouterr().err == f"ovsim: error: {trace}: kernels: the trace has no GPU activity to fit\n"


def test_replay_errors_past_the_importer_name_the_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A table written by something else carries no sources; the error still names the file."""
    import pandas as pd

    table = tmp_path / "k.parquet"
    pd.DataFrame({"rank": [0, 0], "stream": [7, 7], "name": ["a", "b"], "start_s": [0.0, 5e6],
                  "duration_s": [1e-5, 1e-5]}).to_parquet(table)
    assert main(["replay", str(table), "--gpu", "h100-sxm5-80gb"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ovsim: error: {table}: start_s: activities span 5e+06 s") and err.count("\n") == 1


def test_json_output_is_strict_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A change against a zero baseline is null, not NaN (which is not JSON), and "-" in the table."""
    comm = tmp_path / "comm.yaml"
    comm.write_text("system: h100x4\nops:\n  - {name: ar, kind: all_reduce, size_bytes: 1.0e8}\n")

    def strict(text: str) -> Any:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the JSON output"))

    assert main(["compare", str(comm), str(EXAMPLE), "--json"]) == 0
    rows = strict(capsys.readouterr().out)["scenarios"]
    assert [r["compute_vs_first"] for r in rows] == [None, None]
    assert main(["compare", str(comm), str(EXAMPLE)]) == 0
    assert capsys.readouterr().out.splitlines()[3].split()[5] == "-"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"ovsim {version('ovsim')}\n"


def test_compare_shows_each_training_scenarios_memory(capsys: pytest.CaptureFixture[str]) -> None:
    """The estimated peak memory per GPU (ovsim.models.memory); '-' for a list of ops."""
    ex = Path(__file__).resolve().parents[1] / "examples"
    assert main(["compare", str(ex / "training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml"),
                 str(ex / "gemm-allreduce-a100x4-priority.yaml")]) == 0
    head, _, training, ops, _, note = capsys.readouterr().out.splitlines()
    assert head.split()[-2:] == ["mem", "GB"]
    assert note.startswith("contention: ") and "a board's reading is updated" in note
    # The memory test's estimate (tests/models/test_memory.py): 36.2 GB and DeepSpeed's 1 GB reduce bucket.
    assert training.split()[-1] == "37.2" and ops.split()[-1] == "-"


def test_replay_reports_exposed_and_hidden_communication(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 3: compute [0, 15) and [50, 60) us beside an all-reduce [5, 25) (10 of its 20 us hidden,
    10 exposed) and a copy, which is neither. The JSON keeps its keys and gains the new ones; the
    text prints the same figures with their units, and rank 3 stays rank 3."""
    import pandas as pd

    from ovsim.traces.load import write_table
    from ovsim.traces.table import TraceBundle, make_table

    rows = [(7, "gemm", 0.0, 15.0), (7, "gemm", 50.0, 10.0), (9, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5.0, 20.0),
            (11, "Memcpy DtoD (Device -> Device)", 45.0, 20.0)]
    table = tmp_path / "rank3.parquet"
    write_table(TraceBundle(kernels=make_table(pd.DataFrame(
        [{"rank": 3, "stream": s, "name": n, "start_s": t * 1e-6, "duration_s": d * 1e-6, "grid_x": 132,
          "block_x": 256} for s, n, t, d in rows]))), table)
    assert main(["replay", str(table), "--gpu", "h100-sxm5-80gb", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    s = data["summary"]
    assert {"mape_pct", "naive_mape_pct", "span_error_pct", "weighted_error_pct", "naive_weighted_error_pct",
            "exposed_comm_predicted_s", "hidden_pct_predicted"} <= set(s)
    assert s["exposed_comm_measured_s"] == pytest.approx(10e-6) and s["hidden_pct_measured"] == pytest.approx(50.0)
    assert {k["rank"] for k in data["kernels"]} == {3}
    assert main(["replay", str(table), "--gpu", "h100-sxm5-80gb"]) == 0
    out = capsys.readouterr().out.splitlines()
    weighted = next(line for line in out if line.startswith("weighted"))
    assert f"ovsim {s['weighted_error_pct']:.1f}%   naive {s['naive_weighted_error_pct']:.1f}%" in weighted
    comm = next(line for line in out if line.startswith("comm"))
    assert (f"measured 0.010 ms, predicted {s['exposed_comm_predicted_s'] * 1e3:.3f} ms" in comm
            and f"measured 50.0%, predicted {s['hidden_pct_predicted']:.1f}%" in comm)


@pytest.mark.parametrize("flag", ["--timeline", "--plot"])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path: Path, flag: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "v.yaml"
    text = (Path(__file__).resolve().parents[1] / "examples" / "gemm-allreduce-h100x4-priority.yaml").read_text()
    scenario.write_text(text)
    (tmp_path / "link.yaml").symlink_to(scenario)
    for out in (scenario, tmp_path / "link.yaml"):
        assert main(["predict", str(scenario), flag, str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is also an input of this command" in err
    assert scenario.read_text() == text


def test_calibrate_refuses_to_write_over_its_power_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "power.csv"
    log.write_text("timestamp, index, power.draw [W]\n")
    assert main(["calibrate", str(tmp_path), "--gpu", "h100-sxm5-80gb", "-o", str(log),
                 "--power-log", f"run={log}"]) == 2
    assert "--output: is also an input" in capsys.readouterr().err
    assert log.read_text() == "timestamp, index, power.draw [W]\n"


def test_specs_lists_each_gpus_key_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """The H100 SXM row against NVIDIA's H100 datasheet: 132 SMs, 80 GB of HBM3 at 3.35 TB/s,
    NVLink 900 GB/s both directions (450 each way), 700 W; the table and --json agree."""
    assert main(["specs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["gpu", "arch", "SMs", "max", "GHz", "BF16", "TF", "HBM", "GB", "HBM", "TB/s", "link",
                              "GB/s", "TDP", "W"]
    (h100,) = [line.split() for line in out if line.startswith("h100-sxm5-80gb ")]
    assert h100 == ["h100-sxm5-80gb", "sm90", "132", "1.98", "989.4", "80.0", "3.35", "450.0", "700"]
    assert any(line.split()[:5] == ["hgx-h100", "h100-sxm5-80gb", "1", "8", "nvswitch"] for line in out)
    # Eight 400 Gb/s NICs for eight GPUs: 50 GB/s per GPU each way.
    assert any(line.split()[:6] == ["hgx-h100-ndr", "h100-sxm5-80gb", "2", "8", "nvswitch", "50.0"] for line in out)
    assert main(["specs", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    row = next(g for g in data["gpus"] if g["gpu"] == "h100-sxm5-80gb")
    assert (row["SMs"], row["HBM GB"], row["HBM TB/s"], row["TDP W"]) == (132, 80.0, 3.35, 700)


def test_strict_turns_a_skipped_event_into_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    sample = Path(__file__).resolve().parents[1] / "examples" / "traces" / "h100-gemm-beside-16-channels.json.gz"
    doc = json.loads(gzip.decompress(sample.read_bytes()))
    bad = dict(next(e for e in doc["traceEvents"] if e.get("cat") == "kernel"), dur=-1.0)
    doc["traceEvents"].append(bad)
    trace = tmp_path / "run.json"
    trace.write_text(json.dumps(doc))
    out = tmp_path / "k.parquet"
    # Without --strict the event is left out and counted.
    assert main(["import", str(trace), "-o", str(out)]) == 0
    assert "skipped: 1 negative duration" in capsys.readouterr().out
    for args in (["import", str(trace), "-o", str(tmp_path / "s.parquet")],
                 ["replay", str(trace), "--quiet"],
                 ["calibrate", str(trace), "--gpu", "h100-sxm5-80gb", "-o", str(tmp_path / "c"), "--quiet"]):
        assert main([*args, "--strict"]) == 2
        err = capsys.readouterr().err
        assert err == (f"ovsim: error: {trace}: --strict: skipped events (1 negative duration); without --strict "
                       "they are left out and counted\n")
    assert not (tmp_path / "s.parquet").exists() and not (tmp_path / "c").exists()
    # A clean trace passes --strict.
    assert main(["replay", str(sample), "--quiet", "--strict"]) == 0


def test_parser_and_engine_leave_heavy_libraries_unimported() -> None:
    """Every command builds the parser first: it must not import pandas (0.2 s); nor may building
    and running a workload import networkx, which only a cycle's report and users' own graphs use."""
    code = ("import importlib, sys\n"
            "importlib.import_module('ovsim.cli.main').parser()\n"
            "assert 'pandas' not in sys.modules, 'the parser imported pandas'\n"
            "from ovsim.api import predict\n"
            "predict('examples/gemm-allreduce-h100x4-priority.yaml', counters=False)\n"
            "assert 'networkx' not in sys.modules, 'predict imported networkx'\n")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
