"""The CUDA driver API through ctypes: no PyCUDA, CuPy or cuda-python, only `libcuda.so.1` (the NVIDIA driver's own
library, loaded on first use), so a GPU worker needs nothing installed but the driver.

`Driver` wraps the ~25 calls a measurement needs: init, devices and their attributes, the primary context, modules
from PTX (the driver JIT-compiles it) or cubin, memory, kernel launches with packed arguments, events for timing.
Each call's CUresult becomes a typed error: `KernelCrashed` for the sticky errors a faulting kernel leaves behind
(illegal address, launch failure, …: the context is unusable until rebuilt, in practice until the process exits),
`CudaError` for the rest, `NoCudaDriver` when this host has no driver at all.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.base.errors import TilefarmError

LIBCUDA = "libcuda.so.1"

ERROR_NAMES = {
    0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED", 34: "CUDA_ERROR_STUB_LIBRARY", 46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE", 200: "CUDA_ERROR_INVALID_IMAGE",
    201: "CUDA_ERROR_INVALID_CONTEXT", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU", 218: "CUDA_ERROR_INVALID_PTX",
    221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", 222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    300: "CUDA_ERROR_INVALID_SOURCE", 400: "CUDA_ERROR_INVALID_HANDLE", 500: "CUDA_ERROR_NOT_FOUND",
    600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS", 701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT", 709: "CUDA_ERROR_CONTEXT_IS_DESTROYED", 710: "CUDA_ERROR_ASSERT",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR", 715: "CUDA_ERROR_ILLEGAL_INSTRUCTION", 716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE", 718: "CUDA_ERROR_INVALID_PC", 719: "CUDA_ERROR_LAUNCH_FAILED",
    801: "CUDA_ERROR_NOT_SUPPORTED", 803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", 999: "CUDA_ERROR_UNKNOWN",
}  # fmt: skip
# errors a faulting kernel leaves in its context: every later call returns them until the process starts over
STICKY_ERRORS = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})

# CUdevice_attribute values (cuda.h)
ATTR_MAX_THREADS_PER_BLOCK = 1
ATTR_CLOCK_RATE_KHZ = 13
ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_MEMORY_CLOCK_RATE_KHZ = 36
ATTR_MEMORY_BUS_WIDTH = 37
ATTR_L2_CACHE_SIZE = 38
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76
ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97

_JIT_ERROR_LOG_BUFFER, _JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6  # CUjit_option
_LOG_BYTES = 8192

_P = ctypes.POINTER
_int, _uint, _u64, _size, _handle = ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
# what each Driver method calls: the symbols to try, newest first (CUDA 13's cuda.h maps cuEventElapsedTime to _v2;
# older drivers export only the plain name), and the C argument types; every call returns a CUresult (int)
SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = {
    "init": (("cuInit",), (_uint,)),
    "driver_version": (("cuDriverGetVersion",), (_P(_int),)),
    "device_count": (("cuDeviceGetCount",), (_P(_int),)),
    "device_get": (("cuDeviceGet",), (_P(_int), _int)),
    "device_name": (("cuDeviceGetName",), (ctypes.c_char_p, _int, _int)),
    "device_attribute": (("cuDeviceGetAttribute",), (_P(_int), _int, _int)),
    "device_total_mem": (("cuDeviceTotalMem_v2",), (_P(_size), _int)),
    "primary_ctx_retain": (("cuDevicePrimaryCtxRetain",), (_P(_handle), _int)),
    "primary_ctx_release": (("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"), (_int,)),
    "ctx_set_current": (("cuCtxSetCurrent",), (_handle,)),
    "ctx_synchronize": (("cuCtxSynchronize",), ()),
    "module_load": (("cuModuleLoadDataEx",), (_P(_handle), _handle, _uint, _P(_int), _P(_handle))),
    "module_unload": (("cuModuleUnload",), (_handle,)),
    "module_function": (("cuModuleGetFunction",), (_P(_handle), _handle, ctypes.c_char_p)),
    "mem_alloc": (("cuMemAlloc_v2",), (_P(_u64), _size)),
    "mem_free": (("cuMemFree_v2",), (_u64,)),
    "memcpy_htod": (("cuMemcpyHtoD_v2",), (_u64, _handle, _size)),
    "memcpy_dtoh": (("cuMemcpyDtoH_v2",), (_handle, _u64, _size)),
    "memset_d8": (("cuMemsetD8_v2",), (_u64, ctypes.c_ubyte, _size)),
    "launch_kernel": (("cuLaunchKernel",), (_handle, *[_uint] * 7, _handle, _P(_handle), _P(_handle))),
    "event_create": (("cuEventCreate",), (_P(_handle), _uint)),
    "event_record": (("cuEventRecord",), (_handle, _handle)),
    "event_synchronize": (("cuEventSynchronize",), (_handle,)),
    "event_elapsed": (("cuEventElapsedTime_v2", "cuEventElapsedTime"), (_P(ctypes.c_float), _handle, _handle)),
    "event_destroy": (("cuEventDestroy_v2", "cuEventDestroy"), (_handle,)),
    "error_name": (("cuGetErrorName",), (_int, _P(ctypes.c_char_p))),
}


class NoCudaDriver(TilefarmError):
    """This host cannot run CUDA code: no NVIDIA driver library, or one too old for a call tilefarm makes."""


class CudaError(TilefarmError):
    """A driver call failed; `code` is its CUresult, `name` the code's name, `call` the driver function."""

    def __init__(self, call: str, code: int, name: str, detail: str = ""):
        self.call, self.code, self.name = call, code, name
        super().__init__(self.describe() + (f":\n{detail}" if detail else ""))

    def describe(self) -> str:
        return f"{self.call} failed: {self.name} ({self.code})"


