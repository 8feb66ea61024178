"""A reference interpreter of loop IR: the executable spec that generated code is tested against.

Loop IR is translated statement by statement into Python source over flat Python lists (so a loop body costs a
few bytecodes, not a numpy call per element), run, and the buffers are copied back into numpy arrays. Values are
computed in double precision and rounded to the buffer's dtype when stored, so results are at least as accurate
as float32 code.
"""

from __future__ import annotations

import math

import numpy as np

from compiler.base import dtypes
from compiler.schedule.loopir import Allocate, For, Func, IfThenElse, Seq, Stmt, Store
from compiler.tensor import te
from compiler.tensor.te import Binary, Cast, Const, Expr, Load, Select, Unary, Var

BINARY = {
    "add": "({} + {})",
    "sub": "({} - {})",
    "mul": "({} * {})",
    "div": "_div({}, {})",
    "floordiv": "_floordiv({}, {})",
    "mod": "_mod({}, {})",
    "min": "min({}, {})",
    "max": "max({}, {})",
    "pow": "_pow({}, {})",
    "shl": "_shl({}, {}, {bits})",
    "shr": "_shr({}, {}, {bits})",
    "lt": "({} < {})",
    "le": "({} <= {})",
    "eq": "({} == {})",
    "ne": "({} != {})",
    "gt": "({} > {})",
    "ge": "({} >= {})",
    "and": "({} and {})",
    "or": "({} or {})",
}
UNARY = {
    "exp": "_exp({})",
    "log": "_log({})",
    "sqrt": "_sqrt({})",
    "rsqrt": "(1.0 / _sqrt({}))",
    "tanh": "math.tanh({})",
    "erf": "math.erf({})",
    "sin": "_sin({})",
    "cos": "_cos({})",
    "sigmoid": "_sigmoid({})",
    "floor": "float(math.floor({}))",
    "roundeven": "_roundeven({})",
    "abs": "abs({})",
    "neg": "(-{})",
    "not": "(not {})",
}


def _div(a, b):
    try:
        return a / b
    except ZeroDivisionError:
        return math.copysign(math.inf, a) * math.copysign(1.0, b) if a else math.nan


def _roundeven(x: float) -> float:
    """x rounded to the nearest integer, ties to even (Python's round); inf and NaN as they are."""
    return float(round(x)) if math.isfinite(x) else x


def _floordiv(a, b):
    return a // b if b else 0


def _mod(a, b):
    return a % b if b else 0


def _shl(a, b, bits):
    return a << b if 0 <= b < bits else 0  # wrapped to the dtype by the cast around it (`_wrap`, or the store)


def _shr(a, b, bits):
    # Python's >> on a negative int is arithmetic, as on a signed dtype; an unsigned value is never negative
    return a >> b if 0 <= b < bits else (-1 if a < 0 else 0)


def _exp(x):
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _log(x):
    return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)


def _sqrt(x):
    return math.sqrt(x) if x >= 0 else math.nan


def _sin(x):
    return math.sin(x) if math.isfinite(x) else math.nan  # math.sin raises on ±inf; numpy and libm give NaN


def _cos(x):
    return math.cos(x) if math.isfinite(x) else math.nan


def _sigmoid(x):
    return 1.0 / (1.0 + _exp(-x))


def _pow(a, b):
    try:
        return float(a) ** b if isinstance(a, float) or isinstance(b, float) else a**b
    except (OverflowError, ZeroDivisionError):
        return math.inf


def _to(dtype: str):
    if dtypes.is_float(dtype):
        return float
    if dtype == "bool":
        return bool
    lo, hi = te._iinfo(dtype)
    span = hi - lo + 1
    return lambda v: (int(v) - lo) % span + lo  # two's-complement wrap, C-style truncation toward zero


def _expr(e: Expr) -> str:
    if isinstance(e, Const):
        v = float(e.value) if dtypes.is_float(e.dtype) else e.value
        return f"float('{v}')" if isinstance(v, float) and not math.isfinite(v) else repr(v)
    if isinstance(e, Var):
        return _name(e.name)
    if isinstance(e, Binary):
        return _wrap(e, BINARY[e.op].format(_expr(e.a), _expr(e.b), bits=dtypes.bits(e.dtype)))
    if isinstance(e, Unary):
        return _wrap(e, UNARY[e.op].format(_expr(e.a)))
    if isinstance(e, Select):
        return f"({_expr(e.t)} if {_expr(e.cond)} else {_expr(e.f)})"
    if isinstance(e, Cast):
        return f"_cast_{e.dtype}({_expr(e.a)})"
    if isinstance(e, Load):
        return f"{_name(e.buffer)}[{_expr(e.indices[0])}]"
    raise TypeError(f"cannot interpret {type(e).__name__} in loop IR")


