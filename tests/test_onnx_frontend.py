"""The ONNX frontend: normalization, folding, input shapes, value names, errors (ONNX's own tests: test_conformance)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from compiler.artifact.build import run_in_process
from compiler.base.errors import InvalidModel, UnsupportedDType, UnsupportedOp
from compiler.model.onnx_import import ONNX_OPS, load, parse_input_shapes

F = TensorProto.FLOAT
I64 = TensorProto.INT64
BIG = np.iinfo(np.int64).max


def make(nodes, inputs, outputs, opset=13, inits=(), domains=()):
    """A model from (name, elem, shape) inputs/outputs and {name: array} initializers, IR version 8."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in dict(inits).items()],
    )
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=imports, ir_version=8)
    # onnx.checker wants typed graph outputs: let onnx's inference write the ones left open (shape None)
    inferred = onnx.shape_inference.infer_shapes(model).graph.output
    for i, (_, _, shape) in enumerate(outputs):
        if shape is None and inferred[i].type.tensor_type.HasField("shape"):
            model.graph.output[i].CopyFrom(inferred[i])
    return model


def ints(*v):
    return np.array(v, dtype=np.int64)


def only(graph, op=None):
    """The graph's single node (of type `op` when given)."""
    nodes = [n for n in graph.nodes if op is None or n.op == op]
    assert len(nodes) == 1, [str(n) for n in graph.nodes]
    return nodes[0]


def ort_shapes(model, shapes):
    """Output shapes onnxruntime computes on random inputs of the given shapes."""
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        dtype = {"tensor(float)": np.float32, "tensor(int64)": np.int64}[i.type]
        feeds[i.name] = rng.random(shapes[i.name]).astype(dtype)
    return [tuple(o.shape) for o in sess.run(None, feeds)]


def conv_model(auto_pad, stride=1, kernel=2, opset=13):
    w = np.ones((2, 1, kernel, kernel), np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], auto_pad=auto_pad, strides=[stride, stride])
    return make([node], [("x", F, [1, 1, 5, 5])], [("y", F, None)], opset, {"w": w})


# ---------------------------------------------------------------------------------------------- normalization rules


@pytest.mark.parametrize(
    "auto_pad, stride, pads",
    [("SAME_UPPER", 1, [0, 0, 1, 1]), ("SAME_LOWER", 1, [1, 1, 0, 0]), ("VALID", 1, [0, 0, 0, 0]),
     ("SAME_UPPER", 2, [0, 0, 1, 1]), ("NOTSET", 1, [0, 0, 0, 0])],
)  # fmt: skip
def test_conv_auto_pad_becomes_pads(auto_pad, stride, pads):
    model = conv_model(auto_pad, stride)
    g = load(model)
    n = only(g)
    assert n.attrs == {"kernel_shape": [2, 2], "strides": [stride] * 2, "pads": pads, "dilations": [1, 1], "group": 1}
    assert [o.shape for o in g.outputs] == ort_shapes(model, {"x": [1, 1, 5, 5]})


def test_pool_auto_pad_and_defaults():
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")
    model = make([node], [("x", F, [1, 2, 5, 5])], [("y", F, None)])
    g = load(model)
    assert only(g).attrs == {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 1],
                             "ceil_mode": 0, "storage_order": 0}  # fmt: skip
    assert g.outputs[0].shape == (1, 2, 3, 3) == ort_shapes(model, {"x": [1, 2, 5, 5]})[0]


def test_reshape_zero_and_minus_one_resolved():
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    model = make([node], [("x", F, [2, 3, 4])], [("y", F, None)], inits={"s": ints(0, -1)})
    g = load(model)
    assert only(g).attrs == {"shape": [2, 12]} and only(g).inputs == (g.inputs[0],)
    assert g.outputs[0].shape == ort_shapes(model, {"x": [2, 3, 4]})[0]


@pytest.mark.parametrize(
    "starts, ends, axes, steps, want",
    [
        ([-3, 0], [BIG, -1], [0, 1], [1, 2], {"starts": [7, 0], "ends": [10, 7], "axes": [0, 1], "steps": [1, 2]}),
        ([-1], [-BIG], [1], [-1], {"starts": [7], "ends": [-1], "axes": [1], "steps": [-1]}),
        ([-20, 1], [5, 3], [-1, 0], [1, 1], {"starts": [1, 0], "ends": [3, 5], "axes": [0, 1], "steps": [1, 1]}),
    ],
)
def test_slice_clamped_and_listed(starts, ends, axes, steps, want):
    node = helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])
    inits = {"st": ints(*starts), "en": ints(*ends), "ax": ints(*axes), "sp": ints(*steps)}
    model = make([node], [("x", F, [10, 8])], [("y", F, None)], inits=inits)
    g = load(model)
    assert only(g).attrs == want
    assert g.outputs[0].shape == ort_shapes(model, {"x": [10, 8]})[0]


