"""Building and measuring CUDA candidates. `CudaBuilder` replays each candidate's steps, lowers it, generates PTX
(codegen.compile_func) and assembles every kernel with ptxas, in a pool of worker processes; its results keep each
kernel's ptxas report (registers, shared memory, spills). `CudaRunner` times built kernels on a GPU
(gpu_measure), checked against the outputs this host's CPU computes for the same inputs; on a host without the NVIDIA
driver it refuses, naming what is missing."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import pickle
import shutil
import tempfile
import time
import weakref
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compiler.base.errors import TilefarmError
from compiler.base.target import Target
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
from compiler.targets.cuda.codegen import compile_func
from compiler.targets.cuda.gpu_measure import Job, Timing, measure_batch, random_inputs
from compiler.targets.cuda.ptx import Cubin, PtxasReport, assemble_program
from compiler.targets.cuda.target import arch_of, check_runs_here, cuda_target
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.tasks import Task

SEED = 0  # of the random inputs every candidate and its CPU reference run on


@dataclass(frozen=True)
class CudaBuildResult(BuildResult):
    """A built candidate: `path` holds its pickled `BuiltProgram`; `reports` is ptxas's word on each kernel."""

    reports: tuple[PtxasReport, ...] = ()

    @property
    def spills(self) -> bool:
        return any(r.spills for r in self.reports)


@dataclass(frozen=True)
class BuiltProgram:
    """What the runner loads: each kernel's launch (codegen.CudaKernel, PTX included) and its cubin."""

    kernels: tuple
    cubins: tuple[Cubin, ...]
    workspace_bytes: int


def build_one(dag: ComputeDAG, steps: tuple[Step, ...], path: str, target: Target) -> CudaBuildResult:
    """One candidate built into `path`; failures are results (INSTANTIATION: the steps do not replay; BUILD:
    lowering, code generation or ptxas refused it, with the message)."""
    t0 = time.perf_counter()
    try:
        state = apply_steps(dag, list(steps))
    except TilefarmError as e:
        return CudaBuildResult(None, INSTANTIATION, str(e), time.perf_counter() - t0)
    try:
        program = compile_func(lower(state), arch_of(target))
        cubins = assemble_program(program)
    except (TilefarmError, ValueError) as e:
        return CudaBuildResult(None, BUILD, str(e), time.perf_counter() - t0)
    Path(path).write_bytes(pickle.dumps(BuiltProgram(program.kernels, cubins, program.workspace_bytes)))
    reports = tuple(c.report for c in cubins)
    message = "; ".join(str(r) for r in reports)
    return CudaBuildResult(path, None, message, time.perf_counter() - t0, reports)


