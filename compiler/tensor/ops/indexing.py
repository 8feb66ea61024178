"""Ops that address their data through indices or positions: GatherElements, GatherND, ScatterElements, ScatterND,
OneHot, Trilu, CumSum and Einsum.

Indices are clamped into range where they are read (negative ones count from the end, as ONNX says), so a bad index
reads a wrong element rather than out of bounds. A scatter is written as a gather: each output element finds the
updates aimed at it by a reduction over the update positions, so no kernel ever stores through a run-time index.
"""

from __future__ import annotations

from collections.abc import Sequence

from compiler.base.errors import InvalidExpr
from compiler.tensor import te
from compiler.tensor.ops.checks import ALL, NUMERIC, _dims, _dtype_in, _input
from compiler.tensor.ops.transform import _clamp, _position

Ins = Sequence[te.Tensor | None]


def _index(op: str, idx: te.Tensor) -> None:
    if idx.dtype not in ("int32", "int64"):
        raise InvalidExpr(f"{op}: indices {idx.name} must be int32 or int64, got {idx.dtype}")


def gather_elements(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """out[i] = data[i with its `axis` coordinate replaced by indices[i]]."""
    data, idx = _input("GatherElements", ins, 0, "data"), _input("GatherElements", ins, 1, "indices")
    _index("GatherElements", idx)
    axis, n = attrs["axis"], data.shape[attrs["axis"]]
    if idx.ndim != data.ndim:
        raise InvalidExpr(f"GatherElements: indices {_dims(idx)} must have the rank of data {_dims(data)}")

    def body(*i):
        return data[i[:axis] + (_position(idx[i], n),) + i[axis + 1 :]]

    return [te.compute(idx.shape, body, name=name, tag="injective")]


def gather_nd(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """out[b, q, r] = data[b, indices[b, q, 0..k-1], r]: the last axis of indices addresses data's first k axes after
    its `batch_dims` leading ones."""
    data, idx = _input("GatherND", ins, 0, "data"), _input("GatherND", ins, 1, "indices")
    _index("GatherND", idx)
    b, k = attrs.get("batch_dims", 0), idx.shape[-1]
    if b + k > data.ndim or idx.shape[:b] != data.shape[:b]:
        raise InvalidExpr(f"GatherND: indices {_dims(idx)} do not address data {_dims(data)} with batch_dims={b}")
    lead = idx.ndim - 1
    shape = idx.shape[:-1] + data.shape[b + k :]

    def body(*i):
        at = tuple(_position(idx[i[:lead] + (m,)], data.shape[b + m]) for m in range(k))
        return data[i[:b] + at + i[lead:]]

    return [te.compute(shape, body, name=name, tag="injective")]


def _scatter(data: te.Tensor, updates: te.Tensor, hits, name: str, reduction: str) -> te.Tensor:
    """The scatter of `updates` onto `data` as a gather: `hits(out, js)` says whether the update at position js lands
    on output element `out`. Without a reduction the last update aimed at an element wins."""
    positions = updates.shape

    def over_hits(stage: str, reducer, value, identity: te.Expr) -> te.Tensor:
        """Per output element, `reducer` over the updates that land on it of value(js) (`identity` where none does)."""
        js = [te.reduce_axis(n, f"j{d}") for d, n in enumerate(positions)]
        body = lambda *o: reducer(te.select(hits(o, js), value(js), identity), js)
        return te.compute(data.shape, body, name=f"{name}_{stage}")

    def flat(js) -> te.Expr:
        at: te.Expr = te.const(0, "int64")
        for j, n in zip(js, positions):
            at = at * n + te.cast("int64", j)
        return at

    def unflat(at: te.Expr) -> tuple[te.Expr, ...]:
        out: list[te.Expr] = []
        for n in reversed(positions):
            out.insert(0, _clamp(at % n, 0, n - 1))
            at = at // n
        return tuple(out)

    if reduction == "none":
        last = over_hits("last", te.max, flat, te.const(-1, "int64"))
        body = lambda *o: te.select(last[o] >= 0, updates[unflat(last[o])], data[o])
        return te.compute(data.shape, body, name=name, tag="injective")
    if reduction == "add":
        added = over_hits("add", te.sum, lambda js: updates[tuple(js)], te.const(0, data.dtype))
        return te.compute(data.shape, lambda *o: data[o] + added[o], name=name)
    if reduction == "max":
        reducer, pick, none = te.max, te.maximum, te.min_value
    else:
        reducer, pick, none = te.min, te.minimum, te.max_value
    got = over_hits(reduction, reducer, lambda js: updates[tuple(js)], none(data.dtype))
    hit = over_hits("hit", te.max, lambda js: te.const(1, "int32"), te.const(0, "int32"))
    return te.compute(data.shape, lambda *o: te.select(hit[o] > 0, pick(data[o], got[o]), data[o]), name=name)


def _check_reduction(op: str, reduction: str) -> None:
    if reduction not in ("none", "add", "max", "min"):
        raise InvalidExpr(f"{op}: reduction={reduction!r} is not supported (none, add, max, min are)")


def scatter_elements(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """out = data, with out[j with its `axis` coordinate replaced by indices[j]] = updates[j] for every j."""
    data = _input("ScatterElements", ins, 0, "data")
    idx, updates = _input("ScatterElements", ins, 1, "indices"), _input("ScatterElements", ins, 2, "updates")
    _index("ScatterElements", idx)
    reduction, axis = attrs.get("reduction", "none"), attrs["axis"]
    _check_reduction("ScatterElements", reduction)
    if idx.shape != updates.shape or idx.ndim != data.ndim:
        raise InvalidExpr(f"ScatterElements: indices {_dims(idx)} and updates {_dims(updates)} must match in shape "
                          f"and have the rank of data {_dims(data)}")  # fmt: skip
    n = data.shape[axis]

    def hits(o, js):
        cond = te.equal(_position(idx[tuple(js)], n), te.cast("int64", o[axis]))
        for d, (oo, j) in enumerate(zip(o, js)):
            if d != axis:
                cond = cond & te.equal(te.cast("int64", oo), te.cast("int64", j))
        return cond

    return [_scatter(data, updates, hits, name, reduction)]


def scatter_nd(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """out = data, with out[indices[q, 0..k-1], r] = updates[q, r] for every q."""
    data = _input("ScatterND", ins, 0, "data")
    idx, updates = _input("ScatterND", ins, 1, "indices"), _input("ScatterND", ins, 2, "updates")
    _index("ScatterND", idx)
    reduction, k, lead = attrs.get("reduction", "none"), idx.shape[-1], idx.ndim - 1
    _check_reduction("ScatterND", reduction)
    if k > data.ndim or updates.shape != idx.shape[:-1] + data.shape[k:]:
        raise InvalidExpr(f"ScatterND: updates {_dims(updates)} must be indices' {_dims(idx)} leading shape then "
                          f"data's {_dims(data)} trailing one")  # fmt: skip

    def hits(o, js):
        same = [te.equal(_position(idx[tuple(js[:lead]) + (m,)], data.shape[m]), te.cast("int64", o[m]))
                for m in range(k)]  # fmt: skip
        same += [te.equal(te.cast("int64", oo), te.cast("int64", j)) for oo, j in zip(o[k:], js[lead:])]
        cond = same[0]
        for s in same[1:]:
            cond = cond & s
        return cond

    return [_scatter(data, updates, hits, name, reduction)]


def one_hot(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """out[.., d, ..] = on where indices[.., ..] == d (negative indices counting from depth), off elsewhere."""
    idx = _input("OneHot", ins, 0, "indices")
    _dtype_in("OneHot", idx, NUMERIC)
    depth, axis, dtype = attrs["depth"], attrs["axis"], attrs["dtype"]
    off, on = (te.const(v, dtype) for v in attrs["values"])
    shape = idx.shape[:axis] + (depth,) + idx.shape[axis:]

    def body(*o):
        raw = te.cast("int64", idx[o[:axis] + o[axis + 1 :]])  # ONNX casts (float) indices to int64
        at = te.select(raw < 0, raw + depth, raw)
        return te.select(te.equal(at, te.cast("int64", o[axis])), on, off)

    return [te.compute(shape, body, name=name, tag="injective")]


def trilu(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """The upper (or lower) triangle of the last two axes from diagonal k on; the rest 0."""
    x = _input("Trilu", ins, 0, "input")
    _dtype_in("Trilu", x, ALL)
    if x.ndim < 2:
        raise InvalidExpr(f"Trilu: input {x.name} must have at least 2 dims, got {_dims(x)}")
    upper, k_in = attrs.get("upper", 1), ins[1] if len(ins) > 1 else None
    if k_in is not None and k_in.shape not in ((), (1,)):
        raise InvalidExpr(f"Trilu: k {k_in.name} must be a scalar, got {_dims(k_in)}")

    def body(*i):
        k = te.cast("int64", k_in[(0,) * k_in.ndim]) if k_in is not None else attrs.get("k", 0)
        offset = te.cast("int64", i[-1]) - te.cast("int64", i[-2])
        keep = offset >= k if upper else offset <= k
        return te.select(keep, x[i], te.const(0, x.dtype) if x.dtype != "bool" else te.const(False, "bool"))

    return [te.compute(x.shape, body, name=name, tag="injective")]


def cumsum(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """Running sums along `axis`: each element the sum of those before it (and itself unless `exclusive`), counted
    from the end with `reverse`."""
    x = _input("CumSum", ins, 0, "x")
    _dtype_in("CumSum", x, NUMERIC)
    axis, exclusive, reverse = attrs["axis"], attrs.get("exclusive", 0), attrs.get("reverse", 0)
    j = te.reduce_axis(x.shape[axis], "j")

    def body(*i):
        at, jj = te.cast("int64", i[axis]), te.cast("int64", j)
        before = (jj > at if exclusive else jj >= at) if reverse else (jj < at if exclusive else jj <= at)
        return te.sum(te.select(before, x[i[:axis] + (j,) + i[axis + 1 :]], te.const(0, x.dtype)), axis=j)

    return [te.compute(x.shape, body, name=name, tag="comm_reduce")]


def einsum(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """Einstein summation: the product of the operands over every letter, summed over the letters the output lacks.
    `attrs["equation"]` is explicit ("ij,jk->ik"), its ellipses already spelled out as letters (the converter's)."""
    ops = [t for t in ins if t is not None]
    lhs, out = attrs["equation"].split("->")
    terms = lhs.split(",")
    if len(terms) != len(ops):
        raise InvalidExpr(f"Einsum: equation {attrs['equation']!r} has {len(terms)} operands, the node {len(ops)}")
    for t in ops:
        _dtype_in("Einsum", t, NUMERIC)
    extent: dict[str, int] = {}
    for term, t in zip(terms, ops):
        if len(term) != t.ndim:
            raise InvalidExpr(f"Einsum: operand {t.name} {_dims(t)} does not have the rank of {term!r}")
        for letter, n in zip(term, t.shape):
            if extent.setdefault(letter, n) != n:
                raise InvalidExpr(f"Einsum: letter {letter!r} stands for both {extent[letter]} and {n}")
    summed = [c for c in dict.fromkeys("".join(terms)) if c not in out]
    axes = {c: te.reduce_axis(extent[c], f"r_{c}") for c in summed}
    shape = tuple(extent[c] for c in out)

    def body(*i):
        var = {**dict(zip(out, i)), **axes}
        prod = None
        for term, t in zip(terms, ops):
            v = t[tuple(var[c] for c in term)]
            prod = v if prod is None else prod * v
        return te.sum(prod, axis=list(axes.values())) if axes else prod

    return [te.compute(shape, body, name=name, tag="einsum")]


INDEXING_OPS = {
    "GatherElements": gather_elements,
    "GatherND": gather_nd,
    "ScatterElements": scatter_elements,
    "ScatterND": scatter_nd,
    "OneHot": one_hot,
    "Trilu": trilu,
    "CumSum": cumsum,
    "Einsum": einsum,
}
