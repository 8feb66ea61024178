"""Random annotation (Ansor §4.2): a sketch plus sampled *decisions* is a complete program.

Decisions are what the sketch leaves open: tile sizes (a perfect factorization of each tiled extent, innermost
≤ 64), the compute location of stages the sketch did not place, how many outer loops are fused into a `parallel`
loop, how many inner loops into a `vectorize` loop, and each reduction's `auto_unroll_max_step`. `materialize`
turns (sketch, decisions) into the step list deterministically, so mutation edits decisions and the program
follows (MetaSchedule's trace-and-decisions form of Ansor's state mutation).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from compiler.base import dtypes
from compiler.base.errors import InvalidProgram, TilefarmError
from compiler.base.target import Target
from compiler.schedule.lower import infer_bound, unroll_steps
from compiler.schedule.matrix_transform import is_matrix_transform
from compiler.schedule.simplify import linear
from compiler.schedule.state import (
    Annotate,
    ComputeAt,
    ComputeInline,
    ComputeRoot,
    Fuse,
    Pragma,
    State,
    apply_steps,
    derive,
)
from compiler.targets.cpu.host import fmas_in_flight, vector_registers
from compiler.targets.cpu.sketch import Sketch
from compiler.tensor import te

MAX_INNERMOST_FACTOR = 64  # Ansor's max_innermost_split_factor
MAX_VECTORIZE = 64  # MetaSchedule's LLVM max vectorize extent (Ansor: 16); 64 fp32 = 4 AVX-512 registers
UNROLL_STEPS = (0, 16, 64, 512)  # Ansor's CPU auto_unroll_max_step candidates
PARALLEL_JOBS_PER_CORE = 16


@dataclass(frozen=True)
class Decisions:
    """Everything random about a program of a given sketch; hashable and JSON-able."""

    tiles: tuple[tuple[int, ...], ...]  # per sketch tile step: its inner lengths, outermost first
    locations: tuple[tuple[str, str], ...] = ()  # (stage, "root" | "inline" | "target/iter")
    parallel: tuple[tuple[str, int], ...] = ()  # (stage, outer loops fused into the parallel loop)
    vectorize: tuple[tuple[str, int], ...] = ()  # (stage, inner loops fused into the vector loop)
    unroll: tuple[tuple[str, int], ...] = ()  # (stage, auto_unroll_max_step)

    def to_json(self) -> dict:
        return {k: [list(x) for x in getattr(self, k)] for k in self.__dataclass_fields__}

    @staticmethod
    def from_json(d: dict) -> Decisions:
        return Decisions(
            tiles=tuple(tuple(int(v) for v in t) for t in d["tiles"]),
            **{k: tuple((str(a), b) for a, b in d.get(k, ())) for k in _PER_STAGE},
        )


_PER_STAGE = ("locations", "parallel", "vectorize", "unroll")


# ---------------------------------------------------------------------------------------------- materialize


def materialize(sketch: Sketch, d: Decisions) -> State:
    """The program: the sketch's steps with the decided tile sizes, then locations, parallel, unroll, vectorize."""
    return _annotated(_placed(sketch, d), d.parallel, d.unroll, d.vectorize)


def _placed(sketch: Sketch, d: Decisions) -> State:
    """The sketch with the decided tile sizes and compute locations (materialize's first part)."""
    steps = list(sketch.state.steps)
    for idx, lengths in zip(sketch.tile_steps, d.tiles):
        steps[idx] = replace(steps[idx], lengths=lengths)
    with _invalid_program():
        s = apply_steps(sketch.state.dag, steps)
        for name in sorted(sketch.tiled):
            s = register_block_order(s, name)
        for name, loc in d.locations:
            s = _locate(s, name, loc)
    return s


