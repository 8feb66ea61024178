"""Integer arithmetic simplifier and bound analysis for index expressions.

Integer add/sub/mul trees are brought into a canonical linear form (sum of coef*atom + const); division and modulo
by positive constants are simplified with the exact identities below. Float arithmetic is never rewritten: that
would change numerics.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from compiler.base import dtypes
from compiler.schedule.loopir import IfThenElse, Seq, Stmt, Store, map_children
from compiler.tensor import te
from compiler.tensor.te import Binary, Cast, Const, Expr, Select, Unary, Var

Ranges = dict[str, tuple[int, int]]  # var name -> inclusive [lo, hi]
INF = math.inf


def _is_int(e: Expr) -> bool:
    return dtypes.is_int(e.dtype)


# ---------------------------------------------------------------------------------------------- linear form

Linear = tuple[dict[Expr, int], int]


def linear(e: Expr) -> Linear:
    """e == sum(coef * atom) + const, for an integer expression; non-linear parts become atoms."""
    if isinstance(e, Const) and _is_int(e):
        return {}, int(e.value)
    if isinstance(e, Binary) and _is_int(e) and e.op in ("add", "sub"):
        (ta, ca), (tb, cb) = linear(e.a), linear(e.b)
        sign = 1 if e.op == "add" else -1
        terms = dict(ta)
        for atom, k in tb.items():
            terms[atom] = terms.get(atom, 0) + sign * k
        return {a: k for a, k in terms.items() if k}, ca + sign * cb
    if isinstance(e, Binary) and _is_int(e) and e.op == "mul":
        (ta, ca), (tb, cb) = linear(e.a), linear(e.b)
        if not tb:
            return {a: k * cb for a, k in ta.items() if k * cb}, ca * cb
        if not ta:
            return {a: k * ca for a, k in tb.items() if k * ca}, ca * cb
    return {e: 1}, 0


def from_linear(terms: dict[Expr, int], const: int, dtype: str = dtypes.INDEX) -> Expr:
    """Rebuild in a stable order: larger coefficients first, so i.0*64 + i.1*8 + i.2 reads naturally."""
    out: Expr | None = None
    for atom, k in sorted(terms.items(), key=lambda t: (-abs(t[1]), str(t[0]))):
        term = atom if k == 1 else Binary("mul", atom, Const(abs(k), dtype)) if k != -1 else atom
        if out is None:
            out = term if k > 0 else Binary("sub", Const(0, dtype), term)
        else:
            out = Binary("add" if k > 0 else "sub", out, term)
    if out is None:
        return Const(const, dtype)
    if const:
        out = Binary("add" if const > 0 else "sub", out, Const(abs(const), dtype))
    return out


# ---------------------------------------------------------------------------------------------- bounds


def bound(e: Expr, ranges: Ranges) -> tuple[float, float]:
    """Inclusive integer interval of `e` given variable ranges; (-inf, inf) where unknown."""
    if isinstance(e, Const):
        v = e.value
        return (v, v) if isinstance(v, (int, bool)) else (-INF, INF)
    if isinstance(e, Var):
        return ranges.get(e.name, (-INF, INF))
    if isinstance(e, Cast):
        return bound(e.a, ranges) if _is_int(e) and _is_int(e.a) else (-INF, INF)
    if isinstance(e, Select):
        (a, b), (c, d) = bound(e.t, ranges), bound(e.f, ranges)
        return min(a, c), max(b, d)
    if isinstance(e, Binary):
        if e.op in te.COMPARE or e.op in te.LOGIC:
            return 0, 1
        if not _is_int(e):
            return -INF, INF
        (a, b), (c, d) = bound(e.a, ranges), bound(e.b, ranges)
        return BOUND_RULES.get(e.op, lambda *_: (-INF, INF))(a, b, c, d)
    return -INF, INF


def _mul_bound(a, b, c, d):
    prods = [0 if (math.isinf(x) and y == 0) or (math.isinf(y) and x == 0) else x * y for x in (a, b) for y in (c, d)]
    return min(prods), max(prods)


def _div_bound(a, b, c, d):
    if c == d and c > 0 and not math.isinf(c):
        return (a if math.isinf(a) else a // c), (b if math.isinf(b) else b // c)
    return -INF, INF


def _mod_bound(a, b, c, d):
    if c == d and c > 0 and not math.isinf(c):
        if a >= 0 and b < c:
            return a, b
        return 0, c - 1
    return -INF, INF


BOUND_RULES: dict[str, Callable] = {
    "add": lambda a, b, c, d: (a + c, b + d),
    "sub": lambda a, b, c, d: (a - d, b - c),
    "mul": _mul_bound,
    "floordiv": _div_bound,
    "mod": _mod_bound,
    "min": lambda a, b, c, d: (min(a, c), min(b, d)),
    "max": lambda a, b, c, d: (max(a, c), max(b, d)),
}


# ---------------------------------------------------------------------------------------------- rewrite rules


def _fold(op: str, a, b):
    if op == "floordiv":
        return a // b if b else None
    if op == "mod":
        return a % b if b else None
    return {
        "add": lambda: a + b,
        "sub": lambda: a - b,
        "mul": lambda: a * b,
        "min": lambda: min(a, b),
        "max": lambda: max(a, b),
        "lt": lambda: a < b,
        "le": lambda: a <= b,
        "eq": lambda: a == b,
        "ne": lambda: a != b,
        "gt": lambda: a > b,
        "ge": lambda: a >= b,
        "and": lambda: bool(a and b),
        "or": lambda: bool(a or b),
    }.get(op, lambda: None)()


def _rule_fold_consts(e: Expr, ranges: Ranges) -> Expr | None:
    # c1 op c2 -> c   (integers and bools only: float folding would change rounding)
    if isinstance(e, Binary) and isinstance(e.a, Const) and isinstance(e.b, Const) and not dtypes.is_float(e.dtype):
        if dtypes.is_float(e.a.dtype) or dtypes.is_float(e.b.dtype):
            return None
        v = _fold(e.op, e.a.value, e.b.value)
        return None if v is None else Const(v, e.dtype) if e.dtype != "bool" else Const(bool(v), "bool")
    return None


def _rule_linear(e: Expr, ranges: Ranges) -> Expr | None:
    # a*c1 + a*c2 + c3 - c3 -> a*(c1+c2)   (canonical linear form of integer add/sub/mul)
    if isinstance(e, Binary) and _is_int(e) and e.op in ("add", "sub", "mul"):
        terms, c = linear(e)
        out = from_linear(terms, c, e.dtype)
        return out if out != e else None
    return None


def _rule_divmod(e: Expr, ranges: Ranges) -> Expr | None:
    if not (isinstance(e, Binary) and e.op in ("floordiv", "mod") and _is_int(e) and isinstance(e.b, Const)):
        return None
    c = int(e.b.value)
    if c <= 0:
        return None
    if c == 1:
        return e.a if e.op == "floordiv" else Const(0, e.dtype)  # x//1 -> x ; x%1 -> 0
    terms, k = linear(e.a)
    out_terms = {a: q // c for a, q in terms.items() if q % c == 0}
    rest_terms = {a: q for a, q in terms.items() if q % c != 0}
    q, r = divmod(k, c)
    rest = from_linear(rest_terms, r, e.dtype)
    lo, hi = bound(rest, ranges)
    if e.op == "floordiv":
        # (c*a + r) // c -> a + r // c ; r // c -> 0 when 0 <= r < c
        if isinstance(e.a, Binary) and e.a.op == "floordiv" and isinstance(e.a.b, Const) and e.a.b.value > 0:
            return Binary("floordiv", e.a.a, Const(int(e.a.b.value) * c, e.dtype))  # (x//a)//b -> x//(a*b)
        tail = Const(0, e.dtype) if 0 <= lo and hi < c else Binary("floordiv", rest, e.b)
        new = simplify(from_linear(out_terms, q, e.dtype) + tail, ranges) if out_terms or q else tail
        return new if new != e else None
    # (c*a + r) % c -> r % c ; r % c -> r when 0 <= r < c
    if isinstance(e.a, Binary) and e.a.op == "mod" and isinstance(e.a.b, Const) and e.a.b.value % c == 0:
        return Binary("mod", e.a.a, e.b)  # (x % (k*c)) % c -> x % c
    if 0 <= lo and hi < c:
        return rest
    new = Binary("mod", rest, e.b)
    return new if new != e else None


def _rule_compare(e: Expr, ranges: Ranges) -> Expr | None:
    # a < b -> true when max(a - b) < 0 ; false when min(a - b) >= 0   (and friends)
    if not (isinstance(e, Binary) and e.op in te.COMPARE and _is_int(e.a) and _is_int(e.b)):
        return None
    lo, hi = bound(simplify(e.a - e.b, ranges), ranges)
    verdict = {
        "lt": (hi < 0, lo >= 0),
        "le": (hi <= 0, lo > 0),
        "gt": (lo > 0, hi <= 0),
        "ge": (lo >= 0, hi < 0),
        "eq": (lo == hi == 0, lo > 0 or hi < 0),
        "ne": (lo > 0 or hi < 0, lo == hi == 0),
    }[e.op]
    if verdict[0]:
        return Const(True, "bool")
    if verdict[1]:
        return Const(False, "bool")
    return None


def _rule_logic(e: Expr, ranges: Ranges) -> Expr | None:
    # true && x -> x ; false && x -> false ; true || x -> true ; false || x -> x ; select(true, a, b) -> a
    if isinstance(e, Binary) and e.op in te.LOGIC:
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(x, Const):
                if e.op == "and":
                    return y if x.value else Const(False, "bool")
                return Const(True, "bool") if x.value else y
    if isinstance(e, Select) and isinstance(e.cond, Const):
        return e.t if e.cond.value else e.f
    if isinstance(e, Unary) and e.op == "not" and isinstance(e.a, Const):
        return Const(not e.a.value, "bool")
    return None


def _rule_minmax(e: Expr, ranges: Ranges) -> Expr | None:
    # min(a, b) -> a when a <= b always ; max likewise
    if isinstance(e, Binary) and e.op in ("min", "max") and _is_int(e):
        (a, b), (c, d) = bound(e.a, ranges), bound(e.b, ranges)
        if b <= c:
            return e.a if e.op == "min" else e.b
        if d <= a:
            return e.b if e.op == "min" else e.a
    return None


RULES: list[Callable[[Expr, Ranges], Expr | None]] = [
    _rule_fold_consts,
    _rule_linear,
    _rule_divmod,
    _rule_compare,
    _rule_logic,
    _rule_minmax,
]


# simplify() results by expression and the ranges of its free variables. Lowering a search's candidates simplifies
# the same index expressions over and over (a candidate shares all but one or two stages' loops with its parent);
# before this memo, simplify took 40% of the search's time on ResNet-18's convs.
_SIMPLIFIED: dict[tuple, Expr] = {}
_SIMPLIFIED_MAX = 200_000


def simplify(e: Expr, ranges: Ranges | None = None) -> Expr:
    """Apply RULES bottom-up until nothing changes; `ranges` gives loop variables' inclusive bounds."""
    if isinstance(e, Const):
        return e
    if ranges:
        key = (e, tuple(sorted((v, ranges[v]) for v in te.free_vars(e) if v in ranges)))
    else:
        ranges, key = {}, (e, ())
    out = _SIMPLIFIED.get(key)
    if out is None:
        out = _simplify(e, ranges)
        if len(_SIMPLIFIED) >= _SIMPLIFIED_MAX:
            _SIMPLIFIED.clear()
        _SIMPLIFIED[key] = out
    return out


