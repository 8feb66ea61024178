"""The loop structure of a small matrix transform (Winograd's input and output transforms, one side at a time).

A stage tagged MATRIX_TRANSFORM has axes (i, j, *outer, lane): i and j index a position in a tile of a few
elements, `outer` walks tiles and channel blocks, `lane` is the contiguous channel lane; its reduction runs over a
tile side too. Tiling such a stage like a GEMM wastes the search: its loops over the tile are 4 to 6 long, and what
makes it fast is known, namely every loop over the tile unrolled, so the matrix entries and partial sums stay in
registers, with the lanes vectorized innermost. So it gets one structure, Ansor's SimplifyComputeWithConstTensor
rule (which unrolls the indices of a constant matrix and tiles the rest): outer loops first, then the unrolled tile
loops and reduction, then the lane loop. A transform feeding another (rows, then columns) is computed inside its
consumer's last outer loop, so the half-transformed tile lives on the stack.

Both the sketch rule (`targets.cpu.sketch.MatrixTransformRule`) and the default schedule use `transform_structure`.
"""

from __future__ import annotations

from compiler.schedule.state import State
from compiler.tensor.dag import Op
from compiler.tensor.ops.winograd import MATRIX_TRANSFORM


def is_matrix_transform(op: Op) -> bool:
    return op.tag == MATRIX_TRANSFORM and bool(op.reduce_axes) and len(op.axes) >= 3


def outer_axes(op: Op) -> list[str]:
    """The axes over tiles and channel blocks: the parallel ones."""
    return [a.name for a in op.axes[2:-1]]


def transform_structure(s: State, name: str) -> State:
    """`name` reordered to (*outer, i, j, *reduction, lane), the tile loops unrolled; computed inside its consumer's
    last outer loop when that consumer is a matrix transform at root (structure the consumer first)."""
    op = s.stage(name).op
    i, j, *outer, lane = [a.name for a in op.axes]
    reduction = [r.name for r in op.reduce_axes]
    s = s.reorder(name, [*outer, i, j, *reduction, lane])
    for it in (i, j, *reduction):
        s = s.annotate(name, it, "unroll")
    consumers = s.consumers(name)
    if len(consumers) == 1:
        c = s.stage(consumers[0])
        if is_matrix_transform(c.op) and c.compute_at == "root" and outer_axes(c.op):
            s = s.compute_at(name, c.name, outer_axes(c.op)[-1])
    return s
