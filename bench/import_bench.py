"""Trace import speed and memory: ovsim's Kineto importer beside Holistic Trace Analysis's parser on
the same file.

The file is synthetic but made of real events: every event of a shared real trace (by default
HTA's trace_diff test trace, a 2-rank V100 recsys job) is repeated with shifted timestamps and
correlation ids until the uncompressed JSON reaches the target size. Each parser runs in its own
process so that its peak RSS is its own.

    python bench/import_bench.py                 # 100 MB file, ovsim and HTA
    python bench/import_bench.py --mb 35 --no-hta
    python bench/import_bench.py --quick         # 5 MB, for CI

Budget (issue): 100 MB in at most 3 s, peak memory at most 3x the uncompressed size.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO.parent / "shared" / "traces" / "HolisticTraceAnalysis" / "tests" / "data" / "trace_diff" / \
    "test" / "test.json.gz"


def make_trace(source: Path, target_bytes: int, out: Path) -> int:
    """Write a Kineto trace of about ``target_bytes`` made by repeating ``source``'s events."""
    with gzip.open(source, "rt") if source.suffix == ".gz" else open(source) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    timed = [e for e in events if isinstance(e.get("ts"), int | float)]
    t_min = min(float(e["ts"]) for e in timed)
    t_max = max(float(e["ts"]) + float(e.get("dur", 0) or 0) for e in timed)
    period = (t_max - t_min) * 1.01
    one = len(json.dumps(events))
    copies = max(1, math.ceil(target_bytes / one))
    out_events = []
    for c in range(copies):
        for e in events:
            if c and not isinstance(e.get("ts"), int | float):
                continue  # metadata once
            e2 = dict(e)
            if isinstance(e2.get("ts"), int | float):
                e2["ts"] = round(float(e2["ts"]) + c * period, 3)
            args = e2.get("args")
            if isinstance(args, dict) and "correlation" in args:
                e2["args"] = {**args, "correlation": int(args["correlation"]) + c * 10_000_000}
            out_events.append(e2)
    trace["traceEvents"] = out_events
    text = json.dumps(trace)
    out.write_text(text)
    return len(text)


# Peak RSS from VmHWM: a child's ru_maxrss starts from its parent's size at fork, which would
# charge the generator's memory to the parser.
_PEAK = """
def peak_kib():
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return float(line.split()[1])
    except OSError:
        pass
    import resource
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

_OVSIM = _PEAK + """
import sys, time
t = time.perf_counter()
from ovsim.traces.kineto import load_kineto
b = load_kineto(sys.argv[1])
dt = time.perf_counter() - t
print(dt, peak_kib(), len(b.kernels))
"""

_HTA = _PEAK + """
import logging, os, shutil, sys, tempfile, time
logging.disable(logging.WARNING)
d = tempfile.mkdtemp()
os.symlink(sys.argv[1], os.path.join(d, "rank.json"))
t = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=d)
dt = time.perf_counter() - t
print(dt, peak_kib(), len(a.t.get_trace(a.t.get_ranks()[0])))
shutil.rmtree(d)
"""


def run(code: str, path: Path) -> tuple[float, float, int]:
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed")
    seconds, rss_kib, rows = out.stdout.split()
    return float(seconds), float(rss_kib) / 1024, int(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--mb", type=float, default=100.0, help="uncompressed size of the synthetic trace (MB)")
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="real Kineto trace to replicate")
    ap.add_argument("--no-hta", action="store_true", help="skip the HTA comparison")
    ap.add_argument("--repeats", type=int, default=3, help="runs per parser; the best is reported")
    ap.add_argument("--quick", action="store_true", help="5 MB, one run, no HTA (CI smoke)")
    args = ap.parse_args(argv)
    if args.quick:
        args.mb, args.repeats, args.no_hta = 5.0, 1, True
    if not args.source.exists():
        print(f"source trace not found: {args.source} (the shared traces are not here); nothing to measure")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.pt.trace.json"
        size = make_trace(args.source, int(args.mb * 1e6), path)
        print(f"synthetic Kineto trace: {size / 1e6:.1f} MB uncompressed, from {args.source.name}")
        print(f"{'parser':<8} {'best s':>7} {'MB/s':>7} {'peak RSS MiB':>13} {'RSS / size':>10} {'rows':>9}")
        parsers = [("ovsim", _OVSIM)] + ([] if args.no_hta else [("HTA", _HTA)])
        for label, code in parsers:
            try:
                runs = [run(code, path) for _ in range(args.repeats)]
            except RuntimeError as e:
                print(f"{label:<8} failed: {e}")
                continue
            best = min(runs)
            print(f"{label:<8} {best[0]:>7.2f} {size / 1e6 / best[0]:>7.1f} {best[1]:>13.0f} "
                  f"{best[1] * 2**20 / size:>10.2f} {best[2]:>9}")
    print(f"\ncpu: {os.cpu_count()} logical cores visible; each parser runs single-threaded in its own process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
