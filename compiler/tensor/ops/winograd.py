"""Winograd convolution F(m x m, 3 x 3): a 3x3, stride-1 conv in (m + 2)^2 / (9 m^2) of the direct multiplies.

Each m x m output tile comes from a (m + 2) x (m + 2) input tile d and the 3x3 filter g as Y = A^T [(G g G^T) . (B^T d
B)] A (Lavin & Gray, 2015). The filter transform U = G g G^T is done once at compile time (`winograd_weight`, called
by the `winograd_convs` pass); what runs is the shape TVM's auto-scheduler tunes, with each 2-D transform done one
side at a time:

- `pack_rows`, `pack`: V[e, u, p, co, ci] = sum_rb (sum_ra B^T[e, ra] d_p[ra, rb]) B^T[u, rb] for every tile p and
  input channel;
- `bgemm`: M[e, u, p, fo, fi] = sum_c V[e, u, p, c] U[e, u, fo, c, fi], (m + 2)^2 independent matrix products with
  the output channels' lanes innermost, as the blocked direct conv has them;
- `inverse_rows`, `inverse`: Y[vh, vw, p, fo, fi] = sum_sb (sum_sa A^T[vh, sa] M[sa, sb, p, fo, fi]) A^T[vw, sb],
  then the output is gathered tile by tile into N x F/b x OH x OW x b (or straight into N x F x OH x OW when not
  `out_blocked`; the graph always keeps a WinogradConv's result blocked, see compiler.model.layout).

The four transform stages have one fixed loop structure (schedule.matrix_transform): tile loops unrolled, channel
lanes vectorized, the row half computed inside the column half.

The transform matrices are small constant inputs (B^T and A^T, read from L1), so the code stays small whatever
the scheduler unrolls; TVM writes them into the expression as select chains instead, which once unrolled fold into
constants, but here made candidates take up to 10 s to compile (some past the 15 s build timeout). They come from
the Cook-Toom construction over the points 0, 1, -1, 2, -2, ... and infinity, in exact rational arithmetic.
"""

from __future__ import annotations

from compiler.base.errors import InvalidExpr
from compiler.model.graph import NCHWC
from compiler.model.winograd import KERNEL
from compiler.tensor import te
from compiler.tensor.ops.checks import FLOATS, _dims, _dtype_in, _input, _padding, _rank, _same_dtype
from compiler.tensor.ops.nn import Ins, bias_add_nchw, bias_add_nchwc, pad

