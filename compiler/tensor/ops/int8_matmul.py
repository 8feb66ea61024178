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
from dataclasses import dataclass

import numpy as np

from compiler.base.errors import InvalidExpr
from compiler.tensor import te
from compiler.tensor.ops.checks import _dims, _dtype_in, _input

DOT = 4  # k per int32 lane of the dot product
COLUMNS = 16  # the packed weight's columns come in multiples of this: the int32 lanes of one 512-bit vector
Ins = Sequence[te.Tensor | None]


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


def pack_int8_conv_weight(w: np.ndarray, a_zero: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A conv weight F x C x KH x KW (int8) packed for `int8_conv2d_nchwc` as F'/16 x C'/4 x KH x KW x 16 x 4 (F', C'
    rounded up, zeros past F and C), and its per-channel term -a_zero * sum of the filter (F' values)."""
    if w.ndim != 4 or w.dtype != np.int8:
        raise InvalidExpr(f"pack_int8_conv_weight: w must be a 4-D int8 array, got {w.dtype} {list(w.shape)}")
    F, C, KH, KW = w.shape
    fb, cb = -(-F // COLUMNS), -(-C // DOT)
    full = np.zeros((fb * COLUMNS, cb * DOT, KH, KW), np.int8)
    full[:F, :C] = w
    packed = full.reshape(fb, COLUMNS, cb, DOT, KH, KW).transpose(0, 2, 4, 5, 1, 3)
    col = -int(a_zero) * full.astype(np.int64).sum(axis=(1, 2, 3))
    return np.ascontiguousarray(packed), col.astype(np.int32)


def int8_conv2d_nchwc(
    data: te.Tensor,
    w: te.Tensor,
    col: te.Tensor | None = None,
    stride: int = 1,
    padding: int = 0,
    a_zero: int = 0,
    name: str = "int8_conv",
) -> te.Tensor:
    """ConvInteger in the dot-product form: u8 data N x C'/4 x H x W x 4 (NCHW4c) with the constant zero point
    `a_zero` (the padding value, so that padded taps add nothing after the correction), an s8 weight packed by
    `pack_int8_conv_weight`, and `col` (its per-channel term); int32 N x F'/16 x OH x OW x 16 (NCHW16c)."""
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
    if col is None:
        return dot
    return te.compute(
        dot.shape, lambda n, fo, y, x, fi: dot[n, fo, y, x, fi] + col[fo * COLUMNS + fi], name, "elemwise"
    )
