"""Sketch generation (Ansor §4.1): the high-level structures of a task's programs, before any tile size is chosen.

Derivation starts at the output stage and walks to the inputs. At each stage the rules are tried in Ansor's CPU
order; a rule that matches either *applies* (its successor joins the worklist and later rules are tried too) or
*applies and skips the rest*. A partial sketch whose stage index runs out is a sketch. The splits that tile a stage
get placeholder lengths here; `annotate` fills them.

Rules (CPU): [producer at consumer tile, attention rows, scores at rows: ours] → always-inline → [matrix transform,
Ansor's const-tensor rule] → add-rfactor → [pack, ours] → add-cache-write → multi-level tiling with consumer fusion →
multi-level tiling ("SSRSRS") → skip.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from compiler.base.target import Target
from compiler.schedule.matrix_transform import is_matrix_transform, transform_structure
from compiler.schedule.state import FollowSplit, Fuse, Rfactor, Split, State, Step, initial_state
from compiler.targets.cpu.host import host
from compiler.tensor import te
from compiler.tensor.dag import (
    ComputeDAG,
    Op,
    at_own_index,
    feeding_reduction,
    needs_multi_level_tiling,
    strictly_inlinable,
)

TILE_STRUCTURE = "SSRSRS"  # Ansor's CPU multi-level tiling: space and reduction tile levels, outermost first
MAX_SKETCHES = 64


@dataclass(frozen=True)
class Sketch:
    """A program structure: `state` holds its steps with placeholder split lengths; the Split steps at
    `tile_steps` (indices into state.steps) are the tile sizes to fill, splitting extents `tile_extents`."""

    state: State
    tile_steps: tuple[int, ...]
    tile_extents: tuple[int, ...]
    tiled: frozenset[str]  # stages with a multi-level tile structure: their place is part of the sketch
    fixed: frozenset[str]  # stages the sketch placed (inlined, attached, rfactored): annotation leaves them
    rules: tuple[str, ...]  # the rules that made it, outermost stage first, for printing and tests
    # per tile step: it splits its stage's last space axis, whose innermost part is the vector loop
    tile_contiguous: tuple[bool, ...]
    # per multi-level tiled stage, the positions in tile_steps of its space axes' splits: their innermost parts
    # are the register block, the accumulators its reduction loops update (annotate.RegisterFile)
    register_blocks: tuple[tuple[int, ...], ...] = ()

    def __str__(self):
        return f"sketch [{', '.join(self.rules)}]\n{self.state}"


@dataclass(frozen=True)
class _Partial:
    state: State
    index: int
    tile_steps: tuple[int, ...] = ()
    tile_extents: tuple[int, ...] = ()
    tile_contiguous: tuple[bool, ...] = ()
    register_blocks: tuple[tuple[int, ...], ...] = ()
    tiled: frozenset[str] = frozenset()
    fixed: frozenset[str] = frozenset()
    rules: tuple[str, ...] = ()
    splits: dict = field(default_factory=dict, compare=False)  # stage -> {root axis: index of its Split step}
    packed: frozenset[str] = frozenset()  # stages whose input the pack rule already copied

    def do(self, step: Step) -> _Partial:
        return replace(self, state=self.state.do(step))


PASS, APPLY, APPLY_AND_SKIP = 0, 1, 2


@functools.lru_cache(maxsize=256)
def _generate(dag: ComputeDAG, cores: int, pack: bool) -> tuple[Sketch, ...]:
    rules = [r for r in RULES if pack or not isinstance(r, AddCacheReadPack)]
    init = initial_state(dag)
    work = [_Partial(init, len(init.stages) - 1)]
    done: list[Sketch] = []
    while work:
        p = work.pop()
        if p.index < 0:
            done.append(
                Sketch(
                    p.state,
                    p.tile_steps,
                    p.tile_extents,
                    p.tiled,
                    p.fixed,
                    p.rules,
                    p.tile_contiguous,
                    p.register_blocks,
                )
            )
            continue
        stage = p.state.stages[p.index]
        if stage.op.is_placeholder:
            work.append(replace(p, index=p.index - 1))
            continue
        successors: list[_Partial] = []
        for rule in rules:
            verdict = rule.condition(p, cores)
            if verdict == PASS:
                continue
            successors.extend(rule.apply(p, cores))
            if verdict == APPLY_AND_SKIP:
                break
        work.extend(reversed(successors))
        if len(work) + len(done) > MAX_SKETCHES:
            break
    return tuple(done)


def generate_sketches(dag: ComputeDAG, target: Target | None = None, pack: bool = True) -> tuple[Sketch, ...]:
    """All sketches of the task, cached per DAG and core count; `pack=False` gives Ansor's rules alone."""
    return _generate(dag, (target or host()).cores, pack)


