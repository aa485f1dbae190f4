"""Bytes of ATen operator calls from recorded shapes and types. Expected values are counted by hand
from the operator's semantics (each input read once, the result written once)."""

from __future__ import annotations

import pytest

from ovsim.traces.aten import gemm_problem, traffic

BF16 = "c10::BFloat16"


def test_binary_elementwise_reads_both_and_writes_the_result() -> None:
    t = traffic("aten::add[[1, 5185, 1024], [1, 5185, 1024], []]", f"['{BF16}', '{BF16}', 'Scalar']")
    assert t is not None and t.op_class == "elementwise"
    assert t.bytes == 3 * 5185 * 1024 * 2


def test_a_wrapped_python_scalar_does_not_widen_the_result() -> None:
    """x * 1.702 records the number as a zero-dimensional double; the result stays bf16."""
    t = traffic("aten::mul[[1, 5185, 4096], []]", f"['{BF16}', 'double']")
    assert t is not None
    assert t.bytes == 2 * 5185 * 4096 * 2 + 8


def test_a_broadcast_operand_is_read_at_its_own_size() -> None:
    t = traffic("aten::add[[64, 1024], [1024]]", "['float', 'float']")
    assert t is not None
    assert t.bytes == (64 * 1024 + 1024 + 64 * 1024) * 4


def test_mixed_types_write_the_wider_one_and_comparisons_write_bool() -> None:
    mixed = traffic("aten::add[[256, 256], [256, 256]]", f"['{BF16}', 'float']")
    assert mixed is not None and mixed.bytes == 256 * 256 * (2 + 4 + 4)
    cmp = traffic("aten::lt[[256, 256], [256, 256]]", "['float', 'float']")
    assert cmp is not None and cmp.bytes == 256 * 256 * (4 + 4 + 1)


def test_out_tensor_is_written_once_not_read() -> None:
    """mul(self, other, out=): the third tensor is the result."""
    t = traffic("aten::mul[[4, 2798, 2798], [], [4, 2798, 2798]]", "['float', 'double', 'float']")
    assert t is not None
    assert t.bytes == 4 * 2798 * 2798 * 4 * 2 + 8


def test_in_place_ops_write_their_first_operand() -> None:
    t = traffic("aten::add_[[1024, 1024], [1024, 1024], []]", "['float', 'float', 'Scalar']")
    assert t is not None and t.bytes == 3 * 1024 * 1024 * 4
    fill = traffic("aten::fill_[[1000, 10], []]", "['float', 'Scalar']")
    assert fill is not None and fill.bytes == 1000 * 10 * 4


def test_copy_reads_the_source_and_writes_the_destination() -> None:
    t = traffic("aten::copy_[[16, 5185, 64], [16, 5185, 64], []]", f"['float', '{BF16}', 'Scalar']")
    assert t is not None and t.op_class == "copy"
    assert t.bytes == 16 * 5185 * 64 * (4 + 2)


def test_layer_norm_and_softmax() -> None:
    """Layer norm: x read, y written, weight and bias read, float mean and rstd per row written.
    Softmax: x read, y written; its backward reads the gradient and the output."""
    ln = traffic("aten::native_layer_norm[[8, 512, 1024], [], [1024], [1024], []]",
                 f"['{BF16}', 'ScalarList', '{BF16}', '{BF16}', 'Scalar']")
    assert ln is not None and ln.op_class == "norm"
    assert ln.bytes == 2 * 8 * 512 * 1024 * 2 + 2 * 1024 * 2 + 2 * 4 * 8 * 512
    sm = traffic("aten::_softmax[[16, 512, 512], [], []]", f"['{BF16}', 'Scalar', 'Scalar']")
    assert sm is not None and sm.op_class == "softmax" and sm.bytes == 2 * 16 * 512 * 512 * 2
    bwd = traffic("aten::_softmax_backward_data[[16, 512, 512], [16, 512, 512], [], []]",
                  f"['{BF16}', '{BF16}', 'Scalar', 'Scalar']")
    assert bwd is not None and bwd.bytes == 3 * 16 * 512 * 512 * 2


@pytest.mark.parametrize(("op", "types"), [
    ("aten::mm[[64, 128], [128, 256]]", "['float', 'float']"),  # not memory-bound: priced elsewhere
    ("aten::sum[[64, 128], [], []]", "['float', 'ScalarList', 'Scalar']"),  # a reduction
    ("aten::add[[64, 128], [64, 128]]", ""),  # types not recorded
    ("aten::add[[64, 128], [64, 128]]", "['float']"),  # types do not match the shapes
    ("aten::add[[64, 128], [32, 128]]", "['float', 'float']"),  # shapes that do not broadcast
    ("aten::add[[64, 128", "['float', 'float']"),  # truncated record
    ("aten::mul[[64], [64]]", "['mystery', 'float']"),  # a type of unknown size
    ("aten::copy_[[64], [32]]", "['float', 'float']"),  # sizes that disagree
    ("aten::add[[64], [64], [], [3]]", "['float', 'float', 'Scalar', 'float']"),  # a tensor that is no out=
])
def test_anything_unknown_gives_none(op: str, types: str) -> None:
    assert traffic(op, types) is None


def test_gemm_problems_from_launching_operators() -> None:
    assert gemm_problem("aten::addmm[[1024], [8944, 1024], [1024, 2048], [], []]") == (8944, 2048, 1024, 1)
    assert gemm_problem("aten::mm[[128, 5], [5, 64]]") == (128, 64, 5, 1)
    assert gemm_problem("aten::bmm[[12, 32, 64], [12, 64, 559]]") == (32, 559, 64, 12)
    assert gemm_problem("aten::linear[[4, 16, 512], [1024, 512], [1024]]") == (64, 1024, 512, 1)
    assert gemm_problem("aten::mm[[128, 5], [6, 64]]") is None  # inner sizes disagree
    assert gemm_problem("aten::cudnn_convolution[[1, 3, 224, 224], [768, 3, 16, 16]]") is None
    assert gemm_problem("aten::_scaled_mm[[8192, 8192], [8192, 8192], [], [], [], [], [], []]") == (8192, 8192, 8192, 1)
    assert gemm_problem("aten::mm[[128, 5], [5, 64]") is None  # cut short
