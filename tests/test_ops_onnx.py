"""Every op in `ops.OPS`, built from hand-normalized attributes, compiled with the naive schedule and run through
the JIT, against onnx's ReferenceEvaluator running the same op as a one-node ONNX model.

Tolerances: data movement, comparisons, integer arithmetic, min/max, floor/ceil/round and selects are exact
(rtol = atol = 0). Float arithmetic is one or a few float32 roundings per element, the same operations the
reference does in float32, so 1e-6 relative covers reassociation; transcendental functions (exp, log, tanh, erf,
pow, through libm/libmvec) are within a few ulp of numpy's, so 1e-5 relative with a 1e-6 floor near zero.
Reductions and dot products over K float32 terms drift by ~sqrt(K) ulp of the partial sums (K <= 72 here), so
1e-5 relative plus 1e-5 absolute for standard-normal data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.helper import np_dtype_to_tensor_dtype
from onnx.reference import ReferenceEvaluator

from compiler.base import dtypes
from compiler.base.errors import InvalidExpr, UnsupportedDType
from compiler.model.int8_layout import pack_int8_conv_weight, pack_int8_weight
from compiler.model.passes import block_conv_input_channels, pack_conv_weight, pack_depthwise_weight
from compiler.model.winograd import winograd_matrices, winograd_weight
from compiler.schedule import interp
from compiler.schedule.lower import lower
from compiler.schedule.state import initial_state
from compiler.targets.cpu.codegen import compile_funcs
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG

RNG = np.random.default_rng(0)
EXACT = (0.0, 0.0)
ARITH = (1e-6, 1e-6)
TRANSCENDENTAL = (1e-5, 1e-6)
REDUCTION = (1e-5, 1e-5)
WINOGRAD = (1e-4, 1e-4)  # the transforms' coefficients (up to 8 in F(4x4, 3x3)) scale the rounding error


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def f64(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def pos(*shape: int) -> np.ndarray:
    return (np.abs(RNG.standard_normal(shape)) + 0.1).astype(np.float32)


def ints(*shape: int, dtype="int32", lo=-20, hi=20, nonzero=False) -> np.ndarray:
    x = RNG.integers(max(lo, 0) if dtype == "uint8" else lo, hi, shape).astype(dtype)
    if nonzero:
        x[x == 0] = 1
    return x


def bools(*shape: int) -> np.ndarray:
    return RNG.random(shape) < 0.5


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


@dataclass
class Case:
    op: str
    inputs: list  # arrays (None: an omitted optional input), as the graph node sees them
    attrs: dict = field(default_factory=dict)  # normalized, as the frontend produces them
    onnx_attrs: dict | None = None  # the ONNX node's attributes (default: `attrs`)
    onnx_inputs: list | None = None  # the ONNX node's inputs (default: `inputs`), with constant inputs added
    tol: tuple[float, float] = EXACT
    opset: int = 18
    reference: object = None  # a numpy function instead of ONNX (for tilefarm's own ops)
    onnxruntime: bool = False  # run the ONNX model in onnxruntime instead of the reference evaluator


def _fresh(x: np.ndarray | None) -> np.ndarray | None:
    return None if x is None else np.ascontiguousarray(x)


def run_tilefarm(case: Case, schedule=initial_state) -> list[np.ndarray]:
    phs = [None if a is None else te.placeholder(a.shape, str(a.dtype), f"in{k}") for k, a in enumerate(case.inputs)]
    outs = ops.OPS[case.op](phs, case.attrs, "n0")
    read = _placeholders_read(outs)
    used = [(t, a) for t, a in zip(phs, case.inputs) if t is not None and t in read]
    dag = ComputeDAG([t for t, _ in used] + outs)
    names = {s.name for s in dag.ops if not s.is_placeholder}
    assert len(names) == len([s for s in dag.ops if not s.is_placeholder]), "stage names must be unique"
    assert all(n.startswith("n0") for n in names), f"stage names must derive from the prefix: {sorted(names)}"
    kernel = compile_funcs([lower(schedule(dag), "kernel")])["kernel"]
    results = [np.zeros(o.shape, dtypes.numpy(o.dtype)) for o in outs]
    kernel(*[_fresh(a) for _, a in used], *results)
    return results


def _placeholders_read(outs: list[te.Tensor]) -> set[te.Tensor]:
    seen, stack, found = set(), list(outs), set()
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(t.op, te.PlaceholderOp):
            found.add(t)
        else:
            stack.extend(t.op.inputs)
    return found


def run_onnx(case: Case, like: list[np.ndarray]) -> list[np.ndarray]:
    """The case's op in ONNX; `like` (tilefarm's outputs) gives the output count and types to declare."""
    inputs = case.inputs if case.onnx_inputs is None else case.onnx_inputs
    attrs = case.attrs if case.onnx_attrs is None else case.onnx_attrs
    names = ["" if a is None else f"x{k}" for k, a in enumerate(inputs)]
    outputs = [f"y{k}" for k in range(len(like))]
    node = helper.make_node(case.op, names, outputs, **attrs)
    graph = helper.make_graph(
        [node],
        "case",
        [helper.make_tensor_value_info(n, np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, inputs) if a is not None],
        [helper.make_tensor_value_info(o, np_dtype_to_tensor_dtype(a.dtype), None) for o, a in zip(outputs, like)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)], ir_version=8)
    feeds = {n: a for n, a in zip(names, inputs) if a is not None}
    if case.onnxruntime:
        import onnxruntime

        return onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    return ReferenceEvaluator(model).run(None, feeds)


# ---------------------------------------------------------------------------------------------- the cases

UNARY_FLOAT = {
    "Relu": ({}, EXACT), "LeakyRelu": ({"alpha": 0.1}, ARITH), "ThresholdedRelu": ({"alpha": 0.3}, EXACT),
    "Sigmoid": ({}, TRANSCENDENTAL), "HardSigmoid": ({"alpha": 0.3, "beta": 0.4}, ARITH), "HardSwish": ({}, ARITH),
    "Tanh": ({}, TRANSCENDENTAL), "Erf": ({}, TRANSCENDENTAL), "Elu": ({"alpha": 0.7}, TRANSCENDENTAL),
    "Selu": ({"alpha": 1.6, "gamma": 1.05}, TRANSCENDENTAL), "Celu": ({"alpha": 0.8}, TRANSCENDENTAL),
    "Softplus": ({}, TRANSCENDENTAL), "Softsign": ({}, ARITH), "Mish": ({}, TRANSCENDENTAL),
    "Exp": ({}, TRANSCENDENTAL), "Sin": ({}, TRANSCENDENTAL), "Cos": ({}, TRANSCENDENTAL),
    "Neg": ({}, EXACT), "Abs": ({}, EXACT), "Floor": ({}, EXACT), "Ceil": ({}, EXACT),
    "Round": ({}, EXACT), "Sign": ({}, EXACT), "Reciprocal": ({}, ARITH),
}  # fmt: skip
UNARY_POSITIVE = {"Log": TRANSCENDENTAL, "Sqrt": ARITH}


def unary_cases() -> list[Case]:
    cases = []
    for op, (attrs, tol) in UNARY_FLOAT.items():
        cases.append(Case(op, [f32(3, 7) * 2], attrs, tol=tol))
    for op, tol in UNARY_POSITIVE.items():
        cases.append(Case(op, [pos(5, 3)], tol=tol))
    # ties of Round go to the even neighbour; Floor/Ceil/Sign at integers, zero and halves; float64 too
    halves = np.array([-2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 3.5, 2.4999, -7.0, 1e30, -1e30], np.float32)
    cases += [Case(op, [halves]) for op in ("Round", "Floor", "Ceil", "Sign")]
    cases += [Case("Round", [halves.astype(np.float64) + 4]), Case("Exp", [f64(4, 5)], tol=TRANSCENDENTAL)]
    cases += [Case(op, [f64(3, 5) * 4], tol=TRANSCENDENTAL) for op in ("Sin", "Cos")]
    cases.append(Case("Gelu", [f32(4, 9) * 2], {"approximate": "none"}, tol=TRANSCENDENTAL, opset=20))
    cases.append(Case("Gelu", [f32(4, 9) * 2], {"approximate": "tanh"}, tol=TRANSCENDENTAL, opset=20))
    # integer inputs where ONNX allows them
    for op in ("Relu", "Neg", "Abs", "Sign"):
        cases += [Case(op, [ints(6, 5, dtype=dt)]) for dt in ("int8", "int32", "int64")]
    cases += [Case("Abs", [ints(9, dtype="uint8")]), Case("Sign", [ints(9, dtype="uint8")])]
    cases.append(Case("Erf", [ints(2, 7, dtype="int32", lo=-2, hi=3)]))
    cases.append(Case("Not", [bools(3, 4)]))
    special = np.array([np.nan, np.inf, -np.inf, 0.0, 1.5, -3.0], np.float32)
    cases.append(Case("IsNaN", [special]))
    for neg, posv in ((1, 1), (0, 1), (1, 0)):
        cases.append(Case("IsInf", [special], {"detect_negative": neg, "detect_positive": posv}))
    return cases


def binary_cases() -> list[Case]:
    shapes = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((1,), (2, 3)), ((), (3, 2)), ((4, 1, 3), ())]
    cases = []
    for op in ("Add", "Sub", "Mul", "Div"):
        cases += [Case(op, [f32(*a), f32(*b)], tol=ARITH) for a, b in shapes]
        for dt in ("int8", "uint8", "int32", "int64"):
            cases.append(Case(op, [ints(3, 4, dtype=dt, lo=-9, hi=9), ints(4, dtype=dt, lo=-9, hi=9, nonzero=True)]))
    cases.append(Case("Div", [ints(40, dtype="int32", lo=-50, hi=50), ints(40, dtype="int32", nonzero=True)]))
    cases.append(Case("Add", [f64(3, 1), f64(4)], tol=ARITH))
    for fmod in (0, 1):
        for dt in ("int8", "int32", "int64"):
            cases.append(Case("Mod", [ints(30, dtype=dt, lo=-20), ints(30, dtype=dt, lo=-7, hi=7, nonzero=True)],
                              {"fmod": fmod}))  # fmt: skip
    cases.append(Case("Mod", [ints(3, 4, dtype="uint8"), ints(4, dtype="uint8", lo=1)], {"fmod": 0}))
    cases.append(Case("Mod", [f32(6, 5) * 10, f32(5) * 3], {"fmod": 1}, tol=ARITH))
    cases.append(Case("Pow", [pos(3, 4), f32(4)], tol=TRANSCENDENTAL))
    cases.append(Case("Pow", [f32(3, 4), np.array([2, 3, 0, 1], np.int64)], tol=TRANSCENDENTAL))
    cases.append(Case("Pow", [ints(3, 4, dtype="int64", lo=-5, hi=5), ints(1, dtype="int64", lo=0, hi=4)]))
    cases.append(Case("Pow", [ints(3, 4, dtype="int32", lo=0, hi=5), np.array([0.5, 2.0, 1.0, 3.0], np.float32)]))
    cases.append(Case("PRelu", [f32(2, 3, 4, 4), f32(3, 1, 1)], tol=ARITH))
    cases.append(Case("PRelu", [f32(5, 4), f32(4)], tol=ARITH))
    cases.append(Case("PRelu", [ints(5, 4, dtype="int32"), ints(4, dtype="int32")]))
    for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
        cases.append(Case(op, [np.round(f32(3, 4)), np.round(f32(4))]))
        cases.append(Case(op, [ints(2, 3, 1, dtype="int64", lo=-3, hi=3), ints(5, dtype="int64", lo=-3, hi=3)]))
        cases.append(Case(op, [ints(7, dtype="uint8", hi=4), ints(7, dtype="uint8", hi=4)]))
    cases.append(Case("Equal", [bools(3, 4), bools(4)]))
    for op in ("And", "Or", "Xor"):
        cases.append(Case(op, [bools(3, 1, 4), bools(5, 1)]))
    return cases


SHIFTED = ("uint8", "uint16", "uint32", "uint64", "int8", "int32", "int64")


def _shift_inputs(dtype: str, n: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Values over the dtype's whole range (2 x 1 x n) and every count from below 0 (signed dtypes; opset 28 allows
    them) to past the width (k x 1): broadcast against each other."""
    info, bits = np.iinfo(dtype), np.dtype(dtype).itemsize * 8
    rng = np.random.default_rng(bits)  # not RNG: the cases after these keep their data
    x = rng.integers(info.min, info.max, (2, 1, n), dtype=dtype, endpoint=True)
    return x, np.arange(-3 if info.min < 0 else 0, bits + 3).astype(dtype).reshape(-1, 1)


