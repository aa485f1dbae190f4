"""What an ATen operator call moves through memory, from the input shapes and types the PyTorch
profiler records (``record_shapes``): the bytes a streaming kernel must read and write, so that a
trace's memory-bound kernels can be set against the HBM bandwidth.

Only operators whose traffic follows from their arguments alone are known: elementwise arithmetic
(functional, in-place and ``out=``), fills, copies, layer norm and softmax. Anything else (views,
reductions, indexing, fused or library kernels) gives None rather than a guess.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Any

# Bytes per element of the type names the profiler writes.
ELEMENT_BYTES = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}

# Elementwise operators by the number of leading tensor operands they read; a tensor argument
# after those (past any Scalar ones such as add's alpha) is an ``out=`` tensor.
_UNARY = {"abs", "neg", "exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "reciprocal", "sigmoid",
          "tanh", "relu", "gelu", "silu", "mish", "elu", "leaky_relu", "hardtanh", "hardswish", "hardsigmoid", "erf",
          "sin", "cos", "sign", "floor", "ceil", "round", "trunc", "logical_not", "bitwise_not", "isnan", "isinf",
          "square"}
_BINARY = {"add", "sub", "rsub", "mul", "div", "pow", "maximum", "minimum", "fmod", "remainder", "atan2",
           "threshold_backward", "gelu_backward", "silu_backward", "sigmoid_backward", "tanh_backward",
           "logical_and", "logical_or", "bitwise_and", "bitwise_or", "eq", "ne", "lt", "le", "gt", "ge"}
_TERNARY = {"where", "addcmul", "addcdiv", "lerp", "masked_fill"}
_BOOLEAN_OUT = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "isnan", "isinf"}
_WRITE_ONLY = {"fill", "zero"}

# The classes a memory-bound kernel falls in: streaming elementwise work, copies (which may
# permute, so move data less regularly), and the row-wise kernels that read a row more than once.
CLASSES = ("elementwise", "copy", "norm", "softmax")


@dataclass(frozen=True)
class Traffic:
    """An operator call's memory traffic: bytes read plus bytes written, and its class."""

    bytes: float
    op_class: str


def _split(host_op: str) -> tuple[str, list[Any]] | None:
    i = host_op.find("[")
    if i <= 0:
        return None
    try:
        dims = ast.literal_eval(host_op[i:])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return (host_op[:i], dims) if isinstance(dims, list) else None


def _tensors(dims: list[Any], types: list[Any]) -> list[tuple[int, list[int], int] | None]:
    """Per argument: (position, shape, element bytes) for a tensor of a known type, else None."""
    out: list[tuple[int, list[int], int] | None] = []
    for pos, (d, t) in enumerate(zip(dims, types, strict=False)):
        size = ELEMENT_BYTES.get(t) if isinstance(t, str) else None
        ok = size is not None and isinstance(d, list) and all(isinstance(x, int) and x >= 0 for x in d)
        out.append((pos, d, size) if ok else None)  # type: ignore[arg-type]
    return out


def _broadcast(shapes: list[list[int]]) -> list[int] | None:
    rank = max(len(s) for s in shapes)
    result = [1] * rank
    for s in shapes:
        for j, x in enumerate([1] * (rank - len(s)) + s):
            if x != 1 and result[j] not in (1, x):
                return None
            result[j] = max(result[j], x) if x != 1 else result[j]
    return result


