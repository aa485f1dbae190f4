"""The harness's ``gemm`` and ``shapes`` parts: cuBLAS GEMMs alone, and the cuBLAS GEMMs other parts
run as victims.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness_common import (
    shape_grid,
)
from harness_core import HarnessCore


class GemmParts(HarnessCore):
    """The ``gemm`` and ``shapes`` parts, and the cuBLAS GEMMs the later parts use."""

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
