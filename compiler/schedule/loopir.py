"""Loop IR: the imperative program a scheduled ComputeDAG lowers to.

Buffers are flat: every Load/Store carries one element offset. Loops have a kind (serial, parallel,
vectorized, unrolled) that codegen honours; `Allocate` scopes an intermediate buffer to its body.

GPU programs use the same IR: a loop of kind "blockIdx.x" (…y, z) or "threadIdx.x" (…y, z) is bound to that index
(its variable *is* the index, its extent the grid or block dimension), a "vthread" loop is a virtual thread (run
serially inside one thread, interleaving its body's accesses); an `Allocate` has a storage scope ("global": the
kernel's workspace, "shared": one per thread block, "local": one per thread, in registers), and `Barrier` is
`__syncthreads()`: every thread of the block reaches it before any goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from compiler.tensor.te import Const, Expr, Var

CPU_LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled")
BLOCK_KINDS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
THREAD_KINDS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
GPU_LOOP_KINDS = BLOCK_KINDS + THREAD_KINDS + ("vthread",)
LOOP_KINDS = CPU_LOOP_KINDS + GPU_LOOP_KINDS
SCOPES = ("global", "shared", "local")


class Stmt:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True, slots=True)
class For(Stmt):
    var: Var
    extent: int
    kind: str
    body: Stmt
    # an unrolled loop that codegen leaves to LLVM's full unrolling instead of replicating the body itself (a matrix
    # transform's tile loops: the same code, in half the build time)
    llvm_unroll: bool = False


@dataclass(frozen=True, slots=True)
class Store(Stmt):
    buffer: str
    index: Expr
    value: Expr


@dataclass(frozen=True, slots=True)
class Allocate(Stmt):
    buffer: Buffer
    body: Stmt
    scope: str = "global"  # one of SCOPES


@dataclass(frozen=True, slots=True)
class Barrier(Stmt):
    """All threads of a GPU thread block wait here until every one has arrived (shared memory written before is
    visible to every thread after)."""


@dataclass(frozen=True, slots=True)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True)
class IfThenElse(Stmt):
    cond: Expr
    then: Stmt
    orelse: Stmt | None = None


@dataclass(frozen=True, slots=True)
class Func:
    """A kernel: `params` are the caller's buffers (inputs, then outputs), passed as pointers in this order."""

    name: str
    params: tuple[Buffer, ...]
    body: Stmt

    def __str__(self):
        return print_func(self)


def seq(*stmts: Stmt | None) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        flat.extend(s.stmts if isinstance(s, Seq) else (s,))
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def map_children(s: Stmt, fn: Callable[[Stmt], Stmt]) -> Stmt:
    """`s` with `fn` applied to each statement directly inside it (a loop's or an allocation's body, a sequence's
    parts, a branch's arms); a Store or Barrier as it is. A rewrite handles the statements it changes and passes the
    rest here: `map_children(s, rewrite)`."""
    if isinstance(s, (For, Allocate)):
        return replace(s, body=fn(s.body))
    if isinstance(s, Seq):
        return seq(*(fn(c) for c in s.stmts))
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, fn(s.then), s.orelse and fn(s.orelse))
    return s


def map_exprs(s: Stmt, fn: Callable[[Expr], Expr], values: bool = True) -> Stmt:
    """`s` with `fn` applied to every guard's condition and, with `values`, every store's index and value."""
    if isinstance(s, IfThenElse):
        return IfThenElse(fn(s.cond), map_exprs(s.then, fn, values), s.orelse and map_exprs(s.orelse, fn, values))
    if isinstance(s, Store):
        return Store(s.buffer, fn(s.index), fn(s.value)) if values else s
    return map_children(s, lambda c: map_exprs(c, fn, values))


def walk_stmts(s: Stmt):
    """All statements, pre-order."""
    yield s
    if isinstance(s, (For, Allocate)):
        yield from walk_stmts(s.body)
    elif isinstance(s, Seq):
        for c in s.stmts:
            yield from walk_stmts(c)
    elif isinstance(s, IfThenElse):
        yield from walk_stmts(s.then)
        if s.orelse is not None:
            yield from walk_stmts(s.orelse)


def print_func(f: Func) -> str:
    params = ", ".join(f"{b.name}: {b.dtype}{list(b.shape)}" for b in f.params)
    return f"def {f.name}({params}):\n" + print_stmt(f.body, 1)


def print_stmt(s: Stmt, depth: int = 0) -> str:
    pad = "  " * depth
    if isinstance(s, For):
        kind = "" if s.kind == "serial" else f"  # {s.kind}"
        return f"{pad}for {s.var} in range({s.extent}):{kind}\n" + print_stmt(s.body, depth + 1)
    if isinstance(s, Store):
        return f"{pad}{s.buffer}[{s.index}] = {s.value}\n"
    if isinstance(s, Allocate):
        b = s.buffer
        scope = "" if s.scope == "global" else f", {s.scope}"
        return f"{pad}{b.name} = alloc({b.dtype}{list(b.shape)}{scope})\n" + print_stmt(s.body, depth)
    if isinstance(s, Barrier):
        return f"{pad}barrier()\n"
    if isinstance(s, Seq):
        return "".join(print_stmt(c, depth) for c in s.stmts)
    if isinstance(s, IfThenElse):
        out = f"{pad}if {s.cond}:\n" + print_stmt(s.then, depth + 1)
        if s.orelse is not None:
            out += f"{pad}else:\n" + print_stmt(s.orelse, depth + 1)
        return out
    raise TypeError(f"not a statement: {s!r}")


__all__ = [
    "Buffer",
    "For",
    "Store",
    "Allocate",
    "Barrier",
    "Seq",
    "IfThenElse",
    "Func",
    "Const",
    "Var",
    "seq",
    "LOOP_KINDS",
    "CPU_LOOP_KINDS",
    "GPU_LOOP_KINDS",
    "BLOCK_KINDS",
    "THREAD_KINDS",
    "SCOPES",
]
