"""Transformer layers as PyTorch runs them, forward and backward, back to back under the power
limit, at the shapes of published training runs: each GPU's share of an MPT layer (llm-foundry's
FSDP runs: the whole layer), of GPT-3 175B's and a 22B model's (Megatron-LM, tensor parallel over
8: an eighth of the heads and of the MLP) and of Llama 3 405B's (tensor parallel over 8, grouped
queries, a gated MLP), in BF16 with PyTorch's fused attention; and of Megatron-LM's SC'21 and 22B
runs in FP16 with its unfused attention of the time (``megatron_attention.py``). No communication:
one GPU runs what one rank computes. With ``--steps``, whole MPT models' training steps under
PyTorch's automatic mixed precision instead.

Writes, under ``--out``:

- ``iterations.parquet``: per iteration, each phase's milliseconds (CUDA events: forward,
  backward, and with ``--steps`` the optimizer step), and whether it ran back to back
  (``sustained``) or after a pause (``after_pause``);
- ``kernels.parquet``: every kernel of a few profiled iterations (PyTorch's profiler): name, start
  and duration in microseconds, grid and block; ``annotations.parquet``: the profiler's GPU
  ranges, each kernel under the innermost range of the thread that launched it (the forward's ops,
  ``F.*``; the backward's kernels launch from autograd's thread and fall under none);
- ``nvml.parquet``: SM clock, power and temperature sampled through the timed iterations;
- ``manifest.json``: GPU, driver, software, the clocks and power limit as found (never changed).

    OVSIM_COMMIT=$(git rev-parse HEAD) python3 calibration/harness/layers.py --out RUN [--steps] [--only SHAPE ...]
        [--quick]

Needs PyTorch with CUDA, pandas with pyarrow, nvidia-ml-py, and Triton for the unfused shapes;
not ovsim. ``ingest_layers.py`` makes the folders a data set.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import gzip
import json
import math
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import megatron_attention


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """One rank's share of a transformer layer: heads and MLP width are the rank's own."""

    name: str
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    gated: bool
    rms_norm: bool
    seq: int
    micro_batch: int
    layers: int = 2
    # flash: PyTorch's fused attention, tokens [b, s, h]; unfused: Megatron-LM's core attention of
    # 2021-22 (megatron_attention.py), tokens [s, b, h], dropout 0.1 on the probabilities.
    attention: str = "flash"
    dtype: str = "bf16"  # bf16 | fp16: the layer's parameters and activations
    tp: int = 1  # the run's tensor-parallel degree this is one rank's share of (the model: heads x tp)


SHAPES = (
    # llm-foundry MPT (scripts/train/yamls/pretrain/mpt-*.yaml) at its H100 table's micro-batches.
    LayerShape("mpt-1b_s2048_mb14", 2048, 16, 16, 128, 8192, False, False, 2048, 14),
    LayerShape("mpt-7b_s2048_mb6", 4096, 32, 32, 128, 16384, False, False, 2048, 6),
    LayerShape("mpt-13b_s2048_mb2", 5120, 40, 40, 128, 20480, False, False, 2048, 2),
    LayerShape("mpt-30b_s2048_mb3", 7168, 56, 56, 128, 28672, False, False, 2048, 3),
    # Megatron-LM, tensor parallel over 8: GPT-3 175B (96 heads, MLP 4h) and Korthikanti et al.'s 22B.
    LayerShape("gpt3-175b-tp8_s2048_mb1", 12288, 12, 12, 128, 6144, False, False, 2048, 1, tp=8),
    LayerShape("gpt-22b-tp8_s2048_mb4", 6144, 8, 8, 96, 3072, False, False, 2048, 4, tp=8),
    # Llama 3 405B, tensor parallel over 8: 128 query and 8 key-value heads, SwiGLU MLP of 53,248.
    LayerShape("llama3-405b-tp8_s8192_mb1", 16384, 16, 1, 128, 6656, True, True, 8192, 1, tp=8),
    # Megatron-LM's GPT runs of Narayanan et al. (SC'21, table 1) and Korthikanti et al. (22B, table
    # 4), FP16 and unfused attention as they ran: one rank's share of the layer at its micro-batch.
    LayerShape("sc21-1.7b-unfused_s2048_mb16", 2304, 24, 24, 96, 9216, False, False, 2048, 16,
               attention="unfused", dtype="fp16"),
    LayerShape("sc21-7.5b-tp4-unfused_s2048_mb16", 4096, 8, 8, 128, 4096, False, False, 2048, 16,
               attention="unfused", dtype="fp16", tp=4),
    LayerShape("sc21-18b-tp8-unfused_s2048_mb8", 6144, 6, 6, 128, 3072, False, False, 2048, 8,
               attention="unfused", dtype="fp16", tp=8),
    LayerShape("gpt-22b-tp8-unfused_s2048_mb4", 6144, 8, 8, 96, 3072, False, False, 2048, 4,
               attention="unfused", dtype="fp16", tp=8),
    LayerShape("sc21-145b-tp8-unfused_s2048_mb2", 12288, 12, 12, 128, 6144, False, False, 2048, 2,
               attention="unfused", dtype="fp16", tp=8),
    LayerShape("sc21-1t-tp8-unfused_s2048_mb1", 25600, 20, 20, 160, 12800, False, False, 2048, 1,
               attention="unfused", dtype="fp16", tp=8),
)
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
# Largest difference from PyTorch's softmax, forward and backward, the fused one may show on FP16 rows.
SOFTMAX_TOLERANCE = 1e-2
# Whole MPT models (llm-foundry's recipes: layers, width, heads; vocabulary 50,368) trained on one GPU
# at micro-batches that fit its memory.
VOCAB = 50_368
STEP_SHAPES = (
    LayerShape("mpt-125m_s2048_mb32", 768, 12, 12, 64, 3072, False, False, 2048, 32, layers=12),
    LayerShape("mpt-350m_s2048_mb16", 1024, 16, 16, 64, 4096, False, False, 2048, 16, layers=24),
    LayerShape("mpt-760m_s2048_mb16", 1536, 12, 12, 128, 6144, False, False, 2048, 16, layers=24),
    LayerShape("mpt-1b_s2048_mb14", 2048, 16, 16, 128, 8192, False, False, 2048, 14, layers=24),
    LayerShape("mpt-3b_s2048_mb5", 2560, 20, 20, 128, 10240, False, False, 2048, 5, layers=32),
)
QUICK = (LayerShape("tiny_s256_mb2", 512, 4, 4, 128, 2048, False, False, 256, 2),
         LayerShape("tiny-unfused_s256_mb2", 512, 4, 4, 128, 2048, False, False, 256, 2, attention="unfused",
                    dtype="fp16"),
         LayerShape("tiny-gqa_s256_mb2", 512, 4, 1, 128, 1024, True, True, 256, 2))


def make_layer(torch: Any, s: LayerShape, dev: Any, dtype: Any) -> Any:
    """``s.layers`` pre-norm transformer layers with parameters in ``dtype`` (BF16 as FSDP's pure BF16
    and Megatron-LM's BF16 parameters run them; FP32 under autocast), without biases, with causal
    attention (``s.attention``)."""
    nn, f = torch.nn, torch.nn.functional
    module: Any = nn.Module

    class Layer(module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            # Made on the GPU: initialising 10^8-10^9 parameters on the CPU takes seconds.
            on = {"device": dev, "dtype": dtype}
            norm = nn.RMSNorm if s.rms_norm else nn.LayerNorm
            self.norm1, self.norm2 = norm(s.hidden, **on), norm(s.hidden, **on)
            self.qkv = nn.Linear(s.hidden, (s.q_heads + 2 * s.kv_heads) * s.head_dim, bias=False, **on)
            self.proj = nn.Linear(s.q_heads * s.head_dim, s.hidden, bias=False, **on)
            self.fc1 = nn.Linear(s.hidden, s.ffn * (2 if s.gated else 1), bias=False, **on)
            self.fc2 = nn.Linear(s.ffn, s.hidden, bias=False, **on)

        def flash(self, qkv: Any) -> Any:
            """PyTorch's fused attention over ``qkv`` [b, s, (q + 2 kv heads) x head_dim]."""
            b, t, _ = qkv.shape
            q, k, v = qkv.split([s.q_heads * s.head_dim, s.kv_heads * s.head_dim,
                                 s.kv_heads * s.head_dim], dim=-1)
            q = q.view(b, t, s.q_heads, s.head_dim).transpose(1, 2)
            k = k.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
            v = v.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
            gqa = s.kv_heads != s.q_heads
            a = f.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            return a.transpose(1, 2).reshape(b, t, s.q_heads * s.head_dim)

        def forward(self, x: Any) -> Any:
            rf = torch.profiler.record_function
            with rf("F.norm1"):
                h = self.norm1(x)
            with rf("F.qkv"):
                qkv = self.qkv(h)
            with rf("F.attn"):
                if s.attention == "unfused":
                    a = megatron_attention.attention(torch, qkv, s.q_heads, s.head_dim, dropout=0.1)
                else:
                    a = self.flash(qkv)
            with rf("F.proj"):
                x = x + self.proj(a)
            with rf("F.norm2"):
                h = self.norm2(x)
            with rf("F.fc1"):
                u = self.fc1(h)
            with rf("F.act"):
                if s.gated:
                    gate, up = u.chunk(2, dim=-1)
                    u = f.silu(gate) * up
                else:
                    u = f.gelu(u)
            with rf("F.fc2"):
                return x + self.fc2(u)

    return nn.Sequential(*[Layer() for _ in range(s.layers)])


def make_model(torch: Any, s: LayerShape, dev: Any) -> Any:
    """An MPT-style model in FP32: token and learned position embeddings, ``s.layers`` layers, a
    final norm and an output head tied to the token embedding."""
    nn = torch.nn
    module: Any = nn.Module

    class Model(module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(VOCAB, s.hidden, device=dev)
            self.wpe = nn.Embedding(s.seq, s.hidden, device=dev)
            self.blocks = make_layer(torch, s, dev, torch.float32)
            self.norm = nn.LayerNorm(s.hidden, device=dev)

        def forward(self, tokens: Any) -> Any:
            with torch.profiler.record_function("F.embed"):
                x = self.wte(tokens) + self.wpe.weight[: tokens.shape[1]]
            x = self.blocks(x)
            with torch.profiler.record_function("F.head"):
                return nn.functional.linear(self.norm(x), self.wte.weight)
    return Model()


class Sampler:
    """NVML samples (SM clock, power, temperature) every ``period_s`` while running; read only."""

    def __init__(self, period_s: float = 0.01) -> None:
        import pynvml
        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.period_s, self.label = period_s, ""
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n, h = self.nvml, self.handle
        while not self._stop.is_set():
            if self.label:
                try:
                    self.rows.append({"label": self.label, "t_s": time.time(),
                                      "sm_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                                      "power_w": n.nvmlDeviceGetPowerUsage(h) / 1000.0,
                                      "temp_c": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)})
                except Exception as e:  # a sample lost is not a run lost
                    self.rows.append({"label": self.label, "t_s": time.time(), "error": str(e)})
            time.sleep(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def layer_work(torch: Any, model: Any, x: Any, grad: Any) -> Callable[[list[Any] | None], None]:
    """One forward and backward of a stack of layers; ``marks`` (three CUDA events) time its two
    halves."""
    def run(marks: list[Any] | None) -> None:
        for p in model.parameters():
            p.grad = None
        x.grad = None  # else every iteration adds its input's gradient to the last one's
        phases = (("fwd", lambda: model(x)), ("bwd", lambda y: y.backward(grad)))
        _phased(torch, phases, marks)
    return run


def step_work(torch: Any, model: Any, opt: Any, tokens: Any, targets: Any) -> Callable[[list[Any] | None], None]:
    """One training step as PyTorch's automatic mixed precision runs it: FP32 parameters, the
    forward and loss under BF16 autocast, the backward, a fused AdamW step; ``marks`` (four CUDA
    events) time its three parts."""
    f = torch.nn.functional

    def forward() -> Any:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens)
            return f.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    def run(marks: list[Any] | None) -> None:
        opt.zero_grad(set_to_none=True)
        phases = (("fwd", forward), ("bwd", lambda loss: loss.backward()), ("step", lambda _: opt.step()))
        _phased(torch, phases, marks)
    return run


def _phased(torch: Any, phases: tuple[tuple[str, Callable[..., Any]], ...], marks: list[Any] | None) -> None:
    """Each phase in a profiler range, fed the one before's result; an event before and after each."""
    out = None
    if marks:
        marks[0].record()
    for i, (name, fn) in enumerate(phases):
        with torch.profiler.record_function(name):
            out = fn() if i == 0 else fn(out)
        if marks:
            marks[i + 1].record()


def timed(torch: Any, work: Callable[[list[Any] | None], None], phases: tuple[str, ...], seconds: float,
          label: str) -> list[dict[str, Any]]:
    """``work`` back to back for about ``seconds`` (at least 3 times); each phase's milliseconds."""
    runs: list[list[Any]] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or len(runs) < 3:
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(phases) + 1)]
        work(marks)
        runs.append(marks)
        if len(runs) % 8 == 0:
            marks[-1].synchronize()
    torch.cuda.synchronize()
    return [{"condition": label, "iteration": i,
             **{f"{p}_ms": m[j].elapsed_time(m[j + 1]) for j, p in enumerate(phases)}}
            for i, m in enumerate(runs)]


