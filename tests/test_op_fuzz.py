"""Per-op attribute fuzzing (tests/op_fuzz.py) against onnxruntime: every drawn model that onnxruntime runs either
compiles into an artifact whose output matches within 1e-4 of its scale, or is refused with a TilefarmError naming
what is not supported; never a wrong answer, never another exception.

CI draws TILEFARM_FUZZ_EXAMPLES // 4 per op; set it higher to run more by hand."""

from __future__ import annotations

import numpy as np
import onnx.printer
import onnxruntime as ort
import pytest
from hypothesis import assume, event, given

from compiler.artifact.build import compile_model
from compiler.artifact.runtime import Artifact
from compiler.base.errors import TilefarmError
from tests.fuzzing import fuzz_settings
from tests.op_fuzz import OP_STRATEGIES


def _onnxruntime(model, x):
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]
    except Exception:  # noqa: BLE001 - a combination onnxruntime refuses is not one to compare on
        return None


@pytest.mark.parametrize("op", sorted(OP_STRATEGIES))
def test_op_attributes_match_onnxruntime(op, tmp_path_factory):
    @fuzz_settings(30, share=4)
    @given(OP_STRATEGIES[op])
    def check(case):
        model, rng = case
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        x = rng.standard_normal(shape).astype(np.float32)
        want = _onnxruntime(model, x)
        assume(want is not None)
        path = tmp_path_factory.mktemp(op) / "m.tar"
        text = onnx.printer.to_text(model.graph)
        try:
            compile_model(model, path)
        except TilefarmError as e:
            event(f"refused: {type(e).__name__}")
            return
        got = Artifact.load(path).run({"x": x})["y"]
        assert got.shape == want.shape, f"shape {got.shape}, onnxruntime {want.shape}\n{text}"
        scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
        err = float(np.max(np.abs(got - want))) if want.size else 0.0
        assert err <= 1e-4 * scale, f"max error {err:.3g} of scale {scale:.3g}\n{text}"

    check()
