"""Compute definitions of the kernels tilefarm supports (TOPI's role): plain functions from tensors to tensors.

Nothing here schedules. Multi-stage ops (padded conv, softmax, layer norm, pooling) return their last stage;
the earlier stages hang off `Tensor.op.inputs`, so the scheduler sees each of them and may inline or tile it.
`KERNELS` pairs each kernel at a small default shape with a float64 numpy reference and a float32 tolerance.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from compiler import te
from compiler.errors import InvalidExpr

Pair = int | Sequence[int]

# ---------------------------------------------------------------------------------------------- argument checks


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


# ---------------------------------------------------------------------------------------------- linear algebra


def matmul(A: te.Tensor, B: te.Tensor, name: str = "matmul") -> te.Tensor:
    """C[i, j] = sum_k A[i, k] * B[k, j] for A: MxK, B: KxN."""
    _rank("matmul", A, 2, "A")
    _rank("matmul", B, 2, "B")
    _same_dtype("matmul", A, B)
    (M, K), (K2, N) = A.shape, B.shape
    if K != K2:
        raise InvalidExpr(f"matmul: A is {_dims(A)} and B is {_dims(B)}; A's columns ({K}) must equal B's rows ({K2})")
    k = te.reduce_axis(K, "k")
    return te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name=name, tag="matmul")


def batch_matmul(A: te.Tensor, B: te.Tensor, name: str = "batch_matmul") -> te.Tensor:
    """C[b, i, j] = sum_k A[b, i, k] * B[b, k, j] for A: bxMxK, B: bxKxN."""
    _rank("batch_matmul", A, 3, "A")
    _rank("batch_matmul", B, 3, "B")
    _same_dtype("batch_matmul", A, B)
    (batch, M, K), (batch2, K2, N) = A.shape, B.shape
    if batch != batch2 or K != K2:
        raise InvalidExpr(
            f"batch_matmul: A is {_dims(A)} and B is {_dims(B)}; batches must match ({batch} vs"
            f" {batch2}) and A's columns ({K}) must equal B's rows ({K2})"
        )
    k = te.reduce_axis(K, "k")
    return te.compute(
        (batch, M, N), lambda b, i, j: te.sum(A[b, i, k] * B[b, k, j], axis=k), name=name, tag="batch_matmul"
    )


def dense(X: te.Tensor, W: te.Tensor, bias: te.Tensor | None = None, name: str = "dense") -> te.Tensor:
    """Y[i, j] = sum_k X[i, k] * W[j, k] (+ bias[j]) for X: MxK, W: NxK, as ONNX Gemm with transB does."""
    _rank("dense", X, 2, "X")
    _rank("dense", W, 2, "W")
    _same_dtype("dense", X, W, *([bias] if bias is not None else []))
    (M, K), (N, K2) = X.shape, W.shape
    if K != K2:
        raise InvalidExpr(f"dense: X is {_dims(X)} and W is {_dims(W)}; both must have {K} columns (W is NxK)")
    k = te.reduce_axis(K, "k")
    out = te.compute((M, N), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name=name, tag="dense")
    if bias is None:
        return out
    if bias.shape != (N,):
        raise InvalidExpr(f"dense: bias {bias.name} must have shape ({N},), got {_dims(bias)}")
    return te.compute((M, N), lambda i, j: out[i, j] + bias[j], name=f"{name}_bias", tag="broadcast")


# ---------------------------------------------------------------------------------------------- padding, convolution


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
    (N, C, H, W), (F, Cg, KH, KW) = data.shape, weight.shape
    sh, sw = _pair(op, "stride", stride, 1)
    dh, dw = _pair(op, "dilation", dilation, 1)
    pt, pl, pb, pr = _padding(op, padding)
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
    OH = _out_extent(op, "height", H, pt + pb, KH, dh, sh)
    OW = _out_extent(op, "width", W, pl + pr, KW, dw, sw)
    # padding is its own stage, as in TVM, so the scheduler decides whether to inline it
    src = pad(data, (0, 0, pt, pl), (0, 0, pb, pr), name=f"{name}_pad") if pt or pl or pb or pr else data
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


# ---------------------------------------------------------------------------------------------- normalization


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


# ---------------------------------------------------------------------------------------------- test kernels


@dataclass(frozen=True)
class KernelCase:
    """A kernel at a small default shape, its float64 numpy reference and the float32 tolerance to check it with."""

    inputs: tuple[tuple[str, tuple[int, ...]], ...]  # (placeholder name, default shape) per input
    fn: Callable[..., te.Tensor]
    reference: Callable[..., list[np.ndarray]]
    rtol: float
    atol: float

    def build(self, *shapes: Sequence[int]) -> tuple[list[te.Tensor], list[te.Tensor]]:
        """Float32 placeholders at `shapes` (default: the case's) and the kernel's output tensors."""
        shapes = shapes or tuple(s for _, s in self.inputs)
        if len(shapes) != len(self.inputs):
            raise InvalidExpr(f"this kernel takes {len(self.inputs)} input shapes, got {len(shapes)}")
        ins = [te.placeholder(s, "float32", name) for (name, _), s in zip(self.inputs, shapes)]
        return ins, [self.fn(*ins)]

    def random_inputs(self, rng: np.random.Generator) -> list[np.ndarray]:
        """Standard-normal float32 inputs at the default shapes."""
        return [rng.standard_normal(s).astype(np.float32) for _, s in self.inputs]


def _ref_pad(x: np.ndarray, pads: tuple[int, int, int, int], value: float) -> np.ndarray:
    pt, pl, pb, pr = pads
    return np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=value)


def reference_conv2d(x, w, stride=1, padding=0, dilation=1, groups=1) -> np.ndarray:
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    (sh, sw), (dh, dw) = _pair("ref", "stride", stride, 1), _pair("ref", "dilation", dilation, 1)
    xp = _ref_pad(x, _padding("ref", padding), 0.0)
    F, Cg, KH, KW = w.shape
    Fg = F // groups
    OH = (xp.shape[2] - (KH - 1) * dh - 1) // sh + 1
    OW = (xp.shape[3] - (KW - 1) * dw - 1) // sw + 1
    out = np.zeros((x.shape[0], F, OH, OW))
    for ky in range(KH):
        for kx in range(KW):
            # every output's input tap for this kernel offset, as one strided slice: N x C x OH x OW
            tap = xp[:, :, ky * dh : ky * dh + (OH - 1) * sh + 1 : sh, kx * dw : kx * dw + (OW - 1) * sw + 1 : sw]
            for g in range(groups):
                out[:, g * Fg : (g + 1) * Fg] += np.einsum(
                    "nchw,fc->nfhw", tap[:, g * Cg : (g + 1) * Cg], w[g * Fg : (g + 1) * Fg, :, ky, kx]
                )
    return out


def _ref_pool(x, kernel, stride, padding, kind: str, count_include_pad: bool = True) -> np.ndarray:
    x = np.asarray(x, np.float64)
    (kh, kw), (sh, sw) = _pair("ref", "kernel", kernel, 1), _pair("ref", "stride", stride, 1)
    pads = _padding("ref", padding)
    xp = _ref_pad(x, pads, -np.inf if kind == "max" else 0.0)
    ones = _ref_pad(np.ones_like(x), pads, 0.0)
    OH, OW = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
    acc = np.full(x.shape[:2] + (OH, OW), -np.inf if kind == "max" else 0.0)
    count = np.zeros((1, 1, OH, OW))
    for ky in range(kh):
        for kx in range(kw):
            rows, cols = slice(ky, ky + (OH - 1) * sh + 1, sh), slice(kx, kx + (OW - 1) * sw + 1, sw)
            acc = np.maximum(acc, xp[:, :, rows, cols]) if kind == "max" else acc + xp[:, :, rows, cols]
            count += ones[:1, :1, rows, cols]
    if kind == "max":
        return acc
    return acc / (kh * kw if count_include_pad else count)


def _ref_softmax(x, axis=-1) -> np.ndarray:
    e = np.exp(np.asarray(x, np.float64) - np.max(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _ref_layer_norm(x, gamma, beta, axis=-1, eps=1e-5) -> np.ndarray:
    x = np.asarray(x, np.float64)
    dims = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=dims, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=dims, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _f64(fn: Callable[..., np.ndarray]) -> Callable[..., list[np.ndarray]]:
    return lambda *arrays: [fn(*(np.asarray(a, np.float64) for a in arrays))]


# Tolerances are for float32 kernels against these float64 references on standard-normal inputs, checked as
# |got - ref| <= atol + rtol * |ref|. A K-term float32 dot product is off by at most ~K*2^-24*sum|a*b|, but
# with random signs the roundings cancel like a random walk: ~sqrt(K)*2^-24 times the partial sums' size. The
# "max err" notes are the largest errors of float32 evaluations (one running sum per output, and numpy's
# pairwise order) over 20 seeds; each tolerance sits >= 15x above them, leaving room for reassociated,
# FMA-contracted schedules and vector exp/rsqrt a few ulp off. tests/test_ops.py re-checks the sequential case.
KERNELS: dict[str, KernelCase] = {
    # K=64: max err 1e-5
    "matmul": KernelCase((("A", (32, 64)), ("B", (64, 40))), matmul, _f64(np.matmul), rtol=1e-5, atol=1e-4),
    # K=32: max err 6e-6
    "batch_matmul": KernelCase(
        (("A", (3, 16, 32)), ("B", (3, 32, 24))), batch_matmul, _f64(np.matmul), rtol=1e-5, atol=1e-4
    ),
    # K = 8*3*3 = 72: max err 1e-5; the odd input 15 leaves the last stride-2 window short of the padded edge
    "conv2d": KernelCase(
        (("data", (1, 8, 15, 15)), ("weight", (16, 8, 3, 3))),
        lambda d, w: conv2d_nchw(d, w, stride=2, padding=1),
        _f64(lambda d, w: reference_conv2d(d, w, stride=2, padding=1)),
        rtol=1e-5,
        atol=1e-4,
    ),
    # K=72 over a 5x5 effective window: max err 1.2e-5
    "conv2d_dilated": KernelCase(
        (("data", (1, 8, 14, 14)), ("weight", (8, 8, 3, 3))),
        lambda d, w: conv2d_nchw(d, w, padding=2, dilation=2),
        _f64(lambda d, w: reference_conv2d(d, w, padding=2, dilation=2)),
        rtol=1e-5,
        atol=1e-4,
    ),
    # K = 4*3*3 = 36 per group: max err 7e-6
    "conv2d_grouped": KernelCase(
        (("data", (1, 8, 12, 12)), ("weight", (8, 4, 3, 3))),
        lambda d, w: conv2d_nchw(d, w, padding=1, groups=2),
        _f64(lambda d, w: reference_conv2d(d, w, padding=1, groups=2)),
        rtol=1e-5,
        atol=1e-4,
    ),
    # K=9, channel multiplier 2: max err 2e-6
    "conv2d_depthwise": KernelCase(
        (("data", (1, 8, 16, 16)), ("weight", (16, 1, 3, 3))),
        lambda d, w: conv2d_nchw(d, w, padding=1, groups=8),
        _f64(lambda d, w: reference_conv2d(d, w, padding=1, groups=8)),
        rtol=1e-5,
        atol=1e-5,
    ),
    # K=72 as conv2d, plus one rounding for the bias: max err 1e-5
    "conv2d_bias_relu": KernelCase(
        (("data", (1, 8, 12, 12)), ("weight", (12, 8, 3, 3)), ("bias", (12,))),
        lambda d, w, b: conv2d_bias_relu(d, w, b, padding=1),
        _f64(lambda d, w, b: np.maximum(reference_conv2d(d, w, padding=1) + b[None, :, None, None], 0.0)),
        rtol=1e-5,
        atol=1e-4,
    ),
    # outputs in (0, 1]: a 50-term positive sum and an exp; max err 7e-8
    "softmax": KernelCase((("x", (16, 50)),), softmax, _f64(_ref_softmax), rtol=1e-5, atol=1e-6),
    # 48-term mean and variance, one rsqrt; outputs up to ~4: max err 1.2e-6
    "layer_norm": KernelCase(
        (("x", (16, 48)), ("gamma", (48,)), ("beta", (48,))), layer_norm, _f64(_ref_layer_norm), rtol=1e-5, atol=1e-5
    ),
    # max is exact in any order: the float32 result must equal the reference exactly
    "max_pool2d": KernelCase(
        (("x", (1, 8, 15, 15)),),
        lambda x: max_pool2d(x, 3, stride=2, padding=1),
        _f64(lambda x: _ref_pool(x, 3, 2, 1, "max")),
        rtol=0.0,
        atol=0.0,
    ),
    # 9-term sums, then one division: max err 1.3e-7
    "avg_pool2d": KernelCase(
        (("x", (1, 8, 14, 14)),),
        lambda x: avg_pool2d(x, 3, stride=2, padding=1),
        _f64(lambda x: _ref_pool(x, 3, 2, 1, "avg")),
        rtol=1e-5,
        atol=1e-6,
    ),
    # K=200, row sums ~14 in size: max err 2e-5
    "row_sum": KernelCase((("x", (64, 200)),), row_sum, _f64(lambda x: x.sum(axis=1)), rtol=1e-5, atol=2e-4),
}
