"""Measuring candidate schedules on this CPU: build each into a shared library, then check and time it in a sandbox.

`LocalBuilder` replays a candidate's steps, lowers and links it, in a pool of worker processes (a build that runs
past its timeout has its process killed and replaced). `LocalRunner` runs one candidate at a time in a persistent
child process (`compiler/targets/cpu/sandbox.py`, numpy and ctypes only): a kernel that crashes or hangs kills only that
child, which is restarted for the next candidate. Before timing, every candidate's outputs are compared with the
default schedule's on seeded random inputs, so a schedule that computes the wrong thing never wins.
Both implement the protocols of `compiler.costs.measure`; failures are results, never exceptions.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from compiler.base import dtypes
from compiler.base.errors import IllegalStep, TilefarmError
from compiler.base.target import DEFAULT_L3_BYTES, Target
from compiler.costs.measure import (
    BUILD,
    BUILD_TIMEOUT,
    INSTANTIATION,
    RUN,
    RUN_TIMEOUT,
    UNKNOWN,
    BuildResult,
    MeasureInput,
    MeasureResult,
)
from compiler.costs.records import cache_condition
from compiler.schedule.lower import lower
from compiler.schedule.state import Step, apply_steps
from compiler.targets.cpu.codegen import emit_shared_library, link_shared_library
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.targets.cpu.host import host
from compiler.targets.cpu.sandbox import OPENMP_ENV
from compiler.targets.cpu.target_parse import check_runs_here
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.tasks import Task

KERNEL = "kernel"  # the symbol every candidate library exports
WORKER = Path(__file__).with_name("sandbox.py")
# Flushes a buffer's cache lines from every level (the measurement sandbox calls it between timed calls). Built once
# per runner with the system C compiler; where neither x86's clflush nor AArch64's `dc civac` exists it does
# nothing, and the measurement is then one with warm weights.
EVICT_C = r"""
#include <stddef.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
void tilefarm_evict(const void* p, size_t n) {
    const char* c = (const char*)p;
    if (n == 0) return;
    for (size_t i = 0; i < n; i += 64) {
#if defined(__x86_64__) || defined(__i386__)
        _mm_clflush(c + i);
#elif defined(__aarch64__)
        __asm__ volatile("dc civac, %0" : : "r"(c + i) : "memory");
#endif
    }
#if defined(__x86_64__) || defined(__i386__)
    _mm_clflush(c + n - 1);
    _mm_mfence();
#elif defined(__aarch64__)
    __asm__ volatile("dc civac, %0" : : "r"(c + n - 1) : "memory");
    __asm__ volatile("dsb ish" : : : "memory");
#endif
}
"""



def _exit_reason(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


# ---------------------------------------------------------------------------------------------- builder


def _build_one(
    dag: ComputeDAG, steps: tuple[Step, ...], path: str, target: Target | None = None
) -> tuple[str | None, str]:
    try:
        state = apply_steps(dag, steps)
    except IllegalStep as e:
        return INSTANTIATION, str(e)
    try:
        emit_shared_library([lower(state, KERNEL)], path, target)
    except TilefarmError as e:
        return BUILD, f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - a compiler bug fails this candidate, not the tuning run
        return BUILD, f"{type(e).__name__}: {e}\n{''.join(traceback.format_tb(e.__traceback__)[-3:])}"
    return None, ""


def _serve_builds(conn: Connection) -> None:
    """A builder worker: build jobs (dag, steps, path) until it receives None, or until the tuning process is gone
    (killed or interrupted: its end of the pipe closed), quietly: the tuning process reports what it was doing."""
    try:
        while (job := conn.recv()) is not None:
            conn.send(_build_one(*job))
    except (EOFError, OSError, KeyboardInterrupt):
        return


class _BuildWorker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve_builds, args=(child,), daemon=True, name="tilefarm-build")
        self.proc.start()
        child.close()
        self.job: tuple[int, float, str] | None = None  # (input index, start time, library path)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(1.0)
        if self.proc.is_alive():
            self.kill()


class LocalBuilder:
    """Builds candidates in parallel in worker processes, with code for `target` (default: this host; another CPU's
    only where this host runs its instructions, as they are measured here: InvalidTarget says what it lacks); a context
    manager (close() removes the libraries)."""

    def __init__(
        self,
        n_parallel: int | None = None,
        timeout: float = 15.0,
        workdir: str | Path | None = None,
        target: Target | None = None,
    ):
        if target is not None:
            check_runs_here(target)
        self.target = target
        self.n_parallel = n_parallel or host().cores
        self.timeout = timeout
        self._own_dir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="tilefarm-build-") if workdir is None else workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._own_dir:
            weakref.finalize(self, shutil.rmtree, self.workdir, ignore_errors=True)  # if close() is never called
        # forkserver, not fork: the parent may hold llvmlite state and threads. Workers fork from a server that
        # has imported the compiler once, so starting (or replacing a killed) worker costs milliseconds.
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload([__name__])
        self._workers: list[_BuildWorker] = []
        self._count = 0

    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        results: list[BuildResult | None] = [None] * len(inputs)
        pending = list(reversed(range(len(inputs))))
        for k, w in enumerate(self._workers):
            if w.job is not None or not w.proc.is_alive():  # a job left by an interrupted call, or killed by the OS
                self._replace(k)
        while len(self._workers) < min(self.n_parallel, len(inputs)):
            self._workers.append(_BuildWorker(self._ctx))
        while pending or any(w.job for w in self._workers):
            for k, w in enumerate(self._workers):
                if w.job is None and pending:
                    self._dispatch(k, pending.pop(), inputs)
            busy = [w for w in self._workers if w.job]
            deadline = min(w.job[1] for w in busy) + self.timeout
            multiprocessing.connection.wait([w.conn for w in busy], max(0.0, deadline - time.perf_counter()))
            for k, w in enumerate(self._workers):
                if w.job is not None and (done := self._collect(k)) is not None:
                    results[done[0]] = done[1]
        return results  # type: ignore[return-value]

    def _dispatch(self, k: int, i: int, inputs: list[MeasureInput]) -> None:
        self._count += 1
        path = str(self.workdir / f"c{self._count}.so")
        job = (inputs[i].task.dag, tuple(inputs[i].steps), path, self.target)
        try:
            self._workers[k].conn.send(job)
        except OSError:  # it died since the last job: a fresh one takes this job
            self._replace(k).conn.send(job)
        self._workers[k].job = (i, time.perf_counter(), path)

    def _collect(self, k: int) -> tuple[int, BuildResult] | None:
        """(input index, result) if worker k's job is over; a worker that died or ran out of time is replaced."""
        w = self._workers[k]
        i, start, path = w.job
        seconds = time.perf_counter() - start
        if w.conn.poll():
            try:
                error, message = w.conn.recv()
                w.job = None
                return i, BuildResult(None if error else path, error, message, seconds)
            except (EOFError, OSError):  # LLVM or the linker crashed the process
                w.proc.join()
                why = f"the build process died ({_exit_reason(w.proc.exitcode)})"
                result = BuildResult(None, BUILD, why, seconds)
        elif seconds >= self.timeout:
            result = BuildResult(None, BUILD_TIMEOUT, f"the build took over {self.timeout:g} s", seconds)
        else:
            return None
        self._replace(k)
        return i, result

    def _replace(self, k: int) -> _BuildWorker:
        self._workers[k].kill()
        self._workers[k] = _BuildWorker(self._ctx)
        return self._workers[k]

    def close(self) -> None:
        for w in self._workers:
            w.stop()
        self._workers = []
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalBuilder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------- runner


