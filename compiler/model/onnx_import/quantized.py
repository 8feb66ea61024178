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


# ---------------------------------------------------------------------------------------------- com.microsoft

CONTRIB_DOMAIN = "com.microsoft"
_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


def _scalar(ctx: _Ctx, i: int, what: str) -> np.ndarray:
    """Input i, a constant of one value (its zero point 0 when omitted)."""
    c = ctx.const(i, what)
    if c is None:
        return np.zeros((), ctx.inputs[0].dtype if ctx.inputs[0] is not None else np.uint8)
    if c.size != 1:
        raise _CannotConvert(f"{ctx.op} node {ctx.name!r}: {what} has shape {list(c.shape)}; tilefarm takes one value")
    return c.reshape(())


def _requantized_values(x_dtype: str, xs, xz, ys, yz, y_dtype: str, fn=lambda v: v) -> np.ndarray:
    """Every value of x_dtype (lowest first) dequantized, through fn, and quantized again as onnxruntime's lookup
    tables are built (QlinearBuildLookupTable): float32 x_scale * (x - x_zero_point), then round half to even of
    v / y_scale plus y_zero_point, saturated."""
    lo, hi = _RANGES[x_dtype]
    v = np.float32(xs) * (np.arange(lo, hi + 1, dtype=np.int32) - np.int32(xz)).astype(np.float32)
    q = np.rint(fn(v).astype(np.float32) / np.float32(ys)) + np.float32(yz)
    return np.clip(q, *_RANGES[y_dtype]).astype(y_dtype)


def _lookup(ctx: _Ctx, x: Value, table: np.ndarray, out: Value) -> list[Node]:
    """out = table[x - lowest value of x's dtype], a Gather from a 256-entry constant."""
    wide = ctx.temp("index", x.shape, "int32")
    idx = ctx.temp("offset", x.shape, "int32")
    lo = ctx.constant("lowest", np.array(_RANGES[x.dtype][0], np.int32))
    return [
        ctx.node("Cast", [x], {"to": "int32"}, [wide]),
        ctx.node("Sub", [wide, lo], {}, [idx]),
        ctx.node("Gather", [ctx.constant("table", table), idx], {"axis": 0}, [out]),
    ]


def _unary_lookup(fn):
    def convert(ctx: _Ctx) -> list[Node]:
        x = ctx.inputs[0]
        if x.dtype not in QUANTIZED_DTYPES:
            raise InvalidModel(f"{ctx.op} node {ctx.name!r}: input dtype {x.dtype} is not int8 or uint8")
        xs, xz = _scalar(ctx, 1, "X_scale"), _scalar(ctx, 2, "X_zero_point")
        ys, yz = _scalar(ctx, 3, "Y_scale"), _scalar(ctx, 4, "Y_zero_point")
        return _lookup(ctx, x, _requantized_values(x.dtype, xs, xz, ys, yz, x.dtype, fn(ctx)), ctx.outputs[0])

    return convert


def _leaky(ctx: _Ctx):
    alpha = np.float32(ctx.attrs.get("alpha", 0.01))
    return lambda v: np.where(v >= 0, v, v * alpha)


def _sigmoid(ctx: _Ctx):
    return lambda v: (1.0 / (1.0 + np.exp(-v.astype(np.float64)))).astype(np.float32)


def QLinearConcat(ctx: _Ctx) -> list[Node]:
    """Each input requantized to the output's scale and zero point through a lookup table (as onnxruntime does;
    copied as it is where the parameters are the same), then Concat."""
    ys, yz = _scalar(ctx, 0, "Y_scale"), _scalar(ctx, 1, "Y_zero_point")
    y = ctx.outputs[0]
    parts, nodes = [], []
    for k in range(2, len(ctx.inputs), 3):
        x = ctx.inputs[k]
        if x is None or x.dtype != y.dtype:
            raise InvalidModel(f"QLinearConcat node {ctx.name!r}: input {k} must be {y.dtype} like the output")
        xs, xz = _scalar(ctx, k + 1, f"input {k + 1} (scale)"), _scalar(ctx, k + 2, f"input {k + 2} (zero point)")
        if np.float32(xs) == np.float32(ys) and int(xz) == int(yz):
            parts.append(x)
            continue
        out = ctx.temp(f"part{k // 3}", x.shape, y.dtype)
        nodes += _lookup(ctx, x, _requantized_values(x.dtype, xs, xz, ys, yz, y.dtype), out)
        parts.append(out)
    return [*nodes, ctx.node("Concat", parts, {"axis": _axis(int(ctx.attrs["axis"]), len(y.shape))})]


