"""Argument checks and index helpers shared by the op definitions."""

from __future__ import annotations

from collections.abc import Sequence

from compiler.base.errors import InvalidExpr, UnsupportedDType
from compiler.model.graph import NCHWC
from compiler.tensor import te

Pair = int | Sequence[int]

# ---------------------------------------------------------------------------------------------- argument checks




def _lanes(attrs: dict) -> int:
    """1 when an op's data is NCHWc (attribute layout="NCHWc", set by `propagate_nchwc`): its last axis holds
    channel lanes; else 0."""
    return 1 if attrs.get("layout") == NCHWC else 0


def _dims(t: te.Tensor) -> str:
    return "x".join(map(str, t.shape)) or "scalar"


def _rank(op: str, t: te.Tensor, ndim: int, role: str) -> None:
    if t.ndim != ndim:
        raise InvalidExpr(f"{op}: {role} {t.name} must be {ndim}-D, got shape {_dims(t)}")


def _same_dtype(op: str, *ts: te.Tensor) -> None:
    if len({t.dtype for t in ts}) > 1:
        got = ", ".join(f"{t.name}: {t.dtype}" for t in ts)
        raise InvalidExpr(f"{op}: inputs must have one dtype, got {got}; cast them first")


def _pair(op: str, what: str, v: Pair, lowest: int) -> tuple[int, int]:
    vals = (v, v) if isinstance(v, int) else tuple(v)
    if len(vals) != 2 or any(not isinstance(x, int) or x < lowest for x in vals):
        raise InvalidExpr(f"{op}: {what} must be an int or a pair of ints >= {lowest}, got {v!r}")
    return vals


def _padding(op: str, v: Pair) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from an int, a (height, width) pair or ONNX's (top, left, bottom, right)."""
    vals = (v,) * 4 if isinstance(v, int) else tuple(v)
    if len(vals) == 2:
        vals = vals * 2
    if len(vals) != 4 or any(not isinstance(x, int) or x < 0 for x in vals):
        raise InvalidExpr(
            f"{op}: padding must be an int, an (h, w) pair or (top, left, bottom, right) of ints >= 0, got {v!r}"
        )
    return vals


def _out_extent(op: str, what: str, n: int, pads: int, k: int, dilation: int, stride: int) -> int:
    span = (k - 1) * dilation + 1
    if span > n + pads:
        raise InvalidExpr(
            f"{op}: the kernel's {what} extent {span} (kernel {k}, dilation {dilation}) is larger than"
            f" the padded input's {n + pads} ({n} + padding {pads})"
        )
    return (n + pads - span) // stride + 1


def _axis(op: str, axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise InvalidExpr(f"{op}: axis {axis} is out of range for a {ndim}-D input")
    return axis % ndim


def _scale(v: te.Expr, s: int) -> te.Expr:
    # keep `y * 1` out of the definition so printed loop nests read like the math
    return v if s == 1 else v * s


# ---------------------------------------------------------------------------------------------- dtypes, broadcasting

FLOATS = ("float32", "float64")
INTS = ("int8", "uint8", "int32", "int64")
SIGNED = ("int8", "int32", "int64", *FLOATS)
NUMERIC = (*INTS, *FLOATS)
ALL = ("bool", *NUMERIC)


def _dtype_in(op: str, t: te.Tensor, allowed: Sequence[str]) -> None:
    if t.dtype not in allowed:
        raise UnsupportedDType(f"{op}: input {t.name} has dtype {t.dtype}; this op takes {', '.join(allowed)}")


def _broadcast_shape(op: str, *shapes: Sequence[int]) -> tuple[int, ...]:
    """numpy's multidirectional broadcasting: shapes align on the right, size-1 dims stretch."""
    ndim = max(len(s) for s in shapes)
    out = []
    for d in range(ndim):
        sizes = {s[d - ndim + len(s)] for s in shapes if d - ndim + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise InvalidExpr(f"{op}: shapes {[list(s) for s in shapes]} do not broadcast (dim {d}: {sorted(sizes)})")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _bcast(t: te.Tensor, idx: Sequence[te.Expr]) -> te.Expr:
    """The element of `t` that index `idx` of a broadcast output reads (size-1 dims read 0)."""
    idx = tuple(idx)[len(idx) - t.ndim :]
    return t[tuple(0 if n == 1 else i for i, n in zip(idx, t.shape))]


def _c(value: float, like: te.Expr | te.Tensor) -> te.Const:
    """A constant of `like`'s dtype (float attributes become ints for integer tensors)."""
    return te.const(value, like.dtype)


def _input(op: str, ins: Sequence[te.Tensor | None], i: int, role: str) -> te.Tensor:
    if i >= len(ins) or ins[i] is None:
        raise InvalidExpr(f"{op}: input {i} ({role}) is required")
    return ins[i]
