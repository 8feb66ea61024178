"""A reference interpreter of GPU loop IR: runs every thread of every block on numpy arrays, as a GPU would.

Each top-level loop nest of the Func (below its global allocations) is one kernel launch. Its grid and block are
the largest extents of the loops bound to each blockIdx / threadIdx; the launch body is translated once into a
Python generator function run by every thread, in which a bound loop is `if index < extent: var = index` and a
`Barrier` is a `yield`. The threads of a block step in lock-step from barrier to barrier: all must arrive at the
same barrier (or all finish), else BarrierDivergence names the barrier and the first thread that went elsewhere.
Shared buffers are one per block, local buffers one per thread (allocated in its own body), vthread loops run
serially. Between two barriers, two threads touching one shared element with at least one write raise
SharedMemoryRace naming the buffer, the element and the threads.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator

import numpy as np

from compiler.base import dtypes
from compiler.base.errors import TilefarmError
from compiler.schedule import interp
from compiler.schedule.interp import _expr, _name, _zero
from compiler.schedule.loopir import (
    BLOCK_KINDS,
    THREAD_KINDS,
    Allocate,
    Barrier,
    Buffer,
    For,
    Func,
    IfThenElse,
    Seq,
    Stmt,
    Store,
    walk_stmts,
)

INDEX_NAMES = {kind: f"_idx_{kind.replace('.', '_')}" for kind in BLOCK_KINDS + THREAD_KINDS}
_FINISHED = -1


class BarrierDivergence(TilefarmError):
    """The threads of a block did not all reach the same barrier (or some finished while others wait)."""


class SharedMemoryRace(TilefarmError):
    """Two threads of a block touched the same shared element between two barriers, at least one writing it."""


class _Block:
    """The running block: its index, its shared buffers by name, and the thread running now (races are charged
    to it)."""

    def __init__(self, index: tuple[int, int, int]):
        self.index = index
        self.thread: tuple[int, int, int] = (0, 0, 0)
        self.shared: dict[str, _SharedBuffer] = {}

    def buffer(self, name: str, size: int, zero: float) -> _SharedBuffer:
        """The block's shared buffer `name` (made on first use, then the same for every thread)."""
        buf = self.shared.get(name)
        if buf is None:
            buf = self.shared[name] = _SharedBuffer(name, self, [zero] * size)
        return buf

    def barrier_passed(self) -> None:
        for buf in self.shared.values():
            buf.writer.clear()
            buf.readers.clear()


class _SharedBuffer(list):
    """A shared buffer's elements, with who wrote and read each one since the last barrier."""

    def __init__(self, name: str, block: _Block, values: list):
        super().__init__(values)
        self.name, self.block = name, block
        self.writer: dict[int, tuple[int, int, int]] = {}
        self.readers: dict[int, tuple[int, int, int] | None] = {}  # None: read by several threads

    def _race(self, i: int, first: object, how: str) -> SharedMemoryRace:
        return SharedMemoryRace(
            f"shared-memory race on {self.name}[{i}] in block {self.block.index}: thread {first} {how} thread "
            f"{self.block.thread} between two barriers"
        )

    def __getitem__(self, i):
        t = self.block.thread
        w = self.writer.get(i)
        if w is not None and w != t:
            raise self._race(i, w, "wrote it, then read by")
        if i not in self.readers:
            self.readers[i] = t
        elif self.readers[i] != t:
            self.readers[i] = None
        return list.__getitem__(self, i)

    def __setitem__(self, i, value):
        t = self.block.thread
        w = self.writer.get(i)
        if w is not None and w != t:
            raise self._race(i, w, "wrote it, and so did")
        if i in self.readers and self.readers[i] != t:
            first = self.readers[i] or "(several)"
            raise self._race(i, first, "read it, then written by")
        self.writer[i] = t
        list.__setitem__(self, i, value)


# ---------------------------------------------------------------------------------------------- translation