class KernelCrashed(CudaError):
    """A kernel faulted (illegal address, launch failure, …): the context is unusable and must be rebuilt; the
    measurement process exits and a new one starts."""

    def describe(self) -> str:
        return f"kernel crashed: context must be rebuilt ({self.name} from {self.call})"


def error_name(code: int, lib_name: Callable[[int], str | None] | None = None) -> str:
    """The CUresult's name: from the table here, else from the driver's cuGetErrorName, else CUDA_ERROR_<code>."""
    if code in ERROR_NAMES:
        return ERROR_NAMES[code]
    return (lib_name(code) if lib_name else None) or f"CUDA_ERROR_{code}"


def error_for(call: str, code: int, name: str, detail: str = "") -> CudaError:
    """The typed error for a failed call: KernelCrashed for the sticky errors a faulting kernel leaves, else
    CudaError."""
    return (KernelCrashed if code in STICKY_ERRORS else CudaError)(call, code, name, detail)


def select_symbol(lib: Any, candidates: Sequence[str]) -> str:
    """The first of `candidates` that `lib` exports; NoCudaDriver names them all when it exports none."""
    for name in candidates:
        if getattr(lib, name, None) is not None:
            return name
    raise NoCudaDriver(
        f"the CUDA driver library exports none of {', '.join(candidates)}: update the NVIDIA driver (CUDA 12 or later)"
    )


@functools.cache
def load_libcuda() -> ctypes.CDLL:
    """libcuda.so.1 (or the file `TILEFARM_LIBCUDA` names); NoCudaDriver, one line, when it cannot be loaded."""
    path = os.environ.get("TILEFARM_LIBCUDA", LIBCUDA)
    try:
        return ctypes.CDLL(path)
    except OSError as err:
        raise NoCudaDriver(
            f"no CUDA driver on this host: cannot load {path} ({err}); CUDA kernels can be built and checked "
            "with ptxas here, but measuring them needs a machine with an NVIDIA GPU and its driver"
        ) from None


@dataclass(frozen=True)
class DevicePointer:
    """An allocation in device memory: its address and size in bytes."""

    address: int
    nbytes: int


def pack_args(args: Sequence[object]) -> tuple[ctypes.Array, list[ctypes._SimpleCData]]:
    """cuLaunchKernel's `void** kernelParams`: one pointer per argument to a copy of its value (the driver reads
    as many bytes as the kernel's parameter has). A DevicePointer passes its address (64 bits), a ctypes scalar
    itself, a Python int an int64, a Python float a float32. Returns the array and the values it points into,
    which must outlive the launch."""
    values: list[ctypes._SimpleCData] = []
    for i, a in enumerate(args):
        if isinstance(a, DevicePointer):
            values.append(ctypes.c_uint64(a.address))
        elif isinstance(a, ctypes._SimpleCData):
            values.append(a)
        elif isinstance(a, bool) or not isinstance(a, (int, float)):
            raise TypeError(
                f"kernel argument {i}: cannot pass {type(a).__name__}; pass a DevicePointer, a ctypes scalar, "
                "an int (int64) or a float (float32)"
            )
        else:
            values.append(ctypes.c_int64(a) if isinstance(a, int) else ctypes.c_float(a))
    array = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
    return array, values


