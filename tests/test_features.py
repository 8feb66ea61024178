"""Per-store features: shape and finiteness on every kernel and random schedules, and the groups that must react to
a schedule change (vectorize, parallel, strides, reuse)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.costs.features import FEATURE_NAMES, GPU_FIELDS, N_FEATURES, FeatureCache, extract, extract_func
from compiler.schedule import hand_schedules
from compiler.schedule.loopir import Allocate, For, Store, walk_stmts
from compiler.schedule.lower import lower
from compiler.schedule.state import apply_steps, initial_state
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.tensor import te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops import KERNELS
from compiler.tensor.ops.linalg import matmul
from tests.strategies import legal_steps

DAGS = {name: ComputeDAG(sum(case.build(), [])) for name, case in KERNELS.items()}
COL = {n: i for i, n in enumerate(FEATURE_NAMES)}


def log2p(x: float) -> float:
    return float(np.log2(1.0 + x))


def named(row: np.ndarray) -> dict[str, float]:
    return dict(zip(FEATURE_NAMES, row.tolist()))


def buffer_slots(row: np.ndarray) -> list[dict[str, float]]:
    """The non-empty buffer slots of a row, each as {field: value}."""
    out = []
    for b in range(5):
        slot = {k[len(f"b{b}_") :]: v for k, v in named(row).items() if k.startswith(f"b{b}_")}
        if slot["read"] or slot["write"] or slot["read_write"]:
            out.append(slot)
    return out


def test_layout():
    assert N_FEATURES == len(FEATURE_NAMES) == 174
    assert FEATURE_NAMES[161:] == GPU_FIELDS
    assert len(set(FEATURE_NAMES)) == N_FEATURES


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_default_schedules_have_finite_features(name):
    x = extract(default_schedule(DAGS[name]))
    assert x.dtype == np.float32 and x.ndim == 2 and x.shape[1] == N_FEATURES
    assert len(x) >= 1
    assert np.isfinite(x).all() and (x >= 0).all()


@pytest.mark.parametrize("name", ["matmul", "conv2d", "softmax", "layer_norm"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_schedules_have_finite_features(name, data):
    state = apply_steps(DAGS[name], data.draw(legal_steps(DAGS[name])))
    x = extract(state)
    assert x.shape[1] == N_FEATURES and x.dtype == np.float32
    assert np.isfinite(x).all() and (x >= 0).all()
    # one-hots: each annotation kind has exactly one position, each buffer slot at most one access type
    for row in x:
        for kind in ("vectorized", "unrolled", "parallel"):
            assert sum(row[COL[f"{kind}_pos_{p}"]] for p in ("none", "inner_spatial", "mixed")) <= 1
            assert sum(v for k, v in named(row).items() if k.startswith(f"{kind}_pos_")) == 1
        for slot in buffer_slots(row):
            assert slot["read"] + slot["write"] + slot["read_write"] == 1
            assert slot["reuse_loop"] + slot["reuse_serial"] + slot["reuse_none"] == 1


def test_invalid_state_has_no_rows():
    X = te.placeholder((8, 16), name="X")
    T1 = te.compute((8, 16), lambda i, j: X[i, j] + 1.0, name="T1")
    T2 = te.compute((8, 16), lambda i, j: T1[i, j] * 2.0, name="T2")
    O = te.compute((8, 16), lambda i, j: T1[i, j] + T2[i, j], name="O")
    # T1 inside T2's loop, but O reads T1 outside it: lowering refuses
    state = initial_state(ComputeDAG([O])).compute_at("T1", "T2", "j")
    assert extract(state).shape == (0, N_FEATURES)


def elementwise(n: int = 64, m: int = 256):
    X = te.placeholder((n, m), name="X")
    return ComputeDAG([te.compute((n, m), lambda i, j: te.exp(X[i, j]) * 2.0 + 1.0, name="Y")])


def test_vectorize_features_follow_the_annotation():
    s = initial_state(elementwise()).split("Y", "j", [8])
    plain, vec = extract(s), extract(s.annotate("Y", "j.1", "vectorize"))
    assert plain.shape == vec.shape == (1, N_FEATURES)
    p, v = named(plain[0]), named(vec[0])
    assert p["vectorized_num"] == 0 and p["vectorized_pos_none"] == 1
    assert v["vectorized_num"] == 1 and v["vectorized_len"] == pytest.approx(log2p(8))
    assert v["vectorized_prod"] == pytest.approx(log2p(8)) and v["vectorized_pos_inner_spatial"] == 1
    assert [s["vector_stride"] for s in buffer_slots(vec[0])] == [1.0, 1.0]  # log2(1 + 1): contiguous lanes
    assert [s["vector_stride"] for s in buffer_slots(plain[0])] == [0.0, 0.0]
    # what the store computes does not change
    assert np.array_equal(plain[0, :16], vec[0, :16])
    assert p["float_mad"] == pytest.approx(log2p(64 * 256)) and p["float_math"] == pytest.approx(log2p(64 * 256))


def test_parallel_and_unroll_features_of_hand_gemm():
    A, B = te.placeholder((256, 256), name="A"), te.placeholder((256, 256), name="B")
    x = extract(hand_schedules.gemm(ComputeDAG([matmul(A, B)])))
    assert len(x) == 4  # pack B, init accumulators, update, copy out
    assert (x[:, COL["parallel_num"]] == 1).all()
    assert x[:, COL["parallel_len"]] == pytest.approx(np.full(4, log2p(256 // 32)))
    update = named(x[2])
    assert update["unrolled_len"] == pytest.approx(log2p(8)) and update["vectorized_len"] == pytest.approx(log2p(32))
    assert update["float_mad"] == pytest.approx(log2p(256**3))
    # the accumulator tile is allocated inside the parallel and i.0 loops: 8x32 floats
    assert update["alloc_bytes"] == pytest.approx(log2p(8 * 32 * 4))
    assert update["alloc_outer_prod"] == pytest.approx(log2p(256 // 32 * 256 // 8))
    # the accumulators are read and written; two stores (init, update) share them inside the i.0 loop
    acc = [s for s in buffer_slots(x[2]) if s["read_write"]]
    assert len(acc) == 1 and acc[0]["unique_bytes"] == pytest.approx(log2p(8 * 32 * 4))


def test_strides_and_reuse_of_a_naive_matmul():
    M, K, N = 32, 64, 40
    A, B = te.placeholder((M, K), name="A"), te.placeholder((K, N), name="B")
    x = extract(initial_state(ComputeDAG([matmul(A, B)])))  # for i, j: init; for k: update
    assert len(x) == 2

    def slot(unique_bytes: int) -> dict[str, float]:
        (found,) = [s for s in buffer_slots(x[1]) if s["unique_bytes"] == pytest.approx(log2p(unique_bytes))]
        return found

    a, b = slot(M * K * 4), slot(K * N * 4)
    assert a["stride"] == pytest.approx(log2p(1))  # A[i, k] walks a row
    assert b["stride"] == pytest.approx(log2p(N))  # B[k, j] walks a column
    assert b["lines"] > a["lines"]  # a column walk touches a new line at every step
    # A is re-read for every j (the loop outside k that A does not depend on), B for every i
    assert a["reuse_loop"] == 1 and a["reuse_ct"] == pytest.approx(log2p(N))
    assert b["reuse_loop"] == 1 and b["reuse_ct"] == pytest.approx(log2p(M))
    out = [s for s in buffer_slots(x[1]) if s["read_write"]][0]
    assert out["reuse_loop"] == 1 and out["reuse_ct"] == pytest.approx(log2p(K))  # C[i, j] stays across k
    assert out["unique_bytes"] == pytest.approx(log2p(M * N * 4))
    assert named(x[1])["outer_prod"] == pytest.approx(log2p(M * N * K))
    assert named(x[1])["num_loops"] == pytest.approx(log2p(3))


def test_op_counts_and_unroll_pragma():
    X = te.placeholder((16, 16), name="X")
    Y = te.compute((16, 16), lambda i, j: te.select(X[i, j] > 0.0, te.sqrt(X[i, j]), X[i, j] / 3.0), name="Y")
    s = initial_state(ComputeDAG([Y]))
    row = named(extract(s)[0])
    n = 16 * 16
    for field in ("float_cmp", "float_math", "float_divmod", "select_op"):
        assert row[field] == pytest.approx(log2p(n)), field
    assert row["float_mad"] == 0 and row["auto_unroll_max_step"] == 0
    assert named(extract(s.pragma_unroll("Y", 64))[0])["auto_unroll_max_step"] == pytest.approx(log2p(64))
    assert named(extract_func(lower(s), 16)[0])["auto_unroll_max_step"] == pytest.approx(log2p(16))


def test_feature_cache():
    dag = elementwise()
    states = [initial_state(dag).split("Y", "j", [f]) for f in (4, 8, 16)]
    keys = [tuple(map(str, s.steps)) for s in states]
    cache = FeatureCache(max_size=2)
    xs = cache.batch(states, keys)
    assert [len(x) for x in xs] == [1, 1, 1] and len(cache) == 2 and cache.misses == 3
    assert keys[0] not in cache  # least recently used left first
    again = cache.get_or_compute(keys[2], states[2])
    assert again is xs[2] and cache.hits == 1 and not again.flags.writeable
    with pytest.raises(ValueError):
        cache.batch(states, keys[:2])


# ---------------------------------------------------------------------------------------------- GPU programs


def _gpu_matmul(spatial, reduce=((4, 2),)):
    from compiler.targets.cuda.schedule_rules import Tiling, multi_level_tile

    return multi_level_tile(initial_state(DAGS["matmul"]), "matmul", Tiling(spatial=spatial, reduce=reduce))


def test_a_cpu_program_has_zero_gpu_features():
    x = extract(default_schedule(DAGS["matmul"]))
    assert not x[:, 161:].any()


def test_gpu_features_name_the_launch_the_bindings_and_shared_memory():
    state = _gpu_matmul(spatial=((1, 4, 1, 2), (2, 4, 1, 1)))
    func = lower(state)
    x = extract(state)
    rows = [named(r) for r in x]
    assert all(r["gpu"] == pytest.approx(log2p(1)) for r in rows)
    launch = {}
    for s in walk_stmts(func.body):
        if isinstance(s, For) and s.kind != "serial":
            launch[s.kind] = max(launch.get(s.kind, 1), s.extent)
    threads = math.prod(v for k, v in launch.items() if k.startswith("threadIdx"))
    blocks = math.prod(v for k, v in launch.items() if k.startswith("blockIdx"))
    shared = sum(a.buffer.size * 4 for a in walk_stmts(func.body) if isinstance(a, Allocate) and a.scope == "shared")
    assert threads > 1 and blocks > 1 and shared > 0
    for r in rows:
        assert r["threads_per_block"] == pytest.approx(log2p(threads))
        assert r["blocks"] == pytest.approx(log2p(blocks))
        assert r["shared_bytes"] == pytest.approx(log2p(shared))
    # the output's store runs inside every bound loop: its extents are the launch's
    out = named(x[-1])
    assert out["blockIdx_x_len"] == pytest.approx(log2p(launch["blockIdx.x"]))
    assert out["threadIdx_x_len"] == pytest.approx(log2p(launch["threadIdx.x"]))


def test_gpu_features_tell_coalesced_from_strided_global_accesses():
    # 8 threads (Tiling: vthread, thread, middle, inner per axis) over the columns j of C[i, j] (row-major):
    # neighbouring threads write neighbouring elements; over the rows i: elements a row apart
    by_columns = _gpu_matmul(spatial=((1, 1, 1, 1), (1, 8, 1, 1)))
    by_rows = _gpu_matmul(spatial=((1, 8, 1, 1), (1, 1, 1, 1)))

    def out_row(state):
        func = lower(state)
        last = [s for s in walk_stmts(func.body) if isinstance(s, Store)][-1].buffer
        assert last == "matmul"
        return named(extract(state)[-1])

    cols, rows = out_row(by_columns), out_row(by_rows)
    assert cols["global_coalesced"] > 0 and cols["global_strided"] == 0
    assert rows["global_strided"] > 0
