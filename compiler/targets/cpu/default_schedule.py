"""Rule-based schedules for any ComputeDAG: what a task runs with before (or without) tuning.

The rules follow the shape of the hand-written schedules: inline cheap injective stages; give every reduction
with data reuse (conv, matmul) a register-blocked tile (accumulators for `block` rows x `lanes` vector columns,
the reduction loops just outside them), fused with its elementwise consumer when it has one; and parallelize and
vectorize everything else along its contiguous axis.
"""

from __future__ import annotations

import math

from compiler.base.target import Target
from compiler.schedule.matrix_transform import is_matrix_transform, outer_axes, transform_structure
from compiler.schedule.simplify import linear
from compiler.schedule.state import State, initial_state
from compiler.targets.cpu.host import host, vector_registers
from compiler.tensor import te
from compiler.tensor.dag import ComputeDAG, at_own_index, feeding_reduction
from compiler.tensor.te import Load

MIN_PARALLEL_WORK = 1 << 15  # waking a worker costs ~10 us: below this many loop iterations one thread is faster
PARALLEL_MIN = 32  # fuse outer loops until this many parallel iterations (16 x cores, as Ansor does)


def default_schedule(dag: ComputeDAG, target: Target | None = None) -> State:
    """The rule-based schedule of `dag` for `target` (default: this host)."""
    lanes, accumulators = _registers(target or host())
    s = initial_state(dag)
    s = _inline(s)
    tiled: set[str] = set()
    transforms = [st.name for st in reversed(s.stages) if is_matrix_transform(st.op)]
    for name in transforms:  # consumers first: a row transform goes inside its column transform
        s = transform_structure(s, name)
    for name in transforms:
        s = _transform_loops(s, name)
    tiled |= set(transforms)
    attach: dict[str, tuple[str, str]] = {}  # a depthwise conv's tile stage -> the 1x1 conv's loop it goes in
    for stage in reversed(s.stages):
        if stage.op.is_placeholder or stage.compute_at != "root" or stage.name in tiled:
            continue
        if stage.op.reduce_axes and dag.needs_multi_level_tiling(stage.name):
            s, done = _tile_anchor(s, stage.name, lanes, accumulators, attach)
            tiled |= done
    rows = _row_groups(s, tiled)
    members = {m for group in rows.values() for m in group}
    for stage in s.stages:
        if stage.op.is_placeholder or stage.compute_at != "root" or stage.name in tiled | members:
            continue
        k = len(stage.op.axes) - 1 if stage.name in rows else None
        parallel = 0 if stage.name in attach else k  # a softmax inside an attention's ·V rows: theirs are parallel
        if stage.op.reduce_axes:
            s = _reduction(s, stage.name, lanes, parallel)
        else:
            s = _elementwise(s, stage.name, parallel)
        for m in rows.get(stage.name, []):  # consumers first, so each is computed where a reader of it is
            s = _reduction(s, m, lanes, 0) if s.stage(m).op.reduce_axes else _elementwise(s, m, 0)
            s = s.compute_at(m, stage.name, _loop_holding(s.stage(stage.name), stage.op.axes[k - 1].name))
        if stage.name in attach:
            s = s.compute_at(stage.name, *attach[stage.name])
    for name, (holder, loop) in attach.items():
        if s.stage(name).compute_at == "root" and s.stage(name).op.tag in ("matmul", "batch_matmul"):
            s = s.compute_at(name, holder, loop)
    return s


