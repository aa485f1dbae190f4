"""docs/validation.md's table of plain `ovsim validate`, and docs/training.md's table of its 22B layer checks,
are what the checks give now (bench/validation_table.py writes both): a model change that moves a
figure fails here until the tables are regenerated."""

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
    readme, training = (ROOT / "docs" / "validation.md").read_text(), (ROOT / "docs" / "training.md").read_text()
    from ovsim.validate import run

    checks = run(None)
    assert vt.with_table(readme, vt.table(checks)) == readme, (
        "docs/validation.md's validation table is stale: run python bench/validation_table.py --write")
    assert vt.with_table(training, vt.layer_table(checks), vt.LAYER_BEGIN, vt.LAYER_END) == training, (
        "docs/training.md's 22B layer table is stale: run python bench/validation_table.py --write")
