"""QDQ folding: DequantizeLinear → float op → QuantizeLinear chains become integer ops, so no float tensor is written
between quantized ops.

The rewrites (x_q, w_q the quantized tensors the DequantizeLinears read; s, z their scales and zero points):

    DQ(x_q) → Conv(·, DQ(w_q), DQ(b_i32)?) → Q(s_y, z_y)    ⇒  ConvInteger(x_q, w_q, z_x, z_w) → Requantize(m, z_y, b)
    DQ(x_q) → MatMul(·, DQ(w_q))            → Q             ⇒  MatMulInteger(x_q, w_q, z_x, z_w) → Requantize
    DQ(x_q) → Gemm(·, DQ(w_q), bias?)       → Q             ⇒  MatMulInteger(x_q, w_q (K x N)) → Requantize(bias)
    DQ(x_q) → GlobalAveragePool             → Q             ⇒  Cast(int32) → ReduceSum → Requantize(s_x / (s_y·HW),
                                                                                                       -z_x·HW)
    DQ(a_q), DQ(b_q) → Add / Mul           → Q             ⇒  QLinearAdd / QLinearMul(a_q, b_q) (onnxruntime's
                                                                                                kernels' rounding)
    DQ(x_q) → MaxPool / Flatten / Reshape / Transpose / Squeeze / Unsqueeze → Q of the same s, z  ⇒  the op on x_q

with m = s_x · s_w / s_y in float32 (per output channel / column where w is quantized per axis) and the int32 bias
as the model stores it (its scale is s_x · s_w); a float Gemm bias is quantized with that scale. These are the
integer ops onnxruntime's QDQ transformer runs (QLinearConv, QLinearMatMul, QGemm, QLinearGlobalAveragePool,
QLinearAdd, QLinearMul, the dropped Q/DQ pairs), in its rounding order (tilefarm's Requantize), so where onnxruntime
fuses a chain the result is the same to the bit. A chain whose scales or zero points are run-time values, whose
float result is read by anything but its QuantizeLinear (or is a graph output), or whose weight is not a constant is
left in float, which computes the same quantities with float accumulation.

onnxruntime itself leaves a chain in float where its x86 build does not take int8 activations (quantize_static's
default QInt8 activations: ResNet-18's convs after a residual Add, 11 of 20, and the Adds); those fold here too, so an
exact integer sum stands where onnxruntime's float sum may round a near-tie the other way, and the step it differs
by travels on through the net. With uint8 activations (U8S8, what onnxruntime advises on x86) it fuses every chain
and the outputs are equal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler.model.graph import Graph, Node, TensorType, Value, toposort
from compiler.model.onnx_import.quantized import qlinear_add_attrs, qlinear_mul_attrs
from compiler.model.passes import remove_unused

# ops that only move or select elements: on quantized data with unchanged scale and zero point they commute with
# dequantization, so DQ → op → Q of the same parameters is the op on the integers
_MOVERS = ("MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze")


@dataclass(frozen=True)
class _Quant:
    """A DequantizeLinear's or QuantizeLinear's integer tensor, scale, zero point (constants) and axis."""

    q: Value
    scale: np.ndarray
    zero: np.ndarray
    axis: int | None

    def same(self, other: _Quant) -> bool:
        return (
            self.axis is None
            and other.axis is None
            and self.q.dtype == other.q.dtype
            and np.array_equal(self.scale, other.scale)
            and np.array_equal(self.zero, other.zero)
        )


def _params(n: Node, q: Value) -> _Quant | None:
    scale, zp = n.inputs[1], n.inputs[2] if len(n.inputs) > 2 else None
    if scale is None or scale.const is None or (zp is not None and zp.const is None):
        return None
    zero = zp.const if zp is not None else np.zeros(scale.shape, q.dtype)
    return _Quant(q, scale.const.astype(np.float32), zero, n.attrs.get("axis"))


class _Folder:
    def __init__(self, g: Graph):
        self.g = g
        self.makers = g.producers()
        self.readers = g.consumers()
        self.outputs = {id(v) for v in g.outputs}
        self.count = 0

    def dequantized(self, v: Value | None) -> _Quant | None:
        """The quantized tensor `v` is the DequantizeLinear of (int8 / uint8, constant parameters)."""
        n = self.makers.get(id(v)) if v is not None else None
        if n is None or n.op != "DequantizeLinear" or n.inputs[0].dtype not in ("int8", "uint8", "int32"):
            return None
        return _params(n, n.inputs[0])

    def quantized(self, v: Value) -> tuple[Node, _Quant] | None:
        """The one QuantizeLinear (per tensor, constant parameters) that reads `v`, when nothing else does."""
        readers = self.readers.get(id(v), [])
        if id(v) in self.outputs or len(readers) != 1 or readers[0].op != "QuantizeLinear":
            return None
        q = readers[0]
        p = _params(q, q.outputs[0])
        return (q, p) if p is not None and p.axis is None and q.inputs[0] is v else None

    def const(self, prefix: str, a: np.ndarray) -> Value:
        self.count += 1
        return Value(f"{prefix}_qfold{self.count}", TensorType(a.shape, str(a.dtype)), a)

    def temp(self, prefix: str, shape: tuple[int, ...], dtype: str) -> Value:
        self.count += 1
        return Value(f"{prefix}_qfold{self.count}", TensorType(tuple(shape), dtype))

    def zero(self, p: _Quant) -> Value:
        return self.const(p.q.name + "_zp", np.asarray(p.zero).reshape(p.zero.shape))

    def requantize(self, n: Node, acc: Node, x: _Quant, w: _Quant, y: tuple[Node, _Quant], bias, axis: int):
        """`acc` then Requantize into the QuantizeLinear's output: multiplier x_scale * w_scale / y_scale."""
        q, yp = y
        mult = (x.scale.reshape(()) * w.scale / yp.scale.reshape(())).astype(np.float32)
        per_axis = mult.size > 1 or (bias is not None and bias.size > 1)
        m = self.const(f"{n.name}_multiplier", mult.reshape(-1) if per_axis else mult.reshape(()))
        b = None if bias is None else self.const(f"{n.name}_bias", bias)
        inputs = (acc.outputs[0], m, self.zero(yp), b)
        attrs = {"axis": axis if per_axis else None, "to": yp.q.dtype}
        return [acc, Node("Requantize", inputs, q.outputs, attrs, n.name)]


