"""The CPU's search space of one task: its sketches (sketch.py's rules) and their annotation (annotate.py) and
mutation (mutate.py), shaped by the target's vector lanes and register file and by the search's switches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from compiler.base.target import Target
from compiler.schedule.state import State
from compiler.targets.cpu.annotate import Decisions, RegisterFile, materialize, sample_program
from compiler.targets.cpu.mutate import mutate
from compiler.targets.cpu.sketch import Sketch, generate_sketches
from compiler.tensor.dag import ComputeDAG


@dataclass
class CpuSearchSpace:
    """`params` is the search's SearchParams: its lane_tiles, register_tiles, ragged_rows and unrolled_blocks
    switches turn this space's rules on and off."""

    dag: ComputeDAG
    target: Target
    params: object
    sketches: tuple[Sketch, ...] = field(init=False)

    def __post_init__(self):
        p = self.params
        self.sketches = generate_sketches(self.dag, self.target)
        out_dtype = self.dag.op(self.dag.outputs[0]).dtype
        # the vector width in output elements
        registers = replace(RegisterFile.of(self.target, out_dtype), unrolled=p.unrolled_blocks)
        self.lanes = registers.lanes if p.lane_tiles else 0
        self.registers = registers if p.register_tiles else None
        self.ragged = p.ragged_rows and self.registers is not None

    def sample(self, sketch: int, rng: np.random.Generator) -> tuple[Decisions, State]:
        return sample_program(self.sketches[sketch], rng, self.target.cores, self.lanes, self.registers, self.ragged)

    def materialize(self, sketch: int, decisions: Decisions) -> State:
        return materialize(self.sketches[sketch], decisions)

    def mutate(self, sketch: int, decisions: Decisions, state: State, rng: np.random.Generator) -> Decisions | None:
        return mutate(self.sketches[sketch], decisions, state, rng, self.registers)

    def keeps(self, sketch: int, child: State, parent: State) -> bool:
        # as mutate_tile_size does not make an innermost block over the registers, a mutation does not make an
        # unrolled one that spills, unless its parent's already did
        sk = self.sketches[sketch]
        return self.registers is None or self.registers.unrolled_fits(sk, child) or not self.registers.unrolled_fits(
            sk, parent
        )

    def decisions_from_json(self, data) -> Decisions:
        return Decisions.from_json(data)

    def rename_stages(self, d: Decisions, rename: Callable[[str], str | None]) -> Decisions | None:
        def stage(name: str) -> str | None:
            base, sep, it = name.partition("/")
            new = rename(base)
            return None if new is None else new + sep + it

        def per_stage(entries):
            return tuple((stage(n), v) for n, v in entries if stage(n) is not None)

        placed = []
        for n, loc in d.locations:
            new_loc = loc if loc in ("root", "inline") else stage(loc)
            if stage(n) is None or new_loc is None:
                return None
            placed.append((stage(n), new_loc))
        return Decisions(d.tiles, tuple(placed), per_stage(d.parallel), per_stage(d.vectorize), per_stage(d.unroll))
