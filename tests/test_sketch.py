"""Sketch generation and random annotation: golden sketches (how many, which rules, the loop-nest structure) per
workload, golden loop nests from fixed decisions, and the properties of sampling (seeded, JSON-able, replayable)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from compiler.base.errors import InvalidProgram
from compiler.base.target import Target
from compiler.model.passes import pack_conv_weight
from compiler.schedule.lower import lower
from compiler.schedule.state import apply_steps, initial_state, print_state, program_key, step_from_record
from compiler.targets.cpu.annotate import (
    MAX_INNERMOST_FACTOR,
    Decisions,
    factorizations,
    materialize,
    sample,
    sample_tile,
    space,
)
from compiler.targets.cpu.codegen import compile_funcs
from compiler.targets.cpu.sketch import TILE_STRUCTURE, ConsumerView, Sketch, consumer_view, generate_sketches
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops.kernels import KERNELS, reference_conv2d

CORES = 4
TARGET = Target(cores=CORES)  # sketches depend on the core count (rfactor); goldens must not depend on the host


def matmul_dag(n: int, k: int, m: int) -> ComputeDAG:
    A = te.placeholder((n, k), name="A")
    B = te.placeholder((k, m), name="B")
    return ComputeDAG([A, B, ops.matmul(A, B, name="C")])


def kernel_dag(name: str) -> ComputeDAG:
    ins, outs = KERNELS[name].build()
    return ComputeDAG(ins + outs)


def softmax_dag() -> ComputeDAG:
    x = te.placeholder((4, 1000), name="x")
    return ComputeDAG([x, ops.softmax(x)])


def row_sum_dag() -> ComputeDAG:
    x = te.placeholder((4, 1000), name="x")  # 4 outputs, 1000-term sums: little space, much reduction
    return ComputeDAG([x, ops.row_sum(x)])


DAGS = {  # built once: generate_sketches caches per DAG object
    "matmul512": matmul_dag(512, 512, 512),
    "conv2d_bias_relu": kernel_dag("conv2d_bias_relu"),
    "softmax": softmax_dag(),
    "row_sum": row_sum_dag(),
    "matmul_small_space": matmul_dag(2, 512, 2),
}


def sketches(name: str, target: Target = TARGET, pack: bool = False) -> tuple[Sketch, ...]:
    """Ansor's CPU rules alone by default (the pack rule's variants are in tests/test_pack.py)."""
    return generate_sketches(DAGS[name], target, pack=pack)


def names(s: Sketch, stage: str) -> list[str]:
    return [it.name for it in s.state.stage(stage).iters]


def attach(s: Sketch, stage: str) -> tuple[str, str] | str:
    st = s.state.stage(stage)
    return st.attach if st.compute_at == "iter" else st.compute_at


def tile_order(space_axes: list[str], reduce_axes: list[str]) -> list[str]:
    """The SSRSRS order of a multi-level tiled stage's iterators, written out level by level."""
    out, seen = [], {"S": 0, "R": 0}
    for k in TILE_STRUCTURE:
        out += [f"{a}.{seen[k]}" for a in (space_axes if k == "S" else reduce_axes)]
        seen[k] += 1
    return out


# ---------------------------------------------------------------------------------------------- golden sketches


