"""A ComputeDAG as JSON text and back, losslessly: the records database keeps each workload's DAG this way, so a
cost model can be trained on records of workloads that no model at hand contains (compiler.search.transfer).

The canonical text (ComputeDAG.canonical_text) names a workload but drops what does not change its identity
(stage names, tags, some constant dtypes); this form keeps every field. `from_json` rebuilds the ops in their
stored order and checks the result against the workload key stored beside it, so a DAG written by a tilefarm
whose DAG rules differ is refused rather than trained on under the wrong name.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from compiler.base import dtypes
from compiler.base.errors import TilefarmError
from compiler.tensor import te
from compiler.tensor.dag import ComputeDAG, Op
from compiler.tensor.te import Expr

FORMAT = 1


class DAGFormatError(TilefarmError):
    """Stored DAG text that cannot be read back into the workload it claims to be."""


def to_json(dag: ComputeDAG) -> str:
    ops = [
        [op.name, list(op.shape), op.dtype]
        if op.body is None
        else [op.name, list(op.shape), op.dtype, [_var(a) for a in op.axes], _expr(op.body), op.tag]
        for op in dag.ops
    ]
    doc = {"format": FORMAT, "ops": ops, "inputs": list(dag.inputs), "outputs": list(dag.outputs)}
    return json.dumps(doc, separators=(",", ":"))  # non-finite constants come out as Infinity / NaN, read back


def from_json(text: str, workload_key: str | None = None) -> ComputeDAG:
    """The DAG `to_json` wrote; with `workload_key`, raises DAGFormatError unless the rebuilt DAG has that key."""
    try:
        doc = json.loads(text)
        if doc.get("format") != FORMAT:
            raise DAGFormatError(f"DAG format {doc.get('format')!r}, this tilefarm reads format {FORMAT}")
        ops = tuple(_op(o) for o in doc["ops"])
        dag = ComputeDAG.from_ops(ops, tuple(doc["inputs"]), tuple(doc["outputs"]))
    except DAGFormatError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, TilefarmError) as e:
        raise DAGFormatError(f"not a stored ComputeDAG: {type(e).__name__}: {e}") from None
    if workload_key is not None and dag.workload_key != workload_key:
        raise DAGFormatError(f"the stored DAG rebuilds as workload {dag.workload_key}, not {workload_key}")
    return dag


# ---------------------------------------------------------------------------------------------- encoding


def _var(v: te.Var) -> list:
    return [v.name, v.extent, v.dtype]


def _expr(e: Expr) -> list:
    if isinstance(e, te.Const):
        return ["const", e.value, e.dtype]
    if isinstance(e, te.Var):
        return ["var", *_var(e)]
    if isinstance(e, te.Binary):
        return ["binary", e.op, _expr(e.a), _expr(e.b)]
    if isinstance(e, te.Unary):
        return ["unary", e.op, _expr(e.a)]
    if isinstance(e, te.Select):
        return ["select", _expr(e.cond), _expr(e.t), _expr(e.f)]
    if isinstance(e, te.Cast):
        return ["cast", e.dtype, _expr(e.a)]
    if isinstance(e, te.Load):
        return ["load", e.buffer, [_expr(i) for i in e.indices], e.dtype]
    if isinstance(e, te.Reduce):
        return ["reduce", e.op, _expr(e.body), [_var(a) for a in e.axes]]
    raise TypeError(f"no JSON form for expression node {type(e).__name__}")


# ---------------------------------------------------------------------------------------------- decoding


def _op(o: list) -> Op:
    name, shape, dtype = str(o[0]), tuple(int(s) for s in o[1]), dtypes.check(o[2])
    if len(o) == 3:
        return Op(name, shape, dtype)
    axes = tuple(_var_of(a) for a in o[3])
    return Op(name, shape, dtype, axes, _expr_of(o[4]), str(o[5]))


def _var_of(v: list) -> te.Var:
    name, extent, dtype = v
    return te.Var(str(name), None if extent is None else int(extent), dtypes.check(dtype))


def _expr_of(node: list) -> Expr:
    kind, *rest = node
    decode = _DECODERS.get(kind)
    if decode is None:
        raise ValueError(f"unknown expression node {kind!r}")
    return decode(*rest)


def _const(value: Any, dtype: str) -> te.Const:
    dtype = dtypes.check(dtype)
    if dtype == "bool":
        return te.Const(bool(value), dtype)
    if dtypes.is_float(dtype):
        return te.Const(float(value), dtype)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"integer constant {value}")
    return te.Const(int(value), dtype)


_DECODERS: dict[str, Callable[..., Expr]] = {
    "const": _const,
    "var": lambda name, extent, dtype: _var_of([name, extent, dtype]),
    "binary": lambda op, a, b: te.Binary(_known(op, te.ARITH + te.COMPARE + te.LOGIC), _expr_of(a), _expr_of(b)),
    "unary": lambda op, a: te.Unary(_known(op, te.INTRINSICS), _expr_of(a)),
    "select": lambda c, t, f: te.Select(_expr_of(c), _expr_of(t), _expr_of(f)),
    "cast": lambda dtype, a: te.Cast(dtypes.check(dtype), _expr_of(a)),
    "load": lambda buf, idx, dtype: te.Load(str(buf), tuple(_expr_of(i) for i in idx), dtypes.check(dtype)),
    "reduce": lambda op, body, axes: te.Reduce(_known(op, te.REDUCERS), _expr_of(body), tuple(map(_var_of, axes))),
}


def _known(op: str, allowed: tuple[str, ...]) -> str:
    if op not in allowed:
        raise ValueError(f"unknown operator {op!r}")
    return op