def bitshift_cases() -> list[Case]:
    # against onnxruntime: onnx's reference agrees, but the spec left a count of the width or more undefined before
    # opset 28; onnxruntime (and tilefarm) shift every bit out there, giving 0 (-1 for a negative value shifted right)
    cases = []
    for dt in SHIFTED:
        for direction in ("LEFT", "RIGHT"):
            opset = 18 if dt.startswith("u") else 28  # the signed dtypes came with opset 28
            cases.append(Case("BitShift", list(_shift_inputs(dt)), {"direction": direction}, opset=opset,
                              onnxruntime=True))  # fmt: skip
    count = np.array(32, np.uint32)  # one count for all, the width itself
    cases.append(Case("BitShift", [np.arange(1, 9, dtype=np.uint32) << 28, count], {"direction": "LEFT"},
                      onnxruntime=True))  # fmt: skip
    cases.append(Case("BitShift", [np.array([255], np.uint8), np.arange(12, dtype=np.uint8)], {"direction": "LEFT"},
                      onnxruntime=True))  # fmt: skip
    return cases


def other_elementwise_cases() -> list[Case]:
    cases = [
        Case("Where", [bools(3, 1), f32(1, 4), f32(3, 4)]),
        Case("Where", [bools(2, 3, 4), ints(4, dtype="int64"), ints(3, 1, dtype="int64")]),
        Case("Where", [bools(5), bools(5), bools(1)]),
    ]
    for lo, hi in ((-0.5, 0.5), (-math.inf, 0.2), (-0.3, math.inf), (0.4, -0.4)):
        cases.append(clip_case(f32(4, 5), lo, hi))
    cases.append(clip_case(ints(4, 5, dtype="int8", lo=-100, hi=100), -10.0, 1000.0))  # 1000: past int8's range
    for src, dst in (("float32", "int32"), ("float32", "bool"), ("int32", "float64"), ("bool", "float32"),
                     ("int64", "int8"), ("uint8", "int64"), ("float64", "float32"), ("int8", "uint8")):  # fmt: skip
        x = (f32(3, 5) * 20).astype(src) if src != "bool" else bools(3, 5)
        if src in ("int8", "int64"):
            x = ints(3, 5, dtype=src, lo=0, hi=100)
        to = np_dtype_to_tensor_dtype(np.dtype(dst))
        cases.append(Case("Cast", [x], {"to": dst}, {"to": to}))
    cases.append(Case("Cast", [f32(4)], {"to": TensorProto.INT64}))  # the enum value works as well as the name
    # the wider unsigned dtypes (BitShift's): in range, and past the signed type of their width
    big = np.array([0.0, 1.5, 3e9, 4294967040.0, 1e19, 2.0**63], np.float64)
    cases += [
        Case("Cast", [big[:4]], {"to": "uint32"}, {"to": TensorProto.UINT32}),
        Case("Cast", [big], {"to": "uint64"}, {"to": TensorProto.UINT64}),
        Case("Cast", [np.array([0, 1, 2**63, 2**64 - 1], np.uint64)], {"to": "float64"}, {"to": TensorProto.DOUBLE}),
        Case("Cast", [np.array([0, 300, 65535], np.uint16)], {"to": "int8"}, {"to": TensorProto.INT8}),
    ]
    cases.append(Case("CastLike", [f32(3, 2) * 9, ints(1, dtype="int8")]))
    cases += [
        Case("Sum", [f32(3, 4), f32(4), f32(1, 1)], tol=ARITH),
        Case("Sum", [ints(2, 3, dtype="int64"), ints(3, dtype="int64")]),
        Case("Mean", [f32(3, 4), f32(3, 1), f32(4)], tol=ARITH),
        Case("Max", [f32(2, 3), f32(3), f32(2, 1)]),
        Case("Max", [ints(5, dtype="uint8")]),
        Case("Min", [f32(4, 3), f32(1)]),
        Case("Min", [ints(2, 3, dtype="int8"), ints(2, 1, dtype="int8")]),
    ]
    return cases


