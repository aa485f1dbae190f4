"""A transformer layer under PyTorch's automatic mixed precision (``precision: amp_bf16`` or
``amp_fp16``): the parameters, their gradients and the residual stream stay FP32, and autocast casts
what its 16-bit ops take. What a layer runs then (torch.autocast's op lists, PyTorch's CUDA AMP
documentation; the kernels PyTorch 2.11 ran on an H200, calibration/data/h200-sxm/2026-12-04-b):

- forward: each linear's FP32 weight and bias cast to 16 bits, once a forward (autocast's cache); the
  layer norms in FP32 (``layer_norm`` is on autocast's FP32 list), their outputs cast to 16 bits
  for the QKV and FC1 GEMMs; the GEMMs, the attention and the activation in 16 bits; each residual
  add of a 16-bit output to the FP32 stream, in FP32;
- backward: the FP32 stream's gradient cast to 16 bits for the FC2 and projection GEMMs; the QKV
  and FC1 input gradients cast back to FP32 for the norms' backward; each weight's 16-bit gradient
  cast to FP32 (autocast's cast, backward), and from the second micro-batch on added to the
  accumulated gradient (the biases' casts, 9h elements a layer, left out); the two branches'
  gradients summed into the stream's, in FP32.

The embedding and head under autocast are :class:`ovsim.models.training_emit.LayerEmitter`'s.
Tensor and pipeline parallelism and FSDP are refused with autocast
(:func:`ovsim.models.training_layout.layout`), so a layer here is whole on its rank."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from ovsim.models.training_spec import ModelShape, act_elements, layer_matrices, layer_params

FP32_B = 4
# A cast between FP32 and 16 bits: one element read in one width and written in the other.
CAST_B = FP32_B + 2


class Emitter(Protocol):
    """What these functions use of :class:`ovsim.models.training_emit.LayerEmitter`."""

    m: ModelShape
    tokens: int
    act_b: int
    grad_b: int
    # Whether this backward adds its weight gradients to an earlier micro-batch's.
    accumulating: bool

    def mem(self, st: Any, name: str, nbytes: float, kind: Literal["elementwise", "norm", "softmax"]) -> str: ...

    def gemm(self, st: Any, name: str, m: int, n: int, k: int) -> str: ...

    def attention(self, st: Any, name: str, backward: bool) -> None: ...

    def grad_ready(self, st: Any, s: int, nbytes: float, last_mb: bool) -> None: ...


def cast_weights(m: ModelShape) -> int:
    """Parameters of a layer autocast casts to 16 bits: its linears' weights and biases (the norms'
    stay FP32)."""
    return layer_params(m, 1) - 4 * m.hidden


def amp_layer_forward(g: Emitter, st: Any, pre: str) -> None:
    """One layer's forward under autocast (the module docstring)."""
    m = g.m
    mats = layer_matrices(m, 1)
    e = g.tokens * m.hidden  # elements of the residual stream
    g.mem(st, f"{pre}.weights.cast", CAST_B * cast_weights(m), "elementwise")
    g.mem(st, f"{pre}.norm1", 2 * FP32_B * e, "norm")
    g.mem(st, f"{pre}.qkv.cast", CAST_B * e, "elementwise")
    g.gemm(st, f"{pre}.qkv", g.tokens, mats["qkv"][1], mats["qkv"][0])
    g.attention(st, f"{pre}.attn", backward=False)
    g.gemm(st, f"{pre}.proj", g.tokens, mats["proj"][1], mats["proj"][0])
    g.mem(st, f"{pre}.residual1", (2 * FP32_B + g.act_b) * e, "elementwise")
    g.mem(st, f"{pre}.norm2", 2 * FP32_B * e, "norm")
    g.mem(st, f"{pre}.fc1.cast", CAST_B * e, "elementwise")
    g.gemm(st, f"{pre}.fc1", g.tokens, mats["fc1"][1], mats["fc1"][0])
    g.mem(st, f"{pre}.act", act_elements(m, g.tokens, mats["fc1"][1]) * g.act_b, "elementwise")
    g.gemm(st, f"{pre}.fc2", g.tokens, mats["fc2"][1], mats["fc2"][0])
    g.mem(st, f"{pre}.residual2", (2 * FP32_B + g.act_b) * e, "elementwise")


def accumulate_grad(g: Emitter, st: Any, name: str, params: int) -> None:
    """An FP32 gradient added to the accumulated one after the chunk's first backward
    (AccumulateGrad: two FP32 tensors read, one written); nothing in the first."""
    if g.accumulating:
        g.mem(st, f"{name}.accumulate", 3 * FP32_B * params, "elementwise")


def weight_grad_cast(g: Emitter, st: Any, name: str, params: int, accumulates: bool = True) -> None:
    """A weight's 16-bit gradient cast to FP32, then accumulated (:func:`accumulate_grad`) unless
    it is summed into another's first (``accumulates`` false: a head tied to the embedding)."""
    g.mem(st, f"{name}.cast", CAST_B * params, "elementwise")
    if accumulates:
        accumulate_grad(g, st, name, params)


def amp_layer_backward(g: Emitter, st: Any, s: int, pre: str, last_mb: bool, recompute_attention: bool) -> None:
    """One layer's backward under autocast (the module docstring)."""
    m = g.m
    mats = layer_matrices(m, 1)
    T, e, gb = g.tokens, g.tokens * m.hidden, g.grad_b

    def linear_backward(name: str, mat: tuple[int, int]) -> None:
        g.gemm(st, f"{pre}.{name}.dgrad", T, mat[0], mat[1])
        g.gemm(st, f"{pre}.{name}.wgrad", mat[0], mat[1], T)
        weight_grad_cast(g, st, f"{pre}.{name}.wgrad", mat[0] * mat[1])
        g.grad_ready(st, s, mat[0] * mat[1] * gb, last_mb)

    g.mem(st, f"{pre}.fc2.gcast", CAST_B * e, "elementwise")
    linear_backward("fc2", mats["fc2"])
    g.mem(st, f"{pre}.act.bwd", 2 * act_elements(m, T, mats["fc1"][1]) * g.act_b, "elementwise")
    linear_backward("fc1", mats["fc1"])
    g.mem(st, f"{pre}.fc1.gcast", CAST_B * e, "elementwise")
    g.mem(st, f"{pre}.norm2.bwd", 3 * FP32_B * e, "norm")
    g.mem(st, f"{pre}.residual2.bwd", 3 * FP32_B * e, "elementwise")
    g.mem(st, f"{pre}.proj.gcast", CAST_B * e, "elementwise")
    linear_backward("proj", mats["proj"])
    if recompute_attention:
        g.attention(st, f"R{pre[1:]}.attn", backward=False)
    g.attention(st, f"{pre}.attn.bwd", backward=True)
    g.gemm(st, f"{pre}.qkv.dgrad", T, mats["qkv"][0], mats["qkv"][1])
    g.gemm(st, f"{pre}.qkv.wgrad", mats["qkv"][0], mats["qkv"][1], T)
    weight_grad_cast(g, st, f"{pre}.qkv.wgrad", mats["qkv"][0] * mats["qkv"][1])
    g.mem(st, f"{pre}.qkv.gcast", CAST_B * e, "elementwise")
    g.mem(st, f"{pre}.norm1.bwd", 3 * FP32_B * e, "norm")
    g.mem(st, f"{pre}.residual1.bwd", 3 * FP32_B * e, "elementwise")
    small = (layer_params(m, 1) - sum(i * o for i, o in mats.values())) * gb
    g.grad_ready(st, s, mats["qkv"][0] * mats["qkv"][1] * gb + small, last_mb)
