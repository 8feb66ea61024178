"""Targets: takes schedules (States, loop IR) and gives code for one kind of hardware, its measurements and its
artifact's library; one folder per kind, each implementing `Backend` (backend.py), chosen by kind from BACKENDS."""

from __future__ import annotations

from compiler.base.errors import InvalidTarget
from compiler.base.target import Target
from compiler.targets import cpu
from compiler.targets.backend import Backend

BACKENDS: dict[str, Backend] = {
    "cpu": cpu.BACKEND,
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
