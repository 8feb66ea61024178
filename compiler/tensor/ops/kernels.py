"""`KERNELS`: each kernel at a small default shape with a float64 numpy reference and a float32 tolerance."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from compiler.base.errors import InvalidExpr
from compiler.tensor import te
from compiler.tensor.ops.checks import _padding, _pair
from compiler.tensor.ops.int8_matmul import int8_matmul
from compiler.tensor.ops.linalg import batch_matmul, matmul, packed_matmul
from compiler.tensor.ops.nn import (
    avg_pool2d,
    conv2d_bias_relu,
    conv2d_nchw,
    conv2d_nchw_blocked,
    depthwise_conv2d_nchwc,
    max_pool2d,
    row_sum,
)
from compiler.tensor.ops.norm import layer_norm, softmax


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


@dataclass(frozen=True)
class IntKernelCase(KernelCase):
    """An integer kernel: placeholders of `dtypes`, random integers over each dtype's range (int32 ones within
    +-2**20) and a float32 result converted from the integer one, exactly (the cases keep it under 2**24)."""

    dtypes: tuple[str, ...] = ()

    def build(self, *shapes: Sequence[int]) -> tuple[list[te.Tensor], list[te.Tensor]]:
        shapes = shapes or tuple(s for _, s in self.inputs)
        if len(shapes) != len(self.inputs):
            raise InvalidExpr(f"this kernel takes {len(self.inputs)} input shapes, got {len(shapes)}")
        ins = [te.placeholder(s, dt, name) for (name, _), s, dt in zip(self.inputs, shapes, self.dtypes)]
        return ins, [self.fn(*ins)]

    def random_inputs(self, rng: np.random.Generator) -> list[np.ndarray]:
        bounds = {"uint8": (0, 255), "int8": (-128, 127), "int32": (-(1 << 20), 1 << 20)}
        return [rng.integers(*bounds[dt], s, dtype=dt, endpoint=True) for (_, s), dt in zip(self.inputs, self.dtypes)]


def _as_float32(t: te.Tensor) -> te.Tensor:
    return te.compute(t.shape, lambda *i: te.cast("float32", t[i]), name="as_float32", tag="elemwise")


def _unpack_int8(w: np.ndarray) -> np.ndarray:
    """int8_matmul's packed weight ceil(K/4) x N x 4 back to 4*ceil(K/4) x N."""
    return w.transpose(0, 2, 1).reshape(-1, w.shape[1]).astype(np.int64)


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


def _ref_depthwise_nchwc(x, w, stride=1, padding=0) -> np.ndarray:
    """depthwise_conv2d_nchwc's reference: x N x C/b x H x W x b, w C/b x KH x KW x b, through NCHW."""
    n, cb, h, wd, b = x.shape
    nchw = x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, wd)
    weight = w.transpose(0, 3, 1, 2).reshape(cb * b, 1, *w.shape[1:3])
    out = reference_conv2d(nchw, weight, stride, padding, groups=cb * b)
    return out.reshape(n, cb, b, *out.shape[2:]).transpose(0, 1, 3, 4, 2)


def depthwise_pointwise_nchwc(data: te.Tensor, w_dw: te.Tensor, w_pw: te.Tensor) -> te.Tensor:
    """MobileNet's depthwise-then-project pair as fusion makes it one task: a 3x3 depthwise conv on NCHWc data, ReLU6,
    then a 1x1 conv of the blocked result (weight F/b x C/cb x 1 x 1 x cb x b), the result kept blocked."""
    dw = depthwise_conv2d_nchwc(data, w_dw, padding=1, out_blocked=True, name="dw")
    relu6 = te.compute(
        dw.shape,
        lambda *i: te.minimum(te.maximum(dw[i], te.const(0.0, dw.dtype)), te.const(6.0, dw.dtype)),
        name="relu6",
    )
    return conv2d_nchw_blocked(relu6, w_pw, out_blocked=True, name="project")


def _ref_depthwise_pointwise(x, w_dw, w_pw) -> np.ndarray:
    relu6 = np.clip(_ref_depthwise_nchwc(x, w_dw, padding=1), 0.0, 6.0)
    return np.einsum("ncyxi,fcio->nfyxo", relu6, w_pw[:, :, 0, 0])


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
    # K=24 against a weight in panels of 16 columns (a tile may span two panels): max err 6e-6
    "matmul_packed": KernelCase(
        (("A", (3, 10, 24)), ("W", (3, 24, 16))),
        packed_matmul,
        _f64(lambda a, w: a @ w.transpose(1, 0, 2).reshape(w.shape[1], -1)),
        rtol=1e-5,
        atol=1e-4,
    ),
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
    # the same K=9 on NCHWc data (2 blocks of 8 lanes), stride 2, the result kept blocked
    "conv2d_depthwise_nchwc": KernelCase(
        (("data", (1, 2, 15, 15, 8)), ("weight", (2, 3, 3, 8))),
        lambda d, w: depthwise_conv2d_nchwc(d, w, stride=2, padding=1, out_blocked=True),
        _f64(lambda d, w: _ref_depthwise_nchwc(d, w, stride=2, padding=1)),
        rtol=1e-5,
        atol=1e-5,
    ),
    # K = 5*3*3 = 45 against a weight of two 16-filter blocks of which 24 filters are real: the NCHW result keeps those
    "conv2d_blocked_padded": KernelCase(
        (("data", (1, 5, 9, 9)), ("weight", (2, 5, 3, 3, 16))),
        lambda d, w: conv2d_nchw_blocked(d, w, stride=2, padding=1, out_channels=24),
        _f64(lambda d, w: reference_conv2d(d, w.transpose(0, 4, 1, 2, 3).reshape(32, 5, 3, 3), 2, 1)[:, :24]),
        rtol=1e-5,
        atol=1e-4,
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
    # 9 taps into 16 channels of the 1x1 conv, through a ReLU6 (a task fusion makes of two convs): max err 1e-5
    "depthwise_pointwise_nchwc": KernelCase(
        (("data", (1, 2, 9, 9, 8)), ("w_dw", (2, 3, 3, 8)), ("w_pw", (2, 2, 1, 1, 8, 8))),
        depthwise_pointwise_nchwc,
        _f64(_ref_depthwise_pointwise),
        rtol=1e-5,
        atol=1e-4,
    ),
    # 9-term sums, then one division: max err 1.3e-7
    "avg_pool2d": KernelCase(
        (("x", (1, 8, 14, 14)),),
        lambda x: avg_pool2d(x, 3, stride=2, padding=1),
        _f64(lambda x: _ref_pool(x, 3, 2, 1, "avg")),
        rtol=1e-5,
        atol=1e-6,
    ),
    # u8 x s8 -> s32 (the VNNI dot product) against a weight packed ceil(K/4) x N x 4, K=37 (a tail of 1 past the
    # 4-wide products), N=40 of 48 packed columns, plus a per-column int32 term: integers, so exact
    "matmul_int8": IntKernelCase(
        (("A", (20, 37)), ("W", (10, 48, 4)), ("col", (40,))),
        lambda a, w, c: _as_float32(int8_matmul(a, w, c, n=40)),
        lambda a, w, c: [(np.asarray(a, np.int64) @ _unpack_int8(np.asarray(w))[:37, :40] + c).astype(np.float64)],
        rtol=0.0,
        atol=0.0,
        dtypes=("uint8", "int8", "int32"),
    ),
    # K=200, row sums ~14 in size: max err 2e-5
    "row_sum": KernelCase((("x", (64, 200)),), row_sum, _f64(lambda x: x.sum(axis=1)), rtol=1e-5, atol=2e-4),
}