def _annotated(
    s: State,
    parallel: tuple[tuple[str, int], ...],
    unroll: tuple[tuple[str, int], ...],
    vectorize: tuple[tuple[str, int], ...],
) -> State:
    """`s` with these parallel, unroll and vectorize decisions applied in that order (materialize's second part)."""
    with _invalid_program():
        for name, n in parallel:
            s = _parallel(s, name, n)
        for name, step in unroll:
            if step and s.stage(name).compute_at != "inline":
                s = s.do(Pragma(s.stage_id(name), 0, "auto_unroll_max_step", step))
        for name, n in vectorize:
            s = _vectorize(s, name, n)
    return s


@contextlib.contextmanager
def _invalid_program() -> Iterator[None]:
    """Applying decisions: a step the state rejects, or a decision naming a stage or loop this sketch does not have
    (KeyError, ValueError), makes the pair an InvalidProgram."""
    try:
        yield
    except TilefarmError as e:
        raise InvalidProgram(str(e)) from None
    except (KeyError, ValueError) as e:
        raise InvalidProgram(f"decision refers to something the sketch lacks: {e}") from None


def register_block_order(s: State, name: str) -> State:
    """Order the innermost space tile (the register block) of a multi-level tiled stage by decreasing extent,
    keeping its last loop (the contiguous one, which vectorizes) innermost. The operands the block reuses across
    its outer loop stay in registers for the whole block: with a 2 x 14 block of 16-lane accumulators (blocked
    conv), channels outside width keeps 14 broadcast inputs live next to 28 accumulators and spills, while width
    outside channels keeps 2 weight vectors (measured: 28 FMAs per iteration with no stack traffic against a
    spilling loop at about half the speed). Ansor orders every level by the axes' order; the tile sizes are known
    only here, so this is a step of the annotation, replayed like the others."""
    stage = s.stage(name)
    iters = list(stage.iters)
    start = len(iters)
    while start > 0 and iters[start - 1].kind == "spatial" and iters[start - 1].annotation == "none":
        start -= 1
    block = iters[start:-1]
    if len(block) < 2 or start == 0:  # nothing to order, or no reduction tile outside it (not a register block)
        return s
    ordered = sorted(block, key=lambda it: -it.extent)
    if [it.name for it in ordered] == [it.name for it in block]:
        return s
    return s.reorder(name, [it.name for it in iters[:start]] + [it.name for it in ordered] + [iters[-1].name])


def _locate(s: State, name: str, loc: str) -> State:
    sid = s.stage_id(name)
    if loc == "root":
        return s if s.stage(sid).compute_at == "root" else s.do(ComputeRoot(sid))
    if loc == "inline":
        return s.do(ComputeInline(sid))
    target, it = loc.split("/", 1)
    return s.do(ComputeAt(sid, s.stage_id(target), s.stage(target).iter_index(it)))


def _parallel(s: State, name: str, n: int) -> State:
    stage = s.stage(name)
    if n <= 0 or stage.compute_at != "root":
        return s
    n = min(n, _parallel_limit(s, name))
    if n == 0:
        return s
    sid = s.stage_id(name)
    if n > 1:
        s = s.do(Fuse(sid, tuple(range(n))))
    return s.do(Annotate(sid, 0, "parallel"))


def _parallel_limit(s: State, name: str) -> int:
    """How many outer loops may join the parallel loop: spatial, unannotated, up to the first one with stages
    computed inside it."""
    stage = s.stage(name)
    n = 0
    for it in stage.iters:
        if it.kind != "spatial" or it.annotation != "none":
            break
        n += 1
        if s.attached_at(name, it.name):
            break
    return n


def _vectorize(s: State, name: str, n: int) -> State:
    stage = s.stage(name)
    if n <= 0 or stage.compute_at == "inline":
        return s
    n = min(n, _vector_limit(s, name, check_extent=stage.compute_at != "iter"))
    if n == 0:
        return s
    sid = s.stage_id(name)
    last = len(stage.iters) - 1
    if n > 1:
        s = s.do(Fuse(sid, tuple(range(last - n + 1, last + 1))))
    return s.do(Annotate(sid, len(s.stage(sid).iters) - 1, "vectorize"))


