"""Quantized models through the dot-product kernels (compiler/model/int8_layout.py): MatMulInteger with a constant
weight → PackedMatMulInteger, ConvInteger → PackedConvInteger (NCHW4c u8 data, NCHW16c int32 accumulators). Models
written by onnxruntime's quantize_static (QDQ, synthetic calibration) and hand-made integer graphs compile with the
route on and off; the packed ops are in the tasks, the Requantize epilogue fused into them, and every output equals
the generic integer route's bit for bit (and onnxruntime's, where it runs the same integer ops: uint8 activations)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType

from compiler.artifact.build import run_in_process
from compiler.model.fusion import fuse
from compiler.model.graph import Graph
from compiler.model.int8_layout import pack_integer_convs, pack_integer_matmuls
from compiler.model.onnx_import import load
from compiler.model.optimize import optimize
from compiler.tensor.tasks import plan_tasks
from tests.quantized_models import quantize_qdq, small_input

RNG = np.random.default_rng(8052)
ROUTE = ("pack_integer_matmuls", "pack_integer_convs", "propagate_int8_nchwc")
PACKED = {"PackedMatMulInteger", "PackedConvInteger"}


def _generic(g: Graph, feeds: dict) -> dict[str, np.ndarray]:
    """`g` run with the route's passes left out: the generic integer ops."""
    assert not PACKED & {n.op for n in optimize(g, disabled=ROUTE).nodes}
    return run_in_process(g, feeds, disabled_passes=ROUTE)


def _packed_tasks(g: Graph) -> Counter:
    """How many tasks compute a dot-product stage, and the fused groups' op lists holding a packed op."""
    tasks, _, optimized = plan_tasks(g)
    groups = Counter(tuple(n.op for n in grp.nodes) for grp in fuse(optimized) if PACKED & {n.op for n in grp.nodes})
    assert sum(any(op.tag == "int8_dot" for op in t.dag.ops) for t in tasks) >= 1
    return groups


def _compare(model: onnx.ModelProto, shape, runs: int = 2, with_ort: bool = True) -> Counter:
    """Route on against route off (bit for bit) and against onnxruntime (`with_ort`); the packed groups."""
    name = model.graph.input[0].name
    g = load(model, {name: list(shape)})
    groups = _packed_tasks(g)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(runs):
        feeds = {name: RNG.standard_normal(shape).astype(np.float32)}
        got, want = run_in_process(g, feeds), _generic(g, feeds)
        for o in model.graph.output:
            np.testing.assert_array_equal(got[o.name], want[o.name])
        if with_ort:
            for o, theirs in zip(model.graph.output, sess.run(None, feeds)):
                np.testing.assert_array_equal(got[o.name], theirs)
    return groups


