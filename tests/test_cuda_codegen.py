"""CUDA code generation: hand-written GPU loop IR (a vector add, a tiled GEMM with shared tiles and barriers, a
cross-thread reduction, libdevice math, every GPU dtype) compiled to PTX and assembled by ptxas for sm_80 and sm_90;
the same kernels' LLVM IR, and that of every core kernel's default GPU schedule, run on this CPU (threads as OS
threads meeting at barriers) against numpy; the errors a GPU program can earn; ptxas's report parsing. No GPU is
needed; ptxas comes from the nvidia-cuda-nvcc wheel of the dev extra."""

from __future__ import annotations

import ctypes
import importlib.metadata
import itertools
import re
import threading

import llvmlite.binding as llvm
import numpy as np
import pytest

from compiler.base.errors import BuildError, MissingExtra
from compiler.schedule.loopir import Allocate, Barrier, Buffer, For, Func, IfThenElse, Store, seq, walk_stmts
from compiler.schedule.lower import lower
from compiler.targets.cuda.codegen import SM_80, SM_90, GpuArch, arch_for, compile_func, llvm_ir
from compiler.targets.cuda.codegen import libdevice as libdevice_mod
from compiler.targets.cuda.codegen.launch import LaunchShape, launch_shape
from compiler.targets.cuda.codegen.memory import split_launches
from compiler.targets.cuda.default_schedule import default_schedule
from compiler.targets.cuda.ptx import PtxasError, PtxasReport, assemble, assemble_program, find_ptxas, parse_report
from compiler.tensor import te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops import KERNELS
from compiler.tensor.te import Binary, Cast, Const, Expr, Load, Unary, Var


def _has_ptxas() -> bool:
    try:
        find_ptxas()
    except MissingExtra:
        return False
    return True


needs_ptxas = pytest.mark.skipif(
    not _has_ptxas(), reason="ptxas not installed: pip install -e '.[dev]' brings the nvidia-cuda-nvcc wheel"
)


def f32(name: str, n: int) -> Buffer:
    return Buffer(name, "float32", (n,))


def load(buf: str, index, dtype: str = "float32") -> Load:
    return Load(buf, (index,), dtype)


# ---------------------------------------------------------------------------------------------- kernels


