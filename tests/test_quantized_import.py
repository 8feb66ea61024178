"""Quantized ONNX models (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, ConvInteger,
QLinearMatMul, QLinearConv) imported, compiled with the default schedules and run, against onnxruntime and onnx's
reference evaluator: integer outputs bit-exact, on random data plus edge values (ties at .5, saturation bounds,
negative zero points). The models onnxruntime's own quantizer writes (quantize_static QDQ per-channel, and
quantize_dynamic) compile and agree with onnxruntime's int8 run within one step of the output scale."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from compiler.artifact.build import run_in_process
from compiler.base.errors import InvalidModel, UnsupportedOp
from compiler.model.onnx_import import load
from compiler.tensor.tasks import plan_tasks

RNG = np.random.default_rng(52)
ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int8): TensorProto.INT8,
        np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int32): TensorProto.INT32}  # fmt: skip


def one_node(op: str, inputs: dict, consts: dict, out_dtype, opset: int = 21, n_out: int = 1, **attrs):
    """A model of one `op` node: `inputs` (name -> array) are graph inputs, `consts` initializers (None: omitted)."""
    names = [n if a is not None else "" for n, a in {**inputs, **consts}.items()]
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info(n, ELEM[a.dtype], a.shape) for n, a in inputs.items()],
        [helper.make_tensor_value_info(o, ELEM[np.dtype(d)], None) for o, d in zip(outs, out_dtype)],
        [numpy_helper.from_array(a, n) for n, a in consts.items() if a is not None],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def tilefarm(model, feeds: dict) -> list[np.ndarray]:
    got = run_in_process(load(model), feeds)
    return [got[o.name] for o in model.graph.output]


def onnxruntime(model, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check_exact(model, feeds: dict, reference: bool = True) -> list[np.ndarray]:
    """tilefarm's outputs equal onnxruntime's (and the reference evaluator's) bit for bit, dtype included."""
    got = tilefarm(model, feeds)
    oracles = [onnxruntime(model, feeds)] + ([ReferenceEvaluator(model).run(None, feeds)] if reference else [])
    for want in oracles:
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
    return got


def u8(*shape: int) -> np.ndarray:
    return RNG.integers(0, 256, shape).astype(np.uint8)


def s8(*shape: int) -> np.ndarray:
    return RNG.integers(-128, 128, shape).astype(np.int8)


def f32(*values) -> np.ndarray:
    return np.array(values, np.float32)


# ---------------------------------------------------------------------------------------------- Q / DQ


def test_quantize_linear_ties_saturation_and_negative_zero_point():
    # scale 0.5: x / scale is exact, so k + 0.5 are true ties (2.5 -> 2, 3.5 -> 4, -2.5 -> -2); far values saturate
    edges = f32(1.25, 1.75, -1.25, -1.75, 0.25, -0.25, 0.75, 1e6, -1e6, 63.0, 64.5, -64.5, -0.0, 0.0)
    x = np.concatenate([edges, RNG.standard_normal(50).astype(np.float32) * 40])[None, :]
    for zp in (np.array(-3, np.int8), np.array(7, np.uint8), np.array(-128, np.int8), np.array(255, np.uint8)):
        model = one_node("QuantizeLinear", {"x": x}, {"scale": f32(0.5), "zp": zp}, [zp.dtype])
        (y,) = check_exact(model, {"x": x})
        lo, hi = np.iinfo(zp.dtype).min, np.iinfo(zp.dtype).max
        assert y[0, 0] == np.clip(2 + int(zp), lo, hi) and y[0, 1] == np.clip(4 + int(zp), lo, hi)  # ties to even
        assert y.min() == np.iinfo(zp.dtype).min and y.max() == np.iinfo(zp.dtype).max


def test_quantize_linear_per_axis_and_default_zero_point():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32) * 10
    scale, zp = f32(0.05, 0.2, 1.0 / 3.0), np.array([-5, 0, 100], np.int8)
    check_exact(one_node("QuantizeLinear", {"x": x}, {"scale": scale, "zp": zp}, [np.int8], axis=1), {"x": x})
    scale_last = (np.abs(RNG.standard_normal(5)) + 0.01).astype(np.float32)
    model = one_node("QuantizeLinear", {"x": x}, {"scale": scale_last}, [np.uint8], axis=-1)
    check_exact(model, {"x": x})  # no zero point: uint8, zero point 0


