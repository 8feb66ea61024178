"""Loop IR → LLVM IR text for the CPU (llvmlite.ir).

Each `Func` becomes `void name(T* noalias p0, T* noalias p1, ...)`, one pointer per param buffer in order
(bool is stored as one byte), then, when its big intermediates need one, a pointer to a 64-byte-aligned
scratch buffer of `i64 name_scratch_bytes` bytes (exported for every kernel, 0 when it takes none; see
codegen.memory). Loop kinds map to: serial → an LLVM loop; unrolled → the body replicated with
the variable replaced by a constant (or, for a For marked llvm_unroll, an LLVM loop that LLVM must fully unroll,
whose indices its passes fold once unrolled); vectorized → the body emitted once over `<n x T>` lanes (masked where
an `if` depends on the lane, serial when lanes could interfere); parallel → the body outlined and run by
libgomp's `GOMP_parallel`, its threads taking chunks from libgomp's guided schedule. The exported global
`i32 tilefarm_num_threads` picks the thread count (0 = libgomp's default, all cores).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from llvmlite import ir

from compiler.base import dtypes
from compiler.base.arrays import ALIGN
from compiler.base.errors import BuildError
from compiler.schedule.loopir import Allocate, For, Func, IfThenElse, Seq, Stmt, Store
from compiler.targets import llvm_arith
from compiler.targets.cpu.codegen import dot4
from compiler.targets.cpu.codegen.lanes import coeff, has_hazard, referenced, uses, vectorizable
from compiler.targets.cpu.codegen.memory import fits_stack, nbytes, plan_scratch
from compiler.targets.llvm_arith import COMPARISONS, filled, splat_const, zero
from compiler.tensor.te import Binary, Cast, Const, Expr, Load, Select, Unary, Var

MAX_LOAD_STRIDE = 4  # loads stepping by up to this many elements per lane use a masked span + shuffle
MAX_LANES = 64  # a longer vectorized loop is strip-mined into chunks of this many lanes (plus one tail chunk)
NUM_THREADS_GLOBAL = "tilefarm_num_threads"

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()
_SCALAR = {
    "bool": I1,
    "int8": I8,
    "uint8": I8,
    "uint16": I16,
    "int32": I32,
    "uint32": I32,
    "int64": I64,
    "uint64": I64,
    "float32": ir.FloatType(),
    "float64": ir.DoubleType(),
}
_BOOL_ARITH = {"add": "or", "mul": "and", "sub": "xor", "max": "or", "min": "and"}  # numpy's bool algebra
_LIBM = ("exp", "log", "tanh", "erf", "pow", "sin", "cos")  # in glibc's vector math library (libmvec) too, since 2.35
_LLVM_MATH = ("exp", "log", "tanh", "pow", "sin", "cos")  # LLVM intrinsics that lower to the libm call for scalars
_LIBMVEC_ISA = {64: "e", 32: "d", 16: "b"}  # x86-64 vector function ABI letter by register size: AVX-512, AVX2, SSE4


def _value_type(dtype: str, width: int | None = None) -> ir.Type:
    t = _SCALAR[dtype]
    return t if width is None else ir.VectorType(t, width)


def _memory_type(dtype: str) -> ir.Type:
    return I8 if dtype == "bool" else _SCALAR[dtype]


def _width(v: ir.Value) -> int | None:
    return v.type.count if isinstance(v.type, ir.VectorType) else None


def _mangle(t: ir.Type) -> str:
    """The type suffix LLVM expects in overloaded intrinsic names."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_mangle(t.element)}"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    if isinstance(t, ir.PointerType):
        return "p0"
    return {"float": "f32", "double": "f64"}[str(t)]


@functools.cache
def _iota(width: int) -> ir.Constant:
    """<0, 1, ..., width - 1> as i64 lanes (a constant: one object serves every vectorized loop body)."""
    return ir.Constant(ir.VectorType(I64, width), list(range(width)))


@functools.cache
def _index_const(value: int) -> ir.Constant:
    """The i64 constant `value`, one object per value: index_arith's memo keys on its leaves' identities, so an
    unrolled loop's iterations that bind a variable to the same value share the arithmetic built on it."""
    return ir.Constant(I64, value)


def _int_const(v: ir.Value) -> int | None:
    if isinstance(v, ir.Constant) and isinstance(v.type, ir.IntType) and isinstance(v.constant, int):
        return v.constant
    return None


def _bool_const(v: ir.Value) -> bool | None:
    if isinstance(v, ir.Constant) and v.type == ir.IntType(1) and isinstance(v.constant, int):
        return bool(v.constant)
    return None