class Driver:
    """The driver API of `lib` (default: libcuda.so.1, loaded now), initialized; one per process. Handles
    (contexts, modules, functions, events) are ints; device memory is a DevicePointer."""

    def __init__(self, lib: Any = None):
        self.lib = lib if lib is not None else load_libcuda()
        self.symbols = {method: select_symbol(self.lib, names) for method, (names, _) in SIGNATURES.items()}
        self._calls: dict[str, Any] = {}
        for method, (_, argtypes) in SIGNATURES.items():
            fn = getattr(self.lib, self.symbols[method])
            fn.argtypes, fn.restype = list(argtypes), ctypes.c_int
            self._calls[method] = fn
        self._call("init", 0)

    def _call(self, method: str, *args: Any, detail: Callable[[], str] | None = None) -> None:
        code = self._calls[method](*args)
        if code != 0:
            raise error_for(self.symbols[method], code, error_name(code, self._lib_error_name),
                            detail() if detail else "")  # fmt: skip

    def _lib_error_name(self, code: int) -> str | None:
        out = ctypes.c_char_p()
        if self._calls["error_name"](code, ctypes.byref(out)) != 0 or not out.value:
            return None
        return out.value.decode()

    # ------------------------------------------------------------------------------------------ devices

    def version(self) -> int:
        """The CUDA version the driver supports, as 1000 × major + 10 × minor (13000 for 13.0)."""
        out = ctypes.c_int()
        self._call("driver_version", ctypes.byref(out))
        return out.value

    def device_count(self) -> int:
        out = ctypes.c_int()
        self._call("device_count", ctypes.byref(out))
        return out.value

    def device(self, ordinal: int = 0) -> int:
        out = ctypes.c_int()
        self._call("device_get", ctypes.byref(out), ordinal)
        return out.value

    def device_name(self, device: int) -> str:
        buf = ctypes.create_string_buffer(256)
        self._call("device_name", buf, len(buf), device)
        return buf.value.decode(errors="replace")

    def attribute(self, device: int, attribute: int) -> int:
        out = ctypes.c_int()
        self._call("device_attribute", ctypes.byref(out), attribute, device)
        return out.value

    def total_memory(self, device: int) -> int:
        out = ctypes.c_size_t()
        self._call("device_total_mem", ctypes.byref(out), device)
        return out.value

    def use_primary_context(self, device: int) -> int:
        """Retain `device`'s primary context and make it this thread's current one; returns its handle."""
        ctx = ctypes.c_void_p()
        self._call("primary_ctx_retain", ctypes.byref(ctx), device)
        self._call("ctx_set_current", ctx)
        return ctx.value or 0

    def release_primary_context(self, device: int) -> None:
        self._call("primary_ctx_release", device)

    def synchronize(self) -> None:
        """Wait for all work of the current context; a crash of a kernel launched before surfaces here."""
        self._call("ctx_synchronize")

    # ------------------------------------------------------------------------------------------ code

    def load_module(self, image: str | bytes) -> int:
        """A module from PTX text (the driver compiles it for this GPU) or a cubin; its JIT log is in the error."""
        data = image.encode() + b"\0" if isinstance(image, str) else image
        log = ctypes.create_string_buffer(_LOG_BYTES)
        options = (ctypes.c_int * 2)(_JIT_ERROR_LOG_BUFFER, _JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        values = (ctypes.c_void_p * 2)(ctypes.addressof(log), _LOG_BYTES)
        module = ctypes.c_void_p()
        self._call("module_load", ctypes.byref(module), data, 2, options, values,
                   detail=lambda: log.value.decode(errors="replace"))  # fmt: skip
        return module.value or 0

    def unload_module(self, module: int) -> None:
        self._call("module_unload", module)

    def function(self, module: int, name: str) -> int:
        fn = ctypes.c_void_p()
        self._call("module_function", ctypes.byref(fn), module, name.encode())
        return fn.value or 0

    def launch(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[object],
        shared_bytes: int = 0,
    ) -> None:
        """Launch `function` on the default stream (asynchronous: errors of the kernel itself surface at the next
        synchronizing call)."""
        params, _values = pack_args(args)  # _values keeps what params points into alive through the call
        self._call("launch_kernel", function, *grid, *block, shared_bytes, None, params, None)

    # ------------------------------------------------------------------------------------------ memory

    def alloc(self, nbytes: int) -> DevicePointer:
        out = ctypes.c_uint64()
        self._call("mem_alloc", ctypes.byref(out), max(nbytes, 1))
        return DevicePointer(out.value, nbytes)

    def free(self, ptr: DevicePointer) -> None:
        self._call("mem_free", ptr.address)

    def to_device(self, ptr: DevicePointer, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        if array.nbytes > ptr.nbytes:
            raise ValueError(f"copying {array.nbytes} bytes into a device buffer of {ptr.nbytes}")
        self._call("memcpy_htod", ptr.address, array.ctypes.data, array.nbytes)

    def to_host(self, array: np.ndarray, ptr: DevicePointer) -> None:
        if not array.flags.c_contiguous or array.nbytes > ptr.nbytes:
            raise ValueError(f"copying {array.nbytes} bytes out of a device buffer of {ptr.nbytes} into an array that"
                             f" must be C-contiguous")  # fmt: skip
        self._call("memcpy_dtoh", array.ctypes.data, ptr.address, array.nbytes)

    def fill(self, ptr: DevicePointer, byte: int) -> None:
        """Set every byte of `ptr` to `byte` (flushing the L2 cache between timings writes a buffer bigger than it)."""
        self._call("memset_d8", ptr.address, byte, ptr.nbytes)

    # ------------------------------------------------------------------------------------------ timing

    def event(self) -> int:
        ev = ctypes.c_void_p()
        self._call("event_create", ctypes.byref(ev), 0)
        return ev.value or 0

    def record(self, event: int) -> None:
        self._call("event_record", event, None)

    def wait(self, event: int) -> None:
        self._call("event_synchronize", event)

    def elapsed_ms(self, start: int, end: int) -> float:
        """Milliseconds between two recorded events (wait for `end` first)."""
        out = ctypes.c_float()
        self._call("event_elapsed", ctypes.byref(out), start, end)
        return out.value

    def destroy_event(self, event: int) -> None:
        self._call("event_destroy", event)