def random_inputs(dag: ComputeDAG, seed: int = 0) -> list[np.ndarray]:
    """Seeded inputs for checking candidates: floats standard normal; integers small and nonzero (an integer
    division by an input cannot trap; Gather clamps indices); bools fair coin flips."""
    rng = np.random.default_rng(seed)
    out = []
    for name in dag.inputs:
        op = dag.op(name)
        dt = dtypes.numpy(op.dtype)
        if dtypes.is_float(op.dtype):
            a = rng.standard_normal(op.shape)
        elif op.dtype == "bool":
            a = rng.random(op.shape) < 0.5
        elif dtypes.is_signed(op.dtype):
            a = rng.integers(1, 5, op.shape) * rng.choice([-1, 1], op.shape)
        else:
            a = rng.integers(1, 9, op.shape)
        out.append(np.ascontiguousarray(a, dtype=dt))
    return out


def build_evictor(folder: Path) -> str:
    """The cache-line flush (EVICT_C) as a shared library in `folder`: `tilefarm_evict(pointer, bytes)`."""
    src = folder / "evict.c"
    src.write_text(EVICT_C)
    return str(link_shared_library(folder / "evict.so", [src]))


class LocalRunner:
    """Checks and times one candidate at a time in a sandbox process; a context manager.

    Timing (measure_worker.timed_repeats): the correctness check's call and untimed calls up to a tenth of
    `min_repeat_ms` warm up, then `repeat` repeats, each the mean of at least `number` calls that together take at
    least `min_repeat_ms` (TVM's time_evaluator's window, without its discarded batches). With
    `cache_flush`, number is 1, min_repeat_ms 0, and a buffer twice the L3 is overwritten before every call.
    `threads` None runs parallel loops on every core. `timeout` bounds one candidate's whole measurement.

    With `cold_constants`, the inputs that are the model's constants (`Task.constants`: weights, biases) have their
    cache lines flushed before every call, outside the timing, while the activations stay warm: what a kernel
    meets in a run of a model whose weights exceed the last-level cache (ResNet-18's 46 MB, here 32 MB of L3), where
    each conv's weights were evicted by the rest of the model since its last call. Timed calls are still summed
    until `min_repeat_ms` of kernel time.

    Correctness: outputs must match the default schedule's on seeded random inputs. Floats pass where
    |out - ref| <= atol * max(1, max|ref|) + rtol * |ref|: two correct float32 summation orders of n terms differ
    by about sqrt(n) * 1.2e-7 relative to the terms, so rtol = 1e-3 leaves a wide margin for reductions of up to
    ~10^7 terms (and a few-ulp vector math library), while an indexing bug gives errors of the size of the values
    themselves; atol is scaled by the output's largest magnitude because cancellation makes relative error
    meaningless for results near zero. NaN must appear exactly where the reference has NaN. Integers and bools
    must be equal. Outputs are filled with NaN (integers: 0xA5 bytes) first, so an element never written fails.
    """

    def __init__(
        self,
        timeout: float = 10.0,
        number: int = 3,
        repeat: int = 3,
        min_repeat_ms: float = 100,
        cache_flush: bool = False,
        threads: int | None = None,
        check: bool = True,
        rtol: float = 1e-3,
        atol: float = 1e-3,
        seed: int = 0,
        cold_constants: bool = False,
    ):
        self.timeout, self.repeat, self.cache_flush = timeout, repeat, cache_flush
        self.number, self.min_repeat_ms = (1, 0) if cache_flush else (number, min_repeat_ms)
        self.threads, self.check, self.rtol, self.atol, self.seed = threads, check, rtol, atol, seed
        # the flush buffer is twice the L3
        self.flush_bytes = 2 * (host().l3_bytes or DEFAULT_L3_BYTES) if cache_flush else 0
        self._dir = Path(tempfile.mkdtemp(prefix="tilefarm-run-"))
        self.cold_constants = cold_constants
        self._evict_lib = build_evictor(self._dir) if cold_constants else None
        self.cache = cache_condition(cache_flush, cold_constants)
        self._proc: subprocess.Popen | None = None
        self._busy = False  # a request was sent and its reply not read
        self._tasks: dict[str, str | None] = {}  # workload key -> why its reference failed (None: ready)
        weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)  # if close() is never called

    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        return [self._run_one(inp, b) for inp, b in zip(inputs, builds)]

    def _run_one(self, inp: MeasureInput, build: BuildResult) -> MeasureResult:
        if build.error or not build.path:
            return MeasureResult((), build.error or UNKNOWN, build.message, build.seconds, 0.0, cache=self.cache)
        try:
            failed = self._prepare(inp.task)
        except Exception as e:  # noqa: BLE001 - e.g. the default schedule does not compile: fail, keep tuning
            failed = self._tasks[inp.task.key] = f"cannot make the reference outputs: {type(e).__name__}: {e}"
        if failed:
            return MeasureResult((), UNKNOWN, failed, build.seconds, 0.0, cache=self.cache)
        t0 = time.perf_counter()
        reply, error, message = self._request(
            {
                "op": "measure",
                "lib": build.path,
                "check": self.check,
                "rtol": self.rtol,
                "atol": self.atol,
                "number": self.number,
                "repeat": self.repeat,
                "min_repeat_ms": self.min_repeat_ms,
                "flush_bytes": self.flush_bytes,
                **self._task_fields(inp.task),
            }
        )
        seconds = time.perf_counter() - t0
        if reply is not None and reply["ok"]:
            return MeasureResult(tuple(reply["costs"]), None, "", build.seconds, seconds, cache=self.cache)
        if reply is not None:
            error, message = reply["error"], reply["message"]
        return MeasureResult((), error, message, build.seconds, seconds, cache=self.cache)

    def _task_fields(self, task: Task) -> dict:
        outputs = [(o, task.dag.op(o).shape, task.dag.op(o).dtype) for o in task.dag.outputs]
        evict = list(task.constants) if self._evict_lib else []
        return {
            "data": str(self._dir / task.key),
            "outputs": outputs,
            "threads": self.threads or 0,
            "evict": evict,
            "evict_lib": self._evict_lib,
        }

    def _prepare(self, task: Task) -> str | None:
        """Once per task: save seeded inputs and the default schedule's outputs; returns why that failed."""
        if task.key not in self._tasks:
            data = self._dir / task.key
            data.mkdir(exist_ok=True)
            for i, a in enumerate(random_inputs(task.dag, self.seed)):
                np.save(data / f"in{i}.npy", a)
            lib = emit_shared_library([lower(default_schedule(task.dag), KERNEL)], data / "reference.so")
            reply, error, message = self._request({"op": "reference", "lib": str(lib), **self._task_fields(task)})
            if reply is not None and not reply["ok"]:
                error, message = reply["error"], reply["message"]
            self._tasks[task.key] = f"the reference (default schedule) failed: {error}: {message}" if error else None
        return self._tasks[task.key]

    def _request(self, msg: dict) -> tuple[dict | None, str | None, str]:
        """Send one request to the sandbox; (reply, None, "") or (None, error code, message) when it died or hung."""
        if self._proc is None or self._proc.poll() is not None or self._busy:
            self._start()  # a fresh sandbox also drops the reply to a request an exception interrupted
        try:
            self._busy = True
            self._send.send(msg)
            if not self._recv.poll(self.timeout):
                self._stop(kill=True)
                return None, RUN_TIMEOUT, f"no answer within {self.timeout:g} s; the sandbox was killed"
            reply = self._recv.recv()
            self._busy = False
            return reply, None, ""
        except (EOFError, OSError):  # it closed the pipe: it died (or is dying; _stop waits a moment, then kills)
            proc = self._proc
            self._stop()
            log = self._log_path.read_text(errors="replace").strip()[-2000:]
            why = f"the kernel crashed the sandbox ({_exit_reason(proc.returncode)})"
            return None, RUN, f"{why}:\n{log}" if log else why

    def _start(self) -> None:
        self._stop(kill=True)
        child_in, parent_out = os.pipe()
        parent_in, child_out = os.pipe()
        env = dict(os.environ)
        for k, v in OPENMP_ENV.items():  # what artifacts run with: a short spin, then idle workers sleep
            env.setdefault(k, v)
        self._log_path = self._dir / "sandbox.log"  # its stderr: what an abort or a sanitizer printed
        with self._log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, str(WORKER), str(child_in), str(child_out)],
                pass_fds=(child_in, child_out),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal reaches the tuner, which stops the sandbox
            )
        os.close(child_in)
        os.close(child_out)
        self._send = Connection(parent_out, readable=False)
        self._recv = Connection(parent_in, writable=False)

    def _stop(self, kill: bool = False) -> None:
        if self._proc is None:
            return
        if kill:
            self._proc.kill()
        self._send.close()  # the sandbox exits when its request pipe closes
        self._recv.close()
        try:
            self._proc.wait(1.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc, self._busy = None, False

    def close(self) -> None:
        self._stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
