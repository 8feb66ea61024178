"""Search: every program it proposes, from random annotation or from mutation, computes what the kernel's numpy
reference computes; mutations keep tilings perfect; batches are new, distinct and replay from the seed."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.base.errors import InvalidProgram
from compiler.base.target import Target
from compiler.costs.cost_model import RandomModel
from compiler.schedule.loopir import Allocate, For, IfThenElse, Seq, Store
from compiler.schedule.lower import lower
from compiler.schedule.state import State
from compiler.search import evolution as search
from compiler.search.evolution import Candidate, SearchParams, SearchPolicy, program_identity
from compiler.targets import host_target
from compiler.targets.cpu.annotate import (
    MAX_INNERMOST_FACTOR,
    Decisions,
    RegisterFile,
    UpdateShape,
    materialize,
    sample,
    sample_program,
)
from compiler.targets.cpu.codegen import compile_funcs
from compiler.targets.cpu.host import fmas_in_flight
from compiler.targets.cpu.mutate import MUTATIONS, mutate, mutate_tile_size
from compiler.targets.cpu.sketch import Sketch
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops.kernels import KERNELS

PARAMS = SearchParams(population=32, num_iters=1, init_min_population=16)
# matmul and conv: multi-level tiling (with fusion); softmax, layer_norm and row_sum: rfactor; avg_pool2d: a window
# reduction with an elementwise division after it
NAMES = ["matmul", "conv2d_bias_relu", "softmax", "layer_norm", "avg_pool2d", "row_sum"]
DAGS = {name: ComputeDAG([*ins, *outs]) for name in NAMES for ins, outs in [KERNELS[name].build()]}
# LLVM needs 5-25 s for one conv2d program whose reduction nest is unrolled 512 steps; 64 keeps this test fast and
# still unrolls (tests/test_tune.py builds programs as sampled)
MAX_UNROLL = {"conv2d_bias_relu": 64}


def policy(name: str, seed: int = 0, params: SearchParams = PARAMS, dag: ComputeDAG | None = None) -> SearchPolicy:
    return SearchPolicy(dag or DAGS[name], RandomModel(seed), host_target(), params, seed)


def mutants(p: SearchPolicy, parents: list[Candidate], rng: np.random.Generator) -> list[Candidate]:
    """One child per parent and mutation kind (where the kind has something to change and the child is legal)."""
    out = []
    for c in parents:
        for fn, _ in MUTATIONS:
            d = fn(p.sketches[c.sketch_index], c.decisions, c.state, rng)
            if d is None or d == c.decisions:
                continue
            try:
                out.append(p.candidate(c.sketch_index, d))
            except InvalidProgram:
                continue
    return out


def one_of_sketch(p: SearchPolicy, i: int, tries: int = 20) -> Candidate | None:
    """A random program of sketch i (some decision combinations are illegal, e.g. inlining a stage another stage
    was placed in: the search discards those too)."""
    for _ in range(tries):
        try:
            return p.candidate(i, sample(p.sketches[i], p.rng, p.target.cores))
        except InvalidProgram:
            continue
    return None


def capped(p: SearchPolicy, c: Candidate, limit: int | None) -> Candidate:
    if limit is None or all(v <= limit for _, v in c.decisions.unroll):
        return c
    unroll = tuple((name, min(v, limit)) for name, v in c.decisions.unroll)
    return p.candidate(c.sketch_index, replace(c.decisions, unroll=unroll))


@pytest.mark.parametrize("name", NAMES)
def test_sampled_and_mutated_programs_match_the_numpy_reference(name):
    check_search_programs(name, MAX_UNROLL.get(name))


@pytest.mark.slow
def test_conv_programs_with_every_unroll_depth_match_the_numpy_reference():
    check_search_programs("conv2d_bias_relu", None)


def check_search_programs(name: str, unroll_limit: int | None) -> None:
    case = KERNELS[name]
    p = policy(name)
    p.model.informed = True  # as a trained model, so that the first round searches: its batch holds evolved programs
    batch = p.next_batch(4)  # random annotation, one evolution step under random scores, eps-greedy picking
    initial = p.sample_initial(2)
    children = mutants(p, initial, np.random.default_rng(1))
    assert len(batch) == 4 and initial and children
    # every sketch, or every fourth of layer_norm's 45 (5 tilings x 3 rfactor choices x 3 rfactor choices, the
    # choices innermost: a step of 4 still takes every tiling and every choice on each reduction)
    chosen = range(0, len(p.sketches), 1 if len(p.sketches) <= 9 else 4)
    every_sketch = [c for i in chosen if (c := one_of_sketch(p, i))]
    assert len(every_sketch) == len(chosen)
    cands = {c.key: c for c in (capped(p, c, unroll_limit) for c in [*batch, *initial, *children, *every_sketch])}
    kernels = compile_funcs([lower(c.state, f"k{i}") for i, c in enumerate(cands.values())])
    xs = case.random_inputs(np.random.default_rng(0))
    (ref,) = case.reference(*xs)
    for i, c in enumerate(cands.values()):
        out = np.full(ref.shape, np.nan, np.float32)  # an element never written fails
        kernels[f"k{i}"](*xs, out)
        np.testing.assert_allclose(out, ref, rtol=case.rtol, atol=case.atol, err_msg=f"{name}:\n{c.state}")


def perfect(sketch: Sketch, d: Decisions, state: State) -> None:
    """Every tile is a perfect factorization of its extent, and no stage's loops were rounded up."""
    assert len(d.tiles) == len(sketch.tile_extents)
    for extent, lengths in zip(sketch.tile_extents, d.tiles):
        assert extent % math.prod(lengths) == 0 and (lengths[-1] <= MAX_INNERMOST_FACTOR or set(lengths) == {1})
    for s in state.stages:
        if not s.op.is_placeholder:
            root = math.prod(s.op.shape) * math.prod(r.extent for r in s.op.reduce_axes)
            assert math.prod(it.extent for it in s.iters) == root, s.name


