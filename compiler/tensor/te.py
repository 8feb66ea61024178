"""Tensor expressions: the algorithm half of the algorithm/schedule split.

`placeholder` and `compute` build tensors whose bodies are immutable `Expr` trees; nothing here knows
about schedules. The same `Expr` nodes are reused by loop IR for index and value arithmetic.
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.base import dtypes
from compiler.base.errors import InvalidExpr

ARITH = ("add", "sub", "mul", "div", "floordiv", "mod", "min", "max", "pow", "shl", "shr")
COMPARE = ("lt", "le", "eq", "ne", "gt", "ge")
LOGIC = ("and", "or")
_BOOL_RESULT = frozenset(COMPARE + LOGIC)  # ops whose result is a bool, looked up on every Binary built
INTRINSICS = (
    "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "floor", "roundeven", "abs", "sin", "cos", "neg", "not"
)  # fmt: skip
REDUCERS = ("sum", "max", "min")
SYMBOLS = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "floordiv": "//",
    "mod": "%",
    "shl": "<<",
    "shr": ">>",
    "lt": "<",
    "le": "<=",
    "eq": "==",
    "ne": "!=",
    "gt": ">",
    "ge": ">=",
    "and": "&&",
    "or": "||",
}


class Expr:
    """Base of expression nodes. Arithmetic operators build new nodes; `==` stays structural equality."""

    __slots__ = ()
    dtype: str

    def __add__(self, o):
        return Binary("add", self, wrap(o, self))

    def __radd__(self, o):
        return Binary("add", wrap(o, self), self)

    def __sub__(self, o):
        return Binary("sub", self, wrap(o, self))

    def __rsub__(self, o):
        return Binary("sub", wrap(o, self), self)

    def __mul__(self, o):
        return Binary("mul", self, wrap(o, self))

    def __rmul__(self, o):
        return Binary("mul", wrap(o, self), self)

    def __truediv__(self, o):
        return div(self, o)

    def __rtruediv__(self, o):
        return div(wrap(o, self), self)

    def __floordiv__(self, o):
        return Binary("floordiv", self, wrap(o, self))

    def __rfloordiv__(self, o):
        return Binary("floordiv", wrap(o, self), self)

    def __mod__(self, o):
        return Binary("mod", self, wrap(o, self))

    def __rmod__(self, o):
        return Binary("mod", wrap(o, self), self)

    def __pow__(self, o):
        return Binary("pow", self, wrap(o, self))

    def __lshift__(self, o):
        return shift_left(self, o)

    def __rshift__(self, o):
        return shift_right(self, o)

    def __neg__(self):
        return Unary("neg", self)

    def __lt__(self, o):
        return Binary("lt", self, wrap(o, self))

    def __le__(self, o):
        return Binary("le", self, wrap(o, self))

    def __gt__(self, o):
        return Binary("gt", self, wrap(o, self))

    def __ge__(self, o):
        return Binary("ge", self, wrap(o, self))

    def __and__(self, o):
        return Binary("and", self, wrap(o, self))

    def __or__(self, o):
        return Binary("or", self, wrap(o, self))

    def __invert__(self):
        return Unary("not", self)

    def __bool__(self):
        raise InvalidExpr(f"the truth value of expression {self} is unknown at definition time; use te.select")


@dataclass(frozen=True, slots=True)
class Const(Expr):
    value: int | float | bool
    dtype: str = dtypes.INDEX

    def __str__(self):
        if self.dtype == "float32":
            return f"{self.value!r}f"
        return repr(self.value)


@dataclass(frozen=True, slots=True)
class Var(Expr):
    """An index variable: a compute axis, a reduce axis (with its extent) or a loop variable."""

    name: str
    extent: int | None = None
    dtype: str = dtypes.INDEX

    def __str__(self):
        return self.name


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: str = field(init=False)

    def __post_init__(self):
        if self.op in _BOOL_RESULT:
            object.__setattr__(self, "dtype", "bool")
        else:
            a, b = self.a.dtype, self.b.dtype
            object.__setattr__(self, "dtype", a if a == b else dtypes.promote(a, b))

    def __str__(self):
        if self.op in ("min", "max", "pow"):
            return f"{self.op}({self.a}, {self.b})"
        return f"({self.a} {SYMBOLS[self.op]} {self.b})"


@dataclass(frozen=True, slots=True)
class Unary(Expr):
    """An intrinsic of one argument (exp, log, …, neg, not)."""

    op: str
    a: Expr

    @property
    def dtype(self):
        return self.a.dtype

    def __str__(self):
        return f"{self.op}({self.a})"


@dataclass(frozen=True, slots=True)
class Select(Expr):
    """cond ? t : f, evaluated lazily: only the chosen branch's loads happen."""

    cond: Expr
    t: Expr
    f: Expr

    @property
    def dtype(self):
        return self.t.dtype

    def __str__(self):
        return f"select({self.cond}, {self.t}, {self.f})"


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    dtype: str
    a: Expr

    def __str__(self):
        return f"{self.dtype}({self.a})"


