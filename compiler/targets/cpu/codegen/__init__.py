"""CPU code generation: loop IR → LLVM IR (`emit`) → machine code, JIT-loaded or linked into a shared library.

`compile_funcs` JIT-compiles kernels callable on numpy arrays; `emit_shared_library` links them (with libgomp
and libm) into a `.so` loadable with ctypes; `llvm_ir` and `assembly` show what was generated.
`TILEFARM_DUMP=loopir,llvm,asm` (or `all`) writes each stage of every build to `TILEFARM_DUMP_DIR` (default
`./tilefarm_dump`). Kernels run parallel loops on `TILEFARM_NUM_THREADS` threads (read at each call; unset or
0 = libgomp's default, all cores).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np

from compiler.base import dtypes
from compiler.base.arrays import aligned_empty
from compiler.base.errors import BuildError
from compiler.base.target import Target
from compiler.schedule.loopir import Buffer, Func, print_func
from compiler.targets.cpu.codegen.emit import NUM_THREADS_GLOBAL, generate, scratch_bytes_symbol
from compiler.targets.cpu.codegen.memory import plan_scratch
from compiler.targets.cpu.host import host

__all__ = [
    "Kernel", "Kernels", "assembly", "compile_funcs", "emit_shared_library", "llvm_ir", "plan_scratch",
    "scratch_bytes_symbol",
]

DUMP_STAGES = ("loopir", "llvm", "asm")


def _init_llvm() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@functools.cache
def _load_runtime() -> None:
    # libgomp's idle workers spin ~300k iterations after each parallel loop before sleeping; on a shared 2-core host
    # that spinning steals the core other work (another runtime, the next measurement) needs. A short spin keeps
    # back-to-back kernels fast without that. Read once, when libgomp loads; the user's setting wins.
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    llvm.load_library_permanently(ctypes.util.find_library("gomp") or "libgomp.so.1")
    if _libmvec():
        llvm.load_library_permanently(_libmvec())


@functools.cache
def _libmvec() -> str | None:
    """glibc's vector math library, if this system has one recent enough to hold tanh and erf (glibc 2.35)."""
    name = ctypes.util.find_library("mvec")
    try:
        return name if name and hasattr(ctypes.CDLL(name), "_ZGVbN4v_erff") else None
    except OSError:
        return None


def _target_machine(target: Target, pic: bool) -> llvm.TargetMachine:
    _init_llvm()
    t = llvm.Target.from_triple(target.triple or llvm.get_process_triple())
    if pic:
        return t.create_target_machine(cpu=target.mcpu, features=target.features, opt=3, reloc="pic",
                                       codemodel="default")
    return t.create_target_machine(cpu=target.mcpu, features=target.features, opt=3, codemodel="jitdefault")


def _optimize(text: str, tm: llvm.TargetMachine, name: str) -> llvm.ModuleRef:
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as err:
        raise BuildError(f"{name}: generated LLVM IR is invalid: {err}") from None
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def _dump_stages() -> set[str]:
    stages = {s.strip() for s in os.environ.get("TILEFARM_DUMP", "").split(",") if s.strip()}
    return set(DUMP_STAGES) if "all" in stages else stages


def _dump(funcs: list[Func], mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    """Write the stages named in TILEFARM_DUMP to TILEFARM_DUMP_DIR (module files carry the first kernel's name)."""
    stages = _dump_stages()
    if not stages:
        return
    out = Path(os.environ.get("TILEFARM_DUMP_DIR", "tilefarm_dump"))
    out.mkdir(parents=True, exist_ok=True)
    if "loopir" in stages:
        for f in funcs:
            (out / f"{f.name}.loopir").write_text(print_func(f))
    if "llvm" in stages:
        (out / f"{funcs[0].name}.ll").write_text(str(mod))
    if "asm" in stages:
        (out / f"{funcs[0].name}.s").write_text(tm.emit_assembly(mod))


def _build(funcs, target: Target | None, pic: bool) -> tuple[list[Func], llvm.ModuleRef, llvm.TargetMachine]:
    funcs = list(funcs)
    target = target or host()
    tm = _target_machine(target, pic)
    text = generate(funcs, target.vector_bytes if _libmvec() else 0, target.features)
    mod = _optimize(text, tm, funcs[0].name if funcs else "module")
    _dump(funcs, mod, tm)
    return funcs, mod, tm


class Kernel:
    """One JIT-compiled kernel; call it with numpy arrays matching its params, in order."""

    def __init__(self, func: Func, address: int, owner: Kernels, scratch_bytes: int):
        self.func = func
        self._owner = owner  # keeps the execution engine (and so the machine code) alive
        # the kernel's scratch buffer (codegen.memory), allocated once, so that calls do not fault in fresh pages
        self._scratch_buf = aligned_empty((scratch_bytes,), np.uint8) if scratch_bytes else None
        self._scratch = [self._scratch_buf.ctypes.data] if self._scratch_buf is not None else []
        nargs = len(func.params) + len(self._scratch)
        self._cfunc = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * nargs)(address)
        self._expect = [(p, dtypes.numpy(p.dtype), tuple(p.shape)) for p in func.params]

    def __call__(self, *arrays: np.ndarray) -> None:
        if len(arrays) != len(self._expect):
            names = ", ".join(p.name for p in self.func.params)
            raise TypeError(f"kernel {self.func.name} takes {len(self._expect)} arrays ({names}), got {len(arrays)}")
        ptrs = []
        for (param, dtype, shape), a in zip(self._expect, arrays):
            # the fast path is one check per property; _bad_arg explains whichever failed
            if not (isinstance(a, np.ndarray) and a.dtype == dtype and (a.shape == shape or a.size == param.size)
                    and a.flags.c_contiguous):
                raise _bad_arg(self.func.name, param, a)
            ptrs.append(a.__array_interface__["data"][0])
        self._owner._set_threads()
        self._cfunc(*ptrs, *self._scratch)

    def __repr__(self):
        return f"Kernel({self.func.name})"


