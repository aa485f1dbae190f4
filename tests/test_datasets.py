"""The registry of measured data sets (calibration/data/registry.yaml, ovsim.validate.datasets)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ovsim.cli import main
from ovsim.errors import OvsimError
from ovsim.traces.table import TraceBundle, make_table
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


def test_the_registry_lists_every_run_and_each_runs_readers() -> None:
    """Every run folder of the repository (one with a PROVENANCE.json) is in ``runs`` and every
    run there is a folder; every data set a family or a fit names is a run; every run is read by a
    fit or a check, or says it is kept for reference only."""
    data = ROOT / "calibration" / "data"
    on_disk = {str(p.parent.relative_to(data)) for p in data.glob("*/*/PROVENANCE.json")}
    runs = {e["set"] for e in datasets.entries(datasets.RUNS)}
    assert runs == on_disk
    roles = datasets.roles()
    assert set(roles) == runs, set(roles) - runs
    for e in datasets.entries(datasets.RUNS):
        assert roles[e["set"]] or "reference only" in e["measured"], e


def test_a_family_entry_marked_fitted_is_one_a_fit_reads() -> None:
    """A family's ``fit`` and ``fit_phase`` marks (the checks' view) and the fits' list (the fit
    scripts' view) agree: every set a family marks fitted is read by a fit."""
    read_by_fits = {(e["gpu"], e["set"]) for e in datasets.entries(datasets.FITS)}
    for family in ("clock_shares", "smloss", "framework", "own_tiles", "own_smloss"):
        marked = [e for e in datasets.entries(family) if e.get("fit") or e.get("fit_phase")]
        assert marked, family
        assert {(e["gpu"], e["set"]) for e in marked} <= read_by_fits, family
    assert datasets.fit_sets("power")["h200-sxm"]["defective"] == "gemm_bf16_8192__channel_copy_32"
    with pytest.raises(OvsimError, match="no data set of fit 'nonesuch'"):
        datasets.fit_sets("nonesuch")


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
    (tmp_path / "registry.yaml").write_text("overlap:\n  - {set: h100-sxm5-80gb/x}\n")
    monkeypatch.setenv("OVSIM_DATA", str(tmp_path))
    with pytest.raises(OvsimError, match="needs 'set' and 'gpu'") as e:
        datasets.entries("overlap")
    assert e.value.field == "overlap.0"


def _run(name: str, n: int, origin: float) -> TraceBundle:
    kernels = make_table({"rank": [0] * n, "stream": [7] * n, "name": [f"{name}_kernel"] * n,
                          "start_s": [1e-3 * i for i in range(n)], "duration_s": [5e-4] * n})
    return TraceBundle(kernels=kernels, gpu_names={0: "NVIDIA H100 80GB HBM3"}, sources={0: f"overlap/{name}.json.gz"},
                       wall_origin_s=origin)


def test_a_part_in_one_file_reads_back_each_experiment_as_its_own_run(tmp_path: Path) -> None:
    """write_tables keeps each experiment's rows and trace metadata apart; a data set's readers
    find them by label and by shell pattern, and say so where one is missing."""
    from ovsim.traces.load import read_tables, write_tables

    runs = {"add__copy_8": _run("add", 3, 1.7e9), "gemm__copy_8": _run("gemm", 2, 1.7e9 + 5),
            "gemm__copy_16": _run("g", 1, 0.0)}
    (tmp_path / "tables").mkdir()
    write_tables(runs, tmp_path / "tables" / "overlap.parquet")
    back = read_tables(tmp_path / "tables" / "overlap.parquet")
    for label, b in runs.items():
        assert back[label].kernels.equals(b.kernels)
        assert (back[label].gpu_names, back[label].sources, back[label].wall_origin_s) == \
            (b.gpu_names, b.sources, b.wall_origin_s)
    assert list(datasets.experiments(tmp_path, "overlap", "gemm__*")) == ["gemm__copy_16", "gemm__copy_8"]
    assert datasets.one_experiment(tmp_path, "overlap", "add__copy_9") is None
    path = datasets.table_path(tmp_path, "overlap", "add__copy_8")
    assert datasets.read_experiment(path).kernels.equals(runs["add__copy_8"].kernels)
    tr = datasets.table_input(path, "h100-sxm5-80gb")
    assert (tr.label, tr.files) == ("add__copy_8.parquet", (str(tmp_path / "tables" / "overlap.parquet"),))
    with pytest.raises(OvsimError, match="no experiment 'add__copy_9'"):
        datasets.read_experiment(datasets.table_path(tmp_path, "overlap", "add__copy_9"))
    # What a caller changes stays with it (the file is read once and kept).
    mine = datasets.read_experiment(path)
    mine.kernels.loc[0, "duration_s"] = 1.0
    mine.gpu_names[0] = "changed"
    again = datasets.read_experiment(path)
    assert again.kernels.loc[0, "duration_s"] == 5e-4 and again.gpu_names == {0: "NVIDIA H100 80GB HBM3"}


def test_one_file_an_experiment_reads_the_same_and_rows_nobody_lists_are_refused(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ovsim.traces.load import read_tables, write_table, write_tables

    (tmp_path / "tables" / "smloss").mkdir(parents=True)
    write_table(_run("a", 2, 0.0), tmp_path / "tables" / "smloss" / "a__hold_8.parquet")
    assert list(datasets.experiments(tmp_path, "smloss")) == ["a__hold_8"]
    assert datasets.part_file(tmp_path, "smloss").is_dir()
    write_tables({"x": _run("x", 2, 0.0)}, tmp_path / "m.parquet")
    t = pq.read_table(tmp_path / "m.parquet")
    df = t.to_pandas()
    df.loc[1, "experiment"] = "y"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(t.schema.metadata),
                   tmp_path / "bad.parquet")
    with pytest.raises(OvsimError, match=r"experiment\(s\) \['y'\]"):
        read_tables(tmp_path / "bad.parquet")


def test_validate_measured_reads_the_data_sets_given_with_data(tmp_path: Path) -> None:
    """``--data DIR`` points ``validate --measured`` at a data folder (what an installed wheel
    needs): its registry is the one read, and a bad one is refused naming that file."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OVSIM_DATA"}
    (tmp_path / "registry.yaml").write_text("overlap:\n  - {set: h100-sxm5-80gb/none}\n")
    bad = subprocess.run([sys.executable, "-m", "ovsim.cli", "validate", "--measured", "--data", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert bad.returncode == 2 and str(tmp_path / "registry.yaml") in bad.stderr
    assert "needs 'set' and 'gpu'" in bad.stderr and bad.stderr.count("\n") == 1


def test_every_data_table_is_zstd_parquet() -> None:
    """The data sets' tables are zstd-compressed parquet (the issue's compact data; ingest.py and
    write_tables write it), every column of every row group."""
    import pyarrow.parquet as pq

    files = sorted((ROOT / "calibration" / "data").glob("*/*/**/*.parquet"))
    assert len(files) > 50
    for f in files:
        meta = pq.ParquetFile(f).metadata
        codecs = {meta.row_group(i).column(j).compression for i in range(meta.num_row_groups)
                  for j in range(meta.num_columns)}
        assert codecs == {"ZSTD"}, (f, codecs)
