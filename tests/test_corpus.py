"""Every model of the real-model corpus (tests/corpus.py) compiled into an artifact and compared with onnxruntime,
output by output (floats within 1e-4 of the output's scale, integers exactly); a row with a named gap must be refused
with an error naming it. The table of rows is printed at the end of the run (conftest.py)."""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from compiler.artifact.build import compile_model
from compiler.artifact.runtime import Artifact
from compiler.base.errors import TilefarmError
from tests.corpus import CORPUS, Model, fetch


def _feeds(proto: onnx.ModelProto, shapes: dict[str, list[int]], values: dict[str, float]) -> dict[str, np.ndarray]:
    """Seeded inputs: floats standard normal, integers 1, an input named in `values` that value everywhere; a dynamic
    dim not given in `shapes` is 1. Initializers listed as graph inputs (IR < 4 style) are not fed."""
    rng = np.random.default_rng(0)
    inits = {t.name for t in proto.graph.initializer}
    feeds = {}
    for vi in (i for i in proto.graph.input if i.name not in inits):
        tt = vi.type.tensor_type
        shape = shapes.get(vi.name) or [d.dim_value if d.dim_value > 0 else 1 for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        feeds[vi.name] = (rng.standard_normal(shape) if dtype.kind == "f" else np.ones(shape)).astype(dtype)
        if vi.name in values:
            feeds[vi.name] = np.full(shape, values[vi.name], dtype)
    return feeds


@pytest.mark.parametrize("model", CORPUS, ids=[m.name for m in CORPUS])
def test_corpus_model_matches_onnxruntime(model: Model, tmp_path, record_property):
    path = fetch(model)
    proto = onnx.load(str(path))
    feeds = _feeds(proto, model.input_shapes, model.values)
    shapes = {name: list(a.shape) for name, a in feeds.items()}
    row = {"model": model.name, "converter": model.converter, "opset": proto.opset_import[0].version,
           "ops": len({n.op_type for n in proto.graph.node}), "task": model.task}  # fmt: skip
    t0 = time.perf_counter()
    if model.gap:
        with pytest.raises(TilefarmError, match=model.gap) as refused:
            compile_model(path, tmp_path / "m.tar", input_shapes=shapes)
        record_property("corpus", {**row, "result": f"gap: {str(refused.value).splitlines()[0][:70]}"})
        return
    compile_model(path, tmp_path / "m.tar", input_shapes=shapes)
    seconds = time.perf_counter() - t0
    got = Artifact.load(tmp_path / "m.tar").run(feeds)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    worst = 0.0
    for (name, g), w in zip(got.items(), want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w, err_msg=name)
            continue
        scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
        err = float(np.max(np.abs(g - w))) / scale if w.size else 0.0
        worst = max(worst, err)
        assert err <= 1e-4, f"{model.name} output {name}: max error {err:.3g} of its scale"
    record_property("corpus", {**row, "result": f"ok: compiled {seconds:.1f} s, max error {worst:.1e} of scale"})
