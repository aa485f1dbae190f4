"""The engine's counter samples (ovsim.engine.record.Counters): a sample kept only where its
counter's value moved, and the samples packed into arrays as they come give the same columns, in
the same order, as the samples listed."""

from __future__ import annotations

import numpy as np
import pytest

import ovsim.engine.record as record
from ovsim.engine.record import Counters


@pytest.mark.parametrize("pack_rows", [1, 3, 1000])
def test_packed_samples_are_the_samples_in_order(monkeypatch: pytest.MonkeyPatch, pack_rows: int) -> None:
    monkeypatch.setattr(record, "_PACK_ROWS", pack_rows)
    c = Counters()
    given = [(0.0, 0, "power_w", 100.0), (0.0, 1, "power_w", 100.0), (0.0, 0, "sm_clock_hz", 1.98e9),
             (1e-3, 0, "power_w", 100.0),  # unmoved: not kept
             (1e-3, 0, "power_w", 650.0), (2e-3, 1, "link_bytes_per_s", 0.0), (3e-3, 0, "sm_clock_hz", 1.98e9),
             (4e-3, 0, "sm_clock_hz", 1.5e9), (5e-3, 1, "power_w", 90.0)]
    for sample in given:
        c.add(*sample)
    kept = [s for i, s in enumerate(given) if i not in (3, 6)]
    cols = c.columns()
    assert cols["time_s"].tolist() == [s[0] for s in kept]
    assert cols["rank"].tolist() == [s[1] for s in kept] and cols["rank"].dtype == np.int64
    assert cols["counter"].tolist() == [s[2] for s in kept] and cols["counter"].dtype == object
    assert cols["value"].tolist() == [s[3] for s in kept]


def test_no_samples_are_empty_columns() -> None:
    cols = Counters().columns()
    assert list(cols) == ["time_s", "rank", "counter", "value"] and all(len(v) == 0 for v in cols.values())