@dataclass(frozen=True, slots=True)
class Load(Expr):
    """Read of one element of a named buffer (a tensor in TE, a buffer in loop IR)."""

    buffer: str
    indices: tuple[Expr, ...]
    dtype: str

    def __str__(self):
        return f"{self.buffer}[{', '.join(map(str, self.indices))}]"


@dataclass(frozen=True, slots=True)
class Reduce(Expr):
    """A commutative reduction over `axes`; only allowed as the whole body of a compute."""

    op: str
    body: Expr
    axes: tuple[Var, ...]

    @property
    def dtype(self):
        return self.body.dtype

    def __str__(self):
        return f"{self.op}({self.body}, axis=[{', '.join(f'{v.name}:{v.extent}' for v in self.axes)}])"


# ---------------------------------------------------------------------------------------------- tensors


@dataclass(frozen=True, slots=True)
class PlaceholderOp:
    pass


@dataclass(frozen=True, slots=True)
class ComputeOp:
    axes: tuple[Var, ...]
    body: Expr
    inputs: tuple[Tensor, ...]
    tag: str = ""


@dataclass(frozen=True, eq=False)
class Tensor:
    """A named tensor; identity, not structure, tells two tensors apart."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    op: PlaceholderOp | ComputeOp

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, idx: Any) -> Load:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != len(self.shape):
            raise InvalidExpr(f"tensor {self.name} has {len(self.shape)} dims but was indexed with {len(idx)}")
        indices = tuple(wrap(i) for i in idx)
        for i in indices:
            if not dtypes.is_int(i.dtype):
                raise InvalidExpr(f"tensor {self.name}: index {i} has dtype {i.dtype}; indices must be integers")
        if _reads is not None:
            _reads.append(self)
        return Load(self.name, indices, self.dtype)

    def __repr__(self):
        return f"Tensor({self.name}, {list(self.shape)}, {self.dtype})"


_reads: list[Tensor] | None = None  # tensors read while a compute body is being built


def _check_shape(shape: Sequence[int], name: str) -> tuple[int, ...]:
    try:
        shape = tuple(operator.index(s) for s in shape)  # index(), not int(): 2.5 must not become 2
    except TypeError:
        raise InvalidExpr(f"tensor {name}: shape {shape!r} must be a sequence of integers") from None
    if any(s <= 0 for s in shape):
        raise InvalidExpr(f"tensor {name}: every dimension must be positive, got {list(shape)}")
    return shape


def placeholder(shape: Sequence[int], dtype: str = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor."""
    return Tensor(name, _check_shape(shape, name), dtypes.check(dtype), PlaceholderOp())


