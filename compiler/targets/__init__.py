"""Targets: takes schedules (States, loop IR) and gives code for one kind of hardware, its measurements and its
artifact's library; one folder per kind, each implementing `Backend` (backend.py), chosen by kind from BACKENDS."""

from __future__ import annotations

from compiler.base.errors import InvalidTarget
from compiler.base.target import Target
from compiler.targets import cpu
from compiler.targets.backend import Backend
from compiler.targets.cpu.target_parse import KINDS as CPU_KINDS
from compiler.targets.cuda import backend as cuda
from compiler.targets.cuda.target import is_cuda

BACKENDS: dict[str, Backend] = {
    "cpu": cpu.BACKEND,
    "cuda": cuda.BACKEND,
}


def backend_for(target: Target | str) -> Backend:
    """The backend of `target`'s kind (or of the kind named)."""
    kind = target if isinstance(target, str) else target.kind
    if kind not in BACKENDS:
        raise InvalidTarget(f"no backend for target kind {kind!r}; the kinds are {', '.join(BACKENDS)}")
    return BACKENDS[kind]


def host_target() -> Target:
    """The processor this process runs on (the CPU backend's host)."""
    return BACKENDS["cpu"].host()


def parse_target(text: str, host: Target | None = None) -> Target:
    """The Target a tvmc/TVM target string names: "llvm" (this host's CPU), "llvm -mcpu=NAME -mattr=+a,-b" (any CPU
    LLVM knows, features edited; cores and caches are `host`'s), "cuda" or "cuda -arch=sm_80|sm_90" (NVIDIA GPUs,
    sm_90 by default; `host` is not consulted). Raises InvalidTarget naming what is wrong
    (compiler/targets/cpu/target_parse.py, compiler/targets/cuda/target.py)."""
    if is_cuda(text):
        return cuda.BACKEND.parse_target(text)
    kind = text.split()[0] if text.split() else ""
    if kind and kind.lower() not in CPU_KINDS:
        raise InvalidTarget(
            f"target kind {kind!r} is not supported: tilefarm generates code for CPUs (llvm [-mcpu=NAME] "
            "[-mattr=+a,-b]) and NVIDIA GPUs (cuda [-arch=sm_80|sm_90])"
        )
    return cpu.BACKEND.parse_target(text, host)


def check_runs_here(target: Target, host: Target | None = None) -> None:
    """Raise InvalidTarget, naming what `host` (default: this process's) lacks, unless it can run `target`'s code:
    tuning measures here, so it needs this; compiling does not."""
    backend_for(target).check_runs_here(target, host)