def test_dequantize_linear_per_tensor_per_axis_and_int32():
    x8 = s8(3, 4, 2)
    model = one_node("DequantizeLinear", {"x": x8}, {"s": f32(0.1, 0.02, 3.5, 1e-3), "z": s8(4)}, [np.float32], axis=1)
    check_exact(model, {"x": x8})
    xu = u8(6, 7)
    check_exact(one_node("DequantizeLinear", {"x": xu}, {"s": f32(0.37), "z": np.array(255, np.uint8)}, [np.float32]),
                {"x": xu})  # fmt: skip
    x32 = RNG.integers(-(2**20), 2**20, (5, 6)).astype(np.int32)
    check_exact(one_node("DequantizeLinear", {"x": x32}, {"s": f32(1e-4)}, [np.float32]), {"x": x32})


@pytest.mark.parametrize("kind", ["mixed", "positive", "negative", "zeros"])
def test_dynamic_quantize_linear(kind):
    x = RNG.standard_normal((4, 33)).astype(np.float32) * 3
    x = {"mixed": x, "positive": np.abs(x) + 1, "negative": -np.abs(x) - 1, "zeros": np.zeros_like(x)}[kind]
    model = one_node("DynamicQuantizeLinear", {"x": x}, {}, [np.uint8, np.float32, np.uint8], opset=11, n_out=3)
    # the reference divides by a zero scale for a constant input; onnxruntime (and tilefarm) use scale 1 there
    y, scale, zp = check_exact(model, {"x": x}, reference=kind != "zeros")
    assert scale.shape == () and zp.shape == () and (kind != "zeros" or (scale == 1 and zp == 0 and not y.any()))


# ---------------------------------------------------------------------------------------------- integer products


def test_matmul_integer_zero_points_per_tensor_and_per_column():
    a, b = u8(2, 5, 37), s8(37, 6)
    consts = {"b": b, "az": np.array(131, np.uint8), "bz": s8(6)}
    model = one_node("MatMulInteger", {"a": a}, consts, [np.int32], opset=10)
    check_exact(model, {"a": a})
    a2, b2 = s8(7, 9), s8(9, 4)
    model = one_node("MatMulInteger", {"a": a2, "b": b2}, {"az": np.array(-128, np.int8)}, [np.int32], opset=10)
    check_exact(model, {"a": a2, "b": b2})
    # the product is kept as an int32 MatMulInteger: the float MatMul weight packing does not touch it
    assert [n.op for n in plan_tasks(load(model))[2].nodes] == ["MatMulInteger"]


def test_matmul_integer_per_row_a_zero_point():
    # the spec's per-row a_zero_point (onnxruntime takes one value; onnx's reference broadcasts it along K): numpy
    a, b, az, bz = u8(5, 9), s8(9, 3), u8(5), s8(3)
    model = one_node("MatMulInteger", {"a": a}, {"b": b, "az": az, "bz": bz}, [np.int32], opset=10)
    want = (a.astype(np.int32) - az[:, None].astype(np.int32)) @ (b.astype(np.int32) - bz.astype(np.int32))
    np.testing.assert_array_equal(tilefarm(model, {"a": a})[0], want)


def test_conv_integer_group_pads_strides_dilations():
    x, w = u8(1, 4, 9, 8), s8(6, 2, 3, 3)
    consts = {"w": w, "xz": np.array(77, np.uint8), "wz": np.array(-4, np.int8)}
    model = one_node("ConvInteger", {"x": x}, consts, [np.int32], opset=10, group=2, pads=[1, 2, 0, 1],
                     strides=[2, 1], dilations=[1, 2])  # fmt: skip
    check_exact(model, {"x": x})
    assert "Conv" not in [n.op for n in plan_tasks(load(model))[2].nodes]  # no float conv rewrite
    # a per-output-channel weight zero point (onnxruntime takes only one value here: the reference decides)
    consts = {"w": s8(5, 4, 1, 3), "xz": np.array(3, np.uint8), "wz": s8(5)}
    model = one_node("ConvInteger", {"x": x}, consts, [np.int32], opset=10, auto_pad="SAME_UPPER")
    got = tilefarm(model, {"x": x})
    np.testing.assert_array_equal(got[0], ReferenceEvaluator(model).run(None, {"x": x})[0])


def _qlinear_matmul(a, b, scales, zps, b_scale):
    a_s, y_s = scales
    consts = {"a_s": f32(a_s), "a_z": zps[0], "b": b, "b_s": b_scale, "b_z": zps[1], "y_s": f32(y_s), "y_z": zps[2]}
    return one_node("QLinearMatMul", {"a": a}, consts, [zps[2].dtype])


