"""One-node ONNX models with their attributes drawn from everything the standard allows: Conv and ConvTranspose
(pads, auto_pad, strides, dilations, groups, output_padding), Resize (every mode, coordinate transformation and
nearest rounding, by scales or sizes), pooling (ceil_mode, count_include_pad, dilations), Slice (negative steps,
out-of-range starts and ends), Pad (every mode), reductions (keepdims, empty axes). For tests/test_op_fuzz.py.
"""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

OPSET = 19


def _model(node, x_shape, inits=(), out_dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", out_dtype, None)],
        list(inits),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def _image(draw, max_c: int = 6, max_side: int = 12) -> tuple[int, ...]:
    return (draw(st.integers(1, 2)), draw(st.integers(1, max_c)), draw(st.integers(1, max_side)),
            draw(st.integers(1, max_side)))  # fmt: skip


def _const(name: str, a: np.ndarray):
    return numpy_helper.from_array(a, name)


def _kernel(draw, c: int, transposed: bool):
    """A conv's group, kernel size, weight (and perhaps bias) initializers, its input names and a data generator."""
    group = draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
    co = group * draw(st.integers(1, 3))
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    shape = (c, co // group, *k) if transposed else (co, c // group, *k)
    inits, ins = [_const("w", rng.standard_normal(shape).astype(np.float32))], ["x", "w"]
    if draw(st.booleans()):
        inits.append(_const("b", rng.standard_normal(co).astype(np.float32)))
        ins.append("b")
    return group, k, inits, ins, rng


def _auto_pad(draw) -> str:
    return draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))


@st.composite
def conv(draw):
    n, c, h, w = _image(draw)
    group, k, inits, ins, rng = _kernel(draw, c, transposed=False)
    attrs = {"kernel_shape": list(k), "strides": [draw(st.integers(1, 3)), draw(st.integers(1, 3))],
             "dilations": [draw(st.integers(1, 3)), draw(st.integers(1, 3))], "group": group}  # fmt: skip
    auto = _auto_pad(draw)
    if auto == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, 3)) for _ in range(4)]
    else:
        attrs["auto_pad"] = auto
    return _model(helper.make_node("Conv", ins, ["y"], **attrs), (n, c, h, w), inits), rng


@st.composite
def conv_transpose(draw):
    n, c, h, w = _image(draw, max_side=8)
    group, k, inits, ins, rng = _kernel(draw, c, transposed=True)
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    attrs = {"kernel_shape": list(k), "strides": strides, "dilations": dilations, "group": group}
    auto = _auto_pad(draw)
    if auto == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, (k[i % 2] - 1) * dilations[i % 2])) for i in range(4)]
        attrs["output_padding"] = [draw(st.integers(0, max(strides[i], dilations[i]) - 1)) for i in range(2)]
    else:
        attrs["auto_pad"] = auto
    return _model(helper.make_node("ConvTranspose", ins, ["y"], **attrs), (n, c, h, w), inits), rng


