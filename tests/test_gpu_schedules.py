"""GPU schedules: random legal GPU schedules and the default GPU schedule of every core kernel, lowered and run in
the GPU interpreter against numpy; the interpreter's own semantics (lock-step barriers, shared memory per block,
local memory per thread, race and divergence errors); the GPU steps' legality and records."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from compiler.base.errors import IllegalStep, LoweringError
from compiler.schedule import gpu_interp
from compiler.schedule.gpu_interp import BarrierDivergence, SharedMemoryRace
from compiler.schedule.loopir import Allocate, Barrier, Buffer, For, Func, IfThenElse, Seq, Store, seq, walk_stmts
from compiler.schedule.lower import lower
from compiler.schedule.state import Annotate, State, apply_steps, initial_state, step_from_record
from compiler.targets.cuda.default_schedule import default_schedule
from compiler.targets.cuda.schedule_rules import (
    GpuParams,
    LaunchResources,
    Tiling,
    anchors,
    bind_2d,
    bind_flat,
    cross_thread_reduce,
    launch_resources,
    multi_level_tile,
    needs_binding,
)
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops import KERNELS

DAGS = {name: ComputeDAG(sum(case.build(), [])) for name, case in KERNELS.items()}
RNG = np.random.default_rng(0)
INPUTS = {name: case.random_inputs(RNG) for name, case in KERNELS.items()}
REFS = {name: case.reference(*INPUTS[name]) for name, case in KERNELS.items()}
MAX_STORES = 150_000  # every thread's stores together; the GPU interpreter runs a few hundred thousand a second


def check_numerics(name: str, state: State) -> None:
    func = lower(state)
    assert all(r.fits(GpuParams()) for r in launch_resources(func)), launch_resources(func)
    dag, case = DAGS[name], KERNELS[name]
    outs = [np.zeros(dag.op(o).shape, np.float32) for o in dag.outputs]
    gpu_interp.run(func, *INPUTS[name], *outs)
    for got, want in zip(outs, REFS[name]):
        np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol, err_msg=str(state))


def store_count(s) -> int:
    """Stores the program executes over all threads (ignoring guards)."""
    if isinstance(s, For):
        return s.extent * store_count(s.body)
    if isinstance(s, Seq):
        return sum(store_count(c) for c in s.stmts)
    if isinstance(s, Allocate):
        return store_count(s.body)
    if isinstance(s, IfThenElse):
        return store_count(s.then) + (store_count(s.orelse) if s.orelse is not None else 0)
    return int(isinstance(s, Store))


# ---------------------------------------------------------------------------------------------- random schedules


@st.composite
def gpu_schedule(draw, dag: ComputeDAG) -> State:
    """A random legal GPU schedule: each elementwise intermediate inlined or not, each GEMM/conv tiled "SSSRRSRS"
    (random vthread, thread, middle and inner tiles; shared inputs or not, fetched in vectors of 1-4; unrolled or
    not; fused into its elementwise consumer or not) or left to the rest: every other stage reduced across a random
    number of threads (a reduction of at most 256 outputs), bound on a 2-D grid of 2-D blocks, or bound flat with a
    random block size and vector width."""
    s = initial_state(dag)
    for stage in reversed(s.stages):
        op = stage.op
        if not (op.is_placeholder or op.reduce_axes or dag.is_output(op.name)) and draw(st.booleans()):
            s = s.compute_inline(op.name)
    for name in anchors(s):
        if not draw(st.booleans()):
            continue
        op = s.stage(name).op
        sizes = (
            st.sampled_from((1, 2)),
            st.sampled_from((1, 2, 4, 8)),
            st.sampled_from((1, 2)),
            st.sampled_from((1, 2, 3)),
        )
        spatial = tuple(tuple(draw(d) for d in sizes) for _ in op.axes)
        reduce = tuple((draw(st.sampled_from((1, 2, 4))), draw(st.sampled_from((1, 3)))) for _ in op.reduce_axes)
        tiling = Tiling(
            spatial,
            reduce,
            shared=draw(st.booleans()),
            vector=draw(st.sampled_from((1, 2, 4))),
            unroll=draw(st.sampled_from((0, 16, 64))),
            fuse_consumer=draw(st.booleans()),
        )
        s = multi_level_tile(s, name, tiling)
    for stage in s.stages:
        if not needs_binding(s, stage.name):
            continue
        outputs = math.prod(stage.op.shape)
        how = draw(st.sampled_from(("flat", "2d", "cross-thread")))
        if how == "cross-thread" and stage.op.reduce_axes and stage.op.axes and outputs <= 256:
            s = cross_thread_reduce(s, stage.name, draw(st.sampled_from((1, 2, 8, 32))))
        elif how == "2d" and len(stage.op.axes) >= 2:
            s = bind_2d(s, stage.name, draw(st.sampled_from((1, 4, 16))), draw(st.sampled_from((1, 3, 8))))
        else:
            threads = draw(st.sampled_from((1, 3, 32, 64, 256)))
            s = bind_flat(s, stage.name, threads, vector=draw(st.sampled_from((1, 2, 4))))
    return s


@pytest.mark.parametrize("name", sorted(KERNELS))
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_gpu_schedule_interpreter(name, data):
    state = data.draw(gpu_schedule(DAGS[name]))
    replayed = apply_steps(DAGS[name], [step_from_record(json.loads(json.dumps(s.record()))) for s in state.steps])
    assert replayed == state  # the step list (the record) is the schedule
    func = lower(state)
    assume(store_count(func.body) <= MAX_STORES and all(r.fits(GpuParams()) for r in launch_resources(func)))
    check_numerics(name, state)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_default_gpu_schedule(name):
    state = default_schedule(DAGS[name])
    assert "threadIdx.x" in str(state)
    check_numerics(name, state)


# ---------------------------------------------------------------------------------------------- steps and lowering


def matmul_tiled() -> State:
    tiling = Tiling(spatial=((1, 4, 1, 2), (2, 4, 1, 1)), reduce=((4, 2),))
    return multi_level_tile(initial_state(DAGS["matmul"]), "matmul", tiling)


def test_state_prints_bindings_and_scopes():
    text = str(matmul_tiled())
    for line in ("blockIdx.x i.0@j.0", "vthread i.1@j.1", "threadIdx.x i.2@j.2", "A.shared[ax0, ax1] = A[ax0, ax1]"):
        assert line in text, text


def test_lowering_fences_the_shared_fills_with_one_pair_of_barriers():
    """A.shared and B.shared, both computed at the outer reduction loop, are filled between one pair of barriers."""
    func = lower(matmul_tiled())
    shared = [s for s in walk_stmts(func.body) if isinstance(s, Allocate) and s.scope == "shared"]
    assert [a.buffer.name for a in shared] == ["A.shared", "B.shared"]
    barrier, fill_a, fill_b, barrier_after, compute = shared[1].body.stmts
    assert isinstance(barrier, Barrier) and isinstance(barrier_after, Barrier)
    for fill, name in ((fill_a, "A.shared"), (fill_b, "B.shared")):
        assert {s.buffer for s in walk_stmts(fill) if isinstance(s, Store)} == {name}
    assert not any(isinstance(s, Barrier) for s in walk_stmts(compute))
    assert sum(isinstance(s, Barrier) for s in walk_stmts(func.body)) == 2
    # the block's 8 rows of A by 8 reduction steps; of B the 4 columns of one virtual thread (a vthread loop runs
    # serially, and the fill sits inside it)
    assert {a.buffer.name: a.buffer.shape for a in shared} == {"A.shared": (8, 8), "B.shared": (8, 4)}
    local = [s for s in walk_stmts(func.body) if isinstance(s, Allocate) and s.scope == "local"]
    assert [(a.buffer.name, a.buffer.shape) for a in local] == [("matmul.local", (2, 1))]


def test_cpu_programs_allocate_globally():
    """A CPU schedule with the same cache stages keeps today's lowering: global buffers, no barriers."""
    s = initial_state(DAGS["matmul"]).cache_write("matmul", "local").cache_read("A", "shared", ["matmul.local"])
    s = s.compute_at("A.shared", "matmul.local", 1)
    func = lower(s)
    assert all(a.scope == "global" for a in walk_stmts(func.body) if isinstance(a, Allocate))
    assert not any(isinstance(b, Barrier) for b in walk_stmts(func.body))