class _Launch:
    """One kernel launch: its loop nest, grid and block sizes, and the translated per-thread body."""

    def __init__(self, body: Stmt, globals_: dict[str, str], number: int):
        self.number = number
        self.grid = _dims(body, BLOCK_KINDS)
        self.block = _dims(body, THREAD_KINDS)
        self.barriers: list[str] = []
        self.buffers = list(globals_)
        lines = [f"def _thread({', '.join(INDEX_NAMES.values())}, _block, {', '.join(map(_name, self.buffers))}):"]
        lines.append("    yield from ()")  # a generator even without barriers
        self._stmt(body, 1, lines, dict(globals_), None)
        self.source = "\n".join(lines) + "\n"

    def _stmt(self, s: Stmt, depth: int, out: list[str], dtype_of: dict[str, str], inside: str | None) -> None:
        pad = "    " * depth
        if isinstance(s, For):
            if s.kind in INDEX_NAMES:
                index = INDEX_NAMES[s.kind]
                out.append(f"{pad}if {index} < {s.extent}:")
                out.append(f"{pad}    {_name(s.var.name)} = {index}")
            else:  # serial, unrolled, vectorized, parallel and vthread loops run one iteration after another
                out.append(f"{pad}for {_name(s.var.name)} in range({s.extent}):")
            self._stmt(s.body, depth + 1, out, dtype_of, inside)
        elif isinstance(s, Barrier):
            where = f" in the scope of {inside}" if inside else ""
            self.barriers.append(f"barrier #{len(self.barriers)} of launch {self.number}{where}")
            out.append(f"{pad}yield {len(self.barriers) - 1}")
        elif isinstance(s, Store):
            out.append(f"{pad}{_name(s.buffer)}[{_expr(s.index)}] = _cast_{dtype_of[s.buffer]}({_expr(s.value)})")
        elif isinstance(s, Allocate):
            b = s.buffer
            dtype_of[b.name] = b.dtype
            if s.scope == "shared":
                out.append(f"{pad}{_name(b.name)} = _block.buffer({b.name!r}, {b.size}, {_zero(b.dtype)})")
            elif s.scope == "local":
                out.append(f"{pad}{_name(b.name)} = [{_zero(b.dtype)}] * {b.size}")
            else:
                raise ValueError(f"global buffer {b.name} is allocated inside kernel launch {self.number}")
            self._stmt(s.body, depth, out, dtype_of, b.name)
        elif isinstance(s, Seq):
            for c in s.stmts:
                self._stmt(c, depth, out, dtype_of, inside)
            if not s.stmts:
                out.append(f"{pad}pass")
        elif isinstance(s, IfThenElse):
            out.append(f"{pad}if {_expr(s.cond)}:")
            self._stmt(s.then, depth + 1, out, dtype_of, inside)
            if s.orelse is not None:
                out.append(f"{pad}else:")
                self._stmt(s.orelse, depth + 1, out, dtype_of, inside)
        else:
            raise TypeError(f"cannot interpret {type(s).__name__}")

    def describe(self, arrival: int) -> str:
        return "finished" if arrival == _FINISHED else f"reached {self.barriers[arrival]}"

    def run(self, thread_fn: Callable[..., Iterator[int]], buffers: list[list]) -> None:
        """Every block of the grid, its threads in lock-step between barriers."""
        for bz, by, bx in itertools.product(*(range(n) for n in reversed(self.grid))):
            block = _Block((bx, by, bz))
            threads = [
                (t, thread_fn(bx, by, bz, *t, block, *buffers))
                for tz, ty, tx in itertools.product(*(range(n) for n in reversed(self.block)))
                for t in [(tx, ty, tz)]
            ]
            while True:
                arrivals = []
                for t, gen in threads:
                    block.thread = t
                    arrivals.append(next(gen, _FINISHED))
                for (t, _), arrival in zip(threads, arrivals):
                    if arrival != arrivals[0]:
                        raise BarrierDivergence(
                            f"launch {self.number}, block {block.index}: thread {threads[0][0]} "
                            f"{self.describe(arrivals[0])} but thread {t} {self.describe(arrival)}"
                        )
                if arrivals[0] == _FINISHED:
                    break
                block.barrier_passed()


def _dims(body: Stmt, kinds: tuple[str, str, str]) -> tuple[int, int, int]:
    """(x, y, z) extents: the largest loop bound to each of `kinds` (1 where none is)."""
    dims = [1, 1, 1]
    for s in walk_stmts(body):
        if isinstance(s, For) and s.kind in kinds:
            k = kinds.index(s.kind)
            dims[k] = max(dims[k], s.extent)
    return dims[0], dims[1], dims[2]


def split_launches(body: Stmt) -> tuple[list[Buffer], list[Stmt]]:
    """The global buffers allocated around a GPU program, and its kernel launches (its top-level loop nests)."""
    buffers: list[Buffer] = []
    while isinstance(body, Allocate):
        if body.scope != "global":
            raise ValueError(f"{body.scope} buffer {body.buffer.name} is allocated outside any kernel")
        buffers.append(body.buffer)
        body = body.body
    return buffers, list(body.stmts) if isinstance(body, Seq) else [body]


def to_python(f: Func) -> list[str]:
    """The Python source of each launch's per-thread generator."""
    buffers, launches = split_launches(f.body)
    globals_ = {b.name: b.dtype for b in (*f.params, *buffers)}
    return [_Launch(body, globals_, k).source for k, body in enumerate(launches)]


def _env() -> dict:
    env: dict = {
        "math": math,
        "_div": interp._div,
        "_floordiv": interp._floordiv,
        "_mod": interp._mod,
        "_exp": interp._exp,
        "_log": interp._log,
        "_sqrt": interp._sqrt,
        "_sigmoid": interp._sigmoid,
        "_sin": interp._sin,
        "_cos": interp._cos,
        "_pow": interp._pow,
        "_shl": interp._shl,
        "_shr": interp._shr,
    }
    env.update({f"_cast_{d}": interp._to(d) for d in dtypes.DTYPES})
    return env


def run(f: Func, *arrays: np.ndarray) -> None:
    """Execute the GPU program `f` on numpy arrays (in the order of f.params), writing results into them in place;
    raises BarrierDivergence or SharedMemoryRace where the program is wrong on any GPU."""
    if len(arrays) != len(f.params):
        raise ValueError(f"{f.name} takes {len(f.params)} buffers, got {len(arrays)}")
    for b, a in zip(f.params, arrays):
        if a.size != b.size:
            raise ValueError(f"buffer {b.name} needs {b.size} elements, got an array of {a.size}")
    buffers, bodies = split_launches(f.body)
    globals_ = {b.name: b.dtype for b in (*f.params, *buffers)}
    lists = [a.reshape(-1).tolist() for a in arrays] + [[_zero_value(b.dtype)] * b.size for b in buffers]
    for k, body in enumerate(bodies):
        launch = _Launch(body, globals_, k)
        env = _env()
        exec(compile(launch.source, f"<gpu loopir {f.name} launch {k}>", "exec"), env)
        launch.run(env["_thread"], lists)
    for a, values in zip(arrays, lists):
        a.reshape(-1)[:] = np.asarray(values, dtype=np.float64 if a.dtype.kind == "f" else a.dtype).astype(a.dtype)


def _zero_value(dtype: str):
    return math.nan if dtypes.is_float(dtype) else 0