def clip_case(x: np.ndarray, lo: float, hi: float) -> Case:
    """Clip with bounds as attributes; ONNX takes them as optional inputs of x's dtype (omitted when unbounded)."""
    bound = lambda v: None if math.isinf(v) or abs(v) >= 1000 else np.array(v, x.dtype)
    onnx_in = [x, bound(lo), bound(hi)]
    while onnx_in[-1] is None:
        onnx_in.pop()
    return Case("Clip", [x], {"min": lo, "max": hi}, {}, onnx_in)


def reduce_cases() -> list[Case]:
    cases = []
    x = f32(3, 4, 5)
    tol = {"ReduceSum": REDUCTION, "ReduceMean": REDUCTION, "ReduceMax": EXACT, "ReduceMin": EXACT,
           "ReduceL1": REDUCTION, "ReduceL2": REDUCTION, "ReduceSumSquare": REDUCTION,
           "ReduceLogSumExp": REDUCTION}  # fmt: skip
    for op, t in tol.items():
        for axes, keep in (([1], 1), ([0, 2], 0), ([], 1), ([2], 0), ([0, 1, 2], 0)):
            a = {"axes": axes, "keepdims": keep, "noop_with_empty_axes": 0}
            cases.append(Case(op, [x], a, {"keepdims": keep}, [x, i64(*axes)], tol=t))
    # products: an axis longer than one chunk of 16 factors, integers wrapping like numpy
    xp = (1 + 0.05 * f32(2, 37, 3)).astype(np.float32)
    for axes, keep in (([1], 1), ([0, 2], 0), ([0, 1, 2], 0), ([2], 1)):
        a = {"axes": axes, "keepdims": keep, "noop_with_empty_axes": 0}
        cases.append(Case("ReduceProd", [xp], a, {"keepdims": keep}, [xp, i64(*axes)], tol=REDUCTION))
    xi8 = ints(5, 20, dtype="int8", lo=-4, hi=5)
    cases.append(Case("ReduceProd", [xi8], {"axes": [1], "keepdims": 0}, {"keepdims": 0}, [xi8, i64(1)]))
    cases.append(Case("ReduceLogSum", [pos(3, 4)], {"axes": [1], "keepdims": 1}, {"keepdims": 1}, [pos(1), i64(1)],
                      tol=TRANSCENDENTAL))  # fmt: skip
    cases.append(Case("ReduceSum", [x], {"axes": [], "keepdims": 1, "noop_with_empty_axes": 1},
                      {"keepdims": 1, "noop_with_empty_axes": 1}, [x, np.zeros(0, np.int64)]))  # fmt: skip
    for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean"):
        xi = ints(4, 6, dtype="int32", lo=-50, hi=50)
        cases.append(Case(op, [xi], {"axes": [1], "keepdims": 0}, {"keepdims": 0}, [xi, i64(1)]))
    xu = ints(4, 6, dtype="uint8", hi=40)
    cases.append(Case("ReduceMax", [xu], {"axes": [0], "keepdims": 1}, {"keepdims": 1}, [xu, i64(0)]))
    for c in cases:  # ONNX's data input is the case's own
        if c.onnx_inputs is not None:
            c.onnx_inputs[0] = c.inputs[0]
    ties = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [5, -1, 5, 4]], np.float32)
    for op in ("ArgMax", "ArgMin"):
        for axis, keep, last in ((1, 1, 0), (1, 0, 1), (0, 1, 1), (0, 0, 0)):
            cases.append(Case(op, [ties], {"axis": axis, "keepdims": keep, "select_last_index": last}))
        cases.append(Case(op, [ints(3, 5, 2, dtype="int64", lo=-3, hi=3)], {"axis": 1, "keepdims": 0}))
    ties = np.array([[3, 1, 3, 2, 1, 3], [0, 5, -1, 5, 2, 2]], np.float32)
    for k, axis, largest in ((3, 1, 1), (4, 1, 0), (2, 0, 1), (6, 1, 1)):
        cases.append(Case("TopK", [ties], {"k": k, "axis": axis, "largest": largest, "sorted": 1},
                          {"axis": axis, "largest": largest, "sorted": 1}, [ties, i64(k)]))  # fmt: skip
    xt = ints(3, 5, 4, dtype="int32", lo=-9, hi=9)
    cases.append(Case("TopK", [xt], {"k": 2, "axis": 1, "largest": 1}, {"axis": 1}, [xt, i64(2)]))
    cases.append(Case("GlobalAveragePool", [f32(2, 3, 5, 4)], tol=REDUCTION))
    cases.append(Case("GlobalAveragePool", [f32(1, 2, 7)], tol=REDUCTION))
    cases.append(Case("GlobalMaxPool", [f32(2, 3, 4, 3)]))
    return cases


