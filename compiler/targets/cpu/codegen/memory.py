"""Where a kernel's intermediate buffers live: on the stack, in the caller's scratch buffer, or on the heap.

Small buffers (register tiles, a thread's slice of a cache stage) are stack arrays. A big one outside parallel loops
(a Winograd conv's packed input and batched-GEMM result, a padded copy of an image: megabytes) is given a byte offset
in a scratch buffer that the caller passes as the kernel's last argument, sized by `plan_scratch`: the artifact
reserves it in its planned workspace, a JIT kernel and the measurement sandbox allocate it once. Allocating such
buffers per call cost more than the arithmetic on a VM: glibc serves them with mmap, so every call faulted in fresh
zeroed pages and unmapped them again (a 64-channel Winograd conv on Zen 3: 7.4 ms per call, 3.3 ms without).
Only a big buffer inside a parallel loop (one per thread chunk) still comes from the heap.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.base import dtypes
from compiler.base.arrays import ALIGN
from compiler.schedule.loopir import Allocate, For, Func, IfThenElse, Seq, Stmt

STACK_LIMIT = 64 * 1024  # bigger allocations go to scratch or the heap: thread stacks are small
STACK_BUDGET = 512 * 1024  # and so do the ones past this total per function


def nbytes(s: Allocate) -> int:
    return s.buffer.size * dtypes.itemsize(s.buffer.dtype)


def fits_stack(size: int, used: int) -> bool:
    return size <= STACK_LIMIT and used + size <= STACK_BUDGET


@dataclass(frozen=True)
class ScratchPlan:
    """Byte offsets in the scratch buffer by allocation (`id` of the Allocate statement), and the buffer's size.

    Offsets nest like a stack: an allocation's body may allocate above it, and the next sibling reuses its bytes."""

    offsets: dict[int, int]
    nbytes: int


def plan_scratch(f: Func) -> ScratchPlan:
    """The scratch layout of `f`: every allocation outside parallel loops that does not fit the stack budget (taken in
    the order codegen emits them, so the same ones stay on the stack)."""
    offsets: dict[int, int] = {}
    stack = 0

    def walk(s: Stmt, base: int) -> int:
        nonlocal stack
        if isinstance(s, Seq):
            return max((walk(c, base) for c in s.stmts), default=base)
        if isinstance(s, For):
            return base if s.kind == "parallel" else walk(s.body, base)  # a parallel body is a function of its own
        if isinstance(s, IfThenElse):
            return max(walk(s.then, base), walk(s.orelse, base) if s.orelse is not None else base)
        if isinstance(s, Allocate):
            size = nbytes(s)
            if fits_stack(size, stack):
                stack += size
                return walk(s.body, base)
            offsets[id(s)] = base
            return walk(s.body, base + -(-size // ALIGN) * ALIGN)
        return base

    top = walk(f.body, 0)
    return ScratchPlan(offsets, top)
