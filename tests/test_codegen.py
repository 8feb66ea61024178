"""CPU codegen: hand-built loop IR run through the LLVM JIT and checked against numpy."""

import ctypes
import math

import numpy as np
import pytest

from compiler.base.errors import BuildError
from compiler.base.target import Target
from compiler.schedule.loopir import Allocate, Buffer, For, Func, IfThenElse, Store, seq
from compiler.targets import host_target
from compiler.targets.cpu import codegen
from compiler.targets.cpu.codegen.lanes import vectorizable
from compiler.tensor.te import Binary, Cast, Const, Expr, Load, Select, Unary, Var

RNG = np.random.default_rng(0)
INTS = ("int8", "uint8", "int32", "int64")
FLOATS = ("float32", "float64")
i, j, k = Var("i"), Var("j"), Var("k")


def c(x: int) -> Const:
    return Const(x)


def ld(buf: Buffer, index: Expr) -> Load:
    return Load(buf.name, (index,), buf.dtype)


def kernel(*params: Buffer, body, name="k"):
    return codegen.compile_funcs([Func(name, params, body)])[name]


def data(dtype: str, shape, low=-50, high=50, nonzero=False) -> np.ndarray:
    if dtype == "bool":
        return RNG.random(shape) < 0.5
    if dtype == "uint8":
        low = max(low, 0)
    if dtype.startswith("float"):
        x = RNG.uniform(low, high, shape).astype(dtype)
    else:
        x = RNG.integers(low, high, shape).astype(dtype)
    if nonzero:
        x[x == 0] = 1
    return x


# ---------------------------------------------------------------------------------------------- elementwise

ARITH = ("add", "sub", "mul", "floordiv", "mod", "min", "max")
NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "floordiv": np.floor_divide, "mod": np.mod,
         "min": np.minimum, "max": np.maximum, "div": np.true_divide, "pow": np.power, "lt": np.less,
         "le": np.less_equal, "eq": np.equal, "ne": np.not_equal, "gt": np.greater, "ge": np.greater_equal}
