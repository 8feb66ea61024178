"""Mutations of a program's decisions (Ansor §4.2, evolutionary search): tile size, auto-unroll, compute location,
parallel granularity, chosen by Ansor's CPU weights. Each returns new Decisions or None when it has nothing to
change; the caller materializes and discards illegal results."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from compiler.base.errors import InvalidProgram
from compiler.schedule.state import State
from compiler.targets.cpu.annotate import (
    MAX_INNERMOST_FACTOR,
    UNROLL_STEPS,
    Decisions,
    RegisterFile,
    _divisors,
    _parallel_limit,
    materialize,
    space,
)
from compiler.targets.cpu.sketch import Sketch


def mutate_tile_size(
    sketch: Sketch, d: Decisions, state: State, rng: np.random.Generator, registers: RegisterFile | None = None
) -> Decisions | None:
    """Move a factor from one tile level of a split to another; the product (the extent, or where the levels do
    not divide it, the extent rounded up to a multiple of theirs) stays the same. None where the move makes a
    register block that does not fit in `registers` (annotate.RegisterFile)."""
    candidates = [i for i, (ext, t) in enumerate(zip(sketch.tile_extents, d.tiles)) if ext > 1]
    if not candidates:
        return None
    i = candidates[rng.integers(len(candidates))]
    extent, lengths = sketch.tile_extents[i], d.tiles[i]
    parts = [-(-extent // _prod(lengths)), *lengths]
    sources = [k for k, v in enumerate(parts) if v > 1]
    if not sources:
        return None
    src = sources[rng.integers(len(sources))]
    factors = [f for f in _divisors(parts[src]) if f > 1]
    f = factors[rng.integers(len(factors))]
    dst = [k for k in range(len(parts)) if k != src][rng.integers(len(parts) - 1)]
    parts[src] //= f
    parts[dst] *= f
    if parts[-1] > MAX_INNERMOST_FACTOR:
        return None
    tiles = d.tiles[:i] + (tuple(parts[1:]),) + d.tiles[i + 1 :]
    if registers is not None and not registers.fits(sketch, tiles) and registers.fits(sketch, d.tiles):
        return None
    return replace(d, tiles=tiles)


def mutate_unroll(sketch: Sketch, d: Decisions, state: State, rng: np.random.Generator) -> Decisions | None:
    if not d.unroll:
        return None
    i = int(rng.integers(len(d.unroll)))
    name, old = d.unroll[i]
    choices = [v for v in UNROLL_STEPS if v != old]
    new = (name, int(choices[rng.integers(len(choices))]))
    return replace(d, unroll=d.unroll[:i] + (new,) + d.unroll[i + 1 :])


def mutate_compute_location(sketch: Sketch, d: Decisions, state: State, rng: np.random.Generator) -> Decisions | None:
    options = dict(space(sketch).locations)
    movable = [i for i, (name, _) in enumerate(d.locations) if len(options.get(name, ())) > 1]
    if not movable:
        return None
    i = movable[rng.integers(len(movable))]
    name, old = d.locations[i]
    choices = [o for o in options[name] if o != old]
    new = (name, choices[rng.integers(len(choices))])
    return replace(d, locations=d.locations[:i] + (new,) + d.locations[i + 1 :])


def mutate_parallel(sketch: Sketch, d: Decisions, state: State, rng: np.random.Generator) -> Decisions | None:
    """Change how many outer loops are fused into the parallel loop."""
    if not d.parallel:
        return None
    i = int(rng.integers(len(d.parallel)))
    name, old = d.parallel[i]
    try:
        limit = _parallel_limit_unannotated(sketch, d, name)
    except (KeyError, InvalidProgram):
        return None
    choices = [n for n in range(1, limit + 1) if n != old]
    if not choices:
        return None
    new = (name, choices[rng.integers(len(choices))])
    return replace(d, parallel=d.parallel[:i] + (new,) + d.parallel[i + 1 :])


def _parallel_limit_unannotated(sketch: Sketch, d: Decisions, name: str) -> int:
    """The limit in the program before any parallel, vector or unroll annotation."""
    s = materialize(sketch, replace(d, parallel=(), vectorize=(), unroll=()))
    return _parallel_limit(s, name)


MUTATIONS = (  # Ansor's CPU weights
    (mutate_tile_size, 0.90),
    (mutate_unroll, 0.04),
    (mutate_compute_location, 0.05),
    (mutate_parallel, 0.01),
)


def mutate(
    sketch: Sketch, d: Decisions, state: State, rng: np.random.Generator, registers: RegisterFile | None = None
) -> Decisions | None:
    """One mutation chosen by weight (a kind with nothing to change falls through to tile size); with `registers`,
    tile-size moves keep register blocks that fit in them fitting."""
    weights = np.array([w for _, w in MUTATIONS])
    k = int(rng.choice(len(MUTATIONS), p=weights / weights.sum()))
    out = mutate_tile_size(sketch, d, state, rng, registers) if k == 0 else MUTATIONS[k][0](sketch, d, state, rng)
    if out is None and k != 0:
        out = mutate_tile_size(sketch, d, state, rng, registers)
    return out


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


__all__ = ["mutate", "mutate_tile_size", "mutate_unroll", "mutate_compute_location", "mutate_parallel", "MUTATIONS"]
