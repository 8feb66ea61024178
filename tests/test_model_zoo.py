"""The onnx package's light model zoo (kind="real": AlexNet ... VGG-19, weights constant-filled) compiled whole and run
on the backend runner's input, against onnxruntime and against the outputs that ship with the graphs."""

from __future__ import annotations

import pathlib
import tempfile
import time
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from compiler.artifact.build import build
from compiler.artifact.runtime import Artifact
from compiler.base.errors import UnsupportedOp
from compiler.model.onnx_import import load
from compiler.tensor.ops import OPS

# The weights are constant-filled, so all 1000 logits are equal and most of these nets end in a uniform softmax
# (every output exactly 1e-3) whatever the kernels compute; the logits themselves (1e9 to 1e31 here) carry the whole
# net's arithmetic, so they are compared too. Outputs get the torch models' bound. The logits are sums of up to 25088
# positive float32 terms per layer over up to 19 layers, where summing in another order than onnxruntime's may move
# a result by up to (terms x 6e-8) per layer (VGG-19, AlexNet, ZFNet: 2e-5 to 7e-5); they get the loader's own rtol,
# 1e-3, which a wrong index into a padded window or a dropped term still exceeds.
MAX_REL_ERR = {"output": 1e-4, "logits": 1e-3}

NO_LRN = pytest.mark.xfail(
    "LRN" not in OPS, raises=UnsupportedOp, strict=True, reason="LRN is not implemented (compiler/tensor/ops/norm.py)"
)
MARKS = {
    "bvlc_alexnet": [NO_LRN],
    "inception_v1": [NO_LRN],
    "zfnet512": [NO_LRN],
}


def zoo_cases():
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="real")
    # a case's url is relative to site-packages, e.g. onnx/backend/test/data/light/light_resnet50.onnx
    site = pathlib.Path(onnx.__file__).parent.parent
    return [pytest.param(c, site / c.url, id=c.model_name, marks=MARKS.get(c.model_name, [])) for c in cases]


CASES = zoo_cases()


def test_the_zoo_has_nine_models():
    assert sorted(p.id for p in CASES) == sorted(
        ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
         "vgg19", "zfnet512"]
    )  # fmt: skip


def with_logits(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with the input of its final Softmax, when it ends in one, as a second graph output."""
    final = next(n for n in model.graph.node if model.graph.output[0].name in n.output)
    if final.op_type == "Softmax":  # onnx.checker wants a typed output, with its shape
        infos = onnx.shape_inference.infer_shapes(model).graph.value_info
        model.graph.output.append(next(vi for vi in infos if vi.name == final.input[0]))
    return model


def runner_inputs(model: onnx.ModelProto, name: str) -> dict[str, np.ndarray]:
    """The inputs onnx's backend runner feeds these graphs (not random: arange(n) / n), from which the shipped
    outputs were computed."""
    from onnx.backend.test.runner import Runner

    inits = {i.name for i in model.graph.initializer}
    return {
        x.name: Runner.generate_dummy_data(x, seed=0, name=name, random=False)
        for x in model.graph.input
        if x.name not in inits
    }


@pytest.mark.parametrize("case, path", CASES)
def test_zoo_model(case, path, record_property):
    import onnxruntime as ort

    model = with_logits(onnx.load(str(path)))
    feeds = runner_inputs(model, case.model_name)
    quiet = ort.SessionOptions()
    quiet.log_severity_level = 3  # the caffe2 conversions carry an unused initializer that onnxruntime warns about
    wants = ort.InferenceSession(model.SerializeToString(), quiet, providers=["CPUExecutionProvider"]).run(None, feeds)

    # the constant weights come out dense (VGG-19: a 9 kB graph, a 575 MB artifact): not kept in pytest's tmp_path,
    # which holds on to the last three runs
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        build(load(model), f"{tmp}/m.tar", name="m")
        seconds = time.perf_counter() - t0
        art = Artifact.load(f"{tmp}/m.tar")
    record_property("compile_seconds", round(seconds, 2))

    gots = list(art.run(feeds).values())  # fed by the model's own input names (gpu_0/data_0)
    assert [g.shape for g in gots] == [w.shape for w in wants]
    errs = {what: float(np.abs(g - w).max() / np.abs(w).max()) for what, g, w in zip(MAX_REL_ERR, gots, wants)}
    print(f"\n{case.model_name}: compile {seconds:.1f} s, max rel err vs onnxruntime "
          + ", ".join(f"{what} {e:.2e}" for what, e in errs.items()))  # fmt: skip
    assert all(e < MAX_REL_ERR[what] for what, e in errs.items()), f"{case.model_name}: max rel err {errs}"
    shipped = pathlib.Path(str(path).removesuffix(".onnx") + "_output_0.pb")
    if shipped.exists():  # the reference evaluator's output, at the loader's tolerances
        expected = numpy_helper.to_array(onnx.load_tensor(str(shipped)))
        np.testing.assert_allclose(gots[0], expected, rtol=case.rtol, atol=case.atol)