def nn_cases() -> list[Case]:
    cases = []
    conv = lambda k, strides=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), group=1: {
        "kernel_shape": list(k),
        "strides": list(strides),
        "pads": list(pads),
        "dilations": list(dil),
        "group": group,
    }
    cases += [
        Case("Conv", [f32(1, 3, 7, 8), f32(4, 3, 3, 3)], conv((3, 3)), tol=REDUCTION),
        Case("Conv", [f32(2, 4, 9, 7), f32(6, 4, 3, 2), f32(6)], conv((3, 2), (2, 1), (1, 0, 2, 1)), tol=REDUCTION),
        Case("Conv", [f32(1, 4, 9, 9), f32(4, 2, 3, 3)], conv((3, 3), pads=(2, 2, 2, 2), dil=(2, 2), group=2),
             tol=REDUCTION),
        # depthwise with a channel multiplier of 2
        Case("Conv", [f32(1, 3, 6, 6), f32(6, 1, 3, 3), f32(6)], conv((3, 3), (2, 2), (1, 1, 1, 1), group=3),
             tol=REDUCTION),
        Case("Conv", [f64(1, 2, 5, 5), f64(3, 2, 1, 1)], conv((1, 1)), tol=REDUCTION),
        # 1-D and 3-D
        Case("Conv", [f32(2, 4, 11), f32(6, 2, 3), f32(6)], conv((3,), (2,), (2, 1), (2,), group=2), tol=REDUCTION),
        Case("Conv", [f32(1, 2, 4, 5, 6), f32(3, 2, 2, 3, 2)],
             conv((2, 3, 2), (1, 2, 2), (0, 1, 1, 1, 0, 0), (1, 1, 1)), tol=REDUCTION),
    ]  # fmt: skip
    tconv = lambda k, strides=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), group=1, opad=(0, 0): {
        **conv(k, strides, pads, dil, group),
        "output_padding": list(opad),
    }
    cases += [
        Case("ConvTranspose", [f32(1, 3, 4, 5), f32(3, 2, 3, 3)], tconv((3, 3)), tol=REDUCTION),
        Case("ConvTranspose", [f32(2, 2, 3, 4), f32(2, 3, 3, 2), f32(3)], tconv((3, 2), (2, 3), (1, 0, 0, 1)),
             tol=REDUCTION),
        # the reference evaluator reshapes a grouped ConvTranspose's weight wrongly: onnxruntime checks this one
        Case("ConvTranspose", [f32(1, 4, 3, 3), f32(4, 1, 2, 2)], tconv((2, 2), (2, 2), group=2, opad=(1, 1)),
             tol=REDUCTION, onnxruntime=True),
        Case("ConvTranspose", [f32(1, 2, 4, 4), f32(2, 2, 3, 3)], tconv((3, 3), (1, 2), (2, 1, 1, 3), dil=(2, 1)),
             tol=REDUCTION),
        Case("ConvTranspose", [f32(2, 3, 6), f32(3, 4, 3), f32(4)], tconv((3,), (3,), (1, 2), opad=(1,)),
             tol=REDUCTION),
    ]  # fmt: skip
    pool = lambda k, strides=None, pads=None, ceil=0, dil=None, **kw: {
        "kernel_shape": list(k), "strides": list(strides or [1] * len(k)), "pads": list(pads or [0] * 2 * len(k)),
        "ceil_mode": ceil, **({"dilations": list(dil)} if dil else {}), **kw}  # fmt: skip
    for x in (f32(1, 2, 7, 8),):
        cases += [
            Case("MaxPool", [x], pool((3, 3), (2, 2), (1, 1, 1, 1))),
            Case("MaxPool", [x], pool((2, 3), (2, 2), (0, 1, 0, 0), ceil=1)),
            Case("MaxPool", [x], pool((2, 2), (1, 2), dil=(2, 3), ceil=1)),
            Case("MaxPool", [ints(1, 2, 5, 5, dtype="int8", lo=-100, hi=100)], pool((3, 3), (2, 2), (1, 1, 1, 1))),
            Case("MaxPool", [f32(2, 3, 9)], pool((3,), (2,), (1, 1))),
        ]
        for include in (0, 1):
            cases += [
                Case("AveragePool", [x], pool((3, 3), (2, 2), (1, 1, 1, 1), count_include_pad=include), tol=ARITH),
                Case("AveragePool", [x], pool((3, 2), (2, 3), (1, 0, 1, 1), ceil=1, count_include_pad=include),
                     tol=ARITH),
                Case("AveragePool", [x], pool((2, 2), (2, 2), (1, 1, 0, 0), dil=(2, 2), count_include_pad=include),
                     opset=19, tol=ARITH),
                Case("AveragePool", [f32(1, 2, 8)], pool((3,), (3,), (0, 2), ceil=1, count_include_pad=include),
                     tol=ARITH),
            ]  # fmt: skip
    cases += [
        Case("MatMul", [f32(5, 7), f32(7, 3)], tol=REDUCTION),
        Case("MatMul", [f32(2, 5, 7), f32(2, 7, 3)], tol=REDUCTION),
        Case("MatMul", [f32(3, 1, 4, 6), f32(2, 6, 5)], tol=REDUCTION),
        Case("MatMul", [f32(6), f32(2, 6, 5)], tol=REDUCTION),
        Case("MatMul", [f32(3, 4, 6), f32(6)], tol=REDUCTION),
        Case("MatMul", [f32(6), f32(6)], tol=REDUCTION),
        Case("MatMul", [ints(3, 4, dtype="int64"), ints(4, 2, dtype="int64")]),
        Case("MatMul", [ints(2, 3, 4, dtype="int32"), ints(1, 4, 2, dtype="int32")]),
    ]
    gemm = lambda ta=0, tb=0, alpha=1.0, beta=1.0: {"transA": ta, "transB": tb, "alpha": alpha, "beta": beta}
    cases += [
        Case("Gemm", [f32(4, 6), f32(6, 3)], gemm(), tol=REDUCTION),
        Case("Gemm", [f32(6, 4), f32(3, 6), f32(3)], gemm(1, 1, 0.5, 2.0), tol=REDUCTION),
        Case("Gemm", [f32(4, 6), f32(3, 6), f32(4, 1)], gemm(0, 1), tol=REDUCTION),
        Case("Gemm", [f32(4, 6), f32(6, 3), f32(4, 3)], gemm(alpha=2.0, beta=0.0), tol=REDUCTION),
        Case("Gemm", [ints(3, 5, dtype="int64"), ints(5, 2, dtype="int64"), ints(1, 2, dtype="int64")], gemm()),
    ]
    dense_ref = lambda x, w, b=None: [x @ w.T + (0 if b is None else b)]
    cases += [
        Case("Dense", [f32(4, 6), f32(5, 6)], tol=REDUCTION, reference=dense_ref),
        Case("Dense", [f32(4, 6), f32(5, 6), f32(5)], tol=REDUCTION, reference=dense_ref),
    ]

    # BlockedConv (made by passes): the weight packed F/16 x C x KH x KW x 16; Conv's attributes
    def blocked_ref(x, w, b=None, stride=1, padding=0, dilation=1):
        unpacked = w.transpose(0, 4, 1, 2, 3).reshape(-1, *w.shape[1:4])
        out = ops.reference_conv2d(x, unpacked, stride, padding, dilation)
        return [out + (0 if b is None else b[None, :, None, None])]

    w1, w2 = pack_conv_weight(f32(32, 3, 3, 3)), pack_conv_weight(f32(16, 4, 3, 2))
    cases += [
        Case("BlockedConv", [f32(1, 3, 7, 9), w1, f32(32)], conv((3, 3), (2, 2), (1, 0, 2, 1)), tol=REDUCTION,
             reference=lambda x, w, b: blocked_ref(x, w, b, (2, 2), (1, 0, 2, 1))),
        Case("BlockedConv", [f32(2, 4, 9, 8), w2], conv((3, 2), pads=(2, 1, 2, 1), dil=(2, 1)), tol=REDUCTION,
             reference=lambda x, w: blocked_ref(x, w, None, 1, (2, 1, 2, 1), (2, 1))),
    ]  # fmt: skip
    # PackedMatMul (made by passes): the constant B laid out in panels N/P x K x P
    panels = lambda b, p: np.ascontiguousarray(b.reshape(b.shape[0], -1, p).transpose(1, 0, 2))
    b1, b2 = f32(6, 64), f32(5, 8)
    cases += [
        Case("PackedMatMul", [f32(4, 6), panels(b1, 32)], tol=REDUCTION, reference=lambda a, w: [a @ b1]),
        Case("PackedMatMul", [f32(2, 3, 5), panels(b2, 4)], tol=REDUCTION, reference=lambda a, w: [a @ b2]),
    ]

    # PackedMatMulInteger, PackedConvInteger (made by int8_layout's passes): integer products, exact; the conv's
    # Requantize (multiplier, zero point, bias per channel) on its NCHW16c accumulators, rounding half to even
    a8, wm, zm = ints(2, 3, 13, dtype="uint8", lo=0, hi=256), ints(13, 20, dtype="int8", lo=-128, hi=128), ints(20)
    pm = pack_int8_weight(wm, zm, 100)
    x8, wc, zc = (
        ints(1, 6, 7, 8, dtype="uint8", lo=0, hi=256),
        ints(18, 6, 3, 3, dtype="int8", lo=-128, hi=128),
        ints(18),
    )
    wcp, colc = pack_int8_conv_weight(wc, 9, zc)
    zc32 = np.zeros(32, np.int32)
    zc32[:18] = zc
    conv_acc = ops.reference_conv2d((x8 - 9.0), (wc - zc[:, None, None, None]).astype(np.float64), 2, 1).astype(
        np.int32
    )
    mult, bias = (pos(32) / 4000).astype(np.float32), ints(32, lo=-5000, hi=5000)

    def requantized(acc):
        v = (acc + bias[None, :18, None, None]).astype(np.float32) * mult[None, :18, None, None]
        return [np.clip(np.rint(v) + 3, 0, 255).astype(np.uint8)]

    int8_conv = {"stride": 2, "padding": 1, "a_zero": 9, "channels": 18}
    cases += [
        Case("PackedMatMulInteger", [a8, pm.packed, pm.col, None, None, pm.w_zero], {"n": 20},
             reference=lambda *_: [((a8 - np.int64(100)) @ (wm - zm.astype(np.int64))).astype(np.int32)]),
        Case("PackedConvInteger", [x8, wcp, colc, zc32], int8_conv, reference=lambda *_: [conv_acc]),
        Case("PackedConvInteger", [x8, wcp, colc, zc32, mult, np.array(3, np.uint8), bias],
             {**int8_conv, "to": "uint8"}, reference=lambda *_: requantized(conv_acc)),
    ]  # fmt: skip

    # a depthwise BlockedConv: the weight C/16 x KH x KW x 16; and one of 24 filters, padded to two blocks
    def depthwise_ref(x, w, b=None, stride=1, padding=0):
        unpacked = w.transpose(0, 3, 1, 2).reshape(-1, 1, *w.shape[1:3])
        out = ops.reference_conv2d(x, unpacked, stride, padding, groups=unpacked.shape[0])
        return [out + (0 if b is None else b[None, :, None, None])]

    wd, w24 = pack_depthwise_weight(f32(32, 1, 3, 3)), pack_conv_weight(f32(24, 5, 1, 1))
    dw = conv((3, 3), (2, 2), (1, 1, 1, 1), group=32)
    cases += [
        Case("BlockedConv", [f32(1, 32, 7, 9), wd, f32(32)], dw, tol=REDUCTION,
             reference=lambda x, w, b: depthwise_ref(x, w, b, (2, 2), (1, 1, 1, 1))),
        Case("BlockedConv", [f32(1, 5, 4, 6), w24, f32(24)], {**conv((1, 1)), "channels": 24}, tol=REDUCTION,
             reference=lambda x, w, b: [blocked_ref(x, w)[0][:, :24] + b[:, None, None]]),
    ]  # fmt: skip
    cases += nchwc_cases(blocked_ref)
    # WinogradConv (made by passes): the weight transformed for F(m x m, 3 x 3); NCHW or NCHWc data and result
    wa, wb = f32(32, 16, 3, 3) / 12, f32(16, 32, 3, 3) / 17
    xa, xb = f32(1, 16, 9, 11), f32(1, 32, 6, 5)
    ua, ub = winograd_weight(wa, 4, 16), winograd_weight(wb, 2, 16)
    mats = {m: [t.astype(np.float32) for t in winograd_matrices(m)[::-2]] for m in (2, 4)}  # B^T, A^T
    cases += [
        Case("WinogradConv", [xa, ua, f32(32), *mats[4]], {"pads": (1, 1, 1, 1)}, tol=WINOGRAD,
             reference=lambda x, u, b, bt, at: blocked_ref(x, pack_conv_weight(wa), b, 1, 1)),
        Case("WinogradConv", [_to_nchwc(xb), ub, f32(1, 16), *mats[2]],
             {"pads": (0, 2, 1, 0), "data_layout": "NCHWc", "out_layout": "NCHWc"}, tol=WINOGRAD,
             reference=lambda x, u, b, bt, at: [_to_nchwc(blocked_ref(_to_nchw(x), pack_conv_weight(wb),
                                                                      b.reshape(-1), 1, (0, 2, 1, 0))[0])]),
        Case("WinogradConv", [xa, ua, None, *mats[4]], {"pads": (1, 1, 1, 1)}, tol=WINOGRAD,
             reference=lambda x, u, b, bt, at: blocked_ref(x, pack_conv_weight(wa), None, 1, 1)),
    ]  # fmt: skip
    for axis in (0, 1, 2):
        cases.append(Case("Softmax", [f32(3, 4, 5) * 3], {"axis": axis}, tol=TRANSCENDENTAL))
        cases.append(Case("LogSoftmax", [f32(3, 4, 5) * 3], {"axis": axis}, tol=REDUCTION))
    cases.append(Case("Softmax", [f64(2, 9)], {"axis": 1}, tol=TRANSCENDENTAL))
    ln = lambda axis, eps=1e-5: {"axis": axis, "epsilon": eps, "stash_type": 1}
    cases += [
        Case("LayerNormalization", [f32(3, 8), f32(8), f32(8)], ln(1), tol=REDUCTION),
        Case("LayerNormalization", [f32(2, 3, 4), f32(3, 4), None], ln(1, 1e-3), tol=REDUCTION),
        Case("LayerNormalization", [f32(2, 3, 4), f32(4), f32(1)], ln(1), tol=REDUCTION),
        Case("LayerNormalization", [f32(2, 3, 4), f32(2, 3, 4), f32(2, 3, 4)], ln(0), tol=REDUCTION),
    ]
    c = 3
    bn = [f32(2, c, 4, 5), f32(c), f32(c), f32(c), pos(c)]
    cases.append(Case("BatchNormalization", bn, {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0}, tol=ARITH))
    cases.append(Case("BatchNormalization", [f32(4, c), *bn[1:]], {"epsilon": 1e-3, "momentum": 0.9}, tol=ARITH))
    for size in (1, 3):
        lrn = {"alpha": 1e-3 * size, "beta": 0.75, "bias": 1.5, "size": size}
        # the reference evaluator's LRN loops over the batch dim where it means the channels: onnxruntime instead
        cases.append(Case("LRN", [f32(2, 5, 3, 4) * 3], lrn, tol=TRANSCENDENTAL, onnxruntime=True))
    # onnxruntime takes odd sizes only: an even window (one more channel after than before) against the spec
    lrn4 = {"alpha": 4e-3, "beta": 0.75, "bias": 1.5, "size": 4}
    cases.append(Case("LRN", [f32(2, 5, 3, 4) * 3], lrn4, tol=TRANSCENDENTAL, reference=lambda x: [_lrn(x, **lrn4)]))
    cases.append(Case("InstanceNormalization", [f32(2, c, 4, 5), f32(c), f32(c)], {"epsilon": 1e-5}, tol=REDUCTION))
    return cases


