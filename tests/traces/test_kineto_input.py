"""Kineto importer on bad input: every malformed field gives an OvsimError naming the file and
field; the sliced parser reads what one whole parse reads; fuzzed files end in a table or an
OvsimError, never another exception."""

from __future__ import annotations

import copy
import gzip
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kineto_events import HTA, doc, kernel, real, write

from ovsim.errors import OvsimError
from ovsim.traces import json_slices, kineto_file
from ovsim.traces.kineto import load_kineto
from ovsim.traces.table import TraceBundle, validate_table

# -- bad input -------------------------------------------------------------------------------------

def raises(path: Path, field: str) -> OvsimError:
    with pytest.raises(OvsimError) as e:
        load_kineto(path)
    assert e.value.field == field, e.value
    assert e.value.source.startswith(str(path)), e.value
    return e.value


def test_missing_file(tmp_path: Path) -> None:
    # Said as a scenario file not found is: the file, and no field of it.
    assert raises(tmp_path / "nope.json", "").message == "no such file or folder"


def test_truncated_and_corrupt_gzip(tmp_path: Path) -> None:
    data = gzip.compress(orjson.dumps(doc([kernel()] * 50)))
    assert "truncated" in raises(write(tmp_path / "t.json.gz", data[: len(data) // 2]), "gzip").message
    raises(write(tmp_path / "c.json.gz", data[:20] + bytes(100) + data[120:]), "gzip")


@pytest.mark.parametrize(("content", "field"), [
    (b"", "json"), (b"   \n", "json"), (b"{\"traceEvents\": [", "json"), (b"{'traceEvents': []}", "json"),
    (b"\xff\xfe{}", "json"), (b"[{\"ph\": \"X\"}]", "traceEvents"), (b"42", "traceEvents"),
    (b"{\"schemaVersion\": 1}", "traceEvents"), (b"{\"traceEvents\": {}}", "traceEvents"),
    (b"{\"traceEvents\": [], \"distributedInfo\": [0]}", "distributedInfo"),
    (b"{\"traceEvents\": [], \"distributedInfo\": {\"rank\": \"first\"}}", "distributedInfo.rank"),
    (b"{\"traceEvents\": [], \"distributedInfo\": {\"rank\": 3, \"world_size\": 2}}", "distributedInfo.rank"),
    (b"{\"traceEvents\": [], \"baseTimeNanoseconds\": \"soon\"}", "baseTimeNanoseconds"),
])
def test_bad_documents(tmp_path: Path, content: bytes, field: str) -> None:
    raises(write(tmp_path / "t.json", content), field)


def test_truncated_json_names_the_position(tmp_path: Path) -> None:
    text = orjson.dumps(doc([kernel(corr=i) for i in range(200)]), option=orjson.OPT_INDENT_2)
    err = raises(write(tmp_path / "t.json", text[:-700]), "json")
    assert "line" in err.message


def test_bad_events_are_skipped_and_counted(tmp_path: Path) -> None:
    good = kernel()
    no_ts = {k: v for k, v in kernel().items() if k != "ts"}
    no_dur = {k: v for k, v in kernel().items() if k != "dur"}
    no_name = {k: v for k, v in kernel().items() if k != "name"}
    events: list[Any] = [good, no_ts, no_dur, no_name, kernel(dur=-1.0), kernel(dur=-5.0), kernel(dur=2e9),
                         kernel(ts="soon"), {**kernel(), "ph": "B"}, 17, "kernel", None,
                         {**kernel(), "tid": "main", "args": {}}, {**kernel(), "cat": ["kernel"]}]
    b = load_kineto(write(tmp_path / "t.json", doc(events)))
    assert len(b.kernels) == 1
    assert b.skipped == {"missing ts": 1, "missing dur": 1, "missing name": 1, "negative duration": 2,
                         "duration over 1e9 us": 1, "malformed ts": 1,
                         "GPU event that is not a complete (ph X) event": 1, "event is not an object": 3,
                         "no stream": 1, "event with a malformed cat": 1}


def test_wrong_types_in_optional_fields_become_unknown(tmp_path: Path) -> None:
    ev = kernel(correlation=2**64 - 1)
    ev["args"].update({"registers per thread": True, "shared memory": 1.5, "device": "cuda:0"})
    row = load_kineto(write(tmp_path / "t.json", doc([ev]))).kernels.iloc[0]
    for c in ("correlation", "registers_per_thread", "shared_mem_bytes", "device"):
        assert pd.isna(row[c]), c


@pytest.mark.parametrize(("grid", "block", "reason"), [
    ("big", [1, 2, 3], "malformed grid"), ([-5, 1, 1], [1, 2, 3], "malformed grid"),
    ([4, 1, 1], [1, "2", 3], "malformed block"), ([4, 1, 1], [0, 1, 1], "malformed block"),
    ([4, 1], [128, 1, 1], "malformed grid"), ([4, 1, True], [128, 1, 1], "malformed grid")])
def test_a_launch_shape_out_of_its_domain_skips_the_kernel_with_a_count(
        tmp_path: Path, grid: object, block: object, reason: str) -> None:
    """A kernel cannot be priced without its launch shape: it is skipped and counted, as a malformed
    time is, never read as unknown blocks."""
    bundle = load_kineto(write(tmp_path / "t.json", doc([kernel(grid=grid, block=block), kernel(corr=2)])))
    assert len(bundle.kernels) == 1
    assert bundle.skipped == {reason: 1}


def test_empty_folder_and_empty_archive(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a trace")
    raises(tmp_path, "path")
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "notes.txt", arcname="notes.txt")
    raises(archive, "path")


def test_truncated_archive(tmp_path: Path) -> None:
    data = orjson.dumps(doc([kernel(corr=i) for i in range(2000)]))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("run/rank0.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    raises(write(tmp_path / "t.tgz", raw[: len(raw) // 2]), "archive")


@pytest.mark.parametrize("content", [b"garbage" * 100, gzip.compress(b"not a tar")])
def test_a_file_named_as_an_archive_that_is_none_says_so(tmp_path: Path, content: bytes) -> None:
    # tarfile lists every compression it tried, one per line; the error is one short line.
    e = raises(write(tmp_path / "run.tar.gz", content), "archive")
    assert e.message == "cannot read the archive: not a tar archive (plain, gzip, bzip2 or xz)"


def test_world_size_disagreement_and_rank_outside_it(tmp_path: Path) -> None:
    write(tmp_path / "a.json", doc([kernel()], rank=0, world=2))
    write(tmp_path / "b.json", doc([kernel()], rank=1, world=4))
    assert "disagree" in raises(tmp_path, "distributedInfo.world_size").message


# -- the sliced parser -----------------------------------------------------------------------------

def whole(path: Path, monkeypatch: pytest.MonkeyPatch) -> TraceBundle:
    def refuse(raw: bytes, on_events: Any) -> dict[str, Any]:
        raise json_slices.WholeParse

    with monkeypatch.context() as m:
        m.setattr(kineto_file, "parse_sliced", refuse)
        return load_kineto(path)


def same(a: TraceBundle, b: TraceBundle) -> None:
    pd.testing.assert_frame_equal(a.kernels, b.kernels)
    assert (a.gpu_names, a.world_size, a.skipped) == (b.gpu_names, b.world_size, b.skipped)
    if a.syncs is None or b.syncs is None:
        assert a.syncs is None and b.syncs is None
    else:
        pd.testing.assert_frame_equal(a.syncs, b.syncs)


@pytest.mark.parametrize("chunk", [1, 300, 5000])
def test_slices_read_a_real_trace_like_one_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  chunk: int) -> None:
    src = real(f"{HTA}/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz")
    path = write(tmp_path / "t.json", gzip.decompress(src.read_bytes()))
    monkeypatch.setattr(json_slices, "CHUNK_BYTES", chunk)
    same(load_kineto(path), whole(path, monkeypatch))


TRICKY = ["}, {", "},{\"ph\": \"X\"}", "]", "],", "\"}, {\"", "\\", "\\\"}, {", "}\n,\n{", "[{}, {}]", "é ☃ \u2028"]


def tricky_events() -> st.SearchStrategy[list[dict[str, Any]]]:
    text = st.one_of(st.sampled_from(TRICKY), st.text(max_size=8))
    ev = st.builds(
        lambda name, note, nested, ts, dur, stream: {
            **kernel(name, ts, dur, stream=stream), "note": note, "nested": nested},
        name=st.lists(text, max_size=3).map("".join), note=st.lists(text, max_size=3).map("".join),
        nested=st.lists(st.dictionaries(st.sampled_from(["a", "}, {"]), text, max_size=2), max_size=3),
        ts=st.floats(0, 1e6), dur=st.floats(0, 1e3), stream=st.integers(0, 3))
    return st.lists(st.one_of(ev, st.just({}), st.integers(0, 3)), max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=tricky_events(), chunk=st.integers(1, 400), indent=st.booleans(),
       trailer=st.sampled_from([{}, {"INFO": ["] }, {"]}, {"deviceList": [{"a": 1}, {"b": [2]}]}]))
def test_slices_never_cut_inside_a_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         events: list[Any], chunk: int, indent: bool,
                                         trailer: dict[str, Any]) -> None:
    d = doc(events, **trailer)
    path = write(tmp_path / "t.json", orjson.dumps(d, option=orjson.OPT_INDENT_2 if indent else 0))
    with monkeypatch.context() as m:
        m.setattr(json_slices, "CHUNK_BYTES", chunk)
        sliced = load_kineto(path)
    same(sliced, whole(path, monkeypatch))
    assert len(sliced.kernels) == sum(1 for e in events if isinstance(e, dict) and e.get("cat") == "kernel")


# -- fuzzing ---------------------------------------------------------------------------------------

WRONG = ["x", "", 1.5, -3, 0, None, True, [], {}, [1, 2, 3], {"a": 1}, 2**63, 2**64 - 1, -(2**63) - 1, 2**70, 1e300,
         -1e-9]


@pytest.fixture(scope="module")
def fuzz_base() -> dict[str, Any]:
    """A real trace (alexnet: kernels, copies, memsets, stream waits) plus the NCCL kernels of another
    with their launches and record_param_comms ops."""
    alexnet = real(f"{HTA}/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz")
    base: dict[str, Any] = orjson.loads(gzip.decompress(alexnet.read_bytes()))
    nccl = orjson.loads(gzip.decompress(real(f"{HTA}/nccl_parser_config/nccl_data.json.gz").read_bytes()))
    comm = [e for e in nccl["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
    corr = {e["args"]["correlation"] for e in comm}
    ext = {e["args"]["External id"] for e in comm}
    linked = [e for e in nccl["traceEvents"] if isinstance(e.get("args"), dict) and e.get("cat") != "kernel"
              and (e["args"].get("correlation") in corr or e["args"].get("External id") in ext)]
    base["traceEvents"] = base["traceEvents"] + comm + linked
    base["distributedInfo"] = {"rank": 0, "world_size": 2}
    base["baseTimeNanoseconds"] = nccl["baseTimeNanoseconds"]
    return base


def outcome(path: Path) -> None:
    """A valid table, or an OvsimError naming the file and a field; anything else fails the test."""
    try:
        b = load_kineto(path)
    except OvsimError as e:
        assert e.source and e.field, e
        return
    validate_table(b.kernels)
    assert set(b.kernels["rank"].unique()) <= set(b.sources)


@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), indent=st.booleans(), gz=st.booleans(), chunk=st.sampled_from([1, 2000, 1 << 22]))
def test_fuzz_mutated_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fuzz_base: dict[str, Any],
                             data: st.DataObject, indent: bool, gz: bool, chunk: int) -> None:
    d = copy.deepcopy(fuzz_base)
    events = d["traceEvents"]
    for _ in range(data.draw(st.integers(1, 30), label="mutations")):
        target = data.draw(st.sampled_from(["event", "args", "meta"]), label="where")
        if target == "meta":
            holder: Any = d if data.draw(st.booleans()) else d.get("distributedInfo")
        else:
            holder = events[data.draw(st.integers(0, len(events) - 1), label="event")]
            if target == "args" and isinstance(holder, dict) and isinstance(holder.get("args"), dict):
                holder = holder["args"]
        if not isinstance(holder, dict) or not holder:
            continue
        key = data.draw(st.sampled_from(sorted(holder)), label="key")
        if data.draw(st.booleans(), label="delete"):
            del holder[key]
        else:
            # A copy: a later mutation may land inside this value, and WRONG is shared by all examples.
            holder[key] = copy.deepcopy(data.draw(st.sampled_from(WRONG), label="value"))
    # json, not orjson: it writes the integers beyond 64 bits that a broken writer might.
    text = json.dumps(d, indent=2 if indent else None).encode()
    path = write(tmp_path / ("t.json.gz" if gz else "t.json"), text, gz=gz)
    with monkeypatch.context() as m:
        m.setattr(json_slices, "CHUNK_BYTES", chunk)
        outcome(path)


@pytest.fixture(scope="module")
def fuzz_text(fuzz_base: dict[str, Any]) -> bytes:
    return orjson.dumps(fuzz_base, option=orjson.OPT_INDENT_2)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0, 1), gz=st.booleans(), chunk=st.sampled_from([1, 2000, 1 << 22]))
def test_fuzz_truncated_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fuzz_text: bytes, cut: float,
                              gz: bool, chunk: int) -> None:
    data = gzip.compress(fuzz_text) if gz else fuzz_text
    path = write(tmp_path / ("t.json.gz" if gz else "t.json"), data[: int(len(data) * cut)])
    with monkeypatch.context() as m:
        m.setattr(json_slices, "CHUNK_BYTES", chunk)
        outcome(path)
