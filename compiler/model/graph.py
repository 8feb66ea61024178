"""Graph IR: typed values, nodes in topological order, constants as numpy arrays, a text printer.

Nodes use ONNX operator names (`Conv`, `MatMul`, `Add`, …) plus a few of tilefarm's own made by passes (`Dense`,
`BlockedConv`, `WinogradConv`, `NCHWcToNCHW`, `PackedMatMul`, `Requantize`, and the integer route's
`PackedMatMulInteger` and `PackedConvInteger`, described in `compiler.model.int8_layout`).
The frontend normalizes every node so that later stages never look at ONNX again:

- attributes are ONNX's, with every default filled in and spelled out as plain Python values (ints, floats,
  strings, lists of ints), e.g. Conv always has `strides`, `pads` (begin..., end...), `dilations`, `group`,
  `kernel_shape`; `auto_pad` is resolved into `pads` and removed;
- inputs that ONNX allows as tensors but that must be known to compile are constant-folded and moved into
  attributes under the ONNX input name: Reshape `shape` (0 and -1 resolved to the real output shape), Expand
  `shape`, Tile `repeats`, Slice `starts`/`ends`/`axes`/`steps` (all four, clamped to the data's bounds, one entry
  per sliced axis), Pad `pads` (+ `constant_value`, `mode`), Split `split` (sizes, always listed), Squeeze /
  Unsqueeze `axes`, Reduce* `axes` (always listed; an empty list means all axes unless noop_with_empty_axes), Clip
  `min`/`max` (floats, ±inf when absent), Resize `sizes` (the output shape, always) with `mode`,
  `coordinate_transformation_mode`, `nearest_mode`, `cubic_coeff_a`; TopK `k`;
- negative axes are made non-negative; data inputs left are real tensors (graph inputs, node outputs, or
  constants such as weights and Gather indices, held in `Value.const`).

Details the frontend (`compiler.model.onnx_import`) guarantees beyond that:

- Slice entries are sorted by axis and follow Python's `range(start, end, step)`: with a negative step `end` may be
  -1, meaning "through index 0";
- Reduce* `axes` is never empty for a non-scalar input (ONNX's empty axes become every axis;
  `noop_with_empty_axes=1` with empty axes becomes `Identity`), so `noop_with_empty_axes` is always 0;
- Expand `shape` is the full output shape; Pad `pads` has 2·rank entries (opset 18's `axes` input is resolved),
  `constant_value` is a float;
- Resize also has `scales` (one float per dim: the scale ONNX's coordinate transform uses, i.e. the given scales,
  else sizes/input), `roi` (2·rank floats, begin..., end..., for tf_crop_and_resize), `exclude_outside`,
  `extrapolation_value`, `antialias`; `axes` and `keep_aspect_ratio_policy` are resolved into `sizes`/`scales`;
- ConvTranspose has `kernel_shape`, `strides`, `pads`, `dilations`, `group`, `output_padding`; `output_shape` and
  `auto_pad` are resolved into `pads` (and `output_padding` when the output is larger than stride × input);
- pools: MaxPool has `kernel_shape`, `strides`, `pads`, `dilations`, `ceil_mode`, `storage_order`; AveragePool the
  same with `count_include_pad` instead of `storage_order`;
- Softmax / LogSoftmax normalize over the single `axis` (opset-13 meaning). Before opset 13 they flattened the input
  to 2-D at `axis`; that is written as Flatten(axis) → Softmax(axis=1) → Reshape(shape=input shape), or as one
  Softmax(axis) when every dim after `axis` is 1;
- Gather has `axis`; constant indices are made non-negative;
- Cast `to` is a tilefarm dtype name (`"float32"`); CastLike becomes Cast;
- Sum / Mean / Max / Min of N inputs become chains of binary Add / Max / Min (Mean then Divs by the constant N);
  one input becomes Identity;
- Dropout becomes Identity (a mask output that is read becomes a constant of ones); Identity is kept;
- BatchNormalization (`epsilon`, `momentum`), LayerNormalization (`axis`, `epsilon`, `stash_type`) and MaxPool
  have only their first output;
- Constant, ConstantOfShape, Shape, Size and Range never appear: they are folded into constants at import;
- `Dense` (made by passes): inputs X (M x K), W (N x K) and an optional bias (N,); no attributes (Gemm with transB=1).
- `BlockedConv` (made by passes): a 2-D Conv with group 1 whose weight is laid out F/b x C x KH x KW x b (b output
  channels innermost); Conv's other inputs and attributes, plus `data_layout` / `out_layout` ("NCHWc" when the data
  comes / the result goes as N x C/b x H x W x b; absent means NCHW). With out_layout NCHWc the bias is F/b x b;
  with data_layout NCHWc the weight is F/b x C/b x KH x KW x b x b (input-channel blocks too). A depthwise one
  (`group` = C = F) has the weight C/b x KH x KW x b in either layout. `channels` = F where F is no multiple of b:
  the weight's last block is padded with zero filters, and an NCHWc result carries zeros in those lanes.
- `WinogradConv` (made by passes): a 3x3, stride-1, one-group Conv whose weight is transformed for Winograd
  F(m x m, 3 x 3) and laid out a x a x F/b x C x b (a = m + 2); inputs X, that weight, an optional bias (None when
  absent), then the constants B^T (a x a) and A^T (m x a); attributes `pads`, and `data_layout` / `out_layout` as
  BlockedConv has them (its weight is the same in both data layouts).
- `layout="NCHWc"` on MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool (made by `propagate_nchwc`): input and
  output are N x C/b x H x W x b; other elementwise and same-shape binary ops need no attribute, their values simply
  carry the 5-D type.
- `NCHWcToNCHW` (made by `propagate_nchwc`): one input N x C/b x H x W x b, output N x C x H x W; `channels` where C
  fills the last block only partly (its padding lanes are dropped).
- Quantized ops (`compiler.model.onnx_import.quantized`): `QuantizeLinear(x, scale, zero_point?)` with `axis` (None
  when the scale is one value, else the non-negative axis a 1-D scale and zero point run along) and `to` ("int8" or
  "uint8"); `DequantizeLinear(x, scale, zero_point?)` with `axis` alike (x int8, uint8 or int32; a float32 result);
  `MatMulInteger(A, B, a_zero_point?, b_zero_point?)` (int32; zero points one value, per row of A / column of B);
  `ConvInteger(x, w, x_zero_point?, w_zero_point?)` with Conv's attributes (int32; w_zero_point one value or per
  output channel); `Requantize(acc, multiplier, zero_point?, bias?)` with `axis` and `to` (tilefarm's own: int32
  acc + bias, times the float32 multiplier, rounded half to even, plus the zero point, saturated).
  QLinearMatMul and QLinearConv become MatMulInteger / ConvInteger then Requantize; DynamicQuantizeLinear becomes
  ReduceMin/ReduceMax and elementwise ops for its scale and zero point, then QuantizeLinear.
- Control flow (`compiler.model.onnx_import.control_flow`) runs closed subgraphs, each a `Graph` whose inputs are
  bound to the node's inputs by position:
  `If(cond, *free)` with `branches` = (then, else): `cond` a one-element bool; each branch takes `free` and gives the
  node's outputs, typed alike; `Loop(M, cond, *initial, *free)` with `body` (inputs: iteration number int64, condition
  bool, the `carried` loop-carried values, `free`; outputs: condition, carried values of the same types, scan
  pieces), `carried`, `trips` (M when constant, else None; M or cond may be None when absent) and `bounded` (the
  scan outputs, `trips` long, may end early: their leading dim is only a bound). ONNX's Scan becomes such a Loop.
  `Trap()` with `reason`: the only node of an If branch that could not be compiled for the input shapes; taking
  that branch fails the run with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NCHWC = "NCHWc"  # the `layout` / `data_layout` / `out_layout` attribute value of channel-blocked data


def pooled_extent(n: int, before: int, after: int, span: int, stride: int, ceil_mode: bool) -> int:
    """The windows a pooling of `span` (a dilated kernel) takes along an axis of `n` padded by `before` and `after`.
    With ceil_mode a last window that would start in the trailing padding is dropped, as onnxruntime and PyTorch
    do (onnx's shape inference keeps it)."""
    if not ceil_mode:
        return (n + before + after - span) // stride + 1
    o = -(-(n + before + after - span) // stride) + 1
    return o - 1 if (o - 1) * stride >= n + before else o


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    def __str__(self):
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclass(eq=False)
class Value:
    """A tensor flowing between nodes; `const` holds the data of constants (weights, folded shapes)."""

    name: str
    type: TensorType
    const: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def __repr__(self):
        return f"%{self.name}: {self.type}"


@dataclass(eq=False)
class Node:
    op: str
    inputs: tuple[Value | None, ...]  # None for an omitted optional input
    outputs: tuple[Value, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def __str__(self):
        outs = ", ".join(f"%{o.name}" for o in self.outputs)
        ins = ", ".join("_" if v is None else f"%{v.name}" for v in self.inputs)
        attrs = "".join(f", {k}={_short(v)}" for k, v in sorted(self.attrs.items()))
        return f"{outs} = {self.op}({ins}{attrs})"


@dataclass(eq=False)
class Graph:
    """Inputs, outputs and nodes in topological order; constants are Values with `const` set."""

    inputs: list[Value]
    outputs: list[Value]
    nodes: list[Node]
    name: str = "graph"

    def constants(self) -> list[Value]:
        seen: dict[int, Value] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None and v.const is not None:
                    seen.setdefault(id(v), v)
        return list(seen.values())

    def consumers(self) -> dict[int, list[Node]]:
        """id(value) -> nodes reading it."""
        out: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    out.setdefault(id(v), []).append(n)
        return out

    def producers(self) -> dict[int, Node]:
        return {id(o): n for n in self.nodes for o in n.outputs}

    def __str__(self):
        lines = [f"graph {self.name}(" + ", ".join(repr(v) for v in self.inputs) + "):"]
        for c in self.constants():
            lines.append(f"  %{c.name}: {c.type} = const")
        lines.extend(f"  {n}" for n in self.nodes)
        lines.append("  return " + ", ".join(f"%{v.name}" for v in self.outputs))
        for sub in subgraphs(self):  # If branches and Loop bodies, after the graph that runs them
            lines.extend("  " + line for line in str(sub).splitlines())
        return "\n".join(lines) + "\n"


CONTROL_FLOW = ("If", "Loop")  # the ops that run subgraphs (`subgraphs`)


def node_subgraphs(n: Node) -> list[Graph]:
    """The graphs a control-flow node runs: an If's two branches, a Loop's body; none for other nodes."""
    if n.op == "If":
        return list(n.attrs["branches"])
    return [n.attrs["body"]] if n.op == "Loop" else []


def subgraphs(g: Graph) -> list[Graph]:
    """The graphs g's control-flow nodes run, in node order."""
    return [sub for n in g.nodes for sub in node_subgraphs(n)]


def toposort(nodes: Iterable[Node]) -> list[Node]:
    """Nodes ordered so every producer comes before its consumers (stable for an already sorted list)."""
    nodes = list(nodes)
    producer = {id(o): n for n in nodes for o in n.outputs}
    done: set[int] = set()
    order: list[Node] = []

    def visit(n: Node) -> None:
        stack = [(n, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in done:
                continue
            if expanded:
                done.add(id(node))
                order.append(node)
                continue
            stack.append((node, True))
            for v in reversed(node.inputs):
                p = producer.get(id(v)) if v is not None else None
                if p is not None and id(p) not in done:
                    stack.append((p, False))

    for n in nodes:
        visit(n)
    return order


def _short(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)}" if v.size > 8 else str(v.tolist())
    if isinstance(v, (list, tuple)) and len(v) > 8:
        return f"[{', '.join(map(str, v[:8]))}, …]"
    if isinstance(v, Graph) or (isinstance(v, tuple) and v and all(isinstance(x, Graph) for x in v)):
        return ", ".join(f"graph {g.name}" for g in (v if isinstance(v, tuple) else (v,)))
    return repr(v)