@settings(max_examples=25, deadline=None, derandomize=True)
@given(name=st.sampled_from(NAMES), seed=st.integers(0, 2**32 - 1))
def test_mutations_keep_tile_products_equal_to_extents(name, seed):
    # from perfect factorizations (ragged register rows, which need not divide, are drawn with ragged_rows)
    p = policy(name, seed, replace(PARAMS, ragged_rows=False))
    rng = np.random.default_rng(seed)
    (c,) = p.sample_initial(1)
    for _ in range(8):
        sketch = p.sketches[c.sketch_index]
        tiled = mutate_tile_size(sketch, c.decisions, c.state, rng)
        if tiled is not None:
            changed = [k for k, (a, b) in enumerate(zip(c.decisions.tiles, tiled.tiles)) if a != b]
            assert len(changed) <= 1 and replace(tiled, tiles=c.decisions.tiles) == c.decisions
        d = mutate(sketch, c.decisions, c.state, rng)
        if d is None:
            continue
        try:
            child = p.candidate(c.sketch_index, d)
        except InvalidProgram:
            continue
        perfect(sketch, d, child.state)
        assert child.state == materialize(sketch, d)
        c = child


def test_next_batch_is_new_and_distinct_every_round():
    p = policy("matmul")
    rng = np.random.default_rng(0)
    for _ in range(3):
        batch = p.next_batch(8)
        keys = [c.key for c in batch]
        assert len(keys) == 8 and len(set(keys)) == 8
        assert not set(keys) & set(p.measured)
        costs = [math.inf if rng.random() < 0.2 else float(rng.uniform(1e-5, 1e-3)) for _ in batch]
        p.record(batch, costs)
    assert len(p.measured) == 24


def test_next_batch_never_repeats_a_program_when_the_space_runs_out():
    x = te.placeholder((4, 8), name="x")  # a few hundred programs: the search runs out of new ones
    params = SearchParams(population=16, num_iters=1, init_min_population=8)
    p = policy("tiny", params=params, dag=ComputeDAG([x, ops.row_sum(x)]))
    seen: set[str] = set()
    programs: set[str] = set()
    sizes = []
    for _ in range(80):
        batch = p.next_batch(8)
        keys = [c.key for c in batch]
        idents = [program_identity(c.state) for c in batch]
        assert len(set(keys)) == len(keys) and not set(keys) & seen
        assert len(set(idents)) == len(idents) and not set(idents) & programs  # no twin: the same loop nest
        seen |= set(keys)
        programs |= set(idents)
        sizes.append(len(batch))
        p.record(batch, [1e-6] * len(batch))
        if not batch:
            break
    assert sizes[0] == 8 and sizes[-1] == 0  # it filled batches while it could, then ran out without repeating
    assert len(seen) == sum(sizes) == len(p.measured)


