"""Strict, consistent input: what a user writes is read as written or refused with the field named."""

from __future__ import annotations

from pathlib import Path

import pytest

from ovsim.api import predict
from ovsim.cli import main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gemm-allreduce-h100x4-priority.yaml"


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    text = EXAMPLE.read_text()
    assert text.count(old) == 1
    p = tmp_path / "s.yaml"
    p.write_text(text.replace(old, new))
    return p


def _error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ovsim: error:") and "\n" not in err
    return err


def test_a_boolean_is_not_a_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Pydantic alone reads true as 1: this ran as a GEMM of one row.
    err = _error(["predict", str(_variant(tmp_path, "m: 8192", "m: true"))], capsys)
    assert "ops.gemm" in err and "m: a number is expected, not true" in err


def test_a_count_written_with_an_exponent_is_that_number(tmp_path: Path) -> None:
    # YAML 1.1 reads 8.192e3 and 8192e0 as text; both are the GEMM of the example.
    base = predict(EXAMPLE, mode="analytic").timeline.makespan_s
    for written in ("8.192e3", "8192e0"):
        assert predict(_variant(tmp_path, "m: 8192", f"m: {written}"), mode="analytic").timeline.makespan_s == base


def test_a_fractional_count_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["predict", str(_variant(tmp_path, "m: 8192", "m: 8.1925e3"))], capsys)
    assert "ops.gemm.m" in err


def test_a_key_given_twice_is_an_error_at_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _variant(tmp_path, "    n: 8192\n", "    n: 8192\n    n: 4096\n")
    line = p.read_text().splitlines().index("    n: 4096") + 1
    err = _error(["predict", str(p)], capsys)
    assert f"line {line}" in err and "key 'n' is given twice" in err


def test_a_priority_for_a_mistyped_stream_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["predict", str(_variant(tmp_path, "streams: {compute: 0, comm: 0}",
                                          "streams: {compute: 0, com: -1}"))], capsys)
    assert "streams.com" in err and "ops run on 'comm', which has none" in err
    # A declared stream may go unused (one streams section for several variants of a scenario).
    assert main(["predict", str(_variant(tmp_path, "streams: {compute: 0, comm: 0}",
                                         "streams: {compute: 0, comm: 0, spare: 1}")), "--quiet"]) == 0


def test_a_missing_spec_folder_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OVSIM_SPEC_PATH", str(tmp_path / "nope"))
    err = _error(["specs"], capsys)
    assert "OVSIM_SPEC_PATH" in err and "nope" in err


def test_a_misspelt_field_is_named_with_the_one_meant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Pydantic alone reports only "size_bytes: Field required", which hides what was written.
    err = _error(["predict", str(_variant(tmp_path, "size_bytes: 896.0e6", "size_byte: 896.0e6"))], capsys)
    assert err.endswith("ops.allreduce: unknown field 'size_byte'; did you mean 'size_bytes'?")


@pytest.mark.parametrize(("wrote", "said"), [
    ("allreduce", "unknown kind 'allreduce'; did you mean 'all_reduce'?"),
    # Nothing spelt like it: the kinds there are.
    ("zzz", "unknown kind 'zzz' (one of gemm, attention,"),
])
def test_a_misspelt_op_kind_is_named_with_the_one_meant(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        wrote: str, said: str) -> None:
    # Pydantic alone says "Input tag 'allreduce' found using 'kind' does not match any of the expected tags".
    err = _error(["predict", str(_variant(tmp_path, "kind: all_reduce", f"kind: {wrote}"))], capsys)
    assert f"ops.allreduce: {said}" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("example", "old", "new", "field", "meant"), [
    # Optional fields: nothing is missing, so only the model's own field names can suggest one.
    ("gemm-allreduce-h100x4-priority.yaml", "comm_priority: high", "comm_prio: high", "knobs", "comm_priority"),
    ("training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml", "dp_mode:", "dp_mod:", "training.parallel", "dp_mode"),
    ("training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml", "micro_batch_size:", "micro_batch_sz:", "training",
     "micro_batch_size"),
    # Another tool's name for a field: spelt nearer another ("sequence_parallel"), answered by meaning.
    ("training-llama2-70b-tp8-dp4-4nodes-h100.yaml", "tp: 8", "tensor_parallel: 8", "training.parallel", "tp"),
    ("training-llama2-70b-tp8-dp4-4nodes-h100.yaml", "tp: 8", "tensor_model_parallel_size: 8", "training.parallel",
     "tp"),
])
def test_a_misspelt_optional_field_is_named_with_the_one_meant(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               example: str, old: str, new: str, field: str,
                                                               meant: str) -> None:
    text = (EXAMPLE.parent / example).read_text()
    assert old in text
    p = tmp_path / example
    p.write_text(text.replace(old, new, 1))
    wrote = new.split(":")[0]
    err = _error(["predict", str(p)], capsys)
    assert err.endswith(f"{field}: unknown field '{wrote}'; did you mean '{meant}'?")


