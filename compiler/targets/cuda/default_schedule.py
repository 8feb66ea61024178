"""Default GPU schedules: take a ComputeDAG and give a State every one of whose kernels runs on a GPU.

What an untuned task runs with: elementwise intermediates inlined, each GEMM or conv (a reduction with data reuse)
tiled "SSSRRSRS" with shared-memory inputs and local accumulators (schedule_rules.default_tiling), a reduction of
fewer rows than terms per row (softmax's and layer norm's row statistics, a global pool) reduced across a block's
threads, and every other stage (elementwise outputs, pooling) bound flat: its spatial loops fused, split by the
block size and bound to blockIdx.x / threadIdx.x, its reduction loops serial in each thread.
"""

from __future__ import annotations

from compiler.base.errors import LoweringError
from compiler.schedule.lower import lower
from compiler.schedule.state import State, initial_state
from compiler.targets.cuda.schedule_rules import (
    GpuParams,
    Tiling,
    anchors,
    bind_flat,
    cross_thread_reduce,
    default_tiling,
    inline_elementwise,
    launch_resources,
    multi_level_tile,
    needs_binding,
    reduction_threads,
    smaller,
    wants_cross_thread_reduction,
)
from compiler.tensor.dag import ComputeDAG


def default_schedule(dag: ComputeDAG, params: GpuParams | None = None) -> State:
    """The rule-based GPU schedule of `dag` within `params`' limits (default: an H100/H200's)."""
    params = params or GpuParams()
    s = inline_elementwise(initial_state(dag))
    for name in anchors(s):
        s = _tile_within_limits(s, name, params)
    for stage in s.stages:
        if not needs_binding(s, stage.name):
            continue
        if stage.op.reduce_axes and wants_cross_thread_reduction(stage.op, params):
            s = cross_thread_reduce(s, stage.name, reduction_threads(stage.op, params))
        else:
            s = bind_flat(s, stage.name, params.threads_per_block)
    return s


def _tile_within_limits(s: State, name: str, params: GpuParams) -> State:
    """`name` tiled by default_tiling, made smaller until its kernel's block and shared memory fit `params`."""
    tiling: Tiling | None = default_tiling(s.stage(name).op, params)
    while tiling is not None:
        tiled = multi_level_tile(s, name, tiling)
        if all(r.fits(params) for r in launch_resources(lower(tiled))):
            return tiled
        tiling = smaller(tiling)
    raise LoweringError(f"no tiling of {name} fits {params.max_shared_bytes} bytes of shared memory per block")