def test_a_first_round_under_an_untrained_model_measures_random_programs_without_searching():
    p = policy("matmul")
    batch = p.next_batch(8)  # nothing measured, the model untrained: random programs, nothing scored
    assert len({c.key for c in batch}) == 8 and p.stats.scored == 0
    p.record(batch, [1e-4 * (k + 1) for k in range(len(batch))])
    assert len(p.next_batch(8)) == 8 and p.stats.scored > 0  # measured programs to evolve from: the search runs
    q = policy("matmul")
    q.model.informed = True  # a trained or pre-trained model: its scores rank the population from the first round
    assert len(q.next_batch(8)) == 8 and q.stats.scored > 0


def test_twins_are_one_program_and_a_measured_twin_is_not_picked_again():
    p = policy("matmul")
    first, other = p.next_batch(4)[:2]
    stage = len(first.state.stages) - 1  # the output stage
    order = list(range(len(first.state.stages[stage].iters)))
    twin_state = first.state.reorder(stage, order)  # one more step, the same loop nest
    assert program_identity(twin_state) == program_identity(first.state)
    assert program_identity(other.state) != program_identity(first.state)
    twin = Candidate(first.sketch_index, None, twin_state, "twin")
    p.record([twin], [1e-4])
    p.params = replace(p.params, eps_greedy=0.0)
    p.model.informed = True  # as a trained model: the search runs (the twin has no trace, so it seeds nothing)
    p._evolve = lambda population, keep: [first]  # the evolution's best pick is the measured program's twin
    assert first.key not in {c.key for c in p.next_batch(1)}
    assert p.stats.twins >= 1


def test_the_same_seed_gives_the_same_batches():
    def rounds(seed: int) -> list[list[str]]:
        p = policy("softmax", seed)
        out = []
        for _ in range(2):
            batch = p.next_batch(6)
            out.append([c.key for c in batch])
            p.record(batch, [1e-4 * (k + 1) for k in range(len(batch))])  # the same measurements both times
        return out

    a = rounds(3)
    assert a == rounds(3)
    assert a != rounds(4)


@pytest.mark.parametrize("name", NAMES)
def test_a_sampled_program_is_its_decisions_materialized(name):
    # the search takes sample_program's state, built on the partial programs sampling makes; it must be the program
    # the decisions replay to (materialize), as every record and mutation assumes; and sample draws the same
    p = policy(name)
    rng, again = np.random.default_rng(11), np.random.default_rng(11)
    for _ in range(6):
        i = int(rng.integers(len(p.sketches)))
        assert i == int(again.integers(len(p.sketches)))
        try:
            d, state = sample_program(p.sketches[i], rng, p.target.cores)
        except InvalidProgram:
            with pytest.raises(InvalidProgram):
                materialize(p.sketches[i], sample(p.sketches[i], again, p.target.cores))
            continue
        assert sample(p.sketches[i], again, p.target.cores) == d
        assert state == materialize(p.sketches[i], d)


def test_features_sent_ahead_while_a_population_is_made_change_no_batch(monkeypatch):
    # on two cores the search sends a population's new programs to the feature workers STREAM_CHUNK at a time
    # while it makes the rest; its batches and features are those of featurizing each population once it is made
    def rounds() -> tuple[SearchPolicy, list[list[str]], list[np.ndarray]]:
        two_cores = replace(host_target(), cores=2)
        params = SearchParams(population=96, num_iters=2, init_min_population=16)
        p = SearchPolicy(DAGS["conv2d_bias_relu"], RandomModel(5), two_cores, params, 5)
        p.model.informed = True  # its scores rank the population: the evolution runs from the first round
        keys, xs = [], []
        for _ in range(2):
            batch = p.next_batch(8)
            keys.append([c.key for c in batch])
            xs += p.featurize(batch)
            p.record(batch, [1e-4 * (k + 1) for k in range(len(batch))])
        return p, keys, xs

    ahead, keys, xs = rounds()
    assert ahead.stats.sent_ahead >= search.STREAM_CHUNK and not ahead._in_flight and not ahead._queued
    monkeypatch.setattr(search, "PARALLEL_FEATURES_MIN", 10**9)  # nothing goes to the workers: all featurized here
    here, keys_here, xs_here = rounds()
    assert here.stats.sent_ahead == 0 and here.stats.featurized == ahead.stats.featurized
    assert keys == keys_here
    assert len(xs) == len(xs_here) and all(np.array_equal(a, b) for a, b in zip(xs, xs_here))


