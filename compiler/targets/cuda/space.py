"""The GPU search space of one task: schedule_rules' "SSSRRSRS" tiling and flat binding as sketches, with the tile
sizes and block size as the decisions annotation samples and mutation changes (Ansor's GPU rules as far as
schedule_rules has them: no cross-thread reduction or rfactor sketch yet).

Two sketches where the task has a GEMM or conv to tile: with the reduction's inputs cached in shared memory, and
without (each thread reading global memory). A task without one has one sketch: every stage bound flat.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from compiler.base.errors import InvalidProgram, TilefarmError
from compiler.base.target import Target
from compiler.schedule.lower import lower
from compiler.schedule.state import GPU_ANNOTATIONS, State, initial_state
from compiler.targets.cuda.schedule_rules import (
    GpuParams,
    Tiling,
    anchors,
    bind_flat,
    inline_elementwise,
    launch_resources,
    multi_level_tile,
)
from compiler.tensor.dag import ComputeDAG

BLOCK_SIZES = (32, 64, 128, 256, 512)  # the flat binding's threads per block
SPATIAL_LEVELS = 4  # vthread, thread, middle, inner (the block level takes the rest)
REDUCE_LEVELS = 2  # middle, inner (the outer level takes the rest)


@dataclass(frozen=True)
class GpuSketch:
    """A sketch: the elementwise intermediates inlined, the anchors (GEMMs, convs) to tile, with or without
    shared-memory input caches. `rules`, `tile_steps` and `tile_extents` are what the search compares sketches of
    sibling tasks by (evolution.SketchShape): the rules naming their stages, no placeholder Split in `state` (the
    tiles are applied whole by materialize), and the extents of the anchors' axes."""

    state: State
    anchors: tuple[str, ...]
    shared: bool

    @property
    def rules(self) -> tuple[str, ...]:
        cache = "shared inputs" if self.shared else "global inputs"
        return (*(f"multi_level_tile({a}, {cache})" for a in self.anchors), "bind_flat(rest)")

    @property
    def tile_steps(self) -> tuple[int, ...]:
        return ()

    @property
    def tile_extents(self) -> tuple[int, ...]:
        ops = [self.state.stage(a).op for a in self.anchors]
        return tuple(ax.extent for op in ops for ax in (*op.axes, *op.reduce_axes))

    def __str__(self):
        return f"sketch [{', '.join(self.rules)}]\n{self.state}"


@dataclass(frozen=True)
class GpuDecisions:
    """Per anchor (in sketch order) its spatial and reduction tile sizes, and the flat stages' block size."""

    tiles: tuple[tuple[str, tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]], ...]
    block: int

    def to_json(self) -> dict:
        return {"tiles": [[n, [list(s) for s in sp], [list(r) for r in rd]] for n, sp, rd in self.tiles],
                "block": self.block}  # fmt: skip

    @staticmethod
    def from_json(data: dict) -> GpuDecisions:
        tiles = tuple((n, tuple(tuple(s) for s in sp), tuple(tuple(r) for r in rd)) for n, sp, rd in data["tiles"])
        return GpuDecisions(tiles, int(data["block"]))


def generate_sketches(dag: ComputeDAG) -> tuple[GpuSketch, ...]:
    """The task's sketches: with and without shared-memory caches where it has anchors, else one flat sketch."""
    s = inline_elementwise(initial_state(dag))
    found = tuple(anchors(s))
    if not found:
        return (GpuSketch(s, (), False),)
    return GpuSketch(s, found, True), GpuSketch(s, found, False)


def materialize(sketch: GpuSketch, d: GpuDecisions, params: GpuParams) -> State:
    """The program the decisions make of the sketch, lowered once to check that every launch fits the device
    (`params`); raises InvalidProgram naming what does not."""
    s = sketch.state
    try:
        for name, spatial, reduce in d.tiles:
            tiling = Tiling(tuple(spatial), tuple(reduce), shared=sketch.shared)  # type: ignore[arg-type]
            s = multi_level_tile(s, name, tiling)
        for stage in s.stages:
            if _unbound(s, stage.name):
                s = bind_flat(s, stage.name, d.block)
        resources = launch_resources(lower(s))
    except (TilefarmError, ValueError, KeyError) as e:
        raise InvalidProgram(str(e)) from None
    for r in resources:
        if not r.fits(params):
            raise InvalidProgram(
                f"a launch takes {r.threads} threads and {r.shared_bytes} B of shared memory per block; the device "
                f"allows {params.max_threads_per_block} and {params.max_shared_bytes} B"
            )
    return s