def _vector_limit(s: State, name: str, check_extent: bool = True) -> int:
    """How many inner loops may fuse into the vector loop: spatial, unannotated, no stage computed inside, product
    at most MAX_VECTORIZE (checked when sampling on bound-inferred extents; an attached stage's declared extents
    are its whole tensor's, so materializing trusts the sampled decision there)."""
    stage = s.stage(name)
    n, prod = 0, 1
    for it in reversed(stage.iters):
        if it.kind != "spatial" or it.annotation != "none" or (check_extent and prod * it.extent > MAX_VECTORIZE):
            break
        if s.attached_at(name, it.name):
            break
        n, prod = n + 1, prod * it.extent
    if n and stage.iters[-1].extent == 1:
        return 0
    return n


def _contiguous_run(s: State, name: str, n: int) -> int:
    """How many of the stage's n innermost loops (n >= 1) fuse into a vector loop that every access of the stage
    walks in one straight run: for each adjacent pair (outer o, inner i) and each buffer index (the store's and
    every load's, inlined producers resolved), coefficient(o) == extent(i) * coefficient(i), neither loop inside a
    non-affine term. An access that breaks it (a broadcast operand, a padded row) makes the fused loop's index a
    div/mod of the vector lane, which LLVM turns into gathers and shuffles: on a conv's register block such
    candidates were half of the measured ones and none came within 1.6x of the best (64x56x56, 128 trials)."""
    if n <= 1:
        return n
    stage = s.stage(name)
    op = stage.op
    values = derive(stage).values
    extent = {it.name: it.extent for it in stage.iters}
    inner = [it.name for it in stage.iters[len(stage.iters) - n :]]
    try:
        accesses = [(op.shape, tuple(op.axes))]
        accesses += [(s.stage(ld.buffer).op.shape, ld.indices) for ld in te.loads(s.resolve_inlined(op.body))]
    except KeyError:  # a buffer that is not a stage of this state: nothing to reason with, fuse nothing
        return 1
    coefs: list[dict[str, int]] = []
    for shape, indices in accesses:
        flat: te.Expr = te.const(0, "int64")
        for size, index in zip(shape, indices):
            flat = flat * size + index
        terms, _ = linear(te.substitute(flat, values))
        coef: dict[str, int] = {}
        for atom, k in terms.items():
            if isinstance(atom, te.Var):
                coef[atom.name] = coef.get(atom.name, 0) + k
            else:  # a loop inside a non-affine term does not step the index evenly
                for v in te.free_vars(atom) & set(inner):
                    coef[v] = -1
        coefs.append(coef)
    run = 1
    for outer, inside in zip(reversed(inner[:-1]), reversed(inner[1:])):
        if any(
            c.get(outer, 0) < 0 or c.get(inside, 0) < 0 or c.get(outer, 0) != extent[inside] * c.get(inside, 0)
            for c in coefs
        ):
            break
        run += 1
    return run


# ---------------------------------------------------------------------------------------------- sampling


