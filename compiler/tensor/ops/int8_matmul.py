"""The integer matmul in the form the CPU's 4-wide u8 x s8 dot product (VNNI `vpdpbusd`) computes: a u8 activation
times an s8 weight packed at compile time as ceil(K/4) x N x 4, so the 4 k of one output column are 4 adjacent
bytes and one 64-byte vector holds 16 columns x 4 k. The packed weight's columns are padded with zeros to a
multiple of 16 (`COLUMNS`), so every column block fills whole vectors; the result keeps the real N.

The reduction runs over k/4 only; its body spells the 4 products out (`dot4`), so every schedule keeps the 4 k
innermost, inside one lane, and the CPU codegen turns `acc + dot4` over 16 (or 8) int32 lanes into one `vpdpbusd`
(codegen/dot4.py). A K that is not a multiple of 4 leaves a tail of 1-3 products, added in the epilogue.

Zero points fold into terms outside the dot product (all int32, exact):
    sum_k (a - za)(w - zw) = sum_k a*w - za * Sw[n] - zw[n] * (Ra[m] - K * za)
with Sw[n] = sum_k w[k, n] (a constant, from `pack_int8_weight`) and Ra[m] = sum_k a[m, k] (a stage of its own,
only when some zw is nonzero). Constant zero points fold into one per-column `col` term at pack time. An s8
activation is shifted to u8 by +128 (its zero point with it); a u8 weight is shifted to s8 by -128 likewise.
"""

from __future__ import annotations

from collections.abc import Sequence

from compiler.base.errors import InvalidExpr
from compiler.model.int8_layout import COLUMNS, DOT, PackedInt8Weight, pack_int8_conv_weight, pack_int8_weight
from compiler.tensor import te
from compiler.tensor.ops.checks import _dims, _dtype_in, _input
from compiler.tensor.ops.nn import nchwc_to_nchw
from compiler.tensor.ops.quantized import _saturate

__all__ = [
    "COLUMNS",
    "DOT",
    "INT8_OPS",
    "PackedInt8Weight",
    "int8_conv2d_nchwc",
    "int8_matmul",
    "pack_int8_conv_weight",
    "pack_int8_weight",
    "packed_conv_integer",
    "packed_matmul_integer",
    "depthwise_int8_nchwc",
]
Ins = Sequence[te.Tensor | None]


def dot4(a: te.Tensor, w: te.Tensor, row: tuple, n: te.Expr, ko: te.Expr | int, count: int = DOT) -> te.Expr:
    """sum_{j < count} int32(a[row, 4*ko + j]) * int32(w[ko, n, j]): the products one int32 lane of `vpdpbusd`
    adds."""
    out: te.Expr | None = None
    for j in range(count):
        p = te.cast("int32", a[(*row, ko * DOT + j)]) * te.cast("int32", w[ko, n, j])
        out = p if out is None else out + p
    assert out is not None
    return out


def _per(t: te.Tensor | None, i, what: str, extent: int) -> te.Expr | None:
    """int32 of t's only element, or t[i] for a 1-D t of `extent` elements."""
    if t is None:
        return None
    if t.ndim == 0:
        return te.cast("int32", t[()])
    if t.ndim == 1 and t.shape[0] == 1:
        return te.cast("int32", t[0])
    if t.ndim == 1 and t.shape[0] == extent:
        return te.cast("int32", t[i])
    raise InvalidExpr(f"int8_matmul: {what} {t.name} ({_dims(t)}) must be one value or 1-D of {extent}")