def _lrn(x, alpha, beta, bias, size):
    """ONNX LRN by its definition, in float64."""
    sq = np.zeros(x.shape)
    C = x.shape[1]
    for c in range(C):
        lo, hi = max(0, c - (size - 1) // 2), min(C, c + math.ceil((size - 1) / 2) + 1)
        sq[:, c] = (x[:, lo:hi].astype(np.float64) ** 2).sum(axis=1)
    return x / (bias + alpha / size * sq) ** beta


def transform_cases() -> list[Case]:
    x = f32(2, 3, 4)
    cases = []
    for shape in ((4, 6), (24,), (2, 12), (1, 2, 3, 4), (4, 3, 2), (2, 1, 12)):
        cases.append(Case("Reshape", [x], {"shape": list(shape)}, {}, [x, i64(*shape)]))
    xi = ints(2, 3, 4, dtype="int8")
    cases.append(Case("Reshape", [xi], {"shape": [6, 4]}, {}, [xi, i64(6, 4)]))
    cases += [Case("Flatten", [x], {"axis": a}) for a in (0, 1, 2, 3)]
    y = f32(3, 1, 4, 1)
    cases += [
        Case("Squeeze", [y], {"axes": [1, 3]}, {}, [y, i64(1, 3)]),
        Case("Squeeze", [y], {"axes": [3]}, {}, [y, i64(3)]),
        Case("Unsqueeze", [x], {"axes": [0, 3]}, {}, [x, i64(0, 3)]),
        Case("Unsqueeze", [x], {"axes": [3]}, {}, [x, i64(3)]),
    ]
    cases += [Case("Transpose", [x], {"perm": p}) for p in ([2, 0, 1], [0, 2, 1], [2, 1, 0])]
    cases.append(Case("Transpose", [bools(2, 3)], {"perm": [1, 0]}))
    cases += [
        Case("Concat", [f32(2, 3), f32(2, 1), f32(2, 4)], {"axis": 1}),
        Case("Concat", [ints(1, 3, dtype="int64"), ints(2, 3, dtype="int64")], {"axis": 0}),
        Case("Concat", [f32(2, 2, 2)], {"axis": 2}),
    ]
    xs = f32(4, 7)
    cases += [
        Case("Split", [xs], {"axis": 1, "split": [2, 4, 1]}, {"axis": 1}, [xs, i64(2, 4, 1)]),
        Case("Split", [xs], {"axis": 0, "split": [2, 2]}, {"axis": 0, "num_outputs": 2}, [xs]),
    ]
    xl = f32(5, 6, 7)
    # (normalized starts, ends, axes, steps), ONNX starts/ends where they differ
    for (st, en, ax, sp), onnx_se in (
        (([1, 0], [4, 6], [0, 1], [1, 2]), None),
        (([4], [0], [2], [-2]), None),
        (([5], [-1], [1], [-1]), ([-1], [-100])),
        (([0, 2, 6], [5, 6, -1], [0, 1, 2], [3, 1, -3]), ([0, 2, 6], [9, 6, -9])),
    ):
        s_on, e_on = onnx_se or (st, en)
        cases.append(Case("Slice", [xl], {"starts": st, "ends": en, "axes": ax, "steps": sp}, {},
                          [xl, i64(*s_on), i64(*e_on), i64(*ax), i64(*sp)]))  # fmt: skip
    data = f32(5, 4, 3)
    for idx, axis in (
        (np.array([[0, 4], [-1, 2]], np.int64), 0),
        (np.array([3, -4, 0], np.int32), 1),
        (np.array(2, np.int64), 2),
        (np.array([-3], np.int64), 2),
    ):
        cases.append(Case("Gather", [data, idx], {"axis": axis}))
    cases.append(Case("Gather", [ints(6, dtype="int64"), np.array([[5, 0, -6]], np.int64)], {"axis": 0}))
    cases += [
        Case("Expand", [f32(3, 1)], {"shape": [2, 3, 4]}, {}, [f32(3, 1), i64(2, 3, 4)]),
        Case("Expand", [f32(1, 4)], {"shape": [3, 1]}, {}, [f32(1, 4), i64(3, 1)]),
        Case("Expand", [bools(2, 1)], {"shape": [2, 5]}, {}, [bools(2, 1), i64(2, 5)]),
        Case("Tile", [f32(2, 3)], {"repeats": [2, 3]}, {}, [f32(2, 3), i64(2, 3)]),
        Case("Tile", [ints(1, 3, dtype="int32")], {"repeats": [4, 1]}, {}, [ints(1, 3, dtype="int32"), i64(4, 1)]),
    ]
    for c in cases:
        if c.op in ("Expand", "Tile"):
            c.onnx_inputs[0] = c.inputs[0]
    xp = f32(1, 3, 4, 5)
    for mode, pads in (("constant", [0, 1, 2, 0, 0, 0, 1, 3]), ("reflect", [0, 0, 2, 3, 0, 0, 3, 1]),
                       ("edge", [1, 0, 2, 1, 0, 1, 1, 4]),
                       ("wrap", [0, 1, 2, 3, 0, 0, 1, 2])):  # fmt: skip
        value = 1.5 if mode == "constant" else 0.0
        onnx_in = [xp, i64(*pads)] + ([np.array(value, np.float32)] if mode == "constant" else [])
        cases.append(Case("Pad", [xp], {"pads": pads, "mode": mode, "constant_value": value}, {"mode": mode},
                          onnx_in, opset=19 if mode == "wrap" else 18))  # fmt: skip
    xpi = ints(3, 4, dtype="int64")
    cases.append(Case("Pad", [xpi], {"pads": [1, 0, 0, 2], "mode": "constant", "constant_value": 7.0},
                      {"mode": "constant"}, [xpi, i64(1, 0, 0, 2), np.array(7, np.int64)]))  # fmt: skip
    # opset 18's axes input: the frontend spreads the pads over every dim
    cases.append(Case("Pad", [xp], {"pads": [0, 0, 1, 0, 0, 0, 0, 2], "mode": "constant", "constant_value": 0.0},
                      {"mode": "constant"},
                      [xp, i64(1, 0, 0, 2), np.array(0, np.float32), i64(2, -1)]))  # fmt: skip
    # negative pads crop (the reference evaluator cannot: numpy slicing is the reference)
    crop = {"pads": [0, 0, -1, 2, 0, 0, 1, -2], "mode": "constant", "constant_value": 1.5}
    crop_ref = lambda a: [np.pad(a, ((0, 0), (0, 0), (0, 1), (2, 0)), constant_values=1.5)[:, :, 1:, :-2]]
    cases.append(Case("Pad", [xp], crop, reference=crop_ref))
    cases += resize_cases()
    cases += [
        Case("Identity", [f32(3, 2)]),
        Case("Identity", [bools(4)]),
        Case("Dropout", [f32(2, 5)]),
    ]
    return cases


def resize_cases() -> list[Case]:
    cases = []
    x = f32(1, 2, 4, 5)
    coords = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")
    nearest = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")

    def case(x, sizes, mode, coord, nmode="round_prefer_floor", scales=None, roi=None, opset=18):
        attrs = {
            "mode": mode,
            "coordinate_transformation_mode": coord,
            "nearest_mode": nmode,
            "sizes": list(sizes),
            "cubic_coeff_a": -0.75,
            "exclude_outside": 0,
            "extrapolation_value": -7.0,
            "antialias": 0,
        }
        onnx_attrs = {k: v for k, v in attrs.items() if k != "sizes"}
        roi_in = None if roi is None else np.array(roi, np.float32)
        if roi is not None:
            attrs["roi"] = list(roi)
        if scales is None:
            onnx_in = [x, roi_in, None, i64(*sizes)]
        else:
            attrs["scales"] = list(scales)
            onnx_in = [x, roi_in, np.array(scales, np.float32)]
        # linear blends 2 pixels per resized dim; cubic weighs 4 per dim, a 16-term dot product in 2-D: a reduction
        tol = EXACT if mode == "nearest" else REDUCTION if mode == "cubic" else ARITH
        return Case("Resize", [x], attrs, onnx_attrs, onnx_in, tol=tol, opset=opset)

    for coord in coords:
        for nmode in nearest:
            cases.append(case(x, (1, 2, 8, 3), "nearest", coord, nmode))
        cases.append(case(x, (1, 2, 7, 10), "linear", coord))
        cases.append(case(x, (1, 2, 3, 2), "linear", coord))
        cases.append(case(x, (1, 2, 1, 5), "linear", coord))
    # scales given (not sizes): the transform uses the scale itself, 2.5 here, not 10/4
    cases.append(case(x, (1, 2, 10, 7), "nearest", "asymmetric", "round_prefer_ceil", scales=(1, 1, 2.5, 1.5)))
    cases.append(case(x, (1, 2, 10, 7), "linear", "half_pixel", scales=(1, 1, 2.5, 1.5)))
    cases.append(case(ints(2, 3, 3, dtype="int32"), (4, 6, 3), "nearest", "half_pixel"))
    # scale * size not an integer: half_pixel_symmetric re-centres (opset 19)
    for mode in ("nearest", "linear"):
        cases.append(case(x, (1, 2, 6, 8), mode, "half_pixel_symmetric", scales=(1, 1, 1.7, 1.7), opset=19))
    # nearest where onnxruntime's float32 source coordinates, and its tie window, pick another pixel than float64 ones
    # (onnx's reference): tilefarm follows onnxruntime. 13 -> 2 asymmetric: 1 / float32(2/13) = 6.4999995, a tie
    ties = [((1, 1, 2, n), (1, 1, 2, m), coord, nmode, None) for n, m, coord, nmode in (
        (3, 1, "half_pixel_symmetric", "floor"), (14, 9, "half_pixel_symmetric", "round_prefer_ceil"),
        (14, 2, "asymmetric", "floor"), (7, 9, "pytorch_half_pixel", "floor"),
        (13, 2, "asymmetric", "round_prefer_ceil"), (13, 2, "asymmetric", "round_prefer_floor"),
        (20, 6, "half_pixel", "round_prefer_ceil"))]  # fmt: skip
    ties.append(((1, 1, 2, 7), (1, 1, 2, 3), "half_pixel_symmetric", "ceil", (1, 1, 1, 0.5)))
    for shape, sizes, coord, nmode, scales in ties:
        pixels = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)  # each value names its pixel
        cases.append(case(pixels, sizes, "nearest", coord, nmode, scales=scales, opset=19))
        cases[-1].onnxruntime = True
    # a crop box partly outside the input: those outputs are extrapolation_value
    roi = (0, 0, -0.25, 0.25, 1, 1, 0.75, 1.5)
    for mode in ("nearest", "linear"):
        cases.append(case(x, (1, 2, 5, 6), mode, "tf_crop_and_resize", roi=roi))
    cases.append(case(x, (1, 2, 1, 1), "linear", "tf_crop_and_resize", roi=(0, 0, 0.25, 0.5, 1, 1, 0.75, 1.0)))
    for coord in ("half_pixel", "align_corners", "asymmetric"):
        cases.append(case(x, (1, 2, 7, 3), "cubic", coord))
    cubic = case(x, (1, 2, 9, 4), "cubic", "half_pixel")
    for c in (cubic, case(x, (1, 2, 9, 4), "cubic", "pytorch_half_pixel")):
        c.attrs.update(cubic_coeff_a=-0.5, exclude_outside=1)
        c.onnx_attrs.update(cubic_coeff_a=-0.5, exclude_outside=1)
        cases.append(c)
    cases.append(case(ints(1, 1, 4, 4, dtype="uint8", hi=250), (1, 1, 6, 7), "cubic", "half_pixel"))
    # trilinear: linear mode interpolates every resized dim
    cases.append(case(x, (1, 3, 7, 3), "linear", "half_pixel"))
    cases.append(case(ints(1, 1, 3, 3, dtype="uint8", hi=200), (1, 1, 5, 4), "linear", "align_corners"))
    return cases


