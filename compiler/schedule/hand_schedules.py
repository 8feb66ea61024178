"""Hand-written schedules in the State API: the kind of schedule the auto-scheduler is meant to find.

Both follow the structure of every fast CPU GEMM/conv: a register block of accumulators (cache_write to a local
tile, unrolled rows, a vectorized contiguous column block), the reduction loop just outside it, outer tiles, and a
parallel outer loop.
"""

from __future__ import annotations

from compiler.schedule.state import State, initial_state
from compiler.tensor.dag import ComputeDAG


def gemm(dag: ComputeDAG, rows: int = 8, cols: int = 32, tile_cols: int = 32) -> State:
    """C = A·B: 8x32 register block, B packed per 32-column panel (cache_read), panels split across threads."""
    C, B = dag.outputs[0], dag.inputs[1]
    local, pack = f"{C}.local", f"{B}.pack"
    s = initial_state(dag).cache_write(C)
    s = s.split(C, "i", [rows]).split(C, "j", [tile_cols]).reorder(C, ["j.0", "i.0", "i.1", "j.1"])
    s = s.cache_read(B, "pack", [local])
    s = s.compute_at(local, C, "i.0").compute_at(pack, C, "j.0")
    s = s.split(local, "i", [rows]).split(local, "j", [cols]).reorder(local, ["i.0", "j.0", "k", "i.1", "j.1"])
    s = s.annotate(local, "i.1", "unroll").annotate(local, "j.1", "vectorize")
    s = s.annotate(C, "j.1", "vectorize").annotate(pack, "ax1", "vectorize")
    return s.annotate(C, "j.0", "parallel")


def conv2d(dag: ComputeDAG, channels: int = 16) -> State:
    """NCHW conv: 16 output channels x one output row segment (<= 16 lanes) of accumulators; padding materialized
    once (so the inner loop has no bounds checks); output-channel blocks and rows split across threads."""
    out = dag.outputs[0]
    _, F, _, W = dag.op(out).shape
    lanes = max(d for d in range(1, 17) if W % d == 0)
    ob = channels if F % channels == 0 else 1
    local = f"{out}.local"
    s = initial_state(dag).cache_write(out)
    s = s.split(out, "f", [ob]).split(out, "y", [1]).split(out, "x", [lanes])
    s = s.reorder(out, ["n", "f.0", "y.0", "x.0", "f.1", "y.1", "x.1"]).compute_at(local, out, "x.0")
    s = s.split(local, "f", [ob]).split(local, "x", [lanes])
    s = s.reorder(local, ["n", "f.0", "y", "x.0", "rc", "ry", "rx", "f.1", "x.1"])
    s = s.annotate(local, "f.1", "unroll").annotate(local, "x.1", "vectorize")
    s = s.annotate(out, "x.1", "vectorize").fuse(out, ["n", "f.0", "y.0"]).annotate(out, "n@f.0@y.0", "parallel")
    pads = [op.name for op in dag.ops if op.name.endswith("_pad")]
    for p in pads:  # materialize the padded input: a cheap copy that removes every branch from the inner loop
        s = s.fuse(p, ["i0", "i1", "i2"]).annotate(p, "i0@i1@i2", "parallel").annotate(p, "i3", "vectorize")
    return s
