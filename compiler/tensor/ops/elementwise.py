"""Elementwise ONNX ops: activations and math (unary), broadcasting arithmetic, comparisons and bit shifts (binary),
Where, Clip, Cast and the variadic Sum / Mean / Max / Min.

Each op is one stage. Unary and binary ops are rows of `UNARY` / `BINARY`: (dtypes ONNX allows, the element
expression); the builders around them handle broadcasting, dtype checks and naming.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence

from compiler.base import dtypes
from compiler.base.errors import InvalidExpr, UnsupportedDType
from compiler.tensor import te
from compiler.tensor.ops.checks import ALL, FLOATS, NUMERIC, SIGNED, _bcast, _broadcast_shape, _c, _dtype_in, _input

Expr = te.Expr
Ins = Sequence[te.Tensor | None]


def _zero(x: Expr) -> te.Const:
    return _c(0, x)


def round_half_even(x: Expr) -> Expr:
    """x rounded to the nearest integer, ties to even (ONNX Round, numpy.round): the `roundeven` intrinsic, one
    instruction on x86 (vrndscaleps) and NVPTX (cvt.rni). The floor-and-settle-ties form it replaces took a float
    remainder per lane (`f % 2`, a libm fmodf call each) and four selects, in every quantize and requantize."""
    return te.roundeven(x)


def _sign(x: Expr) -> Expr:
    # `x` itself for zero (and NaN), like numpy
    if not dtypes.is_signed(x.dtype):
        return te.select(x > _zero(x), _c(1, x), x)
    return te.select(x > _zero(x), _c(1, x), te.select(x < _zero(x), _c(-1, x), x))


def _gelu(x: Expr, approximate: str) -> Expr:
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + te.tanh(inner))
    if approximate != "none":
        raise InvalidExpr(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * x * (1.0 + te.erf(x * (1.0 / math.sqrt(2.0))))


def _softplus(x: Expr) -> Expr:
    # log(1 + e^x) without overflowing e^x for large x
    return te.maximum(x, _zero(x)) + te.log(1.0 + te.exp(-te.abs(x)))


def _through_float64(fn: Callable[[Expr], Expr], x: Expr) -> Expr:
    """fn(x), computed in float64 and cast back for an integer x (as ONNX's integer Erf is)."""
    return fn(x) if dtypes.is_float(x.dtype) else te.cast(x.dtype, fn(te.cast("float64", x)))


def _is_inf(x: Expr, a: dict) -> Expr:
    pos = te.equal(x, te.max_value(x.dtype)) if a["detect_positive"] else te.const(False, "bool")
    neg = te.equal(x, te.min_value(x.dtype)) if a["detect_negative"] else te.const(False, "bool")
    return pos | neg


# op -> (dtypes, f(x, attrs)); `x` is the loaded element
UNARY: dict[str, tuple[tuple[str, ...], Callable[[Expr, dict], Expr]]] = {
    "Relu": (SIGNED, lambda x, a: te.maximum(x, _zero(x))),
    "LeakyRelu": (FLOATS, lambda x, a: te.select(x < _zero(x), x * a["alpha"], x)),
    "ThresholdedRelu": (FLOATS, lambda x, a: te.select(x > a["alpha"], x, _zero(x))),
    "Sigmoid": (FLOATS, lambda x, a: te.sigmoid(x)),
    "HardSigmoid": (FLOATS, lambda x, a: te.maximum(_zero(x), te.minimum(_c(1, x), x * a["alpha"] + a["beta"]))),
    # HardSwish is x * HardSigmoid(x) with alpha 1/6, beta 1/2
    "HardSwish": (FLOATS, lambda x, a: x * te.maximum(_zero(x), te.minimum(_c(1, x), x * (1.0 / 6.0) + 0.5))),
    "Tanh": (FLOATS, lambda x, a: te.tanh(x)),
    "Erf": (NUMERIC, lambda x, a: _through_float64(te.erf, x)),
    "Gelu": (FLOATS, lambda x, a: _gelu(x, a["approximate"])),
    "Elu": (FLOATS, lambda x, a: te.select(x < _zero(x), a["alpha"] * (te.exp(x) - 1.0), x)),
    "Selu": (FLOATS, lambda x, a: a["gamma"] * te.select(x <= _zero(x), a["alpha"] * te.exp(x) - a["alpha"], x)),
    "Celu": (
        FLOATS,
        lambda x, a: te.maximum(_zero(x), x) + te.minimum(_zero(x), a["alpha"] * (te.exp(x / a["alpha"]) - 1.0)),
    ),
    "Softplus": (FLOATS, lambda x, a: _softplus(x)),
    "Softsign": (FLOATS, lambda x, a: x / (1.0 + te.abs(x))),
    "Mish": (FLOATS, lambda x, a: x * te.tanh(_softplus(x))),
    "Exp": (FLOATS, lambda x, a: te.exp(x)),
    "Sin": (FLOATS, lambda x, a: te.sin(x)),
    "Cos": (FLOATS, lambda x, a: te.cos(x)),
    "Log": (FLOATS, lambda x, a: te.log(x)),
    "Sqrt": (FLOATS, lambda x, a: te.sqrt(x)),
    "Reciprocal": (FLOATS, lambda x, a: te.div(_c(1, x), x)),
    "Neg": (SIGNED, lambda x, a: -x),
    "Abs": (NUMERIC, lambda x, a: te.abs(x)),
    "Floor": (FLOATS, lambda x, a: te.floor(x)),
    # ceil(x) = -floor(-x) exactly, so no ceil intrinsic is needed
    "Ceil": (FLOATS, lambda x, a: -te.floor(-x)),
    "Round": (FLOATS, lambda x, a: round_half_even(x)),
    "Sign": (NUMERIC, lambda x, a: _sign(x)),
    "Not": (("bool",), lambda x, a: ~x),
    "IsNaN": (FLOATS, lambda x, a: te.not_equal(x, x)),
    "IsInf": (FLOATS, _is_inf),
}


def _int_div(a: Expr, b: Expr) -> Expr:
    # ONNX integer Div truncates toward zero; te's integer division floors
    if not dtypes.is_signed(a.dtype):
        return a // b
    q = te.abs(a) // te.abs(b)
    return te.select(te.not_equal(a < _zero(a), b < _zero(b)), -q, q)


def _div(a: Expr, b: Expr, attrs: dict) -> Expr:
    return a / b if dtypes.is_float(a.dtype) else _int_div(a, b)


def _mod(a: Expr, b: Expr, attrs: dict) -> Expr:
    if not attrs["fmod"] or not dtypes.is_signed(a.dtype):
        return a % b  # te's mod takes the divisor's sign, as ONNX Mod with fmod=0 (and any unsigned Mod) does
    # fmod: the dividend's sign. The remainder of the magnitudes is exact, unlike fixing up a floored one
    r = te.abs(a) % te.abs(b)
    return te.select(a < _zero(a), -r, r)


def _pow(a: Expr, b: Expr, attrs: dict) -> Expr:
    # the exponent may have another dtype; the result has the base's
    if dtypes.is_float(a.dtype) or not dtypes.is_float(b.dtype):
        return te.power(a, te.cast(a.dtype, b))
    return te.cast(a.dtype, te.power(te.cast("float64", a), te.cast("float64", b)))


def _prelu(x: Expr, slope: Expr, attrs: dict) -> Expr:
    return te.select(x < _zero(x), x * slope, x)


def _bitshift(x: Expr, count: Expr, attrs: dict) -> Expr:
    # te's shifts answer a count past the width as ONNX (opset 28) and onnxruntime do: every bit shifted out
    direction = attrs["direction"]
    if direction not in ("LEFT", "RIGHT"):
        raise InvalidExpr(f"BitShift: direction must be LEFT or RIGHT, got {direction!r}")
    return x << count if direction == "LEFT" else x >> count


# BitShift's dtypes: the unsigned ones of opset 11, the signed ones opset 28 added (the 16-bit and wider unsigned
# dtypes are for it alone so far; the arithmetic ops take INTS)
SHIFTED = ("uint8", "uint16", "uint32", "uint64", "int8", "int32", "int64")


# op -> (dtypes of the first input, f(a, b, attrs), whether both inputs must share a dtype)
BINARY: dict[str, tuple[tuple[str, ...], Callable[[Expr, Expr, dict], Expr], bool]] = {
    "Add": (NUMERIC, lambda a, b, _: a + b, True),
    "Sub": (NUMERIC, lambda a, b, _: a - b, True),
    "Mul": (NUMERIC, lambda a, b, _: a * b, True),
    "Div": (NUMERIC, _div, True),
    "Mod": (NUMERIC, _mod, True),
    "Pow": (("int32", "int64", *FLOATS), _pow, False),
    "PRelu": (SIGNED, _prelu, True),
    "Equal": (ALL, lambda a, b, _: te.equal(a, b), True),
    "Less": (NUMERIC, lambda a, b, _: a < b, True),
    "LessOrEqual": (NUMERIC, lambda a, b, _: a <= b, True),
    "Greater": (NUMERIC, lambda a, b, _: a > b, True),
    "GreaterOrEqual": (NUMERIC, lambda a, b, _: a >= b, True),
    "And": (("bool",), lambda a, b, _: a & b, True),
    "Or": (("bool",), lambda a, b, _: a | b, True),
    "Xor": (("bool",), lambda a, b, _: te.not_equal(a, b), True),
    "BitShift": (SHIFTED, _bitshift, True),
}


def unary(op: str) -> Callable[[Ins, dict, str], list[te.Tensor]]:
    """The builder of the UNARY row `op`."""
    allowed, fn = UNARY[op]

    def build(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
        x = _input(op, ins, 0, "X")
        _dtype_in(op, x, allowed)
        return [te.compute(x.shape, lambda *i: fn(x[i], attrs), name=name, tag="elemwise")]

    return build


def binary(op: str) -> Callable[[Ins, dict, str], list[te.Tensor]]:
    """The builder of the BINARY row `op`, broadcasting numpy-style."""
    allowed, fn, same = BINARY[op]

    def build(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
        a, b = _input(op, ins, 0, "A"), _input(op, ins, 1, "B")
        _dtype_in(op, a, allowed)
        _dtype_in(op, b, allowed if same else NUMERIC)
        if same and a.dtype != b.dtype:
            raise InvalidExpr(f"{op}: inputs {a.name} ({a.dtype}) and {b.name} ({b.dtype}) must have one dtype")
        shape = _broadcast_shape(op, a.shape, b.shape)
        tag = "elemwise" if a.shape == b.shape else "broadcast"
        return [te.compute(shape, lambda *i: fn(_bcast(a, i), _bcast(b, i), attrs), name=name, tag=tag)]

    return build


def where(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    cond, x, y = (_input("Where", ins, i, r) for i, r in enumerate(("condition", "X", "Y")))
    _dtype_in("Where", cond, ("bool",))
    if x.dtype != y.dtype:
        raise InvalidExpr(f"Where: X ({x.dtype}) and Y ({y.dtype}) must have one dtype")
    shape = _broadcast_shape("Where", cond.shape, x.shape, y.shape)
    body = lambda *i: te.select(_bcast(cond, i), _bcast(x, i), _bcast(y, i))
    return [te.compute(shape, body, name=name, tag="broadcast")]


def clip(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Clip", ins, 0, "input")
    _dtype_in("Clip", x, NUMERIC)
    lo, hi = float(attrs.get("min", -math.inf)), float(attrs.get("max", math.inf))

    def bound(v: float, unbounded: float) -> te.Const | None:
        if v == unbounded:
            return None
        if not dtypes.is_float(x.dtype):  # an integer bound past the dtype's range bounds nothing either
            low, high = te.min_value(x.dtype).value, te.max_value(x.dtype).value
            return te.const(int(min(max(v, low), high)), x.dtype)
        return te.const(v, x.dtype)

    def body(*i):
        v = x[i]
        # max before min: with min > max every element becomes max, as in numpy.clip and ONNX
        if (b := bound(lo, -math.inf)) is not None:
            v = te.maximum(v, b)
        if (b := bound(hi, math.inf)) is not None:
            v = te.minimum(v, b)
        return v

    return [te.compute(x.shape, body, name=name, tag="elemwise")]


# ONNX TensorProto.DataType -> dtype, for the ones tilefarm computes in (no onnx import: it is not a dependency)
ONNX_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    6: "int32",
    7: "int64",
    9: "bool",
    11: "float64",
    12: "uint32",
    13: "uint64",
}


def onnx_dtype(to: int | str) -> str:
    """The dtype named by an ONNX `to` attribute (a TensorProto enum value, or already a dtype name)."""
    if isinstance(to, str):
        return dtypes.check(to)
    if to not in ONNX_DTYPES:
        raise UnsupportedDType(
            f"ONNX data type {to} is not supported; supported: "
            + ", ".join(f"{k} ({v})" for k, v in ONNX_DTYPES.items())
        )
    return ONNX_DTYPES[to]


def _cast_to(x: te.Tensor, dtype: str, name: str) -> te.Tensor:
    return te.compute(x.shape, lambda *i: te.cast(dtype, x[i]), name=name, tag="elemwise")


def cast(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Cast", ins, 0, "input")
    return [_cast_to(x, onnx_dtype(attrs["to"]), name)]


def cast_like(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x, like = _input("CastLike", ins, 0, "input"), _input("CastLike", ins, 1, "target_type")
    return [_cast_to(x, like.dtype, name)]


def _variadic(op: str, allowed: tuple[str, ...], combine: Callable[[Expr, Expr], Expr], mean: bool = False):
    def build(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
        xs = [t for t in ins if t is not None]
        if not xs:
            raise InvalidExpr(f"{op}: needs at least one input")
        for t in xs:
            _dtype_in(op, t, allowed)
        if len({t.dtype for t in xs}) > 1:
            raise InvalidExpr(f"{op}: inputs must have one dtype, got {[t.dtype for t in xs]}")
        shape = _broadcast_shape(op, *(t.shape for t in xs))

        def body(*i):
            v = functools.reduce(combine, (_bcast(t, i) for t in xs))
            return v / float(len(xs)) if mean else v

        return [te.compute(shape, body, name=name, tag="broadcast")]

    return build


VARIADIC = {
    "Sum": _variadic("Sum", NUMERIC, operator.add),
    "Mean": _variadic("Mean", FLOATS, operator.add, mean=True),
    "Max": _variadic("Max", NUMERIC, te.maximum),
    "Min": _variadic("Min", NUMERIC, te.minimum),
}

ELEMENTWISE_OPS = {
    **{op: unary(op) for op in UNARY},
    **{op: binary(op) for op in BINARY},
    **VARIADIC,
    "Where": where,
    "Clip": clip,
    "Cast": cast,
    "CastLike": cast_like,
}
