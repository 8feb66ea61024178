"""NCHWc layout propagation: which values stay blocked, where conversions go, and that numerics do not change."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact.build import run_in_process
from compiler.model.fusion import fuse
from compiler.model.onnx_import import load
from compiler.model.optimize import optimize
from compiler.model.passes import CONV_BLOCK
from compiler.schedule.lower import lower
from compiler.targets import host_target
from compiler.targets.cpu.annotate import materialize, sample
from compiler.targets.cpu.codegen import compile_funcs
from compiler.targets.cpu.sketch import generate_sketches
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG

B = CONV_BLOCK


def _model(nodes, inits, out_shape, in_shape=(1, 3, 16, 16)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv(name, x, out, cin, cout, rng, inits, k=3, stride=1):
    inits[f"{name}_w"] = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    inits[f"{name}_b"] = rng.standard_normal(cout).astype(np.float32)
    p = k // 2
    return helper.make_node(
        "Conv", [x, f"{name}_w", f"{name}_b"], [out], kernel_shape=[k, k], pads=[p] * 4, strides=[stride] * 2
    )


def residual_net(rng) -> onnx.ModelProto:
    """stem conv + ReLU, max pool, a residual block with a strided 1x1 shortcut, global pool, flatten."""
    c1, c2, inits = 2 * B, 3 * B, {}
    nodes = [
        _conv("stem", "x", "s", 3, c1, rng, inits),
        helper.make_node("Relu", ["s"], ["s_r"]),
        helper.make_node("MaxPool", ["s_r"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
        _conv("a", "p", "a", c1, c2, rng, inits, stride=2),
        helper.make_node("Relu", ["a"], ["a_r"]),
        _conv("b", "a_r", "b", c2, c2, rng, inits),
        _conv("short", "p", "sc", c1, c2, rng, inits, k=1, stride=2),
        helper.make_node("Add", ["b", "sc"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["sum_r"]),
        helper.make_node("GlobalAveragePool", ["sum_r"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["y"]),
    ]
    return _model(nodes, inits, (1, c2))


def _ort(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_activations_between_convs_stay_blocked_and_are_converted_once_at_the_end():
    rng = np.random.default_rng(0)
    model = residual_net(rng)
    g = optimize(load(model, {"x": [1, 3, 16, 16]}))
    by_op = {}
    for n in g.nodes:
        by_op.setdefault(n.op, []).append(n)
    convs = by_op["BlockedConv"]
    assert all(n.attrs.get("out_layout") == "NCHWc" for n in convs)
    # the stem reads the 3-channel NCHW input; every later conv reads NCHWc data
    assert [n.attrs.get("data_layout", "NCHW") for n in convs] == ["NCHW", "NCHWc", "NCHWc", "NCHWc"]
    assert by_op["MaxPool"][0].attrs["layout"] == "NCHWc" and by_op["GlobalAveragePool"][0].attrs["layout"] == "NCHWc"
    add = by_op["Add"][0]
    assert all(v.shape[1:] == (3, 4, 4, B) for v in add.inputs)  # the residual add runs on NCHWc operands
    # one conversion: the pooled C values, before Flatten; the graph output keeps its NCHW name and type
    (conv_back,) = by_op["NCHWcToNCHW"]
    assert conv_back.inputs[0].shape == (1, 3, 1, 1, B) and conv_back.outputs[0].shape == (1, 3 * B, 1, 1)
    assert [v.name for v in g.outputs] == ["y"] and g.outputs[0].shape == (1, 3 * B)
    groups = [[n.op for n in grp.nodes] for grp in fuse(g)]
    assert ["BlockedConv", "Add", "Relu"] in groups and ["NCHWcToNCHW", "Flatten"] in groups


def test_blocked_network_matches_onnxruntime():
    rng = np.random.default_rng(1)
    model = residual_net(rng)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    got = run_in_process(load(model, {"x": [1, 3, 16, 16]}), {"x": x})["y"]
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-4, atol=1e-4)


def test_a_conv_read_only_as_nchw_stays_nchw():
    # conv -> Flatten: nothing gains from NCHWc, so no conversion node and no blocked output
    rng, inits = np.random.default_rng(2), {}
    nodes = [_conv("c", "x", "c", 3, B, rng, inits), helper.make_node("Flatten", ["c"], ["y"])]
    model = _model(nodes, inits, (1, B * 16 * 16))
    g = optimize(load(model, {"x": [1, 3, 16, 16]}))
    assert [n.op for n in g.nodes] == ["BlockedConv", "Flatten"]
    assert "out_layout" not in g.nodes[0].attrs


def test_a_blocked_value_also_read_as_nchw_is_converted_once():
    # conv1 feeds conv2 (blocked) and a Transpose and the graph output (NCHW): one NCHWcToNCHW serves both (conv2
    # is 1x1: a 3x3 one would be a WinogradConv, whose result is always blocked and converted for the Add)
    rng, inits = np.random.default_rng(3), {}
    nodes = [
        _conv("c1", "x", "c1", 3, B, rng, inits),
        _conv("c2", "c1", "c2", B, B, rng, inits, k=1),
        helper.make_node("Transpose", ["c1"], ["t"], perm=[0, 1, 3, 2]),
        helper.make_node("Add", ["t", "c2"], ["y"]),
    ]
    model = _model(nodes, inits, (1, B, 16, 16))
    g = optimize(load(model, {"x": [1, 3, 16, 16]}))
    assert [n.op for n in g.nodes].count("NCHWcToNCHW") == 1
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    got = run_in_process(load(model, {"x": [1, 3, 16, 16]}), {"x": x})["y"]
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-4, atol=1e-4)


def test_a_broadcast_operand_keeps_the_add_in_nchw():
    # Add of a per-channel constant (1, C, 1, 1) is not same-shape: it runs on NCHW, and the conv writes NCHW
    rng = np.random.default_rng(4)
    inits = {"k": rng.standard_normal((1, B, 1, 1)).astype(np.float32)}
    nodes = [_conv("c", "x", "c", 3, B, rng, inits), helper.make_node("Add", ["c", "k"], ["y"])]
    model = _model(nodes, inits, (1, B, 16, 16))
    g = optimize(load(model, {"x": [1, 3, 16, 16]}))
    assert "NCHWcToNCHW" not in [n.op for n in g.nodes]
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    got = run_in_process(load(model, {"x": [1, 3, 16, 16]}), {"x": x})["y"]
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-4, atol=1e-4)


def _nchwc(a: np.ndarray) -> np.ndarray:
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // B, B, h, w).transpose(0, 1, 3, 4, 2))


@pytest.mark.parametrize("seed", [0, 1])
def test_an_nchwc_max_pool_reduces_outside_its_vector_lanes(seed):
    x = te.placeholder((1, 2, 9, 9, B), name="x")
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2], "layout": "NCHWc"}
    pool = ops.OPS["MaxPool"]([x], attrs, "pool")[0]
    dag = ComputeDAG([x, pool])
    (sk,) = generate_sketches(dag, host_target())
    assert sk.rules == ("lanes(pool)",)  # the padded copy is Select: annotation places it (Ansor)
    iters = sk.state.stage("pool").iters
    assert [it.kind for it in iters][-3:] == ["reduce", "reduce", "spatial"]
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((1, 2 * B, 9, 9)).astype(np.float32)
    padded = np.pad(data, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.max([padded[:, :, i : i + 9 : 2, j : j + 9 : 2] for i in range(3) for j in range(3)], axis=0)
    for _ in range(4):
        state = materialize(sk, sample(sk, rng, 2, lanes=8))
        out = np.full(pool.shape, np.nan, np.float32)
        compile_funcs([lower(state)])["kernel"](_nchwc(data), out)
        np.testing.assert_array_equal(out, _nchwc(want))


def test_an_nchw_pool_keeps_ansors_rules():
    x = te.placeholder((1, 4, 9, 9), name="x")
    pool = ops.OPS["MaxPool"]([x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, "pool")[0]
    rules = [s.rules for s in generate_sketches(ComputeDAG([x, pool]), host_target())]
    assert not any(r.startswith("lanes") for rs in rules for r in rs)


def test_the_blocked_conv_fuses_its_bias_residual_add_and_relu_into_one_pass():
    # the bias is laid out C/b x b, read at the stage's own axes: strictly inlinable like the add, so the conv's
    # accumulator tile is written once, through bias + add + ReLU (no second pass over the output)
    from compiler.tensor.tasks import plan_tasks

    tasks, _, _ = plan_tasks(load(residual_net(np.random.default_rng(5)), {"x": [1, 3, 16, 16]}))
    (task,) = [t for t in tasks if t.name == "fused_blockedconv_add_relu"]
    first = generate_sketches(task.dag, host_target())[0].rules
    assert [r.split("(")[0] for r in first] == ["inline", "inline", "tile+fuse"]


def _depthwise(name, x, out, c, rng, inits, stride=1, dilation=1):
    inits[f"{name}_w"] = (rng.standard_normal((c, 1, 3, 3)) / 3).astype(np.float32)
    inits[f"{name}_b"] = rng.standard_normal(c).astype(np.float32)
    return helper.make_node(
        "Conv", [x, f"{name}_w", f"{name}_b"], [out], kernel_shape=[3, 3], pads=[dilation] * 4, group=c,
        strides=[stride] * 2, dilations=[dilation] * 2,
    )  # fmt: skip


def inverted_residuals(rng) -> onnx.ModelProto:
    """MobileNetV2's blocks: 1x1 expand + ReLU, 3x3 depthwise + ReLU, 1x1 project (+ the residual add at stride 1),
    once at stride 1 and once at stride 2 with a dilated depthwise conv."""
    c, e, inits = B, 3 * B, {}
    nodes = [
        _conv("stem", "x", "s", 3, c, rng, inits),
        _conv("e1", "s", "e1", c, e, rng, inits, k=1),
        helper.make_node("Relu", ["e1"], ["e1r"]),
        _depthwise("d1", "e1r", "d1", e, rng, inits),
        helper.make_node("Relu", ["d1"], ["d1r"]),
        _conv("p1", "d1r", "p1", e, c, rng, inits, k=1),
        helper.make_node("Add", ["p1", "s"], ["r1"]),
        _conv("e2", "r1", "e2", c, e, rng, inits, k=1),
        _depthwise("d2", "e2", "d2", e, rng, inits, stride=2, dilation=2),
        _conv("p2", "d2", "y", e, 2 * B, rng, inits, k=1),
    ]
    return _model(nodes, inits, (1, 2 * B, 8, 8))


def test_depthwise_convs_keep_inverted_residual_blocks_in_nchwc():
    # the depthwise conv is a BlockedConv too (weight C/b x 3 x 3 x b): no conversion sits between the expand,
    # depthwise and project convs, and the last conv writes the NCHW graph output from its accumulators
    rng = np.random.default_rng(6)
    model = inverted_residuals(rng)
    g = optimize(load(model, {"x": [1, 3, 16, 16]}))
    convs = [n for n in g.nodes if n.op == "BlockedConv"]
    depthwise = [n for n in convs if n.attrs.get("group", 1) > 1]
    assert len(convs) == 7 and [n.inputs[1].shape for n in depthwise] == [(3, 3, 3, B)] * 2
    assert [n.attrs.get("data_layout", "NCHW") for n in convs] == ["NCHW"] + ["NCHWc"] * 6
    assert "NCHWcToNCHW" not in [n.op for n in g.nodes]
    assert [n.attrs.get("out_layout", "NCHW") for n in convs] == ["NCHWc"] * 6 + ["NCHW"]
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    got = run_in_process(load(model, {"x": [1, 3, 16, 16]}), {"x": x})["y"]
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride", [1, 2])
def test_a_depthwise_conv_of_nchw_data_matches_onnxruntime(stride):
    # the graph input goes straight into the depthwise conv: it reads NCHW, writes NCHW for the graph output
    rng, inits = np.random.default_rng(7 + stride), {}
    out_shape = (1, 2 * B, 16 // stride, 16 // stride)
    node = _depthwise("d", "x", "y", 2 * B, rng, inits, stride)
    model = _model([node], inits, out_shape, in_shape=(1, 2 * B, 16, 16))
    g = optimize(load(model, {"x": [1, 2 * B, 16, 16]}))
    assert [(n.op, n.attrs.get("data_layout"), n.attrs.get("out_layout")) for n in g.nodes] == [
        ("BlockedConv", None, None)
    ]
    x = rng.standard_normal((1, 2 * B, 16, 16)).astype(np.float32)
    got = run_in_process(load(model, {"x": [1, 2 * B, 16, 16]}), {"x": x})["y"]
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-4, atol=1e-4)


def test_24_channel_layers_travel_in_padded_blocks_and_match_onnxruntime():
    # MobileNetV2's 24-channel stage: the project conv computes 32 channels (zero filters in the last block's upper
    # half), the residual add and the next expand conv read them blocked (its weight has zero input channels there),
    # and no conversion sits between the convs; the graph output drops the padding
    rng, inits = np.random.default_rng(8), {}
    c, e = 24, 4 * B
    nodes = [
        _conv("stem", "x", "s", 3, c, rng, inits),
        _conv("e1", "s", "e1", c, e, rng, inits, k=1),
        helper.make_node("Relu", ["e1"], ["e1r"]),
        _depthwise("d1", "e1r", "d1", e, rng, inits),
        _conv("p1", "d1", "p1", e, c, rng, inits, k=1),
        helper.make_node("Add", ["p1", "s"], ["r1"]),
        _conv("e2", "r1", "e2", c, e, rng, inits, k=1),
        helper.make_node("Relu", ["e2"], ["y"]),
        helper.make_node("Sigmoid", ["r1"], ["z"]),
    ]
    model = _model(nodes, inits, (1, e, 16, 16))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, c, 16, 16]))
    g = optimize(load(model, {"x": [1, 3, 16, 16]}))
    convs = [n for n in g.nodes if n.op == "BlockedConv"]
    assert [n.attrs.get("channels") for n in convs] == [24, None, None, 24, None]
    assert [n.attrs.get("data_layout", "NCHW") for n in convs] == ["NCHW"] + ["NCHWc"] * 4
    add = next(n for n in g.nodes if n.op == "Add")
    assert add.outputs[0].shape == (1, 2, 16, 16, B)
    (back,) = [n for n in g.nodes if n.op == "NCHWcToNCHW"]  # the sigmoid's graph output, 24 channels again
    assert back.attrs == {"channels": 24} and back.outputs[0].shape == (1, 24, 16, 16)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    got = run_in_process(load(model, {"x": [1, 3, 16, 16]}), {"x": x})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip(["y", "z"], sess.run(None, {"x": x})))
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)


def test_a_padded_block_never_meets_an_op_that_could_turn_its_zero_lanes_into_nan():
    # 0/0 in the padding lanes would reach every channel of the next conv through its zero weights (0 * NaN): a Div of
    # two padded values runs in NCHW, and the convs around it convert
    rng, inits = np.random.default_rng(9), {}
    nodes = [
        _conv("a", "x", "a", 3, 24, rng, inits, k=1),
        _conv("b", "x", "b", 3, 24, rng, inits, k=1),
        helper.make_node("Div", ["a", "b"], ["q"]),
        _conv("c", "q", "y", 24, B, rng, inits, k=1),
    ]
    model = _model(nodes, inits, (1, B, 16, 16))
    g = optimize(load(model, {"x": [1, 3, 16, 16]}))
    div = next(n for n in g.nodes if n.op == "Div")
    assert all(len(v.shape) == 4 for v in (*div.inputs, *div.outputs))
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    got = run_in_process(load(model, {"x": [1, 3, 16, 16]}), {"x": x})["y"]
    np.testing.assert_allclose(got, _ort(model, x), rtol=1e-3, atol=1e-3)
