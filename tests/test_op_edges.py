"""Attribute corners the per-op fuzzer (tests/test_op_fuzz.py) found where tilefarm and onnxruntime disagreed, each
pinned by its smallest model and compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact.build import compile_model
from compiler.artifact.runtime import Artifact


def _matches_onnxruntime(node, x: np.ndarray, tmp_path, inits=()) -> None:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    compile_model(model, tmp_path / "m.tar")
    got = Artifact.load(tmp_path / "m.tar").run({"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


X = np.random.default_rng(0).standard_normal((1, 2, 7, 5)).astype(np.float32)
ROI = numpy_helper.from_array(np.array([], np.float32), "roi")


def test_resize_pytorch_half_pixel_to_one_pixel_reads_the_first(tmp_path):
    # length_resized 1: the source coordinate is 0 (tilefarm took onnx's reference's -0.5, which cubic tells apart)
    sizes = numpy_helper.from_array(np.array([1, 2, 1, 1], np.int64), "sizes")
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="cubic",
                            coordinate_transformation_mode="pytorch_half_pixel")  # fmt: skip
    _matches_onnxruntime(node, X, tmp_path, [ROI, sizes])


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_align_corners_divides_by_the_output_length(tmp_path, mode):
    # a scale of 2.5 on 5 columns makes 12 (12.5 rounded down): the corners align over 11 steps, not 11.5
    scales = numpy_helper.from_array(np.array([1, 1, 1, 2.5], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode=mode,
                            coordinate_transformation_mode="align_corners")  # fmt: skip
    _matches_onnxruntime(node, X, tmp_path, [ROI, scales])


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_ceil_mode_drops_a_last_window_that_starts_in_the_padding(tmp_path, op):
    # 7 rows, window 2, stride 3, pads 1: ceil gives 4 windows, the last starting at row 8 (past the input): 3
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[2, 2], strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1)
    _matches_onnxruntime(node, X, tmp_path)


def test_ceil_mode_under_valid_padding_and_an_empty_output(tmp_path):
    # 2 rows, stride 2, window 1: ceil gives 2 windows, the second starting past the input: 1 row; the output is
    # empty (a window of 2 over 1 column), so onnx's inferred shape, which keeps 2 rows, was the one returned
    node = helper.make_node("AveragePool", ["x"], ["y"], auto_pad="VALID", ceil_mode=1, kernel_shape=[1, 2],
                            strides=[2, 1])  # fmt: skip
    _matches_onnxruntime(node, X[:, :1, :2, :1], tmp_path)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("op", ["Conv", "AveragePool"])
def test_same_padding_with_a_stride_past_the_window(tmp_path, op, auto_pad):
    # strides 4 and 3 over a 1x1 window on 7 x 5: 2 x 2 outputs, the spec's pads (2 - 1) * 4 + 1 - 7 = -2 and
    # (2 - 1) * 3 + 1 - 5 = -1. onnxruntime's AveragePool crops the input by them (halved toward zero), its Conv takes
    # them as 0 (as TensorFlow and PyTorch do); tilefarm clamped both, then cropped both (MaxPool: onnxruntime refuses)
    inits = [numpy_helper.from_array(np.ones((3, 2, 1, 1), np.float32), "w")] if op == "Conv" else []
    node = helper.make_node(op, ["x", "w"] if op == "Conv" else ["x"], ["y"], auto_pad=auto_pad, kernel_shape=[1, 1],
                            strides=[4, 3])  # fmt: skip
    _matches_onnxruntime(node, X, tmp_path, inits)


@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum"])
def test_a_reduction_over_no_axes_still_applies_its_elementwise_parts(tmp_path, op):
    # noop_with_empty_axes: nothing is reduced, but L1 still gives |x|, SumSquare x*x, LogSum log(x)
    node = helper.make_node(op, ["x"], ["y"], noop_with_empty_axes=1)
    _matches_onnxruntime(node, np.abs(X) + 0.5 if op == "ReduceLogSum" else X, tmp_path)


@pytest.mark.parametrize("bounds", [["lo", "hi"], ["lo"], ["", "hi"], ["hi", "lo"]])
def test_clip_with_bounds_computed_at_run_time(tmp_path, bounds):
    """openWakeWord's mel spectrogram floors at its maximum less top_db: Clip's min is a run-time value (Max then Min,
    as ONNX defines Clip, so a min above the max gives the max)."""
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
        helper.make_node("Sub", ["mx", "db"], ["lo"]),
        helper.make_node("ReduceMin", ["x"], ["mn"], keepdims=0),
        helper.make_node("Add", ["mn", "db"], ["hi"]),
        helper.make_node("Clip", ["x", *bounds], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(1.5, np.float32), "db")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": X})[0]
    compile_model(model, tmp_path / "m.tar")
    np.testing.assert_allclose(Artifact.load(tmp_path / "m.tar").run({"x": X})["y"], want, rtol=1e-6, atol=1e-6)