def test_a_trace_given_as_a_scenario_is_sent_to_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    trace = Path(__file__).resolve().parents[1] / "examples" / "traces" / "h100-gemm-beside-16-channels.json.gz"
    err = _error(["predict", str(trace)], capsys)
    assert err == f"ovsim: error: {trace}: gzip-compressed, not a YAML file; a trace is replayed with `ovsim replay`"
    plain = tmp_path / "t.json"
    plain.write_bytes(gzip.decompress(trace.read_bytes()))
    err = _error(["predict", str(plain)], capsys)
    assert err == f"ovsim: error: {plain}: a trace (it has traceEvents), not a scenario; replay it with `ovsim replay`"


def test_import_with_nothing_left_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "abc", "dur": 5, '
                     '"pid": 0, "tid": 7, "args": {"device": 0, "stream": 7}}]}')
    err = _error(["import", str(trace), "-o", str(tmp_path / "k.parquet")], capsys)
    assert "no GPU activity left to write (skipped: 1 malformed ts)" in err
    assert not (tmp_path / "k.parquet").exists()


def test_a_gz_name_on_bytes_that_are_not_gzip_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.json.gz"
    trace.write_bytes(b"\xff\xfe not gzip at all" * 50)
    assert "not gzip data, though the name ends .gz" in _error(["replay", str(trace)], capsys)


def test_a_bad_byte_is_reported_where_it_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.json"
    # Line 1 is 18 bytes with its newline; on line 2, 24 characters come before the bad byte.
    trace.write_bytes(b'{"traceEvents": [\n  {"ph": "X", "name": "k\xff"}\n]}')
    assert "byte 42 (line 2, column 25) is not valid UTF-8" in _error(["replay", str(trace)], capsys)


@pytest.mark.parametrize(("ops", "field"), [
    # Named as the scenario and --axis name it, without the kind pydantic took the op for.
    ("[{name: g, kind: gemm, m: 8, n: 8, k: 8}, {name: ar, kind: all_reduce, size_bytes: -5}]", "ops.ar.size_bytes"),
    # A name that another op has too, or that the axis syntax would read otherwise, gives way to
    # the position.
    ("[{name: g, kind: gemm, m: 8, n: 8, k: 8}, {name: g, kind: all_reduce, size_bytes: -5}]",
     "ops.1.size_bytes"),
    ("[{name: g, kind: gemm, m: 8, n: 8, k: 8}, {name: '-7', kind: all_reduce, size_bytes: -5}]",
     "ops.1.size_bytes"),
    ("[{name: g, kind: gemm, m: 8, n: 8, k: 8}, {name: 'a=b', kind: all_reduce, size_bytes: -5}]",
     "ops.1.size_bytes"),
])
def test_an_ops_field_is_named_by_the_ops_name(ops: str, field: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(f"name: s\nsystem: h100x4\nops: {ops}\n")
    err = _error(["predict", str(p)], capsys)
    assert err.endswith(f"{p}: {field}: Input should be greater than 0")
    # The same path is an axis that sweeps it (where no other op has the name).
    if "name: g, kind: all_reduce" not in ops:
        assert main(["sweep", str(p), "--axis", f"{field}=1e6", "--mode", "analytic", "--json"]) == 0
        capsys.readouterr()


@pytest.mark.parametrize("call", ["predict", "compare", "sweep"])
def test_a_mode_other_than_the_two_is_refused_in_python(call: str) -> None:
    """``mode="fast"`` from Python is an error naming the field, as ``--mode fast`` is on the
    command line, not a simulation labelled "fast"."""
    from ovsim.api import compare
    from ovsim.errors import OvsimError
    from ovsim.sweep import sweep

    run = {"predict": lambda: predict(EXAMPLE, mode="fast"),  # type: ignore[arg-type]
           "compare": lambda: compare([EXAMPLE], mode="fast"),  # type: ignore[arg-type]
           "sweep": lambda: sweep(EXAMPLE, {"power.cap_w": [300]}, mode="fast")}[call]  # type: ignore[arg-type]
    with pytest.raises(OvsimError, match="unknown mode 'fast'") as e:
        run()
    assert e.value.field == "mode"


def test_a_sweep_axis_of_one_value_not_in_a_list_is_refused() -> None:
    from ovsim.errors import OvsimError
    from ovsim.sweep import sweep

    with pytest.raises(OvsimError, match="expected a non-empty list of values") as e:
        sweep(EXAMPLE, {"power.cap_w": 300})  # type: ignore[dict-item]
    assert e.value.field == "power.cap_w"


@pytest.mark.parametrize("content", [None, "params:\n  x: 1\n"])
def test_a_scenarios_calibration_file_is_named_under_its_field(content: str | None, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A calibration file the scenario lists, missing or wrong, is named after the scenario and its
    ``calibration`` field."""
    if content is not None:
        (tmp_path / "mine.yaml").write_text(content)
    p = _variant(tmp_path, "name: gemm-allreduce-h100x4-priority\n",
                 "name: gemm-allreduce-h100x4-priority\ncalibration: [mine.yaml]\n")
    err = _error(["predict", str(p)], capsys)
    assert err.startswith(f"ovsim: error: {p}: calibration: ") and "mine.yaml" in err


def test_python_dash_m_ovsim_runs_the_command() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ovsim", "--version"], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.startswith("ovsim ")
