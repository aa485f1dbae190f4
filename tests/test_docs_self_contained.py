"""The code, docs, notebooks, tests, examples and benchmarks send no reader to documents outside the
repository: every reference names a public source or a file of the repository.

The names checked are those of notes that live beside the repository, not in it. ``DESIGN.md`` is
matched with its capitals and not after a path (``docs/design.md`` is in the repository).
The shipped calibration files and the calibration scripts are checked too (measured data and
superseded versions, kept as written, are not); only this file is skipped, since it spells the names.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
CHECKED = ("ovsim/", "docs/", "notebooks/", "tests/", "examples/", "bench/", "calibration/", "README.md",
           "CHANGELOG.md")
# Measured data and superseded calibration files are kept as they were written.
KEPT = ("calibration/data/", "calibration/history/")
OUTSIDE = re.compile(
    r"science\.md"
    r"|(?<![\w/])DESIGN\.md"
    r"|seed-and-validation-numbers\.md"
    r"|formats-and-ecosystem\.md"
    r"|style-references\.md"
    r"|\.\./shared"
    r"|shared/research"
)


def _tracked_files() -> list[str]:
    """The files git tracks under ``CHECKED``; outside a git checkout, every file there (bytecode
    caches apart)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *CHECKED], cwd=ROOT, capture_output=True,
                             check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        tops = [ROOT / top for top in CHECKED]
        files = [p.relative_to(ROOT).as_posix() for top in tops if top.is_dir() for p in sorted(top.rglob("*"))
                 if p.is_file() and "__pycache__" not in p.parts]
        files += [top.relative_to(ROOT).as_posix() for top in tops if top.is_file()]
    return [f for f in files if f != SELF and not f.startswith(KEPT)]


def test_no_reference_to_documents_outside_the_repository() -> None:
    files = _tracked_files()
    assert "README.md" in files and any(f.startswith("docs/") for f in files)
    hits = []
    for rel in files:
        path = ROOT / rel
        if not path.is_file():  # deleted in the working tree but still tracked
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            for m in OUTSIDE.finditer(line):
                hits.append(f"{rel}:{n}: {m.group(0)}")
    assert not hits, "references to documents outside the repository:\n" + "\n".join(hits)


@pytest.mark.parametrize(("text", "outside"), [
    ("see DESIGN.md section 3", True),
    ("(science.md 6.2)", True),
    ("../shared/research/seed-and-validation-numbers.md", True),
    ("formats-and-ecosystem.md 2.3", True),
    ("style-references.md", True),
    ("ovsim validate --traces ../shared/traces", True),
    ("shared/research/science.md", True),
    ("docs/design.md", False),
    ("the project design (docs/design.md)", False),
    ("the shared traces", False),
])
def test_pattern(text: str, outside: bool) -> None:
    assert bool(OUTSIDE.search(text)) is outside
