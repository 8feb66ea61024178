"""`tilefarm quantize` (tilefarm/quantize.py): static QDQ quantization calibrated on the user's .npz and dynamic
quantization through onnxruntime's tools; the model it writes runs in onnxruntime and compiles in tilefarm to the same
outputs; its report of agreement with the float model; clear errors for bad calibration files."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact.build import run_in_process
from compiler.model.onnx_import import load
from tilefarm.cli import main
from tilefarm.examples import EXAMPLES

RNG = np.random.default_rng(3)


@pytest.fixture()
def cnn(tmp_path):
    """ResNet-18 on 32 x 32 images, its float model and 8 calibration samples."""
    model = EXAMPLES["resnet18"](num_classes=10)
    for d in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        d.dim_value = 32
    path = tmp_path / "resnet18.onnx"
    onnx.save(model, str(path))
    np.savez(tmp_path / "calib.npz", input=RNG.standard_normal((8, 3, 32, 32)).astype(np.float32))
    return path, tmp_path / "calib.npz"


@pytest.mark.parametrize("method, per_channel", [("minmax", True), ("entropy", False), ("percentile", True)])
def test_static_quantization_writes_a_qdq_model_tilefarm_and_onnxruntime_agree_on(cnn, tmp_path, capsys, method,
                                                                                  per_channel):  # fmt: skip
    model, calib = cnn
    out = tmp_path / "resnet18.int8.onnx"
    argv = ["quantize", str(model), "--calibration", str(calib), "--method", method, "-o", str(out)]
    assert main(argv + (["--per-channel"] if per_channel else [])) == 0
    report = capsys.readouterr().out
    assert f"wrote {out}" in report and "output: max |diff|" in report and "within one output step" in report
    q = onnx.load(str(out))
    ops = {n.op_type for n in q.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    weight_axes = {
        a.i for n in q.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute if a.name == "axis"
    }
    assert (weight_axes == {0}) == per_channel
    x = RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    if method == "minmax":  # the calibration method changes only the scales: one compile checks the form
        np.testing.assert_array_equal(run_in_process(load(q), {"input": x})["output"], want)


def test_report_numbers_are_the_float_models_agreement(cnn, tmp_path):
    from tilefarm.quantize import quantize

    model, calib = cnn
    out = tmp_path / "q.onnx"
    (a,) = quantize(model, out, calib, per_channel=True)
    samples = np.load(calib)["input"]
    f = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    i = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    diffs = np.concatenate([np.abs(i.run(None, {"input": s[None]})[0] - f.run(None, {"input": s[None]})[0]).ravel()
                            for s in samples])  # fmt: skip
    assert a.output == "output" and a.max_abs_diff == pytest.approx(float(diffs.max()))
    assert a.within_step == pytest.approx(float((diffs <= a.step * (1 + 1e-6)).mean()))


def test_dynamic_quantization_of_a_matmul_net(tmp_path, capsys):
    w1, w2 = (RNG.standard_normal(s).astype(np.float32) * 0.2 for s in ((16, 32), (32, 8)))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )  # fmt: skip
    path, out = tmp_path / "mlp.onnx", tmp_path / "mlp.int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    assert main(["quantize", str(path), "--dynamic", "-o", str(out)]) == 0
    assert "MatMulInteger" in {n.op_type for n in onnx.load(str(out)).graph.node}
    assert "y: max |diff|" not in capsys.readouterr().out  # no samples, no report
    np.savez(tmp_path / "x.npz", x=RNG.standard_normal((8, 16)).astype(np.float32))  # two batches of the model's 4
    assert main(["quantize", str(path), "--dynamic", "--calibration", str(tmp_path / "x.npz"), "-o", str(out)]) == 0
    assert "y: max |diff|" in capsys.readouterr().out  # a float output: no quantization step to count within
    np.savez(tmp_path / "x.npz", x=RNG.standard_normal((6, 16)).astype(np.float32))
    assert main(["quantize", str(path), "--dynamic", "--calibration", str(tmp_path / "x.npz"), "-o", str(out)]) == 2
    assert "batches of 4, so N must be a multiple of it; got 6" in capsys.readouterr().err
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    want = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(run_in_process(load(onnx.load(str(out))), {"x": x})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"x": np.zeros((2, 3, 32, 32), np.float32)}, "has no array for input 'input'; it holds 'x'"),
        ({"input": np.zeros((2, 3, 16, 32), np.float32)}, r"shape \[2, 3, 16, 32\]; the model takes \[N, 3, 32, 32\]"),
        ({"input": np.zeros((3, 32, 32), np.float32)}, r"shape \[3, 32, 32\]"),
        ({"input": np.zeros((2, 3, 32, 32), np.int64)}, "is int64; calibration inputs are float"),
        ({"input": np.full((2, 3, 32, 32), np.nan, np.float32)}, "holds NaN"),
        ({"input": np.zeros((2, 3, 32, 32), np.float32), "extra": np.zeros(2)}, "'extra', which the model has no"),
        ({"input": np.zeros((0, 3, 32, 32), np.float32)}, r"same number \(> 0\) of samples"),
    ],
)
def test_bad_calibration_files_are_named(cnn, tmp_path, capsys, arrays, message):
    model, _ = cnn
    np.savez(tmp_path / "bad.npz", **arrays)
    assert (
        main(["quantize", str(model), "--calibration", str(tmp_path / "bad.npz"), "-o", str(tmp_path / "q.onnx")]) == 2
    )
    assert re.search(message, capsys.readouterr().err)


def test_missing_files_and_calibration_are_named(cnn, tmp_path, capsys):
    model, calib = cnn
    assert main(["quantize", str(model), "-o", str(tmp_path / "q.onnx")]) == 2
    assert "static quantization needs --calibration" in capsys.readouterr().err
    assert main(["quantize", str(tmp_path / "none.onnx"), "--dynamic", "-o", str(tmp_path / "q.onnx")]) == 2
    assert "no such model file" in capsys.readouterr().err
    assert main(["quantize", str(model), "--calibration", str(tmp_path / "none.npz"), "-o", str(tmp_path / "q")]) == 2
    assert "no such calibration file" in capsys.readouterr().err
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    assert main(["quantize", str(model), "--calibration", str(tmp_path / "junk.npz"), "-o", str(tmp_path / "q")]) == 2
    assert "is not a .npz of arrays" in capsys.readouterr().err