def vadd_func(n: int = 1 << 20, threads: int = 256) -> Func:
    """c = a + b, one element per thread."""
    bx, tx = Var("bx"), Var("tx")
    i = bx * threads + tx
    store = Store("c", i, load("a", i) + load("b", i))
    body = For(bx, n // threads, "blockIdx.x", For(tx, threads, "threadIdx.x", store))
    return Func("vadd", (f32("a", n), f32("b", n), f32("c", n)), body)


def gemm_func(m: int = 256, n: int = 256, k: int = 256, tile: int = 64, kt: int = 16, reg: int = 4) -> Func:
    """C = A @ B: a block computes a tile×tile tile of C with (tile/reg)² threads, each a reg×reg register tile
    (a local accumulator), stepping through K in kt-wide slices staged in shared memory between two barriers."""
    threads = tile // reg
    by, bx, ty, tx, ko, ki = (Var(n_) for n_ in ("by", "bx", "ty", "tx", "ko", "ki"))
    i, j, l = Var("i"), Var("j"), Var("l")
    per_thread = tile * kt // (threads * threads)
    e = (ty * threads + tx) * per_thread + l  # this thread's elements of the shared tiles
    fill = For(
        l,
        per_thread,
        "unrolled",
        seq(
            Store("As", e, load("A", (by * tile + e // kt) * k + ko * kt + e % kt)),
            Store("Bs", e, load("B", (ko * kt + e // tile) * n + bx * tile + e % tile)),
        ),
    )
    acc_ij = i * reg + j
    fma = Store(
        "acc", acc_ij, load("acc", acc_ij) + load("As", (ty * reg + i) * kt + ki) * load("Bs", ki * tile + tx * reg + j)
    )
    compute = For(ki, kt, "unrolled", For(i, reg, "unrolled", For(j, reg, "vectorized", fma)))
    thread = Allocate(
        Buffer("acc", "float32", (reg * reg,)),
        seq(
            For(i, reg, "unrolled", For(j, reg, "unrolled", Store("acc", acc_ij, Const(0.0, "float32")))),
            For(ko, k // kt, "serial", seq(fill, Barrier(), compute, Barrier())),
            For(
                i,
                reg,
                "unrolled",
                For(
                    j,
                    reg,
                    "vectorized",
                    Store("C", (by * tile + ty * reg + i) * n + bx * tile + tx * reg + j, load("acc", acc_ij)),
                ),
            ),
        ),
        scope="local",
    )
    threads_nest = For(ty, threads, "threadIdx.y", For(tx, threads, "threadIdx.x", thread))
    shared = Allocate(
        Buffer("As", "float32", (tile * kt,)),
        Allocate(Buffer("Bs", "float32", (kt * tile,)), threads_nest, scope="shared"),
        scope="shared",
    )
    body = For(by, m // tile, "blockIdx.y", For(bx, n // tile, "blockIdx.x", shared))
    return Func("gemm", (f32("A", m * k), f32("B", k * n), f32("C", m * n)), body)


def row_sum_func(rows: int = 512, cols: int = 1000, threads: int = 256) -> Func:
    """out[r] = sum(x[r, :]): a block per row; each thread sums a strided slice in a register, then the block folds
    the partial sums in shared memory, halving the active threads between barriers."""
    r, t, c = Var("r"), Var("t"), Var("c")
    steps = (cols + threads - 1) // threads
    col = c * threads + t
    partial = Allocate(
        Buffer("part", "float32", (1,)),
        seq(
            Store("part", Const(0, "int64"), Const(0.0, "float32")),
            For(
                c,
                steps,
                "serial",
                IfThenElse(
                    col < cols,
                    Store("part", Const(0, "int64"), load("part", Const(0, "int64")) + load("x", r * cols + col)),
                ),
            ),
            Store("sums", t, load("part", Const(0, "int64"))),
        ),
        scope="local",
    )
    folds = []
    half = threads // 2
    while half >= 1:
        folds += [Barrier(), IfThenElse(t < half, Store("sums", t, load("sums", t) + load("sums", t + half)))]
        half //= 2
    write = IfThenElse(te.equal(t, 0), Store("out", r, load("sums", Const(0, "int64"))))
    block = For(t, threads, "threadIdx.x", seq(partial, *folds, write))
    body = For(r, rows, "blockIdx.x", Allocate(Buffer("sums", "float32", (threads,)), block, scope="shared"))
    return Func("row_sum", (f32("x", rows * cols), f32("out", rows)), body)


MATH = ("exp", "log", "tanh", "erf", "sqrt", "rsqrt", "sigmoid", "sin", "cos", "floor", "abs")


def math_func(dtype: str = "float32", n: int = 4096) -> Func:
    """out_op[i] = op(x[i]) for every float intrinsic, and x[i] ** y[i]."""
    bx, tx = Var("bx"), Var("tx")
    i = bx * 128 + tx
    x = load("x", i, dtype)
    stores = [Store(f"out_{op}", i, getattr(te, op)(x)) for op in MATH]
    stores.append(Store("out_pow", i, te.power(x, load("y", i, dtype))))
    outs = tuple(Buffer(f"out_{op}", dtype, (n,)) for op in (*MATH, "pow"))
    body = For(bx, n // 128, "blockIdx.x", For(tx, 128, "threadIdx.x", seq(*stores)))
    return Func(f"math_{dtype}", (Buffer("x", dtype, (n,)), Buffer("y", dtype, (n,)), *outs), body)


def dtypes_func(n: int = 1024) -> Func:
    """Conversions between every GPU dtype and integer arithmetic with numpy's semantics."""
    tx = Var("tx")
    a, b = load("a", tx, "int32"), load("b", tx, "int32")
    h = Cast("float32", Load("h", (tx,), "float16"))
    stores = [
        Store("i8", tx, te.cast("int8", a) + te.cast("int8", b)),
        Store("u8", tx, te.cast("uint8", h)),
        Store("i64", tx, te.cast("int64", a) * te.cast("int64", b) // Const(7, "int64")),
        Store("i32", tx, seq_ops(a, b)),
        Store("flag", tx, (a < b) | te.equal(a % Const(3, "int32"), Const(0, "int32"))),
        Store("h_out", tx, Cast("float16", h * Const(0.5, "float32") + te.cast("float32", load("flag", tx, "bool")))),
        Store("f64", tx, te.cast("float64", h) / te.cast("float64", b)),
        Store("big", tx, tx * Const(1 << 40, "int64")),  # a value, not an index: stays 64-bit
    ]
    bufs = (
        Buffer("a", "int32", (n,)),
        Buffer("b", "int32", (n,)),
        Buffer("h", "float16", (n,)),
        Buffer("i8", "int8", (n,)),
        Buffer("u8", "uint8", (n,)),
        Buffer("i64", "int64", (n,)),
        Buffer("i32", "int32", (n,)),
        Buffer("flag", "bool", (n,)),
        Buffer("h_out", "float16", (n,)),
        Buffer("f64", "float64", (n,)),
        Buffer("big", "int64", (n,)),
    )
    return Func("dtypes", bufs, For(tx, n, "threadIdx.x", seq(*stores)))


def seq_ops(a, b):
    """Integer ops whose GPU lowering differs from C's: floor division, modulo, shifts, min/max, power."""
    return te.maximum(a // b, a % b) + te.minimum(a << Const(2, "int32"), a >> b) + te.power(a, Const(3, "int32"))


def two_launch_func(n: int = 4096) -> Func:
    """tmp = exp(x) (a global intermediate); out = tmp * 2: two launches sharing a workspace."""
    bx, tx = Var("bx"), Var("tx")
    i = bx * 256 + tx

    def launch(store):
        return For(bx, n // 256, "blockIdx.x", For(tx, 256, "threadIdx.x", store))

    body = Allocate(
        Buffer("tmp", "float32", (n,)),
        seq(
            launch(Store("tmp", i, te.exp(load("x", i)))),
            launch(Store("out", i, load("tmp", i) * Const(2.0, "float32"))),
        ),
        scope="global",
    )
    return Func("two", (f32("x", n), f32("out", n)), body)


def assembled(kernel) -> PtxasReport:
    return assemble(kernel.ptx, kernel.name, kernel.arch.name)[1]


SREGS = ("ctaid.x", "ctaid.y", "ctaid.z", "tid.x", "tid.y", "tid.z")
_SREG_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32)
_BARRIER_FN = ctypes.CFUNCTYPE(None)
_EMU_RSQRTF = """
define internal float @"emu.rsqrtf"(float %x) {
  %s = call float @"llvm.sqrt.f32"(float %x)
  %r = fdiv float 1.0, %s
  ret float %r
}
"""


def run_on_cpu(f: Func, *arrays: np.ndarray) -> None:
    """Run GPU program `f` on this CPU from the LLVM IR the codegen makes of each launch, in order, on `arrays` and
    a zeroed workspace: address spaces dropped, each special register read and each barrier a call back into
    Python, libdevice's math libm's. The blocks run one after another (so the module's shared arrays are the running
    block's), the threads of a block as OS threads meeting at a threading.Barrier, so shared-memory tiles, barriers,
    guards and index math are checked against numpy without a GPU."""
    launches = split_launches(f)
    workspace = np.zeros(max(launches.workspace_bytes, 1), np.uint8)
    pointers = [a.ctypes.data for a in arrays] + ([workspace.ctypes.data] if launches.workspace else [])
    for text, body in zip(llvm_ir(f, optimized=False), launches.bodies):
        _emulate(text, launch_shape(Func(f.name, f.params, body)), pointers)


def _emulate(text: str, shape: LaunchShape, pointers: list[int]) -> None:
    """Run one launch's kernel (the module `text` defines) on the CPU, every block's threads in turn."""
    name = re.search(r'define ptx_kernel void @"([^"]+)"', text).group(1)  # type: ignore[union-attr]
    text = re.sub(r"target triple = .*", "", text).replace("ptx_kernel ", "")
    text = re.sub(r" ?addrspace\(\d\)", "", text)
    text = re.sub(r'declare \w+ @"llvm\.nvvm\.(read\.ptx\.sreg|barrier)[^\n]*\n', "", text)
    for k, reg in enumerate(SREGS):
        text = text.replace(f'call i32 @"llvm.nvvm.read.ptx.sreg.{reg}"()', f'call i32 @"emu.sreg"(i32 {k})')
    text = text.replace('call void @"llvm.nvvm.barrier.cta.sync.aligned.all"(i32 0)', 'call void @"emu.barrier"()')
    if '@"__nv_rsqrtf"' in text:  # the one libdevice function libm lacks
        text = re.sub(r'declare float @"__nv_rsqrtf"[^\n]*\n', "", text)
        text = text.replace('@"__nv_rsqrtf"', '@"emu.rsqrtf"') + _EMU_RSQRTF
        if 'declare float @"llvm.sqrt.f32"' not in text:
            text += 'declare float @"llvm.sqrt.f32"(float)\n'
    text = re.sub(r'@"__nv_(\w+)"', r'@"\1"', text)  # libdevice's __nv_expf is libm's expf
    text += 'declare i32 @"emu.sreg"(i32)\ndeclare void @"emu.barrier"()\n'
    local = threading.local()
    barrier = threading.Barrier(shape.threads_per_block, timeout=60)
    callbacks = (_SREG_FN(lambda k: local.regs[k]), _BARRIER_FN(barrier.wait))  # alive until the kernel is done
    llvm.add_symbol("emu.sreg", ctypes.cast(callbacks[0], ctypes.c_void_p).value)
    llvm.add_symbol("emu.barrier", ctypes.cast(callbacks[1], ctypes.c_void_p).value)
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # the host's own CPU: with F16C, half conversions are instructions, not compiler-rt calls MCJIT cannot resolve
    host = llvm.get_host_cpu_features().flatten()
    tm = llvm.Target.from_default_triple().create_target_machine(cpu=llvm.get_host_cpu_name(), features=host)
    mod = llvm.parse_assembly(text)
    mod.verify()
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    kernel = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(pointers))(engine.get_function_address(name))

    def thread(block: tuple[int, ...], tid: tuple[int, ...]) -> None:
        local.regs = (*reversed(block), *reversed(tid))
        kernel(*pointers)

    for block in itertools.product(*(range(n) for n in reversed(shape.grid))):
        threads = [
            threading.Thread(target=thread, args=(block, tid))
            for tid in itertools.product(*(range(n) for n in reversed(shape.block)))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not barrier.broken, f"kernel {name}: a thread did not reach a barrier the others waited at"


# ---------------------------------------------------------------------------------------------- tests


@needs_ptxas
@pytest.mark.parametrize("arch", [SM_80, SM_90], ids=str)
def test_vector_add_launch_shape_and_ptx(arch):
    (k,) = compile_func(vadd_func(), arch).kernels
    assert (k.grid, k.block, k.shared_bytes) == ((4096, 1, 1), (256, 1, 1), 0)
    assert f".target {arch.name}" in k.ptx and ".maxntid 256, 1, 1" in k.ptx
    assert "ld.global.nc" in k.ptx  # inputs are read through the read-only cache: params are noalias
    assert "mul.wide" in k.ptx  # 32-bit index arithmetic, widened once for the address
    report = assembled(k)
    assert report.registers > 0 and not report.spills and report.stack_frame_bytes == 0


@needs_ptxas
@pytest.mark.parametrize("arch", [SM_80, SM_90], ids=str)
def test_tiled_gemm_keeps_its_register_tile_and_shares_tiles(arch):
    (k,) = compile_func(gemm_func(), arch).kernels
    assert (k.grid, k.block) == ((4, 4, 1), (16, 16, 1))
    assert k.shared_bytes == 2 * 64 * 16 * 4
    assert k.ptx.count("bar.sync") == 2
    assert "ld.shared.v4" in k.ptx  # a thread's four neighbouring B elements: one 16-byte shared load
    assert "st.local" not in k.ptx and "ld.local" not in k.ptx  # the accumulator lives in registers
    report = assembled(k)
    assert report.shared_bytes == 8192 and report.barriers == 1
    assert not report.spills and report.stack_frame_bytes == 0
    assert report.registers <= 64


@needs_ptxas
def test_reduction_folds_in_shared_memory_between_barriers():
    (k,) = compile_func(row_sum_func(), SM_90).kernels
    assert (k.grid, k.block, k.shared_bytes) == ((512, 1, 1), (256, 1, 1), 1024)
    assert k.ptx.count("bar.sync") == 8  # one per halving: 128, 64, ..., 1
    report = assembled(k)
    assert not report.spills and report.shared_bytes == 1024


@needs_ptxas
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_math_goes_through_libdevice_and_is_stripped(dtype):
    (k,) = compile_func(math_func(dtype), SM_90).kernels
    assert "__nv_" not in k.ptx  # inlined: no call left, no unused libdevice function emitted
    helpers = re.findall(r"^\.func .*?(\w+)$", k.ptx, flags=re.M)
    assert all(name.startswith("__internal") for name in helpers), helpers  # libdevice's noinline slow paths only
    assert len(k.ptx.splitlines()) < 3000  # the whole of libdevice would be ~21k lines
    assert "sqrt.rn" in k.ptx  # sqrt stays LLVM's intrinsic: IEEE-rounded
    assert not assembled(k).spills


@needs_ptxas
def test_every_gpu_dtype_converts_and_assembles():
    (k,) = compile_func(dtypes_func(), SM_80).kernels
    for instruction in ("cvt.f32.f16", "cvt.rn.f16.f32", "st.global.b8", "div.rn.f64", "cvt.rn.f64.s32"):
        assert instruction in k.ptx, instruction
    assembled(k)


GPU_DTYPES = ("bool", "int8", "uint8", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64")


def every_op_func(dtype: str) -> Func:
    """Every binary op, intrinsic and cast te has, applied to two `dtype` buffers where te defines it."""
    t = Var("t")
    a, b = load("a", t, dtype), load("b", t, dtype)
    is_int, is_float = dtype.startswith(("int", "uint")), dtype.startswith("float")
    exprs: list[Expr] = [Binary(op, a, b) for op in te.COMPARE]
    exprs += [Binary(op, a, b) for op in te.ARITH if (is_int or op not in ("shl", "shr"))
              and (dtype != "bool" or op in ("add", "sub", "mul", "min", "max"))]  # fmt: skip
    exprs += [Binary(op, a, b) for op in te.LOGIC if dtype == "bool"]
    unary = [op for op in te.INTRINSICS if op != "not"] if is_float else ["abs", "neg", "floor", "not"]
    exprs += [Unary(op, a) for op in unary]
    exprs += [Cast(other, a) for other in GPU_DTYPES if other != dtype]
    outs = tuple(Buffer(f"out{k}", e.dtype, (64,)) for k, e in enumerate(exprs))
    stores = [Store(o.name, t, e) for o, e in zip(outs, exprs)]
    params = (Buffer("a", dtype, (64,)), Buffer("b", dtype, (64,)), *outs)
    return Func(f"every_op_{dtype}", params, For(t, 64, "threadIdx.x", seq(*stores)))


@needs_ptxas
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_every_op_and_cast_of_every_dtype_assembles(dtype):
    (k,) = compile_func(every_op_func(dtype), SM_80).kernels
    assembled(k)


@needs_ptxas
def test_global_intermediates_share_one_workspace_across_launches():
    program = compile_func(two_launch_func(), SM_90)
    assert [k.name for k in program.kernels] == ["two_launch0", "two_launch1"]
    assert program.workspace_bytes == 4096 * 4
    assert all(k.takes_workspace for k in program.kernels)
    for k in program.kernels:
        assert k.ptx.count(".param .u64") == 3  # x, out, workspace
    cubins = assemble_program(program)
    assert [c.kernel for c in cubins] == ["two_launch0", "two_launch1"]
    assert all(c.image.startswith(b"\x7fELF") and c.report.arch == "sm_90" for c in cubins)


def _wrap32(x: int) -> int:
    return (x + 2**31) % 2**32 - 2**31


def _reference_i32(a: int, b: int) -> int:
    """seq_ops with te's semantics: floor division and modulo (by 0: 0), shifts past the width fill with the sign."""
    div = a // b if b else 0
    mod = a % b if b else 0
    shr = a >> b if 0 <= b < 32 else (-1 if a < 0 else 0)
    return _wrap32(max(div, mod) + min(_wrap32(a << 2), shr) + _wrap32(a**3))


def test_dtypes_compute_what_numpy_does():
    n = 1024
    rng = np.random.default_rng(1)
    a = rng.integers(-(2**20), 2**20, n, dtype=np.int32)
    b = rng.integers(-40, 40, n, dtype=np.int32)
    h = rng.uniform(0, 250, n).astype(np.float16)
    outs = [np.zeros(n, d) for d in (np.int8, np.uint8, np.int64, np.int32, np.bool_, np.float16, np.float64)]
    big = np.zeros(n, np.int64)
    run_on_cpu(dtypes_func(n), a, b, h, *outs, big)
    i8, u8, i64, i32, flag, h_out, f64 = outs
    np.testing.assert_array_equal(i8, a.astype(np.int8) + b.astype(np.int8))
    np.testing.assert_array_equal(u8, h.astype(np.float32).astype(np.uint8))
    np.testing.assert_array_equal(i64, a.astype(np.int64) * b.astype(np.int64) // 7)
    np.testing.assert_array_equal(i32, [_reference_i32(int(x), int(y)) for x, y in zip(a, b)])
    np.testing.assert_array_equal(flag, (a < b) | (a % 3 == 0))
    np.testing.assert_array_equal(h_out, (h.astype(np.float32) * 0.5 + flag.astype(np.float32)).astype(np.float16))
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(f64, h.astype(np.float64) / b)
    np.testing.assert_array_equal(big, np.arange(n, dtype=np.int64) << 40)


def test_bound_loops_index_by_block_and_thread():
    a, b = np.arange(4096, dtype=np.float32), np.full(4096, 0.5, np.float32)
    c = np.zeros(4096, np.float32)
    run_on_cpu(vadd_func(4096, 128), a, b, c)
    np.testing.assert_array_equal(c, a + b)
    t = Var("t")
    body = _bound(
        "blockIdx.x",
        1,
        seq(
            _bound("threadIdx.x", 256, Store("x", t, Const(1.0, "float32"))),
            _bound("threadIdx.x", 100, Store("x", t, Const(2.0, "float32"))),
        ),
        "b",
    )
    x = np.zeros(256, np.float32)
    run_on_cpu(Func("short", (f32("x", 256),), body), x)
    np.testing.assert_array_equal(x, np.where(np.arange(256) < 100, 2.0, 1.0))


def test_tiled_gemm_and_reduction_compute_what_numpy_does():
    rng = np.random.default_rng(2)
    A, B = rng.standard_normal((64, 32), dtype=np.float32), rng.standard_normal((32, 96), dtype=np.float32)
    C = np.zeros((64, 96), np.float32)
    run_on_cpu(gemm_func(64, 96, 32, tile=32, kt=16, reg=4), A, B, C)
    np.testing.assert_allclose(C, A @ B, rtol=1e-5, atol=1e-5)
    x, sums = rng.standard_normal(6 * 100, dtype=np.float32), np.zeros(6, np.float32)
    run_on_cpu(row_sum_func(6, 100, threads=32), x, sums)
    np.testing.assert_allclose(sums, x.reshape(6, 100).sum(axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_default_gpu_schedules_compute_what_numpy_does(name):
    """Every core kernel's default GPU schedule, lowered by compiler.schedule and compiled here, run on the CPU."""
    case = KERNELS[name]
    dag = ComputeDAG(sum(case.build(), []))
    inputs = case.random_inputs(np.random.default_rng(0))
    outputs = [np.zeros(dag.op(o).shape, np.float32) for o in dag.outputs]
    run_on_cpu(lower(default_schedule(dag), name), *inputs, *outputs)
    for got, want in zip(outputs, case.reference(*inputs)):
        np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)


def test_o3_unrolls_and_promotes_the_register_tile():
    (unoptimized,) = llvm_ir(gemm_func(), optimized=False)
    (optimized,) = llvm_ir(gemm_func())
    assert "alloca" in unoptimized and "alloca" not in optimized
    assert "addrspace(3)" in optimized and "ptx_kernel" in optimized


def test_dump_writes_loop_ir_llvm_and_ptx(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFARM_DUMP", "loopir,ptx")
    monkeypatch.setenv("TILEFARM_DUMP_DIR", str(tmp_path))
    compile_func(two_launch_func(), SM_90)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two.loopir", "two_launch0.ptx", "two_launch1.ptx"]
    assert (tmp_path / "two_launch0.ptx").read_text().startswith("//")


def test_arch_for_compute_capability():
    assert arch_for((9, 0)) is SM_90 and arch_for((8, 0)) is SM_80
    assert arch_for((8, 9)) == GpuArch(89) and arch_for((10, 0)).features == "+ptx86"
    with pytest.raises(BuildError, match="sm_75 and newer"):
        arch_for((7, 0))


def _bound(kind: str, extent: int, body, var: str = "t"):
    return For(Var(var), extent, kind, body)


def test_gpu_programs_a_gpu_cannot_run_are_refused_with_the_reason():
    x = (f32("x", 2048),)
    t = Var("t")
    store = Store("x", t, Const(1.0, "float32"))
    cases = [
        (Func("par", x, For(t, 64, "parallel", store)), "parallel, a CPU loop kind"),
        (Func("notf", x, For(t, 64, "threadIdx.x", Store("x", t, Unary("not", load("x", t))))), "bool or integer"),
        (Func("big", x, _bound("threadIdx.x", 2048, store)), "block dimension x is 2048"),
        (Func("many", x, _bound("threadIdx.x", 64, _bound("threadIdx.y", 32, store, "u"))), "2048 threads"),
        (Func("nested", x, _bound("threadIdx.x", 64, _bound("threadIdx.x", 32, store, "u"))), "inside a loop bound"),
        (
            Func(
                "smem",
                x,
                _bound(
                    "blockIdx.x",
                    2,
                    Allocate(Buffer("s", "float32", (16384,)), _bound("threadIdx.x", 64, store), "shared"),
                    "b",
                ),
            ),
            "65536 bytes of shared memory",
        ),
        (
            Func("outside", x, Allocate(Buffer("s", "float32", (4,)), _bound("threadIdx.x", 64, store), "shared")),
            "shared buffer s is allocated outside every kernel launch",
        ),
        (
            Func("glob", x, _bound("threadIdx.x", 64, Allocate(Buffer("g", "float32", (4,)), store))),
            "allocated inside a kernel launch",
        ),
        (
            Func("scope", x, _bound("threadIdx.x", 64, Allocate(Buffer("g", "float32", (4,)), store, "texture"))),
            "scope 'texture'",
        ),
    ]
    for f, why in cases:
        with pytest.raises(BuildError, match=why):
            compile_func(f)


def test_a_barrier_only_some_threads_reach_is_refused():
    t = Var("t")
    x = (f32("x", 256),)
    body = _bound(
        "blockIdx.x",
        1,
        seq(
            _bound("threadIdx.x", 256, Store("x", t, Const(1.0, "float32"))),
            _bound("threadIdx.x", 128, seq(Barrier(), Store("x", t, Const(2.0, "float32")))),
        ),
        "b",
    )
    with pytest.raises(BuildError, match="extent 128 but 256 are launched"):
        compile_func(Func("diverge", x, body))
    b = Var("b")
    store = Store("x", t, Const(1.0, "float32"))
    branch = IfThenElse(t < 128, seq(Barrier(), store))
    body = _bound("blockIdx.x", 2, _bound("threadIdx.x", 256, branch), "b")
    with pytest.raises(BuildError, match=r"barrier under `if \(t < 128\)`, which depends on thread index t"):
        compile_func(Func("branch", x, body))
    uniform = _bound("blockIdx.x", 2, _bound("threadIdx.x", 256, IfThenElse(b < 1, seq(Barrier(), store))), "b")
    compile_func(Func("uniform", x, uniform))  # every thread of a block takes the same way


@needs_ptxas
def test_threads_past_a_shorter_loop_skip_it():
    t = Var("t")
    x = (f32("x", 256),)
    body = _bound(
        "blockIdx.x",
        1,
        seq(
            _bound("threadIdx.x", 256, Store("x", t, Const(1.0, "float32"))),
            _bound("threadIdx.x", 100, Store("x", t, Const(2.0, "float32"))),
        ),
        "b",
    )
    (k,) = compile_func(Func("short", x, body)).kernels
    assert k.block == (256, 1, 1)
    assert re.search(r"setp\.(gt|lt)\.u32\s+%p\d+, %r\d+, (99|100);", k.ptx)  # the 156 threads past 100 skip
    assembled(k)


def test_missing_libdevice_names_the_extra(monkeypatch):
    def no_wheel(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.delenv("TILEFARM_LIBDEVICE", raising=False)
    monkeypatch.setattr(libdevice_mod.importlib.metadata, "files", no_wheel)
    libdevice_mod.libdevice_path.cache_clear()
    libdevice_mod._bitcode.cache_clear()
    try:
        with pytest.raises(MissingExtra, match=r"pip install 'tilefarm\[cuda\]'"):
            compile_func(math_func())
        compile_func(vadd_func())  # a kernel without math does not need it
    finally:
        libdevice_mod.libdevice_path.cache_clear()
        libdevice_mod._bitcode.cache_clear()


PTXAS_OUTPUT = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm' for 'sm_90'
ptxas info    : Function properties for gemm
    48 bytes stack frame, 24 bytes spill stores, 32 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8192 bytes smem, 384 bytes cmem[0]
ptxas info    : Compiling entry function 'vadd' for 'sm_90'
ptxas info    : Function properties for vadd
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 0 barriers
"""


def test_ptxas_report_is_parsed_per_kernel():
    reports = parse_report(PTXAS_OUTPUT)
    assert reports["gemm"] == PtxasReport("gemm", "sm_90", 255, 8192, 48, 24, 32, 1)
    assert reports["gemm"].spills and "spills 24 B stored" in str(reports["gemm"])
    assert reports["vadd"] == PtxasReport("vadd", "sm_90", 14) and not reports["vadd"].spills


@needs_ptxas
def test_ptxas_failure_names_the_kernel_and_its_message():
    (k,) = compile_func(vadd_func(), SM_90).kernels
    broken = k.ptx.replace("ret;", "ret.bogus;")
    with pytest.raises(PtxasError, match="rejected kernel vadd") as info:
        assemble(broken, "vadd", "sm_90")
    assert "vadd.ptx" in info.value.message and "/tmp" not in info.value.message
    with pytest.raises(PtxasError, match="sm_70"):  # CUDA 13's ptxas dropped Volta
        assemble(k.ptx.replace("sm_90", "sm_70"), "vadd", "sm_70")


def test_a_ptxas_override_that_is_not_there_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEFARM_PTXAS", str(tmp_path / "ptxas"))
    find_ptxas.cache_clear()
    try:
        with pytest.raises(MissingExtra, match="not an executable"):
            find_ptxas()
    finally:
        find_ptxas.cache_clear()


@needs_ptxas
def test_a_shared_buffer_inside_a_virtual_thread_loop_is_one_buffer():
    # a vthread loop is replicated with constant indices; a shared allocation inside it is still one buffer of the
    # block (each virtual thread's use of it ends at a barrier before the next begins), not one per replica: four
    # replicas of 40 KiB once made a 160 KiB candidate that ptxas refused
    from compiler.schedule.state import initial_state
    from compiler.targets.cuda.schedule_rules import Tiling, multi_level_tile

    dag = ComputeDAG(sum(KERNELS["matmul"].build(), []))
    tiling = Tiling(spatial=((4, 4, 1, 2), (1, 8, 1, 1)), reduce=((4, 2),))  # 4 virtual threads over the rows
    tiled = multi_level_tile(initial_state(dag), "matmul", tiling)
    func = lower(tiled)
    vthreads = [s for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == "vthread"]
    assert vthreads and vthreads[0].extent == 4
    assert any(isinstance(s, Allocate) and s.scope == "shared" for s in walk_stmts(vthreads[0].body))
    (k,) = compile_func(func, SM_90).kernels
    assert assembled(k).shared_bytes == k.shared_bytes
