"""What llm-foundry's sequence-length sweeps say about the attention kernel's rate.

llm-foundry's MPT throughput tables (mosaicml/llm-foundry scripts/train/benchmarking/README.md at
061f2c7) run each model at sequences of 2K to 64K tokens on the same 8 GPUs. Longer sequences move
time from the GEMMs and memory-bound kernels into attention, so a sweep tells the two apart. For
each model, ovsim predicts every row (analytic) and splits rank 0's iteration into its attention
kernels A and the rest N; the published iteration P is then fitted as

    P = a N + b A

by least squares over the model's rows: ``a`` is how much longer than ovsim's the non-attention
work ran, and ``e / b`` the attention kernel's implied fraction of the dense 16-bit peak, ``e`` the
efficiency ovsim priced it at. Two parameters for each model's 3-7 rows; the models are
independent of each other, so their agreement is the check. A benchmark: it prints figures and
asserts nothing; nothing it finds is shipped.

    python bench/attention_seq_sweeps.py                 # both GPUs, about a minute
    python bench/attention_seq_sweeps.py --gpu h100 --attention flash2

The runs used llm-foundry's Triton FlashAttention (``attn_impl: triton``, the MPT recipes and the
benchmark script of that time), whose rate no paper gives.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_rows import FOUNDRY_SEQ_SWEEPS, FoundryRow

from ovsim.api import predict
from ovsim.errors import OvsimError


class Split(NamedTuple):
    """A row's iteration as ovsim predicts it and as it was measured, in seconds."""

    seq: int
    iteration_s: float
    attention_s: float
    published_s: float
    # The fraction of the peak ovsim priced the attention kernels at.
    priced_efficiency: float


class Implied(NamedTuple):
    """A sweep's least-squares split: the non-attention work's factor over ovsim's, the attention
    kernel's implied efficiency, and each row's residual (fit over published, minus 1)."""

    non_attention_factor: float
    attention_efficiency: float
    residuals: tuple[float, ...]


def split(row: FoundryRow, attention: str) -> Split:
    """``row`` predicted with ``attention``: rank 0's iteration and its attention kernels' time."""
    sc = row.scenario()
    assert sc.training is not None
    training = sc.training.model_copy(update={"attention": attention})
    res = predict(sc.model_copy(update={"training": training}), mode="analytic")
    ops = res.ops[res.ops["rank"] == 0]
    published_s = row.micro_batch * row.accum * row.seq / row.published_tokens_per_s
    priced = res.calibration.params.attention_eff(training.attention_kernel)
    return Split(row.seq, float(res.summary()["makespan_s"]),
                 float(ops[ops.kind == "attention"].duration_s.sum()), published_s, priced)


def implied(points: Sequence[Split]) -> Implied:
    """Fit P = a N + b A over ``points`` (N the iteration less its attention, A the attention,
    all priced at the same efficiency)."""
    n = np.array([p.iteration_s - p.attention_s for p in points])
    a = np.array([p.attention_s for p in points])
    published = np.array([p.published_s for p in points])
    x = np.stack([n, a], axis=1)
    (factor, scale), *_ = np.linalg.lstsq(x, published, rcond=None)
    residuals = x @ np.array([factor, scale]) / published - 1
    return Implied(float(factor), points[0].priced_efficiency / float(scale), tuple(float(r) for r in residuals))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", choices=("a100", "h100"), nargs="+", default=["a100", "h100"])
    ap.add_argument("--attention", choices=("flash", "flash1", "flash2"), default="flash",
                    help="the attention ovsim prices (default: flash)")
    args = ap.parse_args(argv)
    print(f"ovsim error: ovsim's throughput over the published, less 1, over the sweep's rows; attention "
          f"priced as {args.attention}")
    print(f"{'GPU':5} {'model':6} {'sequences':>10} {'ovsim error':>17} {'non-attention':>14} "
          f"{'attention, implied':>19} {'worst residual':>15}")
    for gpu in args.gpu:
        rows = [r for r in FOUNDRY_SEQ_SWEEPS if r.gpu == gpu]
        for model in dict.fromkeys(r.model for r in rows):
            sweep = [r for r in rows if r.model == model]
            try:
                points = [split(r, args.attention) for r in sweep]
            except OvsimError as e:
                print(f"attention_seq_sweeps: {gpu}: {e}", file=sys.stderr)
                return 2
            fit = implied(points)
            errors = [p.published_s / p.iteration_s - 1 for p in points]
            seqs = f"{points[0].seq // 1024}K-{points[-1].seq // 1024}K"
            span = f"{100 * min(errors):+.1f}..{100 * max(errors):+.1f}%"
            print(f"{gpu:5} {model:6} {seqs:>10} {span:>17} "
                  f"{fit.non_attention_factor:>13.3f}x {fit.attention_efficiency:>18.3f} "
                  f"{100 * max(map(abs, fit.residuals)):>14.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
