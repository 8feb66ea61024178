"""Converters of the quantized ONNX ops (`QUANTIZED`, part of `ONNX_OPS`): QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv.

QuantizeLinear / DequantizeLinear keep their inputs (scale and zero point may be run-time values) with `axis` made
non-negative, or None when the scale is one value; QuantizeLinear gets `to`, its output dtype. QLinearMatMul and
QLinearConv become MatMulInteger / ConvInteger (int32) and a Requantize(acc, multiplier, zero point, bias) whose
multiplier is x_scale * w_scale / y_scale in float32, as onnxruntime computes it. DynamicQuantizeLinear becomes the
min/max reductions, scale and zero point of its definition (a constant input gives scale 1, as onnxruntime does)
and a QuantizeLinear.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from compiler.base.errors import InvalidModel
from compiler.model.graph import Node, Value
from compiler.model.onnx_import.converters import _axis, _CannotConvert, _Ctx, _window_attrs

QUANTIZED_DTYPES = ("int8", "uint8")


def _axis_of(ctx: _Ctx, scale: Value, rank: int) -> int | None:
    """The normalized axis of a per-axis scale, None for a per-tensor one; blocked quantization is refused."""
    if ctx.attrs.get("block_size", 0):
        raise _CannotConvert(
            f"{ctx.op} node {ctx.name!r}: block_size={ctx.attrs['block_size']} (blocked quantization) is not supported;"
            " tilefarm quantizes per tensor or per axis"
        )
    if len(scale.shape) == 0 or int(np.prod(scale.shape)) == 1:
        return None
    axis = _axis(int(ctx.attrs.get("axis", 1)), rank)
    extent = ctx.inputs[0].shape[axis]
    zp = ctx.input(2)
    for v, what in ((scale, "scale"), (zp, "zero point")):
        if v is not None and tuple(v.shape) != (extent,):
            raise InvalidModel(
                f"{ctx.op} node {ctx.name!r}: the {what} has shape {list(v.shape)}, but a per-axis {what} along axis "
                f"{axis} of the {list(ctx.inputs[0].shape)} input needs {extent} values"
            )
    return axis


def _quantized_out(ctx: _Ctx, value: Value) -> str:
    if value.dtype not in QUANTIZED_DTYPES:
        raise _CannotConvert(
            f"{ctx.op} node {ctx.name!r}: output dtype {value.dtype} is not supported; tilefarm quantizes to "
            f"{' or '.join(QUANTIZED_DTYPES)}"
        )
    return value.dtype


def QuantizeLinear(ctx: _Ctx) -> list[Node]:
    x, scale = ctx.inputs[0], ctx.inputs[1]
    if x.dtype != "float32" or scale.dtype != "float32":
        raise _CannotConvert(
            f"QuantizeLinear node {ctx.name!r}: input {x.dtype} with a {scale.dtype} scale is not supported; tilefarm "
            "quantizes float32 with a float32 scale"
        )
    to = _quantized_out(ctx, ctx.outputs[0])
    axis = _axis_of(ctx, scale, len(x.shape))
    return [ctx.node("QuantizeLinear", [x, scale, ctx.input(2)], {"axis": axis, "to": to})]


def DequantizeLinear(ctx: _Ctx) -> list[Node]:
    x, scale = ctx.inputs[0], ctx.inputs[1]
    if x.dtype not in (*QUANTIZED_DTYPES, "int32"):
        raise _CannotConvert(f"DequantizeLinear node {ctx.name!r}: input dtype {x.dtype} is not int8, uint8 or int32")
    axis = _axis_of(ctx, scale, len(x.shape))
    return [ctx.node("DequantizeLinear", [x, scale, ctx.input(2)], {"axis": axis})]


def DynamicQuantizeLinear(ctx: _Ctx) -> list[Node]:
    """y, scale, zero point of a uint8 quantization over x's range widened to include 0:
    scale = (max - min) / 255 (1 when max == min), zero point = saturate(round(0 - min / scale))."""
    x = ctx.inputs[0]
    y, scale, zp = (ctx.outputs + [None, None])[:3]
    scale = scale or ctx.temp("scale", (), "float32")
    zp = zp or ctx.temp("zero_point", (), "uint8")
    zero = ctx.constant("zero", np.zeros((), np.float32))
    nodes: list[Node] = []

    def step(op: str, inputs: list[Value], attrs: dict | None = None, out: Value | None = None, dtype="float32"):
        out = out or ctx.temp(op.lower(), (), dtype)
        nodes.append(ctx.node(op, inputs, attrs, [out]))
        return out

    axes = {"axes": list(range(len(x.shape))), "keepdims": 0, "noop_with_empty_axes": 0}
    lo = step("Min", [step("ReduceMin", [x], axes), zero])
    hi = step("Max", [step("ReduceMax", [x], axes), zero])
    span = step("Div", [step("Sub", [hi, lo]), ctx.constant("qrange", np.array(255, np.float32))])
    flat = step("Equal", [hi, lo], dtype="bool")
    step("Where", [flat, ctx.constant("one", np.ones((), np.float32)), span], out=scale)
    shifted = step("Sub", [zero, step("Div", [lo, scale])])
    rounded = step("Round", [step("Clip", [shifted], {"min": 0.0, "max": 255.0})])
    step("Cast", [rounded], {"to": "uint8"}, out=zp)
    nodes.append(ctx.node("QuantizeLinear", [x, scale, zp], {"axis": None, "to": "uint8"}, [y]))
    return nodes


def MatMulInteger(ctx: _Ctx) -> list[Node]:
    a, b = ctx.inputs[0], ctx.inputs[1]
    for zp, rows, what in (
        (ctx.input(2), a.shape[-2:-1], "a_zero_point"),
        (ctx.input(3), b.shape[-1:], "b_zero_point"),
    ):
        if zp is not None and int(np.prod(zp.shape)) != 1 and tuple(zp.shape) != tuple(rows):
            raise _CannotConvert(
                f"MatMulInteger node {ctx.name!r}: {what} has shape {list(zp.shape)}; it must be one value or one per "
                f"{'row of A' if what[0] == 'a' else 'column of B'} ({list(rows)})"
            )
    return [ctx.node("MatMulInteger", [a, b, ctx.input(2), ctx.input(3)])]


def _conv_attrs(ctx: _Ctx, w: Value) -> dict:
    kernel = ctx.attrs.get("kernel_shape", list(w.shape[2:]))
    return {**_window_attrs(ctx, kernel), "group": ctx.attrs.get("group", 1)}


def ConvInteger(ctx: _Ctx) -> list[Node]:
    x, w, xzp = ctx.inputs[0], ctx.inputs[1], ctx.input(2)
    if xzp is not None and int(np.prod(xzp.shape)) != 1:
        raise _CannotConvert(f"ConvInteger node {ctx.name!r}: x_zero_point must be one value, got {list(xzp.shape)}")
    return [ctx.node("ConvInteger", [x, w, xzp, ctx.input(3)], _conv_attrs(ctx, w))]


def _multiplier(ctx: _Ctx, x_scale: Value, w_scale: Value, y_scale: Value, nodes: list[Node]) -> Value:
    """x_scale * w_scale / y_scale in float32 (a constant when all three are)."""
    if all(v.const is not None for v in (x_scale, w_scale, y_scale)):
        f32 = [np.asarray(v.const, np.float32) for v in (x_scale, w_scale, y_scale)]
        return ctx.constant("multiplier", (f32[0] * f32[1] / f32[2]).astype(np.float32))
    shape = tuple(np.broadcast_shapes(x_scale.shape, w_scale.shape, y_scale.shape))
    product = ctx.temp("scale_product", shape, "float32")
    out = ctx.temp("multiplier", shape, "float32")
    nodes += [ctx.node("Mul", [x_scale, w_scale], {}, [product]), ctx.node("Div", [product, y_scale], {}, [out])]
    return out


def _requantized(ctx: _Ctx, integer: Node, scales: tuple[Value, Value, Value], bias: Value | None, axis: int):
    """The int32 `integer` node, then Requantize into the node's output (zero point input 7 of both QLinear ops):
    only the weight's scale (and the bias) may be per output channel / column, as onnxruntime has it."""
    extent = ctx.outputs[0].shape[axis]
    for v, what in ((scales[0], "input scale"), (scales[2], "output scale"), (ctx.input(7), "output zero point")):
        if v is not None and int(np.prod(v.shape)) != 1:
            raise _CannotConvert(
                f"{ctx.op} node {ctx.name!r}: the {what} has shape {list(v.shape)}; tilefarm takes one value there "
                "(a per-row or per-channel one is not supported)"
            )
    for v, what in ((scales[1], "weight scale"), (bias, "bias")):
        if v is not None and int(np.prod(v.shape)) not in (1, extent):
            raise InvalidModel(
                f"{ctx.op} node {ctx.name!r}: the {what} has shape {list(v.shape)}; it must be one value or "
                f"{extent}, one per output {'channel' if axis == 1 and ctx.op == 'QLinearConv' else 'column'}"
            )
    nodes = [integer]
    mult = _multiplier(ctx, *scales, nodes)
    y = ctx.outputs[0]
    to = _quantized_out(ctx, y)
    per_axis = int(np.prod(mult.shape)) > 1 or (bias is not None and int(np.prod(bias.shape)) > 1)
    attrs = {"axis": axis if per_axis else None, "to": to}
    nodes.append(ctx.node("Requantize", [integer.outputs[0], mult, ctx.input(7), bias], attrs, [y]))
    return nodes