def _wrap_int(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if bits > 1 and value >= 1 << (bits - 1) else value


def _floordiv(a: int, b: int) -> int:
    return 0 if b == 0 else a // b  # numpy gives 0 for division by zero


def _mod(a: int, b: int) -> int:
    return 0 if b == 0 else a % b


_COMPARE = {"lt": int.__lt__, "le": int.__le__, "eq": int.__eq__, "ne": int.__ne__, "gt": int.__gt__, "ge": int.__ge__}
_FOLD = {
    "add": int.__add__,
    "sub": int.__sub__,
    "mul": int.__mul__,
    "floordiv": _floordiv,
    "div": _floordiv,
    "mod": _mod,
    "min": min,
    "max": max,
}


class _ModuleEmitter:
    """One LLVM module: the kernels, their outlined parallel bodies and the helpers they call."""

    def __init__(self, name: str, libmvec_bytes: int, features: str = ""):
        self.module = ir.Module(name=name)
        self.libmvec_bytes = libmvec_bytes if libmvec_bytes in _LIBMVEC_ISA else 0
        self.dot4_isa = dot4.Dot4ISA.of(features)
        nthreads = ir.GlobalVariable(self.module, I32, NUM_THREADS_GLOBAL)
        nthreads.initializer = ir.Constant(I32, 0)
        self.num_threads = nthreads
        self.outlined = 0
        self._hints: dict[str, ir.MDValue] = {}  # unroll hint -> its metadata node
        self._leaves: dict[int, tuple] = {}  # int_leaves by expression id (the entry keeps the expression alive)
        # lane facts by (fact, node id, lane variable): an unrolled body emits the same loop IR nodes once per iteration
        self._lane_facts: dict[tuple[Callable, int, str | None], tuple] = {}

    def loop_id(self, hint: str) -> ir.MDValue:
        """A fresh loop-ID node (self-referential, so LLVM keeps it distinct) carrying the unroll hint `hint`."""
        if hint not in self._hints:
            self._hints[hint] = self.module.add_metadata([ir.MetaDataString(self.module, hint)])
        node = self.module.add_metadata([ir.MetaDataString(self.module, f"tilefarm.loop.{len(self.module.metadata)}")])
        node.operands = (node, self._hints[hint])
        return node

    def function(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        """The declaration of `name`, created on first use."""
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args), name)
        return fn

    def int_leaves(self, e: Expr) -> tuple[str, ...] | None:
        """The variables of an expression of integer Binary, Var and Const nodes only (None if it has others)."""
        hit = self._leaves.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        if isinstance(e, Var):
            out: tuple[str, ...] | None = (e.name,)
        elif isinstance(e, Const):
            out = ()
        elif isinstance(e, Binary) and dtypes.is_int(e.dtype) and dtypes.is_int(e.a.dtype) and dtypes.is_int(e.b.dtype):
            a, b = self.int_leaves(e.a), self.int_leaves(e.b)
            out = None if a is None or b is None else tuple(dict.fromkeys(a + b))
        else:
            out = None
        self._leaves[id(e)] = (e, out)
        return out

    def vectorizable(self, loop: For) -> bool:
        """codegen.lanes.vectorizable, once per loop node."""
        return self._lane_fact(vectorizable, loop, None)

    def uses(self, e: Expr, var: str) -> bool:
        """codegen.lanes.uses, once per expression node and variable."""
        return self._lane_fact(uses, e, var)

    def coeff(self, e: Expr, var: str) -> int | None:
        """codegen.lanes.coeff, once per expression node and variable."""
        return self._lane_fact(coeff, e, var)

    def dot4(self, s: Store, var: str) -> dot4.Dot4 | None:
        """codegen.dot4.match, once per store node and lane variable."""
        return self._lane_fact(self._match_dot4, s, var)

    def _match_dot4(self, s: Store, var: str) -> dot4.Dot4 | None:
        return dot4.match(s, var, self.coeff)

    def _lane_fact(self, fact: Callable, node, var: str | None) -> Any:
        key = (fact, id(node), var)
        hit = self._lane_facts.get(key)
        if hit is not None and hit[0] is node:  # the entry keeps the node alive, so its id is not reused
            return hit[1]
        out = fact(node) if var is None else fact(node, var)
        self._lane_facts[key] = (node, out)
        return out

    def intrinsic(self, name: str, ret: ir.Type, args: list[ir.Type], overloads: list[ir.Type]) -> ir.Function:
        return self.function(".".join([name, *map(_mangle, overloads)]), ret, args)

    def emit(self, f: Func) -> None:
        plan = plan_scratch(f)
        size = ir.GlobalVariable(self.module, I64, scratch_bytes_symbol(f.name))
        size.initializer, size.global_constant = ir.Constant(I64, plan.nbytes), True
        fn = ir.Function(self.module, ir.FunctionType(VOID, [PTR] * (len(f.params) + (plan.nbytes > 0))), f.name)
        fn.attributes.add("nounwind")
        for arg, name in zip(fn.args, [*(b.name for b in f.params), "scratch"]):
            arg.name = name
            arg.add_attribute("noalias")
        em = _FnEmitter(self, fn, f.name, in_parallel=False)
        em.bufs = {buf.name: (arg, buf.dtype) for arg, buf in zip(fn.args, f.params)}
        if plan.nbytes:
            fn.args[-1].attributes.align = ALIGN
            em.scratch = (fn.args[-1], plan.offsets)
        em.stmt(f.body)
        em.finish()

    def ipow(self) -> ir.Function:
        """i64 power by squaring (a negative exponent gives 1)."""
        fn = self.module.globals.get("tilefarm.ipow")
        if fn is not None:
            return fn
        fn = ir.Function(self.module, ir.FunctionType(I64, [I64, I64]), "tilefarm.ipow")
        fn.linkage = "internal"
        base, exp = fn.args
        entry, loop, done = fn.append_basic_block(), fn.append_basic_block(), fn.append_basic_block()
        b = ir.IRBuilder(entry)
        b.cbranch(b.icmp_signed(">", exp, ir.Constant(I64, 0)), loop, done)
        b.position_at_end(loop)
        r, x, n = b.phi(I64), b.phi(I64), b.phi(I64)
        odd = b.trunc(n, I1)
        r2 = b.select(odd, b.mul(r, x), r)
        x2, n2 = b.mul(x, x), b.lshr(n, ir.Constant(I64, 1))
        for phi, init, nxt in ((r, ir.Constant(I64, 1), r2), (x, base, x2), (n, exp, n2)):
            phi.add_incoming(init, entry)
            phi.add_incoming(nxt, loop)
        b.cbranch(b.icmp_signed("!=", n2, ir.Constant(I64, 0)), loop, done)
        b.position_at_end(done)
        out = b.phi(I64)
        out.add_incoming(ir.Constant(I64, 1), entry)
        out.add_incoming(r2, loop)
        b.ret(out)
        return fn


@dataclass(frozen=True)
class _Lanes:
    """The vectorized loop whose body is being emitted: its variable, first lane's value and lane count."""

    var: str
    start: ir.Value
    width: int


