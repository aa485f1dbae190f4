"""The harness's Nsight Compute parts (``ncu``, ``framework_ncu``) and the entry points of the
framework parts (framework.py).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import framework
from harness_common import (
    CHANNEL_SMEM_BYTES,
    HERE,
    find_tool,
    log,
    ncu_has_table,
)
from harness_power import PowerParts


class NcuParts(PowerParts):
    """The Nsight Compute parts and the framework parts' entry points."""

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

    def part_own_tiles_ncu(self) -> None:
        self.part_ncu("own_tiles_ncu", "own_tiles")

    def part_ncu(self, name: str = "ncu", subject_kind: str = "harness") -> None:
        folder = self.out / name
        folder.mkdir(parents=True, exist_ok=True)
        ncu = find_tool("ncu")
        if ncu is None:
            (folder / "SKIPPED").write_text("ncu: not on PATH nor in the CUDA toolkit's or Nsight Compute's folders\n")
            return
        # run.py, the harness's entry point: this module has none of its own.
        subject = [sys.executable, str(HERE / "run.py"), "--out", str(self.out / "ncu_subject"),
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
