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
import contextlib
import datetime as dt
import functools
import gzip
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import framework  # the framework parts (beside this file, as run.py is run)

HERE = Path(__file__).resolve().parent
PARTS = ("gemm", "shapes", "comm", "overlap", "smloss", "shaping", "dispatch", "copy", "power", "clock", "ncu",
         "framework", "framework_copy", "framework_ncu")
# Parts the default run leaves out: Nsight Compute's, and the real framework kernels' (framework.py).
OPT_IN_PARTS = ("ncu", "framework", "framework_copy", "framework_ncu")
# NCCL's per-block shared memory: 4112 B of scratch per warp for its 20 warps, sized for 640 threads
# whatever the launch uses (NVIDIA/nccl src/include/device.h).
CHANNEL_SMEM_BYTES = 4112 * 20
# NCCL's kernels take 96 registers per thread; the channel kernels hold values live to come close.
CHANNEL_MIN_REGISTERS = 88
CHANNEL_BUFFER_BYTES = 256 << 20  # larger than any L2 the harness meets (50-60 MB on H100/H200)
KINETO_NAME = "{label}.json.gz"
# cuBLAS GEMMs the overlap, copy and power parts run as victims (labels of ``Harness.gemm_specs``).
VICTIM_GEMMS = ("gemm_bf16_8192x8192x8192", "gemm_bf16_4096x4096x4096", "gemm_bf16_2048x8192x8192",
                "gemm_fp8_8192x8192x8192")
# CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT for the harness's own GEMM and probes: the most
# shared memory. Without it the driver configures an SM with the least shared memory that gives the
# launching kernel its occupancy (132 KB on an H100 for one padded GEMM block), which leaves no room
# for a channel block beside it, whatever the paddings computed from the SM's full 228 KB.
SHAPED_CARVEOUT_PCT = 100
SHAPED_KERNELS = ("ovsim_gemm_tile64", "ovsim_probe_first", "ovsim_probe_second")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def find_tool(name: str) -> str | None:
    """A CUDA tool on PATH, else in the CUDA toolkit's or Nsight Compute's usual folders."""
    found = shutil.which(name)
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    candidates = [Path(r) / "bin" / name for r in roots if r]
    candidates += sorted(Path("/opt/nvidia").glob(f"nsight-compute/*/{name}"), reverse=True)
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def nvml_handle(nvml: Any, cuda_index: int, pci_bus_id: str | None) -> Any:
    """The NVML handle of the GPU that CUDA calls ``cuda_index``: by PCI bus id, since NVML numbers
    GPUs in PCI order and ignores CUDA_VISIBLE_DEVICES, so the two indices differ on a machine whose
    process sees a subset of its GPUs."""
    if pci_bus_id:
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        except Exception:  # an old binding or an id format the driver does not take
            pass
    return nvml.nvmlDeviceGetHandleByIndex(cuda_index)


def ncu_has_table(path: Path) -> bool:
    """Whether ``ncu --csv --page raw`` output holds its table (a header row whose first field is ID)."""
    import csv

    try:
        with open(path, newline="", errors="replace") as f:
            return any(row and row[0].strip() == "ID" for row in csv.reader(f))
    except OSError:
        return False


def write_json_atomic(path: Path, doc: Any) -> None:
    """A kill mid-write (a command's time limit) leaves the previous file, never half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


# Hidden sizes of the models the shared traces and the studies run (BERT-small 512 is below the
# range; ViT/BERT-base 768 to GPT-3 6.7B's 4096 and the 175B-class 8192).
SHAPE_HIDDEN = (768, 1024, 2048, 4096, 8192)
# Token rows: decode and small batches (1-128), a short sequence (512), a training micro-batch
# (2048-8192).
SHAPE_ROWS = (1, 8, 32, 128, 512, 2048, 8192)
# Row counts that are no multiple of anything (a ViT's 197 tokens times a batch, a prompt): their
# last tile is ragged.
SHAPE_ODD_ROWS = (141, 788, 5185)
# (batch, m, n, k) of attention's batched products: scores and context of heads of 8 to 128.
SHAPE_BATCHED = ((37632, 8, 8, 64), (37632, 8, 64, 8), (4096, 16, 16, 64), (1536, 197, 197, 64),
                 (1536, 197, 64, 197), (384, 512, 512, 64), (384, 512, 64, 512), (192, 1024, 1024, 128),
                 (192, 1024, 128, 1024), (64, 2048, 2048, 128), (64, 2048, 128, 2048))


def shape_grid() -> list[tuple[str, str, int, int, int, int]]:
    """(experiment, dtype name, batch, m, n, k) of every GEMM the ``shapes`` part runs: each row
    count against a hidden size's four linear layers (fused QKV 3h x h, output h x h, MLP up 4h x h
    and down h x 4h, as n x k), weight gradients (k the token rows), odd row counts and batched
    attention products in BF16, and TF32, FP16 and FP8 subsets."""
    def linear_layers(h: int) -> tuple[tuple[int, int], ...]:
        return (3 * h, h), (h, h), (4 * h, h), (h, 4 * h)

    out: list[tuple[str, str, int, int, int, int]] = []
    for h in SHAPE_HIDDEN:
        layers = linear_layers(h)
        out += [("bf16_linear", "bf16", 1, m, n, k) for m in SHAPE_ROWS for n, k in layers]
        out += [("bf16_linear", "bf16", 1, m, n, k) for m in SHAPE_ODD_ROWS if h <= 4096 for n, k in layers]
        out += [("bf16_linear", "bf16", 1, n, k, tokens) for tokens in (2048, 8192) for n, k in layers[2:]]
        if h in (1024, 4096):
            out += [("tf32_linear", "tf32", 1, m, n, k) for m in (8, 128, 2048, 8192) for n, k in layers]
            out += [("fp16_linear", "fp16", 1, m, n, k) for m in (8, 128, 2048, 8192) for n, k in layers]
    out += [("bf16_batched", "bf16", b, m, n, k) for b, m, n, k in SHAPE_BATCHED]
    # Last: torch._scaled_mm wants every dimension a multiple of 16, and a GPU without FP8 skips it.
    out += [("fp8_linear", "fp8", 1, m, n, k) for h in (1024, 4096) for m in (32, 128, 2048, 8192)
            for n, k in linear_layers(h)]
    # A weight gradient can be a forward shape of another hidden size: run it once.
    return list(dict.fromkeys(out))


def prepare_out(out: Path, gpu: str, parts: list[str]) -> dict[str, Any]:
    """Make ``out`` ready for ``parts``: each part's folder from an earlier run into the same folder
    is removed (its experiments.jsonl is appended to, so a part run twice would list every
    experiment twice), and the parts an earlier run finished are returned, to stay in the manifest.
    A folder holding another GPU's run is refused."""
    previous: dict[str, Any] = {}
    manifest = out / "manifest.json"
    if manifest.is_file():
        try:
            old = json.loads(manifest.read_text())
        except json.JSONDecodeError:
            old = {}
        if old.get("gpu") not in (None, gpu):
            raise SystemExit(f"{out}: holds a run on {old['gpu']}, not {gpu}: give another --out")
        previous = {p: v for p, v in (old.get("parts") or {}).items() if p not in parts}
    for part in parts:
        folder = out / part
        if not folder.exists():
            continue
        made_here = ("experiments.jsonl", "metrics.csv", "ncu.log", "SKIPPED")
        if any((folder / n).exists() for n in made_here) or not any(folder.iterdir()):
            log(f"{folder}: from an earlier run; removed, the part runs again")
            shutil.rmtree(folder)
        else:
            raise SystemExit(f"{folder}: exists and is not a harness part's folder: give another --out")
    return previous