def test_candidates_replay_from_their_trace():
    p = policy("layer_norm")
    for c in p.next_batch(4):
        again = p.from_trace(c.trace)
        assert again is not None and again.key == c.key and again.state == c.state


# GEMM 1024 on an AVX2 target: 16 ymm registers of 8 fp32 lanes, where a uniform draw of its tiles gives a register
# block of 16 or more accumulators (17 or more registers with the broadcast) a third of the time or more
# (annotate.RegisterFile)
GEMM_1024 = ComputeDAG([*(ab := [te.placeholder((1024, 1024), name=n) for n in "AB"]), ops.matmul(*ab, name="C")])
# Zen 2: its two FMA units of 5-cycle latency want 10 accumulators in flight (host.fmas_in_flight)
AVX2 = Target(triple="x86_64-unknown-linux-gnu", mcpu="znver2", features="+avx,+avx2,+fma", cores=2, vector_bytes=32)


def avx2_gemm(
    seed: int = 0,
    register_tiles: bool = True,
    ragged_rows: bool = True,
    target: Target = AVX2,
    unrolled_blocks: bool = True,
) -> SearchPolicy:
    params = replace(PARAMS, register_tiles=register_tiles, ragged_rows=ragged_rows, unrolled_blocks=unrolled_blocks)
    return SearchPolicy(GEMM_1024, RandomModel(seed), target, params, seed)


def test_a_multi_level_tiled_gemm_names_its_register_block():
    p = avx2_gemm()
    tiled = [sk for sk in p.sketches if sk.tiled]
    assert tiled and all(len(sk.register_blocks) == 1 for sk in tiled)
    for sk in tiled:
        (block,) = sk.register_blocks
        # the i and j splits (not k's), j the contiguous one whose innermost part is the vector loop
        assert len(block) == 2 and [sk.tile_contiguous[k] for k in block] == [False, True]
        assert all(len(sk.state.steps[sk.tile_steps[k]].lengths) == 3 for k in block)


def unit_tiles(sk: Sketch) -> list[tuple[int, ...]]:
    """Every tile step of the sketch at length 1 on each of its levels."""
    return [(1,) * len(sk.state.steps[idx].lengths) for idx in sk.tile_steps]


def test_register_demand_is_the_accumulators_plus_a_broadcast():
    sk = next(sk for sk in avx2_gemm().sketches if sk.register_blocks)
    i, j = sk.register_blocks[0]
    rf = RegisterFile(registers=16, lanes=8)

    def demand(ii: int, jj: int) -> int:
        tiles = unit_tiles(sk)
        tiles[i], tiles[j] = (1, 1, ii), (1, 1, jj)
        return rf.demand(sk, tuple(tiles))

    assert demand(4, 16) == 4 * 2 + 1 == 9  # fits in 16 ymm registers
    assert demand(1, 64) == 8 + 1  # B's vectors are the FMAs' memory operands
    assert demand(8, 4) == 8 + 1  # half a vector is a register all the same
    assert demand(8, 16) == 8 * 2 + 1  # 17: spills
    assert demand(2, 64) == 2 * 8 + 1


def test_sampled_register_blocks_fit_in_the_register_file():
    fitting = avx2_gemm()
    programs = fitting.sample_initial(120)
    assert len(programs) == 120
    assert all(fitting.space.registers.fits(fitting.sketches[c.sketch_index], c.decisions.tiles) for c in programs)
    # what the prior takes away: without it a good part of the same draws spill
    ansor = avx2_gemm(register_tiles=False)
    assert ansor.space.registers is None
    drawn = ansor.sample_initial(120)
    registers = fitting.space.registers
    spilling = [c for c in drawn if not registers.fits(fitting.sketches[c.sketch_index], c.decisions.tiles)]
    assert len(spilling) > 120 // 5


