"""Timing built CUDA candidates on this host's GPU through the driver API (driver.Driver): each candidate's cubins
loaded, run once on random inputs and checked against the outputs this host's CPU computed for the same inputs
(measure.cpu_reference), then timed with CUDA events (`repeat` timings of `number` runs each, `number` grown until
one timing takes `min_repeat_ms`; with `cache_flush`, a buffer twice the GPU's L2 is overwritten before each timing,
outside it).

`measure_batch` runs in a worker process that holds the GPU's context (measure.CudaRunner starts it): a kernel that
faults leaves the context unusable, so the batch stops there, that candidate is a RUN error, and the runner starts
a fresh process for the rest.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import numpy as np

from compiler.base.errors import TilefarmError
from compiler.costs.measure import RUN, UNKNOWN, WRONG_ANSWER
from compiler.targets.cuda.driver import ATTR_L2_CACHE_SIZE, DevicePointer, Driver, KernelCrashed


@dataclass(frozen=True)
class Job:
    """One candidate to time: its built program (measure.BuiltProgram, pickled at `path`), its task's outputs on the
    CPU (`reference`: an .npz of out0, out1, …), and how many of the kernel's buffers are inputs (the rest are
    outputs)."""

    path: str
    reference: str
    n_inputs: int


@dataclass(frozen=True)
class Timing:
    """What measuring one Job gave: seconds per run, one per repeat, or the error code and why."""

    costs: tuple[float, ...]
    error: str | None = None
    message: str = ""


def random_inputs(kernel_params, n_inputs: int, seed: int = 0) -> list[np.ndarray]:
    """Inputs for a kernel's first `n_inputs` buffers: standard normal floats, zero integers (in range as indices)."""
    rng = np.random.default_rng(seed)
    out = []
    for b in kernel_params[:n_inputs]:
        dtype = np.dtype(b.dtype)
        a = rng.standard_normal(b.size).astype(dtype) if dtype.kind == "f" else np.zeros(b.size, dtype)
        out.append(a)
    return out


class _Loaded:
    """A built program on the device: its modules, functions, buffers and workspace."""

    def __init__(self, drv: Driver, built, inputs: list[np.ndarray]):
        self.drv, self.kernels = drv, built.kernels
        self.modules = [drv.load_module(c.image) for c in built.cubins]
        self.functions = [drv.function(m, k.name) for m, k in zip(self.modules, built.kernels)]
        params = built.kernels[0].params
        self.outputs = [np.zeros(b.size, np.dtype(b.dtype)) for b in params[len(inputs) :]]
        self.buffers: list[DevicePointer] = [drv.alloc(a.nbytes) for a in (*inputs, *self.outputs)]
        for ptr, a in zip(self.buffers, inputs):
            drv.to_device(ptr, a)
        for ptr in self.buffers[len(inputs) :]:
            drv.fill(ptr, 0)
        self.workspace = drv.alloc(built.workspace_bytes) if built.workspace_bytes else None

    def launch(self) -> None:
        for fn, k in zip(self.functions, self.kernels):
            extra = [self.workspace] if k.takes_workspace and self.workspace is not None else []
            self.drv.launch(fn, k.grid, k.block, [*self.buffers, *extra], k.shared_bytes)

    def results(self) -> list[np.ndarray]:
        self.drv.synchronize()
        n = len(self.buffers) - len(self.outputs)
        for a, ptr in zip(self.outputs, self.buffers[n:]):
            self.drv.to_host(a, ptr)
        return self.outputs

    def close(self) -> None:
        for ptr in [*self.buffers, *([self.workspace] if self.workspace else [])]:
            self.drv.free(ptr)
        for m in self.modules:
            self.drv.unload_module(m)