def _to_nchw(x: np.ndarray) -> np.ndarray:
    n, cb, h, w, b = x.shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w))


def _to_nchwc(x: np.ndarray, b: int = 16) -> np.ndarray:
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // b, b, h, w).transpose(0, 1, 3, 4, 2))


def _window_ref(x: np.ndarray, k: int, stride: int, pad: int, fill: float, reduce) -> np.ndarray:
    """A square-window pool of an NCHW x, padded with `fill`."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    oh, ow = (xp.shape[2] - k) // stride + 1, (xp.shape[3] - k) // stride + 1
    taps = [xp[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride] for i in range(k) for j in range(k)]
    return reduce(np.stack(taps), axis=0)


def nchwc_cases(blocked_ref) -> list[Case]:
    """tilefarm's NCHWc forms (made by compiler.model.layout.propagate_nchwc): N x C/16 x H x W x 16 data."""
    x = f32(1, 2, 7, 9, 16)
    w = pack_conv_weight(f32(32, 32, 3, 3))
    w6, bias = block_conv_input_channels(w), f32(2, 16)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [1, 1, 1, 0], "dilations": [1, 1], "group": 1}
    both = {**attrs, "data_layout": "NCHWc", "out_layout": "NCHWc"}
    conv_ref = lambda x, w, b=None: blocked_ref(_to_nchw(x), w, b, (2, 1), (1, 1, 1, 0))
    pool = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 0, "layout": "NCHWc"}
    ones = np.ones((1, 32, 7, 9), np.float32)
    counts = _window_ref(ones, 3, 2, 1, 0.0, np.sum)  # count_include_pad=0: in-bounds taps only
    return [
        Case("NCHWcToNCHW", [x], reference=lambda x: [_to_nchw(x)]),
        Case("NCHWcToNCHW", [x], {"channels": 24}, reference=lambda x: [_to_nchw(x)[:, :24]]),
        Case("BlockedConv", [x, w6, bias], both, tol=REDUCTION,
             reference=lambda x, w6, b: [_to_nchwc(conv_ref(x, w, b.reshape(-1))[0])]),
        Case("BlockedConv", [x, w6], {**attrs, "data_layout": "NCHWc"}, tol=REDUCTION,
             reference=lambda x, w6: conv_ref(x, w)),
        Case("MaxPool", [x], pool, reference=lambda x: [_to_nchwc(_window_ref(_to_nchw(x), 3, 2, 1, -np.inf, np.max))]),
        Case("AveragePool", [x], {**pool, "count_include_pad": 0}, tol=ARITH,
             reference=lambda x: [_to_nchwc(_window_ref(_to_nchw(x), 3, 2, 1, 0.0, np.sum) / counts)]),
        Case("GlobalAveragePool", [x], {"layout": "NCHWc"}, tol=REDUCTION,
             reference=lambda x: [x.mean(axis=(2, 3), keepdims=True)]),
        Case("GlobalMaxPool", [x], {"layout": "NCHWc"}, reference=lambda x: [x.max(axis=(2, 3), keepdims=True)]),
    ]  # fmt: skip


