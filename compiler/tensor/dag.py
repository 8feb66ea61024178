"""ComputeDAG: the stages of a tensor computation, their access analysis, FLOPs and workload key."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from compiler.base import dtypes
from compiler.base.errors import InvalidExpr
from compiler.tensor import te
from compiler.tensor.te import Expr, Load, Reduce, Var

EXPENSIVE = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "pow")


@dataclass(frozen=True)
class Op:
    """One stage's definition: a placeholder (body None) or a compute whose loads name other ops."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    axes: tuple[Var, ...] = ()
    body: Expr | None = None
    tag: str = ""

    @property
    def is_placeholder(self) -> bool:
        return self.body is None

    @property
    def reduce_axes(self) -> tuple[Var, ...]:
        return self.body.axes if isinstance(self.body, Reduce) else ()

    @property
    def value(self) -> Expr:
        """The per-element expression (the reduction's body for a reduction)."""
        return self.body.body if isinstance(self.body, Reduce) else self.body

    @cached_property
    def loops(self) -> tuple[tuple[tuple[str, int | None], ...], tuple[tuple[str, int | None], ...]]:
        """(name, extent) of each axis, then of each reduce axis: all of the op that its stage's loops derive from
        (state.derive keys its cache on this, so ops rebuilt alike, as every replay of a cache_write rebuilds its
        two, share entries)."""
        return tuple((a.name, a.extent) for a in self.axes), tuple((r.name, r.extent) for r in self.reduce_axes)

    @cached_property
    def reads(self) -> tuple[str, ...]:
        if self.body is None:
            return ()
        return tuple(dict.fromkeys(ld.buffer for ld in te.loads(self.body)))

    def __str__(self):
        if self.body is None:
            return f"{self.name} = placeholder({list(self.shape)}, {self.dtype})"
        idx = ", ".join(a.name for a in self.axes)
        return f"{self.name}[{idx}] = {self.body}"


