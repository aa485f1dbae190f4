"""The harness's contention parts: ``comm``, ``overlap``, ``smloss``, ``shaping``, ``dispatch`` and
``copy``.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from typing import Any

from harness_common import (
    CHANNEL_BUFFER_BYTES,
    CHANNEL_SMEM_BYTES,
    VICTIM_GEMMS,
)
from harness_gemm import GemmParts


class ContentionParts(GemmParts):
    """The parts that measure kernels beside communication-like kernels, held SMs and copies."""

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

    SMLOSS_WMMA = (("ovsim_gemm_wmma_64x64_w4", 64, 64, 128), ("ovsim_gemm_wmma_128x128_w4", 128, 128, 128))

    def smloss_victims(self) -> dict[str, Callable[[], Any]]:
        """The ``smloss`` part's victims: ``SMLOSS_VICTIMS``, or the BF16 GEMMs of ``--smloss-gemms``."""
        if self.smloss_wmma:  # kernels of one's own: L2-bound at 64x64 tiles, issue-bound at 128x128
            return {f"wmma_{bm}x{bn}_t{threads}_8192": self.wmma_tile_launch(name, bm, bn, threads, 8192)
                    for name, bm, bn, threads in self.SMLOSS_WMMA}
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
