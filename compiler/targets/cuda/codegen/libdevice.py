"""NVIDIA's libdevice (the `__nv_*` math functions, as LLVM bitcode) linked into a kernel's module: LLVM's NVPTX
backend has no libcall for `llvm.exp.f32` and friends (it aborts the process), so math is a call into libdevice,
inlined and the rest of the library dropped. The bitcode comes from pip's `nvidia-nvvm` wheel (the `cuda` extra), or
the file `TILEFARM_LIBDEVICE` names."""

from __future__ import annotations

import functools
import importlib.metadata
import os
from pathlib import Path

import llvmlite.binding as llvm

from compiler.base.errors import MissingExtra

LIBDEVICE_FILE = "libdevice.10.bc"


@functools.cache
def libdevice_path() -> Path:
    """Where libdevice's bitcode is: `TILEFARM_LIBDEVICE`, else the installed `nvidia-nvvm` wheel's copy. Raises
    MissingExtra saying how to get it."""
    override = os.environ.get("TILEFARM_LIBDEVICE")
    if override:
        path = Path(override)
        if not path.is_file():
            raise MissingExtra(f"TILEFARM_LIBDEVICE names {path}, which is not a file")
        return path
    try:
        files = importlib.metadata.files("nvidia-nvvm") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == LIBDEVICE_FILE:
            return Path(str(f.locate()))
    raise MissingExtra(
        "GPU math (exp, log, tanh, erf, sin, cos, pow, rsqrt) needs NVIDIA's libdevice, which this environment lacks: "
        "pip install 'tilefarm[cuda]' (it brings the nvidia-nvvm wheel), or set TILEFARM_LIBDEVICE to a "
        f"{LIBDEVICE_FILE}"
    )


@functools.cache
def _bitcode() -> bytes:
    return libdevice_path().read_bytes()


def needs_libdevice(mod: llvm.ModuleRef) -> bool:
    return any(f.is_declaration and f.name.startswith("__nv_") for f in mod.functions)


def link_libdevice(mod: llvm.ModuleRef, keep: set[str]) -> None:
    """Link libdevice into `mod` and make every definition but `keep` (the kernels) internal, so that the optimizer
    inlines the math functions used and deletes the other few hundred."""
    lib = llvm.parse_bitcode(_bitcode())
    lib.triple, lib.data_layout = mod.triple, mod.data_layout
    mod.link_in(lib)
    for fn in mod.functions:
        if not fn.is_declaration and fn.name not in keep:
            fn.linkage = llvm.Linkage.internal
    for var in mod.global_variables:
        if not var.is_declaration:
            var.linkage = llvm.Linkage.internal
