"""The calibration harness's machinery every part uses: the GPU's kernels built and launched, the
channel kernels, inputs, an experiment's profiled window and the timing of a kernel alone.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import framework
from harness_common import (
    CHANNEL_BUFFER_BYTES,
    CHANNEL_MIN_REGISTERS,
    CHANNEL_SMEM_BYTES,
    HERE,
    KINETO_NAME,
    SHAPED_CARVEOUT_PCT,
    SHAPED_KERNELS,
    WMMA_TILE_KERNELS,
    find_tool,
    log,
)


class HarnessCore:
    """The GPU, its streams and the harness's kernels, and how an experiment is profiled; the parts
    (harness_gemm.py to harness_ncu.py) build on it, and ``run.Harness`` is all of them."""

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
        # The smloss part's victims are the WMMA GEMMs of kernels.cu instead (run.py --smloss-wmma).
        self.smloss_wmma = False
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
            "ovsim_probe_second", "ovsim_gemm_tile64", "ovsim_clock_probe", *(k[0] for k in WMMA_TILE_KERNELS))}
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

    def wmma_tile_launch(self, name: str, bm: int, bn: int, threads: int, n: int) -> Callable[[], None]:
        """An n^3 launch of a WMMA GEMM kernel (``name``, a ``bm`` x ``bn`` tile) on the current
        stream, on random inputs made here."""
        t = self.torch
        a, b = self.rand(n, n), self.rand(n, n)
        c = t.empty(n, n, device=self.dev, dtype=t.float32)
        self.made()
        blocks = (n // bm) * (n // bn)

        def run() -> None:
            self.launch(name, blocks, threads, self._gemm64_args(a, b, c, n, n, n, None), 0, t.cuda.current_stream())
        return run

    def wmma_tile_launches(self, n: int) -> dict[str, Callable[[], None]]:
        """``wmma_tile_launch`` of the study's kernel and each WMMA tile kernel, by kernel name."""
        return {name: self.wmma_tile_launch(name, bm, bn, threads, n)
                for name, bm, bn, threads in (("ovsim_gemm_tile64", 64, 64, 128), *WMMA_TILE_KERNELS)}

    def check_gemm64(self) -> float:
        """Relative error of the harness GEMM against a float64 product on fresh random inputs."""
        return self._check_gemm("ovsim_gemm_tile64", 64, 64, 128, 512, 384, 256)

    def check_wmma_tiles(self) -> None:
        """Each WMMA GEMM of another tile, as :meth:`check_gemm64`."""
        for name, bm, bn, threads in WMMA_TILE_KERNELS:
            self._check_gemm(name, bm, bn, threads, 512, 512, 256)

    def _check_gemm(self, name: str, bm: int, bn: int, threads: int, m: int, n: int, k: int) -> float:
        """Run GEMM kernel ``name`` (``bm`` x ``bn`` tiles) on fresh random inputs, its output
        poisoned first (every element must be written), and stop the run unless it matches a
        float64 product within 1e-3 (relative Frobenius norm); the error."""
        t = self.torch
        a, b = self.rand(m, k), self.rand(k, n)
        c = t.full((m, n), float("nan"), device=self.dev, dtype=t.float32)
        self.made()
        self.launch(name, (m // bm) * (n // bn), threads, self._gemm64_args(a, b, c, m, n, k, None), 0,
                    t.cuda.current_stream())
        t.cuda.synchronize()
        ref = a.double() @ b.double()
        err = float((c.double() - ref).norm() / ref.norm())
        if not err < 1e-3:
            sys.exit(f"{name} is wrong: relative error {err} against a float64 product")
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
