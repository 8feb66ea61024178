"""If, Loop and Scan: their subgraphs imported as closed graphs of their own, run by the artifact's native entry.

Each subgraph is imported like a model (`import_graph`, the importer's own pipeline: fixed input shapes, folding,
inference, checks, conversion) with these inputs, in order: its formal inputs (a Loop body's iteration number,
condition and loop-carried values; a Scan body's states and slices), then every value of the enclosing graph it reads
that is computed at run time (its free values; constant ones become its constants). The graph node gets those free
values as trailing inputs, so every subgraph is closed and the passes and the planner see ordinary node inputs.

What `import_control` types (the enclosing graph's shapes depend on it, so it runs while that graph is folded):
- If: both branches must give each output the same type (else the shape would depend on the data);
- Loop: a loop-carried value must keep its type through the body; a scan output stacks one slice per iteration, so
  it needs a trip count M known at compile time. When the condition can end the loop early the count run is known
  only at run time: the output is sized for M and its leading dim is only a bound (`Imported.bounded`), allowed for a
  graph output only (the artifact reports the length run);
- Scan: becomes a Loop over the scanned axis (length known from the shapes): scan inputs are moved to lead
  (Transpose) and reversed (Slice) where asked, the body reads slice i by a Gather, and scan outputs are put back.

The graph nodes made (`compiler.model.graph` describes them): If(cond, *free) with `branches` = (then, else) and
Loop(M, cond, *initial, *free) with `body`, `carried`, `trips`, `bounded`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from compiler.base.errors import InvalidModel, TilefarmError, UnsupportedOp
from compiler.model.graph import Graph, Node, TensorType, Value
from compiler.model.onnx_import.converters import _Ctx

# (name, onnx element type, shape) of a subgraph's formal input
Formal = tuple[str, int, tuple[int, ...]]
# the importer's pipeline on one subgraph: (graph, formals, free names, where) -> the converted graph
ImportGraph = Callable[[onnx.GraphProto, list[Formal], list[str], str], Graph]


@dataclass
class Imported:
    """One control-flow node's subgraphs, converted, and the types of its outputs."""

    graphs: tuple[Graph, ...]  # If: then, else; Loop, Scan: the body (the run-time free values are trailing inputs)
    types: dict[str, tuple[int, tuple[int, ...]]]  # output name -> (onnx element type, shape)
    trips: int | None = None  # Loop: M when constant; Scan: the scanned length
    bounded: set[str] = field(default_factory=set)  # outputs whose leading dim is only a bound on the length run


def free_names(g: onnx.GraphProto) -> list[str]:
    """Names a graph (with the graphs nested in it) reads but does not define, in order of first use."""
    defined = {i.name for i in g.input} | {t.name for t in g.initializer}
    defined |= {t.values.name for t in g.sparse_initializer}
    out: dict[str, None] = {}
    for node in g.node:
        nested = [name for a in node.attribute for sub in _graphs(a) for name in free_names(sub)]
        for name in [*node.input, *nested]:
            if name and name not in defined:
                out.setdefault(name)
        defined.update(o for o in node.output if o)
    for o in g.output:
        if o.name not in defined:
            out.setdefault(o.name)
    return list(out)


def _graphs(a: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if a.type == onnx.AttributeProto.GRAPH:
        return [a.g]
    return list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []


def _attr(node: onnx.NodeProto, name: str, default=None):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _elem(v: Value) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype))


def _declared_shape(vi: onnx.ValueInfoProto, default: tuple[int, ...]) -> tuple[int, ...]:
    tt = vi.type.tensor_type
    if not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
        return default
    return tuple(d.dim_value for d in tt.shape.dim)


def import_control(
    node: onnx.NodeProto,
    type_of: Callable[[str], tuple[int, tuple[int, ...]]],
    consts: dict[str, np.ndarray],
    import_graph: ImportGraph,
) -> Imported:
    """Import the subgraphs of an If, Loop or Scan whose inputs all have static types (`type_of`) or are `consts`."""
    if node.op_type == "If":
        return _import_if(node, import_graph)
    if node.op_type == "Loop":
        return _import_loop(node, type_of, consts, import_graph)
    return _import_scan(node, type_of, import_graph)