def test_qlinear_matmul_requantization_ties_and_saturation():
    # multiplier 0.5 * 0.25 / 0.25 = 0.5: every odd accumulator is a tie (the output zero point is even, where
    # onnxruntime and onnx's reference agree on ties: see test_qlinear_conv_per_channel_bias_and_padding)
    a, b = u8(3, 8, 16), u8(16, 5)
    zps = (np.array(128, np.uint8), np.array(3, np.uint8), np.array(100, np.uint8))
    (y,) = check_exact(_qlinear_matmul(a, b, (0.5, 0.25), zps, f32(0.25)), {"a": a})
    assert y.min() == 0 and y.max() == 255
    a8, b8 = s8(6, 20), s8(20, 7)
    zps8 = (np.array(-7, np.int8), np.array(0, np.int8), np.array(-20, np.int8))
    check_exact(_qlinear_matmul(a8, b8, (0.02, 0.3), zps8, f32(0.011)), {"a": a8})


def test_qlinear_matmul_per_column_weight_scale():
    a, b = u8(4, 12), s8(12, 6)
    zps = (np.array(90, np.uint8), np.zeros(6, np.int8), np.array(3, np.uint8))
    b_scale = (np.abs(RNG.standard_normal(6)) * 0.01 + 1e-3).astype(np.float32)
    check_exact(_qlinear_matmul(a, b, (0.05, 0.07), zps, b_scale), {"a": a})


def test_qlinear_conv_per_channel_bias_and_padding():
    x, w = u8(1, 3, 10, 9), s8(8, 3, 3, 3)
    bias = RNG.integers(-5000, 5000, 8).astype(np.int32)
    w_s = (np.abs(RNG.standard_normal(8)) * 0.005 + 1e-3).astype(np.float32)
    consts = {"x_s": f32(0.03), "x_z": np.array(120, np.uint8), "w": w, "w_s": w_s, "w_z": np.zeros(8, np.int8),
              "y_s": f32(0.08), "y_z": np.array(110, np.uint8), "b": bias}  # fmt: skip
    model = one_node("QLinearConv", {"x": x}, consts, [np.uint8], opset=10, pads=[1, 1, 1, 1], strides=[2, 1])
    check_exact(model, {"x": x})
    # int8 activations, grouped (depthwise), one weight scale, ties (multiplier 0.5) and an odd output zero point:
    # onnxruntime rounds acc * multiplier, then adds the zero point; onnx's reference adds it before rounding, so a
    # tie lands on the other integer there. tilefarm follows onnxruntime
    x8, w8 = s8(1, 4, 6, 6), s8(4, 1, 3, 3)
    consts = {"x_s": f32(0.5), "x_z": np.array(-3, np.int8), "w": w8, "w_s": f32(0.25), "w_z": np.array(0, np.int8),
              "y_s": f32(0.25), "y_z": np.array(5, np.int8)}  # fmt: skip
    check_exact(one_node("QLinearConv", {"x": x8}, consts, [np.int8], opset=10, group=4), {"x": x8}, reference=False)


def test_blocked_quantization_is_refused_by_name():
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    model = one_node("QuantizeLinear", {"x": x}, {"s": np.ones((4, 3), np.float32)}, [np.uint8], axis=1, block_size=2)
    with pytest.raises(UnsupportedOp, match="block_size=2"):
        load(model)


def test_bad_quantization_parameters_are_named():
    x = RNG.standard_normal((2, 4, 3)).astype(np.float32)
    model = one_node("QuantizeLinear", {"x": x}, {"s": f32(0.1, 0.2, 0.3), "z": s8(3)}, [np.int8], axis=1)
    with pytest.raises(InvalidModel, match=r"scale has shape \[3\].*along axis 1 .* needs 4 values"):
        load(model)
    a, b = u8(2, 3), u8(3, 4)
    consts = {"a_s": f32(0.1, 0.2), "a_z": np.array(1, np.uint8), "b": b, "b_s": f32(0.1), "b_z": np.array(2, np.uint8),
              "y_s": f32(0.3), "y_z": np.array(3, np.uint8)}  # fmt: skip
    with pytest.raises(UnsupportedOp, match="input scale has shape \\[2\\]"):
        load(one_node("QLinearMatMul", {"a": a}, consts, [np.uint8]))


