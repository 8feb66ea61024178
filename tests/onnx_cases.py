"""The ONNX backend test cases (node, pytorch-converted, pytorch-operator) as tilefarm loads them: shared by the
frontend tests and the conformance suite."""

from __future__ import annotations

import collections
import functools
import pathlib
import warnings

import numpy as np
import onnx
from onnx import numpy_helper

from compiler.base.errors import InvalidModel, UnsupportedOp
from compiler.model.onnx_import import ONNX_OPS, PARAM_INPUTS, load

KINDS = ("node", "pytorch-converted", "pytorch-operator")


@functools.cache
def conformance_cases(kind: str) -> list:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model_tests(kind=kind)


def case_model(case) -> onnx.ModelProto:
    return case.model if case.model is not None else onnx.load(f"{case.model_dir}/model.onnx")


def case_data(case) -> list[tuple[list, list]]:
    """Every (inputs, expected outputs) of a case: in memory for node tests, as .pb files next to the model for the
    pytorch ones."""
    if case.data_sets is not None:
        return list(case.data_sets)
    return [
        (_tensors(d, "input"), _tensors(d, "output"))
        for d in sorted(pathlib.Path(case.model_dir).glob("test_data_set_*"))
    ]


def _tensors(folder: pathlib.Path, kind: str) -> list[np.ndarray]:
    """input_0.pb, input_1.pb, ... (or output_K.pb) in the order of K."""
    files = sorted(folder.glob(f"{kind}_*.pb"), key=lambda f: int(f.stem.rsplit("_", 1)[1]))
    return [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]


# ops without a converter that the frontend replaces by the function ONNX defines them with, all of whose cases pass
EXPANDED_OPS = ("GroupNormalization", "DepthToSpace", "SpaceToDepth", "RMSNormalization", "MeanVarianceNormalization")


def is_supported(model: onnx.ModelProto) -> bool:
    return all(n.domain in ("", "ai.onnx") and n.op_type in (*ONNX_OPS, *EXPANDED_OPS) for n in model.graph.node)


def supported_cases(kind: str):
    """(name, model, inputs, expected outputs) of every case whose ops the frontend converts."""
    for case in conformance_cases(kind):
        model = case_model(case)
        if is_supported(model):
            inputs, outputs = (case_data(case) or [([], [])])[0]
            yield case.name, model, inputs, outputs


def as_array(value):
    """A test's input or output as numpy: the loader gives some (every Cast case's) as TensorProtos."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value) if isinstance(value, np.generic) else value


def load_case(model: onnx.ModelProto, inputs: list):
    """The case's tilefarm graph and its feeds by input name. Parameter inputs are bound first; small integer inputs
    only when a shape still depends on them, so integer arithmetic stays in kernels instead of folding away."""
    bound, left = bind_parameters(model, inputs)
    try:
        g = load(bound, _shapes(bound, left))
    except (UnsupportedOp, InvalidModel) as e:
        # a shape computed from an input (AffineGrid's `size` decides between its 2-D and 3-D If branches)
        if "compile-time constant" not in str(e) and "depends on the data" not in str(e):
            raise
        bound, left = bind_parameters(model, inputs, small_ints=True)
        g = load(bound, _shapes(bound, left))
    return g, {v.name: a for v, a in zip(g.inputs, left)}


def _shapes(model: onnx.ModelProto, arrays: list) -> dict[str, list[int]]:
    """The data's shapes by input name, as a user gives them with --input-shapes (a declared 0 is dynamic)."""
    inits = {t.name for t in model.graph.initializer}
    return {vi.name: list(a.shape) for vi, a in zip([i for i in model.graph.input if i.name not in inits], arrays)}


def bind_parameters(model: onnx.ModelProto, inputs: list, small_ints: bool = False) -> tuple[onnx.ModelProto, list]:
    """The model with its parameter inputs turned into initializers, and the arrays of the inputs left.

    A node test passes its shape/axes/scales parameters as graph inputs; a compiler needs them constant, so they are
    bound to the test's data: inputs read at a PARAM_INPUTS slot, and with `small_ints` every integer input of
    rank ≤ 1 (center_crop_pad computes its pads from one) and every scalar (Range's expansion counts its Loop's
    trips from them)."""
    consumers = collections.defaultdict(list)
    for node in model.graph.node:
        for slot, name in enumerate(node.input):
            consumers[name].append((node.op_type, slot))
    inits = {t.name for t in model.graph.initializer}
    real = [vi for vi in model.graph.input if vi.name not in inits]
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    left = []
    for vi, value in zip(real, inputs):
        value = as_array(value)
        is_param = any(slot in PARAM_INPUTS.get(op, ()) for op, slot in consumers[vi.name])
        if is_param or (small_ints and ((value.dtype.kind in "iu" and value.ndim <= 1) or value.ndim == 0)):
            bound.graph.initializer.append(numpy_helper.from_array(value, vi.name))
            bound.graph.input.remove(next(x for x in bound.graph.input if x.name == vi.name))
        else:
            left.append(value)
    return bound, left
