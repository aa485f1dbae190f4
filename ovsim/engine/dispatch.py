"""The block dispatcher: which blocks run where, one SM layer at a time.

A GPU's SMs are kept as groups of identical SMs (:class:`~ovsim.engine.state.SmGroup`). When blocks
finish (:func:`retire`) or a kernel is launched, :func:`dispatch` hands the free room to waiting
kernels: stream priority, then launch order; a kernel waits while an earlier one still has blocks
to place on the same SM partition; no preemption; the group with the most room for the block
first. :func:`batch` takes a kernel's waves that nothing else can interleave with in one step and
:func:`unbatch` gives back those not begun, so the cost grows neither with the SM count nor with
a kernel's waves. Every function here reads and changes one GPU's SMs and kernels only.
"""

from __future__ import annotations

import math
from typing import Any

from ovsim.engine.state import BIG, INF, BlockEntry, GpuState, KernelState, SmGroup, blocks_fit


def free_entry(g: SmGroup, e: BlockEntry) -> None:
    k = e.kernel
    g.threads += e.per_sm * k.threads
    g.regs += e.per_sm * k.regs
    g.smem += e.per_sm * k.smem
    g.blocks += e.per_sm
    k.resident -= g.n_sms * e.per_sm


def retire(gpu: GpuState, now: float, eps: float) -> list[KernelState] | None:
    """Free the blocks that have finished their work by ``now`` (within ``eps`` seconds of it at
    their rate). None where none had; else the kernels that finished with them (no block left
    waiting or resident), taken off the GPU's running list."""
    changed = False
    for g in gpu.groups:
        for e in g.entries:
            if e.rate > 0 and e.remaining <= e.rate * eps:
                break
        else:
            continue
        keep: list[BlockEntry] = []
        for e in g.entries:
            if e.rate > 0 and e.remaining <= e.rate * eps:
                free_entry(g, e)
                changed = True
                if e.kernel.cluster > 1:
                    gpu.cluster_freed_s = now
            else:
                keep.append(e)
        g.entries = keep
    if not changed:
        return None
    merge(gpu)
    for k in gpu.running:
        if k.late_blocks and k.undispatched == 0 and k.resident == 0:
            # The resident CTAs have run every other tile and left: the late ones start.
            k.undispatched, k.late_blocks = k.late_blocks, 0
    done = [k for k in gpu.running if k.undispatched == 0 and k.resident == 0]
    if done:
        gpu.running = [k for k in gpu.running if not (k.undispatched == 0 and k.resident == 0)]
    return done


def evict(gpu: GpuState, k: KernelState) -> None:
    """Take every block of ``k`` (a collective's kernel whose flow has finished) off the GPU."""
    for g in gpu.groups:
        keep = []
        for e in g.entries:
            if e.kernel is k:
                free_entry(g, e)
            else:
                keep.append(e)
        g.entries = keep
    if k in gpu.pending:
        gpu.pending.remove(k)
    k.undispatched = 0
    merge(gpu)


def merge(gpu: GpuState) -> None:
    if len(gpu.groups) < 2:
        return
    groups = gpu.groups
    if len(groups) > 8:
        merged: dict[tuple[Any, ...], SmGroup] = {}
        out: list[SmGroup] = []
        for g in groups:
            key = g.key()
            if key in merged:
                merged[key].n_sms += g.n_sms
            else:
                merged[key] = g
                out.append(g)
        gpu.groups = out
        return
    # Groups are usually two to four: comparing each with the groups kept beats hashing a key
    # of every group (the quadratic cost would not, past a few).
    out = [groups[0]]
    for i in range(1, len(groups)):
        g = groups[i]
        for h in out:
            if h.same(g):
                h.n_sms += g.n_sms
                break
        else:
            out.append(g)
    if len(out) < len(groups):
        gpu.groups = out