def test_contrib_quantized_ops_are_reported_by_name():
    # com.microsoft ops tilefarm does not compile (QAttention, QLinearReduceMean, ...) are named with their domain,
    # all at once
    nodes = [helper.make_node(op, ["x", "s", "z", "x", "s", "z", "s", "z"], [f"{op}_y"], domain="com.microsoft")
             for op in ("QLinearSoftmax", "QLinearReduceMean")]  # fmt: skip
    graph = helper.make_graph(
        nodes + [helper.make_node("Add", ["QLinearSoftmax_y", "QLinearReduceMean_y"], ["y"])],
        "contrib",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 3])],
        [numpy_helper.from_array(f32(0.1), "s"), numpy_helper.from_array(np.array(3, np.uint8), "z")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    with pytest.raises(UnsupportedOp, match="com.microsoft.QLinearSoftmax.*com.microsoft.QLinearReduceMean"):
        load(helper.make_model(graph, opset_imports=opsets, ir_version=9))


# ---------------------------------------------------------------------------------------------- quantizer output


class _Calibration:
    """onnxruntime's CalibrationDataReader over a few synthetic inputs."""

    def __init__(self, name: str, arrays: list[np.ndarray]):
        self.feeds = iter([{name: a} for a in arrays])

    def get_next(self):
        return next(self.feeds, None)


def _within_one_step(got: np.ndarray, want: np.ndarray, step: float) -> None:
    close = np.abs(got.astype(np.float64) - want) <= step * (1 + 1e-6)
    assert close.mean() >= 0.999, f"{(~close).sum()} of {close.size} elements differ by more than one step {step}"


def _float_model(nodes, inits, x_shape, y_shape):
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_quantize_static_qdq_per_channel_conv_net(tmp_path):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1),
    ]
    inits = {"w1": RNG.standard_normal((8, 3, 3, 3)) * 0.3, "b1": RNG.standard_normal(8) * 0.1,
             "w2": RNG.standard_normal((16, 8, 3, 3)) * 0.2, "b2": RNG.standard_normal(16) * 0.1,
             "fc": RNG.standard_normal((10, 16)) * 0.3, "fb": RNG.standard_normal(10) * 0.1}  # fmt: skip
    float_path, int8_path = tmp_path / "net.onnx", tmp_path / "net.int8.onnx"
    float_path.write_bytes(_float_model(nodes, inits, [1, 3, 16, 16], [1, 10]).SerializeToString())
    calib = [RNG.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(8)]
    quantize_static(str(float_path), str(int8_path), _Calibration("x", calib), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    model = __import__("onnx").load(str(int8_path))
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    y_scale = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == _output_scale(model))
    for x in [RNG.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(3)]:
        (got,), (want,) = tilefarm(model, {"x": x}), onnxruntime(model, {"x": x})
        _within_one_step(got, want, float(y_scale))


def test_quantize_static_qoperator_conv_net_is_exact(tmp_path):
    # QOperator form: QuantizeLinear -> QLinearConv -> QLinearConv -> DequantizeLinear; every step is integer or
    # the same float32 arithmetic as onnxruntime's, so the outputs are equal
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=2),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], strides=[2, 2]),
    ]
    inits = {"w1": RNG.standard_normal((8, 2, 3, 3)) * 0.3, "b1": RNG.standard_normal(8) * 0.1,
             "w2": RNG.standard_normal((6, 8, 3, 3)) * 0.2, "b2": RNG.standard_normal(6) * 0.1}  # fmt: skip
    float_path, int8_path = tmp_path / "net.onnx", tmp_path / "net.qop.onnx"
    float_path.write_bytes(_float_model(nodes, inits, [1, 4, 12, 12], [1, 6, 6, 6]).SerializeToString())
    calib = [RNG.standard_normal((1, 4, 12, 12)).astype(np.float32) for _ in range(8)]
    quantize_static(str(float_path), str(int8_path), _Calibration("x", calib), quant_format=QuantFormat.QOperator,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    model = __import__("onnx").load(str(int8_path))
    assert [n.op_type for n in model.graph.node].count("QLinearConv") == 2
    for x in [RNG.standard_normal((1, 4, 12, 12)).astype(np.float32) for _ in range(2)]:
        np.testing.assert_array_equal(tilefarm(model, {"x": x})[0], onnxruntime(model, {"x": x})[0])


def _output_scale(model) -> str:
    """The scale initializer of the DequantizeLinear that gives the graph's output."""
    out = model.graph.output[0].name
    return next(n.input[1] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == out)


def test_quantize_dynamic_matmul_net(tmp_path):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    inits = {"w1": RNG.standard_normal((32, 48)) * 0.2, "w2": RNG.standard_normal((48, 16)) * 0.2}
    float_path, int8_path = tmp_path / "mlp.onnx", tmp_path / "mlp.int8.onnx"
    float_path.write_bytes(_float_model(nodes, inits, [4, 32], [4, 16]).SerializeToString())
    quantize_dynamic(str(float_path), str(int8_path), weight_type=QuantType.QInt8)
    model = __import__("onnx").load(str(int8_path))
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in model.graph.node}
    for x in [RNG.standard_normal((4, 32)).astype(np.float32) for _ in range(3)]:
        (got,), (want,) = tilefarm(model, {"x": x}), onnxruntime(model, {"x": x})
        # the float output has no quantization step of its own: the int32 products are exact, so only float32
        # rounding in the scale products separates the two
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- com.microsoft


