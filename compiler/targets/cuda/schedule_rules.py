"""GPU schedule rules: take a State and give it with loops bound to the grid, virtual threads and threads.

The rules are Ansor's for GPUs, with the tile sizes as arguments so that a search (or a property test) can draw
them: always-inline of elementwise intermediates, multi-level tiling "SSSRRSRS" (the outer three spatial levels
bound to blockIdx.x, vthread and threadIdx.x, then reduction, spatial and reduction levels in each thread's local
accumulators) with the anchor's inputs cached in shared memory at the outer reduction loop and fetched by all the
block's threads together, and a flat binding (spatial loops fused, split by the block size, bound to blockIdx.x
and threadIdx.x) for everything else. `launch_resources` reads what a lowered program asks of the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from compiler.base import dtypes
from compiler.schedule.gpu_interp import split_launches
from compiler.schedule.loopir import THREAD_KINDS, Allocate, For, Func, walk_stmts
from compiler.schedule.state import GPU_ANNOTATIONS, State
from compiler.tensor import te
from compiler.tensor.dag import Op, at_own_index


@dataclass(frozen=True)
class GpuParams:
    """What a GPU allows a kernel and what the rules aim for; the defaults are an H100/H200's (sm_90)."""

    max_threads_per_block: int = 1024
    max_shared_bytes: int = 48 * 1024  # per block without opting in to the larger carve-out
    warp_size: int = 32
    max_vthread: int = 8  # Ansor's warp_size / 4: enough to spread a thread's tile over the shared-memory banks
    threads_per_block: int = 256  # the flat binding's block size


@dataclass(frozen=True)
class Tiling:
    """Tile sizes of "SSSRRSRS": per spatial axis (vthread, thread, middle, inner) extents (the block level takes
    the rest), per reduction axis (middle, inner) extents (the outer level takes the rest). `shared` caches the
    anchor's inputs in shared memory, each thread fetching `vector` neighbouring elements at a time; `unroll` is
    the accumulating stage's auto_unroll_max_step; `fuse_consumer` tiles the anchor's elementwise consumer (where it
    has one) and computes the anchor in each thread's registers there, instead of caching its writes."""

    spatial: tuple[tuple[int, int, int, int], ...]
    reduce: tuple[tuple[int, int], ...]
    shared: bool = True
    vector: int = 1
    unroll: int = 0
    fuse_consumer: bool = True


def inline_elementwise(s: State) -> State:
    """Every elementwise intermediate (no reduction, not an output) inlined into its consumers."""
    for stage in reversed(s.stages):
        op = stage.op
        if op.is_placeholder or op.reduce_axes or s.dag.is_output(op.name) or stage.compute_at != "root":
            continue
        s = s.compute_inline(op.name)
    return s


def bind_flat(s: State, name: str, threads: int, vector: int = 1) -> State:
    """The stage's spatial loops fused, split by `threads` (and `vector` consecutive elements per thread, a
    vectorized loop), bound to blockIdx.x (outer) and threadIdx.x (inner); its reduction loops stay serial inside
    each thread."""
    stage = s.stage(name)
    spatial = [i for i, it in enumerate(stage.iters) if it.kind == "spatial"]
    if not spatial:
        return s  # a reduction to one value: one thread of one block
    if spatial != list(range(len(spatial))):
        raise ValueError(f"{name}'s spatial loops must come first to bind them, got {[it.name for it in stage.iters]}")
    if len(spatial) > 1:
        s = s.fuse(name, spatial)
    if vector > 1:
        s = s.split(name, 0, [threads, vector]).annotate(name, 2, "vectorize")
    else:
        s = s.split(name, 0, [threads])
    return s.annotate(name, 0, "blockIdx.x").annotate(name, 1, "threadIdx.x")