def test_matmul_sketches():
    sk = sketches("matmul512")
    assert [s.rules for s in sk] == [
        ("cache_write(C)", "tile+fuse(C.local, L1)"),
        ("cache_write(C)", "tile+fuse(C.local, L2)"),
        ("tile(C)",),
    ]
    ssrsrs = tile_order(["i", "j"], ["k"])
    assert ssrsrs == ["i.0", "j.0", "i.1", "j.1", "k.0", "i.2", "j.2", "k.1", "i.3", "j.3"]
    for level, s in zip((1, 2), sk[:2]):
        assert [st.name for st in s.state.stages] == ["A", "B", "C.local", "C"]
        assert names(s, "C.local") == ssrsrs
        # the output follows the first `level` space tile levels; the cache is computed at the last of them
        assert names(s, "C") == [f"{a}.{lv}" for lv in range(level + 1) for a in "ij"]
        assert attach(s, "C.local") == ("C", f"j.{level - 1}")
        assert s.tiled == {"C.local"} and s.fixed == {"C", "C.local"}
        assert s.tile_extents == (512, 512, 512)
        assert space(s).locations == () and space(s).reductions == ("C.local",)
    plain = sk[2]
    assert plain.tiled == plain.fixed == {"C"} and plain.tile_steps == (0, 1, 2)
    assert names(plain, "C") == ssrsrs
    # placeholder lengths: every tile level 1, the outermost takes the extent
    assert print_state(plain.state) == (
        "Placeholder: A, B\n"
        "for i.0 (0,512)\n"
        "  for j.0 (0,512)\n"
        "    for i.1 (0,1)\n"
        "      for j.1 (0,1)\n"
        "        for k.0 (0,512)\n"
        "          for i.2 (0,1)\n"
        "            for j.2 (0,1)\n"
        "              for k.1 (0,1)\n"
        "                for i.3 (0,1)\n"
        "                  for j.3 (0,1)\n"
        "                    C[i, j] += (A[i, k] * B[k, j])\n"
    )


def test_conv2d_bias_relu_sketches():
    sk = sketches("conv2d_bias_relu")
    assert [s.rules for s in sk] == [
        ("inline(conv2d_bias)", "tile+fuse(conv2d, L1)"),
        ("inline(conv2d_bias)", "tile+fuse(conv2d, L2)"),
        ("inline(conv2d_bias)", "tile(conv2d)"),
    ]
    # batch n has extent 1: left whole, outermost; the rest is SSRSRS over (f, y, x) and (rc, ry, rx)
    ssrsrs = ["n", *tile_order(["f", "y", "x"], ["rc", "ry", "rx"])]
    for level, s in zip((1, 2, None), sk):
        assert s.state.stage("conv2d_bias").compute_at == "inline"
        assert names(s, "conv2d") == ssrsrs
        assert s.tile_extents == (12, 12, 12, 8, 3, 3)
        assert s.tiled == {"conv2d"}
        # the padding has a select: not inlined by the sketch, its place is left to annotation
        assert s.state.stage("conv2d_pad").compute_at == "root" and "conv2d_pad" not in s.fixed
        pad_options = dict(space(s).locations)["conv2d_pad"]
        assert pad_options[:2] == ("root", "inline")
        conv_loops = [f"conv2d/{it}" for it in ssrsrs[:7]]  # the consumer's space loops outside its reduction
        if level is None:
            assert list(pad_options[2:]) == conv_loops
        else:  # and the loops of the stage conv2d is computed in, down to the attach point
            relu_loops = [f"conv2d_relu/{it}" for it in names(s, "conv2d_relu")[: 1 + 3 * level]]
            assert list(pad_options[2:]) == relu_loops + conv_loops
        if level is None:
            assert attach(s, "conv2d") == "root" and attach(s, "conv2d_relu") == "root"
            assert names(s, "conv2d_relu") == ["i0", "i1", "i2", "i3"]
            assert s.fixed == {"conv2d", "conv2d_bias"}
        else:
            assert names(s, "conv2d_relu") == ["i0"] + [f"i{d}.{lv}" for lv in range(level + 1) for d in (1, 2, 3)]
            assert attach(s, "conv2d") == ("conv2d_relu", f"i3.{level - 1}")
            assert s.fixed == {"conv2d", "conv2d_bias", "conv2d_relu"}


def test_softmax_sketches_are_rfactor_choices_on_both_reductions():
    sk = sketches("softmax")
    assert len(sk) == 9
    choices = ("outer", "inner", None)
    expected = [
        tuple(f"rfactor({stage}, {c})" for stage, c in (("softmax_sum", c_sum), ("softmax_max", c_max)) if c)
        for c_sum, c_max in itertools.product(choices, choices)
    ]
    assert [s.rules for s in sk] == expected
    for s in sk:
        assert s.tiled == frozenset()
        assert s.state.stage("softmax_exp").compute_at == "root"  # exp is expensive: never inlined by a rule
        for stage in ("softmax_max", "softmax_sum"):
            rule = next((r for r in s.rules if r.startswith(f"rfactor({stage},")), None)
            has_rf = any(st.name == f"{stage}.rf" for st in s.state.stages)
            assert has_rf == (rule is not None)
            if rule is None:
                assert names(s, stage) == ["i", "k"] and stage not in s.fixed
            elif "outer" in rule:  # partial sums over the outer part: a parallel loop
                assert names(s, f"{stage}.rf") == ["k.0", "i", "k.1"]
                assert names(s, stage) == ["i", "k.0"]
            else:  # partial sums over the inner part, innermost in the .rf stage's space
                assert names(s, f"{stage}.rf") == ["i", "k.1", "k.0"]
                assert names(s, stage) == ["i", "k.1"]
        assert s.tile_extents == (1000,) * len(s.rules)


