"""The CUDA driver layer without a driver: argument packing, CUresult → typed errors, which symbol each call binds,
a host without libcuda, the GPU fingerprint (all against fakes). With a GPU (the device machine), kernels compiled
by the CUDA codegen run and match numpy, and a crashing kernel is reported as one."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

from compiler.targets.cuda import driver as cu
from compiler.targets.cuda.driver import (
    CudaError,
    DevicePointer,
    Driver,
    KernelCrashed,
    NoCudaDriver,
    error_for,
    error_name,
    load_libcuda,
    pack_args,
    select_symbol,
)
from compiler.targets.cuda.fingerprint import GpuFingerprint, driver_release, gpu_fingerprint

# ---------------------------------------------------------------------------------------------- a fake libcuda


class FakeCuda:
    """A libcuda stand-in: every symbol Driver binds, as plain functions that record their calls and return the
    CUresult set in `fail` (by symbol), else 0."""

    def __init__(self, omit: tuple[str, ...] = ()):
        self.calls: list[tuple[str, tuple]] = []
        self.fail: dict[str, int] = {}
        self.jit_log = b""
        outputs = {
            "cuDriverGetVersion": 13000,
            "cuDeviceGetCount": 1,
            "cuDeviceGet": 0,
            "cuDeviceGetAttribute": 132,
            "cuDeviceTotalMem_v2": 141 << 30,
            "cuDevicePrimaryCtxRetain": 0xC0,
            "cuModuleLoadDataEx": 0x40,
            "cuModuleGetFunction": 0xF0,
            "cuMemAlloc_v2": 0x7F0000,
            "cuEventCreate": 0xE0,
            "cuEventElapsedTime": 1.5,
            "cuEventElapsedTime_v2": 2.5,
        }
        symbols = {name for names, _ in cu.SIGNATURES.values() for name in names} | {"cuEventElapsedTime"}
        self.lib = SimpleNamespace(**{s: self._symbol(s, outputs.get(s)) for s in symbols if s not in omit})

    def _symbol(self, name: str, output):
        def call(*args):
            self.calls.append((name, args))
            if name == "cuDeviceGetName":
                args[0].value = b"Fake H200"
            elif name == "cuModuleLoadDataEx" and self.jit_log:
                ctypes.memmove(args[4][0], self.jit_log, len(self.jit_log))
            elif name == "cuGetErrorName":
                args[1]._obj.value = b"CUDA_ERROR_FROM_DRIVER"
            elif output is not None:
                args[0]._obj.value = output
            return self.fail.get(name, 0)

        return call

    def called(self, name: str) -> list[tuple]:
        return [args for n, args in self.calls if n == name]


# ---------------------------------------------------------------------------------------------- packing


def test_arguments_are_packed_as_pointers_to_their_values():
    params, values = pack_args([DevicePointer(0x7F00_0000_1000, 64), 7, 2.5, ctypes.c_int32(-3), ctypes.c_double(1.25)])
    assert len(params) == 5 and len(values) == 5
    assert ctypes.c_uint64.from_address(params[0]).value == 0x7F00_0000_1000
    assert ctypes.c_int64.from_address(params[1]).value == 7
    assert ctypes.c_float.from_address(params[2]).value == 2.5
    assert ctypes.c_int32.from_address(params[3]).value == -3
    assert ctypes.c_double.from_address(params[4]).value == 1.25


@pytest.mark.parametrize("bad", [True, "x", np.zeros(3), None])
def test_arguments_that_have_no_kernel_parameter_type_are_refused(bad):
    with pytest.raises(TypeError, match="kernel argument 1: cannot pass"):
        pack_args([1, bad])


# ---------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("code", [700, 715, 716, 719])
def test_a_faulting_kernel_is_a_crash_that_needs_a_new_context(code):
    err = error_for("cuCtxSynchronize", code, error_name(code))
    assert isinstance(err, KernelCrashed) and err.code == code
    assert str(err).startswith("kernel crashed: context must be rebuilt")
    assert error_name(code) in str(err) and "cuCtxSynchronize" in str(err)


def test_other_errors_name_the_call_and_the_code():
    err = error_for("cuMemAlloc_v2", 2, error_name(2))
    assert type(err) is CudaError
    assert str(err) == "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2)"


def test_unknown_codes_are_named_by_the_driver_or_by_number():
    assert error_name(1234, lambda code: "CUDA_ERROR_NEWER_THAN_US") == "CUDA_ERROR_NEWER_THAN_US"
    assert error_name(1234, lambda code: None) == error_name(1234) == "CUDA_ERROR_1234"


def test_a_failing_call_raises_with_the_driver_symbol_and_jit_log():
    fake = FakeCuda()
    drv = Driver(fake.lib)
    fake.fail["cuModuleLoadDataEx"] = 218
    fake.jit_log = b"ptxas fatal: Unresolved extern function 'f'"
    with pytest.raises(CudaError, match=r"cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_PTX \(218\):\nptxas fatal"):
        drv.load_module(".version 8.0")
    fake.fail["cuCtxSynchronize"] = 700
    with pytest.raises(KernelCrashed, match="CUDA_ERROR_ILLEGAL_ADDRESS from cuCtxSynchronize"):
        drv.synchronize()
    fake.fail["cuMemFree_v2"] = 4321
    with pytest.raises(CudaError, match="CUDA_ERROR_FROM_DRIVER"):
        drv.free(DevicePointer(1, 1))


# ---------------------------------------------------------------------------------------------- symbols


def test_the_newest_exported_symbol_is_bound():
    both = SimpleNamespace(cuEventElapsedTime=print, cuEventElapsedTime_v2=print)
    assert select_symbol(both, ("cuEventElapsedTime_v2", "cuEventElapsedTime")) == "cuEventElapsedTime_v2"
    old = SimpleNamespace(cuEventElapsedTime=print)
    assert select_symbol(old, ("cuEventElapsedTime_v2", "cuEventElapsedTime")) == "cuEventElapsedTime"
    with pytest.raises(NoCudaDriver, match="exports none of cuMemAlloc_v2: update the NVIDIA driver"):
        select_symbol(old, ("cuMemAlloc_v2",))


def test_driver_binds_v2_memory_calls_and_whichever_elapsed_time_exists():
    fake = FakeCuda()
    drv = Driver(fake.lib)
    assert drv.symbols["mem_alloc"] == "cuMemAlloc_v2" and drv.symbols["event_elapsed"] == "cuEventElapsedTime_v2"
    assert drv.elapsed_ms(1, 2) == 2.5
    old = FakeCuda(omit=("cuEventElapsedTime_v2", "cuEventDestroy_v2", "cuDevicePrimaryCtxRelease_v2"))
    drv = Driver(old.lib)
    assert drv.symbols["event_elapsed"] == "cuEventElapsedTime" and drv.elapsed_ms(1, 2) == 1.5
    assert drv.symbols["event_destroy"] == "cuEventDestroy"


def test_driver_calls_go_to_the_library_in_order():
    fake = FakeCuda()
    drv = Driver(fake.lib)
    assert fake.called("cuInit") == [(0,)]
    dev = drv.device(0)
    assert drv.use_primary_context(dev) == 0xC0 and fake.called("cuCtxSetCurrent")
    module = drv.load_module(".version 8.0\n")
    (args,) = fake.called("cuModuleLoadDataEx")
    assert args[1] == b".version 8.0\n\0" and args[2] == 2  # PTX goes in NUL-terminated, with an error log
    fn = drv.function(module, "vadd")
    assert fake.called("cuModuleGetFunction")[0][2] == b"vadd"
    buf = drv.alloc(4096)
    assert buf == DevicePointer(0x7F0000, 4096)
    drv.to_device(buf, np.arange(1024, dtype=np.float32))
    assert fake.called("cuMemcpyHtoD_v2")[0][2] == 4096
    with pytest.raises(ValueError, match="8192 bytes into a device buffer of 4096"):
        drv.to_device(buf, np.zeros(2048, np.float32))
    drv.launch(fn, (4, 1, 1), (256, 1, 1), [buf, buf], shared_bytes=1024)
    (launch,) = fake.called("cuLaunchKernel")
    assert launch[:8] == (0xF0, 4, 1, 1, 256, 1, 1, 1024)
    params = launch[9]
    assert ctypes.c_uint64.from_address(params[1]).value == 0x7F0000


# ---------------------------------------------------------------------------------------------- no driver


def test_a_host_without_libcuda_gets_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEFARM_LIBCUDA", str(tmp_path / "libcuda.so.1"))
    load_libcuda.cache_clear()
    try:
        with pytest.raises(NoCudaDriver) as info:
            Driver()
    finally:
        load_libcuda.cache_clear()
    message = str(info.value)
    assert message.startswith("no CUDA driver on this host: cannot load") and "\n" not in message
    assert "needs a machine with an NVIDIA GPU" in message
    assert info.value.__suppress_context__  # raised `from None`: no OSError traceback chained under it


# ---------------------------------------------------------------------------------------------- fingerprint


class FakeDevice:
    """DeviceQueries of an H200 on driver 580 (CUDA 13.0)."""

    attributes = {
        cu.ATTR_MULTIPROCESSOR_COUNT: 132,
        cu.ATTR_COMPUTE_CAPABILITY_MAJOR: 9,
        cu.ATTR_COMPUTE_CAPABILITY_MINOR: 0,
        cu.ATTR_CLOCK_RATE_KHZ: 1_980_000,
        cu.ATTR_MEMORY_CLOCK_RATE_KHZ: 3_201_000,
        cu.ATTR_MEMORY_BUS_WIDTH: 6144,
        cu.ATTR_L2_CACHE_SIZE: 50 << 20,
        cu.ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232_448,
    }

    def __init__(self, version: int = 13000):
        self._version = version

    def version(self) -> int:
        return self._version

    def device(self, ordinal: int = 0) -> int:
        return ordinal

    def device_name(self, device: int) -> str:
        return "NVIDIA H200"

    def attribute(self, device: int, attribute: int) -> int:
        return self.attributes[attribute]

    def total_memory(self, device: int) -> int:
        return 150_000_000_000


def test_gpu_fingerprint_reports_what_the_driver_says(tmp_path):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:12 UTC 2025\n")
    fp = gpu_fingerprint(FakeDevice(), proc_version=proc)
    assert fp == GpuFingerprint(
        name="NVIDIA H200", sm_count=132, compute_capability=(9, 0), memory_bytes=150_000_000_000,
        cuda_version="13.0", driver_release="580.65.06", sm_clock_mhz=1980, memory_clock_mhz=3201,
        memory_bus_bits=6144, l2_bytes=50 << 20, max_shared_per_block=232_448,
    )  # fmt: skip
    assert fp.arch == "sm_90"
    assert str(fp) == "NVIDIA H200 (sm_90, 132 SMs at 1980 MHz, 140 GiB, CUDA 13.0, driver 580.65.06)"
    assert fp.key() == gpu_fingerprint(FakeDevice(), proc_version=proc).key() and len(fp.key()) == 16
    assert gpu_fingerprint(FakeDevice(12080), proc_version=proc).key() != fp.key()  # another driver JITs the PTX


def test_driver_release_is_empty_where_proc_does_not_say(tmp_path):
    assert driver_release(tmp_path / "absent") == ""
    (tmp_path / "odd").write_text("something else entirely\n")
    assert driver_release(tmp_path / "odd") == ""


# ---------------------------------------------------------------------------------------------- on a GPU


def _gpu() -> Driver | None:
    try:
        drv = Driver()
        return drv if drv.device_count() > 0 else None
    except (NoCudaDriver, CudaError):
        return None


needs_gpu = pytest.mark.skipif(_gpu() is None, reason="no NVIDIA GPU and driver on this host")


def _run(drv: Driver, kernel, arrays: list[np.ndarray]) -> None:
    module = drv.load_module(kernel.ptx)
    fn = drv.function(module, kernel.name)
    bufs = [drv.alloc(a.nbytes) for a in arrays]
    for b, a in zip(bufs, arrays):
        drv.to_device(b, a)
    drv.launch(fn, kernel.grid, kernel.block, bufs)
    drv.synchronize()
    for b, a in zip(bufs, arrays):
        drv.to_host(a, b)
        drv.free(b)
    drv.unload_module(module)


@needs_gpu
def test_compiled_kernels_run_on_the_gpu_and_match_numpy():
    from compiler.targets.cuda.codegen import arch_for, compile_func
    from tests.test_cuda_codegen import gemm_func, row_sum_func, vadd_func

    drv = _gpu()
    assert drv is not None
    dev = drv.device(0)
    drv.use_primary_context(dev)
    fp = gpu_fingerprint(drv)
    arch = arch_for(fp.compute_capability)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(1 << 20, dtype=np.float32), rng.standard_normal(1 << 20, dtype=np.float32)
    c = np.zeros_like(a)
    _run(drv, compile_func(vadd_func(), arch).kernels[0], [a, b, c])
    np.testing.assert_array_equal(c, a + b)
    A, B = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)
    C = np.zeros((256, 256), np.float32)
    _run(drv, compile_func(gemm_func(), arch).kernels[0], [A, B, C])
    np.testing.assert_allclose(C, A @ B, rtol=1e-4, atol=1e-3)
    x, sums = rng.standard_normal(512 * 1000, dtype=np.float32), np.zeros(512, np.float32)
    _run(drv, compile_func(row_sum_func(), arch).kernels[0], [x, sums])
    np.testing.assert_allclose(sums, x.reshape(512, 1000).sum(axis=1), rtol=1e-4, atol=1e-3)


@needs_gpu
def test_a_kernel_writing_out_of_bounds_is_reported_as_a_crash():
    # in a child process: the crash leaves its context unusable, as it would a measurement process
    script = textwrap.dedent("""
        from compiler.schedule.loopir import Buffer, For, Func, Store
        from compiler.targets.cuda.codegen import arch_for, compile_func
        from compiler.targets.cuda.driver import Driver, KernelCrashed
        from compiler.targets.cuda.fingerprint import gpu_fingerprint
        from compiler.tensor.te import Const, Var
        t = Var("t")
        f = Func("wild", (Buffer("x", "float32", (4,)),),
                 For(t, 256, "threadIdx.x", Store("x", t * Const(1 << 28, "int64"), Const(1.0, "float32"))))
        drv = Driver()
        drv.use_primary_context(drv.device(0))
        (k,) = compile_func(f, arch_for(gpu_fingerprint(drv).compute_capability)).kernels
        fn = drv.function(drv.load_module(k.ptx), k.name)
        buf = drv.alloc(16)
        try:
            drv.launch(fn, k.grid, k.block, [buf])
            drv.synchronize()
        except KernelCrashed as err:
            print(err)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("kernel crashed: context must be rebuilt"), out.stdout + out.stderr
