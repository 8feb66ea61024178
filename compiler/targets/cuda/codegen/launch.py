"""A GPU kernel's launch shape, read from its loop IR: the grid and block dimensions are the extents of the loops
bound to blockIdx.{x,y,z} and threadIdx.{x,y,z}, checked against the limits every CUDA GPU since sm_30 has."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.base.errors import BuildError
from compiler.schedule.loopir import BLOCK_KINDS, THREAD_KINDS, Allocate, For, Func, IfThenElse, Seq, Stmt

MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)


@dataclass(frozen=True)
class LaunchShape:
    """Blocks in the grid and threads in a block, (x, y, z) each."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    @property
    def threads_per_block(self) -> int:
        x, y, z = self.block
        return x * y * z


def launch_shape(f: Func) -> LaunchShape:
    """The grid and block of kernel `f`: per bound index, the largest extent of a loop bound to it (1 where none is).
    Raises BuildError naming the loop when an index is bound inside a loop bound to the same index, or a dimension
    exceeds CUDA's limits."""
    extents = dict.fromkeys(BLOCK_KINDS + THREAD_KINDS, 1)

    def visit(s: Stmt, bound: tuple[str, ...]) -> None:
        if isinstance(s, For):
            if s.kind in extents:
                if s.kind in bound:
                    raise BuildError(f"kernel {f.name}: loop {s.var} is bound to {s.kind} inside a loop bound to it")
                extents[s.kind] = max(extents[s.kind], s.extent)
                bound = (*bound, s.kind)
            visit(s.body, bound)
        elif isinstance(s, Allocate):
            visit(s.body, bound)
        elif isinstance(s, Seq):
            for c in s.stmts:
                visit(c, bound)
        elif isinstance(s, IfThenElse):
            visit(s.then, bound)
            if s.orelse is not None:
                visit(s.orelse, bound)

    visit(f.body, ())
    grid = tuple(extents[k] for k in BLOCK_KINDS)
    block = tuple(extents[k] for k in THREAD_KINDS)
    shape = LaunchShape(grid, block)  # type: ignore[arg-type]
    for dims, limits, what in ((grid, MAX_GRID, "grid"), (block, MAX_BLOCK, "block")):
        for axis, n, limit in zip("xyz", dims, limits):
            if n > limit:
                raise BuildError(f"kernel {f.name}: {what} dimension {axis} is {n}, CUDA allows at most {limit}")
    if shape.threads_per_block > MAX_THREADS_PER_BLOCK:
        raise BuildError(
            f"kernel {f.name}: a block of {block[0]}x{block[1]}x{block[2]} = {shape.threads_per_block} threads; CUDA "
            f"allows at most {MAX_THREADS_PER_BLOCK}"
        )
    return shape
