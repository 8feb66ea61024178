"""Ansor's schedule State and its transform steps.

A State is the list of stages of a ComputeDAG, each with its loop iterators (after split/fuse/reorder), their
annotations and where the stage is computed. Steps are frozen dataclasses; replaying the same steps on the same DAG
always gives the same State, so the step list *is* the schedule (and the tuning record).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from compiler.base.errors import IllegalStep
from compiler.schedule.loopir import GPU_LOOP_KINDS
from compiler.tensor import te
from compiler.tensor.dag import ComputeDAG, Op
from compiler.tensor.te import Expr, Load, Reduce, Var

ANNOTATIONS = ("none", "parallel", "vectorize", "unroll")
# GPU bindings: the loop becomes a grid or block index (blockIdx.x, threadIdx.x, ...) or a virtual thread
GPU_ANNOTATIONS = GPU_LOOP_KINDS
# the storage scopes a cache stage can live in on a GPU; other scope names (the CPU's "pack") are global memory
CACHE_SCOPES = ("shared", "local")


@dataclass(frozen=True)
class Iter:
    name: str
    extent: int
    kind: str  # "spatial" | "reduce"
    annotation: str = "none"

    def annotated(self, annotation: str) -> Iter:
        """The same loop with another annotation (built directly, as Stage.with_iters is: Annotate runs it for most
        of the steps the search replays)."""
        return Iter(self.name, self.extent, self.kind, annotation)


@dataclass(frozen=True)
class Stage:
    """One op with its loop structure. `relations` (splits and fuses) replay on other root extents for bound
    inference; `attach` is (stage name, iter name) when computed at another stage's loop."""

    op: Op
    iters: tuple[Iter, ...]
    relations: tuple[tuple, ...] = ()
    compute_at: str = "root"  # "root" | "inline" | "iter"
    attach: tuple[str, str] | None = None
    auto_unroll_max_step: int = 0
    scope: str = "global"  # "shared" | "local" for a cache stage of that scope (GPU lowering allocates it there)

    @property
    def name(self) -> str:
        return self.op.name

    def with_iters(self, iters: tuple[Iter, ...]) -> Stage:
        """The stage with other loops (annotated or reordered), the rest as it is; what dataclasses.replace does, in
        under half its time (0.77 against 1.7 us; the search replays this for most of its steps)."""
        return Stage(
            self.op, iters, self.relations, self.compute_at, self.attach, self.auto_unroll_max_step, self.scope
        )

    def iter_index(self, name: str) -> int:
        for i, it in enumerate(self.iters):
            if it.name == name:
                return i
        raise KeyError(name)


def root_iters(op: Op) -> tuple[Iter, ...]:
    return tuple(Iter(a.name, a.extent, "spatial") for a in op.axes) + tuple(
        Iter(r.name, r.extent, "reduce") for r in op.reduce_axes
    )


@dataclass(frozen=True)
class Derived:
    """Leaves of a stage for given root extents: loop order, each root axis as an expression of leaf variables,
    and the predicates (split tails) that must hold for a point to be computed."""

    leaves: tuple[Iter, ...]
    values: dict[str, Expr]
    predicates: tuple[tuple[Expr, str], ...]  # (condition, kind of the root axis it guards)


# derive() results by (the op's loops, relations, loop order and annotations, extents). The search lowers thousands
# of candidates of one task, and a candidate differs from its parent in one or two stages, so most stages replay the
# same relations on the same extents again (a fifth of a ResNet-18 conv's search time went to derive before this).
# The key holds the op's axes (Op.loops), not the op: replaying a cache_write builds its ops anew, and keyed by op
# identity the cache-write stage of every candidate missed (in the search's feature workers, half of bound inference
# went to those misses on a Winograd conv).
_DERIVED: dict[tuple, Derived] = {}
_DERIVED_MAX = 50_000


def derive(stage: Stage, extents: dict[str, int] | None = None) -> Derived:
    """Replay the stage's splits and fuses on root extents (default: the op's own). The result is shared: read it,
    never change its `values`."""
    key = (
        stage.op.loops,
        stage.relations,
        tuple((it.name, it.annotation) for it in stage.iters),
        tuple(sorted(extents.items())) if extents else (),
    )
    hit = _DERIVED.get(key)
    if hit is not None:
        return hit
    d = _derive(stage, extents)
    if len(_DERIVED) >= _DERIVED_MAX:
        _DERIVED.clear()
    _DERIVED[key] = d
    return d