class ComputeDAG:
    """The ops of a computation in topological order, built from its input and output tensors.

    `tensors` lists inputs (placeholders, in the kernel's argument order) and outputs; placeholders that are read
    but not listed are appended in the order they are first reached.
    """

    def __init__(self, tensors: Sequence[te.Tensor]):
        listed_inputs = [t for t in tensors if isinstance(t.op, te.PlaceholderOp)]
        outputs = [t for t in tensors if isinstance(t.op, te.ComputeOp)]
        if not outputs:
            raise InvalidExpr("a ComputeDAG needs at least one computed output tensor")
        order = topological_tensors(outputs)
        names = _unique_names(order)
        self.ops: tuple[Op, ...] = tuple(_to_op(t, names) for t in order)
        placeholders = [t for t in order if isinstance(t.op, te.PlaceholderOp)]
        unknown = [t for t in listed_inputs if t not in placeholders]
        if unknown:
            raise InvalidExpr(f"inputs {[t.name for t in unknown]} are not read by any output")
        inputs = listed_inputs + [t for t in placeholders if t not in listed_inputs]
        self.inputs: tuple[str, ...] = tuple(names[t] for t in inputs)
        self.outputs: tuple[str, ...] = tuple(names[t] for t in outputs)
        self._by_name = {op.name: op for op in self.ops}

    @classmethod
    def from_ops(cls, ops: tuple[Op, ...], inputs: tuple[str, ...], outputs: tuple[str, ...]) -> ComputeDAG:
        """A DAG from ops already in topological order (a stored DAG, compiler.tensor.dag_json), checked as it is built:
        unique names, every load of an earlier op, the inputs placeholders and the outputs computes."""
        by_name: dict[str, Op] = {}
        for op in ops:
            if op.name in by_name:
                raise InvalidExpr(f"two stages are named {op.name}")
            missing = [r for r in op.reads if r not in by_name]
            if missing:
                raise InvalidExpr(f"stage {op.name} reads {missing}, which no earlier stage defines")
            by_name[op.name] = op
        placeholders = [op.name for op in ops if op.is_placeholder]
        if sorted(inputs) != sorted(placeholders):
            raise InvalidExpr(f"inputs {list(inputs)} are not the placeholders {placeholders}")
        if not outputs or any(n not in by_name or by_name[n].is_placeholder for n in outputs):
            raise InvalidExpr(f"outputs {list(outputs)} are not computed stages")
        dag = cls.__new__(cls)
        dag.ops, dag.inputs, dag.outputs, dag._by_name = tuple(ops), tuple(inputs), tuple(outputs), by_name
        return dag

    def op(self, name: str) -> Op:
        return self._by_name[name]

    @cached_property
    def consumers(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {op.name: [] for op in self.ops}
        for op in self.ops:
            for r in op.reads:
                out[r].append(op.name)
        return {k: tuple(v) for k, v in out.items()}

    # ------------------------------------------------------------------------------------------ cost

    @cached_property
    def flop_count(self) -> int:
        """Floating/integer arithmetic on values (index arithmetic excluded), Ansor's FlopEstimator convention."""
        total = 0
        for op in self.ops:
            if op.body is None:
                continue
            points = _prod(op.shape) * _prod(a.extent for a in op.reduce_axes)
            total += points * (_count_ops(op.value) + (1 if op.reduce_axes else 0))
        return total

    # ------------------------------------------------------------------------------------------ identity

    @cached_property
    def canonical_text(self) -> str:
        """The computation with tensors and axes renamed by position: equal for structurally identical DAGs."""
        rename = {op.name: f"T{i}" for i, op in enumerate(self.ops)}
        lines = []
        for op in self.ops:
            if op.body is None:
                lines.append(f"{rename[op.name]} = placeholder({list(op.shape)}, {op.dtype})")
                continue
            axes = {a.name: Var(f"s{i}", a.extent) for i, a in enumerate(op.axes)}
            axes.update({r.name: Var(f"r{i}", r.extent) for i, r in enumerate(op.reduce_axes)})
            body = te.rewrite(op.body, lambda n, ax=axes: _rename_node(n, ax, rename))
            lines.append(f"{rename[op.name]}{list(op.shape)}:{op.dtype} = {body}")
        lines.append(f"inputs {[rename[n] for n in self.inputs]} outputs {[rename[n] for n in self.outputs]}")
        return "\n".join(lines)

    @cached_property
    def workload_key(self) -> str:
        return hashlib.sha256(self.canonical_text.encode()).hexdigest()[:32]

    def __str__(self):
        return "\n".join(str(op) for op in self.ops)

    # ------------------------------------------------------------------------------------------ access analysis

    def is_output(self, name: str) -> bool:
        return name in self.outputs

    def is_strictly_inlinable(self, name: str) -> bool:
        """Elementwise in its own axis order, no reduction, no branch, no expensive intrinsic (Ansor's predicate)."""
        return not self.is_output(name) and strictly_inlinable(self.op(name))

    def needs_multi_level_tiling(self, name: str) -> bool:
        """Data reuse: some inputs' indices miss an output axis (two inputs, or one with a reduction)."""
        return needs_multi_level_tiling(self.op(name))

    def elementwise_match(self, producer: str, consumer: str) -> bool:
        """`consumer` reads `producer` at exactly its own index and has the same shape."""
        p, c = self.op(producer), self.op(consumer)
        if c.body is None or p.shape != c.shape:
            return False
        return all(at_own_index(ld, c.axes) for ld in te.loads(c.body) if ld.buffer == producer)


def feeding_reduction(dag: ComputeDAG, name: str) -> Op | None:
    """The reduction whose result reaches stage `name` through stages that each read one computed stage (an
    epilogue's bias add and activation), or `name`'s own op if it is one; None where a stage on the way reads more
    computed stages than one, or none."""
    op = dag.op(name)
    while not op.reduce_axes:
        reads = [r for r in op.reads if not dag.op(r).is_placeholder]
        if len(reads) != 1:
            return None
        op = dag.op(reads[0])
    return op


def strictly_inlinable(op: Op) -> bool:
    """Elementwise in its own axis order, no reduction, no branch, no expensive intrinsic (Ansor's predicate; the
    caller excludes outputs)."""
    if op.body is None or op.reduce_axes:
        return False
    axis_names = [a.name for a in op.axes]
    for node in te.walk(op.body):
        if isinstance(node, te.Select) or (isinstance(node, te.Unary) and node.op in EXPENSIVE):
            return False
        if isinstance(node, te.Binary) and node.op == "pow":
            return False
        if isinstance(node, Load):
            used = [i.name for i in node.indices if isinstance(i, Var)]
            if any(not isinstance(i, (Var, te.Const)) for i in node.indices):
                return False
            if len(set(used)) != len(used) or used != [a for a in axis_names if a in used]:
                return False
    return True


def needs_multi_level_tiling(op: Op) -> bool:
    """Data reuse: some inputs' indices miss an output axis (two inputs, or one with a reduction)."""
    if op.body is None:
        return False
    missing = 0
    for r in op.reads:
        used: set[str] = set()
        for ld in te.loads(op.body):
            if ld.buffer == r:
                for i in ld.indices:
                    used |= te.free_vars(i)
        if any(a.extent > 1 and a.name not in used for a in op.axes):
            missing += 1
    return missing >= 2 or (missing >= 1 and bool(op.reduce_axes))


def at_own_index(ld: Load, axes: tuple[Var, ...]) -> bool:
    """The load reads element [axes...] itself (a broadcast 0 on an extent-1 axis is that element too)."""
    if len(ld.indices) != len(axes):
        return False
    for i, a in zip(ld.indices, axes):
        if isinstance(i, Var) and i.name == a.name:
            continue
        if a.extent == 1 and isinstance(i, te.Const) and i.value == 0:
            continue
        return False
    return True


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def _count_ops(e: Expr) -> int:
    if isinstance(e, Load):
        return 0  # index arithmetic is not counted
    own = 1 if isinstance(e, (te.Binary, te.Unary)) else 0
    return own + sum(_count_ops(c) for c in te.children(e))


def _rename_node(n: Expr, axes: dict[str, Var], tensors: dict[str, str]) -> Expr | None:
    if isinstance(n, te.Const) and dtypes.is_int(n.dtype) and n.dtype != dtypes.INDEX:
        # integer constants of every width print alike, but int8 and int64 arithmetic wrap differently
        return te.Cast(n.dtype, n)
    if isinstance(n, Var):
        return axes.get(n.name, n)
    if isinstance(n, Load):
        return Load(tensors[n.buffer], n.indices, n.dtype)
    if isinstance(n, Reduce):
        return Reduce(n.op, n.body, tuple(axes[a.name] for a in n.axes))
    return None


def topological_tensors(outputs: Sequence[te.Tensor]) -> list[te.Tensor]:
    """Every tensor the outputs depend on (themselves included), producers first."""
    order: list[te.Tensor] = []
    seen: set[int] = set()

    def visit(t: te.Tensor) -> None:
        if id(t) in seen:
            return
        seen.add(id(t))
        if isinstance(t.op, te.ComputeOp):
            for i in t.op.inputs:
                visit(i)
        order.append(t)

    for t in outputs:
        visit(t)
    return order


def _unique_names(order: list[te.Tensor]) -> dict[te.Tensor, str]:
    names: dict[te.Tensor, str] = {}
    taken: set[str] = set()
    for t in order:
        name, k = t.name, 0
        while name in taken or "." in name:  # '.' is reserved for derived stages (C.local, C.rf)
            k += 1
            name = f"{t.name.replace('.', '_')}_{k}"
        taken.add(name)
        names[t] = name
    return names


def _to_op(t: te.Tensor, names: dict[te.Tensor, str]) -> Op:
    if isinstance(t.op, te.PlaceholderOp):
        return Op(names[t], t.shape, t.dtype)
    by_old = {i.name: names[i] for i in t.op.inputs}
    if len(by_old) != len(t.op.inputs):
        # two distinct tensors with one name are read by the same compute: loads can't tell them apart
        raise InvalidExpr(f"compute {t.name} reads two different tensors with the same name; name them apart")
    body = te.rewrite(t.op.body, lambda n: Load(by_old[n.buffer], n.indices, n.dtype) if isinstance(n, Load) else None)
    return Op(names[t], t.shape, t.dtype, t.op.axes, body, t.op.tag)