# ---------------------------------------------------------------------------------------------- predicates


def _op(p: _Partial) -> Op:
    return p.state.stages[p.index].op


def _name(p: _Partial) -> str:
    return p.state.stages[p.index].name


def fusible_consumer(state: State, name: str) -> str | None:
    """The single consumer that reads `name` one element per element of its own (looking through inlined stages):
    Ansor's HasFusibleConsumer, which asks for the consumer's own index, widened to a *blocked view* of it
    (consumer_view): a blocked conv's result read back as NCHW, [n, f // 16, y, x, f % 16], fuses too, so the
    accumulator block is written to NCHW from registers instead of through a whole blocked copy of the tensor."""
    consumers = state.consumers(name)
    if len(consumers) != 1:
        return None
    c = state.stage(consumers[0])
    if c.op.reduce_axes and state.stage(name).op.reduce_axes:
        return None
    return c.name if consumer_view(state, name, c.name) is not None else None


def _untiled_consumer(state: State, name: str) -> str | None:
    """fusible_consumer, unless a rule already tiled it: an int8 matmul's epilogue (compiler.tensor.ops.int8_matmul)
    adds outer products of a row and a column term, so it is tiled itself, and its dot-product producer then tiles
    on its own (with a cache write). A consumer placed whole in another stage's tile (at-consumer-tile: a depthwise
    conv's ReLU6 inside the 1x1 conv's pixel tile) keeps its loops, and its producer tiles into it."""
    consumer = fusible_consumer(state, name)
    if consumer is None:
        return None
    loops = {it.name for it in state.stage(consumer).iters}
    return consumer if all(a.name in loops for a in state.stage(consumer).op.axes) else None


@dataclass(frozen=True)
class ConsumerView:
    """How a fusible consumer's loops line up with its producer's axes: split each consumer axis in `splits` by
    the given inner extent (into `axis.0`, `axis.1`); then `loops[i]` is the consumer loop walking producer axis i."""

    splits: tuple[tuple[str, int], ...]
    loops: tuple[str, ...]


