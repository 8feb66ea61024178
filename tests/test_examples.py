"""The example models: valid ONNX, runnable in onnxruntime, non-degenerate outputs, reproducible from the seed; BERT's
encoder stack compiled by tilefarm and compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from compiler.artifact.build import build
from compiler.artifact.runtime import Artifact
from compiler.model.onnx_import import load
from tilefarm.examples import EXAMPLES, bert, save

# name -> (input name, input shape at batch 2, output shape at batch 2)
EXPECTED = {
    "tiny_cnn": ("input", [2, 3, 32, 32], (2, 10)),
    "resnet18": ("input", [2, 3, 224, 224], (2, 1000)),
    "mobilenetv2": ("input", [2, 3, 224, 224], (2, 1000)),
    "encoder": ("x", [2, 128, 256], (2, 128, 256)),
    "bert": ("x", [2, 128, 768], (2, 128, 768)),
}
# builder arguments that keep a test fast: one of BERT's 12 layers (full size its weights are 340 MB)
SMALL = {"bert": {"layers": 1}}


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    return {name: builder(seed=0, **SMALL.get(name, {})) for name, builder in EXAMPLES.items()}


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
    def serialized(seed: int) -> bytes:
        return EXAMPLES[name](seed=seed, **SMALL.get(name, {})).SerializeToString()

    assert serialized(3) == serialized(3)
    assert serialized(3) != serialized(4)


def test_bert_has_bert_base_dimensions():
    """The full-size graph, not compiled: 12 post-norm layers of hidden 768, 12 heads of 64, FFN 3072."""
    model = bert()
    nodes = model.graph.node
    assert model.graph.name == "bert"
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 128, 768]
    count = lambda op: sum(n.op_type == op for n in nodes)  # noqa: E731
    assert (count("Softmax"), count("Erf"), count("LayerNormalization")) == (12, 12, 24)
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    matrices = sorted(tuple(w.shape) for w in weights.values() if w.ndim == 2)
    assert matrices == sorted([(768, 768)] * 48 + [(768, 3072)] * 12 + [(3072, 768)] * 12)
    split = [w.tolist() for w in weights.values() if w.dtype == np.int64 and w.size == 4]
    assert split == [[0, 0, 12, 64]] * 12  # each layer's q, k and v split into 12 heads of 64
    # BERT-base's encoder parameters (its 110M less the embeddings and pooler)
    assert sum(w.size for w in weights.values() if w.dtype == np.float32 and w.ndim > 0) == 85_054_464


def test_bert_layer_compiles_and_matches_onnxruntime(tmp_path):
    model = bert(layers=1)
    x = np.random.default_rng(2).standard_normal((1, 128, 768)).astype(np.float32)
    build(load(model, {"x": [1, 128, 768]}), tmp_path / "bert.tar", name="bert")
    (ours,) = Artifact.load(tmp_path / "bert.tar").run({"x": x}).values()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (ref,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)


def test_save_writes_a_loadable_model(tmp_path):
    path = tmp_path / "tiny.onnx"
    model = save("tiny_cnn", path, seed=5, num_classes=4)
    assert onnx.load(str(path)).SerializeToString() == model.SerializeToString()
    with pytest.raises(KeyError, match="resnet18"):
        save("resnet19", tmp_path / "x.onnx")
