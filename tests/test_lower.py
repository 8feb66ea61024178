"""lower(): golden loop IR of fixed schedules, and the interpreter and the JIT agreeing with numpy on them."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.base.errors import LoweringError
from compiler.schedule import interp
from compiler.schedule.lower import lower
from compiler.schedule.state import Annotate, ComputeAt, Split, apply_steps
from compiler.targets.cpu.codegen import compile_funcs
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG


def row_sum_split():
    """Both axes split by 4, neither divides: rows 0-3 run unguarded, the reduction's last 2 terms in a loop of
    their own (partition.py), and rows 4-5 in a 4-lane vector loop masked to its first 2 lanes."""
    x = te.placeholder((6, 10), name="x")
    dag = ComputeDAG([x, ops.row_sum(x)])
    return lower(apply_steps(dag, [Split(1, 0, (4,)), Split(1, 2, (4,)), Annotate(1, 1, "vectorize")]))


ROW_SUM_SPLIT = """\
def kernel(x: float32[6, 10], row_sum: float32[6]):
  for i.1 in range(4):  # vectorized
    row_sum[i.1] = 0.0f
    for k.0 in range(2):
      for k.1 in range(4):
        row_sum[i.1] = (row_sum[i.1] + x[(((i.1 * 10) + (k.0 * 4)) + k.1)])
    for k.1 in range(2):
      row_sum[i.1] = (row_sum[i.1] + x[(((i.1 * 10) + k.1) + 8)])
  for i.1 in range(4):  # vectorized
    if ((i.1 + 4) < 6):
      row_sum[(i.1 + 4)] = 0.0f
    for k.0 in range(2):
      for k.1 in range(4):
        if ((i.1 + 4) < 6):
          row_sum[(i.1 + 4)] = (row_sum[(i.1 + 4)] + x[((((i.1 * 10) + (k.0 * 4)) + k.1) + 40)])
    for k.1 in range(2):
      if ((i.1 + 4) < 6):
        row_sum[(i.1 + 4)] = (row_sum[(i.1 + 4)] + x[(((i.1 * 10) + k.1) + 48)])
"""  # noqa: E501 - golden text, one loop IR line


def stencil_compute_at():
    """B = 2x computed per 4-wide tile of C[i] = B[i] + B[i+2]: each tile needs a 6-element window of B."""
    x = te.placeholder((12,), name="x")
    B = te.compute((12,), lambda i: x[i] * 2.0, "B")
    C = te.compute((10,), lambda i: B[i] + B[i + 2], "C")
    return lower(apply_steps(ComputeDAG([x, C]), [Split(2, 0, (4,)), ComputeAt(1, 2, 0)]))


# The window starts at i.0*4 and is 4 + 2 wide; B is a 6-element local buffer indexed from the window's start.
# The last tile's window (8..13) sticks out of B's 12 elements and its C tile (8..11) out of C's 10: partitioned,
# the first two tiles run unguarded and the last computes B's 4 and C's 2 elements there are.
STENCIL_COMPUTE_AT = """\
def kernel(x: float32[12], C: float32[10]):
  for i.0 in range(2):
    B = alloc(float32[6])
    for i in range(6):
      B[i] = (x[((i.0 * 4) + i)] * 2.0f)
    for i.1 in range(4):
      C[((i.0 * 4) + i.1)] = (B[i.1] + B[(i.1 + 2)])
  B = alloc(float32[6])
  for i in range(4):
    B[i] = (x[(i + 8)] * 2.0f)
  for i.1 in range(2):
    C[(i.1 + 8)] = (B[i.1] + B[(i.1 + 2)])
"""


def test_golden_split_with_tail_guards():
    assert str(row_sum_split()) == ROW_SUM_SPLIT


def test_golden_compute_at_region_and_local_buffer():
    assert str(stencil_compute_at()) == STENCIL_COMPUTE_AT


CASES = {
    "row_sum_split": (row_sum_split, [(6, 10)], lambda x: x.sum(axis=1)),
    "stencil_compute_at": (stencil_compute_at, [(12,)], lambda x: 2 * x[:10] + 2 * x[2:]),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("runner", ["interp", "jit"])
def test_interpreter_and_jit_match_numpy(name, runner):
    build, shapes, reference = CASES[name]
    func = build()
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    out = np.full(func.params[-1].shape, np.nan, np.float32)  # NaN shows any element left unwritten
    run = (lambda *a: interp.run(func, *a)) if runner == "interp" else compile_funcs([func])[func.name]
    run(*inputs, out)
    np.testing.assert_allclose(out, reference(*(a.astype(np.float64) for a in inputs)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("runner", ["interp", "jit"])
def test_narrow_integer_arithmetic_wraps_like_numpy(runner):
    # int8 * int8 stays int8 in numpy and in compiled code; the interpreter (Python ints) must wrap the same way
    x = te.placeholder((4,), "int8", "x")
    y = te.compute((4,), lambda i: te.cast("int32", x[i] * te.const(100, "int8")) + 1000, "y")
    func = lower(apply_steps(ComputeDAG([x, y]), []))
    xs = np.array([1, 2, 3, -4], np.int8)
    out = np.zeros(4, np.int32)
    run = (lambda *a: interp.run(func, *a)) if runner == "interp" else compile_funcs([func])[func.name]
    run(xs, out)
    np.testing.assert_array_equal(out, (xs * np.int8(100)).astype(np.int32) + 1000)


def test_producer_inside_one_consumer_but_read_by_another_is_a_lowering_error():
    x = te.placeholder((12,), name="x")
    B = te.compute((12,), lambda i: x[i] * 2.0, "B")
    C1 = te.compute((12,), lambda i: B[i] + 1.0, "C1")
    C2 = te.compute((12,), lambda i: B[i] * 3.0, "C2")
    # legal as a step (C1 reads B), but C2's loop runs after C1's and B exists only inside C1's loop
    state = apply_steps(ComputeDAG([x, C1, C2]), [ComputeAt(1, 2, 0)])
    with pytest.raises(LoweringError, match="B is computed inside C1's loop i, but its consumer C2 runs outside"):
        lower(state)