def profiled(torch: Any, work: Callable[[list[Any] | None], None], n: int, label: str, shape: str,
             warm: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The kernels and GPU ranges of the last ``n`` of ``warm + n`` runs of ``work`` under PyTorch's
    profiler. The profiler's start idles the GPU and its clock climbs back; ``warm`` runs back to
    back first bring it down to where the timed runs held it."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                              torch.profiler.ProfilerActivity.CPU])
    with prof:
        for _ in range(warm + n):
            work(None)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            events = json.load(fh)["traceEvents"]
    kernels, ranges = [], []
    for e in events:
        cat, args = e.get("cat", ""), e.get("args", {})
        if cat == "kernel":
            kernels.append({"shape": shape, "condition": label, "name": e.get("name", ""),
                            "ts_us": float(e["ts"]), "dur_us": float(e.get("dur", 0.0)),
                            "stream": int(args.get("stream", -1)),
                            "grid": str(args.get("grid", "")), "block": str(args.get("block", "")),
                            "registers": int(args.get("registers per thread", -1))})
        elif cat == "gpu_user_annotation":
            ranges.append({"shape": shape, "condition": label, "name": e.get("name", ""),
                           "ts_us": float(e["ts"]), "dur_us": float(e.get("dur", 0.0))})
    return last_runs(kernels, ranges, warm, n)


def last_runs(kernels: list[dict[str, Any]], ranges: list[dict[str, Any]], warm: int,
              n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The kernels of the last ``n`` of ``warm + n`` runs that each launch the same kernels, and
    the ranges from the first of them on; all of them where the count does not divide evenly."""
    kernels = sorted(kernels, key=lambda k: k["ts_us"])
    per_run, extra = divmod(len(kernels), warm + n)
    if not warm or extra or not per_run:
        return kernels, ranges
    kept = kernels[warm * per_run:]
    return kept, [r for r in ranges if r["ts_us"] >= kept[0]["ts_us"]]


def measure(torch: Any, name: str, work: Callable[[list[Any] | None], None], phases: tuple[str, ...],
            sampler: Sampler, warm_s: float, timed_s: float) -> dict[str, list[dict[str, Any]]]:
    """``work`` warmed up, timed back to back and profiled, then once after a pause (timed) and once
    after another (profiled)."""
    timed(torch, work, phases, warm_s, "warm_up")
    sampler.label = f"{name}/sustained"
    its = timed(torch, work, phases, timed_s, "sustained")
    sampler.label = f"{name}/profiled"
    warm = max(2, math.ceil(1e3 / median_ms(its)))  # about a second back to back under the profiler
    kernels, ranges = profiled(torch, work, 3, "sustained", name, warm=warm)
    sampler.label = ""
    time.sleep(2.0)
    sampler.label = f"{name}/after_pause"
    its += timed(torch, work, phases, 0.0, "after_pause")[:1]
    sampler.label = ""
    time.sleep(2.0)
    k2, r2 = profiled(torch, work, 1, "after_pause", name)
    for row in its:
        row["shape"] = name
    return {"iterations": its, "kernels": kernels + k2, "annotations": ranges + r2}


def measure_layers(torch: Any, s: LayerShape, dev: Any, sampler: Sampler, warm_s: float,
                   timed_s: float) -> dict[str, list[dict[str, Any]]]:
    torch.manual_seed(0)
    dtype = getattr(torch, DTYPES[s.dtype])
    model = make_layer(torch, s, dev, dtype)
    # Megatron-LM's layers take tokens first ([s, b, h]), the others batch first.
    dims = (s.seq, s.micro_batch) if s.attention == "unfused" else (s.micro_batch, s.seq)
    x = torch.randn(*dims, s.hidden, device=dev, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    return measure(torch, s.name, layer_work(torch, model, x, grad), ("fwd", "bwd"), sampler, warm_s, timed_s)


def measure_steps(torch: Any, s: LayerShape, dev: Any, sampler: Sampler, warm_s: float,
                  timed_s: float) -> dict[str, list[dict[str, Any]]]:
    torch.manual_seed(0)
    model = make_model(torch, s, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, VOCAB, (s.micro_batch, s.seq), device=dev)
    targets = torch.randint(0, VOCAB, (s.micro_batch, s.seq), device=dev)
    work = step_work(torch, model, opt, tokens, targets)
    return measure(torch, s.name, work, ("fwd", "bwd", "step"), sampler, warm_s, timed_s)


def unfused_checked(torch: Any, dev: Any, shapes: tuple[LayerShape, ...],
                    manifest: dict[str, Any]) -> tuple[LayerShape, ...]:
    """The shapes to run: the unfused ones only if the fused softmax matches PyTorch's (within
    ``SOFTMAX_TOLERANCE``); the check's outcome goes in the manifest, a failure as each one's error."""
    try:
        got: Any = megatron_attention.check(torch, dev)
        ok = max(got.values()) <= SOFTMAX_TOLERANCE
    except Exception:  # the unfused shapes are left out; the others run
        got, ok = traceback.format_exc(), False
    manifest["softmax_check"] = got
    print(f"fused causal softmax against PyTorch's: {got}", flush=True)
    if ok:
        return shapes
    for s in shapes:
        if s.attention == "unfused":
            manifest["errors"][s.name] = f"not run: the fused softmax's check failed ({got})"
    return tuple(s for s in shapes if s.attention != "unfused")


def smi(field: str) -> str:
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip()
    except Exception as e:  # the manifest says what could not be read
        return f"unread: {e}"


SMI_FIELDS = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,power.default_limit,temperature.gpu"


def median_ms(its: list[dict[str, Any]]) -> float:
    """The median over iterations of their phases' milliseconds together."""
    return float(sorted(sum(v for k, v in r.items() if k.endswith("_ms")) for r in its)[len(its) // 2])


def new_manifest(torch: Any, args: argparse.Namespace, shapes: tuple[LayerShape, ...]) -> dict[str, Any]:
    """What the run is: its command, commit, software, GPU and its state as found, and shapes."""
    return {"argv": sys.argv, "commit": os.environ.get("OVSIM_COMMIT", "unknown"), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "gpu": torch.cuda.get_device_name(0), "smi_before": smi(SMI_FIELDS),
            "what": "steps" if args.steps else "layers",
            "shapes": [dataclasses.asdict(s) for s in shapes], "warm_s": args.warm_s, "timed_s": args.timed_s,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "errors": {}, "seconds": {}}


def run_shapes(torch: Any, args: argparse.Namespace, shapes: tuple[LayerShape, ...],
               manifest: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each shape measured in turn (a failure recorded in the manifest, the others still run)."""
    dev = torch.device("cuda")
    measure = measure_steps if args.steps else measure_layers
    sampler = Sampler()
    tables: dict[str, list[dict[str, Any]]] = {"iterations": [], "kernels": [], "annotations": []}
    for s in shapes:
        t0 = time.perf_counter()
        try:
            got = measure(torch, s, dev, sampler, 0.2 if args.quick else args.warm_s,
                          0.2 if args.quick else args.timed_s)
            for k, v in got.items():
                tables[k] += v
            its = [r for r in got["iterations"] if r["condition"] == "sustained"]
            print(f"{s.name}: {len(its)} iterations, median {median_ms(its):.3f} ms, "
                  f"{len(got['kernels'])} kernels profiled", flush=True)
        except Exception:  # one shape's failure must not lose the others
            sampler.label = ""
            manifest["errors"][s.name] = traceback.format_exc()
            print(f"{s.name}: FAILED\n{traceback.format_exc()}", flush=True)
        gc.collect()  # the model, its optimizer and their closures, before the next shape's
        torch.cuda.empty_cache()
        manifest["seconds"][s.name] = round(time.perf_counter() - t0, 2)
    sampler.stop()
    tables["nvml"] = sampler.rows
    return tables


def write_tables(out: Path, tables: dict[str, list[dict[str, Any]]]) -> None:
    import pandas as pd

    for name, rows in tables.items():
        df = pd.DataFrame(rows)
        try:
            df.to_parquet(out / f"{name}.parquet", index=False)
        except Exception:  # keep the data if parquet cannot be written
            with gzip.open(out / f"{name}.csv.gz", "wt") as fh:
                df.to_csv(fh, index=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="three tiny shapes, short phases: a check of the script")
    ap.add_argument("--steps", action="store_true",
                    help="whole models' training steps (STEP_SHAPES) instead of layers (SHAPES)")
    ap.add_argument("--only", nargs="*", default=None, help="shape names to run (default: all)")
    ap.add_argument("--warm-s", type=float, default=2.0)
    ap.add_argument("--timed-s", type=float, default=2.0)
    args = ap.parse_args()
    import torch

    every = STEP_SHAPES if args.steps else SHAPES
    shapes = QUICK if args.quick else tuple(s for s in every if not args.only or s.name in args.only)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = new_manifest(torch, args, shapes)
    if any(s.attention == "unfused" for s in shapes):
        shapes = unfused_checked(torch, torch.device("cuda"), shapes, manifest)
    write_tables(args.out, run_shapes(torch, args, shapes, manifest))
    manifest["smi_after"] = smi(SMI_FIELDS)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {sorted(p.name for p in args.out.iterdir())}; errors: {list(manifest['errors'])}")
    return 1 if manifest["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