def _unbound(s: State, name: str) -> bool:
    stage = s.stage(name)
    return (
        not stage.op.is_placeholder
        and stage.compute_at == "root"
        and not any(it.annotation in GPU_ANNOTATIONS for it in stage.iters)
    )


def _pow2_choices(extent: int, cap: int) -> list[int]:
    return [1 << k for k in range(max(1, min(extent, cap)).bit_length())]


def sample_tiles(
    state: State, name: str, rng: np.random.Generator, params: GpuParams
) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """Random power-of-two tile sizes for anchor `name`: per spatial axis (vthread, thread, middle, inner) within its
    extent, the threads of a block at most `params.max_threads_per_block` and virtual threads at most
    `params.max_vthread`; per reduction axis (middle, inner)."""
    op = state.stage(name).op
    threads_left, vthreads_left = params.max_threads_per_block, params.max_vthread
    spatial = []
    for axis in reversed(op.axes):  # the innermost axes get the threads first, as coalescing wants
        left = axis.extent
        t = int(rng.choice(_pow2_choices(left, min(threads_left, 32))))
        left = max(1, left // t)
        vt = int(rng.choice(_pow2_choices(left, vthreads_left)))
        left = max(1, left // vt)
        mid = int(rng.choice(_pow2_choices(left, 4)))
        inner = int(rng.choice(_pow2_choices(max(1, left // mid), 4)))
        threads_left //= t
        vthreads_left //= vt
        spatial.append((vt, t, mid, inner))
    reduce = []
    for axis in op.reduce_axes:
        mid = int(rng.choice(_pow2_choices(axis.extent, 16)))
        inner = int(rng.choice(_pow2_choices(max(1, axis.extent // mid), 4)))
        reduce.append((mid, inner))
    return tuple(reversed(spatial)), tuple(reduce)


@dataclass
class CudaSearchSpace:
    """`params` is the search's SearchParams (its CPU switches do not apply here); the device limits are
    GpuParams' (an H100/H200's)."""

    dag: ComputeDAG
    target: Target
    params: object
    gpu: GpuParams = field(default_factory=GpuParams)
    sketches: tuple[GpuSketch, ...] = field(init=False)

    def __post_init__(self):
        self.sketches = generate_sketches(self.dag)

    def sample(self, sketch: int, rng: np.random.Generator) -> tuple[GpuDecisions, State]:
        sk = self.sketches[sketch]
        tiles = tuple((n, *sample_tiles(sk.state, n, rng, self.gpu)) for n in sk.anchors)
        d = GpuDecisions(tiles, int(rng.choice(BLOCK_SIZES)))  # type: ignore[arg-type]
        return d, materialize(sk, d, self.gpu)

    def materialize(self, sketch: int, decisions: GpuDecisions) -> State:
        return materialize(self.sketches[sketch], decisions, self.gpu)

    def mutate(
        self, sketch: int, decisions: GpuDecisions, state: State, rng: np.random.Generator
    ) -> GpuDecisions | None:
        """One anchor's tile sizes drawn again (Ansor's tile-size mutation), or, without anchors, the block size."""
        sk = self.sketches[sketch]
        if not sk.anchors:
            return GpuDecisions((), int(rng.choice([b for b in BLOCK_SIZES if b != decisions.block])))
        k = int(rng.integers(len(sk.anchors)))
        tiles = list(decisions.tiles)
        tiles[k] = (sk.anchors[k], *sample_tiles(sk.state, sk.anchors[k], rng, self.gpu))  # type: ignore[assignment]
        return GpuDecisions(tuple(tiles), decisions.block)

    def keeps(self, sketch: int, child: State, parent: State) -> bool:
        return True  # materialize already refused every program the device cannot launch

    def decisions_from_json(self, data) -> GpuDecisions:
        return GpuDecisions.from_json(data)

    def rename_stages(self, d: GpuDecisions, rename: Callable[[str], str | None]) -> GpuDecisions | None:
        tiles = []
        for name, spatial, reduce in d.tiles:
            new = rename(name)
            if new is None:
                return None
            tiles.append((new, spatial, reduce))
        return GpuDecisions(tuple(tiles), d.block)
