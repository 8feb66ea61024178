"""Loop partitioning at split tails (compiler/schedule/partition.py): the main part runs unguarded, every program still
computes what numpy does, and programs whose splits divide their extents lower as before."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import compiler.schedule.lower
from compiler.base import dtypes
from compiler.base.errors import InvalidProgram
from compiler.base.target import Target
from compiler.schedule.loopir import Buffer, For, Func, IfThenElse, Store, seq, walk_stmts
from compiler.schedule.lower import lower
from compiler.schedule.partition import partition_loops
from compiler.targets.cpu.annotate import Decisions, materialize, sample_program
from compiler.targets.cpu.codegen import compile_funcs
from compiler.targets.cpu.sketch import generate_sketches
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops.kernels import KERNELS
from compiler.tensor.te import Const, Var

TARGET = Target(cores=2)


def matmul_dag(n: int, k: int, m: int) -> ComputeDAG:
    A, B = te.placeholder((n, k), name="A"), te.placeholder((k, m), name="B")
    return ComputeDAG([A, B, ops.matmul(A, B, name="C")])


GEMM_1024 = matmul_dag(1024, 1024, 1024)
# 6-row register blocks over 1024 rows (tiles innermost last, the outer length implied): i in 6 parts of 192 rows,
# the last holding 64, j in 8 parts of 128 columns
SIX_ROWS = Decisions(
    tiles=((4, 8, 6), (2, 4, 16), (8,)),
    parallel=(("C", 2),),
    vectorize=(("C.local", 1), ("C", 1)),
    unroll=(("C.local", 64),),
)


def loops(stmt) -> list[For]:
    return [s for s in walk_stmts(stmt) if isinstance(s, For)]


def test_six_row_blocks_over_1024_rows_run_without_guards():
    f = lower(materialize(generate_sketches(GEMM_1024, TARGET)[0], SIX_ROWS))
    assert not [s for s in walk_stmts(f.body) if isinstance(s, IfThenElse)]
    parallel = [s for s in loops(f.body) if s.kind == "parallel"]
    # the 5 whole 192-row parts (times 8 column parts), then the last part's 8 (its rows 960..1023)
    assert [s.extent for s in parallel] == [40, 8]
    # in the last part: 10 whole 6-row blocks (i.1 = 0's 8, i.1 = 1's first 2), then one 4-row block, and no 6-row
    # block past row 1023
    block_rows = sorted(s.extent for s in loops(parallel[1].body) if s.var.name == "i.3")
    # init and update each: a 6-row loop for i.1 = 0, one for i.1 = 1's two whole blocks, one of 4 rows
    assert block_rows == [4, 4, 6, 6, 6, 6]


def test_the_partitioned_program_computes_the_product():
    dag = matmul_dag(100, 24, 48)
    sk = generate_sketches(dag, TARGET)[0]
    d = replace(SIX_ROWS, tiles=((2, 2, 6), (1, 1, 16), (8,)))
    f = lower(materialize(sk, d))
    a, b = np.random.default_rng(0).random((2, 100, 48), np.float32)
    a, b = a[:, :24], b[:24]
    out = np.zeros((100, 48), np.float32)
    compile_funcs([f])["kernel"](np.ascontiguousarray(a), np.ascontiguousarray(b), out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_a_parallel_loop_fused_over_a_row_axis_runs_its_whole_blocks_unguarded():
    # rows in 3 parts of 4 blocks of 10 (2 x 5), the parallel loop fused over the row part, the 3 column parts and
    # the row block: the last row part's blocks 0-1 are whole and 2-3 past row 99, in each column part, so the
    # guards hold for the fused loop's first 26 iterations, then fail and hold again with every column part
    dag = matmul_dag(100, 24, 48)
    sk = next(s for s in generate_sketches(dag, TARGET) if [st.name for st in s.state.stages] == ["A", "B", "C"])
    d = Decisions(tiles=((4, 2, 5), (1, 1, 16), (8,)), parallel=(("C", 3),), vectorize=(("C", 1),), unroll=(("C", 64),))
    f = lower(materialize(sk, d))
    main, tail = [s for s in loops(f.body) if s.kind == "parallel"]
    assert (main.extent, tail.extent) == (24, 11)
    # the tail's iterations test once whether their block is whole (then run it without guards) or holds rows at
    # all (then run it guarded); here none is partial, and the blocks past row 99 do nothing
    switch = tail.body
    assert isinstance(switch, IfThenElse) and not [s for s in walk_stmts(switch.then) if isinstance(s, IfThenElse)]
    assert isinstance(switch.orelse, IfThenElse) and switch.orelse.orelse is None
    a, b = np.random.default_rng(3).random((2, 100, 48), np.float32)
    a, b = np.ascontiguousarray(a[:, :24]), np.ascontiguousarray(b[:24])
    out = np.zeros((100, 48), np.float32)
    compile_funcs([f])["kernel"](a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_a_tail_iteration_is_skipped_only_where_every_store_is_guarded_off():
    # v's row block (v % 5) is whole for v % 5 <= 3 and past the 16 rows at 4: a periodic guard. C's stores are under
    # it, D's are not: the iterations whose block is past the rows still store D
    v, i = Var("v", dtypes.INDEX), Var("i", dtypes.INDEX)
    guard = (v % 5) * 4 + i < 16
    rows = For(i, 4, "serial", IfThenElse(guard, Store("C", v * 4 + i, Const(1.0, "float32"))))
    loop = For(v, 10, "serial", seq(rows, Store("D", v, Const(1.0, "float32"))))
    body = partition_loops(loop, {"v": (0, 9), "i": (0, 3)})
    assert any(isinstance(s, IfThenElse) and s.orelse is not None for s in walk_stmts(body))  # unswitched
    c, d = np.zeros(40, np.float32), np.zeros(10, np.float32)
    params = (Buffer("C", "float32", (40,)), Buffer("D", "float32", (10,)))
    compile_funcs([Func("kernel", params, body)])["kernel"](c, d)
    np.testing.assert_array_equal(c, [float((k // 4) % 5 <= 3) for k in range(40)])
    np.testing.assert_array_equal(d, np.ones(10, np.float32))


def random_lengths(dag: ComputeDAG, seed: int, n: int):
    """`n` sampled programs of `dag` with every tile length redrawn from 1..7, dividing its extent or not."""
    sketches = generate_sketches(dag, TARGET)
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        sk = sketches[len(out) % len(sketches)]
        d, _ = sample_program(sk, rng, TARGET.cores, 8)
        d = replace(d, tiles=tuple(tuple(int(rng.integers(1, 8)) for _ in t) for t in d.tiles))
        try:
            out.append(materialize(sk, d))
        except InvalidProgram:
            continue
    return out


def test_programs_with_tails_everywhere_compute_the_product():
    dag = matmul_dag(37, 29, 53)
    rng = np.random.default_rng(1)
    a, b = rng.random((37, 29), np.float32), rng.random((29, 53), np.float32)
    for state in random_lengths(dag, seed=1, n=16):
        out = np.zeros((37, 53), np.float32)
        compile_funcs([lower(state)])["kernel"](a, b, out)
        np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


CONV = KERNELS["conv2d_bias_relu"]
CONV_DAG = ComputeDAG([t for part in CONV.build() for t in part])


def test_a_conv_with_tails_everywhere_computes_the_convolution():
    arrays = CONV.random_inputs(np.random.default_rng(2))
    (want,) = CONV.reference(*arrays)
    for state in random_lengths(CONV_DAG, seed=2, n=6):
        out = np.zeros(want.shape, np.float32)
        compile_funcs([lower(state)])["kernel"](*arrays, out)
        np.testing.assert_allclose(out, want, rtol=CONV.rtol, atol=CONV.atol)


@pytest.mark.parametrize("dag", [GEMM_1024, CONV_DAG], ids=["gemm_1024", "conv2d_bias_relu"])
def test_programs_whose_tiles_divide_lower_as_without_partitioning(dag, monkeypatch):
    sketches = generate_sketches(dag, TARGET)
    rng = np.random.default_rng(0)
    states = [sample_program(sketches[i % len(sketches)], rng, TARGET.cores, 8)[1] for i in range(24)]
    partitioned = [str(lower(s)) for s in states]
    monkeypatch.setattr(compiler.schedule.lower, "partition_loops", lambda stmt, ranges: stmt)
    assert [str(lower(s)) for s in states] == partitioned