def test_empty_tensors_fold_to_constants_and_drop_out_of_split_and_concat():
    nodes = [
        helper.make_node("Slice", ["x", "st", "en", "ax"], ["e"]),  # starts past the end: x[:, 8:8]
        helper.make_node("ReduceSum", ["e", "ax"], ["s"], keepdims=1),  # the sum of nothing: zeros
        helper.make_node("Split", ["x", "sp"], ["a", "b"], axis=1),
        helper.make_node("Concat", ["b", "a"], ["y"], axis=1),
    ]
    inits = {"st": ints(20), "en": ints(30), "ax": ints(1), "sp": ints(8, 0)}
    g = load(make(nodes, [("x", F, [2, 8])], [("s", F, None), ("y", F, None)], 13, inits))
    assert g.outputs[0].const.tolist() == [[0.0], [0.0]]
    assert [(n.op, n.attrs.get("split")) for n in g.nodes] == [("Split", [8]), ("Identity", None)]


@pytest.mark.parametrize(
    "op, opset, by_input, axes, keepdims, want_axes, shape",
    [
        ("ReduceMean", 13, False, [-1], 1, [2], (2, 3, 1)),
        ("ReduceMean", 18, True, [0, -1], 0, [0, 2], (3,)),
        ("ReduceSum", 13, True, [1], 1, [1], (2, 1, 4)),
        ("ReduceSum", 11, False, [1], 0, [1], (2, 4)),
        ("ReduceMax", 17, False, None, 0, [0, 1, 2], ()),
        ("ReduceMin", 20, True, None, 1, [0, 1, 2], (1, 1, 1)),
    ],
)
def test_reduce_axes_by_attribute_or_input(op, opset, by_input, axes, keepdims, want_axes, shape):
    inits, names, attrs = {}, ["x"], {"keepdims": keepdims}
    if axes is not None and by_input:
        inits["a"], names = ints(*axes), ["x", "a"]
    elif axes is not None:
        attrs["axes"] = axes
    model = make([helper.make_node(op, names, ["y"], **attrs)], [("x", F, [2, 3, 4])], [("y", F, None)], opset, inits)
    g = load(model)
    assert only(g).attrs == {"axes": want_axes, "keepdims": keepdims, "noop_with_empty_axes": 0}
    assert g.outputs[0].shape == shape == ort_shapes(model, {"x": [2, 3, 4]})[0]


def test_reduce_noop_with_empty_axes_is_identity():
    node = helper.make_node("ReduceSum", ["x"], ["y"], noop_with_empty_axes=1)
    g = load(make([node], [("x", F, [2, 3])], [("y", F, None)], 13))
    assert only(g).op == "Identity"


@pytest.mark.parametrize(
    "opset, how, sizes",
    [(11, "attr", [2, 5]), (13, "input", [2, 5]), (13, "none", [4, 3]), (18, "num_outputs", [3, 3, 1])],
)
def test_split_sizes_always_listed(opset, how, sizes):
    n_out = len(sizes)
    outs = [f"y{i}" for i in range(n_out)]
    total = sum(sizes) if how != "none" else 7
    inits, attrs, names = {}, {"axis": -1}, ["x"]
    if how == "attr":
        attrs["split"] = sizes
    elif how == "input":
        inits["s"], names = ints(*sizes), ["x", "s"]
    elif how == "num_outputs":
        attrs["num_outputs"] = n_out
    if how == "none":
        n_out, outs, total, sizes = 2, ["y0", "y1"], 8, [4, 4]
    model = make([helper.make_node("Split", names, outs, **attrs)], [("x", F, [2, total])],
                 [(o, F, None) for o in outs], opset, inits)  # fmt: skip
    g = load(model)
    assert only(g).attrs == {"axis": 1, "split": sizes}
    assert [o.shape for o in g.outputs] == ort_shapes(model, {"x": [2, total]})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_before_opset_13_coerces_to_2d(op):
    model = make([helper.make_node(op, ["x"], ["y"], axis=1)], [("x", F, [2, 3, 4])], [("y", F, None)], 11)
    g = load(model)
    assert [n.op for n in g.nodes] == ["Flatten", op, "Reshape"]
    assert (
        g.nodes[0].attrs == {"axis": 1} and g.nodes[1].attrs == {"axis": 1} and g.nodes[2].attrs == {"shape": [2, 3, 4]}
    )
    assert g.nodes[1].inputs[0].shape == (2, 12)
    assert g.outputs[0].shape == ort_shapes(model, {"x": [2, 3, 4]})[0]


