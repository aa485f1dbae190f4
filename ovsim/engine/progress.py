"""Moving a GPU through time: its work done and its slow-down accounting between events, and when
its next completion falls."""

from __future__ import annotations

from ovsim.engine.state import INF, FlowState, GpuState


def advance(gpu: GpuState, now: float) -> None:
    """Bring a GPU's blocks and flows up to ``now`` at their current rates, and charge each
    kernel's and member's time since to its slow-down reasons (Timeline's ``wait_sm_s``,
    ``share_*_s``, ``wait_peers_s``, ``clock_s``)."""
    dt = now - gpu.last_t
    if dt > 0:
        gpu.last_t = now
        for g in gpu.groups:
            for e in g.entries:
                rate = e.rate
                if rate > 0:
                    e.remaining -= rate * dt
        throttled = gpu.throttled
        mult = gpu.rate_multipliers
        for k in gpu.running:
            # Slow-down reasons (inlined: this runs for every kernel at every event).
            if k.resident == 0:
                k.wait_sm_s += dt
                continue
            alone = k.undispatched + k.batched + k.resident + k.late_blocks
            if alone > k.max_resident:
                alone = k.max_resident
            f_res = k.resident / alone if k.resident < alone else 1.0
            f_issue = k.full_issue_blocks / k.resident
            if f_issue > 1.0:  # blocks with room run faster than at full residency: no loss
                f_issue = 1.0
            k.wait_sm_s += dt * (1 - f_res)
            k.share_sm_s += dt * f_res * (1 - f_issue)
            if throttled:
                # Time lost to a clock below the calibration's, or gained (negative) above it.
                m = mult[k.clock_cls]
                if m != 1.0:
                    k.clock_s += dt * f_res * f_issue * (1 - m)
                    f_issue *= m
            k.share_hbm_s += dt * f_res * f_issue * (1 - k.hbm_pace_share / k.hbm_pace_share_alone)
    for f in gpu.flows:
        fdt = now - f.last_t
        if fdt > 0:
            f.last_t = now
            if f.phase == "latency":
                f.latency_left_s -= fdt
            elif f.phase == "data":
                f.remaining_bytes -= f.rate * fdt
            _attribute_flow(f, fdt)


def _attribute_flow(f: FlowState, dt: float) -> None:
    phase = f.phase
    if phase == "waiting":
        for m in f.members.values():
            if m.end_s < INF:
                continue
            if m.arrived:
                m.wait_peers_s += dt
            else:
                m.wait_sm_s += dt
    elif phase == "data" and f.effective_cap_bytes_per_s > 0:
        # The same for every member, all of which move the data until the flow ends: kept on the
        # flow, and each member's share set from it then (Flows.finish), the same sums.
        f.share_sm_s += dt * (1 - f.sm_factor)
        bottleneck = f.bottleneck
        if bottleneck:
            lost = dt * max(0.0, f.sm_factor - f.rate / f.demand.rate_cap_bytes_per_s)
            if bottleneck == "hbm":
                f.share_hbm_s += lost
            elif bottleneck == "link":
                f.share_link_s += lost


def settle(gpu: GpuState) -> float:
    """Apply each kernel's HBM share to its blocks' rates (the rate solver leaves it in
    ``KernelState.hbm_pace_share``); returns the seconds until the GPU's next completion (inf: none)."""
    dt = INF
    for g in gpu.groups:
        for e in g.entries:
            rate = e.rate
            pace = e.kernel.hbm_pace_share
            if pace < 1.0:
                e.rate = rate = rate * pace
            if rate > 0 and e.remaining < dt * rate:
                dt = e.remaining / rate
    for f in gpu.flows:
        if f.phase == "latency":
            if f.latency_left_s < dt:
                dt = f.latency_left_s
        elif f.phase == "data" and f.rate > 0 and f.remaining_bytes < dt * f.rate:
            dt = f.remaining_bytes / f.rate
    return dt
