"""Integer kernels (compiler.tensor.ops.int8_matmul, codegen.dot4): u8 x s8 -> s32 matmuls and convs bit-exact
against integer numpy, through vpdpbusd (AVX512-VNNI), the exact vpmaddubsw form (VNNI turned off with
TILEFARM_CPU_FEATURES) and generic code, with zero points, K not a multiple of 4 and N not a multiple of 16."""

from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np
import pytest

from compiler.base.target import Target
from compiler.schedule.lower import lower
from compiler.targets.cpu.annotate import RegisterFile, sample_program
from compiler.targets.cpu.codegen import assembly, compile_funcs
from compiler.targets.cpu.codegen.dot4 import Dot4ISA
from compiler.targets.cpu.default_schedule import _dot_tile, default_schedule
from compiler.targets.cpu.host import FEATURES_ENV, host, vector_registers
from compiler.targets.cpu.sketch import generate_sketches
from compiler.tensor import te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops.int8_matmul import (
    DOT,
    int8_conv2d_nchwc,
    int8_matmul,
    pack_int8_conv_weight,
    pack_int8_weight,
)
from compiler.tensor.ops.kernels import reference_conv2d

HOST_ISA = Dot4ISA.of(host().features)


@contextmanager
def host_with(features: str):
    """host() as TILEFARM_CPU_FEATURES=`features` makes it (the cached host is restored after)."""
    old = os.environ.get(FEATURES_ENV)
    os.environ[FEATURES_ENV] = features
    host.cache_clear()
    try:
        yield host()
    finally:
        if old is None:
            del os.environ[FEATURES_ENV]
        else:
            os.environ[FEATURES_ENV] = old
        host.cache_clear()


def reference(a: np.ndarray, w: np.ndarray, a_zero, w_zero) -> np.ndarray:
    """MatMulInteger in int64: (a - a_zero) @ (w - w_zero), a_zero per row or one, w_zero per column or one."""
    za = np.asarray(a_zero, np.int64).reshape(-1, 1) if np.ndim(a_zero) else np.int64(a_zero)
    zw = np.asarray(w_zero, np.int64).reshape(1, -1) if np.ndim(w_zero) else np.int64(w_zero)
    out = (a.astype(np.int64) - za) @ (w.astype(np.int64) - zw)
    assert np.abs(out).max(initial=0) < 2**31
    return out.astype(np.int32)


def build(a: np.ndarray, w: np.ndarray, a_zero=0, w_zero=0, runtime_zero: bool = False):
    """The int8_matmul DAG of a (M x K) and w (K x N) with its zero points, and the arrays to call it with."""
    M, N = a.shape[0], w.shape[1]
    pk = pack_int8_weight(w, w_zero, None if runtime_zero else int(a_zero), a.dtype.name)
    ins = [te.placeholder(a.shape, a.dtype.name, "A"), te.placeholder(pk.packed.shape, "int8", "W")]
    arrays = [a, pk.packed]
    ins.append(te.placeholder((N,), "int32", "col"))
    arrays.append(pk.col)
    az = ws = wz = None
    if runtime_zero:
        za = np.asarray(a_zero, a.dtype).reshape(np.shape(a_zero))
        az, ws = te.placeholder(za.shape, a.dtype.name, "a_zero"), te.placeholder((N,), "int32", "w_sum")
        ins += [az, ws]
        arrays += [za, pk.w_sum]
    if pk.w_zero is not None:
        wz = te.placeholder((N,), "int32", "w_zero")
        ins.append(wz)
        arrays.append(pk.w_zero)
    out = int8_matmul(ins[0], ins[1], ins[2], az, ws, wz, n=N)
    assert out.shape == (M, N) and out.dtype == "int32"
    return ComputeDAG([*ins, out]), arrays


def run(dag: ComputeDAG, state, arrays, target: Target | None = None) -> tuple[np.ndarray, str]:
    """The kernel's result and its assembly."""
    func = lower(state, "k")
    out = np.zeros(dag.op(dag.outputs[0]).shape, np.int32)
    compile_funcs([func], target)["k"](*arrays, out)
    return out, assembly([func], target)