def _import_if(node: onnx.NodeProto, import_graph: ImportGraph) -> Imported:
    """Both branches; one whose shapes do not work out for these input shapes (Silero VAD's 8 kHz branch, given a
    16 kHz window) becomes a trap (`_trap`): taking it fails the run, naming why."""
    branches = [_attr(node, "then_branch"), _attr(node, "else_branch")]
    free = list(dict.fromkeys(n for b in branches for n in free_names(b)))
    graphs: list[Graph | None] = []
    errors: list[TilefarmError] = []
    for b, which in zip(branches, ("then", "else")):
        try:
            graphs.append(import_graph(b, [], free, f"{node.name}/{which}"))
        except (InvalidModel, UnsupportedOp) as e:
            if isinstance(e, UnsupportedOp) and not e.shape_bound:
                raise
            graphs.append(None)
            errors.append(e)
    live = [g for g in graphs if g is not None]
    if not live:
        raise errors[0]
    if len(live) == 1:
        reason = f"If node {node.name!r} took a branch that was not compiled for these input shapes: {errors[0]}"
        graphs = [g if g is not None else _trap(live[0], reason) for g in graphs]
    then, other = graphs
    types = {}
    for k, (name, a, b) in enumerate(zip(node.output, then.outputs, other.outputs)):
        if a.type != b.type:
            raise InvalidModel(
                f"If node {node.name!r}: output {k} ({name!r}) is {a.type} in then_branch but {b.type} in "
                "else_branch, so its shape depends on the data; tilefarm compiles an If whose branches agree"
            )
        types[name] = (_elem(a), a.shape)
    return Imported((then, other), types)


def _trap(like: Graph, reason: str) -> Graph:
    """A branch that fails the run with `reason`: a Trap node giving outputs typed as `like`'s."""
    outputs = tuple(Value(f"{v.name}_trap", v.type) for v in like.outputs)
    inputs = [Value(v.name, v.type) for v in like.inputs]
    return Graph(inputs, list(outputs), [Node("Trap", (), outputs, {"reason": reason}, "trap")], "trap")


def _carried_kept(node: onnx.NodeProto, body: Graph, first_in: int, first_out: int, names: Sequence[str]) -> None:
    """Loop-carried values (body inputs from `first_in`, outputs from `first_out`) keep their types."""
    for k, name in enumerate(names):
        before, after = body.inputs[first_in + k].type, body.outputs[first_out + k].type
        if before != after:
            raise InvalidModel(
                f"{node.op_type} node {node.name!r}: the body turns loop-carried value {name!r} from {before} into "
                f"{after}, so its shape would change from iteration to iteration; tilefarm compiles loops whose "
                "carried values keep their type"
            )


def _passes_condition_on(body: Graph) -> bool:
    """Whether the body's condition output is its condition input or the constant true (it never ends the loop)."""
    out = body.outputs[0]
    made = body.producers()
    while id(out) in made and made[id(out)].op == "Identity":
        out = made[id(out)].inputs[0]
    return out is body.inputs[1] or (out.const is not None and bool(out.const.reshape(-1)[0]))