@st.composite
def resize(draw):
    n, c, h, w = _image(draw, max_c=3, max_side=9)
    mode = draw(st.sampled_from(["nearest", "linear", "cubic"]))
    ctm = draw(st.sampled_from(["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                                "half_pixel_symmetric"]))  # fmt: skip
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = draw(st.sampled_from(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    if mode == "cubic":
        attrs["cubic_coeff_a"] = draw(st.sampled_from([-0.75, -0.5]))
        attrs["exclude_outside"] = draw(st.integers(0, 1))
    inits = [_const("roi", np.array([], np.float32))]
    if draw(st.booleans()):
        scales = [1.0, 1.0, draw(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])), draw(st.sampled_from([0.5, 2.0, 2.5]))]
        if any(s * d < 1 for s, d in zip(scales[2:], (h, w))):
            scales[2:] = [2.0, 2.0]
        inits.append(_const("scales", np.array(scales, np.float32)))
        ins = ["x", "roi", "scales"]
    else:
        sizes = [n, c, draw(st.integers(1, 16)), draw(st.integers(1, 16))]
        inits.append(_const("sizes", np.array(sizes, np.int64)))
        ins = ["x", "roi", "", "sizes"]
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    return _model(helper.make_node("Resize", ins, ["y"], **attrs), (n, c, h, w), inits), rng


@st.composite
def pool(draw):
    n, c, h, w = _image(draw, max_side=10)
    op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
    k = [draw(st.integers(1, 4)), draw(st.integers(1, 4))]
    attrs = {"kernel_shape": k, "strides": [draw(st.integers(1, 3)), draw(st.integers(1, 3))],
             "ceil_mode": draw(st.integers(0, 1))}  # fmt: skip
    if op == "MaxPool":
        attrs["dilations"] = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    else:
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    auto = _auto_pad(draw)
    if auto == "NOTSET":
        # a dilated window can fall wholly in the padding, where onnxruntime gives -FLT_MAX and onnx's reference 0
        dilated = any(d > 1 for d in attrs.get("dilations", []))
        attrs["pads"] = [0 if dilated else draw(st.integers(0, k[i % 2] - 1)) for i in range(4)]
    else:
        attrs["auto_pad"] = auto
        # onnxruntime 1.2x pads a dilated SAME MaxPool short (1x1 input, kernel 2 dilated 2: 0 rows where the spec,
        # onnx's inference and its reference evaluator give 1), so the two are not compared there
        attrs.pop("dilations", None)
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    return _model(helper.make_node(op, ["x"], ["y"], **attrs), (n, c, h, w)), rng


@st.composite
def slice_(draw):
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=4)))
    rank = len(shape)
    axes = draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank))
    starts = [draw(st.integers(-10, 10)) for _ in axes]
    ends = [draw(st.sampled_from([draw(st.integers(-10, 10)), 2**62, -(2**62)])) for _ in axes]
    steps = [draw(st.sampled_from([1, 2, 3, -1, -2])) for _ in axes]
    inits = [_const(n, np.array(v, np.int64)) for n, v in [("starts", starts), ("ends", ends), ("axes", axes),
                                                            ("steps", steps)]]  # fmt: skip
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
    return _model(node, shape, inits), rng


@st.composite
def pad(draw):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
    mode = draw(st.sampled_from(["constant", "reflect", "edge", "wrap"]))
    limit = [s - 1 if mode == "reflect" else (s if mode == "wrap" else 4) for s in shape]
    pads = [draw(st.integers(0, m)) for m in limit] + [draw(st.integers(0, m)) for m in limit]
    if mode == "constant" and draw(st.booleans()):  # negative pads crop
        pads = [p - draw(st.integers(0, min(1, s - 1))) if p == 0 else p for p, s in zip(pads, shape * 2)]
    inits = [_const("pads", np.array(pads, np.int64)), _const("value", np.array(1.5, np.float32))]
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    node = helper.make_node("Pad", ["x", "pads", "value"], ["y"], mode=mode)
    return _model(node, shape, inits), rng


@st.composite
def reduce(draw):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
    op = draw(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                               "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare"]))  # fmt: skip
    rank = len(shape)
    axes = draw(st.lists(st.integers(-rank, rank - 1), max_size=rank, unique_by=lambda a: a % rank))
    attrs = {"keepdims": draw(st.integers(0, 1)), "noop_with_empty_axes": draw(st.integers(0, 1))}
    inits, ins = [], ["x"]
    if axes or draw(st.booleans()):
        inits.append(_const("axes", np.array(axes, np.int64)))
        ins.append("axes")
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    return _model(helper.make_node(op, ins, ["y"], **attrs), shape, inits), rng


OP_STRATEGIES = {"conv": conv(), "conv_transpose": conv_transpose(), "resize": resize(), "pool": pool(),
                 "slice": slice_(), "pad": pad(), "reduce": reduce()}  # fmt: skip
