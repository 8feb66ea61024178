"""CUDA code generation: GPU loop IR → LLVM IR for `nvptx64-nvidia-cuda` (`emit`) → LLVM's O3 pipeline, with
libdevice linked in for math → PTX, one module per kernel.

`compile_func(func, arch)` gives a `GpuProgram`: one `CudaKernel` per kernel launch (the Func's top-level loop
nests, as compiler.schedule's GPU interpreter runs them), each with its PTX and what launching it takes (grid, block,
static shared memory, params), and the size of the workspace its global intermediates share. `llvm_ir` shows the
IR. `TILEFARM_DUMP=loopir,llvm,ptx` (or `all`; `asm` is an alias of `ptx`) writes each stage of every build to
`TILEFARM_DUMP_DIR` (default `./tilefarm_dump`).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

import llvmlite.binding as llvm

from compiler.base.errors import BuildError
from compiler.schedule.loopir import Buffer, Func, print_func
from compiler.targets.cuda.codegen.emit import TRIPLE, generate
from compiler.targets.cuda.codegen.launch import LaunchShape, launch_shape
from compiler.targets.cuda.codegen.libdevice import link_libdevice, needs_libdevice
from compiler.targets.cuda.codegen.memory import PARAM_ALIGN, shared_bytes, split_launches

__all__ = [
    "ARCHS",
    "SM_80",
    "SM_90",
    "CudaKernel",
    "GpuArch",
    "GpuProgram",
    "PARAM_ALIGN",
    "arch_for",
    "compile_func",
    "llvm_ir",
]

DUMP_STAGES = ("loopir", "llvm", "ptx")


@dataclass(frozen=True)
class GpuArch:
    """What PTX is generated for: the SM version (90 → sm_90) and the PTX ISA version (80 → PTX 8.0, which a driver
    of CUDA 12.0 or later loads)."""

    sm: int
    ptx_isa: int = 80

    @property
    def name(self) -> str:
        return f"sm_{self.sm}"

    @property
    def features(self) -> str:
        return f"+ptx{self.ptx_isa}"

    def __str__(self):
        return self.name


SM_80 = GpuArch(80)  # A100
SM_90 = GpuArch(90)  # H100, H200
ARCHS = {a.sm: a for a in (SM_80, SM_90)}


def arch_for(compute_capability: tuple[int, int]) -> GpuArch:
    """The architecture for a device of this compute capability ((9, 0) → sm_90); CUDA 13's ptxas takes sm_75 up."""
    major, minor = compute_capability
    sm = major * 10 + minor
    if sm < 75:
        raise BuildError(f"compute capability {major}.{minor}: CUDA 13's ptxas assembles sm_75 and newer only")
    return ARCHS.get(sm, GpuArch(sm, 86 if sm >= 100 else 80))  # sm_100 and up need PTX ISA 8.6


@dataclass(frozen=True)
class CudaKernel:
    """One compiled kernel launch: PTX text with the entry `name`, launched on `grid` blocks of `block` threads.
    `shared_bytes` is the static shared memory the PTX declares (a launch adds no dynamic shared memory). Its
    arguments are pointers to `params`' buffers in order (each on PARAM_ALIGN bytes), then, when its program has a
    workspace, a pointer to it."""

    name: str
    ptx: str
    arch: GpuArch
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    params: tuple[Buffer, ...]
    takes_workspace: bool = False

    @property
    def threads_per_block(self) -> int:
        return LaunchShape(self.grid, self.block).threads_per_block


@dataclass(frozen=True)
class GpuProgram:
    """A GPU loop IR `Func` compiled: its kernel launches, run in order on the same buffers, and the bytes of the
    device workspace its global intermediates live in (0: none)."""

    name: str
    kernels: tuple[CudaKernel, ...]
    params: tuple[Buffer, ...]
    workspace_bytes: int
    compile_seconds: float


