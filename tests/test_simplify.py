"""The index simplifier: rewrites keep the value, bounds contain every value, symbolic ranges contain every access."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.schedule.simplify import bound, simplify, symbolic_range
from compiler.tensor import te
from compiler.tensor.te import Binary, Const, Expr, Var

NAMES = ("i", "j", "k", "l")


def evaluate(e: Expr, env: dict[str, int]) -> int:
    """Integer value of `e` with floor division and floored modulo, the semantics of te's // and %."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        return env[e.name]
    assert isinstance(e, Binary), f"the simplifier introduced {e!r}"
    a, b = evaluate(e.a, env), evaluate(e.b, env)
    return {
        "add": lambda: a + b,
        "sub": lambda: a - b,
        "mul": lambda: a * b,
        "floordiv": lambda: a // b,
        "mod": lambda: a % b,
        "min": lambda: min(a, b),
        "max": lambda: max(a, b),
    }[e.op]()


@st.composite
def ranges(draw) -> dict[str, tuple[int, int]]:
    """2-4 variables with inclusive ranges, some starting below zero (as i - pad does), some of one value."""
    n = draw(st.integers(2, 4))
    out = {}
    for name in NAMES[:n]:
        lo = draw(st.integers(-4, 4))
        out[name] = (lo, lo + draw(st.integers(0, 9)))
    return out


