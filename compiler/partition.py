"""Loop partitioning at guards: the main part of a loop runs without the guards its tail needs.

A split whose lengths do not divide its extent (a 6-row register block over 1024 rows) runs its loops past the
extent and guards the points there (lower.py); a stage computed at another's loop guards the points of its box
outside its tensor. Inside the innermost loops such a guard is a compare and a branch per point, and it keeps the
block's accumulators from staying in registers. `partition_loops` cuts each loop whose guards mention its
variable at the first iteration where one of them can fail: before it every guard holds (the simplifier removes
them), from there a tail loop keeps them, and iterations in which no store can happen are dropped. The tail's own
loops are cut in turn, so a 6-row block over 1024 rows runs 170 blocks unguarded, then the last block's 4 rows,
unguarded too.

Decisions use interval bounds (simplify.bound), which hold for guards that are monotone in the loop variable,
as split tails and box edges are; where a bound is not tight the loop is left as it is, never cut wrongly.
"""

from __future__ import annotations

from dataclasses import replace

from compiler import te
from compiler.loopir import Allocate, For, IfThenElse, Seq, Stmt, Store, seq, walk_stmts
from compiler.simplify import Ranges, simplify, simplify_stmt
from compiler.te import Binary, Const, Expr, Var


def partition_loops(s: Stmt, ranges: Ranges) -> Stmt:
    """`s` (simplified under `ranges`, every loop variable's inclusive bounds) with its guarded loops cut."""
    if isinstance(s, For):
        return _partition(s, ranges)
    if isinstance(s, Seq):
        return seq(*(partition_loops(c, ranges) for c in s.stmts))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, partition_loops(s.body, ranges))
    if isinstance(s, IfThenElse):
        orelse = s.orelse and partition_loops(s.orelse, ranges)
        return IfThenElse(s.cond, partition_loops(s.then, ranges), orelse)
    return s


def _partition(loop: For, ranges: Ranges) -> Stmt:
    v, extent = loop.var.name, loop.extent
    guards = [c for c in _guards(loop.body) if v in te.free_vars(c)]
    # a vector loop's guards become lane masks in codegen; cutting it would leave vectors of odd widths
    if not guards or loop.kind == "vectorized":
        return replace(loop, body=partition_loops(loop.body, ranges))

    def holds(n: int) -> bool:  # every guard true for v in [0, n)
        r = {**ranges, v: (0, n - 1)}
        return n == 0 or all(_is_true(simplify(c, r)) for c in guards)

    def dead(n: int) -> bool:  # no store happens for v in [n, extent)
        return n == extent or not _stores(simplify_stmt(loop.body, {**ranges, v: (n, extent - 1)}))

    main = _last(holds, 0, extent)  # the longest prefix in which every guard holds
    end = _first(dead, main, extent)  # the first iteration from which nothing is stored
    if main == 0 and end == extent:
        return replace(loop, body=partition_loops(loop.body, ranges))
    parts = [_iterations(loop, 0, main, ranges)] if main else []
    if end > main:
        parts.append(_iterations(loop, main, end, ranges))
    return seq(*parts)


def _iterations(loop: For, start: int, end: int, ranges: Ranges) -> Stmt:
    """Iterations [start, end) of `loop`, simplified for that range and cut in turn; one iteration runs inline."""
    v = loop.var
    if end - start == 1:
        r = {**ranges, v.name: (start, start)}
        return partition_loops(simplify_stmt(_substitute(loop.body, {v.name: Const(start, v.dtype)}), r), r)
    if start == 0:
        r = {**ranges, v.name: (0, end - 1)}
        return replace(loop, extent=end, body=partition_loops(simplify_stmt(loop.body, r), r))
    t = Var(f"{v.name}.tail", v.dtype)
    r = {**ranges, t.name: (0, end - start - 1)}
    body = simplify_stmt(_substitute(loop.body, {v.name: t + Const(start, v.dtype)}), r)
    return For(t, end - start, loop.kind, partition_loops(body, r), loop.llvm_unroll)


def _last(ok, lo: int, hi: int) -> int:
    """The largest n in [lo, hi] with ok(n), for ok true at lo and monotone (true up to a point, then false)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _first(ok, lo: int, hi: int) -> int:
    """The smallest n in [lo, hi] with ok(n), for ok true at hi and monotone (false up to a point, then true)."""
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return lo


def _guards(s: Stmt) -> list[Expr]:
    """The guards' conjuncts: a split tail's and a reduction tail's conditions are cut at their own loops."""
    return [c for g in walk_stmts(s) if isinstance(g, IfThenElse) for c in _conjuncts(g.cond)]


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op == "and":
        return _conjuncts(e.a) + _conjuncts(e.b)
    return [e]


def _stores(s: Stmt) -> bool:
    return any(isinstance(c, Store) for c in walk_stmts(s))


def _is_true(e: Expr) -> bool:
    return isinstance(e, Const) and bool(e.value)


def _substitute(s: Stmt, mapping: dict[str, Expr]) -> Stmt:
    if isinstance(s, For):
        return replace(s, body=_substitute(s.body, mapping))
    if isinstance(s, Seq):
        return Seq(tuple(_substitute(c, mapping) for c in s.stmts))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _substitute(s.body, mapping))
    if isinstance(s, IfThenElse):
        orelse = s.orelse and _substitute(s.orelse, mapping)
        return IfThenElse(te.substitute(s.cond, mapping), _substitute(s.then, mapping), orelse)
    if isinstance(s, Store):
        return Store(s.buffer, te.substitute(s.index, mapping), te.substitute(s.value, mapping))
    return s