@pytest.mark.parametrize(
    "binding, why",
    [
        (Annotate(2, 2, "threadIdx.x"), "cannot bind reduction iterator k"),
        (Annotate(2, 0, "warp.x"), "unknown annotation"),
    ],
)
def test_illegal_bindings(binding, why):
    with pytest.raises(IllegalStep, match=why):
        apply_steps(DAGS["matmul"], [binding])


def test_a_stage_binds_each_thread_index_once():
    s = initial_state(DAGS["matmul"]).annotate("matmul", 0, "threadIdx.x")
    with pytest.raises(IllegalStep, match="already binds i to threadIdx.x"):
        s.annotate("matmul", 1, "threadIdx.x")


def test_lowering_rejects_meaningless_bindings():
    s = initial_state(DAGS["matmul"]).cache_write("matmul", "local")
    s = s.annotate("matmul", 0, "blockIdx.x").compute_at("matmul.local", "matmul", 1)
    with pytest.raises(LoweringError, match="only a stage at the root binds the grid"):
        lower(s.annotate("matmul.local", 1, "blockIdx.y"))
    with pytest.raises(LoweringError, match="only a stage in shared memory is computed cooperatively"):
        lower(s.annotate("matmul.local", 1, "threadIdx.x"))


def test_gpu_records_round_trip():
    state = matmul_tiled()
    lines = [json.dumps(s.record()) for s in state.steps]
    assert '["AN", 5, 0, "blockIdx.x"]' in lines and '["CHR", 0, "shared", [2]]' in lines
    assert apply_steps(DAGS["matmul"], [step_from_record(json.loads(line)) for line in lines]) == state


