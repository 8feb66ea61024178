"""Normalization: softmax, layer norm, and the ONNX Softmax / LogSoftmax / LayerNormalization /
BatchNormalization builders."""

from __future__ import annotations

import math
from collections.abc import Sequence

from compiler.base.errors import InvalidExpr
from compiler.tensor import te
from compiler.tensor.ops.checks import FLOATS, _axis, _bcast, _broadcast_shape, _dims, _dtype_in, _input, _same_dtype

Ins = Sequence[te.Tensor | None]

def softmax(x: te.Tensor, axis: int = -1, name: str = "softmax") -> te.Tensor:
    """exp(x - max) / sum(exp(x - max)) along `axis`, as four stages (max, exp, sum, divide)."""
    ax = _axis("softmax", axis, x.ndim)
    n, rshape = x.shape[ax], x.shape[:ax] + x.shape[ax + 1 :]

    def full(i, k):  # an index of the reduced shape, with k put back at `axis`
        return i[:ax] + (k,) + i[ax:]

    def drop(i):
        return i[:ax] + i[ax + 1 :]

    k1, k2 = te.reduce_axis(n, "k"), te.reduce_axis(n, "k")
    mx = te.compute(rshape, lambda *i: te.max(x[full(i, k1)], axis=k1), name=f"{name}_max", tag="comm_reduce")
    ex = te.compute(x.shape, lambda *i: te.exp(x[i] - mx[drop(i)]), name=f"{name}_exp", tag="broadcast")
    sm = te.compute(rshape, lambda *i: te.sum(ex[full(i, k2)], axis=k2), name=f"{name}_sum", tag="comm_reduce")
    return te.compute(x.shape, lambda *i: ex[i] / sm[drop(i)], name=name, tag="broadcast")


def layer_norm(
    x: te.Tensor, gamma: te.Tensor, beta: te.Tensor, axis: int = -1, eps: float = 1e-5, name: str = "layer_norm"
) -> te.Tensor:
    """ONNX LayerNormalization: normalize over dims axis..end, then scale by gamma and shift by beta."""
    op = "layer_norm"
    ax = _axis(op, axis, x.ndim)
    _same_dtype(op, x, gamma, beta)
    outer, inner = x.shape[:ax], x.shape[ax:]
    for t in (gamma, beta):
        if t.shape != inner:
            raise InvalidExpr(
                f"{op}: {t.name} must have shape {inner} (the normalized dims of {x.name}: {_dims(x)}), got {_dims(t)}"
            )
    inv_n = 1.0 / math.prod(inner)
    ks = [te.reduce_axis(e, f"k{d}") for d, e in enumerate(inner)]
    kt = tuple(ks)
    # 1/n goes inside the sums because a reduction must be a stage's whole body
    mean = te.compute(outer, lambda *i: te.sum(x[i + kt] * inv_n, axis=ks), name=f"{name}_mean", tag="comm_reduce")

    def sq_dev(i):
        d = x[i + kt] - mean[i]
        return d * d * inv_n

    var = te.compute(outer, lambda *i: te.sum(sq_dev(i), axis=ks), name=f"{name}_var", tag="comm_reduce")
    return te.compute(
        x.shape,
        lambda *i: (x[i] - mean[i[:ax]]) * te.rsqrt(var[i[:ax]] + eps) * gamma[i[ax:]] + beta[i[ax:]],
        name=name,
        tag="broadcast",
    )


# ---------------------------------------------------------------------------------------------- ONNX builders