def indexing_cases() -> list[Case]:
    """Ops that address data through indices (compiler/tensor/ops/indexing.py); constant ONNX inputs (OneHot's depth,
    CumSum's axis, Trilu's k) are attributes of the normalized node. Scatter indices are distinct where the reduction
    is none: which of two updates of one element wins is not defined."""
    data, cols = f32(3, 4, 5), np.array([[[0, 3, -1, 2, 1]] * 4] * 3, np.int64)
    rows = np.array([[2, 0, 1, 2], [0, 2, 0, 1]], np.int64)
    nd = np.array([[1], [3]], np.int64)
    one_hot = {"depth": 4, "axis": 2, "values": [-1.0, 2.0], "dtype": "float32"}
    hot_in = ints(2, 3, dtype="int64", lo=-4, hi=4)
    square, tri, tri_int, cum, cum_int = f32(4, 4), f32(4, 5), ints(2, 3, 4), f32(3, 4), ints(3, 4)
    depth = np.array(4, np.int64)
    return [
        Case("GatherElements", [data, cols], {"axis": 2}),
        Case("GatherElements", [data, np.array([[[1] * 5, [-1] * 5]] * 3, np.int32)], {"axis": 1}),
        Case("GatherND", [data, np.array([[1, 2], [0, -1]], np.int64)], {"batch_dims": 0}),
        Case("GatherND", [data, np.array([[2], [0], [1]], np.int64)], {"batch_dims": 1}),
        Case("ScatterElements", [f32(3, 4), rows[:1], f32(1, 4)], {"axis": 0, "reduction": "none"}),
        Case("ScatterElements", [f32(3, 4), rows, f32(2, 4)], {"axis": 0, "reduction": "add"}, tol=ARITH),
        Case("ScatterElements", [f32(4, 3), rows.T.copy(), f32(4, 2)], {"axis": 1, "reduction": "max"}),
        Case("ScatterND", [f32(4, 5), nd, f32(2, 5)], {"reduction": "none"}),
        Case("ScatterND", [f32(4, 5), np.array([[1, 2], [1, 2], [3, -1]], np.int64), f32(3)], {"reduction": "add"},
             tol=ARITH),
        Case("ScatterND", [ints(4, 5, dtype="int32"), nd, ints(2, 5, dtype="int32")], {"reduction": "min"}),
        Case("OneHot", [hot_in], one_hot, {"axis": -1}, [hot_in, depth, np.array([-1.0, 2.0], np.float32)]),
        Case("OneHot", [hot_in], {**one_hot, "axis": 0, "values": [0, 7], "dtype": "int32"}, {"axis": 0},
             [hot_in, depth, np.array([0, 7], np.int32)]),
        Case("Trilu", [tri], {"k": 1, "upper": 1}, {"upper": 1}, [tri, np.array(1, np.int64)]),
        Case("Trilu", [tri_int], {"k": -1, "upper": 0}, {"upper": 0}, [tri_int, np.array(-1, np.int64)]),
        Case("CumSum", [cum], {"axis": 1}, {}, [cum, np.array(1, np.int64)], tol=ARITH),
        Case("CumSum", [cum_int], {"axis": 0, "exclusive": 1, "reverse": 1}, {"exclusive": 1, "reverse": 1},
             [cum_int, np.array(0, np.int64)]),
        Case("Einsum", [f32(3, 4), f32(4, 5)], {"equation": "ij,jk->ik"}, tol=REDUCTION),
        Case("Einsum", [f32(2, 3, 4), f32(2, 5, 4)], {"equation": "bij,bkj->bik"}, tol=REDUCTION),
        Case("Einsum", [square], {"equation": "ii->i"}),
        Case("Einsum", [f32(3, 4)], {"equation": "ij->"}, tol=REDUCTION),
    ]  # fmt: skip


def _requantize_ref(acc, mult, zp, bias):
    per_channel = (slice(None), None, None)
    q = np.rint((acc + bias[per_channel]).astype(np.float32) * mult[per_channel]) + zp.astype(np.float32)
    return [np.clip(q, -128, 127).astype(np.int8)]


def _qlinear_add_ref(a, b):
    # two fused multiply-adds (onnxruntime's AVX2 QLinearAdd), each exact in float64 and rounded once to float32
    t = (b.astype(np.float64) * np.float32(0.7) + np.float32(3.25)).astype(np.float32)
    u = (a.astype(np.float64) * np.float32(0.3) + t).astype(np.float32)
    return [np.clip(np.rint(u), 0, 255).astype(np.uint8)]


def _qlinear_mul_ref(a, b):
    p = (a.astype(np.int32) - 3) * (b.astype(np.int32) - 200)
    return [np.clip(np.rint(p.astype(np.float32) * np.float32(0.01) + np.float32(7)), 0, 255).astype(np.uint8)]