def _row_groups(s: State, tiled: set[str]) -> dict[str, list[str]]:
    """Stages at root computed row by row inside the one that reads them, by the stage holding them (its rows: every
    axis but the last), consumers first. A producer joins when every stage reading it is the holder or another
    member, each reading it at its own row (the first axes' indices are the reader's own): a softmax's row max, exp
    and row sum inside its division, a LayerNorm's mean and variance inside its normalization. Each row then stays in
    L1 from its first stage to its last, and the threads meet once per task instead of once per stage."""
    dag = s.dag
    groups: dict[str, list[str]] = {}
    taken: set[str] = set()
    for holder in reversed(s.stages):
        op = holder.op
        k = len(op.axes) - 1
        if op.is_placeholder or holder.compute_at != "root" or holder.name in tiled | taken or k < 1:
            continue
        group: list[str] = []
        changed = True
        while changed:
            changed = False
            for p in reversed(s.stages):
                name = p.name
                if name in group or name == holder.name or name in taken or name in tiled:
                    continue
                if p.op.is_placeholder or p.compute_at != "root" or dag.is_output(name) or len(p.op.shape) < k:
                    continue
                readers = s.consumers(name)
                if readers and set(readers) <= {holder.name, *group} and p.op.shape[:k] == op.shape[:k]:
                    if all(_reads_row(s, r, name, k) for r in readers):
                        group.append(name)
                        changed = True
        if group:
            order = {st.name: i for i, st in enumerate(s.stages)}
            groups[holder.name] = sorted(group, key=lambda n: -order[n])
            taken |= {holder.name, *group}
    return groups


def _reads_row(s: State, reader: str, producer: str, k: int) -> bool:
    """Whether every load of `producer` by `reader` indexes its first `k` axes by the reader's own first k axes."""
    op = s.stage(reader).op
    own = [a.name for a in op.axes[:k]]
    loads = [ld for ld in _loads(s, op.body) if ld.buffer == producer]
    return bool(loads) and all(
        len(ld.indices) >= k and all(isinstance(i, te.Var) and i.name == n for i, n in zip(ld.indices, own))
        for ld in loads
    )