def share_plan(share: float, gemm_s: float, victim_s: float, max_cycle_s: float) -> tuple[int, int]:
    """GEMMs and victim kernels per cycle of an alternation whose GEMM time share is nearest
    ``share``, with the cycle at most ``max_cycle_s`` (at least one of each; of the shares within
    2% of the smaller of the two shares of the nearest, the shortest cycle)."""
    plans = [(abs(g * gemm_s / (g * gemm_s + n * victim_s) - share), g * gemm_s + n * victim_s, g, n)
             for g in range(1, max(1, int(max_cycle_s / gemm_s)) + 1)
             for n in range(1, max(1, int((max_cycle_s - g * gemm_s) / victim_s)) + 1)]
    nearest = min(p[0] for p in plans)
    _, _, g, n = min((p for p in plans if p[0] <= nearest + 0.02 * min(share, 1.0 - share)), key=lambda p: p[1])
    return g, n



def _times(fn: Callable[[], Any], n: int) -> list[Any]:
    """``fn`` called ``n`` times (a phase's loop body)."""
    return [fn() for _ in range(n)]

class PowerSampler:
    """NVML samples on a thread, as fast as NVML answers, in nvidia-smi's CSV layout. The files are
    appended to about once a second, so a run stopped by a time limit keeps what it sampled, and a
    second run into the same folder continues them (ovsim's reader skips a repeated header)."""

    def __init__(self, path: Path, handle: Any, device_index: int, interval_s: float = 0.005,
                 flush_s: float = 1.0) -> None:
        import pynvml

        self.nvml = pynvml
        self.handle = handle
        self.index = device_index
        self.path = path
        self.interval_s = interval_s
        self.flush_s = flush_s
        self.rows: list[tuple[int, float, float, float, float]] = []
        self.errors = 0
        self.instant = self._instant() is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _instant(self) -> float | None:
        """Instantaneous board power (W) where the driver offers it (NVML_FI_DEV_POWER_INSTANT);
        nvmlDeviceGetPowerUsage is a one-second average on Ampere's successors."""
        fid = getattr(self.nvml, "NVML_FI_DEV_POWER_INSTANT", None)
        if fid is None:
            return None
        try:
            v = self.nvml.nvmlDeviceGetFieldValues(self.handle, [fid])[0]
        except Exception:  # the binding or the driver lacks the field
            return None
        if getattr(v, "nvmlReturn", 1) != 0:
            return None
        return float(v.value.uiVal) / 1000.0

    def _sample(self) -> tuple[int, float, float, float, float]:
        n = self.nvml
        t = time.time_ns()
        avg = n.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
        inst = self._instant() if self.instant else float("nan")
        sm = float(n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM))
        mem = float(n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_MEM))
        return (t, inst if inst is not None else float("nan"), avg, sm, mem)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            try:
                self.rows.append(self._sample())
            except Exception:  # one failed query loses one sample, not the rest of the log
                self.errors += 1
            if time.monotonic() - last >= self.flush_s:
                self.write()
                last = time.monotonic()
            time.sleep(self.interval_s)

    def __enter__(self) -> PowerSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.write()
        if self.errors:
            log(f"power sampler: {self.errors} NVML queries failed; those samples are missing")

    def files(self) -> list[tuple[Path, str, int]]:
        """(file, power column, row field): power.csv holds the one column ovsim reads, the
        instantaneous reading where the driver gives one, else NVML's average; with an
        instantaneous reading, NVML's average goes to power_average.csv beside it."""
        if self.instant:
            return [(self.path, "power.draw.instant [W]", 1),
                    (self.path.with_name("power_average.csv"), "power.draw.average [W]", 2)]
        return [(self.path, "power.draw [W]", 2)]

    def write(self) -> None:
        """Append the rows not written yet (with the header when a file is new or has another)."""
        done = getattr(self, "_written", 0)
        rows = self.rows[done:]
        for path, column, pick in self.files():
            header = f"timestamp, index, {column}, clocks.sm [MHz], clocks.mem [MHz]"
            fresh = not path.is_file() or path.stat().st_size == 0
            if not fresh:
                with open(path) as f:
                    fresh = f.readline().strip() != header
            with open(path, "w" if fresh else "a") as f:
                if fresh:
                    f.write(header + "\n")
                for row in rows:
                    if not math.isfinite(row[pick]):  # no reading this time
                        continue
                    stamp = dt.datetime.fromtimestamp(row[0] / 1e9, tz=dt.UTC).strftime("%Y/%m/%d %H:%M:%S.%f")
                    f.write(f"{stamp}, {self.index}, {row[pick]:.2f}, {row[3]:.0f}, {row[4]:.0f}\n")
        self._written = done + len(rows)


