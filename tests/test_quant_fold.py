"""fold_qdq (compiler/model/quant_fold.py): DequantizeLinear → Conv / MatMul / Gemm / GlobalAveragePool / MaxPool …
→ QuantizeLinear chains of QDQ models become integer ops with a fused Requantize. Models written by onnxruntime's
quantize_static (QDQ, per channel and per tensor, int8 and uint8, synthetic calibration data) compile with no float
conv or matmul left, and their outputs equal onnxruntime's int8 run bit for bit (onnxruntime fuses the same chains
into QLinearConv / QGemm / QLinearGlobalAveragePool / QLinearAdd).
Chains that cannot fold (run-time scales, a float value read twice) stay float and still agree."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType

from compiler.artifact.build import run_in_process
from compiler.model.onnx_import import load
from compiler.model.optimize import optimize
from compiler.model.quant_fold import fold_qdq
from tests.quantized_models import quantize_qdq, small_input
from tilefarm.examples import EXAMPLES

RNG = np.random.default_rng(5252)
FLOAT_PRODUCTS = {"Conv", "MatMul", "Gemm", "BlockedConv", "WinogradConv", "PackedMatMul", "GlobalAveragePool"}


def _check(model: onnx.ModelProto, shape, runs: int = 2) -> Counter:
    """Compile the QDQ model, check no float product is left and its outputs equal onnxruntime's bit for bit on
    `runs` random inputs; the ops fold_qdq leaves (later passes may pack the integer products further)."""
    name = model.graph.input[0].name
    g = load(model, {name: list(shape)})
    assert not FLOAT_PRODUCTS & {n.op for n in optimize(g).nodes}
    ops = Counter(n.op for n in fold_qdq(g).nodes)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(runs):
        x = RNG.standard_normal(shape).astype(np.float32)
        got = run_in_process(g, {name: x})
        for o, want in zip(model.graph.output, sess.run(None, {name: x})):
            np.testing.assert_array_equal(got[o.name], want)
    return ops


@pytest.mark.parametrize("example", ["resnet18", "mobilenetv2"])
def test_qdq_example_net_folds_and_equals_onnxruntime(tmp_path, example):
    # uint8 activations (U8S8): onnxruntime fuses every chain into its integer ops, and so does fold_qdq
    model = quantize_qdq(tmp_path, small_input(EXAMPLES[example](), 48), (1, 3, 48, 48), RNG, act=QuantType.QUInt8)
    ops = _check(model, (1, 3, 48, 48))
    convs = sum(n.op_type == "Conv" for n in model.graph.node)
    adds = sum(n.op_type == "Add" for n in model.graph.node)
    assert ops["ConvInteger"] == convs and ops["MatMulInteger"] == 1 and ops["QLinearAdd"] == adds
    # no float left but the input's QuantizeLinear and the output's DequantizeLinear
    assert (ops["QuantizeLinear"], ops["DequantizeLinear"], ops["Add"]) == (1, 1, 0)


@pytest.mark.slow
@pytest.mark.parametrize("example", ["resnet18", "mobilenetv2"])
def test_qdq_example_net_at_224(tmp_path, example):
    model = quantize_qdq(tmp_path, EXAMPLES[example](), (1, 3, 224, 224), RNG, act=QuantType.QUInt8)
    _check(model, (1, 3, 224, 224), runs=2)


def _conv_net() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["m", "w2"], ["c2"], group=2, dilations=[2, 2], pads=[2, 2, 2, 2]),
        helper.make_node("Add", ["c2", "m"], ["s"]),
        helper.make_node("Mul", ["s", "m"], ["sm"]),
        helper.make_node("GlobalAveragePool", ["sm"], ["p"]),
        helper.make_node("Reshape", ["p", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["y"]),
    ]
    inits = {"w1": RNG.standard_normal((8, 3, 3, 3)) * 0.3, "b1": RNG.standard_normal(8) * 0.1,
             "w2": RNG.standard_normal((8, 4, 3, 3)) * 0.2, "fc": RNG.standard_normal((8, 5)) * 0.3}  # fmt: skip
    graph = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in inits.items()]
        + [numpy_helper.from_array(np.array([2, 8], np.int64), "shape")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize(
    "per_channel, act, weight",
    [(True, QuantType.QUInt8, QuantType.QInt8), (False, QuantType.QUInt8, QuantType.QUInt8),
     (False, QuantType.QInt8, QuantType.QInt8), (True, QuantType.QUInt8, QuantType.QUInt8)],
)  # fmt: skip
def test_conv_pool_matmul_net_per_tensor_and_per_channel_int8_and_uint8(tmp_path, per_channel, act, weight):
    model = quantize_qdq(tmp_path, _conv_net(), (2, 3, 12, 12), RNG, per_channel, act, weight)
    ops = _check(model, (2, 3, 12, 12), runs=3)
    assert ops["ConvInteger"] == 2 and ops["MatMulInteger"] == 1 and ops["ReduceSum"] == 1
    if act == QuantType.QUInt8:
        assert ops["QLinearAdd"] == ops["QLinearMul"] == 1


def _qdq_conv(x_scale_input: bool, shared: bool) -> onnx.ModelProto:
    """x → Q → DQ → Conv → Q → DQ → y by hand; the input's scale a graph input (run-time) if `x_scale_input`, the
    conv's float result also a second output if `shared`."""
    w = RNG.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    arrays = {"wq": w, "ws": np.full(4, 0.02, np.float32), "ys": np.array(0.05, np.float32),
              "yz": np.array(3, np.uint8), "xz": np.array(128, np.uint8)}  # fmt: skip
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items()]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
    if x_scale_input:
        inputs.append(helper.make_tensor_value_info("xs", TensorProto.FLOAT, []))
    else:
        inits.append(numpy_helper.from_array(np.array(0.03, np.float32), "xs"))
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])]
    if shared:
        outputs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 4, 8, 8]))
    graph = helper.make_graph(nodes, "qdq", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("x_scale_input, shared", [(False, False), (True, False), (False, True)])
def test_hand_written_chain_folds_only_when_it_may(x_scale_input, shared):
    model = _qdq_conv(x_scale_input, shared)
    feeds = {"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    if x_scale_input:
        feeds["xs"] = np.array(0.03, np.float32)
    g = load(model)
    ops = Counter(n.op for n in fold_qdq(g).nodes)
    folds = not x_scale_input and not shared
    assert (ops["ConvInteger"], ops["Requantize"]) == ((1, 1) if folds else (0, 0))
    got = run_in_process(g, feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    if folds:
        np.testing.assert_array_equal(got["y"], want[0])
    else:  # a float conv: a near-tie may round the other way than onnxruntime's float sum does
        np.testing.assert_allclose(got["y"], want[0], rtol=0, atol=0.05 * 1.001)
    if shared:  # the float conv, read by the caller too, keeps float accumulation
        np.testing.assert_allclose(got["c"], want[1], rtol=1e-5, atol=1e-5)
