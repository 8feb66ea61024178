"""The CPU backend: takes States and loop IR, gives x86-64 (or any LLVM CPU's) machine code through llvmlite, measured
in a sandbox process and linked with the system C compiler into the artifact's shared library."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from compiler.base.arrays import ALIGN
from compiler.base.target import Target
from compiler.schedule.loopir import Func
from compiler.targets.cpu import cache_probe, codegen
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.targets.cpu.host import host
from compiler.targets.cpu.runner import LocalBuilder, LocalRunner
from compiler.targets.cpu.sandbox import OPENMP_ENV
from compiler.targets.cpu.space import CpuSearchSpace
from compiler.targets.cpu.target_parse import check_runs_here, parse_target, runtime_requirements


class CpuBackend:
    kind = "cpu"
    alignment = ALIGN
    library_env = OPENMP_ENV

    host = staticmethod(host)
    parse_target = staticmethod(parse_target)
    check_runs_here = staticmethod(check_runs_here)
    runtime_requirements = staticmethod(runtime_requirements)
    search_space = staticmethod(CpuSearchSpace)
    default_schedule = staticmethod(default_schedule)
    builder = staticmethod(LocalBuilder)
    runner = staticmethod(LocalRunner)

    def keeps_cached(self, nbytes: int) -> bool:
        return cache_probe.keeps_cached(nbytes)  # looked up at the call: a test stubs the probe

    def compile_kernels(self, funcs: Sequence[Func], target: Target | None = None) -> codegen.Kernels:
        return codegen.compile_funcs(list(funcs), target)

    def scratch_bytes(self, func: Func) -> int:
        return codegen.plan_scratch(func).nbytes

    def link_artifact(
        self, funcs: Sequence[Func], entry_c: str, params: bytes, folder: Path, name: str, target: Target | None = None
    ) -> Path:
        # the weights go in as an assembler .incbin, 64-byte aligned in .rodata
        (folder / "params.bin").write_bytes(params or b"\0")
        (folder / "params.S").write_text(
            '.section .rodata\n.balign 64\n.globl tilefarm_params\ntilefarm_params:\n.incbin "params.bin"\n'
            '.section .note.GNU-stack,"",@progbits\n'
        )
        (folder / "entry.c").write_text(entry_c)
        cwd = os.getcwd()
        os.chdir(folder)  # .incbin resolves params.bin relative to the assembler's working directory
        try:
            return codegen.emit_shared_library(
                list(funcs), folder / f"{name}.so", target, extra_sources=[folder / "entry.c", folder / "params.S"]
            )
        finally:
            os.chdir(cwd)


BACKEND = CpuBackend()