def consumer_view(state: State, producer: str, consumer: str) -> ConsumerView | None:
    """The consumer reads the producer at its own index, or at a blocked view of it: every producer index is a
    consumer axis `a`, or one of the pair `a // k`, `a % k` (k dividing a's extent), each consumer axis used once
    (or once as each of the pair), with the producer's extents those pieces' extents. None for anything else."""
    c, p = state.stage(consumer).op, state.stage(producer).op
    loads = [ld for ld in te.loads(state.resolve_inlined(c.body)) if ld.buffer == producer]
    if not loads or len(loads[0].indices) != len(p.shape) or any(ld.indices != loads[0].indices for ld in loads):
        return None
    if at_own_index(loads[0], c.axes):
        return ConsumerView((), tuple(a.name for a in c.axes)) if c.shape == p.shape else None
    extent = {a.name: a.extent for a in c.axes}
    pieces: list[tuple[str, str, int]] = []  # per producer axis: (consumer axis, "own" | "outer" | "inner", k)
    # an axis of extent 1 may be read at index 0 (inlining a broadcast gives that): it pairs with a consumer axis of
    # extent 1 that nothing else reads, in order
    read = set().union(*(te.free_vars(i) for i in loads[0].indices))
    spare_units = [a for a, n in extent.items() if n == 1 and a not in read]
    for index, size in zip(loads[0].indices, p.shape):
        if isinstance(index, te.Var) and extent.get(index.name) == size:
            pieces.append((index.name, "own", 0))
            continue
        if size == 1 and isinstance(index, te.Const) and index.value == 0 and spare_units:
            pieces.append((spare_units.pop(0), "own", 0))
            continue
        if not (
            isinstance(index, te.Binary)
            and index.op in ("floordiv", "mod")
            and isinstance(index.a, te.Var)
            and index.a.name in extent
            and isinstance(index.b, te.Const)
        ):
            return None
        axis, k = index.a.name, int(index.b.value)
        if k <= 1 or extent[axis] % k or size != (extent[axis] // k if index.op == "floordiv" else k):
            return None
        pieces.append((axis, "outer" if index.op == "floordiv" else "inner", k))
    uses: dict[str, list[tuple[str, int]]] = {}
    for axis, kind, k in pieces:
        uses.setdefault(axis, []).append((kind, k))
    for axis in extent:
        kinds = sorted(uses.get(axis, []))
        own = kinds == [("own", 0)]
        pair = len(kinds) == 2 and kinds[0][0] == "inner" and kinds[1] == ("outer", kinds[0][1])
        if not (own or pair):
            return None
    splits = tuple((axis, uses[axis][0][1]) for axis in extent if uses[axis][0][0] != "own")
    suffix = {"own": "", "outer": ".0", "inner": ".1"}
    return ConsumerView(splits, tuple(axis + suffix[kind] for axis, kind, _ in pieces))


PACK_MIN_ROW = 17  # elements: an input whose rows are shorter is laid out as contiguous panels already


def packable_input(state: State, name: str) -> str | None:
    """The input read with the stage's innermost spatial axis as its innermost index and reused across another
    spatial axis (it misses one): what a packed panel serves. Copies are never packed again, nor inputs whose rows
    are at most a vector block long (a blocked conv's weight, F/16 x C x KH x KW x 16): their panels are contiguous
    already, and in tuning runs of blocked convs the packed sketches took a fifth of the trials and never won."""
    op = state.stage(name).op
    inner = op.axes[-1].name if op.axes else None
    for ld in te.loads(op.body):
        if ld.buffer.endswith(".pack") or not ld.indices:
            continue
        last = ld.indices[-1]
        used = set().union(*(te.free_vars(i) for i in ld.indices))
        if isinstance(last, te.Var) and last.name == inner and any(a.name not in used for a in op.axes):
            src = state.stage(ld.buffer).op
            if src.is_placeholder and src.shape[-1] >= PACK_MIN_ROW:
                return ld.buffer
    return None


def needs_rfactor(op: Op, cores: int) -> bool:
    """Little parallelism in the space loops but plenty in the reduction (Ansor's CPU NeedsRfactor)."""
    if not op.reduce_axes:
        return False
    space = math.prod(op.shape)
    reduce = math.prod(r.extent for r in op.reduce_axes)
    if needs_multi_level_tiling(op):
        return space < reduce and space <= 16 * cores
    return reduce > cores


def _has_cache_write(p: _Partial) -> bool:
    return _name(p).endswith(".local")


# ---------------------------------------------------------------------------------------------- rules


class Rule:
    name = ""

    def condition(self, p: _Partial, cores: int) -> int:
        raise NotImplementedError

    def apply(self, p: _Partial, cores: int) -> list[_Partial]:
        raise NotImplementedError


def view_copy(state: State, name: str) -> bool:
    """The stage only reads one producer at a blocked view of its own index (a blocked conv's result put back in
    NCHW: conv_nchw[n, f, y, x] = conv[n, f // 16, y, x, f % 16]). Ansor's inlining predicate refuses it (its index
    is not the stage's own), but inlining it adds no arithmetic beyond the index and lets the producer fuse into
    the stage's consumers through the view: a conv's bias, residual add and ReLU then run on its accumulator tile
    instead of in a second (and for the 7x7 stem conv, scalar) pass over the whole output. ResNet-18 at 2 threads
    on Zen 5, 3,000 trials each: its kernels alone sum to 7.82 ms against 8.04, the artifact 1-3% faster."""
    op = state.stage(name).op
    if not isinstance(op.body, te.Load) or op.reduce_axes:
        return False
    return consumer_view(state, op.body.buffer, name) is not None


class AlwaysInline(Rule):
    name = "inline"

    def condition(self, p, cores):
        op = _op(p)
        if p.state.dag.is_output(op.name) or op.name.endswith((".local", ".pack")):
            return PASS
        return APPLY_AND_SKIP if strictly_inlinable(op) or view_copy(p.state, op.name) else PASS

    def apply(self, p, cores):
        q = replace(p, state=p.state.compute_inline(_name(p)), fixed=p.fixed | {_name(p)})
        return [_advance(q, self.name)]


class ProducerAtConsumerTile(Rule):
    """tilefarm's addition to Ansor's CPU rules, for a task that fusion made of two tiled reductions (a depthwise
    conv and the 1x1 conv that reads it, passes.fuse_depthwise_pointwise): the elementwise stage between them (the
    depthwise conv's bias and ReLU6) is kept rather than inlined, and computed inside the consumer's outermost tile
    level, whose loops are ordered with the axes the consumer reads it by (the pixels) first and the others (the
    output channels) after them, so each tile's pixels are computed once, every channel of them, just before every
    output channel reads them from cache. The producer reduction then tiles into this stage (tile+fuse). The
    rules after this one are skipped: the trials go to the fused structure the pass asked for (turning the pass off
    gives the two convs as tasks of their own)."""

    name = "at-consumer-tile"

    def condition(self, p, cores):
        s, name = p.state, _name(p)
        if s.dag.is_output(name) or not strictly_inlinable(_op(p)) or name.endswith((".local", ".pack")):
            return PASS
        consumers = s.dag.consumers.get(name, [])
        if len(consumers) != 1 or consumers[0] not in p.tiled or not s.stage(consumers[0]).op.reduce_axes:
            return PASS
        fits = _tiled_producer(s, name) and _tile_holder(s, consumers[0]) is not None
        return APPLY_AND_SKIP if fits else PASS

    def apply(self, p, cores):
        s, name = p.state, _name(p)
        consumer = s.dag.consumers[name][0]
        holder, pixels, channels = _tile_holder(s, consumer)  # type: ignore[misc]
        rest = [it.name for it in s.stage(holder).iters][len(pixels) + len(channels) :]
        s = s.reorder(holder, pixels + channels + rest).compute_at(name, holder, pixels[-1])
        q = replace(p, state=s, fixed=p.fixed | {name})
        return [_advance(q, self.name)]


def _tiled_producer(state: State, name: str) -> bool:
    """Whether `name` reads, through elementwise stages, a reduction that needs multi-level tiling."""
    reduction = feeding_reduction(state.dag, name)
    return reduction is not None and needs_multi_level_tiling(reduction)


def _tile_holder(state: State, consumer: str, producer: str | None = None) -> tuple[str, list[str], list[str]] | None:
    """Where a tiled reduction's outermost tile level lives (the stage it is computed in, or itself at root), and
    that level's loops split in two: those over axes the reduction reads its non-constant input (or `producer`) by
    (pixels, at least one), then the others (channels). None where the holder's loops do not line up with the
    reduction's axes."""
    c = state.stage(consumer)
    holder = c.attach[0] if c.compute_at == "iter" and c.attach else consumer
    h = state.stage(holder)
    if holder != consumer and (h.op.shape != c.op.shape or consumer_view(state, consumer, holder) is None):
        return None
    axis_of = {a.name: i for i, a in enumerate(h.op.axes)}
    reads = [ld for ld in te.loads(c.op.body) if not state.stage(ld.buffer).op.is_placeholder]
    if producer is not None:
        reads = [ld for ld in reads if ld.buffer == producer]
    if len(reads) != 1:
        return None
    used = set().union(*(te.free_vars(i) for i in reads[0].indices))
    pixel_axes = {i for i, a in enumerate(c.op.axes) if a.name in used}
    pixels, channels = [], []
    for it in h.iters:
        base, _, part = it.name.partition(".")
        if it.kind != "spatial" or base not in axis_of or part not in ("", "0"):
            break
        (pixels if axis_of[base] in pixel_axes else channels).append(it.name)
    return (holder, pixels, channels) if pixels else None


class AttentionRows(Rule):
    """tilefarm's addition for an attention that fusion made one task (passes.fuse_attention): the softmax's
    division, which the ·V product reads, is kept rather than inlined and computed inside the product's outermost
    tile level, its loops ordered with the rows (the axes the product reads it by) first, so a block of query rows
    gets its probabilities just before every column of V reads them; its row max, exp and row sum are computed
    inside it row by row (`softmax_rows`), the row's vectorized partial reductions of a sampled width (rfactor) then
    combined, the exp and the division split along the keys with a sampled inner part to vectorize (without it no
    vector loop fits a whole row of 128 keys, and 40 random programs of the encoder's attention ran 2.5x the default
    schedule's time at best; with it, 1.1x). The scores' product then tiles into the same loop (ScoresAtRows). The
    rules after this one are skipped: turning the pass off gives the three tasks of before."""

    name = "attention-rows"

    def condition(self, p, cores):
        s, name = p.state, _name(p)
        if s.dag.is_output(name) or not strictly_inlinable(_op(p)) or name.endswith((".local", ".pack")):
            return PASS
        consumers = s.consumers(name)
        if len(consumers) != 1 or consumers[0] not in p.tiled or not s.stage(consumers[0]).op.reduce_axes:
            return PASS
        fits = softmax_rows(s, name) and _tile_holder(s, consumers[0], name) is not None
        return APPLY_AND_SKIP if fits else PASS

    def apply(self, p, cores):
        s, name = p.state, _name(p)
        members = softmax_rows(s, name)
        op = s.stage(name).op
        row = op.axes[len(op.axes) - 2].name
        tile_steps, tile_extents, contiguous = list(p.tile_steps), list(p.tile_extents), list(p.tile_contiguous)

        def split(s: State, stage: str, axis: str, extent: int) -> State:
            """A split of the row's keys, its inner part a sampled vector loop (a whole row outgrows MAX_VECTORIZE)."""
            tile_steps.append(len(s.steps))
            tile_extents.append(extent)
            contiguous.append(True)
            return s.do(Split(s.stage_id(stage), s.stage(stage).iter_index(axis), (1,)))

        for m in [name, *members]:
            m_op = s.stage(m).op
            if not m_op.reduce_axes and m_op.axes[-1].extent > 1:  # the division, the exp
                s = split(s, m, m_op.axes[-1].name, m_op.axes[-1].extent)
        for m in members:  # consumers first, so each is computed where a reader of it is
            s = s.compute_at(m, name, row)
            k = s.stage(m).op.reduce_axes
            if len(k) != 1:
                continue
            it_id = s.stage(m).iter_index(k[0].name)
            s = split(s, m, k[0].name, k[0].extent)
            s = s.do(Rfactor(s.stage_id(m), it_id + 1, len(s.stage(m).op.axes)))
            rf = s.stage(f"{m}.rf").iters
            lanes = [it.name for it in rf if it.kind == "spatial"]
            s = s.reorder(f"{m}.rf", lanes[:-1] + [it.name for it in rf if it.kind == "reduce"] + lanes[-1:])
            s = s.compute_at(f"{m}.rf", m, s.stage(m).iters[len(s.stage(m).op.axes) - 1].name)
        (consumer,) = s.consumers(name)
        holder, rows, columns = _tile_holder(s, consumer, name)  # type: ignore[misc]
        rest = [it.name for it in s.stage(holder).iters][len(rows) + len(columns) :]
        s = s.reorder(holder, rows + columns + rest).compute_at(name, holder, rows[-1])
        below = set(members) | {f"{m}.rf" for m in members}
        index = p.index - 1
        while index >= 0 and s.stages[index].name in below:
            index -= 1
        rules = p.rules + (f"{self.name}({name})",)
        return [
            replace(
                p,
                state=s,
                index=index,
                tile_steps=tuple(tile_steps),
                tile_extents=tuple(tile_extents),
                tile_contiguous=tuple(contiguous),
                fixed=p.fixed | {name} | below,
                rules=rules,
            )
        ]


def softmax_rows(state: State, name: str) -> list[str]:
    """The stages a softmax's division `name` reads that are computed row by row inside it, consumers first: every
    computed stage above it up to a product that needs multi-level tiling (the scores), but the strictly inlinable
    ones (the scale, a mask: inlined), each read by `name` or another of them alone, at least one a row reduction;
    [] where the stages above it are not such a softmax over one such product's rows."""
    op = state.stage(name).op
    k = len(op.axes) - 1
    found: list[str] = []
    products: set[str] = set()
    todo = [name]
    while todo:
        for r in state.stage(todo.pop()).op.reads:
            st = state.stage(r)
            if st.op.is_placeholder or r in found or r in products:
                continue
            if needs_multi_level_tiling(st.op):
                products.add(r)
                continue
            found.append(r)
            todo.append(r)
    members = [m for m in found if not strictly_inlinable(state.stage(m).op)]
    if len(products) != 1 or not any(state.stage(m).op.reduce_axes for m in members) or k < 2:
        return []
    for m in members:
        m_op = state.stage(m).op
        if state.stage(m).compute_at != "root" or state.dag.is_output(m) or m_op.shape[:k] != op.shape[:k]:
            return []
        if not set(state.dag.consumers.get(m, [])) <= {name, *found}:
            return []
    order = {st.name: i for i, st in enumerate(state.stages)}
    return sorted(members, key=lambda m: -order[m])


class ScoresAtRows(Rule):
    """After AttentionRows: the scores' product, whose readers (the softmax's row max and exp) are computed inside
    the ·V product's row tile, is tiled (SSRSRS, its sizes sampled like any tile's) inside that same loop, before
    the softmax: each block of query rows has its scores computed, normalized and multiplied by V while in cache."""

    name = "scores-at-rows"

    def condition(self, p, cores):
        s, name = p.state, _name(p)
        if not any(r.startswith(f"{AttentionRows.name}(") for r in p.rules):
            return PASS  # only an attention's: a Winograd conv's GEMM has its readers in one loop too
        if not needs_multi_level_tiling(_op(p)) or name.endswith((".local", ".pack")) or s.dag.is_output(name):
            return PASS
        return APPLY_AND_SKIP if _rows_attach(s, name) is not None else PASS

    def apply(self, p, cores):
        name = _name(p)
        q = _multi_level_tile(p, name)
        holder, loop = _rows_attach(q.state, name)  # type: ignore[misc]
        q = replace(q, state=q.state.compute_at(name, holder, loop), rules=q.rules[:-1] + (f"{self.name}({name})",))
        return [_advance(q, None)]


def _rows_attach(state: State, name: str) -> tuple[str, str] | None:
    """The loop every reader of `name` is computed in, through the stages they are computed in, if they all are
    computed in the same one (the ·V tile holding an attention's softmax rows)."""
    points = set()
    readers = state.consumers(name)
    for r in readers:
        st = state.stage(r)
        if st.compute_at != "iter" or st.attach is None:
            return None
        at = st.attach
        while state.stage(at[0]).compute_at == "iter" and state.stage(at[0]).attach is not None:
            at = state.stage(at[0]).attach
        points.add(tuple(at))
    return points.pop() if readers and len(points) == 1 else None  # type: ignore[return-value]


class AddRfactor(Rule):
    """Fuse the reduction loops, split them (the factor is filled later), and factor out either part: the outer
    part gives parallel partial reductions, the inner one (moved innermost) vectorized ones."""

    name = "rfactor"

    def condition(self, p, cores):
        op = _op(p)
        if _has_cache_write(p) or op.name.endswith(".rf") or not needs_rfactor(op, cores):
            return PASS
        return APPLY

    def apply(self, p, cores):
        name, op = _name(p), _op(p)
        s = p.state
        stage = s.stage(name)
        red = [i for i, it in enumerate(stage.iters) if it.kind == "reduce"]
        if len(red) > 1:
            s = s.do(Fuse(s.stage_id(name), tuple(red)))
        it_id = next(i for i, it in enumerate(s.stage(name).iters) if it.kind == "reduce")
        extent = s.stage(name).iters[it_id].extent
        split_index = len(s.steps)
        s = s.do(Split(s.stage_id(name), it_id, (1,)))
        out = []
        for part, position in ((0, 0), (1, len(op.axes))):
            rf = s.do(Rfactor(s.stage_id(name), it_id + part, position))
            q = replace(
                p,
                state=rf,
                tile_steps=p.tile_steps + (split_index,),
                tile_extents=p.tile_extents + (extent,),
                tile_contiguous=p.tile_contiguous + (False,),
                fixed=p.fixed | {name},
                rules=p.rules + (f"{self.name}({name}, {'outer' if part == 0 else 'inner'})",),
            )
            out.append(replace(q, index=p.index - 1))  # the .rf stage went in at p.index: skip it and its reducer
        return out


def lane_axis_reduction(op: Op) -> bool:
    """A reduction without data reuse (a pool, not a conv) whose innermost output axis is also the innermost index
    of everything it reads, at stride 1: an NCHWc pool's channel lanes."""
    if not op.reduce_axes or needs_multi_level_tiling(op) or not op.axes or op.axes[-1].extent < 4:
        return False
    lane = op.axes[-1].name
    loads = te.loads(op.body)
    return bool(loads) and all(
        ld.indices and isinstance(ld.indices[-1], te.Var) and ld.indices[-1].name == lane for ld in loads
    )


class MatrixTransformRule(Rule):
    """Ansor's SimplifyComputeWithConstTensor, for Winograd's transforms: the one structure of
    schedule.matrix_transform (tile loops unrolled, lanes innermost, a row transform inside its column transform)
    instead of multi-level tiling, which gave a Winograd conv 27 sketches, 24 of them over its transforms."""

    name = "transform"

    def condition(self, p, cores):
        return APPLY_AND_SKIP if is_matrix_transform(_op(p)) else PASS

    def apply(self, p, cores):
        name = _name(p)
        q = replace(p, state=transform_structure(p.state, name), fixed=p.fixed | {name})
        return [_advance(q, self.name)]


class ReduceOutsideLanes(Rule):
    """tilefarm's addition for NCHWc pooling: move the reduction loops outside the innermost output axis, so each
    window step is one vector load per lane block and the running max (or sum) stays in vector registers. Ansor's
    CPU rules would rfactor the 3x3 window or leave the reduction innermost, and the lane axis then never
    vectorizes."""

    name = "lanes"

    def condition(self, p, cores):
        op = _op(p)
        if _has_cache_write(p) or op.name.endswith(".rf") or not lane_axis_reduction(op):
            return PASS
        return APPLY_AND_SKIP

    def apply(self, p, cores):
        name = _name(p)
        iters = p.state.stage(name).iters
        spatial = [it.name for it in iters if it.kind == "spatial"]
        order = spatial[:-1] + [it.name for it in iters if it.kind == "reduce"] + spatial[-1:]
        q = replace(p, state=p.state.reorder(p.state.stage_id(name), order), fixed=p.fixed | {name})
        return [_advance(q, self.name)]


class AddCacheReadPack(Rule):
    """tilefarm's addition to Ansor's CPU rules: before a stage is tiled into its consumer, optionally copy the
    input it walks along its innermost output axis (B of C = A·B) into a `.pack` stage. Annotation then places the
    copy at an outer tile loop, where it holds one contiguous panel of that input: the hand-written GEMM's B
    packing, which takes row strides (4 KB for N = 1024, one L1 set) out of the inner loop. Ansor leaves this to
    layout rewriting of constant weights, which does not reach activations."""

    name = "pack"

    def condition(self, p, cores):
        op = _op(p)
        if p.state.stages[p.index].name in p.packed or not needs_multi_level_tiling(op):
            return PASS
        if not (_has_cache_write(p) or fusible_consumer(p.state, op.name)):
            return PASS
        return APPLY if packable_input(p.state, op.name) else PASS

    def apply(self, p, cores):
        name = _name(p)
        src = packable_input(p.state, name)
        s = p.state.cache_read(src, "pack", [name])
        q = replace(
            p,
            state=s,
            index=p.index + 1,  # the copy stage went in before this one
            packed=p.packed | {name},
            fixed=p.fixed,
            rules=p.rules + (f"{self.name}({src} for {name})",),
        )
        return [q]  # this stage is derived again, now reading the copy (the rules below then tile it)


class AddCacheWrite(Rule):
    name = "cache_write"

    def condition(self, p, cores):
        op = _op(p)
        if _has_cache_write(p) or not needs_multi_level_tiling(op) or _untiled_consumer(p.state, op.name):
            return PASS
        return APPLY

    def apply(self, p, cores):
        name = _name(p)
        q = replace(p, state=p.state.cache_write(name), rules=p.rules + (f"{self.name}({name})",))
        return [q]  # the index now points at the .local stage, which the fusion rule tiles into `name`


class MultiLevelTilingWithFusion(Rule):
    """Tile the stage, make its elementwise consumer follow the outer tile levels, and compute the stage inside
    the consumer at the end of space level 1 or 2 (two sketches)."""

    name = "tile+fuse"

    def condition(self, p, cores):
        op = _op(p)
        if not needs_multi_level_tiling(op) or _untiled_consumer(p.state, op.name) is None:
            return PASS
        return APPLY_AND_SKIP if _has_cache_write(p) else APPLY

    def apply(self, p, cores):
        name = _name(p)
        consumer = fusible_consumer(p.state, name)
        tiled = _multi_level_tile(p, name)
        out = []
        for level in (1, 2):
            q = _follow(tiled, name, consumer, level)
            q = replace(q, fixed=q.fixed | {name, consumer}, rules=q.rules[:-1] + (f"{self.name}({name}, L{level})",))
            out.append(_advance(q, None))
        return out


class MultiLevelTiling(Rule):
    name = "tile"

    def condition(self, p, cores):
        return APPLY_AND_SKIP if needs_multi_level_tiling(_op(p)) else PASS

    def apply(self, p, cores):
        return [_advance(_multi_level_tile(p, _name(p)), None)]


class SkipStage(Rule):
    name = "skip"

    def condition(self, p, cores):
        return APPLY

    def apply(self, p, cores):
        return [_advance(p, None)]


RULES: tuple[Rule, ...] = (
    ProducerAtConsumerTile(),
    AttentionRows(),
    ScoresAtRows(),
    AlwaysInline(),
    MatrixTransformRule(),
    ReduceOutsideLanes(),
    AddRfactor(),
    AddCacheReadPack(),
    AddCacheWrite(),
    MultiLevelTilingWithFusion(),
    MultiLevelTiling(),
    SkipStage(),
)


def _advance(p: _Partial, rule: str | None) -> _Partial:
    rules = p.rules + ((f"{rule}({_name(p)})",) if rule else ())
    return replace(p, index=p.index - 1, rules=rules)


def _multi_level_tile(p: _Partial, name: str) -> _Partial:
    """Split every space axis into as many parts as TILE_STRUCTURE has S's and every reduction axis into as many as
    it has R's, then order the parts as the structure says. Axes of extent 1 are left whole, outermost."""
    s = p.state
    sid = s.stage_id(name)
    levels = {k: TILE_STRUCTURE.count(k) for k in "SR"}
    tile_steps, tile_extents, splits = list(p.tile_steps), list(p.tile_extents), {}
    contiguous = list(p.tile_contiguous)
    block: list[int] = []
    last_space = [it.name for it in s.stage(sid).iters if it.kind == "spatial"][-1:]
    parts: dict[str, list[str]] = {}
    for it in s.stage(sid).iters:
        n = levels["S" if it.kind == "spatial" else "R"]
        if it.extent == 1:
            parts[it.name] = [it.name]
            continue
        splits[it.name] = len(s.steps)
        if it.kind == "spatial":
            block.append(len(tile_steps))
        tile_steps.append(len(s.steps))
        tile_extents.append(it.extent)
        contiguous.append([it.name] == last_space)
        s = s.do(Split(sid, s.stage(sid).iter_index(it.name), (1,) * (n - 1)))
        parts[it.name] = [f"{it.name}.{k}" for k in range(n)]
    order = [n for n, ps in parts.items() if len(ps) == 1]
    seen = {"S": 0, "R": 0}
    kinds = {it.name: it.kind for it in p.state.stage(sid).iters}
    for k in TILE_STRUCTURE:
        level = seen[k]
        seen[k] += 1
        for axis, ps in parts.items():
            if len(ps) > 1 and (kinds[axis] == "spatial") == (k == "S"):
                order.append(ps[level])
    s = s.reorder(sid, order)
    return replace(
        p,
        state=s,
        tile_steps=tuple(tile_steps),
        tile_extents=tuple(tile_extents),
        tile_contiguous=tuple(contiguous),
        register_blocks=p.register_blocks + ((tuple(block),) if block else ()),
        tiled=p.tiled | {name},
        fixed=p.fixed | {name},
        splits={**p.splits, name: splits},
        rules=p.rules + (f"tile({name})",),
    )


def _follow(p: _Partial, producer: str, consumer: str, level: int) -> _Partial:
    """The consumer's space axes split like the producer's first `level` tile levels (the rest as one inner
    part), ordered level by level; the producer computed at the end of that level."""
    s = p.state
    cid = s.stage_id(consumer)
    view = consumer_view(s, producer, consumer)
    assert view is not None, f"{consumer} is not a fusible consumer of {producer}"
    for axis, k in view.splits:  # a blocked view: f -> f.0 (f // k), f.1 (f % k)
        s = s.do(Split(cid, s.stage(cid).iter_index(axis), (k,)))
    prod_axes = s.stage(producer).op.axes
    splits = p.splits[producer]
    parts: list[list[str]] = []
    for pa, loop in zip(prod_axes, view.loops):
        if pa.name not in splits:
            parts.append([loop])
            continue
        s = s.do(FollowSplit(cid, s.stage(cid).iter_index(loop), splits[pa.name], level))
        parts.append([f"{loop}.{k}" for k in range(level + 1)])
    order = [ps[0] for ps in parts if len(ps) == 1]
    for lv in range(level + 1):
        order += [ps[lv] for ps in parts if len(ps) > 1]
    s = s.reorder(cid, order)
    attach = [ps[level - 1] for ps in parts if len(ps) > 1]
    at = attach[-1] if attach else order[0]
    s = s.compute_at(producer, consumer, at)
    return replace(p, state=s)


__all__ = [
    "Sketch",
    "generate_sketches",
    "fusible_consumer",
    "consumer_view",
    "ConsumerView",
    "view_copy",
    "needs_rfactor",
    "RULES",
    "TILE_STRUCTURE",
]