def test_softmax_one_axis_from_opset_13_and_on_the_last_axis():
    g13 = load(make([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", F, [2, 3, 4])], [("y", F, None)], 13))
    assert only(g13).attrs == {"axis": 1}
    g11 = load(make([helper.make_node("Softmax", ["x"], ["y"])], [("x", F, [2, 3, 4])], [("y", F, None)], 11))
    assert [n.op for n in g11.nodes] == ["Flatten", "Softmax", "Reshape"]  # opset 11's default axis is 1
    last = load(make([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", F, [2, 3, 4])], [("y", F, None)], 11))
    assert only(last).attrs == {"axis": 2}


def test_clip_bounds_from_inputs():
    nodes = [helper.make_node("Clip", ["x", "lo"], ["y"]), helper.make_node("Clip", ["y", "", "hi"], ["z"]),
             helper.make_node("Clip", ["z"], ["w"])]  # fmt: skip
    g = load(make(nodes, [("x", F, [4])], [("w", F, None)], 13, {"lo": np.float32(-1), "hi": np.float32(6)}))
    assert [n.attrs for n in g.nodes] == [{"min": -1.0, "max": np.inf}, {"min": -np.inf, "max": 6.0},
                                          {"min": -np.inf, "max": np.inf}]  # fmt: skip
    assert all(len(n.inputs) == 1 for n in g.nodes)


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_without_axes_and_unsqueeze_negative_axes(opset):
    axes = {"axes": [-1, 0]} if opset < 13 else {}
    nodes = [helper.make_node("Squeeze", ["x"], ["y"]),
             helper.make_node("Unsqueeze", ["y", "a"] if opset >= 13 else ["y"], ["z"], **axes)]  # fmt: skip
    model = make(nodes, [("x", F, [1, 3, 1, 2])], [("z", F, None)], opset, {"a": ints(-1, 0)} if opset >= 13 else {})
    g = load(model)
    assert g.nodes[0].attrs == {"axes": [0, 2]} and g.nodes[1].attrs == {"axes": [0, 3]}
    assert g.outputs[0].shape == (1, 3, 2, 1) == ort_shapes(model, {"x": [1, 3, 1, 2]})[0]


def test_gather_axis_and_negative_constant_indices():
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=-1)
    g = load(make([node], [("x", F, [2, 5])], [("y", F, None)], 13, {"i": ints(-1, 0)}))
    n = only(g)
    assert n.attrs == {"axis": 1} and n.inputs[1].const.tolist() == [4, 0]


def test_pad_resize_expand_tile_constant_inputs_become_attributes():
    nodes = [
        helper.make_node("Pad", ["x", "p", "v"], ["a"], mode="constant"),
        helper.make_node("Resize", ["a", "", "s"], ["b"], mode="linear"),
        helper.make_node("Expand", ["b", "e"], ["c"]),
        helper.make_node("Tile", ["c", "t"], ["d"]),
    ]
    inits = {"p": ints(0, 0, 1, 1, 0, 0, 1, 1), "v": np.float32(0.5), "s": np.array([1, 1, 2, 1.5], np.float32),
             "e": ints(2, 1, 1, 1), "t": ints(1, 1, 1, 2)}  # fmt: skip
    model = make(nodes, [("x", F, [1, 3, 4, 4])], [("d", F, None)], 13, inits)
    g = load(model)
    pad, resize, expand, tile = g.nodes
    assert pad.attrs == {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "constant_value": 0.5, "mode": "constant"}
    assert resize.attrs["sizes"] == [1, 3, 12, 9] and resize.attrs["scales"] == [1.0, 1.0, 2.0, 1.5]
    assert resize.attrs["mode"] == "linear" and resize.attrs["coordinate_transformation_mode"] == "half_pixel"
    assert expand.attrs == {"shape": [2, 3, 12, 9]} and tile.attrs == {"repeats": [1, 1, 1, 2]}
    assert all(len(n.inputs) == 1 for n in g.nodes)
    assert g.outputs[0].shape == ort_shapes(model, {"x": [1, 3, 4, 4]})[0]


def test_conv_transpose_output_shape_becomes_pads():
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], output_shape=[10, 8])
    model = make([node], [("x", F, [1, 1, 4, 4])], [("y", F, None)], 13, {"w": np.ones((1, 2, 3, 3), np.float32)})
    g = load(model)
    a = only(g).attrs
    assert "output_shape" not in a and a["kernel_shape"] == [3, 3] and a["strides"] == [2, 2]
    for i, size in enumerate([10, 8]):  # out = stride*(in-1) + output_padding + kernel - pads
        assert 2 * 3 + a["output_padding"][i] + 3 - a["pads"][i] - a["pads"][2 + i] == size
    assert g.outputs[0].shape == (1, 2, 10, 8) == ort_shapes(model, {"x": [1, 1, 4, 4]})[0]


def test_variadic_sum_mean_become_binary_chains():
    nodes = [helper.make_node("Sum", ["x", "y", "z"], ["s"]), helper.make_node("Mean", ["s", "x"], ["m"])]
    model = make(nodes, [(n, F, [2, 3]) for n in "xyz"], [("m", F, None)])
    g = load(model)
    assert [n.op for n in g.nodes] == ["Add", "Add", "Add", "Div"]
    assert g.nodes[-1].inputs[1].const == 2


def test_defaults_are_filled_in():
    nodes = [
        helper.make_node("LeakyRelu", ["x"], ["a"]),
        helper.make_node("Gemm", ["a", "w"], ["b"], transB=1),
        helper.make_node("Dropout", ["b"], ["c"]),  # (of floats: Dropout takes no int64)
        helper.make_node("Cast", ["c"], ["d"], to=TensorProto.INT64),
    ]
    g = load(make(nodes, [("x", F, [2, 3])], [("d", I64, None)], 13, {"w": np.ones((4, 3), np.float32)}))
    assert [n.op for n in g.nodes] == ["LeakyRelu", "Gemm", "Identity", "Cast"]
    assert g.nodes[0].attrs == {"alpha": 0.01}
    assert g.nodes[1].attrs == {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 1}
    assert g.nodes[3].attrs == {"to": "int64"} and g.outputs[0].type.dtype == "int64"


# ---------------------------------------------------------------------------------------------- folding


def shape_subgraph_model(batch="N"):
    """What converters write for `x.reshape(x.shape[0], -1)`: Shape → Gather → Unsqueeze → Concat → Reshape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["zero"], value_int=0),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        helper.make_node("Constant", [], ["minus1"], value_ints=[-1]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    return make(nodes, [("x", F, [batch, 3, 4, 4])], [("z", F, [batch, 48])], 13, {"ax": ints(0)})


def test_shape_subgraph_folds_away():
    g = load(shape_subgraph_model())
    assert [n.op for n in g.nodes] == ["Reshape", "Relu"]
    assert g.nodes[0].attrs == {"shape": [1, 48]}
    g4 = load(shape_subgraph_model(), {"x": [4, 3, 4, 4]})
    assert g4.nodes[0].attrs == {"shape": [4, 48]} and g4.outputs[0].shape == (4, 48)
    assert ort_shapes(shape_subgraph_model(), {"x": [4, 3, 4, 4]}) == [(4, 48)]


def test_tf2onnx_style_model():
    """What tf2onnx writes for a Keras conv net: an NHWC input with a symbolic batch, a Transpose to NCHW, weights as
    Constant nodes, `unk__` dims, and the flatten done through Shape → Cast → Slice → Concat → Reshape."""
    w = helper.make_tensor("w", F, [4, 3, 3, 3], np.linspace(-1, 1, 108).tolist())
    nodes = [
        helper.make_node("Transpose", ["input_1:0"], ["nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Constant", [], ["conv/kernel:0"], value=w),
        helper.make_node("Conv", ["nchw", "conv/kernel:0"], ["conv"], auto_pad="SAME_UPPER", strides=[2, 2]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("Shape", ["relu"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape32"], to=TensorProto.INT32),
        helper.make_node("Slice", ["shape32", "zero", "one"], ["batch"]),
        helper.make_node("Concat", ["batch", "minus1"], ["flat32"], axis=0),
        helper.make_node("Cast", ["flat32"], ["flat"], to=I64),
        helper.make_node("Reshape", ["relu", "flat"], ["Identity:0"]),
    ]
    inits = {"zero": np.array([0], np.int32), "one": np.array([1], np.int32), "minus1": np.array([-1], np.int32)}
    model = make(nodes, [("input_1:0", F, ["unk__7", 8, 8, 3])], [("Identity:0", F, ["unk__8", 64])], 13, inits)
    g = load(model)
    assert [n.op for n in g.nodes] == ["Transpose", "Conv", "Relu", "Reshape"]
    assert g.nodes[1].attrs["pads"] == [0, 0, 1, 1] and g.nodes[-1].attrs == {"shape": [1, 64]}
    assert [v.name for v in g.inputs] == ["input_1:0"] and g.outputs[0].name == "Identity:0"  # the model's own names
    x = np.random.default_rng(0).standard_normal((3, 8, 8, 3)).astype(np.float32)
    g3 = load(model, {"input_1:0": [3, 8, 8, 3]})
    want = ReferenceEvaluator(model).run(None, {"input_1:0": x})[0]
    np.testing.assert_allclose(run_in_process(g3, {"input_1:0": x})["Identity:0"], want, rtol=1e-5, atol=1e-5)


def test_if_with_constant_condition_takes_its_branch():
    then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"])], "then", [], [helper.make_tensor_value_info("t", F, [2, 3])]
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, [2, 3])]
    )
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ReduceProd", ["s"], ["n"], keepdims=0),
        helper.make_node("Greater", ["n", "five"], ["big"]),
        helper.make_node("If", ["big"], ["y"], then_branch=then, else_branch=other),
    ]
    g = load(make(nodes, [("x", F, [2, 3])], [("y", F, [2, 3])], 13, {"five": np.int64(5)}))
    assert [n.op for n in g.nodes] == ["Relu", "Identity"] and g.outputs[0].name == "y"


def test_constant_of_shape_range_cast_fold():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=1),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], value=helper.make_tensor("v", F, [1], [1.0])),
        helper.make_node("Range", ["r0", "r1", "r2"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=F),
        helper.make_node("Mul", ["ones", "rf"], ["k"]),
        helper.make_node("Add", ["x", "k"], ["y"]),
    ]
    inits = {"r0": np.int64(0), "r1": np.int64(4), "r2": np.int64(1)}
    g = load(make(nodes, [("x", F, [2, 3, 4])], [("y", F, None)], 17, inits))
    n = only(g)
    assert n.op == "Add" and n.inputs[1].const.tolist() == [[0, 1, 2, 3]] * 3


def test_constant_node_weights_in_every_form():
    w = helper.make_tensor("w", F, [2, 1, 1, 1], [2.0, 3.0])
    nodes = [
        helper.make_node("Constant", [], ["w"], value=w),
        helper.make_node("Constant", [], ["b"], value_floats=[0.5, 0.25]),
        helper.make_node("Conv", ["x", "w", "b"], ["y"]),
        helper.make_node("Constant", [], ["k"], value_float=2.0),
        helper.make_node("Mul", ["y", "k"], ["z"]),
    ]
    g = load(make(nodes, [("x", F, [1, 1, 3, 3])], [("z", F, None)]))
    conv, mul = g.nodes
    assert conv.inputs[1].const.reshape(-1).tolist() == [2.0, 3.0] and conv.inputs[2].const.tolist() == [0.5, 0.25]
    assert mul.inputs[1].const == 2.0 and mul.inputs[1].dtype == "float32"
    assert {v.name for v in g.constants()} == {"w", "b", "k"}


@pytest.mark.parametrize(
    "node, opset, inits",
    [
        (helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2), 21,
         {"s": np.arange(4, dtype=np.float32), "b": np.ones(4, np.float32)}),
        (helper.make_node("Shrink", ["x"], ["y"], lambd=0.5, bias=0.1), 18, {}),
        (helper.make_node("MeanVarianceNormalization", ["x"], ["y"]), 13, {}),
        (helper.make_node("MeanVarianceNormalization", ["x"], ["y"]), 17, {}),  # the opset-13 body at opset 17
    ],
    ids=lambda v: getattr(v, "op_type", None) or "",
)  # fmt: skip
def test_ops_defined_as_onnx_functions_are_expanded(node, opset, inits):
    model = make([node], [("x", F, [2, 4, 3, 3])], [("y", F, [2, 4, 3, 3])], opset, inits)
    g = load(model)
    assert node.op_type not in {n.op for n in g.nodes} and all(n.op in ONNX_OPS for n in g.nodes)
    x = np.random.default_rng(0).standard_normal((2, 4, 3, 3)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(run_in_process(g, {"x": x})["y"], want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------- input shapes


def sym_model(dims):
    return make([helper.make_node("Relu", ["x"], ["y"])], [("x", F, dims)], [("y", F, None)])


def test_symbolic_batch_defaults_to_one_and_input_shapes_fix_it():
    assert load(sym_model(["batch", 8])).inputs[0].shape == (1, 8)
    assert load(sym_model(["batch", 8]), {"x": [6, 8]}).outputs[0].shape == (6, 8)
    assert load(sym_model([None, 8])).inputs[0].shape == (1, 8)  # an unnamed unknown dim
    assert load(sym_model(["b", "n"]), {"x": [2, 5]}).inputs[0].shape == (2, 5)


def test_minus_one_and_zero_dims_are_dynamic_as_converters_write_them():
    # paddle2onnx writes a dynamic batch as -1, keras2onnx as 0: --input-shapes fixes them, and a leading one is the
    # batch as an unnamed dim is
    assert load(sym_model([-1, 3, 48]), {"x": [1, 3, 48]}).inputs[0].shape == (1, 3, 48)
    assert load(sym_model([-1, 3, 48])).inputs[0].shape == (1, 3, 48)
    assert load(sym_model([1, 0, 48]), {"x": [1, 5, 48]}).outputs[0].shape == (1, 5, 48)
    with pytest.raises(InvalidModel, match=r"input 'x' dim 1 is unknown.*x:\[1,N,48\]"):
        load(sym_model([1, -1, 48]))


def test_a_scalar_input():
    g = load(sym_model([]), parse_input_shapes("x:[]"))
    assert g.inputs[0].shape == () and g.outputs[0].shape == ()


def test_symbol_bound_on_one_input_fixes_the_others():
    node = helper.make_node("Add", ["x", "y"], ["z"])
    model = make([node], [("x", F, ["b", "len"]), ("y", F, ["b", "len"])], [("z", F, None)])
    g = load(model, {"x": [3, 7]})
    assert [v.shape for v in g.inputs] == [(3, 7), (3, 7)]


@pytest.mark.parametrize(
    "dims, given, match",
    [
        (["batch", "len"], None, r"input 'x' dim 1 is 'len'.*--input-shapes"),
        (["batch", 8], {"x": [1, 9]}, "dim 1 is 8 in the model"),
        (["batch", 8], {"x": [1, 8, 1]}, "rank 2"),
        (["batch", 8], {"nope": [1, 8]}, "model's inputs are 'x'"),
    ],
)
def test_unresolved_or_wrong_input_shapes(dims, given, match):
    with pytest.raises(InvalidModel, match=match):
        load(sym_model(dims), given)


def test_parse_input_shapes():
    assert parse_input_shapes("x:[1,3,224,224],y:[1,8]") == {"x": [1, 3, 224, 224], "y": [1, 8]}
    assert parse_input_shapes(" input:0:[1, 8] , s:[] ") == {"input:0": [1, 8], "s": []}
    # tvmc's form: separated by spaces
    want = {"input_ids": [1, 32], "attention_mask": [1, 32]}
    assert parse_input_shapes("input_ids:[1,32] attention_mask:[1,32]") == want
    assert parse_input_shapes("input_ids:[1, 32]   attention_mask:[1,32] sr:[]") == {**want, "sr": []}
    for bad in ["x:[1,a]", "x=[1]", "x:[1", "x:[-1]"]:
        with pytest.raises(InvalidModel):
            parse_input_shapes(bad)


# ---------------------------------------------------------------------------------------------- errors


def test_every_unsupported_op_is_listed_in_one_error():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Hardmax", ["a"], ["b"], name="hard1"),
        helper.make_node("Det", ["b"], ["c"], name="det"),
        helper.make_node("Hardmax", ["c"], ["d"], name="hard2"),
        helper.make_node("Fancy", ["d"], ["e"], name="mine", domain="com.example"),
    ]
    model = make(nodes, [("x", F, [3, 3])], [("e", F, [3, 3])], 13, {"ax": ints(0)}, ["com.example"])
    with pytest.raises(UnsupportedOp) as err:
        load(model)
    assert err.value.ops == {"Hardmax": ["hard1", "hard2"], "Det": ["det"], "com.example.Fancy": ["mine"]}
    assert all(s in str(err.value) for s in ["hard1", "hard2", "det", "com.example.Fancy"])


def test_runtime_shape_parameters_are_reported():
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["y"], name="r"),
        helper.make_node("Range", ["a", "b", "c"], ["z"]),
    ]
    model = make(nodes, [("x", F, [6]), ("s", I64, [2]), ("a", I64, []), ("b", I64, []), ("c", I64, [])],
                 [("y", F, [2, 3]), ("z", I64, ["n"])])  # fmt: skip
    with pytest.raises(UnsupportedOp, match="'s' \\(shape\\) must be a compile-time constant") as err:
        load(model)
    assert set(err.value.ops) == {"Reshape", "Range"}


def valid_bytes():
    return conv_model("VALID").SerializeToString()


@pytest.mark.parametrize(
    "data, match",
    [
        (b"\x08\x07garbage\xff\xff\xff", "not an ONNX model"),
        (b"", "no graph"),
        (valid_bytes()[: len(valid_bytes()) // 2], "not an ONNX model|checker|no graph"),
        (b"hello world, this is not protobuf", "not an ONNX model|no graph"),
    ],
)
def test_malformed_bytes(data, match):
    with pytest.raises(InvalidModel, match=match):
        load(data)


def test_undefined_value_and_missing_file(tmp_path):
    model = make([helper.make_node("Add", ["x", "ghost"], ["y"])], [("x", F, [2])], [("y", F, [2])])
    with pytest.raises(InvalidModel, match="checker"):
        load(model)
    with pytest.raises(InvalidModel, match="no such model file"):
        load(tmp_path / "missing.onnx")
    path = tmp_path / "m.onnx"
    path.write_bytes(valid_bytes())
    assert load(path).outputs[0].shape == (1, 2, 4, 4)
    assert load(str(path)).outputs[0].shape == (1, 2, 4, 4)


def test_unsupported_dtype_names_the_value():
    model = make([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT16, [2])],
                 [("y", TensorProto.FLOAT16, None)])  # fmt: skip
    with pytest.raises(UnsupportedDType, match="'x' has ONNX dtype FLOAT16"):
        load(model)


def test_graph_inputs_and_outputs_keep_their_names_internal_values_are_sanitized_and_unique():
    nodes = [helper.make_node("Relu", ["in:0"], ["a/b"]), helper.make_node("Relu", ["a/b"], ["a.b"]),
             helper.make_node("Relu", ["a.b"], ["a_b"])]  # fmt: skip
    g = load(make(nodes, [("in:0", F, [2])], [("a_b", F, None)]))
    assert [v.name for v in g.inputs] == ["in:0"] and [v.name for v in g.outputs] == ["a_b"]
    assert [n.outputs[0].name for n in g.nodes] == ["a_b_1", "a_b_2", "a_b"]
    x = np.array([-1.0, 2.0], np.float32)
    assert run_in_process(g, {"in:0": x})["a_b"].tolist() == [0.0, 2.0]


# ---------------------------------------------------------------------------------------------- ONNX's own models

# the backend node tests run end to end in test_conformance.py


def test_light_model_zoo_graphs_load():
    import pathlib

    light = pathlib.Path(onnx.__file__).parent / "backend/test/data/light"
    files = sorted(light.glob("light_*.onnx"))
    if not files:
        pytest.skip("onnx ships no light model-zoo graphs here")
    for f in files:
        g = load(f)
        assert g.outputs[0].shape[:2] == (1, 1000), f.name
        assert all(n.op in ONNX_OPS or n.op in ("Flatten",) for n in g.nodes)


def test_an_opset_11_shape_computation_folds_at_its_own_opset():
    """Unsqueeze with the `axes` attribute (opset < 13) folds: a bare node was evaluated at onnx's newest opset, where
    that attribute is an error, so ddddocr's and paddle2onnx's Shape -> Gather -> Unsqueeze -> Concat -> Reshape
    chains were left as a run-time shape (found by the real-model corpus)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        helper.make_node("Unsqueeze", ["d0"], ["u"], axes=[0]),
        helper.make_node("Concat", ["u", "m1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "i0"),
        numpy_helper.from_array(np.array([-1], np.int64), "m1"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
        inits,
    )
    g = load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]))
    assert [(n.op, n.attrs) for n in g.nodes] == [("Reshape", {"shape": [2, 12]})]


def _tiny(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "case",
    [
        # a 113-byte model asking for 4 GiB while it is folded
        (
            "ConstantOfShape",
            [helper.make_node("ConstantOfShape", ["s"], ["y"], name="big")],
            [],
            [numpy_helper.from_array(np.array([2**28, 4], np.int64), "s")],
            "ConstantOfShape node 'big'",
        ),
        ("input", [helper.make_node("Relu", ["x"], ["y"])], [("x", [2**31])], [], "input 'x' is \\[2147483648\\]"),
        (
            "Expand",
            [helper.make_node("Expand", ["x", "s"], ["y"], name="wide")],
            [("x", [1])],
            [numpy_helper.from_array(np.array([2**40], np.int64), "s")],
            "output of Expand node 'wide'",
        ),
        (
            "Range",
            [helper.make_node("Range", ["a", "b", "c"], ["y"], name="many")],
            [],
            [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("a", 0), ("b", 2**40), ("c", 1))],
            "Range node 'many'",
        ),
    ],
    ids=lambda c: c[0],
)
def test_a_model_whose_numbers_ask_for_gigabytes_is_refused_before_allocating(case):
    _, nodes, inputs, inits, message = case
    model = _tiny(nodes, [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])], inits)  # fmt: skip
    with pytest.raises(InvalidModel, match=message):
        load(model)


