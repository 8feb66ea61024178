"""ONNX → Graph: fix input shapes, fold everything constant, infer static shapes, normalize every node.

`load(model, input_shapes)` reads a model (path, bytes or ModelProto) of opset 11–21 (older default-domain opsets are
first upgraded to 11 with onnx's version converter) and returns a `Graph` whose nodes follow the contract in
`compiler.model.graph`. Steps, in order:

1. parse and check (`onnx.checker`); anything malformed is an `InvalidModel`. What the model's numbers would make
   the loader allocate (nodes, declared tensors, folded constants) is weighed against a `Budget` (budget.py) before
   it is allocated: past it, an `OverBudget` naming the limit and its setting;
2. give every graph input a static shape: `input_shapes` first, then a symbolic leading (batch) dim defaults to 1;
3. repeat {infer shapes (`onnx.shape_inference`, data propagation on), fold every node whose inputs are all constant
   (and `Shape`/`Size` of a statically shaped value), inline the branch an `If` with a constant condition takes,
   replace an op without a converter that ONNX defines as a function of supported ops (Swish, GroupNormalization,
   RMSNormalization, Shrink, ...) by that function's body} until nothing changes, so shape subgraphs such as
   Shape → Gather → Concat → Reshape disappear;
4. report every op that is left and unsupported in one `UnsupportedOp`, every value without a static shape as
   `InvalidModel`;
5. convert each node through its converter in `ONNX_OPS`. `Dropout` becomes `Identity`; `Identity` is kept (a later
   pass removes both).

Graph inputs and outputs keep their ONNX names (`gpu_0/data_0`), which is what a user feeds and reads; internal values
get readable, unique names. The per-op converters of step 5 live in `converters.py`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import onnx.reference
import onnx.version_converter
from google.protobuf.message import Message
from onnx import TensorProto, helper, numpy_helper

from compiler.base import dtypes
from compiler.base.errors import InvalidModel, UnsupportedDType, UnsupportedOp
from compiler.model.graph import Graph, Node, TensorType, Value, pooled_extent
from compiler.model.onnx_import.budget import Budget, Meter, OverBudget, node_count, size
from compiler.model.onnx_import.control_flow import CONTROL_FLOW, Formal, Imported, free_names, import_control
from compiler.model.onnx_import.converters import (
    AXES_INPUT_FROM,
    CONVERTERS,
    FOLD_ONLY,
    WINDOWED,
    _CannotConvert,
    _Ctx,
    check_window,
)
from compiler.model.onnx_import.quantized import CONTRIB, CONTRIB_DOMAIN, QUANTIZED, contrib_types
from compiler.model.onnx_import.recurrent import RECURRENT

__all__ = ["ONNX_OPS", "PARAM_INPUTS", "Budget", "OverBudget", "external_files", "load", "parse_input_shapes"]

# op_type -> converter returning the normalized Node(s); its keys are the supported ONNX operators
ONNX_OPS = {**CONVERTERS, **RECURRENT, **CONTROL_FLOW, **QUANTIZED}

MIN_OPSET = 11
INLINE_DOMAIN = "tilefarm.inline"  # the domain ops are moved to while onnx's inliner expands their function bodies
DEFAULT_DOMAINS = ("", "ai.onnx")
# ops whose outputs are random or depend on state: never evaluated at compile time
NONDETERMINISTIC = {
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
}  # fmt: skip
# op -> inputs that must be compile-time constants (they become attributes, or the op only ever folds)
PARAM_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3), "Split": (1,),
    "Squeeze": (1,), "Unsqueeze": (1,), **dict.fromkeys(AXES_INPUT_FROM, (1,)),
    "Resize": (1, 2, 3), "TopK": (1,), "Dropout": (2,), "Range": (0, 1, 2), "ConstantOfShape": (0,),
    "CumSum": (1,), "OneHot": (1, 2), "LSTM": (1, 2, 3, 4, 7), "GRU": (1, 2, 3, 4), "RNN": (1, 2, 3, 4),
}  # fmt: skip
# the multiplicative parameters of ops (by input slot), which must be finite when constant (check_types)
WEIGHTS = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (1,), "BatchNormalization": (1, 2, 3, 4),
    "InstanceNormalization": (1, 2), "LayerNormalization": (1, 2), "GroupNormalization": (1, 2),
}  # fmt: skip
# constants up to this many elements stay initializers during shape inference so data propagation can read them;
# bigger ones (weights) are passed as typed inputs, which keeps each inference round cheap
SMALL_CONST = 1024
SKELETON_BYTES = 1 << 20  # initializers above this are left out of what onnx's checker serializes (_skeleton)


# ---------------------------------------------------------------------------------------------- public API


def load(
    model: str | Path | bytes | onnx.ModelProto,
    input_shapes: dict[str, list[int]] | None = None,
    budget: Budget | None = None,
) -> Graph:
    """Import an ONNX model as a normalized Graph with static shapes; see the module docstring for the steps. What
    the model may make the loader allocate is bounded by `budget` (default: Budget.from_env()), checked before each
    allocation: OverBudget names the limit it passes."""
    budget = budget or Budget.from_env()
    proto = _read(model)
    nodes = node_count(proto)
    if nodes > budget.nodes:
        raise budget.refuse("the model (subgraphs included, local functions as inlined)", nodes, "nodes")
    proto = _prepare(proto)
    return _import(_State(proto, _opset(proto), Meter(budget)), input_shapes or {})


def _import(state: _State, input_shapes: dict[str, list[int]]) -> Graph:
    state.fix_inputs(input_shapes)
    state.fold_to_fixpoint()
    state.check_types()
    state.check_supported()
    state.check_static()
    return state.convert()


def _import_subgraph(outer: _State, g: onnx.GraphProto, formals: list[Formal], free: list[str], where: str) -> Graph:
    """A control-flow node's subgraph imported as a model of its own (control_flow.ImportGraph): its inputs are
    `formals`, then the free values of the enclosing graph computed at run time; the constant ones are its
    constants."""
    runtime = [n for n in free if n not in outer.consts]
    inputs = [helper.make_tensor_value_info(n, elem, shape) for n, elem, shape in formals]
    inputs += [helper.make_tensor_value_info(n, outer.types[n].elem, outer.types[n].shape) for n in runtime]
    nodes = []
    for i, n in enumerate(g.node):  # an unnamed node is named by where it is, for errors that name it
        nodes.append(_named(n, i))
        nodes[-1].name = n.name or f"{where}/{n.op_type}_{i}"
    graph = helper.make_graph(nodes, _sanitize(where), inputs, list(g.output), list(g.initializer),
                              value_info=list(g.value_info), sparse_initializer=list(g.sparse_initializer))  # fmt: skip
    model = helper.make_model(graph, opset_imports=outer.proto.opset_import, ir_version=outer.proto.ir_version)
    state = _State(model, outer.opset, outer.meter)  # one budget for the model and every subgraph in it
    state.nested = True
    state.consts.update({n: outer.consts[n] for n in free if n in outer.consts})
    shapes = {n: list(shape) for n, _, shape in formals} | {n: list(outer.types[n].shape) for n in runtime}
    return _import(state, shapes)


def parse_input_shapes(text: str) -> dict[str, list[int]]:
    """Parse the CLI form `x:[1,3,224,224],y:[1,8]`, or tvmc's `x:[1,3,224,224] y:[1,8]` (names may contain ':', e.g.
    `input:0:[1,8]`); `sr:[]` is a scalar."""
    shapes: dict[str, list[int]] = {}
    pos, text = 0, text.strip()
    item = re.compile(r"\s*([^\[\],\s][^\[\],]*?):\[([^\]]*)\]\s*(?:,|\s|$)")
    while pos < len(text):
        m = item.match(text, pos)
        if not m:
            raise InvalidModel(
                f"cannot parse input shapes {text!r} at {text[pos:]!r}; expected e.g. 'x:[1,3,224,224],y:[1,8]'"
            )
        dims = [d.strip() for d in m.group(2).split(",") if d.strip()]
        if not all(re.fullmatch(r"\d+", d) for d in dims):
            raise InvalidModel(f"input shape of {m.group(1)!r} must list non-negative integers, got [{m.group(2)}]")
        shapes[m.group(1).strip()] = [int(d) for d in dims]
        pos = m.end()
    return shapes


# ---------------------------------------------------------------------------------------------- reading


def _read(model: str | Path | bytes | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model  # read, never changed (_check copies it before it would): a model's weights are held once
    if isinstance(model, (bytes, bytearray)):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(bytes(model))
        except Exception as e:  # protobuf raises DecodeError, or RuntimeWarning-like errors from the C++ parser
            raise InvalidModel(f"not an ONNX model (protobuf parse failed: {e})") from None
        if external_files(proto):
            raise InvalidModel(
                f"the model keeps tensors in external files ({', '.join(sorted(set(external_files(proto).values())))}"
                "), which bytes alone do not carry: load it by its path, with those files beside it"
            )
        return proto
    path = Path(model)
    if not path.is_file():
        raise InvalidModel(f"no such model file: {path}")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise InvalidModel(f"{path} is not an ONNX model ({type(e).__name__}: {e})") from None
    missing = {t: f for t, f in external_files(proto).items() if not (path.parent / f).is_file()}
    if missing:
        listing = ", ".join(f"{t!r} in {f!r}" for t, f in sorted(missing.items()))
        raise InvalidModel(f"{path.name} keeps tensors in external files not found in {path.parent}: {listing}")
    try:
        onnx.load_external_data_for_model(proto, str(path.parent))
    except Exception as e:
        raise InvalidModel(f"{path}: its external data cannot be read ({type(e).__name__}: {e})") from None
    return proto


def external_files(proto: onnx.ModelProto) -> dict[str, str]:
    """Tensor name -> the external data file (ONNX's `location`) of every tensor the model keeps outside itself:
    initializers (sparse ones too) and constant attributes, in subgraphs and local functions too, as
    onnx.load_external_data_for_model reads them. A tensor without a name is named by its position."""
    out: dict[str, str] = {}

    def tensor(t: onnx.TensorProto) -> None:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            out[t.name or f"tensor {len(out)}"] = next((e.value for e in t.external_data if e.key == "location"), "")

    def attributes(nodes) -> None:
        for node in nodes:
            for a in node.attribute:
                for t in [a.t, *a.tensors] if a.HasField("t") else a.tensors:
                    tensor(t)
                for sub in [a.g, *a.graphs] if a.HasField("g") else a.graphs:
                    graph(sub)

    def graph(g: onnx.GraphProto) -> None:
        for t in g.initializer:
            tensor(t)
        for s in g.sparse_initializer:
            tensor(s.values)
            tensor(s.indices)
        attributes(g.node)

    graph(proto.graph)
    for f in proto.functions:
        attributes(f.node)
    return out


def _prepare(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Check the model, upgrade opsets older than 11 and inline model-local functions."""
    if not proto.HasField("graph") or not proto.graph.output:
        raise InvalidModel("not an ONNX model: it has no graph or the graph has no outputs")
    proto = _check(proto)
    if _opset(proto) < 7:
        proto = _per_channel_prelu(proto)
    if _opset(proto) < MIN_OPSET:
        try:
            proto = onnx.version_converter.convert_version(proto, MIN_OPSET)
        except Exception as e:
            raise InvalidModel(
                f"opset {_opset(proto)} is older than {MIN_OPSET} and onnx could not upgrade it: {e}"
            ) from None
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    return proto


def _per_channel_prelu(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Before opset 7 a PRelu slope of C values applied per channel (axis 1, as PyTorch exported it); from opset 7
    on it broadcasts numpy-style from the last axis, and onnx's version converter does not move it, so the slope
    initializer (read by that PRelu alone) is reshaped to [C, 1, ...] here, and so is its graph input (IR < 4 lists
    initializers as inputs)."""
    proto = onnx.shape_inference.infer_shapes(proto)
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in [*proto.graph.input, *proto.graph.value_info]}
    inits = {t.name: t for t in proto.graph.initializer}
    readers = [name for node in proto.graph.node for name in node.input]
    for node in (n for n in proto.graph.node if n.op_type == "PRelu"):
        slope, rank = inits.get(node.input[1]), ranks.get(node.input[0], 0)
        if slope is None or len(slope.dims) != 1 or slope.dims[0] == 1 or rank < 3 or readers.count(slope.name) > 1:
            continue
        shape = [slope.dims[0]] + [1] * (rank - 2)
        slope.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(slope).reshape(shape), slope.name))
        typed = helper.make_tensor_type_proto(slope.data_type, shape)
        for vi in proto.graph.input:
            if vi.name == slope.name:
                vi.type.CopyFrom(typed)
    return proto


def _check(proto: onnx.ModelProto) -> onnx.ModelProto:
    """onnx.checker on the model; returns it, or a copy whose outputs got the shapes their exporter left unset."""
    if any(not o.type.tensor_type.HasField("shape") for o in proto.graph.output):
        # exporters may leave an output's shape unset (onnxruntime accepts that; onnx's checker does not):
        # fill it from shape inference first
        try:
            inferred = onnx.shape_inference.infer_shapes(_skeleton(proto))
        except Exception:
            inferred = proto
        filled = [(i, new.type) for i, (out, new) in enumerate(zip(proto.graph.output, inferred.graph.output))
                  if not out.type.tensor_type.HasField("shape") and new.type.tensor_type.HasField("shape")]  # fmt: skip
        if filled:
            copy = onnx.ModelProto()
            copy.CopyFrom(proto)  # the caller's model is never changed
            for i, t in filled:
                copy.graph.output[i].type.CopyFrom(t)
            proto = copy
    try:
        onnx.checker.check_model(_skeleton(proto))
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InvalidModel(f"the model fails onnx.checker: {first}") from None
    return proto


def _skeleton(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model as onnx's checker and shape inference are given it: they serialize their argument and parse it again
    in C++, which held a model's weights three times at once. An initializer of more than SKELETON_BYTES is given as
    a graph input of its type instead (its data is checked where it is read: _to_array); the model itself if it has
    none."""
    g = proto.graph
    big = {t.name for t in g.initializer if _declared_bytes(t) > SKELETON_BYTES}
    if not big:
        return proto
    skeleton = onnx.ModelProto()
    _copy_fields(proto, skeleton, skip="graph")
    _copy_fields(g, skeleton.graph, skip="initializer")
    skeleton.graph.initializer.extend(t for t in g.initializer if t.name not in big)
    listed = {vi.name for vi in g.input}  # below IR 4 an initializer is listed as an input already
    skeleton.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                                for t in g.initializer if t.name in big and t.name not in listed)  # fmt: skip
    return skeleton


def _copy_fields(src: Message, dst: Message, skip: str) -> None:
    """Every field set in `src` but `skip`, copied into `dst`."""
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if isinstance(value, Message):
            getattr(dst, field.name).CopyFrom(value)
        elif isinstance(value, str | bytes | int | float | bool):
            setattr(dst, field.name, value)
        else:  # a repeated field
            getattr(dst, field.name).extend(value)


def _opset(proto: onnx.ModelProto) -> int:
    versions = [o.version for o in proto.opset_import if o.domain in DEFAULT_DOMAINS]
    return versions[0] if versions else MIN_OPSET


# ---------------------------------------------------------------------------------------------- types


@dataclass
class _Type:
    elem: int  # onnx TensorProto element type, 0 when unknown
    shape: tuple[int, ...] | None  # None when unknown or not fully static

    @property
    def static(self) -> bool:
        return self.elem != 0 and self.shape is not None


def _type_of(vi: onnx.ValueInfoProto) -> _Type:
    """A value's type (a dim of -1 is unknown; of a graph input, 0 too: `_static`)."""
    if not vi.type.HasField("tensor_type"):
        return _Type(0, None)
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return _Type(tt.elem_type, None)
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in tt.shape.dim]
    return _Type(tt.elem_type, None if None in dims else tuple(dims))