def _bias(f: _Folder, n: Node, b: Value | None, x: _Quant, w: _Quant, columns: int) -> np.ndarray | None | bool:
    """The int32 bias of a folded product: a DequantizeLinear of int32 with scale x_scale * w_scale, or a float
    constant quantized with that scale (False: neither, so the chain is not folded)."""
    if b is None:
        return None
    scale = (x.scale.reshape(()) * w.scale).astype(np.float32)
    d = f.dequantized(b)
    if d is not None:
        ok = d.q.dtype == "int32" and d.q.const is not None and not d.zero.any()
        return d.q.const.reshape(-1) if ok and np.allclose(d.scale, scale, rtol=1e-6, atol=0) else False
    if b.const is None or b.const.dtype != np.float32 or b.const.size not in (1, columns):
        return False
    return np.rint(b.const.reshape(-1) / scale).astype(np.int32)


def _weight(f: _Folder, v: Value | None, axis: int) -> _Quant | None:
    """A constant int8 / uint8 weight, quantized per tensor or along `axis`."""
    w = f.dequantized(v)
    if w is None or w.q.const is None or w.q.dtype == "int32" or w.axis not in (None, axis):
        return None
    return w


def _activation(f: _Folder, v: Value | None) -> _Quant | None:
    x = f.dequantized(v)
    return x if x is not None and x.axis is None and x.q.dtype != "int32" and x.scale.size == 1 else None


def _conv(f: _Folder, n: Node) -> list[Node] | None:
    x, w = _activation(f, n.inputs[0]), _weight(f, n.inputs[1], 0)
    y = f.quantized(n.outputs[0])
    if x is None or w is None or y is None:
        return None
    bias = _bias(f, n, n.inputs[2] if len(n.inputs) > 2 else None, x, w, w.q.shape[0])
    if bias is False:
        return None
    acc = f.temp(f"{n.name}_acc", n.outputs[0].shape, "int32")
    zw = f.const(f"{w.q.name}_zp", w.zero.reshape(-1) if w.zero.size > 1 else w.zero.reshape(()))
    integer = Node("ConvInteger", (x.q, w.q, f.zero(x), zw), (acc,), dict(n.attrs), n.name)
    return f.requantize(n, integer, x, w, y, bias, 1)


def _matmul(f: _Folder, n: Node) -> list[Node] | None:
    """MatMul of a 2-D weight, or Gemm (alpha 1, beta 1, A not transposed) of one, per tensor or per column."""
    gemm = n.op == "Gemm"
    trans = gemm and n.attrs.get("transB", 0)
    if gemm and (n.attrs.get("transA", 0) or n.attrs.get("alpha", 1.0) != 1.0 or n.attrs.get("beta", 1.0) != 1.0):
        return None
    x, w = _activation(f, n.inputs[0]), _weight(f, n.inputs[1], 0 if trans else 1)
    y = f.quantized(n.outputs[0])
    if x is None or w is None or y is None or len(w.q.shape) != 2 or len(x.q.shape) < 2:
        return None
    bias = _bias(f, n, n.inputs[2] if gemm and len(n.inputs) > 2 else None, x, w, w.q.shape[1 - trans])
    if bias is False:
        return None
    wq = w.q if not trans else f.const(f"{w.q.name}_kn", np.ascontiguousarray(w.q.const.T))
    zw = f.const(f"{w.q.name}_zp", w.zero.reshape(-1) if w.zero.size > 1 else w.zero.reshape(()))
    acc = f.temp(f"{n.name}_acc", n.outputs[0].shape, "int32")
    integer = Node("MatMulInteger", (x.q, wq, f.zero(x), zw), (acc,), {}, n.name)
    return f.requantize(n, integer, x, w, y, bias, len(acc.shape) - 1)