def _import_loop(node, type_of, consts, import_graph) -> Imported:
    body_proto = _attr(node, "body")
    trip, cond = (node.input[i] if len(node.input) > i and node.input[i] else None for i in (0, 1))
    initial = list(node.input[2:])
    formals: list[Formal] = [
        (body_proto.input[0].name, TensorProto.INT64, _declared_shape(body_proto.input[0], ())),
        (body_proto.input[1].name, TensorProto.BOOL, _declared_shape(body_proto.input[1], ())),
    ]
    formals += [(vi.name, *type_of(name)) for vi, name in zip(body_proto.input[2:], initial)]
    body = import_graph(body_proto, formals, free_names(body_proto), f"{node.name}/body")
    _carried_kept(node, body, 2, 1, initial)
    trips = None if trip is None or trip not in consts else max(0, int(consts[trip].reshape(-1)[0]))
    if cond is not None and cond in consts and not bool(consts[cond].reshape(-1)[0]):
        trips = 0
    runs_all = trips is not None and (cond is None or cond in consts) and _passes_condition_on(body)
    outputs = list(node.output)
    types = {name: type_of(i) for name, i in zip(outputs, initial)}
    bounded = set()
    for name, piece in zip(outputs[len(initial) :], body.outputs[1 + len(initial) :]):
        if trips is None:
            raise InvalidModel(
                f"Loop node {node.name!r}: scan output {name!r} stacks one {piece.type} per iteration, but the trip "
                "count M is not a compile-time constant, so its size is unknown; tilefarm needs a constant M "
                "(a bound on the iterations) to compile it"
            )
        types[name] = (_elem(piece), (trips, *piece.shape))
        if not runs_all:
            bounded.add(name)
    return Imported((body,), types, trips, bounded)


def _import_scan(node, type_of, import_graph) -> Imported:
    body_proto = _attr(node, "body")
    n_scan = _attr(node, "num_scan_inputs")
    n_states = len(node.input) - n_scan
    axes = _attr(node, "scan_input_axes") or [0] * n_scan
    formals: list[Formal] = [(vi.name, *type_of(name)) for vi, name in zip(body_proto.input, node.input[:n_states])]
    lengths = set()
    for vi, name, axis in zip(body_proto.input[n_states:], node.input[n_states:], axes):
        elem, shape = type_of(name)
        axis = axis % len(shape)
        lengths.add(shape[axis])
        formals.append((vi.name, elem, shape[:axis] + shape[axis + 1 :]))
    if len(lengths) != 1:
        raise InvalidModel(f"Scan node {node.name!r}: its scan inputs differ in length along their axes ({lengths})")
    (length,) = lengths
    body = import_graph(body_proto, formals, free_names(body_proto), f"{node.name}/body")
    _carried_kept(node, body, 0, 0, node.input[:n_states])
    out_axes = _attr(node, "scan_output_axes") or [0] * (len(node.output) - n_states)
    types = {name: type_of(i) for name, i in zip(node.output, node.input[:n_states])}
    for name, piece, axis in zip(node.output[n_states:], body.outputs[n_states:], out_axes):
        axis = axis % (len(piece.shape) + 1)
        types[name] = (_elem(piece), piece.shape[:axis] + (length,) + piece.shape[axis:])
    return Imported((body,), types, length)


# ---------------------------------------------------------------------------------------------- converters


def _free_values(ctx: _Ctx, graph: Graph, formals: int) -> list[Value]:
    """The enclosing graph's values bound to the subgraph inputs after its `formals`."""
    return [ctx.conv.value(v.name) for v in graph.inputs[formals:]]


def _if(ctx: _Ctx) -> list[Node]:
    imported = ctx.conv.control(ctx.onnx_outputs)
    then, other = imported.graphs
    free = _free_values(ctx, then, 0)
    return [ctx.node("If", [ctx.inputs[0], *free], {"branches": (then, other)}, ctx.outputs)]


def _loop(ctx: _Ctx) -> list[Node]:
    imported = ctx.conv.control(ctx.onnx_outputs)
    (body,) = imported.graphs
    carried = len(ctx.inputs) - 2
    free = _free_values(ctx, body, 2 + carried)
    attrs = {"body": body, "carried": carried, "trips": imported.trips, "bounded": bool(imported.bounded)}
    return [ctx.node("Loop", [ctx.input(0), ctx.input(1), *ctx.inputs[2:], *free], attrs, ctx.outputs)]