def compute(shape: Sequence[int], fcompute: Callable[..., Any], name: str = "compute", tag: str = "") -> Tensor:
    """A tensor whose element at each index is `fcompute(*index)`; axis names come from the lambda's parameters."""
    global _reads
    shape = _check_shape(shape, name)
    if not callable(fcompute):
        raise InvalidExpr(f"compute {name}: expected a function of the {len(shape)} output indices, got {fcompute!r}")
    params = list(inspect.signature(fcompute).parameters)
    if len(params) != len(shape) and not any(
        p.kind == inspect.Parameter.VAR_POSITIONAL for p in inspect.signature(fcompute).parameters.values()
    ):
        raise InvalidExpr(f"compute {name}: the function takes {len(params)} indices but the shape has {len(shape)}")
    names = params if len(params) == len(shape) else [f"i{d}" for d in range(len(shape))]
    axes = tuple(Var(n, e) for n, e in zip(names, shape))
    outer, _reads = _reads, []
    try:
        body = wrap(fcompute(*axes))
        reads = _reads
    finally:
        _reads = outer
    _check_body(body, name, axes)
    inputs = tuple(dict.fromkeys(reads))  # de-duplicated, first-use order
    return Tensor(name, shape, body.dtype, ComputeOp(axes, body, inputs, tag))


def _check_body(body: Expr, name: str, axes: tuple[Var, ...]) -> None:
    dtypes.check(body.dtype)
    inner = body.body if isinstance(body, Reduce) else body
    if any(isinstance(e, Reduce) for e in walk(inner)):
        raise InvalidExpr(f"compute {name}: a reduction must be the whole body, not part of an expression")
    reduce_axes = body.axes if isinstance(body, Reduce) else ()
    clash = {a.name for a in axes} & {r.name for r in reduce_axes}
    if clash:
        raise InvalidExpr(f"compute {name}: reduce axis names {sorted(clash)} clash with the output axes")
    if len({r.name for r in reduce_axes}) != len(reduce_axes):
        raise InvalidExpr(f"compute {name}: a reduce axis is listed twice in {[r.name for r in reduce_axes]}")
    # variables are told apart by name in every later pass, so one that is not an axis here would be unbound
    # (a reduce axis used outside its reduction, or two reduce axes with one name)
    known = set(axes) | set(reduce_axes)
    stray = sorted({str(v) for v in walk(inner) if isinstance(v, Var) and v not in known})
    if stray:
        raise InvalidExpr(
            f"compute {name}: uses index variables {stray} that are neither its axes nor the axes of its reduction"
        )


def reduce_axis(extent: int | tuple[int, int], name: str = "k") -> Var:
    """A reduction axis over range(extent); a (0, n) pair is accepted like TVM's."""
    if isinstance(extent, tuple):
        if len(extent) != 2 or extent[0] != 0:
            raise InvalidExpr(f"reduce axis {name}: only (0, n) ranges are supported, got {extent}")
        extent = extent[1]
    try:
        n = operator.index(extent)
    except TypeError:
        raise InvalidExpr(f"reduce axis {name}: extent must be an integer, got {extent!r}") from None
    if n <= 0:
        raise InvalidExpr(f"reduce axis {name}: extent must be positive, got {extent}")
    return Var(name, n)


def _reducer(op: str):
    def reduce(expr: Expr, axis: Var | Sequence[Var]) -> Reduce:
        axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
        if not axes:
            raise InvalidExpr(f"te.{op}: a reduction needs at least one reduce axis (made with te.reduce_axis)")
        if any(not isinstance(a, Var) or a.extent is None for a in axes):
            raise InvalidExpr(f"te.{op}: reduce axes must be made with te.reduce_axis (they carry the extent)")
        return Reduce(op, wrap(expr), axes)

    reduce.__name__ = op
    reduce.__doc__ = f"{op.capitalize()}-reduction of `expr` over `axis`."
    return reduce


sum = _reducer("sum")  # noqa: A001 - the TE vocabulary
max = _reducer("max")  # noqa: A001
min = _reducer("min")  # noqa: A001


# ---------------------------------------------------------------------------------------------- helpers