COMPARE = ("lt", "le", "eq", "ne", "gt", "ge")


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
@pytest.mark.parametrize("dtype", INTS + FLOATS)
def test_binary_ops_match_numpy(dtype, kind):
    n = 37  # not a multiple of any vector width
    ops = ARITH + COMPARE + (("div", "pow") if dtype in FLOATS else ())
    A, B = Buffer("A", dtype, (n,)), Buffer("B", dtype, (n,))
    outs = [Buffer(f"o_{op}", "bool" if op in COMPARE else dtype, (n,)) for op in ops]
    body = For(i, n, kind, seq(*(Store(o.name, i, Binary(op, ld(A, i), ld(B, i))) for o, op in zip(outs, ops))))
    f = kernel(A, B, *outs, body=body)
    a = data(dtype, n, 1, 20) if dtype in FLOATS else data(dtype, n)  # positive bases keep pow real
    b = data(dtype, n, -3, 3, nonzero=True)
    b[:5] = a[:5]  # equal pairs exercise eq/le/ge
    got = [np.zeros(n, o.dtype) for o in outs]
    f(a, b, *got)
    for op, g in zip(ops, got):
        with np.errstate(all="ignore"):
            want = NUMPY[op](a, b)
        np.testing.assert_allclose(g, want, rtol=1e-6 if dtype == "float32" else 1e-12, err_msg=op)


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
def test_int_division_never_traps(kind):
    n = 10
    A, B, Q, R, Z = (Buffer(x, "int32", (n,)) for x in "ABQRZ")
    f = kernel(A, B, Q, R, Z, body=For(i, n, kind, seq(
        Store("Q", i, Binary("floordiv", ld(A, i), ld(B, i))), Store("R", i, Binary("mod", ld(A, i), ld(B, i))),
        Store("Z", i, Binary("floordiv", ld(A, i), Const(0, "int32"))))))
    a = np.array([-4, -3, -2, -1, 0, 1, 2, 3, -(2**31), -(2**31)], np.int32)
    b = np.array([0, 3, -3, 0, 2, -2, 0, 5, -1, -1], np.int32)
    q, r, z = (np.empty(n, np.int32) for _ in range(3))
    f(a, b, q, r, z)
    with np.errstate(all="ignore"):  # numpy gives 0 for x // 0 and x % 0, and MIN // -1 wraps to MIN
        np.testing.assert_array_equal(q, a // b)
        np.testing.assert_array_equal(r, a % b)
        np.testing.assert_array_equal(z, a // 0)


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
def test_constant_divisors_floor_negative_values(kind):
    n = 40
    A = Buffer("A", "int64", (n,))
    divisors = (1, 2, 3, 8, 7)
    outs = [Buffer(f"{op}{d}", "int64", (n,)) for op in ("q", "r") for d in divisors]
    stores = [Store(f"{op}{d}", i, Binary(name, ld(A, i), c(d)))
              for op, name in (("q", "floordiv"), ("r", "mod")) for d in divisors]
    f = kernel(A, *outs, body=For(i, n, kind, seq(*stores)))
    a = np.arange(-20, 20, dtype=np.int64)
    got = [np.zeros(n, np.int64) for _ in outs]
    f(a, *got)
    want = [a // d for d in divisors] + [a % d for d in divisors]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
def test_bool_logic(kind):
    n = 33
    A, B = Buffer("A", "bool", (n,)), Buffer("B", "bool", (n,))
    outs = [Buffer(x, "bool", (n,)) for x in ("o_and", "o_or", "o_not", "o_add", "o_mul")]
    body = For(i, n, kind, seq(
        Store("o_and", i, Binary("and", ld(A, i), ld(B, i))),
        Store("o_or", i, Binary("or", ld(A, i), ld(B, i))),
        Store("o_not", i, Unary("not", ld(A, i))),
        Store("o_add", i, Binary("add", ld(A, i), ld(B, i))),
        Store("o_mul", i, Binary("mul", ld(A, i), ld(B, i)))))
    f = kernel(A, B, *outs, body=body)
    a, b = data("bool", n), data("bool", n)
    got = [np.zeros(n, bool) for _ in outs]
    f(a, b, *got)
    for g, w in zip(got, (a & b, a | b, ~a, a + b, a * b)):
        np.testing.assert_array_equal(g, w)


def test_int_pow_and_unary_ints():
    n = 16
    A, B = Buffer("A", "int64", (n,)), Buffer("B", "int64", (n,))
    P, N, S, X = (Buffer(x, "int32", (n,)) for x in "PNSX")
    f = kernel(A, B, P, N, S, X, body=For(i, n, "vectorized", seq(
        Store("P", i, Cast("int32", Binary("pow", ld(A, i), ld(B, i)))),
        Store("N", i, Unary("neg", Cast("int32", ld(A, i)))),
        Store("S", i, Unary("abs", Cast("int32", ld(A, i)))),
        Store("X", i, Unary("not", Cast("int32", ld(A, i)))))))
    a, b = np.arange(-8, 8, dtype=np.int64), np.arange(16, dtype=np.int64) % 5
    p, neg, ab, nt = (np.zeros(n, np.int32) for _ in range(4))
    f(a, b, p, neg, ab, nt)
    np.testing.assert_array_equal(p, (a**b).astype(np.int32))
    np.testing.assert_array_equal(neg, -a)
    np.testing.assert_array_equal(ab, np.abs(a))
    np.testing.assert_array_equal(nt, ~a)


# ---------------------------------------------------------------------------------------------- casts

ALL = ("bool",) + INTS + FLOATS


@pytest.mark.parametrize("src", ALL)
def test_casts_match_numpy_astype(src):
    n = 50
    # float → uint8 of a negative value is undefined in C (numpy's result is platform-dependent): the uint8 output
    # reads a non-negative copy of the input
    X, P = Buffer("X", src, (n,)), Buffer("P", src, (n,))
    outs = [Buffer(f"o_{d}", d, (n,)) for d in ALL]
    stores = [Store(o.name, i, Cast(o.dtype, ld(P if o.dtype == "uint8" else X, i))) for o in outs]
    f = kernel(X, P, *outs, body=For(i, n, "vectorized", seq(*stores)))
    x = data(src, n, -100, 100)
    if src in FLOATS:
        x[:4] = [0.0, -0.0, 2.5, -2.5]  # truncation toward zero, bool of -0.0
    p = np.abs(x) if src != "bool" else x
    if src == "int8":
        p[p < 0] = 127  # abs(-128) stays negative
    got = [np.zeros(n, o.dtype) for o in outs]
    f(x, p, *got)
    for o, g in zip(outs, got):
        np.testing.assert_array_equal(g, (p if o.dtype == "uint8" else x).astype(o.dtype), err_msg=f"{src}->{o.dtype}")


# ---------------------------------------------------------------------------------------------- intrinsics

# references are computed in float64 (math.erf for erf). Tolerances: scalar code calls libm (within ~2 ulp), vector
# code glibc's libmvec (documented and measured within 4 ulp on 200k points); rsqrt = 1/sqrt and sigmoid =
# 1/(1+exp(-x)) add one or two roundings. 4-5 float32 ulps (2^-23 ≈ 1.2e-7 each, relative) stay under rtol 1e-6;
# float64 is held to 1e-13 (≈ 450 ulp of 2^-52, far above the handful seen).
UNARY = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "tanh": np.tanh,
         "erf": np.vectorize(math.erf), "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "floor": np.floor,
         "abs": np.abs, "neg": np.negative}
POSITIVE_ONLY = ("log", "sqrt", "rsqrt")


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_float_intrinsics(dtype, kind):
    n = 70  # more than MAX_LANES: a vector chunk and a tail
    X = Buffer("X", dtype, (n,))
    outs = [Buffer(f"o_{op}", dtype, (n,)) for op in UNARY]
    f = kernel(X, *outs, body=For(i, n, kind, seq(
        *(Store(o.name, i, Unary(op, ld(X, i))) for o, op in zip(outs, UNARY)))))
    x = data(dtype, n, -6, 6)
    x[:3] = [0.0, 1e-3, -1e-3]
    got = [np.zeros(n, dtype) for _ in outs]
    f(x, *got)
    x64 = x.astype(np.float64)
    for op, g in zip(UNARY, got):
        mask = x64 > 0 if op in POSITIVE_ONLY else np.ones(n, bool)
        with np.errstate(all="ignore"):
            want = UNARY[op](x64).astype(dtype)
        rtol = 1e-6 if dtype == "float32" else 1e-13
        np.testing.assert_allclose(g[mask], want[mask], rtol=rtol, atol=1e-30, err_msg=op)


def test_vector_math_calls_libmvec_one_register_at_a_time():
    X = Buffer("X", "float32", (40,))
    f = Func("vexp", (X,), For(i, 40, "vectorized", Store("X", i, Unary("exp", ld(X, i)))))
    text = codegen.llvm_ir([f], optimized=False)
    if codegen._libmvec() and host_target().vector_bytes == 64:
        assert text.count("call <16 x float> @\"_ZGVeN16v_expf\"") == 3  # 40 lanes: 16 + 16 + 8 (padded)


def test_float_min_max_propagate_nan():
    A, B, L, H = (Buffer(x, "float32", (4,)) for x in "ABLH")
    f = kernel(A, B, L, H, body=For(i, 4, "vectorized", seq(
        Store("L", i, Binary("min", ld(A, i), ld(B, i))), Store("H", i, Binary("max", ld(A, i), ld(B, i))))))
    a = np.array([np.nan, 1, 2, -1], np.float32)
    b = np.array([0, np.nan, 3, -2], np.float32)
    lo, hi = np.zeros(4, np.float32), np.zeros(4, np.float32)
    f(a, b, lo, hi)
    np.testing.assert_array_equal(lo, np.minimum(a, b))
    np.testing.assert_array_equal(hi, np.maximum(a, b))


# ---------------------------------------------------------------------------------------------- lazy select

FAR = 1 << 40  # an offset that faults if the guarded-out load ever executes


def padded_read(A: Buffer, n: int, pad: int, index: Expr) -> Expr:
    """A[index - pad] if 0 <= index - pad < n else 0, where out-of-range lanes point far outside the buffer."""
    src = index - c(pad)
    inside = Binary("and", Binary("ge", src, c(0)), Binary("lt", src, c(n)))
    far = Select(inside, src, src + c(FAR))  # cheap to evaluate, deadly to load from
    return Select(inside, ld(A, far), Const(0.0, "float32"))


@pytest.mark.parametrize("kind", ["serial", "vectorized", "unrolled"])
def test_lazy_select_guards_out_of_bounds_loads(kind):
    n, pad = 20, 3
    A, B = Buffer("A", "float32", (n,)), Buffer("B", "float32", (n + 2 * pad,))
    f = kernel(A, B, body=For(i, n + 2 * pad, kind, Store("B", i, padded_read(A, n, pad, i))))
    a, b = data("float32", n), np.full(n + 2 * pad, 7, np.float32)
    f(a, b)
    np.testing.assert_array_equal(b, np.pad(a, pad))


def test_lazy_select_with_uniform_condition_inside_vector_loop():
    rows, n, pad = 6, 16, 1
    A, B = Buffer("A", "float32", (rows, n)), Buffer("B", "float32", (rows + 2 * pad, n))
    r = i - c(pad)
    inside = Binary("and", Binary("ge", r, c(0)), Binary("lt", r, c(rows)))
    safe_row = Select(inside, r, r + c(FAR))
    value = Select(inside, ld(A, safe_row * c(n) + j), Const(0.0, "float32"))  # the condition ignores j
    f = kernel(A, B, body=For(i, rows + 2 * pad, "serial", For(j, n, "vectorized", Store("B", i * c(n) + j, value))))
    a, b = data("float32", (rows, n)), np.full((rows + 2 * pad, n), 7, np.float32)
    f(a, b)
    np.testing.assert_array_equal(b, np.pad(a, ((pad, pad), (0, 0))))


# ---------------------------------------------------------------------------------------------- vectorized loops


@pytest.mark.parametrize("n", [1, 16, 37, 64, 100, 130])
def test_vectorized_contiguous_and_broadcast(n):
    rows = 3
    A, S, B = Buffer("A", "float32", (rows, n)), Buffer("S", "float32", (rows,)), Buffer("B", "float32", (rows, n))
    idx = i * c(n) + j
    f = kernel(A, S, B, body=For(i, rows, "serial", For(j, n, "vectorized",
                                                         Store("B", idx, ld(A, idx) * ld(S, i) + ld(A, idx)))))
    a, s, b = data("float32", (rows, n)), data("float32", rows), np.zeros((rows, n), np.float32)
    f(a, s, b)
    np.testing.assert_allclose(b, a * s[:, None] + a, rtol=1e-5)  # fp contraction: one rounding less than numpy


def test_vectorized_gather_transpose_and_strided_store():
    n = 24
    A, T, G, W = (Buffer(x, "float32", (n, n)) for x in "ATGW")
    idx = i * c(n) + j
    body = For(i, n, "serial", For(j, n, "vectorized", seq(
        Store("T", idx, ld(A, j * c(n) + i)),  # strided gather
        Store("G", idx, ld(A, i * c(n) + Binary("mod", j * c(7), c(n)))),  # non-affine gather
        Store("W", j * c(n) + i, ld(A, idx)),  # strided scatter
    )))
    f = kernel(A, T, G, W, body=body)
    a = data("float32", (n, n))
    t, g, w = (np.zeros((n, n), np.float32) for _ in range(3))
    f(a, t, g, w)
    np.testing.assert_array_equal(t, a.T)
    np.testing.assert_array_equal(g, a[:, (np.arange(n) * 7) % n])
    np.testing.assert_array_equal(w, a.T)


def test_vectorized_if_on_lane_becomes_a_mask():
    n = 29
    A, B = Buffer("A", "float32", (n,)), Buffer("B", "float32", (n + 3,))
    even = Binary("eq", Binary("mod", i, c(2)), c(0))
    body = For(i, n + 3, "vectorized", IfThenElse(
        Binary("lt", i, c(n)),  # a tail predicate: lanes past n must neither load nor store
        IfThenElse(even, Store("B", i, ld(A, i)), Store("B", i, Unary("neg", ld(A, i))))))
    f = kernel(A, B, body=body)
    a, b = data("float32", n), np.full(n + 3, 5, np.float32)
    f(a, b)
    want = np.where(np.arange(n) % 2 == 0, a, -a)
    np.testing.assert_array_equal(b, np.concatenate([want, [5, 5, 5]]))


def test_vectorized_in_place_update_and_bool_store():
    n = 40
    C, A, M = Buffer("C", "float32", (n,)), Buffer("A", "float32", (n,)), Buffer("M", "bool", (n,))
    body = For(i, n, "vectorized", seq(
        Store("C", i, ld(C, i) + ld(A, i)), Store("M", i, Binary("gt", ld(C, i), Const(0.0, "float32")))))
    f = kernel(C, A, M, body=body)
    cc, a, m = data("float32", n), data("float32", n), np.zeros(n, bool)
    want = cc + a
    f(cc, a, m)
    np.testing.assert_array_equal(cc, want)
    np.testing.assert_array_equal(m, want > 0)


# ---------------------------------------------------------------------------------------------- fallbacks


def test_vectorized_loop_carried_reduction_falls_back_to_serial():
    n = 50
    A, S, T = Buffer("A", "float64", (n,)), Buffer("S", "float64", (1,)), Buffer("T", "float64", (1,))
    loop = For(i, n, "vectorized", seq(
        Store("S", c(0), ld(S, c(0)) + ld(A, i)),  # value depends on the lane, index does not
        Store("T", c(0), ld(T, c(0)) + Const(1.0, "float64")),  # uniform, but read back by the next iteration
    ))
    assert not vectorizable(loop)
    f = kernel(A, S, T, body=loop)
    a, s, t = data("float64", n), np.zeros(1), np.zeros(1)
    f(a, s, t)
    np.testing.assert_allclose(s, [a.sum()], rtol=1e-12)
    assert t[0] == n


def test_vectorized_true_dependence_and_nested_loop_fall_back():
    n = 20
    B, M = Buffer("B", "int32", (n + 1,)), Buffer("M", "int32", (n, 4))
    shift = For(i, n, "vectorized", Store("B", i + c(1), ld(B, i) + Const(1, "int32")))  # B[i+1] = B[i] + 1
    nested = For(i, n, "vectorized", For(j, 4, "serial", Store("M", i * c(4) + j, Cast("int32", i * j))))
    assert not vectorizable(shift) and not vectorizable(nested)
    f = kernel(B, M, body=seq(shift, nested))
    b, m = np.zeros(n + 1, np.int32), np.zeros((n, 4), np.int32)
    f(b, m)
    np.testing.assert_array_equal(b, np.arange(n + 1))
    np.testing.assert_array_equal(m, np.arange(n)[:, None] * np.arange(4))


def test_vectorizable_accepts_independent_lanes():
    C, A = Buffer("C", "float32", (8,)), Buffer("A", "float32", (8,))
    assert vectorizable(For(i, 8, "vectorized", Store("C", i, ld(C, i) + ld(A, i))))
    assert vectorizable(For(i, 8, "vectorized", Store("C", Binary("mod", i * c(3), c(8)), ld(A, i))))
    assert not vectorizable(For(i, 8, "vectorized", seq(
        Store("C", Binary("mod", i * c(3), c(8)), ld(A, i)), Store("C", i, ld(A, i)))))


# ---------------------------------------------------------------------------------------------- unroll, alloc


def test_unrolled_accumulation_in_local_buffer():
    n = 10
    A, B = Buffer("A", "float32", (n, 4)), Buffer("B", "float32", (4,))
    acc = Buffer("acc", "float32", (4,))
    body = Allocate(acc, seq(
        For(j, 4, "unrolled", Store("acc", j, Const(0.0, "float32"))),
        For(i, n, "serial", For(j, 4, "unrolled", Store("acc", j, ld(acc, j) + ld(A, i * c(4) + j)))),
        For(j, 4, "vectorized", Store("B", j, ld(acc, j)))))
    f = kernel(A, B, body=body)
    a, b = data("float32", (n, 4)), np.zeros(4, np.float32)
    f(a, b)
    np.testing.assert_allclose(b, a.sum(0), rtol=1e-5)


@pytest.mark.parametrize("width", [7, 14])
def test_padded_rows_of_odd_width_into_a_local_buffer(width):
    # a 7-wide conv's padded input computed inside a tile: rows of width + 2 lanes (9: not a power of two) read
    # under a mask that is off at both ends. LLVM 22 lowered the unrolled <9 x float> masked loads on AVX2 so that
    # lane 8 read the next row's first element; codegen now loads the next power of two with those lanes masked off
    rows, w = 3, width + 2
    A, B = Buffer("A", "float32", (rows, width)), Buffer("B", "float32", (rows, w))
    P, S = Buffer("P", "float32", (rows, w)), Buffer("S", "int32", (1,))
    row_ok = Binary("ge", ld(S, c(0)), c(0))  # uniform across the lanes, known only at run time (a conv's row test)
    inside = Binary("and", Binary("and", row_ok, Binary("ge", j, c(1))), Binary("lt", j, c(width + 1)))
    padded = Select(inside, ld(A, i * c(width) + j - c(1)), Const(0.0, "float32"))
    body = Allocate(P, seq(
        For(i, rows, "unrolled", For(j, w, "vectorized", Store("P", i * c(w) + j, padded))),
        For(i, rows * w, "vectorized", Store("B", i, ld(P, i)))))
    a, b = data("float32", (rows, width)), np.full((rows, w), 7, np.float32)
    kernel(A, S, B, body=body)(a, np.ones(1, np.int32), b)
    np.testing.assert_array_equal(b, np.pad(a, ((0, 0), (1, 1))))


@pytest.mark.parametrize("size", [100, 40_000])  # 400 B on the stack, 160 KB on the heap
def test_allocate_small_and_large(size):
    A, B = Buffer("A", "float32", (size,)), Buffer("B", "float32", (size,))
    tmp = Buffer("tmp", "float32", (size,))
    body = Allocate(tmp, seq(
        For(i, size, "vectorized", Store("tmp", i, ld(A, i) * Const(2.0, "float32"))),
        For(i, size, "serial", Store("B", i, ld(tmp, c(size - 1) - i)))))
    f = kernel(A, B, body=body)
    a, b = data("float32", size), np.zeros(size, np.float32)
    f(a, b)
    np.testing.assert_array_equal(b, (a * 2)[::-1])


def scratch_kernel(name="scr") -> Func:
    """Two big intermediates one after the other (the second nests a third), a small one on the stack, and a big
    one inside a parallel loop (per thread chunk, on the heap)."""
    n, rows = 20_000, 4
    A, B = Buffer("A", "float32", (n,)), Buffer("B", "float32", (n,))
    t1, t2, t3 = (Buffer(f"t{q}", "float32", (n,)) for q in (1, 2, 3))
    small, per_row = Buffer("small", "float32", (8,)), Buffer("per_row", "float32", (n,))
    body = seq(
        Allocate(t1, seq(
            For(i, n, "vectorized", Store("t1", i, ld(A, i) + Const(1.0, "float32"))),
            For(i, n, "serial", Store("B", i, ld(t1, c(n - 1) - i))))),
        Allocate(t2, Allocate(t3, Allocate(small, seq(
            For(i, n, "vectorized", Store("t2", i, ld(B, i) * Const(2.0, "float32"))),
            For(i, n, "vectorized", Store("t3", i, ld(t2, i) + ld(A, i))),
            For(i, 8, "serial", Store("small", i, Const(0.5, "float32"))),
            For(i, n, "serial", Store("B", i, ld(t3, i) + ld(small, i % c(8)))))))),
        For(j, rows, "parallel", Allocate(per_row, seq(
            For(i, n // rows, "vectorized", Store("per_row", i, ld(B, j * c(n // rows) + i))),
            For(i, n // rows, "vectorized",
                Store("B", j * c(n // rows) + i, ld(per_row, i) - ld(A, j * c(n // rows) + i)))))),
    )
    return Func(name, (A, B), body)


def test_big_intermediates_outside_parallel_loops_share_one_scratch_buffer():
    f = scratch_kernel()
    plan = codegen.plan_scratch(f)
    t1, rest = f.body.stmts[0], f.body.stmts[1]
    t2, t3 = rest, rest.body
    # t1 and t2 are siblings (the same bytes); t3 nests above t2; the small and per-thread buffers are elsewhere
    assert sorted(plan.offsets.values()) == [0, 0, 80_000] and plan.offsets[id(t1)] == plan.offsets[id(t2)] == 0
    assert plan.offsets[id(t3)] == 80_000 and plan.nbytes == 160_000
    a = data("float32", 20_000)
    want = ((a + 1)[::-1] * 2 + a + 0.5) - a
    k = codegen.compile_funcs([f])["scr"]
    for _ in range(2):  # the scratch buffer is reused from call to call
        b = np.zeros(20_000, np.float32)
        k(a, b)
        np.testing.assert_allclose(b, want, rtol=1e-6)


def test_scratch_is_the_last_argument_of_a_shared_library_kernel(tmp_path):
    lib = ctypes.CDLL(str(codegen.emit_shared_library([scratch_kernel(), parallel_kernel()], tmp_path / "libs.so")))
    assert ctypes.c_int64.in_dll(lib, "scr_scratch_bytes").value == 160_000
    assert ctypes.c_int64.in_dll(lib, "par_scratch_bytes").value == 0  # its buffers are on the stack: no argument
    a, b = data("float32", 20_000), np.zeros(20_000, np.float32)
    scratch = np.empty(160_000 + 64, np.uint8)
    ptr = scratch.ctypes.data + -scratch.ctypes.data % 64
    lib.scr(*(x.ctypes.data_as(ctypes.c_void_p) for x in (a, b)), ctypes.c_void_p(ptr))
    np.testing.assert_allclose(b, ((a + 1)[::-1] * 2 + a + 0.5) - a, rtol=1e-6)


# ---------------------------------------------------------------------------------------------- parallel


def parallel_kernel():
    """Rows in parallel; each row uses an outer variable, a per-thread scratch buffer and a nested parallel loop."""
    rows, n = 13, 50
    A, B = Buffer("A", "float32", (rows, n)), Buffer("B", "float32", (rows, n))
    O = Buffer("O", "int64", (2,))
    tmp = Buffer("tmp", "float32", (n,))
    outer = Var("o")
    body = For(outer, 2, "serial", seq(
        Store("O", outer, outer * c(10)),
        For(i, rows, "parallel", Allocate(tmp, seq(
            For(j, n, "parallel", Store("tmp", j, ld(A, i * c(n) + j) + Cast("float32", outer))),  # nested: serial
            For(j, n, "vectorized", Store("B", i * c(n) + j, ld(tmp, j) * Const(2.0, "float32"))))))))
    return Func("par", (A, B, O), body)


@pytest.mark.parametrize("threads", ["1", "2", ""])
def test_parallel_loops(threads, monkeypatch):
    monkeypatch.setenv("TILEFARM_NUM_THREADS", threads)
    f = codegen.compile_funcs([parallel_kernel()])["par"]
    a = data("float32", (13, 50))
    b, o = np.zeros((13, 50), np.float32), np.zeros(2, np.int64)
    f(a, b, o)
    np.testing.assert_array_equal(b, (a + 1) * 2)  # the last outer iteration (o = 1) wins
    np.testing.assert_array_equal(o, [0, 10])


@pytest.mark.parametrize("threads", ["1", "2", "3", "8"])
def test_every_iteration_of_a_parallel_loop_runs_once(threads, monkeypatch):
    """Threads take the iterations in chunks from libgomp's guided schedule: each runs once, however the extent
    divides among the threads, fewer iterations than threads included."""
    monkeypatch.setenv("TILEFARM_NUM_THREADS", threads)
    extents = (1, 2, 3, 7, 64, 1001)
    C = Buffer("C", "int32", (sum(extents),))
    loops, base = [], 0
    for n in extents:
        loops.append(For(i, n, "parallel", Store("C", c(base) + i, ld(C, c(base) + i) + Const(1, "int32"))))
        base += n
    f = codegen.compile_funcs([Func("count", (C,), seq(*loops))])["count"]
    counts = np.zeros(sum(extents), np.int32)
    f(counts)
    f(counts)
    np.testing.assert_array_equal(counts, 2)


def test_parallel_reads_thread_count_at_call_time(monkeypatch):
    f = codegen.compile_funcs([parallel_kernel()])["par"]
    a = data("float32", (13, 50))
    for threads in ("2", "1", "0"):
        monkeypatch.setenv("TILEFARM_NUM_THREADS", threads)
        b, o = np.zeros((13, 50), np.float32), np.zeros(2, np.int64)
        f(a, b, o)
        np.testing.assert_array_equal(b, (a + 1) * 2)
    monkeypatch.setenv("TILEFARM_NUM_THREADS", "lots")
    with pytest.raises(ValueError, match="TILEFARM_NUM_THREADS"):
        f(a, b, o)


# ---------------------------------------------------------------------------------------------- GEMM


def gemm_func(n: int, mr=6, nr=32, kc=16) -> Func:
    """C = A @ B with a register block: an mr x nr local tile, unrolled rows, vectorized columns, k outside."""
    A, B, C = (Buffer(x, "float32", (n, n)) for x in "ABC")
    acc = Buffer("acc", "float32", (mr, nr))
    jo, ko, io, ii, kk = Var("jo"), Var("ko"), Var("io"), Var("ii"), Var("kk")
    row, col, kx = io * c(mr) + ii, jo * c(nr) + j, ko * c(kc) + kk
    in_rows = Binary("lt", row, c(n))
    clamped = Binary("min", row, c(n - 1))  # rows past n read a real row and are never stored
    tile = ii * c(nr) + j
    init = For(ii, mr, "unrolled", For(j, nr, "vectorized", Store(
        "acc", tile, Select(in_rows, ld(C, row * c(n) + col), Const(0.0, "float32")))))
    update = For(kk, kc, "serial", For(ii, mr, "unrolled", For(j, nr, "vectorized", Store(
        "acc", tile, ld(acc, tile) + ld(A, clamped * c(n) + kx) * ld(B, kx * c(n) + col)))))
    out = For(ii, mr, "unrolled", IfThenElse(in_rows, For(j, nr, "vectorized", Store(
        "C", row * c(n) + col, ld(acc, tile)))))
    zero = For(i, n, "parallel", For(j, n, "vectorized", Store("C", i * c(n) + j, Const(0.0, "float32"))))
    blocks = For(jo, n // nr, "parallel", For(ko, n // kc, "serial", For(io, -(-n // mr), "serial",
                                                                           Allocate(acc, seq(init, update, out)))))
    return Func("gemm", (A, B, C), seq(zero, blocks))


def test_gemm_register_block_is_correct_fast_to_compile_and_uses_fma():
    n = 64
    f = gemm_func(n)
    kernels = codegen.compile_funcs([f])
    assert kernels.compile_seconds < 0.5
    a, b, cc = data("float32", (n, n), -1, 1), data("float32", (n, n), -1, 1), np.zeros((n, n), np.float32)
    kernels["gemm"](a, b, cc)
    np.testing.assert_allclose(cc, a @ b, rtol=1e-4, atol=1e-4)
    if host_target().has("avx512f"):
        asm = codegen.assembly([f])
        assert "vfmadd231ps\t%zmm" in asm


# ---------------------------------------------------------------------------------------------- build outputs


def test_shared_library_loads_with_ctypes(tmp_path):
    path = codegen.emit_shared_library([parallel_kernel()], tmp_path / "libk.so")
    lib = ctypes.CDLL(str(path))
    ctypes.c_int32.in_dll(lib, "tilefarm_num_threads").value = 2
    a = data("float32", (13, 50))
    b, o = np.zeros((13, 50), np.float32), np.zeros(2, np.int64)
    lib.par(*(x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, o)))
    np.testing.assert_array_equal(b, (a + 1) * 2)


def test_link_failure_raises_build_error(tmp_path):
    with pytest.raises(BuildError, match="linking"):
        codegen.emit_shared_library([parallel_kernel()], tmp_path / "missing-dir" / "libk.so")


def test_dump_writes_each_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFARM_DUMP", "loopir,llvm,asm")
    monkeypatch.setenv("TILEFARM_DUMP_DIR", str(tmp_path))
    codegen.compile_funcs([parallel_kernel()])
    assert "for i in range(13):  # parallel" in (tmp_path / "par.loopir").read_text()
    assert "GOMP_parallel" in (tmp_path / "par.ll").read_text()
    assert "par:" in (tmp_path / "par.s").read_text()


def test_llvm_ir_and_assembly_text():
    f = Func("scale", (Buffer("A", "float32", (16,)),), For(i, 16, "vectorized", Store(
        "A", i, ld(Buffer("A", "float32", (16,)), i) * Const(3.0, "float32"))))
    raw = codegen.llvm_ir([f], optimized=False)
    assert "define void @\"scale\"(ptr noalias" in raw and "<16 x float>" in raw
    assert "fmul" in codegen.llvm_ir([f])
    assert "scale:" in codegen.assembly([f])


def test_bad_arguments_name_the_param():
    A, B = Buffer("A", "float32", (4, 5)), Buffer("B", "int32", (20,))
    f = kernel(A, B, body=For(i, 20, "serial", Store("B", i, Cast("int32", ld(A, i)))))
    good_a, good_b = np.zeros((4, 5), np.float32), np.zeros(20, np.int32)
    f(good_a.reshape(20), good_b)  # the same number of elements is accepted
    with pytest.raises(TypeError, match="param A: expected dtype float32, got float64"):
        f(np.zeros((4, 5)), good_b)
    with pytest.raises(ValueError, match=r"param B: expected shape \[20\]"):
        f(good_a, np.zeros(21, np.int32))
    with pytest.raises(ValueError, match="param A.*C-contiguous"):
        f(np.zeros((5, 4), np.float32).T, good_b)
    with pytest.raises(TypeError, match="takes 2 arrays"):
        f(good_a)
    with pytest.raises(TypeError, match="param B: expected a numpy array"):
        f(good_a, [0] * 20)


def test_unknown_buffer_is_a_build_error():
    f = Func("bad", (Buffer("A", "float32", (4,)),), For(i, 4, "serial", Store("nope", i, Const(1.0, "float32"))))
    with pytest.raises(BuildError, match="nope"):
        codegen.compile_funcs([f])


def test_host_target_and_fingerprint():
    t = host_target()
    assert t.kind == "cpu" and t.cores >= 1 and t.mcpu
    assert t.fingerprint() == host_target().fingerprint() and len(t.fingerprint()) == 16
    assert t.fingerprint() != Target(**{**t.__dict__, "cores": t.cores + 1}).fingerprint()


def test_serial_loops_stay_rolled_and_unrolled_ones_do_not():
    # unrolling is the schedule's decision: LLVM's own full unroll of a short serial reduction loop let GVN share
    # loads across its iterations until a conv's register block spilled. A serial loop keeps its loop and says so.
    A, B = Buffer("A", "float32", (3, 16)), Buffer("B", "float32", (16,))
    acc = Store("B", j, ld(B, j) + Load("A", (i * c(16) + j,), "float32"))
    rolled = Func("rolled", (A, B), For(i, 3, "serial", For(j, 16, "vectorized", acc)))
    unrolled = Func("unrolled", (A, B), For(i, 3, "unrolled", For(j, 16, "vectorized", acc)))
    assert "llvm.loop.unroll.disable" in codegen.llvm_ir([rolled], optimized=False)
    assert "llvm.loop" not in codegen.llvm_ir([unrolled], optimized=False)
    assert codegen.llvm_ir([rolled]).count("fadd") == 1  # one loop body, still a loop after -O3
    assert codegen.llvm_ir([unrolled]).count("fadd") == 3
    a = data("float32", (3, 16))
    for f in (rolled, unrolled):
        b = np.zeros(16, np.float32)
        codegen.compile_funcs([f])[f.name](a, b)
        np.testing.assert_allclose(b, a.sum(axis=0), rtol=1e-6)


def test_unrolled_indices_fold_a_constant_matrix_entry_into_its_value():
    # a constant matrix read as a select chain over index equalities (TVM's const_matrix): with the loop unrolled,
    # each condition is constant, so only the chosen value is emitted
    M = {(0, 0): 1.0, (1, 1): -4.0, (2, 0): 1.0}  # entry M[i, i % 2]
    entry: Expr = Const(0.0, "float32")
    for (a, b), v in M.items():
        cond = Binary("and", Binary("eq", i, c(a)), Binary("eq", Binary("mod", i, c(2)), c(b)))
        entry = Select(cond, Const(v, "float32"), entry)
    A, B = Buffer("A", "float32", (3,)), Buffer("B", "float32", (3,))
    body = For(i, 3, "unrolled", Store("B", i, Binary("mul", ld(A, i), entry)))
    f = Func("matrix", (A, B), body)
    text = codegen.llvm_ir([f], optimized=False).split('define void @"matrix"')[1]
    assert "icmp" not in text and "select" not in text and text.count("fmul") == 3
    a, b = data("float32", (3,)), np.zeros(3, np.float32)
    codegen.compile_funcs([f])["matrix"](a, b)
    np.testing.assert_array_equal(b, a * np.array([1.0, -4.0, 1.0], np.float32))



def test_an_unrolled_body_computes_each_index_term_once():
    # B[i * 48 + j * 16 + k] for an unrolled j: the j-free part of the index is emitted once per block, not once per
    # copy of the body (Winograd transforms unroll hundreds of statements over one index base)
    A, B = Buffer("A", "float32", (4 * 48,)), Buffer("B", "float32", (4 * 48,))
    index = i * c(48) + j * c(16) + k
    body = For(i, 4, "serial", For(j, 3, "unrolled", For(k, 16, "vectorized", Store("B", index, ld(A, index)))))
    f = Func("copy3", (A, B), body)
    text = codegen.llvm_ir([f], optimized=False)
    assert text.count("mul i64") == 1, text
    a, b = data("float32", 4 * 48), np.zeros(4 * 48, np.float32)
    codegen.compile_funcs([f])["copy3"](a, b)
    np.testing.assert_array_equal(a, b)


def test_iterations_of_an_outer_unrolled_loop_share_the_inner_ones_index_arithmetic():
    # B[(i * 64 + j * 32) + i * 2] for m outside j, both unrolled: j = 1 binds the same constant in every copy of
    # m's body, so the j-dependent part of the index is computed once, not once per m (a register tile's
    # accumulations over an unrolled reduction read their operands this way)
    A, B = Buffer("A", "float32", (232,)), Buffer("B", "float32", (232,))
    m = Var("m")
    index = (i * c(64) + j * c(32)) + i * c(2)
    body = For(i, 4, "serial", For(m, 3, "unrolled", For(j, 2, "unrolled",
                                                          Store("B", index, ld(B, index) + ld(A, index)))))
    f = Func("sum3", (A, B), body)
    text = codegen.llvm_ir([f], optimized=False)
    # i * 64 + 32, i * 64 + i * 2 and (i * 64 + 32) + i * 2: once each, for all three copies of m's body
    assert text.count("= add i64") == 3, text
    a, b = data("float32", 232), np.zeros(232, np.float32)
    codegen.compile_funcs([f])["sum3"](a, b)
    touched = [i_ * 66 + j_ * 32 for i_ in range(4) for j_ in range(2)]
    np.testing.assert_allclose(b[touched], 3 * a[touched], rtol=1e-6)
    assert not np.delete(b, touched).any()


@pytest.mark.parametrize("zero", [0.0, -0.0])
def test_zero_vectors_are_zeroinitializer_and_negative_zero_keeps_its_sign(zero):
    B = Buffer("B", "float32", (16,))
    f = Func("z", (B,), For(k, 16, "vectorized", Store("B", k, Const(zero, "float32"))))
    text = codegen.llvm_ir([f], optimized=False)
    assert ("store <16 x float> zeroinitializer" in text) == (zero == 0.0 and np.copysign(1, zero) > 0)
    b = np.ones(16, np.float32)
    codegen.compile_funcs([f])["z"](b)
    assert (b == 0).all() and (np.signbit(b) == np.signbit(zero)).all()
