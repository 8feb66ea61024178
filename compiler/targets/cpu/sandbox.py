"""The measurement sandbox: a child process that loads one candidate kernel at a time, checks it and times it.

`runner.LocalRunner` starts it as `python sandbox.py FD_IN FD_OUT` and talks to it with pickled dicts over two pipes.
It imports only numpy, ctypes and compiler.base.arrays (never llvmlite or the rest of the compiler), so it starts fast
and a kernel that segfaults, aborts or hangs takes down only this process; the parent sees the pipe close (or no answer
in time), kills it if needed, and starts a fresh one for the next candidate.

Requests, each answered by one reply:
  {"op": "reference", "lib", "data", "outputs", "threads"}: run the trusted kernel once on the task's inputs
      (data/in{i}.npy) and save its outputs as data/ref{i}.npy.  Reply {"ok": True}.
  {"op": "measure", "lib", "data", "outputs", "threads", "check", "rtol", "atol", "number", "repeat",
   "min_repeat_ms", "flush_bytes", "evict", "evict_lib"}:
      reply {"ok": True, "costs": [seconds per call, one per repeat], "number": n}
      or {"ok": False, "error": "wrong_answer" | "run" | "unknown", "message": str}.
`outputs` lists (name, shape, dtype) of the kernel's output parameters, which follow its inputs. `evict` lists
inputs whose cache lines `tilefarm_evict` of the library `evict_lib` flushes (outside the timing) before each call.
"""

from __future__ import annotations

import _ctypes
import ctypes
import ctypes.util
import math
import os
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import numpy as np

from compiler.base.arrays import aligned, aligned_empty

WARMUP_SHARE = 0.1  # untimed calls after the check call, until they (with it) have run this share of min_repeat_ms
OVERSHOOT = 3.0  # a timed batch stops after this many times min_repeat_ms, however many calls it planned
GARBAGE_BYTE = 0xA5  # fills integer and bool outputs before the check; float outputs get NaN
MAX_CACHED_TASKS = 4  # tasks whose arrays stay loaded; tuning moves from task to task, so a few are enough
# libgomp settings artifacts run with (meta.json's "environment"; the user's own settings win), and the sandbox measures
# under. libgomp reads its wait policy once, when it loads with the library. Idle workers that spin steal the core a
# busy host's other work needs (ResNet-18 on 2 threads of a loaded 2-core host: 240 ms spinning, 90 ms passive, 85 ms
# on 1 thread), but workers that sleep at once must be woken for every parallel loop. A short spin (10k iterations,
# ~0.1 ms) keeps a model's back-to-back kernels fast and still lets idle workers sleep. OMP_WAIT_POLICY=active restores
# spinning for dedicated hosts.
OPENMP_ENV = {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "10000"}


class _Task:
    """A task's inputs, reference outputs and output buffers, loaded once from the runner's data folder."""

    def __init__(self, data: str, outputs: list):
        n_in = 0
        while os.path.exists(os.path.join(data, f"in{n_in}.npy")):
            n_in += 1
        self.inputs = [aligned(np.load(os.path.join(data, f"in{i}.npy"))) for i in range(n_in)]
        self.names = [name for name, _, _ in outputs]
        self.outputs = [aligned_empty(shape, dtype) for _, shape, dtype in outputs]
        self.refs: list[np.ndarray] | None = None
        self.data = data

    def load_refs(self) -> list[np.ndarray]:
        if self.refs is None:
            self.refs = [np.load(os.path.join(self.data, f"ref{i}.npy")) for i in range(len(self.outputs))]
        return self.refs

    def pointers(self) -> list[int]:
        return [a.ctypes.data for a in self.inputs + self.outputs]


_tasks: dict[str, _Task] = {}


def _task(data: str, outputs: list) -> _Task:
    if data not in _tasks:
        if len(_tasks) >= MAX_CACHED_TASKS:
            del _tasks[next(iter(_tasks))]
        _tasks[data] = _Task(data, outputs)
    return _tasks[data]


def _fill_garbage(outs: list[np.ndarray]) -> None:
    for o in outs:
        if o.dtype.kind == "f":
            o.fill(np.nan)
        else:
            o.view(np.uint8).fill(GARBAGE_BYTE)


