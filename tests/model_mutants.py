"""Broken ONNX models for the loader fuzzer (tests/test_loader_fuzz.py): a valid random graph (tests/graph_fuzz.py)
with one structured mutation, or its serialized bytes mutated.

Structured mutations: a dim of 0, negative or ≥ 2³¹; another dtype; a dangling or duplicate name; a cycle; an unknown
op or domain; an attribute of the wrong type or an extreme value; an initializer whose data is shorter than its dims;
opsets 0-99 and IR versions 0-15; an empty graph; outputs naming inputs or initializers; NaN and inf weights; external
data pointing outside the model's folder. Byte-level: bytes flipped, cut, repeated or inserted.
"""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.graph_fuzz import graphs

EXTREME_DIMS = [0, -1, -7, 2**31, 2**40, 2**62]
EXTREME_INTS = [-(2**62), -(2**31), -1, 0, 2**31, 2**62]


def _dim(m: onnx.ModelProto, draw) -> str:
    typed = [*m.graph.input, *m.graph.output, *m.graph.value_info]
    dims = [d for vi in typed for d in vi.type.tensor_type.shape.dim]
    size = draw(st.sampled_from(EXTREME_DIMS))
    if dims and draw(st.booleans()):
        d = draw(st.sampled_from(dims))
        d.Clear()
        d.dim_value = size
        return f"a value's dim set to {size}"
    if not m.graph.initializer:
        return "nothing"
    t = draw(st.sampled_from(list(m.graph.initializer)))
    if t.dims:
        t.dims[draw(st.integers(0, len(t.dims) - 1))] = size
    return f"initializer {t.name} dim set to {size}"


def _dtype(m: onnx.ModelProto, draw) -> str:
    vi = draw(st.sampled_from([*m.graph.input, *m.graph.output]))
    elem = draw(st.sampled_from(sorted(TensorProto.DataType.values())))
    vi.type.tensor_type.elem_type = elem
    return f"{vi.name} typed {TensorProto.DataType.Name(elem)}"


def _node(m: onnx.ModelProto, draw) -> onnx.NodeProto | None:
    return draw(st.sampled_from(list(m.graph.node))) if m.graph.node else None


def _dangling(m: onnx.ModelProto, draw) -> str:
    n = _node(m, draw)
    if n is None or not n.input:
        return "nothing"
    n.input[draw(st.integers(0, len(n.input) - 1))] = "nowhere"
    return f"{n.name} reads an undefined value"


def _duplicate(m: onnx.ModelProto, draw) -> str:
    if len(m.graph.node) < 2:
        return "nothing"
    a, b = draw(st.lists(st.sampled_from(list(m.graph.node)), min_size=2, max_size=2, unique_by=id))
    b.output[0] = a.output[0]
    return f"{a.name} and {b.name} write the same value"


def _cycle(m: onnx.ModelProto, draw) -> str:
    first, last = m.graph.node[0] if m.graph.node else None, m.graph.node[-1] if m.graph.node else None
    if first is None or not first.input:
        return "nothing"
    first.input[0] = last.output[0]
    return f"{first.name} reads {last.output[0]}, made after it"


def _unknown_op(m: onnx.ModelProto, draw) -> str:
    n = _node(m, draw)
    if n is None:
        return "nothing"
    if draw(st.booleans()):
        n.op_type = "Frobnicate"
    else:
        n.domain = "com.example"
    return f"{n.name} made unknown"


def _attribute(m: onnx.ModelProto, draw) -> str:
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes:
        return "nothing"
    n = draw(st.sampled_from(nodes))
    a = draw(st.sampled_from(list(n.attribute)))
    kind = draw(st.sampled_from(["float", "string", "ints", "int", "tensor", "extreme"]))
    name = a.name
    n.attribute.remove(a)
    if kind == "extreme":
        value = draw(st.sampled_from(EXTREME_INTS))
        n.attribute.append(helper.make_attribute(name, [value] * max(1, len(a.ints)) if a.ints else value))
    else:
        value = {"float": 0.5, "string": "x", "ints": [3, -2, 2**40], "int": 2**33,
                 "tensor": numpy_helper.from_array(np.zeros(2, np.float32))}[kind]  # fmt: skip
        n.attribute.append(helper.make_attribute(name, value))
    return f"{n.name}.{name} set to a {kind}"