def _scan(ctx: _Ctx) -> list[Node]:
    """Scan as a Loop of its length: scan inputs led by their axis (reversed where asked) and read by a Gather of the
    iteration number; the stacked scan outputs put back in place."""
    imported = ctx.conv.control(ctx.onnx_outputs)
    (body,) = imported.graphs
    n_scan = ctx.attrs["num_scan_inputs"]
    n_states = len(ctx.inputs) - n_scan
    length = imported.trips
    nodes: list[Node] = []
    full: list[Value] = []
    directions = ctx.attrs.get("scan_input_directions") or [0] * n_scan
    for j, (v, axis, reverse) in enumerate(zip(ctx.inputs[n_states:], ctx.attrs.get("scan_input_axes") or [0] * n_scan,
                                               directions)):  # fmt: skip
        axis %= len(v.shape)
        if axis:
            perm = [axis, *(d for d in range(len(v.shape)) if d != axis)]
            moved = ctx.temp(f"scan{j}_lead", tuple(v.shape[d] for d in perm), v.dtype)
            nodes.append(ctx.node("Transpose", [v], {"perm": perm}, [moved]))
            v = moved
        if reverse:
            out = ctx.temp(f"scan{j}_rev", v.shape, v.dtype)
            nodes.append(_reversed(ctx, v, out))
            v = out
        full.append(v)
    # the body in Loop form: (iteration, condition, states, whole scan inputs, free) -> (condition, states, pieces)
    it = Value(ctx.conv.unique(f"{ctx.name}_i"), TensorType((), "int64"))
    cond = Value(ctx.conv.unique(f"{ctx.name}_cond"), TensorType((), "bool"))
    wholes = [Value(ctx.conv.unique(f"{ctx.name}_whole{j}"), v.type) for j, v in enumerate(full)]
    slices = body.inputs[n_states : n_states + n_scan]
    gathers = [Node("Gather", (w, it), (s,), {"axis": 0}, f"{ctx.name}_slice{j}") for j, (w, s) in
               enumerate(zip(wholes, slices))]  # fmt: skip
    loop_body = Graph(
        [it, cond, *body.inputs[:n_states], *wholes, *body.inputs[n_states + n_scan :]],
        [cond, *body.outputs],
        [*gathers, *body.nodes],
        body.name,
    )
    free = _free_values(ctx, body, n_states + n_scan)
    stacked = []
    out_axes = ctx.attrs.get("scan_output_axes") or [0] * (len(ctx.outputs) - n_states)
    out_dirs = ctx.attrs.get("scan_output_directions") or [0] * len(out_axes)
    finals: list[Node] = []
    for j, (out, piece, axis, reverse) in enumerate(zip(ctx.outputs[n_states:], body.outputs[n_states:], out_axes,
                                                        out_dirs)):  # fmt: skip
        axis %= len(piece.shape) + 1
        v = ctx.temp(f"stack{j}", (length, *piece.shape), piece.dtype)
        stacked.append(v)
        if reverse:
            w = ctx.temp(f"stack{j}_rev", v.shape, v.dtype) if axis else out
            finals.append(_reversed(ctx, v, w))
            v = w
        if axis:
            perm = [*range(1, axis + 1), 0, *range(axis + 1, len(v.shape))]
            finals.append(ctx.node("Transpose", [v], {"perm": perm}, [out]))
        elif not reverse:
            finals.append(ctx.node("Identity", [v], {}, [out]))
    trips = ctx.constant("trips", np.array(length, np.int64))
    attrs = {"body": loop_body, "carried": n_states, "trips": length, "bounded": False}
    loop = ctx.node("Loop", [trips, None, *ctx.inputs[:n_states], *full, *free], attrs,
                    [*ctx.outputs[:n_states], *stacked])  # fmt: skip
    return [*nodes, loop, *finals]


def _reversed(ctx: _Ctx, v: Value, out: Value) -> Node:
    """`out` = v reversed along its first axis."""
    n = v.shape[0]
    return ctx.node("Slice", [v], {"starts": [n - 1], "ends": [-1], "axes": [0], "steps": [-1]}, [out])


CONTROL_FLOW = {"If": _if, "Loop": _loop, "Scan": _scan}