class _FnEmitter:
    """Emits statements and expressions into one LLVM function."""

    def __init__(self, mod: _ModuleEmitter, fn: ir.Function, kernel: str, in_parallel: bool):
        self.mod, self.fn, self.kernel, self.in_parallel = mod, fn, kernel, in_parallel
        entry, body = fn.append_basic_block("entry"), fn.append_basic_block("body")
        # allocas live in the entry block so they are allocated once per call and SROA/mem2reg can promote them
        self.allocas = ir.IRBuilder(entry)
        self.allocas.position_before(self.allocas.branch(body))
        self.b = ir.IRBuilder(body)
        self.bufs: dict[str, tuple[ir.Value, str]] = {}
        self.env: dict[str, ir.Value] = {}
        self.lanes: _Lanes | None = None
        self.mask: ir.Value | None = None  # which lanes are active, under a lane-dependent condition
        self.stack_bytes = 0
        self.scratch: tuple[ir.Value, dict[int, int]] | None = None  # the kernel's scratch pointer, offsets by Allocate
        self.memo: dict[tuple, tuple] = {}  # index_arith's values

    def finish(self) -> None:
        self.b.ret_void()

    @contextmanager
    def bind(self, table: dict, name: str, value) -> Iterator[None]:
        old = table.get(name)
        table[name] = value
        try:
            yield
        finally:
            if old is None:
                del table[name]
            else:
                table[name] = old

    # ------------------------------------------------------------------------------------------ statements

    def stmt(self, s: Stmt) -> None:
        if isinstance(s, Seq):
            for c in s.stmts:
                self.stmt(c)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, For):
            self.loop(s)
        elif isinstance(s, Allocate):
            self.allocate(s)
        elif isinstance(s, IfThenElse):
            self.if_then_else(s)
        else:
            raise BuildError(f"kernel {self.kernel}: codegen does not know statement {type(s).__name__}")

    def loop(self, s: For) -> None:
        if s.extent <= 0:
            return
        name = s.var.name
        if s.kind == "unrolled" and not s.llvm_unroll:
            for i in range(s.extent):
                with self.bind(self.env, name, _index_const(i)):
                    self.stmt(s.body)
        elif s.kind == "vectorized" and self.lanes is None and self.mod.vectorizable(s):
            self.vector_loop(s)
        elif s.kind == "parallel" and not self.in_parallel and self.lanes is None:
            self.parallel_loop(s)
        else:
            # a serial loop of the schedule stays rolled (see counted_loop); one marked llvm_unroll is LLVM's to unroll
            hint = "llvm.loop.unroll.full" if s.llvm_unroll else "llvm.loop.unroll.disable"
            self.counted_loop(
                ir.Constant(I64, 0),
                ir.Constant(I64, s.extent),
                lambda i: self.body_at(s, i),
                maybe_empty=False,
                unroll_hint=hint,
            )

    def body_at(self, s: For, i: ir.Value) -> None:
        with self.bind(self.env, s.var.name, i):
            self.stmt(s.body)

    def counted_loop(
        self,
        lo: ir.Value,
        hi: ir.Value,
        body: Callable[[ir.Value], None],
        maybe_empty: bool,
        unroll_hint: str | None = None,
    ):
        """for i in [lo, hi): body(i), in the rotated form LLVM's loop passes expect, its latch carrying
        `unroll_hint` when given: llvm.loop.unroll.disable for a serial loop of the schedule (unrolling is the
        search's decision, and LLVM's full unroll of a short reduction loop lets GVN share loads across iterations
        until the register block spills), llvm.loop.unroll.full for one marked For.llvm_unroll."""
        b = self.b
        pre, head, done = b.block, self.fn.append_basic_block("loop"), self.fn.append_basic_block("loop.end")
        if maybe_empty:
            b.cbranch(b.icmp_signed("<", lo, hi), head, done)
        else:
            b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64)
        i.add_incoming(lo, pre)
        body(i)
        nxt = b.add(i, ir.Constant(I64, 1), flags=("nuw", "nsw"))
        i.add_incoming(nxt, b.block)
        latch = b.cbranch(b.icmp_signed("<", nxt, hi), head, done)
        if unroll_hint:
            latch.set_metadata("llvm.loop", self.mod.loop_id(unroll_hint))
        b.position_at_end(done)

    def vector_loop(self, s: For) -> None:
        width = min(s.extent, MAX_LANES)
        chunks, tail = divmod(s.extent, width)
        if chunks == 1:
            self.vector_body(s, ir.Constant(I64, 0), width)
        else:
            self.counted_loop(
                ir.Constant(I64, 0),
                ir.Constant(I64, chunks),
                lambda c: self.vector_body(s, self.b.mul(c, ir.Constant(I64, width)), width),
                maybe_empty=False,
            )
        if tail:
            self.vector_body(s, ir.Constant(I64, chunks * width), tail)

    def vector_body(self, s: For, start: ir.Value, width: int) -> None:
        iota = _iota(width)
        lanes = iota if _int_const(start) == 0 else self.b.add(self.splat(start, width), iota)
        outer = self.lanes
        self.lanes = _Lanes(s.var.name, start, width)
        try:
            with self.bind(self.env, s.var.name, lanes):
                self.stmt(s.body)
        finally:
            self.lanes = outer

    def parallel_loop(self, s: For) -> None:
        """Outline the body into `<kernel>.parN.body(captures..., lo, hi)` and run it on every libgomp thread."""
        bufs, names = referenced(s.body)
        cap_bufs = sorted(b for b in bufs if b in self.bufs)
        cap_vars = sorted(n for n in names if n in self.env and n != s.var.name)
        values = [self.bufs[b][0] for b in cap_bufs] + [self.env[n] for n in cap_vars]
        types = [PTR] * len(cap_bufs) + [I64] * len(cap_vars)

        tag = f"{self.kernel}.par{self.mod.outlined}"
        self.mod.outlined += 1
        body_fn = ir.Function(self.mod.module, ir.FunctionType(VOID, [*types, I64, I64]), tag + ".body")
        body_fn.linkage = "internal"
        body_fn.attributes.add("nounwind")
        for arg in body_fn.args[: len(cap_bufs)]:
            arg.add_attribute("noalias")  # restates the kernel's own noalias params for the optimizer
        em = _FnEmitter(self.mod, body_fn, self.kernel, in_parallel=True)
        em.bufs = {b: (arg, self.bufs[b][1]) for b, arg in zip(cap_bufs, body_fn.args)}
        em.env = dict(zip(cap_vars, body_fn.args[len(cap_bufs) :]))
        lo, hi = body_fn.args[-2:]
        em.counted_loop(lo, hi, lambda i: em.body_at(s, i), maybe_empty=True)
        em.finish()

        frame = ir.LiteralStructType(types)
        trampoline = self.trampoline(tag, frame, body_fn, s.extent)
        data = self.allocas.alloca(frame)
        data.type = PTR
        for k, v in enumerate(values):
            self.b.store(v, self.b.gep(data, [ir.Constant(I32, 0), ir.Constant(I32, k)], source_etype=frame))
        gomp = self.mod.function("GOMP_parallel", VOID, [PTR, PTR, I32, I32])
        nthreads = self.b.load(self.mod.num_threads, typ=I32)
        self.b.call(gomp, [trampoline, data, nthreads, ir.Constant(I32, 0)])

    def trampoline(self, tag: str, frame: ir.Type, body_fn: ir.Function, extent: int) -> ir.Function:
        """`void tag(frame*)`: unpack the captures and run chunks of [0, extent) on this thread until none are left,
        taking them from libgomp's guided schedule.

        Guided, not one fixed chunk per thread: the first chunks are a thread's share as a static split would make
        them (ceil(left / threads)), the last ones shrink to single iterations, so a thread that runs slower (the
        two vCPUs of these hosts do not run at one speed: a tuned GEMM 512 timed 47 GFLOP/s on one and 64 on the
        other in the same seconds) hands its tail to the faster one instead of keeping the other waiting at the
        end of the loop. A few atomic operations per thread and loop."""
        fn = ir.Function(self.mod.module, ir.FunctionType(VOID, [PTR]), tag)
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        b = ir.IRBuilder(fn.append_basic_block())
        data = fn.args[0]
        caps = [
            b.load(b.gep(data, [ir.Constant(I32, 0), ir.Constant(I32, k)], source_etype=frame), typ=t)
            for k, t in enumerate(frame.elements)
        ]
        lo, hi = b.alloca(I64), b.alloca(I64)
        start = self.mod.function("GOMP_loop_nonmonotonic_guided_start", I8, [I64, I64, I64, I64, PTR, PTR])
        step, min_chunk = ir.Constant(I64, 1), ir.Constant(I64, 1)
        got = b.call(start, [ir.Constant(I64, 0), ir.Constant(I64, extent), step, min_chunk, lo, hi])
        chunk, done = fn.append_basic_block("chunk"), fn.append_basic_block("done")
        b.cbranch(b.icmp_unsigned("!=", got, ir.Constant(I8, 0)), chunk, done)
        b.position_at_end(chunk)
        b.call(body_fn, [*caps, b.load(lo, typ=I64), b.load(hi, typ=I64)])
        more = b.call(self.mod.function("GOMP_loop_nonmonotonic_guided_next", I8, [PTR, PTR]), [lo, hi])
        b.cbranch(b.icmp_unsigned("!=", more, ir.Constant(I8, 0)), chunk, done)
        b.position_at_end(done)
        b.call(self.mod.function("GOMP_loop_end_nowait", VOID, []), [])  # GOMP_parallel's own end waits for all
        b.ret_void()
        return fn

    def allocate(self, s: Allocate) -> None:
        buf = s.buffer
        size = nbytes(s)
        if self.scratch is not None and id(s) in self.scratch[1]:
            base, offsets = self.scratch
            ptr = self.b.gep(base, [ir.Constant(I64, offsets[id(s)])], source_etype=I8)
            with self.bind(self.bufs, buf.name, (ptr, buf.dtype)):
                self.stmt(s.body)
            return
        if fits_stack(size, self.stack_bytes):
            self.stack_bytes += size
            ptr = self.allocas.alloca(ir.ArrayType(_memory_type(buf.dtype), buf.size), name=buf.name)
            ptr.align = 64
            ptr.type = PTR  # opaque, like every other buffer pointer, so vector loads/stores type-check
            with self.bind(self.bufs, buf.name, (ptr, buf.dtype)):
                self.stmt(s.body)
            return
        # a big buffer inside a parallel loop: one per thread chunk (aligned_alloc wants a multiple of the alignment)
        padded = ir.Constant(I64, -(-size // 64) * 64)
        ptr = self.b.call(self.mod.function("aligned_alloc", PTR, [I64, I64]), [ir.Constant(I64, 64), padded])
        with self.bind(self.bufs, buf.name, (ptr, buf.dtype)):
            self.stmt(s.body)
        self.b.call(self.mod.function("free", VOID, [PTR]), [ptr])

    def if_then_else(self, s: IfThenElse) -> None:
        cond = self.as_bool(s.cond)
        if _width(cond) is None:
            if s.orelse is None:
                with self.b.if_then(cond):
                    self.stmt(s.then)
                return
            with self.b.if_else(cond) as (then, orelse):
                with then:
                    self.stmt(s.then)
                with orelse:
                    self.stmt(s.orelse)
            return
        with self.masked(cond):
            self.stmt(s.then)
        if s.orelse is not None:
            with self.masked(self.b.not_(cond)):
                self.stmt(s.orelse)

    @contextmanager
    def masked(self, cond: ir.Value) -> Iterator[None]:
        outer = self.mask
        self.mask = cond if outer is None else self.b.and_(outer, cond)
        try:
            yield
        finally:
            self.mask = outer

    def store(self, s: Store) -> None:
        ptr, dtype = self.buffer(s.buffer)
        value = self.dot4(s) if dtype == "int32" else None
        if value is None:
            value = self.to_memory(self.convert(self.expr(s.value), s.value.dtype, dtype), dtype)
        align = dtypes.itemsize(dtype)
        elem = _memory_type(dtype)
        if self.lanes is None or not self.mod.uses(s.index, self.lanes.var):
            if _width(value) is not None:
                raise BuildError(f"kernel {self.kernel}: lanes would race on {s.buffer}[{s.index}] (codegen bug)")
            addr = self.b.gep(ptr, [self.index(s.index)], source_etype=elem)
            if self.mask is None:
                self.b.store(value, addr, align=align)
            else:  # a uniform store under a lane mask happens if any lane is active
                with self.b.if_then(self.any_lane(self.mask)):
                    self.b.store(value, addr, align=align)
            return
        width = self.lanes.width
        value = self.splat(value, width)
        if self.mod.coeff(s.index, self.lanes.var) == 1:
            addr = self.b.gep(ptr, [self.index_at_start(s.index)], source_etype=elem)
            if self.mask is None:
                self.b.store(value, addr, align=align)
            else:
                fn = self.mod.intrinsic(
                    "llvm.masked.store", VOID, [value.type, PTR, I32, self.mask.type], [value.type, PTR]
                )
                self.b.call(fn, [value, addr, ir.Constant(I32, align), self.mask])
            return
        addrs = self.vector_gep(ptr, self.index(s.index), elem)
        fn = self.mod.intrinsic(
            "llvm.masked.scatter", VOID, [value.type, addrs.type, I32, self.lane_mask().type], [value.type, addrs.type]
        )
        self.b.call(fn, [value, addrs, ir.Constant(I32, align), self.lane_mask()])

    def dot4(self, s: Store) -> ir.Value | None:
        """The value of a vectorized `acc + dot4` store through the target's dot-product instructions
        (codegen.dot4), or None when `s` is not one or the target has no form for its lane count."""
        lanes = self.lanes
        if lanes is None or self.mask is not None:
            return None
        form = self.mod.dot4_isa.chunk(lanes.width)
        m = self.mod.dot4(s, lanes.var) if form is not None else None
        if m is None or form is None:
            return None
        chunk, vnni = form
        bytes_ty = ir.VectorType(I8, dot4.DOT * chunk)
        acc = self.expr(m.acc)
        a_ptr, _ = self.buffer(m.a.buffer)
        a4 = self.b.load(self.b.gep(a_ptr, [self.index(m.a.indices[0])], source_etype=I8), typ=I32, align=1)
        a_bytes = self.b.bitcast(self.splat(a4, chunk), bytes_ty)  # the row's 4 activation bytes in every lane
        w_ptr, _ = self.buffer(m.w.buffer)
        w_at = self.index_at_start(m.w.indices[0])
        out = []
        for c in range(lanes.width // chunk):
            addr = self.b.gep(w_ptr, [self.b.add(w_at, ir.Constant(I64, dot4.DOT * chunk * c))], source_etype=I8)
            w = self.b.load(addr, typ=bytes_ty, align=1)
            part = self.lanes_slice(acc, c * chunk, chunk)
            out.append(self.vpdpbusd(part, a_bytes, w) if vnni else self.maddubs_dot(part, a_bytes, w))
        return self.concat(out, lanes.width)

    def vpdpbusd(self, acc: ir.Value, a: ir.Value, w: ir.Value) -> ir.Value:
        """acc + the 4-byte dot products of u8 `a` and s8 `w` per int32 lane (AVX512-VNNI / AVX-VNNI)."""
        bits = acc.type.count * 32
        fn = self.mod.function(f"llvm.x86.avx512.vpdpbusd.{bits}", acc.type, [acc.type, a.type, w.type])
        return self.b.call(fn, [acc, a, w])

    def maddubs_dot(self, acc: ir.Value, a: ir.Value, w: ir.Value) -> ir.Value:
        """vpdpbusd without VNNI, exact: vpmaddubsw on w's low 6 bits and on its high part w >> 6, each pair sum
        within int16 (codegen.dot4), widened by vpmaddwd with 1 and with 64."""
        lanes = acc.type.count
        words = ir.VectorType(I16, 2 * lanes)
        if lanes == 16:
            maddubs, maddwd = "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"
        else:
            maddubs, maddwd = "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"
        ubs = self.mod.function(maddubs, words, [a.type, a.type])
        wd = self.mod.function(maddwd, acc.type, [words, words])
        low = self.b.and_(w, filled(w.type, 63))
        high = self.b.ashr(w, filled(w.type, 6))
        lo = self.b.call(wd, [self.b.call(ubs, [a, low]), filled(words, 1)])
        hi = self.b.call(wd, [self.b.call(ubs, [a, high]), filled(words, 64)])
        return self.b.add(acc, self.b.add(lo, hi))

    # ------------------------------------------------------------------------------------------ memory

    def buffer(self, name: str) -> tuple[ir.Value, str]:
        try:
            return self.bufs[name]
        except KeyError:
            raise BuildError(f"kernel {self.kernel}: buffer {name!r} is neither a parameter nor allocated") from None

    def index(self, e: Expr) -> ir.Value:
        return self.convert(self.expr(e), e.dtype, dtypes.INDEX)

    def index_at_start(self, e: Expr) -> ir.Value:
        """The scalar index of the first lane of an index that steps by one per lane."""
        lanes, mask = self.lanes, self.mask
        self.lanes = self.mask = None
        try:
            with self.bind(self.env, lanes.var, lanes.start):
                return self.index(e)
        finally:
            self.lanes, self.mask = lanes, mask

    def vector_gep(self, ptr: ir.Value, index: ir.Value, elem: ir.Type) -> ir.Value:
        addrs = self.b.gep(ptr, [self.splat(index, self.lanes.width)], source_etype=elem)
        addrs.type = ir.VectorType(PTR, self.lanes.width)  # llvmlite types a vector GEP as a scalar pointer
        return addrs

    def lane_mask(self) -> ir.Value:
        if self.mask is not None:
            return self.mask
        return ir.Constant(ir.VectorType(I1, self.lanes.width), [1] * self.lanes.width)

    def any_lane(self, mask: ir.Value) -> ir.Value:
        fn = self.mod.intrinsic("llvm.vector.reduce.or", I1, [mask.type], [mask.type])
        return self.b.call(fn, [mask])

    def to_memory(self, v: ir.Value, dtype: str) -> ir.Value:
        return self.b.zext(v, self.retype(v, I8)) if dtype == "bool" else v

    def from_memory(self, v: ir.Value, dtype: str) -> ir.Value:
        return self.b.icmp_unsigned("!=", v, zero(v.type)) if dtype == "bool" else v

    def load(self, e: Load) -> ir.Value:
        ptr, dtype = self.buffer(e.buffer)
        elem, align = _memory_type(dtype), dtypes.itemsize(dtype)
        idx = e.indices[0]
        lanes = self.lanes
        if lanes is not None and self.mod.uses(idx, lanes.var) and self.mod.coeff(idx, lanes.var) == 1:
            addr = self.b.gep(ptr, [self.index_at_start(idx)], source_etype=elem)
            vty = ir.VectorType(elem, lanes.width)
            if self.mask is None:
                return self.from_memory(self.b.load(addr, typ=vty, align=align), dtype)
            return self.from_memory(self.masked_load(addr, vty, align, self.mask), dtype)
        step = self.mod.coeff(idx, lanes.var) if lanes is not None and self.mod.uses(idx, lanes.var) else None
        if step is not None and 2 <= step <= MAX_LOAD_STRIDE and lanes.width * step <= MAX_LANES:
            return self.from_memory(self.strided_load(ptr, elem, align, idx, step), dtype)
        index = self.index(idx)
        if lanes is None or (_width(index) is None and self.mask is None):
            addr = self.b.gep(ptr, [index], source_etype=elem)
            return self.from_memory(self.b.load(addr, typ=elem, align=align), dtype)
        # lanes read scattered elements, or one element under a lane mask that may leave no lane active
        addrs = self.vector_gep(ptr, index, elem)
        vty = ir.VectorType(elem, lanes.width)
        mask = self.lane_mask()
        fn = self.mod.intrinsic("llvm.masked.gather", vty, [addrs.type, I32, mask.type, vty], [vty, addrs.type])
        return self.from_memory(self.b.call(fn, [addrs, ir.Constant(I32, align), mask, zero(vty)]), dtype)

    def masked_load(self, addr: ir.Value, vty: ir.VectorType, align: int, mask: ir.Value) -> ir.Value:
        """llvm.masked.load, zero in inactive lanes. A lane count that is not a power of two is loaded as the next
        power of two with the extra lanes masked off, then narrowed: LLVM 22's x86 lowering of an odd-width masked
        load (<9 x float> on AVX2, as a 7-wide conv's padded row is) can read a lane whose mask is off once
        neighbouring loads are combined (tests/test_codegen.py has the case)."""
        n = vty.count
        wide_n = 1 << (n - 1).bit_length()
        wty = ir.VectorType(vty.element, wide_n)
        if wide_n != n:
            pick = ir.Constant(ir.VectorType(I32, wide_n), [*range(n), *[n] * (wide_n - n)])  # lane n: all off
            mask = self.b.shuffle_vector(mask, zero(mask.type), pick)
        fn = self.mod.intrinsic("llvm.masked.load", wty, [PTR, I32, mask.type, wty], [wty, PTR])
        v = self.b.call(fn, [addr, ir.Constant(I32, align), mask, zero(wty)])
        if wide_n == n:
            return v
        return self.b.shuffle_vector(v, zero(wty), ir.Constant(ir.VectorType(I32, n), list(range(n))))

    def strided_load(self, ptr: ir.Value, elem: ir.Type, align: int, idx: Expr, step: int) -> ir.Value:
        """Lanes that read every `step`-th element (stride-2 convolutions, pooling): one masked load of the
        contiguous span, then a shuffle, instead of a gather. The mask reads only the elements used, so the span
        never touches memory past the last one."""
        width = self.lanes.width
        wide = ir.VectorType(elem, width * step)
        pattern = [j % step == 0 for j in range(width * step)]
        mask: ir.Value = ir.Constant(ir.VectorType(I1, width * step), pattern)
        if self.mask is not None:
            spread = self.b.shuffle_vector(
                self.mask,
                zero(self.mask.type),
                ir.Constant(ir.VectorType(I32, width * step), [j // step for j in range(width * step)]),
            )
            mask = self.b.and_(mask, spread)
        addr = self.b.gep(ptr, [self.index_at_start(idx)], source_etype=elem)
        span = self.masked_load(addr, wide, align, mask)
        pick = ir.Constant(ir.VectorType(I32, width), [j * step for j in range(width)])
        return self.b.shuffle_vector(span, zero(wide), pick)

    # ------------------------------------------------------------------------------------------ expressions

    def expr(self, e: Expr) -> ir.Value:
        if isinstance(e, Const):
            return self.const(e.value, e.dtype)
        if isinstance(e, Var):
            try:
                return self.env[e.name]
            except KeyError:
                raise BuildError(f"kernel {self.kernel}: variable {e.name!r} is used outside its loop") from None
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Binary):
            return self.index_arith(e) if dtypes.is_int(e.dtype) else self.binary(e)
        if isinstance(e, Unary):
            return self.unary(e.op, self.expr(e.a), e.dtype)
        if isinstance(e, Cast):
            return self.convert(self.expr(e.a), e.a.dtype, e.dtype)
        if isinstance(e, Select):
            return self.select(e)
        raise BuildError(f"kernel {self.kernel}: codegen does not know expression {type(e).__name__} ({e})")

    def index_arith(self, e: Binary) -> ir.Value:
        """Integer arithmetic on loop variables (an index), emitted once per basic block and variable values: the
        statements of an unrolled body all compute `p * 64 + co * 16` anew otherwise, which on a Winograd transform
        was most of the instructions, and of the time to build and compile them."""
        leaves = self.mod.int_leaves(e)
        if leaves is None:
            return self.binary(e)
        values = tuple(self.env.get(v) for v in leaves)
        key = (id(e), id(self.b.block), *map(id, values))
        hit = self.memo.get(key)
        # the entry keeps its expression and values alive, so their ids are not reused while it exists
        if hit is not None and hit[0] is e and all(a is b for a, b in zip(hit[1], values)):
            return hit[2]
        out = self.binary(e)
        self.memo[key] = (e, values, out)
        return out

    def const(self, value, dtype: str, width: int | None = None) -> ir.Constant:
        if dtypes.is_float(dtype):
            value = float(value)
        else:
            value = _wrap_int(int(value), dtypes.bits(dtype)) if dtype != "bool" else int(bool(value))
        return filled(_value_type(dtype, width), value)

    def as_bool(self, e: Expr) -> ir.Value:
        return self.convert(self.expr(e), e.dtype, "bool")

    def retype(self, like: ir.Value, scalar: ir.Type) -> ir.Type:
        w = _width(like)
        return scalar if w is None else ir.VectorType(scalar, w)

    def splat(self, v: ir.Value, width: int) -> ir.Value:
        if _width(v) is not None:
            return v
        vty = ir.VectorType(v.type, width)
        if isinstance(v, ir.Constant) and not isinstance(v.constant, (list, tuple)):
            return filled(vty, v.constant)
        one = self.b.insert_element(zero(vty), v, ir.Constant(I32, 0))
        return self.b.shuffle_vector(one, zero(vty), zero(ir.VectorType(I32, width)))

    def unify(self, *vals: ir.Value) -> list[ir.Value]:
        """Broadcast uniform operands to the lane count of the vector ones."""
        width = next((_width(v) for v in vals if _width(v) is not None), None)
        return list(vals) if width is None else [self.splat(v, width) for v in vals]

    def convert(self, v: ir.Value, src: str, dst: str) -> ir.Value:
        """Cast like numpy's astype (float → int truncates toward zero)."""
        if src == dst:
            return v
        b, ty = self.b, self.retype(v, _SCALAR[dst])
        if dst == "bool":
            z = zero(v.type)
            return b.fcmp_unordered("!=", v, z) if dtypes.is_float(src) else b.icmp_unsigned("!=", v, z)
        if dtypes.is_float(src) and dtypes.is_float(dst):
            return b.fpext(v, ty) if dtypes.bits(dst) > dtypes.bits(src) else b.fptrunc(v, ty)
        if dtypes.is_float(src):
            if dtypes.bits(dst) < 32:  # through i32 so out-of-range values wrap like numpy on x86, not poison
                return b.trunc(b.fptosi(v, self.retype(v, I32)), ty)
            if dst == "uint32":  # through i64: values past int32's range are in uint32's
                return b.trunc(b.fptosi(v, self.retype(v, I64)), ty)
            if dst == "uint64":  # fptosi below 2^63 (a negative value wraps, as numpy's does), fptoui from there
                big = b.fcmp_ordered(">=", v, splat_const(v, 2.0**63))
                return b.select(big, b.fptoui(v, ty), b.fptosi(v, ty))
            return b.fptosi(v, ty)
        signed = dtypes.is_signed(src)
        if dtypes.is_float(dst):
            return b.sitofp(v, ty) if signed else b.uitofp(v, ty)
        if dtypes.bits(dst) < dtypes.bits(src):
            return b.trunc(v, ty)
        return b.sext(v, ty) if signed else b.zext(v, ty)

    def binary(self, e: Binary) -> ir.Value:
        if e.op in ("and", "or"):
            a = self.as_bool(e.a)
            ca = _bool_const(a)
            if ca is not None:  # an unrolled index made it constant: the other side decides, or is never needed
                return self.as_bool(e.b) if ca == (e.op == "and") else a
            b = self.as_bool(e.b)
            cb = _bool_const(b)
            if cb is not None:
                return a if cb == (e.op == "and") else b
            a, b = self.unify(a, b)
            return self.b.and_(a, b) if e.op == "and" else self.b.or_(a, b)
        dt = dtypes.promote(e.a.dtype, e.b.dtype) if e.op in COMPARISONS else e.dtype
        a = self.convert(self.expr(e.a), e.a.dtype, dt)
        b = self.convert(self.expr(e.b), e.b.dtype, dt)
        if e.op in COMPARISONS:
            a, b = self.unify(a, b)
            return self.compare(e.op, a, b, dt)
        if dtypes.is_float(dt):
            return self.float_arith(e.op, *self.unify(a, b))
        return self.int_arith(e.op, a, b, dt)

    def compare(self, op: str, a: ir.Value, b: ir.Value, dt: str) -> ir.Value:
        ca, cb = _int_const(a), _int_const(b)
        if ca is not None and cb is not None and not dtypes.is_float(dt):  # unrolled indices (a pad's bounds test)
            return ir.Constant(ir.IntType(1), int(_COMPARE[op](ca, cb)))
        return llvm_arith.compare(self.b, op, a, b, dt)

    def float_arith(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
        value = llvm_arith.float_binary(self.b, op, a, b, self._float_call)
        if value is None:
            raise BuildError(f"kernel {self.kernel}: unknown binary op {op!r}")
        return value

    def _float_call(self, name: str, *args: ir.Value) -> ir.Value:
        return self.libm(name, *args) if name in _LIBM else self.math(name, *args)

    def int_arith(self, op: str, a: ir.Value, b: ir.Value, dt: str) -> ir.Value:
        ca, cb = _int_const(a), _int_const(b)
        if ca is not None and cb is not None and op in _FOLD:  # unrolled indices fold to constants SROA can use
            return self.const(_FOLD[op](ca, cb), dt)
        if dt == "bool" and op in _BOOL_ARITH:
            op = _BOOL_ARITH[op]
            a, b = self.unify(a, b)
            return {"or": self.b.or_, "and": self.b.and_, "xor": self.b.xor}[op](a, b)
        if op in ("div", "floordiv", "mod"):
            return self.int_division(op == "mod", a, b, cb, dt)
        if op == "pow":
            return self.int_pow(a, b, dt)
        if op in ("shl", "shr"):
            return self.shift(op == "shl", *self.unify(a, b), dt)
        if op == "add" and cb == 0:
            return a
        if op == "mul" and cb == 1:
            return a
        a, b = self.unify(a, b)
        if op in ("add", "sub", "mul"):
            return {"add": self.b.add, "sub": self.b.sub, "mul": self.b.mul}[op](a, b)
        if op in ("min", "max"):
            kind = ("s" if dtypes.is_signed(dt) else "u") + op
            return self.math(f"llvm.{kind}", a, b)
        raise BuildError(f"kernel {self.kernel}: unknown binary op {op!r} for {dt}")

    def int_division(self, is_mod: bool, a: ir.Value, b: ir.Value, cb: int | None, dt: str) -> ir.Value:
        return llvm_arith.int_division(self.b, is_mod, *self.unify(a, b), cb, dt)

    def shift(self, left: bool, a: ir.Value, b: ir.Value, dt: str) -> ir.Value:
        return llvm_arith.shift(self.b, left, a, b, dt)

    def int_pow(self, a: ir.Value, b: ir.Value, dt: str) -> ir.Value:
        a64, b64 = self.convert(a, dt, "int64"), self.convert(b, dt, "int64")
        out = self.per_lane(lambda x, y: self.b.call(self.mod.ipow(), [x, y]), a64, b64)
        return self.convert(out, "int64", dt)

    def per_lane(self, scalar_op: Callable[..., ir.Value], *args: ir.Value) -> ir.Value:
        """Apply a scalar-only operation lane by lane."""
        args = self.unify(*args)
        width = _width(args[0])
        if width is None:
            return scalar_op(*args)
        results = [scalar_op(*(self.b.extract_element(x, ir.Constant(I32, i)) for x in args)) for i in range(width)]
        out = zero(ir.VectorType(results[0].type, width))
        for i, r in enumerate(results):
            out = self.b.insert_element(out, r, ir.Constant(I32, i))
        return out

    def math(self, name: str, *args: ir.Value) -> ir.Value:
        """Call an overloaded LLVM intrinsic on (possibly vector) operands of one type."""
        args = self.unify(*args)
        t = args[0].type
        return self.b.call(self.mod.intrinsic(name, t, [t] * len(args), [t]), list(args))

    def unary(self, op: str, x: ir.Value, dt: str) -> ir.Value:
        b = self.b
        is_float = dtypes.is_float(dt)
        if op == "not":
            return b.not_(x)
        if op == "neg":
            return b.fneg(x) if is_float else b.neg(x)
        if op == "abs":
            if is_float:
                return self.math("llvm.fabs", x)
            if not dtypes.is_signed(dt):
                return x
            return b.call(self.mod.intrinsic("llvm.abs", x.type, [x.type, I1], [x.type]), [x, ir.Constant(I1, 0)])
        if op in ("floor", "roundeven") and not is_float:
            return x
        if not is_float:
            raise BuildError(f"kernel {self.kernel}: {op} needs a float operand, got {dt}")
        one = splat_const(x, 1.0)
        if op in _LIBM:
            return self.libm(op, x)
        if op in ("sqrt", "floor", "roundeven"):  # roundeven: one vrndscaleps / roundps
            return self.math(f"llvm.{op}", x)
        if op == "rsqrt":
            return b.fdiv(one, self.math("llvm.sqrt", x))
        if op == "sigmoid":
            return b.fdiv(one, b.fadd(one, self.libm("exp", b.fneg(x))))
        raise BuildError(f"kernel {self.kernel}: unknown intrinsic {op!r}")

    def libm(self, op: str, *args: ir.Value) -> ir.Value:
        """libm's `op` on float operands; vectors go to libmvec one register at a time where it is available."""
        args = self.unify(*args)
        width, t = _width(args[0]), args[0].type
        scalar = t.element if width is not None else t
        name = op + ("f" if isinstance(scalar, ir.FloatType) else "")
        if width is None or not self.mod.libmvec_bytes:
            if op in _LLVM_MATH:
                return self.math(f"llvm.{op}", *args)
            fn = self.mod.function(name, scalar, [scalar] * len(args))
            return self.per_lane(lambda *xs: self.b.call(fn, list(xs)), *args)
        lanes = self.mod.libmvec_bytes // (4 if isinstance(scalar, ir.FloatType) else 8)
        vty = ir.VectorType(scalar, lanes)
        isa = _LIBMVEC_ISA[self.mod.libmvec_bytes]
        fn = self.mod.function(f"_ZGV{isa}N{lanes}{'v' * len(args)}_{name}", vty, [vty] * len(args))
        chunks = [self.b.call(fn, [self.lanes_slice(x, at, lanes) for x in args]) for at in range(0, width, lanes)]
        return self.concat(chunks, width)

    def lanes_slice(self, v: ir.Value, start: int, n: int) -> ir.Value:
        """Lanes [start, start + n) of `v` (lanes past its end repeat lane 0)."""
        count = v.type.count
        if start == 0 and n == count:
            return v
        mask = [start + i if start + i < count else 0 for i in range(n)]
        return self.b.shuffle_vector(v, zero(v.type), ir.Constant(ir.VectorType(I32, n), mask))

    def concat(self, chunks: list[ir.Value], width: int) -> ir.Value:
        """The first `width` lanes of the chunks laid end to end."""
        while len(chunks) > 1:
            if len(chunks) % 2:
                chunks.append(zero(chunks[0].type))
            n = chunks[0].type.count
            mask = ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n)))
            chunks = [self.b.shuffle_vector(a, b, mask) for a, b in zip(chunks[::2], chunks[1::2])]
        return self.lanes_slice(chunks[0], 0, width)

    def select(self, e: Select) -> ir.Value:
        cond = self.as_bool(e.cond)
        known = _bool_const(cond)
        if known is not None:  # only the chosen branch exists
            return self.expr(e.t if known else e.f)
        if not (has_hazard(e.t) or has_hazard(e.f)):
            c, t, f = self.unify(cond, self.expr(e.t), self.expr(e.f))
            return self.b.select(c, t, f)
        if _width(cond) is not None:  # lanes: each branch only loads for the lanes that chose it
            with self.masked(cond):
                t = self.expr(e.t)
            with self.masked(self.b.not_(cond)):
                f = self.expr(e.f)
            c, t, f = self.unify(cond, t, f)
            return self.b.select(c, t, f)
        results = []
        with self.b.if_else(cond) as (then, orelse):
            for branch, sub in ((then, e.t), (orelse, e.f)):
                with branch:
                    results.append((self.expr(sub), self.b.block))
        return self.merge(results)

    def merge(self, results: list[tuple[ir.Value, ir.Block]]) -> ir.Value:
        """Phi of the two branch values of a lazy select (both broadcast if either is a vector)."""
        (t, tb), (f, fb) = results
        if _width(t) != _width(f):
            # the scalar one must be broadcast in its own block, before that block's branch
            vec_width = _width(t) or _width(f)
            fixed = []
            for v, blk in results:
                if _width(v) is None:
                    with self.b.goto_block(blk):
                        v = self.splat(v, vec_width)
                fixed.append((v, blk))
            (t, tb), (f, fb) = fixed
        phi = self.b.phi(t.type)
        phi.add_incoming(t, tb)
        phi.add_incoming(f, fb)
        return phi


def scratch_bytes_symbol(kernel: str) -> str:
    """The exported i64 constant holding how many scratch bytes `kernel` takes as its last argument (0: none)."""
    return f"{kernel}_scratch_bytes"


def generate(funcs: list[Func], libmvec_bytes: int = 0, features: str = "") -> str:
    """The LLVM IR module (text) holding every kernel of `funcs`; with `libmvec_bytes` (the vector register size)
    vector exp/log/tanh/erf/pow call glibc's libmvec instead of libm once per lane; `features` (LLVM's, of the
    target) pick the integer dot-product instructions (codegen.dot4)."""
    names = [f.name for f in funcs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise BuildError(f"kernel names must be unique, repeated: {sorted(dup)}")
    # no kernels (a model that folded to constants): the module holds the thread-count global alone
    mod = _ModuleEmitter(funcs[0].name if funcs else "kernels", libmvec_bytes, features)
    for f in funcs:
        mod.emit(f)
    return str(mod.module)
