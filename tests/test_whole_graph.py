"""Whole-graph faults, each pinned by the smallest model that showed it: outputs folded to constants, a value that
is both a graph output and read by a BatchNormalization folded into its Conv, dead nodes, zero-element outputs.
Every model is compiled into an artifact and run against onnxruntime."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact.build import compile_model
from compiler.artifact.runtime import Artifact
from compiler.base.errors import InvalidModel


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    def info(name, shape, dtype=TensorProto.FLOAT):
        return helper.make_tensor_value_info(name, dtype, shape)

    graph = helper.make_graph(nodes, "g", [info(*i) for i in inputs], [info(*o) for o in outputs], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _matches_onnxruntime(model, feeds, tmp_path) -> dict[str, np.ndarray]:
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    compile_model(model, tmp_path / "m.tar")
    got = Artifact.load(tmp_path / "m.tar").run(feeds)
    for (name, g), w in zip(got.items(), want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=name)
    return got


X = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)


def test_outputs_folded_to_constants_are_copied_out(tmp_path):
    # Shape(x) and c + c fold to constants at compile time; the entry used to copy them onto themselves, so the
    # caller got whatever its output buffer held
    c = numpy_helper.from_array(np.array([1.5, 2.0], np.float32), "c")
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Add", ["c", "c"], ["cc"])]  # fmt: skip
    model = _model(nodes, [("x", [1, 4])], [("y", [1, 4]), ("s", [2], TensorProto.INT64), ("cc", [2])], [c])
    got = _matches_onnxruntime(model, {"x": X}, tmp_path)
    assert got["s"].tolist() == [1, 4]


def test_an_output_folded_to_a_constant_is_read_by_a_later_kernel_from_the_constants(tmp_path):
    # conv(c) folds to a constant that is both an output and read by the Concat: the Concat's kernel read it from the
    # output buffer, which the entry fills only after the kernels ran (the graph fuzzer's first wrong answer)
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in [("c", (1, 2, 2, 2)), ("w", (2, 2, 1, 1))]]  # fmt: skip
    nodes = [helper.make_node("Conv", ["c", "w"], ["k"]), helper.make_node("Concat", ["k", "x"], ["y"], axis=1)]
    model = _model(nodes, [("x", [1, 1, 2, 2])], [("y", [1, 3, 2, 2]), ("k", [1, 2, 2, 2])], inits)
    _matches_onnxruntime(model, {"x": rng.standard_normal((1, 1, 2, 2)).astype(np.float32)}, tmp_path)


def test_a_model_that_folds_to_constants_alone_compiles(tmp_path):
    # no kernel at all: the library holds the entry and the constants ("nothing to compile" before)
    model = _model([helper.make_node("Shape", ["x"], ["s"])], [("x", [1, 4])], [("s", [2], TensorProto.INT64)])
    assert _matches_onnxruntime(model, {"x": X}, tmp_path)["s"].tolist() == [1, 4]


def test_a_conv_result_that_is_an_output_keeps_its_value_when_a_batchnorm_reads_it(tmp_path):
    # fold_batchnorm took the BatchNormalization for the conv result's only reader and folded it into the conv's
    # weights: the graph output `c1` then came back uninitialized (NaN)
    rng = np.random.default_rng(1)
    stats = [rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(4), rng.random(4) + 0.5]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    inits += [numpy_helper.from_array(s.astype(np.float32), n) for s, n in zip(stats, ["s", "b", "mu", "var"])]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "s", "b", "mu", "var"], ["bn"])]  # fmt: skip
    model = _model(nodes, [("x", [1, 3, 8, 8])], [("bn", [1, 4, 8, 8]), ("c1", [1, 4, 8, 8])], inits)
    _matches_onnxruntime(model, {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}, tmp_path)


def test_nodes_no_output_reads_are_dropped(tmp_path):
    # conv5 reads conv3 and nothing reads conv5: its fused group had no output ("a ComputeDAG needs at least one
    # computed output tensor")
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in [("a", (2, 1, 1, 1)), ("b", (2, 2, 1, 1)), ("c", (2, 1, 1, 1))]]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "a"], ["conv3"]), helper.make_node("Conv", ["conv3", "b"], ["conv5"]),
             helper.make_node("Conv", ["conv3", "c"], ["conv7"], group=2)]  # fmt: skip
    model = _model(nodes, [("x", [1, 1, 2, 2])], [("conv7", [1, 2, 2, 2])], inits)
    _matches_onnxruntime(model, {"x": rng.standard_normal((1, 1, 2, 2)).astype(np.float32)}, tmp_path)


@pytest.mark.parametrize("profile", [False, True])
def test_run_reports_a_zero_element_output_without_a_traceback(tmp_path, profile):
    ints = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in [("st", 2), ("en", 2), ("ax", 1)]]
    model = _model([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])], [("x", [1, 4])], [("y", [1, 0])], ints)
    assert _matches_onnxruntime(model, {"x": X}, tmp_path)["y"].shape == (1, 0)
    cmd = [sys.executable, "-m", "tilefarm", "run", str(tmp_path / "m.tar"), "--repeat", "2"]
    out = subprocess.run(cmd + (["--profile"] if profile else []), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "y: float32[1, 0]  (no elements)" in out.stdout


def test_a_model_with_external_data_compiles_from_its_path_and_a_missing_file_is_named(tmp_path):
    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [1, 64])], [("y", [1, 32])], [w])
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})[0]
    compile_model(tmp_path / "m.onnx", tmp_path / "m.tar")
    np.testing.assert_allclose(Artifact.load(tmp_path / "m.tar").run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(InvalidModel, match="external files .*weights.bin.*by its path"):
        compile_model((tmp_path / "m.onnx").read_bytes(), tmp_path / "b.tar")
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(InvalidModel, match="m.onnx keeps tensors in external files not found in .*'w' in 'weights"):
        compile_model(tmp_path / "m.onnx", tmp_path / "c.tar")


def test_a_concat_of_a_thousand_inputs_compiles(tmp_path):
    """Concat's selects nest log2(n) deep: as a chain, 400 or more inputs overflowed Python's recursion in every pass
    over the expression."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    model = _model([helper.make_node("Concat", ["x"] * 1000, ["y"], axis=0)], [("x", [2, 4])], [("y", [2000, 4])])
    _matches_onnxruntime(model, {"x": x}, tmp_path)


def test_a_chain_of_twenty_thousand_nodes_compiles(tmp_path):
    n = 20_000
    nodes = [helper.make_node("Relu" if k % 2 else "Neg", [f"v{k - 1}" if k else "x"], [f"v{k}" if k < n - 1 else "y"])
             for k in range(n)]  # fmt: skip
    _matches_onnxruntime(_model(nodes, [("x", [1, 4])], [("y", [1, 4])]), {"x": X}, tmp_path)
