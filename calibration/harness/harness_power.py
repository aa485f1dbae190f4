"""The harness's ``power`` and ``clock`` parts: steady phases for the power model, and kernels at
the clocks the power limit walks them through.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from harness_common import (
    WMMA_TILE_KERNELS,
    repeat_calls,
    share_plan,
)
from harness_contention import ContentionParts


class PowerParts(ContentionParts):
    """The ``power`` and ``clock`` parts."""

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
                loop(functools.partial(repeat_calls, other, 20))
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
        phase_s, cool_s = (2.0, 1.0) if self.quick else (5.0, 2.0)
        heater = self.victims["gemm_bf16_8192x8192x8192"]
        heater_s = self.time_alone_s(heater)
        ops = dict(self.victims)
        ops.update(self.gemm_ops(tuple(g for g in self.CLOCK_GEMMS if g not in ops)))
        phases: list[tuple[str, str, int, int, dict[str, Any]]] = []
        victim_s: dict[str, float] = {}
        for vname in self.CLOCK_GEMMS + self.CLOCK_MEMORY:
            if vname not in ops:  # no FP8 on this GPU or in this PyTorch
                continue
            victim_s[vname] = self.time_alone_s(ops[vname])
            group = self._group_of(victim_s[vname])
            memory = vname in self.CLOCK_MEMORY
            heat = self._group_of(heater_s) if memory else 0
            phases.append((f"{vname}__after_gemm" if memory else vname, vname, group, heat, {}))
        add = "add_bf16_256M"
        for share in self.CLOCK_GEMM_SHARES:
            heat, group = share_plan(share, heater_s, victim_s[add], self.CLOCK_SHARE_CYCLE_S)
            phases.append((f"{add}__gemm_share_{round(share * 100)}", add, group, heat,
                           {"gemm_share": share, "heater_alone_s": heater_s}))
        for label, vname, group, heat, extra in phases:
            self._clock_phase("clock", label, ops[vname], group, heater if heat else None, heat, phase_s, cool_s,
                              victim=vname, heater="gemm_bf16_8192x8192x8192" if heat else None,
                              victim_alone_s=victim_s[vname], **extra)

    # Occupancies the ``clock_own`` part runs the WMMA GEMM at (blocks per SM; its natural one first).
    CLOCK_OWN_OCCUPANCIES = (None, 4, 2, 1)
    CLOCK_OWN_SIZE = 8192

    def part_clock_own(self) -> None:
        """Power by work done: the harness's own WMMA GEMM (about a fifth of cuBLAS's rate) back to
        back for a whole phase at its natural occupancy and shaped lower, beside cuBLAS's FP16 and
        BF16 GEMMs of the same problem, each from a cool start with the clock part's probes. NVML's
        power log over each phase, with the counted clock, gives each kernel's power at one clock
        and rate: whether a tensor kernel draws by the SMs it occupies or by the work it does."""
        phase_s, cool_s = (2.0, 1.0) if self.quick else (5.0, 2.0)
        n = self.CLOCK_OWN_SIZE
        ops = dict(self.victims)
        cublas = ("gemm_fp16_8192x8192x8192", "gemm_bf16_8192x8192x8192")
        ops.update(self.gemm_ops(tuple(g for g in cublas if g not in ops)))
        paddings = dict(self.shaping_paddings())
        natural = max(paddings)
        for occ in self.CLOCK_OWN_OCCUPANCIES:
            occ = natural if occ is None else occ
            if occ not in paddings:
                continue
            run, blocks = self.gemm64(n, n, n, paddings[occ])

            def own(run: Callable[..., None] = run) -> None:
                run(self.torch.cuda.current_stream())
            alone_s = self.time_alone_s(own)
            self._clock_phase("clock_own", f"gemm64_{n}_occ{occ}", own, self._group_of(alone_s),
                              None, 0, phase_s, cool_s, victim="ovsim_gemm_tile64", blocks_per_sm_target=occ,
                              extra_smem_bytes=paddings[occ], blocks=blocks, flops=2 * n ** 3,
                              victim_alone_s=alone_s)
            del run
        for vname in cublas:
            if vname not in ops:
                continue
            alone_s = self.time_alone_s(ops[vname])
            self._clock_phase("clock_own", vname, ops[vname], self._group_of(alone_s), None, 0,
                              phase_s, cool_s, victim=vname, flops=2 * n ** 3, victim_alone_s=alone_s)

    OWN_TILES_SIZE = 8192
    OWN_TILES_REPEATS = 10

    def part_own_tiles(self) -> None:
        """The WMMA GEMM at other tiles (kernels.cu: 64x64 to 128x128, 4 or 8 warps), each checked
        against a float64 product, then timed alone (10 launches after 3 warm-ups and a pause that
        lets the clock return to the top), then back to back under the power limit with the clock
        part's probes, as the clock_own part runs the 64x64 one."""
        self.check_wmma_tiles()
        n = 4096 if self.quick else self.OWN_TILES_SIZE
        phase_s, cool_s = (1.5, 1.0) if self.quick else (3.0, 1.5)
        for name, bm, bn, threads in (("ovsim_gemm_tile64", 64, 64, 128), *WMMA_TILE_KERNELS):
            run = self.wmma_tile_launch(name, bm, bn, threads, n)
            info = {"kernel": name, "tile": [bm, bn, 32], "threads": threads, "blocks": (n // bm) * (n // bn),
                    "m": n, "n": n, "k": n, "flops": 2 * n ** 3}
            self.warm(run, 3)
            time.sleep(cool_s)
            label = f"{name.removeprefix('ovsim_gemm_')}_{n}"  # the kernel's name: two kernels share a tile
            with self.experiment("own_tiles", label, **info):
                with self.torch.cuda.stream(self.compute):
                    for _ in range(self.OWN_TILES_REPEATS):
                        run()
                self.compute.synchronize()
            alone_s = self.time_alone_s(run)
            self._clock_phase("own_tiles", f"{label}__sustained", run, self._group_of(alone_s),
                              None, 0, phase_s, cool_s, victim=name, victim_alone_s=alone_s, **info)
            del run

    def _clock_phase(self, part: str, label: str, fn: Callable[[], Any], group: int,
                     heater_fn: Callable[[], Any] | None, heat: int, phase_s: float, cool_s: float,
                     **info: Any) -> None:
        """One clock phase: after ``cool_s`` idle, ``heat`` heater calls then ``group`` calls of
        ``fn``, with a probe before each group, back to back for ``phase_s``; the probes go to
        ``<part>/<label>.clock.csv``."""
        t = self.torch
        # Enough slots for the densest phase; a probe past the end would write out of bounds.
        slots = int(2 * phase_s / (self.CLOCK_GROUP_S + self.CLOCK_WINDOW_NS * 1e-9)) + 64
        out = t.zeros(4 * slots, dtype=t.int64, device=self.dev)
        self.made()
        time.sleep(cool_s)
        with self.experiment(part, label, group=group, heater_group=heat, window_ns=self.CLOCK_WINDOW_NS,
                             seconds=phase_s, **info):
            slot = 0
            pending: list[Any] = []
            end = time.perf_counter() + phase_s
            while time.perf_counter() < end and slot + 3 < slots:
                for f, k in ((heater_fn, heat), (fn, group)):
                    if k == 0 or f is None:
                        continue
                    slot = self._clock_probe(out, slot)
                    with t.cuda.stream(self.compute):
                        for _ in range(k):
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
        with open(self.out / part / f"{label}.clock.csv", "w") as fh:
            fh.write("launch,smid,start_ns,end_ns,sm_cycles\n")
            for i, (sm, s0, s1, cyc) in enumerate(rows):
                fh.write(f"{i},{sm},{s0},{s1},{cyc}\n")

    def _group_of(self, alone_s: float) -> int:
        """Launches of a kernel of ``alone_s`` between two probes: about ``CLOCK_GROUP_S`` of them."""
        return max(1, round(self.CLOCK_GROUP_S / alone_s))

    def _clock_probe(self, out: Any, slot: int) -> int:
        """Launch a clock probe writing slot ``slot`` of ``out`` on the compute stream; the next slot."""
        self.launch("ovsim_clock_probe", 1, 32, (self.cupy.uint64(self.CLOCK_WINDOW_NS), self.cupy.int32(slot), out),
                    0, self.compute)
        return slot + 1
