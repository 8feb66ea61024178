"""Integer products in the forms the dot-product kernels compute (compiler/tensor/ops/int8_matmul.py): weights packed
at compile time for the 4-wide u8 x s8 dot product (`vpdpbusd`), zero points folded into per-column terms.

- `pack_integer_matmuls`: a MatMulInteger with a constant 2-D weight (what fold_qdq makes of a QDQ MatMul or Gemm,
  and the import of QLinearMatMul) becomes a PackedMatMulInteger(A, W, col, a_zero, w_sum, w_zero) with the weight
  ceil(K/4) x N' x 4 (`pack_int8_weight`);
- `pack_integer_convs`: a 2-D ConvInteger (one group, dilation 1, equal strides and pads, a constant zero point for
  the data) becomes a PackedConvInteger(X, W, col, w_zero), the weight F'/16 x C'/4 x KH x KW x 16 x 4
  (`pack_int8_conv_weight`); a weight zero point is subtracted times each window's data sum. Its kernel reads
  NCHW4c u8 data and accumulates NCHW16c int32; the node takes NCHW data and gives NCHW, the two moves being stages
  of its own task, so each is placed once, at the conv. A depthwise one (group = channels) becomes one too
  (attribute `group`): its weight minus its zero point as int32 C'/16 x KH x KW x 16, its data minus its zero
  point, the products summed in int32 over 16 channel lanes (no channel sum: no 4-wide dot product to use);
- `propagate_int8_nchwc`: u8 values stay NCHW16c between such convs (see its docstring).

Anything the kernels cannot compute exactly (a non-constant weight, grouped convs other than depthwise ones,
dilated or unevenly padded convs, a run-time zero point of a conv's data) is left to the generic integer ops, which
compute the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from compiler.base.errors import InvalidExpr
from compiler.model.graph import NCHWC, Graph, Node, TensorType, Value, toposort
from compiler.model.passes import CONV_BLOCK

DOT = 4  # k per int32 lane of the dot product
COLUMNS = 16  # the packed weight's columns come in multiples of this: the int32 lanes of one 512-bit vector
_QUANTIZED = ("uint8", "int8")


@dataclass(frozen=True)
class PackedInt8Weight:
    """A K x N weight packed for the 4-wide dot product, with the per-column terms its zero points fold into."""

    packed: np.ndarray  # int8, ceil(K/4) x N' x 4 (N' = N rounded up to COLUMNS); k past K and n past N are 0
    w_sum: np.ndarray  # int32 [N]: sum_k of the (shifted) s8 weight
    w_zero: np.ndarray | None  # int32 [N]: the s8 weight's zero point per column, None when all are 0
    col: np.ndarray  # int32 [N]: the constant terms, -za * Sw[n] + K * za * zw[n] for a constant za (else 0)


def pack_int8_weight(w: np.ndarray, w_zero=0, a_zero: int | None = 0, a_dtype: str = "uint8") -> PackedInt8Weight:
    """Pack a K x N int8 or uint8 weight (zero point `w_zero`: one value or one per column) for `int8_matmul`.
    `a_zero` is the activation's constant zero point (None: given at run time to `int8_matmul`), `a_dtype` the
    activation's dtype (an int8 activation is shifted by +128, and so is its zero point)."""
    if w.ndim != 2 or w.dtype not in (np.int8, np.uint8):
        raise InvalidExpr(f"pack_int8_weight: w must be a 2-D int8 or uint8 array, got {w.dtype} {list(w.shape)}")
    K, N = w.shape
    w32 = w.astype(np.int32)
    zw = np.broadcast_to(np.asarray(w_zero, np.int32).reshape(-1), (N,)).astype(np.int32)
    if w.dtype == np.uint8:  # w - zw == (w - 128) - (zw - 128)
        w32, zw = w32 - 128, zw - 128
    k4, n_pad = -(-K // DOT), -(-N // COLUMNS) * COLUMNS
    packed = np.zeros((k4 * DOT, n_pad), np.int8)
    packed[:K, :N] = w32
    packed = np.ascontiguousarray(packed.reshape(k4, DOT, n_pad).transpose(0, 2, 1))
    w_sum = w32.sum(axis=0, dtype=np.int64).astype(np.int32)
    col = np.zeros(N, np.int32)
    if a_zero is not None:
        za = int(a_zero) + (128 if a_dtype == "int8" else 0)
        col = (-za * w_sum.astype(np.int64) + K * za * zw.astype(np.int64)).astype(np.int32)
    return PackedInt8Weight(packed, w_sum, zw if zw.any() else None, col)


def pack_int8_conv_weight(w: np.ndarray, a_zero: int = 0, w_zero=0) -> tuple[np.ndarray, np.ndarray]:
    """A conv weight F x C x KH x KW (int8) packed for `int8_conv2d_nchwc` as F'/16 x C'/4 x KH x KW x 16 x 4 (F', C'
    rounded up, zeros past F and C), and its per-channel term -a_zero * sum of the filter + K * a_zero * w_zero[f]
    (F' values; K = C' x KH x KW, the taps the data's row sums count, padded channels reading a_zero)."""
    if w.ndim != 4 or w.dtype != np.int8:
        raise InvalidExpr(f"pack_int8_conv_weight: w must be a 4-D int8 array, got {w.dtype} {list(w.shape)}")
    F, C, KH, KW = w.shape
    fb, cb = -(-F // COLUMNS), -(-C // DOT)
    full = np.zeros((fb * COLUMNS, cb * DOT, KH, KW), np.int8)
    full[:F, :C] = w
    packed = full.reshape(fb, COLUMNS, cb, DOT, KH, KW).transpose(0, 2, 4, 5, 1, 3)
    zw = np.zeros(fb * COLUMNS, np.int64)
    zw[:F] = np.broadcast_to(np.asarray(w_zero, np.int64).reshape(-1), (F,))
    col = -int(a_zero) * full.astype(np.int64).sum(axis=(1, 2, 3)) + cb * DOT * KH * KW * int(a_zero) * zw
    return np.ascontiguousarray(packed), col.astype(np.int32)


def _const(name: str, a: np.ndarray) -> Value:
    return Value(name, TensorType(a.shape, str(a.dtype)), a)


def _one_value(v: Value | None) -> int | None:
    """The integer a constant one-element zero point holds (0 when omitted), None when it is not one."""
    if v is None:
        return 0
    if v.const is None or v.const.size != 1:
        return None
    return int(v.const.reshape(()))


def _packed_matmul(n: Node) -> Node | None:
    a, w = n.inputs[0], n.inputs[1]
    a_zp, w_zp = (n.inputs[i] if len(n.inputs) > i else None for i in (2, 3))
    if a is None or w is None or w.const is None or len(w.shape) != 2 or len(a.shape) < 2:
        return None
    if a.dtype not in _QUANTIZED or w.dtype not in _QUANTIZED or (w_zp is not None and w_zp.const is None):
        return None
    K, N = w.shape
    M = a.shape[-2]
    za = _one_value(a_zp)
    if za is None and a_zp is not None and a_zp.shape not in ((), (1,), (M,)):
        return None  # MatMulInteger's import checks this; a per-row zero point of another length is not one
    zw = np.zeros(N, np.int32) if w_zp is None else w_zp.const.astype(np.int32).reshape(-1)
    if zw.size not in (1, N):
        return None
    p = pack_int8_weight(w.const, zw, za, a.dtype)
    name = w.name
    run_time_zero = za is None  # a graph value, or a constant per-row one: an input the epilogue multiplies by Sw
    inputs = [
        a,
        _const(f"{name}_dot4", p.packed),
        _const(f"{name}_col", p.col) if p.col.any() else None,
        a_zp if run_time_zero else None,
        _const(f"{name}_wsum", p.w_sum) if run_time_zero else None,
        _const(f"{name}_wzero", p.w_zero) if p.w_zero is not None else None,
    ]
    while inputs[-1] is None:
        inputs.pop()
    return replace(n, op="PackedMatMulInteger", inputs=tuple(inputs), attrs={"n": N})


def pack_integer_matmuls(g: Graph) -> Graph:
    """Every MatMulInteger with a constant 2-D weight as a PackedMatMulInteger (see the module docstring)."""
    nodes = [(_packed_matmul(n) if n.op == "MatMulInteger" else None) or n for n in g.nodes]
    return Graph(g.inputs, g.outputs, nodes, g.name)


def _conv_geometry(a: dict) -> tuple[int, int] | None:
    """(stride, padding) of a 2-D ConvInteger (attributes `a`) the NCHWc kernel computes: one group, dilation 1, the
    same stride on both axes and the same padding on all four sides."""
    strides, pads = tuple(a.get("strides") or (1, 1)), tuple(a.get("pads") or (0, 0, 0, 0))
    if a.get("group", 1) != 1 or tuple(a.get("dilations") or (1, 1)) != (1, 1):
        return None
    if len(strides) != 2 or strides[0] != strides[1] or len(pads) != 4 or len(set(pads)) != 1:
        return None
    return strides[0], pads[0]


def _depthwise(n: Node) -> bool:
    """A ConvInteger with one filter per input channel (MobileNet's depthwise convs)."""
    w = n.inputs[1]
    group = n.attrs.get("group", 1)
    return w is not None and group > 1 and group == w.shape[0] == n.inputs[0].shape[1] and w.shape[1] == 1


def pack_int8_depthwise_weight(w: np.ndarray, w_zero) -> np.ndarray:
    """A depthwise weight C x 1 x KH x KW (int8 / uint8) minus its zero point (one or per channel), as int32
    C'/16 x KH x KW x 16 (C' = C rounded up to 16, zeros past C)."""
    C, _, KH, KW = w.shape
    shifted = w[:, 0].astype(np.int32) - np.broadcast_to(np.asarray(w_zero, np.int32).reshape(-1), (C,))[:, None, None]
    full = np.zeros((-(-C // COLUMNS) * COLUMNS, KH, KW), np.int32)
    full[:C] = shifted
    return np.ascontiguousarray(full.reshape(-1, COLUMNS, KH, KW).transpose(0, 2, 3, 1))


def _packed_depthwise(n: Node, stride: int, padding: int, za: int) -> Node | None:
    """A depthwise ConvInteger as a PackedConvInteger whose weight is (w - zw) in int32, C'/16 x KH x KW x 16: with
    no channel reduction there is no 4-wide dot product, and the 16 channels of a block are one int32 vector."""
    x, w = n.inputs[0], n.inputs[1]
    w_zp = n.inputs[3] if len(n.inputs) > 3 else None
    zw = np.zeros(1, np.int32) if w_zp is None else w_zp.const
    if zw is None or zw.size not in (1, w.shape[0]):
        return None
    packed = pack_int8_depthwise_weight(w.const, zw)
    za_u8 = za + (128 if x.dtype == "int8" else 0)
    attrs = {"stride": stride, "padding": padding, "a_zero": za_u8, "channels": w.shape[0], "group": w.shape[0]}
    return replace(n, op="PackedConvInteger", inputs=(x, _const(f"{w.name}_dw16", packed)), attrs=attrs)


def _packed_conv(n: Node) -> Node | None:
    x, w = n.inputs[0], n.inputs[1]
    x_zp, w_zp = (n.inputs[i] if len(n.inputs) > i else None for i in (2, 3))
    if x is None or w is None or w.const is None or len(x.shape) != 4 or len(w.shape) != 4:
        return None
    if _depthwise(n) and x.dtype in _QUANTIZED and w.dtype in _QUANTIZED:
        geometry = _conv_geometry({**n.attrs, "group": 1})
        za = _one_value(x_zp)
        return None if geometry is None or za is None else _packed_depthwise(n, *geometry, za)
    geometry, za = _conv_geometry(n.attrs), _one_value(x_zp)
    if geometry is None or za is None or x.dtype not in _QUANTIZED or w.dtype not in _QUANTIZED:
        return None
    zw = np.zeros(1, np.int32) if w_zp is None else w_zp.const
    if zw is None:
        return None
    weight = w.const.astype(np.int32)
    zw = zw.astype(np.int32).reshape(-1)
    if w.dtype == "uint8":  # w - zw == (w - 128) - (zw - 128)
        weight, zw = weight - 128, zw - 128
    if zw.size not in (1, w.shape[0]):
        return None
    za_u8 = za + (128 if x.dtype == "int8" else 0)  # the kernel's data is u8: an s8 input is shifted with its zero
    packed, col = pack_int8_conv_weight(weight.astype(np.int8), za_u8, zw)
    stride, padding = geometry
    attrs = {"stride": stride, "padding": padding, "a_zero": za_u8, "channels": w.shape[0]}
    inputs: tuple[Value, ...] = (x, _const(f"{w.name}_dot4", packed), _const(f"{w.name}_col", col))
    if zw.any():  # subtracted times each window's data sum (a stage of its own)
        full = np.zeros(packed.shape[0] * COLUMNS, np.int32)
        full[: w.shape[0]] = np.broadcast_to(zw, (w.shape[0],))
        inputs = (*inputs, _const(f"{w.name}_wzero", full))
    return replace(n, op="PackedConvInteger", inputs=inputs, attrs=attrs)


_SCALARS = ("multiplier", "zero_point", "bias")  # a one-value Requantize input becomes the attribute of its name


def _requantize_inputs(n: Node, reader: Node, F: int, padded: int) -> tuple[tuple[Value | None, ...], dict] | None:
    """The multiplier, zero point and bias of the Requantize `reader` of conv `n`'s result, laid out for the
    kernel, when it can run on the conv's accumulators (constants, one value or per channel): per-channel ones
    padded to `padded` channels, one-value ones as attributes (a constant in the code: a one-element load in the
    lanes of a vectorized rounding select is a gather)."""
    if reader.op != "Requantize" or reader.inputs[0] is not n.outputs[0] or reader.attrs.get("axis") not in (None, 1):
        return None
    values = [reader.inputs[i] if len(reader.inputs) > i else None for i in (1, 2, 3)]
    if any(v is not None and (v.const is None or v.const.size not in (1, F)) for v in values):
        return None
    inputs: list[Value | None] = []
    attrs: dict = {"to": reader.attrs["to"]}
    for key, v in zip(_SCALARS, values):
        if v is None or v.const is None or v.const.size == 1:
            if v is not None and v.const is not None:
                attrs[key] = float(v.const.reshape(())) if key == "multiplier" else int(v.const.reshape(()))
            inputs.append(None)
            continue
        c = np.zeros(padded, v.const.dtype)
        c[:F] = v.const.reshape(-1)
        inputs.append(_const(f"{v.name}_c{padded}", c))
    return tuple(inputs), attrs


def pack_integer_convs(g: Graph) -> Graph:
    """Every ConvInteger the NCHWc dot-product kernel computes exactly as a PackedConvInteger, with the Requantize
    that alone reads it (module docstring)."""
    readers, outputs = g.consumers(), {id(v) for v in g.outputs}
    nodes, absorbed = [], set()
    for n in g.nodes:
        packed = _packed_conv(n) if n.op == "ConvInteger" else None
        if packed is None:
            nodes.append(n)
            continue
        after = readers.get(id(n.outputs[0]), [])
        F, padded = n.inputs[1].shape[0], packed.inputs[1].shape[0] * COLUMNS
        quant = None
        if len(after) == 1 and id(n.outputs[0]) not in outputs:
            quant = _requantize_inputs(n, after[0], F, padded)
        if quant is not None:
            inputs = [*packed.inputs, *(None,) * (4 - len(packed.inputs)), *quant[0]]
            while inputs[-1] is None:
                inputs.pop()
            packed = replace(packed, inputs=tuple(inputs), outputs=after[0].outputs, attrs={**packed.attrs, **quant[1]})
            absorbed.add(id(after[0]))
        nodes.append(packed)
    return Graph(g.inputs, g.outputs, [n for n in nodes if id(n) not in absorbed], g.name)


# ---------------------------------------------------------------------------------------------- NCHW16c between convs

_PASS_THROUGH = ("QLinearAdd", "MaxPool", "Relu")  # ops computing the same on NCHW16c data (MaxPool: `layout`)


def _requantized_conv(n: Node) -> bool:
    """A PackedConvInteger with its Requantize whose filters fill whole blocks of 16."""
    return n.op == "PackedConvInteger" and "to" in n.attrs and n.attrs["channels"] % CONV_BLOCK == 0


def _reads_blocked(n: Node) -> bool:
    """A PackedConvInteger of u8 data whose input channels fill whole blocks of 16 (its weight's C'/4 blocks of 4
    then match; a depthwise one's channels are its filters)."""
    if n.op != "PackedConvInteger" or n.inputs[0].dtype != "uint8":
        return False
    channels = n.attrs["channels"] if "group" in n.attrs else n.inputs[1].shape[1] * DOT
    return channels % CONV_BLOCK == 0


def _passes_through(n: Node, can: set[int]) -> bool:
    """A QLinearAdd of same-shape values, a Relu or a MaxPool whose data inputs could all be NCHW16c (`can`)."""
    data = [v for v in n.inputs if v is not None]  # a constant operand would need its own re-layout: none here
    if n.op not in _PASS_THROUGH or len(n.outputs) != 1 or not data or not all(id(v) in can for v in data):
        return False
    return n.op == "MaxPool" or all(v.shape == n.outputs[0].shape for v in data)


def propagate_int8_nchwc(g: Graph) -> Graph:
    """Keep u8 values between PackedConvIntegers NCHW16c (propagate_nchwc's design: a value is blocked where its
    producer can write it so and some reader gains from it; an NCHWcToNCHW puts it back once for any other reader)."""
    can: set[int] = set()
    for n in g.nodes:
        if len(n.outputs[0].shape) == 4 and (_requantized_conv(n) or _passes_through(n, can)):
            can.add(id(n.outputs[0]))
    wanted: set[int] = set()  # a subset of `can`, decided from the readers backwards
    for n in reversed(g.nodes):
        if _reads_blocked(n):
            wanted.update(id(v) for v in n.inputs[:1] if id(v) in can)
        elif n.op != "PackedConvInteger" and id(n.outputs[0]) in wanted:
            wanted.update(id(v) for v in n.inputs if v is not None and id(v) in can)
    if not wanted:
        return g

    blocked: dict[int, Value] = {}  # id(original value) -> its NCHW16c twin
    produced_plain: set[int] = set()
    nodes: list[Node] = []

    def plain(v: Value | None) -> Value | None:
        """v as NCHW: the original value, converted back from its twin the first time it is needed."""
        if v is None or id(v) not in blocked or id(v) in produced_plain:
            return v
        nodes.append(Node("NCHWcToNCHW", (blocked[id(v)],), (v,), {}, f"{v.name}_to_nchw"))
        produced_plain.add(id(v))
        return v

    for n in g.nodes:
        out, attrs = n.outputs[0], dict(n.attrs)
        if n.op == "PackedConvInteger":
            x = n.inputs[0]
            if _reads_blocked(n) and x is not None and id(x) in blocked:
                attrs["data_layout"], x = NCHWC, blocked[id(x)]
            ins = (plain(x), *n.inputs[1:])
            if id(out) in wanted:
                attrs["out_layout"] = NCHWC
        elif id(out) in wanted:  # its data inputs are all blocked: they were wanted for it
            ins = tuple(blocked[id(v)] if v is not None and id(v) in blocked else v for v in n.inputs)
            if n.op == "MaxPool":
                attrs["layout"] = NCHWC
        else:
            ins = tuple(plain(v) for v in n.inputs)
        outs = n.outputs
        if id(out) in wanted:
            N, C, H, W = out.shape
            blocked[id(out)] = Value(f"{out.name}_nchwc", TensorType((N, C // CONV_BLOCK, H, W, CONV_BLOCK), out.dtype))
            outs = (blocked[id(out)],)
        nodes.append(replace(n, inputs=ins, outputs=outs, attrs=attrs))
    for v in g.outputs:
        plain(v)  # a graph output leaves NCHW, under its own name
    return Graph(g.inputs, g.outputs, toposort(nodes), g.name)