def wrap(x: Any, like: Expr | None = None) -> Expr:
    """Turn a Python scalar into a Const; floats take the float dtype of `like` (default float32)."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(x, "bool")
    if isinstance(x, int):
        if like is not None and like.dtype != "bool":
            return Const(float(x) if dtypes.is_float(like.dtype) else x, like.dtype)
        return Const(x, dtypes.INDEX)
    if isinstance(x, float):
        dt = like.dtype if like is not None and dtypes.is_float(like.dtype) else "float32"
        return Const(x, dt)
    raise InvalidExpr(f"cannot use {x!r} ({type(x).__name__}) in a tensor expression")


def const(value: int | float | bool, dtype: str) -> Const:
    dtypes.check(dtype)
    if dtype == "bool":
        return Const(bool(value), dtype)
    return Const(float(value) if dtypes.is_float(dtype) else int(value), dtype)


def div(a: Any, b: Any) -> Expr:
    a = wrap(a, b if isinstance(b, Expr) else None)
    b = wrap(b, a)
    return Binary("div" if dtypes.is_float(dtypes.promote(a.dtype, b.dtype)) else "floordiv", a, b)


def select(cond: Any, t: Any, f: Any) -> Select:
    if isinstance(cond, bool):
        # `a == b` on expressions is structural equality, a plain bool: te.select(i == 0, ...) would silently pick
        raise InvalidExpr(
            "te.select: the condition is a Python bool; compare expressions with te.equal / te.not_equal"
            " (== and != test structural equality), or use a Python `if` for a condition known at definition time"
        )
    t = wrap(t, f if isinstance(f, Expr) else None)
    f = wrap(f, t)
    if t.dtype != f.dtype:
        raise InvalidExpr(f"select branches have different dtypes: {t.dtype} and {f.dtype}; cast one of them")
    return Select(wrap(cond), t, f)


def cast(dtype: str, x: Any) -> Expr:
    x = wrap(x)
    return x if x.dtype == dtypes.check(dtype) else Cast(dtype, x)


def _intrinsic(op: str):
    def fn(x: Any) -> Expr:
        x = wrap(x)
        if op not in ("abs", "neg", "not") and not dtypes.is_float(x.dtype):
            raise InvalidExpr(f"te.{op} needs a float argument, got {x.dtype}; cast it first")
        return Unary(op, x)

    fn.__name__ = op
    return fn


exp, log, sqrt, rsqrt, tanh, erf, sigmoid, floor, roundeven, abs, sin, cos = map(  # noqa: A001
    _intrinsic, ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "floor", "roundeven", "abs", "sin", "cos")
)


def power(a: Any, b: Any) -> Expr:
    a = wrap(a, b if isinstance(b, Expr) else None)
    return Binary("pow", a, wrap(b, a))


def maximum(a: Any, b: Any) -> Expr:
    a = wrap(a, b if isinstance(b, Expr) else None)
    return Binary("max", a, wrap(b, a))


def minimum(a: Any, b: Any) -> Expr:
    a = wrap(a, b if isinstance(b, Expr) else None)
    return Binary("min", a, wrap(b, a))


def equal(a: Any, b: Any) -> Expr:
    a = wrap(a, b if isinstance(b, Expr) else None)
    return Binary("eq", a, wrap(b, a))


def not_equal(a: Any, b: Any) -> Expr:
    a = wrap(a, b if isinstance(b, Expr) else None)
    return Binary("ne", a, wrap(b, a))


def _shift(op: str, a: Any, b: Any) -> Expr:
    a = wrap(a, b if isinstance(b, Expr) else None)
    b = wrap(b, a)
    if not (dtypes.is_int(a.dtype) and a.dtype == b.dtype):
        name = "shift_left" if op == "shl" else "shift_right"
        raise InvalidExpr(f"te.{name} shifts an integer by a count of its dtype, got {a.dtype} and {b.dtype}; cast one")
    return Binary(op, a, b)


def shift_left(a: Any, b: Any) -> Expr:
    """a << b. A count outside [0, bits of the dtype) shifts every bit out: 0 (ONNX BitShift's answer, where C's and
    LLVM's is undefined)."""
    return _shift("shl", a, b)


def shift_right(a: Any, b: Any) -> Expr:
    """a >> b: logical for an unsigned dtype, arithmetic (the sign copied in) for a signed one. A count outside
    [0, bits) shifts every bit out: 0, or -1 for a negative `a`."""
    return _shift("shr", a, b)


def min_value(dtype: str) -> Const:
    return const(-math.inf if dtypes.is_float(dtype) else _iinfo(dtype)[0], dtype)


def max_value(dtype: str) -> Const:
    return const(math.inf if dtypes.is_float(dtype) else _iinfo(dtype)[1], dtype)


def _iinfo(dtype: str) -> tuple[int, int]:
    if dtype == "bool":
        return 0, 1
    info = np.iinfo(dtypes.numpy(dtype))
    return int(info.min), int(info.max)


# ---------------------------------------------------------------------------------------------- traversal


# The traversals below are the search's hot path (lowering and featurizing thousands of programs a round): they test
# the common node types by exact type first (Binary, Var, Const: most of every index tree), then fall back to
# isinstance.


def children(e: Expr) -> tuple[Expr, ...]:
    t = type(e)
    if t is Binary:
        return (e.a, e.b)
    if t is Var or t is Const:
        return ()
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, (Unary, Cast)):
        return (e.a,)
    if isinstance(e, Select):
        return (e.cond, e.t, e.f)
    if isinstance(e, Load):
        return e.indices
    if isinstance(e, Reduce):
        return (e.body,)
    return ()


