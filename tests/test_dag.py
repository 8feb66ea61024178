"""ComputeDAG: workload keys identify a computation up to naming, FLOP counts, and the access-analysis predicates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG

ROOT = Path(__file__).resolve().parents[1]


def matmul_dag(M=8, N=6, K=4, dtype="float32", reducer=te.sum, combine=lambda a, b: a * b):
    """C[i, j] = reducer over k of combine(A[i, k], B[k, j])."""
    A = te.placeholder((M, K), dtype, "A")
    B = te.placeholder((K, N), dtype, "B")
    k = te.reduce_axis(K, "k")
    return ComputeDAG([A, B, te.compute((M, N), lambda i, j: reducer(combine(A[i, k], B[k, j]), axis=k), "C")])


def relu_after_bias(names=("x", "b", "y", "z"), floor=0.0):
    x = te.placeholder((4, 6), name=names[0])
    b = te.placeholder((6,), name=names[1])
    y = te.compute((4, 6), lambda i, j: x[i, j] + b[j], names[2])
    z = te.compute((4, 6), lambda i, j: te.maximum(y[i, j], te.const(floor, "float32")), names[3])
    return ComputeDAG([x, b, z])


# ---------------------------------------------------------------------------------------------- workload key


def test_renaming_tensors_and_axes_keeps_key_and_text():
    lhs = te.placeholder((8, 4), name="lhs")
    rhs = te.placeholder((4, 6), name="rhs")
    red = te.reduce_axis(4, "red")
    out = te.compute((8, 6), lambda row, col: te.sum(lhs[row, red] * rhs[red, col], axis=red), "out")
    a, b = matmul_dag(), ComputeDAG([lhs, rhs, out])
    assert a.canonical_text == b.canonical_text
    assert a.workload_key == b.workload_key
    assert str(a) != str(b)  # the plain printout does show the names: only the canonical form drops them
    assert relu_after_bias().workload_key == relu_after_bias(("p", "q", "r", "s")).workload_key


def test_canonical_text_of_matmul():
    assert matmul_dag().canonical_text == (
        "T0 = placeholder([8, 4], float32)\n"
        "T1 = placeholder([4, 6], float32)\n"
        "T2[8, 6]:float32 = sum((T0[s0, r0] * T1[r0, s1]), axis=[r0:4])\n"
        "inputs ['T0', 'T1'] outputs ['T2']"
    )


def _transposed_read():
    A = te.placeholder((8, 4), name="A")
    B = te.placeholder((6, 4), name="B")
    k = te.reduce_axis(4, "k")
    return ComputeDAG([A, B, te.compute((8, 6), lambda i, j: te.sum(A[i, k] * B[j, k], axis=k), "C")])


def _extra_stage():
    A = te.placeholder((8, 4), name="A")
    B = te.placeholder((4, 6), name="B")
    return ComputeDAG([A, B, ops.relu(ops.matmul(A, B))])


def _swapped_inputs():
    A = te.placeholder((8, 4), name="A")
    B = te.placeholder((4, 6), name="B")
    return ComputeDAG([B, A, ops.matmul(A, B)])


VARIANTS = {
    "shape M": lambda: matmul_dag(M=9),
    "shape K": lambda: matmul_dag(K=5),
    "dtype": lambda: matmul_dag(dtype="float64"),
    "sum -> max": lambda: matmul_dag(reducer=te.max),
    "* -> +": lambda: matmul_dag(combine=lambda a, b: a + b),
    "operand order": lambda: matmul_dag(combine=lambda a, b: b * a),
    "constant": lambda: matmul_dag(combine=lambda a, b: a * b * 2.0),
    "input order": _swapped_inputs,
    "transposed read": _transposed_read,
    "extra stage": _extra_stage,
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_any_change_to_the_computation_changes_the_key(variant):
    base = matmul_dag()
    other = VARIANTS[variant]()
    assert other.canonical_text != base.canonical_text
    assert other.workload_key != base.workload_key


def test_changing_a_constant_changes_the_key():
    assert relu_after_bias().workload_key != relu_after_bias(floor=1.0).workload_key
    doubled = matmul_dag(combine=lambda a, b: a * b * 2.0)
    tripled = matmul_dag(combine=lambda a, b: a * b * 3.0)
    assert doubled.workload_key != tripled.workload_key


def test_integer_constant_width_changes_the_key():
    # x*100 wraps in int8 but not in int64; the two must not share compiled code or tuning records
    def scaled(const_dtype):
        x = te.placeholder((4,), "int8", "x")
        y = te.compute((4,), lambda i: te.cast("float32", x[i] * te.const(100, const_dtype)), "y")
        return ComputeDAG([x, y])

    assert scaled("int8").workload_key != scaled("int64").workload_key
    assert scaled("int8").workload_key != scaled("int32").workload_key


def test_key_is_a_hex_digest_of_fixed_length():
    key = matmul_dag().workload_key
    assert len(key) == 32 and int(key, 16) >= 0


KEY_SCRIPT = """
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
d = te.placeholder((1, 8, 12, 12), name="data")
w = te.placeholder((12, 8, 3, 3), name="weight")
b = te.placeholder((12,), name="bias")
x = te.placeholder((16, 50), name="x")
print(ComputeDAG([d, w, b, ops.conv2d_bias_relu(d, w, b, padding=1)]).workload_key)
print(ComputeDAG([x, ops.softmax(x)]).workload_key)
"""


def test_key_is_the_same_in_separate_processes():
    keys = []
    for seed in ("1", "12345"):  # different str hashing, so set/dict-order dependence would show
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", KEY_SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, check=True
        )
        keys.append(out.stdout.split())
    assert keys[0] == keys[1]
    assert len(keys[0]) == 2 and keys[0][0] != keys[0][1]


# ---------------------------------------------------------------------------------------------- flop count


def test_flop_count_of_matmul():
    assert matmul_dag(M=8, N=6, K=4).flop_count == 2 * 8 * 6 * 4


def _conv(padding):
    data = te.placeholder((2, 3, 8, 8), name="data")
    weight = te.placeholder((4, 3, 3, 3), name="weight")
    return ComputeDAG([data, weight, ops.conv2d_nchw(data, weight, padding=padding)])


def test_flop_count_of_unpadded_conv2d():
    N, O, OH, OW, C, KH, KW = 2, 4, 6, 6, 3, 3, 3
    assert _conv(0).flop_count == 2 * N * O * OH * OW * C * KH * KW


def test_flop_count_of_padded_conv2d_includes_the_bounds_checks_of_the_pad_stage():
    # The pad stage is a select whose condition is (y >= 1) && (y < 9) && (x >= 1) && (x < 9): 4 compares and 3 ands
    # per padded element are counted (as TVM's FlopEstimator does); the select and index arithmetic are not.
    N, O, OH, OW, C, KH, KW = 2, 4, 8, 8, 3, 3, 3
    padded_elements = 2 * 3 * 10 * 10
    assert _conv(1).flop_count == 2 * N * O * OH * OW * C * KH * KW + 7 * padded_elements


def test_flop_count_of_elementwise_stages_counts_one_per_operation():
    assert relu_after_bias().flop_count == 4 * 6 * 2  # one add, one max per element


# ---------------------------------------------------------------------------------------------- access analysis


@pytest.fixture(scope="module")
def conv_bias_relu():
    data = te.placeholder((1, 4, 6, 6), name="data")
    weight = te.placeholder((8, 4, 3, 3), name="weight")
    bias = te.placeholder((8,), name="bias")
    out = ops.relu(ops.conv2d_bias_relu(data, weight, bias, padding=1), name="relu2")
    # a second relu so conv2d_relu is an intermediate, not the output
    return ComputeDAG([data, weight, bias, out])


def test_needs_multi_level_tiling(conv_bias_relu):
    assert matmul_dag().needs_multi_level_tiling("C")
    assert conv_bias_relu.needs_multi_level_tiling("conv2d")
    for name in ("conv2d_pad", "conv2d_bias", "conv2d_relu", "relu2"):
        assert not conv_bias_relu.needs_multi_level_tiling(name), name
    assert not matmul_dag().needs_multi_level_tiling("A")


def test_needs_multi_level_tiling_of_a_plain_reduction_is_false():
    x = te.placeholder((16, 50), name="x")
    assert not ComputeDAG([x, ops.row_sum(x)]).needs_multi_level_tiling("row_sum")


def test_is_strictly_inlinable(conv_bias_relu):
    d = conv_bias_relu
    assert d.is_strictly_inlinable("conv2d_bias")  # x + bias[c]: elementwise, cheap
    assert d.is_strictly_inlinable("conv2d_relu")  # max(x, 0) and not an output
    assert not d.is_strictly_inlinable("conv2d_pad")  # a select: inlining it puts a branch in the conv's loop
    assert not d.is_strictly_inlinable("conv2d")  # a reduction
    assert not d.is_strictly_inlinable("relu2")  # the output
    assert not d.is_strictly_inlinable("data")  # a placeholder


def test_is_strictly_inlinable_rejects_expensive_and_reordered_reads():
    x = te.placeholder((4, 6), name="x")
    e = te.compute((4, 6), lambda i, j: te.exp(x[i, j]), "e")
    t = te.compute((6, 4), lambda i, j: x[j, i] + 1.0, "t")
    out = te.compute((4, 6), lambda i, j: e[i, j] + t[j, i], "out")
    d = ComputeDAG([x, out])
    assert not d.is_strictly_inlinable("e")
    assert not d.is_strictly_inlinable("t")


def test_elementwise_match(conv_bias_relu):
    d = conv_bias_relu
    assert d.elementwise_match("conv2d", "conv2d_bias")
    assert d.elementwise_match("conv2d_bias", "conv2d_relu")
    assert not d.elementwise_match("conv2d_pad", "conv2d")  # shifted reads, different shape
    assert not d.elementwise_match("conv2d_relu", "data")  # a placeholder consumes nothing
    x = te.placeholder((4, 4), name="x")
    y = te.compute((4, 4), lambda i, j: x[i, j] * 2.0, "y")
    z = te.compute((4, 4), lambda i, j: y[j, i], "z")  # same shape, transposed read
    assert not ComputeDAG([x, z]).elementwise_match("y", "z")


def test_consumers_and_outputs(conv_bias_relu):
    d = conv_bias_relu
    assert d.consumers["conv2d_pad"] == ("conv2d",)
    assert d.consumers["relu2"] == ()
    assert d.outputs == ("relu2",) and d.inputs == ("data", "weight", "bias")