def contrib_node(op: str, inputs: dict, consts: dict, out: tuple, **attrs):
    """A model of one com.microsoft `op` node with output y of (onnx element type, shape): onnx cannot infer it."""
    names = [n if a is not None else "" for n, a in {**inputs, **consts}.items()]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], domain="com.microsoft", **attrs)],
        op,
        [helper.make_tensor_value_info(n, ELEM[a.dtype], a.shape) for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", *out)],
        [numpy_helper.from_array(a, n) for n, a in consts.items() if a is not None],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def _qparams(dtype, x_scale=0.05, x_zp=3, y_scale=0.02, y_zp=5) -> dict:
    return {"xs": f32(x_scale)[0], "xz": np.array(x_zp, dtype), "ys": f32(y_scale)[0], "yz": np.array(y_zp, dtype)}


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("op, attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1})])
def test_contrib_lookup_ops_cover_every_input_value(dtype, op, attrs):
    # every one of the 256 input values, saturating at both ends (y_scale 0.02 for values up to +-6)
    x = np.arange(256).astype(np.uint8).view(dtype).reshape(4, 8, 8)
    model = contrib_node(op, {"x": x}, _qparams(dtype, 0.05, -7 if dtype == np.int8 else 9), (ELEM[x.dtype], x.shape),
                         **attrs)  # fmt: skip
    check_exact(model, {"x": x}, reference=False)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_contrib_qlinear_global_average_pool(dtype, channels_last):
    x = (u8 if dtype == np.uint8 else s8)(2, 6, 5, 4)
    out = (2, 1, 1, 4) if channels_last else (2, 6, 1, 1)
    params = _qparams(dtype, 0.05, 3, 0.01, -2 if dtype == np.int8 else 2)
    model = contrib_node(
        "QLinearGlobalAveragePool", {"x": x}, params, (ELEM[x.dtype], out), channels_last=channels_last
    )
    check_exact(model, {"x": x}, reference=False)


def test_contrib_qlinear_concat_requantizes_each_input():
    a, b = u8(2, 3, 4), u8(2, 5, 4)
    consts = {"ys": f32(0.04)[0], "yz": np.array(10, np.uint8)}
    inputs = {
        "a": a,
        "as": f32(0.1)[0],
        "az": np.array(128, np.uint8),
        "b": b,
        "bs": f32(0.04)[0],
        "bz": np.array(10, np.uint8),
    }
    names = ["ys", "yz", "a", "as", "az", "b", "bs", "bz"]
    graph = helper.make_graph(
        [helper.make_node("QLinearConcat", names, ["y"], domain="com.microsoft", axis=1)], "concat",
        [helper.make_tensor_value_info(n, TensorProto.UINT8, x.shape) for n, x in (("a", a), ("b", b))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 8, 4])],
        [numpy_helper.from_array(v, k) for k, v in {**consts, **inputs}.items() if k not in ("a", "b")],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=9)
    check_exact(model, {"a": a, "b": b}, reference=False)