def with_children(e: Expr, kids: Sequence[Expr]) -> Expr:
    if isinstance(e, Binary):
        return Binary(e.op, kids[0], kids[1])
    if isinstance(e, Unary):
        return Unary(e.op, kids[0])
    if isinstance(e, Cast):
        return Cast(e.dtype, kids[0])
    if isinstance(e, Select):
        return Select(kids[0], kids[1], kids[2])
    if isinstance(e, Load):
        return Load(e.buffer, tuple(kids), e.dtype)
    if isinstance(e, Reduce):
        return Reduce(e.op, kids[0], e.axes)
    return e


def walk(e: Expr):
    """All nodes of `e`, pre-order."""
    stack = [e]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(children(n)))


def rewrite(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Post-order rewrite: children first, then `fn(node)`; `fn` returns None to keep the node."""
    t = type(e)
    if t is Binary:
        a, b = rewrite(e.a, fn), rewrite(e.b, fn)
        if a is not e.a or b is not e.b:
            e = Binary(e.op, a, b)
    elif t is not Var and t is not Const:
        kids = children(e)
        if kids:
            new = tuple(rewrite(k, fn) for k in kids)
            if any(a is not b for a, b in zip(new, kids)):
                e = with_children(e, new)
    out = fn(e)
    return e if out is None else out


def substitute(e: Expr, mapping: dict[str, Expr]) -> Expr:
    """Replace variables by name. Subtrees without a replaced variable are returned as they are (not rebuilt)."""
    if not mapping:
        return e

    def visit(n: Expr) -> Expr:
        t = type(n)
        if t is Binary:
            a, b = visit(n.a), visit(n.b)
            return n if a is n.a and b is n.b else Binary(n.op, a, b)
        if t is Var:
            return mapping.get(n.name, n)
        if t is Const:
            return n
        if isinstance(n, Var):
            return mapping.get(n.name, n)
        kids = children(n)
        if not kids:
            return n
        new = tuple(visit(k) for k in kids)
        return n if all(a is b for a, b in zip(new, kids)) else with_children(n, new)

    return visit(e)


def free_vars(e: Expr) -> set[str]:
    out: set[str] = set()
    stack = [e]
    while stack:
        n = stack.pop()
        t = type(n)
        if t is Binary:
            stack.append(n.a)
            stack.append(n.b)
        elif t is Var or isinstance(n, Var):
            out.add(n.name)
        elif t is not Const:
            stack.extend(children(n))
    return out


def loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]