def test_a_dtype_an_op_does_not_take_is_refused_naming_it():
    # onnx.checker does not look at types: a BatchNormalization of uint8 data, an Add of float and int64
    bn = make([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")],
              [("x", TensorProto.UINT8, [1, 2, 3])], [("y", TensorProto.UINT8, None)], 15,
              {k: np.ones(2, np.float32) for k in "sbmv"})  # fmt: skip
    with pytest.raises(InvalidModel, match="BatchNormalization node 'bn': input 0 \\('x'\\) is tensor\\(uint8\\)"):
        load(bn)
    add = make([helper.make_node("Add", ["x", "k"], ["y"], name="mixed")], [("x", F, [2])], [("y", F, None)], 13,
               {"k": np.ones(2, np.int64)})  # fmt: skip
    with pytest.raises(InvalidModel, match="Add node 'mixed': input 1 \\('k'\\) is tensor\\(int64\\) while another"):
        load(add)


def test_conv_window_attributes_are_bounded():
    w = {"w": np.ones((2, 1, 3, 3), np.float32)}
    for attrs, message in [
        ({"kernel_shape": [3, -2, 2**40]}, "kernel_shape \\[3, -2, 1099511627776\\] must be 2"),
        ({"strides": [0, 1]}, "strides \\[0, 1\\] must be 2 values of at least 1"),
        ({"kernel_shape": [2, 2]}, "kernel_shape \\[2, 2\\] but the weight is \\[2, 1, 3, 3\\]"),
    ]:
        model = make([helper.make_node("Conv", ["x", "w"], ["y"], name="c", **attrs)], [("x", F, [1, 1, 5, 5])],
                     [("y", F, ["n", "f", "h", "w"])], 13, w)  # fmt: skip
        with pytest.raises(InvalidModel, match=f"Conv node 'c': {message}"):
            load(model)


def test_an_axis_out_of_range_and_a_non_finite_weight_are_refused_naming_the_node():
    cat = make([helper.make_node("Concat", ["x", "x"], ["y"], axis=2**33, name="cat")], [("x", F, [2, 3])],
               [("y", F, ["a", "b"])], 13)  # fmt: skip
    with pytest.raises(InvalidModel, match="Concat node 'cat': axis 8589934592 is out of range for a value of rank 2"):
        load(cat)
    w = np.ones((2, 1, 1, 1), np.float32)
    w[1] = np.inf
    conv = make([helper.make_node("Conv", ["x", "w"], ["y"], name="c")], [("x", F, [1, 1, 2, 2])],
                [("y", F, [1, 2, 2, 2])], 13, {"w": w})  # fmt: skip
    with pytest.raises(InvalidModel, match="Conv node 'c': its weight 'w' holds NaN or inf"):
        load(conv)