def test_row_sum_sketches():
    sk = sketches("row_sum")
    assert [s.rules for s in sk] == [("rfactor(row_sum, outer)",), ("rfactor(row_sum, inner)",), ()]
    assert print_state(sk[0].state) == (
        "Placeholder: x\n"
        "for k.0 (0,1000)\n"
        "  for i (0,4)\n"
        "    for k.1 (0,1)\n"
        "      row_sum.rf[k.0, i] += x[i, ((k.0 * 1) + k.1)]\n"
        "for i (0,4)\n"
        "  for k.0 (0,1000)\n"
        "    row_sum[i] += row_sum.rf[k.0, i]\n"
    )
    assert names(sk[1], "row_sum.rf") == ["i", "k.1", "k.0"]
    assert print_state(sk[2].state) == "Placeholder: x\nfor i (0,4)\n  for k (0,1000)\n    row_sum[i] += x[i, k]\n"
    assert [s.tile_extents for s in sk] == [(1000,), (1000,), ()]


def test_small_space_matmul_gets_rfactor_and_tiling_sketches():
    sk = sketches("matmul_small_space")
    assert [s.rules for s in sk] == [
        ("rfactor(C, outer)",),
        ("rfactor(C, inner)",),
        ("cache_write(C)", "tile+fuse(C.local, L1)"),
        ("cache_write(C)", "tile+fuse(C.local, L2)"),
        ("tile(C)",),
    ]
    assert names(sk[0], "C.rf") == ["k.0", "i", "j", "k.1"]
    assert names(sk[1], "C.rf") == ["i", "j", "k.1", "k.0"]
    assert names(sk[4], "C") == tile_order(["i", "j"], ["k"])
    assert [s.tile_extents for s in sk] == [(512,), (512,), (2, 2, 512), (2, 2, 512), (2, 2, 512)]


def test_the_pack_rule_adds_packed_variants_of_the_cache_write_sketches():
    for name in DAGS:
        ansor = [s.rules for s in sketches(name)]
        default = [s.rules for s in sketches(name, pack=True)]
        packed = [r for r in default if any(x.startswith("pack(") for x in r)]
        assert sorted(r for r in default if r not in packed) == sorted(ansor)
        # B of the 2 x 512 . 512 x 2 matmul has rows of 2 elements: contiguous panels already, never packed
        wide = name != "matmul_small_space"
        assert [tuple(x for x in r if not x.startswith("pack(")) for r in packed] == [
            r for r in ansor if wide and r and r[0].startswith("cache_write(")
        ]
        assert all(r[1] == "pack(B for C.local)" for r in packed)


@pytest.mark.parametrize("cores", [1, 4, 64])
def test_sketch_counts_do_not_depend_on_the_core_count_for_these_shapes(cores):
    counts = {name: len(sketches(name, Target(cores=cores))) for name in DAGS}
    assert counts == {"matmul512": 3, "conv2d_bias_relu": 3, "softmax": 9, "row_sum": 3, "matmul_small_space": 5}


def test_every_sketch_places_its_tile_steps_on_splits_of_the_right_extent():
    for name in DAGS:
        for s in sketches(name):
            assert len(s.tile_steps) == len(s.tile_extents)
            for idx, extent in zip(s.tile_steps, s.tile_extents):
                step = s.state.steps[idx]
                assert step.record()[0] == "SP" and all(n == 1 for n in step.lengths)
                before = apply_steps(s.state.dag, s.state.steps[:idx])  # stage ids are those of that moment
                assert before.stages[step.stage_id].name in s.fixed
                assert extent > 1


# ---------------------------------------------------------------------------------------------- golden programs