def _registers(target: Target) -> tuple[int, int]:
    """fp32 lanes of one vector register, and how many vector registers hold accumulators: 16 of AVX-512's 32,
    10 of AVX2's 16 (the rest keep the loaded and broadcast operands)."""
    lanes = max(1, target.vector_bytes // 4)
    return lanes, 16 if vector_registers(target) >= 32 else 10


def _transform_loops(s: State, name: str) -> State:
    """A structured matrix transform's lanes vectorized and, at root, its outer loops parallel."""
    s = s.annotate(name, s.stage(name).op.axes[-1].name, "vectorize")
    if s.stage(name).compute_at != "root":
        return s
    return _parallel(s, name, outer_axes(s.stage(name).op))


def _inline(s: State) -> State:
    """Inline injective intermediates, except those feeding a tiled reduction (pads): re-evaluating a select in the
    innermost loop of a conv costs more than materializing the padded input once."""
    dag = s.dag
    for stage in reversed(s.stages):
        op = stage.op
        if op.is_placeholder or op.reduce_axes or dag.is_output(op.name):
            continue
        feeds_anchor = any(
            s.stage(c).op.reduce_axes and dag.needs_multi_level_tiling(c) and not _windowed_only(s.stage(c).op)
            for c in s.consumers(op.name)
        )
        if not feeds_anchor and not _costly_and_shared(s, op.name):
            s = s.compute_inline(op.name)
    return s


COSTLY = {"exp", "log", "tanh", "erf", "sigmoid", "sin", "cos"}  # intrinsics of tens of instructions per lane


def _costly_and_shared(s: State, name: str) -> bool:
    """A stage that evaluates a costly intrinsic and is read by more than one stage (a softmax's exp, read by the
    row sum and the division): inlined, each reader would evaluate it again, the sum's reader one lane at a time."""
    if len(s.consumers(name)) < 2:
        return False
    return any(isinstance(e, te.Unary) and e.op in COSTLY for e in te.walk(s.stage(name).op.body))


def _windowed_only(op) -> bool:
    """A reduction over a window alone (a depthwise conv: no channel reduction): each padded input element is read
    KH x KW times at most, so a copy of the padded input costs a pass over memory that the select saves nothing of."""
    return op.tag == "depthwise_conv2d_nchwc"


def _divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _lanes(extent: int, limit: int = 16) -> int:
    lanes = _divisor(extent, limit)
    return extent if lanes < 4 and extent <= limit else lanes


def _tile_anchor(
    s: State, name: str, vector: int, accumulators: int, attach: dict[str, tuple[str, str]]
) -> tuple[State, set[str]]:
    """Register-block a reduction with reuse: cache_write (or its elementwise consumer) holds the output tile. The
    tile is `accumulators` vectors of `vector` lanes; a stage whose consumer reads it elsewhere than at its own
    index (the NCHW copy of a blocked conv) keeps its own local tile.

    A 1x1 conv fused with the depthwise conv it reads (passes.fuse_depthwise_pointwise) runs its output channels
    inside its pixel tiles, and notes in `attach` the loop where the depthwise conv's tile stage (tiled later, as
    stages go consumers first) computes the pixels of one tile, every channel of them: they are read by every output
    channel of the tile from cache. That stage, found in `attach`, is computed there rather than at root."""
    dag = s.dag
    op = s.stage(name).op
    axes = list(op.axes)
    if not any(a.extent > 1 for a in axes):
        return s, set()
    consumers = s.consumers(name)
    out = consumers[0] if len(consumers) == 1 else None
    if out is not None and out not in dag.consumers:
        out = None  # another reduction's cache stage (a chain of tiled reductions): not the DAG's to fuse into
    if out is not None and not (dag.elementwise_match(name, out) or _reads_at_own_index(s, name, out)):
        out = None
    if out is not None and (s.stage(out).compute_at != "root" or dag.is_output(name)):
        out = None  # an output is computed at root, so it cannot live inside its consumer's tile
    v = max(i for i, a in enumerate(axes) if a.extent > 1)
    if out is not None and all(it.name != s.stage(out).op.axes[v].name for it in s.stage(out).iters):
        out = None  # another reduction the consumer reads already tiled it (a scatter's max and its hit count)
    if out is None:
        s = s.cache_write(name)
        local, out = f"{name}.local", name
    else:
        local = name
    b = _block_axis(s, local, v)
    if b is None:  # one output row (a classifier's GEMV): every accumulator along it
        lanes = _row_chunk(axes[v].extent, vector, accumulators)
    else:
        wide = axes[v].extent % (2 * vector) == 0 and axes[v].extent >= 4 * vector
        lanes = 2 * vector if wide else _lanes(axes[v].extent, max(vector, 8))
    vectors = -(-lanes // vector)
    block = _divisor(axes[b].extent, max(1, accumulators // vectors)) if b is not None else 1
    c, group = None, 1  # an int8 conv's output channel blocks in the tile too: one data broadcast feeds `group`
    if op.tag == "int8_dot" and b is not None and b > 1 and vectors == 1:
        c = 1
        block, group = _dot_tile(axes[b].extent, axes[c].extent, accumulators)
    # the output tile loops: outer axes, then the tile of accumulators (the output stage's axes match by position)
    onames = [a.name for a in s.stage(out).op.axes]
    ov, ob = onames[v], onames[b] if b is not None else None
    oc = onames[c] if c is not None else None
    s = s.split(out, ov, [lanes])
    if ob is not None:
        s = s.split(out, ob, [block])
    if oc is not None:
        s = s.split(out, oc, [group])
    outer = [f"{n}.0" if n in (ov, ob, oc) else n for n in onames if n != ov] + [f"{ov}.0"]
    depthwise = _depthwise_input(s, local)
    scores = _attention_rows(s, local, v)
    if depthwise is not None:  # N x F/b x H x W x b: the channel blocks inside the pixel tile
        outer = [outer[0], *outer[2:-1], outer[1], outer[-1]]
    elif scores is None:  # the output's column blocks outside its row blocks, where that reads fewer bytes (_traffic)
        out_axes = s.stage(out).op.axes
        extents = {n: a.extent for n, a in zip(onames, out_axes)}
        tile = {ov: lanes, ob: block, oc: group}
        extents.update({f"{n}.0": a.extent // tile.get(n, block) for n, a in zip(onames, out_axes)})
        axis_of = dict(zip(onames, [a.name for a in axes]))
        columns_first = [outer[-1], *outer[:-1]]
        if _traffic(s, local, columns_first, extents, axis_of) < _traffic(s, local, outer, extents, axis_of):
            outer = columns_first
    s = s.reorder(out, outer + [f"{n}.1" for n in (oc, ob) if n is not None] + [f"{ov}.1"])
    s = s.compute_at(local, out, f"{ov}.0").annotate(out, f"{ov}.1", "vectorize")
    # the accumulator tile: reductions outside, unrolled rows, vectorized columns
    names = [a.name for a in axes]
    vn, bn = names[v], names[b] if b is not None else None
    cn = names[c] if c is not None else None
    inner = [f"{n}.1" for n in (cn, bn) if n is not None] + [f"{vn}.1"]
    s = s.split(local, vn, [lanes])
    if bn is not None:
        s = s.split(local, bn, [block])
    if cn is not None:
        s = s.split(local, cn, [group])
    reduce_names = [r.name for r in op.reduce_axes]
    spatial_outer = [f"{n}.0" if n in (vn, bn, cn) else n for n in names]
    s = s.reorder(local, spatial_outer + reduce_names + inner)
    for n in (cn, bn):
        if n is not None:
            s = s.annotate(local, f"{n}.1", "unroll")
    s = s.annotate(local, f"{vn}.1", "vectorize")
    if out in attach and s.stage(out).op.tag in ("matmul", "batch_matmul"):
        return s, {local, out}  # an attention's scores: computed in the ·V rows after their softmax is (the end)
    if out in attach:
        return s.compute_at(out, *attach[out]), {local, out}
    # parallel over the outer loops; with a depthwise input, its pixel loops only (each thread its own pixels); with
    # one output row (a GEMV), its column chunks too: otherwise one thread streams the whole weight
    parallel = outer[:-2] if depthwise is not None else outer if b is None else outer[:-1]
    s = _parallel(s, out, parallel, work=_work(s, local))
    if depthwise is not None:
        attach[depthwise] = (out, _loop_holding(s.stage(out), outer[-3]))
    if scores is not None:  # the row block's scores and their softmax, computed before its columns of ·V
        softmax, product = scores
        attach[softmax] = attach[product] = (out, _loop_holding(s.stage(out), outer[-2]))
    return s, {local, out}


def _dot_tile(width: int, blocks: int, accumulators: int) -> tuple[int, int]:
    """Output columns and 16-channel blocks of an int8 conv's accumulator tile: the most accumulators, then the
    fewest loads per step of the window (one broadcast of 4 data bytes per column, one weight vector per block). A
    7-wide row alone held 7 of 16 accumulators, fewer than vpdpbusd's latency times its throughput keeps busy."""
    tiles = [(r, g) for r in range(1, width + 1) for g in (1, 2, 4)]
    fits = [(r, g) for r, g in tiles if width % r == 0 and blocks % g == 0 and r * g <= accumulators]
    return max(fits, key=lambda t: (t[0] * t[1], -(t[0] + t[1])))


def _traffic(s: State, name: str, order: list[str], extents: dict[str, int], axis_of: dict[str, str]) -> int:
    """Elements the tile loops in `order` (outermost first) read: each input of reduction `name` once, times the trips
    of the loops it does not depend on that run outside the innermost loop it does (its data is read again on each;
    an input whose loops are all inside them is read once). With a 128 x 3072 by 3072 x 768 GEMM (BERT's FFN), rows
    outside columns read the 9.4 MB weight 16 times, from L3; columns outside rows read the 1.5 MB input 24 times,
    from L2: BERT-base (sequence 128) ran in 175 ms instead of 267 at 1 thread on an Emerald Rapids (2 MiB L2),
    the 4-layer encoder in 6.7 instead of 7.3; convs keep their order (their channel blocks outside the pixels)."""
    total = 0
    order = [loop for loop in order if extents[loop] > 1]  # a loop of one trip orders nothing
    for ld in _loads(s, s.stage(name).op.body):
        producer = s.stage(ld.buffer).op
        used = set().union(*(te.free_vars(i) for i in ld.indices)) if ld.indices else set()
        depends = [axis_of[loop.split(".")[0]] in used for loop in order]
        if not any(depends):
            continue
        last = max(i for i, d in enumerate(depends) if d)
        trips = math.prod(extents[loop] for loop, d in zip(order[:last], depends) if not d)
        total += math.prod(producer.shape) * trips
    return total


def _depthwise_input(s: State, name: str) -> str | None:
    """The stage a 1x1 conv reads whose value a depthwise conv makes, through elementwise stages (the depthwise
    tile's output stage), if `name` is such a conv of a task fusion made of the two."""
    op = s.stage(name).op
    if op.tag != "conv2d_nchw_blocked" or len(op.axes) != 5:
        return None
    for ld in _loads(s, op.body):
        if s.stage(ld.buffer).op.is_placeholder:
            continue
        reduction = feeding_reduction(s.dag, ld.buffer)
        if reduction is not None and reduction.tag == "depthwise_conv2d_nchwc":
            return ld.buffer
    return None


def _attention_rows(s: State, name: str, v: int) -> tuple[str, str] | None:
    """For a product P·V of a task fusion made of an attention (passes.fuse_attention): the stage P reads (the
    softmax's division, which holds its row max, exp and row sum) and the tiled product of the scores under it, if
    `name` reads P at its own index but the last, which is its reduction (P[b, h, i, k] · V[b, h, k, j])."""
    op = s.stage(name).op
    if len(op.reduce_axes) != 1 or v != len(op.axes) - 1 or len(op.axes) < 3:
        return None
    for ld in _loads(s, op.body):
        p = s.stage(ld.buffer)
        if p.op.is_placeholder or p.op.reduce_axes or p.compute_at != "root" or len(ld.indices) != len(op.axes):
            continue
        rows = [a.name for a in op.axes[:-1]]
        at_row = all(not isinstance(i, te.Var) or i.name == n for i, n in zip(ld.indices, rows))
        if not at_row or not isinstance(ld.indices[-1], te.Var) or ld.indices[-1].name != op.reduce_axes[0].name:
            continue
        upstream = _upstream(s, ld.buffer)
        products = [n for n in upstream if s.dag.needs_multi_level_tiling(n) and s.stage(n).compute_at == "root"]
        if len(products) == 1 and any(s.stage(n).op.tag == "comm_reduce" for n in upstream):
            return ld.buffer, products[0]
    return None


def _upstream(s: State, name: str) -> list[str]:
    """The computed stages `name` reads, directly or through others (inlined ones seen through)."""
    seen: list[str] = []
    todo = [name]
    while todo:
        for ld in _loads(s, s.stage(todo.pop()).op.body):
            if not s.stage(ld.buffer).op.is_placeholder and ld.buffer not in seen:
                seen.append(ld.buffer)
                todo.append(ld.buffer)
    return seen


def _loop_holding(stage, name: str) -> str:
    """The loop of `stage` that is `name` or a fused loop containing it."""
    for it in stage.iters:
        if name in it.name.split("@"):
            return it.name
    raise KeyError(name)


def _row_chunk(extent: int, vector: int, accumulators: int) -> int:
    """The accumulators of a tile with one row: a divisor of `extent` of at most `accumulators` vectors, whole vectors
    first, then half vectors, then the largest. A classifier's 1x1280 by 1280x1000 GEMV streams its weight rows 200
    floats at a time in 0.061 ms where 10-float tiles (the divisor up to one vector) took 0.129 (Zen 5, 1 thread): each
    row of the weight is then read in long runs of whole cache lines rather than 40 bytes at a 4000-byte stride."""
    divisors = [d for d in range(1, min(extent, vector * accumulators) + 1) if extent % d == 0]
    return max(divisors, key=lambda d: (d % vector == 0, d % max(1, vector // 2) == 0, d))


def _reads_at_own_index(s: State, producer: str, consumer: str) -> bool:
    c = s.stage(consumer).op
    if c.shape != s.stage(producer).op.shape or c.reduce_axes:
        return False
    loads = [ld for ld in _loads(s, c.body) if ld.buffer == producer]
    return bool(loads) and all(at_own_index(ld, c.axes) for ld in loads)


def _loads(s: State, body) -> list[Load]:
    """Loads of `body` after substituting inlined stages (what the consumer really reads)."""
    return te.loads(s.resolve_inlined(body))


def _block_axis(s: State, local: str, v: int) -> int | None:
    """The spatial axis to unroll into accumulator rows: prefer one the vector-loaded input does not depend on (its
    loads are reused across the rows), then the longest."""
    op = s.stage(local).op
    vname = op.axes[v].name
    loads = _loads(s, op.body)
    with_v = [ld for ld in loads if any(vname in te.free_vars(i) for i in ld.indices)]
    used = set().union(*(te.free_vars(i) for ld in with_v for i in ld.indices)) if with_v else set()
    candidates = [i for i, a in enumerate(op.axes) if i != v and a.extent > 1]
    if not candidates:
        return None
    return max(candidates, key=lambda i: (op.axes[i].name not in used, op.axes[i].extent, i))


def _work(s: State, name: str) -> int:
    op = s.stage(name).op
    return math.prod(a.extent for a in op.axes) * math.prod(r.extent for r in op.reduce_axes)


def _parallel(s: State, name: str, iters: list[str], work: int | None = None) -> State:
    """Fuse the outermost loops until there is enough parallel work, then mark the fused loop parallel; `work`
    (loop iterations under these loops, default the stage's own) below MIN_PARALLEL_WORK stays on one thread."""
    stage = s.stage(name)
    if (work if work is not None else _work(s, name)) < MIN_PARALLEL_WORK:
        return s
    chosen, extent = [], 1
    for it in iters:
        if stage.iters[stage.iter_index(it)].kind != "spatial":
            break
        chosen.append(it)
        extent *= stage.iters[stage.iter_index(it)].extent
        if extent >= PARALLEL_MIN:
            break
    if not chosen or extent == 1:
        return s
    if len(chosen) > 1:
        s = s.fuse(name, chosen)
    return s.annotate(name, "@".join(chosen), "parallel")


def _contiguous(s: State, name: str, axis: str) -> bool:
    """Every load steps by 0 or 1 element along `axis` (so vector loads, not gathers, serve it)."""
    for ld in _loads(s, s.stage(name).op.body):
        if not ld.indices:
            continue  # a scalar reads the same element at every step
        *outer, last = ld.indices
        if any(axis in te.free_vars(i) for i in outer):
            return False
        terms, _ = linear(last)
        for atom, k in terms.items():
            if axis in te.free_vars(atom) and not (isinstance(atom, te.Var) and k == 1):
                return False
    return True


def _elementwise(s: State, name: str, rows: int | None = None) -> State:
    """Vectorize the contiguous axis, parallelize the fused outer ones (only the first `rows` of them, if given)."""
    op = s.stage(name).op
    names = [a.name for a in op.axes]
    if not names:
        return s
    last = op.axes[-1]
    lanes = _lanes(last.extent) if last.extent > 1 and _contiguous(s, name, last.name) else 1
    if lanes > 1:
        s = s.split(name, last.name, [lanes])
        s = s.annotate(name, f"{last.name}.1", "vectorize")
        outer = names[:-1] + [f"{last.name}.0"]
    else:
        outer = names[:-1]
    return _parallel(s, name, outer if rows is None else outer[:rows])


def _reduction(s: State, name: str, vector: int, rows: int | None = None) -> State:
    """Reductions without reuse: spatial outer loops parallel (only the first `rows` of them, if given); reduction
    loops outside a vectorized last axis, or, where the reduction itself runs along contiguous memory (a softmax's
    row max and sum), vectorized partial reductions of `vector` lanes (rfactor), combined per row."""
    op = s.stage(name).op
    names = [a.name for a in op.axes]
    reduce_names = [r.name for r in op.reduce_axes]
    if names and op.axes[-1].extent >= 4 and _contiguous(s, name, op.axes[-1].name):
        last = op.axes[-1]
        lanes = _lanes(last.extent)
        s = s.split(name, last.name, [lanes])
        outer = names[:-1] + [f"{last.name}.0"]
        s = s.reorder(name, outer + reduce_names + [f"{last.name}.1"])
        s = s.annotate(name, f"{last.name}.1", "vectorize")
        return _parallel(s, name, outer if rows is None else outer[:rows])
    k = op.reduce_axes[-1] if op.reduce_axes else None
    if names and k is not None and k.extent % vector == 0 and k.extent >= 2 * vector and _contiguous(s, name, k.name):
        s = s.split(name, k.name, [vector])
        s = s.rfactor(name, f"{k.name}.1", len(names))
        rf = f"{name}.rf"
        s = s.reorder(rf, [*names, *[r for r in reduce_names if r != k.name], f"{k.name}.0", f"{k.name}.1"])
        s = s.annotate(rf, f"{k.name}.1", "vectorize")
        s = s.compute_at(rf, name, names[-1])
        return _parallel(s, name, names if rows is None else names[:rows], work=_work(s, rf))
    return _parallel(s, name, names if rows is None else names[:rows])
