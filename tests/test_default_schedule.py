"""Default (untuned) schedules: correct on every kernel, and shaped like the hand-written ones on anchors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.schedule.lower import lower
from compiler.schedule.state import initial_state, print_state
from compiler.targets.cpu.codegen import compile_funcs
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG


def run(dag: ComputeDAG, state, arrays):
    func = lower(state, "k")
    outs = [np.zeros(dag.op(o).shape, np.float32) for o in dag.outputs]
    compile_funcs([func])["k"](*arrays, *outs)
    return outs


@pytest.mark.parametrize("name", sorted(ops.KERNELS))
def test_default_schedule_matches_reference(name):
    case = ops.KERNELS[name]
    dag = ComputeDAG(sum(case.build(), []))
    arrays = case.random_inputs(np.random.default_rng(1))
    for got, want in zip(run(dag, default_schedule(dag), arrays), case.reference(*arrays)):
        np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)


@pytest.mark.parametrize(
    "shape,stride,groups",
    [((1, 16, 14, 14), 1, 1), ((2, 8, 13, 11), 2, 1), ((1, 12, 9, 9), 1, 12), ((1, 8, 7, 7), 1, 2)],
)
def test_conv_bias_relu_is_fused_and_correct(shape, stride, groups):
    n, c, h, w = shape
    x = te.placeholder(shape, name="x")
    wt = te.placeholder((16 if groups != c else c, c // groups, 3, 3), name="w")
    b = te.placeholder((wt.shape[0],), name="b")
    dag = ComputeDAG([x, wt, b, ops.conv2d_bias_relu(x, wt, b, stride=stride, padding=1, groups=groups)])
    state = default_schedule(dag)
    # the conv is computed inside the output's tile loop and the bias is inlined: one loop nest, no extra pass
    conv = state.stage("conv2d")
    assert conv.compute_at == "iter" and state.stage("conv2d_bias").compute_at == "inline"
    assert any(it.annotation == "vectorize" for it in conv.iters)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in (x, wt, b)]
    want = np.maximum(
        ops.reference_conv2d(*arrays[:2], stride=stride, padding=1, groups=groups) + arrays[2][None, :, None, None], 0
    )
    np.testing.assert_allclose(run(dag, state, arrays)[0], want, rtol=1e-4, atol=1e-4)


def test_matmul_output_gets_a_register_tile():
    A, B = te.placeholder((64, 96), name="A"), te.placeholder((96, 128), name="B")
    state = default_schedule(ComputeDAG([A, B, ops.matmul(A, B, name="C")]))
    local = state.stage("C.local")
    assert [it.annotation for it in local.iters][-2:] == ["unroll", "vectorize"]
    assert any(it.annotation == "parallel" for it in state.stage("C").iters)


def test_output_read_by_another_output_keeps_its_own_tile():
    A, B = te.placeholder((32, 48), name="A"), te.placeholder((48, 64), name="B")
    C = ops.matmul(A, B, name="C")
    D = te.compute(C.shape, lambda i, j: te.maximum(C[i, j], 0.0), name="D")
    dag = ComputeDAG([A, B, C, D])
    arrays = [np.random.default_rng(0).standard_normal(t.shape).astype(np.float32) for t in (A, B)]
    c, d = run(dag, default_schedule(dag), arrays)
    np.testing.assert_allclose(c, arrays[0] @ arrays[1], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(d, np.maximum(arrays[0] @ arrays[1], 0), rtol=1e-5, atol=1e-4)


@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 70), n=st.integers(1, 70), k=st.integers(1, 40))
def test_default_schedule_matmul_any_shape(m, n, k):
    A, B = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    dag = ComputeDAG([A, B, ops.matmul(A, B, name="C")])
    rng = np.random.default_rng(m * 10000 + n * 100 + k)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    np.testing.assert_allclose(run(dag, default_schedule(dag), [a, b])[0], a @ b, rtol=1e-4, atol=1e-4)


@settings(max_examples=15, deadline=None)
@given(
    c=st.sampled_from([1, 3, 4, 8]),
    f=st.sampled_from([1, 4, 8, 16, 24]),
    h=st.integers(3, 17),
    w=st.integers(3, 17),
    stride=st.integers(1, 3),
    pad=st.integers(0, 2),
    depthwise=st.booleans(),
)
def test_default_schedule_conv_any_shape(c, f, h, w, stride, pad, depthwise):
    groups = c if depthwise else 1
    f = c * (f % 3 + 1) if depthwise else f
    x = te.placeholder((1, c, h, w), name="x")
    wt = te.placeholder((f, c // groups, 3, 3), name="w")
    b = te.placeholder((f,), name="b")
    dag = ComputeDAG([x, wt, b, ops.conv2d_bias_relu(x, wt, b, stride=stride, padding=pad, groups=groups)])
    rng = np.random.default_rng(h * 100 + w)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in (x, wt, b)]
    want = ops.reference_conv2d(*arrays[:2], stride=stride, padding=pad, groups=groups)
    want = np.maximum(want + arrays[2][None, :, None, None], 0)
    np.testing.assert_allclose(run(dag, default_schedule(dag), arrays)[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(2, 3, 128), (4, 48), (3, 5, 40)])
def test_a_softmax_reduces_its_rows_in_vectors_and_evaluates_exp_once(shape):
    # the row max and sum run along contiguous memory: vector partial reductions (rfactor) per row, and the exp that
    # both the sum and the division read is computed once, vectorized, rather than inlined into each (one lane at a
    # time in the sum); a row whose length is no multiple of the lanes keeps the scalar reduction
    from compiler.targets import host_target

    x = te.placeholder(shape, name="x")
    y = ops.OPS["Softmax"]([x], {"axis": -1}, "sm")[0]
    dag = ComputeDAG([x, y])
    state = default_schedule(dag, host_target())
    names = {s.name for s in state.stages}
    lanes = host_target().vector_bytes // 4
    assert "sm_exp" in names and state.stage("sm_exp").compute_at != "inline"
    rows_vectorized = shape[-1] % lanes == 0 and shape[-1] >= 2 * lanes
    assert ({"sm_max.rf", "sm_sum.rf"} <= names) == rows_vectorized
    a = np.random.default_rng(2).standard_normal(shape).astype(np.float32) * 4
    (got,) = run(dag, state, [a])
    want = np.exp(a - a.max(-1, keepdims=True))
    np.testing.assert_allclose(got, want / want.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("op, shape", [("Softmax", (2, 12, 32, 64)), ("LayerNormalization", (4, 128, 96))])
def test_row_stages_are_computed_row_by_row_inside_the_stage_reading_them(op, shape):
    # a softmax's max, exp and sum and a LayerNorm's mean and variance each cover one row of the output, so each is
    # computed for one row at a time inside the output's row loop: one parallel loop nest, each row's data in L1
    x = te.placeholder(shape, name="x")
    ins = [x]
    if op == "LayerNormalization":
        ins += [te.placeholder(shape[-1:], name="g"), te.placeholder(shape[-1:], name="b")]
    y = ops.OPS[op](ins, {"axis": -1, "epsilon": 1e-5}, "y")[0]
    dag = ComputeDAG([*ins, y])
    state = default_schedule(dag)
    roots = [s for s in state.stages if s.compute_at == "root" and not s.op.is_placeholder]
    assert [s.name for s in roots] == [y.name], print_state(state)
    rows = {a.name for a in roots[0].op.axes[:-1]}
    parallel = [it for it in roots[0].iters if it.annotation == "parallel"]
    assert len(parallel) == 1 and set(parallel[0].name.split("@")) <= rows, "threads split the rows only"
    inner = [s for s in state.stages if s.compute_at == "iter" and s.attach[0] == y.name]
    assert inner, "the row stages are computed inside the output's loops"
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in ins]
    (got,) = run(dag, state, arrays)
    (want,) = run(dag, initial_state(dag), arrays)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1000, 256, 37])
def test_a_one_row_matmul_streams_its_weight_rows_in_long_runs(n):
    # a classifier's GEMV: no row axis to unroll, so every accumulator goes along the row; N = 1000 has no multiple
    # of 16 lanes as a divisor, and 200 (half vectors whole) beat 10 (the divisor up to one vector) 2x
    from compiler.targets import host_target
    from compiler.targets.cpu.default_schedule import _row_chunk

    lanes = host_target().vector_bytes // 4
    assert _row_chunk(1000, 16, 16) == 200 and _row_chunk(1024, 16, 16) == 256 and _row_chunk(37, 16, 16) == 37
    x, w = te.placeholder((1, 64), name="x"), te.placeholder((64, n), name="w")
    y = ops.linalg.matmul(x, w, name="mm")
    dag = ComputeDAG([x, w, y])
    state = default_schedule(dag, host_target())
    inner = state.stage("mm.local").iters[-1]
    assert inner.annotation == "vectorize" and inner.extent == _row_chunk(n, lanes, 16 if lanes == 16 else 10)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((1, 64)).astype(np.float32), rng.standard_normal((64, n)).astype(np.float32)
    np.testing.assert_allclose(run(dag, state, [a, b])[0], a @ b, rtol=1e-4, atol=1e-4)


def test_a_depthwise_conv_reads_its_padding_through_a_select_rather_than_a_padded_copy():
    # each input element is read 9 times at most: a copy of the padded input would cost a pass over memory
    from compiler.tensor.ops.nn import depthwise_conv2d_nchwc

    x, w = te.placeholder((1, 2, 9, 9, 16), name="x"), te.placeholder((2, 3, 3, 16), name="w")
    y = depthwise_conv2d_nchwc(x, w, stride=2, padding=1, name="dw", out_blocked=True)
    dag = ComputeDAG([x, w, y])
    state = default_schedule(dag)
    assert state.stage("dw_pad").compute_at == "inline"
    case = ops.KERNELS["conv2d_depthwise_nchwc"]
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(x.shape).astype(np.float32), rng.standard_normal(w.shape).astype(np.float32)
    got = run(dag, state, [a, b])[0]
    np.testing.assert_allclose(got, case.reference(a, b)[0].astype(np.float32), rtol=1e-5, atol=1e-5)
