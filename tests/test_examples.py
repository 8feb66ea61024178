"""The example models: valid ONNX, runnable in onnxruntime, non-degenerate outputs, reproducible from the seed."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tilefarm.examples import EXAMPLES, save

# name -> (input name, input shape at batch 2, output shape at batch 2)
EXPECTED = {
    "tiny_cnn": ("input", [2, 3, 32, 32], (2, 10)),
    "resnet18": ("input", [2, 3, 224, 224], (2, 1000)),
    "mobilenetv2": ("input", [2, 3, 224, 224], (2, 1000)),
    "encoder": ("x", [2, 128, 256], (2, 128, 256)),
}


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    return {name: build(seed=0) for name, build in EXAMPLES.items()}


def test_every_example_is_listed():
    assert set(EXPECTED) == set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs_in_onnxruntime(models, name):
    model = models[name]
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8 and model.opset_import[0].version == 17
    input_name, shape, out_shape = EXPECTED[name]
    # the batch dim is symbolic, so batch 2 must work as well as 1
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    (y,) = sess.run(None, {input_name: x})
    assert y.shape == out_shape
    assert np.isfinite(y).all()
    assert y.std() > 1e-3, "weights should keep the activations alive through the network"
    assert np.abs(y).max() < 1e3, "weights should keep the activations O(1)"
    # the two batch rows see different inputs, so they must differ
    assert not np.allclose(y[0], y[1])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_same_seed_same_bytes(name):
    build = EXAMPLES[name]
    assert build(seed=3).SerializeToString() == build(seed=3).SerializeToString()
    assert build(seed=3).SerializeToString() != build(seed=4).SerializeToString()


def test_save_writes_a_loadable_model(tmp_path):
    path = tmp_path / "tiny.onnx"
    model = save("tiny_cnn", path, seed=5, num_classes=4)
    assert onnx.load(str(path)).SerializeToString() == model.SerializeToString()
    with pytest.raises(KeyError, match="resnet18"):
        save("resnet19", tmp_path / "x.onnx")
