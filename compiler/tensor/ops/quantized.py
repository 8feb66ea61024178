"""Quantized ONNX ops: QuantizeLinear, DequantizeLinear, MatMulInteger, ConvInteger and tilefarm's Requantize (the
int32 → int8/uint8 epilogue QLinearMatMul and QLinearConv are imported as).

Integer arithmetic is int32: inputs are cast to int32 and their zero points subtracted before they are multiplied
and summed. Float steps are float32 and in onnxruntime's order (MLAS): quantizing divides by the scale, rounds half
to even, adds the zero point and saturates; requantizing converts the int32 accumulator to float32, multiplies by
the combined scale, rounds half to even, adds the zero point and saturates.

A scale or zero point is a scalar (or one element) for the whole tensor, or 1-D along the `axis` attribute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from compiler.base.errors import InvalidExpr
from compiler.tensor import te
from compiler.tensor.ops.checks import FLOATS, _dims, _dtype_in, _input
from compiler.tensor.ops.elementwise import round_half_even
from compiler.tensor.ops.linalg import matmul_op
from compiler.tensor.ops.nn import conv_nd

Ins = Sequence[te.Tensor | None]
QUANTIZED = ("int8", "uint8")
LIMITS = {"int8": (-128, 127), "uint8": (0, 255)}


def _param(op: str, t: te.Tensor | None, idx: Sequence[te.Expr], axis: int | None, extent: int) -> te.Expr | None:
    """The element of a scale / zero point `t` that output index `idx` reads: t's only element, or t[idx[axis]] for
    a 1-D t of `extent` elements along `axis` (None when t is omitted)."""
    if t is None:
        return None
    if t.ndim == 0:
        return t[()]
    size = t.shape[0] if t.ndim == 1 else 0
    if size == 1:
        return t[0]
    if t.ndim != 1 or axis is None or size != extent:
        raise InvalidExpr(f"{op}: {t.name} ({_dims(t)}) must be a scalar or 1-D of {extent} elements along axis {axis}")
    return t[idx[axis]]


def _extent(shape: tuple[int, ...], axis: int | None) -> int:
    return shape[axis] if axis is not None and axis < len(shape) else 1


def _saturate(value: te.Expr, to: str) -> te.Expr:
    """A float32 value already rounded to an integer, clamped to `to`'s range and cast to it."""
    lo, hi = LIMITS[to]
    return te.cast(to, te.minimum(te.maximum(value, te.const(lo, "float32")), te.const(hi, "float32")))


def _out_dtype(op: str, attrs: dict) -> str:
    to = attrs.get("to", "uint8")
    if to not in QUANTIZED:
        raise InvalidExpr(f"{op}: output dtype {to} is not one of {', '.join(QUANTIZED)}")
    return to