class _Kernel:
    """The `kernel` symbol of a candidate library, called on raw pointers (`call`, with its scratch buffer appended
    when it takes one, as an artifact gives it part of the workspace); unloaded on close."""

    def __init__(self, path: str, nargs: int, threads: int):
        self.lib = ctypes.CDLL(path)
        try:
            self.fn = self.lib.kernel
            ctypes.c_int32.in_dll(self.lib, "tilefarm_num_threads").value = threads
        except (AttributeError, ValueError) as e:
            self.close()
            raise OSError(f"{path} is not a tilefarm kernel library: {e}") from None
        try:  # codegen.scratch_bytes_symbol("kernel"); a library written by hand may take none
            scratch = ctypes.c_int64.in_dll(self.lib, "kernel_scratch_bytes").value
        except ValueError:
            scratch = 0
        self.scratch = aligned_empty((scratch,), np.uint8) if scratch else None
        extra = [self.scratch.ctypes.data] if scratch else []
        self.fn.restype, self.fn.argtypes = None, [ctypes.c_void_p] * (nargs + len(extra))
        self.call = (lambda *ptrs: self.fn(*ptrs, *extra)) if extra else self.fn

    def close(self) -> None:
        # thousands of candidates pass through one process: unload each (libgomp itself stays loaded)
        _ctypes.dlclose(self.lib._handle)


def _mismatch(task: _Task, rtol: float, atol: float) -> str | None:
    """Why the outputs differ from the reference, or None. Floats: |out - ref| <= atol * max(1, max|ref|) +
    rtol * |ref| elementwise, NaN only where the reference has NaN; integers and bools: exactly equal."""
    for name, o, r in zip(task.names, task.outputs, task.load_refs()):
        if o.dtype.kind == "f":
            finite = np.abs(r[np.isfinite(r)])
            scale = max(1.0, float(finite.max())) if finite.size else 1.0
            bad = ~np.isclose(o, r, rtol=rtol, atol=atol * scale, equal_nan=True)
        else:
            bad = o.view(np.uint8) != r.view(np.uint8) if o.dtype == np.bool_ else o != r
        if bad.any():
            err = np.where(bad, np.abs(o.astype(np.float64) - r.astype(np.float64)), 0.0)
            err = np.where(np.isnan(err), np.inf, err)  # a NaN where a number belongs is the worst error
            at = np.unravel_index(int(np.argmax(err)), o.shape)
            got, want = o[at].item(), r[at].item()
            return (
                f"output {name}: {int(bad.sum())} of {o.size} elements differ from the reference; the largest error "
                f"is {float(err[at]):.4g} at {tuple(int(i) for i in at)}: got {got!r}, expected {want!r}"
            )
    return None


def _time(
    fn, ptrs: list[int], number: int, min_s: float, before: Callable[[], None] | None, limit: float
) -> tuple[float, int]:
    """(seconds, calls) of one batch: at least `number` calls that together take at least `min_s` seconds, stopped
    early once the calls have taken `limit` seconds; `before` (a cache flush) runs outside the timing before each
    call."""
    total, calls = 0.0, 0
    while (calls < number or total < min_s) and total < limit:
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn(*ptrs)
        total += time.perf_counter() - t0
        calls += 1
    return total, calls


def timed_repeats(
    fn, ptrs: list[int], number: int, repeat: int, min_s: float, before: Callable[[], None] | None, warm_s: float
) -> tuple[list[float], int]:
    """Seconds per call in each of `repeat` batches, and the calls in the last. `warm_s`: what the caller's first,
    untimed call (the check) took.

    A batch runs `number` calls or more, until they have taken `min_s` (TVM's min_repeat_ms). TVM's time_evaluator
    instead grows `number` (x1.618 at least) and times the batch anew until it lasts min_repeat_ms, which discards
    every batch that falls short: a batch sized from a first estimate often falls just short (the first calls after
    loading run slower), and its 1.618x successor then runs ~160 ms. Timing 64 conv candidates (~2 ms calls) that
    way took the sandbox 191 ms each for a 100 ms window, this way 110 ms (bench/results/runner-batches-*).
    Before the first batch, calls run untimed until they and the check call have taken
    WARMUP_SHARE x min_s, so the timed window starts warm (a conv's first three calls after the check ran 9%
    slower than the rest).

    A kernel's time can jump 100x between calls (a parallel loop whose second thread must wait for a core another
    process holds), so a batch whose `number` was sized from fast calls could run for minutes: a batch stops once
    its calls have taken OVERSHOOT x min_s, and the calls it made become `number`."""
    limit = OVERSHOOT * min_s if min_s > 0 else math.inf
    if warm_s < WARMUP_SHARE * min_s:
        _time(fn, ptrs, 1, WARMUP_SHARE * min_s - warm_s, before, limit)
    costs = []
    for _ in range(repeat):
        seconds, number = _time(fn, ptrs, number, min_s, before, limit)
        costs.append(seconds / number)
    return costs, number