def bind_2d(s: State, name: str, threads_x: int, threads_y: int) -> State:
    """A stage of two or more spatial loops on a 2-D grid of 2-D blocks: the innermost loop split by `threads_x`
    (blockIdx.x, threadIdx.x), the one outside it by `threads_y` (threadIdx.y; blockIdx.y with every loop further
    out fused into it)."""
    stage = s.stage(name)
    n = len(stage.op.axes)
    if n < 2 or [it.name for it in stage.iters[:n]] != [a.name for a in stage.op.axes]:
        raise ValueError(f"{name} needs two or more spatial loops, as yet unscheduled, for a 2-D binding")
    y, x = stage.iters[n - 2].name, stage.iters[n - 1].name
    s = s.split(name, x, [threads_x]).split(name, y, [threads_y])
    outer = [a.name for a in stage.op.axes[: n - 2]]
    reduce = [it.name for it in stage.iters[n:]]
    s = _reorder(s, name, outer + [f"{y}.0", f"{x}.0", f"{y}.1", f"{x}.1"] + reduce)
    if n > 2:
        s = s.fuse(name, list(range(n - 1)))
    s = s.annotate(name, 0, "blockIdx.y").annotate(name, 1, "blockIdx.x")
    return s.annotate(name, 2, "threadIdx.y").annotate(name, 3, "threadIdx.x")


def fusible_consumer(s: State, name: str) -> str | None:
    """The elementwise stage at the root that is `name`'s only consumer and reads it at its own index (a conv's bias
    and ReLU), if there is one."""
    consumers = s.consumers(name)
    if len(consumers) != 1:
        return None
    c = s.stage(consumers[0])
    if c.compute_at != "root" or c.op.reduce_axes or c.op.shape != s.stage(name).op.shape:
        return None
    loads = [ld for ld in te.loads(s.resolve_inlined(c.op.body)) if ld.buffer == name]
    return c.name if all(at_own_index(ld, c.op.axes) for ld in loads) else None


def cross_thread_reduce(s: State, name: str, threads: int) -> State:
    """A reduction of few, long rows (Ansor's cross-thread reduction): one block per output element, whose
    `threads` threads each reduce every `threads`-th term into a shared `<name>.rf` stage (the reduction fused,
    split by `threads` and factored), after which thread 0 reduces the threads' partial results."""
    stage = s.stage(name)
    n_spatial = len(stage.op.axes)
    reduce = [i for i, it in enumerate(stage.iters) if it.kind == "reduce"]
    if not n_spatial or not reduce or reduce[0] != n_spatial:
        raise ValueError(f"{name} needs spatial loops, then its reduction loops, for a cross-thread reduction")
    if len(reduce) > 1:
        s = s.fuse(name, reduce)
    s = s.split(name, n_spatial, [threads])
    s = s.rfactor(name, n_spatial + 1, n_spatial)
    rf = f"{name}.rf"
    if n_spatial > 1:
        s = s.fuse(name, list(range(n_spatial)))
    s = s.split(name, 0, [1]).annotate(name, 0, "blockIdx.x").annotate(name, 1, "threadIdx.x")
    s = s.compute_at(rf, name, 0)
    return s.annotate(rf, n_spatial, "threadIdx.x")


def wants_cross_thread_reduction(op: Op, params: GpuParams) -> bool:
    """Ansor's condition: fewer outputs than a block has threads, and fewer than terms in each output's sum."""
    spatial = math.prod(a.extent for a in op.axes)
    terms = math.prod(r.extent for r in op.reduce_axes)
    return bool(op.axes) and spatial <= params.max_threads_per_block and spatial < terms


def reduction_threads(op: Op, params: GpuParams) -> int:
    """Threads for a cross-thread reduction: a power of two up to one per term, at most the flat block size."""
    return min(params.threads_per_block, _pow2_at_most(math.prod(r.extent for r in op.reduce_axes)))


