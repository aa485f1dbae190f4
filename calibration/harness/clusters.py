"""Build and run ``clusters.cu`` on this machine's GPU: where thread-block clusters of cuBLAS's Hopper
GEMMs can go (which SMs share a GPC, and how many 2-block clusters find room while a kernel holds
some SMs). Writes ``OUT/clusters.json`` with the GPU, driver and commit beside the program's output.
Needs nvcc and a GPU of compute capability 9.0 or later (clusters); changes nothing on the GPU.

    OVSIM_COMMIT=$(git rev-parse HEAD) python3 calibration/harness/clusters.py --out RUN
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def query(field: str) -> str:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader", "-i", "0"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder to write clusters.json in (created)")
    args = ap.parse_args()
    cc = query("compute_cap").replace(".", "")
    if not cc.isdigit() or int(cc) < 90:
        print(f"clusters.py: compute capability {cc} has no thread-block clusters (9.0 and later)", file=sys.stderr)
        return 2
    arch = f"sm_{cc}a" if cc == "90" else f"sm_{cc}"
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "clusters"
        subprocess.run(["nvcc", "-O2", f"-arch={arch}", "-o", str(exe), str(HERE / "clusters.cu")], check=True)
        run = subprocess.run([str(exe)], capture_output=True, text=True)
    if run.returncode != 0:
        print(f"clusters.py: the probe failed: {run.stderr.strip()}", file=sys.stderr)
        return 1
    result = json.loads(run.stdout)
    result.update(driver=query("driver_version"), commit=os.environ.get("OVSIM_COMMIT", "unknown"), arch=arch)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "clusters.json").write_text(json.dumps(result) + "\n")
    print(f"wrote {args.out / 'clusters.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