def _simplify(e: Expr, ranges: Ranges) -> Expr:
    def visit(n: Expr) -> Expr | None:
        if isinstance(n, Var) and ranges.get(n.name, (0, 1))[0] == ranges.get(n.name, (0, 1))[1]:
            return Const(ranges[n.name][0], n.dtype)  # a loop of extent 1 is a constant
        for _ in range(8):
            for rule in RULES:
                out = rule(n, ranges)
                if out is not None and out != n:
                    n = out
                    break
            else:
                return n
        return n

    return te.rewrite(e, visit)


def simplify_stmt(s: Stmt, ranges: Ranges) -> Stmt:
    """`simplify` on every index, value and guard; a guard that folds to a constant leaves its taken branch."""
    if isinstance(s, IfThenElse):
        cond = simplify(s.cond, ranges)
        if isinstance(cond, Const):
            return (
                simplify_stmt(s.then, ranges)
                if cond.value
                else (simplify_stmt(s.orelse, ranges) if s.orelse else Seq(()))
            )
        return IfThenElse(cond, simplify_stmt(s.then, ranges), s.orelse and simplify_stmt(s.orelse, ranges))
    if isinstance(s, Store):
        return Store(s.buffer, simplify(s.index, ranges), simplify(s.value, ranges))
    return map_children(s, lambda c: simplify_stmt(c, ranges))


# ---------------------------------------------------------------------------------------------- regions


def symbolic_range(e: Expr, fixed: set[str], ranges: Ranges) -> tuple[Expr, int] | None:
    """(min, extent) of an index over the non-fixed variables: min is an expression of the fixed ones.

    None when no finite bound is known.
    """
    terms, const = linear(simplify(e, {k: v for k, v in ranges.items() if v[0] == v[1]}))
    sym: dict[Expr, int] = {}
    lo_sum, hi_sum = const, const
    for atom, k in terms.items():
        if te.free_vars(atom) <= fixed:
            sym[atom] = k
            continue
        lo, hi = bound(atom, ranges)
        if math.isinf(lo) or math.isinf(hi):
            return None
        lo_sum += min(k * lo, k * hi)
        hi_sum += max(k * lo, k * hi)
    return simplify(from_linear(sym, int(lo_sum))), int(hi_sum - lo_sum + 1)
