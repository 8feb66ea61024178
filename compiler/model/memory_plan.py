"""Memory planning: workspace offsets for the values passed between fused groups, reused once a value is dead."""

from __future__ import annotations

import numpy as np

from compiler.model.fusion import Group


def plan_memory(groups: list[Group], keep: set[int], align: int = 64) -> tuple[dict[int, int], int]:
    """Workspace offsets (by value id) for values passed between groups, reusing memory once a value is dead.

    `keep` lists values that live elsewhere (graph inputs, outputs, constants). Greedy first fit over execution
    order. Returns (offsets, workspace size in bytes).
    """
    last_use: dict[int, int] = {}
    for i, grp in enumerate(groups):
        for v in grp.inputs:
            last_use[id(v)] = i
    free: list[tuple[int, int]] = []  # (offset, size)
    live: dict[int, tuple[int, int, int]] = {}  # value id -> (offset, size, last use)
    offsets: dict[int, int] = {}
    top = 0
    for i, grp in enumerate(groups):
        for vid, (off, size, last) in list(live.items()):
            if last < i:
                free.append((off, size))
                del live[vid]
        free = _coalesce(free)
        for v in grp.outputs:
            if id(v) in keep:
                continue
            size = -(-int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize // align) * align
            slot = next((k for k, (_, s) in enumerate(free) if s >= size), None)
            if slot is None:
                off, top = top, top + size
            else:
                off, s = free.pop(slot)
                if s > size:
                    free.append((off + size, s - size))
            offsets[id(v)] = off
            live[id(v)] = (off, size, last_use.get(id(v), i))
    return offsets, top


def _coalesce(free: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for off, size in sorted(free):
        if out and out[-1][0] + out[-1][1] == off:
            out[-1] = (out[-1][0], out[-1][1] + size)
        else:
            out.append((off, size))
    return out