def _float_model(nodes, inits: dict, x_shape, y_shape) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))],
        [numpy_helper.from_array(np.asarray(a, np.float32 if a.dtype.kind == "f" else a.dtype), n)
         for n, a in inits.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _matmul_net() -> onnx.ModelProto:
    """MatMul (3-D activations, K not a multiple of 4, N not of 16) → Relu → Gemm (transB, bias) → MatMul."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["f"]),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["g"], transB=1),
        helper.make_node("MatMul", ["g", "w3"], ["y"]),
    ]
    inits = {"w1": RNG.standard_normal((37, 24)) * 0.3, "shape": np.array([6, 24], np.int64),
             "w2": RNG.standard_normal((40, 24)) * 0.3, "b2": RNG.standard_normal(40) * 0.1,
             "w3": RNG.standard_normal((40, 7)) * 0.3}  # fmt: skip
    return _float_model(nodes, inits, (2, 3, 37), (6, 7))


QUANT_CASES = [
    (True, QuantType.QUInt8, QuantType.QInt8),
    (False, QuantType.QUInt8, QuantType.QUInt8),
    (False, QuantType.QInt8, QuantType.QInt8),
    (True, QuantType.QUInt8, QuantType.QUInt8),
]


@pytest.mark.parametrize("per_channel, act, weight", QUANT_CASES)
def test_matmul_net_takes_the_packed_route(tmp_path, per_channel, act, weight):
    model = quantize_qdq(tmp_path, _matmul_net(), (2, 3, 37), RNG, per_channel, act, weight)
    groups = _compare(model, (2, 3, 37), runs=3, with_ort=act == QuantType.QUInt8)
    # every product packed (per-column u8 weight zero points too: the kernel subtracts zw[n] * row sums), each with
    # its Requantize in the same task
    assert sum(groups.values()) == 3
    assert all(ops[0] == "PackedMatMulInteger" and "Requantize" in ops for ops in groups)


def _conv_net() -> onnx.ModelProto:
    """A ResNet-like block: 3x3 conv (3 channels in: NCHW4c with a padded channel) → ReLU → 3x3 conv → residual Add
    with a 1x1 conv → 3x3 stride-2 conv (20 filters: a padded block) → global pool → Gemm."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["r1", "w3"], ["c3"]),
        helper.make_node("Add", ["c2", "c3"], ["s"]),
        helper.make_node("Relu", ["s"], ["r2"]),
        helper.make_node("Conv", ["r2", "w4", "b4"], ["c4"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c4"], ["r4"]),
        helper.make_node("GlobalAveragePool", ["r4"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1),
    ]
    inits = {"w1": RNG.standard_normal((16, 3, 3, 3)) * 0.3, "b1": RNG.standard_normal(16) * 0.1,
             "w2": RNG.standard_normal((16, 16, 3, 3)) * 0.1, "b2": RNG.standard_normal(16) * 0.1,
             "w3": RNG.standard_normal((16, 16, 1, 1)) * 0.3,
             "w4": RNG.standard_normal((20, 16, 3, 3)) * 0.1, "b4": RNG.standard_normal(20) * 0.1,
             "fc": RNG.standard_normal((5, 20)) * 0.3, "fcb": RNG.standard_normal(5) * 0.1}  # fmt: skip
    return _float_model(nodes, inits, (2, 3, 14, 14), (2, 5))


@pytest.mark.parametrize("per_channel, act, weight", QUANT_CASES)
def test_conv_net_takes_the_packed_route(tmp_path, per_channel, act, weight):
    model = quantize_qdq(tmp_path, _conv_net(), (2, 3, 14, 14), RNG, per_channel, act, weight)
    groups = _compare(model, (2, 3, 14, 14), with_ort=act == QuantType.QUInt8)
    # every conv packed (a u8 weight's zero points too: subtracted times each window's data sum), and the matmul
    assert sum(ops.count("PackedConvInteger") for ops in groups.elements()) == 4
    assert sum(ops.count("PackedMatMulInteger") for ops in groups.elements()) == 1
    # each conv computes its Requantize on its NCHW16c accumulators; the matmul's is fused into its task
    g = optimize(load(model, {"x": [2, 3, 14, 14]}))
    convs = [n for n in g.nodes if n.op == "PackedConvInteger"]
    assert [n.attrs["to"] for n in convs] == ["uint8" if act == QuantType.QUInt8 else "int8"] * 4
    assert all("Requantize" in ops for ops in groups if "PackedMatMulInteger" in ops)
    # u8 values stay NCHW16c from the first conv through the residual QLinearAdd into the last conv (whose 20
    # filters leave it NCHW); s8 ones go back to NCHW (the kernel's data is u8)
    blocked = act == QuantType.QUInt8
    layouts = [(n.attrs.get("data_layout"), n.attrs.get("out_layout")) for n in convs]
    nchwc = "NCHWc" if blocked else None
    assert layouts == [(None, nchwc), (nchwc, nchwc), (nchwc, nchwc), (nchwc, None)]
    assert sum(n.op == "NCHWcToNCHW" for n in g.nodes) == 0


def _integer_conv(x_dtype: str, x_zero: int, w_zero, stride: int, pads, group: int = 1, filters: int = 18):
    """x (x_dtype, zero point x_zero) → ConvInteger with an int8 weight → int32 y."""
    c = 6
    w = RNG.integers(-128, 128, (filters, c // group, 3, 3)).astype(np.int8)
    arrays = {"w": w, "xz": np.array(x_zero, x_dtype), "wz": np.asarray(w_zero, np.int8)}
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=list(pads), strides=[stride] * 2,
                            group=group)  # fmt: skip
    elem = TensorProto.UINT8 if x_dtype == "uint8" else TensorProto.INT8
    graph = helper.make_graph(
        [node], "ci", [helper.make_tensor_value_info("x", elem, [2, c, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(a, n) for n, a in arrays.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize(
    "x_dtype, x_zero, w_zero, stride, pads, group, packed",
    [("uint8", 0, 0, 1, (1, 1, 1, 1), 1, True), ("uint8", 201, 0, 2, (2, 2, 2, 2), 1, True),
     ("int8", -77, 0, 1, (0, 0, 0, 0), 1, True), ("uint8", 3, 5, 1, (1, 1, 1, 1), 1, True),
     ("uint8", 3, 0, 1, (1, 0, 1, 0), 1, False),
     # depthwise (6 channels in a block of 16), per-channel weight zero points; s8 data
     ("uint8", 250, [3, -128, 127, 0, 9, -1], 2, (1, 1, 1, 1), 6, True), ("int8", 100, 4, 1, (2, 2, 2, 2), 6, True),
     ("uint8", 7, 0, 1, (0, 1, 0, 1), 6, False)],
)  # fmt: skip
def test_conv_integer_packed_exactly_or_left_generic(x_dtype, x_zero, w_zero, stride, pads, group, packed):
    model = _integer_conv(x_dtype, x_zero, w_zero, stride, pads, group, 6 if group > 1 else 18)
    g = load(model)
    assert ("PackedConvInteger" in {n.op for n in optimize(g).nodes}) == packed
    lo, hi = (0, 256) if x_dtype == "uint8" else (-128, 128)
    for x in (RNG.integers(lo, hi, (2, 6, 9, 11)), np.full((2, 6, 9, 11), hi - 1), np.full((2, 6, 9, 11), lo)):
        feeds = {"x": x.astype(x_dtype)}
        got = run_in_process(g, feeds)["y"]
        np.testing.assert_array_equal(got, _generic(g, feeds)["y"])
        if x_dtype == "uint8" and np.ndim(w_zero) == 0:  # onnxruntime's ConvInteger: uint8 data, one weight zero
            want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
            np.testing.assert_array_equal(got, want[0])


def _integer_matmul(a_dtype: str, w_dtype: str, a_zero_input: bool) -> onnx.ModelProto:
    """MatMulInteger of A (3 x 5 x 13) by a constant 13 x 20 weight with per-column zero points; A's zero point a
    graph input (run time, as dynamic quantization makes it) or a constant."""
    w = RNG.integers(*((0, 256) if w_dtype == "uint8" else (-128, 128)), (13, 20)).astype(w_dtype)
    wz = RNG.integers(*((0, 256) if w_dtype == "uint8" else (-128, 128)), 20).astype(w_dtype)
    a_elem = TensorProto.UINT8 if a_dtype == "uint8" else TensorProto.INT8
    inputs = [helper.make_tensor_value_info("a", a_elem, [3, 5, 13])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(wz, "wz")]
    if a_zero_input:
        inputs.append(helper.make_tensor_value_info("az", a_elem, []))
    else:
        inits.append(numpy_helper.from_array(np.array(100 if a_dtype == "uint8" else -9, a_dtype), "az"))
    node = helper.make_node("MatMulInteger", ["a", "w", "az", "wz"], ["y"])
    outputs = [helper.make_tensor_value_info("y", TensorProto.INT32, None)]
    graph = helper.make_graph([node], "mi", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("a_dtype, w_dtype, a_zero_input",
                         [("uint8", "int8", False), ("uint8", "uint8", True), ("int8", "int8", True),
                          ("int8", "uint8", False)])  # fmt: skip
def test_matmul_integer_zero_points_packed_exactly(a_dtype, w_dtype, a_zero_input):
    g = load(_integer_matmul(a_dtype, w_dtype, a_zero_input))
    assert "PackedMatMulInteger" in {n.op for n in optimize(g).nodes}
    lo, hi = (0, 256) if a_dtype == "uint8" else (-128, 128)
    for az in ((lo + hi) // 2, lo, hi - 1):
        feeds = {"a": RNG.integers(lo, hi, (3, 5, 13)).astype(a_dtype)}
        if a_zero_input:
            feeds["az"] = np.array(az, a_dtype)
        got = run_in_process(g, feeds)["y"]
        np.testing.assert_array_equal(got, _generic(g, feeds)["y"])


def test_passes_leave_what_they_cannot_pack():
    # a grouped ConvInteger and a MatMulInteger of two run-time values stay generic
    g = load(_integer_conv("uint8", 3, 0, 1, (1, 1, 1, 1), group=2))
    assert [n.op for n in pack_integer_convs(g).nodes] == ["ConvInteger"]
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    vi = [helper.make_tensor_value_info(n, TensorProto.UINT8, [4, 8]) for n in "ab"]
    graph = helper.make_graph([node], "mm", vi, [helper.make_tensor_value_info("y", TensorProto.INT32, [4, 8])])
    g = load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9))
    assert [n.op for n in pack_integer_matmuls(g).nodes] == ["MatMulInteger"]


def test_requantize_on_the_accumulators_rounds_ties_to_even_and_saturates():
    # QLinearConv (1x1, 16 filters) whose multipliers x_scale * w_scale / y_scale are 0.5 and 0.25 (every odd
    # accumulator a tie), 3.75, and 2^14 and -2^14 (products far past 2^22: saturated both ways)
    mults = np.array([0.5, 0.25, 3.75, 2.0**14, -(2.0**14)] * 3 + [0.5], np.float32)
    w = RNG.integers(-128, 128, (16, 8, 1, 1)).astype(np.int8)
    arrays = {"xs": np.array(1.0, np.float32), "xz": np.array(130, np.uint8), "w": w, "ws": mults,
              "wz": np.zeros(16, np.int8), "ys": np.array(1.0, np.float32), "yz": np.array(7, np.uint8),
              "b": RNG.integers(-999, 999, 16).astype(np.int32)}  # fmt: skip
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"])
    graph = helper.make_graph(
        [node], "qc", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 8, 5, 6])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 16, 5, 6])],
        [numpy_helper.from_array(a, n) for n, a in arrays.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    g = load(model)
    assert {n.op for n in optimize(g).nodes} == {"PackedConvInteger"}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(3):
        feeds = {"x": RNG.integers(0, 256, (1, 8, 5, 6)).astype(np.uint8)}
        got = run_in_process(g, feeds)["y"]
        np.testing.assert_array_equal(got, _generic(g, feeds)["y"])
        np.testing.assert_array_equal(got, sess.run(None, feeds)[0])
    acc = np.einsum("nchw,fc->nfhw", feeds["x"].astype(np.int64) - 130, w[:, :, 0, 0].astype(np.int64))
    scaled = (acc + arrays["b"][None, :, None, None]) * mults.astype(np.float64)[None, :, None, None]
    assert (scaled % 1 == 0.5).sum() > 10 and (np.abs(scaled) > 2**22).sum() > 10  # the inputs reach both edges


def _routed_example(tmp_path, name: str) -> Graph:
    """Example `name` on 32 x 32 images, quantized (QDQ, per channel, U8S8), checked through the route against the
    generic one and onnxruntime, and optimized."""
    from tilefarm.examples import EXAMPLES

    shape = (1, 3, 32, 32)
    model = quantize_qdq(
        tmp_path, small_input(EXAMPLES[name](), 32), shape, RNG, True, QuantType.QUInt8, QuantType.QInt8
    )
    _compare(model, shape, runs=1)
    return optimize(load(model, {model.graph.input[0].name: list(shape)}))


def test_mobilenetv2_convs_depthwise_ones_too_all_packed(tmp_path):
    g = _routed_example(tmp_path, "mobilenetv2")
    convs = [n for n in g.nodes if n.op == "PackedConvInteger"]
    assert not {"ConvInteger", "MatMulInteger"} & {n.op for n in g.nodes}
    assert sum("group" in n.attrs for n in convs) == 17  # the depthwise ones
    # depthwise convs read and write NCHW16c where their neighbours' channels fill blocks of 16 (not 24)
    assert sum(n.attrs.get("data_layout") == n.attrs.get("out_layout") == "NCHWc" for n in convs if "group" in n.attrs)


def test_resnet18_keeps_nchw16c_from_the_max_pool_to_the_last_block(tmp_path):
    g = _routed_example(tmp_path, "resnet18")
    ops = Counter(n.op for n in g.nodes)
    assert ops["PackedConvInteger"] == 20 and ops["ConvInteger"] == 0 and ops["PackedMatMulInteger"] == 1
    (pool,) = [n for n in g.nodes if n.op == "MaxPool"]
    assert pool.attrs["layout"] == "NCHWc"
    # one conversion back: the last residual add's shortcut (the add feeds the global pool, which reads NCHW)
    assert ops["NCHWcToNCHW"] == 1


def test_route_turns_off_by_disable_pass(tmp_path):
    from compiler.artifact.build import build
    from compiler.artifact.runtime import Artifact

    g = load(_integer_conv("uint8", 201, 0, 2, (2, 2, 2, 2)))
    assert "ConvInteger" in {n.op for n in optimize(g, ROUTE).nodes}
    build(g, tmp_path / "off.tar", name="off", disabled_passes=ROUTE)
    feeds = {"x": RNG.integers(0, 256, (2, 6, 9, 11)).astype(np.uint8)}
    off = Artifact.load(tmp_path / "off.tar").run(feeds)["y"]
    np.testing.assert_array_equal(run_in_process(g, feeds)["y"], off)
