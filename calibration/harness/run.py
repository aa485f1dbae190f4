"""The calibration harness: measure, on one NVIDIA GPU, what ovsim's contention, dispatch and power
parameters are fitted from. Run it on the GPU's machine; it needs PyTorch, CuPy, nvcc and
nvidia-ml-py there, not ovsim. ``ingest.py`` then turns a run's folder into the committed data set.

    python3 calibration/harness/run.py --out RUN_DIR [--parts gemm,comm,...] [--quick]

Parts (each writes RUN_DIR/<part>/): every experiment is one PyTorch profiler (Kineto) trace,
``<experiment>.json.gz``, with the kernels' per-block records (SM, start, end from %globaltimer)
in ``<experiment>.blocks.csv`` when the harness's own kernels ran, and a line in
``experiments.jsonl`` saying what ran.

- ``gemm``: cuBLAS GEMMs alone, 1024^3 to 16384^3 and skinny and transformer shapes, in BF16,
  FP16, TF32 and FP8 (where the GPU has it).
- ``shapes``: cuBLAS GEMMs alone over the shapes real models run (:func:`shape_grid`): rows from
  1 to 8192 against the four linear layers of hidden sizes 768 to 8192, weight-gradient shapes,
  odd row counts, and batched attention products from 8x8 to 2048x2048, in BF16 (TF32, FP16 and
  FP8 on subsets), all of a precision and kind in one trace whose operators carry their shapes, each
  shape after a pause that lets the power limit's average fall (short kernels run at the top clock).
- ``comm``: communication-like kernels alone: one block per channel, 8 to 32 channels of 512 or
  640 threads with NCCL's ~80 KB of dynamic shared memory and 96 registers, copying or reducing
  through HBM (``kernels.cu``).
- ``overlap``: GEMMs and memory-bound kernels measured alone, then again beside those kernels on
  another stream, at normal and at high stream priority, with the communication launched first
  and last.
- ``shaping``: a 64x64x32-tile GEMM alone with its occupancy shaped by extra shared memory (1 to
  all of its blocks per SM), and beside a communication-like kernel at both priorities.
- ``dispatch``: probes of the block scheduler: a later kernel, at equal or higher priority, that
  needs an empty SM or fits beside the first kernel's blocks; a persistent kernel sized to the SM
  count followed by a communication-like kernel.
- ``copy``: copy-engine copies (device to device, pinned host to device) alone and beside a GEMM
  and a memory-bound kernel.
- ``power``: steady phases of a few seconds each (idle, GEMM, memory-bound, communication-like,
  GEMM beside communication) for the power model; NVML is sampled through every part anyway.
- ``clock``: kernels run back to back for a few seconds from a cool start, so the card's power
  limit walks the SM clock down, with a probe between every few kernels that counts the SM's
  cycles over 100 us of the global timer: each kernel's duration at the clock it ran at, for how
  much of a kernel's time follows the SM clock. Memory-bound kernels run between GEMMs that
  hold the clock down; the streaming add also alternates with the GEMM at GEMM time shares from
  10 to 90%, each share settling at its own clock under the limit (the voltage curve's points).
- ``clock_own`` (not run by default): the 64x64x32-tile GEMM at its natural occupancy and shaped to
  4, 2 and 1 blocks per SM, then cuBLAS's FP16 and BF16 GEMMs of the same 8192^3 problem, each back
  to back for a few seconds with the clock part's probes: power against work done.
- ``own_tiles`` (not run by default): the same WMMA GEMM at tiles from 64x64 to 128x128 with 4 or 8
  warps (``kernels.cu``), each checked against a float64 product, timed alone at 8192^3, then back
  to back for 3 s under the power limit with the probes: a kernel of one's own as its tile grows.
- ``own_tiles_ncu`` (not run by default): Nsight Compute metrics of one launch of each of those
  tiles alone at 4096^3 (L2, DRAM, tensor pipe).
- ``ncu``: Nsight Compute metrics of each kernel kind alone (``ncu --clock-control none``: the
  card's clocks are never locked or changed).

RUN_DIR/manifest.json records the GPU, driver, CUDA, PyTorch, CuPy and nvcc versions, clocks and
power limit as read, the harness kernels' resource use, and how long each part took;
RUN_DIR/power.csv holds the NVML samples in nvidia-smi's CSV layout (UTC timestamps), which
``ovsim calibrate --power-log`` reads.

Inputs are random (never zeros), every kernel is warmed up before the profiled window, and the
harness GEMM is checked against cuBLAS before anything is timed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import framework  # the framework parts (beside this file, as run.py is run)
from harness_common import (
    CHANNEL_SMEM_BYTES,
    OPT_IN_PARTS,
    PARTS,
    PowerSampler,
    log,
    nvml_handle,
    prepare_out,
    write_json_atomic,
)
from harness_ncu import NcuParts


class Harness(NcuParts):
    """Every part of the harness, on this machine's GPU (harness_core.py and the parts it builds on)."""

    def nvml_handle(self) -> Any:
        import pynvml

        pynvml.nvmlInit()
        return nvml_handle(pynvml, self.torch.cuda.current_device(), self.pci_bus_id)

    def manifest(self) -> dict[str, Any]:
        import cupy
        import pynvml
        import torch

        h = self.nvml_handle()

        def read(fn: Callable[[], Any]) -> Any:
            try:
                v = fn()
                return v.decode() if isinstance(v, bytes) else v
            except Exception as e:  # a query this driver does not answer is recorded as such
                return f"unavailable: {type(e).__name__}"

        n = pynvml
        nvcc = subprocess.run([self.nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
        return {
            "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "gpu": self.props.name,
            "compute_capability": f"{self.cc[0]}.{self.cc[1]}",
            "pci_bus_id": self.pci_bus_id,
            "sm_count": self.sms,
            "l2_bytes": int(self.rt["l2CacheSize"]),
            "memory_bytes": self.props.total_memory,
            "shared_mem_per_sm_bytes": self.smem_per_sm,
            "registers_per_sm": int(self.rt["regsPerMultiprocessor"]),
            "driver": read(lambda: n.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": read(lambda: n.nvmlSystemGetCudaDriverVersion()),
            "cuda_runtime_version": torch.version.cuda,
            "torch": torch.__version__,
            "cupy": cupy.__version__,
            "nvcc": nvcc[-1] if nvcc else "unavailable",
            "clocks_mhz_as_read": {
                "sm_current": read(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
                "sm_max": read(lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM)),
                "sm_application": read(lambda: n.nvmlDeviceGetApplicationsClock(h, n.NVML_CLOCK_SM)),
                "mem_current": read(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
                "mem_max": read(lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM)),
            },
            "power_limit_w_as_read": read(lambda: n.nvmlDeviceGetPowerManagementLimit(h) / 1000.0),
            "power_default_limit_w": read(lambda: n.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000.0),
            "persistence_mode": read(lambda: n.nvmlDeviceGetPersistenceMode(h)),
            "ecc_mode": read(lambda: n.nvmlDeviceGetEccMode(h)[0]),
            "stream_priorities": {"high": self.high.priority, "normal": self.normal.priority},
            "kernels": {name: {"registers_per_thread": k.num_regs, "static_shared_mem_bytes": k.shared_size_bytes,
                               "max_threads_per_block": k.max_threads_per_block,
                               "preferred_shared_memory_carveout_pct": k.preferred_shared_memory_carveout}
                        for name, k in self.kernels.items()},
            "channel_dynamic_smem_bytes": CHANNEL_SMEM_BYTES,
            "shaping_paddings": self.shaping_paddings(),
            "nvcc_resource_usage": self.resource_report,
            "quick": self.quick,
            "commit": os.environ.get("OVSIM_COMMIT", "unknown"),
        }


def _counts(text: str, what: str, most: int, why: str) -> tuple[int, ...]:
    """Comma-separated counts from 1 to ``most`` (a command-line option's value)."""
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what} counts, got {text!r}") from None
    if not counts or any(not 1 <= c <= most for c in counts):
        raise argparse.ArgumentTypeError(f"{what} counts from 1 to {most} ({why}), got {text!r}")
    return counts


def _channel_counts(text: str) -> tuple[int, ...]:
    return _counts(text, "channel", 64, "NCCL's most")


def _held_counts(text: str) -> tuple[int, ...]:
    return _counts(text, "SM", 131, "one SM must stay for the victims")


def _gemm_shapes(text: str) -> tuple[tuple[int, int, int], ...]:
    """Comma-separated MxNxK GEMM shapes (a command-line option's value)."""
    shapes = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        dims = item.lower().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise argparse.ArgumentTypeError(f"expected MxNxK with positive integers, got {item!r}")
        shapes.append((int(dims[0]), int(dims[1]), int(dims[2])))
    if not shapes:
        raise argparse.ArgumentTypeError("expected at least one MxNxK shape")
    return tuple(shapes)


def _copy_sizes(text: str) -> tuple[tuple[int, int], ...]:
    """Comma-separated MIBxSTREAMS pairs (a command-line option's value): 1 to 4096 MiB, 1 or 2 streams."""
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts) or not (
                1 <= int(parts[0]) <= 4096 and 1 <= int(parts[1]) <= 2):
            raise argparse.ArgumentTypeError(f"expected MIBxSTREAMS (1-4096 MiB, 1 or 2 streams), got {item!r}")
        out.append((int(parts[0]), int(parts[1])))
    if not out:
        raise argparse.ArgumentTypeError("expected at least one MIBxSTREAMS pair")
    return tuple(out)


def _fractions(text: str) -> tuple[float, ...]:
    """Comma-separated positive numbers (a command-line option's value)."""
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not (0 < v < 100) for v in values):
        raise argparse.ArgumentTypeError(f"expected numbers above 0 and under 100, got {text!r}")
    return values


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="run folder (created)")
    ap.add_argument("--parts", default=",".join(p for p in PARTS if p not in OPT_IN_PARTS),
                    help=f"comma-separated, from {', '.join(PARTS)}")
    ap.add_argument("--quick", action="store_true", help="fewer shapes and shorter phases (about a third the time)")
    ap.add_argument("--overlap-channels", type=_channel_counts, default=(16, 32), metavar="N,N",
                    help="channel counts the overlap part runs its victims beside (default 16,32)")
    ap.add_argument("--smloss-held", type=_held_counts, default=(8, 16, 32, 66), metavar="N,N",
                    help="SM counts the smloss part holds beside its victims (default 8,16,32,66)")
    ap.add_argument("--smloss-gemms", type=_gemm_shapes, default=(), metavar="MxNxK,...",
                    help="BF16 cuBLAS GEMMs the smloss part runs instead of its own victims")
    ap.add_argument("--smloss-wmma", action="store_true",
                    help="the smloss part runs the WMMA GEMMs of kernels.cu (64x64 and 128x128 tiles) as its victims")
    ap.add_argument("--smloss-hold-fractions", type=_fractions, default=(1.5,), metavar="X,X",
                    help="how long the smloss part holds its SMs, in units of the victims' repeats "
                         "(default 1.5: longer than all of them; under 1: ends among them)")
    ap.add_argument("--framework-channels", type=_channel_counts, default=None, metavar="N,N",
                    help="copy-channel counts the framework part runs its kernels beside (default: copy at 2, 8 "
                         "and 24, reduce at 8, poll at 8)")
    ap.add_argument("--framework-copies", type=_copy_sizes, default=framework.COPY_OVERLAPPERS, metavar="MIBxS,...",
                    help="device-to-device copies the framework_copy part runs its kernels beside: MiB per copy "
                         "x streams copying at once (default 512x1)")
    ap.add_argument("--ncu-subject", nargs="?", const="harness", choices=("harness", "framework", "own_tiles"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    # A command's time limit ends the run with SIGTERM: exit through the context managers, so the
    # profiler stops and the power log and manifest keep what was measured.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    channels = framework.CHANNEL_OVERLAPPERS if args.framework_channels is None else tuple(
        ("copy", c) for c in args.framework_channels)
    h = Harness(args.out, args.quick, args.overlap_channels, args.smloss_held, args.smloss_gemms,
                args.smloss_hold_fractions, channels, args.framework_copies)
    h.smloss_wmma = args.smloss_wmma
    if args.ncu_subject == "framework":
        with framework.fp32_gemms(h.torch):
            h.ncu_subject(framework.victims(h))
        return 0
    if args.ncu_subject == "own_tiles":
        h.ncu_subject(h.wmma_tile_launches(4096))
        return 0
    if args.ncu_subject:
        h.ncu_subject()
        return 0
    earlier_parts = prepare_out(args.out, h.props.name, parts)
    h.check_channel()
    gemm_err = h.check_gemm64()
    h.check_profiler()
    manifest = h.manifest()
    manifest["gemm64_relative_error_vs_cublas"] = gemm_err
    manifest["parts"] = dict(earlier_parts)
    index = h.torch.cuda.current_device()
    failed: list[str] = []
    with PowerSampler(args.out / "power.csv", h.nvml_handle(), index) as sampler:
        manifest["power_column"] = "power.draw.instant" if sampler.instant else "power.draw (NVML one-second average)"
        write_json_atomic(args.out / "manifest.json", manifest)
        for part in parts:
            log(f"part {part}")
            t0 = time.perf_counter()
            try:
                getattr(h, f"part_{part}")()
                manifest["parts"][part] = {"seconds": round(time.perf_counter() - t0, 1)}
            except Exception as e:  # one part's failure must not cost the others' data
                # The experiments it finished stay on disk; the manifest says it did not finish.
                traceback.print_exc()
                manifest["parts"][part] = {"seconds": round(time.perf_counter() - t0, 1),
                                           "error": f"{type(e).__name__}: {e}"}
                failed.append(part)
                h.torch.cuda.synchronize()
            write_json_atomic(args.out / "manifest.json", manifest)
    write_json_atomic(args.out / "manifest.json", manifest)
    for part, v in manifest["parts"].items():
        print(f"{part:<10} {v['seconds']:8.1f} s{'  FAILED: ' + v['error'] if 'error' in v else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
