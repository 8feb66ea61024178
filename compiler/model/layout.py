"""Layout propagation: convolution networks keep their activations in NCHWc between layers.

`block_conv_weights` makes every eligible conv compute N x F/b x OH x OW x b (b = CONV_BLOCK channel lanes
innermost) and copy the result back to NCHW. Between two such convs that copy is undone again: the next conv reads
one input channel at a time from 16 planes apart, and each NCHW store of a 16-channel accumulator touches 16 cache
lines. `propagate_nchwc` keeps such values blocked (onnxruntime's NCHWc transformer does the same):

- a BlockedConv writes its result NCHWc when something downstream wants it so (a WinogradConv always does), and
  reads NCHWc data when its producer wrote it so (its `data_layout` / `out_layout` attributes; its weight then gets
  input-channel blocks too, F/b x C/b x KH x KW x b x b, so the reduction reads it in one stream); a WinogradConv
  does the same with its weight unchanged;
- elementwise ops, same-shape binary ops (scalar constants allowed) and pools pass the layout through (pools get
  `layout="NCHWc"`), so a conv + bias + residual add + ReLU task and a max pool vectorize over the lanes;
- wherever a blocked value meets anything else (a Flatten, a depthwise conv, a graph output), an `NCHWcToNCHW`
  node puts it back once; it is injective, so fusion folds it into what reads it where it can.

A value is kept blocked only when some reader gains from it: a BlockedConv or WinogradConv, a global pool (whose
output is tiny to convert), or a pass-through op whose own output is kept blocked. So a conv whose only reader
wants NCHW still writes NCHW from its accumulators, as before, and no conversion is added.
"""

from __future__ import annotations

from dataclasses import replace

from compiler.model.graph import NCHWC, Graph, Node, TensorType, Value, toposort
from compiler.model.passes import (
    CONV_BLOCK,
    ELEMWISE,
    block_conv_input_channels,
    blockable_channels,
    pad_channels,
    pattern,
)

_BINARY = {"Add", "Sub", "Mul", "Div", "Max", "Min"}
_POOLS = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}
_GLOBAL_POOLS = {"GlobalAveragePool", "GlobalMaxPool"}
_CONVS = {"BlockedConv", "WinogradConv"}  # convs that read and write either layout
_FLOATS = {"float32", "float64", "float16"}


# ops that keep the padding lanes of a padded block finite (they start at 0, from the conv's zero filters): the next
# conv multiplies them by zero weights, and a NaN or infinity there (0/0, log 0) would spread into every channel
_PADDING_SAFE = {
    "Add", "Sub", "Mul", "Max", "Min", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
    "Elu", "Selu", "Celu", "Softplus", "Neg", "Abs", "Identity", "Erf", "Gelu", "Mish", *_POOLS,
}  # fmt: skip


def _blockable_shape(v: Value) -> bool:
    return len(v.shape) == 4 and blockable_channels(v.shape[1]) and v.dtype in _FLOATS


def _padded(v: Value) -> bool:
    """A value whose channels fill its last block only partly (24 in two blocks of 16)."""
    return v.shape[1] % CONV_BLOCK != 0


def _is_scalar_const(v: Value | None) -> bool:
    return v is not None and v.const is not None and v.const.size == 1


def _passes_through(n: Node) -> bool:
    """Ops that compute the same thing on NCHWc data as on NCHW data, given the layout."""
    if n.op in _BINARY or n.op in _POOLS:
        return True
    return pattern(n) == ELEMWISE and len(n.outputs) == 1 and all(v is None for v in n.inputs[1:])


def _can_block(n: Node, can: set[int]) -> bool:
    """Whether n could write its (single) output NCHWc, given which values could be NCHWc (`can`)."""
    out = n.outputs[0]
    if len(n.outputs) != 1 or not _blockable_shape(out):
        return False
    if n.op in _CONVS:  # its bias, if any, must be a constant to lay out in blocks
        return len(n.inputs) < 3 or n.inputs[2] is None or n.inputs[2].const is not None
    if not _passes_through(n) or _padded(out) and n.op not in _PADDING_SAFE:
        return False
    data = [v for v in n.inputs if v is not None and not _is_scalar_const(v)]
    if n.op in _POOLS:
        return len(data) == 1 and id(data[0]) in can
    # same-shape operands only: a broadcast operand (a per-channel constant, say) would need its own re-layout
    return bool(data) and all(id(v) in can and v.shape == out.shape for v in data)