@functools.lru_cache(maxsize=4096)
def factorizations(extent: int, parts: int, max_innermost: int = MAX_INNERMOST_FACTOR) -> tuple[tuple[int, ...], ...]:
    """Every way to write `extent` as an ordered product of `parts` factors, the last ≤ max_innermost."""
    if parts == 1:
        return ((extent,),) if extent <= max_innermost else ()
    out = []
    for d in _divisors(extent):
        for rest in factorizations(extent // d, parts - 1, max_innermost):
            out.append((d, *rest))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def sample_tile(extent: int, n_lengths: int, rng: np.random.Generator, multiple_of: int = 1) -> tuple[int, ...]:
    """Uniformly random perfect factorization; returns the inner lengths (the outer part is implied). With
    `multiple_of`, only those whose innermost length is a multiple of it, where there are any."""
    options = factorizations(extent, n_lengths + 1)
    if not options:  # a prime extent above the innermost limit: keep it outermost
        return (1,) * n_lengths
    if multiple_of > 1:
        options = [o for o in options if o[-1] % multiple_of == 0] or options
    return options[rng.integers(len(options))][1:]


@dataclass(frozen=True)
class RegisterFile:
    """The target's vector registers, for the register block of a multi-level tiled stage: the innermost tile of
    its space axes, whose values (vectors of `lanes` along the contiguous axis) the reduction loops outside it
    update. A block fits when its accumulators and the one broadcast value each step multiplies them by fit in the
    registers together (`demand`); the other operand's vectors can be the FMAs' memory operands. On AVX2 (16 ymm
    registers) a 4x16 fp32 GEMM block needs 4 * 2 + 1 = 9, an 8x16 one 17 and spills accumulators to the stack
    in the innermost loop. Ansor samples every factorization alike, and its cost model does not steer away from
    such blocks: tuning GEMM 1024 on AVX2 (256 trials, six runs), 17-39% of the measured programs did not fit,
    and 1 of the 72 among the runs' 12 fastest. `sample` draws a block that does not fit again, and `mutate` does
    not make one."""

    registers: int
    lanes: int
    in_flight: int = 0  # accumulators the FMA units need to stay busy (host.fmas_in_flight); 0: unknown
    unrolled: bool = True  # count the tile levels auto-unrolling adds to a register block (unrolled_demand)

    @staticmethod
    def of(target: Target, dtype: str) -> RegisterFile:
        """The target's vector registers, each `target.vector_bytes` wide: lanes of `dtype` (the stage's output)."""
        lanes = target.vector_bytes // dtypes.itemsize(dtype)
        return RegisterFile(vector_registers(target), lanes, fmas_in_flight(target))

    def demand(self, sketch: Sketch, tiles: tuple[tuple[int, ...], ...]) -> int:
        """The most registers any of the sketch's register blocks needs with these tile sizes (0 if none has the
        vector loop in it: a scalar block's pressure is not this model's)."""
        return max((self.block_demand(sketch, b, tiles) for b in sketch.register_blocks), default=0)

    def block_demand(self, sketch: Sketch, block: tuple[int, ...], tiles: Sequence[tuple[int, ...]]) -> int:
        vector = [k for k in block if sketch.tile_contiguous[k]]
        if not vector:
            return 0
        acc = -(-tiles[vector[0]][-1] // self.lanes)  # vectors along the contiguous axis, a partial one counted
        for k in block:
            if k != vector[0]:
                acc *= tiles[k][-1]
        return acc + 1

    def fits(self, sketch: Sketch, tiles: tuple[tuple[int, ...], ...]) -> bool:
        return self.demand(sketch, tiles) <= self.registers

    def update_shape(self, state: State, stage: str) -> UpdateShape | None:
        """How the update of `stage` (a multi-level tiled stage of a complete program) uses the registers: the loops
        inside its innermost rolled loop are all unrolled (by its auto_unroll_max_step, as lowering decides) or
        vectorized, so the accumulators of the space loops among them live in registers across the reduction steps
        among them, and across the rolled loop's own iterations too where it is a reduction. None where no vector
        loop is inside that loop or nothing is rolled (a scalar or fully unrolled update is not this model's)."""
        st = state.stage(stage)
        steps, vector, acc, reduction = 1, False, 1, 1
        for it in reversed(st.iters):
            if it.extent == 1:
                continue  # lowering emits no loop
            vectorized = it.annotation == "vectorize"
            steps *= unroll_steps(it.extent, vectorized)
            unrolled = vectorized or it.annotation == "unroll"
            unrolled = unrolled or (it.annotation == "none" and steps <= st.auto_unroll_max_step)
            if not unrolled:
                if not vector:
                    return None
                return UpdateShape(acc, reduction * it.extent if it.kind == "reduce" else reduction)
            if it.kind == "spatial":
                acc *= -(-it.extent // self.lanes) if vectorized else it.extent
                vector = vector or vectorized
            else:
                reduction *= it.extent
        return None

    def unrolled_demand(self, state: State, stage: str) -> int:
        """The registers the update of `stage` needs (`update_shape`): its accumulators and one broadcast value,
        where they live across reduction steps; 0 where each step takes them through memory or the model does not
        apply. `block_demand` counts the innermost tile alone: with GEMM tiles i.2 = 4, i.3 = 4, j.3 = 16 under
        `k.0` and k.1 = 4 (SSRSRS), auto_unroll_max_step 64 unrolls i.2 too and 16 AVX2 accumulators live across
        k.0, where the innermost tile holds 8."""
        shape = self.update_shape(state, stage)
        return shape.accumulators + 1 if shape is not None and shape.steps > 1 else 0

    def unrolled_fits(self, sketch: Sketch, state: State) -> bool:
        """Whether every multi-level tiled stage's update fits in the registers with its unrolled tile levels
        (`unrolled_demand`); True without `unrolled`."""
        if not self.unrolled:
            return True
        return all(
            self.unrolled_demand(state, name) <= self.registers
            for name in sketch.tiled
            if state.stage(name).op.reduce_axes and state.stage(name).compute_at != "inline"
        )

    def row_accumulators(self, sketch: Sketch, block: tuple[int, ...], tiles: Sequence[tuple[int, ...]], k: int) -> int:
        """The block's accumulators per unit of the innermost tile of its non-contiguous axis `k`."""
        one = list(tiles)
        one[k] = (*tiles[k][:-1], 1)
        return self.block_demand(sketch, block, one) - 1

    def most_rows(self, sketch: Sketch, block: tuple[int, ...], tiles: Sequence[tuple[int, ...]], k: int) -> int:
        """The longest innermost tile of the block's non-contiguous axis `k` with which the block fits (at least 1):
        demand grows by one row's accumulators per unit of it."""
        per_row = self.row_accumulators(sketch, block, tiles, k)
        return max(1, (self.registers - 1) // per_row) if per_row > 0 else 1


@dataclass(frozen=True)
class UpdateShape:
    """A tiled stage's update as the registers see it (RegisterFile.update_shape)."""

    accumulators: int  # vectors (and scalars) of the update that live in registers
    steps: int  # reduction steps between two trips of the accumulators through memory (1: every step loads them)


REDRAWS = 64  # draws of a register block's tiles before taking one that does not fit (none may: a block of 1s fits)
RAGGED_SHARE = 0.5  # of register blocks drawn with `ragged` that can take ragged rows, the share that does


@dataclass(frozen=True)
class Space:
    """What annotation may choose per stage of one sketch (computed once per sketch)."""

    locations: tuple[tuple[str, tuple[str, ...]], ...]  # stage -> candidate locations
    reductions: tuple[str, ...]  # stages that get an auto_unroll_max_step


@functools.lru_cache(maxsize=1024)
def space(sketch: Sketch) -> Space:
    s = sketch.state
    locs = []
    for st in s.stages:
        if st.op.is_placeholder or st.name in sketch.fixed or s.dag.is_output(st.name) or st.compute_at != "root":
            continue
        options = ["root"]
        if not st.op.reduce_axes and not st.name.endswith(".pack"):
            options.append("inline")
        consumers = s.consumers(st.name)
        if len(consumers) == 1:
            options += _attach_points(s, consumers[0])
        locs.append((st.name, tuple(options)))
    # a matrix transform's tile loops are unrolled by its structure already
    reductions = tuple(
        st.name for st in s.stages if st.op.reduce_axes and st.compute_at != "inline" and not is_matrix_transform(st.op)
    )
    return Space(tuple(locs), reductions)


def _attach_points(s: State, consumer: str) -> list[str]:
    """The consumer's spatial loops outside its reduction, and, when the consumer is itself computed inside
    another stage, that stage's loops down to the attach point (where a copy holds a whole tile's panel)."""
    c = s.stage(consumer)
    out = []
    if c.compute_at == "iter":
        target, at = c.attach
        for it in s.stage(target).iters:
            out.append(f"{target}/{it.name}")
            if it.name == at:
                break
    for it in c.iters:
        if it.kind != "spatial":
            break
        out.append(f"{c.name}/{it.name}")
    return out


def sample(
    sketch: Sketch,
    rng: np.random.Generator,
    cores: int,
    lanes: int = 0,
    registers: RegisterFile | None = None,
    ragged: bool = False,
) -> Decisions:
    """Ansor's InitFillTileSize, InitChangeComputeLocation, InitParallel, InitUnroll, InitVectorization.

    With `lanes` (the target's vector width in elements), a split of a stage's last space axis, whose innermost
    part becomes the vector loop, draws that part from the multiples of `lanes` where the extent has any (Ansor
    draws it uniformly; a 16-wide channel block then gets all 16 lanes in 1 draw of 35). With `registers`, a
    register block that does not fit in them is drawn again (RegisterFile). With `ragged` as well, half the blocks
    (RAGGED_SHARE) whose rows the extent's divisors cannot make hold the accumulators the FMA units need in flight
    take the innermost tile of one such row axis from the counts that fit beyond its largest fitting divisor
    (_ragged_rows): AVX2's 16 registers hold 6 rows of two 8-lane accumulators and a broadcast, but 1024 rows have
    no divisor between 4 and 8, and 4x16 blocks keep 8 FMAs in flight where Zen 2's 2 FMA units of 5-cycle latency
    want 10 (partition.py runs the tail block without guards in its innermost loops)."""
    return sample_program(sketch, rng, cores, lanes, registers, ragged)[0]


def sample_program(
    sketch: Sketch,
    rng: np.random.Generator,
    cores: int,
    lanes: int = 0,
    registers: RegisterFile | None = None,
    ragged: bool = False,
) -> tuple[Decisions, State]:
    """`sample`'s decisions and their program (`materialize(sketch, decisions)`), built on the partial programs
    that sampling builds anyway: the search then materializes each random program once, not three times."""
    contiguous = sketch.tile_contiguous
    assert len(contiguous) == len(sketch.tile_steps), "a sketch rule added a tile step without its contiguity flag"

    def draw(k: int) -> tuple[int, ...]:
        levels = len(sketch.state.steps[sketch.tile_steps[k]].lengths)
        return sample_tile(sketch.tile_extents[k], levels, rng, lanes if contiguous[k] else 1)

    drawn = [draw(k) for k in range(len(sketch.tile_steps))]
    for block in sketch.register_blocks if registers is not None else ():
        for _ in range(REDRAWS):
            if registers.block_demand(sketch, block, drawn) <= registers.registers:
                break
            for k in block:
                drawn[k] = draw(k)
        if ragged and registers.block_demand(sketch, block, drawn):
            rows = _ragged_rows(sketch, block, drawn, registers)
            if rows and rng.random() < RAGGED_SHARE:
                k, fewest, most = rows[rng.integers(len(rows))]
                drawn[k] = (*drawn[k][:-1], int(rng.integers(fewest, most + 1)))
    tiles = tuple(drawn)
    sp = space(sketch)
    locations = tuple((name, opts[rng.integers(len(opts))]) for name, opts in sp.locations)
    s = _placed(sketch, Decisions(tiles, locations))
    parallel = []
    for st in s.stages:
        if st.op.is_placeholder or st.compute_at != "root":
            continue
        parallel.append((st.name, default_parallel(s, st.name, cores)))
    s_par = _annotated(s, tuple(parallel), (), ())
    bounded = s_par
    if any(st.compute_at == "iter" for st in s_par.stages):  # declared extents overstate attached stages' loops
        bounded = infer_bound(s_par)
    unroll = tuple((name, int(UNROLL_STEPS[rng.integers(len(UNROLL_STEPS))])) for name in sp.reductions)
    vectorize = []
    for st in bounded.stages:
        if st.op.is_placeholder or st.compute_at == "inline":
            continue
        limit = _contiguous_run(bounded, st.name, _vector_limit(bounded, st.name))
        if limit:
            vectorize.append((st.name, int(rng.integers(1, limit + 1))))
    d = Decisions(tiles, locations, tuple(parallel), tuple(vectorize), unroll)
    program = _annotated(s_par, (), unroll, d.vectorize)
    if registers is not None and not registers.unrolled_fits(sketch, program):
        d, program = _unroll_that_fits(sketch, d, s_par, rng, registers)
    return d, program


def _unroll_that_fits(
    sketch: Sketch, d: Decisions, s_par: State, rng: np.random.Generator, registers: RegisterFile
) -> tuple[Decisions, State]:
    """`d` with the auto_unroll_max_step of each tiled stage whose unrolled register block does not fit in the
    registers (RegisterFile.unrolled_demand) drawn again from the values with which it fits (0 unrolls nothing, so
    one does wherever the innermost block fits; where none does, the value stays), and the program."""
    unroll = list(d.unroll)
    for i, (name, step) in enumerate(d.unroll):
        if name not in sketch.tiled:
            continue
        fitting = [v for v in UNROLL_STEPS if _unroll_fits(d, s_par, unroll, i, int(v), registers)]
        if fitting and step not in fitting:
            unroll[i] = (name, int(fitting[rng.integers(len(fitting))]))
    d = replace(d, unroll=tuple(unroll))
    return d, _annotated(s_par, (), d.unroll, d.vectorize)


def _unroll_fits(d: Decisions, s_par: State, unroll: list, i: int, value: int, registers: RegisterFile) -> bool:
    """Whether stage `unroll[i]`'s register block fits with auto_unroll_max_step `value`."""
    name = unroll[i][0]
    trial = (*unroll[:i], (name, value), *unroll[i + 1 :])
    program = _annotated(s_par, (), trial, d.vectorize)
    return registers.unrolled_demand(program, name) <= registers.registers


def _ragged_rows(
    sketch: Sketch, block: tuple[int, ...], tiles: Sequence[tuple[int, ...]], registers: RegisterFile
) -> list[tuple[int, int, int]]:
    """(axis, fewest, most) per row axis of the block whose extent has no divisor that fits and gives the block as
    many accumulators as the FMA units need in flight (`registers.in_flight`): the counts in [fewest, most] fit
    and exceed every divisor that fits. 1024 rows of 16 AVX2 columns on Zen 2 (10 FMAs in flight): 5-7, beyond the
    divisor 4 (8 accumulators); on Zen 3 (8 in flight) none; 56 rows: none, 7 divides 56. With AVX-512's 32
    registers the divisors of 1024 fill 16 accumulators, twice what any core needs, and none are drawn."""
    out = []
    for k in block:
        if sketch.tile_contiguous[k]:
            continue
        extent = sketch.tile_extents[k]
        most = min(registers.most_rows(sketch, block, tiles, k), extent, MAX_INNERMOST_FACTOR)
        divisor = max(d for d in _divisors(extent) if d <= most)
        if divisor < most and divisor * registers.row_accumulators(sketch, block, tiles, k) < registers.in_flight:
            out.append((k, divisor + 1, most))
    return out


def default_parallel(s: State, name: str, cores: int) -> int:
    """Ansor's InitParallel: fuse outer spatial loops until there are more than 16 jobs per core or an attach
    point is reached."""
    stage = s.stage(name)
    limit = _parallel_limit(s, name)
    n, prod = 0, 1
    for it in stage.iters[:limit]:
        n, prod = n + 1, prod * it.extent
        if prod > PARALLEL_JOBS_PER_CORE * cores:
            break
    return n if prod > 1 else 0


__all__ = [
    "Decisions",
    "RegisterFile",
    "materialize",
    "sample",
    "sample_program",
    "sample_tile",
    "factorizations",
    "space",
    "default_parallel",
    "UNROLL_STEPS",
    "MAX_INNERMOST_FACTOR",
    "MAX_VECTORIZE",
]