def _static(d: onnx.TensorShapeProto.Dimension) -> bool:
    """A graph input's dimension with a size: converters write a dynamic one as a name, as nothing, or as -1 or 0
    (paddle2onnx, keras2onnx)."""
    return d.HasField("dim_value") and d.dim_value > 0


def _variadic(formal) -> bool:
    return formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic


def _nbytes(t: _Type) -> int:
    """Bytes of a statically typed value (Python ints: no overflow however large its dims)."""
    try:
        size = _np_dtype(t.elem).itemsize
    except (TypeError, KeyError, ValueError):
        size = 8
    return math.prod(t.shape) * size


def _declared_bytes(t: onnx.TensorProto | onnx.SparseTensorProto) -> int:
    """The bytes a tensor's dims declare (a sparse one's made dense), read without touching its data."""
    elem = t.values.data_type if isinstance(t, onnx.SparseTensorProto) else t.data_type
    return _nbytes(_Type(elem, tuple(max(d, 0) for d in t.dims)))


def _np_dtype(elem: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem))


def _dtype_name(elem: int, what: str) -> str:
    try:
        return dtypes.check(str(_np_dtype(elem)))
    except (UnsupportedDType, TypeError, KeyError) as e:
        name = onnx.TensorProto.DataType.Name(elem) if elem in onnx.TensorProto.DataType.values() else str(elem)
        raise UnsupportedDType(f"{what} has ONNX dtype {name}, which tilefarm does not support ({e})") from None