def _derive(stage: Stage, extents: dict[str, int] | None) -> Derived:
    roots = root_iters(stage.op)
    extents = extents or {}
    cur = [Iter(it.name, extents.get(it.name, it.extent), it.kind) for it in roots]
    values: dict[str, Expr] = {it.name: Var(it.name) for it in roots}
    kinds = {it.name: it.kind for it in roots}
    preds: list[tuple[Expr, str]] = []

    def subst(mapping: dict[str, Expr]) -> None:
        for k in values:
            values[k] = te.substitute(values[k], mapping)
        preds[:] = [(te.substitute(p, mapping), kd) for p, kd in preds]

    for rel in stage.relations:
        if rel[0] == "split":
            _, name, lengths, inner_to_outer = rel
            pos = [c.name for c in cur].index(name)
            it = cur[pos]
            lengths = _clamp(lengths, it.extent, inner_to_outer)
            known = math.prod(lengths)
            rest = -(-it.extent // known)
            parts = (rest, *lengths) if inner_to_outer else (*lengths, rest)
            new = [Iter(f"{name}.{k}", e, it.kind) for k, e in enumerate(parts)]
            expr: Expr = Var(new[0].name)
            for n in new[1:]:
                expr = expr * n.extent + Var(n.name)
            root_kind = kinds[name] if name in kinds else it.kind
            subst({name: expr})
            if math.prod(parts) != it.extent:
                preds.append((expr < it.extent, root_kind))
            cur[pos : pos + 1] = new
        elif rel[0] == "fuse":
            names = rel[1]  # consecutive in the loop order of the time, which reorders may since have changed
            group = [next(c for c in cur if c.name == n) for n in names]
            pos = cur.index(group[0])
            fused = Iter("@".join(names), math.prod(g.extent for g in group), group[0].kind)
            f, mapping, inner = Var(fused.name), {}, 1
            for g in reversed(group):
                e = f if inner == 1 else f // inner
                mapping[g.name] = e if g is group[0] else e % g.extent
                inner *= g.extent
            subst(mapping)
            cur = [c for c in cur if c.name not in names]
            cur.insert(min(pos, len(cur)), fused)
    order = {it.name: i for i, it in enumerate(stage.iters)}
    ann = {it.name: it.annotation for it in stage.iters}
    leaves = tuple(c.annotated(ann.get(c.name, "none")) for c in sorted(cur, key=lambda c: order[c.name]))
    return Derived(leaves, values, tuple(preds))


def _clamp(lengths: tuple[int, ...], extent: int, inner_to_outer: bool) -> tuple[int, ...]:
    """Shrink split factors that exceed a (bound-inferred) smaller extent, innermost first: same points, fewer
    wasted iterations."""
    order = list(reversed(lengths)) if inner_to_outer else list(lengths)
    out, left = [], extent
    for n in order:
        n = min(n, left)
        out.append(n)
        left = -(-left // n)
    return tuple(reversed(out)) if inner_to_outer else tuple(out)


# ---------------------------------------------------------------------------------------------- state


@dataclass(frozen=True)
class State:
    dag: ComputeDAG
    stages: tuple[Stage, ...]
    steps: tuple[Step, ...] = ()

    def stage(self, key: int | str) -> Stage:
        if isinstance(key, int):
            return self.stages[key]
        return self.stages[self.stage_id(key)]

    def stage_id(self, name: str) -> int:
        try:
            return self._stage_ids[name]
        except KeyError:
            raise KeyError(name) from None

    # Lowering asks for stages by name and for the stages attached at each loop tens of times per program: built
    # once per (immutable) State, on first use.
    @functools.cached_property
    def _stage_ids(self) -> dict[str, int]:
        ids: dict[str, int] = {}
        for i, s in enumerate(self.stages):
            ids.setdefault(s.name, i)
        return ids

    @functools.cached_property
    def _attached(self) -> dict[tuple[str, str], list[Stage]]:
        out: dict[tuple[str, str], list[Stage]] = {}
        for s in self.stages:
            if s.compute_at == "iter":
                out.setdefault(tuple(s.attach), []).append(s)
        return out

    def with_stage(self, i: int, stage: Stage) -> State:
        return State(self.dag, self.stages[:i] + (stage,) + self.stages[i + 1 :], self.steps)

    def consumers(self, name: str) -> list[str]:
        """Stages reading `name`, looking through inlined stages."""
        out: list[str] = []
        for s in self.stages:
            if s.op.body is not None and name in s.op.reads:
                out.extend(self.consumers(s.name) if s.compute_at == "inline" else [s.name])
        return list(dict.fromkeys(out))

    def resolve_inlined(self, e: Expr) -> Expr:
        """`e` with every load of an inlined stage replaced by that stage's expression (what is really read)."""

        def visit(n: Expr) -> Expr | None:
            if isinstance(n, Load) and self.stage(n.buffer).compute_at == "inline":
                op = self.stage(n.buffer).op
                return self.resolve_inlined(te.substitute(op.body, {a.name: i for a, i in zip(op.axes, n.indices)}))
            return None

        return te.rewrite(e, visit)

    def attached_at(self, name: str, iter_name: str) -> list[Stage]:
        return list(self._attached.get((name, iter_name), ()))

    def __str__(self):
        return print_state(self)

    # -- the schedule API: each method appends one step, naming stages and iterators by name (or id)

    def do(self, step: Step) -> State:
        return apply_steps(self.dag, [step], self)

    def _sid(self, stage: int | str) -> int:
        return stage if isinstance(stage, int) else self.stage_id(stage)

    def _iid(self, stage: int | str, it: int | str) -> int:
        return it if isinstance(it, int) else self.stage(stage).iter_index(it)

    def split(self, stage, it, lengths: Sequence[int], inner_to_outer: bool = True) -> State:
        return self.do(Split(self._sid(stage), self._iid(stage, it), tuple(lengths), inner_to_outer))

    def fuse(self, stage, iters: Sequence) -> State:
        return self.do(Fuse(self._sid(stage), tuple(self._iid(stage, i) for i in iters)))

    def reorder(self, stage, iters: Sequence) -> State:
        return self.do(Reorder(self._sid(stage), tuple(self._iid(stage, i) for i in iters)))

    def annotate(self, stage, it, annotation: str) -> State:
        return self.do(Annotate(self._sid(stage), self._iid(stage, it), annotation))

    def pragma_unroll(self, stage, max_step: int) -> State:
        return self.do(Pragma(self._sid(stage), 0, "auto_unroll_max_step", max_step))

    def compute_at(self, stage, target, it) -> State:
        return self.do(ComputeAt(self._sid(stage), self._sid(target), self._iid(target, it)))

    def compute_inline(self, stage) -> State:
        return self.do(ComputeInline(self._sid(stage)))

    def compute_root(self, stage) -> State:
        return self.do(ComputeRoot(self._sid(stage)))

    def cache_write(self, stage, scope: str = "local") -> State:
        return self.do(CacheWrite(self._sid(stage), scope))

    def cache_read(self, stage, scope: str, readers: Sequence) -> State:
        return self.do(CacheRead(self._sid(stage), scope, tuple(self._sid(r) for r in readers)))

    def rfactor(self, stage, it, factor_iter_id: int) -> State:
        return self.do(Rfactor(self._sid(stage), self._iid(stage, it), factor_iter_id))


def initial_state(dag: ComputeDAG) -> State:
    return State(dag, tuple(Stage(op, root_iters(op)) for op in dag.ops))


def apply_steps(dag: ComputeDAG, steps: Iterable[Step], state: State | None = None) -> State:
    """Replay `steps` from the initial state (or `state`); raises IllegalStep naming the failing step."""
    state = state or initial_state(dag)
    for step in steps:
        why = _malformed(step)
        if why:
            raise IllegalStep(len(state.steps), step, why)
        try:
            state = step.apply(state)
        except IllegalStep as e:
            raise IllegalStep(len(state.steps), step, e.why) from None
        except (IndexError, KeyError) as e:
            raise IllegalStep(
                len(state.steps), step, f"refers to a stage or iterator that does not exist ({e})"
            ) from None
        if not step.keeps_loops:
            _check_attachments(state, step, len(state.steps))
        state = State(state.dag, state.stages, state.steps + (step,))
    return state


def _malformed(step: Step) -> str | None:
    """Why a step's fields cannot be right (wrong types, negative indices), as in a hand-edited record; else None."""
    for name, kind, index in _field_checks(type(step)):
        v = getattr(step, name)
        if kind == "tuple[int, ...]":
            if not isinstance(v, tuple) or not all(_is_int(x) for x in v):
                return f"{name} must be a list of integers, got {v!r}"
        elif kind == "int" and not _is_int(v) or kind in ("bool", "str") and type(v).__name__ != kind:
            return f"{name} must be of type {kind}, got {v!r}"
        # Python reads a negative index from the end, which would silently pick another stage or loop
        if index and any(x < 0 for x in (v if isinstance(v, tuple) else (v,))):
            return f"{name} must not be negative, got {v!r}"
    return None


@functools.cache
def _field_checks(cls: type) -> tuple[tuple[str, str, bool], ...]:
    """(name, declared type, whether it is a stage or iterator index) per field of a step class: what _malformed
    checks, read once per class (every replayed step is checked, and the search replays millions)."""
    return tuple((f.name, f.type, f.name.endswith(("_id", "_ids"))) for f in dataclasses.fields(cls))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_attachments(state: State, step: Step, index: int) -> None:
    attached = [s for s in state.stages if s.compute_at == "iter"]
    if not attached:
        return
    names = {s.name: s for s in state.stages}
    for s in attached:
        target, it = s.attach
        if target not in names or all(i.name != it for i in names[target].iters):
            raise IllegalStep(
                index, step, f"it would leave {s.name} computed at loop {target}.{it}, which no longer exists"
            )


# ---------------------------------------------------------------------------------------------- steps


class Step:
    """Base of transform steps: `apply` returns a new State; `record()` is the JSON form ["TAG", *fields]."""

    tag = ""
    # True where the step neither renames nor removes a loop nor moves a stage (Reorder, Annotate, Pragma): no
    # stage computed at a loop can lose it, so apply_steps skips that check after it
    keeps_loops = False

    def apply(self, state: State) -> State:
        raise NotImplementedError

    def record(self) -> list:
        return [self.tag, *(_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self))]

    def __str__(self):
        args = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"{type(self).__name__}({args})"

    def fail(self, why: str) -> IllegalStep:
        return IllegalStep(None, self, why)


def _jsonable(v):
    return [_jsonable(x) for x in v] if isinstance(v, (tuple, list)) else v


def _stage_for_transform(step: Step, state: State, stage_id: int) -> Stage:
    s = state.stages[stage_id]
    if s.op.is_placeholder:
        raise step.fail(f"stage {s.name} is a placeholder: it has no loops to transform")
    return s


def _move_attachments(state: State, stage: str, old: Sequence[str], new: str) -> State:
    if not any(s.attach is not None and s.attach[0] == stage for s in state.stages):
        return state
    stages = tuple(
        replace(s, attach=(stage, new)) if s.attach is not None and s.attach[0] == stage and s.attach[1] in old else s
        for s in state.stages
    )
    return replace(state, stages=stages)


@dataclass(frozen=True)
class Split(Step):
    """Split an iterator into len(lengths)+1 parts. inner_to_outer: lengths are the inner parts' extents (the outer
    extent is derived, rounded up); otherwise they are the outer parts' extents."""

    stage_id: int
    iter_id: int
    lengths: tuple[int, ...]
    inner_to_outer: bool = True
    tag = "SP"

    def apply(self, state):
        s = _stage_for_transform(self, state, self.stage_id)
        it = s.iters[self.iter_id]
        if not self.lengths or any(not isinstance(n, int) or n <= 0 for n in self.lengths):
            raise self.fail(f"split lengths must be positive integers, got {list(self.lengths)}")
        if it.annotation != "none":
            raise self.fail(f"iterator {it.name} is annotated {it.annotation}; split before annotating")
        parts = [f"{it.name}.{k}" for k in range(len(self.lengths) + 1)]
        lengths = _clamp(tuple(self.lengths), it.extent, self.inner_to_outer)
        rest = -(-it.extent // math.prod(lengths))
        sizes = (rest, *lengths) if self.inner_to_outer else (*lengths, rest)
        new = tuple(Iter(n, e, it.kind) for n, e in zip(parts, sizes))
        stage = replace(
            s,
            iters=s.iters[: self.iter_id] + new + s.iters[self.iter_id + 1 :],
            relations=s.relations + (("split", it.name, tuple(self.lengths), self.inner_to_outer),),
        )
        return _move_attachments(state.with_stage(self.stage_id, stage), s.name, [it.name], parts[-1])


@dataclass(frozen=True)
class FollowSplit(Step):
    """Split an iterator the way an earlier Split step split another stage's (Ansor's FSP): the first
    `n_split - 1` inner lengths of step `src_step_id`, then the product of the rest. A consumer follows its
    producer's tiles this way, and mutating the producer's tile sizes moves both."""

    stage_id: int
    iter_id: int
    src_step_id: int
    n_split: int
    tag = "FSP"

    def lengths(self, state: State) -> tuple[int, ...]:
        if not 0 <= self.src_step_id < len(state.steps) or not isinstance(state.steps[self.src_step_id], Split):
            raise self.fail(f"step {self.src_step_id} is not an earlier Split step")
        src = state.steps[self.src_step_id].lengths
        if not 1 <= self.n_split <= len(src):
            raise self.fail(f"n_split must be in [1, {len(src)}], got {self.n_split}")
        return (*src[: self.n_split - 1], math.prod(src[self.n_split - 1 :]))

    def apply(self, state):
        return Split(self.stage_id, self.iter_id, self.lengths(state)).apply(state)


@dataclass(frozen=True)
class Fuse(Step):
    """Fuse consecutive iterators into one."""

    stage_id: int
    iter_ids: tuple[int, ...]
    tag = "FU"

    def apply(self, state):
        s = _stage_for_transform(self, state, self.stage_id)
        ids = list(self.iter_ids)
        if not ids or ids != list(range(ids[0], ids[0] + len(ids))):
            raise self.fail(f"can only fuse consecutive iterators, got {ids}")
        group = [s.iters[i] for i in ids]
        if len({g.kind for g in group}) > 1:
            raise self.fail("cannot fuse spatial and reduction iterators together")
        if any(g.annotation != "none" for g in group):
            raise self.fail("cannot fuse annotated iterators")
        fused = Iter("@".join(g.name for g in group), math.prod(g.extent for g in group), group[0].kind)
        stage = replace(
            s,
            iters=s.iters[: ids[0]] + (fused,) + s.iters[ids[-1] + 1 :],
            relations=s.relations + (("fuse", tuple(g.name for g in group)),),
        )
        return _move_attachments(state.with_stage(self.stage_id, stage), s.name, [g.name for g in group], fused.name)


@dataclass(frozen=True)
class Reorder(Step):
    """Permute a stage's iterators: `order` lists the current iterator ids outermost first."""

    stage_id: int
    order: tuple[int, ...]
    tag = "RE"
    keeps_loops = True

    def apply(self, state):
        s = _stage_for_transform(self, state, self.stage_id)
        if sorted(self.order) != list(range(len(s.iters))):
            raise self.fail(f"order {list(self.order)} is not a permutation of the {len(s.iters)} iterators")
        return state.with_stage(self.stage_id, s.with_iters(tuple(s.iters[i] for i in self.order)))


@dataclass(frozen=True)
class Annotate(Step):
    """Mark an iterator parallel, vectorize, unroll (or none), or bind it to a GPU index (blockIdx.x, threadIdx.y,
    vthread, ...: spatial iterators only, each block or thread index at most once per stage)."""

    stage_id: int
    iter_id: int
    annotation: str
    tag = "AN"
    keeps_loops = True

    def apply(self, state):
        s = _stage_for_transform(self, state, self.stage_id)
        it = s.iters[self.iter_id]
        if self.annotation not in ANNOTATIONS and self.annotation not in GPU_ANNOTATIONS:
            raise self.fail(f"unknown annotation {self.annotation!r}; use one of {ANNOTATIONS + GPU_ANNOTATIONS}")
        if it.kind == "reduce" and self.annotation in ("parallel", "vectorize"):
            raise self.fail(f"cannot {self.annotation} reduction iterator {it.name} (use rfactor first)")
        if self.annotation in GPU_ANNOTATIONS:
            if it.kind == "reduce":
                raise self.fail(f"cannot bind reduction iterator {it.name} to {self.annotation}; bind spatial loops")
            other = next((o for o in s.iters if o.annotation == self.annotation and o.name != it.name), None)
            if other is not None and self.annotation != "vthread":
                raise self.fail(f"{s.name} already binds {other.name} to {self.annotation}")
        iters = s.iters[: self.iter_id] + (it.annotated(self.annotation),) + s.iters[self.iter_id + 1 :]
        return state.with_stage(self.stage_id, s.with_iters(iters))


@dataclass(frozen=True)
class Pragma(Step):
    """Stage-level pragma; only auto_unroll_max_step exists: unroll loop nests of at most `value` iterations."""

    stage_id: int
    iter_id: int
    name: str
    value: int
    tag = "PR"
    keeps_loops = True

    def apply(self, state):
        s = _stage_for_transform(self, state, self.stage_id)
        s.iters[self.iter_id]
        if self.name != "auto_unroll_max_step" or self.value < 0:
            raise self.fail("the only pragma is auto_unroll_max_step with a non-negative value")
        return state.with_stage(self.stage_id, replace(s, auto_unroll_max_step=self.value))


@dataclass(frozen=True)
class ComputeAt(Step):
    """Compute a stage inside the loop `target_iter_id` of a consumer stage."""

    stage_id: int
    target_stage_id: int
    target_iter_id: int
    tag = "CA"

    def apply(self, state):
        s = _stage_for_transform(self, state, self.stage_id)
        target = state.stages[self.target_stage_id]
        it = target.iters[self.target_iter_id]
        if state.dag.is_output(s.name):
            raise self.fail(f"{s.name} is an output of the DAG; outputs are computed at root")
        if not _encloses_consumer(state, target.name, s.name):
            raise self.fail(
                f"neither {target.name} nor a stage computed inside it reads {s.name}; a stage can only be computed "
                "at a loop that encloses a consumer"
            )
        if target.compute_at == "inline":
            raise self.fail(f"{target.name} is inlined; it has no loops")
        t: Stage | None = target
        while t is not None and t.compute_at == "iter":
            if t.attach[0] == s.name:
                raise self.fail(f"{target.name} is itself computed inside {s.name}")
            t = state.stage(t.attach[0])
        return state.with_stage(self.stage_id, replace(s, compute_at="iter", attach=(target.name, it.name)))


def _encloses_consumer(state: State, target: str, name: str) -> bool:
    for c in state.consumers(name):
        stage: Stage | None = state.stage(c)
        while stage is not None:
            if stage.name == target:
                return True
            stage = state.stage(stage.attach[0]) if stage.compute_at == "iter" else None
    return False


@dataclass(frozen=True)
class ComputeInline(Step):
    """Substitute the stage's expression into its consumers."""

    stage_id: int
    tag = "CI"

    def apply(self, state):
        s = _stage_for_transform(self, state, self.stage_id)
        if s.op.reduce_axes:
            raise self.fail(f"{s.name} is a reduction and cannot be inlined")
        if state.dag.is_output(s.name):
            raise self.fail(f"{s.name} is an output of the DAG and cannot be inlined")
        if any(o.attach is not None and o.attach[0] == s.name for o in state.stages if o.compute_at == "iter"):
            raise self.fail(f"other stages are computed inside {s.name}'s loops")
        return state.with_stage(self.stage_id, replace(s, compute_at="inline", attach=None))


@dataclass(frozen=True)
class ComputeRoot(Step):
    """Compute the stage in its own loop nest at the top level."""

    stage_id: int
    tag = "CR"

    def apply(self, state):
        s = _stage_for_transform(self, state, self.stage_id)
        return state.with_stage(self.stage_id, replace(s, compute_at="root", attach=None))


def _fresh(step: Step, s: Stage, what: str) -> None:
    if s.relations or any(it.annotation != "none" for it in s.iters) or s.compute_at == "inline":
        raise step.fail(f"{what} must come before {s.name} is split, fused, annotated or inlined")


def _insert(state: State, at: int, stage: Stage) -> State:
    if any(s.name == stage.name for s in state.stages):
        raise IllegalStep(None, stage.name, f"a stage named {stage.name} already exists")
    return replace(state, stages=state.stages[:at] + (stage,) + state.stages[at:])


@dataclass(frozen=True)
class CacheWrite(Step):
    """Compute the stage into a new `<name>.<scope>` stage and copy it out; the new stage comes first."""

    stage_id: int
    scope: str = "local"
    tag = "CHW"

    def apply(self, state):
        s = _stage_for_transform(self, state, self.stage_id)
        _fresh(self, s, "cache_write")
        reduce_names = {r.name for r in s.op.reduce_axes}
        if any(o.attach is not None and o.attach == (s.name, r) for o in state.stages for r in reduce_names):
            raise self.fail(f"a stage is computed at a reduction loop of {s.name}")
        cache = replace(s.op, name=f"{s.name}.{self.scope}")
        copy = replace(s.op, body=Load(cache.name, tuple(Var(a.name, a.extent) for a in s.op.axes), s.op.dtype))
        state = state.with_stage(self.stage_id, replace(s, op=copy, iters=root_iters(copy)))
        return _insert(state, self.stage_id, Stage(cache, root_iters(cache), scope=_cache_scope(self.scope)))


@dataclass(frozen=True)
class CacheRead(Step):
    """Copy a tensor into a new `<name>.<scope>` stage that the given readers read instead."""

    stage_id: int
    scope: str
    reader_stage_ids: tuple[int, ...]
    tag = "CHR"

    def apply(self, state):
        src = state.stages[self.stage_id]
        readers = [state.stages[i] for i in self.reader_stage_ids]
        if not readers or any(src.name not in r.op.reads for r in readers):
            raise self.fail(f"every reader must read {src.name} directly")
        axes = tuple(Var(f"ax{d}", n) for d, n in enumerate(src.op.shape))
        cache = Op(f"{src.name}.{self.scope}", src.op.shape, src.op.dtype, axes, Load(src.name, axes, src.op.dtype))
        for i, r in zip(self.reader_stage_ids, readers):
            body = te.rewrite(
                r.op.body,
                lambda n: (
                    Load(cache.name, n.indices, n.dtype) if isinstance(n, Load) and n.buffer == src.name else None
                ),
            )
            state = state.with_stage(i, replace(r, op=replace(r.op, body=body)))
        return _insert(state, self.stage_id + 1, Stage(cache, root_iters(cache), scope=_cache_scope(self.scope)))


def _cache_scope(scope: str) -> str:
    """The storage scope of a cache stage named by a CacheRead/CacheWrite scope (the CPU's "pack" is global)."""
    return scope if scope in CACHE_SCOPES else "global"


@dataclass(frozen=True)
class Rfactor(Step):
    """Factor a reduction: reduce iterator `iter_id` becomes a spatial axis (at position `factor_iter_id`) of a new
    `<name>.rf` stage that does the rest of the reduction; the stage then reduces over that axis."""

    stage_id: int
    iter_id: int
    factor_iter_id: int
    tag = "RF"

    def apply(self, state):
        s = _stage_for_transform(self, state, self.stage_id)
        op = s.op
        it = s.iters[self.iter_id]
        if it.kind != "reduce":
            raise self.fail(f"{it.name} is not a reduction iterator")
        spatial = {a.name for a in op.axes}
        if any(
            rel[0] == "split" and rel[1] in spatial or rel[0] == "fuse" and rel[1][0] in spatial for rel in s.relations
        ):
            raise self.fail(f"rfactor must come before the spatial iterators of {s.name} are split or fused")
        if not 0 <= self.factor_iter_id <= len(op.axes):
            raise self.fail(f"factor_iter_id must be in [0, {len(op.axes)}]")
        d = derive(s)
        red = op.body
        assert isinstance(red, Reduce)
        factor = Var(it.name, it.extent)
        others = tuple(Var(r.name, r.extent) for r in d.leaves if r.kind == "reduce" and r.name != it.name)
        value = te.substitute(op.value, {r.name: d.values[r.name] for r in op.reduce_axes})
        conds = [p for p, kind in d.predicates if kind == "reduce"]
        if conds:
            cond = conds[0]
            for c in conds[1:]:
                cond = cond & c
            value = te.Select(cond, value, identity(red.op, value.dtype))
        rf_axes = op.axes[: self.factor_iter_id] + (factor,) + op.axes[self.factor_iter_id :]
        rf_body = Reduce(red.op, value, others) if others else value
        rf = Op(
            f"{op.name}.rf",
            op.shape[: self.factor_iter_id] + (it.extent,) + op.shape[self.factor_iter_id :],
            op.dtype,
            rf_axes,
            rf_body,
        )
        idx = tuple(Var(a.name, a.extent) for a in rf_axes)
        new = replace(op, body=Reduce(red.op, Load(rf.name, idx, op.dtype), (factor,)))
        state = state.with_stage(self.stage_id, replace(s, op=new, iters=root_iters(new), relations=()))
        return _insert(state, self.stage_id, Stage(rf, root_iters(rf)))


def identity(op: str, dtype: str) -> te.Const:
    if op == "sum":
        return te.const(0, dtype)
    return te.min_value(dtype) if op == "max" else te.max_value(dtype)


STEPS: dict[str, type[Step]] = {
    cls.tag: cls
    for cls in (
        Split,
        FollowSplit,
        Fuse,
        Reorder,
        Annotate,
        Pragma,
        ComputeAt,
        ComputeInline,
        ComputeRoot,
        CacheWrite,
        CacheRead,
        Rfactor,
    )
}


def step_from_record(rec: Sequence) -> Step:
    """Inverse of Step.record()."""
    if not isinstance(rec, (list, tuple)) or not rec or not isinstance(rec[0], str) or rec[0] not in STEPS:
        raise IllegalStep(None, rec, f"unknown step tag; expected one of {sorted(STEPS)}")
    cls = STEPS[rec[0]]
    fields = dataclasses.fields(cls)
    if len(rec) - 1 != len(fields):
        raise IllegalStep(None, rec, f"{cls.__name__} takes {len(fields)} fields, got {len(rec) - 1}")
    args = [tuple(v) if isinstance(v, list) else v for v in rec[1:]]
    step = cls(*args)
    why = _malformed(step)
    if why:
        raise IllegalStep(None, rec, why)
    return step


# ---------------------------------------------------------------------------------------------- printing


def print_state(state: State) -> str:
    """The schedule as a loop nest, Ansor-style: attached stages appear inside their consumer's loops."""
    lines = []
    inputs = [s.name for s in state.stages if s.op.is_placeholder]
    if inputs:
        lines.append("Placeholder: " + ", ".join(inputs))
    for s in state.stages:
        if s.compute_at == "root" and not s.op.is_placeholder:
            _print_stage(state, s, 0, lines)
    return "\n".join(lines) + "\n"


def _print_stage(state: State, s: Stage, depth: int, lines: list[str]) -> None:
    if s.auto_unroll_max_step:
        lines.append("  " * depth + f"{s.name} auto_unroll: {s.auto_unroll_max_step}")
    for it in s.iters:
        kw = {"none": "for", "vectorize": "vectorize"}.get(it.annotation, it.annotation)
        lines.append("  " * depth + f"{kw} {it.name} (0,{it.extent})")
        depth += 1
        for child in state.attached_at(s.name, it.name):
            _print_stage(state, child, depth, lines)
    body = s.op.body
    op = "="
    if isinstance(body, Reduce):
        op, body = {"sum": "+=", "max": "max=", "min": "min="}[body.op], body.body
    idx = ", ".join(a.name for a in s.op.axes)
    lines.append("  " * depth + f"{s.name}[{idx}] {op} {body}")


def program_key(state: State) -> str:
    """The identity of a program: its step list (what a record stores)."""
    return json.dumps([st.record() for st in state.steps], separators=(",", ":"))