def multi_level_tile(s: State, name: str, tiling: Tiling) -> State:
    """Ansor's GPU tiling of a reduction with data reuse (GEMM, conv): `name` computed into a `<name>.local` stage
    (or, with `tiling.fuse_consumer` and a fusible consumer, `name` itself computed for that consumer) tiled
    "RRSRS" inside the thread loop of the output's "SSS" levels (blockIdx.x, vthread, threadIdx.x), and with
    `tiling.shared` each input of the reduction cached in shared memory at the outer reduction loop, its copy
    loops fused, split by the block's threads (and `tiling.vector`) and bound to threadIdx.x."""
    op = s.stage(name).op
    if len(tiling.spatial) != len(op.axes) or len(tiling.reduce) != len(op.reduce_axes):
        raise ValueError(
            f"{name} has {len(op.axes)} spatial and {len(op.reduce_axes)} reduction axes; the tiling gives "
            f"{len(tiling.spatial)} and {len(tiling.reduce)}"
        )
    consumer = fusible_consumer(s, name) if tiling.fuse_consumer else None
    if consumer is not None:
        outer, local = consumer, name
    else:
        s = s.cache_write(name, "local")
        outer, local = name, f"{name}.local"
    inputs = list(dict.fromkeys(s.stage(local).op.reads)) if tiling.shared and op.reduce_axes else []
    # an input another anchor of the task already caches (Winograd's transform matrix, read by two of its stages)
    # has its one shared cache there; this anchor reads it from global memory
    inputs = [src for src in inputs if not any(st.name == f"{src}.shared" for st in s.stages)]
    for src in inputs:
        s = s.cache_read(src, "shared", [local])
    outer_axes = [a.name for a in s.stage(outer).op.axes]
    for a, (vt, t, mid, inner) in zip(outer_axes, tiling.spatial):
        s = s.split(outer, a, [vt, t, mid * inner])
    levels = [[f"{a}.{k}" for a in outer_axes] for k in range(4)]
    s = _reorder(s, outer, [n for level in levels for n in level])
    n = len(outer_axes)
    for level, binding in enumerate(("blockIdx.x", "vthread", "threadIdx.x")):
        if n > 1:
            s = s.fuse(outer, list(range(level, level + n)))
        s = s.annotate(outer, level, binding)
    s = s.compute_at(local, outer, 2)
    threads = s.stage(outer).iters[2].extent  # what splitting left of the thread tiles (an axis may be shorter)
    axes = [a.name for a in op.axes]

    reduce = [r.name for r in op.reduce_axes]
    for a, (_, _, _, inner) in zip(axes, tiling.spatial):
        s = s.split(local, a, [inner])
    for r, (mid, inner) in zip(reduce, tiling.reduce):
        s = s.split(local, r, [mid, inner])
    order = (
        [f"{r}.0" for r in reduce]
        + [f"{r}.1" for r in reduce]
        + [f"{a}.0" for a in axes]
        + [f"{r}.2" for r in reduce]
        + [f"{a}.1" for a in axes]
    )
    s = _reorder(s, local, order)
    if tiling.unroll:
        s = s.pragma_unroll(local, tiling.unroll)
    for src in inputs:
        cache = f"{src}.shared"
        s = s.compute_at(cache, local, len(reduce) - 1)
        dims = len(s.stage(cache).iters)
        if dims > 1:
            s = s.fuse(cache, list(range(dims)))
        if tiling.vector > 1:
            s = s.split(cache, 0, [threads, tiling.vector]).annotate(cache, 2, "vectorize")
        else:
            s = s.split(cache, 0, [threads])
        s = s.annotate(cache, 1, "threadIdx.x")
    return s


def _reorder(s: State, name: str, order: list[str]) -> State:
    stage = s.stage(name)
    return s.reorder(name, [stage.iter_index(n) for n in order])


def anchors(s: State) -> list[str]:
    """Stages at the root that multi-level tiling is for: reductions with data reuse (GEMM, conv)."""
    return [
        st.name
        for st in s.stages
        if st.compute_at == "root" and st.op.reduce_axes and s.dag.needs_multi_level_tiling(st.name)
    ]