def QLinearGlobalAveragePool(ctx: _Ctx) -> list[Node]:
    """onnxruntime's: the int32 sum over the image, requantized with multiplier x_scale / (y_scale * pixels) and
    bias -x_zero_point * pixels (channels_last: N x H x W x C)."""
    x, y = ctx.inputs[0], ctx.outputs[0]
    xs, xz = _scalar(ctx, 1, "x_scale"), _scalar(ctx, 2, "x_zero_point")
    ys, yz = _scalar(ctx, 3, "y_scale"), ctx.input(4)
    last = bool(ctx.attrs.get("channels_last", 0))
    axes = list(range(1, len(x.shape) - 1)) if last else list(range(2, len(x.shape)))
    pixels = int(np.prod([x.shape[a] for a in axes]))
    wide, total = ctx.temp("int32", x.shape, "int32"), ctx.temp("sum", y.shape, "int32")
    mult = ctx.constant("multiplier", np.float32(xs) / (np.float32(ys) * np.float32(pixels)))
    bias = ctx.constant("bias", np.array(-int(xz) * pixels, np.int32))
    return [
        ctx.node("Cast", [x], {"to": "int32"}, [wide]),
        ctx.node("ReduceSum", [wide], {"axes": axes, "keepdims": 1, "noop_with_empty_axes": 0}, [total]),
        ctx.node("Requantize", [total, mult, yz, bias], {"axis": None, "to": _quantized_out(ctx, y)}, [y]),
    ]


def _scaled_product(ctx: _Ctx, acc: Value, scale: Value, bias: Value | None) -> list[Node]:
    """float32(acc) * scale (+ bias) into the node's output."""
    y = ctx.outputs[0]
    f = ctx.temp("float", acc.shape, "float32")
    nodes = [ctx.node("Cast", [acc], {"to": "float32"}, [f])]
    if bias is None:
        return [*nodes, ctx.node("Mul", [f, scale], {}, [y])]
    scaled = ctx.temp("scaled", acc.shape, "float32")
    return [*nodes, ctx.node("Mul", [f, scale], {}, [scaled]), ctx.node("Add", [scaled, bias], {}, [y])]


def _product_scale(ctx: _Ctx, a_scale: Value, b_scale: Value, nodes: list[Node]) -> Value:
    if a_scale.const is not None and b_scale.const is not None:
        return ctx.constant("scale", (a_scale.const.astype(np.float32) * b_scale.const.astype(np.float32)))
    out = ctx.temp("scale", tuple(np.broadcast_shapes(a_scale.shape, b_scale.shape)), "float32")
    nodes.append(ctx.node("Mul", [a_scale, b_scale], {}, [out]))
    return out


def MatMulIntegerToFloat(ctx: _Ctx) -> list[Node]:
    """(A - a_zero_point) @ (B - b_zero_point) in int32, times a_scale * b_scale (b's per column or one), plus bias."""
    a, b, a_scale, b_scale = ctx.inputs[:4]
    acc = ctx.temp("acc", ctx.outputs[0].shape, "int32")
    nodes = [ctx.node("MatMulInteger", [a, b, ctx.input(4), ctx.input(5)], {}, [acc])]
    scale = _product_scale(ctx, a_scale, b_scale, nodes)
    return nodes + _scaled_product(ctx, acc, scale, ctx.input(6))


def DynamicQuantizeMatMul(ctx: _Ctx) -> list[Node]:
    """A quantized to uint8 as DynamicQuantizeLinear does, then MatMulIntegerToFloat with B."""
    a, b, b_scale = ctx.inputs[:3]
    aq, a_scale, a_zp = (
        ctx.temp("a", a.shape, "uint8"),
        ctx.temp("a_scale", (), "float32"),
        ctx.temp("a_zp", (), "uint8"),
    )
    dq = _Ctx(**{**ctx.__dict__, "op": "DynamicQuantizeLinear", "inputs": [a], "outputs": [aq, a_scale, a_zp]})
    nodes = DynamicQuantizeLinear(dq)
    acc = ctx.temp("acc", ctx.outputs[0].shape, "int32")
    nodes.append(ctx.node("MatMulInteger", [aq, b, a_zp, ctx.input(3)], {}, [acc]))
    scale = _product_scale(ctx, a_scale, b_scale, nodes)
    return nodes + _scaled_product(ctx, acc, scale, ctx.input(4))


def qlinear_add_attrs(a_scale, a_zp, b_scale, b_zp, c_scale, c_zp) -> dict:
    """The constants of onnxruntime's QLinearAdd kernel (tensor op QLinearAdd), in its float32 order: ratios
    a_scale / c_scale and b_scale / c_scale, fixed part c_zp - fma(ratio_a, a_zp, ratio_b * b_zp) (the compiler
    contracts onnxruntime's `ratio_a * a_zp + ratio_b * b_zp` into a fused multiply-add; float64 computes it exactly,
    rounded once to float32)."""
    f32 = np.float32
    ra, rb = f32(a_scale) / f32(c_scale), f32(b_scale) / f32(c_scale)
    fused = f32(np.float64(ra) * int(a_zp) + np.float64(rb * f32(int(b_zp))))
    fixed = f32(int(c_zp)) - fused
    return {"ratios": (float(ra), float(rb)), "fixed": float(fixed)}


