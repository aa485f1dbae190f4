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
    """Whether this run's engine is compiled or not, what is imported matches its sources."""
    check_compiled()
