"""The guard against a compiled engine module that was built from another source (setup.py,
OVSIM_COMPILE=1): Python imports an extension module in place of the .py beside it, so a stale one
would run old code without a word."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ovsim.engine import MANIFEST, check_compiled, compiled_modules

EXTENSION = "cpython-311-x86_64-linux-gnu.so"


def _built(folder: Path, sources: dict[str, str]) -> None:
    """A folder as setup.py leaves it: each source, its (here empty) extension and the manifest."""
    for name, text in sources.items():
        (folder / f"{name}.py").write_text(text)
        (folder / f"{name}.{EXTENSION}").write_bytes(b"")
    digests = {f"{n}.py": hashlib.sha256(t.encode()).hexdigest() for n, t in sources.items()}
    (folder / MANIFEST).write_text(json.dumps(digests))


def test_a_pure_python_folder_passes(tmp_path: Path) -> None:
    (tmp_path / "sim.py").write_text("x = 1\n")
    assert compiled_modules(tmp_path) == []
    check_compiled(tmp_path)


def test_modules_built_from_their_sources_pass(tmp_path: Path) -> None:
    _built(tmp_path, {"sim": "x = 1\n", "rates": "y = 2\n"})
    # The shared library mypyc builds beside them has no source of its own and is not a module.
    (tmp_path / f"compiled__mypyc.{EXTENSION}").write_bytes(b"")
    assert compiled_modules(tmp_path) == ["rates", "sim"]
    check_compiled(tmp_path)


def test_a_source_edited_after_the_build_is_refused_by_name(tmp_path: Path) -> None:
    _built(tmp_path, {"sim": "x = 1\n", "rates": "y = 2\n"})
    (tmp_path / "rates.py").write_text("y = 3\n")
    with pytest.raises(ImportError, match=r"rates\.py: changed since its compiled module was built"):
        check_compiled(tmp_path)


def test_a_build_without_its_manifest_is_refused(tmp_path: Path) -> None:
    _built(tmp_path, {"sim": "x = 1\n"})
    (tmp_path / MANIFEST).unlink()
    with pytest.raises(ImportError, match="cannot be checked against their sources"):
        check_compiled(tmp_path)


def test_the_shipped_engine_passes_its_own_check() -> None:
    """Whether this run's engine is compiled or not, what is imported matches its sources; a
    compiled one's build recorded ir.py, whose Op its modules read by position."""
    check_compiled()
    import ovsim.engine

    folder = Path(ovsim.engine.__file__).parent
    if compiled_modules(folder):
        assert "../models/ir.py" in json.loads((folder / MANIFEST).read_text())


def test_a_record_read_by_position_edited_after_the_build_is_refused(tmp_path: Path) -> None:
    """The compiled modules read a named tuple's fields (ir.Op) by position: setup.py records its
    source beside the modules' own, by its path from the engine's folder, and a change refuses them."""
    engine, models = tmp_path / "engine", tmp_path / "models"
    engine.mkdir()
    models.mkdir()
    (models / "ir.py").write_text("class Op: ...\n")
    _built(engine, {"sim": "x = 1\n"})
    digests = json.loads((engine / MANIFEST).read_text())
    digests["../models/ir.py"] = hashlib.sha256(b"class Op: ...\n").hexdigest()
    (engine / MANIFEST).write_text(json.dumps(digests))
    check_compiled(engine)
    (models / "ir.py").write_text("class Op:\n    x: int\n")
    with pytest.raises(ImportError, match=r"ir\.py: changed since the compiled engine modules were built"):
        check_compiled(engine)
    (models / "ir.py").unlink()
    with pytest.raises(ImportError, match=r"ir\.py: changed since"):
        check_compiled(engine)