def random_case(rng, M, K, N, a_dtype="uint8", w_dtype="int8"):
    info = np.iinfo(a_dtype), np.iinfo(w_dtype)
    a = rng.integers(info[0].min, info[0].max, (M, K), dtype=a_dtype, endpoint=True)
    w = rng.integers(info[1].min, info[1].max, (K, N), dtype=w_dtype, endpoint=True)
    return a, w


def test_pack_layout_and_sums():
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 127, (10, 20), dtype=np.int8, endpoint=True)
    pk = pack_int8_weight(w, w_zero=3, a_zero=5)
    assert pk.packed.shape == (3, 32, DOT) and pk.packed.dtype == np.int8 and pk.packed.flags.c_contiguous
    for k in range(12):
        for n in range(32):
            want = w[k, n] if k < 10 and n < 20 else 0
            assert pk.packed[k // DOT, n, k % DOT] == want
    w_sum = w.astype(np.int64).sum(axis=0)
    np.testing.assert_array_equal(pk.w_sum, w_sum)
    np.testing.assert_array_equal(pk.w_zero, np.full(20, 3))
    np.testing.assert_array_equal(pk.col, -5 * w_sum + 10 * 5 * 3)
    # a uint8 weight is stored shifted to int8, its zero point with it; an int8 activation moves its zero point +128
    wu = rng.integers(0, 255, (10, 20), dtype=np.uint8, endpoint=True)
    pu = pack_int8_weight(wu, w_zero=128, a_zero=-2, a_dtype="int8")
    assert pu.packed[0, 0, 0] == int(wu[0, 0]) - 128 and pu.w_zero is None
    np.testing.assert_array_equal(pu.col, -126 * (wu.astype(np.int64) - 128).sum(axis=0))


CASES = [
    # M, K, N, activation dtype, weight dtype, a_zero, w_zero, a_zero given at run time
    (16, 64, 32, "uint8", "int8", 0, 0, False),
    (16, 64, 32, "uint8", "int8", 131, 0, False),
    (7, 37, 40, "uint8", "int8", 17, 0, False),  # odd K (a tail of 1), N not a multiple of 16
    (5, 3, 20, "uint8", "int8", 9, 0, False),  # K below 4: the tail alone
    (33, 130, 72, "uint8", "int8", 255, -4, False),  # a weight zero point: the row-sum term
    (12, 66, 48, "int8", "int8", -7, 0, False),  # s8 activations, shifted by +128
    (12, 66, 48, "int8", "uint8", 5, 121, False),  # ... against a u8 weight, shifted by -128
    (9, 41, 24, "uint8", "int8", 200, 0, True),  # a run-time zero point
    (9, 41, 24, "uint8", "int8", "rows", "cols", True),  # per-row activation and per-column weight zero points
]


@pytest.mark.parametrize("M, K, N, a_dtype, w_dtype, a_zero, w_zero, runtime", CASES)
def test_default_schedule_exact(M, K, N, a_dtype, w_dtype, a_zero, w_zero, runtime):
    rng = np.random.default_rng(M * K + N)
    a, w = random_case(rng, M, K, N, a_dtype, w_dtype)
    if a_zero == "rows":
        a_zero = rng.integers(0, 255, M, dtype=np.uint8, endpoint=True)
    if w_zero == "cols":
        w_zero = rng.integers(-128, 127, N, dtype=np.int8, endpoint=True)
    dag, arrays = build(a, w, a_zero, w_zero, runtime)
    got, asm = run(dag, default_schedule(dag), arrays)
    np.testing.assert_array_equal(got, reference(a, w, a_zero, w_zero))
    if HOST_ISA.vnni512 and K >= DOT:
        assert "vpdpbusd" in asm


def _extremes(K: int, N: int) -> tuple[np.ndarray, np.ndarray]:
    """Activations 255 and weights -128 / 127 in long runs: every pair sum of vpmaddubsw would saturate."""
    a = np.full((8, K), 255, np.uint8)
    a[1::2, ::3] = 0
    w = np.where(np.arange(N)[None, :] % 3 == 0, -128, 127).astype(np.int8) * np.ones((K, 1), np.int8)
    w[::5] = -128
    return a, w


@pytest.mark.parametrize(
    "features, instruction, needs",
    [
        ("", "vpdpbusd", "vnni512"),
        ("-avx512vnni", "vpmaddubsw", "bw512"),  # the exact no-VNNI form, zmm
        ("-avx512f", "vpmaddubsw", "avx2"),  # AVX2: 8 lanes, ymm
    ],
)
def test_isa_paths_exact(features, instruction, needs):
    if features and "+" + features[1:] not in host().features.split(","):
        pytest.skip(f"this host has no {features[1:]} to turn off")
    if instruction == "vpmaddubsw" and "+avxvnni" in host().features.split(","):
        features += ",-avxvnni"  # AVX-VNNI (an Intel core since Alder Lake) keeps vpdpbusd on ymm otherwise
    with host_with(features) as target:
        isa = Dot4ISA.of(target.features)
        if not getattr(isa, needs):
            pytest.skip(f"this host's dot-product form with TILEFARM_CPU_FEATURES={features!r} is not {instruction}")
        if instruction == "vpmaddubsw" and (isa.vnni256 if needs == "avx2" else isa.vnni512):
            pytest.skip("VNNI is still on with these features")
        rng = np.random.default_rng(3)
        for a, w in (random_case(rng, 24, 99, 56), _extremes(260, 48)):
            dag, arrays = build(a, w, 3, 0)
            got, asm = run(dag, default_schedule(dag, target), arrays, target)
            np.testing.assert_array_equal(got, reference(a, w, 3, 0))
            assert instruction in asm
            if instruction != "vpdpbusd":
                assert "vpdpbusd" not in asm
            if needs == "avx2":
                assert "zmm" not in asm


def test_sketch_programs_exact():
    """Random programs of the tuner's sketches: exact, and the ones vectorizing whole 16-column blocks use VNNI."""
    rng = np.random.default_rng(5)
    a, w = random_case(rng, 32, 70, 48)
    dag, arrays = build(a, w, 11, 0)
    want = reference(a, w, 11, 0)
    target = host()
    registers = RegisterFile(32 if target.has("avx512f") else 16, max(1, target.vector_bytes // 4))
    sketches = generate_sketches(dag, target)
    assert sketches
    used_dot = 0
    for i in range(8):
        sketch = sketches[i % len(sketches)]
        _, state = sample_program(sketch, rng, target.cores, registers.lanes, registers)
        got, asm = run(dag, state, arrays)
        np.testing.assert_array_equal(got, want, err_msg=str(state))
        used_dot += "vpdpbusd" in asm
    if HOST_ISA.vnni512:
        assert used_dot > 0


def test_mismatched_bytes_stay_generic():
    """Products whose activation byte j meets weight byte 3 - j are not a dot4: generic code, still exact."""
    rng = np.random.default_rng(7)
    a, w = random_case(rng, 8, 32, 32)
    pk = pack_int8_weight(w)
    A, W = te.placeholder(a.shape, "uint8", "A"), te.placeholder(pk.packed.shape, "int8", "W")
    ko = te.reduce_axis(8, "ko")

    def body(m, n):
        terms = [te.cast("int32", A[m, ko * 4 + j]) * te.cast("int32", W[ko, n, 3 - j]) for j in range(4)]
        return te.sum(terms[0] + terms[1] + terms[2] + terms[3], axis=ko)

    out = te.compute((8, 32), body, "crossed")
    dag = ComputeDAG([A, W, out])
    got, asm = run(dag, default_schedule(dag), [a, pk.packed])
    crossed = pk.packed[:, :, ::-1].transpose(0, 2, 1).reshape(32, 32)
    np.testing.assert_array_equal(got, reference(a, crossed, 0, 0))
    assert "vpdpbusd" not in asm and "vpmaddubsw" not in asm


@pytest.mark.parametrize(
    "C, F, H, stride, pad, a_zero",
    [
        (16, 32, 10, 1, 0, 5),
        (16, 32, 10, 1, 1, 0),
        (61, 40, 15, 2, 1, 200),  # channels not multiples of 4 / 16, stride 2, the padding the zero point
        (8, 16, 7, 1, 2, 255),
        (16, 64, 7, 1, 1, 3),  # a 7-wide row: 2 of the 4 channel blocks in the accumulator tile
    ],
)
def test_conv_nchwc_exact(C, F, H, stride, pad, a_zero):
    """ConvInteger in the dot-product form: NCHW4c u8 data, the weight packed F/16 x C/4 x 3 x 3 x 16 x 4."""
    rng = np.random.default_rng(C + F + H)
    x = rng.integers(0, 255, (1, C, H, H), dtype=np.uint8, endpoint=True)
    w = rng.integers(-128, 127, (F, C, 3, 3), dtype=np.int8, endpoint=True)
    wp, col = pack_int8_conv_weight(w, a_zero)
    c4 = wp.shape[1]
    xb = np.full((1, c4 * DOT, H, H), a_zero, np.uint8)  # channels past C hold the zero point: they add nothing
    xb[:, :C] = x
    xb = np.ascontiguousarray(xb.reshape(1, c4, DOT, H, H).transpose(0, 1, 3, 4, 2))
    ins = [te.placeholder(xb.shape, "uint8", "data"), te.placeholder(wp.shape, "int8", "W")]
    ins.append(te.placeholder(col.shape, "int32", "col"))
    out = int8_conv2d_nchwc(*ins, stride=stride, padding=pad, a_zero=a_zero)
    dag = ComputeDAG([*ins, out])
    got, asm = run(dag, default_schedule(dag), [xb, wp, col])
    want = reference_conv2d(x.astype(np.int64) - a_zero, w.astype(np.int64), stride, pad)
    nchw = got.transpose(0, 1, 4, 2, 3).reshape(1, -1, *got.shape[2:4])[:, :F]
    np.testing.assert_array_equal(nchw, want.astype(np.int64))
    if HOST_ISA.vnni512:
        assert "vpdpbusd" in asm


def test_conv_tile_holds_channel_blocks():
    """The default schedule's accumulator tile of an int8 conv: as many of the 16 zmm accumulators as the output
    row and channel blocks divide into, then the fewest loads (a data broadcast per column, a weight vector per
    block); a 7 x 7 x 512 layer's 7 columns take 2 channel blocks (14 accumulators)."""
    assert _dot_tile(7, 32, 16) == (7, 2)
    assert _dot_tile(56, 4, 16) == (4, 4)  # 8 loads per step, where 14 x 1 took 15
    assert _dot_tile(14, 16, 16) == (7, 2)
    assert _dot_tile(9, 1, 16) == (9, 1)
    assert _dot_tile(8, 3, 10) == (8, 1)  # AVX2's 10 accumulators; 3 blocks take no group
    ins = [te.placeholder((1, 4, 9, 9, DOT), "uint8", "data"), te.placeholder((4, 4, 3, 3, 16, 4), "int8", "W")]
    ins.append(te.placeholder((64,), "int32", "col"))
    dag = ComputeDAG([*ins, int8_conv2d_nchwc(*ins, a_zero=3)])
    nest = str(default_schedule(dag, host()))
    if vector_registers(host()) >= 32:
        assert "unroll fo.1 (0,2)" in nest and "unroll ox.1 (0,7)" in nest, nest


def test_conv_sketch_programs_exact():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 255, (1, 16, 12, 12), dtype=np.uint8, endpoint=True)
    w = rng.integers(-128, 127, (32, 16, 3, 3), dtype=np.int8, endpoint=True)
    wp, col = pack_int8_conv_weight(w, 7)
    xb = np.ascontiguousarray(x.reshape(1, 4, DOT, 12, 12).transpose(0, 1, 3, 4, 2))
    ins = [te.placeholder(xb.shape, "uint8", "data"), te.placeholder(wp.shape, "int8", "W")]
    ins.append(te.placeholder(col.shape, "int32", "col"))
    dag = ComputeDAG([*ins, int8_conv2d_nchwc(*ins, padding=1, a_zero=7)])
    want = reference_conv2d(x.astype(np.int64) - 7, w.astype(np.int64), 1, 1)
    target = host()
    registers = RegisterFile(32 if target.has("avx512f") else 16, max(1, target.vector_bytes // 4))
    sketches = generate_sketches(dag, target)
    used_dot = 0
    for i in range(6):
        _, state = sample_program(sketches[i % len(sketches)], rng, target.cores, registers.lanes, registers)
        got, asm = run(dag, state, [xb, wp, col])
        np.testing.assert_array_equal(got.transpose(0, 1, 4, 2, 3).reshape(1, 32, 12, 12), want, err_msg=str(state))
        used_dot += "vpdpbusd" in asm
    if HOST_ISA.vnni512:
        assert used_dot > 0