def mismatch(outputs: list[np.ndarray], reference: list[np.ndarray], rtol: float, atol: float) -> str | None:
    """Why the outputs differ from the reference's, or None (floats within atol·max(1, max|ref|) + rtol·|ref|)."""
    if [o.size for o in outputs] != [r.size for r in reference]:
        return f"output sizes {[o.size for o in outputs]} are not the CPU reference's {[r.size for r in reference]}"
    for k, (o, r) in enumerate(zip(outputs, reference)):
        if o.dtype.kind == "f":
            finite = np.abs(r[np.isfinite(r)])
            scale = max(1.0, float(finite.max())) if finite.size else 1.0
            bad = ~np.isclose(o, r, rtol=rtol, atol=atol * scale, equal_nan=True)
        else:
            bad = o != r
        if bad.any():
            return f"output {k}: {int(bad.sum())} of {o.size} elements differ from the CPU reference's"
    return None


def time_loaded(
    drv: Driver, prog: _Loaded, number: int, repeat: int, min_repeat_ms: float, flush: DevicePointer | None = None
) -> tuple[float, ...]:
    """Seconds per run of a loaded program: `repeat` event timings of `number` runs each, `number` doubled first
    until one timing takes `min_repeat_ms`. `flush`, a buffer larger than the L2, is overwritten (cuMemsetD8)
    before each timing and outside it, so every timing starts with nothing of the program's in the L2."""
    start, end = drv.event(), drv.event()
    try:

        def timed(n: int) -> float:
            if flush is not None:
                drv.fill(flush, 0)
            drv.record(start)
            for _ in range(n):
                prog.launch()
            drv.record(end)
            drv.wait(end)
            return drv.elapsed_ms(start, end)

        while number < 1 << 20 and timed(number) < min_repeat_ms:
            number *= 2
        return tuple(timed(number) / 1e3 / number for _ in range(repeat))
    finally:
        drv.destroy_event(start)
        drv.destroy_event(end)


def flush_buffer(drv: Driver, device: int) -> DevicePointer:
    """A device buffer twice the device's L2 (what overwriting it evicts: everything a kernel left there)."""
    return drv.alloc(2 * drv.attribute(device, ATTR_L2_CACHE_SIZE))


def load_reference(path: str) -> list[np.ndarray]:
    """A task's CPU reference outputs (measure.cpu_reference's .npz), in output order."""
    with np.load(path) as data:
        return [data[f"out{k}"] for k in range(len(data.files))]


def measure_batch(jobs: list[Job], options: dict, drv: Driver | None = None) -> list[Timing]:
    """Time `jobs` on device 0 (options: number, repeat, min_repeat_ms, cache_flush, rtol, atol, seed). Stops after
    a kernel that faults (its Timing is the last, a RUN error): the caller measures the rest in a fresh process."""
    drv = drv or Driver()
    device = drv.device(0)
    drv.use_primary_context(device)
    flush = flush_buffer(drv, device) if options.get("cache_flush") else None
    references: dict[str, list[np.ndarray]] = {}
    out: list[Timing] = []
    for job in jobs:
        try:
            out.append(_measure(drv, job, options, references, flush))
        except KernelCrashed as e:
            out.append(Timing((), RUN, str(e)))
            return out  # the context is gone, the flush buffer with it
        except TilefarmError as e:
            out.append(Timing((), RUN, str(e)))
        except Exception as e:  # a bug here, not the candidate's
            out.append(Timing((), UNKNOWN, f"{type(e).__name__}: {e}"))
    if flush is not None:
        drv.free(flush)
    return out


def _load(path: str):
    with open(path, "rb") as f:
        return pickle.load(f)


def _measure(
    drv: Driver, job: Job, options: dict, references: dict[str, list[np.ndarray]], flush: DevicePointer | None
) -> Timing:
    built = _load(job.path)
    inputs = random_inputs(built.kernels[0].params, job.n_inputs, options.get("seed", 0))
    if job.reference not in references:
        references[job.reference] = load_reference(job.reference)
    prog = _Loaded(drv, built, inputs)
    try:
        prog.launch()
        why = mismatch(prog.results(), references[job.reference], options.get("rtol", 1e-3), options.get("atol", 1e-4))
        if why:
            return Timing((), WRONG_ANSWER, why)
        number, repeat = options.get("number", 1), options.get("repeat", 3)
        return Timing(time_loaded(drv, prog, number, repeat, options.get("min_repeat_ms", 0.0), flush))
    finally:
        prog.close()
