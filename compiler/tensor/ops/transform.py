"""Data movement ("injective") ONNX ops: every output element is one input element (or a padding value, or, for
linear and cubic Resize, a blend of a few), found by index arithmetic. Shapes and other compile-time inputs arrive as
normalized attributes (see compiler/model/graph.py).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence

import numpy as np

from compiler.base import dtypes
from compiler.base.errors import InvalidExpr
from compiler.tensor import te
from compiler.tensor.ops.checks import _bcast, _broadcast_shape, _input
from compiler.tensor.ops.elementwise import round_half_even

Expr = te.Expr
Ins = Sequence[te.Tensor | None]


def _all(conds: list[Expr]) -> Expr | None:
    return functools.reduce(operator.and_, conds) if conds else None


def _copy(x: te.Tensor, name: str) -> te.Tensor:
    return te.compute(x.shape, lambda *i: x[i], name=name, tag="injective")


def _clamp(v: Expr, lo: int, hi: int) -> Expr:
    return te.minimum(te.maximum(v, lo), hi)


def _position(raw: Expr, n: int) -> Expr:
    """An index read from data as a position in range(n): negative ones count from the end; out-of-range ones are
    clamped rather than read out of bounds."""
    raw = te.cast("int64", raw)
    return _clamp(te.select(raw < 0, raw + n, raw), 0, n - 1)


# ---------------------------------------------------------------------------------------------- reshapes


def reshape_to(x: te.Tensor, shape: Sequence[int], name: str) -> te.Tensor:
    """`x` with a new shape of the same size, elements in row-major order."""
    shape = tuple(shape)
    if math.prod(shape) != math.prod(x.shape):
        raise InvalidExpr(f"reshape: cannot view {x.name} of shape {list(x.shape)} as {list(shape)} (sizes differ)")
    in_core = [(d, n) for d, n in enumerate(x.shape) if n != 1]
    out_core = [(d, n) for d, n in enumerate(shape) if n != 1]
    if [n for _, n in in_core] == [n for _, n in out_core]:
        # only size-1 dims come or go (Squeeze, Unsqueeze, most Flattens): a direct index map, no div/mod
        where = {din: dout for (din, _), (dout, _) in zip(in_core, out_core)}
        body = lambda *i: x[tuple(i[where[d]] if d in where else 0 for d in range(x.ndim))]
        return te.compute(shape, body, name=name, tag="injective")

    def body(*i):
        flat = None  # the row-major position of output index i
        for v, n in zip(i, shape):
            if n > 1:
                flat = v if flat is None else flat * n + v
        idx, stride, first = [], math.prod(x.shape), True
        for n in x.shape:
            stride //= n
            if n == 1 or flat is None:
                idx.append(0)
                continue
            v = flat // stride if stride > 1 else flat
            idx.append(v if first else v % n)  # the leading dim needs no wrap: flat < the total size
            first = False
        return x[tuple(idx)]

    return te.compute(shape, body, name=name, tag="injective")


def reshape(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    return [reshape_to(_input("Reshape", ins, 0, "data"), attrs["shape"], name)]


def flatten(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Flatten", ins, 0, "input")
    axis = attrs.get("axis", 1)
    return [reshape_to(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])), name)]


def squeeze(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Squeeze", ins, 0, "data")
    axes = attrs.get("axes") or [d for d, n in enumerate(x.shape) if n == 1]
    if any(x.shape[d] != 1 for d in axes):
        raise InvalidExpr(f"Squeeze: axes {axes} of {x.name} ({list(x.shape)}) must all have size 1")
    return [reshape_to(x, [n for d, n in enumerate(x.shape) if d not in axes], name)]


def unsqueeze(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Unsqueeze", ins, 0, "data")
    shape, rest = [], iter(x.shape)
    for d in range(x.ndim + len(attrs["axes"])):
        shape.append(1 if d in attrs["axes"] else next(rest))
    return [reshape_to(x, shape, name)]


def transpose(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Transpose", ins, 0, "data")
    perm = list(attrs.get("perm") or reversed(range(x.ndim)))
    if sorted(perm) != list(range(x.ndim)):
        raise InvalidExpr(f"Transpose: perm {perm} is not a permutation of the {x.ndim} dims of {x.name}")
    inv = [perm.index(d) for d in range(x.ndim)]
    shape = tuple(x.shape[p] for p in perm)
    return [te.compute(shape, lambda *i: x[tuple(i[inv[d]] for d in range(x.ndim))], name=name, tag="injective")]


# ---------------------------------------------------------------------------------------------- join, split, slice


def concat(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    xs = [t for t in ins if t is not None]
    axis = attrs["axis"]
    others = lambda t: (t.dtype, t.ndim, t.shape[:axis] + t.shape[axis + 1 :])  # what inputs must agree on
    if not xs or len({others(t) for t in xs}) > 1:
        raise InvalidExpr(f"Concat: inputs {[t.shape for t in xs]} must agree in dtype and in every dim but {axis}")
    starts = [0]
    for t in xs:
        starts.append(starts[-1] + t.shape[axis])

    def body(*i):
        def part(k):  # input k, shifted to its place along the axis
            at = i[:axis] + ((i[axis] - starts[k]) if starts[k] else i[axis],) + i[axis + 1 :]
            return xs[k][at]

        def pick(lo: int, hi: int):  # inputs lo..hi-1: lazy selects, so each element loads from one input only,
            if hi - lo == 1:  # split at the middle, so they nest log2(n) deep (3,000 inputs in a chain overflowed
                return part(lo)  # the recursion of every pass over the expression)
            mid = (lo + hi) // 2
            return te.select(i[axis] < starts[mid], pick(lo, mid), pick(mid, hi))

        return pick(0, len(xs))

    shape = xs[0].shape[:axis] + (starts[-1],) + xs[0].shape[axis + 1 :]
    return [te.compute(shape, body, name=name, tag="injective")]


def slice_axes(x: te.Tensor, starts, ends, axes, steps, name: str) -> te.Tensor:
    """Elements range(start, end, step) along each of `axes` (positions already resolved and clamped)."""
    begin = [0] * x.ndim
    step = [1] * x.ndim
    shape = list(x.shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise InvalidExpr(f"Slice: a step of 0 on axis {a} of {x.name}")
        n = len(range(s, e, st))
        if n == 0:
            raise InvalidExpr(f"Slice: range({s}, {e}, {st}) on axis {a} of {x.name} is empty; empty tensors are"
                              " not supported")  # fmt: skip
        if not (0 <= s < x.shape[a] and 0 <= s + (n - 1) * st < x.shape[a]):
            raise InvalidExpr(f"Slice: range({s}, {e}, {st}) reaches outside axis {a} of {x.name} ({x.shape[a]})")
        begin[a], step[a], shape[a] = s, st, n

    def body(*i):
        return x[tuple(v * st + b if st != 1 else (v + b if b else v) for v, b, st in zip(i, begin, step))]

    return te.compute(shape, body, name=name, tag="injective")


def slice_(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Slice", ins, 0, "data")
    return [slice_axes(x, attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"], name)]


def split(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Split", ins, 0, "input")
    axis, sizes = attrs["axis"], list(attrs["split"])
    if sum(sizes) != x.shape[axis]:
        raise InvalidExpr(f"Split: sizes {sizes} do not add up to axis {axis} of {x.name} ({x.shape[axis]})")
    outs, at = [], 0
    for k, n in enumerate(sizes):
        outs.append(slice_axes(x, [at], [at + n], [axis], [1], f"{name}_{k}"))
        at += n
    return outs


# ---------------------------------------------------------------------------------------------- gather, expand, tile


def gather(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    data, idx = _input("Gather", ins, 0, "data"), _input("Gather", ins, 1, "indices")
    if idx.dtype not in ("int32", "int64"):
        raise InvalidExpr(f"Gather: indices {idx.name} must be int32 or int64, got {idx.dtype}")
    axis = attrs.get("axis", 0)
    n = data.shape[axis]
    shape = data.shape[:axis] + idx.shape + data.shape[axis + 1 :]

    def body(*i):
        return data[i[:axis] + (_position(idx[i[axis : axis + idx.ndim]], n),) + i[axis + idx.ndim :]]

    return [te.compute(shape, body, name=name, tag="injective")]


def expand(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Expand", ins, 0, "input")
    shape = _broadcast_shape("Expand", x.shape, attrs["shape"])
    return [te.compute(shape, lambda *i: _bcast(x, i), name=name, tag="broadcast")]


def tile(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Tile", ins, 0, "input")
    reps = list(attrs["repeats"])
    if len(reps) != x.ndim or any(r < 1 for r in reps):
        raise InvalidExpr(f"Tile: repeats {reps} must be one positive count per dim of {x.name} ({x.ndim}-D)")
    shape = tuple(n * r for n, r in zip(x.shape, reps))
    body = lambda *i: x[tuple(v % n if r > 1 and n > 1 else (v if n > 1 else 0) for v, n, r in zip(i, x.shape, reps))]
    return [te.compute(shape, body, name=name, tag="injective")]


def identity(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    return [_copy(_input("Identity", ins, 0, "input"), name)]


# ---------------------------------------------------------------------------------------------- pad


def _pad_source(i: Expr, before: int, after: int, n: int, mode: str) -> tuple[Expr, list[Expr]]:
    """The input index output index `i` reads along one dim, and the conditions for it to be inside."""
    s = i - before if before else i
    if mode == "constant":  # test only the sides that have padding, so an unpadded side costs nothing
        return s, ([s >= 0] if before > 0 else []) + ([s < n] if after > 0 else [])
    if mode == "edge":
        return _clamp(s, 0, n - 1), []
    if mode == "wrap":
        return s % n, []
    if n == 1:  # reflect about a single element: it is its own mirror image
        return te.const(0, dtypes.INDEX), []
    s = te.select(s < 0, -s, s)
    return te.select(s >= n, 2 * (n - 1) - s, s), []


def pad_tensor(x: te.Tensor, pads: Sequence[int], mode: str, value: float, name: str) -> te.Tensor:
    """ONNX Pad over every dim: pads = (begin..., end...), negative amounts crop."""
    r = x.ndim
    before, after = list(pads[:r]), list(pads[r:])
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise InvalidExpr(f"Pad: mode must be constant, reflect, edge or wrap, got {mode!r}")
    if mode == "reflect" and any(p >= n and n > 1 for p, n in zip(before + after, x.shape * 2)):
        raise InvalidExpr(f"Pad: reflect padding {list(pads)} must be smaller than each dim of {list(x.shape)}")
    shape = tuple(n + b + a for n, b, a in zip(x.shape, before, after))
    if any(n <= 0 for n in shape):
        raise InvalidExpr(f"Pad: pads {list(pads)} crop {x.name} ({list(x.shape)}) to nothing")
    fill = te.const(value, x.dtype)

    def body(*i):
        src, inside = [], []
        for v, b, a, n in zip(i, before, after, x.shape):
            s, conds = _pad_source(v, b, a, n, mode) if b or a else (v, [])
            src.append(s)
            inside += conds
        cond = _all(inside)
        # Select is lazy: the load happens only where the index is in bounds
        return x[tuple(src)] if cond is None else te.select(cond, x[tuple(src)], fill)

    return te.compute(shape, body, name=name, tag="injective,pad")


def pad(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Pad", ins, 0, "data")
    pads = list(attrs["pads"])
    if len(pads) != 2 * x.ndim:
        raise InvalidExpr(f"Pad: {x.name} is {x.ndim}-D, so pads needs {2 * x.ndim} values, got {pads}")
    return [pad_tensor(x, pads, attrs.get("mode", "constant"), attrs.get("constant_value", 0), name)]


# ---------------------------------------------------------------------------------------------- resize


def _source_coord(i: Expr, n: int, m: int, scale: float, mode: str, roi: tuple[float, float]) -> Expr:
    """Where output coordinate `i` of `m` falls in the input of `n` (float64), as ONNX Resize's transformations
    compute it: the same operations in the same order, so ties and edges round the same way."""
    x = te.cast("float64", i)
    out_width = scale * n  # the reference's own float, not m
    # length_resized is the output's length `m`, as onnxruntime and PyTorch take it (onnx's reference evaluator takes
    # scale * n for align_corners); half_pixel_symmetric alone reads the unrounded scale * n
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and m != 1):
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":  # an output of one: the spec's 0 (onnxruntime's; onnx's reference takes -0.5,
        return te.const(0.0, "float64")  # which only cubic tells apart, its taps unclamped)
    if mode == "half_pixel_symmetric":  # half_pixel, re-centred when m was rounded from scale * n
        offset = n / 2 * (1 - m / out_width)
        return offset + (x + 0.5) / scale - 0.5
    if mode == "asymmetric":
        return x / scale
    if mode == "align_corners":
        return te.const(0.0, "float64") if m == 1 else x * float(n - 1) / (m - 1)
    if mode == "tf_crop_and_resize":
        lo, hi = roi
        if m == 1:
            return te.const((hi - lo) * (n - 1) / 2 + lo * (n - 1), "float64")
        return x * (hi - lo) * float(n - 1) / (m - 1) + lo * (n - 1)
    raise InvalidExpr(
        f"Resize: coordinate_transformation_mode {mode!r} is not supported (half_pixel, half_pixel_symmetric,"
        " pytorch_half_pixel, asymmetric, align_corners and tf_crop_and_resize are)"
    )


def _nearest_coord(i: Expr, n: int, m: int, scale: float, mode: str, roi: tuple[float, float]) -> Expr:
    """`_source_coord` as onnxruntime computes it for nearest mode: in float32 (half_pixel_symmetric: float32
    constants, then double rounded to float32), in its operations and order. Nearest rounds these coordinates, and
    float64 ones (onnx's reference, and `_source_coord`) land a rounding error away from them: 1.0000001 where
    onnxruntime has 0.99999994 or 1, which floor, ceil and a tie then round to another pixel."""
    s, n32, m32 = np.float32(scale), np.float32(n), np.float32(m)  # a scale from sizes: float32(m) / float32(n)
    x = te.cast("float32", i)

    def f32(v) -> te.Const:
        return te.const(float(np.float32(v)), "float32")

    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and m > 1):
        return (x + 0.5) / f32(s) - 0.5
    if mode == "pytorch_half_pixel":
        return f32(0)
    if mode == "asymmetric":
        return x / f32(s)
    if mode == "align_corners":
        return f32(0) if m == 1 else x * f32(n32 - 1) / f32(m32 - 1)
    if mode == "half_pixel_symmetric":
        offset = n32 / np.float32(2) * (np.float32(1) - m32 / (s * n32))
        return te.cast("float32", float(offset) + (te.cast("float64", i) + 0.5) / float(s) - 0.5)
    if mode == "tf_crop_and_resize":
        lo, hi = np.float32(roi[0]), np.float32(roi[1])
        if m == 1:
            return f32(0.5 * float(lo + hi) * float(n32 - 1))
        return f32(lo * (n32 - 1)) + x * f32(hi - lo) * f32(n32 - 1) / f32(m32 - 1)
    return _source_coord(i, n, m, scale, mode, roi)  # the error naming the modes


# onnxruntime (1.32, measured; onnx's reference has exact ties only) takes a fraction within this of .5 as a tie,
# which round_prefer_floor rounds down and round_prefer_ceil up: 6.4999995 goes to 7 under round_prefer_ceil
TIE = 1e-6


def _nearest(x: Expr, n: int, mode: str) -> Expr:
    f = te.floor(x)
    r = x - f  # exact: the fraction decides the rounding; r - 0.5 is exact too
    up = {"round_prefer_floor": r - 0.5 > TIE, "round_prefer_ceil": r - 0.5 >= -TIE, "floor": None, "ceil": r > 0.0}
    if mode not in up:
        raise InvalidExpr(f"Resize: nearest_mode must be one of {sorted(up)}, got {mode!r}")
    i = te.cast("int64", f)
    if up[mode] is not None:
        i = te.select(up[mode], i + 1, i)
    return _clamp(i, 0, n - 1)  # a negative coordinate reads pixel 0 whichever way it rounds


def _cubic_weights(t: Expr, a: float) -> list[Expr]:
    """Keys' cubic convolution weights of the 4 taps around a point `t` past the second one, in ONNX's form."""
    u, v = t + 1.0, 1.0 - t
    w = v + 1.0
    return [
        ((a * u - 5 * a) * u + 8 * a) * u - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1.0,
        ((a + 2) * v - (a + 3)) * v * v + 1.0,
        ((a * w - 5 * a) * w + 8 * a) * w - 4 * a,
    ]


def resize(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    x = _input("Resize", ins, 0, "X")
    sizes = tuple(attrs["sizes"])
    scales = list(attrs.get("scales") or [m / n for m, n in zip(sizes, x.shape)])
    mode = attrs.get("mode", "nearest")
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    roi = list(attrs.get("roi") or [0.0] * x.ndim + [1.0] * x.ndim)
    crop = coord == "tf_crop_and_resize"
    changed = [
        d for d in range(x.ndim)
        if sizes[d] != x.shape[d] or scales[d] != 1.0 or (crop and (roi[d], roi[x.ndim + d]) != (0.0, 1.0))
    ]  # fmt: skip
    if mode not in ("nearest", "linear", "cubic"):
        raise InvalidExpr(f"Resize: mode must be nearest, linear or cubic, got {mode!r}")
    if mode != "nearest" and attrs.get("antialias", 0) and any(sizes[d] < x.shape[d] for d in changed):
        raise InvalidExpr(f"Resize: antialiased {mode} downscaling is not supported")

    def src(i: tuple, d: int) -> Expr:
        where = _nearest_coord if mode == "nearest" else _source_coord
        return where(i[d], x.shape[d], sizes[d], scales[d], coord, (roi[d], roi[x.ndim + d]))

    def extrapolated(i: tuple, value: Expr) -> Expr:
        # tf_crop_and_resize: where a coordinate falls outside the input the output is extrapolation_value
        if not crop or not changed:
            return value
        outside = functools.reduce(operator.or_, [(src(i, d) < 0.0) | (src(i, d) > x.shape[d] - 1.0) for d in changed])
        return te.select(outside, te.const(attrs.get("extrapolation_value", 0.0), x.dtype), value)

    if mode == "nearest":
        nearest_mode = attrs.get("nearest_mode", "round_prefer_floor")

        def body(*i):
            at = tuple(_nearest(src(i, d), x.shape[d], nearest_mode) if d in changed else i[d] for d in range(x.ndim))
            return extrapolated(i, x[at])

        return [te.compute(sizes, body, name=name, tag="injective")]

    calc = x.dtype if dtypes.is_float(x.dtype) else "float64"

    cubic_a, exclude = attrs.get("cubic_coeff_a", -0.75), attrs.get("exclude_outside", 0)

    def taps(c: Expr, n: int) -> list[tuple[Expr, Expr]]:
        """(input index, weight) of the neighbours of coordinate `c`: 2 for linear, 4 for cubic."""
        f = te.floor(c)
        lo, t = te.cast("int64", f), c - f
        if mode == "linear":
            return [(lo, 1.0 - t), (lo + 1, t)]
        idx = [lo + (k - 1) for k in range(4)]
        weights = _cubic_weights(t, cubic_a)
        if exclude:  # taps outside the input get no weight; the rest are renormalized
            weights = [te.select((j >= 0) & (j < n), w, te.const(0.0, "float64")) for j, w in zip(idx, weights)]
            total = functools.reduce(operator.add, weights)
            weights = [w / total for w in weights]
        return list(zip(idx, weights))

    def blend(i: tuple, idx: list, dims: list[int]) -> Expr:
        # separably, outermost resized dim first (the last blend is along the innermost), as the reference does:
        # the roundings then match it
        if not dims:
            return te.cast(calc, x[tuple(idx)])
        d, total = dims[0], None
        for j, w in taps(src(i, d), x.shape[d]):
            idx[d] = _clamp(j, 0, x.shape[d] - 1)  # clamped: the reference pads the edges
            term = te.cast(calc, w) * blend(i, list(idx), dims[1:])
            total = term if total is None else total + term
        return total

    def body(*i):
        v = blend(i, list(i), sorted(changed, reverse=True))
        if not dtypes.is_float(x.dtype):  # integers: rounded half to even and saturated, as the reference casts
            low, high = te.min_value(x.dtype).value, te.max_value(x.dtype).value
            v = _clamp(round_half_even(v), float(low), float(high))
        return extrapolated(i, te.cast(x.dtype, v))

    return [te.compute(sizes, body, name=name, tag="injective")]


TRANSFORM_OPS = {
    "Reshape": reshape,
    "Flatten": flatten,
    "Squeeze": squeeze,
    "Unsqueeze": unsqueeze,
    "Transpose": transpose,
    "Concat": concat,
    "Split": split,
    "Slice": slice_,
    "Gather": gather,
    "Expand": expand,
    "Tile": tile,
    "Pad": pad,
    "Resize": resize,
    "Identity": identity,
    "Dropout": identity,  # inference: the data passes through; the optional mask output is not produced
}