# the tag of a transform stage: axes (i, j, *tiles and channel blocks, lane), i and j within a tile, a reduction over
# a tile side; compiler.schedule.matrix_transform gives such stages their loop structure
MATRIX_TRANSFORM = "matrix_transform"
def conv2d_winograd(
    data: te.Tensor,
    U: te.Tensor,
    BT: te.Tensor,
    AT: te.Tensor,
    padding=1,
    name: str = "conv2d",
    out_blocked: bool = False,
) -> te.Tensor:
    """3x3 stride-1 conv of NCHW (N x C x H x W) or NCHWc (N x C/b x H x W x b) data with a weight transformed by
    `winograd_weight` (a x a x F/b x C x b), given the transform matrices B^T (a x a) and A^T (m x a) as inputs
    (`winograd_matrices`): N x F/b x OH x OW x b, or N x F x OH x OW unless `out_blocked`."""
    op = "conv2d_winograd"
    _rank(op, U, 5, "transformed weight")
    _rank(op, AT, 2, "A^T")
    for t in (U, BT, AT):
        _same_dtype(op, data, t)
    a, a2, Fb, C, b = U.shape
    m = AT.shape[0]
    if BT.shape != (a, a) or AT.shape != (m, a) or a != m + KERNEL - 1 or a2 != a:
        raise InvalidExpr(
            f"{op}: weight {_dims(U)}, B^T {_dims(BT)} and A^T {_dims(AT)} are not the transforms of one"
            f" F(m x m, 3 x 3) (a x a x F/b x C x b, a x a and m x a with a = m + 2)"
        )
    if data.ndim == 5:
        N, Cb, H, W, cb = data.shape
        if Cb * cb != C:
            raise InvalidExpr(f"{op}: weight {_dims(U)} has {C} input channels, data {_dims(data)} has {Cb * cb}")
    else:
        _rank(op, data, 4, "data")
        N, Cd, H, W = data.shape
        cb = b
        if Cd != C or C % cb:
            raise InvalidExpr(f"{op}: data {_dims(data)} must have the weight's {C} input channels, a multiple of {cb}")
        Cb = C // cb
    pt, pl, pb, pr = _padding(op, padding)
    OH, OW = H + pt + pb - KERNEL + 1, W + pl + pr - KERNEL + 1
    if OH < 1 or OW < 1:
        raise InvalidExpr(f"{op}: data {_dims(data)} with padding {padding} is smaller than the 3x3 kernel")
    nH, nW = -(-OH // m), -(-OW // m)
    P = N * nH * nW
    # zeros around the image, and past its end up to the last whole tile
    Hp, Wp = nH * m + 2, nW * m + 2
    if data.ndim == 5:
        src = pad(data, (0, 0, pt, pl, 0), (0, 0, Hp - H - pt, Wp - W - pl, 0), name=f"{name}_pad")
    else:
        # NCHW data is padded into channel blocks on the way (onnxruntime's ReorderInput, merged with the padding):
        # the pack then reads cb channels of a pixel as one vector, where NCHW would scatter them H x W apart
        def padded_blocks(n, co, y, x, ci):
            inside = (y >= pt) & (y < pt + H) & (x >= pl) & (x < pl + W)
            return te.select(inside, data[n, co * cb + ci, y - pt, x - pl], te.const(0.0, data.dtype))

        src = te.compute((N, Cb, Hp, Wp, cb), padded_blocks, name=f"{name}_pad", tag="injective")

    def tile(p):
        return p // (nH * nW), (p // nW) % nH, p % nW

    # Each 2-D transform X^T d X is done one side at a time (rows, then columns): 2 a^3 multiply-adds per tile and
    # channel instead of a^4 for the pack (432 against 1,296 with a = 6), a m (a + m) instead of a^2 m^2 for the
    # inverse (240 against 576). The four stages are MATRIX_TRANSFORMs: schedule.matrix_transform schedules them.
    ra, rb = te.reduce_axis(a, "ra"), te.reduce_axis(a, "rb")

    def pack_rows(e, j, p, co, ci):
        n, th, tw = tile(p)
        return te.sum(BT[e, ra] * src[n, co, th * m + ra, tw * m + j, ci], axis=[ra])

    T = te.compute((a, a, P, Cb, cb), pack_rows, name=f"{name}_pack_rows", tag=MATRIX_TRANSFORM)
    V = te.compute(
        (a, a, P, Cb, cb),
        lambda e, u, p, co, ci: te.sum(T[e, rb, p, co, ci] * BT[u, rb], axis=[rb]),
        name=f"{name}_pack",
        tag=MATRIX_TRANSFORM,
    )
    rc = te.reduce_axis(C, "rc")
    M = te.compute(
        (a, a, P, Fb, b),
        lambda e, u, p, fo, fi: te.sum(V[e, u, p, rc // cb, rc % cb] * U[e, u, fo, rc, fi], axis=[rc]),
        name=f"{name}_bgemm",
        tag="winograd_bgemm",
    )
    sa, sb = te.reduce_axis(a, "sa"), te.reduce_axis(a, "sb")
    S = te.compute(
        (m, a, P, Fb, b),
        lambda vh, j, p, fo, fi: te.sum(AT[vh, sa] * M[sa, j, p, fo, fi], axis=[sa]),
        name=f"{name}_inverse_rows",
        tag=MATRIX_TRANSFORM,
    )
    inverse = te.compute(
        (m, m, P, Fb, b),
        lambda vh, vw, p, fo, fi: te.sum(S[vh, sb, p, fo, fi] * AT[vw, sb], axis=[sb]),
        name=f"{name}_inverse",
        tag=MATRIX_TRANSFORM,
    )

    def tile_of(n, y, x):
        return (n * nH + y // m) * nW + x // m

    if out_blocked:
        return te.compute(
            (N, Fb, OH, OW, b),
            lambda n, fo, y, x, fi: inverse[y % m, x % m, tile_of(n, y, x), fo, fi],
            name=name,
            tag="injective",
        )
    # one gather straight into NCHW: a blocked result copied to NCHW after it would be a second injective stage,
    # and computing the first inside the second's loops recomputed it for every channel
    return te.compute(
        (N, Fb * b, OH, OW),
        lambda n, f, y, x: inverse[y % m, x % m, tile_of(n, y, x), f // b, f % b],
        name=name,
        tag="injective",
    )


def winograd_conv(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """tilefarm's WinogradConv (made by the `winograd_convs` pass from a 3x3 stride-1 Conv with a constant weight):
    inputs X, the transformed weight (a x a x F/b x C x b), an optional bias, B^T and A^T; attributes `pads`, and
    `data_layout` / `out_layout` as BlockedConv has them."""
    x, w = _input("WinogradConv", ins, 0, "X"), _input("WinogradConv", ins, 1, "W")
    bias = ins[2] if len(ins) > 2 else None
    bt, at = _input("WinogradConv", ins, 3, "B^T"), _input("WinogradConv", ins, 4, "A^T")
    _dtype_in("WinogradConv", x, FLOATS)
    if x.ndim != (5 if attrs.get("data_layout") == NCHWC else 4):
        raise InvalidExpr(
            f"WinogradConv: data {_dims(x)} does not match data_layout {attrs.get('data_layout', 'NCHW')}"
        )
    out_blocked = attrs.get("out_layout") == NCHWC
    conv_name = name if bias is None else f"{name}_conv"
    out = conv2d_winograd(x, w, bt, at, attrs.get("pads") or (0, 0, 0, 0), name=conv_name, out_blocked=out_blocked)
    if bias is None:
        return [out]
    return [bias_add_nchwc(out, bias, name=name) if out_blocked else bias_add_nchw(out, bias, name=name)]


WINOGRAD_OPS = {"WinogradConv": winograd_conv}
