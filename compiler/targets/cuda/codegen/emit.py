"""GPU loop IR → LLVM IR text for `nvptx64-nvidia-cuda` (llvmlite.ir), one kernel per module.

A `Func` of one launch becomes `ptx_kernel void name(ptr addrspace(1) noalias align 16 p0, ...)`, one global pointer
per param buffer in order (bool stored as one byte, float16 as half), then, when its program's "global"
intermediates need one, the workspace pointer (codegen.memory). Loop kinds map to: blockIdx.* / threadIdx.* → the
loop variable is the special register (a thread whose index is past a shorter loop's extent skips its body);
unrolled, vectorized and vthread → the body replicated with the variable replaced by a constant (a longer loop: an
LLVM loop it must fully unroll), so a thread's register tile is indexed by constants and a vectorized run of
neighbours becomes one wide load; serial → an LLVM loop. `Barrier` is `bar.sync 0`. Index arithmetic is 32-bit when
every buffer has under 2^31 elements. Math goes to libdevice's `__nv_*` functions (linked in codegen.libdevice);
float16 arithmetic is done in float32.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from llvmlite import ir

from compiler.base import dtypes
from compiler.base.errors import BuildError
from compiler.schedule.loopir import (
    BLOCK_KINDS,
    THREAD_KINDS,
    Allocate,
    Barrier,
    Buffer,
    For,
    Func,
    IfThenElse,
    Seq,
    Stmt,
    Store,
    walk_stmts,
)
from compiler.targets import llvm_arith
from compiler.targets.cuda.codegen.launch import LaunchShape
from compiler.targets.cuda.codegen.memory import PARAM_ALIGN, SHARED_ALIGN
from compiler.tensor.te import Binary, Cast, Const, Expr, Load, Select, Unary, Var, free_vars, walk

TRIPLE = "nvptx64-nvidia-cuda"
GLOBAL, SHARED = 1, 3  # NVPTX address spaces
REPLICATE_LIMIT = 64  # unrolled / vectorized / vthread loops up to this extent are replicated with constant indices
INT32_MAX = 2**31 - 1

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
VOID = ir.VoidType()
GLOBAL_PTR, SHARED_PTR, PTR = ir.PointerType(addrspace=GLOBAL), ir.PointerType(addrspace=SHARED), ir.PointerType()
_SCALAR = {
    "bool": I1,
    "int8": I8,
    "uint8": I8,
    "uint16": I16,
    "int32": I32,
    "uint32": I32,
    "int64": I64,
    "uint64": I64,
    "float16": ir.HalfType(),
    "float32": ir.FloatType(),
    "float64": ir.DoubleType(),
}
_BITS = {"float16": 16}  # dtypes.bits for what compiler.base.dtypes does not list
_SREG = {
    "blockIdx.x": "ctaid.x",
    "blockIdx.y": "ctaid.y",
    "blockIdx.z": "ctaid.z",
    "threadIdx.x": "tid.x",
    "threadIdx.y": "tid.y",
    "threadIdx.z": "tid.z",
}
_BOOL_ARITH = {"add": "or", "mul": "and", "sub": "xor", "max": "or", "min": "and"}  # numpy's bool algebra
_LIBDEVICE = ("exp", "log", "tanh", "erf", "sin", "cos", "pow", "rsqrt")  # __nv_<op>f (float32) and __nv_<op>
_REPLICATED = ("unrolled", "vectorized", "vthread")


def _bits(dtype: str) -> int:
    return _BITS.get(dtype) or dtypes.bits(dtype)


def _is_float(dtype: str) -> bool:
    return dtype.startswith("float")


def _is_signed(dtype: str) -> bool:
    return dtype.startswith("int") or _is_float(dtype)


def _memory_type(dtype: str) -> ir.Type:
    if dtype not in _SCALAR:
        raise BuildError(f"dtype {dtype!r} has no GPU representation; the GPU dtypes are {', '.join(_SCALAR)}")
    return I8 if dtype == "bool" else _SCALAR[dtype]


def _mangle(t: ir.Type) -> str:
    return f"i{t.width}" if isinstance(t, ir.IntType) else {"half": "f16", "float": "f32", "double": "f64"}[str(t)]


def _int_const(v: ir.Value) -> int | None:
    if isinstance(v, ir.Constant) and isinstance(v.type, ir.IntType) and isinstance(v.constant, int):
        return v.constant
    return None


def _wrap(value: int, bits: int) -> int:
    """`value` wrapped to a signed `bits`-bit integer."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if bits > 1 and value >= 1 << (bits - 1) else value


