"""The ``framework`` and ``framework_copy`` parts of the harness: a real framework's kernels beside
communication-like traffic.

The other parts measure the harness's own victims (large GEMMs, a 256M-element add). Real traces
of overlapped training show something they do not: short kernels of few blocks (elementwise ops
of a few microseconds, a layer norm's gamma/beta gradient on 24 blocks) slowed far more than any
count of free SMs explains. These parts run the kernels of one GPT-2 layer as PyTorch launches
them, at the sizes of the public Echo data set (GPT-2, batch 16, sequence 512, hidden 768, FP32:
github.com/NetX-lab/Echo-slowdown), each ``reps`` times alone and then ``reps`` times beside

- ``framework``: one long channel kernel (copy at 2, 8 and 24 channels, reduce at 8), or a channel
  kernel that only polls flags in L2, as an NCCL channel waiting for its peer does (8 channels);
- ``framework_copy``: device-to-device ``cudaMemcpyAsync`` copies (the copy engines, as NCCL's
  copy-engine collectives move data).

Kernels whose inputs fit in L2 (50 MB on an H100) run twice: on one input set (hot in L2 alone, as
a kernel reading what the previous one wrote) and rotating over sets larger than L2 (cold), so the
slowdown from traffic that evicts L2 can be told from the slowdown of HBM itself.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

# Echo's GPT-2 (define_model.py, train_script.py there): batch 16 x sequence 512 tokens, hidden 768,
# 12 heads, MLP 3072.
TOKENS, HIDDEN, HEADS, SEQ, BATCH = 16 * 512, 768, 12, 512, 16
# Input sets a cold kernel rotates over: 4 x 25 MB (8192 x 768 FP32) exceeds the H100's and H200's L2.
COLD_SETS = 4
# Overlappers of the framework part by default: (op, channels). "poll" waits on flags and moves
# nothing. --framework-channels runs copy channels at other counts instead.
CHANNEL_OVERLAPPERS = (("copy", 2), ("copy", 8), ("copy", 24), ("reduce", 8), ("poll", 8))
# Device-to-device copies of the framework_copy part by default: (MiB per copy, streams copying at
# once). Small copies back to back are how NCCL's copy-engine paths move a collective, in chunks.
COPY_OVERLAPPERS = ((512, 1),)
POLL_THREADS = 640


def victims(h: Any) -> dict[str, Callable[[], Any]]:
    """The GPT-2 layer's kernels, as PyTorch launches them (FP32 unless named otherwise)."""
    t = h.torch
    f = t.nn.functional
    f32 = t.float32

    def sets(*shape: int, n: int = 1) -> list[Any]:
        return [h.rand(*shape, dtype=f32) for _ in range(n)]

    def rotate(fn: Callable[..., Any], args: list[tuple[Any, ...]]) -> Callable[[], Any]:
        state = {"i": 0}

        def run() -> Any:
            a = args[state["i"] % len(args)]
            state["i"] += 1
            return fn(*a)
        return run

    out: dict[str, Callable[[], Any]] = {}
    w, b = h.rand(HIDDEN, dtype=f32), h.rand(HIDDEN, dtype=f32)
    for temp, n in (("hot", 1), ("cold", COLD_SETS)):
        xs, gs = sets(TOKENS, HIDDEN, n=n), sets(TOKENS, HIDDEN, n=n)
        stats = [t.native_layer_norm(x, (HIDDEN,), w, b, 1e-5) for x in xs]
        out[f"layernorm_fwd_f32_8192x768_{temp}"] = rotate(
            lambda x: t.native_layer_norm(x, (HIDDEN,), w, b, 1e-5), [(x,) for x in xs])
        out[f"layernorm_bwd_f32_8192x768_{temp}"] = rotate(
            lambda g, x, mean, rstd: t.ops.aten.native_layer_norm_backward(
                g, x, [HIDDEN], mean, rstd, w, b, [True, True, True]),
            [(g, x, s[1], s[2]) for g, x, s in zip(gs, xs, stats, strict=True)])
        out[f"add_f32_8192x768_{temp}"] = rotate(t.add, list(zip(xs, gs, strict=True)))
        out[f"sum_rows_f32_8192x768_{temp}"] = rotate(lambda g: g.sum(dim=0), [(g,) for g in gs])
    u = h.rand(TOKENS, 4 * HIDDEN, dtype=f32)
    out["gelu_f32_8192x3072"] = lambda: f.gelu(u, approximate="tanh")
    out["dropout_f32_8192x3072"] = lambda: f.dropout(u, 0.1, training=True)
    scores = h.rand(BATCH * HEADS, SEQ, SEQ, dtype=f32)
    out["softmax_f32_192x512x512"] = lambda: t.softmax(scores, dim=-1)
    # Single-block and few-block kernels of a few microseconds: bias-sized adds, scalar scales.
    out["add_f32_768"] = lambda: t.add(w, b)
    small = h.rand(4096, dtype=f32)
    out["mul_scalar_f32_4096"] = lambda: t.mul(small, 0.5)
    params = [h.rand(HIDDEN, dtype=f32) for _ in range(8)] + [h.rand(HIDDEN, 4 * HIDDEN, dtype=f32)]
    out["foreach_mul_f32_gpt2_layer"] = lambda: t._foreach_mul(params, 0.999)
    x = h.rand(TOKENS, HIDDEN, dtype=f32)
    w_mlp, w_proj = h.rand(HIDDEN, 4 * HIDDEN, dtype=f32), h.rand(HIDDEN, HIDDEN, dtype=f32)
    out["sgemm_f32_8192x3072x768"] = lambda: t.matmul(x, w_mlp)
    out["sgemm_f32_8192x768x768"] = lambda: t.matmul(x, w_proj)
    q, k, v = (h.rand(BATCH, HEADS, SEQ, HIDDEN // HEADS, dtype=f32) for _ in range(3))
    out["attention_f32_16x12x512x64"] = lambda: f.scaled_dot_product_attention(q, k, v)
    xb = x.to(t.bfloat16)
    out["add_bf16_8192x768"] = lambda: t.add(xb, xb)
    h.made()
    return out


@contextlib.contextmanager
def fp32_gemms(torch: Any) -> Iterator[None]:
    """FP32 GEMMs as PyTorch runs them by default (and Echo's run did): SIMT sgemm, not the TF32
    the rest of the harness asks for; restored after."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _reps(victim_s: float) -> int:
    """Repeats a victim runs alone and beside: more of the short ones, whose durations scatter more."""
    return 30 if victim_s < 50e-6 else 12 if victim_s < 1e-3 else 6


def poll_channel(h: Any, channels: int, seconds: float, smem_bytes: int) -> Callable[[Any, Any], None]:
    """A channel kernel that polls flags for ``seconds`` (``ovsim_channel_poll``), with a channel's
    dynamic shared memory ``smem_bytes``."""
    flags = h.torch.zeros(channels * 1024, dtype=h.torch.int32, device=h.dev)
    h.made()
    spin_ns = int(seconds * 1e9)

    def run(stream: Any, rec: Any = None) -> None:
        cp = h.cupy
        h.launch("ovsim_channel_poll", channels, POLL_THREADS,
                 (flags, cp.uint64(spin_ns), rec if rec is not None else cp.uint64(0)), smem_bytes, stream)
    return run


def part_framework(h: Any, smem_bytes: int,
                   overlappers: tuple[tuple[str, int], ...] = CHANNEL_OVERLAPPERS) -> None:
    """Each victim alone, then beside each of ``CHANNEL_OVERLAPPERS`` (channels of ``smem_bytes``
    dynamic shared memory each), at normal priority, the channel launched first."""
    with fp32_gemms(h.torch):
        for vname, fn in victims(h).items():
            victim_s = h.time_alone_s(fn, reps=5)
            reps = _reps(victim_s)
            # The channels start 0.5 ms before the victims and must outlast them.
            lasting_s = 1.5 * reps * victim_s + 0.002
            for op, channels in overlappers:
                label = f"{op}_{channels}"
                if op == "poll":
                    comm = poll_channel(h, channels, lasting_s + 0.001, smem_bytes)
                    iters = 0
                else:
                    comm, iters = h.channel_lasting(op, channels, 640, lasting_s, extra_iters=1)
                with h.experiment("framework", f"{vname}__{label}", victim=vname, op=op, channels=channels,
                                  priority="normal", first="comm", comm_iters=iters, victim_alone_s=victim_s,
                                  repeats=reps) as ctx:
                    h._alone_then_beside(fn, comm, h.normal, "comm", reps, ctx, op, channels)


def part_framework_copy(h: Any, overlappers: tuple[tuple[int, int], ...] = COPY_OVERLAPPERS) -> None:
    """Each victim alone, then beside back-to-back device-to-device copies of each size in
    ``overlappers`` on one or two streams (two copy engines at once)."""
    t = h.torch
    side = [h.normal, t.cuda.Stream(priority=0)]
    with fp32_gemms(t):
        kernels = victims(h)
        for mib, streams in overlappers:
            n = mib << 19  # bf16 elements
            pairs = [(h.rand(n, dtype=t.bfloat16), t.empty(n, dtype=t.bfloat16, device=h.dev))
                     for _ in range(streams)]
            h.made()
            copies = [functools.partial(d.copy_, s, non_blocking=True) for s, d in pairs]
            with t.cuda.stream(h.normal):
                one_s = h.time_alone_s(copies[0], reps=3)
            for vname, fn in kernels.items():
                victim_s = h.time_alone_s(fn, reps=5)
                reps = _reps(victim_s)
                count = max(2, int((1.5 * reps * victim_s + 0.002) / one_s) + 1)
                label = f"{vname}__d2d" + ("" if (mib, streams) == (512, 1) else f"_{mib}mib_x{streams}")
                with h.experiment("framework_copy", label, victim=vname, copy="d2d", bytes_per_copy=2 * mib << 20,
                                  copy_streams=streams, copies=count, victim_alone_s=victim_s, repeats=reps):
                    with t.cuda.stream(h.compute):
                        for _ in range(reps):
                            fn()
                    t.cuda.synchronize()
                    for copy, stream in zip(copies, side, strict=False):
                        with t.cuda.stream(stream):
                            for _ in range(count):
                                copy()
                    time.sleep(0.0005)  # the copies are running before the victims arrive
                    with t.cuda.stream(h.compute):
                        for _ in range(reps):
                            fn()
                    t.cuda.synchronize()
            del pairs, copies