# ---------------------------------------------------------------------------------------------- the interpreter

TX, BX = te.Var("tx"), te.Var("bx")
ZERO = te.Const(0)


def kernel(body, *params: Buffer) -> Func:
    return Func("k", params, body)


def threads(n: int, body) -> For:
    return For(TX, n, "threadIdx.x", body)


def test_shared_memory_is_one_buffer_per_block_and_barriers_order_it():
    """Each thread writes its slot, then (after the barrier) reads its neighbour's: a rotation within each block."""
    S = Buffer("S", "float32", (4,))
    out = Buffer("out", "float32", (8,))
    body = For(
        BX,
        2,
        "blockIdx.x",
        threads(
            4,
            Allocate(
                S,
                seq(
                    Store("S", TX, te.cast("float32", BX * 10 + TX)),
                    Barrier(),
                    Store("out", BX * 4 + TX, te.Load("S", ((TX + 1) % 4,), "float32")),
                ),
                "shared",
            ),
        ),
    )
    result = np.zeros(8, np.float32)
    gpu_interp.run(kernel(body, out), result)
    np.testing.assert_array_equal(result, [1, 2, 3, 0, 11, 12, 13, 10])


def test_local_memory_is_one_buffer_per_thread():
    L = Buffer("L", "float32", (1,))
    out = Buffer("out", "float32", (4,))
    body = threads(
        4,
        Allocate(
            L,
            seq(Store("L", ZERO, te.cast("float32", TX)), Store("out", TX, te.Load("L", (ZERO,), "float32"))),
            "local",
        ),
    )
    result = np.zeros(4, np.float32)
    gpu_interp.run(kernel(body, out), result)
    np.testing.assert_array_equal(result, [0, 1, 2, 3])


def test_a_missing_barrier_is_a_race_on_the_shared_buffer():
    S = Buffer("S", "float32", (4,))
    out = Buffer("out", "float32", (4,))
    body = threads(
        4,
        Allocate(
            S,
            seq(Store("S", TX, te.cast("float32", TX)), Store("out", TX, te.Load("S", ((TX + 1) % 4,), "float32"))),
            "shared",
        ),
    )
    with pytest.raises(SharedMemoryRace, match=r"race on S\[1\] in block \(0, 0, 0\): thread \(0, 0, 0\) read it"):
        gpu_interp.run(kernel(body, out), np.zeros(4, np.float32))


def test_two_threads_writing_one_shared_element_race():
    S = Buffer("S", "float32", (1,))
    out = Buffer("out", "float32", (1,))
    body = threads(2, Allocate(S, Store("S", ZERO, te.cast("float32", TX)), "shared"))
    with pytest.raises(SharedMemoryRace, match=r"S\[0\].*thread \(0, 0, 0\) wrote it, and so did thread \(1, 0, 0\)"):
        gpu_interp.run(kernel(body, out), np.zeros(1, np.float32))


def test_a_barrier_some_threads_skip_is_divergence():
    out = Buffer("out", "float32", (4,))
    body = threads(4, seq(IfThenElse(TX < 2, Barrier()), Store("out", TX, te.const(1.0, "float32"))))
    with pytest.raises(
        BarrierDivergence, match=r"thread \(0, 0, 0\) reached barrier #0 of launch 0 but thread \(2, 0, 0\) finished"
    ):
        gpu_interp.run(kernel(body, out), np.zeros(4, np.float32))


