"""The host class this worker process measures and compiles for: its CPU (the default), or one GPU read from the CUDA
driver (`tilefarm worker --gpu N`), whose fingerprint names its queue (measure.gpu.<key>) and its records. The tasks
and the heartbeat ask `current()`; `tilefarm worker` sets it with `use()` before the node starts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from compiler.base.errors import TilefarmError
from compiler.base.target import Target
from compiler.targets import host_target
from compiler.targets.cuda.fingerprint import DeviceQueries, GpuFingerprint, gpu_fingerprint
from workers.celery_app import HARDWARE, measure_queue


@dataclass(frozen=True)
class MeasuringHost:
    """A host class as a worker serves it: the Target its timings are for, and for a GPU what its driver reports."""

    target: Target
    gpu: GpuFingerprint | None = None

    @property
    def fingerprint(self) -> str:
        return self.target.fingerprint()

    @property
    def kind(self) -> str:
        """cpu or gpu: the hardware, as queue names and the workers' rows say it."""
        return HARDWARE.get(self.target.kind, self.target.kind)

    @property
    def queue(self) -> str:
        return measure_queue(self.fingerprint, self.target.kind)

    def device(self) -> dict[str, Any] | None:
        """The GPU's fingerprint fields the worker's row keeps (name, SMs, compute capability, memory, versions,
        clocks); None for a CPU."""
        return self.gpu.fields() if self.gpu is not None else None

    def describe(self) -> str:
        return str(self.gpu) if self.gpu is not None else f"{self.target.cpu_model or self.target.mcpu} (CPU)"


def cpu() -> MeasuringHost:
    return MeasuringHost(host_target())


def gpu(ordinal: int = 0, driver: DeviceQueries | None = None) -> MeasuringHost:
    """GPU `ordinal` as its driver (default: the CUDA driver API, libcuda.so.1) reports it; raises TilefarmError
    (InvalidTarget, CudaError) naming what is missing: no driver, no such device, an architecture tilefarm has no
    code for."""
    if driver is None:
        from compiler.targets.cuda.driver import Driver

        driver = Driver()
    count = driver.device_count() if hasattr(driver, "device_count") else None  # DeviceQueries need not say
    if ordinal < 0 or (count is not None and ordinal >= count):
        said = f"the driver reports {count} GPU(s)," if count is not None else "GPUs are"
        raise TilefarmError(f"no GPU {ordinal}: {said} numbered from 0")
    fp = gpu_fingerprint(driver, ordinal)
    return MeasuringHost(fp.target(), fp)


_current: MeasuringHost | None = None


def use(host: MeasuringHost | None) -> None:
    """Make `host` the one this process measures for (None: back to its CPU)."""
    global _current
    _current = host


def current() -> MeasuringHost:
    return _current if _current is not None else cpu()


def as_fields(host: MeasuringHost) -> dict[str, Any]:
    """The Target fields a worker's row stores (progress.live_target gives them to the search)."""
    return dataclasses.asdict(host.target)