def _wrap(e: Expr, code: str) -> str:
    # Python ints never overflow, but compiled code (and numpy) wrap integer arithmetic at every operation; index
    # arithmetic is int64 and left alone, so loops pay nothing for this, unless it is a left shift (which pushes
    # bits past the top at any width)
    if dtypes.is_int(e.dtype) and (e.dtype != dtypes.INDEX or isinstance(e, Binary) and e.op == "shl"):
        return f"_cast_{e.dtype}({code})"
    return code


def _name(n: str) -> str:
    return "v_" + "".join(c if c.isalnum() else f"_{ord(c)}_" for c in n)


def _stmt(s: Stmt, depth: int, out: list[str], dtype_of: dict[str, str]) -> None:
    pad = "    " * depth
    if isinstance(s, For):
        out.append(f"{pad}for {_name(s.var.name)} in range({s.extent}):")
        _stmt(s.body, depth + 1, out, dtype_of)
    elif isinstance(s, Store):
        out.append(f"{pad}{_name(s.buffer)}[{_expr(s.index)}] = _cast_{dtype_of[s.buffer]}({_expr(s.value)})")
    elif isinstance(s, Allocate):
        b = s.buffer
        dtype_of[b.name] = b.dtype
        out.append(f"{pad}{_name(b.name)} = [{_zero(b.dtype)}] * {b.size}")
        _stmt(s.body, depth, out, dtype_of)
    elif isinstance(s, Seq):
        for c in s.stmts:
            _stmt(c, depth, out, dtype_of)
        if not s.stmts:
            out.append(f"{pad}pass")
    elif isinstance(s, IfThenElse):
        out.append(f"{pad}if {_expr(s.cond)}:")
        _stmt(s.then, depth + 1, out, dtype_of)
        if s.orelse is not None:
            out.append(f"{pad}else:")
            _stmt(s.orelse, depth + 1, out, dtype_of)
    else:
        raise TypeError(f"cannot interpret {type(s).__name__}")


def _zero(dtype: str) -> str:
    # uninitialised memory in compiled code; NaN here so reading it before writing shows up in tests
    return "math.nan" if dtypes.is_float(dtype) else "0"


def to_python(f: Func) -> str:
    """The Python source the interpreter runs for `f`."""
    lines = [f"def {_name(f.name)}({', '.join(_name(b.name) for b in f.params)}):"]
    _stmt(f.body, 1, lines, {b.name: b.dtype for b in f.params})
    return "\n".join(lines) + "\n"


def run(f: Func, *arrays: np.ndarray) -> None:
    """Execute `f` on numpy arrays (in the order of f.params), writing results into them in place."""
    if len(arrays) != len(f.params):
        raise ValueError(f"{f.name} takes {len(f.params)} buffers, got {len(arrays)}")
    env: dict = {
        "math": math,
        "_div": _div,
        "_floordiv": _floordiv,
        "_mod": _mod,
        "_exp": _exp,
        "_log": _log,
        "_sqrt": _sqrt,
        "_sigmoid": _sigmoid,
        "_sin": _sin,
        "_cos": _cos,
        "_pow": _pow,
        "_shl": _shl,
        "_shr": _shr,
    }
    env.update({f"_cast_{d}": _to(d) for d in dtypes.DTYPES})
    exec(compile(to_python(f), f"<loopir {f.name}>", "exec"), env)
    lists = []
    for b, a in zip(f.params, arrays):
        if a.size != b.size:
            raise ValueError(f"buffer {b.name} needs {b.size} elements, got an array of {a.size}")
        lists.append(a.reshape(-1).tolist())
    env[_name(f.name)](*lists)
    for a, values in zip(arrays, lists):
        # stores wrapped integers to their dtype; inferring one would take uint64's top half for float64
        a.reshape(-1)[:] = np.asarray(values, dtype=np.float64 if a.dtype.kind == "f" else a.dtype).astype(a.dtype)
