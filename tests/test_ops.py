"""The kernel definitions in compiler/tensor/ops/: shapes, argument errors, and references checked independently."""

import math

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from compiler.base.errors import InvalidExpr
from compiler.tensor import ops, te
from compiler.tensor.dag import topological_tensors

# ---------------------------------------------------------------------------------------------- a direct TE evaluator
# Evaluates a tensor's definition with numpy broadcasting, one stage at a time, without the scheduler or loop IR,
# so the op definitions are checked against the references before any backend exists. Out-of-bounds loads are
# errors unless a Select masks them off, which is how lazy `select` padding must behave.

_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "floordiv": np.floor_divide,
    "mod": np.mod, "min": np.minimum, "max": np.maximum, "pow": np.power, "lt": np.less, "le": np.less_equal,
    "eq": np.equal, "ne": np.not_equal, "gt": np.greater, "ge": np.greater_equal, "and": np.logical_and,
    "or": np.logical_or,
}  # fmt: skip
_UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda a: 1 / np.sqrt(a), "tanh": np.tanh,
    "erf": np.vectorize(math.erf), "sigmoid": lambda a: 1 / (1 + np.exp(-a)), "floor": np.floor, "abs": np.abs,
    "neg": np.negative, "not": np.logical_not,
}  # fmt: skip
_INIT = {"sum": 0.0, "max": -np.inf, "min": np.inf}


def _eval(e, env, bufs, mask, fdt):
    if isinstance(e, te.Const):
        return fdt(e.value) if isinstance(e.value, float) else e.value
    if isinstance(e, te.Var):
        return env[e.name]
    if isinstance(e, te.Binary):
        return _BINARY[e.op](_eval(e.a, env, bufs, mask, fdt), _eval(e.b, env, bufs, mask, fdt))
    if isinstance(e, te.Unary):
        return _UNARY[e.op](_eval(e.a, env, bufs, mask, fdt))
    if isinstance(e, te.Cast):
        return np.asarray(_eval(e.a, env, bufs, mask, fdt)).astype(fdt if e.dtype.startswith("float") else e.dtype)
    if isinstance(e, te.Select):
        c = _eval(e.cond, env, bufs, mask, fdt)
        t, f = _eval(e.t, env, bufs, mask & c, fdt), _eval(e.f, env, bufs, mask & ~c, fdt)
        return np.where(c, t, f)
    if isinstance(e, te.Load):
        arr = bufs[e.buffer]
        idx = np.broadcast_arrays(*(np.asarray(_eval(i, env, bufs, mask, fdt)) for i in e.indices))
        for d, (i, n) in enumerate(zip(idx, arr.shape)):
            bad = ((i < 0) | (i >= n)) & mask
            assert not np.any(bad), f"out-of-bounds load of {e.buffer} along dim {d}"
        return arr[tuple(np.clip(i, 0, n - 1) for i, n in zip(idx, arr.shape))]
    raise TypeError(e)


def evaluate(outputs, feeds, fdt=np.float64, sequential=False):
    """Evaluate `outputs` given placeholder arrays by name; `sequential` accumulates reductions one term at a time."""
    bufs = {name: np.asarray(a, fdt) for name, a in feeds.items()}

    def run(t):
        if t.name in bufs:
            return
        assert isinstance(t.op, te.ComputeOp), f"no value fed for placeholder {t.name}"
        for i in t.op.inputs:
            run(i)
        body = t.op.body
        red = body.axes if isinstance(body, te.Reduce) else ()
        axes = tuple(t.op.axes) + tuple(red)
        env = {v.name: np.arange(v.extent).reshape([-1 if d == j else 1 for j in range(len(axes))])
               for d, v in enumerate(axes)}  # fmt: skip
        full = tuple(v.extent for v in axes)
        val = np.broadcast_to(_eval(body.body if red else body, env, bufs, np.True_, fdt), full)
        if red:
            flat = val.reshape(t.shape + (-1,))
            if sequential:  # the accumulation order of a naive loop nest, every partial sum rounded to fdt
                acc = np.full(t.shape, _INIT[body.op], fdt)
                for r in range(flat.shape[-1]):
                    acc = {"sum": np.add, "max": np.maximum, "min": np.minimum}[body.op](acc, flat[..., r]).astype(fdt)
                val = acc
            else:
                val = {"sum": np.sum, "max": np.max, "min": np.min}[body.op](flat, axis=-1)
        bufs[t.name] = np.asarray(val, fdt)

    for o in outputs:
        run(o)
    return [bufs[o.name] for o in outputs]


