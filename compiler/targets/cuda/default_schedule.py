"""Default GPU schedules: take a ComputeDAG and give a State every one of whose kernels runs on a GPU.

What an untuned task runs with: elementwise intermediates inlined, each GEMM or conv (a reduction with data reuse)
tiled "SSSRRSRS" with shared-memory inputs and local accumulators (schedule_rules.default_tiling), and every other
stage (elementwise outputs, row reductions, pooling, softmax's parts) bound flat: its spatial loops fused, split by
the block size and bound to blockIdx.x / threadIdx.x, its reduction loops serial in each thread.
"""

from __future__ import annotations

from compiler.schedule.state import State, initial_state
from compiler.targets.cuda.schedule_rules import (
    GpuParams,
    anchors,
    bind_flat,
    default_tiling,
    inline_elementwise,
    multi_level_tile,
)
from compiler.tensor.dag import ComputeDAG


def default_schedule(dag: ComputeDAG, params: GpuParams | None = None) -> State:
    """The rule-based GPU schedule of `dag` within `params`' limits (default: an H100/H200's)."""
    params = params or GpuParams()
    s = inline_elementwise(initial_state(dag))
    tiled: set[str] = set()
    for name in anchors(s):
        before = {st.name for st in s.stages}
        s = multi_level_tile(s, name, default_tiling(s.stage(name).op, params))
        tiled |= {name} | ({st.name for st in s.stages} - before)
    for stage in s.stages:
        if stage.op.is_placeholder or stage.compute_at != "root" or stage.name in tiled:
            continue
        s = bind_flat(s, stage.name, params.threads_per_block)
    return s