def _bad_arg(kernel: str, param: Buffer, a) -> Exception:
    where = f"kernel {kernel}, param {param.name}"
    if not isinstance(a, np.ndarray):
        return TypeError(f"{where}: expected a numpy array, got {type(a).__name__}")
    if a.dtype != dtypes.numpy(param.dtype):
        return TypeError(f"{where}: expected dtype {param.dtype}, got {a.dtype}")
    if not a.flags.c_contiguous:
        return ValueError(f"{where}: the array must be C-contiguous (use np.ascontiguousarray)")
    return ValueError(f"{where}: expected shape {list(param.shape)} ({param.size} elements), got {list(a.shape)}")


class Kernels(Mapping[str, Kernel]):
    """The kernels of one JIT build, by name; `compile_seconds` is how long the build took."""

    def __init__(self, funcs: list[Func], engine: llvm.ExecutionEngine, compile_seconds: float):
        self._engine = engine
        self._threads = ctypes.c_int32.from_address(engine.get_global_value_address(NUM_THREADS_GLOBAL))

        def scratch_bytes(kernel: str) -> int:
            return ctypes.c_int64.from_address(engine.get_global_value_address(scratch_bytes_symbol(kernel))).value

        self._kernels = {
            f.name: Kernel(f, engine.get_function_address(f.name), self, scratch_bytes(f.name)) for f in funcs
        }
        self.compile_seconds = compile_seconds

    def _set_threads(self) -> None:
        text = os.environ.get("TILEFARM_NUM_THREADS", "").strip()
        try:
            self._threads.value = max(int(text), 0) if text else 0
        except ValueError:
            raise ValueError(f"TILEFARM_NUM_THREADS must be an integer, got {text!r}") from None

    def __getitem__(self, name: str) -> Kernel:
        return self._kernels[name]

    def __iter__(self):
        return iter(self._kernels)

    def __len__(self):
        return len(self._kernels)


def compile_funcs(funcs, target: Target | None = None) -> Kernels:
    """JIT-compile loop IR functions for `target` (default: this host); returns callable kernels by name."""
    t0 = time.perf_counter()
    _load_runtime()
    funcs, mod, tm = _build(funcs, target, pic=False)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    return Kernels(funcs, engine, time.perf_counter() - t0)


def emit_shared_library(funcs, path, target: Target | None = None, extra_sources=()) -> Path:
    """Compile to a position-independent object and link it with libgomp and libm into a shared library;
    `extra_sources` (C or assembler files) are compiled into the same library."""
    path = Path(path)
    _, mod, tm = _build(funcs, target, pic=True)
    with tempfile.TemporaryDirectory() as tmp:
        obj = Path(tmp) / "kernels.o"
        obj.write_bytes(tm.emit_object(mod))
        libs = ["-lgomp", "-lm"] + (["-lmvec"] if _libmvec() else [])
        return link_shared_library(path, [*extra_sources, obj], libs)


def link_shared_library(path, inputs, libs=()) -> Path:
    """Compile and link C/assembler sources and objects into the shared library `path` with the system C compiler
    ($CC, default cc); a BuildError names the command and its output when that fails."""
    path = Path(path)
    cmd = [os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O2", "-o", str(path), *map(str, inputs), *libs]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as err:
        raise BuildError(f"cannot run the linker {cmd[0]!r}: {err}") from None
    if proc.returncode != 0:
        raise BuildError(f"linking {path} failed ({' '.join(cmd)}):\n{proc.stderr}")
    return path


def llvm_ir(funcs, target: Target | None = None, optimized: bool = True) -> str:
    """The LLVM IR module for `funcs`, after LLVM's O3 pipeline unless `optimized` is False."""
    if not optimized:
        target = target or host()
        return generate(list(funcs), target.vector_bytes if _libmvec() else 0, target.features)
    return str(_build(funcs, target, pic=False)[1])


def assembly(funcs, target: Target | None = None) -> str:
    """The machine code for `funcs`, as assembly text."""
    _, mod, tm = _build(funcs, target, pic=False)
    return tm.emit_assembly(mod)
