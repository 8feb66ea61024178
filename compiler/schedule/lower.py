"""lower(state) -> loop IR: bound inference for compute_at, split tails, inlining, buffer allocation.

Regions are inferred consumers-first (reverse stage order): a stage computed at a consumer's loop computes exactly
the box of elements its readers touch inside that loop, stored in a buffer the size of that box.

A State with a loop bound to a GPU index (blockIdx.*, threadIdx.*, vthread) lowers to a GPU program: bound loops
keep their kind, a stage computed inside another's loops lives in shared memory (a "shared" cache stage: one box for
the whole thread block, so its region is inferred with the enclosing threadIdx loops left free) or in local memory
(any other: one box per thread), and the shared stages computed at one loop are fenced by barriers, before
them (the block's threads have finished reading the previous contents) and after them (every thread's writes are
visible before anyone reads). Each top-level loop nest is one kernel launch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from compiler.base.errors import LoweringError
from compiler.schedule.loopir import (
    BLOCK_KINDS,
    GPU_LOOP_KINDS,
    THREAD_KINDS,
    Allocate,
    Barrier,
    Buffer,
    For,
    Func,
    IfThenElse,
    Seq,
    Stmt,
    Store,
    map_children,
    map_exprs,
    seq,
)
from compiler.schedule.matrix_transform import is_matrix_transform
from compiler.schedule.partition import partition_loops
from compiler.schedule.simplify import Ranges, simplify, simplify_stmt, symbolic_range
from compiler.schedule.state import Stage, State, derive, identity
from compiler.tensor import te
from compiler.tensor.te import Const, Expr, Load, Reduce, Var

LOOP_KIND = {
    "none": "serial",
    "parallel": "parallel",
    "vectorize": "vectorized",
    "unroll": "unrolled",
    **{kind: kind for kind in GPU_LOOP_KINDS},
}
COMBINE = {"sum": "add", "max": "max", "min": "min"}


@dataclass
class _Info:
    """Per-stage lowering facts: its buffer box, loop variables and root axes as loop-variable expressions."""

    region: list[tuple[Expr, int]]
    loops: list[tuple[Var, int, str]]  # (var, extent, annotation) outermost first
    leaf_names: list[str]
    kinds: list[str]  # "spatial" | "reduce" per loop
    axis_exprs: dict[str, Expr]
    predicates: list[tuple[Expr, str]]
    enclosing: list[tuple[Var, int]]
    local: bool  # buffer holds only the region (computed at another stage's loop)


class _Lowering:
    def __init__(self, state: State):
        self.state = state
        self.stages = {s.name: s for s in state.stages}
        self.info: dict[str, _Info] = {}
        self.ranges: Ranges = {}
        self.used_names: set[str] = set()
        self.loop_names: dict[tuple[str, str], str] = {}
        self.values = {
            s.name: state.resolve_inlined(s.op.body)
            for s in state.stages
            if s.op.body is not None and s.compute_at != "inline"
        }
        self.loads = {name: te.loads(v) for name, v in self.values.items()}
        self.gpu = is_gpu_program(state)
        self.thread_vars: set[str] = set()  # loop variables bound to a threadIdx

    def readers(self, name: str) -> list[Stage]:
        return [
            s for s in self.state.stages if s.name in self.loads and any(ld.buffer == name for ld in self.loads[s.name])
        ]

    # ------------------------------------------------------------------------------------------ bounds

    def _unique(self, name: str) -> str:
        out, k = name, 0
        while out in self.used_names:
            k += 1
            out = f"{name}_{k}"
        self.used_names.add(out)
        return out

    def infer(self, s: Stage) -> None:
        shape = s.op.shape
        if s.compute_at == "root":
            region: list[tuple[Expr, int]] = [(Const(0), n) for n in shape]
            enclosing: list[tuple[Var, int]] = []
        else:
            target_name, iter_name = s.attach
            target = self.stages[target_name]
            if target.compute_at == "inline" or target_name not in self.info:
                raise LoweringError(f"{s.name} is computed at {target_name}, which has no loops of its own")
            t_info = self.info[target_name]
            pos = t_info.leaf_names.index(iter_name)
            enclosing = t_info.enclosing + [(v, e) for v, e, _ in t_info.loops[: pos + 1]]
            region = self._region(s, enclosing, target_name, pos)
        extents = {a.name: e for a, (_, e) in zip(s.op.axes, region)}
        d = derive(s, extents)
        loops, names = [], []
        for leaf in d.leaves:
            v = Var(self.loop_names[(s.name, leaf.name)])
            loops.append((v, leaf.extent, leaf.annotation))
            names.append(leaf.name)
            self.ranges[v.name] = (0, leaf.extent - 1)
            if leaf.annotation in THREAD_KINDS:
                self.thread_vars.add(v.name)
        mapping = {leaf: v for leaf, (v, _, _) in zip(names, loops)}
        axis_exprs = {k: te.substitute(v, mapping) for k, v in d.values.items()}
        for a, (start, _) in zip(s.op.axes, region):
            axis_exprs[a.name] = simplify(start + axis_exprs[a.name])
        preds = [(te.substitute(p, mapping), kind) for p, kind in d.predicates]
        local = s.compute_at == "iter"
        if local:  # the box may stick out of the tensor: guard the points outside
            for a, n in zip(s.op.axes, shape):
                preds.append(((axis_exprs[a.name] >= 0) & (axis_exprs[a.name] < n), "spatial"))
        self.info[s.name] = _Info(
            region, loops, names, [leaf.kind for leaf in d.leaves], axis_exprs, preds, enclosing, local
        )

    def _region(self, s: Stage, enclosing: list[tuple[Var, int]], target: str, pos: int) -> list[tuple[Expr, int]]:
        fixed = {v.name for v, _ in enclosing}
        if self.scope(s) == "shared":  # one box for all the block's threads
            fixed -= self.thread_vars
        boxes: list[list[tuple[Expr, int] | None]] = []
        for r in self.readers(s.name):
            self._check_inside(s, r, target, pos)
            info = self.info[r.name]
            for ld in self.loads[r.name]:
                if ld.buffer == s.name:
                    idx = [te.substitute(i, info.axis_exprs) for i in ld.indices]
                    boxes.append([symbolic_range(i, fixed, self.ranges) for i in idx])
        region = []
        for d, n in enumerate(s.op.shape):
            cur = boxes[0][d] if boxes else None
            for b in boxes[1:]:
                cur = _union(cur, b[d])
            if cur is None or cur[1] >= n:
                cur = (Const(0), n)
            region.append(cur)
        return region

    def _check_inside(self, s: Stage, reader: Stage, target: str, pos: int) -> None:
        r: Stage | None = reader
        while r is not None:
            if r.name == target:
                return
            if r.compute_at != "iter":
                break
            t_name, it = r.attach
            if t_name == target:
                if self.info[target].leaf_names.index(it) >= pos:
                    return
                break
            r = self.stages[t_name]
        raise LoweringError(
            f"{s.name} is computed inside {target}'s loop {self.info[target].leaf_names[pos]}, but its consumer "
            f"{reader.name} runs outside that loop and could not see it"
        )

    # ------------------------------------------------------------------------------------------ emission

    def scope(self, s: Stage) -> str:
        """Where the stage's buffer lives: global on CPUs and at the root of a GPU program; inside a GPU kernel in
        shared memory for a shared cache stage or a stage the block's threads compute together (one with a loop
        bound to a threadIdx, as a cross-thread reduction's partial sums), else in each thread's local memory."""
        if not self.gpu or s.compute_at != "iter":
            return "global"
        cooperative = s.scope == "global" and any(it.annotation in THREAD_KINDS for it in s.iters)
        return "shared" if s.scope == "shared" or cooperative else "local"

    def buffer(self, name: str) -> Buffer:
        s = self.stages[name]
        info = self.info.get(name)
        shape = tuple(e for _, e in info.region) if info is not None and info.local else s.op.shape
        return Buffer(name, s.op.dtype, shape)

    def access(self, name: str, indices: tuple[Expr, ...]) -> Expr:
        """Flat element offset of `name[indices]` in its buffer (relative to the box for local buffers)."""
        info = self.info.get(name)
        buf = self.buffer(name)
        flat: Expr = Const(0)
        for d, (i, n) in enumerate(zip(indices, buf.shape)):
            if info is not None and info.local:
                i = i - info.region[d][0]
            flat = flat * n + i if d else i
        return flat

    def _value(self, s: Stage) -> tuple[Expr, Reduce | None]:
        info = self.info[s.name]
        body = self.values[s.name]
        red = body if isinstance(body, Reduce) else None
        value = te.substitute(red.body if red is not None else body, info.axis_exprs)

        def flat(n: Expr) -> Expr | None:
            return Load(n.buffer, (self.access(n.buffer, n.indices),), n.dtype) if isinstance(n, Load) else None

        return te.rewrite(value, flat), red

    def emit(self, s: Stage) -> Stmt:
        info = self.info[s.name]
        # a matrix transform's unrolled tile loops hold no register tile that LLVM's unrolling would schedule
        # differently (a GEMM's can: one Winograd bgemm ran 14% slower so), so they are left to LLVM
        transform = is_matrix_transform(s.op)
        value, red = self._value(s)
        out_idx = self.access(s.name, tuple(info.axis_exprs[a.name] for a in s.op.axes))
        spatial = _conj([p for p, k in info.predicates if k == "spatial"])
        reduce_pred = _conj([p for p, k in info.predicates if k == "reduce"])
        if red is None:
            update: Stmt = _guard(spatial, Store(s.name, out_idx, value))
            first_reduce = None
        else:
            cur = Load(s.name, (out_idx,), s.op.dtype)
            update = _guard(_and(spatial, reduce_pred), Store(s.name, out_idx, te.Binary(COMBINE[red.op], cur, value)))
            init: Stmt = _guard(spatial, Store(s.name, out_idx, identity(red.op, s.op.dtype)))
            first_reduce = info.kinds.index("reduce")
            for (v, e, ann), kind in reversed(list(zip(info.loops, info.kinds))[first_reduce + 1 :]):
                if kind == "spatial":
                    init = _loop(v, e, ann, init, transform)
        stmt = update
        own_loops = set()
        for i in reversed(range(len(info.loops))):
            v, e, ann = info.loops[i]
            children = self.state.attached_at(s.name, info.leaf_names[i])
            if self.gpu:
                stmt = self._emit_gpu_children(children, stmt)
            else:
                for child in reversed(children):
                    stmt = Allocate(self.buffer(child.name), seq(self.emit(child), stmt))
            stmt = _loop(v, e, ann, stmt, transform)
            own_loops.add(v.name)
            if i == first_reduce:
                stmt = seq(init, stmt)
        if s.auto_unroll_max_step:
            stmt = _auto_unroll(stmt, own_loops, s.auto_unroll_max_step)[0]
        return stmt

    def _emit_gpu_children(self, children: list[Stage], body: Stmt) -> Stmt:
        """The stages computed at one loop of a GPU program, then `body`: each run of consecutive shared fills
        between one pair of barriers (the block's threads are done reading the buffers' last contents before any
        thread overwrites them, and every fill is complete before anyone reads it)."""
        parts: list[Stmt] = []
        for k, child in enumerate(children):
            shared = self.scope(child) == "shared"
            if shared and (k == 0 or self.scope(children[k - 1]) != "shared"):
                parts.append(Barrier())
            parts.append(self.emit(child))
            if shared and (k == len(children) - 1 or self.scope(children[k + 1]) != "shared"):
                parts.append(Barrier())
        stmt = seq(*parts, body)
        for child in reversed(children):
            stmt = Allocate(self.buffer(child.name), stmt, self.scope(child))
        return stmt

    def infer_all(self) -> None:
        for s in self.state.stages:  # loop names in program order, for readable output
            if s.op.body is not None and s.compute_at != "inline":
                for leaf in derive(s).leaves:
                    self.loop_names[(s.name, leaf.name)] = self._unique(leaf.name)
        for s in reversed(self.state.stages):
            if s.op.body is not None and s.compute_at != "inline":
                self.infer(s)

    def run(self, name: str, simplify: bool = True) -> Func:
        dag = self.state.dag
        if self.gpu:
            check_gpu_bindings(self.state)
        self.infer_all()
        roots = [s for s in self.state.stages if s.op.body is not None and s.compute_at == "root"]
        body: Stmt = seq(*(self.emit(s) for s in roots))
        for s in reversed(roots):
            if not dag.is_output(s.name):
                body = Allocate(self.buffer(s.name), body)
        params = tuple(Buffer(n, dag.op(n).dtype, dag.op(n).shape) for n in dag.inputs + dag.outputs)
        if self.gpu:
            body = merge_nested_bindings(body, {})
        if simplify:
            body = simplify_stmt(body, self.ranges)
            # loop partitioning would cut bound loops apart, and put barriers under guards some threads fail
            if not self.gpu:
                body = partition_loops(body, self.ranges)
        return Func(name, params, body)


def lower(state: State, name: str = "kernel", simplify: bool = True) -> Func:
    """Loop IR for a scheduled State; params are the DAG's inputs then outputs. `simplify=False` skips the final
    simplification of indices and guards (what code generation wants, but not what program features need)."""
    return _Lowering(state).run(name, simplify)


def is_gpu_program(state: State) -> bool:
    """Whether any loop of the State is bound to a GPU index (it then lowers to a GPU program)."""
    return any(it.annotation in GPU_LOOP_KINDS for s in state.stages for it in s.iters)


def check_gpu_bindings(state: State) -> None:
    """Raise LoweringError where a GPU State's bindings have no meaning: a blockIdx bound inside another stage's
    loops (the grid belongs to a kernel's outermost loops), or a thread-bound local cache stage (one per thread)."""
    for s in state.stages:
        bound = [it for it in s.iters if it.annotation in GPU_LOOP_KINDS]
        if not bound or s.compute_at == "root":
            continue
        blocks = [it.name for it in bound if it.annotation in BLOCK_KINDS]
        if blocks:
            raise LoweringError(
                f"{s.name} is computed inside {s.attach[0]}'s loops but binds {', '.join(blocks)} to blockIdx; "
                "only a stage at the root binds the grid"
            )
        threads = [it.name for it in bound if it.annotation in THREAD_KINDS]
        if threads and s.scope == "local":
            raise LoweringError(
                f"{s.name} lives in each thread's local memory but binds {', '.join(threads)} to threadIdx; only a "
                "stage in shared memory is computed cooperatively by the block's threads"
            )


def merge_nested_bindings(s: Stmt, bound: dict[str, tuple[Var, int]]) -> Stmt:
    """`s` with each loop bound to an index that an enclosing loop already binds (a shared stage's copy loop inside
    its consumer's threadIdx.x loop) replaced by that loop's variable, under a guard where it is shorter: one loop
    per index on every path, as hardware runs it. `bound` holds the enclosing bound loops' (variable, extent)."""
    if isinstance(s, For):
        if s.kind in BLOCK_KINDS + THREAD_KINDS:
            if s.kind in bound:
                var, extent = bound[s.kind]
                if s.extent > extent:
                    raise LoweringError(
                        f"loop {s.var} bound to {s.kind} has extent {s.extent} inside loop {var} bound to it with "
                        f"extent {extent}: the threads past {extent} never reach it; split it by {extent} or less"
                    )
                body = merge_nested_bindings(_rename(s.body, s.var.name, var), bound)
                return body if s.extent == extent else IfThenElse(var < s.extent, body)
            bound = {**bound, s.kind: (s.var, s.extent)}
        return replace(s, body=merge_nested_bindings(s.body, bound))
    return map_children(s, lambda c: merge_nested_bindings(c, bound))


def _rename(s: Stmt, name: str, var: Var) -> Stmt:
    """`s` with loop variable `name` replaced by `var` in every index, value and guard."""
    return map_exprs(s, lambda e: te.substitute(e, {name: var}))


def infer_bound(state: State) -> State:
    """The State with each iterator's extent as bound inference finds it (stages computed at another stage's loop
    shrink to the region their consumers need there), for printing."""
    low = _Lowering(state)
    low.infer_all()
    stages = list(state.stages)
    for i, s in enumerate(stages):
        info = low.info.get(s.name)
        if info is not None:
            extents = {leaf: e for leaf, (_, e, _) in zip(info.leaf_names, info.loops)}
            stages[i] = replace(s, iters=tuple(replace(it, extent=extents.get(it.name, it.extent)) for it in s.iters))
    return replace(state, stages=tuple(stages))


# ---------------------------------------------------------------------------------------------- helpers


def _union(a: tuple[Expr, int] | None, b: tuple[Expr, int] | None) -> tuple[Expr, int] | None:
    if a is None or b is None:
        return None
    diff = simplify(b[0] - a[0])
    if not isinstance(diff, Const):
        return None
    d = int(diff.value)
    lo = min(0, d)
    return simplify(a[0] + lo), max(a[1], d + b[1]) - lo


def _conj(preds: list[Expr]) -> Expr | None:
    out = None
    for p in preds:
        out = p if out is None else out & p
    return out


def _and(a: Expr | None, b: Expr | None) -> Expr | None:
    return b if a is None else a if b is None else a & b


def _guard(cond: Expr | None, stmt: Stmt) -> Stmt:
    return stmt if cond is None else IfThenElse(cond, stmt)


def _loop(v: Var, extent: int, annotation: str, body: Stmt, llvm_unroll: bool = False) -> Stmt:
    kind = LOOP_KIND[annotation]
    # the simplifier turns v into 0 (its range is [0, 0]); a loop bound to a GPU index stays, as only the index's
    # first thread (or block) runs its body
    if extent == 1 and kind not in BLOCK_KINDS + THREAD_KINDS:
        return body
    return For(v, extent, kind, body, llvm_unroll=llvm_unroll and kind == "unrolled")


VECTOR_STEP_LANES = 16  # a vector loop counts as one unroll step per 16 lanes (one AVX-512 register of fp32)


def unroll_steps(extent: int, vectorized: bool) -> int:
    """The steps a loop of `extent` iterations counts toward auto_unroll_max_step (_auto_unroll; annotate's
    RegisterFile.unrolled_demand predicts lowering's unrolling by the same count)."""
    return -(-extent // VECTOR_STEP_LANES) if vectorized else extent


def _auto_unroll(s: Stmt, own: set[str], max_step: int) -> tuple[Stmt, int]:
    """Unroll this stage's serial loops whose whole nest runs at most `max_step` steps (a vector loop counts one
    step per 16 lanes: counting a 64-lane loop as one let a 512-step pragma unroll into LLVM IR that took minutes
    to optimize)."""
    if isinstance(s, For):
        body, steps = _auto_unroll(s.body, own, max_step)
        total = steps * unroll_steps(s.extent, s.kind == "vectorized")
        kind = "unrolled" if s.kind == "serial" and s.var.name in own and total <= max_step else s.kind
        return replace(s, kind=kind, body=body), total
    if isinstance(s, Seq):
        parts = [_auto_unroll(c, own, max_step) for c in s.stmts]
        return Seq(tuple(p[0] for p in parts)), sum(p[1] for p in parts)
    if isinstance(s, Allocate):
        body, steps = _auto_unroll(s.body, own, max_step)
        return Allocate(s.buffer, body, s.scope), steps
    if isinstance(s, IfThenElse):
        then, steps = _auto_unroll(s.then, own, max_step)
        if s.orelse is None:
            return IfThenElse(s.cond, then), steps
        orelse, other = _auto_unroll(s.orelse, own, max_step)
        return IfThenElse(s.cond, then, orelse), max(steps, other)
    return s, 1
