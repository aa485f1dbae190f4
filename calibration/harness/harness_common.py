"""What the calibration harness's parts share: paths, the channel kernels' NCCL-like resources,
the victim GEMMs, logging, tools' lookup, the run folder's preparation, the GEMM shape grid and the
NVML power sampler. ``run.py`` assembles the parts."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PARTS = ("gemm", "shapes", "comm", "overlap", "smloss", "shaping", "dispatch", "copy", "power", "clock", "clock_own",
         "own_tiles", "own_tiles_ncu", "ncu", "framework", "framework_copy", "framework_ncu")
# Parts the default run leaves out: Nsight Compute's, the real framework kernels' (framework.py),
# and the own GEMM's power phases.
OPT_IN_PARTS = ("clock_own", "own_tiles", "own_tiles_ncu", "ncu", "framework", "framework_copy", "framework_ncu")
# The WMMA GEMMs of other tiles (kernels.cu): name, output tile rows and columns, threads a block.
WMMA_TILE_KERNELS = (("ovsim_gemm_wmma_64x64_w4", 64, 64, 128), ("ovsim_gemm_wmma_128x64_w4", 128, 64, 128),
                     ("ovsim_gemm_wmma_64x128_w4", 64, 128, 128), ("ovsim_gemm_wmma_128x128_w4", 128, 128, 128),
                     ("ovsim_gemm_wmma_128x128_w8", 128, 128, 256))
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



def repeat_calls(fn: Callable[[], Any], n: int) -> list[Any]:
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