def test_contrib_matmul_integer_to_float_and_dynamic_quantize_matmul():
    a, b = u8(3, 4, 16), s8(16, 8)
    consts = {"b": b, "as": f32(0.03)[0], "bs": (RNG.random(8) * 0.05).astype(np.float32), "az": np.array(7, np.uint8),
              "bz": np.zeros(8, np.int8), "bias": RNG.standard_normal(8).astype(np.float32)}  # fmt: skip
    model = contrib_node("MatMulIntegerToFloat", {"a": a}, consts, (TensorProto.FLOAT, [3, 4, 8]))
    (got,), (want,) = tilefarm(model, {"a": a}), onnxruntime(model, {"a": a})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # exact int32 products, float32 scaling
    x = RNG.standard_normal((5, 16)).astype(np.float32)
    consts = {"b": b, "bs": consts["bs"], "bz": None, "bias": consts["bias"]}
    model = contrib_node("DynamicQuantizeMatMul", {"x": x}, consts, (TensorProto.FLOAT, [5, 8]))
    (got,), (want,) = tilefarm(model, {"x": x}), onnxruntime(model, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_unknown_contrib_op_is_refused_by_op_and_domain():
    x = u8(2, 3)
    model = contrib_node("QAttention", {"x": x}, {}, (TensorProto.UINT8, [2, 3]))
    with pytest.raises(UnsupportedOp, match="com.microsoft.QAttention"):
        load(model)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("op, b_shape", [("QLinearAdd", (4, 300)), ("QLinearMul", (4, 300)), ("QLinearMul", (1,))])
def test_contrib_qlinear_add_and_mul_round_as_onnxruntime(dtype, op, b_shape):
    # onnxruntime's kernels add the output zero point before rounding (QLinearAdd through two fused multiply-adds,
    # QLinearMul a float32 multiply and add): bit for bit on many scale / zero point draws, both saturation bounds
    lo, hi = (-128, 128) if dtype == np.int8 else (0, 256)
    elem = ELEM[np.dtype(dtype)]
    for _ in range(12):
        a, b = RNG.integers(lo, hi, (4, 300)).astype(dtype), RNG.integers(lo, hi, b_shape).astype(dtype)
        c_scale = 1e-3 if op == "QLinearAdd" else 1e-4  # products of two scales are small
        consts = {k: f32(RNG.random() * (0.1 if k != "cs" else c_scale * 100) + c_scale)[0] if k.endswith("s")
                  else np.array(RNG.integers(lo, hi), dtype) for k in ("as", "az", "bs", "bz", "cs", "cz")}  # fmt: skip
        names = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
        graph = helper.make_graph(
            [helper.make_node(op, names, ["y"], domain="com.microsoft")], "binary",
            [helper.make_tensor_value_info("a", elem, [4, 300]), helper.make_tensor_value_info("b", elem, b_shape)],
            [helper.make_tensor_value_info("y", elem, [4, 300])],
            [numpy_helper.from_array(v, k) for k, v in consts.items()],
        )  # fmt: skip
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        check_exact(helper.make_model(graph, opset_imports=opsets, ir_version=9), {"a": a, "b": b}, reference=False)


def test_qlinear_add_fixed_part_is_a_fused_multiply_add():
    # onnxruntime's c_zp - (ratio_a * a_zp + ratio_b * b_zp) is compiled to a fused multiply-add; on the scale draws
    # where rounding it in two steps instead changes an output, tilefarm still equals onnxruntime on all 65536 pairs
    f, found = np.float32, 0
    a, b = np.repeat(np.arange(256, dtype=np.uint8), 256), np.tile(np.arange(256, dtype=np.uint8), 256)
    draws = np.random.default_rng(11)
    while found < 3:
        sa, sb, sc = (f(draws.random() * 0.1 + 1e-3) for _ in range(3))
        za, zb, zc = (int(v) for v in draws.integers(0, 256, 3))
        ra, rb = f(sa / sc), f(sb / sc)
        if f(zc) - (f(ra * f(za)) + f(rb * f(zb))) == f(zc) - f(np.float64(ra) * za + np.float64(rb * f(zb))):
            continue
        found += 1
        consts = {"as": np.array(sa), "az": np.array(za, np.uint8), "bs": np.array(sb), "bz": np.array(zb, np.uint8),
                  "cs": np.array(sc), "cz": np.array(zc, np.uint8)}  # fmt: skip
        names = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
        graph = helper.make_graph(
            [helper.make_node("QLinearAdd", names, ["y"], domain="com.microsoft")], "add",
            [helper.make_tensor_value_info(n, TensorProto.UINT8, [65536]) for n in "ab"],
            [helper.make_tensor_value_info("y", TensorProto.UINT8, [65536])],
            [numpy_helper.from_array(v, k) for k, v in consts.items()],
        )  # fmt: skip
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        check_exact(helper.make_model(graph, opset_imports=opsets, ir_version=9), {"a": a, "b": b}, reference=False)
