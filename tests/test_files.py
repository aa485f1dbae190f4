"""Outputs are written whole or not at all (ovsim.files.atomic_output)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ovsim.cli import main
from ovsim.errors import OvsimError
from ovsim.files import atomic_output


def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    out.write_text("old")
    with pytest.raises(RuntimeError), atomic_output(out) as tmp:
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["t.json"]


def test_a_finished_write_replaces_the_file_with_plain_permissions(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    out.write_text("old")
    with atomic_output(out) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".csv" and tmp != out
        tmp.write_text("new")
    umask = os.umask(0)
    os.umask(umask)
    assert out.read_text() == "new" and stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


def test_an_exclusive_write_never_replaces(tmp_path: Path) -> None:
    out = tmp_path / "c.v1.yaml"
    out.write_text("kept")
    with pytest.raises(OvsimError, match="exists"), atomic_output(out, exclusive=True) as tmp:
        tmp.write_text("new")
    assert out.read_text() == "kept" and len(list(tmp_path.iterdir())) == 1


def test_an_exclusive_write_without_hard_links_still_never_replaces(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system that has no hard links (os.link raises): the name is taken by a rename once
    it is seen to be free, and an existing file is still kept."""
    def no_links(src: object, dst: object) -> None:
        raise PermissionError("hard links not supported")

    monkeypatch.setattr(os, "link", no_links)
    out = tmp_path / "c.v2.yaml"
    with atomic_output(out, exclusive=True) as tmp:
        tmp.write_text("new")
    assert out.read_text() == "new" and len(list(tmp_path.iterdir())) == 1
    with pytest.raises(OvsimError, match="exists"), atomic_output(out, exclusive=True) as tmp:
        tmp.write_text("newer")
    assert out.read_text() == "new" and len(list(tmp_path.iterdir())) == 1


def test_import_refuses_an_output_that_is_not_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # It used to write parquet bytes under the .csv name.
    assert main(["import", str(tmp_path / "never-read.json"), "-o", str(tmp_path / "k.csv")]) == 2
    err = capsys.readouterr().err
    assert "k.csv" in err and "--output" in err and "parquet" in err
    assert not (tmp_path / "k.csv").exists()
