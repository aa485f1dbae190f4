"""Core attention as Megatron-LM ran it before fused attention kernels (its ``CoreAttention`` of
2021-22): tokens first ([s, b, h]), ``baddbmm`` for the scaled QK^T over every head's s x s scores,
one fused scale-causal-mask-softmax kernel forward and one backward (Megatron-LM's
``scaled_upper_triang_masked_softmax``; here in Triton), dropout on the probabilities, ``bmm`` for
PV, and the context permuted back to [s, b, h]. Imported by ``layers.py``; needs Triton."""

from __future__ import annotations

import functools
import math
from typing import Any


@functools.cache
def causal_softmax(torch: Any) -> Any:
    """The autograd function of the fused causal softmax over rows of [batch x heads, s, s]."""
    import triton
    import triton.language as tl

    # Named for the profiler's kernel table, where "fwd" and "bwd" are the phases' ranges.
    @triton.jit  # type: ignore[untyped-decorator]
    def causal_softmax_fwd(x_ptr, y_ptr, n_cols, rows_per_seq, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        inside = cols < n_cols
        x = tl.load(x_ptr + row.to(tl.int64) * n_cols + cols, mask=inside, other=0.0).to(tl.float32)
        x = tl.where(cols <= row % rows_per_seq, x, -float("inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        y = e / tl.sum(e, axis=0)
        tl.store(y_ptr + row.to(tl.int64) * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=inside)

    @triton.jit  # type: ignore[untyped-decorator]
    def causal_softmax_bwd(g_ptr, y_ptr, dx_ptr, n_cols, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        inside = cols < n_cols
        base = row.to(tl.int64) * n_cols
        g = tl.load(g_ptr + base + cols, mask=inside, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + base + cols, mask=inside, other=0.0).to(tl.float32)
        dx = y * (g - tl.sum(g * y, axis=0))
        tl.store(dx_ptr + base + cols, dx.to(dx_ptr.dtype.element_ty), mask=inside)

    def launch(n_cols: int) -> tuple[int, int]:
        block = triton.next_power_of_2(n_cols)
        return block, 4 if block <= 1024 else 8 if block <= 4096 else 16

    class CausalSoftmax(torch.autograd.Function):  # type: ignore[misc]
        @staticmethod
        def forward(ctx: Any, scores: Any) -> Any:
            rows, n = scores.numel() // scores.shape[-1], scores.shape[-1]
            x = scores.contiguous()
            y = torch.empty_like(x)
            block, warps = launch(n)
            causal_softmax_fwd[(rows,)](x, y, n, scores.shape[-2], BLOCK=block, num_warps=warps)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (y,) = ctx.saved_tensors
            g = grad.contiguous()
            dx = torch.empty_like(y)
            rows, n = y.numel() // y.shape[-1], y.shape[-1]
            block, warps = launch(n)
            causal_softmax_bwd[(rows,)](g, y, dx, n, BLOCK=block, num_warps=warps)
            return dx

    return CausalSoftmax


def check(torch: Any, dev: Any) -> dict[str, float]:
    """The fused softmax against PyTorch's (masked_fill and softmax, in FP32) on random FP16 rows:
    the largest differences forward and backward."""
    torch.manual_seed(1)
    s = 200
    x = torch.randn(6, s, s, device=dev, dtype=torch.float16, requires_grad=True)
    g = torch.randn(6, s, s, device=dev, dtype=torch.float16)
    y = causal_softmax(torch).apply(x)
    (dx,) = torch.autograd.grad(y, x, g)
    xr = x.detach().float().requires_grad_(True)
    mask = torch.ones(s, s, device=dev, dtype=torch.bool).triu(1)
    yr = torch.softmax(xr.masked_fill(mask, float("-inf")), dim=-1)
    (dxr,) = torch.autograd.grad(yr, xr, g.float())
    return {"fwd_max_abs": float((y.float() - yr).abs().max()), "bwd_max_abs": float((dx.float() - dxr).abs().max())}


def attention(torch: Any, qkv: Any, heads: int, head_dim: int, dropout: float) -> Any:
    """Megatron-LM's core attention of one layer: ``qkv`` [s, b, heads x 3 x head_dim] (each head's
    q, k and v side by side, as its fused QKV layer lays them out) to the context [s, b, heads x
    head_dim]."""
    sq, b, _ = qkv.shape
    q, k, v = qkv.view(sq, b, heads, 3 * head_dim).split(head_dim, dim=-1)
    q, k, v = (t.reshape(sq, b * heads, head_dim) for t in (q, k, v))
    scores = torch.empty(b * heads, sq, sq, device=qkv.device, dtype=qkv.dtype)
    scores = torch.baddbmm(scores, q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2), beta=0.0,
                           alpha=1.0 / math.sqrt(head_dim))
    probs = causal_softmax(torch).apply(scores)
    probs = torch.nn.functional.dropout(probs, dropout, training=True)
    ctx = torch.bmm(probs, v.transpose(0, 1))
    return ctx.view(b, heads, sq, head_dim).permute(2, 0, 1, 3).reshape(sq, b, heads * head_dim)