def softmax_op(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Softmax", ins, 0, "input")
    _dtype_in("Softmax", x, FLOATS)
    return [softmax(x, attrs.get("axis", -1), name=name)]


def log_softmax(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """x - max - log(sum(exp(x - max))) along `axis`: three stages (max, sum of exp, result)."""
    x = _input("LogSoftmax", ins, 0, "input")
    _dtype_in("LogSoftmax", x, FLOATS)
    ax = _axis("LogSoftmax", attrs.get("axis", -1), x.ndim)
    rshape = x.shape[:ax] + x.shape[ax + 1 :]
    full = lambda i, k: i[:ax] + (k,) + i[ax:]
    drop = lambda i: i[:ax] + i[ax + 1 :]
    k1, k2 = te.reduce_axis(x.shape[ax], "k"), te.reduce_axis(x.shape[ax], "k")
    mx = te.compute(rshape, lambda *i: te.max(x[full(i, k1)], axis=k1), name=f"{name}_max", tag="comm_reduce")
    sm = te.compute(
        rshape, lambda *i: te.sum(te.exp(x[full(i, k2)] - mx[i]), axis=k2), name=f"{name}_sum", tag="comm_reduce"
    )
    body = lambda *i: x[i] - mx[drop(i)] - te.log(sm[drop(i)])
    return [te.compute(x.shape, body, name=name, tag="broadcast")]


def _moments(x: te.Tensor, start: int, name: str) -> tuple[te.Tensor, te.Tensor]:
    """Mean and (biased) variance of `x` over dims start..end, as two reduction stages."""
    outer, inner = x.shape[:start], x.shape[start:]
    inv_n = 1.0 / math.prod(inner)
    ks = tuple(te.reduce_axis(e, f"k{d}") for d, e in enumerate(inner))
    # 1/n goes inside the sums because a reduction must be a stage's whole body
    mean = te.compute(outer, lambda *i: te.sum(x[i + ks] * inv_n, axis=ks), name=f"{name}_mean", tag="comm_reduce")

    def sq_dev(i):
        d = x[i + ks] - mean[i]
        return d * d * inv_n

    var = te.compute(outer, lambda *i: te.sum(sq_dev(i), axis=ks), name=f"{name}_var", tag="comm_reduce")
    return mean, var


def layer_normalization(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """ONNX LayerNormalization (output Y only): Scale and B broadcast against the normalized dims."""
    op = "LayerNormalization"
    x, scale = _input(op, ins, 0, "X"), _input(op, ins, 1, "Scale")
    bias = ins[2] if len(ins) > 2 else None
    _dtype_in(op, x, FLOATS)
    _same_dtype(op, x, scale, *([bias] if bias is not None else []))
    ax = _axis(op, attrs.get("axis", -1), x.ndim)
    for t in (scale, bias):
        if t is not None and t.ndim > x.ndim - ax:
            raise InvalidExpr(f"{op}: {t.name} ({_dims(t)}) has more dims than the normalized {x.shape[ax:]}")
        if t is not None:
            _broadcast_shape(op, x.shape[ax:], t.shape)
    mean, var = _moments(x, ax, name)
    eps = attrs.get("epsilon", 1e-5)

    def body(*i):
        y = (x[i] - mean[i[:ax]]) * te.rsqrt(var[i[:ax]] + eps) * _bcast(scale, i)
        return y if bias is None else y + _bcast(bias, i)

    return [te.compute(x.shape, body, name=name, tag="broadcast")]


def _per_channel(op: str, x: te.Tensor, ts: Sequence[te.Tensor]) -> None:
    for t in ts:
        if t.shape != (x.shape[1],):
            raise InvalidExpr(
                f"{op}: {t.name} must have shape ({x.shape[1]},) (the channels of {x.name}), got {_dims(t)}"
            )


def batch_normalization(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """Inference BatchNormalization: (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + B[c]."""
    op = "BatchNormalization"
    x, scale, bias, mean, var = (_input(op, ins, i, r) for i, r in enumerate(("X", "scale", "B", "mean", "var")))
    if attrs.get("training_mode", 0):
        raise InvalidExpr(f"{op}: training_mode=1 is not supported (inference only)")
    _dtype_in(op, x, FLOATS)
    _same_dtype(op, x, scale, bias, mean, var)
    _per_channel(op, x, (scale, bias, mean, var))
    eps = attrs.get("epsilon", 1e-5)
    body = lambda *i: (x[i] - mean[i[1]]) * te.rsqrt(var[i[1]] + eps) * scale[i[1]] + bias[i[1]]
    return [te.compute(x.shape, body, name=name, tag="broadcast")]


def instance_normalization(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """Normalize each (n, c) over its spatial dims, then scale[c] and B[c]."""
    op = "InstanceNormalization"
    x, scale, bias = (_input(op, ins, i, r) for i, r in enumerate(("input", "scale", "B")))
    _dtype_in(op, x, FLOATS)
    _same_dtype(op, x, scale, bias)
    _per_channel(op, x, (scale, bias))
    mean, var = _moments(x, 2, name)
    eps = attrs.get("epsilon", 1e-5)
    body = lambda *i: (x[i] - mean[i[:2]]) * te.rsqrt(var[i[:2]] + eps) * scale[i[1]] + bias[i[1]]
    return [te.compute(x.shape, body, name=name, tag="broadcast")]


def lrn(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """Local response normalization across channels: x / (bias + alpha/size * sum of x^2 over nearby channels)^beta."""
    x = _input("LRN", ins, 0, "X")
    _dtype_in("LRN", x, FLOATS)
    if x.ndim < 3:
        raise InvalidExpr(f"LRN: input {x.name} must be N x C x spatial..., got {_dims(x)}")
    size, C = attrs["size"], x.shape[1]
    first = (size - 1) // 2  # the window of channel c is c - first .. c + ceil((size-1)/2)
    r = te.reduce_axis(size, "r")

    def square(i):
        c = i[1] + r - first if first else i[1] + r
        v = x[(i[0], c) + i[2:]]
        # lazy select: channels past either end add nothing and are never loaded
        return te.select((c >= 0) & (c < C), v * v, te.const(0, x.dtype))

    sq = te.compute(x.shape, lambda *i: te.sum(square(i), axis=r), name=f"{name}_sqsum", tag="comm_reduce")
    scale = attrs["alpha"] / size
    body = lambda *i: x[i] / te.power(sq[i] * scale + attrs["bias"], te.const(attrs["beta"], x.dtype))
    return [te.compute(x.shape, body, name=name, tag="elemwise")]


NORM_OPS = {
    "LRN": lrn,
    "Softmax": softmax_op,
    "LogSoftmax": log_softmax,
    "LayerNormalization": layer_normalization,
    "BatchNormalization": batch_normalization,
    "InstanceNormalization": instance_normalization,
}