def _case_run(name, fdt=np.float64, sequential=False, seed=0):
    case = ops.KERNELS[name]
    inputs, outputs = case.build()
    arrays = case.random_inputs(np.random.default_rng(seed))
    got = evaluate(outputs, {t.name: a for t, a in zip(inputs, arrays)}, fdt, sequential)
    return case, arrays, got


def _stages(t):
    return [x.name for x in topological_tensors([t]) if isinstance(x.op, te.ComputeOp)]


# ---------------------------------------------------------------------------------------------- the KERNELS table

EXPECTED_OUT_SHAPES = {
    "matmul": (32, 40),
    "batch_matmul": (3, 16, 24),
    "conv2d": (1, 16, 8, 8),
    "conv2d_dilated": (1, 8, 14, 14),
    "conv2d_grouped": (1, 8, 12, 12),
    "conv2d_depthwise": (1, 16, 16, 16),
    "conv2d_depthwise_nchwc": (1, 2, 8, 8, 8),
    "matmul_packed": (3, 10, 48),
    "matmul_int8": (20, 40),
    "conv2d_blocked_padded": (1, 24, 5, 5),
    "depthwise_pointwise_nchwc": (1, 2, 9, 9, 8),
    "conv2d_bias_relu": (1, 12, 12, 12),
    "softmax": (16, 50),
    "layer_norm": (16, 48),
    "max_pool2d": (1, 8, 8, 8),
    "avg_pool2d": (1, 8, 7, 7),
    "row_sum": (64,),
}


def test_kernels_table_keys():
    assert set(ops.KERNELS) == set(EXPECTED_OUT_SHAPES)


@pytest.mark.parametrize("name", sorted(EXPECTED_OUT_SHAPES))
def test_case_shapes_and_size(name):
    case = ops.KERNELS[name]
    inputs, outputs = case.build()
    assert [t.shape for t in inputs] == [s for _, s in case.inputs]
    assert [o.shape for o in outputs] == [EXPECTED_OUT_SHAPES[name]]
    assert all(o.dtype == "float32" for o in outputs)
    ref = case.reference(*case.random_inputs(np.random.default_rng(0)))
    assert [r.shape for r in ref] == [o.shape for o in outputs] and all(r.dtype == np.float64 for r in ref)
    # small enough for a naive-loop interpreter: output elements x reduction length per stage
    for stage in _stage_tensors(outputs[0]):
        body = stage.op.body
        red = math.prod(a.extent for a in body.axes) if isinstance(body, te.Reduce) else 1
        assert math.prod(stage.shape) * red <= 200_000, stage.name


def _stage_tensors(t):
    names = set(_stages(t))
    out, stack = [], [t]
    while stack:
        x = stack.pop()
        if x.name in names and all(x is not y for y in out):
            out.append(x)
            stack.extend(x.op.inputs)
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED_OUT_SHAPES))
def test_definition_matches_reference(name):
    case, arrays, got = _case_run(name)
    for g, r in zip(got, case.reference(*arrays)):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", sorted(EXPECTED_OUT_SHAPES))
def test_tolerance_admits_sequential_float32(name):
    # the tolerance must pass a float32 evaluation in the worst common order (one running sum per output)
    for seed in range(3):
        case, arrays, got = _case_run(name, np.float32, sequential=True, seed=seed)
        for g, r in zip(got, case.reference(*arrays)):
            assert g.dtype == np.float32
            np.testing.assert_allclose(g, r, rtol=case.rtol, atol=case.atol)


def test_build_at_other_shapes():
    inputs, (out,) = ops.KERNELS["matmul"].build((5, 7), (7, 3))
    assert out.shape == (5, 3) and [t.name for t in inputs] == ["A", "B"]
    with pytest.raises(InvalidExpr, match="takes 2 input shapes"):
        ops.KERNELS["matmul"].build((5, 7))