def test_threads_past_a_shorter_loop_skip_its_body():
    """A loop bound to threadIdx.x with fewer iterations than the block runs only on the first threads."""
    out = Buffer("out", "float32", (8,))
    inner = te.Var("t2")
    body = threads(
        8,
        seq(
            Store("out", TX, te.const(1.0, "float32")),
            For(inner, 3, "threadIdx.x", Store("out", inner, te.const(2.0, "float32"))),
        ),
    )
    result = np.zeros(8, np.float32)
    gpu_interp.run(kernel(body, out), result)
    np.testing.assert_array_equal(result, [2, 2, 2, 1, 1, 1, 1, 1])


def test_a_shared_fill_reuses_its_consumers_thread_index():
    """The fill's loop bound to threadIdx.x inside the consumer's becomes the consumer's variable (hardware has one
    threadIdx.x), guarded where the fill has fewer iterations than the block has threads."""
    func = lower(matmul_tiled())
    assert [s.extent for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == "threadIdx.x"] == [16]


def test_a_fill_longer_than_its_block_is_rejected():
    s = initial_state(DAGS["matmul"]).cache_write("matmul", "local").cache_read("A", "shared", ["matmul.local"])
    s = s.split("matmul", 0, [4]).annotate("matmul", 1, "threadIdx.x").compute_at("matmul.local", "matmul", 1)
    s = s.compute_at("A.shared", "matmul.local", 1).split("A.shared", 1, [8]).annotate("A.shared", 2, "threadIdx.x")
    with pytest.raises(LoweringError, match="has extent 8 inside loop .* bound to it with extent 4"):
        lower(s)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_default_gpu_schedule_assembles(name):
    """The CUDA code generator turns every default GPU schedule into PTX that ptxas accepts for sm_90."""
    codegen = pytest.importorskip("compiler.targets.cuda.codegen")
    from compiler.base.errors import MissingExtra
    from compiler.targets.cuda import ptx

    try:
        ptx.find_ptxas()
    except MissingExtra as e:
        pytest.skip(str(e))
    program = codegen.compile_func(lower(default_schedule(DAGS[name]), name))
    for kernel in program.kernels:
        _, report = ptx.assemble(kernel.ptx, kernel.name, "sm_90")
        assert report.shared_bytes <= GpuParams().max_shared_bytes and not report.spills, report


def test_a_one_element_fill_runs_on_one_thread():
    """A fill whose thread loop shrinks to one iteration is still bound: thread 0 writes the element, not every
    thread of the block (a race)."""
    s = initial_state(DAGS["matmul"]).cache_write("matmul", "local").cache_read("B", "shared", ["matmul.local"])
    s = s.split("matmul", 0, [4]).annotate("matmul", 0, "blockIdx.x").annotate("matmul", 1, "threadIdx.x")
    s = s.compute_at("matmul.local", "matmul", 1).compute_at("B.shared", "matmul.local", 2)
    s = s.fuse("B.shared", [0, 1]).split("B.shared", 0, [4]).annotate("B.shared", 1, "threadIdx.x")
    fill = [a for a in walk_stmts(lower(s).body) if isinstance(a, Allocate) and a.scope == "shared"][0].body.stmts[1]
    assert isinstance(fill, IfThenElse) and str(fill.cond) == "(i.1 < 1)", fill
    check_numerics("matmul", s)


def test_default_schedule_shrinks_its_tiles_to_fit_shared_memory():
    params = GpuParams(max_shared_bytes=1024)
    state = default_schedule(DAGS["conv2d"], params)
    assert [r.fits(params) for r in launch_resources(lower(state))] == [True]
    assert [
        r.fits(GpuParams(max_shared_bytes=1024)) for r in launch_resources(lower(default_schedule(DAGS["conv2d"])))
    ] == [False]
    check_numerics("conv2d", state)


@pytest.mark.parametrize("name", sorted(KERNELS))
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_gpu_schedule_assembles(name, data):
    """Random GPU schedules go through the CUDA code generator to PTX that ptxas accepts."""
    codegen = pytest.importorskip("compiler.targets.cuda.codegen")
    from compiler.base.errors import MissingExtra
    from compiler.targets.cuda import ptx

    try:
        ptx.find_ptxas()
    except MissingExtra as e:
        pytest.skip(str(e))
    func = lower(data.draw(gpu_schedule(DAGS[name])), name)
    assume(all(r.fits(GpuParams()) for r in launch_resources(func)))
    for kernel in codegen.compile_func(func).kernels:
        ptx.assemble(kernel.ptx, kernel.name, "sm_90")