def _global_average_pool(f: _Folder, n: Node) -> list[Node] | None:
    """onnxruntime's QLinearGlobalAveragePool: the int32 sum over the image, requantized with multiplier
    x_scale / (y_scale * pixels) and bias -x_zero_point * pixels."""
    x, y = _activation(f, n.inputs[0]), f.quantized(n.outputs[0])
    if x is None or y is None or len(x.q.shape) < 3 or n.attrs.get("layout"):
        return None
    q, yp = y
    pixels = int(np.prod(x.q.shape[2:]))
    wide = f.temp(f"{n.name}_int32", x.q.shape, "int32")
    total = f.temp(f"{n.name}_sum", n.outputs[0].shape, "int32")
    axes = list(range(2, len(x.q.shape)))
    mult = (x.scale.reshape(()) / (yp.scale.reshape(()) * np.float32(pixels))).astype(np.float32)
    bias = f.const(f"{n.name}_bias", np.asarray(-int(x.zero.reshape(())) * pixels, np.int32))
    return [
        Node("Cast", (x.q,), (wide,), {"to": "int32"}, n.name),
        Node("ReduceSum", (wide,), (total,), {"axes": axes, "keepdims": 1, "noop_with_empty_axes": 0}, n.name),
        Node("Requantize", (total, f.const(f"{n.name}_multiplier", mult), f.zero(yp), bias), q.outputs,
             {"axis": None, "to": yp.q.dtype}, n.name),
    ]  # fmt: skip


def _binary(f: _Folder, n: Node) -> list[Node] | None:
    """onnxruntime's QLinearAdd / QLinearMul (its QDQ transformer's fusion of DQ, DQ → Add / Mul → Q) of tensors of
    one shape (a Mul also by one value)."""
    a, b, y = _activation(f, n.inputs[0]), _activation(f, n.inputs[1]), f.quantized(n.outputs[0])
    if a is None or b is None or y is None or not a.q.dtype == b.q.dtype == y[1].q.dtype:
        return None
    if n.op == "Mul" and a.q.shape != b.q.shape and int(np.prod(a.q.shape)) == 1:
        a, b = b, a
    if a.q.shape != b.q.shape and (n.op == "Add" or int(np.prod(b.q.shape)) != 1 or a.q.shape != n.outputs[0].shape):
        return None
    one = [p.reshape(()) for p in (a.scale, a.zero, b.scale, b.zero, y[1].scale, y[1].zero)]
    attrs = qlinear_add_attrs(*one) if n.op == "Add" else qlinear_mul_attrs(*one)
    return [Node(f"QLinear{n.op}", (a.q, b.q), y[0].outputs, attrs, n.name)]


def _mover(f: _Folder, n: Node) -> list[Node] | None:
    x, y = _activation(f, n.inputs[0]), f.quantized(n.outputs[0])
    if x is None or y is None or not x.same(y[1]):
        return None
    return [Node(n.op, (x.q, *n.inputs[1:]), y[0].outputs, dict(n.attrs), n.name)]


FOLDS: dict[str, Callable[[_Folder, Node], list[Node] | None]] = {
    "Conv": _conv,
    "MatMul": _matmul,
    "Gemm": _matmul,
    "GlobalAveragePool": _global_average_pool,
    "Add": _binary,
    "Mul": _binary,
    **dict.fromkeys(_MOVERS, _mover),
}


def fold_qdq(g: Graph) -> Graph:
    """Every DequantizeLinear → op → QuantizeLinear chain FOLDS knows, as integer ops (see the module docstring);
    the Q and DQ nodes left unread are dropped."""
    if not any(n.op == "DequantizeLinear" for n in g.nodes):
        return g
    f = _Folder(g)
    nodes, dropped = [], set()
    for n in g.nodes:
        fold = FOLDS.get(n.op)
        new = fold(f, n) if fold is not None else None
        if new is None:
            nodes.append(n)
            continue
        nodes += new
        dropped.add(id(f.readers[id(n.outputs[0])][0]))  # the QuantizeLinear, whose output a new node now makes
    nodes = [n for n in nodes if id(n) not in dropped]
    return remove_unused(Graph(g.inputs, g.outputs, toposort(nodes), g.name))