# ------------------------------------------------------------------------------------------ references, independently

rng = np.random.default_rng(1)


def _arrays(name):
    return ops.KERNELS[name].random_inputs(rng)


def _conv_windows(x, w, stride, pad, dilation, groups):
    # im2col by sliding windows, a formulation independent of the reference's per-tap slicing
    (sh, sw), (dh, dw) = stride, dilation
    F, Cg, KH, KW = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    win = sliding_window_view(xp, ((KH - 1) * dh + 1, (KW - 1) * dw + 1), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    outs = [
        np.einsum("ncyxij,fcij->nfyx", win[:, g * Cg : (g + 1) * Cg], w[g * F // groups : (g + 1) * F // groups])
        for g in range(groups)
    ]
    return np.concatenate(outs, axis=1)


def test_ref_matmul():
    a, b = _arrays("matmul")
    np.testing.assert_allclose(ops.KERNELS["matmul"].reference(a, b)[0], a.astype(float) @ b, rtol=1e-12)
    a, b = _arrays("batch_matmul")
    want = np.stack([a[i].astype(float) @ b[i] for i in range(a.shape[0])])
    np.testing.assert_allclose(ops.KERNELS["batch_matmul"].reference(a, b)[0], want, rtol=1e-12)


@pytest.mark.parametrize(
    "name,stride,pad,dilation,groups",
    [
        ("conv2d", (2, 2), (1, 1), (1, 1), 1),
        ("conv2d_dilated", (1, 1), (2, 2), (2, 2), 1),
        ("conv2d_grouped", (1, 1), (1, 1), (1, 1), 2),
        ("conv2d_depthwise", (1, 1), (1, 1), (1, 1), 8),
    ],
)
def test_ref_conv(name, stride, pad, dilation, groups):
    x, w = _arrays(name)
    want = _conv_windows(x, w, stride, pad, dilation, groups)
    np.testing.assert_allclose(ops.KERNELS[name].reference(x, w)[0], want, rtol=1e-10, atol=1e-10)


def test_ref_conv_one_output_by_hand():
    x, w = _arrays("conv2d")
    out = ops.KERNELS["conv2d"].reference(x, w)[0]
    # output (0, 3, 0, 2) with stride 2, pad 1: rows -1..1 (row -1 is padding), cols 3..5
    taps = [(c, r, s) for c in range(8) for r in range(0, 2) for s in range(3, 6)]
    want = sum(float(x[0, c, r, s]) * float(w[3, c, r + 1, s - 3]) for c, r, s in taps)
    assert out[0, 3, 0, 2] == pytest.approx(want, rel=1e-12)


def test_ref_conv_bias_relu():
    x, w, b = _arrays("conv2d_bias_relu")
    want = np.maximum(_conv_windows(x, w, (1, 1), (1, 1), (1, 1), 1) + b.reshape(1, -1, 1, 1), 0)
    got = ops.KERNELS["conv2d_bias_relu"].reference(x, w, b)[0]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    assert (got == 0).any() and (got > 0).any()


def test_ref_softmax():
    (x,) = _arrays("softmax")
    got = ops.KERNELS["softmax"].reference(x)[0]
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-12)
    # log-softmax through log-sum-exp, computed from scratch
    lse = np.log(np.exp(x.astype(float)).sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(np.log(got), x - lse, rtol=1e-10, atol=1e-10)
    # shift invariance: the max-subtraction must not change the result
    np.testing.assert_allclose(ops.KERNELS["softmax"].reference(x.astype(float) + 50)[0], got, rtol=1e-10)


def test_ref_layer_norm():
    x, g, b = _arrays("layer_norm")
    plain = ops.KERNELS["layer_norm"].reference(x, np.ones_like(g), np.zeros_like(b))[0]
    np.testing.assert_allclose(plain.mean(axis=-1), 0, atol=1e-12)
    np.testing.assert_allclose(plain.var(axis=-1) * (1 + 1e-5 / x.astype(float).var(axis=-1)), 1, rtol=1e-10)
    np.testing.assert_allclose(ops.KERNELS["layer_norm"].reference(x, g, b)[0], plain * g + b, rtol=1e-12, atol=1e-12)


def test_ref_pools():
    (x,) = _arrays("max_pool2d")
    win = sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf), (3, 3), (2, 3))
    np.testing.assert_array_equal(ops.KERNELS["max_pool2d"].reference(x)[0], win[:, :, ::2, ::2].max(axis=(-2, -1)))
    (x,) = _arrays("avg_pool2d")
    win = sliding_window_view(np.pad(x.astype(float), ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), (2, 3))
    want = win[:, :, ::2, ::2].mean(axis=(-2, -1))
    np.testing.assert_allclose(ops.KERNELS["avg_pool2d"].reference(x)[0], want, rtol=1e-12)


def test_ref_row_sum():
    (x,) = _arrays("row_sum")
    want = [math.fsum(map(float, row)) for row in x]
    np.testing.assert_allclose(ops.KERNELS["row_sum"].reference(x)[0], want, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------- op definitions


def ph(*shape, name="x", dtype="float32"):
    return te.placeholder(shape, dtype, name)


def test_matmul_family_shapes():
    assert ops.matmul(ph(4, 5, name="A"), ph(5, 6, name="B")).shape == (4, 6)
    assert ops.batch_matmul(ph(2, 4, 5, name="A"), ph(2, 5, 6, name="B")).shape == (2, 4, 6)
    d = ops.dense(ph(4, 5), ph(6, 5, name="W"))
    assert d.shape == (4, 6) and d.op.tag == "dense"
    db = ops.dense(ph(4, 5), ph(6, 5, name="W"), ph(6, name="b"))
    assert db.shape == (4, 6) and _stages(db) == ["dense", "dense_bias"]


def test_matmul_dtype_follows_inputs():
    assert ops.matmul(ph(4, 5, name="A", dtype="float64"), ph(5, 6, name="B", dtype="float64")).dtype == "float64"


def test_dense_with_bias_numerics():
    x, w, b = (rng.standard_normal(s) for s in ((4, 5), (6, 5), (6,)))
    X, W, B = ph(4, 5, name="X"), ph(6, 5, name="W"), ph(6, name="b")
    (got,) = evaluate([ops.dense(X, W, B)], {"X": x, "W": w, "b": b})
    np.testing.assert_allclose(got, x @ w.T + b, rtol=1e-12)


def test_pad_shape_lazy_select_and_value():
    x = ph(2, 3)
    p = ops.pad(x, (1, 0), (2, 3), value=-1.0)
    assert p.shape == (5, 6) and p.op.tag.startswith("injective")
    assert isinstance(p.op.body, te.Select) and isinstance(p.op.body.t, te.Load)
    arr = rng.standard_normal((2, 3))
    (got,) = evaluate([p], {"x": arr})
    np.testing.assert_array_equal(got, np.pad(arr, ((1, 2), (0, 3)), constant_values=-1.0))


def test_pad_tests_only_padded_sides():
    p = ops.pad(ph(2, 3), (0, 0), (0, 2))
    cond = p.op.body.cond
    assert isinstance(cond, te.Binary) and cond.op == "lt"  # one comparison: column < 3
    assert isinstance(ops.pad(ph(2, 3), (0, 0), (0, 0)).op.body, te.Load)


def test_conv2d_shapes_and_stages():
    data, w = ph(1, 3, 10, 12, name="data"), ph(4, 3, 3, 3, name="w")
    assert ops.conv2d_nchw(data, w).shape == (1, 4, 8, 10)
    c = ops.conv2d_nchw(data, w, stride=2, padding=1)
    assert c.shape == (1, 4, 5, 6) and _stages(c) == ["conv2d_pad", "conv2d"]
    assert _stages(ops.conv2d_nchw(data, w)) == ["conv2d"]  # no padding, no pad stage
    assert ops.conv2d_nchw(data, w, stride=(1, 2), padding=(0, 1), dilation=(2, 1)).shape == (1, 4, 6, 6)
    # ONNX order (top, left, bottom, right)
    assert ops.conv2d_nchw(data, w, padding=(0, 0, 1, 2)).shape == (1, 4, 9, 12)


def test_conv2d_asymmetric_padding_numerics():
    x, w = rng.standard_normal((1, 2, 5, 6)), rng.standard_normal((3, 2, 3, 3))
    out = ops.conv2d_nchw(ph(1, 2, 5, 6, name="d"), ph(3, 2, 3, 3, name="w"), padding=(1, 0, 0, 2))
    (got,) = evaluate([out], {"d": x, "w": w})
    xp = np.pad(x, ((0, 0), (0, 0), (1, 0), (0, 2)))
    np.testing.assert_allclose(got, _conv_windows(xp, w, (1, 1), (0, 0), (1, 1), 1), rtol=1e-12, atol=1e-12)


def test_depthwise_has_no_channel_reduction():
    c = ops.conv2d_nchw(ph(1, 4, 6, 6, name="d"), ph(8, 1, 3, 3, name="w"), padding=1, groups=4)
    assert c.op.tag == "depthwise_conv2d_nchw"
    assert [a.name for a in c.op.body.axes] == ["ry", "rx"]
    g = ops.conv2d_nchw(ph(1, 4, 6, 6, name="d"), ph(8, 2, 3, 3, name="w"), groups=2)
    assert g.op.tag == "group_conv2d_nchw" and [a.name for a in g.op.body.axes] == ["rc", "ry", "rx"]


def test_conv2d_bias_relu_stages():
    out = ops.conv2d_bias_relu(ph(1, 2, 5, 5, name="d"), ph(3, 2, 3, 3, name="w"), ph(3, name="b"), padding=1)
    assert out.shape == (1, 3, 5, 5) and _stages(out) == ["conv2d_pad", "conv2d", "conv2d_bias", "conv2d_relu"]
    assert out.op.tag == "elemwise"


def test_elementwise_ops():
    x = ph(2, 3, 4, 5)
    assert ops.relu(x).shape == x.shape and ops.relu(x).dtype == "float32"
    assert ops.bias_add_nchw(x, ph(3, name="b")).shape == x.shape
    assert ops.relu(ph(7, dtype="int32")).dtype == "int32"


def test_softmax_stages_and_axis():
    s = ops.softmax(ph(4, 5, 6), axis=1)
    assert s.shape == (4, 5, 6) and _stages(s) == ["softmax_max", "softmax_exp", "softmax_sum", "softmax"]
    arr = rng.standard_normal((4, 5, 6))
    (got,) = evaluate([s], {"x": arr})
    e = np.exp(arr - arr.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-12)


def test_layer_norm_stages_and_multi_axis():
    ln = ops.layer_norm(ph(3, 4, 5), ph(4, 5, name="g"), ph(4, 5, name="b"), axis=1)
    assert ln.shape == (3, 4, 5) and _stages(ln) == ["layer_norm_mean", "layer_norm_var", "layer_norm"]
    x, g, b = rng.standard_normal((3, 4, 5)), rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    (got,) = evaluate([ln], {"x": x, "g": g, "b": b})
    m, v = x.mean(axis=(1, 2), keepdims=True), x.var(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(got, (x - m) / np.sqrt(v + 1e-5) * g + b, rtol=1e-10, atol=1e-12)


def test_pool_shapes():
    x = ph(2, 3, 9, 10)
    assert ops.max_pool2d(x, 3).shape == (2, 3, 7, 8)
    assert ops.max_pool2d(x, (2, 3), stride=2, padding=1).shape == (2, 3, 5, 5)
    a = ops.avg_pool2d(x, 2, stride=2)
    assert a.shape == (2, 3, 4, 5) and _stages(a) == ["avg_pool2d_sum", "avg_pool2d"]


def test_avg_pool_exclude_pad_numerics():
    arr = rng.standard_normal((1, 2, 6, 7))
    out = ops.avg_pool2d(ph(1, 2, 6, 7), 3, stride=2, padding=(1, 1, 1, 0), count_include_pad=False)
    (got,) = evaluate([out], {"x": arr})
    xp = np.pad(arr, ((0, 0), (0, 0), (1, 1), (1, 0)))
    ones = np.pad(np.ones_like(arr), ((0, 0), (0, 0), (1, 1), (1, 0)))
    s = sliding_window_view(xp, (3, 3), (2, 3))[:, :, ::2, ::2].sum(axis=(-2, -1))
    n = sliding_window_view(ones, (3, 3), (2, 3))[:, :, ::2, ::2].sum(axis=(-2, -1))
    np.testing.assert_allclose(got, s / n, rtol=1e-12)
    assert (n < 9).any()


def test_max_pool_int_padding_is_lowest():
    arr = -np.arange(2 * 5 * 5).reshape(1, 2, 5, 5)
    (got,) = evaluate([ops.max_pool2d(ph(1, 2, 5, 5, dtype="int32"), 2, padding=1)], {"x": arr})
    assert got.shape == (1, 2, 6, 6) and got.max() == 0 and got.min() == arr.min()


def test_row_sum():
    r = ops.row_sum(ph(3, 8))
    assert r.shape == (3,) and r.op.tag == "comm_reduce"


# ---------------------------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: ops.matmul(ph(4, 5), ph(6, 7)), r"A's columns \(5\) must equal B's rows \(6\)"),
        (lambda: ops.matmul(ph(4, 5, 1), ph(5, 7)), "must be 2-D"),
        (lambda: ops.matmul(ph(4, 5), ph(5, 7, dtype="float64")), "one dtype"),
        (lambda: ops.batch_matmul(ph(2, 4, 5), ph(3, 5, 6)), r"batches must match \(2 vs 3\)"),
        (lambda: ops.dense(ph(4, 5), ph(6, 4)), "both must have 5 columns"),
        (lambda: ops.dense(ph(4, 5), ph(6, 5), ph(5, name="b")), r"bias b must have shape \(6,\)"),
        (lambda: ops.pad(ph(2, 3), (1,), (1,)), "one amount per dimension"),
        (lambda: ops.pad(ph(2, 3), (1, -1), (0, 0)), "ints >= 0"),
        (lambda: ops.conv2d_nchw(ph(1, 6, 8, 8), ph(4, 3, 3, 3), groups=4), "groups=4 must be a positive int"),
        (lambda: ops.conv2d_nchw(ph(1, 6, 8, 8), ph(4, 2, 3, 3), groups=2), "so it needs 3"),
        (lambda: ops.conv2d_nchw(ph(1, 3, 4, 8), ph(4, 3, 7, 3), padding=1), r"height extent 7 .* padded input's 6"),
        (lambda: ops.conv2d_nchw(ph(1, 3, 8, 8), ph(4, 3, 3, 3), dilation=4), "dilation 4"),
        (lambda: ops.conv2d_nchw(ph(1, 3, 8, 8), ph(4, 3, 3, 3), stride=0), "stride must be"),
        (lambda: ops.conv2d_nchw(ph(1, 3, 8, 8), ph(4, 3, 3, 3), padding=(1, 2, 3)), "padding must be"),
        (lambda: ops.conv2d_nchw(ph(3, 8, 8), ph(4, 3, 3, 3)), "data x must be 4-D"),
        (lambda: ops.bias_add_nchw(ph(1, 3, 4, 4), ph(4, name="b")), r"must have shape \(3,\)"),
        (lambda: ops.softmax(ph(3, 4), axis=2), "axis 2 is out of range"),
        (lambda: ops.layer_norm(ph(3, 4), ph(3, name="g"), ph(4, name="b")), r"g must have shape \(4,\)"),
        (lambda: ops.max_pool2d(ph(1, 1, 2, 2), 3), "larger than the padded input"),
        (lambda: ops.max_pool2d(ph(1, 1, 8, 8), 3, padding=3), "smaller than the kernel"),
        (lambda: ops.avg_pool2d(ph(1, 8, 8), 2), "must be 4-D"),
        (lambda: ops.row_sum(ph(3, 4, 5)), "must be 2-D"),
    ],
)
def test_argument_errors(make, message):
    with pytest.raises(InvalidExpr, match=message):
        make()
