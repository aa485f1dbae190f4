"""Layers and steps as PyTorch ran them on H200s against ovsim: the rows of `ovsim validate
--measured`'s group of them (ovsim.validate.measured_layers), by data set and part, each phase
measured and predicted. A couple of seconds; the figures of docs/calibration.md, "Layers and steps
as PyTorch runs them".

    python bench/layer_times.py
"""

from __future__ import annotations

import sys

from ovsim.validate.measured import MEASURED_DATA
from ovsim.validate.measured_layers import measured_layer_checks


def main() -> int:
    checks = measured_layer_checks(MEASURED_DATA)
    if not checks:
        print("no layers.py data sets here (a checkout's calibration/data, or OVSIM_DATA)", file=sys.stderr)
        return 1
    print(f"{'row':<78} {'measured ms':>11} {'ovsim ms':>9} {'error':>7}  phases (ovsim against measured)")
    for c in checks:
        phases = c.note.split("; median")[0]
        print(f"{c.name:<78} {c.reference:>11.2f} {c.predicted:>9.2f} {c.error_pct:>+6.1f}%  {phases}")
    failed = [c for c in checks if not c.passed]
    print(f"{len(checks) - len(failed)} of {len(checks)} within {checks[0].tolerance_pct:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