def QLinearAdd(ctx: _Ctx) -> list[Node]:
    a, b, y = ctx.inputs[0], ctx.inputs[3], ctx.outputs[0]
    if a.dtype not in QUANTIZED_DTYPES or b.dtype != a.dtype or y.dtype != a.dtype:
        raise InvalidModel(f"QLinearAdd node {ctx.name!r}: A, B and C must be one of int8, uint8 alike")
    if a.shape != b.shape:
        raise _CannotConvert(
            f"QLinearAdd node {ctx.name!r}: A {list(a.shape)} and B {list(b.shape)} differ in shape; tilefarm adds "
            "quantized tensors of one shape (onnxruntime's broadcast spans round differently)"
        )
    slots = (
        (1, "A_scale"),
        (2, "A_zero_point"),
        (4, "B_scale"),
        (5, "B_zero_point"),
        (6, "C_scale"),
        (7, "C_zero_point"),
    )
    params = [_scalar(ctx, i, what) for i, what in slots]
    return [ctx.node("QLinearAdd", [a, b], qlinear_add_attrs(*params))]


def qlinear_mul_attrs(a_scale, a_zp, b_scale, b_zp, c_scale, c_zp) -> dict:
    """The constants of onnxruntime's QLinearMul kernel (tensor op QLinearMul): ratio a_scale * b_scale / c_scale in
    float32, and the three zero points."""
    f32 = np.float32
    return {
        "ratio": float(f32(a_scale) * f32(b_scale) / f32(c_scale)),
        "zero_points": (int(a_zp), int(b_zp), int(c_zp)),
    }


def QLinearMul(ctx: _Ctx) -> list[Node]:
    a, b, y = ctx.inputs[0], ctx.inputs[3], ctx.outputs[0]
    if a.dtype not in QUANTIZED_DTYPES or b.dtype != a.dtype or y.dtype != a.dtype:
        raise InvalidModel(f"QLinearMul node {ctx.name!r}: A, B and C must be one of int8, uint8 alike")
    if a.shape != b.shape and int(np.prod(a.shape)) == 1:
        a, b = b, a  # a product commutes: the one-element operand goes second
        slots = ((4, "B_scale"), (5, "B_zero_point"), (1, "A_scale"), (2, "A_zero_point"))
    else:
        slots = ((1, "A_scale"), (2, "A_zero_point"), (4, "B_scale"), (5, "B_zero_point"))
    if a.shape != b.shape and int(np.prod(b.shape)) != 1:
        raise _CannotConvert(
            f"QLinearMul node {ctx.name!r}: A {list(a.shape)} and B {list(b.shape)} differ in shape; tilefarm "
            "multiplies quantized tensors of one shape, or by one value"
        )
    params = [_scalar(ctx, i, what) for i, what in (*slots, (6, "C_scale"), (7, "C_zero_point"))]
    return [ctx.node("QLinearMul", [a, b], qlinear_mul_attrs(*params))]


CONTRIB: dict[str, Callable[[_Ctx], list[Node]]] = {
    "QLinearMul": QLinearMul,
    "QLinearAdd": QLinearAdd,
    "QLinearGlobalAveragePool": QLinearGlobalAveragePool,
    "QLinearLeakyRelu": _unary_lookup(_leaky),
    "QLinearSigmoid": _unary_lookup(_sigmoid),
    "QLinearConcat": QLinearConcat,
    "MatMulIntegerToFloat": MatMulIntegerToFloat,
    "DynamicQuantizeMatMul": DynamicQuantizeMatMul,
}
"""The com.microsoft contrib ops onnxruntime's quantizer writes that tilefarm imports (by op type)."""


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return (*np.broadcast_shapes(a[:-2], b[:-2]), *a[-2:-1], *b[-1:]) if len(b) > 1 else a[:-1]


def contrib_types(op: str, attrs: dict, typed: list) -> list[tuple[int, tuple[int, ...]]] | None:
    """The (onnx element type, shape) of a CONTRIB node's outputs from its inputs' (None where one is unknown):
    onnx's shape inference does not know the com.microsoft ops."""
    if any(t is None for t in typed[:1]):
        return None
    elem, shape = typed[0]
    if op in ("QLinearLeakyRelu", "QLinearSigmoid"):
        return [(elem, shape)]
    if op in ("QLinearAdd", "QLinearMul") and len(typed) > 3 and typed[3] is not None:
        return [(elem, tuple(np.broadcast_shapes(tuple(shape), tuple(typed[3][1]))))]
    if op == "QLinearGlobalAveragePool":
        last = attrs.get("channels_last", 0)
        return [
            (elem, (shape[0], *[1] * (len(shape) - 2), shape[-1]) if last else (*shape[:2], *[1] * (len(shape) - 2)))
        ]
    if op == "QLinearConcat":
        parts = typed[2::3]
        if any(t is None for t in parts) or not parts:
            return None
        axis = int(attrs["axis"]) % len(parts[0][1])
        out = list(parts[0][1])
        out[axis] = sum(t[1][axis] for t in parts)
        return [(parts[0][0], tuple(out))]
    if op in ("MatMulIntegerToFloat", "DynamicQuantizeMatMul") and len(typed) > 1 and typed[1] is not None:
        return [(1, _matmul_shape(tuple(shape), tuple(typed[1][1])))]  # float32
    return None