def block_rows(p: SearchPolicy, c) -> tuple[int, int]:
    """(rows, columns) of the innermost tile of a GEMM program's register block."""
    i, j = p.sketches[c.sketch_index].register_blocks[0]
    return c.decisions.tiles[i][-1], c.decisions.tiles[j][-1]


def test_ragged_rows_fill_the_register_file_beyond_the_extents_divisors():
    p = avx2_gemm()
    blocks = [block_rows(p, c) for c in p.sample_initial(200) if p.sketches[c.sketch_index].register_blocks]
    assert all(p.space.registers.fits(p.sketches[0], _gemm_tiles(p, r, c)) for r, c in blocks)
    ragged = [(r, c) for r, c in blocks if 1024 % r]
    assert len(ragged) > len(blocks) // 10
    for r, c in ragged:  # more rows than the largest fitting divisor of 1024 (a power of 2), as many as fit
        most = (16 - 1) // -(-c // 8)
        assert 2 ** most.bit_length() // 2 < r <= most, (r, c)
    # 6 and 7 rows of 16 columns (12 and 14 accumulators): no divisor of 1024 gives those
    assert {(6, 16), (7, 16)} & set(ragged)
    divisors = avx2_gemm(ragged_rows=False)
    assert all(1024 % r == 0 for r, _ in (block_rows(divisors, c) for c in divisors.sample_initial(200)))


def test_ragged_rows_only_where_the_divisors_leave_the_fma_units_waiting():
    # Zen 3's FMAs (4 cycles, 2 per cycle) want 8 in flight: 4 rows of 16 AVX2 columns, a divisor of 1024, hold as
    # many; with AVX-512's 32 registers 1024's divisors give 16 accumulators (16x16, 8x32, 4x64), more than any core
    # needs. Neither draws a ragged row count.
    zen3 = replace(AVX2, mcpu="znver3")
    avx512 = replace(AVX2, mcpu="znver4", features="+avx,+avx2,+avx512f,+fma", vector_bytes=64)
    assert (fmas_in_flight(AVX2), fmas_in_flight(zen3), fmas_in_flight(avx512)) == (10, 8, 4)
    for target in (zen3, avx512):
        p = avx2_gemm(target=target)
        assert p.space.ragged and p.space.registers.in_flight == fmas_in_flight(target)
        blocks = [block_rows(p, c) for c in p.sample_initial(200) if p.sketches[c.sketch_index].register_blocks]
        assert blocks and all(1024 % r == 0 for r, _ in blocks), target.mcpu


def _gemm_tiles(p: SearchPolicy, rows: int, cols: int) -> tuple[tuple[int, ...], ...]:
    i, j = p.sketches[0].register_blocks[0]
    tiles = unit_tiles(p.sketches[0])
    tiles[i], tiles[j] = (1, 1, rows), (1, 1, cols)
    return tuple(tiles)


def test_the_most_rows_a_block_holds():
    sk = next(sk for sk in avx2_gemm().sketches if sk.register_blocks)
    block = sk.register_blocks[0]
    rf = RegisterFile(registers=16, lanes=8)
    tiles = unit_tiles(sk)
    for cols, rows in ((16, 7), (8, 15), (32, 3), (64, 1), (4, 15)):
        tiles[block[1]] = (1, 1, cols)
        assert rf.most_rows(sk, block, tiles, block[0]) == rows  # rows * ceil(cols / 8) + 1 <= 16


def _gemm_program(p: SearchPolicy, rows: tuple[int, int, int], cols: tuple[int, int, int], k: int, unroll: int):
    """Sketch 2 of GEMM 1024 (C.local tiled SSRSRS: ... k.0 i.2 j.2 k.1 i.3 j.3) with these tile lengths, its
    innermost column loop vectorized, auto_unroll_max_step `unroll`."""
    sk = p.sketches[2]
    assert sk.rules == ("cache_write(C)", "tile+fuse(C.local, L1)")
    i, j = sk.register_blocks[0]
    tiles = list(unit_tiles(sk))
    tiles[i], tiles[j] = rows, cols
    tiles[next(t for t in range(len(tiles)) if t not in (i, j))] = (k,)
    d = Decisions(tuple(tiles), (), (("C", 2),), (("C.local", 1),), (("C.local", unroll),))
    return sk, materialize(sk, d)