def _blocked_type(v: Value) -> TensorType:
    n, c, h, w = v.shape
    return TensorType((n, -(-c // CONV_BLOCK), h, w, CONV_BLOCK), v.dtype)


def propagate_nchwc(g: Graph) -> Graph:
    """Keep activations between blocked convs in NCHWc (see the module docstring)."""
    can: set[int] = set()
    for n in g.nodes:
        if _can_block(n, can):
            can.add(id(n.outputs[0]))
    wanted: set[int] = set()  # values worth writing NCHWc: a subset of `can`, decided from the readers backwards
    for n in reversed(g.nodes):
        if n.op in _CONVS:
            readers_want = n.inputs[:1]
        elif n.op in _GLOBAL_POOLS or id(n.outputs[0]) in wanted:
            readers_want = n.inputs
        else:
            continue
        wanted.update(id(v) for v in readers_want if v is not None and id(v) in can)
    # a global pool that reads NCHWc writes NCHWc too: converting its C values back costs nothing
    wanted.update(id(n.outputs[0]) for n in g.nodes if n.op in _GLOBAL_POOLS and id(n.inputs[0]) in wanted)
    # a Winograd conv always writes NCHWc: its inverse transform yields channel vectors, and an NCHW reader gets
    # them through an NCHWcToNCHW task of its own (onnxruntime's ReorderOutput), where a gather into NCHW in the
    # conv's own task measured 1.5x slower (2.0 against 1.3 ms for ResNet's 64-channel layer, 128 trials each)
    wanted.update(id(n.outputs[0]) for n in g.nodes if n.op == "WinogradConv")
    wanted &= can
    if not wanted:
        return g

    blocked: dict[int, Value] = {}  # id(original value) -> its NCHWc twin
    produced_plain: set[int] = set()
    nodes: list[Node] = []
    relaid: dict[tuple, Value | None] = {}  # constants laid out once, however many convs share them

    def once(fn, v: Value | None) -> Value | None:
        key = (fn, id(v))
        if key not in relaid:
            relaid[key] = fn(v)
        return relaid[key]

    def plain(v: Value | None) -> Value | None:
        """v as NCHW: the original value, converted back from its NCHWc twin the first time it is needed."""
        if v is None or id(v) not in blocked or id(v) in produced_plain:
            return v
        attrs = {"channels": v.shape[1]} if _padded(v) else {}
        nodes.append(Node("NCHWcToNCHW", (blocked[id(v)],), (v,), attrs, f"{v.name}_to_nchw"))
        produced_plain.add(id(v))
        return v

    for n in g.nodes:
        out = n.outputs[0]
        block_out = id(out) in wanted
        if n.op in _CONVS:
            attrs, x = dict(n.attrs), n.inputs[0]
            outs, rest = n.outputs, n.inputs[1:]
            if x is not None and id(x) in blocked:
                attrs["data_layout"], x = NCHWC, blocked[id(x)]
                if n.op == "BlockedConv" and n.attrs.get("group", 1) == 1:  # a Winograd or depthwise weight reads
                    # either layout as it is
                    rest = (once(_input_blocked_weight, rest[0]), *rest[1:])
            if block_out:
                attrs["out_layout"] = NCHWC
                outs = (_twin(out, blocked),)
                rest = (rest[0], *(once(_blocked_bias, v) for v in rest[1:2]), *rest[2:])  # WinogradConv: B^T, A^T
            nodes.append(replace(n, inputs=(x, *rest), outputs=outs, attrs=attrs))
        elif block_out:
            ins = tuple(blocked[id(v)] if v is not None and id(v) in blocked else v for v in n.inputs)
            attrs = {**n.attrs, "layout": NCHWC} if n.op in _POOLS else n.attrs
            nodes.append(replace(n, inputs=ins, outputs=(_twin(out, blocked),), attrs=attrs))
        else:
            nodes.append(replace(n, inputs=tuple(plain(v) for v in n.inputs)))
    for v in g.outputs:
        plain(v)  # a graph output leaves NCHW, under its own name
    return Graph(g.inputs, g.outputs, toposort(nodes), g.name)


def _input_blocked_weight(w: Value) -> Value:
    """A BlockedConv weight F/b x C x KH x KW x b laid out F/b x C/b x KH x KW x b x b for NCHWc data."""
    assert w.const is not None, "BlockedConv weights are constants (block_conv_weights)"
    c = block_conv_input_channels(w.const)
    return Value(f"{w.name}_i{CONV_BLOCK}", TensorType(c.shape, w.dtype), c)


def _blocked_bias(v: Value | None) -> Value | None:
    """A conv's constant bias (F,) laid out F/b x b, as the NCHWc output reads it (zero in a padded block's lanes)."""
    if v is None:
        return v
    assert v.const is not None, "only a conv with a constant bias is blocked (_can_block)"
    c = pad_channels(v.const, 0).reshape(-1, CONV_BLOCK)
    return Value(f"{v.name}_blocked", TensorType(c.shape, v.dtype), c)


def _twin(v: Value, blocked: dict[int, Value]) -> Value:
    twin = Value(f"{v.name}_nchwc", _blocked_type(v))
    blocked[id(v)] = twin
    return twin