def _has_load(e: Expr) -> bool:
    return any(isinstance(n, Load) for n in walk(e))


def _fits_int32(f: Func, workspace: list[Buffer]) -> bool:
    """True if every buffer offset and loop variable of `f` fits 32-bit index arithmetic."""
    sizes = [b.size for b in (*f.params, *workspace)]
    for s in walk_stmts(f.body):
        if isinstance(s, Allocate):
            sizes.append(s.buffer.size)
        elif isinstance(s, For):
            sizes.append(s.extent)
    return max(sizes, default=0) <= INT32_MAX


class KernelEmitter:
    """Emits one kernel into `module`: statements, then expressions, into a single LLVM function."""

    def __init__(self, module: ir.Module, f: Func, shape: LaunchShape, workspace: dict[str, tuple[int, Buffer]]):
        self.module, self.func, self.shape = module, f, shape
        self.index_type = I32 if _fits_int32(f, [b for _, b in workspace.values()]) else I64
        nargs = len(f.params) + bool(workspace)
        fn = ir.Function(module, ir.FunctionType(VOID, [GLOBAL_PTR] * nargs), f.name)
        fn.calling_convention = "ptx_kernel"
        fn.attributes.add("nounwind")
        for arg, name in zip(fn.args, [*(b.name for b in f.params), "workspace"]):
            arg.name = name
            arg.add_attribute("noalias")
            arg.attributes.align = PARAM_ALIGN
        self.fn = fn
        entry, body = fn.append_basic_block("entry"), fn.append_basic_block("body")
        # allocas and special-register reads live in the entry block: SROA promotes the first, every use sees the second
        self.entry = ir.IRBuilder(entry)
        self.entry.position_before(self.entry.branch(body))
        self.b = ir.IRBuilder(body)
        self.bufs: dict[str, tuple[ir.Value, str]] = {b.name: (a, b.dtype) for a, b in zip(fn.args, f.params)}
        for name, (offset, buf) in workspace.items():
            self.bufs[name] = (self.entry.gep(fn.args[-1], [ir.Constant(I64, offset)], source_etype=I8), buf.dtype)
        self.env: dict[str, ir.Value] = {}
        self.narrow = False  # evaluating an index: int64 arithmetic in self.index_type
        self.sregs: dict[str, ir.Value] = {}
        self.thread_vars: set[str] = set()  # variables of the enclosing threadIdx loops: differ between threads
        self.shared: dict[int, tuple[Allocate, ir.GlobalVariable]] = {}  # shared arrays by Allocate statement

    def emit(self) -> None:
        self.stmt(self.func.body)
        self.b.ret_void()
        dims = dict(zip("xyz", self.shape.block))
        for axis, n in dims.items():
            self.module.add_named_metadata(
                "nvvm.annotations", [self.fn, ir.MetaDataString(self.module, f"maxntid{axis}"), ir.Constant(I32, n)]
            )

    def fail(self, what: str) -> BuildError:
        return BuildError(f"kernel {self.func.name}: {what}")

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
        elif isinstance(s, Barrier):
            fn = self.declare("llvm.nvvm.barrier.cta.sync.aligned.all", VOID, [I32])
            self.b.call(fn, [ir.Constant(I32, 0)])
        else:
            raise self.fail(f"codegen does not know statement {type(s).__name__}")

    def loop(self, s: For) -> None:
        if s.extent <= 0:
            return
        if s.kind in _SREG:
            self.bound_loop(s)
        elif s.kind in _REPLICATED and s.extent <= REPLICATE_LIMIT and not s.llvm_unroll:
            for i in range(s.extent):
                with self.bind(self.env, s.var.name, ir.Constant(self.index_type, i)):
                    self.stmt(s.body)
        elif s.kind == "parallel":
            raise self.fail(f"loop {s.var} is parallel, a CPU loop kind: bind it to blockIdx/threadIdx instead")
        else:
            self.counted_loop(s, unroll=s.kind in _REPLICATED or s.llvm_unroll)

    def bound_loop(self, s: For) -> None:
        """A loop bound to a block or thread index: its variable is that index; threads (or blocks) past a shorter
        loop's extent skip its body, which then must not wait at a barrier the others reach."""
        index = self.sreg(s.kind)
        dims = self.shape.grid if s.kind in BLOCK_KINDS else self.shape.block
        launched = dims[(BLOCK_KINDS + THREAD_KINDS).index(s.kind) % 3]
        outer = self.thread_vars
        if s.kind in THREAD_KINDS:
            self.thread_vars = outer | {s.var.name}
        try:
            self.bound_body(s, index, launched)
        finally:
            self.thread_vars = outer

    def bound_body(self, s: For, index: ir.Value, launched: int) -> None:
        """The body of a bound loop, for the threads (blocks) whose index is below its extent."""
        with self.bind(self.env, s.var.name, index):
            if s.extent == launched:
                self.stmt(s.body)
                return
            if any(isinstance(c, Barrier) for c in walk_stmts(s.body)):
                raise self.fail(
                    f"loop {s.var} bound to {s.kind} has extent {s.extent} but {launched} are launched, and its "
                    "body holds a barrier the idle ones would never reach: give every loop bound to it one extent"
                )
            with self.b.if_then(self.b.icmp_unsigned("<", index, ir.Constant(self.index_type, s.extent))):
                self.stmt(s.body)

    def sreg(self, kind: str) -> ir.Value:
        """The special register of a block or thread index, read once in the entry block, with its range."""
        if kind not in self.sregs:
            fn = self.declare(f"llvm.nvvm.read.ptx.sreg.{_SREG[kind]}", I32, [])
            value = self.entry.call(fn, [])
            dims = self.shape.grid if kind in BLOCK_KINDS else self.shape.block
            n = dims[(BLOCK_KINDS + THREAD_KINDS).index(kind) % 3]
            value.set_metadata("range", self.module.add_metadata([ir.Constant(I32, 0), ir.Constant(I32, n)]))
            if self.index_type != I32:
                value = self.entry.zext(value, self.index_type)
            self.sregs[kind] = value
        return self.sregs[kind]

    def counted_loop(self, s: For, unroll: bool) -> None:
        """for var in [0, extent): body, rotated as LLVM's loop passes expect; `unroll` asks LLVM to unroll it fully."""
        b, ty = self.b, self.index_type
        pre, head, done = b.block, self.fn.append_basic_block("loop"), self.fn.append_basic_block("loop.end")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(ty)
        i.add_incoming(ir.Constant(ty, 0), pre)
        with self.bind(self.env, s.var.name, i):
            self.stmt(s.body)
        nxt = b.add(i, ir.Constant(ty, 1), flags=("nuw", "nsw"))
        i.add_incoming(nxt, b.block)
        latch = b.cbranch(b.icmp_signed("<", nxt, ir.Constant(ty, s.extent)), head, done)
        if unroll:
            hint = self.module.add_metadata([ir.MetaDataString(self.module, "llvm.loop.unroll.full")])
            node = self.module.add_metadata([ir.MetaDataString(self.module, f"loop.{len(self.module.metadata)}")])
            node.operands = (node, hint)  # a loop ID refers to itself, so LLVM keeps each one distinct
            latch.set_metadata("llvm.loop", node)
        b.position_at_end(done)

    def allocate(self, s: Allocate) -> None:
        buf = s.buffer
        elem = _memory_type(buf.dtype)
        if s.scope == "shared":
            ptr: ir.Value = self.shared_buffer(s)
        elif s.scope == "local":
            ptr = self.entry.alloca(ir.ArrayType(elem, buf.size), name=buf.name)
            ptr.align = 16
            ptr.type = PTR
        else:
            raise self.fail(
                f"global buffer {buf.name} is allocated inside a kernel launch (codegen.memory splits them)"
            )
        with self.bind(self.bufs, buf.name, (ptr, buf.dtype)):
            self.stmt(s.body)

    def shared_buffer(self, s: Allocate) -> ir.GlobalVariable:
        """The block's shared array of allocation `s`: one per statement, however often a replicated loop (a vthread)
        emits it, as each replica's use of it ends at a barrier before the next one's begins."""
        if id(s) not in self.shared:
            buf, arr = s.buffer, ir.ArrayType(_memory_type(s.buffer.dtype), s.buffer.size)
            name = f"{self.func.name}.{buf.name}.{len(self.shared) + 1}"
            var = ir.GlobalVariable(self.module, arr, name, addrspace=SHARED)
            var.linkage = "internal"
            var.initializer = ir.Constant(arr, ir.Undefined)  # shared memory cannot be initialized
            var.align = SHARED_ALIGN
            var.type = SHARED_PTR  # opaque, like every buffer pointer
            self.shared[id(s)] = (s, var)  # the statement is kept alive, so its id stays its own
        return self.shared[id(s)][1]

    def if_then_else(self, s: IfThenElse) -> None:
        varying = sorted(free_vars(s.cond) & self.thread_vars)
        if varying and any(isinstance(c, Barrier) for c in walk_stmts(s)):
            raise self.fail(
                f"a barrier under `if {s.cond}`, which depends on thread index {', '.join(varying)}: the threads "
                "that skip it never arrive; move the barrier out of the branch"
            )
        cond = self.as_bool(s.cond)
        if s.orelse is None:
            with self.b.if_then(cond):
                self.stmt(s.then)
            return
        with self.b.if_else(cond) as (then, orelse):
            with then:
                self.stmt(s.then)
            with orelse:
                self.stmt(s.orelse)

    def store(self, s: Store) -> None:
        ptr, dtype = self.buffer(s.buffer)
        value = self.convert(self.expr(s.value), s.value.dtype, dtype)
        if dtype == "bool":
            value = self.b.zext(value, I8)
        addr = self.b.gep(ptr, [self.index(s.index)], source_etype=_memory_type(dtype))
        self.b.store(value, addr, align=_bits(dtype) // 8 or 1)

    # ------------------------------------------------------------------------------------------ memory

    def buffer(self, name: str) -> tuple[ir.Value, str]:
        try:
            return self.bufs[name]
        except KeyError:
            raise self.fail(f"buffer {name!r} is neither a parameter nor allocated") from None

    def index(self, e: Expr) -> ir.Value:
        """An element offset, in the kernel's index type."""
        outer, self.narrow = self.narrow, True
        try:
            return self.resize(self.expr(e), e.dtype, self.index_type)
        finally:
            self.narrow = outer

    def load(self, e: Load) -> ir.Value:
        ptr, dtype = self.buffer(e.buffer)
        elem = _memory_type(dtype)
        addr = self.b.gep(ptr, [self.index(e.indices[0])], source_etype=elem)
        value = self.b.load(addr, typ=elem, align=_bits(dtype) // 8 or 1)
        return self.b.icmp_unsigned("!=", value, ir.Constant(I8, 0)) if dtype == "bool" else value

    # ------------------------------------------------------------------------------------------ expressions

    def expr(self, e: Expr) -> ir.Value:
        if isinstance(e, Const):
            return self.const(e.value, e.dtype)
        if isinstance(e, Var):
            try:
                value = self.env[e.name]
            except KeyError:
                raise self.fail(f"variable {e.name!r} is used outside its loop") from None
            return value if self.narrow else self.resize(value, e.dtype, _SCALAR[e.dtype])
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Binary):
            return self.binary(e)
        if isinstance(e, Unary):
            return self.unary(e)
        if isinstance(e, Cast):
            return self.convert(self.expr(e.a), e.a.dtype, e.dtype)
        if isinstance(e, Select):
            return self.select(e)
        raise self.fail(f"codegen does not know expression {type(e).__name__} ({e})")

    def value_type(self, dtype: str) -> ir.Type:
        """The LLVM type `dtype` is computed in here: an int64 index is narrowed to the kernel's index type."""
        if self.narrow and dtype == dtypes.INDEX:
            return self.index_type
        try:
            return _SCALAR[dtype]
        except KeyError:
            raise self.fail(
                f"dtype {dtype!r} has no GPU representation; the GPU dtypes are {', '.join(_SCALAR)}"
            ) from None

    def const(self, value, dtype: str) -> ir.Constant:
        if _is_float(dtype):
            return ir.Constant(self.value_type(dtype), float(value))
        if dtype == "bool":
            return ir.Constant(I1, int(bool(value)))
        ty = self.value_type(dtype)
        if ty.width < 64 and ty is self.index_type and not -(2**31) <= int(value) <= INT32_MAX:
            ty = I64  # an index constant too big for 32 bits widens the arithmetic around it
        return ir.Constant(ty, _wrap(int(value), ty.width))

    def resize(self, v: ir.Value, dtype: str, ty: ir.Type) -> ir.Value:
        """An integer value of `dtype` (signedness) widened or truncated to type `ty`."""
        if v.type == ty or not isinstance(ty, ir.IntType):
            return v
        if v.type.width > ty.width:
            return self.b.trunc(v, ty)
        return self.b.sext(v, ty) if _is_signed(dtype) and dtype != "bool" else self.b.zext(v, ty)

    def as_bool(self, e: Expr) -> ir.Value:
        return self.convert(self.expr(e), e.dtype, "bool")

    def convert(self, v: ir.Value, src: str, dst: str) -> ir.Value:
        """Cast like numpy's astype (float → int truncates toward zero)."""
        b, ty = self.b, self.value_type(dst)
        if src == dst:
            return self.resize(v, src, ty)
        if dst == "bool":
            zero = ir.Constant(v.type, None)
            return b.fcmp_unordered("!=", v, zero) if _is_float(src) else b.icmp_unsigned("!=", v, zero)
        if _is_float(src) and _is_float(dst):
            return b.fpext(v, ty) if _bits(dst) > _bits(src) else b.fptrunc(v, ty)
        if src == "float16":  # half to an integer through float32 (2^63 has no half)
            v, src = b.fpext(v, _SCALAR["float32"]), "float32"
        if _is_float(src):
            if _bits(dst) < 32:  # through i32, so an out-of-range value wraps as numpy's does on x86
                return b.trunc(b.fptosi(v, I32), ty)
            if dst == "uint32":
                return b.trunc(b.fptosi(v, I64), ty)
            if dst == "uint64":
                big = b.fcmp_ordered(">=", v, ir.Constant(v.type, 2.0**63))
                return b.select(big, b.fptoui(v, ty), b.fptosi(v, ty))
            return b.fptosi(v, ty)
        if _is_float(dst):
            return b.sitofp(v, ty) if _is_signed(src) and src != "bool" else b.uitofp(v, ty)
        return self.resize(v, src, ty)

    def unify(self, a: ir.Value, b: ir.Value, dtype: str) -> tuple[ir.Value, ir.Value]:
        """Two integers of `dtype` at one width (an index narrowed to 32 bits meets a 64-bit value)."""
        if not (isinstance(a.type, ir.IntType) and isinstance(b.type, ir.IntType)) or a.type == b.type:
            return a, b
        wide = a.type if a.type.width > b.type.width else b.type
        return self.resize(a, dtype, wide), self.resize(b, dtype, wide)

    def binary(self, e: Binary) -> ir.Value:
        if e.op in ("and", "or"):
            a, b = self.as_bool(e.a), self.as_bool(e.b)
            return self.b.and_(a, b) if e.op == "and" else self.b.or_(a, b)
        dt = dtypes.promote(e.a.dtype, e.b.dtype) if e.op in llvm_arith.COMPARISONS else e.dtype
        work = "float32" if dt == "float16" else dt  # half arithmetic is done in float32, then rounded
        a, b = self.unify(
            self.convert(self.expr(e.a), e.a.dtype, work), self.convert(self.expr(e.b), e.b.dtype, work), work
        )
        if e.op in llvm_arith.COMPARISONS:
            return self.compare(e.op, a, b, work)
        if _is_float(work):
            return self.convert(self.float_arith(e.op, a, b), work, dt)
        return self.int_arith(e.op, a, b, dt)

    def compare(self, op: str, a: ir.Value, b: ir.Value, dt: str) -> ir.Value:
        return llvm_arith.compare(self.b, op, a, b, dt)

    def float_arith(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
        value = llvm_arith.float_binary(self.b, op, a, b, self._float_call)
        if value is None:
            raise self.fail(f"unknown binary op {op!r}")
        return value

    def _float_call(self, name: str, *args: ir.Value) -> ir.Value:
        """LLVM's intrinsics (floor, minimum, maximum: NaN-propagating min.NaN on sm_80+), libdevice's pow."""
        return self.intrinsic(name, *args) if name.startswith("llvm.") else self.libdevice(name, *args)

    def int_arith(self, op: str, a: ir.Value, b: ir.Value, dt: str) -> ir.Value:
        bld = self.b
        ca, cb = _int_const(a), _int_const(b)
        if ca is not None and cb is not None and op in ("add", "sub", "mul"):  # replicated loops' constant indices
            return ir.Constant(a.type, _wrap({"add": ca + cb, "sub": ca - cb, "mul": ca * cb}[op], a.type.width))
        if dt == "bool" and op in _BOOL_ARITH:
            return {"or": bld.or_, "and": bld.and_, "xor": bld.xor}[_BOOL_ARITH[op]](a, b)
        if op in ("add", "sub", "mul"):
            if (op == "add" and cb == 0) or (op == "mul" and cb == 1):
                return a
            return {"add": bld.add, "sub": bld.sub, "mul": bld.mul}[op](a, b)
        if op in ("div", "floordiv", "mod"):
            return self.int_division(op == "mod", a, b, cb, dt)
        if op in ("min", "max"):
            return self.intrinsic(f"llvm.{'s' if _is_signed(dt) else 'u'}{op}", a, b)
        if op in ("shl", "shr"):
            return self.shift(op == "shl", a, b, dt)
        if op == "pow":
            return self.resize(
                self.b.call(self.ipow(), [self.resize(a, dt, I64), self.resize(b, dt, I64)]), "int64", a.type
            )
        raise self.fail(f"unknown binary op {op!r} for {dt}")

    def int_division(self, is_mod: bool, a: ir.Value, b: ir.Value, cb: int | None, dt: str) -> ir.Value:
        return llvm_arith.int_division(self.b, is_mod, a, b, cb, dt)

    def shift(self, left: bool, a: ir.Value, b: ir.Value, dt: str) -> ir.Value:
        return llvm_arith.shift(self.b, left, a, b, dt)

    def unary(self, e: Unary) -> ir.Value:
        op, dt = e.op, e.dtype
        work = "float32" if dt == "float16" else dt
        x = self.convert(self.expr(e.a), e.a.dtype, work)
        bld = self.b
        if op == "not":
            if _is_float(dt):
                raise self.fail(f"not({e.a}) needs a bool or integer operand, got {dt}")
            return bld.not_(x)
        if not _is_float(dt):
            if op == "neg":
                return bld.neg(x)
            if op == "abs":
                if not _is_signed(dt):
                    return x
                return bld.call(
                    self.declare(f"llvm.abs.{_mangle(x.type)}", x.type, [x.type, I1]), [x, ir.Constant(I1, 0)]
                )
            if op in ("floor", "roundeven"):
                return x
            raise self.fail(f"{op} needs a float operand, got {dt}")
        return self.convert(self.float_unary(op, x), work, dt)

    def float_unary(self, op: str, x: ir.Value) -> ir.Value:
        bld, one = self.b, ir.Constant(x.type, 1.0)
        if op == "neg":
            return bld.fneg(x)
        if op == "abs":
            return self.intrinsic("llvm.fabs", x)
        if op in ("sqrt", "floor", "roundeven"):  # roundeven: cvt.rni
            return self.intrinsic(f"llvm.{op}", x)
        if op in _LIBDEVICE:
            return self.libdevice(op, x)
        if op == "sigmoid":
            return bld.fdiv(one, bld.fadd(one, self.libdevice("exp", bld.fneg(x))))
        raise self.fail(f"unknown intrinsic {op!r}")

    def select(self, e: Select) -> ir.Value:
        cond = self.as_bool(e.cond)
        if not (_has_load(e.t) or _has_load(e.f)):
            t, f = self.unify(self.expr(e.t), self.expr(e.f), e.dtype)
            return self.b.select(cond, t, f)
        # a load in a branch may be out of bounds where the other is chosen (a padded border): branch, then merge
        results = []
        with self.b.if_else(cond) as (then, orelse):
            for branch, sub in ((then, e.t), (orelse, e.f)):
                with branch:
                    results.append((self.expr(sub), self.b.block))
        (t, tb), (f, fb) = results
        if t.type != f.type:  # one side narrowed: widen it in its own block, before that block's branch
            wide = t.type if t.type.width > f.type.width else f.type
            fixed = []
            for v, blk in results:
                with self.b.goto_block(blk):
                    fixed.append((self.resize(v, e.dtype, wide), blk))
            (t, tb), (f, fb) = fixed
        phi = self.b.phi(t.type)
        phi.add_incoming(t, tb)
        phi.add_incoming(f, fb)
        return phi

    # ------------------------------------------------------------------------------------------ calls

    def declare(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args), name)
        return fn

    def intrinsic(self, name: str, *args: ir.Value) -> ir.Value:
        """An overloaded LLVM intrinsic on operands of one type."""
        t = args[0].type
        return self.b.call(self.declare(f"{name}.{_mangle(t)}", t, [t] * len(args)), list(args))

    def libdevice(self, op: str, *args: ir.Value) -> ir.Value:
        """libdevice's `__nv_<op>f` (float32) or `__nv_<op>` (float64)."""
        t = args[0].type
        name = f"__nv_{op}{'f' if isinstance(t, ir.FloatType) else ''}"
        return self.b.call(self.declare(name, t, [t] * len(args)), list(args))

    def ipow(self) -> ir.Function:
        """i64 power by squaring (a negative exponent gives 1), an internal helper function."""
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
        r2 = b.select(b.trunc(n, I1), b.mul(r, x), r)
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


def generate(f: Func, shape: LaunchShape, workspace: dict[str, tuple[int, Buffer]]) -> str:
    """The LLVM IR module (text) holding kernel `f` (one launch), its launch bounds and libdevice's reflection flag
    (`__CUDA_FTZ` = 0: libdevice keeps denormals). `workspace` gives each global buffer's byte offset in the
    workspace; when it has any, the kernel takes the workspace pointer after its params."""
    module = ir.Module(name=f.name)
    module.triple = TRIPLE
    KernelEmitter(module, f, shape, workspace).emit()
    module.add_named_metadata(
        "llvm.module.flags", [ir.Constant(I32, 4), ir.MetaDataString(module, "nvvm-reflect-ftz"), ir.Constant(I32, 0)]
    )
    return str(module)
