"""README.md's table of plain `ovsim validate` is what the checks give now (bench/validation_table.py
writes it): a model change that moves a figure fails here until the table is regenerated."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_validation_table_is_current() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import validation_table as vt
    finally:
        sys.path.remove(str(ROOT / "bench"))
    readme = (ROOT / "README.md").read_text()
    from ovsim.validate import run

    assert vt.with_table(readme, vt.table(run(None))) == readme, (
        "README.md's validation table is stale: run python bench/validation_table.py --write")