@functools.cache
def _target_machine(arch: GpuArch) -> llvm.TargetMachine:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=arch.name, features=arch.features, opt=3)


def _parse(text: str, tm: llvm.TargetMachine, name: str) -> llvm.ModuleRef:
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as err:
        raise BuildError(f"kernel {name}: generated LLVM IR is invalid: {err}") from None
    mod.data_layout = str(tm.target_data)
    return mod


def _optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


def _dump_stages() -> set[str]:
    stages = {s.strip() for s in os.environ.get("TILEFARM_DUMP", "").split(",") if s.strip()}
    if "asm" in stages:
        stages.add("ptx")
    return set(DUMP_STAGES) if "all" in stages else stages


def _dump(f: Func, modules: list[tuple[str, llvm.ModuleRef, str]]) -> None:
    """Write the stages named in TILEFARM_DUMP: the loop IR of `f`, each launch's LLVM IR and PTX by kernel name."""
    stages = _dump_stages()
    if not stages:
        return
    out = Path(os.environ.get("TILEFARM_DUMP_DIR", "tilefarm_dump"))
    out.mkdir(parents=True, exist_ok=True)
    if "loopir" in stages:
        (out / f"{f.name}.loopir").write_text(print_func(f))
    for name, mod, ptx in modules:
        if "llvm" in stages:
            (out / f"{name}.ll").write_text(str(mod))
        if "ptx" in stages:
            (out / f"{name}.ptx").write_text(ptx)


def _launch_funcs(f: Func) -> tuple[list[Func], dict[str, tuple[int, Buffer]], int]:
    """One Func per kernel launch of `f` (named `f.name` when there is one, else `<name>_launch<k>`), the workspace
    buffers by name with their offsets, and the workspace's size."""
    launches = split_launches(f)
    bodies = launches.bodies
    names = [f.name] if len(bodies) == 1 else [f"{f.name}_launch{k}" for k in range(len(bodies))]
    return [Func(n, f.params, b) for n, b in zip(names, bodies)], launches.workspace, launches.workspace_bytes


def _build(k: Func, workspace: dict[str, tuple[int, Buffer]], arch: GpuArch) -> tuple[llvm.ModuleRef, CudaKernel]:
    shape = launch_shape(k)
    smem = shared_bytes(k)
    tm = _target_machine(arch)
    mod = _parse(generate(k, shape, workspace), tm, k.name)
    if needs_libdevice(mod):
        link_libdevice(mod, keep={k.name})
    _optimize(mod, tm)
    ptx = tm.emit_assembly(mod)
    return mod, CudaKernel(k.name, ptx, arch, shape.grid, shape.block, smem, k.params, bool(workspace))


def compile_func(f: Func, arch: GpuArch = SM_90) -> GpuProgram:
    """PTX for each kernel launch of GPU program `f` on `arch`, with its launch configuration. Raises BuildError
    naming what the loop IR does that a GPU cannot (a parallel loop, a block too big, too much shared memory, a
    barrier only some threads reach), MissingExtra when it needs libdevice and the `cuda` extra is not installed."""
    t0 = time.perf_counter()
    funcs, workspace, workspace_bytes = _launch_funcs(f)
    built = [_build(k, workspace, arch) for k in funcs]
    _dump(f, [(k.name, mod, k.ptx) for mod, k in built])
    kernels = tuple(k for _, k in built)
    return GpuProgram(f.name, kernels, f.params, workspace_bytes, time.perf_counter() - t0)


def llvm_ir(f: Func, arch: GpuArch = SM_90, optimized: bool = True) -> list[str]:
    """The LLVM IR module of each kernel launch of `f`, after libdevice linking and LLVM's O3 pipeline unless
    `optimized` is False."""
    funcs, workspace, _ = _launch_funcs(f)
    if not optimized:
        return [generate(k, launch_shape(k), workspace) for k in funcs]
    return [str(_build(k, workspace, arch)[0]) for k in funcs]