def needs_binding(s: State, name: str) -> bool:
    """Whether the stage still runs on the host's terms: computed at the root and no loop bound to the GPU."""
    stage = s.stage(name)
    return (
        not stage.op.is_placeholder
        and stage.compute_at == "root"
        and not any(it.annotation in GPU_ANNOTATIONS for it in stage.iters)
    )


def default_tiling(op: Op, params: GpuParams) -> Tiling:
    """Tile sizes that suit most GEMMs and convs: `params.threads_per_block` threads, up to 16 per spatial axis from
    the innermost out, each thread computing up to 4 outputs along each of the innermost two axes long enough for
    it; a reduction step of up to 8 on the first reduction axis and whole windows on the others (`smaller` shrinks
    it where the shared tiles do not fit)."""
    threads_left = params.threads_per_block
    spatial: list[tuple[int, int, int, int]] = [(1, 1, 1, 1)] * len(op.axes)
    for d in reversed(range(len(op.axes))):
        extent = op.axes[d].extent
        t = min(16, threads_left, _pow2_at_most(extent))
        inner = 1
        if d >= len(op.axes) - 2:
            inner = 4 if extent >= 8 * t else 2 if extent >= 4 * t else 1
        spatial[d] = (1, t, 1, inner)
        threads_left //= t
    reduce = [(min(8, r.extent), 1) if k == 0 else (r.extent, 1) for k, r in enumerate(op.reduce_axes)]
    return Tiling(tuple(spatial), tuple(reduce))


def smaller(tiling: Tiling) -> Tiling | None:
    """The tiling one step smaller, in what it keeps in shared memory: the largest reduction step halved, else each
    thread's outputs, else the threads of the largest thread tile halved; None where every tile is 1."""
    reduce = list(tiling.reduce)
    k = max(range(len(reduce)), key=lambda i: reduce[i][0] * reduce[i][1], default=None)
    if k is not None and reduce[k][0] * reduce[k][1] > 1:
        mid, inner = reduce[k]
        reduce[k] = (mid // 2, inner) if mid > 1 else (mid, inner // 2)
        return replace(tiling, reduce=tuple(reduce))
    spatial = list(tiling.spatial)
    if any(mid * inner > 1 for _, _, mid, inner in spatial):
        return replace(tiling, spatial=tuple((vt, t, 1, 1) for vt, t, _, _ in spatial))
    k = max(range(len(spatial)), key=lambda i: spatial[i][1], default=None)
    if k is not None and spatial[k][1] > 1:
        vt, t, mid, inner = spatial[k]
        spatial[k] = (vt, t // 2, mid, inner)
        return replace(tiling, spatial=tuple(spatial))
    return None


def _pow2_at_most(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


@dataclass(frozen=True)
class LaunchResources:
    """What one kernel launch asks of the device: threads per block, blocks, shared bytes per block."""

    threads: int
    blocks: int
    shared_bytes: int

    def fits(self, params: GpuParams) -> bool:
        return self.threads <= params.max_threads_per_block and self.shared_bytes <= params.max_shared_bytes


def launch_resources(f: Func) -> list[LaunchResources]:
    """Per kernel launch of a lowered GPU program (its top-level loop nests), what it asks of the device."""
    out = []
    for body in split_launches(f.body)[1]:
        dims: dict[str, int] = {}
        shared: dict[str, int] = {}
        for s in walk_stmts(body):
            if isinstance(s, For) and s.kind.startswith(("blockIdx", "threadIdx")):
                dims[s.kind] = max(dims.get(s.kind, 1), s.extent)
            elif isinstance(s, Allocate) and s.scope == "shared":
                shared[s.buffer.name] = s.buffer.size * max(1, dtypes.bits(s.buffer.dtype) // 8)
        threads = math.prod(dims.get(k, 1) for k in THREAD_KINDS)
        blocks = math.prod(e for k, e in dims.items() if k.startswith("blockIdx"))
        out.append(LaunchResources(threads, blocks, sum(shared.values())))
    return out