def quantized_cases() -> list[Case]:
    """The quantized ops (compiler/tensor/ops/quantized.py), exact; Requantize (tilefarm's own) against numpy."""
    x, u8, s8 = f32(2, 3, 4) * 20, ints(2, 5, 6, dtype="uint8", lo=0, hi=256), ints(6, 4, dtype="int8", lo=-128, hi=128)
    scale3, zp3 = pos(3), ints(3, dtype="int8", lo=-10, hi=10)
    conv = {"kernel_shape": [3, 3], "strides": [1, 2], "pads": [1, 0, 1, 1], "dilations": [1, 1], "group": 1}
    acc, mult = ints(1, 3, 2, 2, lo=-5000, hi=5000), (pos(3) * 0.01).astype(np.float32)
    return [
        Case("QuantizeLinear", [x, np.array(0.5, np.float32), np.array(3, np.uint8)], {"axis": None, "to": "uint8"},
             {}, opset=21),
        Case("QuantizeLinear", [x, scale3, zp3], {"axis": 1, "to": "int8"}, {"axis": 1}, opset=21),
        Case("DequantizeLinear", [u8, np.array(0.1, np.float32), np.array(128, np.uint8)], {"axis": None}, {},
             opset=21),
        Case("DequantizeLinear", [ints(2, 3, dtype="int8", lo=-128, hi=128), scale3, zp3], {"axis": 1}, {}, opset=21),
        Case("MatMulInteger", [u8, s8, np.array(7, np.uint8), ints(4, dtype="int8", lo=-3, hi=3)], opset=10),
        Case("ConvInteger", [ints(1, 2, 5, 5, dtype="uint8", lo=0, hi=256), ints(3, 2, 3, 3, dtype="int8", lo=-128,
             hi=128), np.array(100, np.uint8)], conv, opset=10),
        Case("Requantize", [acc, mult, np.array(-3, np.int8), ints(3, lo=-100, hi=100)], {"axis": 1, "to": "int8"},
             reference=_requantize_ref),
        Case("QLinearAdd", [u8, ints(2, 5, 6, dtype="uint8", lo=0, hi=256)],
             {"ratios": (float(np.float32(0.3)), float(np.float32(0.7))), "fixed": 3.25}, reference=_qlinear_add_ref),
        Case("QLinearMul", [u8, ints(2, 5, 6, dtype="uint8", lo=0, hi=256)],
             {"ratio": float(np.float32(0.01)), "zero_points": (3, 200, 7)}, reference=_qlinear_mul_ref),
    ]  # fmt: skip


CASES = (
    unary_cases() + binary_cases() + bitshift_cases() + other_elementwise_cases() + reduce_cases() + nn_cases()
    + transform_cases() + indexing_cases() + quantized_cases()
)


def _ids(cases: list[Case]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for c in cases:
        seen[c.op] = seen.get(c.op, -1) + 1
        out.append(f"{c.op}-{seen[c.op]}")
    return out


@pytest.mark.parametrize("schedule", [initial_state, default_schedule], ids=["naive", "default"])
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_op_matches_onnx_reference(case: Case, schedule):
    # the default schedule (inlined injective stages, tiled and vectorized loops) must not change the results
    got = run_tilefarm(case, schedule)
    want = case.reference(*case.inputs) if case.reference else run_onnx(case, got)
    rtol, atol = case.tol
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape, f"shape {g.shape} != reference {w.shape}"
        assert g.dtype == w.dtype or case.reference, f"dtype {g.dtype} != reference {w.dtype}"
        np.testing.assert_allclose(g, w.astype(g.dtype), rtol=rtol, atol=atol, equal_nan=True)


def test_every_op_has_cases():
    assert set(ops.OPS) == {c.op for c in CASES}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["Sin", "Cos"])
def test_sin_cos_vectorized_and_interpreted(op, dtype):
    # the naive schedule above calls scalar libm; a vectorized loop goes through libmvec, the interpreter
    # through Python's math: all three must agree with numpy (sin/cos are within 4 ulp in libmvec)
    x = (RNG.standard_normal((3, 37)) * 10).astype(dtype)
    x[0, :3] = [np.inf, -np.inf, np.nan]
    with np.errstate(invalid="ignore"):  # sin(±inf) is NaN, as wanted
        want = getattr(np, op.lower())(x)
    inp = te.placeholder(x.shape, dtype, "x")
    (out,) = ops.OPS[op]([inp], {}, "n0")
    dag = ComputeDAG([inp, out])
    state = initial_state(dag).annotate("n0", "i1", "vectorize")
    func = lower(state, "kernel")
    got = np.zeros_like(x)
    compile_funcs([func])["kernel"](x, got)
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)
    got[:] = 0
    interp.run(func, x, got)
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-12, atol=1e-7)


@pytest.mark.parametrize("dtype", SHIFTED)
def test_bitshift_interpreted(dtype):
    # the interpreter (Python ints) reads te's shifts as codegen does, counts past the width included
    x, count = _shift_inputs(dtype)
    opset = 18 if dtype.startswith("u") else 28
    for direction in ("LEFT", "RIGHT"):
        case = Case("BitShift", [x, count], {"direction": direction}, opset=opset, onnxruntime=True)
        a, b = te.placeholder(x.shape, dtype, "a"), te.placeholder(count.shape, dtype, "b")
        (out,) = ops.OPS["BitShift"]([a, b], case.attrs, "n0")
        got = np.zeros(out.shape, dtype)
        interp.run(lower(initial_state(ComputeDAG([a, b, out])), "kernel"), x, count, got)
        np.testing.assert_array_equal(got, run_onnx(case, [got])[0], err_msg=direction)


# ---------------------------------------------------------------------------------------------- errors


def ph(*shape, dtype="float32", name="x"):
    return te.placeholder(shape, dtype, name)


@pytest.mark.parametrize(
    "op, inputs, attrs, error, match",
    [
        ("Exp", [ph(3, dtype="int32")], {}, UnsupportedDType, "Exp: input x has dtype int32"),
        ("Add", [ph(3, 2), ph(4, name="y")], {}, InvalidExpr, "do not broadcast"),
        ("Add", [ph(3), ph(3, dtype="float64", name="y")], {}, InvalidExpr, "must have one dtype"),
        ("Cast", [ph(3)], {"to": 10}, UnsupportedDType, "ONNX data type 10"),
        ("Reshape", [ph(2, 3)], {"shape": [4, 2]}, InvalidExpr, "sizes differ"),
        ("Resize", [ph(1, 1, 2, 2)], {"sizes": [1, 1, 4, 4], "mode": "area"}, InvalidExpr, "nearest, linear or cubic"),
        ("Resize", [ph(1, 1, 2, 2)], {"sizes": [1, 1, 1, 1], "mode": "linear", "antialias": 1,
                    "scales": [1, 1, 0.5, 0.5]}, InvalidExpr, "antialiased"),
        ("Resize", [ph(1, 1, 2, 2)], {"sizes": [1, 1, 3, 3], "coordinate_transformation_mode": "other"},
         InvalidExpr, "'other' is not supported"),
        ("Conv", [ph(1, 2, 5), ph(2, 2, 3, 3, name="w")], {"kernel_shape": [3]}, InvalidExpr, "of one rank"),
        ("Conv", [ph(1, 3, 5), ph(2, 2, 3, name="w")], {"kernel_shape": [3], "group": 2}, InvalidExpr, "group=2"),
        ("Slice", [ph(4)], {"starts": [2], "ends": [2], "axes": [0], "steps": [1]}, InvalidExpr, "empty"),
        ("Pad", [ph(3)], {"pads": [3, 0], "mode": "reflect"}, InvalidExpr, "smaller than"),
        ("BatchNormalization", [ph(1, 3, 2, 2), *(ph(3, name=f"p{i}") for i in range(4))], {"training_mode": 1},
         InvalidExpr, "training_mode"),
        ("Relu", [None], {}, InvalidExpr, "input 0"),
        ("BitShift", [ph(3, dtype="uint8"), ph(3, dtype="uint8", name="y")], {"direction": "UP"}, InvalidExpr,
         "LEFT or RIGHT"),
        ("BitShift", [ph(3), ph(3, name="y")], {"direction": "LEFT"}, UnsupportedDType, "BitShift: input x"),
        ("BitShift", [ph(3, dtype="uint8"), ph(3, dtype="uint32", name="y")], {"direction": "LEFT"}, InvalidExpr,
         "one dtype"),
    ],
)  # fmt: skip
def test_op_errors(op, inputs, attrs, error, match):
    with pytest.raises(error, match=match):
        ops.OPS[op](inputs, attrs, "n")