def _sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name) or "v"


def _ceil_mode_shapes(nodes: list[onnx.NodeProto], types: dict[str, _Type]) -> dict[str, tuple[int, ...]]:
    """The shapes of pool outputs under ceil_mode as onnxruntime computes them (`pooled_extent`: a last window that
    would start in the trailing padding is dropped), where onnx's inference keeps that window."""
    out = {}
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type not in ("MaxPool", "AveragePool") or not attrs.get("ceil_mode"):
            continue
        x = types.get(node.input[0])
        auto_pad = attrs.get("auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if x is None or x.shape is None or auto_pad not in ("NOTSET", "VALID"):  # SAME sizes ignore ceil_mode
            continue
        sp = len(x.shape) - 2
        k, s = attrs["kernel_shape"], attrs.get("strides", [1] * sp)
        d = attrs.get("dilations", [1] * sp)
        p = attrs.get("pads", [0] * 2 * sp) if auto_pad == "NOTSET" else [0] * 2 * sp
        spatial = [pooled_extent(n, p[i], p[sp + i], (k[i] - 1) * d[i] + 1, s[i], True)
                   for i, n in enumerate(x.shape[2:])]  # fmt: skip
        out[node.output[0]] = (*x.shape[:2], *(max(o, 0) for o in spatial))
    return out


# ---------------------------------------------------------------------------------------------- import state


class _State:
    """The model while it is folded and inferred: remaining nodes, constants by name, types by name."""

    def __init__(self, proto: onnx.ModelProto, opset: int, meter: Meter):
        g = proto.graph
        self.proto, self.opset, self.meter = proto, opset, meter
        self.nodes: list[onnx.NodeProto] = [_named(n, i) for i, n in enumerate(g.node)]
        self.consts: dict[str, np.ndarray] = {}
        for t in g.initializer:
            self.consts[t.name] = self._initializer(t, f"initializer {t.name!r}")
        for t in g.sparse_initializer:
            self.consts[t.values.name] = self._initializer(t, f"sparse initializer {t.values.name!r}")
        self.inputs = [vi for vi in g.input if vi.name not in self.consts]
        self.outputs = [vi.name for vi in g.output]
        self.types: dict[str, _Type] = {vi.name: _type_of(vi) for vi in list(g.value_info) + list(g.output)}
        self.declared = {vi.name: vi.type.tensor_type for vi in g.output}  # the outputs' types as the model states them
        self.kept: set[str] = set()  # names of nodes whose function body could not be inlined
        # control-flow nodes (by their outputs) whose subgraphs are imported, and the ops they lack
        self.control: dict[tuple[str, ...], Imported] = {}
        self.control_unsupported: dict[tuple[str, ...], UnsupportedOp] = {}
        self.nested = False  # a subgraph's: its outputs are read by the node that runs it
        self.contrib: dict[str, tuple[int, tuple[int, ...]]] = {}  # com.microsoft nodes' outputs, typed by us

    def _initializer(self, t: onnx.TensorProto | onnx.SparseTensorProto, what: str) -> np.ndarray:
        """An initializer as an array, its declared dims weighed first: a few bytes can declare [2**40] (and a sparse
        one is made dense)."""
        nbytes = _declared_bytes(t)
        if nbytes > self.meter.budget.value_bytes:
            raise self.meter.budget.refuse(f"{what} is declared {list(t.dims)}", nbytes, "value_bytes")
        return _to_array(t, what)

    # -- step 2: static input shapes

    def fix_inputs(self, given: dict[str, list[int]]) -> None:
        names = [vi.name for vi in self.inputs]
        unknown = [n for n in given if n not in names]
        if unknown:
            raise InvalidModel(
                f"--input-shapes names {', '.join(map(repr, unknown))}, but the model's inputs are "
                f"{', '.join(map(repr, names))}"
            )
        symbols = self._bind_symbols(given)
        for vi in self.inputs:
            self.types[vi.name] = _Type(vi.type.tensor_type.elem_type, self._input_shape(vi, given, symbols))

    def _bind_symbols(self, given: dict[str, list[int]]) -> dict[str, int]:
        """dim_param name -> size, from the shapes the user gave, so `batch` fixed on one input fixes it everywhere."""
        symbols: dict[str, int] = {}
        for vi in self.inputs:
            if vi.name in given and vi.type.tensor_type.HasField("shape"):
                dims = vi.type.tensor_type.shape.dim
                if len(dims) == len(given[vi.name]):
                    for d, size in zip(dims, given[vi.name]):
                        if d.dim_param:
                            symbols.setdefault(d.dim_param, size)
        return symbols

    def _input_shape(self, vi: onnx.ValueInfoProto, given: dict[str, list[int]], symbols: dict[str, int]):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise InvalidModel(f"input {vi.name!r} is not a tensor; tilefarm compiles tensor inputs only")
        if vi.name in given:
            shape = tuple(given[vi.name])
            if tt.HasField("shape"):
                dims = tt.shape.dim
                if len(dims) != len(shape):
                    raise InvalidModel(f"input {vi.name!r} has rank {len(dims)} but --input-shapes gives {list(shape)}")
                for i, (d, size) in enumerate(zip(dims, shape)):
                    if _static(d) and d.dim_value != size:
                        raise InvalidModel(
                            f"input {vi.name!r} dim {i} is {d.dim_value} in the model but --input-shapes gives {size}"
                        )
            return shape
        if not tt.HasField("shape"):
            raise InvalidModel(
                f"input {vi.name!r} has no shape in the model; pass it with --input-shapes "
                f"(e.g. {vi.name}:[1,3,224,224])"
            )
        shape = []
        for i, d in enumerate(tt.shape.dim):
            if _static(d):
                shape.append(d.dim_value)
            elif d.dim_param in symbols:
                shape.append(symbols[d.dim_param])
            elif i == 0:
                shape.append(1)  # an unknown leading dim is the batch: compile for one sample
            else:
                what = f"'{d.dim_param}'" if d.dim_param else "unknown"
                example = ",".join(str(x.dim_value) if _static(x) else "N" for x in tt.shape.dim)
                raise InvalidModel(
                    f"input {vi.name!r} dim {i} is {what}; fix it with --input-shapes (e.g. {vi.name}:[{example}])"
                )
        return tuple(shape)

    # -- step 3: fold and infer

    def fold_to_fixpoint(self) -> None:
        self.infer()
        while self.fold() or self.expand_functions() or self.import_control_flow():
            self.infer()

    def _typed(self, name: str) -> tuple[int, tuple[int, ...]]:
        """A constant's or a statically typed value's (onnx element type, shape)."""
        if name in self.consts:
            return helper.np_dtype_to_tensor_dtype(self.consts[name].dtype), self.consts[name].shape
        return self.types[name].elem, self.types[name].shape

    def import_control_flow(self) -> bool:
        """Import the subgraphs of the If, Loop and Scan nodes left whose inputs and free values all have static
        types now (control_flow.import_control), which types their outputs; whether any was imported."""
        done = False
        for node in self.nodes:
            key = tuple(node.output)
            known = key in self.control or key in self.control_unsupported
            if node.op_type not in CONTROL_FLOW or node.domain not in DEFAULT_DOMAINS or known:
                continue
            reads = [n for n in node.input if n] + [n for a in node.attribute for n in _free_in(a)]
            if not all(n in self.consts or (n in self.types and self.types[n].static) for n in reads):
                continue
            try:
                self.control[key] = import_control(node, self._typed, self.consts, partial(_import_subgraph, self))
            except UnsupportedOp as e:
                self.control_unsupported[key] = e
                continue
            done = True
        return done

    def expand_functions(self) -> bool:
        """Replace ops tilefarm lacks by the function ONNX defines them with (Swish, GroupNormalization, ...),
        where every op of that function is supported."""
        functions, nodes, calls = [], [], {}
        for node in self.nodes:
            found = None if node.op_type in ONNX_OPS or node.name in self.kept else self._function(node)
            if found is None:
                nodes.append(node)
                continue
            call, body = found
            call.domain = body.domain = INLINE_DOMAIN
            call.op_type = body.name = f"{node.op_type}_{len(functions)}"
            # a body written for an older opset still holds at the model's (ONNX adds a version when it would not)
            del body.opset_import[:]
            body.opset_import.append(helper.make_opsetid("", self.opset))
            functions.append(body)
            nodes.append(call)
            calls[call.op_type] = node
        if not functions:
            return False
        imports = [*self.proto.opset_import, helper.make_opsetid(INLINE_DOMAIN, 1)]
        model = helper.make_model(
            helper.make_graph(nodes, "expand", [], []), opset_imports=imports, functions=functions
        )
        inlined = onnx.inliner.inline_local_functions(model).graph.node
        left = [calls[n.op_type] for n in inlined if n.domain == INLINE_DOMAIN]
        self.kept.update(n.name for n in left)  # the inliner declined these: they stay and are reported
        self.nodes = [
            calls.get(n.op_type, n) if n.domain == INLINE_DOMAIN else _named(n, i) for i, n in enumerate(inlined)
        ]
        return len(left) < len(functions)

    def _type_proto(self, name: str) -> onnx.TypeProto:
        if name in self.consts:
            a = self.consts[name]
            return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        t = self.types.get(name)
        return helper.make_tensor_type_proto(t.elem, t.shape) if t is not None else onnx.TypeProto()

    def _function(self, node: onnx.NodeProto) -> tuple[onnx.NodeProto, onnx.FunctionProto] | None:
        """The ONNX function body of `node`'s op at this opset, if it has one made only of supported ops, and a copy
        of the node with every attribute default spelled out (the body reads attributes by reference)."""
        if node.domain not in DEFAULT_DOMAINS:
            return None
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opset)
        except onnx.defs.SchemaError:
            return None
        full = onnx.NodeProto()
        full.CopyFrom(node)
        given = {a.name for a in node.attribute}
        full.attribute.extend(a.default_value for name, a in schema.attributes.items()
                              if name not in given and a.default_value.type != 0)  # fmt: skip
        versions = [v for v in schema.function_opset_versions if v <= self.opset]
        context_versions = [v for v in schema.context_dependent_function_opset_versions if v <= self.opset]
        body = onnx.FunctionProto()
        if versions:
            body.ParseFromString(schema.get_function_with_opset_version(max(versions)))
        elif context_versions:
            types = [self._type_proto(n) for n in node.input]
            if any(not t.HasField("tensor_type") or t.tensor_type.elem_type == 0 for t in types):
                return None
            body.ParseFromString(schema.get_context_dependent_function_with_opset_version(
                max(context_versions), full.SerializeToString(), [t.SerializeToString() for t in types]))  # fmt: skip
        else:
            return None
        if not all(n.op_type in ONNX_OPS and n.domain in DEFAULT_DOMAINS for n in body.node):
            return None
        return full, body

    def infer(self) -> None:
        self._infer()
        fixed = _ceil_mode_shapes(self.nodes, self.types)
        if any(self.types[name].shape != shape for name, shape in fixed.items()):
            self._infer(fixed)  # again, from the pool outputs' true shapes on

    def _infer(self, known: dict[str, tuple[int, ...]] | None = None) -> None:
        """onnx's shape inference over the remaining nodes; `known` gives values' shapes it is to take as they are."""
        known = known or {}
        g = helper.make_graph(
            self.nodes,
            "infer",
            [
                helper.make_tensor_value_info(vi.name, self.types[vi.name].elem, self.types[vi.name].shape)
                for vi in self.inputs
            ]
            + [
                helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                for n, a in self.consts.items()
                if a.size > SMALL_CONST
            ],
            [helper.make_empty_tensor_value_info(n) for n in self.outputs],
            initializer=[numpy_helper.from_array(a, n) for n, a in self.consts.items() if a.size <= SMALL_CONST],
            value_info=[helper.make_tensor_value_info(n, self.types[n].elem, s) for n, s in known.items()]
            + [helper.make_tensor_value_info(n, *t) for n, t in self._control_types().items() if n not in known]
            + [helper.make_tensor_value_info(n, *t) for n, t in self.contrib.items() if n not in known],
        )
        model = helper.make_model(g, opset_imports=self.proto.opset_import, ir_version=max(self.proto.ir_version, 4))
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception as e:
            raise InvalidModel(f"shape inference failed: {str(e).strip().splitlines()[0]}") from None
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            t = _type_of(vi)
            if t.elem != 0 or vi.name not in self.types:
                self.types[vi.name] = t
        self.types.update({n: _Type(*t) for n, t in self.contrib.items()})
        if self._contrib_types():  # onnx does not know them: infer again from their outputs on
            self._infer(known)
        # control-flow outputs are typed by their imported subgraphs (onnx leaves a scan output's length unknown)
        self.types.update({n: _Type(*t) for n, t in self._control_types().items()})

    def _contrib_types(self) -> bool:
        """Type the outputs of the com.microsoft nodes (quantized.contrib_types) whose inputs are typed and whose
        outputs are not yet; whether any was."""
        typed = False
        for node in self.nodes:
            if node.domain != CONTRIB_DOMAIN or all(n in self.contrib for n in node.output if n):
                continue
            ins = [self._typed(n) if n in self.consts or (n in self.types and self.types[n].static) else None
                   for n in node.input]  # fmt: skip
            outs = contrib_types(node.op_type, {a.name: _attr_value(a) for a in node.attribute}, ins)
            for name, t in zip(node.output, outs or []):
                self.contrib[name] = (t[0], tuple(t[1]))
                typed = True
        return typed

    def _control_types(self) -> dict[str, tuple[int, tuple[int, ...]]]:
        return {n: t for imported in self.control.values() for n, t in imported.types.items()}

    def fold(self) -> bool:
        kept: list[onnx.NodeProto] = []
        changed = self._empty_values_are_constants()
        for node in self.nodes:
            if all(self._empty(n) for n in node.output if n):
                changed = True
                continue  # `_empty_values_are_constants` gave its outputs
            branch = self._constant_branch(node)
            if branch is not None:
                kept.extend(branch)
                changed = True
                continue
            values = self._evaluate(node)
            if values is None:
                kept.append(node)
                continue
            for name, value in zip(node.output, values):
                if name:
                    self.consts[name] = self._as_inferred(name, np.asarray(value))
            changed = True
        self.nodes = kept
        return changed

    def _empty(self, name: str) -> bool:
        t = self.types.get(name)
        return t is not None and t.static and math.prod(t.shape) == 0

    def _empty_values_are_constants(self) -> bool:
        """A tensor with no elements is known from its type alone: it becomes a constant, so what reads it folds
        (a reduction over an empty axis, a Concat part of size 0), since kernels have no zero-sized loops."""
        empty = [n for n in self.types if n not in self.consts and self._empty(n)]
        for name in empty:
            self.consts[name] = np.zeros(self.types[name].shape, _np_dtype(self.types[name].elem))
        return bool(empty)

    def _constant_branch(self, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        """The nodes of the branch an `If` with a constant condition takes (exporters leave such shape checks)."""
        if node.op_type != "If" or node.domain not in DEFAULT_DOMAINS or node.input[0] not in self.consts:
            return None
        which = "then_branch" if bool(self.consts[node.input[0]].reshape(-1)[0]) else "else_branch"
        branch = next(helper.get_attribute_value(a) for a in node.attribute if a.name == which)
        for t in branch.initializer:
            self.consts[t.name] = self._initializer(t, f"initializer {t.name!r} of {node.name!r}")
        body = [_named(n, 0) for n in branch.node]
        for k, n in enumerate(body):
            n.name = n.name or f"{node.name}_{which}_{k}"
        # the branch's outputs take the If's output names through Identity, which folds or is removed later
        body += [helper.make_node("Identity", [o.name], [name], name=f"{node.name}_{name}")
                 for o, name in zip(branch.output, node.output) if name]  # fmt: skip
        return body

    def _as_inferred(self, name: str, value: np.ndarray) -> np.ndarray:
        # the reference evaluator occasionally widens dtypes; the model's declared type wins
        t = self.types.get(name)
        if t is not None and t.elem != 0 and value.dtype != object:
            want = _np_dtype(t.elem)
            if value.dtype != want:
                value = value.astype(want)
        return value

    def _evaluate(self, node: onnx.NodeProto) -> list[np.ndarray] | None:
        """The outputs of `node` if they can be computed now, else None."""
        if node.domain not in DEFAULT_DOMAINS or node.op_type in NONDETERMINISTIC:
            return None
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None
        if node.op_type in ("Shape", "Size") and node.input[0] not in self.consts:
            t = self.types.get(node.input[0])
            if t is None or t.shape is None:
                return None
            return [_shape_op(node, t.shape)]
        args = [n for n in node.input if n]
        if node.op_type == "CastLike" and node.input[0] in self.consts and self.types.get(node.input[1]):
            if self.types[node.input[1]].elem:  # only the type of the second input matters
                return [self.consts[node.input[0]].astype(_np_dtype(self.types[node.input[1]].elem))]
        if not all(n in self.consts for n in args):
            return None
        if node.op_type == "Identity":
            return [self.consts[node.input[0]]]  # the same array: nothing made
        # what the outputs will take, as far as their types tell, weighed before they are made
        typed = [(n, self.types[n]) for n in node.output if n and n in self.types and self.types[n].static]
        made = ", ".join(f"{n!r} of {list(t.shape)}" for n, t in typed)
        if not self._spend(node, f"would make {made}", sum(_nbytes(t) for _, t in typed), count=False):
            return None
        if node.op_type == "ConstantOfShape":
            fill, dims = _constant_of_shape(node, self.consts[node.input[0]])
            if not self._spend(node, f"asks for a constant of shape {list(dims)}", math.prod(dims) * fill.itemsize):
                return None
            return [np.full(dims, fill[0], dtype=fill.dtype)]
        if node.op_type == "Range":
            start, limit, delta = (self.consts[n].reshape(-1)[0] for n in node.input[:3])
            count = max(int(np.ceil((limit - start) / delta)), 0) if delta else 0
            itemsize = self.consts[node.input[0]].itemsize
            if not self._spend(node, f"would make {count:,} elements", count * itemsize, count=False):
                return None
        # in a one-node model of the model's opsets: a bare node is evaluated at onnx's newest opset (`opsets` is
        # ignored for one), where an opset-11 Unsqueeze's `axes` attribute is an error and the node never folded
        graph = helper.make_graph([node], "fold", [], [helper.make_empty_tensor_value_info(n) for n in node.output])
        model = helper.make_model(graph, opset_imports=self.proto.opset_import, ir_version=self.proto.ir_version)
        try:
            with np.errstate(all="ignore"):  # log(0) = -inf and the like fold as they compute at run time
                values = onnx.reference.ReferenceEvaluator(model).run(None, {n: self.consts[n] for n in args})
        except Exception:
            return None  # left as a node: either supported at run time or reported as unsupported
        # counted as made (outputs whose types were unknown too: those were weighed only now)
        made = sum(np.asarray(v).nbytes for v in values)
        return values if self._spend(node, f"made {size(made)} of outputs", made) else None

    def _spend(self, node: onnx.NodeProto, what: str, nbytes: int, count: bool = True) -> bool:
        """Whether folding `node`, which makes `nbytes` (`what` says how), fits what is left of the fold budget; if so
        and `count`, they are counted as spent. A node that does not fit is left to run time (check_static weighs
        its outputs), but an op that only ever folds cannot be: OverBudget naming it."""
        if not self.meter.fits(nbytes):
            if node.op_type in FOLD_ONLY:
                raise self.meter.refuse(f"{node.op_type} node {node.name!r} {what}", nbytes)
            return False
        if count:
            self.meter.spend(nbytes)
        return True

    # -- step 4: checks

    def check_supported(self) -> None:
        ops: dict[str, list[str]] = {}
        notes = []
        lacking = False  # an op tilefarm does not have, not only a run-time value where a constant is needed
        for node in self.nodes:
            name = node.name
            inner = self.control_unsupported.get(tuple(node.output))
            if inner is not None:  # what a subgraph lacks, listed with the rest
                for op, names in inner.ops.items():
                    ops.setdefault(op, []).extend(names)
                notes += inner.notes
                lacking |= not inner.shape_bound
                continue
            if node.domain == CONTRIB_DOMAIN and node.op_type in CONTRIB:
                continue
            if node.domain not in DEFAULT_DOMAINS:
                ops.setdefault(f"{node.domain}.{node.op_type}", []).append(name)
                lacking = True
            elif node.op_type not in ONNX_OPS:
                ops.setdefault(node.op_type, []).append(name)
                lacking = True
            elif node.op_type in FOLD_ONLY or self._runtime_params(node):
                ops.setdefault(node.op_type, []).append(name)
                notes.append(self._runtime_note(node, name))
        if ops:
            raise UnsupportedOp(ops, notes, shape_bound=not lacking)

    def _runtime_params(self, node: onnx.NodeProto) -> list[int]:
        slots = PARAM_INPUTS.get(node.op_type, ())
        return [i for i in slots if i < len(node.input) and node.input[i] and node.input[i] not in self.consts]

    def _runtime_note(self, node: onnx.NodeProto, name: str) -> str:
        if node.op_type in FOLD_ONLY and not self._runtime_params(node):
            return f"{node.op_type} node {name!r} must fold to a constant, but could not be evaluated at compile time"
        schema = onnx.defs.get_schema(node.op_type, self.opset)
        slots = ", ".join(
            f"{node.input[i]!r} ({schema.inputs[min(i, len(schema.inputs) - 1)].name})"
            for i in self._runtime_params(node)
        )
        return (
            f"{node.op_type} node {name!r}: input {slots} must be a compile-time constant, but is computed at run time"
        )

    def check_types(self) -> None:
        """Every node's input dtypes within its op's type constraints, and one dtype per constraint (onnx.checker
        does not look at types; a BatchNormalization of uint8 data or an Add of float and int64 is refused here, as
        onnxruntime refuses it, rather than compiled into something); convs' and pools' window attributes within
        their bounds (converters.check_window); constant weights (WEIGHTS) finite."""
        for node in self.nodes:
            if node.domain not in DEFAULT_DOMAINS or node.op_type in CONTROL_FLOW:
                continue
            for i in WEIGHTS.get(node.op_type, ()):
                w = self.consts.get(node.input[i]) if i < len(node.input) else None
                if w is not None and w.dtype.kind == "f" and not np.isfinite(w).all():
                    raise InvalidModel(
                        f"{node.op_type} node {node.name!r}: its weight {node.input[i]!r} holds NaN or inf; a trained "
                        "model's are finite, and where products with padding or algebra on them come out NaN or inf "
                        "depends on the order of the arithmetic"
                    )
            x = self.types.get(node.input[0]) if node.input else None
            if node.op_type in WINDOWED and x is not None and x.shape is not None:
                w = self._typed(node.input[1])[1] if node.op_type.startswith("Conv") and len(node.input) > 1 else None
                check_window(node.op_type, node.name, {a.name: _attr_value(a) for a in node.attribute}, len(x.shape), w)
            try:
                schema = onnx.defs.get_schema(node.op_type, self.opset)
            except onnx.defs.SchemaError:
                continue
            allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
            bound: dict[str, str] = {}
            for i, name in enumerate(node.input):
                if not name or not schema.inputs or (i >= len(schema.inputs) and not _variadic(schema.inputs[-1])):
                    continue
                formal = schema.inputs[min(i, len(schema.inputs) - 1)]
                elem = self._typed(name)[0] if name in self.consts or name in self.types else 0
                if not elem:
                    continue
                given = f"tensor({TensorProto.DataType.Name(elem).lower()})"
                takes = allowed.get(formal.type_str, {formal.type_str})
                mixed = formal.type_str in allowed and bound.setdefault(formal.type_str, given) != given
                if given not in takes or (mixed and (i < len(schema.inputs) or formal.is_homogeneous)):
                    why = f"while another is {bound[formal.type_str]}" if given in takes else (
                        f"which it does not take ({', '.join(sorted(takes))})")  # fmt: skip
                    raise InvalidModel(f"{node.op_type} node {node.name!r}: input {i} ({name!r}) is {given} {why}")

    def check_static(self) -> None:
        for vi in self.inputs:
            self._check_size(vi.name, f"input {vi.name!r}")
        for node in self.nodes:
            for out in node.output:
                self._check_size(out, f"{out!r} (output of {node.op_type} node {node.name!r})")
        for name in self.outputs:
            self._check_declared(name)
        bounded = {n for imported in self.control.values() for n in imported.bounded}
        for name in bounded.intersection(self.outputs) if self.nested else ():
            raise InvalidModel(
                f"{name!r} is a Loop scan output whose length is known only at run time (the loop's condition can "
                "end it early), given out of a subgraph; tilefarm compiles such a value only as an output of the model"
            )
        for node in self.nodes:
            for name in bounded.intersection(node.input):
                raise InvalidModel(
                    f"{node.op_type} node {node.name!r} reads {name!r}, a Loop scan output whose length is known only "
                    "at run time (the loop's condition can end it early); tilefarm compiles such a value only as a "
                    "graph output"
                )
            for out in node.output:
                t = self.types.get(out)
                if out and (t is None or not t.static):
                    raise InvalidModel(
                        f"the shape of {out!r} (output of {node.op_type} node {node.name!r}) is not static "
                        "after shape inference and constant folding; fix the input shapes with --input-shapes"
                    )
        for out in self.outputs:
            if out not in self.consts and not (out in self.types and self.types[out].static):
                raise InvalidModel(
                    f"graph output {out!r} has no static shape; fix the input shapes with --input-shapes"
                )

    def _check_declared(self, name: str) -> None:
        """A graph output computed with another dtype than the model declares for it is refused, as onnxruntime refuses
        it (its artifact would return what the model says it does not). Not so a shape: exporters state wrong ones
        (ddddocr's CRNN declares [1, ?] for a [20, 1, 8210] output), which onnxruntime only warns about."""
        stated, t = self.declared[name], self.types.get(name)
        if name in self.consts:
            a = self.consts[name]
            t = _Type(helper.np_dtype_to_tensor_dtype(a.dtype) if a.dtype != object else 0, a.shape)
        if t is None or t.elem == 0:
            return
        if stated.elem_type and stated.elem_type != t.elem:
            names = [TensorProto.DataType.Name(e) if e in TensorProto.DataType.values() else str(e)
                     for e in (stated.elem_type, t.elem)]  # fmt: skip
            raise InvalidModel(f"graph output {name!r} is declared {names[0]} but computes {names[1]}")

    def _check_size(self, name: str, what: str) -> None:
        t = self.types.get(name)
        if t is not None and t.static and _nbytes(t) > self.meter.budget.value_bytes:
            raise self.meter.budget.refuse(f"{what} is {list(t.shape)}", _nbytes(t), "value_bytes")

    # -- step 5: convert

    def convert(self) -> Graph:
        conv = _Converter(self)
        return conv.run()


def _free_in(a: onnx.AttributeProto) -> list[str]:
    """The enclosing graph's names a graph attribute reads (control_flow.free_names)."""
    graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
    return [n for g in graphs for n in free_names(g)]


def _named(node: onnx.NodeProto, index: int) -> onnx.NodeProto:
    """A copy of the node with a name to report: its own, or op_type and position in the model."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.name = node.name or f"{node.op_type}_{index}"
    return copy


def _to_array(t, what: str) -> np.ndarray:
    try:
        if isinstance(t, onnx.SparseTensorProto):
            return _dense(t)
        return numpy_helper.to_array(t)
    except Exception as e:
        raise InvalidModel(f"cannot read {what}: {e}") from None


def _dense(t: onnx.SparseTensorProto) -> np.ndarray:
    values, indices = numpy_helper.to_array(t.values), numpy_helper.to_array(t.indices)
    dense = np.zeros(math.prod(t.dims), values.dtype)
    # indices are either flat positions [NNZ] or coordinates [NNZ, rank]
    flat = indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), tuple(t.dims))
    dense[flat] = values
    return dense.reshape(tuple(t.dims))


def _shape_op(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(math.prod(shape), dtype=np.int64)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return np.array(shape[slice(start, end)], dtype=np.int64)


def _constant_of_shape(node: onnx.NodeProto, shape: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """A ConstantOfShape's fill value (one element) and the dims of the constant it asks for."""
    fill = np.zeros(1, np.float32)
    for a in node.attribute:
        if a.name == "value":
            fill = numpy_helper.to_array(a.t).reshape(-1)
    dims = tuple(int(s) for s in shape.reshape(-1))
    if any(d < 0 for d in dims):
        raise InvalidModel(f"ConstantOfShape node {node.name!r} asks for a constant of negative shape {list(dims)}")
    return fill, dims


class _Converter:
    def __init__(self, state: _State):
        self.s = state
        # graph inputs and outputs keep the model's own names, which users feed and read; no code uses a value's name
        # as an identifier (tasks and codegen make their own), so internal values are only made readable and unique
        self.kept = {vi.name for vi in state.inputs} | set(state.outputs)
        self.names: set[str] = set(self.kept)
        self.values: dict[str, Value] = {}

    def control(self, outputs: list[str]) -> Imported:
        return self.s.control[tuple(outputs)]

    def unique(self, name: str) -> str:
        base = _sanitize(name)
        name, k = base, 1
        while name in self.names:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        return name

    def value(self, name: str) -> Value:
        if name not in self.values:
            const = self.s.consts.get(name)
            if const is not None:
                elem = TensorProto.STRING if const.dtype == object else helper.np_dtype_to_tensor_dtype(const.dtype)
                shape, dtype = const.shape, _dtype_name(elem, f"constant {name!r}")
            else:
                t = self.s.types[name]
                shape, dtype = t.shape, _dtype_name(t.elem, f"value {name!r}")
            own = name if name in self.kept else self.unique(name)
            self.values[name] = Value(own, TensorType(tuple(shape), dtype), const)
        return self.values[name]

    def run(self) -> Graph:
        s = self.s
        inputs = [self.value(vi.name) for vi in s.inputs]
        used = {n for node in s.nodes for n in node.input if n} | set(s.outputs)
        nodes: list[Node] = []
        errors: dict[str, list[str]] = {}
        notes: list[str] = []
        for p in s.nodes:
            name = p.name
            ctx = _Ctx(
                op=p.op_type,
                name=_sanitize(name),
                opset=s.opset,
                attrs={a.name: _attr_value(a) for a in p.attribute},
                inputs=[self.value(n) if n else None for n in p.input],
                outputs=[self.value(n) if n else None for n in p.output],
                used=used,
                conv=self,
                onnx_outputs=list(p.output),
            )
            try:
                nodes.extend((CONTRIB if p.domain == CONTRIB_DOMAIN else ONNX_OPS)[p.op_type](ctx))
            except InvalidModel as e:  # named by the node, where the converter's check could not
                raise e if repr(name) in str(e) else InvalidModel(f"{p.op_type} node {name!r}: {e}") from None
            except _CannotConvert as e:
                errors.setdefault(p.op_type, []).append(name)
                notes.append(e.note)
        if errors:
            raise UnsupportedOp(errors, notes)
        return Graph(inputs, [self.value(n) for n in s.outputs], nodes, _sanitize(s.proto.graph.name or "graph"))


def _attr_value(a: onnx.AttributeProto) -> Any:
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode() for x in v]
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    return v