MATMUL_L1_DECISIONS = Decisions(
    tiles=((4, 8, 4), (2, 4, 16), (8,)),
    parallel=(("C", 2),),
    vectorize=(("C.local", 1), ("C", 1)),
    unroll=(("C.local", 64),),
)

MATMUL_L1_PROGRAM = """\
Placeholder: A, B
parallel i.0@j.0 (0,16)
  C.local auto_unroll: 64
  for i.0 (0,4)
    for j.0 (0,4)
      for i.1 (0,4)
        for j.1 (0,2)
          for k.0 (0,64)
            for i.2 (0,8)
              for j.2 (0,4)
                for k.1 (0,8)
                  for i.3 (0,4)
                    vectorize j.3 (0,16)
                      C.local[i, j] += (A[i, k] * B[k, j])
  for i.1 (0,128)
    for j.1 (0,128)
      C[i, j] = C.local[i, j]
"""

ROW_SUM_DECISIONS = Decisions(
    tiles=((8,),),
    locations=(("row_sum.rf", "row_sum/i"),),
    parallel=(("row_sum", 1),),
    vectorize=(("row_sum.rf", 1),),
    unroll=(("row_sum.rf", 16), ("row_sum", 0)),
)

ROW_SUM_PROGRAM = """\
Placeholder: x
parallel i (0,4)
  row_sum.rf auto_unroll: 16
  for k.0 (0,125)
    for i (0,4)
      for k.1 (0,8)
        row_sum.rf[k.0, i] += x[i, ((k.0 * 8) + k.1)]
  for k.0 (0,125)
    row_sum[i] += row_sum.rf[k.0, i]
"""

SOFTMAX_DECISIONS = Decisions(
    tiles=((8,), (25,)),  # softmax_sum's split (derived first, from the output back), then softmax_max's
    locations=(("softmax_max.rf", "softmax_max/i"), ("softmax_exp", "inline"), ("softmax_sum.rf", "root")),
    parallel=(("softmax_max", 1), ("softmax_sum.rf", 1), ("softmax_sum", 1), ("softmax", 1)),
    vectorize=(("softmax_sum.rf", 1), ("softmax", 1)),  # no legal vector loop (reduce / 1000 > 64): ignored
    unroll=(("softmax_sum.rf", 16),),
)

SOFTMAX_PROGRAM = """\
Placeholder: x
parallel i (0,4)
  for k.0 (0,40)
    for i (0,4)
      for k.1 (0,25)
        softmax_max.rf[k.0, i] max= x[i, ((k.0 * 25) + k.1)]
  for k.0 (0,40)
    softmax_max[i] max= softmax_max.rf[k.0, i]
softmax_sum.rf auto_unroll: 16
parallel k.0 (0,125)
  for i (0,4)
    for k.1 (0,8)
      softmax_sum.rf[k.0, i] += softmax_exp[i, ((k.0 * 8) + k.1)]
parallel i (0,4)
  for k.0 (0,125)
    softmax_sum[i] += softmax_sum.rf[k.0, i]
parallel i0 (0,4)
  for i1 (0,1000)
    softmax[i0, i1] = (softmax_exp[i0, i1] / softmax_sum[i0])
"""


@pytest.mark.parametrize(
    "dag, index, decisions, golden",
    [
        ("matmul512", 0, MATMUL_L1_DECISIONS, MATMUL_L1_PROGRAM),
        ("row_sum", 0, ROW_SUM_DECISIONS, ROW_SUM_PROGRAM),
        ("softmax", 0, SOFTMAX_DECISIONS, SOFTMAX_PROGRAM),
    ],
)
def test_fixed_decisions_give_a_fixed_loop_nest(dag, index, decisions, golden):
    state = materialize(sketches(dag)[index], decisions)
    assert print_state(state) == golden
    assert print_state(materialize(sketches(dag)[index], Decisions.from_json(decisions.to_json()))) == golden


def test_a_location_outside_the_space_is_an_invalid_program():
    sk = sketches("conv2d_bias_relu")[2]
    assert "conv2d_relu/i0" not in dict(space(sk).locations)["conv2d_pad"]
    tiles = tuple((1,) * (len(sk.state.steps[i].lengths)) for i in sk.tile_steps)
    with pytest.raises(InvalidProgram, match="encloses a consumer"):
        materialize(sk, Decisions(tiles, locations=(("conv2d_pad", "conv2d_relu/i0"),)))


