"""Layers and steps as PyTorch ran them on H200s against ovsim: the rows of `ovsim validate
--measured`'s group of them (ovsim.validate.measured_layers), by data set and part, each phase
measured and predicted. A couple of seconds; the figures of docs/calibration.md, "Layers and steps
as PyTorch runs them".

    python bench/layer_times.py
    python bench/layer_times.py --kernels SHAPE [--set h200-sxm/2026-12-04-c] [--part layers_unfused]

``--kernels`` breaks one shape down: each forward op's kernels (the profiler's ``F.*`` ranges)
against ovsim's op of the same name, then every kernel of an iteration by class (its name: GEMMs,
attention, softmax and loss, norms, the optimizer, the rest) against ovsim's ops of the same
class (op_class), per iteration. The profiled iterations of the data sets of 2026-12-04 ran nearer
the top clock than the timed ones (calibration/data/README.md).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

import pandas as pd

from ovsim import api
from ovsim.validate.measured import MEASURED_DATA
from ovsim.validate.measured_layers import MEASURED_LAYERS, measured_layer_checks, read_run, shape_scenario

# A kernel's class by its name, first match wins (attention before GEMMs: cuDNN's attention
# kernels are named for the sm90 instructions they use too). The harness's Triton causal softmax
# (calibration/harness/megatron_attention.py) reached the profiler as "fwd" and "bwd".
CLASSES = (("attention", r"flash|fmha|sdpa|attention"), ("gemm", r"nvjet|gemm|cutlass|xmma|sm90"),
           ("softmax and loss", r"softmax|nll_loss|^fwd$|^bwd$"), ("optimizer", r"adam|multi_tensor"),
           ("norm", r"layer_norm|rms_norm|gammabeta"))


def kernel_class(name: str) -> str:
    low = name.lower()
    return next((c for c, pattern in CLASSES if re.search(pattern, low)), "other")


def op_class(name: str, kind: str) -> str:
    """An ovsim op's class as :func:`kernel_class` names the measured kernels': its kind for GEMMs,
    attention and norms; a softmax (a pass named so, or a fused loss of the kind) as the kernels'
    names say; the optimizer step's passes; the rest, casts and fills included, "other"."""
    if kind in ("gemm", "attention", "norm"):
        return kind
    if kind == "softmax" or "softmax" in name:
        return "softmax and loss"
    return "optimizer" if name.startswith("s0.") else "other"


def rows() -> int:
    checks = measured_layer_checks(MEASURED_DATA)
    if not checks:
        print("no layers.py data sets here (a checkout's calibration/data, or OVSIM_DATA)", file=sys.stderr)
        return 1
    print(f"{'row':<78} {'measured ms':>11} {'ovsim ms':>9} {'error':>7}  "
          "phases (ovsim against measured), iterations, clocks")
    for c in checks:
        print(f"{c.name:<78} {c.reference:>11.2f} {c.predicted:>9.2f} {c.error_pct:>+6.1f}%  {c.note}")
    failed = [c for c in checks if not c.passed]
    print(f"{len(checks) - len(failed)} of {len(checks)} within {checks[0].tolerance_pct:.0f}%")
    return 0


def _find(shape_name: str, rel: str | None, part: str | None
          ) -> tuple[str, str, str, dict[str, object], pd.DataFrame, dict[str, Any]]:
    """The first (set, part, system, shape) measuring ``shape_name``, within ``rel`` and ``part`` if
    given, with the set's tables and manifests."""
    for r, _, system in MEASURED_LAYERS:
        if rel not in (None, r):
            continue
        data, manifests = read_run(MEASURED_DATA / r)
        for p, man in manifests.items():
            for s in man["shapes"]:
                if s["name"] == shape_name and part in (None, p):
                    return r, p, system, s, data, manifests
    raise SystemExit(f"no data set measured {shape_name}" + (f" in {rel}" if rel else "")
                     + (f", part {part}" if part else ""))


def kernels(shape_name: str, rel: str | None, part: str | None) -> int:
    rel, part, system, shape, data, manifests = _find(shape_name, rel, part)
    steps = manifests[part].get("what") == "steps"
    mine = (data["part"] == part) & (data["shape"] == shape_name) & (data["condition"] == "sustained")
    k, ranges = data[mine & (data["table"] == "kernels")], data[mine & (data["table"] == "annotations")]
    ops = api.predict(shape_scenario(shape, steps, system), counters=False).timeline.ops
    ops = ops[ops["rank"] == 0].assign(ms=lambda o: (o["end_s"] - o["start_s"]) * 1e3)
    runs = len(ranges[ranges["name"] == "F.qkv"]) / int(str(shape["layers"])) or 1
    print(f"{shape_name} ({rel}, {part}): {runs:.0f} profiled iterations; ms an iteration")
    forward = ranges[ranges["name"].str.startswith("F.")]
    per_op: dict[str, float] = {}
    for _, r in forward.iterrows():
        inside = k[(k["ts_us"] >= r["ts_us"]) & (k["ts_us"] + k["dur_us"] <= r["ts_us"] + r["dur_us"])]
        per_op[r["name"]] = per_op.get(r["name"], 0.0) + float(inside["dur_us"].sum()) / 1e3 / runs
    print(f"  {'forward op':<16} {'measured':>9} {'ovsim':>9}")
    for op, ms in per_op.items():
        mine_ops = ops[ops["name"].str.match(rf"F0\.(L\d+\.)?{re.escape(op[2:])}(\.|$)")]
        print(f"  {op:<16} {ms:>9.2f} {float(mine_ops['ms'].sum()):>9.2f}")
    by_class = k.groupby(k["name"].map(kernel_class))["dur_us"].sum() / 1e3 / runs
    ovsim_class = ops.groupby([op_class(n, kd) for n, kd in zip(ops["name"], ops["kind"], strict=True)])["ms"].sum()
    print(f"  {'kernels by class':<16} {'measured':>9} {'ovsim':>9}")
    for cls in sorted(set(by_class.index) | set(ovsim_class.index), key=lambda c: -float(by_class.get(c, 0.0))):
        print(f"  {cls:<16} {float(by_class.get(cls, 0.0)):>9.2f} {float(ovsim_class.get(cls, 0.0)):>9.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", metavar="SHAPE", help="break one measured shape down, op by op and by kernel class")
    ap.add_argument("--set", help="the data set (calibration/data/...) to take it from; default: the first")
    ap.add_argument("--part", help="the part of the data set; default: the first that measured it")
    args = ap.parse_args(argv)
    pd.set_option("display.width", 200)
    return kernels(args.kernels, args.set, args.part) if args.kernels else rows()


if __name__ == "__main__":
    sys.exit(main())
