"""Models written the way TensorFlow/Keras (tf2onnx) and PaddlePaddle (paddle2onnx) exporters write them: NHWC
inputs wrapped in Transposes, weights as Constant nodes, symbolic batch with Shape/Gather/Concat/Reshape
arithmetic, decomposed LayerNorm (ReduceMean/Sub/Pow/Sqrt/Div), GELU with Tanh, HardSigmoid/HardSwish, Resize and
ConvTranspose. Each must compile and match onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact.build import build
from compiler.artifact.runtime import Artifact
from compiler.model.onnx_import import load


def const(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array), name))


def tf_style_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    f32 = np.float32
    nodes = [
        helper.make_node("Transpose", ["images"], ["nchw"], perm=[0, 3, 1, 2]),
        const("k1", (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(f32)),
        const("b1", rng.standard_normal(8).astype(f32)),
        helper.make_node("Conv", ["nchw", "k1", "b1"], ["c1"], auto_pad="SAME_UPPER", strides=[2, 2]),
        helper.make_node("HardSigmoid", ["c1"], ["hs"], alpha=0.2, beta=0.5),
        helper.make_node("Mul", ["c1", "hs"], ["swish"]),  # hard-swish written out, as Keras does
        helper.make_node("HardSwish", ["swish"], ["hsw"]),
        # batch-dependent reshape: Shape -> Gather -> Concat -> Reshape, as tf2onnx emits for Flatten-like ops
        helper.make_node("Shape", ["hsw"], ["shp"]),
        const("zero", np.array([0], np.int64)),
        helper.make_node("Gather", ["shp", "zero"], ["batch"], axis=0),
        const("rest", np.array([8, -1], np.int64)),
        helper.make_node("Concat", ["batch", "rest"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["hsw", "newshape"], ["tokens"]),  # [N, 8, H*W/4]
        helper.make_node("Transpose", ["tokens"], ["seq"], perm=[0, 2, 1]),  # [N, T, 8]
        # LayerNorm decomposed the way older exporters write it
        const("axes", np.array([-1], np.int64)),
        helper.make_node("ReduceMean", ["seq", "axes"], ["mu"], keepdims=1),
        helper.make_node("Sub", ["seq", "mu"], ["xc"]),
        const("two", np.array(2.0, f32)),
        helper.make_node("Pow", ["xc", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1),
        const("eps", np.array(1e-5, f32)),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["xc", "sd"], ["ln"]),
        # GELU, tanh approximation
        const("c044", np.array(0.044715, f32)),
        const("s2pi", np.array(np.sqrt(2 / np.pi), f32)),
        const("half", np.array(0.5, f32)),
        const("one", np.array(1.0, f32)),
        const("three", np.array(3.0, f32)),
        helper.make_node("Pow", ["ln", "three"], ["x3"]),
        helper.make_node("Mul", ["x3", "c044"], ["x3c"]),
        helper.make_node("Add", ["ln", "x3c"], ["inner"]),
        helper.make_node("Mul", ["inner", "s2pi"], ["scaled"]),
        helper.make_node("Tanh", ["scaled"], ["th"]),
        helper.make_node("Add", ["th", "one"], ["th1"]),
        helper.make_node("Mul", ["ln", "th1"], ["g0"]),
        helper.make_node("Mul", ["g0", "half"], ["gelu"]),
        # back to an image, upsample, transposed conv, NHWC out
        helper.make_node("Transpose", ["gelu"], ["chw"], perm=[0, 2, 1]),
        const("img", np.array([0, 8, 4, 4], np.int64)),
        helper.make_node("Reshape", ["chw", "img"], ["fm"]),
        const("scales", np.array([1, 1, 2, 2], f32)),
        helper.make_node("Resize", ["fm", "", "scales"], ["up"], mode="nearest"),
        const("kt", (rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(f32)),
        helper.make_node(
            "ConvTranspose", ["up", "kt"], ["ct"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]
        ),
        helper.make_node(
            "Resize", ["ct", "", "scales"], ["up2"], mode="linear", coordinate_transformation_mode="half_pixel"
        ),
        helper.make_node("Transpose", ["up2"], ["out"], perm=[0, 2, 3, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "tf_style",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 8, 8, 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 32, 32, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def test_tf_style_model_matches_onnxruntime(tmp_path):
    model = tf_style_model()
    x = np.random.default_rng(1).standard_normal((2, 8, 8, 3)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"images": x})
    build(load(model, {"images": [2, 8, 8, 3]}), tmp_path / "tf.tar", name="tf_style")
    got = Artifact.load(tmp_path / "tf.tar").run({"images": x})["out"]
    assert got.shape == want[0].shape == (2, 32, 32, 4)
    err = np.abs(got - want[0]).max() / np.abs(want[0]).max()
    print(f"max relative error {err:.2e}")
    assert err < 1e-4


def paddle_style_model() -> onnx.ModelProto:
    """Token ids -> embeddings + position embeddings built from Range/Expand, a mask from Equal/Where, and
    ConstantOfShape/Slice/Cast shape plumbing, as paddle2onnx and HF exporters write them."""
    rng = np.random.default_rng(2)
    f32, i64 = np.float32, np.int64
    nodes = [
        const("table", rng.standard_normal((50, 16)).astype(f32)),
        const("pos_table", rng.standard_normal((32, 16)).astype(f32)),
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),  # [N, T, 16]
        helper.make_node("Shape", ["ids"], ["ids_shape"]),
        const("one_i", np.array([1], i64)),
        const("two_i", np.array([2], i64)),
        helper.make_node("Slice", ["ids_shape", "one_i", "two_i"], ["t_vec"]),
        const("zero_s", np.array(0, i64)),
        const("one_s", np.array(1, i64)),
        helper.make_node("Squeeze", ["t_vec"], ["t"]),
        helper.make_node("Range", ["zero_s", "t", "one_s"], ["positions"]),
        const("zero_i", np.array([0], i64)),
        helper.make_node("Unsqueeze", ["positions", "zero_i"], ["pos2"]),
        helper.make_node("Expand", ["pos2", "ids_shape"], ["pos_ids"]),
        helper.make_node("Gather", ["pos_table", "pos_ids"], ["pos_emb"], axis=0),
        helper.make_node("Add", ["emb", "pos_emb"], ["h"]),
        # padding mask: ids == 0 -> -1e4 added to the scores, via Equal / Where / ConstantOfShape
        helper.make_node("Equal", ["ids", "zero_s"], ["is_pad"]),
        helper.make_node(
            "ConstantOfShape", ["ids_shape"], ["zeros"], value=numpy_helper.from_array(np.array([0.0], f32))
        ),
        const("neg", np.array(-1e4, f32)),
        helper.make_node("Where", ["is_pad", "neg", "zeros"], ["bias"]),
        helper.make_node("Unsqueeze", ["bias", "one_i"], ["bias3"]),  # [N, 1, T]
        helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["h", "ht"], ["scores"]),  # [N, T, T]
        helper.make_node("Add", ["scores", "bias3"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["attn"], axis=-1),
        helper.make_node("MatMul", ["attn", "h"], ["ctx"]),
        helper.make_node("Cast", ["ctx"], ["out"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "paddle_style",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "T"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", "T", 16])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_paddle_style_model_matches_onnxruntime(tmp_path):
    model = paddle_style_model()
    ids = np.random.default_rng(3).integers(0, 50, (2, 12)).astype(np.int64)
    ids[:, -3:] = 0  # padding
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})
    build(load(model, {"ids": [2, 12]}), tmp_path / "p.tar", name="paddle_style")
    got = Artifact.load(tmp_path / "p.tar").run({"ids": ids})["out"]
    err = np.abs(got - want[0]).max() / np.abs(want[0]).max()
    print(f"max relative error {err:.2e}")
    assert got.shape == (2, 12, 16) and err < 1e-4


def test_output_without_declared_shape_is_accepted():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    g = load(model, {"x": [2, 3]})
    assert g.outputs[0].shape == (2, 3)
