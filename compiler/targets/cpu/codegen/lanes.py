"""Lane analysis for vectorized loops: which index expressions step by one per lane, and when running a loop body
once over all lanes gives the same memory as running its iterations in order."""

from __future__ import annotations

from collections.abc import Iterator

from compiler.base import dtypes
from compiler.schedule.loopir import For, IfThenElse, Seq, Stmt, Store, walk_stmts
from compiler.tensor.te import Binary, Const, Expr, Load, Var, free_vars, walk


def coeff(e: Expr, v: str) -> int | None:
    """c if `e` == base + c*v with `base` free of v, else None."""
    if isinstance(e, Var):
        return 1 if e.name == v else 0
    if isinstance(e, Const):
        return 0
    if isinstance(e, Binary) and e.op in ("add", "sub", "mul") and dtypes.is_int(e.dtype):
        ca, cb = coeff(e.a, v), coeff(e.b, v)
        if ca is None or cb is None:
            return None
        if e.op == "add":
            return ca + cb
        if e.op == "sub":
            return ca - cb
        if ca == 0 and cb == 0:
            return 0
        if ca == 0 and isinstance(e.a, Const):
            return int(e.a.value) * cb
        if cb == 0 and isinstance(e.b, Const):
            return int(e.b.value) * ca
        return None
    return 0 if v not in free_vars(e) else None


def uses(e: Expr, v: str) -> bool:
    return any(isinstance(n, Var) and n.name == v for n in walk(e))


def _exprs(s: Stmt) -> Iterator[Expr]:
    if isinstance(s, Store):
        yield s.index
        yield s.value
    elif isinstance(s, IfThenElse):
        yield s.cond


def vectorizable(loop: For) -> bool:
    """True if running the body once over all lanes gives the same memory as running iterations in order."""
    v = loop.var.name
    stores: list[tuple[Store, bool]] = []  # (store, under a lane-dependent condition)
    loads: dict[str, list[Load]] = {}

    def visit(s: Stmt, varying_mask: bool) -> bool:
        for e in _exprs(s):
            for n in walk(e):
                if isinstance(n, Load):
                    loads.setdefault(n.buffer, []).append(n)
        if isinstance(s, Seq):
            return all(visit(c, varying_mask) for c in s.stmts)
        if isinstance(s, IfThenElse):
            inner = varying_mask or uses(s.cond, v)
            return visit(s.then, inner) and (s.orelse is None or visit(s.orelse, inner))
        if isinstance(s, Store):
            stores.append((s, varying_mask))
            return True
        return False  # nested loops and allocations stay serial

    if not visit(loop.body, False):
        return False
    for name in {s.buffer for s, _ in stores}:
        mine = [(s, m) for s, m in stores if s.buffer == name]
        if not _lanes_independent(mine, loads.get(name, []), v):
            return False
    return True


def _lanes_independent(stores: list[tuple[Store, bool]], loads: list[Load], v: str) -> bool:
    """Whether the stores to one buffer (and the loads of it) can run lane-parallel without changing results."""
    uniform = [s for s, _ in stores if not uses(s.index, v)]
    if uniform:
        # every lane writes the same element: only fine if all lanes write the same value, nobody reads it back
        # and no lane-dependent condition decides which statement writes last
        return len(uniform) == len(stores) and not loads and not any(
            uses(s.value, v) or masked for s, masked in stores)
    indices = {s.index for s, _ in stores} | {ld.indices[0] for ld in loads}
    if len(indices) == 1 and coeff(next(iter(indices)), v) not in (None, 0):
        return True  # one injective pattern: each lane only ever touches its own element
    return not loads and len(stores) == 1  # a lone scatter writes lanes in order, like the serial loop would


def has_hazard(e: Expr) -> bool:
    """True if evaluating `e` where it is not selected could fault: a load, or an integer division."""
    return any(isinstance(n, Load) or (isinstance(n, Binary) and n.op in ("div", "floordiv", "mod")
                                       and not dtypes.is_float(n.dtype) and not isinstance(n.b, Const))
               for n in walk(e))


def referenced(s: Stmt) -> tuple[set[str], set[str]]:
    """(buffer names, variable names) a statement reads or writes."""
    bufs, names = set(), set()
    for st in walk_stmts(s):
        if isinstance(st, Store):
            bufs.add(st.buffer)
        for e in _exprs(st):
            for n in walk(e):
                if isinstance(n, Load):
                    bufs.add(n.buffer)
                elif isinstance(n, Var):
                    names.add(n.name)
    return bufs, names

