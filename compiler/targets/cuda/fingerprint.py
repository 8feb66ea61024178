"""The GPU a timing is valid for: what the driver reports of a device (name, SMs, compute capability, memory, clocks,
driver versions), and a short stable key of what a kernel's speed depends on, naming its measurement queue
(`measure.gpu.<key>`) and its records. The key is the fingerprint of the GPU's own Target (`GpuFingerprint.target`):
the farm, the records and the search name host classes by `Target.fingerprint()`, GPUs and CPUs alike."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

from compiler.base.errors import InvalidTarget, TilefarmError
from compiler.base.target import Target
from compiler.targets.cuda import driver as cu
from compiler.targets.cuda.codegen import ARCHS
from compiler.targets.cuda.target import arch_of, choices, cuda_target

NVIDIA_PROC_VERSION = Path("/proc/driver/nvidia/version")


class DeviceQueries(Protocol):
    """What gpu_fingerprint asks of a driver (driver.Driver has it; tests pass a fake)."""

    def version(self) -> int: ...
    def device(self, ordinal: int = 0) -> int: ...
    def device_name(self, device: int) -> str: ...
    def attribute(self, device: int, attribute: int) -> int: ...
    def total_memory(self, device: int) -> int: ...


@dataclass(frozen=True)
class GpuFingerprint:
    """One GPU as its driver reports it. `cuda_version` is the newest CUDA the driver supports ("13.0"),
    `driver_release` the kernel module's release ("580.65.06"; empty where /proc does not say)."""

    name: str
    sm_count: int
    compute_capability: tuple[int, int]
    memory_bytes: int
    cuda_version: str
    driver_release: str
    sm_clock_mhz: int
    memory_clock_mhz: int
    memory_bus_bits: int
    l2_bytes: int
    max_shared_per_block: int

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    def code_arch(self) -> str:
        """The architecture tilefarm generates this GPU's code for: the newest it supports at or below the device's
        compute capability (an sm_86 runs sm_80 PTX); InvalidTarget for a GPU older than all of them."""
        major, minor = self.compute_capability
        fits = [sm for sm in ARCHS if sm <= major * 10 + minor]
        if not fits:
            raise InvalidTarget(
                f"{self.name} is {self.arch}: tilefarm generates code for {choices()} only, so it cannot measure for it"
            )
        return ARCHS[max(fits)].name

    def target(self) -> Target:
        """The cuda Target of this GPU: its code architecture's (code_arch), the GPU named in `cpu_model` with what its
        timings depend on (model, compute capability, SMs, clocks, CUDA and driver versions), and its own L2."""
        base = cuda_target(ARCHS[int(self.code_arch()[3:])])
        model = (
            f"{self.name} ({self.arch}, {self.sm_count} SMs, {self.sm_clock_mhz}/{self.memory_clock_mhz} MHz, "
            f"CUDA {self.cuda_version}, driver {self.driver_release or 'unknown'})"
        )
        return replace(
            base, cpu_model=model, l2_bytes=self.l2_bytes or base.l2_bytes, l3_bytes=self.l2_bytes or base.l3_bytes
        )

    def key(self) -> str:
        """A stable short hash of what a kernel's timing depends on (the GPU model, compute capability, SM count and
        clocks, and the driver, whose JIT compiles the PTX): its Target's fingerprint, the host class of its
        records and the `<key>` of its queue `measure.gpu.<key>`."""
        return self.target().fingerprint()

    def fields(self) -> dict:
        """What a GPU worker reports in its heartbeat (the workers' `device`), as JSON, with its key."""
        return {**asdict(self), "compute_capability": list(self.compute_capability), "key": self.key()}

    def __str__(self):
        gib = self.memory_bytes / 2**30
        return (
            f"{self.name} ({self.arch}, {self.sm_count} SMs at {self.sm_clock_mhz} MHz, {gib:.0f} GiB, "
            f"CUDA {self.cuda_version}, driver {self.driver_release or 'unknown'})"
        )


def driver_release(proc_version: Path = NVIDIA_PROC_VERSION) -> str:
    """The NVIDIA kernel module's release from /proc ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06
    …"), or "" where the file is absent or says something else."""
    try:
        text = proc_version.read_text()
    except OSError:
        return ""
    words = text.split("Kernel Module", 1)[-1].split() if "Kernel Module" in text else []
    return words[0] if words and words[0][0].isdigit() else ""


def gpu_fingerprint(
    driver: DeviceQueries, ordinal: int = 0, proc_version: Path = NVIDIA_PROC_VERSION
) -> GpuFingerprint:
    """What `driver` reports of device `ordinal`."""
    dev = driver.device(ordinal)
    version = driver.version()
    return GpuFingerprint(
        name=driver.device_name(dev),
        sm_count=driver.attribute(dev, cu.ATTR_MULTIPROCESSOR_COUNT),
        compute_capability=(
            driver.attribute(dev, cu.ATTR_COMPUTE_CAPABILITY_MAJOR),
            driver.attribute(dev, cu.ATTR_COMPUTE_CAPABILITY_MINOR),
        ),
        memory_bytes=driver.total_memory(dev),
        cuda_version=f"{version // 1000}.{version % 1000 // 10}",
        driver_release=driver_release(proc_version),
        sm_clock_mhz=driver.attribute(dev, cu.ATTR_CLOCK_RATE_KHZ) // 1000,
        memory_clock_mhz=driver.attribute(dev, cu.ATTR_MEMORY_CLOCK_RATE_KHZ) // 1000,
        memory_bus_bits=driver.attribute(dev, cu.ATTR_MEMORY_BUS_WIDTH),
        l2_bytes=driver.attribute(dev, cu.ATTR_L2_CACHE_SIZE),
        max_shared_per_block=driver.attribute(dev, cu.ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
    )


def local_gpus(driver: DeviceQueries | None = None, proc_version: Path | None = None) -> list[GpuFingerprint]:
    """Every GPU this host's driver (default: the CUDA driver API) reports; none where no driver loads or it fails."""
    try:
        drv = driver if driver is not None else cu.Driver()
        count = drv.device_count() if hasattr(drv, "device_count") else 1  # DeviceQueries need not say
        return [gpu_fingerprint(drv, k, proc_version or NVIDIA_PROC_VERSION) for k in range(count)]
    except TilefarmError:
        return []


def tuning_target(target: Target, driver: DeviceQueries | None = None, proc_version: Path | None = None) -> Target:
    """What tuning for cuda `target` on this host measures for: where the driver reports a GPU 0 (the one the runner
    times on), that GPU's own Target, so its records are filed under the GPU's key as the farm's GPU workers file
    theirs (compiled for `target`'s architecture where the GPU runs it); `target` itself where no driver loads (the
    runner then refuses to measure). InvalidTarget where the GPU cannot run code of `target`'s architecture."""
    try:
        drv = driver if driver is not None else cu.Driver()
    except TilefarmError:
        return target
    gpu = gpu_fingerprint(drv, 0, proc_version or NVIDIA_PROC_VERSION)
    arch, own = arch_of(target), gpu.target()
    if arch.name == own.mcpu:
        return own
    if arch.sm > int(own.mcpu[3:]):
        raise InvalidTarget(
            f"cannot tune for cuda -arch={arch.name} here: this host's GPU 0, {gpu}, runs code up to "
            f'{own.mcpu} (tune with --target "cuda -arch={own.mcpu}")'
        )
    return replace(own, mcpu=arch.name, features=arch.features)
