"""Convolution, padding and pooling (NCHW), plus the ONNX Conv / ConvTranspose / pooling builders."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

from compiler.base.errors import InvalidExpr
from compiler.model.graph import NCHWC, pooled_extent
from compiler.tensor import te
from compiler.tensor.ops.checks import (
    FLOATS,
    Pair,
    _dims,
    _dtype_in,
    _input,
    _lanes,
    _out_extent,
    _padding,
    _pair,
    _rank,
    _same_dtype,
    _scale,
)

Ins = Sequence[te.Tensor | None]


def pad(
    X: te.Tensor, pad_before: Sequence[int], pad_after: Sequence[int], value: float = 0.0, name: str = "pad"
) -> te.Tensor:
    """X surrounded by `value`: pad_before[d] elements before and pad_after[d] after along each dim d."""
    before, after = tuple(pad_before), tuple(pad_after)
    if len(before) != X.ndim or len(after) != X.ndim:
        raise InvalidExpr(
            f"pad: {X.name} is {X.ndim}-D but got pad_before {before} and pad_after {after};"
            f" give one amount per dimension"
        )
    if any(not isinstance(p, int) or p < 0 for p in before + after):
        raise InvalidExpr(f"pad: padding amounts must be ints >= 0, got pad_before {before}, pad_after {after}")
    fill = te.const(value, X.dtype)

    def body(*idx):
        src, inside = [], []
        for i, b, a, n in zip(idx, before, after, X.shape):
            src.append(i - b if b else i)
            # test only the sides that have padding, so an unpadded dim costs nothing
            inside += ([i >= b] if b else []) + ([i < b + n] if a else [])
        if not inside:
            return X[tuple(src)]
        # Select is lazy: the load runs only where the index is in bounds
        return te.select(functools.reduce(operator.and_, inside), X[tuple(src)], fill)

    shape = tuple(n + b + a for n, b, a in zip(X.shape, before, after))
    return te.compute(shape, body, name=name, tag="injective,pad")


def _window(op: str, data: te.Tensor, kernel: tuple[int, int], stride: Pair, padding: Pair, dilation: Pair, name: str):
    """A 2-D convolution's padded input (its own stage, as in TVM, so the scheduler decides whether to inline it),
    output extents, strides and dilations. `data` is NCHW, or NCHWc (5-D, channel lanes last, never padded)."""
    sh, sw = _pair(op, "stride", stride, 1)
    dh, dw = _pair(op, "dilation", dilation, 1)
    pt, pl, pb, pr = _padding(op, padding)
    (H, W), (KH, KW) = data.shape[2:4], kernel
    OH = _out_extent(op, "height", H, pt + pb, KH, dh, sh)
    OW = _out_extent(op, "width", W, pl + pr, KW, dw, sw)
    lanes = (0,) * (data.ndim - 4)
    padded = pt or pl or pb or pr
    src = pad(data, (0, 0, pt, pl, *lanes), (0, 0, pb, pr, *lanes), name=f"{name}_pad") if padded else data
    return src, (OH, OW), (sh, sw), (dh, dw)


def conv2d_nchw(
    data: te.Tensor,
    weight: te.Tensor,
    stride: Pair = 1,
    padding: Pair = 0,
    dilation: Pair = 1,
    groups: int = 1,
    name: str = "conv2d",
) -> te.Tensor:
    """2-D convolution, data NxCxHxW, weight Fx(C/groups)xKHxKW; depthwise (no channel reduction) when groups == C."""
    op = "conv2d_nchw"
    _rank(op, data, 4, "data")
    _rank(op, weight, 4, "weight")
    _same_dtype(op, data, weight)
    (N, C), (F, Cg, KH, KW) = data.shape[:2], weight.shape
    if not isinstance(groups, int) or groups < 1 or C % groups or F % groups:
        raise InvalidExpr(
            f"{op}: groups={groups} must be a positive int dividing both the input channels ({C})"
            f" and the output channels ({F})"
        )
    if Cg != C // groups:
        raise InvalidExpr(
            f"{op}: weight {_dims(weight)} has {Cg} input channels per group, but data has {C}"
            f" channels in {groups} group(s), so it needs {C // groups}"
        )
    src, (OH, OW), (sh, sw), (dh, dw) = _window(op, data, (KH, KW), stride, padding, dilation, name)
    ry, rx = te.reduce_axis(KH, "ry"), te.reduce_axis(KW, "rx")

    if groups == C and groups > 1:
        mult = F // C  # channel multiplier: output channel f reads input channel f // mult
        return te.compute(
            (N, F, OH, OW),
            lambda n, f, y, x: te.sum(
                src[n, f // mult if mult > 1 else f, _scale(y, sh) + _scale(ry, dh), _scale(x, sw) + _scale(rx, dw)]
                * weight[f, 0, ry, rx],
                axis=[ry, rx],
            ),
            name=name,
            tag="depthwise_conv2d_nchw",
        )

    rc = te.reduce_axis(Cg, "rc")
    Fg = F // groups

    def channel(f):
        return rc if groups == 1 else f // Fg * Cg + rc

    return te.compute(
        (N, F, OH, OW),
        lambda n, f, y, x: te.sum(
            src[n, channel(f), _scale(y, sh) + _scale(ry, dh), _scale(x, sw) + _scale(rx, dw)] * weight[f, rc, ry, rx],
            axis=[rc, ry, rx],
        ),
        name=name,
        tag="conv2d_nchw" if groups == 1 else "group_conv2d_nchw",
    )


def conv2d_nchw_blocked(
    data: te.Tensor,
    weight: te.Tensor,
    stride: Pair = 1,
    padding: Pair = 0,
    dilation: Pair = 1,
    name: str = "conv2d",
    out_blocked: bool = False,
    out_channels: int | None = None,
) -> te.Tensor:
    """conv2d_nchw (groups 1) with the weight laid out F/b x C x KH x KW x b: b output channels innermost, as the
    `block_conv_weights` pass packs it once at compile time. The reduction computes N x F/b x OH x OW x b, so its
    innermost axis is b channels that vector loads of the weight serve whatever the image width (a 7-wide row fills
    a vector only partly): onnxruntime's NCHWc idea.

    `data` is NCHW (N x C x H x W) or already blocked NCHWc (N x C/b x H x W x b, 5-D): then the channel reduction
    is split into blocks rco and lanes rci, so a block of input channels is read contiguously; the weight then comes
    F/b x C/cb x KH x KW x cb x b (`block_conv_input_channels`), so the reduction order rco, ry, rx, rci walks it
    in one contiguous stream, as it walks the data (onnxruntime's and TVM's OIHW16i16o). With `out_blocked`
    the result stays NCHWc (the `propagate_nchwc` pass passes it to the next conv that way); otherwise a copy puts
    it back in NCHW, which the scheduler inlines into the conv's consumer. `out_channels` (F) below F/b x b: the
    weight's last block is padded with zero filters (24 channels computed as 32), and the NCHW copy keeps F of them."""
    op = "conv2d_nchw_blocked"
    if data.ndim == 5:  # NCHWc data: the weight has input-channel blocks too, F/b x C/cb x KH x KW x cb x b
        _rank(op, weight, 6, "weight (for NCHWc data)")
        Fb, Cwb, KH, KW, cwb, b = weight.shape
        if cwb != data.shape[4]:
            raise InvalidExpr(
                f"{op}: weight {_dims(weight)} has input blocks of {cwb}, data {_dims(data)} of {data.shape[4]}"
            )
        N, C, Cw = data.shape[0], data.shape[1] * data.shape[4], Cwb * cwb
    else:
        _rank(op, data, 4, "data")
        _rank(op, weight, 5, "weight")
        (Fb, Cw, KH, KW, b), (N, C) = weight.shape, data.shape[:2]
    _same_dtype(op, data, weight)
    if Cw != C:
        raise InvalidExpr(f"{op}: weight {_dims(weight)} has {Cw} input channels, but data {_dims(data)} has {C}")
    src, (OH, OW), (sh, sw), (dh, dw) = _window(op, data, (KH, KW), stride, padding, dilation, name)
    ry, rx = te.reduce_axis(KH, "ry"), te.reduce_axis(KW, "rx")

    def at(y, x):
        return _scale(y, sh) + _scale(ry, dh), _scale(x, sw) + _scale(rx, dw)

    if data.ndim == 5:
        cb = data.shape[4]
        rco, rci = te.reduce_axis(C // cb, "rco"), te.reduce_axis(cb, "rci")

        def body(n, fo, y, x, fi):
            return te.sum(src[(n, rco, *at(y, x), rci)] * weight[fo, rco, ry, rx, rci, fi], axis=[rco, ry, rx, rci])

    else:
        rc = te.reduce_axis(C, "rc")

        def body(n, fo, y, x, fi):
            return te.sum(src[(n, rc, *at(y, x))] * weight[fo, rc, ry, rx, fi], axis=[rc, ry, rx])

    blocked = te.compute((N, Fb, OH, OW, b), body, name=name, tag="conv2d_nchw_blocked")
    if out_blocked:
        return blocked
    return nchwc_to_nchw(blocked, name=f"{name}_nchw", channels=out_channels)


def depthwise_conv2d_nchwc(
    data: te.Tensor,
    weight: te.Tensor,
    stride: Pair = 1,
    padding: Pair = 0,
    dilation: Pair = 1,
    name: str = "depthwise_conv2d",
    out_blocked: bool = False,
) -> te.Tensor:
    """A depthwise conv2d (groups = channels, one output per channel) with the weight laid out C/b x KH x KW x b, as
    `block_conv_weights` packs it: it computes N x C/b x OH x OW x b, so the b lanes of a channel block are one vector
    and each tap of the window is one multiply-add of vectors (onnxruntime's NCHWc depthwise kernel does the same).
    In NCHW each channel's plane is a separate image, and a row of 7 or 14 pixels fills a vector only partly.

    `data` is NCHW or NCHWc (5-D, lanes b); with `out_blocked` the result stays NCHWc, otherwise it is copied back
    to NCHW, which the scheduler inlines into the consumer."""
    op = "depthwise_conv2d_nchwc"
    _rank(op, weight, 4, "weight")
    _same_dtype(op, data, weight)
    Cb, KH, KW, b = weight.shape
    if data.ndim == 5:
        if data.shape[4] != b:
            raise InvalidExpr(f"{op}: weight {_dims(weight)} has blocks of {b}, data {_dims(data)} of {data.shape[4]}")
        N, C = data.shape[0], data.shape[1] * b
    else:
        _rank(op, data, 4, "data")
        N, C = data.shape[:2]
    if C != Cb * b:
        raise InvalidExpr(f"{op}: weight {_dims(weight)} has {Cb * b} channels, but data {_dims(data)} has {C}")
    src, (OH, OW), (sh, sw), (dh, dw) = _window(op, data, (KH, KW), stride, padding, dilation, name)
    ry, rx = te.reduce_axis(KH, "ry"), te.reduce_axis(KW, "rx")

    def body(n, co, y, x, ci):
        at = (_scale(y, sh) + _scale(ry, dh), _scale(x, sw) + _scale(rx, dw))
        pixel = src[(n, co, *at, ci)] if data.ndim == 5 else src[(n, co * b + ci, *at)]
        return te.sum(pixel * weight[co, ry, rx, ci], axis=[ry, rx])

    blocked = te.compute((N, Cb, OH, OW, b), body, name=name, tag="depthwise_conv2d_nchwc")
    if out_blocked:
        return blocked
    return nchwc_to_nchw(blocked, name=f"{name}_nchw")


def nchwc_to_nchw(data: te.Tensor, name: str = "nchw", channels: int | None = None) -> te.Tensor:
    """An N x C/b x H x W x b (NCHWc) tensor put back in NCHW: a pure re-indexing. `channels` below C/b x b drops the
    last block's padding lanes (a 24-channel value travels in two blocks of 16)."""
    _rank("nchwc_to_nchw", data, 5, "input")
    N, Cb, H, W, b = data.shape
    C = Cb * b if channels is None else channels
    if not (Cb - 1) * b < C <= Cb * b:
        raise InvalidExpr(f"nchwc_to_nchw: {C} channels do not fill the last of the {Cb} blocks of {_dims(data)}")
    return te.compute((N, C, H, W), lambda n, f, y, x: data[n, f // b, y, x, f % b], name=name, tag="injective")


def bias_add_nchwc(x: te.Tensor, bias: te.Tensor, name: str = "bias_add") -> te.Tensor:
    """x[n, co, ..., ci] + bias[co, ci] for an NCHWc x (channel blocks on axis 1, lanes last) and a bias laid out
    C/b x b (read at the stage's own axes, so it stays strictly inlinable and the conv fuses past it)."""
    _same_dtype("bias_add_nchwc", x, bias)
    if bias.shape != (x.shape[1], x.shape[-1]):
        raise InvalidExpr(
            f"bias_add_nchwc: bias {bias.name} must have shape ({x.shape[1]}, {x.shape[-1]}) to match the channel"
            f" blocks of {x.name} ({_dims(x)}, NCHWc), got {_dims(bias)}"
        )
    return te.compute(x.shape, lambda *i: x[i] + bias[i[1], i[-1]], name=name, tag="broadcast")


def bias_add_nchw(x: te.Tensor, bias: te.Tensor, name: str = "bias_add") -> te.Tensor:
    """x[n, c, ...] + bias[c]."""
    if x.ndim < 2:
        raise InvalidExpr(f"bias_add_nchw: {x.name} must have a channel axis 1, got shape {_dims(x)}")
    _same_dtype("bias_add_nchw", x, bias)
    if bias.shape != (x.shape[1],):
        raise InvalidExpr(
            f"bias_add_nchw: bias {bias.name} must have shape ({x.shape[1]},) to match the channels of"
            f" {x.name} ({_dims(x)}), got {_dims(bias)}"
        )
    return te.compute(x.shape, lambda *i: x[i] + bias[i[1]], name=name, tag="broadcast")


def relu(x: te.Tensor, name: str = "relu") -> te.Tensor:
    """max(x, 0)."""
    return te.compute(x.shape, lambda *i: te.maximum(x[i], te.const(0, x.dtype)), name=name, tag="elemwise")


def conv2d_bias_relu(
    data: te.Tensor,
    weight: te.Tensor,
    bias: te.Tensor,
    stride: Pair = 1,
    padding: Pair = 0,
    dilation: Pair = 1,
    groups: int = 1,
    name: str = "conv2d",
) -> te.Tensor:
    """relu(bias_add(conv2d)): the fused pattern of every CNN's conv layers."""
    conv = conv2d_nchw(data, weight, stride, padding, dilation, groups, name=name)
    return relu(bias_add_nchw(conv, bias, name=f"{name}_bias"), name=f"{name}_relu")


# ---------------------------------------------------------------------------------------------- pooling, reduction


def _pool_args(op: str, x: te.Tensor, kernel: Pair, stride: Pair, padding: Pair):
    _rank(op, x, 4, "input")
    kh, kw = _pair(op, "kernel", kernel, 1)
    sh, sw = _pair(op, "stride", stride, 1)
    pt, pl, pb, pr = _padding(op, padding)
    # a window made only of padding has no max and nothing to average
    if max(pt, pb) >= kh or max(pl, pr) >= kw:
        raise InvalidExpr(f"{op}: padding {(pt, pl, pb, pr)} must be smaller than the kernel {(kh, kw)} on each side")
    N, C, H, W = x.shape
    OH = _out_extent(op, "height", H, pt + pb, kh, 1, sh)
    OW = _out_extent(op, "width", W, pl + pr, kw, 1, sw)
    return (N, C, OH, OW), (kh, kw), (sh, sw), (pt, pl, pb, pr)


def _pool_window(x, out_shape, kernel, stride, pads, reducer, fill, name):
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = kernel, stride, pads
    src = pad(x, (0, 0, pt, pl), (0, 0, pb, pr), value=fill, name=f"{name}_pad") if any(pads) else x
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    return te.compute(
        out_shape,
        lambda n, c, h, w: reducer(src[n, c, _scale(h, sh) + ry, _scale(w, sw) + rx], axis=[ry, rx]),
        name=name,
        tag="pool",
    )


def max_pool2d(x: te.Tensor, kernel: Pair, stride: Pair = 1, padding: Pair = 0, name: str = "max_pool2d") -> te.Tensor:
    """Max over each kernel window of an NCHW input; padding never wins (it is the dtype's lowest value)."""
    out_shape, k, s, p = _pool_args("max_pool2d", x, kernel, stride, padding)
    return _pool_window(x, out_shape, k, s, p, te.max, te.min_value(x.dtype).value, name)


def avg_pool2d(
    x: te.Tensor,
    kernel: Pair,
    stride: Pair = 1,
    padding: Pair = 0,
    count_include_pad: bool = True,
    name: str = "avg_pool2d",
) -> te.Tensor:
    """Mean over each kernel window of an NCHW input; padded zeros count in the divisor if count_include_pad."""
    out_shape, (kh, kw), (sh, sw), (pt, pl, pb, pr) = _pool_args("avg_pool2d", x, kernel, stride, padding)
    total = _pool_window(x, out_shape, (kh, kw), (sh, sw), (pt, pl, pb, pr), te.sum, 0.0, f"{name}_sum")
    H, W = x.shape[2:]

    def taps(v, s, before, after, k, n):  # in-bounds elements of the window starting at v*s - before
        if count_include_pad or not (before or after):
            return k
        start = _scale(v, s) - before
        return te.minimum(start + k, n) - te.maximum(start, 0)

    def body(n, c, h, w):
        count = taps(h, sh, pt, pb, kh, H) * taps(w, sw, pl, pr, kw, W)
        return total[n, c, h, w] / (count if isinstance(count, int) else te.cast(x.dtype, count))

    return te.compute(out_shape, body, name=name, tag="elemwise")


def row_sum(x: te.Tensor, name: str = "row_sum") -> te.Tensor:
    """y[i] = sum_k x[i, k] for a 2-D x: the plain row reduction."""
    _rank("row_sum", x, 2, "input")
    k = te.reduce_axis(x.shape[1], "k")
    return te.compute((x.shape[0],), lambda i: te.sum(x[i, k], axis=k), name=name, tag="comm_reduce")


# ---------------------------------------------------------------------------------------------- ONNX builders


def _conv_args(op: str, x: te.Tensor, w: te.Tensor, attrs: dict):
    """(strides, pads, dilations, group) for x: N x C x spatial... and w: F x C' x kernel... of the same rank."""
    sp = x.ndim - 2
    if sp < 1 or w.ndim != x.ndim:
        raise InvalidExpr(f"{op}: input {_dims(x)} and weight {_dims(w)} must be N x C x spatial... of one rank")
    _dtype_in(op, x, FLOATS)
    _same_dtype(op, x, w)
    return (
        tuple(attrs.get("strides") or (1,) * sp),
        tuple(attrs.get("pads") or (0,) * (2 * sp)),
        tuple(attrs.get("dilations") or (1,) * sp),
        attrs.get("group", 1),
    )


def _with_bias(out: te.Tensor, bias: te.Tensor | None, name: str) -> te.Tensor:
    return out if bias is None else bias_add_nchw(out, bias, name=name)


def conv_nd(data: te.Tensor, weight: te.Tensor, strides, pads, dilations, groups: int, name: str) -> te.Tensor:
    """Convolution over any number of spatial dims (1-D, 3-D, ...); 2-D goes through conv2d_nchw."""
    op, sp = "Conv", data.ndim - 2
    (N, C), (F, Cg), kernel = data.shape[:2], weight.shape[:2], weight.shape[2:]
    if groups < 1 or C % groups or F % groups or Cg != C // groups:
        raise InvalidExpr(
            f"{op}: group={groups} must divide the input channels ({C}) and the output channels ({F}), and the"
            f" weight {_dims(weight)} must have C/group = {C // max(groups, 1)} input channels"
        )
    before, after = list(pads[:sp]), list(pads[sp:])
    out = [
        _out_extent(op, f"dim {d}", data.shape[2 + d], before[d] + after[d], kernel[d], dilations[d], strides[d])
        for d in range(sp)
    ]
    src = pad(data, [0, 0, *before], [0, 0, *after], name=f"{name}_pad") if any(pads) else data
    rc, rs = te.reduce_axis(Cg, "rc"), [te.reduce_axis(k, f"r{d}") for d, k in enumerate(kernel)]
    Fg = F // groups

    def body(n, f, *o):
        c = rc if groups == 1 else f // Fg * Cg + rc
        at = tuple(_scale(v, s) + _scale(r, dl) for v, r, s, dl in zip(o, rs, strides, dilations))
        return te.sum(src[(n, c) + at] * weight[(f, rc, *rs)], axis=[rc, *rs])

    return te.compute((N, F, *out), body, name=name, tag=f"conv{sp}d_ncx")


def conv(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x, w = _input("Conv", ins, 0, "X"), _input("Conv", ins, 1, "W")
    bias = ins[2] if len(ins) > 2 else None
    strides, pads, dilations, group = _conv_args("Conv", x, w, attrs)
    conv_name = name if bias is None else f"{name}_conv"
    if x.ndim == 4:
        out = conv2d_nchw(x, w, strides, pads, dilations, group, name=conv_name)
    else:
        out = conv_nd(x, w, strides, pads, dilations, group, conv_name)
    return [_with_bias(out, bias, name)]


def blocked_conv(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """tilefarm's BlockedConv (made by passes from a 2-D Conv with a constant weight): Conv's inputs and attributes,
    the weight packed F/b x C x KH x KW x b (a depthwise conv, `group` = channels: C/b x KH x KW x b); `data_layout`
    / `out_layout` ("NCHW" or "NCHWc") say whether the data comes and the result goes blocked (the `propagate_nchwc`
    pass sets them; a blocked result's bias is F/b x b)."""
    x, w = _input("BlockedConv", ins, 0, "X"), _input("BlockedConv", ins, 1, "W")
    bias = ins[2] if len(ins) > 2 else None
    _dtype_in("BlockedConv", x, FLOATS)
    if x.ndim != (5 if attrs.get("data_layout") == NCHWC else 4):
        raise InvalidExpr(f"BlockedConv: data {_dims(x)} does not match data_layout {attrs.get('data_layout', 'NCHW')}")
    out_blocked = attrs.get("out_layout") == NCHWC
    strides, pads = attrs.get("strides") or (1, 1), attrs.get("pads") or (0, 0, 0, 0)
    conv_name = name if bias is None else f"{name}_conv"
    dilations = attrs.get("dilations") or (1, 1)
    if attrs.get("group", 1) == 1:
        out = conv2d_nchw_blocked(
            x, w, strides, pads, dilations, name=conv_name, out_blocked=out_blocked, out_channels=attrs.get("channels")
        )
    else:
        out = depthwise_conv2d_nchwc(x, w, strides, pads, dilations, name=conv_name, out_blocked=out_blocked)
    if bias is None:
        return [out]
    return [bias_add_nchwc(out, bias, name=name) if out_blocked else bias_add_nchw(out, bias, name=name)]


def nchwc_to_nchw_op(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """tilefarm's NCHWcToNCHW (made by `propagate_nchwc` where a blocked value meets an op that wants NCHW)."""
    return [nchwc_to_nchw(_input("NCHWcToNCHW", ins, 0, "X"), name=name, channels=attrs.get("channels"))]


def _upsample_source(i: te.Expr, before: int, n: int, stride: int) -> tuple[te.Expr, list[te.Expr]]:
    """Index and in-bounds conditions of output index `i` of a zero-upsampled (by `stride`), padded dim."""
    s = i - before if before else i
    conds = [s >= 0] if before > 0 else []
    conds.append(s < (n - 1) * stride + 1)
    if stride > 1:
        conds.append(te.equal(s % stride, te.const(0, s.dtype)))
        s = s // stride
    return s, conds


def conv_transpose(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """The gradient of Conv: a Conv with the flipped kernel over the stride-upsampled, re-padded input."""
    op = "ConvTranspose"
    x, w = _input(op, ins, 0, "X"), _input(op, ins, 1, "W")
    bias = ins[2] if len(ins) > 2 else None
    strides, pads, dilations, group = _conv_args(op, x, w, attrs)
    sp = x.ndim - 2
    out_pad = tuple(attrs.get("output_padding") or (0,) * sp)
    (N, C), (C2, Fg), kernel, sizes = x.shape[:2], w.shape[:2], w.shape[2:], x.shape[2:]
    if C2 != C or C % group:
        raise InvalidExpr(f"{op}: weight {_dims(w)} must be C x F/group x kernel... with C = {C} divisible by {group}")
    # the upsampled input is padded by the kernel's span minus the conv's own padding on each side
    span = [(k - 1) * dl for k, dl in zip(kernel, dilations)]
    before = [sp_ - p for sp_, p in zip(span, pads[:sp])]
    after = [sp_ - p + op_ for sp_, p, op_ in zip(span, pads[sp:], out_pad)]
    ext = tuple((n - 1) * s + 1 + b + a for n, s, b, a in zip(sizes, strides, before, after))
    out = tuple(e - sp_ for e, sp_ in zip(ext, span))
    if any(o <= 0 for o in out):
        raise InvalidExpr(f"{op}: pads {list(pads)} leave no output for input {_dims(x)}")

    def upsampled(n, c, *i):
        srcs = [_upsample_source(v, b, m, s) for v, b, m, s in zip(i, before, sizes, strides)]
        inside = functools.reduce(operator.and_, [cond for _, conds in srcs for cond in conds])
        return te.select(inside, x[(n, c) + tuple(s for s, _ in srcs)], te.const(0, x.dtype))

    up = te.compute((N, C) + ext, upsampled, name=f"{name}_upsample", tag="injective,pad")
    Cg = C // group
    rc, rs = te.reduce_axis(Cg, "rc"), [te.reduce_axis(k, f"r{d}") for d, k in enumerate(kernel)]

    def body(n, f, *o):
        c = rc if group == 1 else f // Fg * Cg + rc
        wf = f if group == 1 else f % Fg
        at = tuple(v + _scale(r, dl) for v, r, dl in zip(o, rs, dilations))
        flipped = tuple(k - 1 - r for k, r in zip(kernel, rs))
        return te.sum(up[(n, c) + at] * w[(c, wf) + flipped], axis=[rc, *rs])

    tag = "conv2d_nchw" if sp == 2 else f"conv{sp}d_ncx"
    conv_out = te.compute((N, Fg * group, *out), body, name=name if bias is None else f"{name}_conv", tag=tag)
    return [_with_bias(conv_out, bias, name)]


def _pool_geometry(op: str, x: te.Tensor, attrs: dict):
    """Per spatial dim: (input size, pad before, pad after, kernel, stride, dilation, output size). With
    layout "NCHWc" the last axis of `x` holds channel lanes and is not spatial."""
    sp = x.ndim - 2 - _lanes(attrs)
    if sp < 1:
        raise InvalidExpr(f"{op}: input {x.name} must be N x C x spatial..., got {_dims(x)}")
    kernel = list(attrs["kernel_shape"])
    strides = list(attrs.get("strides") or [1] * sp)
    dilations = list(attrs.get("dilations") or [1] * sp)
    pads = list(attrs.get("pads") or [0] * (2 * sp))
    dims = []
    for d in range(sp):
        n, b, e, k, s, dl = x.shape[2 + d], pads[d], pads[sp + d], kernel[d], strides[d], dilations[d]
        span = (k - 1) * dl + 1
        if n + b + e < span:
            raise InvalidExpr(f"{op}: the window ({span}) is larger than the padded input ({n + b + e}) on dim {d}")
        dims.append((n, b, e, k, s, dl, pooled_extent(n, b, e, span, s, bool(attrs.get("ceil_mode", 0)))))
    return dims


def _window_stage(x, dims, fill, reducer, name):
    """reducer over each window of `x` padded with `fill` (also past the end, where ceil_mode windows reach); axes
    of `x` after the spatial ones (NCHWc's lanes) are carried along."""
    lanes = x.ndim - 2 - len(dims)
    before = [0, 0] + [b for _, b, _, _, _, _, _ in dims] + [0] * lanes
    after = [0, 0] + [max(e, (o - 1) * s + (k - 1) * dl + 1 - n - b) for n, b, e, k, s, dl, o in dims] + [0] * lanes
    src = pad(x, before, after, value=fill, name=f"{name}_pad") if any(before + after) else x
    rs = [te.reduce_axis(k, f"r{d}") for d, (_, _, _, k, _, _, _) in enumerate(dims)]

    def body(n, c, *rest):
        o, tail = rest[: len(dims)], rest[len(dims) :]
        idx = tuple(_scale(v, s) + _scale(r, dl) for v, r, (_, _, _, _, s, dl, _) in zip(o, rs, dims))
        return reducer(src[(n, c, *idx, *tail)], axis=rs)

    shape = x.shape[:2] + tuple(o for *_, o in dims) + x.shape[x.ndim - lanes :]
    return te.compute(shape, body, name=name, tag="pool")


def max_pool(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("MaxPool", ins, 0, "X")
    _dtype_in("MaxPool", x, ("int8", "uint8", *FLOATS))
    dims = _pool_geometry("MaxPool", x, attrs)
    # padding never wins: it is the dtype's lowest value
    return [_window_stage(x, dims, te.min_value(x.dtype).value, te.max, name)]


def _window_count(v: te.Expr, n: int, b: int, e: int, k: int, s: int, dl: int, include_pad: bool):
    """How many taps of output `v`'s window land in the input (or in its explicit padding, with include_pad)."""
    lo, hi = (-b, n + e) if include_pad else (0, n)
    start = _scale(v, s) - b
    if dl == 1:
        return te.minimum(start + k, hi) - te.maximum(start, lo)
    first = te.maximum(-((start - lo) // dl), 0)  # the first tap r with start + r*dl >= lo (ceil division)
    last = te.minimum((hi - 1 - start) // dl, k - 1)
    return te.maximum(last - first + 1, 0)


def average_pool(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("AveragePool", ins, 0, "X")
    _dtype_in("AveragePool", x, FLOATS)
    dims = _pool_geometry("AveragePool", x, attrs)
    include_pad = bool(attrs.get("count_include_pad", 0))
    total = _window_stage(x, dims, 0.0, te.sum, f"{name}_sum")

    def full(n, b, e, k, s, dl, o):  # every window has all k taps inside the counted range
        lo, hi = (-b, n + e) if include_pad else (0, n)
        return -b >= lo and (o - 1) * s - b + (k - 1) * dl < hi

    def body(nn, c, *rest):
        count = 1
        for v, g in zip(rest, dims):
            count = count * g[3] if full(*g) else _window_count(v, *g[:6], include_pad) * count
        return total[(nn, c, *rest)] / (float(count) if isinstance(count, int) else te.cast(x.dtype, count))

    return [te.compute(total.shape, body, name=name, tag="elemwise")]


NN_OPS = {
    "Conv": conv,
    "BlockedConv": blocked_conv,
    "NCHWcToNCHW": nchwc_to_nchw_op,
    "ConvTranspose": conv_transpose,
    "MaxPool": max_pool,
    "AveragePool": average_pool,
}
