"""Whole-graph differential testing: random multi-op ONNX graphs (tests/graph_fuzz.py) compiled into artifacts and
run against onnxruntime, output by output, within 1e-4 of each output's scale.

CI runs 120 cases, the same ones every run (tests/fuzzing.py);
`TILEFARM_FUZZ_EXAMPLES=20000 pytest tests/test_graph_fuzz.py` runs more by hand."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.printer
import onnxruntime as ort
from hypothesis import given

from compiler.artifact.build import compile_model
from compiler.artifact.runtime import Artifact
from tests.fuzzing import fuzz_settings
from tests.graph_fuzz import graphs


def _reference(model, feeds) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


@fuzz_settings(120)
@given(graphs())
def test_random_graphs_match_onnxruntime(tmp_path_factory, case):
    model, feeds = case
    want = _reference(model, feeds)
    path = tmp_path_factory.mktemp("fuzz") / "m.tar"
    try:
        compile_model(model, path)
        got = Artifact.load(path).run(feeds)
    except Exception as e:
        raise AssertionError(f"{type(e).__name__}: {e}\n{onnx.printer.to_text(model.graph)}") from e
    assert list(got) == [o.name for o in model.graph.output]
    for (name, g), w in zip(got.items(), want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
        err = float(np.max(np.abs(g - w))) if w.size else 0.0
        text = onnx.printer.to_text(model.graph)
        assert err <= 1e-4 * scale, f"{name}: max error {err:.3g} of scale {scale:.3g}\n{text}"