def batch(gpu: GpuState) -> None:
    """Fast-forward waves: give a kernel's next whole waves to the SMs that would run them,
    as long as nothing else happens on the GPU, so that they take one event instead of one each.

    When blocks finish, the dispatcher gives the room they free to the first pending kernel
    with blocks left that may use the partition. If that is the blocks' own kernel, it refills
    the same SMs with the same layer (any other room it could use, it would have filled
    already), and the rates after the refill are the rates before it. So each group of SMs
    holding the kernel keeps running it, one wave after another, at its present rate, until
    the kernel's blocks run short. Which group gets which of the remaining blocks follows from
    the order in which their waves end; the waves given away are those that end before the
    first moment a group would find too few blocks (or groups ending together would compete
    for them), or, with another kernel pending, would take the kernel's last ones: that one
    may dispatch then. The entries hold them as ``extra`` (their blocks move from ``undispatched`` to
    ``batched``); any event that touches the GPU first returns the waves not begun
    (:func:`unbatch`), so the dispatcher and every rate see exactly what they would have seen.
    Runs after the rates are set: a group's wave lasts ``1 / rate``."""
    if not gpu.pending:
        return
    first: dict[str, KernelState] = {}
    for k in gpu.pending:
        if k.undispatched > 0 or k.late_blocks:
            for p in k.partitions:
                if p not in first:
                    first[p] = k
    if not first:
        return
    # A kernel waiting behind k may dispatch the moment k has no blocks left waiting, so the wave
    # that takes k's last blocks must begin at an event (a kernel launched later is one).
    behind = len(gpu.pending) > 1
    # A kernel first on both partitions counts once.
    for k in {id(k): k for k in first.values()}.values() if len(first) > 1 else first.values():
        if k.flow is not None:
            continue
        where = [(g, e) for g in gpu.groups for e in g.entries if e.kernel is k]
        if not where:
            continue
        if any(first.get(g.part) is not k or e.extra or e.rate <= 0 for g, e in where):
            continue
        # The blocks a kernel short of SMs would fill them with stay waiting: the slow-down
        # attribution (progress.advance) counts them while the waves run.
        spare = k.undispatched - max(0, k.max_resident - k.resident)
        if spare <= 0:
            continue
        if len(where) == 1:
            g, e = where[0]
            wave = g.n_sms * e.per_sm
            _give(gpu, k, e, wave, (spare - 1) // wave if behind else spare // wave)
            continue
        waves = interleave([g.n_sms * e.per_sm for g, e in where], [e.remaining / e.rate for _, e in where],
                            [1.0 / e.rate for _, e in where], spare, keep_last=behind)
        for i in range(len(where)):
            g, e = where[i]
            _give(gpu, k, e, g.n_sms * e.per_sm, waves[i])

def _give(gpu: GpuState, k: KernelState, e: BlockEntry, wave: int, waves: int) -> None:
    if waves > 0:
        e.extra = waves
        e.remaining += waves
        k.undispatched -= waves * wave
        k.batched += waves * wave
        gpu.batched = True

def unbatch(gpu: GpuState, eps: float = 0.0) -> None:
    """Give fast-forwarded waves not yet begun back to their kernels (see :func:`batch`). A wave
    that began within ``eps`` seconds before now (at its rate) begins now, whole, as a wave
    stepped to this event would. (One that ends within ``eps`` after now keeps that bit of work:
    :func:`retire` ends it at this event and the dispatcher hands its room out, by priority.)"""
    for g in gpu.groups:
        for e in g.entries:
            if e.extra:
                k = e.kernel
                whole = math.ceil(e.remaining)
                if whole - e.remaining <= e.rate * eps:
                    e.remaining = float(whole)
                # Each wave is one unit of work, the current one last to have begun.
                left = min(e.extra, max(0, math.ceil(e.remaining) - 1))
                e.remaining -= left
                wave = g.n_sms * e.per_sm
                k.batched -= e.extra * wave
                k.undispatched += left * wave
                e.extra = 0
    gpu.batched = False


def dispatch(gpu: GpuState, now: float) -> None:
    """Leftover policy, per SM partition: a kernel places blocks only on partitions where no
    earlier kernel (in priority, then launch order) still has blocks waiting. A carve-out
    partitions the SMs, so a compute kernel waiting for room on the main SMs does not hold a
    collective back from the reserved ones."""
    placed_any = False
    blocked: set[str] = set()
    any_done = False
    for k in gpu.pending:
        allowed = tuple(p for p in k.partitions if p not in blocked) if blocked else k.partitions
        if allowed:
            before = k.undispatched
            place(gpu, k, now, allowed)
            placed_any = placed_any or k.undispatched < before
        if k.undispatched == 0 and not k.late_blocks:
            any_done = True
            continue
        blocked.update(k.partitions)
        if len(blocked) == gpu.n_partitions:
            break
    if any_done:
        gpu.pending = [k for k in gpu.pending if k.undispatched > 0 or k.late_blocks]
    if placed_any:
        merge(gpu)

def place(gpu: GpuState, k: KernelState, now: float, partitions: tuple[str, ...]) -> None:
    """Place k's blocks one SM-layer at a time on the group of SMs with the most room for
    another of its blocks (ties: the larger group), as long as any SM has room.

    Layers the greedy choice would put on the same group in a row are placed at once: one
    block more takes exactly one off the group's fit, so the best group keeps winning until
    its fit falls to the runner-up's."""
    kt, kr, ks = k.threads, k.regs, k.smem
    cap = cluster_room(gpu, k) if k.cluster > 1 else BIG
    if k.start_s == INF and k.cluster == 1 and gpu.model.unit_sms:
        k.paired = gpu.cluster_freed_s == now or any(o.cluster > 1 and o.resident > 0 for o in gpu.running)
    if k.ctas and k.start_s == INF:
        hold_late(gpu, k, partitions, cap)
    todo = min(k.undispatched, cap - k.resident)
    while todo > 0:
        best: SmGroup | None = None
        best_fit = 0
        second_fit = 0
        second_n = 0
        for g in gpu.groups:
            if g.part not in partitions:
                continue
            # _fit, inlined: this runs for every group at every placement.
            fit = g.threads // kt
            if g.blocks < fit:
                fit = g.blocks
            if kr and g.regs // kr < fit:
                fit = g.regs // kr
            if ks and g.smem // ks < fit:
                fit = g.smem // ks
            if fit <= 0:
                continue
            if best is None or fit > best_fit or (fit == best_fit and g.n_sms > best.n_sms):
                if best is not None:
                    second_fit, second_n = best_fit, best.n_sms
                best, best_fit = g, fit
            elif fit > second_fit or (fit == second_fit and g.n_sms > second_n):
                second_fit, second_n = fit, g.n_sms
        if best is None:
            return
        if todo < best.n_sms:
            rest = best.clone(best.n_sms - todo)
            best.n_sms = todo
            gpu.groups.insert(gpu.groups.index(best) + 1, rest)
            layers = 1
        else:
            wins = best_fit - second_fit + (1 if best.n_sms > second_n else 0)
            layers = max(1, min(wins, best_fit, todo // best.n_sms))
        best.threads -= layers * kt
        best.regs -= layers * kr
        best.smem -= layers * ks
        best.blocks -= layers
        # Blocks of k that have done no work yet on these SMs (placed now, or a wave of k's that
        # begins now, fast-forwarded or not) are one entry with these: the group's layout, which
        # decides where later blocks go, is then the same however the waves were stepped.
        for e in best.entries:
            if e.kernel is k and e.remaining == 1.0:
                e.per_sm += layers
                break
        else:
            best.entries.append(BlockEntry(k, layers, 1.0 if k.flow is None else INF))
        k.undispatched -= layers * best.n_sms
        k.resident += layers * best.n_sms
        if k.start_s == INF:
            k.start_s = now
        if k.late_blocks and k.resident > k.ctas - k.late_blocks:
            # More tiles run at once than CTAs had found SMs: late CTAs have found some (SMs
            # another kernel freed) and run their first tiles among the rest.
            came = min(k.late_blocks, k.resident - (k.ctas - k.late_blocks))
            k.late_blocks -= came
            k.undispatched += came
        todo = min(k.undispatched, cap - k.resident)

def cluster_room(gpu: GpuState, k: KernelState) -> int:
    """The most blocks of a cluster kernel resident at once: its blocks per SM on every SM but
    those other kernels hold (no block of it fits there) and the free ones those strand, no
    whole cluster fitting in their placement unit. SMs held by kernels that started on an
    idle GPU are taken to sit where a plain launch puts its blocks (GpuModel.stranded_sms), as
    NCCL's and the harness's kernels are launched: measured, calibration/data/README.md, "Where
    2-block clusters go". Those held by kernels that started beside a cluster kernel or as one
    left SMs took SMs its clusters could not use first (the stranded ones), then SMs its
    clusters freed, whole clusters' worth: they strand none."""
    held = paired = 0
    for g in gpu.groups:
        if blocks_fit(g.threads, g.regs, g.smem, g.blocks, k.threads, k.regs, k.smem) == 0 and \
                not any(e.kernel is k for e in g.entries):
            held += g.n_sms
            if all(e.kernel.paired for e in g.entries):
                paired += g.n_sms
    m = gpu.model
    plain = held - paired
    stranded = m.stranded_sms(plain, k.cluster)
    return (m.sm_count - plain - stranded - max(0, paired - stranded)) * k.blocks_per_sm_alone

def hold_late(gpu: GpuState, k: KernelState, partitions: tuple[str, ...], cap: int) -> None:
    """At a persistent kernel's first placement, hold back the first tiles of the CTAs that find
    no SM (another kernel holds it). Each runs its first tile only once the resident CTAs have
    run all the other tiles: one more round of tiles from the first SM taken, as measured on
    cuBLAS's Hopper GEMMs beside SM-holding kernels (calibration/data/README.md, "smloss")."""
    room = min(cap, sum(g.n_sms * blocks_fit(g.threads, g.regs, g.smem, g.blocks, k.threads, k.regs, k.smem)
                        for g in gpu.groups if g.part in partitions))
    if room <= 0:
        return  # nothing starts now; counted again when something does
    late = k.ctas - min(room, k.ctas)
    if late > 0:
        k.late_blocks = late
        k.undispatched -= late


def interleave(sizes: list[int], first_end_s: list[float], period_s: list[float], blocks: int,
                keep_last: bool = True) -> list[int]:
    """Whole waves each group of SMs runs from ``blocks`` waiting blocks, groups refilling themselves
    as their waves end (group i: ``sizes[i]`` blocks a wave, current wave ending at
    ``first_end_s[i]``, then one every ``period_s[i]``), counted up to the first wave end that finds
    too few blocks for every group ending then (within float round-off, ends are simultaneous).
    With ``keep_last``, the wave that would take the last blocks is not given either: the moment
    the kernel has none left waiting is when a kernel behind it may dispatch, which must be an
    event."""
    given, ends, blocks = skip_waves(sizes, first_end_s, period_s, blocks)
    while True:
        t = min(ends)
        tie = [i for i, x in enumerate(ends) if x <= t + 1e-9 * max(t, 1e-9)]
        need = sum(sizes[i] for i in tie)
        if need > blocks or (keep_last and need == blocks):
            return given
        blocks -= need
        for i in tie:
            given[i] += 1
            ends[i] += period_s[i]


def skip_waves(sizes: list[int], first_end_s: list[float], period_s: list[float],
                blocks: int) -> tuple[list[int], list[float], int]:
    """The waves that surely end before :func:`interleave` stops, given at once: counted in closed
    form up to three of the longest periods before the time the blocks would run out at the groups'
    mean rates, so that the wave-by-wave loop only settles the last few (a kernel of billions of
    blocks would otherwise take a loop turn per wave). Returns (waves given, each group's next wave
    end, blocks left)."""
    zero = [0] * len(sizes)
    # Sums of floats start at 0.0: the compiled engine (setup.py) checks that they are floats.
    rate = sum((n / p for n, p in zip(sizes, period_s, strict=True)), 0.0)
    if rate <= 0 or blocks < 64 * sum(sizes):
        return zero, list(first_end_s), blocks
    t_out = (blocks + sum((n * f / p for n, f, p in zip(sizes, first_end_s, period_s, strict=True)), 0.0)) / rate
    t0 = t_out - 3 * max(period_s)
    given = [max(0, math.floor((t0 - f) / p) + 1) if t0 >= f else 0 for f, p in zip(first_end_s, period_s, strict=True)]
    used = sum(n * g for n, g in zip(sizes, given, strict=True))
    if used >= blocks:
        return zero, list(first_end_s), blocks
    ends = [f + g * p for f, g, p in zip(first_end_s, given, period_s, strict=True)]
    return given, ends, blocks - used