# ---------------------------------------------------------------------------------------------- sampling


def sampled(name: str, seed: int, per_sketch: int = 3) -> list[tuple[Sketch, Decisions]]:
    rng = np.random.default_rng(seed)
    out = []
    for s in sketches(name):
        for _ in range(per_sketch):
            try:
                out.append((s, sample(s, rng, CORES)))
            except InvalidProgram:
                continue
    return out


@pytest.mark.parametrize("name", DAGS)
def test_the_same_seed_gives_the_same_decisions(name):
    a, b = sampled(name, 7), sampled(name, 7)
    assert a and [d for _, d in a] == [d for _, d in b]
    assert [d for _, d in a] != [d for _, d in sampled(name, 8)]


@pytest.mark.parametrize("name", DAGS)
def test_decisions_round_trip_through_json(name):
    for _, d in sampled(name, 1):
        text = json.dumps(d.to_json())
        assert Decisions.from_json(json.loads(text)) == d
        hash(d)  # decisions key caches and sets


@pytest.mark.parametrize("name", DAGS)
def test_sampled_programs_replay_from_their_json_step_records(name):
    dag = DAGS[name]
    for s, d in sampled(name, 2):
        state = materialize(s, d)
        records = json.loads(json.dumps([st.record() for st in state.steps]))
        replayed = apply_steps(dag, [step_from_record(r) for r in records])
        assert replayed == state
        assert print_state(replayed) == print_state(state)
        assert program_key(replayed) == program_key(state)


@pytest.mark.parametrize("name", DAGS)
def test_sampled_tiles_are_perfect_factorizations(name):
    for s, d in sampled(name, 3):
        assert len(d.tiles) == len(s.tile_extents)
        for extent, lengths in zip(s.tile_extents, d.tiles):
            assert extent % math.prod(lengths) == 0
            assert lengths[-1] <= MAX_INNERMOST_FACTOR or lengths == (1,) * len(lengths)
        state = materialize(s, d)
        for st in state.stages:  # perfect splits: no loop is rounded up, the iteration count is unchanged
            if not st.op.is_placeholder:
                root = math.prod(st.op.shape) * math.prod(r.extent for r in st.op.reduce_axes)
                assert math.prod(it.extent for it in st.iters) == root, st.name


def brute_force(extent: int, parts: int, max_innermost: int) -> set[tuple[int, ...]]:
    divisors = [d for d in range(1, extent + 1) if extent % d == 0]
    return {t for t in itertools.product(divisors, repeat=parts) if math.prod(t) == extent and t[-1] <= max_innermost}


@pytest.mark.parametrize("extent", [1, 2, 7, 12, 64, 97, 128, 360, 1000])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_factorizations(extent, parts):
    got = factorizations(extent, parts)
    assert len(set(got)) == len(got)
    assert set(got) == brute_force(extent, parts, MAX_INNERMOST_FACTOR)
    for t in got:
        assert len(t) == parts and math.prod(t) == extent and t[-1] <= MAX_INNERMOST_FACTOR
    assert set(factorizations(extent, parts, 4)) == brute_force(extent, parts, 4)


def test_sample_tile_draws_from_the_factorizations():
    rng = np.random.default_rng(0)
    seen = {sample_tile(64, 2, rng) for _ in range(400)}
    assert seen == {t[1:] for t in factorizations(64, 3)}  # uniform over 28 options: all seen in 400 draws
    assert sample_tile(97, 1, rng) == (1,)  # a prime above the innermost limit can only go outermost