def measure(req: dict) -> dict:
    task = _task(req["data"], req["outputs"])
    ptrs = task.pointers()
    try:
        k = _Kernel(req["lib"], len(ptrs), req["threads"])
    except OSError as e:
        return {"ok": False, "error": "run", "message": f"cannot load the kernel: {e}"}
    try:
        # the check call is the first warm-up call
        _fill_garbage(task.outputs)
        t0 = time.perf_counter()
        k.call(*ptrs)
        warm_s = time.perf_counter() - t0
        if req["check"]:
            why = _mismatch(task, req["rtol"], req["atol"])
            if why:
                return {"ok": False, "error": "wrong_answer", "message": why}
        before = _cache_preparation(req, task)
        costs, number = timed_repeats(
            k.call, ptrs, req["number"], req["repeat"], req["min_repeat_ms"] / 1000, before, warm_s
        )
        return {"ok": True, "costs": costs, "number": number}
    finally:
        k.close()


_evictors: dict[str, ctypes.CDLL] = {}


def evictor(path: str) -> Callable[[int, int], None]:
    """`tilefarm_evict(pointer, bytes)` of the evictor library at `path` (runner.build_evictor), loaded once."""
    if path not in _evictors:
        _evictors[path] = ctypes.CDLL(path)
        _evictors[path].tilefarm_evict.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return _evictors[path].tilefarm_evict


def _cache_preparation(req: dict, task: _Task) -> Callable[[], None] | None:
    """What runs before each timed call: overwrite a buffer twice the L3 (`flush_bytes`: every cache cold), and/or
    flush the lines of the inputs listed in `evict` (the model's weights cold, as in a run of a model whose weights
    exceed the L3, while the activations stay where the previous kernel left them)."""
    steps: list[Callable[[], None]] = []
    if req.get("flush_bytes"):
        flush = np.zeros(req["flush_bytes"] // 8, np.int64)

        def overwrite() -> None:
            flush[...] += 1

        steps.append(overwrite)
    if req.get("evict"):
        evict = evictor(req["evict_lib"])
        spans = [(task.inputs[i].ctypes.data, task.inputs[i].nbytes) for i in req["evict"]]

        def evict_inputs() -> None:
            for ptr, n in spans:
                evict(ptr, n)

        steps.append(evict_inputs)

    def prepare() -> None:
        for step in steps:
            step()

    return prepare if steps else None


def reference(req: dict) -> dict:
    task = _task(req["data"], req["outputs"])
    k = _Kernel(req["lib"], len(task.inputs) + len(task.outputs), req["threads"])
    try:
        _fill_garbage(task.outputs)
        k.call(*task.pointers())
    finally:
        k.close()
    for i, o in enumerate(task.outputs):
        np.save(os.path.join(req["data"], f"ref{i}.npy"), o)
    return {"ok": True}


def main(fd_in: int, fd_out: int) -> None:
    # Held for the life of the process: a kernel library is unloaded after each candidate, and if it held the
    # only reference to libgomp, its idle worker threads would be left running unmapped code.
    ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
    requests, replies = Connection(fd_in, writable=False), Connection(fd_out, readable=False)
    ops = {"measure": measure, "reference": reference}
    while True:
        try:
            req = requests.recv()
        except EOFError:  # the runner closed the pipe or died
            return
        try:
            reply = ops[req["op"]](req)
        except Exception as e:  # noqa: BLE001 - anything the sandbox itself hits goes back as a message
            reply = {"ok": False, "error": "unknown", "message": f"{type(e).__name__}: {e}"}
        replies.send(reply)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