def test_a_few_long_rows_are_reduced_across_threads():
    """row_sum's 64 rows of 200: a block per row, 128 threads summing every 128th term into shared memory, then
    thread 0 the 128 partial sums."""
    func = lower(default_schedule(DAGS["row_sum"]))
    shared = [(a.buffer.name, a.buffer.shape) for a in walk_stmts(func.body) if isinstance(a, Allocate)]
    assert shared == [("row_sum.rf", (1, 128))]
    assert launch_resources(func) == [LaunchResources(threads=128, blocks=64, shared_bytes=512)]
    check_numerics("row_sum", default_schedule(DAGS["row_sum"]))


def small_matmul_tiled() -> Func:
    """C = A @ B, 8x12 by 12x8: blocks of 4x2 outputs (2 threads of 2 rows by 2 threads), 2 virtual threads of 2
    columns each, reduction steps of 2 through shared tiles."""
    A, B = te.placeholder((8, 12), name="A"), te.placeholder((12, 8), name="B")
    dag = ComputeDAG([A, B, ops.matmul(A, B, name="C")])
    return lower(multi_level_tile(initial_state(dag), "C", Tiling(((1, 2, 1, 2), (2, 2, 1, 1)), ((2, 1),))))


# Each reduction step k.0: barrier, the block's 4 threads fill A's 4x2 tile (two rounds) and the virtual thread's
# 2x2 tile of B, barrier, then each thread accumulates its 2 rows in local memory.
SMALL_MATMUL_TILED = """\
def kernel(A: float32[8, 12], B: float32[12, 8], C: float32[8, 8]):
  for i.0@j.0 in range(4):  # blockIdx.x
    for i.1@j.1 in range(2):  # vthread
      for i.2@j.2 in range(4):  # threadIdx.x
        C.local = alloc(float32[2, 1], local)
        for i.1 in range(2):
          C.local[i.1] = 0.0f
        for k.0 in range(6):
          A.shared = alloc(float32[4, 2], shared)
          B.shared = alloc(float32[2, 2], shared)
          barrier()
          for ax0@ax1.0 in range(2):
            A.shared[(((ax0@ax1.0 * 4) + ((i.2@j.2 // 2) * 2)) + (i.2@j.2 % 2))] = A[((((((i.0@j.0 // 2) * 48) + (ax0@ax1.0 * 24)) + ((i.2@j.2 // 2) * 12)) + (k.0 * 2)) + (i.2@j.2 % 2))]
          B.shared[(((i.2@j.2 // 2) * 2) + (i.2@j.2 % 2))] = B[(((((k.0 * 16) + ((i.2@j.2 // 2) * 8)) + ((i.0@j.0 % 2) * 4)) + (i.1@j.1 * 2)) + (i.2@j.2 % 2))]
          barrier()
          for k.1 in range(2):
            for i.1 in range(2):
              C.local[i.1] = (C.local[i.1] + (A.shared[((((i.2@j.2 // 2) * 4) + (i.1 * 2)) + k.1)] * B.shared[((k.1 * 2) + (i.2@j.2 % 2))]))
        for i.3 in range(2):
          C[(((((((i.0@j.0 // 2) * 32) + ((i.2@j.2 // 2) * 16)) + (i.3 * 8)) + ((i.0@j.0 % 2) * 4)) + (i.1@j.1 * 2)) + (i.2@j.2 % 2))] = C.local[i.3]
"""  # noqa: E501 - golden text, one loop IR line


def test_golden_tiled_matmul():
    func = small_matmul_tiled()
    assert str(func) == SMALL_MATMUL_TILED
    a, b = (np.random.default_rng(2).standard_normal(shape).astype(np.float32) for shape in ((8, 12), (12, 8)))
    c = np.zeros((8, 8), np.float32)
    gpu_interp.run(func, a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_two_gemms_reading_one_input_share_nothing_but_the_input():
    """C1 = A @ B and C2 = A @ D in one task: A gets one shared cache (in C1's tiles), C2 reads A from global memory."""
    A, B, D = te.placeholder((8, 12), name="A"), te.placeholder((12, 8), name="B"), te.placeholder((12, 4), name="D")
    state = default_schedule(ComputeDAG([A, B, D, ops.matmul(A, B, name="C1"), ops.matmul(A, D, name="C2")]))
    assert [s.name for s in state.stages if s.scope == "shared"] == ["A.shared", "B.shared", "D.shared"]
    a, b, d = (np.random.default_rng(3).standard_normal(t.shape).astype(np.float32) for t in (A, B, D))
    c1, c2 = np.zeros((8, 8), np.float32), np.zeros((8, 4), np.float32)
    gpu_interp.run(lower(state), a, b, d, c1, c2)
    np.testing.assert_allclose(c1, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c2, a.astype(np.float64) @ d, rtol=1e-5, atol=1e-5)
