"""Reductions: ONNX Reduce* (with keepdims and noop_with_empty_axes), ArgMax / ArgMin, GlobalAverage/MaxPool.

A reduction is one stage whose body is the reduce; what comes before it (|x|, x², exp(x - max)) is inlined
into that body and what comes after (the mean's division, the log, the sqrt) is a second, elementwise stage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compiler.base import dtypes
from compiler.base.errors import InvalidExpr
from compiler.tensor import te
from compiler.tensor.ops.checks import ALL, FLOATS, NUMERIC, _c, _dtype_in, _input, _lanes
from compiler.tensor.ops.transform import reshape_to

Expr = te.Expr
Ins = Sequence[te.Tensor | None]


def _reduced_axes(op: str, x: te.Tensor, axes: Sequence[int]) -> list[int]:
    bad = [a for a in axes if not 0 <= a < x.ndim]
    if bad:
        raise InvalidExpr(f"{op}: axes {bad} are out of range for the {x.ndim}-D input {x.name}")
    return sorted(set(axes))


def reduce_over(
    x: te.Tensor,
    axes: Sequence[int],
    keepdims: bool,
    reducer: Callable,
    pre: Callable[[Expr, tuple], Expr],
    name: str,
) -> te.Tensor:
    """reducer(pre(x[j], out_index)) over `axes`: the output keeps those dims as 1 (keepdims) or drops them."""
    ks = {d: te.reduce_axis(x.shape[d], f"k{d}") for d in axes}
    shape = tuple(1 if d in ks else n for d, n in enumerate(x.shape) if keepdims or d not in ks)

    def body(*out):
        rest = iter([out[d] for d in range(x.ndim) if d not in ks] if keepdims else out)
        src = tuple(ks[d] if d in ks else next(rest) for d in range(x.ndim))
        return reducer(pre(x[src], out), axis=list(ks.values()))

    return te.compute(shape, body, name=name, tag="comm_reduce")


def _kept(out: tuple, axes: Sequence[int], ndim: int, keepdims: bool) -> tuple:
    """An output index as an index of the keepdims shape: 0 at the reduced axes."""
    if keepdims:
        return tuple(0 if d in axes else i for d, i in enumerate(out))
    rest = iter(out)
    return tuple(0 if d in axes else next(rest) for d in range(ndim))


def _mean_divide(s: te.Tensor, n: int, name: str) -> te.Tensor:
    if dtypes.is_float(s.dtype):
        return te.compute(s.shape, lambda *i: s[i] / float(n), name=name, tag="elemwise")
    # integer mean truncates toward zero, like numpy's mean cast back to the integer dtype
    body = lambda *i: te.select(s[i] < _c(0, s), -((-s[i]) // n), s[i] // n)
    return te.compute(s.shape, body, name=name, tag="elemwise")


def _log_sum_exp(x: te.Tensor, axes: list[int], keepdims: bool, name: str) -> te.Tensor:
    # subtract the max first so exp cannot overflow
    mx = reduce_over(x, axes, True, te.max, lambda v, o: v, f"{name}_max")
    at = lambda out: mx[_kept(out, axes, x.ndim, keepdims)]
    sm = reduce_over(x, axes, keepdims, te.sum, lambda v, o: te.exp(v - at(o)), f"{name}_sum")
    return te.compute(sm.shape, lambda *i: te.log(sm[i]) + at(i), name=name, tag="broadcast")


PRODUCT_CHUNK = 16  # factors multiplied out in one expression


def _product(x: te.Tensor, axes: list[int], keepdims: bool, name: str) -> te.Tensor:
    """The product over `axes`. te has no product reduction, so each axis is multiplied out as an unrolled
    expression of at most PRODUCT_CHUNK loads, in rounds of chunks for longer axes; exact for integers
    (wrapping like numpy), a different order of roundings than numpy's loop for floats."""
    stages = 0

    def step(t: te.Tensor, d: int, last: bool) -> te.Tensor:
        nonlocal stages
        n = t.shape[d]
        chunks = -(-n // PRODUCT_CHUNK)
        size = n if chunks == 1 else PRODUCT_CHUNK
        one = te.const(1, t.dtype)

        def body(*i):
            prod = None
            for j in range(size):
                at = i[d] * size + j if chunks > 1 else j
                v = t[i[:d] + (at,) + i[d + 1 :]]
                if chunks > 1 and (chunks - 1) * size + j >= n:  # only the last chunk can run past the end
                    v = te.select(at < n, v, one)
                prod = v if prod is None else prod * v
            return prod

        shape = t.shape[:d] + (chunks,) + t.shape[d + 1 :]
        stages += 1
        done = last and chunks == 1 and keepdims
        out = te.compute(shape, body, name=name if done else f"{name}_p{stages}", tag="comm_reduce")
        return out if chunks == 1 else step(out, d, last)

    for k, d in enumerate(axes):
        x = step(x, d, k == len(axes) - 1)
    if keepdims:
        return x
    return reshape_to(x, [n for d, n in enumerate(x.shape) if d not in axes], name)


# op -> (dtypes, reducer, element before reducing, element-wise stage after (or None))
REDUCE: dict[str, tuple[tuple[str, ...], Callable, Callable[[Expr], Expr], Callable[[Expr], Expr] | None]] = {
    "ReduceSum": (NUMERIC, te.sum, lambda v: v, None),
    "ReduceMean": (NUMERIC, te.sum, lambda v: v, None),  # the division is `_mean_divide`
    "ReduceMax": (ALL, te.max, lambda v: v, None),  # over bool: any (see `_bool_extreme`)
    "ReduceMin": (ALL, te.min, lambda v: v, None),  # over bool: all
    "ReduceL1": (NUMERIC, te.sum, te.abs, None),
    "ReduceSumSquare": (NUMERIC, te.sum, lambda v: v * v, None),
    "ReduceL2": (FLOATS, te.sum, lambda v: v * v, te.sqrt),
    "ReduceLogSum": (FLOATS, te.sum, lambda v: v, te.log),
    "ReduceLogSumExp": (FLOATS, te.sum, lambda v: v, None),  # built by `_log_sum_exp`
    "ReduceProd": (NUMERIC, None, lambda v: v, None),  # built by `_product`
}


def _bool_extreme(x: te.Tensor, axes: list[int], keepdims: bool, reducer: Callable, name: str) -> te.Tensor:
    """Max or min of bools (any / all), reduced as uint8: the reduction's identity needs a numeric dtype."""
    red = reduce_over(x, axes, keepdims, reducer, lambda v, o: te.cast("uint8", v), f"{name}_reduce")
    return te.compute(red.shape, lambda *i: te.cast("bool", red[i]), name=name, tag="elemwise")


def reduce(op: str):
    """The builder of the REDUCE row `op`."""
    allowed, reducer, pre, post = REDUCE[op]

    def build(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
        x = _input(op, ins, 0, "data")
        _dtype_in(op, x, allowed)
        axes, keepdims = list(attrs.get("axes", [])), bool(attrs.get("keepdims", 1))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):  # nothing reduced, the elementwise parts applied as ONNX says
                done = post or (lambda v: v)
                return [te.compute(x.shape, lambda *i: done(pre(x[i])), name=name, tag="elemwise")]
            axes = list(range(x.ndim))
        axes = _reduced_axes(op, x, axes)
        if op == "ReduceLogSumExp":
            return [_log_sum_exp(x, axes, keepdims, name)]
        if op == "ReduceProd":
            return [_product(x, axes, keepdims, name)]
        if x.dtype == "bool":
            return [_bool_extreme(x, axes, keepdims, reducer, name)]
        last = op == "ReduceSum" or op in ("ReduceMax", "ReduceMin", "ReduceL1", "ReduceSumSquare")
        red = reduce_over(x, axes, keepdims, reducer, lambda v, o: pre(v), name if last else f"{name}_reduce")
        if op == "ReduceMean":
            n = 1
            for d in axes:
                n *= x.shape[d]
            return [_mean_divide(red, n, name)]
        if post is not None:
            return [te.compute(red.shape, lambda *i: post(red[i]), name=name, tag="elemwise")]
        return [red]

    return build


def arg_reduce(op: str):
    """ArgMax / ArgMin: the max (min), then the first (or last) index holding it, as int64."""
    reducer = te.max if op == "ArgMax" else te.min

    def build(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
        x = _input(op, ins, 0, "data")
        _dtype_in(op, x, NUMERIC)
        axis, keepdims, last = attrs.get("axis", 0), bool(attrs.get("keepdims", 1)), attrs.get("select_last_index", 0)
        _reduced_axes(op, x, [axis])
        best = reduce_over(x, [axis], True, reducer, lambda v, o: v, f"{name}_value")
        n = x.shape[axis]
        k = te.reduce_axis(n, f"j{axis}")
        shape = tuple(1 if d == axis else s for d, s in enumerate(x.shape) if keepdims or d != axis)

        def body(*out):
            at = _kept(out, [axis], x.ndim, keepdims)
            hit = te.equal(x[at[:axis] + (k,) + at[axis + 1 :]], best[at])
            # the first index: min over the hits (non-hits count as n); the last: max (non-hits as -1)
            if last:
                return te.max(te.select(hit, k, te.const(-1, "int64")), axis=k)
            return te.min(te.select(hit, k, te.const(n, "int64")), axis=k)

        return [te.compute(shape, body, name=name, tag="comm_reduce")]

    return build


def global_pool(op: str):
    """GlobalAveragePool / GlobalMaxPool: reduce every spatial dim (2 onward), keeping them as size 1. With
    layout "NCHWc" (set by `propagate_nchwc`) the last axis holds channel lanes and is kept."""

    def build(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
        x = _input(op, ins, 0, "X")
        _dtype_in(op, x, FLOATS)
        lanes = _lanes(attrs)
        if x.ndim < 3 + lanes:
            raise InvalidExpr(f"{op}: input {x.name} must be N x C x spatial..., got {x.ndim}-D")
        axes = list(range(2, x.ndim - lanes))
        if op == "GlobalMaxPool":
            return [reduce_over(x, axes, True, te.max, lambda v, o: v, name)]
        total = reduce_over(x, axes, True, te.sum, lambda v, o: v, f"{name}_sum")
        n = 1
        for d in axes:
            n *= x.shape[d]
        return [_mean_divide(total, n, name)]

    return build


def top_k(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """TopK without a sort: each element's rank (how many elements beat it, ties broken by the lower index, as
    ONNX orders them), then output j is the element of rank j. O(n^2) along the axis, all reductions."""
    x = _input("TopK", ins, 0, "X")
    _dtype_in("TopK", x, NUMERIC)
    axis, k, largest = attrs.get("axis", x.ndim - 1), attrs["k"], attrs.get("largest", 1)
    _reduced_axes("TopK", x, [axis])
    n = x.shape[axis]
    if not 1 <= k <= n:
        raise InvalidExpr(f"TopK: k={k} must be in 1..{n} (the size of axis {axis} of {x.name})")
    at = lambda i, j: i[:axis] + (j,) + i[axis + 1 :]  # index i with position j along the axis
    m = te.reduce_axis(n, "m")

    def beats(i):
        other, mine = x[at(i, m)], x[i]
        better = other > mine if largest else other < mine
        return te.cast("int64", better | (te.equal(other, mine) & (m < i[axis])))

    rank = te.compute(x.shape, lambda *i: te.sum(beats(i), axis=m), name=f"{name}_rank", tag="comm_reduce")
    shape = at(x.shape, k)

    def pick(value, none, suffix):
        # exactly one position has rank j: the max over it and `none` everywhere else picks its value or index
        r = te.reduce_axis(n, "r")
        body = lambda *i: te.max(te.select(te.equal(rank[at(i, r)], i[axis]), value(i, r), none), axis=r)
        return te.compute(shape, body, name=f"{name}_{suffix}", tag="comm_reduce")

    # both outputs read only `rank`, not each other: an output feeding another output could not be scheduled
    # like an intermediate stage
    values = pick(lambda i, r: x[at(i, r)], te.min_value(x.dtype), "values")
    indices = pick(lambda i, r: r, te.const(-1, "int64"), "indices")
    return [values, indices]


REDUCE_OPS = {
    "TopK": top_k,
    **{op: reduce(op) for op in REDUCE},
    "ArgMax": arg_reduce("ArgMax"),
    "ArgMin": arg_reduce("ArgMin"),
    "GlobalAveragePool": global_pool("GlobalAveragePool"),
    "GlobalMaxPool": global_pool("GlobalMaxPool"),
}