class Harness:
    def __init__(self, out: Path, quick: bool, overlap_channels: tuple[int, ...] = (16, 32),
                 smloss_held: tuple[int, ...] = (8, 16, 32, 66),
                 smloss_gemms: tuple[tuple[int, int, int], ...] = (),
                 smloss_hold_fractions: tuple[float, ...] = (1.5,),
                 framework_channels: tuple[tuple[str, int], ...] = framework.CHANNEL_OVERLAPPERS,
                 framework_copies: tuple[tuple[int, int], ...] = framework.COPY_OVERLAPPERS) -> None:
        import cupy
        import torch

        self.torch = torch
        self.cupy = cupy
        # 'tf32' GEMMs are float32 inputs on the tensor cores, in every part that runs one.
        torch.backends.cuda.matmul.allow_tf32 = True
        self.out = out
        self.quick = quick
        self.overlap_channels = overlap_channels
        self.smloss_held = smloss_held
        self.smloss_gemms = smloss_gemms
        self.smloss_hold_fractions = smloss_hold_fractions
        self.framework_channels = framework_channels
        self.framework_copies = framework_copies
        self.dev = torch.device("cuda")
        self.props = torch.cuda.get_device_properties(self.dev)
        # The CUDA runtime's own cudaDeviceProp, for the limits PyTorch does not expose everywhere.
        self.rt = cupy.cuda.runtime.getDeviceProperties(torch.cuda.current_device())
        self.sms = int(self.rt["multiProcessorCount"])
        self.cc = torch.cuda.get_device_capability(self.dev)
        try:
            self.pci_bus_id: str | None = cupy.cuda.runtime.deviceGetPCIBusId(torch.cuda.current_device())
        except Exception:  # recorded as unknown; NVML then goes by index
            self.pci_bus_id = None
        self.smem_per_sm = int(self.rt["sharedMemPerMultiprocessor"])
        self.module, self.resource_report = self._build()
        self.kernels = {name: self.module.get_function(name) for name in (
            "ovsim_channel_copy", "ovsim_channel_reduce", "ovsim_channel_poll", "ovsim_probe_first",
            "ovsim_probe_second", "ovsim_gemm_tile64", "ovsim_clock_probe")}
        for name in ("ovsim_channel_copy", "ovsim_channel_reduce"):
            if self.kernels[name].num_regs < CHANNEL_MIN_REGISTERS:
                log(f"warning: {name} got {self.kernels[name].num_regs} registers per thread, not NCCL's 96: "
                    "it leaves other blocks more room than NCCL would (the manifest records the count)")
        optin = int(self.rt.get("sharedMemPerBlockOptin", self.smem_per_sm - 1024))
        for name, k in self.kernels.items():
            # Above 48 KB a block gets dynamic shared memory only once the kernel's limit is raised.
            k.max_dynamic_shared_size_bytes = optin - k.shared_size_bytes
            if name in SHAPED_KERNELS:
                k.preferred_shared_memory_carveout = SHAPED_CARVEOUT_PCT
        self.high = torch.cuda.Stream(priority=-1)
        self.normal = torch.cuda.Stream(priority=0)
        self.compute = torch.cuda.Stream(priority=0)
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(0)
        self.channel_pass_s: dict[tuple[str, int, int], float] = {}

    # -- building and launching ------------------------------------------------------------------

    def _build(self) -> tuple[Any, str]:
        arch = f"sm_{self.cc[0]}{self.cc[1]}"
        cubin = self.out / f"kernels.{arch}.cubin"
        nvcc = find_tool("nvcc")
        if nvcc is None:
            sys.exit("nvcc: not on PATH nor in CUDA_HOME, CUDA_PATH or /usr/local/cuda: the harness builds kernels.cu "
                     "with it")
        self.nvcc = nvcc
        cmd = [nvcc, "-cubin", f"-arch={arch}", "-O3", "--resource-usage", str(HERE / "kernels.cu"),
               "-o", str(cubin)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"kernels.cu: nvcc failed:\n{r.stderr}")
        return self.cupy.RawModule(path=str(cubin)), r.stderr + r.stdout

    def cp_stream(self, s: Any) -> Any:
        return self.cupy.cuda.ExternalStream(s.cuda_stream)

    def rand(self, *shape: int, dtype: Any = None) -> Any:
        t = self.torch
        return t.randn(*shape, device=self.dev, dtype=dtype or t.float16, generator=self.gen)

    def made(self) -> None:
        """Wait for the tensors just made. PyTorch makes them on the current (default) stream, and
        the harness's other streams do not wait for it: without this, a kernel launched on one of
        them can read inputs still being generated, and its blocks' records can be zeroed after
        they are written."""
        self.torch.cuda.current_stream().synchronize()

    def records(self, blocks: int) -> Any:
        rec = self.torch.zeros(3 * blocks, dtype=self.torch.int64, device=self.dev)
        self.made()
        return rec

    def launch(self, name: str, grid: int, threads: int, args: tuple[Any, ...], smem: int, stream: Any) -> None:
        cp = self.cupy
        conv = tuple(cp.asarray(a) if hasattr(a, "data_ptr") else a for a in args)
        with self.cp_stream(stream):
            self.kernels[name]((grid,), (threads,), conv, shared_mem=smem)

    # -- kernels as callables --------------------------------------------------------------------

    def channel(self, op: str, channels: int, threads: int, iters: int) -> Callable[..., None]:
        """A communication-like launch: (stream, record buffer or None)."""
        a = self.rand(CHANNEL_BUFFER_BYTES // 2)
        b = self.rand(CHANNEL_BUFFER_BYTES // 2)
        dst = self.torch.empty_like(a)
        self.made()
        name = "ovsim_channel_copy" if op == "copy" else "ovsim_channel_reduce"

        def run(stream: Any, rec: Any = None) -> None:
            self.launch(name, channels, threads, self._channel_args(op, a, b, dst, iters, rec), CHANNEL_SMEM_BYTES,
                        stream)
        return run

    def channel_lasting(self, op: str, channels: int, threads: int, seconds: float,
                        extra_iters: int = 0) -> tuple[Callable[..., None], int]:
        """A channel launch that passes over its buffer often enough to last about ``seconds``
        alone (plus ``extra_iters`` passes, at least one), and that count."""
        key = (op, channels, threads)
        if key not in self.channel_pass_s:
            # One pass's time does not depend on what the channels will run beside: measured once.
            once = self.channel(op, channels, threads, iters=1)
            self.channel_pass_s[key] = self.time_alone_s(lambda: once(self.normal))
        per_iter_s = self.channel_pass_s[key]
        iters = max(1, int(seconds / per_iter_s) + extra_iters)
        return self.channel(op, channels, threads, iters=iters), iters

    def _channel_args(self, op: str, a: Any, b: Any, dst: Any, iters: int, rec: Any) -> tuple[Any, ...]:
        """The kernel arguments of ovsim_channel_copy (a -> dst) or ovsim_channel_reduce (a + b -> dst)."""
        cp = self.cupy
        tail = (cp.int64(CHANNEL_BUFFER_BYTES // 16), cp.int32(iters), rec if rec is not None else cp.uint64(0))
        return (a, dst, *tail) if op == "copy" else (a, b, dst, *tail)

    def _gemm64_args(self, a: Any, b: Any, c: Any, m: int, n: int, k: int, rec: Any) -> tuple[Any, ...]:
        i32 = self.cupy.int32
        return (a, b, c, i32(m), i32(n), i32(k), rec if rec is not None else self.cupy.uint64(0))

    def gemm64(self, m: int, n: int, k: int, extra_smem: int) -> tuple[Callable[..., None], int]:
        a, b = self.rand(m, k), self.rand(k, n)
        c = self.torch.empty(m, n, device=self.dev, dtype=self.torch.float32)
        self.made()
        blocks = (m // 64) * (n // 64)

        def run(stream: Any, rec: Any = None) -> None:
            self.launch("ovsim_gemm_tile64", blocks, 128, self._gemm64_args(a, b, c, m, n, k, rec), extra_smem, stream)
        return run, blocks

    def check_gemm64(self) -> float:
        """Relative error of the harness GEMM against cuBLAS in fp32 on fresh random inputs."""
        t = self.torch
        m, n, k = 512, 384, 256
        a, b = self.rand(m, k), self.rand(k, n)
        c = t.full((m, n), float("nan"), device=self.dev, dtype=t.float32)
        self.launch("ovsim_gemm_tile64", (m // 64) * (n // 64), 128, self._gemm64_args(a, b, c, m, n, k, None), 0,
                    t.cuda.current_stream())
        t.cuda.synchronize()
        ref = a.double() @ b.double()
        err = float((c.double() - ref).norm() / ref.norm())
        if not err < 1e-3:
            sys.exit(f"ovsim_gemm_tile64 is wrong: relative error {err} against cuBLAS")
        return err

    def check_channel(self) -> None:
        t = self.torch
        for op in ("copy", "reduce"):
            a, b = self.rand(CHANNEL_BUFFER_BYTES // 2), self.rand(CHANNEL_BUFFER_BYTES // 2)
            dst = t.full_like(a, float("nan"))
            self.launch(f"ovsim_channel_{op}", 24, 640, self._channel_args(op, a, b, dst, 1, None), CHANNEL_SMEM_BYTES,
                        t.cuda.current_stream())
            t.cuda.synchronize()
            want = a if op == "copy" else a + b
            if not bool(t.equal(dst, want)):
                sys.exit(f"ovsim_channel_{op} is wrong: its output differs from the input it moved")

    def check_profiler(self) -> None:
        """The PyTorch profiler must record the kernels CuPy launches on PyTorch's streams (CUPTI sees
        every kernel of the context); every overlap, shaping and dispatch result depends on it, so
        a profiler that misses them stops the run here rather than after its parts."""
        from torch.profiler import ProfilerActivity, profile

        chan = self.channel("copy", 8, 512, iters=1)
        self.warm(lambda: chan(self.normal))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            chan(self.normal)
            self.torch.cuda.synchronize()
        path = self.out / "profiler_check.json"
        prof.export_chrome_trace(str(path))
        seen = '"ovsim_channel_copy"' in path.read_text(errors="replace")
        path.unlink()
        if not seen:
            sys.exit("the PyTorch profiler recorded no ovsim_channel_copy kernel: the harness kernels CuPy launches "
                     "would be missing from every trace")

    # -- experiments -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def experiment(self, part: str, label: str, **info: Any) -> Iterator[dict[str, Any]]:
        """Profile the body into <part>/<label>.json.gz; per-block records the body registers in
        ``ctx['records']`` (name -> (tensor, launch)) go to <label>.blocks.csv."""
        from torch.profiler import ProfilerActivity, profile

        t = self.torch
        folder = self.out / part
        folder.mkdir(parents=True, exist_ok=True)
        ctx: dict[str, Any] = {"records": []}
        t.cuda.synchronize()
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            yield ctx
            t.cuda.synchronize()
        raw = folder / f"{label}.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(folder / KINETO_NAME.format(label=label), "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        if ctx["records"]:
            with open(folder / f"{label}.blocks.csv", "w") as f:
                f.write("kernel,launch,block,smid,start_ns,end_ns\n")
                for kernel, launch, rec in ctx["records"]:
                    r = rec.view(-1, 3).cpu().tolist()
                    for i, (sm, s, e) in enumerate(r):
                        f.write(f"{kernel},{launch},{i},{sm},{s},{e}\n")
        with open(folder / "experiments.jsonl", "a") as f:
            f.write(json.dumps({"label": label, "part": part, **info}) + "\n")
        log(f"  {part}/{label}: {time.perf_counter() - t0:.1f} s")

    def warm(self, fn: Callable[[], Any], n: int = 2) -> None:
        for _ in range(n):
            fn()
        self.torch.cuda.synchronize()

    def time_alone_s(self, fn: Callable[[], Any], reps: int = 3) -> float:
        """Seconds per call, from the host around a device synchronize: ``fn`` may launch on any
        stream, which events on the current one would not see. Used to size experiments (kernels
        of 0.1 ms and more, where launch time is small); the profiler gives the durations."""
        t = self.torch
        self.warm(fn)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        t.cuda.synchronize()
        return (time.perf_counter() - t0) / reps

    # -- parts -----------------------------------------------------------------------------------

    def gemm_specs(self) -> list[tuple[str, int, int, int, str]]:
        """(label, m, n, k, dtype name) of every cuBLAS GEMM the ``gemm`` part runs."""
        squares = [1024, 2048, 4096, 8192] if self.quick else [1024, 2048, 4096, 8192, 16384]
        shapes = [(s, s, s) for s in squares]
        shapes += [(128, 8192, 8192), (512, 8192, 8192), (2048, 8192, 8192), (8192, 8192, 1024),
                   (4096, 28672, 8192), (4096, 8192, 28672)]
        specs = []
        for (m, n, k) in shapes:
            for dname in ("bf16", "fp16", "tf32"):
                if self.quick and dname == "tf32" and m * n * k > 8192**3:
                    continue
                specs.append((f"gemm_{dname}_{m}x{n}x{k}", m, n, k, dname))
            if tuple(self.cc) >= (8, 9):
                specs.append((f"gemm_fp8_{m}x{n}x{k}", m, n, k, "fp8"))
        return specs

    def gemm_ops(self, want: tuple[str, ...]) -> dict[str, Callable[[], Any]]:
        """The cuBLAS GEMMs of ``want`` (labels of ``gemm_specs``), each with two input sets, so
        back-to-back runs do not hit in L2. Inputs are made here, only for these labels."""
        ops: dict[str, Callable[[], Any]] = {}
        for label, m, n, k, dname in self.gemm_specs():
            if label not in want or (dname == "fp8" and not hasattr(self.torch, "_scaled_mm")):
                continue
            ops[label] = self.cublas_gemm(dname, 1, m, n, k)
        self.made()
        return ops

    def cublas_gemm(self, dname: str, batch: int, m: int, n: int, k: int) -> Callable[[], Any]:
        """A cuBLAS GEMM (batched where ``batch`` > 1; FP8 through ``torch._scaled_mm``, unbatched)
        on two input sets it rotates between, so back-to-back runs do not hit in L2."""
        t = self.torch
        if dname == "fp8":
            one = t.tensor(1.0, device=self.dev)
            fp8 = [(self.rand(m, k).to(t.float8_e4m3fn), self.rand(n, k).to(t.float8_e4m3fn).t()) for _ in range(2)]
            return self._rotating(
                lambda a, b: t._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=t.bfloat16), fp8)
        dtype = {"bf16": t.bfloat16, "fp16": t.float16, "tf32": t.float32}[dname]
        lead = (batch,) if batch > 1 else ()
        sets = [(self.rand(*lead, m, k, dtype=dtype), self.rand(*lead, k, n, dtype=dtype)) for _ in range(2)]
        return self._rotating(lambda a, b: t.matmul(a, b), sets)

    @staticmethod
    def _rotating(fn: Callable[..., Any], sets: list[tuple[Any, Any]]) -> Callable[[], Any]:
        state = {"i": 0}

        def run() -> Any:
            a, b = sets[state["i"] % len(sets)]
            state["i"] += 1
            return fn(a, b)
        return run

    def part_gemm(self) -> None:
        # One GEMM's inputs at a time: all of them at once would hold 28 GiB (14 GiB with --quick).
        for label, *_ in self.gemm_specs():
            ops = self.gemm_ops((label,))
            if label not in ops:
                continue
            fn = ops[label]
            self.warm(fn, 3)
            with self.experiment("gemm", label, repeats=10):
                for _ in range(10):
                    fn()
            del ops, fn

    def part_shapes(self) -> None:
        t = self.torch
        grid = shape_grid()
        fp8 = tuple(self.cc) >= (8, 9) and hasattr(t, "_scaled_mm")
        for experiment in dict.fromkeys(e for e, *_ in grid):
            specs = [g for g in grid if g[0] == experiment]
            if experiment.startswith("fp8") and not fp8:
                continue
            with self.experiment("shapes", experiment, shapes=[list(g[1:]) for g in specs], repeats=10):
                for _, dname, batch, m, n, k in specs:
                    fn = self.cublas_gemm(dname, batch, m, n, k)
                    self.warm(fn, 2)
                    for _ in range(10):
                        fn()
                    t.cuda.synchronize()
                    del fn
                    # Long enough for the power limit's average (about 70 ms) to fall back after
                    # the largest shapes (about 60 ms of GEMMs), so every shape starts at the top clock.
                    time.sleep(0.15 if 2.0 * batch * m * n * k > 1e11 else 0.01)

    def part_comm(self) -> None:
        for op in ("copy", "reduce"):
            for channels in (8, 16, 24, 32):
                for threads in (512, 640):
                    run = self.channel(op, channels, threads, iters=2)
                    self.warm(functools.partial(run, self.normal))
                    label = f"channel_{op}_{channels}x{threads}"
                    with self.experiment("comm", label, op=op, channels=channels, threads=threads,
                                         bytes_per_launch=2 * CHANNEL_BUFFER_BYTES,
                                         dynamic_smem_bytes=CHANNEL_SMEM_BYTES) as ctx:
                        for i in range(5):
                            rec = self.records(channels)
                            run(self.normal, rec)
                            ctx["records"].append((f"ovsim_channel_{op}", i, rec))

    @functools.cached_property
    def victims(self) -> dict[str, Callable[[], Any]]:
        """Kernels measured beside communication: GEMMs of several sizes, memory-bound kernels.
        Their inputs are made once and kept for every part that runs them."""
        t = self.torch
        out = self.gemm_ops(VICTIM_GEMMS)
        x, y = self.rand(1 << 28, dtype=t.bfloat16), self.rand(1 << 28, dtype=t.bfloat16)
        out["add_bf16_256M"] = lambda: t.add(x, y)
        h = self.rand(16384, 8192, dtype=t.bfloat16)
        w = t.ones(8192, device=self.dev, dtype=t.bfloat16)
        out["layernorm_bf16_16384x8192"] = lambda: t.nn.functional.layer_norm(h, (8192,), w)
        out["softmax_bf16_16384x8192"] = lambda: t.softmax(h, dim=-1)
        self.made()
        return out

    def part_overlap(self) -> None:
        reps = 6
        victims = self.victims
        if self.quick:
            victims = {k: v for i, (k, v) in enumerate(victims.items()) if i % 2 == 0}
        for vname, fn in victims.items():
            victim_s = self.time_alone_s(fn)
            for op in ("copy", "reduce"):
                for channels in self.overlap_channels:
                    # Long enough to cover the overlapped repeats with margin.
                    comm, iters = self.channel_lasting(op, channels, 640, 1.5 * reps * victim_s, extra_iters=1)
                    # Launch order matters where the victim fills the GPU before the channels arrive.
                    orders = ("comm", "victim") if vname.startswith("gemm") else ("comm",)
                    for prio in ("normal", "high"):
                        for first in orders:
                            label = f"{vname}__{op}_{channels}__{prio}__{first}_first"
                            stream = self.high if prio == "high" else self.normal
                            with self.experiment("overlap", label, victim=vname, op=op, channels=channels,
                                                 priority=prio, first=first, comm_iters=iters,
                                                 victim_alone_s=victim_s) as ctx:
                                self._alone_then_beside(fn, comm, stream, first, reps, ctx, op, channels)

    # Victims of the ``smloss`` part (its SM counts held are ``--smloss-held``, from a few to half
    # the GPU by default): the two square GEMMs and the add, and the 2048x8192x8192 GEMM whose steps
    # the overlap part's replay misses.
    SMLOSS_VICTIMS = ("gemm_bf16_8192x8192x8192", "gemm_bf16_4096x4096x4096", "gemm_bf16_2048x8192x8192",
                      "add_bf16_256M")

    def smloss_victims(self) -> dict[str, Callable[[], Any]]:
        """The ``smloss`` part's victims: ``SMLOSS_VICTIMS``, or the BF16 GEMMs of ``--smloss-gemms``."""
        if not self.smloss_gemms:
            return {v: self.victims[v] for v in self.SMLOSS_VICTIMS}
        return {f"gemm_bf16_{m}x{n}x{k}": self.cublas_gemm("bf16", 1, m, n, k) for m, n, k in self.smloss_gemms}

    def part_smloss(self) -> None:
        """Victims alone, then beside a kernel that only holds SMs: one warp per SM spinning on the
        clock with all of the SM's shared memory, so no block that needs shared memory fits beside it
        and it moves no data. Against the ``overlap`` part (channel blocks, which hold SMs and move
        data), this separates the SMs a collective takes from the memory traffic it adds.

        A hold fraction of 1.5 (the default) outlasts the victims' repeats; one under 1 ends
        among them (``fraction`` x the repeats' time after they begin), so that a victim loses its
        SMs only for part of its run."""
        t = self.torch
        reps = 6
        hold_smem = self.smem_per_sm - 1024 - 64
        for vname, fn in self.smloss_victims().items():
            victim_s = self.time_alone_s(fn)
            for fraction, held in itertools.product(self.smloss_hold_fractions, self.smloss_held):
                # The holding blocks start about 0.5 ms before the victims (the sleep below).
                spin_ns = int(fraction * reps * victim_s * 1e9) + (1_000_000 if fraction >= 1 else 500_000)
                label = f"{vname}__hold_{held}" + ("" if fraction == 1.5 else f"__for_{fraction:g}")
                with self.experiment("smloss", label, victim=vname, held_sms=held, hold_threads=32,
                                     hold_smem_bytes=hold_smem, hold_spin_ns=spin_ns, hold_fraction=fraction,
                                     victim_alone_s=victim_s) as ctx:
                    with t.cuda.stream(self.compute):
                        for _ in range(reps):
                            fn()
                    t.cuda.synchronize()
                    rec = self.records(held)
                    self.launch("ovsim_probe_first", held, 32, (self.cupy.uint64(spin_ns), self.cupy.int32(0), rec),
                                hold_smem, self.normal)
                    time.sleep(0.0005)  # the holding blocks are resident before the victims arrive
                    with t.cuda.stream(self.compute):
                        for _ in range(reps):
                            fn()
                    t.cuda.synchronize()
                    ctx["records"].append(("ovsim_probe_first", 0, rec))

    def _alone_then_beside(self, fn: Callable[[], Any], comm: Callable[..., None], stream: Any,
                           first: str, reps: int, ctx: dict[str, Any], op: str, channels: int) -> None:
        """``reps`` clean instances of the victim, then ``reps`` beside one long communication kernel;
        the importer tells them apart by whether a collective kernel overlaps each."""
        t = self.torch
        with t.cuda.stream(self.compute):
            for _ in range(reps):
                fn()
        t.cuda.synchronize()
        rec = self.records(channels)
        if first == "comm":
            comm(stream, rec)
            time.sleep(0.0005)  # the channel blocks are resident before the victims arrive
            with t.cuda.stream(self.compute):
                for _ in range(reps):
                    fn()
        else:
            with t.cuda.stream(self.compute):
                for _ in range(reps):
                    fn()
            comm(stream, rec)
        t.cuda.synchronize()
        ctx["records"].append((f"ovsim_channel_{op}", 0, rec))

    def shaping_paddings(self) -> list[tuple[int, int]]:
        """(blocks per SM, extra shared memory) from the GEMM's natural occupancy down to one block."""
        k = self.kernels["ovsim_gemm_tile64"]
        static = k.shared_size_bytes
        # Registers are allocated per warp in units of 256.
        regs = 4 * -(-max(k.num_regs, 1) * 32 // 256) * 256
        by_regs = int(self.rt["regsPerMultiprocessor"]) // regs
        by_threads = int(self.rt["maxThreadsPerMultiProcessor"]) // 128
        reserved = 1024  # per block, sm_80 and later
        by_smem = self.smem_per_sm // (static + reserved)
        natural = min(by_regs, by_threads, by_smem, 32)
        out = [(natural, 0)]
        for want in range(natural - 1, 0, -1):
            # The smallest padding that keeps want + 1 blocks from fitting.
            per_block = self.smem_per_sm // (want + 1) + 1
            out.append((want, max(0, per_block - static - reserved)))
        return out

    def part_shaping(self) -> None:
        size = 4096 if self.quick else 8192
        paddings = self.shaping_paddings()
        for occ, pad in paddings:
            run, blocks = self.gemm64(size, size, size, pad)
            self.warm(functools.partial(run, self.compute))
            with self.experiment("shaping", f"gemm64_{size}_occ{occ}", blocks_per_sm_target=occ,
                                 extra_smem_bytes=pad) as ctx:
                for i in range(3):
                    rec = self.records(blocks)
                    run(self.compute, rec)
                    ctx["records"].append(("ovsim_gemm_tile64", i, rec))
        alone = 2
        # Both ends of the occupancy range (one, when the GEMM's natural occupancy is one block).
        for occ, pad in dict((paddings[0], paddings[-1])).items():
            run, blocks = self.gemm64(size, size, size, pad)
            victim_s = self.time_alone_s(functools.partial(run, self.compute), reps=2)
            comm, _ = self.channel_lasting("copy", 16, 544, 1.2 * victim_s)
            for prio in ("normal", "high"):
                stream = self.high if prio == "high" else self.normal
                label = f"gemm64_{size}_occ{occ}__copy_16__{prio}__victim_first"
                with self.experiment("shaping", label, blocks_per_sm_target=occ, extra_smem_bytes=pad,
                                     priority=prio, first="victim", victim_alone_s=victim_s,
                                     alone_launches=alone) as ctx:
                    # Instances alone in the same trace, which the summary's slowdown divides by.
                    for _ in range(alone):
                        run(self.compute)
                    self.torch.cuda.synchronize()
                    grec, crec = self.records(blocks), self.records(16)
                    run(self.compute, grec)
                    comm(stream, crec)
                    ctx["records"] += [("ovsim_gemm_tile64", 0, grec), ("ovsim_channel_copy", 0, crec)]

    def part_dispatch(self) -> None:
        spin_first_ns, spin_second_ns = 200_000, 100_000
        per_sm = 4
        first_smem = self.smem_per_sm // per_sm - 1024 - 64
        waves = 10
        first_blocks = self.sms * per_sm * waves
        cases = {
            # needs an SM with no first-kernel block on it
            "empty_sm": (self.smem_per_sm - 1024 - 64, 1024),
            # fits in the room one retiring first-kernel block leaves
            "one_slot": (first_smem, 256),
        }
        for case, (second_smem, second_threads) in cases.items():
            for prio in ("equal", "high"):
                stream = self.high if prio == "high" else self.normal
                label = f"probe_{case}_{prio}"
                with self.experiment("dispatch", label, first_blocks=first_blocks, first_smem=first_smem,
                                     first_spin_ns=spin_first_ns, second_blocks=self.sms // 2,
                                     second_smem=second_smem, second_threads=second_threads,
                                     second_spin_ns=spin_second_ns, priority=prio) as ctx:
                    r1, r2 = self.records(first_blocks), self.records(self.sms // 2)
                    # The first kernel's blocks retire one at a time on each SM (stagger 1).
                    self.launch("ovsim_probe_first", first_blocks, 256,
                                (self.cupy.uint64(spin_first_ns), self.cupy.int32(1), r1), first_smem, self.compute)
                    time.sleep(0.001)  # the second kernel arrives a few waves in
                    self.launch("ovsim_probe_second", self.sms // 2, second_threads,
                                (self.cupy.uint64(spin_second_ns), self.cupy.int32(0), r2), second_smem, stream)
                    ctx["records"] += [("ovsim_probe_first", 0, r1), ("ovsim_probe_second", 0, r2)]
        # A persistent kernel (one wave, every SM) and a communication-like kernel behind it.
        for prio in ("equal", "high"):
            stream = self.high if prio == "high" else self.normal
            comm = self.channel("copy", 16, 640, iters=1)
            with self.experiment("dispatch", f"persistent_then_channel_{prio}", persistent_blocks=self.sms,
                                 persistent_spin_ns=2_000_000, priority=prio) as ctx:
                r1, r2 = self.records(self.sms), self.records(16)
                self.launch("ovsim_probe_first", self.sms, 1024,
                            (self.cupy.uint64(2_000_000), self.cupy.int32(0), r1), self.smem_per_sm // 2, self.compute)
                time.sleep(0.0005)
                comm(stream, r2)
                ctx["records"] += [("ovsim_probe_first", 0, r1), ("ovsim_channel_copy", 0, r2)]

    def part_copy(self) -> None:
        t = self.torch
        n = 1 << 29  # 1 GiB of bf16
        src = self.rand(n, dtype=t.bfloat16)
        dst = t.empty_like(src)
        host = t.empty(n, dtype=t.bfloat16, pin_memory=True).copy_(src.cpu())
        dst2 = t.empty_like(src)
        victims = self.victims
        copies: dict[str, Callable[[], Any]] = {"d2d": lambda: dst.copy_(src, non_blocking=True),
                                                "h2d": lambda: dst2.copy_(host, non_blocking=True)}
        for cname, copy in copies.items():
            with t.cuda.stream(self.normal):
                self.warm(copy)
            with self.experiment("copy", f"{cname}_alone", copy=cname, bytes=2 * n), t.cuda.stream(self.normal):
                for _ in range(3):
                    copy()
            for vname in ("gemm_bf16_8192x8192x8192", "add_bf16_256M"):
                fn = victims[vname]
                self.warm(fn)
                with self.experiment("copy", f"{vname}__{cname}", copy=cname, victim=vname, bytes=2 * n):
                    with t.cuda.stream(self.compute):
                        for _ in range(4):
                            fn()
                    t.cuda.synchronize()
                    with t.cuda.stream(self.normal):
                        for _ in range(3):
                            copy()
                    with t.cuda.stream(self.compute):
                        for _ in range(8):
                            fn()

    def part_power(self) -> None:
        t = self.torch
        phase_s = 1.5 if self.quick else 4.0
        v = self.victims
        gemm, add = v["gemm_bf16_8192x8192x8192"], v["add_bf16_256M"]
        comm, _ = self.channel_lasting("copy", 32, 640, phase_s)

        def loop(fn: Callable[[], Any]) -> None:
            end = time.perf_counter() + phase_s
            while time.perf_counter() < end:
                with t.cuda.stream(self.compute):
                    fn()
                # The compute stream only: a device-wide wait would also wait for a channel kernel
                # running beside the loop, and the rest of the phase would run the GEMMs alone.
                self.compute.synchronize()

        with self.experiment("power", "idle", seconds=phase_s):
            time.sleep(phase_s)
        with self.experiment("power", "gemm_bf16_8192", seconds=phase_s):
            loop(lambda: [gemm() for _ in range(20)])
        # The same GEMM in other precisions: the power model's dynamic power depends on precision.
        for dname in ("tf32", "fp8"):
            label = f"gemm_{dname}_8192x8192x8192"
            other = self.gemm_ops((label,)).get(label)
            if other is None:  # no FP8 on this GPU or in this PyTorch
                continue
            self.warm(other)
            with self.experiment("power", f"gemm_{dname}_8192", seconds=phase_s):
                loop(functools.partial(_times, other, 20))
            del other
        with self.experiment("power", "add_bf16_256M", seconds=phase_s):
            loop(lambda: [add() for _ in range(20)])
        with self.experiment("power", "channel_copy_32", seconds=phase_s):
            comm(self.normal)
        with self.experiment("power", "gemm_bf16_8192__channel_copy_32", seconds=phase_s):
            comm(self.high)
            loop(lambda: [gemm() for _ in range(20)])

    # Victims of the ``clock`` part: cuBLAS GEMMs alone, and memory-bound kernels after GEMMs
    # (alone they stay below the power limit, so the clock would never move under them).
    CLOCK_GEMMS = ("gemm_bf16_8192x8192x8192", "gemm_bf16_4096x4096x4096", "gemm_bf16_2048x8192x8192",
                   "gemm_fp8_8192x8192x8192", "gemm_tf32_8192x8192x8192")
    CLOCK_MEMORY = ("add_bf16_256M", "layernorm_bf16_16384x8192", "softmax_bf16_16384x8192")
    CLOCK_WINDOW_NS = 100_000
    # Kernels between two probes: about this long, so the probes cost ~2% of the phase.
    CLOCK_GROUP_S = 0.005
    # GEMM time shares of GEMM/add alternations beyond the ~half of the add's phase above. The add
    # draws the same power at any clock (it does not follow it, and the H100's fitted memory SM
    # weight is 0), so the limit's average power, less the add's share of it, is the GEMM's power at
    # the clock the phase settles at: low shares stay under the limit at the top clock, high shares
    # walk it down towards the GEMM's own. Points of the voltage curve above ~1500 MHz, with no
    # clock or limit ever set.
    CLOCK_GEMM_SHARES = (0.1, 0.25, 0.75, 0.9)
    # A cycle well inside the power loop's ~70 ms window, so the phase runs at one clock.
    CLOCK_SHARE_CYCLE_S = 0.015

    def part_clock(self) -> None:
        """Per kernel, the SM clock it ran at, counted by probes between the kernels of its stream.

        Each phase starts after an idle pause (the clock back at its highest) and runs for a few
        seconds, while the power limit lowers the clock: the kernels' durations then span the clocks
        the firmware picks, which the harness never sets. The probes run on the same stream as the
        kernels, so none overlaps them; a kernel's clock is the mean of the probes on either side."""
        t = self.torch
        phase_s, cool_s = (2.0, 1.0) if self.quick else (5.0, 2.0)
        heater = self.victims["gemm_bf16_8192x8192x8192"]
        heater_s = self.time_alone_s(heater)
        ops = dict(self.victims)
        ops.update(self.gemm_ops(tuple(g for g in self.CLOCK_GEMMS if g not in ops)))
        # Enough slots for the densest phase; a probe past the end would write out of bounds.
        slots = int(2 * phase_s / (self.CLOCK_GROUP_S + self.CLOCK_WINDOW_NS * 1e-9)) + 64
        phases: list[tuple[str, str, int, int, dict[str, Any]]] = []
        victim_s: dict[str, float] = {}
        for vname in self.CLOCK_GEMMS + self.CLOCK_MEMORY:
            if vname not in ops:  # no FP8 on this GPU or in this PyTorch
                continue
            victim_s[vname] = self.time_alone_s(ops[vname])
            group = max(1, round(self.CLOCK_GROUP_S / victim_s[vname]))
            memory = vname in self.CLOCK_MEMORY
            heat = max(1, round(self.CLOCK_GROUP_S / heater_s)) if memory else 0
            phases.append((f"{vname}__after_gemm" if memory else vname, vname, group, heat, {}))
        add = "add_bf16_256M"
        for share in self.CLOCK_GEMM_SHARES:
            heat, group = share_plan(share, heater_s, victim_s[add], self.CLOCK_SHARE_CYCLE_S)
            phases.append((f"{add}__gemm_share_{round(share * 100)}", add, group, heat,
                           {"gemm_share": share, "heater_alone_s": heater_s}))
        for label, vname, group, heat, extra in phases:
            fn = ops[vname]
            out = t.zeros(4 * slots, dtype=t.int64, device=self.dev)
            self.made()
            time.sleep(cool_s)
            with self.experiment("clock", label, victim=vname, group=group, heater_group=heat,
                                 heater="gemm_bf16_8192x8192x8192" if heat else None,
                                 window_ns=self.CLOCK_WINDOW_NS, seconds=phase_s, victim_alone_s=victim_s[vname],
                                 **extra):
                slot = 0
                pending: list[Any] = []
                end = time.perf_counter() + phase_s
                while time.perf_counter() < end and slot + 3 < slots:
                    for f, n in ((heater, heat), (fn, group)):
                        if n == 0:
                            continue
                        slot = self._clock_probe(out, slot)
                        with t.cuda.stream(self.compute):
                            for _ in range(n):
                                f()
                    ev = t.cuda.Event()
                    ev.record(self.compute)
                    pending.append(ev)
                    # Two groups queued ahead: the GPU never idles, the host never runs far ahead.
                    if len(pending) > 2:
                        pending.pop(0).synchronize()
                slot = self._clock_probe(out, slot)
                t.cuda.synchronize()
                rows = out[: 4 * slot].view(-1, 4).cpu().tolist()
            with open(self.out / "clock" / f"{label}.clock.csv", "w") as fh:
                fh.write("launch,smid,start_ns,end_ns,sm_cycles\n")
                for i, (sm, s0, s1, cyc) in enumerate(rows):
                    fh.write(f"{i},{sm},{s0},{s1},{cyc}\n")

    def _clock_probe(self, out: Any, slot: int) -> int:
        """Launch a clock probe writing slot ``slot`` of ``out`` on the compute stream; the next slot."""
        self.launch("ovsim_clock_probe", 1, 32, (self.cupy.uint64(self.CLOCK_WINDOW_NS), self.cupy.int32(slot), out),
                    0, self.compute)
        return slot + 1

    def ncu_subject(self, only: dict[str, Callable[[], Any]] | None = None) -> None:
        """One launch of each kernel kind, alone: what ``part_ncu`` profiles (``only``'s launches
        instead, for ``part_framework_ncu``)."""
        t = self.torch
        launches: list[Callable[[], Any]] = list((only or self.victims).values())
        if only is None:
            for op in ("copy", "reduce"):
                chan = self.channel(op, 16, 640, iters=1)
                launches.append(functools.partial(chan, self.normal))
            for _, pad in (self.shaping_paddings()[0], self.shaping_paddings()[-1]):
                gemm = self.gemm64(4096, 4096, 4096, pad)[0]
                launches.append(functools.partial(gemm, self.compute))
        # Once outside the profiled range: cuBLAS's handle and workspace, and any lazily loaded
        # module, are set up here rather than profiled.
        for fn in launches:
            fn()
        t.cuda.synchronize()
        # ncu runs with --profile-from-start off: only launches between these two calls are profiled,
        # not the random-input generation and warm-up before them.
        t.cuda.profiler.start()
        for fn in launches:
            fn()
        t.cuda.synchronize()
        t.cuda.profiler.stop()

    NCU_METRICS = (
        "gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed", "lts__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed", "dram__bytes_read.sum",
        "dram__bytes_write.sum", "launch__registers_per_thread", "launch__shared_mem_per_block_static",
        "launch__shared_mem_per_block_dynamic", "launch__grid_size", "launch__block_size",
        "sm__warps_active.avg.pct_of_peak_sustained_active", "sm__maximum_warps_per_active_cycle_pct",
        "launch__waves_per_multiprocessor", "launch__occupancy_limit_registers",
        "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps", "launch__occupancy_limit_blocks")
    # ncu's own sections holding the metrics above (under whatever names this GPU gives them), for a
    # second try when ncu refuses a metric name of the first.
    NCU_SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis")

    def part_framework(self) -> None:
        framework.part_framework(self, CHANNEL_SMEM_BYTES, self.framework_channels)

    def part_framework_copy(self) -> None:
        framework.part_framework_copy(self, self.framework_copies)

    def part_framework_ncu(self) -> None:
        self.part_ncu("framework_ncu", "framework")

    def part_ncu(self, name: str = "ncu", subject_kind: str = "harness") -> None:
        folder = self.out / name
        folder.mkdir(parents=True, exist_ok=True)
        ncu = find_tool("ncu")
        if ncu is None:
            (folder / "SKIPPED").write_text("ncu: not on PATH nor in the CUDA toolkit's or Nsight Compute's folders\n")
            return
        subject = [sys.executable, str(Path(__file__).resolve()), "--out", str(self.out / "ncu_subject"),
                   "--ncu-subject", subject_kind]
        common = [ncu, "--csv", "--page", "raw", "--clock-control", "none", "--profile-from-start", "off",
                  "--target-processes", "all"]
        sections = [a for name in self.NCU_SECTIONS for a in ("--section", name)]
        for attempt, what in enumerate((["--metrics", ",".join(self.NCU_METRICS)], sections)):
            with open(folder / "metrics.csv", "w") as f, open(folder / "ncu.log", "w") as err:
                r = subprocess.run([*common, *what, *subject], stdout=f, stderr=err)
            shutil.rmtree(self.out / "ncu_subject", ignore_errors=True)
            if r.returncode == 0 and ncu_has_table(folder / "metrics.csv"):
                return
            log(f"ncu exited {r.returncode} with {'no' if not ncu_has_table(folder / 'metrics.csv') else 'a'} "
                f"metrics table; see {folder / 'ncu.log'}")
            if attempt == 0:
                for name in ("metrics.csv", "ncu.log"):
                    (folder / name).replace(folder / f"first_try.{name}")
                log("ncu: trying again with its sections " + ", ".join(self.NCU_SECTIONS))

    # -- the run ---------------------------------------------------------------------------------

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
    ap.add_argument("--smloss-hold-fractions", type=_fractions, default=(1.5,), metavar="X,X",
                    help="how long the smloss part holds its SMs, in units of the victims' repeats "
                         "(default 1.5: longer than all of them; under 1: ends among them)")
    ap.add_argument("--framework-channels", type=_channel_counts, default=None, metavar="N,N",
                    help="copy-channel counts the framework part runs its kernels beside (default: copy at 2, 8 "
                         "and 24, reduce at 8, poll at 8)")
    ap.add_argument("--framework-copies", type=_copy_sizes, default=framework.COPY_OVERLAPPERS, metavar="MIBxS,...",
                    help="device-to-device copies the framework_copy part runs its kernels beside: MiB per copy "
                         "x streams copying at once (default 512x1)")
    ap.add_argument("--ncu-subject", nargs="?", const="harness", choices=("harness", "framework"),
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
    if args.ncu_subject == "framework":
        with framework.fp32_gemms(h.torch):
            h.ncu_subject(framework.victims(h))
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