def QLinearMatMul(ctx: _Ctx) -> list[Node]:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale = ctx.inputs[:7]
    acc = ctx.temp("acc", ctx.outputs[0].shape, "int32")
    integer = ctx.node("MatMulInteger", [a, b, a_zp, b_zp], {}, [acc])
    return _requantized(ctx, integer, (a_scale, b_scale, y_scale), None, len(acc.shape) - 1)


def QLinearConv(ctx: _Ctx) -> list[Node]:
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale = ctx.inputs[:7]
    if x_zp is not None and int(np.prod(x_zp.shape)) != 1:
        raise _CannotConvert(f"QLinearConv node {ctx.name!r}: x_zero_point must be one value, got {list(x_zp.shape)}")
    acc = ctx.temp("acc", ctx.outputs[0].shape, "int32")
    integer = ctx.node("ConvInteger", [x, w, x_zp, w_zp], _conv_attrs(ctx, w), [acc])
    return _requantized(ctx, integer, (x_scale, w_scale, y_scale), ctx.input(8), 1)


QUANTIZED: dict[str, Callable[[_Ctx], list[Node]]] = {
    "QuantizeLinear": QuantizeLinear,
    "DequantizeLinear": DequantizeLinear,
    "DynamicQuantizeLinear": DynamicQuantizeLinear,
    "MatMulInteger": MatMulInteger,
    "ConvInteger": ConvInteger,
    "QLinearMatMul": QLinearMatMul,
    "QLinearConv": QLinearConv,
}