class CudaBuilder:
    """Builds candidates for a cuda `target` (default: sm_90) in `n_parallel` worker processes (default: the CPUs),
    each within `timeout` seconds; needs ptxas, not a GPU. A context manager (close() removes the built files)."""

    def __init__(
        self,
        n_parallel: int | None = None,
        timeout: float = 60.0,
        workdir: str | Path | None = None,
        target: Target | None = None,
    ):
        self.target = target or cuda_target()
        arch_of(self.target)  # InvalidTarget for one that is not a CUDA target
        self.n_parallel = n_parallel or os.cpu_count() or 1
        self.timeout = timeout
        self._own_dir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="tilefarm-cuda-build-") if workdir is None else workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._own_dir:
            weakref.finalize(self, shutil.rmtree, self.workdir, ignore_errors=True)
        # forkserver, not fork: the parent may hold llvmlite state and threads
        self._pool = cf.ProcessPoolExecutor(self.n_parallel, mp_context=multiprocessing.get_context("forkserver"))
        self._count = 0

    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        jobs = []
        for inp in inputs:
            self._count += 1
            path = str(self.workdir / f"c{self._count}.cuda")
            jobs.append(self._pool.submit(build_one, inp.task.dag, tuple(inp.steps), path, self.target))
        # the pool runs n_parallel at a time: the batch gets each one's timeout per round of them
        rounds = -(-len(jobs) // self.n_parallel)
        done, _ = cf.wait(jobs, timeout=self.timeout * max(1, rounds))
        results: list[BuildResult] = []
        for job in jobs:
            if job not in done:
                job.cancel()
                results.append(CudaBuildResult(None, BUILD_TIMEOUT, f"no build within {self.timeout:.0f} s", 0.0))
                continue
            try:
                results.append(job.result())
            except Exception as e:  # the worker died (out of memory, killed): the build failed, not the search
                results.append(CudaBuildResult(None, BUILD, f"the build process failed: {e!r}", 0.0))
        return results

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> CudaBuilder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cpu_reference(task: Task, path: Path, seed: int = 0) -> Path:
    """The task's outputs computed on this host's CPU (the CPU backend's default schedule, JIT-compiled) for the
    inputs gpu_measure.random_inputs draws with `seed`, saved to `path` (.npz: out0, out1, …): what every GPU
    candidate of the task must reproduce."""
    from compiler.targets import backend_for, host_target  # the package imports this module: a cycle at import time

    host = host_target()
    backend = backend_for(host)
    func = lower(backend.default_schedule(task.dag, host), "reference")
    n_inputs = len(task.dag.inputs)
    inputs = random_inputs(func.params, n_inputs, seed)
    outputs = [np.zeros(b.size, np.dtype(b.dtype)) for b in func.params[n_inputs:]]
    backend.compile_kernels([func], host)["reference"](*inputs, *outputs)
    np.savez(path, **{f"out{k}": a for k, a in enumerate(outputs)})
    return path


class CudaRunner:
    """Times built CUDA candidates on this host's GPU (gpu_measure), each checked first against its task's outputs
    computed on this host's CPU for the same random inputs (cpu_reference, once per task). `repeat`, `number`,
    `min_repeat_ms` shape the timing, `timeout` (seconds per candidate) bounds a batch. With `cache_flush` (as the
    CPU runner's: records say "flushed"), `number` is 1, `min_repeat_ms` 0, and a buffer twice the GPU's L2 is
    overwritten before each timed run, outside its events. The CPU runner's other options (threads,
    cold_constants) do not apply and are ignored. Batches run in a worker process
    holding the GPU context (a fresh one after a kernel faults), or in this process through `driver` where one is
    given (tests). Without the NVIDIA driver, run() raises InvalidTarget (target.no_driver_message)."""

    def __init__(
        self,
        target: Target | None = None,
        repeat: int = 3,
        number: int = 1,
        min_repeat_ms: float = 0.0,
        timeout: float = 10.0,
        cache_flush: bool = False,
        driver=None,
        **ignored,
    ):
        self.target = target or cuda_target()
        number, min_repeat_ms = (1, 0.0) if cache_flush else (number, min_repeat_ms)
        self.options = {"repeat": repeat, "number": number, "min_repeat_ms": min_repeat_ms, "cache_flush": cache_flush}
        self.cache = cache_condition(cache_flush, False)
        self.timeout, self.driver = timeout, driver
        self.workdir = Path(tempfile.mkdtemp(prefix="tilefarm-cuda-ref-"))
        weakref.finalize(self, shutil.rmtree, self.workdir, ignore_errors=True)
        self._references: dict[str, tuple[str | None, str]] = {}  # task key -> (its .npz, or None and why)

    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        if self.driver is None:
            check_runs_here(self.target)
        results: list[MeasureResult | None] = [None] * len(inputs)
        pending = []
        for i, (inp, b) in enumerate(zip(inputs, builds)):
            if b.error is not None or b.path is None:
                results[i] = MeasureResult((), b.error or BUILD, b.message, b.seconds, 0.0, cache=self.cache)
                continue
            ref, why = self._reference(inp.task)
            if ref is None:
                why = f"no CPU reference for {inp.task.name}: {why}"
                results[i] = MeasureResult((), UNKNOWN, why, b.seconds, 0.0, cache=self.cache)
            else:
                pending.append((i, Job(b.path, ref, len(inp.task.dag.inputs))))
        while pending:
            t0 = time.perf_counter()
            timings = self._measure([job for _, job in pending])
            seconds = (time.perf_counter() - t0) / max(1, len(timings))
            for (i, _), t in zip(pending, timings):
                results[i] = MeasureResult(t.costs, t.error, t.message, builds[i].seconds, seconds, cache=self.cache)
            pending = pending[len(timings) :]
        return results  # type: ignore[return-value]

    def _reference(self, task: Task) -> tuple[str | None, str]:
        """The task's CPU reference outputs, computed once: (the .npz's path, "") or (None, why it failed)."""
        if task.key not in self._references:
            path = self.workdir / f"ref{len(self._references)}.npz"
            try:
                self._references[task.key] = (str(cpu_reference(task, path, SEED)), "")
            except Exception as e:  # noqa: BLE001 - the task's reference failed: its candidates fail, tuning goes on
                self._references[task.key] = (None, f"{type(e).__name__}: {e}")
        return self._references[task.key]

    def _measure(self, jobs: list[Job]) -> list[Timing]:
        """Timings of a prefix of `jobs` (all of them unless a kernel faulted or hung: then the last is its error)."""
        options = {**self.options, "seed": SEED}
        if self.driver is not None:
            return measure_batch(jobs, options, self.driver)
        pool = cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        try:
            return pool.submit(measure_batch, jobs, options).result(timeout=self.timeout * len(jobs) + 30)
        except cf.TimeoutError:
            return [Timing((), RUN_TIMEOUT, f"the batch gave no answer within {self.timeout:.0f} s a candidate")]
        except BrokenProcessPool:
            return [Timing((), RUN, "the measuring process died (the candidate crashed it)")]
        finally:
            for proc in list(getattr(pool, "_processes", {}).values()):  # a hung kernel: end its process
                proc.kill()
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> CudaRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