def int8_matmul(
    a: te.Tensor,
    w: te.Tensor,
    col: te.Tensor | None = None,
    a_zero: te.Tensor | None = None,
    w_sum: te.Tensor | None = None,
    w_zero: te.Tensor | None = None,
    n: int | None = None,
    name: str = "int8_matmul",
) -> te.Tensor:
    """C[..., m, n] = sum_k a[..., m, k] * w[k, n] + col[n] - a_zero[m] * w_sum[n] - w_zero[n] * (Ra[m] - K *
    a_zero[m]), int32, for a u8 / s8 activation `a` (..., M x K) and an s8 weight packed ceil(K/4) x N x 4
    (`pack_int8_weight`), of which the first `n` columns are real (default: all). `a_zero` (a run-time zero point:
    one value or one per row) needs `w_sum`."""
    op = "int8_matmul"
    _dtype_in(op, a, ("uint8", "int8"))
    _dtype_in(op, w, ("int8",))
    if a.ndim < 2 or w.ndim != 3 or w.shape[2] != DOT:
        raise InvalidExpr(f"{op}: a {_dims(a)} must be ... x M x K and w {_dims(w)} ceil(K/4) x N x 4")
    K, (k4, n_pad, _) = a.shape[-1], w.shape
    N = n_pad if n is None else n
    if not 0 < N <= n_pad:
        raise InvalidExpr(f"{op}: n={n} columns of a weight of {n_pad}")
    if k4 != -(-K // DOT):
        raise InvalidExpr(f"{op}: a has K={K} columns, so w must have {-(-K // DOT)} rows of 4, not {k4}")
    if a_zero is not None and w_sum is None:
        raise InvalidExpr(f"{op}: a run-time activation zero point needs the weight's column sums (w_sum)")
    shift = a.dtype == "int8"
    if shift:  # s8 → u8: a + 128 (its zero point moves with it: pack_int8_weight's col, or az below)
        src = a
        a = te.compute(a.shape, lambda *i: te.cast("uint8", te.cast("int32", src[i]) + 128), f"{name}_u8", "elemwise")
    shape, full, tail = (*a.shape[:-1], N), K // DOT, K % DOT
    lanes = (*a.shape[:-1], n_pad)  # the dot product runs over the padded columns: whole vectors
    dot = None
    if full:
        ko = te.reduce_axis(full, "ko")
        dot = te.compute(lanes, lambda *i: te.sum(dot4(a, w, i[:-1], i[-1], ko), axis=ko), f"{name}_dot", "int8_dot")
    row_sum = None
    if w_zero is not None:
        k = te.reduce_axis(K, "k")
        row_sum = te.compute(a.shape[:-1], lambda *i: te.sum(te.cast("int32", a[(*i, k)]), axis=k), f"{name}_rsum")
    M = a.shape[-2]

    def body(*i):
        row, n = i[:-1], i[-1]
        v = dot[i] if dot is not None else te.const(0, "int32")
        if tail:
            v = v + dot4(a, w, row, n, full, tail)
        c = _per(col, n, "col", N)
        if c is not None:
            v = v + c
        az = _per(a_zero, row[-1], "a_zero", M)
        if az is not None:
            az = az + 128 if shift else az
            v = v - az * _per(w_sum, n, "w_sum", N)
        zw = _per(w_zero, n, "w_zero", N)
        if zw is not None:
            ra = row_sum[row]
            v = v - zw * (ra if az is None else ra - az * K)
        return v

    return te.compute(shape, body, name, "elemwise")


def packed_matmul_integer(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """tilefarm's PackedMatMulInteger: int8_matmul(A, W, col, a_zero, w_sum, w_zero), the MatMulInteger of a
    constant weight packed by `pack_int8_weight` (inputs after A and W optional; attribute n: the real columns)."""
    a, w = _input("PackedMatMulInteger", ins, 0, "A"), _input("PackedMatMulInteger", ins, 1, "W")
    col, a_zero, w_sum, w_zero = (ins[i] if len(ins) > i else None for i in range(2, 6))
    return [int8_matmul(a, w, col, a_zero, w_sum, w_zero, attrs.get("n"), name)]


def int8_conv2d_nchwc(
    data: te.Tensor,
    w: te.Tensor,
    col: te.Tensor | None = None,
    stride: int = 1,
    padding: int = 0,
    a_zero: int = 0,
    name: str = "int8_conv",
    w_zero: te.Tensor | None = None,
) -> te.Tensor:
    """ConvInteger in the dot-product form: u8 data N x C'/4 x H x W x 4 (NCHW4c) with the constant zero point
    `a_zero` (the padding value, so that padded taps add nothing after the correction), an s8 weight packed by
    `pack_int8_conv_weight`, and `col` (its per-channel term); int32 N x F'/16 x OH x OW x 16 (NCHW16c). A weight
    zero point `w_zero` (F' int32 values) is subtracted times the sum of each window's data (its K term is in `col`)."""
    op = "int8_conv2d_nchwc"
    _dtype_in(op, data, ("uint8",))
    _dtype_in(op, w, ("int8",))
    if data.ndim != 5 or data.shape[4] != DOT or w.ndim != 6 or w.shape[4:] != (COLUMNS, DOT):
        raise InvalidExpr(
            f"{op}: data {_dims(data)} must be N x C/4 x H x W x 4, w {_dims(w)} F/16 x C/4 x KH x KW x 16 x 4"
        )
    N, C4, H, W, _ = data.shape
    FB, C4w, KH, KW, _, _ = w.shape
    if C4w != C4:
        raise InvalidExpr(f"{op}: data has {C4} channel blocks of 4, w {C4w}")
    src = data
    if padding:
        fill = te.const(a_zero, "uint8")

        def pad_body(n, c, y, x, j):
            inside = (y >= padding) & (y < H + padding) & (x >= padding) & (x < W + padding)
            return te.select(inside, data[n, c, y - padding, x - padding, j], fill)

        src = te.compute((N, C4, H + 2 * padding, W + 2 * padding, DOT), pad_body, f"{name}_pad", "injective,pad")
    OH, OW = (src.shape[2] - KH) // stride + 1, (src.shape[3] - KW) // stride + 1
    ko, ky, kx = te.reduce_axis(C4, "ko"), te.reduce_axis(KH, "ky"), te.reduce_axis(KW, "kx")

    def body(n, fo, oy, ox, fi):
        out: te.Expr | None = None
        for j in range(DOT):
            a = te.cast("int32", src[n, ko, oy * stride + ky, ox * stride + kx, j])
            p = a * te.cast("int32", w[fo, ko, ky, kx, fi, j])
            out = p if out is None else out + p
        return te.sum(out, axis=(ko, ky, kx))

    dot = te.compute((N, FB, OH, OW, COLUMNS), body, f"{name}_dot", "int8_dot")
    if col is None and w_zero is None:
        return dot
    window = None
    if w_zero is not None:
        rc, ry, rx, rj = (
            te.reduce_axis(C4, "rc"),
            te.reduce_axis(KH, "ry"),
            te.reduce_axis(KW, "rx"),
            te.reduce_axis(DOT, "rj"),
        )
        window = te.compute(
            (N, OH, OW),
            lambda n, y, x: te.sum(
                te.cast("int32", src[n, rc, y * stride + ry, x * stride + rx, rj]), axis=(rc, ry, rx, rj)
            ),
            f"{name}_wsum",
        )

    def epilogue(n, fo, y, x, fi):
        v = dot[n, fo, y, x, fi]
        if col is not None:
            v = v + col[fo * COLUMNS + fi]
        if window is not None and w_zero is not None:
            v = v - w_zero[fo * COLUMNS + fi] * window[n, y, x]
        return v

    return te.compute(dot.shape, epilogue, name, "elemwise")


def to_nchw4c(x: te.Tensor, blocks: int, a_zero: int, name: str) -> te.Tensor:
    """u8 data N x blocks x H x W x 4 (NCHW4c) from NCHW u8 / s8 data (an s8 value shifted by +128; channels past C
    read the zero point `a_zero`, which the weight's zero channels multiply away) or from NCHW16c u8 data."""
    if x.ndim == 5:  # NCHW16c: four channel blocks of 4 in each block of 16
        _dtype_in("PackedConvInteger", x, ("uint8",))
        if x.shape[1] * x.shape[4] != blocks * DOT:
            raise InvalidExpr(f"PackedConvInteger: data {_dims(x)} has not the {blocks * DOT} channels of its weight")
        per = x.shape[4] // DOT
        return te.compute(
            (x.shape[0], blocks, *x.shape[2:4], DOT),
            lambda n, c, y, w, j: x[n, c // per, y, w, (c % per) * DOT + j],
            f"{name}_nchw4c",
            "injective",
        )
    _dtype_in("PackedConvInteger", x, ("uint8", "int8"))
    N, C, H, W = x.shape
    if not (blocks - 1) * DOT < C <= blocks * DOT:
        raise InvalidExpr(f"PackedConvInteger: data {_dims(x)} has not the {blocks * DOT} channels of its weight")

    def body(n, c, y, w, j):
        ch = c * DOT + j
        v = x[n, te.minimum(ch, te.const(C - 1, ch.dtype)) if C % DOT else ch, y, w]
        if x.dtype == "int8":
            v = te.cast("uint8", te.cast("int32", v) + 128)
        return te.select(ch < C, v, te.const(a_zero, "uint8")) if C % DOT else v

    return te.compute((N, blocks, H, W, DOT), body, f"{name}_nchw4c", "injective")


# x rounded half to even by the float32 adder itself: for |x| <= 2^22, x + 1.5 * 2^23 lies where the ulp is 1, so
# the sum is round_half_even(x) + 1.5 * 2^23 and the difference that integer, exactly. x is first clamped to
# ±2^22 (beyond, both saturate alike), which also keeps LLVM from contracting the product and the sum into one FMA
# (one rounding where Requantize rounds the float32 product). Unlike round_half_even's selects, it leaves no branch
# in which a reader's vectorized select must load the inlined accumulator, multiplier and bias under a lane mask
# (a QLinearAdd reading the conv repeats its operand in each branch of its own rounding)
ROUNDER = te.const(1.5 * 2.0**23, "float32")
LIMIT = te.const(2.0**22, "float32")


def requantize_nchwc(acc: te.Tensor, ins: Sequence[te.Tensor | None], attrs: dict, name: str) -> te.Tensor:
    """Requantize (compiler/tensor/ops/quantized.py, the same steps in the same order, its rounding as ROUNDER's
    comment says: the same saturated results) of an NCHW16c int32 `acc`;
    the multiplier, zero point and bias (`ins`, or attributes of the same names when one value) one value or one
    per channel (F' values, the padded channels' included)."""
    consts = {"multiplier": "float32", "zero_point": "float32", "bias": "int32"}

    def per(t: te.Tensor | None, fo: te.Expr, fi: te.Expr, key: str) -> te.Expr | None:
        if t is None:
            return te.const(attrs[key], consts[key]) if key in attrs else None
        if t.ndim == 0:
            return t[()]
        if t.ndim == 1 and t.shape[0] == 1:
            return t[0]
        if t.ndim == 1 and t.shape[0] == acc.shape[1] * acc.shape[4]:
            return t[fo * acc.shape[4] + fi]
        raise InvalidExpr(f"PackedConvInteger: {t.name} ({_dims(t)}) must be one value or one per channel")

    mult, zero, bias = ins
    if mult is None and "multiplier" not in attrs:
        raise InvalidExpr(f"PackedConvInteger {name}: a Requantize (attribute to) needs a multiplier")

    def body(n, fo, y, x, fi):
        b = per(bias, fo, fi, "bias")
        v = te.cast("float32", acc[n, fo, y, x, fi] if b is None else acc[n, fo, y, x, fi] + b)
        x = te.minimum(te.maximum(v * per(mult, fo, fi, "multiplier"), -LIMIT), LIMIT)
        q = (x + ROUNDER) - ROUNDER
        z = per(zero, fo, fi, "zero_point")
        return _saturate(q if z is None else q + te.cast("float32", z), attrs["to"])

    return te.compute(acc.shape, body, name, "elemwise")


def depthwise_int8_nchwc(x: te.Tensor, w: te.Tensor, stride: int, padding: int, a_zero: int, name: str) -> te.Tensor:
    """A depthwise ConvInteger on 16 channel lanes: data NCHW (u8 / s8) or NCHW16c (u8) with the u8 zero point
    `a_zero`, taken as int32(x) - zero point (0 in the padding), times the int32 weight C'/16 x KH x KW x 16 already
    minus its zero point (`pack_int8_depthwise_weight`); int32 N x C'/16 x OH x OW x 16."""
    op = "PackedConvInteger"
    _dtype_in(op, w, ("int32",))
    CB, KH, KW, _ = w.shape
    if x.ndim == 5:
        _dtype_in(op, x, ("uint8",))
        N, H, W, C = x.shape[0], x.shape[2], x.shape[3], x.shape[1] * x.shape[4]
        if x.shape[1] != CB or x.shape[4] != COLUMNS:
            raise InvalidExpr(f"{op}: data {_dims(x)} must be N x {CB} x H x W x {COLUMNS} for w {_dims(w)}")
    else:
        _dtype_in(op, x, ("uint8", "int8"))
        N, C, H, W = x.shape
        if not (CB - 1) * COLUMNS < C <= CB * COLUMNS:
            raise InvalidExpr(f"{op}: data {_dims(x)} has not the {CB * COLUMNS} channels of w {_dims(w)}")
    zero = a_zero - (128 if x.dtype == "int8" else 0)  # the zero point of x as it is

    def body(n, cb, y, xx, ci):
        ch = cb * COLUMNS + ci
        iy, ix = y - padding, xx - padding
        inside = (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
        if x.ndim == 5:
            v = x[n, cb, iy, ix, ci]
        else:
            inside = inside & (ch < C) if C % COLUMNS else inside
            v = x[n, te.minimum(ch, te.const(C - 1, ch.dtype)) if C % COLUMNS else ch, iy, ix]
        return te.select(inside, te.cast("int32", v) - zero, te.const(0, "int32"))

    src = te.compute((N, CB, H + 2 * padding, W + 2 * padding, COLUMNS), body, f"{name}_pad", "injective,pad")
    OH, OW = (H + 2 * padding - KH) // stride + 1, (W + 2 * padding - KW) // stride + 1
    ky, kx = te.reduce_axis(KH, "ky"), te.reduce_axis(KW, "kx")
    return te.compute(
        (N, CB, OH, OW, COLUMNS),
        lambda n, cb, y, xx, ci: te.sum(
            src[n, cb, y * stride + ky, xx * stride + kx, ci] * w[cb, ky, kx, ci], axis=(ky, kx)
        ),
        name,
        "depthwise_conv2d_nchwc",
    )


def packed_conv_integer(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """tilefarm's PackedConvInteger(X, W, col?, w_zero?, multiplier?, zero_point?, bias?): ConvInteger by
    `int8_conv2d_nchwc` of data NCHW (u8 / s8) or NCHW16c (u8, `data_layout`), the weight packed by
    `pack_int8_conv_weight`, its per-channel term `col` and the weight's zero point per output channel; with `to`,
    the Requantize that read the conv computed on the NCHW16c accumulators (one-value parameters as attributes
    multiplier, zero_point, bias). Attributes
    stride, padding, a_zero (the u8 data's zero point), channels (F); the result NCHW, or NCHW16c (`out_layout`)."""
    op = "PackedConvInteger"
    x, w = _input(op, ins, 0, "X"), _input(op, ins, 1, "W")
    col, w_zero, mult, zero, bias = (ins[i] if len(ins) > i else None for i in range(2, 7))
    if w.ndim != (4 if "group" in attrs else 6):
        want = "C/16 x KH x KW x 16 (depthwise)" if "group" in attrs else "F/16 x C/4 x KH x KW x 16 x 4"
        raise InvalidExpr(f"{op}: w {_dims(w)} must be {want}")
    if (x.ndim == 5) != (attrs.get("data_layout") == "NCHWc"):
        raise InvalidExpr(f"{op}: data {_dims(x)} does not match data_layout {attrs.get('data_layout', 'NCHW')}")
    stride, padding, a_zero = attrs["stride"], attrs["padding"], attrs["a_zero"]
    if "group" in attrs:
        out = depthwise_int8_nchwc(x, w, stride, padding, a_zero, f"{name}_acc")
    else:
        data = to_nchw4c(x, w.shape[1], a_zero, name)
        out = int8_conv2d_nchwc(data, w, col, stride, padding, a_zero, f"{name}_acc", w_zero)
    if "to" in attrs:
        out = requantize_nchwc(out, (mult, zero, bias), attrs, f"{name}_q")
    if attrs.get("out_layout") == "NCHWc":
        return [out]
    return [nchwc_to_nchw(out, name, attrs["channels"])]


INT8_OPS = {"PackedMatMulInteger": packed_matmul_integer, "PackedConvInteger": packed_conv_integer}