def expressions(names: tuple[str, ...]):
    small = st.integers(-3, 9).map(lambda c: Const(c))
    positive = st.integers(1, 12).map(lambda c: Const(c))
    leaves = st.one_of(st.sampled_from([Var(n) for n in names]), small)

    def extend(sub):
        return st.one_of(
            st.tuples(sub, sub).map(lambda t: t[0] + t[1]),
            st.tuples(sub, sub).map(lambda t: t[0] - t[1]),
            st.tuples(sub, small).map(lambda t: t[0] * t[1]),
            st.tuples(small, sub).map(lambda t: t[0] * t[1]),
            st.tuples(sub, positive).map(lambda t: t[0] // t[1]),
            st.tuples(sub, positive).map(lambda t: t[0] % t[1]),
            st.tuples(sub, sub).map(lambda t: te.minimum(t[0], t[1])),
            st.tuples(sub, sub).map(lambda t: te.maximum(t[0], t[1])),
        )

    return st.recursive(leaves, extend, max_leaves=12)


@st.composite
def problems(draw):
    r = draw(ranges())
    return draw(expressions(tuple(r))), r


def points(r: dict[str, tuple[int, int]], rng: random.Random, limit: int = 100):
    """Every point of the box when it is small, else `limit` random ones plus the corners."""
    names = sorted(r)
    axes = [range(r[n][0], r[n][1] + 1) for n in names]
    if math.prod(len(a) for a in axes) <= limit:
        yield from (dict(zip(names, p)) for p in itertools.product(*axes))
        return
    yield from (dict(zip(names, p)) for p in itertools.product(*[(a[0], a[-1]) for a in axes]))
    for _ in range(limit):
        yield {n: rng.randint(*r[n]) for n in names}


@settings(max_examples=150, deadline=None)
@given(problems(), st.randoms(use_true_random=False))
def test_simplify_keeps_the_value(problem, rng):
    e, r = problem
    s = simplify(e, r)
    for env in points(r, rng):
        assert evaluate(s, env) == evaluate(e, env), f"{e} -> {s} at {env}"


@settings(max_examples=150, deadline=None)
@given(problems(), st.randoms(use_true_random=False))
def test_bound_contains_every_value(problem, rng):
    e, r = problem
    lo, hi = bound(e, r)
    slo, shi = bound(simplify(e, r), r)
    for env in points(r, rng):
        v = evaluate(e, env)
        assert lo <= v <= hi, f"{e} = {v} at {env}, outside {lo, hi}"
        assert slo <= v <= shi, f"simplified {e} = {v} at {env}, outside {slo, shi}"


@settings(max_examples=150, deadline=None)
@given(problems(), st.data())
def test_symbolic_range_contains_every_inner_value(problem, data):
    e, r = problem
    fixed = set(data.draw(st.sets(st.sampled_from(sorted(r)), max_size=len(r) - 1)))
    result = symbolic_range(e, fixed, r)
    if result is None:
        return  # no finite bound is a legal answer (lowering then computes the whole tensor)
    start, extent = result
    assert te.free_vars(start) <= fixed, f"the range's start {start} depends on loop variables inside it"
    assert extent >= 1
    rng = data.draw(st.randoms(use_true_random=False))
    inner = {n: v for n, v in r.items() if n not in fixed}
    for outer in points({n: v for n, v in r.items() if n in fixed}, rng, limit=8):
        base = evaluate(start, outer)
        for env in points(inner, rng, limit=50):
            v = evaluate(e, {**outer, **env})
            assert base <= v < base + extent, f"{e} = {v} at {outer}, {env}: outside [{start}, +{extent})"


# ---------------------------------------------------------------------------------------------- concrete rules

i, j, k, x = Var("i"), Var("j"), Var("k"), Var("x")
R = {"i": (0, 7), "j": (0, 3), "k": (0, 3), "x": (0, 100)}

RULES = [
    ((i * 4 + j) // 4, R, i),  # j < 4 never carries into i
    ((i * 4 + j) % 4, R, j),
    ((i * 8 + j * 4 + k) // 4, R, i * 2 + j),
    ((i * 8 + j * 4 + k) % 4, R, k),
    ((i * 4 + j + 1) // 4, R, (j + 1) // 4 + i),  # j + 1 may reach 4: only the multiple of 4 comes out
    ((i * 4 + j) // 4, {**R, "j": (0, 4)}, j // 4 + i),  # j = 4 would carry: j // 4 stays
    ((i * 4 + j) // 4 * 4 + (i * 4 + j) % 4, R, i * 4 + j),  # split then fuse is the identity
    (x // 1, R, x),
    (x % 1, R, Const(0)),
    ((x // 2) // 3, R, x // 6),
    ((x % 12) % 4, R, x % 4),
    (i * 3 + i * 2 - i * 5, R, Const(0)),
    ((i + 3) - 3, R, i),
    (j * 2 + i * 4 - 1 + 1, R, i * 4 + j * 2),  # larger coefficients first
    (te.minimum(i, 10), R, i),  # i <= 7 < 10
    (te.maximum(i, 10), R, Const(10)),
    (i < 8, R, Const(True, "bool")),
    (i < 7, R, i < 7),  # i = 7 makes it false: unknown
    (i + j, {"i": (3, 3), "j": (0, 3)}, j + 3),  # a loop of extent 1 is a constant
]


@pytest.mark.parametrize("e, r, want", RULES, ids=[str(e) for e, _, _ in RULES])
def test_rule(e, r, want):
    assert simplify(e, r) == want


def test_float_arithmetic_is_never_rewritten():
    # (1 + 2) in float32 must keep its rounding order and (y - y) may be NaN
    y = te.placeholder((4,), name="y")[0]
    for e in (te.const(1.0, "float32") + 2.0, y - y, y * 1.0 + 0.0):
        assert simplify(e, R) == e


def test_bound_examples():
    assert bound(i * 4 + j, R) == (0, 31)
    assert bound((i * 4 + j) // 8, R) == (0, 3)
    assert bound(x % 12, R) == (0, 11)
    assert bound(j - i, R) == (-7, 3)
    assert bound(Var("unknown") + 1, R) == (-math.inf, math.inf)


def test_symbolic_range_examples():
    assert symbolic_range(i * 4 + j, {"i"}, R) == (i * 4, 4)  # one tile of 4 per i
    assert symbolic_range((i * 4 + j) // 2, {"i"}, R) == (i * 2, 2)
    assert symbolic_range(i * j, {"i"}, R) == (Const(0), 22)  # not linear: bounded over every i
    assert symbolic_range(i + Var("free"), {"i"}, R) is None


def test_a_simplified_expression_is_remembered_per_range_of_its_variables():
    """simplify() memoizes by expression and the ranges of its free variables: the same expression under other
    ranges simplifies anew, and ranges of variables it does not use do not split the memo."""
    i, j = Var("i"), Var("j")
    e = (i * 4 + j) // 4
    assert simplify(e, {"j": (0, 3)}) == i
    assert str(simplify(e, {"j": (0, 7)})) == "((j // 4) + i)"
    assert simplify(e, {"j": (0, 3), "k": (0, 99)}) is simplify(e, {"j": (0, 3)})
    assert simplify(e, {"j": (2, 2)}) == i  # j a constant 2: (4i + 2) // 4
