"""Random whole ONNX graphs for differential testing against onnxruntime (tests/test_graph_fuzz.py).

A graph starts from one or two NCHW inputs and grows op by op, each op reading values drawn from all those made so
far: fan-out, residual joins (Add/Mul/Concat of two branches), BatchNormalization after Conv, ConvTranspose, Add or
anything else, long elementwise chains, reshapes between anchors, Resize, pooling, constants, and control flow: an If
on the data's sign whose branches read the enclosing graph's values, a Loop carrying a value through a few steps (its
stacked scan output an output only). Its outputs are drawn
from every value, inputs and constants included, the last one always among them, so intermediate values that are
also read further on are outputs as often as final ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
MAX_CHANNELS = 32
MAX_SIDE = 40


@dataclass
class _Builder:
    """The graph being drawn: values by name with their NCHW shapes, nodes and initializers."""

    rng: np.random.Generator
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    inputs: list = field(default_factory=list)

    def name(self, prefix: str) -> str:
        return f"{prefix}{len(self.shapes) + len(self.inits)}"

    def const(self, a: np.ndarray, prefix: str = "c") -> str:
        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(a.astype(np.float32) if a.dtype.kind == "f" else a, n))
        return n

    def node(self, op: str, ins: list[str], shape: tuple[int, ...], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        self.shapes[out] = shape
        return out

    def normal(self, *shape: int, scale: float = 1.0) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)


def _conv(b: _Builder, draw, v: str) -> str | None:
    n, c, h, w = b.shapes[v]
    k = draw(st.sampled_from([1, 3]))
    stride = draw(st.sampled_from([1, 1, 2]))
    dil = draw(st.sampled_from([1, 1, 2])) if k == 3 else 1
    pad = draw(st.integers(0, dil * (k - 1)))
    reach = dil * (k - 1) + 1
    if h + 2 * pad < reach or w + 2 * pad < reach:
        return None
    group = c if draw(st.booleans()) and c > 1 else 1
    co = c if group > 1 else draw(st.sampled_from([2, 4, 8, 16, 32]))
    ins = [v, b.const(b.normal(co, c // group, k, k, scale=1 / np.sqrt(c * k * k)))]
    if draw(st.booleans()):
        ins.append(b.const(b.normal(co, scale=0.1)))
    oh, ow = (h + 2 * pad - reach) // stride + 1, (w + 2 * pad - reach) // stride + 1
    return b.node("Conv", ins, (n, co, oh, ow), kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4,
                  dilations=[dil] * 2, group=group)  # fmt: skip


def _conv_transpose(b: _Builder, draw, v: str) -> str | None:
    n, c, h, w = b.shapes[v]
    k = draw(st.sampled_from([2, 3]))
    stride = draw(st.sampled_from([1, 2]))
    pad = draw(st.integers(0, k - 1))
    out_pad = draw(st.integers(0, stride - 1))
    oh, ow = (h - 1) * stride - 2 * pad + k + out_pad, (w - 1) * stride - 2 * pad + k + out_pad
    if min(oh, ow) < 1 or max(oh, ow) > MAX_SIDE:
        return None
    co = draw(st.sampled_from([2, 4, 8, 16]))
    ins = [v, b.const(b.normal(c, co, k, k, scale=1 / np.sqrt(c * k * k)))]
    if draw(st.booleans()):
        ins.append(b.const(b.normal(co, scale=0.1)))
    return b.node("ConvTranspose", ins, (n, co, oh, ow), kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4,
                  output_padding=[out_pad] * 2)  # fmt: skip


def _batchnorm(b: _Builder, draw, v: str) -> str:
    c = b.shapes[v][1]
    stats = [b.normal(c), b.normal(c, scale=0.1), b.normal(c, scale=0.1), (b.rng.random(c) + 0.5).astype(np.float32)]
    return b.node("BatchNormalization", [v, *(b.const(s) for s in stats)], b.shapes[v], epsilon=1e-5)


def _unary(b: _Builder, draw, v: str) -> str:
    op = draw(st.sampled_from(["Relu", "Sigmoid", "HardSigmoid", "Clip", "LeakyRelu", "Tanh", "Neg", "Abs"]))
    if op == "Clip":
        return b.node(op, [v, b.const(np.array(-0.5, np.float32)), b.const(np.array(0.75, np.float32))], b.shapes[v])
    return b.node(op, [v], b.shapes[v])


def _binary(b: _Builder, draw, v: str) -> str:
    op = draw(st.sampled_from(["Add", "Add", "Mul", "Sub"]))
    same = [u for u, s in b.shapes.items() if s == b.shapes[v]]
    if draw(st.booleans()) and len(same) > 1:
        other = draw(st.sampled_from(same))  # a residual join (or the value with itself)
    else:
        n, c, _, _ = b.shapes[v]
        other = b.const(b.normal(1, c, 1, 1))  # a per-channel broadcast
    ins = [v, other] if draw(st.booleans()) else [other, v]
    return b.node(op, ins, b.shapes[v])


def _pool(b: _Builder, draw, v: str) -> str | None:
    n, c, h, w = b.shapes[v]
    op = draw(st.sampled_from(["MaxPool", "AveragePool", "GlobalAveragePool"]))
    if op == "GlobalAveragePool":
        return b.node(op, [v], (n, c, 1, 1))
    if min(h, w) < 2:
        return None
    return b.node(op, [v], (n, c, h // 2, w // 2), kernel_shape=[2, 2], strides=[2, 2])


def _resize(b: _Builder, draw, v: str) -> str | None:
    n, c, h, w = b.shapes[v]
    if 2 * max(h, w) > MAX_SIDE:
        return None
    scales = b.const(np.array([1, 1, 2, 2], np.float32))
    return b.node("Resize", [v, "", scales], (n, c, 2 * h, 2 * w), mode="nearest",
                  coordinate_transformation_mode="asymmetric", nearest_mode="floor")  # fmt: skip


def _concat(b: _Builder, draw, v: str) -> str | None:
    n, c, h, w = b.shapes[v]
    others = [
        u for u, s in b.shapes.items() if len(s) == 4 and s[0] == n and s[2:] == (h, w) and s[1] + c <= 2 * MAX_CHANNELS
    ]
    if not others:
        return None
    u = draw(st.sampled_from(others))
    return b.node("Concat", [v, u], (n, c + b.shapes[u][1], h, w), axis=1)


def _reshape_round_trip(b: _Builder, draw, v: str) -> str:
    n, c, h, w = b.shapes[v]
    flat = b.node("Reshape", [v, b.const(np.array([n, c, h * w], np.int64))], (n, c, h * w))
    if draw(st.booleans()):
        flat = b.node("Transpose", [flat], (n, h * w, c), perm=[0, 2, 1])
        flat = b.node("Relu", [flat], (n, h * w, c))
        flat = b.node("Transpose", [flat], (n, c, h * w), perm=[0, 2, 1])
    return b.node("Reshape", [flat, b.const(np.array([n, c, h, w], np.int64))], (n, c, h, w))


def _constant(b: _Builder, draw, v: str) -> str:
    """A Constant node's value, of `v`'s shape: it may join `v` later, or be an output itself."""
    out = b.name("constant")
    b.nodes.append(helper.make_node("Constant", [], [out], value=numpy_helper.from_array(b.normal(*b.shapes[v]))))
    b.shapes[out] = b.shapes[v]
    return out


def _branch_op(b: _Builder, draw, v: str, out: str) -> tuple[list, list]:
    """One subgraph's node computing `out` of `v`'s shape from `v` (read from the enclosing graph): an elementwise
    op, a shape-keeping conv, a join with another value of that shape, or `v` itself. Returns (nodes, initializers)."""
    shape = b.shapes[v]
    kind = draw(st.sampled_from(["unary", "conv", "join", "identity"]))
    if kind == "unary":
        return [helper.make_node(draw(st.sampled_from(["Relu", "Sigmoid", "Neg", "Tanh"])), [v], [out])], []
    if kind == "conv":
        # scaled by its fan-in, as _conv's and trained convs' are (0.3 on 16 channels grew each conv's output 3.6x,
        # and three in a row left Winograd's rounding past the comparison's tolerance after a Clip)
        w = numpy_helper.from_array(b.normal(shape[1], shape[1], 3, 3, scale=1 / np.sqrt(9 * shape[1])), f"{out}_w")
        return [helper.make_node("Conv", [v, w.name], [out], pads=[1, 1, 1, 1])], [w]
    if kind == "join":
        other = draw(st.sampled_from(sorted(u for u, s in b.shapes.items() if s == shape)))
        return [helper.make_node(draw(st.sampled_from(["Add", "Mul"])), [v, other], [out])], []
    return [helper.make_node("Identity", [v], [out])], []


def _if(b: _Builder, draw, v: str) -> str:
    """An If on the data (the sign of a sum of `v`) whose branches read values of the enclosing graph."""
    out = b.name("if")
    # the condition's sum and bool are not among the values ops and outputs are drawn from: a sum of thousands of
    # terms that cancel to a small one is compared by its own size, which its rounding (any summation order's) exceeds
    total, positive = f"{out}_sum", f"{out}_positive"
    b.nodes.append(helper.make_node("ReduceSum", [v], [total], keepdims=0))
    b.nodes.append(helper.make_node("Greater", [total, b.const(np.array(0.0, np.float32))], [positive]))
    branches = {}
    for which in ("then", "else"):
        nodes, inits = _branch_op(b, draw, v, f"{out}_{which}")
        typed = helper.make_tensor_value_info(f"{out}_{which}", TensorProto.FLOAT, list(b.shapes[v]))
        branches[f"{which}_branch"] = helper.make_graph(nodes, f"{out}_{which}", [], [typed], inits)
    b.nodes.append(helper.make_node("If", [positive], [out], name=out, **branches))
    b.shapes[out] = b.shapes[v]
    return out


def _loop(b: _Builder, draw, v: str) -> str:
    """A Loop of 1-3 iterations carrying `v` through an elementwise step (reading the enclosing graph's values too);
    its scan output (each iteration's value, stacked) is a graph output only."""
    out, trips = b.name("loop"), draw(st.integers(1, 3))
    step, inits = _branch_op(b, draw, v, f"{out}_step")
    step = [helper.make_node(n.op_type, [f"{out}_in" if i == v else i for i in n.input], n.output, **{
        a.name: helper.get_attribute_value(a) for a in n.attribute}) for n in step]  # fmt: skip
    shape = list(b.shapes[v])
    typed = [helper.make_tensor_value_info(f"{out}_{k}", TensorProto.FLOAT, shape) for k in ("in", "next", "piece")]
    body = helper.make_graph(
        [*step, helper.make_node("Mul", [f"{out}_step", f"{out}_half"], [f"{out}_next"]),
         helper.make_node("Identity", [f"{out}_next"], [f"{out}_piece"]),
         helper.make_node("Identity", [f"{out}_cond"], [f"{out}_cond_out"])],
        f"{out}_body",
        [helper.make_tensor_value_info(f"{out}_i", TensorProto.INT64, []),
         helper.make_tensor_value_info(f"{out}_cond", TensorProto.BOOL, []), typed[0]],
        [helper.make_tensor_value_info(f"{out}_cond_out", TensorProto.BOOL, []), typed[1], typed[2]],
        [*inits, numpy_helper.from_array(np.array(0.5, np.float32), f"{out}_half")],
    )  # fmt: skip
    m = b.const(np.array(trips, np.int64), "m")
    stacked = f"{out}_stack"
    b.nodes.append(helper.make_node("Loop", [m, "", v], [out, stacked], name=out, body=body))
    b.shapes[out], b.shapes[stacked] = b.shapes[v], (trips, *b.shapes[v])
    return out


OPS = {
    "conv": _conv,
    "conv_transpose": _conv_transpose,
    "batchnorm": _batchnorm,
    "unary": _unary,
    "binary": _binary,
    "pool": _pool,
    "resize": _resize,
    "concat": _concat,
    "reshape": _reshape_round_trip,
    "constant": _constant,
    "if": _if,
    "loop": _loop,
}
WEIGHTS = {"conv": 3, "conv_transpose": 2, "batchnorm": 3, "unary": 3, "binary": 3, "pool": 1, "resize": 1,
           "concat": 1, "reshape": 1, "constant": 1, "if": 1, "loop": 1}  # fmt: skip


@st.composite
def graphs(draw, max_ops: int = 14) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A random model and seeded inputs for it."""
    b = _Builder(np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    # small images, and ones large enough for the layouts of real convs: 16-channel blocks (NCHWc) and Winograd's tiles
    large = draw(st.booleans())
    side = st.integers(16, 32) if large else st.integers(2, 12)
    for i in range(draw(st.integers(1, 2))):
        shape = (1, draw(st.sampled_from([3, 16, 32] if large else [1, 2, 3, 4, 8])), draw(side), draw(side))
        name = f"x{i}"
        b.shapes[name] = shape
        b.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
    kinds = [k for k, w in WEIGHTS.items() for _ in range(w)]
    last = None
    for _ in range(draw(st.integers(1, max_ops))):
        images = sorted(u for u, s in b.shapes.items() if len(s) == 4)  # every op reads an NCHW value
        v = last if last is not None and draw(st.booleans()) else draw(st.sampled_from(images))
        made = OPS[draw(st.sampled_from(kinds))](b, draw, v)
        last = made or last
    values = sorted(b.shapes)
    outs = set(draw(st.lists(st.sampled_from(values), min_size=0, max_size=3)))
    outs.add(last or values[-1])
    # an output that is a graph input is legal ONNX, but onnxruntime refuses it
    outs = [o for o in sorted(outs) if o not in {i.name for i in b.inputs}] or [b.node("Relu", ["x0"], b.shapes["x0"])]
    outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(b.shapes[o])) for o in outs]
    graph = helper.make_graph(b.nodes, "fuzz", b.inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model, full_check=True)
    feeds = {i.name: b.normal(*b.shapes[i.name]) for i in b.inputs}
    return model, feeds
