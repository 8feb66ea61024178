"""Where a GPU program's buffers live: the caller's buffers and "global" intermediates in device memory (the latter
allocated around the program's kernel launches, at offsets of one workspace buffer every kernel takes as its last
parameter), "shared" ones as static shared memory (one copy per thread block), "local" ones as per-thread arrays that
LLVM keeps in registers where every index is a constant once unrolled (else ptxas puts them on the thread's stack:
its report says so)."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.base import dtypes
from compiler.base.errors import BuildError
from compiler.schedule.loopir import SCOPES, Allocate, Buffer, Func, Seq, Stmt, walk_stmts

PARAM_ALIGN = 16  # bytes every buffer a kernel gets starts on (cuMemAlloc gives 256): lets ptxas use 16-byte loads
WORKSPACE_ALIGN = 256  # each global intermediate's offset in the workspace: a full memory transaction
SHARED_ALIGN = 16
MAX_STATIC_SHARED = 48 * 1024  # bytes of static shared memory a block may declare (more needs dynamic shared memory)


def nbytes(s: Allocate) -> int:
    return s.buffer.size * dtypes.itemsize(s.buffer.dtype)


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


@dataclass(frozen=True)
class Launches:
    """A GPU program split as the hardware runs it: its top-level loop nests, one kernel launch each, in order, and
    the "global" buffers allocated around them, by name with their byte offset in one workspace of
    `workspace_bytes`."""

    bodies: tuple[Stmt, ...]
    workspace: dict[str, tuple[int, Buffer]]
    workspace_bytes: int


def split_launches(f: Func) -> Launches:
    """`f`'s launches and workspace layout. Raises BuildError for a "global" buffer allocated inside a launch (no
    thread could tell the others where it is) or a shared or local one around them (it belongs to no block)."""
    workspace: dict[str, tuple[int, Buffer]] = {}
    top = 0
    body = f.body
    while isinstance(body, Allocate):
        if body.scope != "global":
            raise BuildError(
                f"kernel {f.name}: {body.scope} buffer {body.buffer.name} is allocated outside every kernel launch"
            )
        workspace[body.buffer.name] = (top, body.buffer)
        top += _round_up(nbytes(body), WORKSPACE_ALIGN)
        body = body.body
    bodies = body.stmts if isinstance(body, Seq) else (body,)
    for launch in bodies:
        for s in walk_stmts(launch):
            if isinstance(s, Allocate) and s.scope == "global":
                raise BuildError(
                    f"kernel {f.name}: global buffer {s.buffer.name} is allocated inside a kernel launch; allocate it "
                    "around the launches"
                )
    return Launches(tuple(bodies), workspace, top)


def shared_bytes(f: Func) -> int:
    """Static shared memory kernel `f` declares: every "shared" allocation has its own array. Raises BuildError
    naming the buffers when they exceed what a block may declare statically, or when an allocation's scope is not
    one of loopir.SCOPES."""
    allocs = [s for s in walk_stmts(f.body) if isinstance(s, Allocate)]
    for s in allocs:
        if s.scope not in SCOPES:
            raise BuildError(f"kernel {f.name}: buffer {s.buffer.name} has scope {s.scope!r}, not one of {SCOPES}")
    shared = [s for s in allocs if s.scope == "shared"]
    total = sum(_round_up(nbytes(s), SHARED_ALIGN) for s in shared)
    if total > MAX_STATIC_SHARED:
        listing = ", ".join(f"{s.buffer.name} ({nbytes(s)} B)" for s in shared)
        raise BuildError(
            f"kernel {f.name}: {total} bytes of shared memory ({listing}); a block may declare at most "
            f"{MAX_STATIC_SHARED} statically: tile smaller"
        )
    return total
