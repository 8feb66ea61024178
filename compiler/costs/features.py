"""Per-store features of a lowered program for the cost model: Ansor's feature groups, computed symbolically.

One row per `Store` of the loop IR, every value log2(1 + x). Nothing is simulated: touched elements, reuse and
strides come from loop extents and the coefficients of each flat index read as an affine form of the loop
variables (a non-affine part, like `f // 56`, is a term whose range interval arithmetic bounds). Layout
(N_FEATURES = 161, names in FEATURE_NAMES):

  [0, 49)    compute: 16 op counts x executions of the store (float mad/addsub/mul/divmod/cmp/math/cast, the same
             for int, bool ops, select; a float add of a mul counts once, as a mad); then for vectorized, unrolled
             and parallel loops around the store: count, product of extents, innermost extent, and the innermost
             one's position one-hot (none, inner/middle/outer spatial, inner/middle/outer reduce, mixed)
  [49, 144)  5 buffers x 19, sorted by (cache lines, bytes) descending, zero-padded: access read/write/read-write,
             bytes, unique bytes, cache lines, unique cache lines, reuse loop-multiple-read/serial-multiple-read-
             write/none, reuse distance (iterations, bytes), reuse count, bytes/unique bytes/lines/unique lines per
             reuse, stride (elements per step of the innermost loop that moves the access), and the stride along
             the innermost vectorized loop (0 if none moves it; other than 1 it means a gather or a scatter)
  [144, 154) arithmetic intensity: flops / bytes this store touches inside each loop level, interpolated over
             log2 flops and sampled at 10 points
  [154, 158) allocation of the stored buffer (zeros for a param): bytes, elements x loops outside the Allocate,
             loops outside it, loops inside it
  [158, 161) outer: product of the enclosing loop extents, number of enclosing loops, auto_unroll_max_step
  [161, 174) GPU (zeros for a CPU program): whether the program is a GPU kernel; the extents of the store's
             enclosing loops bound to blockIdx.x/y/z, threadIdx.x/y/z and vthread; the kernel's threads per block
             and blocks (its launch: the largest bound loop per index); bytes of shared memory it allocates; and
             the store's global-memory accesses (times its executions) that neighbouring threads of threadIdx.x
             make to neighbouring or equal elements (coalesced) or farther apart (strided). Registers per thread
             are known only after ptxas builds a candidate, so they are not here.

"Spatial" loops are those the store's index moves with (inner = smallest coefficient), "reduce" loops the other
enclosing ones (inner = innermost); a loop inside a non-affine index term is "mixed".
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from compiler.base import dtypes
from compiler.base.errors import TilefarmError
from compiler.schedule.loopir import (
    BLOCK_KINDS,
    GPU_LOOP_KINDS,
    THREAD_KINDS,
    Allocate,
    Buffer,
    For,
    Func,
    IfThenElse,
    Seq,
    Stmt,
    Store,
    walk_stmts,
)
from compiler.schedule.lower import lower
from compiler.schedule.state import State
from compiler.tensor.te import COMPARE, Binary, Cast, Const, Expr, Load, Select, Unary, Var, free_vars

OPS = ("mad", "addsub", "mul", "divmod", "cmp", "math", "cast")
# fmt: off
POSITIONS = ("none", "inner_spatial", "middle_spatial", "outer_spatial", "inner_reduce", "middle_reduce",
             "outer_reduce", "mixed")
ANNOTATED = ("vectorized", "unrolled", "parallel")
BUFFER_FIELDS = ("read", "write", "read_write", "bytes", "unique_bytes", "lines", "unique_lines",
                 "reuse_loop", "reuse_serial", "reuse_none", "reuse_dis_iter", "reuse_dis_bytes", "reuse_ct",
                 "bytes_d_reuse", "unique_bytes_d_reuse", "lines_d_reuse", "unique_lines_d_reuse", "stride",
                 "vector_stride")
GPU_FIELDS = ("gpu", *(f"{k.replace('.', '_')}_len" for k in GPU_LOOP_KINDS), "threads_per_block", "blocks",
              "shared_bytes", "global_coalesced", "global_strided")
# fmt: on
MAX_BUFFERS = 5
# bytes per cache line where the caller gives none (Target.cache_line): 64 on every x86-64 and Arm server core
CACHE_LINE = 64
CURVE_POINTS = 10
FEATURE_NAMES: tuple[str, ...] = (
    *(f"float_{o}" for o in OPS),
    *(f"int_{o}" for o in OPS),
    "bool_op",
    "select_op",
    *(f"{k}_{f}" for k in ANNOTATED for f in ("num", "prod", "len", *(f"pos_{p}" for p in POSITIONS))),
    *(f"b{i}_{f}" for i in range(MAX_BUFFERS) for f in BUFFER_FIELDS),
    *(f"intensity_{i}" for i in range(CURVE_POINTS)),
    "alloc_bytes",
    "alloc_prod",
    "alloc_outer_prod",
    "alloc_inner_prod",
    "outer_prod",
    "num_loops",
    "auto_unroll_max_step",
    *GPU_FIELDS,
)
N_FEATURES = len(FEATURE_NAMES)

_N_COUNTS = 16
_INT = len(OPS)  # offset of the int counters
_BOOL, _SELECT = 2 * len(OPS), 2 * len(OPS) + 1
_MAD, _ADDSUB, _MUL, _DIVMOD, _CMP, _MATH, _CAST = range(len(OPS))
_COMPARE = frozenset(COMPARE)
_ALWAYS = 1 << 30  # depth of a term that no loop moves (the spread of constant offsets): active at every level


def extract(state: State, *, cache_line: int | None = None) -> np.ndarray:
    """Features of `state`'s program, (n_stores, N_FEATURES) float32; (0, N_FEATURES) if it does not lower.

    The program is lowered without the final simplification: 2.5x faster, and on 256 measured GEMM programs the
    cost model ranked held-out ones as well either way (pairwise accuracy 0.809 vs 0.810, 5 random splits)."""
    try:
        func = lower(state, simplify=False)
    except TilefarmError:
        return np.zeros((0, N_FEATURES), np.float32)
    unroll = {s.name: s.auto_unroll_max_step for s in state.stages if s.auto_unroll_max_step}
    return extract_func(func, unroll, cache_line=cache_line)


def extract_func(
    func: Func, unroll_max_step: int | Mapping[str, int] = 0, *, cache_line: int | None = None
) -> np.ndarray:
    """Features of a lowered function. `unroll_max_step` is one value for every store or one per stored buffer
    (a stage's stores write the buffer named after it)."""
    line = cache_line or CACHE_LINE
    buffers = {b.name: b for b in func.params}
    sites = _collect(func.body, buffers)
    if not sites:
        return np.zeros((0, N_FEATURES), np.float32)
    stores = [_analyze(site, buffers) for site in sites]
    loop_bytes: dict[int, float] = {}
    loop_buf: dict[tuple[int, str], list[float]] = {}  # (loop, buffer) -> [stores under it touching it, min touched]
    for st in stores:
        for i, lid in enumerate(st.loop_ids):
            loop_bytes[lid] = loop_bytes.get(lid, 0.0) + sum(b.touched[i] * b.itemsize for b in st.buffers)
            for b in st.buffers:
                entry = loop_buf.setdefault((lid, b.name), [0, math.inf])
                entry[0] += 1
                entry[1] = min(entry[1], b.touched[i])
    kernel = _Kernel(func)
    rows = [_row(st, loop_bytes, loop_buf, unroll_max_step, line) + kernel.row(st) for st in stores]
    return np.log2(1.0 + np.asarray(rows, np.float64)).astype(np.float32)


class _Kernel:
    """What a GPU program's features need of the whole kernel: its launch (the largest loop bound to each block
    and thread index), its shared memory, and which buffers live in global memory."""

    def __init__(self, func: Func):
        self.launch: dict[str, int] = {}
        self.shared_bytes = 0
        self.global_buffers = {b.name for b in func.params}
        for s in walk_stmts(func.body):
            if isinstance(s, For) and s.kind in GPU_LOOP_KINDS:
                self.launch[s.kind] = max(self.launch.get(s.kind, 1), s.extent)
            elif isinstance(s, Allocate) and s.scope == "shared":
                self.shared_bytes += s.buffer.size * dtypes.itemsize(s.buffer.dtype)
            elif isinstance(s, Allocate) and s.scope == "global":
                self.global_buffers.add(s.buffer.name)

    def row(self, st: _StoreInfo) -> list[float]:
        if not self.launch:
            return [0.0] * len(GPU_FIELDS)
        loops = st.site.loops
        bound = [
            math.prod(lp.extent for lp in loops if lp.kind == k) if any(lp.kind == k for lp in loops) else 0
            for k in GPU_LOOP_KINDS
        ]
        threads = math.prod(self.launch.get(k, 1) for k in THREAD_KINDS)
        blocks = math.prod(self.launch.get(k, 1) for k in BLOCK_KINDS)
        lanes = [d for d, lp in enumerate(loops) if lp.kind == "threadIdx.x"]
        coalesced = strided = 0
        for u in st.buffers:
            if u.name not in self.global_buffers:
                continue
            for a in u.accesses:
                if not lanes or a.stride(lanes[-1]) <= 1:
                    coalesced += st.execs
                else:
                    strided += st.execs
        return [1.0, *bound, threads, blocks, self.shared_bytes, coalesced, strided]


# ---------------------------------------------------------------------------------------------- program walk


class _Site:
    __slots__ = ("store", "loops", "loop_ids", "alloc")

    def __init__(self, store: Store, loops: tuple[For, ...], loop_ids: tuple[int, ...], alloc):
        self.store, self.loops, self.loop_ids, self.alloc = store, loops, loop_ids, alloc


def _collect(body: Stmt, buffers: dict[str, Buffer]) -> list[_Site]:
    """Every Store with its enclosing loops (outermost first, each loop visit numbered) and the Allocate of the
    buffer it writes as (buffer, product of the loop extents outside the Allocate)."""
    sites: list[_Site] = []
    loops: list[For] = []
    ids: list[int] = []
    allocs: dict[str, tuple[Buffer, int]] = {}
    counter = [0]

    def visit(s: Stmt, prod: int) -> None:
        if isinstance(s, For):
            loops.append(s)
            ids.append(counter[0])
            counter[0] += 1
            visit(s.body, prod * s.extent)
            loops.pop()
            ids.pop()
        elif isinstance(s, Store):
            sites.append(_Site(s, tuple(loops), tuple(ids), allocs.get(s.buffer)))
        elif isinstance(s, Seq):
            for c in s.stmts:
                visit(c, prod)
        elif isinstance(s, Allocate):
            buffers[s.buffer.name] = s.buffer
            allocs[s.buffer.name] = (s.buffer, prod)
            visit(s.body, prod)
        elif isinstance(s, IfThenElse):
            visit(s.then, prod)
            if s.orelse is not None:
                visit(s.orelse, prod)

    visit(body, 1)
    return sites


# ---------------------------------------------------------------------------------------------- index analysis


def _linearize(e: Expr, k: int, coefs: dict[str, int], atoms: list[tuple[Expr, int]]) -> int:
    """Add k*e to `coefs` (per variable) and `atoms` (non-affine parts); returns k times e's constant part."""
    t = type(e)
    if t is Var:
        coefs[e.name] = coefs.get(e.name, 0) + k
        return 0
    if t is Const:
        return k * int(e.value)
    if t is Binary:
        op = e.op
        if op == "add":
            return _linearize(e.a, k, coefs, atoms) + _linearize(e.b, k, coefs, atoms)
        if op == "sub":
            return _linearize(e.a, k, coefs, atoms) + _linearize(e.b, -k, coefs, atoms)
        if op == "mul":
            if type(e.b) is Const:
                return _linearize(e.a, k * int(e.b.value), coefs, atoms)
            if type(e.a) is Const:
                return _linearize(e.b, k * int(e.a.value), coefs, atoms)
    atoms.append((e, k))
    return 0


def _interval(e: Expr, extent: dict[str, int]) -> tuple[int, int] | None:
    """Bounds of an integer expression over the loop ranges, or None if unknown."""
    t = type(e)
    if t is Var:
        n = extent.get(e.name)
        return None if n is None else (0, n - 1)
    if t is Const:
        return int(e.value), int(e.value)
    if t is not Binary:
        return None
    a = _interval(e.a, extent)
    if a is None:
        return None
    op, b_const = e.op, e.b.value if type(e.b) is Const else None
    if op in ("floordiv", "mod") and b_const is not None and b_const > 0:
        c = int(b_const)
        if op == "floordiv":
            return a[0] // c, a[1] // c
        return a if 0 <= a[0] and a[1] < c else (0, c - 1)
    b = _interval(e.b, extent)
    if b is None:
        return None
    if op == "add":
        return a[0] + b[0], a[1] + b[1]
    if op == "sub":
        return a[0] - b[1], a[1] - b[0]
    if op == "mul":
        p = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
        return min(p), max(p)
    if op in ("min", "max"):
        f = min if op == "min" else max
        return f(a[0], b[0]), f(a[1], b[1])
    return None


class _Access:
    """One flat index: terms (|coefficient|, distinct values, depth of the innermost loop moving it), the loop
    depths it moves with (affine coefficient, or inside a non-affine term), and a structural key."""

    __slots__ = ("const", "terms", "affine", "mixed", "key")

    def __init__(self, index: Expr, depth: dict[str, int], extents: list[int], extent_of: dict[str, int]):
        coefs: dict[str, int] = {}
        atoms: list[tuple[Expr, int]] = []
        self.const = _linearize(index, 1, coefs, atoms)
        self.terms: list[tuple[int, int, int]] = []
        self.affine: dict[int, int] = {}
        self.mixed: dict[int, int] = {}
        for name, c in coefs.items():
            d = depth.get(name)
            if c and d is not None:  # a variable that is not an enclosing loop is a constant here
                self.terms.append((abs(c), extents[d], d))
                self.affine[d] = abs(c)
        for atom, c in atoms:
            ds = [depth[v] for v in free_vars(atom) if v in depth]
            if not c or not ds:
                continue
            span = math.prod(extents[d] for d in set(ds))
            iv = _interval(atom, extent_of)
            n = span if iv is None else min(span, iv[1] - iv[0] + 1)
            if n == 1:  # a term no loop moves (`f // 8` with f < 8, as fusing a loop of one trip leaves it)
                continue
            self.terms.append((abs(c), n, max(ds)))
            for d in ds:  # a step of the loop moves the term by at most one: |c| elements, conservatively
                self.mixed[d] = max(self.mixed.get(d, 0), abs(c))
        self.terms.sort()
        self.key = (sorted(coefs.items()), atoms)

    def stride(self, d: int) -> int:
        return max(self.affine.get(d, 0), self.mixed.get(d, 0))


class _BufferUse:
    __slots__ = ("name", "itemsize", "read", "write", "sites", "accesses", "deps", "touched", "run")

    def __init__(self, name: str, itemsize: int):
        self.name, self.itemsize = name, itemsize
        self.read = self.write = False
        self.sites = 0
        self.accesses: list[_Access] = []


class _StoreInfo:
    __slots__ = ("site", "loop_ids", "extents", "execs", "counts", "buffers", "store_access")


def _analyze(site: _Site, buffers: dict[str, Buffer]) -> _StoreInfo:
    st = _StoreInfo()
    st.site, st.loop_ids = site, site.loop_ids
    st.extents = [lp.extent for lp in site.loops]
    st.execs = math.prod(st.extents)
    depth = {lp.var.name: i for i, lp in enumerate(site.loops)}
    extent_of = {lp.var.name: lp.extent for lp in site.loops}
    counts = [0] * _N_COUNTS
    _count_ops(site.store.value, counts)
    st.counts = counts
    uses: dict[str, _BufferUse] = {}

    def use(name: str, dtype: str) -> _BufferUse:
        u = uses.get(name)
        if u is None:
            buf = buffers.get(name)
            u = uses[name] = _BufferUse(name, dtypes.itemsize(buf.dtype if buf is not None else dtype))
        return u

    store = site.store
    w = use(store.buffer, store.value.dtype)
    w.write = True
    w.sites += 1
    st.store_access = _Access(store.index, depth, st.extents, extent_of)
    w.accesses.append(st.store_access)
    for ld in _loads(store.value):
        u = use(ld.buffer, ld.dtype)
        u.read = True
        u.sites += 1
        acc = _Access(ld.indices[0], depth, st.extents, extent_of)
        if not any(a.key == acc.key and a.const == acc.const for a in u.accesses):
            u.accesses.append(acc)
    for u in uses.values():
        u.deps = set()
        for a in u.accesses:
            u.deps.update(a.affine, a.mixed)
        buf = buffers.get(u.name)
        _touched(u, st.extents, buf.size if buf is not None else None)
    st.buffers = list(uses.values())
    return st


def _loads(e: Expr) -> list[Load]:
    out: list[Load] = []
    stack = [e]
    while stack:
        n = stack.pop()
        t = type(n)
        if t is Load:
            out.append(n)
            stack.extend(n.indices)
        elif t is Binary:
            stack.append(n.b)
            stack.append(n.a)
        elif t is Unary or t is Cast:
            stack.append(n.a)
        elif t is Select:
            stack.extend((n.f, n.t, n.cond))
    return out


def _touched(u: _BufferUse, extents: list[int], size: int | None) -> None:
    """Distinct elements of `u` the store touches inside each loop level (index len(extents): one execution),
    and the contiguous run (elements) of the whole footprint."""
    groups: list[tuple[_Access, list[int]]] = []
    for acc in u.accesses:  # accesses differing only by a constant offset share one footprint
        for g in groups:
            if g[0].key == acc.key:
                g[1].append(acc.const)
                break
        else:
            groups.append((acc, [acc.const]))
    fps = []
    for acc, consts in groups:
        terms, lo, hi = acc.terms, min(consts), max(consts)
        if hi > lo:  # the offsets as one more term: base + g*t, t in [0, (hi-lo)/g]
            g = 0
            for c in consts:
                g = math.gcd(g, c - lo)
            terms = sorted(terms + [(g, (hi - lo) // g + 1, _ALWAYS)])
        fps.append((terms, sorted(set(acc.affine) | set(acc.mixed)), len(consts)))
    touched = []
    for level in range(len(extents) + 1):
        total = 0
        for terms, deps, n_off in fps:
            # terms by increasing coefficient: the values so far lie in [0, hi] on multiples of g
            distinct, hi, g = 1, 0, 0
            for c, n, d in terms:
                if d >= level and n > 1:
                    hi += c * (n - 1)
                    g = math.gcd(g, c)
                    distinct = min(distinct * n, hi // g + 1)
            cap = n_off
            for d in deps:
                if d >= level:
                    cap *= extents[d]
            total += min(distinct, cap)
        touched.append(min(total, size) if size else total)
    run = 1
    for c, n, _ in fps[0][0] if len(fps) == 1 else ():
        if n > 1:
            if c > run:
                break
            run += c * (n - 1)
    u.touched = touched
    u.run = min(run, touched[0])


# ---------------------------------------------------------------------------------------------- op counts


def _count_ops(e: Expr, c: list[int]) -> None:
    t = type(e)
    if t is Binary:
        op, a, b = e.op, e.a, e.b
        off = 0 if e.dtype.startswith("float") else _INT
        if op == "add" or op == "sub":
            # an add of a product is one multiply-add (fma for floats): count the product's operands, not the product
            mul = a if type(a) is Binary and a.op == "mul" else b if type(b) is Binary and b.op == "mul" else None
            if mul is not None and mul.dtype == e.dtype:
                c[off + _MAD] += 1
                for x in (mul.a, mul.b, b if mul is a else a):
                    _count_ops(x, c)
                return
            c[off + _ADDSUB] += 1
        elif op == "mul":
            c[off + _MUL] += 1
        elif op == "shl" or op == "shr":  # one ALU op, as an add is
            c[off + _ADDSUB] += 1
        elif op in ("div", "floordiv", "mod"):
            c[off + _DIVMOD] += 1
        elif op in _COMPARE:
            c[(0 if a.dtype.startswith("float") else _INT) + _CMP] += 1
        elif op == "min" or op == "max":
            c[off + _CMP] += 1
        elif op == "and" or op == "or":
            c[_BOOL] += 1
        else:  # pow
            c[off + _MATH] += 1
        _count_ops(a, c)
        _count_ops(b, c)
    elif t is Load:
        for i in e.indices:
            _count_ops(i, c)
    elif t is Unary:
        if e.op == "not":
            c[_BOOL] += 1
        else:
            off = 0 if e.a.dtype.startswith("float") else _INT
            c[off + (_ADDSUB if e.op == "neg" else _MATH)] += 1
        _count_ops(e.a, c)
    elif t is Cast:
        c[(0 if e.dtype.startswith("float") else _INT) + _CAST] += 1
        _count_ops(e.a, c)
    elif t is Select:
        c[_SELECT] += 1
        _count_ops(e.cond, c)
        _count_ops(e.t, c)
        _count_ops(e.f, c)


# ---------------------------------------------------------------------------------------------- rows


def _position(st: _StoreInfo, d: int) -> int:
    """POSITIONS index of the loop at depth d relative to the store's index."""
    acc = st.store_access
    if d in acc.mixed:
        return 7
    if d in acc.affine:
        coefs = sorted(acc.affine.values())
        c = acc.affine[d]
        return 1 if c == coefs[0] else 3 if c == coefs[-1] else 2
    others = [i for i in range(len(st.extents)) if i not in acc.affine and i not in acc.mixed]
    return 4 if d == others[-1] else 6 if d == others[0] else 5


def _row(st: _StoreInfo, loop_bytes, loop_buf, unroll_max_step, line: int) -> list[float]:
    execs, extents, loops = st.execs, st.extents, st.site.loops
    row: list[float] = [n * execs for n in st.counts]
    for kind in ANNOTATED:
        depths = [i for i, lp in enumerate(loops) if lp.kind == kind]
        pos = [0.0] * len(POSITIONS)
        pos[_position(st, depths[-1]) if depths else 0] = 1.0
        prod = math.prod(extents[i] for i in depths) if depths else 0
        row += [len(depths), prod, extents[depths[-1]] if depths else 0, *pos]

    feats = []
    for u in st.buffers:
        feats.append(_buffer_features(st, u, loop_bytes, loop_buf, line))
    feats.sort(key=lambda f: (f[5], f[3]), reverse=True)
    for f in feats[:MAX_BUFFERS]:
        row += f
    row += [0.0] * (len(BUFFER_FIELDS) * (MAX_BUFFERS - min(len(feats), MAX_BUFFERS)))

    row += _intensity_curve(st)
    alloc = st.site.alloc
    if alloc is None:
        row += [0.0] * 4
    else:
        buf, outer = alloc
        row += [buf.size * dtypes.itemsize(buf.dtype), buf.size * outer, outer, execs / outer]
    if isinstance(unroll_max_step, Mapping):
        unroll_max_step = unroll_max_step.get(st.site.store.buffer, 0)
    row += [execs, len(loops), unroll_max_step]
    return row


def _buffer_features(st: _StoreInfo, u: _BufferUse, loop_bytes, loop_buf, line: int) -> list[float]:
    execs, extents, nloops = st.execs, st.extents, len(st.extents)
    size = u.itemsize
    nbytes = execs * size * u.sites
    unique_bytes = u.touched[0] * size
    # the innermost loop that moves the access sets the stride; loops inside it re-read the same lines
    stride, reduce_ratio = 0, 1
    for d in reversed(range(nloops)):
        moving = [a.stride(d) for a in u.accesses if d in a.affine or d in a.mixed]
        if moving:
            stride = min(moving)
            break
        reduce_ratio *= extents[d]
    vector_stride = 0
    vec = [d for d in range(nloops) if st.site.loops[d].kind == "vectorized"]
    if vec:
        moving = [a.stride(vec[-1]) for a in u.accesses if vec[-1] in a.affine or vec[-1] in a.mixed]
        vector_stride = min(moving, default=0)
    lines = max(1.0, execs / reduce_ratio * min(1.0, stride * size / line))
    unique_lines = max(1.0, unique_bytes / min(u.run * size, line))

    kind, dis_iter, dis_bytes, ct = 2, 0.0, 0.0, 0.0  # no reuse
    it, by = 1.0, float(sum(b.itemsize for b in st.buffers))
    for d in reversed(range(nloops)):
        lid = st.loop_ids[d]
        if d not in u.deps:  # every iteration of this loop reads what the previous one did
            kind, dis_iter, dis_bytes, ct = 0, it, by, extents[d]
            break
        it *= extents[d]
        by = loop_bytes[lid]
        count, least = loop_buf[(lid, u.name)]
        if count > 1:  # other stores in this loop touch the buffer too
            kind, dis_iter, dis_bytes, ct = 1, least, by, count - 1
            break
    reuse = [0.0, 0.0, 0.0]
    reuse[kind] = 1.0
    div = max(ct, 1.0)
    access = [float(u.read and not u.write), float(u.write and not u.read), float(u.read and u.write)]
    return [
        *access,
        nbytes,
        unique_bytes,
        lines,
        unique_lines,
        *reuse,
        dis_iter,
        dis_bytes,
        ct,
        nbytes / div,
        unique_bytes / div,
        lines / div,
        unique_lines / div,
        stride,
        vector_stride,
    ]


def _intensity_curve(st: _StoreInfo) -> list[float]:
    ops = sum(st.counts[:_BOOL]) + st.counts[_MAD] + st.counts[_INT + _MAD]  # a mad is two operations
    if ops == 0:
        return [0.0] * CURVE_POINTS
    xs, ys = [], []
    flops = float(ops)
    for level in reversed(range(len(st.extents) + 1)):  # innermost level (one execution) first
        if level < len(st.extents):
            flops *= st.extents[level]
        nbytes = sum(b.touched[level] * b.itemsize for b in st.buffers)
        xs.append(math.log2(1.0 + flops))
        ys.append(flops / max(nbytes, 1))
    top = xs[-1]
    return [float(v) for v in np.interp([top * (k + 1) / CURVE_POINTS for k in range(CURVE_POINTS)], xs, ys)]


# ---------------------------------------------------------------------------------------------- cache


class FeatureCache:
    """Features by a caller's key (the search uses a schedule's step records); the least recently used entry leaves
    first once more than `max_size` are held. Cached arrays are read-only."""

    def __init__(self, max_size: int = 10_000):
        self.max_size = max_size
        self._data: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def __getitem__(self, key: Hashable) -> np.ndarray:
        return self._data[key]

    def get_or_compute(self, key: Hashable, state: State) -> np.ndarray:
        x = self._data.get(key)
        if x is not None:
            self.hits += 1
            self._data.move_to_end(key)
            return x
        self.misses += 1
        return self.put(key, extract(state))

    def put(self, key: Hashable, x: np.ndarray) -> np.ndarray:
        """Hold features computed elsewhere (the search's worker processes)."""
        x.flags.writeable = False
        self._data[key] = x
        if len(self._data) > self.max_size:
            self._data.popitem(last=False)
        return x

    def batch(self, states: Sequence[State], keys: Sequence[Hashable]) -> list[np.ndarray]:
        if len(states) != len(keys):
            raise ValueError(f"got {len(states)} states but {len(keys)} keys")
        return [self.get_or_compute(k, s) for k, s in zip(keys, states)]
