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

A loop fused from several axes (the parallel loop over a GEMM's row part, column part and row block) reads its
row index as a remainder of the fused variable, so its guards fail at the last row part's partial block and hold
again at the next column part's first: not monotone. Its tail then tests, once per iteration, whether the
iteration's block is whole and runs it without guards if so, cut as above if it holds any point, and not at all
otherwise (_unswitched). Sampled ragged GEMM 1024 programs (Zen 2 AVX2 tiles, timed here with AVX2 code, 1 thread)
whose cut form ran more than 5% of their updates under a per-point guard: 21 of 60; unswitched, their times moved
by a median 0.93-1.00x over six runs (0.16x to 1.04x, eight or nine 12-84% faster, once one 2.3x slower in a
transient not seen again), their build by +2-5% (bench/results/unswitched-tails-zen4-avx2-2026-11-28.txt).
"""

from __future__ import annotations

from dataclasses import replace

from compiler.base import dtypes
from compiler.schedule.loopir import (
    Allocate,
    For,
    IfThenElse,
    Seq,
    Stmt,
    Store,
    map_children,
    map_exprs,
    seq,
    walk_stmts,
)
from compiler.schedule.simplify import Ranges, simplify, simplify_stmt, symbolic_range
from compiler.tensor import te
from compiler.tensor.te import Binary, Const, Expr, Var


def partition_loops(s: Stmt, ranges: Ranges) -> Stmt:
    """`s` (simplified under `ranges`, every loop variable's inclusive bounds) with its guarded loops cut."""
    if isinstance(s, For):
        return _partition(s, ranges)
    return map_children(s, lambda c: partition_loops(c, ranges))


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
        parts.append(_iterations(loop, main, end, ranges, unswitch=main > 0))
    return seq(*parts)


def _iterations(loop: For, start: int, end: int, ranges: Ranges, unswitch: bool = False) -> Stmt:
    """Iterations [start, end) of `loop`, simplified for that range and cut in turn; one iteration runs inline.
    With `unswitch`, a tail whose guards hold throughout most of its iterations but not as a prefix runs those
    iterations' body without them (_unswitched)."""
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
    cut = (unswitch and _unswitched(body, t.name, end - start, r)) or partition_loops(body, r)
    return For(t, end - start, loop.kind, cut, loop.llvm_unroll)


UNSWITCH_MAX_ITERATIONS = 256  # tails longer than this are cut as before (each iteration's condition is checked)


def _unswitched(body: Stmt, v: str, extent: int, ranges: Ranges) -> Stmt | None:
    """`if every guard of body that mentions v holds at every point of this iteration: body without them, elif
    each guard enclosing every store holds at some point: body cut as before` (else nothing is stored: skipped),
    where the conditions are expressions of `v` and the loops outside, the first true for at least half of the
    tail's iterations; None where it is not. A parallel loop fused from a row axis's outer parts (i.0, j.0, i.1 of a
    GEMM) has guards that hold for its first iterations, fail at the last row block, hold again for the next
    column part's, and so on: cutting at the first failure ran all the later column parts in the tail, guarded per
    point in the rows past the first failure's bound."""
    if extent > UNSWITCH_MAX_ITERATIONS:
        return None
    guards = list(dict.fromkeys(c for c in _guards(body) if v in te.free_vars(c)))
    if not guards:
        return None
    inner: Ranges = {}  # every loop of the body at its largest extent (a name may recur in sibling nests)
    for f in walk_stmts(body):
        if isinstance(f, For):
            inner[f.var.name] = (0, max(f.extent - 1, inner.get(f.var.name, (0, 0))[1]))
    fixed, every = set(ranges) - set(inner), {**ranges, **inner}
    spans = [_span(c, fixed, every) for c in guards]
    if any(sp is None for sp in spans):
        return None
    always = simplify(_conj([_holds(c, sp, everywhere=True) for c, sp in zip(guards, spans)]), ranges)
    held = sum(_is_true(simplify(always, {**ranges, v: (i, i)})) for i in range(extent))
    if _is_true(always) or 2 * held < extent:
        return None
    unguarded = partition_loops(simplify_stmt(_drop_guards(body, set(guards)), ranges), ranges)
    cut = partition_loops(body, ranges)
    # where a guard that every store is under holds nowhere, the iteration stores nothing
    common = _enclosing_every_store(body) or frozenset()
    enclosing = [(c, sp) for c, sp in zip(guards, spans) if c in common]
    if not enclosing:
        return IfThenElse(always, unguarded, cut)
    somewhere = simplify(_conj([_holds(c, sp, everywhere=False) for c, sp in enclosing]), ranges)
    return IfThenElse(always, unguarded, IfThenElse(somewhere, cut, None))


def _enclosing_every_store(s: Stmt, around: frozenset = frozenset()) -> frozenset | None:
    """The guard conjuncts whose then-branches hold every Store of `s`, with `around` (those outside it); None if
    `s` stores nothing."""
    if isinstance(s, Store):
        return around
    if isinstance(s, IfThenElse):
        parts = [(s.then, around | frozenset(_conjuncts(s.cond))), (s.orelse, around)]
    elif isinstance(s, (For, Allocate)):
        parts = [(s.body, around)]
    elif isinstance(s, Seq):
        parts = [(c, around) for c in s.stmts]
    else:
        return None
    out = None
    for child, outside in parts:
        here = _enclosing_every_store(child, outside) if child is not None else None
        out = here if out is None else out if here is None else out & here
    return out


def _span(c: Expr, fixed: set[str], ranges: Ranges) -> tuple[Expr, int] | None:
    """(smallest value, count of values) of comparison `c`'s difference a - b over the variables not `fixed`, the
    smallest an expression of the fixed ones; None if `c` is not an integer comparison or has no finite bound."""
    if not (isinstance(c, Binary) and c.op in ("lt", "le", "gt", "ge") and dtypes.is_int(c.a.dtype)):
        return None
    return symbolic_range(c.a - c.b, fixed, ranges)


def _holds(c: Binary, span: tuple[Expr, int], everywhere: bool) -> Expr:
    """The condition on the fixed variables under which `c` holds at every point (`everywhere`), or at some."""
    low, n = span
    high = low + Const(n - 1, low.dtype)
    below = c.op in ("lt", "le")  # a - b must be below 0 (lt, le) or above it (gt, ge)
    return Binary(c.op, (high if below else low) if everywhere else (low if below else high), Const(0, low.dtype))


def _conj(conds: list[Expr]) -> Expr:
    out = conds[0]
    for c in conds[1:]:
        out = Binary("and", out, c)
    return out


def _drop_guards(s: Stmt, guards: set[Expr]) -> Stmt:
    """`s` with the conjuncts in `guards` taken as true in its conditions (simplify_stmt then folds them away)."""
    true = Const(True, "bool")
    return map_exprs(s, lambda e: te.rewrite(e, lambda n: true if n in guards else None), values=False)


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
    return map_exprs(s, lambda e: te.substitute(e, mapping))