def traffic(host_op: str, host_types: str) -> Traffic | None:
    """The bytes an operator call reads and writes, from its recorded shapes and types
    (``aten::mul[[1, 4096], [1, 4096]]``, ``['c10::BFloat16', 'c10::BFloat16']``); None where the
    operator is not one whose traffic follows from its arguments, or the record is incomplete.

    Every tensor is read once and every output written once: a broadcast operand is counted at its
    own size, since its reuse hits in cache. The result's type is the widest operand's, ignoring
    zero-dimensional ones (wrapped Python scalars) when a dimensioned operand exists, as PyTorch's
    type promotion does; an ``out=`` tensor gives it directly."""
    split = _split(host_op)
    if split is None or not host_types:
        return None
    name, dims = split
    try:
        types = ast.literal_eval(host_types)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(types, list) or len(types) != len(dims) or not name.startswith("aten::"):
        return None
    op = name.removeprefix("aten::")
    inplace = op.endswith("_")
    base = op.rstrip("_")
    args = _tensors(dims, types)

    def size(t: tuple[int, list[int], int]) -> int:
        return math.prod(t[1]) * t[2]

    if base == "copy" and inplace:
        if len(args) < 2 or args[0] is None or args[1] is None or math.prod(args[0][1]) != math.prod(args[1][1]):
            return None
        return Traffic(float(size(args[0]) + size(args[1])), "copy")
    if base in _WRITE_ONLY and inplace:
        return None if not args or args[0] is None else Traffic(float(size(args[0])), "elementwise")
    if op == "native_layer_norm":
        # input, normalized_shape, weight, bias, eps: y has x's shape and type; mean and rstd
        # (float, one per row) are written too. The profiler records normalized_shape as a
        # ScalarList without its value, so the row length is the weight's.
        x = args[0] if args else None
        w = args[2] if len(args) > 2 else None
        if x is None or w is None or not w[1] or math.prod(w[1]) == 0 or math.prod(x[1]) % math.prod(w[1]):
            return None
        rows = math.prod(x[1]) // math.prod(w[1])
        params = sum(size(t) for t in args[2:4] if t is not None)
        return Traffic(float(2 * size(x) + params + 2 * 4 * rows), "norm")
    if op == "_softmax":
        # self, dim, half_to_float: the result is taken to be of self's type; the profiler records
        # half_to_float's type but not its value, and a true one (a float result) writes 2x more.
        x = args[0] if args else None
        return None if x is None else Traffic(float(2 * size(x)), "softmax")
    if op == "_softmax_backward_data":
        # grad_output, output, dim, input_dtype: reads both, writes grad_input of grad_output's shape.
        if len(args) < 2 or args[0] is None or args[1] is None:
            return None
        return Traffic(float(size(args[0]) + size(args[1]) + size(args[0])), "softmax")
    arity = 1 if base in _UNARY else 2 if base in _BINARY else 3 if base in _TERNARY else 0
    if arity == 0:
        return None
    operands = [a for a in args[:arity] if a is not None]
    dimensioned = [a for a in operands if a[1]]
    if not operands or (args and args[0] is None):
        return None
    rest = [a for a in args[arity:] if a is not None]
    shape = _broadcast([a[1] for a in operands])
    if shape is None:
        return None
    if inplace:
        target = args[0]
        assert target is not None
        written = size(target)
    else:
        elements = math.prod(shape)
        if rest:
            # An out= tensor has the result's shape; anything else is an argument not modelled.
            if math.prod(rest[0][1]) != elements or len(rest) > 1:
                return None
            out_bytes = rest[0][2]
        elif base in _BOOLEAN_OUT:
            out_bytes = 1
        else:
            out_bytes = max(a[2] for a in (dimensioned or operands))
        written = elements * out_bytes
    return Traffic(float(sum(size(a) for a in operands) + written), "elementwise")


_MATMUL = re.compile(r"^(aten::(?:mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm))\[(.*)\]$")


def gemm_problem(host_op: str) -> tuple[int, int, int, int] | None:
    """(M, N, K, batch) of a matrix product from its launching operator's input shapes (the
    profiler's ``aten::mm[[M, K], [K, N]]``), or None when the operator is not one or its shapes
    do not agree."""
    m = _MATMUL.match(host_op.strip())
    if m is None:
        return None
    try:
        shapes = ast.literal_eval("[" + m[2] + "]")
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    op = m[1]
    if op in ("aten::addmm", "aten::baddbmm") and len(shapes) >= 3:
        shapes = shapes[1:3]
    if not all(isinstance(x, list) and all(isinstance(d, int) for d in x) for x in shapes[:2]):
        return None
    if op == "aten::linear" and len(shapes) >= 2 and len(shapes[1]) == 2 and shapes[0]:
        a, w = shapes[0], shapes[1]
        return (math.prod(a[:-1]), w[0], a[-1], 1) if a[-1] == w[1] else None
    if len(shapes) < 2:
        return None
    a, b = shapes[0], shapes[1]
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return a[0], b[1], a[1], 1
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return a[1], b[2], a[2], a[0]
    return None