def test_the_register_block_is_ordered_by_decreasing_extent_with_the_vector_axis_innermost():
    # a blocked conv's block of 2 channel groups x 14 columns x 16 channels: columns outside channel groups keeps
    # 2 weight vectors live across the block instead of 14 broadcast inputs (which spill next to 28 accumulators)
    data = te.placeholder((1, 32, 14, 14), name="data")
    weight = te.placeholder((2, 32, 3, 3, 16), name="weight")
    dag = ComputeDAG([data, weight, ops.conv2d_nchw_blocked(data, weight, padding=1, name="conv")])
    sk = generate_sketches(dag, TARGET, pack=False)[0]  # tiled, fused into its NCHW copy (test_blocked_view...)
    d = sample(sk, np.random.default_rng(0), CORES)
    assert sk.tile_extents == (2, 14, 14, 16, 32, 3, 3)  # fo, y, x, fi; rc, ry, rx
    tiles = ((1, 1, 2), (14, 1, 1), (1, 1, 14), (1, 1, 16), (32,), (3,), (3,))  # innermost: fo 2, y 1, x 14, fi 16
    state = materialize(sk, Decisions(tiles, d.locations))
    block = [it.name for it in state.stage("conv").iters][-4:]
    assert block == ["x.3", "fo.3", "y.3", "fi.3"]  # 14, 2, 1; fi (contiguous, vectorized) stays innermost
    assert print_state(materialize(sk, Decisions(tiles, d.locations))) == print_state(state)  # replays the same


def _vector_fusions(dag: ComputeDAG, samples: int = 40) -> dict[str, set[int]]:
    """Stage -> the numbers of inner loops its sampled vector loops fused, over every sketch of `dag`."""
    rng, seen = np.random.default_rng(0), {}
    for sk in generate_sketches(dag, TARGET, pack=False):
        for _ in range(samples):
            for stage, n in sample(sk, rng, CORES).vectorize:
                seen.setdefault(stage, set()).add(n)
    return seen


def test_the_vector_loop_fuses_only_loops_every_access_walks_contiguously():
    # the blocked conv's register block: the input is broadcast across output channels (stride 0 along fi, 1 along
    # x), so fusing x (or anything) into the 16-lane fi loop would index the input by lane // 16: never sampled
    data = te.placeholder((1, 32, 14, 14), name="data")
    weight = te.placeholder((2, 32, 3, 3, 16), name="weight")
    seen = _vector_fusions(ComputeDAG([data, weight, ops.conv2d_nchw_blocked(data, weight, padding=1, name="conv")]))
    assert seen["conv"] == {1}
    assert seen["conv_pad"] == {1}  # a padded row (16 wide) is not a straight run of the 14-wide input rows
    assert seen["conv_nchw"] == {1}  # NCHW rows are not a straight run of the 16 channels a block holds per pixel
    # an elementwise op whose inner loops cover whole rows fuses them
    A, B = te.placeholder((1024, 8, 4), name="A"), te.placeholder((1024, 8, 4), name="B")
    add = te.compute((1024, 8, 4), lambda i, j, k: A[i, j, k] + B[i, j, k], name="add")
    assert 2 in _vector_fusions(ComputeDAG([A, B, add]))["add"]
    # GEMM's accumulator: A[i, k] is broadcast along j, so i never joins the vector loop
    assert _vector_fusions(DAGS["matmul512"])["C.local"] == {1}