def test_unrolled_tile_levels_count_in_the_register_block():
    p = avx2_gemm()
    rf = p.space.registers
    # i.2 = 4 over a 4x16 innermost block, k.1 = 4: 64 steps inside k.0, all unrolled at 64, so 4 x 4 rows of two
    # vectors live across k.0: 32 accumulators and the broadcast, twice the 16 ymm registers
    sk, prog = _gemm_program(p, (1, 4, 4), (1, 1, 16), 4, 64)
    assert rf.block_demand(sk, sk.register_blocks[0], materialize_tiles(sk, prog)) == 9
    assert rf.unrolled_demand(prog, "C.local") == 33 and not rf.unrolled_fits(sk, prog)
    assert replace(rf, unrolled=False).unrolled_fits(sk, prog)
    # at 16 steps i.2 stays a loop: the accumulators go to memory on each of its iterations, but live in registers
    # over the 4 unrolled steps of k.1 inside it
    assert rf.unrolled_demand(_gemm_program(p, (1, 4, 4), (1, 1, 16), 4, 16)[1], "C.local") == 9
    # k.1 = 1 and i.3 rolled inside k.0: every step takes the accumulators through memory, nothing lives across
    assert rf.unrolled_demand(_gemm_program(p, (1, 1, 4), (1, 1, 16), 1, 0)[1], "C.local") == 0
    # nothing above the innermost tile unrolled: the innermost block's demand
    assert rf.unrolled_demand(_gemm_program(p, (1, 1, 4), (1, 1, 16), 4, 512)[1], "C.local") == 9


def materialize_tiles(sk: Sketch, prog: State) -> tuple[tuple[int, ...], ...]:
    return tuple(prog.steps[idx].lengths for idx in sk.tile_steps)


