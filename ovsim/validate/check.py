"""A validation check: a reference, ovsim's value, the error and the rule it passes by."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:

    pass





GB = 1e9
GIB = 2**30


# Relative difference below which an "at_most" check counts two values as equal.
_ROUND_OFF = 1e-9


@dataclass(frozen=True)
class Check:
    name: str
    group: str  # "published" or "trace (held out)"
    reference: float
    predicted: float
    unit: str
    tolerance_pct: float
    source: str
    note: str = ""
    # "within": |error| <= tolerance_pct; "at_most": predicted <= reference (an error bound);
    # "range": low < predicted <= reference; "band": low <= predicted <= high (a target interval
    # around a published reference).
    rule: str = "within"
    low: float = math.nan
    high: float = math.nan

    @property
    def error_pct(self) -> float:
        return (self.predicted - self.reference) / self.reference * 100 if self.reference else math.nan

    @property
    def shown_error_pct(self) -> float | None:
        """The error to print beside the check: against a figure to match ("within") only; against
        a bound the error to it says nothing, the check being whether ovsim is inside."""
        return self.error_pct if self.rule == "within" else None

    @property
    def passed(self) -> bool:
        if self.rule == "at_most":
            # Within float round-off counts as equal: a replay whose kernels met no contention
            # reproduces the naive durations only up to the engine's summed time steps (~1e-12 relative).
            slack = _ROUND_OFF * max(1.0, abs(self.reference))
            return math.isfinite(self.predicted) and self.predicted <= self.reference + slack
        if self.rule == "range":
            return math.isfinite(self.predicted) and self.low < self.predicted <= self.reference
        if self.rule == "band":
            return math.isfinite(self.predicted) and self.low <= self.predicted <= self.high
        return math.isfinite(self.error_pct) and abs(self.error_pct) <= self.tolerance_pct

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "error_pct": self.error_pct, "passed": self.passed}