def quantize_linear(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """ONNX QuantizeLinear: saturate(round_half_even(x / scale) + zero_point) as int8 / uint8 (`to`)."""
    op = "QuantizeLinear"
    x, scale, zp = _input(op, ins, 0, "x"), _input(op, ins, 1, "y_scale"), ins[2] if len(ins) > 2 else None
    _dtype_in(op, x, ("float32",))
    _dtype_in(op, scale, ("float32",))
    to, axis = _out_dtype(op, attrs), attrs.get("axis")
    extent = _extent(x.shape, axis)

    def body(*i):
        q = round_half_even(x[i] / _param(op, scale, i, axis, extent))
        z = _param(op, zp, i, axis, extent)
        return _saturate(q if z is None else q + te.cast("float32", z), to)

    return [te.compute(x.shape, body, name=name, tag="elemwise")]


def dequantize_linear(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """ONNX DequantizeLinear: float32(int32(x) - int32(zero_point)) * scale, for int8 / uint8 / int32 x."""
    op = "DequantizeLinear"
    x, scale, zp = _input(op, ins, 0, "x"), _input(op, ins, 1, "x_scale"), ins[2] if len(ins) > 2 else None
    _dtype_in(op, x, (*QUANTIZED, "int32"))
    _dtype_in(op, scale, ("float32",))
    axis = attrs.get("axis")
    extent = _extent(x.shape, axis)

    def body(*i):
        z = _param(op, zp, i, axis, extent)
        v = te.cast("int32", x[i])
        v = v if z is None else v - te.cast("int32", z)
        return te.cast("float32", v) * _param(op, scale, i, axis, extent)

    return [te.compute(x.shape, body, name=name, tag="elemwise")]


def _shifted(op: str, t: te.Tensor, zp: te.Tensor | None, axis: int | None, name: str) -> te.Tensor:
    """int32(t) - int32(zero point), its own stage (inlined by the schedule) so the product reads int32 operands."""
    _dtype_in(op, t, QUANTIZED)
    extent = _extent(t.shape, axis)

    def body(*i):
        z = _param(op, zp, i, axis, extent)
        v = te.cast("int32", t[i])
        return v if z is None else v - te.cast("int32", z)

    return te.compute(t.shape, body, name=name, tag="elemwise")


def matmul_integer(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """ONNX MatMulInteger: (A - a_zero_point) @ (B - b_zero_point) in int32; a_zero_point per row of A (or one),
    b_zero_point per column of B (or one)."""
    op = "MatMulInteger"
    a, b = _input(op, ins, 0, "A"), _input(op, ins, 1, "B")
    azp, bzp = (ins[i] if len(ins) > i else None for i in (2, 3))
    a32 = _shifted(op, a, azp, a.ndim - 2 if a.ndim > 1 else None, f"{name}_a")
    b32 = _shifted(op, b, bzp, b.ndim - 1 if b.ndim > 1 else None, f"{name}_b")
    return matmul_op([a32, b32], {}, name)


def conv_integer(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """ONNX ConvInteger: Conv of (x - x_zero_point) and (w - w_zero_point) in int32 (padding reads 0 after the
    shift, i.e. the zero point before it); w_zero_point per output channel or one."""
    op = "ConvInteger"
    x, w = _input(op, ins, 0, "x"), _input(op, ins, 1, "w")
    xzp, wzp = (ins[i] if len(ins) > i else None for i in (2, 3))
    if x.ndim < 3 or w.ndim != x.ndim:
        raise InvalidExpr(f"{op}: x {_dims(x)} and w {_dims(w)} must be N x C x spatial... of one rank")
    x32 = _shifted(op, x, xzp, None, f"{name}_x")
    w32 = _shifted(op, w, wzp, 0, f"{name}_w")
    sp = x.ndim - 2
    strides = tuple(attrs.get("strides") or (1,) * sp)
    pads = tuple(attrs.get("pads") or (0,) * (2 * sp))
    dilations = tuple(attrs.get("dilations") or (1,) * sp)
    return [conv_nd(x32, w32, strides, pads, dilations, attrs.get("group", 1), name)]


def requantize(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """tilefarm's Requantize: saturate(round_half_even(float32(acc + bias) * multiplier) + zero_point) as `to`,
    for an int32 `acc`; multiplier (float32), zero_point and the optional int32 bias are one value or 1-D along
    `axis`."""
    op = "Requantize"
    acc, mult = _input(op, ins, 0, "acc"), _input(op, ins, 1, "multiplier")
    zp, bias = (ins[i] if len(ins) > i else None for i in (2, 3))
    _dtype_in(op, acc, ("int32",))
    _dtype_in(op, mult, FLOATS[:1])
    to, axis = _out_dtype(op, attrs), attrs.get("axis")
    extent = _extent(acc.shape, axis)

    def body(*i):
        b = _param(op, bias, i, axis, extent)
        v = te.cast("float32", acc[i] if b is None else acc[i] + b)
        q = round_half_even(v * _param(op, mult, i, axis, extent))
        z = _param(op, zp, i, axis, extent)
        return _saturate(q if z is None else q + te.cast("float32", z), to)

    return [te.compute(acc.shape, body, name=name, tag="elemwise")]


def qlinear_add(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """onnxruntime's QLinearAdd (MLAS AVX2 kernel) of same-shape int8 / uint8 a and b, with `ratios` the float32
    (a_scale / c_scale, b_scale / c_scale) and `fixed` the float32 c_zero_point - fma(ratio_a, a_zp, ratio_b * b_zp):
    t = fma(b, ratio_b, fixed), u = fma(a, ratio_a, t), saturate(round_half_even(u)). A fused multiply-add rounds
    once: the float64 products of a float32 and an 8-bit integer, and their sum with a float32, are exact."""
    op = "QLinearAdd"
    a, b = _input(op, ins, 0, "A"), _input(op, ins, 1, "B")
    _dtype_in(op, a, QUANTIZED)
    _dtype_in(op, b, (a.dtype,))
    if a.shape != b.shape:
        raise InvalidExpr(f"{op}: A {_dims(a)} and B {_dims(b)} must have one shape")
    ratio_a, ratio_b = (te.const(float(r), "float64") for r in attrs["ratios"])
    fixed = te.const(float(attrs["fixed"]), "float64")

    def body(*i):
        t = te.cast("float32", te.cast("float64", b[i]) * ratio_b + fixed)
        u = te.cast("float32", te.cast("float64", a[i]) * ratio_a + te.cast("float64", t))
        return _saturate(round_half_even(u), a.dtype)

    return [te.compute(a.shape, body, name=name, tag="elemwise")]


def qlinear_mul(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """onnxruntime's QLinearMul (MLAS SSE2 kernel) of int8 / uint8 a and b of one shape (or b one element):
    saturate(round_half_even(float32((a - a_zp) * (b - b_zp)) * ratio + c_zp)), `ratio` the float32
    a_scale * b_scale / c_scale, `zero_points` (a_zp, b_zp, c_zp); a float32 multiply, then a float32 add."""
    op = "QLinearMul"
    a, b = _input(op, ins, 0, "A"), _input(op, ins, 1, "B")
    _dtype_in(op, a, QUANTIZED)
    _dtype_in(op, b, (a.dtype,))
    if a.shape != b.shape and math.prod(b.shape) != 1:
        raise InvalidExpr(f"{op}: B {_dims(b)} must have A's shape {_dims(a)} or be one element")
    za, zb = (te.const(int(z), "int32") for z in attrs["zero_points"][:2])
    ratio, zcf = te.const(float(attrs["ratio"]), "float32"), te.const(float(attrs["zero_points"][2]), "float32")

    def body(*i):
        bi = i if a.shape == b.shape else (0,) * b.ndim
        p = (te.cast("int32", a[i]) - za) * (te.cast("int32", b[bi]) - zb)
        return _saturate(round_half_even(te.cast("float32", p) * ratio + zcf), a.dtype)

    return [te.compute(a.shape, body, name=name, tag="elemwise")]


QUANTIZED_OPS = {
    "QuantizeLinear": quantize_linear,
    "DequantizeLinear": dequantize_linear,
    "MatMulInteger": matmul_integer,
    "ConvInteger": conv_integer,
    "Requantize": requantize,
    "QLinearAdd": qlinear_add,
    "QLinearMul": qlinear_mul,
}