def _update_in_registers(func, buffer: str, lanes: int) -> tuple[int, int] | None:
    """Counted on the lowered loop nest, independently of RegisterFile: (vectors, steps) of `buffer`'s update inside
    the innermost rolled loop enclosing it, the vectors being those its loops with a variable in the store's index
    make, the steps those its loops without one make (reduction loops: they index a load but not the store), the
    rolled loop's own iterations included where it is one of those; None where no vector loop is inside it or
    nothing is rolled. The first update in program order: the main part; the tail of a ragged row axis
    (partition.py) comes after it, where a partial block's loop of one iteration is gone and its few rows may
    live across the reduction."""
    found: list[tuple[int, int] | None] = []

    def visit(stmt, loops):
        if found:
            return
        if isinstance(stmt, For):
            visit(stmt.body, [*loops, stmt])
        elif isinstance(stmt, Allocate):
            visit(stmt.body, loops)
        elif isinstance(stmt, Seq):
            for c in stmt.stmts:
                visit(c, loops)
        elif isinstance(stmt, IfThenElse):
            visit(stmt.then, loops)
            if stmt.orelse is not None:
                visit(stmt.orelse, loops)
        elif isinstance(stmt, Store) and stmt.buffer == buffer and f"{buffer}[" in str(stmt.value):
            index = te.free_vars(stmt.index)
            rolled = [f for f in loops if f.kind not in ("unrolled", "vectorized")]
            inner = loops[loops.index(rolled[-1]) :] if rolled else []
            if not inner or not any(f.kind == "vectorized" for f in inner[1:]):
                found.append(None)
                return
            vectors = steps = 1
            for f in inner:
                if f.var.name not in index:
                    steps *= f.extent
                elif f is not inner[0]:
                    vectors *= -(-f.extent // lanes) if f.kind == "vectorized" else f.extent
            found.append((vectors, steps))

    visit(func.body, [])
    return found[0] if found else None


def _counted_demand(func, buffer: str, lanes: int) -> int:
    """The registers `_update_in_registers` says the update needs: its vectors and a broadcast where they live over
    more than one reduction step, else 0."""
    shape = _update_in_registers(func, buffer, lanes)
    return shape[0] + 1 if shape is not None and shape[1] > 1 else 0


def test_sampled_and_mutated_programs_keep_their_unrolled_register_blocks_in_the_registers():
    p = avx2_gemm(seed=5)
    programs = p.sample_initial(150)
    counted = [_counted_demand(lower(c.state, "k"), "C.local", 8) for c in programs]
    assert all(n <= 16 for n in counted), max(counted)
    assert all(p.space.registers.unrolled_fits(p.sketches[c.sketch_index], c.state) for c in programs)
    children = p._next_generation(programs, np.ones(len(programs)))
    assert all(p.space.registers.unrolled_fits(p.sketches[c.sketch_index], c.state) for c in children)
    # the same draws counting the innermost tile alone: a good part of them spill once unrolled
    unchecked = avx2_gemm(seed=5, unrolled_blocks=False)
    assert not unchecked.space.registers.unrolled
    drawn = unchecked.sample_initial(150)
    over = [c for c in drawn if _counted_demand(lower(c.state, "k"), "C.local", 8) > 16]
    assert len(over) > 150 // 20
    assert all(not p.space.registers.unrolled_fits(p.sketches[c.sketch_index], c.state) for c in over)


def test_the_update_shape_is_what_the_lowered_loop_nest_keeps_in_registers():
    p = avx2_gemm(seed=2)
    rf = p.space.registers
    shapes = 0
    for c in p.sample_initial(120) + p._next_generation(p.sample_initial(60), np.ones(60)):
        if "C.local" not in p.sketches[c.sketch_index].tiled:
            continue
        shape = rf.update_shape(c.state, "C.local")
        counted = _update_in_registers(lower(c.state, "k"), "C.local", 8)
        assert (shape.accumulators, shape.steps) == counted if shape else counted is None, c.decisions
        shapes += shape is not None
    assert shapes > 60


def test_the_update_shape_counts_the_steps_between_the_accumulators_trips_through_memory():
    p = avx2_gemm()
    rf = p.space.registers
    # 5 rows of two vectors unrolled (5 steps), k.1 = 4 rolled around them (20 steps: over 16)
    prog = _gemm_program(p, (1, 1, 5), (1, 1, 16), 4, 16)[1]
    assert rf.update_shape(prog, "C.local") == UpdateShape(accumulators=10, steps=4)
    # 2 rows: k.1 unrolled too, the 4 accumulators live over k.0's 256 iterations of 4 steps
    assert rf.update_shape(_gemm_program(p, (1, 1, 2), (1, 1, 16), 4, 16)[1], "C.local") == UpdateShape(4, 1024)
    # auto_unroll_max_step 0: i.3 is rolled inside k.1, every step takes the 5 rows through memory
    prog = _gemm_program(p, (1, 1, 5), (1, 1, 16), 4, 0)[1]
    assert rf.update_shape(prog, "C.local") == UpdateShape(2, 1) and rf.unrolled_demand(prog, "C.local") == 0


def test_tile_mutations_keep_a_fitting_register_block_fitting():
    p = avx2_gemm(seed=3)
    rng = np.random.default_rng(3)
    grown = 0
    for c in p.sample_initial(40):
        sk = p.sketches[c.sketch_index]
        for _ in range(10):
            d = mutate_tile_size(sk, c.decisions, c.state, rng, p.space.registers)
            assert d is None or p.space.registers.fits(sk, d.tiles)
            unchecked = mutate_tile_size(sk, c.decisions, c.state, rng)
            grown += unchecked is not None and not p.space.registers.fits(sk, unchecked.tiles)
    assert grown > 0  # the same moves unchecked do leave the register file


# a tuning process's feature pool: prints its workers' pids and their parent's (the forkserver's), then waits
TUNER = """
import os, time
from compiler.search import evolution as search
if __name__ == "__main__":
    pool = search._pool(2)
    pids = {f.result() for f in [pool.submit(os.getpid) for _ in range(8)]}
    print(*pids, pool.submit(os.getppid).result(), flush=True)
    time.sleep(120)
"""


def test_feature_workers_and_their_forkserver_exit_when_the_tuner_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "tuner.py"
    script.write_text(TUNER)
    tuner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in tuner.stdout.readline().split()]
    finally:
        tuner.send_signal(signal.SIGKILL)
        tuner.wait()
    assert len(pids) >= 2  # a worker or two, and the forkserver

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # an exited child of init is reaped at once; a zombie would still answer, so read its state (it may be gone
        # by the time the read comes)
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False

    deadline = time.monotonic() + 15
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids), [p for p in pids if alive(p)]