def test_a_blocked_conv_fuses_into_its_nchw_copy_through_the_blocked_view():
    # conv_nchw[n, f, y, x] = conv[n, f // 16, y, x, f % 16]: the copy splits f into f.0 (f // 16) and f.1 (f % 16),
    # follows the conv's tiles, and the conv's accumulator block lives inside the copy's tile (no whole blocked copy)
    data = te.placeholder((1, 32, 14, 14), name="data")
    weight = te.placeholder((2, 32, 3, 3, 16), name="weight")
    dag = ComputeDAG([data, weight, ops.conv2d_nchw_blocked(data, weight, padding=1, name="conv")])
    sk = generate_sketches(dag, TARGET, pack=False)
    assert [s.rules for s in sk] == [("tile+fuse(conv, L1)",), ("tile+fuse(conv, L2)",), ("tile(conv)",)]
    view = consumer_view(sk[0].state, "conv", "conv_nchw")
    assert view == ConsumerView((("f", 16),), ("n", "f.0", "y", "x", "f.1"))
    assert attach(sk[0], "conv") == ("conv_nchw", "f.1.0") and attach(sk[1], "conv") == ("conv_nchw", "f.1.1")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 32, 14, 14)).astype(np.float32)
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    blocked, want = pack_conv_weight(w), reference_conv2d(x, w, padding=1)
    for k in range(6):
        s = sk[k % 2]
        out = np.full((1, 32, 14, 14), np.nan, np.float32)
        compile_funcs([lower(materialize(s, sample(s, rng, CORES)))])["kernel"](x, blocked, out)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_a_blocked_conv_fuses_through_its_inlined_nchw_copy_into_bias_add_relu():
    # the copy is inlined (a blocked view adds only index arithmetic), so the conv's accumulator tile feeds the bias,
    # the residual add and the ReLU directly: no whole NCHW copy and no second pass over the output. The add reads
    # axes of extent 1 at index 0, as broadcasting converters build it.
    data = te.placeholder((1, 32, 14, 14), name="data")
    weight = te.placeholder((2, 32, 3, 3, 16), name="weight")
    bias, res = te.placeholder((32,), name="bias"), te.placeholder((1, 32, 14, 14), name="res")
    conv = ops.conv2d_nchw_blocked(data, weight, padding=1, name="conv")
    added = te.compute(conv.shape, lambda n, f, y, x: conv[0, f, y, x] + bias[f] + res[0, f, y, x], name="add")
    dag = ComputeDAG([data, weight, bias, res, ops.relu(added, name="relu")])
    sk = generate_sketches(dag, TARGET, pack=False)
    fused = ("inline(add)", "inline(conv_nchw)")
    assert [s.rules for s in sk] == [(*fused, r) for r in ("tile+fuse(conv, L1)", "tile+fuse(conv, L2)", "tile(conv)")]
    assert attach(sk[0], "conv") == ("relu", "i1.1.0") and attach(sk[0], "conv_nchw") == "inline"
    rng = np.random.default_rng(6)
    x, r, w, b = (rng.standard_normal(s).astype(np.float32) for s in (data.shape, res.shape, (32, 32, 3, 3), 32))
    want = np.maximum(reference_conv2d(x, w, padding=1) + b[:, None, None] + r, 0)
    for k in range(6):
        s = sk[k % 3]
        out = np.full((1, 32, 14, 14), np.nan, np.float32)
        compile_funcs([lower(materialize(s, sample(s, rng, CORES)))])["kernel"](x, pack_conv_weight(w), b, r, out)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_consumer_view_refuses_reads_that_are_not_one_element_per_element():
    x = te.placeholder((4, 32), name="x")
    y = te.compute((4, 32), lambda i, j: x[i, j] * 2.0, name="y")

    def view(shape, fcompute):
        z = te.compute(shape, fcompute, name="z")
        return consumer_view(initial_state(ComputeDAG([x, y, z])), "y", "z")

    assert view((4, 32), lambda i, j: y[i, j]) == ConsumerView((), ("i", "j"))
    assert view((4, 2, 16), lambda i, a, b: y[i, a * 16 + b]) is None  # a flat index of several axes
    assert view((2, 32), lambda i, j: y[i, j]) is None  # a slice, not the whole tensor
    assert view((4, 32), lambda i, j: y[i, j // 2]) is None  # j // 2 without its j % 2
    assert view((4, 32), lambda i, j: y[j // 8, j % 8]) is None  # i unused, j split the wrong way
    assert view((4, 32), lambda i, j: y[i, j] + y[i, 31 - j]) is None  # two different reads


def test_with_lanes_the_vector_axis_innermost_tile_is_a_multiple_of_them():
    rng = np.random.default_rng(0)
    assert {sample_tile(16, 3, rng, multiple_of=16)[-1] for _ in range(20)} == {16}
    assert {sample_tile(64, 3, rng, multiple_of=16)[-1] for _ in range(60)} == {16, 32, 64}
    assert len({sample_tile(56, 3, rng, multiple_of=16)[-1] for _ in range(60)}) > 2  # none divides 56: uniform
    sketch = sketches("matmul512")[0]  # C = A·B tiled: of i, j and k only j (the last space axis) is contiguous
    assert sketch.tile_contiguous == (False, True, False)
    for _ in range(10):
        tiles = sample(sketch, rng, CORES, lanes=16).tiles
        j = tiles[sketch.tile_contiguous.index(True)]
        assert j[-1] % 16 == 0
    assert any(t[-1] % 16 for t in (sample(sketch, rng, CORES).tiles[0] for _ in range(20)))  # no lanes: uniform