def _short_initializer(m: onnx.ModelProto, draw) -> str:
    if not m.graph.initializer:
        return "nothing"
    t = draw(st.sampled_from(list(m.graph.initializer)))
    if t.raw_data:
        t.raw_data = t.raw_data[: len(t.raw_data) // 2]
    elif t.float_data:
        del t.float_data[len(t.float_data) // 2 :]
    return f"initializer {t.name} cut short"


def _opset(m: onnx.ModelProto, draw) -> str:
    v = draw(st.integers(0, 99))
    m.opset_import[0].version = v
    return f"opset {v}"


def _ir(m: onnx.ModelProto, draw) -> str:
    v = draw(st.integers(0, 15))
    m.ir_version = v
    return f"IR version {v}"


def _empty(m: onnx.ModelProto, draw) -> str:
    del m.graph.node[:]
    return "no nodes"


def _output_names_input(m: onnx.ModelProto, draw) -> str:
    names = [i.name for i in m.graph.input] + [t.name for t in m.graph.initializer]
    o = draw(st.sampled_from(list(m.graph.output)))
    o.name = draw(st.sampled_from(names))
    return f"an output named {o.name}"


def _non_finite(m: onnx.ModelProto, draw) -> str:
    floats = [t for t in m.graph.initializer if t.data_type == TensorProto.FLOAT]
    if not floats:
        return "nothing"
    t = draw(st.sampled_from(floats))
    a = numpy_helper.to_array(t).copy()
    a.reshape(-1)[:: max(1, a.size // 3)] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    t.CopyFrom(numpy_helper.from_array(a, t.name))
    return f"initializer {t.name} holds NaN or inf"


def _external_outside(m: onnx.ModelProto, draw) -> str:
    if not m.graph.initializer:
        return "nothing"
    t = draw(st.sampled_from(list(m.graph.initializer)))
    location = draw(st.sampled_from(["../outside.bin", "/etc/hostname", "/proc/self/environ", "sub/../../x.bin"]))
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    t.external_data.add(key="location", value=location)
    return f"initializer {t.name} in {location}"


STRUCTURED = {
    "dim": _dim, "dtype": _dtype, "dangling": _dangling, "duplicate": _duplicate, "cycle": _cycle,
    "unknown_op": _unknown_op, "attribute": _attribute, "short_initializer": _short_initializer, "opset": _opset,
    "ir": _ir, "empty": _empty, "output_names_input": _output_names_input, "non_finite": _non_finite,
    "external_outside": _external_outside,
}  # fmt: skip


def _bytes(data: bytes, draw) -> tuple[bytes, str]:
    b = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "cut", "repeat", "insert"]))
        at = draw(st.integers(0, max(0, len(b) - 1)))
        if kind == "flip" and b:
            b[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del b[at : at + draw(st.integers(1, 64))]
        elif kind == "repeat":
            b[at:at] = b[at : at + draw(st.integers(1, 64))]
        else:
            b[at:at] = bytes(draw(st.lists(st.integers(0, 255), min_size=1, max_size=16)))
    return bytes(b), "bytes mutated"


@st.composite
def mutants(draw) -> tuple[bytes, str, dict[str, np.ndarray]]:
    """(serialized model, what was done to it, feeds for the valid model it came from)."""
    model, feeds = draw(graphs(max_ops=6))
    kind = draw(st.sampled_from([*STRUCTURED, "bytes"]))
    if kind == "bytes":
        data, what = _bytes(model.SerializeToString(), draw)
        return data, what, feeds
    what = STRUCTURED[kind](model, draw)
    return model.SerializeToString(), f"{kind}: {what}", feeds
