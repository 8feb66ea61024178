"""te's arithmetic in LLVM IR, one definition for the CPU and the CUDA code generators: numpy's answers where LLVM's
instructions trap or give poison (floor division and modulo by 0 or of MIN by -1, shifts by the width or more),
comparisons false with NaN but for !=, the float remainder with the divisor's sign, NaN-propagating min and max.

Each function takes an IRBuilder and operands of one type, a scalar or a vector (the CPU's vectorized loops): the
caller converts and splats them first. What differs between targets (a math function: LLVM's intrinsic, libm or
libdevice) comes in as a callable.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from llvmlite import ir

from compiler.base import dtypes

COMPARISONS = {"lt": "<", "le": "<=", "eq": "==", "ne": "!=", "gt": ">", "ge": ">="}
CONTRACT = ("contract",)  # lets LLVM fuse a*b+c into FMA without the reassociation full fast-math allows
Call = Callable[..., ir.Value]  # (LLVM intrinsic or math function name, *operands) -> value


class _ZeroVector(ir.Constant):
    """A vector of zeros, written `zeroinitializer`: llvmlite spells out every lane (a splat of 16 floats took
    ~300 bytes of IR text, and unrolled Winograd transforms emit thousands)."""

    def _get_reference(self):
        return "zeroinitializer"


def zero(t: ir.Type) -> ir.Constant:
    return _ZeroVector(t, None) if isinstance(t, ir.VectorType) else ir.Constant(t, None)


def _is_zero(value) -> bool:
    """0, False or +0.0 (not -0.0, whose bits differ)."""
    return value is None or (isinstance(value, (int, float)) and value == 0 and math.copysign(1.0, value) > 0)


def filled(t: ir.Type, value) -> ir.Constant:
    """`value` as a constant of type `t`: in every lane of a vector (written zeroinitializer when it is +0)."""
    if not isinstance(t, ir.VectorType):
        return ir.Constant(t, value)
    return zero(t) if _is_zero(value) else ir.Constant(t, [value] * t.count)


def splat_const(like: ir.Value, value) -> ir.Constant:
    """`value` as a constant of `like`'s type (every lane, for a vector)."""
    return filled(like.type, value)


def _width(t: ir.Type) -> int:
    return t.element.width if isinstance(t, ir.VectorType) else t.width


def compare(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
    """x `op` y for te's comparison `op` of two `dtype` values (numpy: any comparison with NaN is false but !=)."""
    sym = COMPARISONS[op]
    if dtypes.is_float(dtype):
        return b.fcmp_unordered(sym, x, y) if op == "ne" else b.fcmp_ordered(sym, x, y)
    return (b.icmp_signed if dtypes.is_signed(dtype) else b.icmp_unsigned)(sym, x, y)


def float_binary(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, call: Call) -> ir.Value | None:
    """x `op` y for floats; None for an op that is not one. `call` gives llvm.floor, llvm.minimum, llvm.maximum
    and pow on the target."""
    if op in ("add", "sub", "mul"):
        return {"add": b.fadd, "sub": b.fsub, "mul": b.fmul}[op](x, y, flags=CONTRACT)
    if op == "div":
        return b.fdiv(x, y)
    if op == "floordiv":
        return call("llvm.floor", b.fdiv(x, y))
    if op == "mod":  # numpy: the remainder takes the sign of the divisor
        r, z = b.frem(x, y), zero(x.type)
        fix = b.and_(b.fcmp_ordered("!=", r, z), b.xor(b.fcmp_ordered("<", r, z), b.fcmp_ordered("<", y, z)))
        return b.select(fix, b.fadd(r, y), r)
    if op in ("min", "max"):  # llvm.minimum/maximum propagate NaN like numpy's minimum/maximum
        return call("llvm.minimum" if op == "min" else "llvm.maximum", x, y)
    if op == "pow":
        return call("pow", x, y)
    return None


def int_division(b: ir.IRBuilder, is_mod: bool, x: ir.Value, y: ir.Value, cy: int | None, dtype: str) -> ir.Value:
    """Floor division or modulo (Python's), without the traps of a hardware divide: x // 0 and x % 0 give 0 and
    MIN // -1 wraps to MIN, like numpy. `cy` is y's value where it is a constant (a power of two becomes a shift or
    a mask)."""
    if cy == 0:
        return splat_const(x, 0)
    signed = dtypes.is_signed(dtype)
    if cy is not None and cy > 0 and cy & (cy - 1) == 0:  # power of two: a shift and a mask are exact floors
        if is_mod:
            return b.and_(x, splat_const(x, cy - 1))
        return (b.ashr if signed else b.lshr)(x, splat_const(x, cy.bit_length() - 1))
    z = zero(x.type)
    by_zero = by_minus_one = None
    if cy is None:  # divide by 1 instead of 0 or -1, then patch the result
        by_zero = b.icmp_unsigned("==", y, z)
        by_minus_one = b.icmp_signed("==", y, splat_const(y, -1)) if signed else None
        bad = b.or_(by_zero, by_minus_one) if by_minus_one is not None else by_zero
        y = b.select(bad, splat_const(y, 1), y)
    if not signed:
        r = b.urem(x, y) if is_mod else b.udiv(x, y)
    else:
        q, r = b.sdiv(x, y), b.srem(x, y)
        # truncated → floored: step down when the remainder is nonzero and its sign differs from the divisor's
        adjust = b.and_(b.icmp_signed("!=", r, z), b.icmp_signed("<", b.xor(r, y), z))
        r = b.select(adjust, b.add(r, y), r) if is_mod else b.sub(q, b.zext(adjust, x.type))
    if by_zero is not None:
        if by_minus_one is not None and not is_mod:
            r = b.select(by_minus_one, b.neg(r), r)
        r = b.select(by_zero, z, r)
    return r


def shift(b: ir.IRBuilder, left: bool, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
    """x << y or x >> y (arithmetic for a signed dtype). LLVM's shift by a count outside [0, bits) is poison; here it
    shifts every bit out, as te defines it: 0, or -1 for a signed negative x shifted right. A negative count
    compares as a huge unsigned one."""
    bits = _width(x.type)
    fits = b.icmp_unsigned("<", y, splat_const(y, bits))
    if not left and dtypes.is_signed(dtype):  # shifting by bits - 1 already fills every bit with the sign
        return b.ashr(x, b.select(fits, y, splat_const(y, bits - 1)))
    # select does not pass on the poison of the operand it does not choose
    return b.select(fits, b.shl(x, y) if left else b.lshr(x, y), zero(x.type))
