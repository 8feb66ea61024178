"""bench.gpu_models' parts that need no GPU: the GEMM model, and the torch eager twin of an ONNX CNN it times
tilefarm's CUDA artifact against (checked on the CPU against onnxruntime)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from bench.gpu_models import gemm_model, torch_module
from tilefarm.examples import EXAMPLES

torch = pytest.importorskip("torch")


def test_the_gemm_model_multiplies_its_two_inputs():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 8, 8), dtype=np.float32)
    (c,) = ort.InferenceSession(gemm_model(8).SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"A": a, "B": b}
    )
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny_cnn", "resnet18"])
def test_the_torch_twin_of_an_example_computes_what_onnxruntime_does(name):
    model = EXAMPLES[name](seed=0)
    shape = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape, dtype=np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {model.graph.input[0].name: x})
    with torch.no_grad():
        got = torch_module(model, "cpu")(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
