"""The converters of most ONNX ops (`CONVERTERS`; with recurrent.py's they make `ONNX_OPS`): each turns one ONNX node
(a `_Ctx`) into normalized graph nodes (`compiler.model.graph`'s contract): attributes filled with their defaults,
constant inputs turned into attributes, opset differences resolved."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from compiler.base import dtypes
from compiler.base.errors import InvalidModel
from compiler.model.graph import Node, TensorType, Value

# ops that have no runtime form here: they must fold to constants
FOLD_ONLY = {"Constant", "ConstantOfShape", "Shape", "Size", "Range"}
# from which opset each Reduce* takes `axes` as an input instead of an attribute
AXES_INPUT_FROM = {
    "ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18, "ReduceL1": 18, "ReduceL2": 18,
    "ReduceLogSum": 18, "ReduceLogSumExp": 18, "ReduceSumSquare": 18, "ReduceProd": 18,
}  # fmt: skip


class _Names(Protocol):
    """The graph builder: hands out unique value names, the Value of an ONNX name and a control-flow node's imported
    subgraphs (control_flow.Imported, by the node's outputs)."""

    def unique(self, name: str) -> str: ...

    def value(self, name: str) -> Value: ...

    def control(self, outputs: list[str]) -> Any: ...


class _CannotConvert(Exception):
    """One node that cannot be compiled as it is; collected into a single UnsupportedOp for the whole model."""

    def __init__(self, note: str):
        self.note = note


@dataclass
class _Ctx:
    """What a converter sees of one ONNX node: its attributes, input/output Values and the opset."""

    op: str
    name: str
    opset: int
    attrs: dict[str, Any]
    inputs: list[Value | None]
    outputs: list[Value | None]
    used: set[str]
    conv: _Names
    onnx_outputs: list[str] = field(default_factory=list)

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def const(self, i: int, what: str) -> np.ndarray | None:
        """Input i's constant data (None when omitted); a run-time value here cannot be compiled."""
        v = self.input(i)
        if v is None:
            return None
        if v.const is None:
            raise _CannotConvert(
                f"{self.op} node {self.name!r}: input {v.name!r} ({what}) must be a compile-time "
                "constant, but it is computed at run time"
            )
        return v.const

    def ints(self, i: int, what: str) -> list[int] | None:
        c = self.const(i, what)
        return None if c is None else [int(x) for x in c.reshape(-1)]

    def node(self, op: str, inputs, attrs: dict[str, Any] | None = None, outputs=None) -> Node:
        outs = tuple(outputs) if outputs is not None else (self.outputs[0],)
        return Node(op, tuple(inputs), outs, dict(attrs or {}), self.name)

    def temp(self, suffix: str, shape: tuple[int, ...], dtype: str) -> Value:
        return Value(self.conv.unique(f"{self.name}_{suffix}"), TensorType(tuple(shape), dtype))

    def constant(self, suffix: str, array: np.ndarray) -> Value:
        return Value(self.conv.unique(f"{self.name}_{suffix}"), TensorType(array.shape, str(array.dtype)), array)

    def first_output_only(self) -> None:
        """Drop optional extra outputs nothing reads; one that is read cannot be produced here."""
        for name, v in zip(self.onnx_outputs[1:], self.outputs[1:]):
            if v is not None and name in self.used:
                raise _CannotConvert(
                    f"{self.op} node {self.name!r}: its output {name!r} is used, but tilefarm computes "
                    "only the first output of this op"
                )
        self.outputs = self.outputs[:1]


# ---------------------------------------------------------------------------------------------- converter helpers


def _axis(a: int, rank: int, inclusive: bool = False) -> int:
    """An axis made non-negative; out of [-rank, rank) (with `inclusive`, as Flatten's, through rank) it is refused."""
    if not -rank <= a < rank + inclusive:
        raise InvalidModel(f"axis {a} is out of range for a value of rank {rank}")
    return a + rank if a < 0 else a


def _axes(axes, rank: int) -> list[int]:
    return sorted(_axis(int(a), rank) for a in axes)


def _filled(ctx: _Ctx, defaults: dict[str, Any]) -> dict[str, Any]:
    """ONNX attributes with every default spelled out."""
    return {k: ctx.attrs.get(k, d) for k, d in defaults.items()}


def _same_pads(auto_pad: str, sizes, kernel, strides, dilations, crop: bool) -> list[int]:
    """Explicit pads for auto_pad SAME_UPPER/SAME_LOWER: output = ceil(in / stride), the odd pixel at the end/begin.
    A stride longer than the window makes the spec's formula negative: with `crop` (pools, as onnxruntime's
    AveragePool) the input is cropped (`_cropped`), else (convs, as onnxruntime, TensorFlow and PyTorch) not padded."""
    begin, end = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size
        total = total if crop else max(total, 0)
        # halved toward zero, as onnxruntime does: the same as the spec's floor where the total is not negative
        head = int(total / 2) if auto_pad == "SAME_UPPER" else int((total + 1) / 2)
        begin.append(head)
        end.append(total - head)
    return begin + end


WINDOWED = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool")


def check_window(op: str, name: str, attrs: dict[str, Any], rank: int, weight: tuple[int, ...] | None) -> None:
    """A conv's or pool's window attributes as the standard bounds them, one entry per spatial dim of its input of
    `rank` (and the kernel its `weight` shape's): onnx's checker does not look at values, and kernels built from
    others read out of bounds or compute something else (found by the loader fuzzer)."""
    n = rank - 2
    kernel = attrs.get("kernel_shape", list(weight[2:]) if weight is not None else None)
    counts = {"kernel_shape": (kernel, n, 1), "strides": (attrs.get("strides"), n, 1),
              "dilations": (attrs.get("dilations"), n, 1), "pads": (attrs.get("pads"), 2 * n, 0),
              "output_padding": (attrs.get("output_padding"), n, 0)}  # fmt: skip
    for what, (values, count, least) in counts.items():
        if values is not None and (len(values) != count or any(v < least for v in values)):
            raise InvalidModel(f"{op} node {name!r}: {what} {list(values)} must be {count} values of at least {least} "
                               f"for its {n}-D input")  # fmt: skip
    if weight is not None and list(weight[2:]) != list(kernel):
        raise InvalidModel(f"{op} node {name!r}: kernel_shape {list(kernel)} but the weight is {list(weight)}")
    if attrs.get("group", 1) < 1:
        raise InvalidModel(f"{op} node {name!r}: group {attrs['group']} must be at least 1")


def _window_attrs(ctx: _Ctx, kernel: list[int], crop: bool = False) -> dict[str, Any]:
    """kernel_shape, strides, dilations and auto_pad resolved into pads, shared by Conv and the pools."""
    n = len(kernel)
    strides = list(ctx.attrs.get("strides", [1] * n))
    dilations = list(ctx.attrs.get("dilations", [1] * n))
    auto_pad = ctx.attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(auto_pad, ctx.inputs[0].shape[2:], kernel, strides, dilations, crop)
    elif auto_pad == "VALID":
        pads = [0] * 2 * n
    else:
        pads = list(ctx.attrs.get("pads", [0] * 2 * n))
    return {"kernel_shape": list(kernel), "strides": strides, "pads": pads, "dilations": dilations}


def _cropped(ctx: _Ctx, op: str, attrs: dict[str, Any]) -> list[Node]:
    """The pool `op` with `attrs`, its input first cropped by the negative pads (made 0) a SAME auto_pad gave."""
    pads, x = attrs["pads"], ctx.inputs[0]
    n = len(pads) // 2
    if min(pads) >= 0:
        return [ctx.node(op, ctx.inputs, attrs)]
    starts = [max(-b, 0) for b in pads[:n]]
    ends = [size + min(e, 0) for size, e in zip(x.shape[2:], pads[n:])]
    cropped = ctx.temp("cropped", (*x.shape[:2], *(e - s for s, e in zip(starts, ends))), x.dtype)
    crop = {"starts": starts, "ends": ends, "axes": list(range(2, 2 + n)), "steps": [1] * n}
    attrs = {**attrs, "pads": [max(p, 0) for p in pads]}
    return [ctx.node("Slice", [x], crop, [cropped]), ctx.node(op, [cropped, *ctx.inputs[1:]], attrs)]


def _plain(ctx: _Ctx) -> list[Node]:
    """An op with no attributes and one output: passed through as it is."""
    return [ctx.node(ctx.op, ctx.inputs)]


# defaults of the elementwise ops whose only attributes are scalars
SCALAR_DEFAULTS: dict[str, dict[str, Any]] = {
    "LeakyRelu": {"alpha": 0.01},
    "Elu": {"alpha": 1.0},
    "Selu": {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
    "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
    "Gelu": {"approximate": "none"},
    "Mod": {"fmod": 0},
    "Celu": {"alpha": 1.0},
    "ThresholdedRelu": {"alpha": 1.0},
    "IsInf": {"detect_negative": 1, "detect_positive": 1},
    "InstanceNormalization": {"epsilon": 1e-5},
    "LRN": {"alpha": 0.0001, "beta": 0.75, "bias": 1.0, "size": 1},
}


def _with_defaults(ctx: _Ctx) -> list[Node]:
    return [ctx.node(ctx.op, ctx.inputs, _filled(ctx, SCALAR_DEFAULTS[ctx.op]))]


# ---------------------------------------------------------------------------------------------- converters


def Conv(ctx: _Ctx) -> list[Node]:
    kernel = ctx.attrs.get("kernel_shape", list(ctx.inputs[1].shape[2:]))
    return [ctx.node("Conv", ctx.inputs, {**_window_attrs(ctx, kernel), "group": ctx.attrs.get("group", 1)})]


def ConvTranspose(ctx: _Ctx) -> list[Node]:
    x, w = ctx.inputs[0], ctx.inputs[1]
    kernel = ctx.attrs.get("kernel_shape", list(w.shape[2:]))
    n = len(kernel)
    strides = list(ctx.attrs.get("strides", [1] * n))
    dilations = list(ctx.attrs.get("dilations", [1] * n))
    out_pad = list(ctx.attrs.get("output_padding", [0] * n))
    auto_pad = ctx.attrs.get("auto_pad", "NOTSET")
    pads = list(ctx.attrs.get("pads", [0] * 2 * n))
    if "output_shape" in ctx.attrs or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # ONNX derives the pads from the wanted output size; the real output shape is what inference computed
        pads = [0] * 2 * n
        for i in range(n):
            total = strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
            total -= ctx.outputs[0].shape[2 + i]
            if total < 0:  # the output is larger than stride × input: the extra rows are output_padding
                out_pad[i] -= total
                total = 0
            small, big = total // 2, total - total // 2
            pads[i], pads[n + i] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        pads = [0] * 2 * n
    attrs = {
        "kernel_shape": list(kernel),
        "strides": strides,
        "pads": pads,
        "dilations": dilations,
        "group": ctx.attrs.get("group", 1),
        "output_padding": out_pad,
    }
    return [ctx.node("ConvTranspose", ctx.inputs, attrs)]


def Gemm(ctx: _Ctx) -> list[Node]:
    attrs = _filled(ctx, {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0})
    return [ctx.node("Gemm", ctx.inputs, attrs)]


def BatchNormalization(ctx: _Ctx) -> list[Node]:
    if ctx.attrs.get("training_mode", 0):
        raise _CannotConvert(
            f"BatchNormalization node {ctx.name!r} is in training mode; export the model for inference"
        )
    ctx.first_output_only()
    return [ctx.node("BatchNormalization", ctx.inputs[:5], _filled(ctx, {"epsilon": 1e-5, "momentum": 0.9}))]


def Clip(ctx: _Ctx) -> list[Node]:
    bounds = ctx.input(1), ctx.input(2)
    if all(b is None or b.const is not None for b in bounds):
        lo, hi = ctx.const(1, "min"), ctx.const(2, "max")
        # a NaN bound clips nothing, as onnxruntime's std::max / std::min compare it
        lo, hi = (None if b is None or np.isnan(b).any() else float(b) for b in (lo, hi))
        attrs = {"min": -math.inf if lo is None else lo, "max": math.inf if hi is None else hi}
        return [ctx.node("Clip", ctx.inputs[:1], attrs)]
    # a bound computed at run time (openWakeWord's mel spectrogram floors at its maximum less top_db): Max, then Min,
    # which is how ONNX defines Clip (so a min above the max gives the max)
    x, nodes = ctx.inputs[0], []
    steps = [(op, b) for op, b in (("Max", bounds[0]), ("Min", bounds[1])) if b is not None]
    for k, (op, b) in enumerate(steps):
        out = ctx.outputs[0] if k == len(steps) - 1 else ctx.temp("floored", x.shape, x.dtype)
        nodes.append(ctx.node(op, [x, b], {}, [out]))
        x = out
    return nodes


def BitShift(ctx: _Ctx) -> list[Node]:
    return [ctx.node("BitShift", ctx.inputs, {"direction": ctx.attrs["direction"]})]  # required: no default


def _pool(ctx: _Ctx) -> list[Node]:
    ctx.first_output_only()  # MaxPool's optional Indices
    attrs = _window_attrs(ctx, ctx.attrs["kernel_shape"], crop=True)
    attrs["ceil_mode"] = ctx.attrs.get("ceil_mode", 0)
    if ctx.op == "MaxPool":
        attrs["storage_order"] = ctx.attrs.get("storage_order", 0)
    else:
        attrs["count_include_pad"] = ctx.attrs.get("count_include_pad", 0)
    return _cropped(ctx, ctx.op, attrs)


def _softmax(ctx: _Ctx) -> list[Node]:
    x = ctx.inputs[0]
    rank = len(x.shape)
    axis = _axis(ctx.attrs.get("axis", -1 if ctx.opset >= 13 else 1), rank)
    if ctx.opset >= 13 or math.prod(x.shape[axis + 1 :]) == 1:  # then one axis is the same thing
        return [ctx.node(ctx.op, [x], {"axis": axis})]
    # before opset 13 the input is flattened to 2-D at `axis` and normalized over the whole second dim
    flat = ctx.temp("flat", (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])), x.dtype)
    soft = ctx.temp("2d", flat.shape, x.dtype)
    return [
        ctx.node("Flatten", [x], {"axis": axis}, [flat]),
        ctx.node(ctx.op, [flat], {"axis": 1}, [soft]),
        ctx.node("Reshape", [soft], {"shape": list(x.shape)}),
    ]


def LayerNormalization(ctx: _Ctx) -> list[Node]:
    rank = len(ctx.inputs[0].shape)
    attrs = {
        "axis": _axis(ctx.attrs.get("axis", -1), rank),
        "epsilon": ctx.attrs.get("epsilon", 1e-5),
        "stash_type": ctx.attrs.get("stash_type", 1),
    }
    read = [v if name in ctx.used else None for name, v in zip(ctx.onnx_outputs[1:], ctx.outputs[1:])]
    mean, inv_std = (read + [None, None])[:2]
    ctx.outputs = ctx.outputs[:1]
    nodes = [ctx.node("LayerNormalization", ctx.inputs, attrs)]
    if mean is not None or inv_std is not None:
        nodes += _layer_norm_stats(ctx, attrs["axis"], attrs["epsilon"], mean, inv_std)
    return nodes


def _layer_norm_stats(ctx: _Ctx, axis: int, epsilon: float, mean: Value | None, inv_std: Value | None) -> list[Node]:
    """LayerNormalization's optional outputs, when read, as nodes of their own: Mean = mean(x) and
    InvStdDev = 1 / sqrt(mean((x - Mean)²) + epsilon) over the axes from `axis` on (kept as size 1)."""
    x = ctx.inputs[0]
    axes = list(range(axis, len(x.shape)))
    kept = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    reduce = {"axes": axes, "keepdims": 1, "noop_with_empty_axes": 0}
    mean = mean or ctx.temp("mean", kept, x.dtype)
    nodes = [ctx.node("ReduceMean", [x], reduce, [mean])]
    if inv_std is None:
        return nodes
    diff, square = ctx.temp("diff", x.shape, x.dtype), ctx.temp("square", x.shape, x.dtype)
    var, shifted, std = (ctx.temp(what, kept, x.dtype) for what in ("var", "var_eps", "std"))
    eps = ctx.constant("epsilon", np.array(epsilon, x.dtype))
    return nodes + [
        ctx.node("Sub", [x, mean], outputs=[diff]),
        ctx.node("Mul", [diff, diff], outputs=[square]),
        ctx.node("ReduceMean", [square], reduce, [var]),
        ctx.node("Add", [var, eps], outputs=[shifted]),
        ctx.node("Sqrt", [shifted], outputs=[std]),
        ctx.node("Reciprocal", [std], outputs=[inv_std]),
    ]


def _reduce(ctx: _Ctx) -> list[Node]:
    x = ctx.inputs[0]
    rank = len(x.shape)
    axes = ctx.ints(1, "axes") if ctx.opset >= AXES_INPUT_FROM[ctx.op] else ctx.attrs.get("axes")
    if not axes:
        if ctx.attrs.get("noop_with_empty_axes", 0):  # no reduction, but the op's elementwise parts: L1 gives |x|
            if ctx.op in ("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum"):
                return [ctx.node(ctx.op, [x], {"axes": [], "keepdims": 1, "noop_with_empty_axes": 1})]
            return [ctx.node("Identity", [x])]
        axes = list(range(rank))
    attrs = {"axes": _axes(axes, rank), "keepdims": ctx.attrs.get("keepdims", 1), "noop_with_empty_axes": 0}
    return [ctx.node(ctx.op, [x], attrs)]


def _arg_reduce(ctx: _Ctx) -> list[Node]:
    rank = len(ctx.inputs[0].shape)
    attrs = {"axis": _axis(ctx.attrs.get("axis", 0), rank), "keepdims": ctx.attrs.get("keepdims", 1),
             "select_last_index": ctx.attrs.get("select_last_index", 0)}  # fmt: skip
    return [ctx.node(ctx.op, ctx.inputs, attrs)]


def Reshape(ctx: _Ctx) -> list[Node]:
    ctx.const(1, "shape")  # a run-time shape cannot be compiled even though inference guessed the output
    x, y = ctx.inputs[0], ctx.outputs[0]
    if math.prod(x.shape) != math.prod(y.shape):  # onnx's inference takes a shape without counting its elements
        raise InvalidModel(f"Reshape node {ctx.name!r}: cannot reshape {x.type} into {list(y.shape)}")
    return [ctx.node("Reshape", ctx.inputs[:1], {"shape": list(y.shape)})]


def Flatten(ctx: _Ctx) -> list[Node]:
    rank = len(ctx.inputs[0].shape)
    return [ctx.node("Flatten", ctx.inputs, {"axis": _axis(ctx.attrs.get("axis", 1), rank, inclusive=True)})]


def Transpose(ctx: _Ctx) -> list[Node]:
    rank = len(ctx.inputs[0].shape)
    perm = ctx.attrs.get("perm", list(reversed(range(rank))))
    return [ctx.node("Transpose", ctx.inputs, {"perm": [_axis(p, rank) for p in perm]})]


def Concat(ctx: _Ctx) -> list[Node]:
    rank = len(ctx.outputs[0].shape)
    # empty parts add nothing (and kernels cannot hold them); the output is not empty, or it would have folded
    parts = [v for v in ctx.inputs if math.prod(v.shape) > 0]
    if len(parts) == 1:
        return [ctx.node("Identity", parts)]
    return [ctx.node("Concat", parts, {"axis": _axis(ctx.attrs["axis"], rank)})]


def Split(ctx: _Ctx) -> list[Node]:
    x = ctx.inputs[0]
    axis = _axis(ctx.attrs.get("axis", 0), len(x.shape))
    split = ctx.ints(1, "split") if ctx.opset >= 13 else ctx.attrs.get("split")
    if not split:  # sizes follow from the outputs inference produced (equal parts, or num_outputs' ceil split)
        split = [o.shape[axis] for o in ctx.outputs]
    # a part of size 0 is an empty constant already (the frontend folds empty tensors): only the others are computed
    parts = [(o, n) for o, n in zip(ctx.outputs, split) if n > 0]
    return [ctx.node("Split", [x], {"axis": axis, "split": [n for _, n in parts]}, [o for o, _ in parts])]


def Slice(ctx: _Ctx) -> list[Node]:
    x = ctx.inputs[0]
    rank = len(x.shape)
    starts, ends = ctx.ints(1, "starts"), ctx.ints(2, "ends")
    axes = ctx.ints(3, "axes") or list(range(len(starts)))
    steps = ctx.ints(4, "steps") or [1] * len(starts)
    rows = []
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _axis(axis, rank)
        dim = x.shape[axis]
        start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:  # walking backwards the end is exclusive, so -1 means "through index 0"
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        rows.append((axis, start, end, step))
    if not rows:  # slicing no axis
        return [ctx.node("Identity", [x])]
    axes, starts, ends, steps = (list(column) for column in zip(*sorted(rows)))
    return [ctx.node("Slice", [x], {"starts": starts, "ends": ends, "axes": axes, "steps": steps})]


def Squeeze(ctx: _Ctx) -> list[Node]:
    x = ctx.inputs[0]
    axes = ctx.ints(1, "axes") if ctx.opset >= 13 else ctx.attrs.get("axes")
    if axes is None or not axes:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    return [ctx.node("Squeeze", [x], {"axes": _axes(axes, len(x.shape))})]


def Unsqueeze(ctx: _Ctx) -> list[Node]:
    axes = ctx.ints(1, "axes") if ctx.opset >= 13 else ctx.attrs["axes"]
    return [ctx.node("Unsqueeze", ctx.inputs[:1], {"axes": _axes(axes, len(ctx.outputs[0].shape))})]


def Gather(ctx: _Ctx) -> list[Node]:
    x, idx = ctx.inputs
    axis = _axis(ctx.attrs.get("axis", 0), len(x.shape))
    if idx.const is not None and (idx.const < 0).any():
        idx = ctx.constant("indices", np.where(idx.const < 0, idx.const + x.shape[axis], idx.const))
    return [ctx.node("Gather", [x, idx], {"axis": axis})]


def Expand(ctx: _Ctx) -> list[Node]:
    ctx.const(1, "shape")
    return [ctx.node("Expand", ctx.inputs[:1], {"shape": list(ctx.outputs[0].shape)})]


def Tile(ctx: _Ctx) -> list[Node]:
    return [ctx.node("Tile", ctx.inputs[:1], {"repeats": ctx.ints(1, "repeats")})]


def Pad(ctx: _Ctx) -> list[Node]:
    x = ctx.inputs[0]
    rank = len(x.shape)
    given = ctx.ints(1, "pads")
    value = ctx.const(2, "constant_value")
    axes = ctx.ints(3, "axes")
    pads = given
    if axes is not None:  # opset 18: pads only for the listed axes
        axes = [_axis(a, rank) for a in axes]
        pads = [0] * 2 * rank
        for k, a in enumerate(axes):
            pads[a], pads[rank + a] = given[k], given[len(axes) + k]
    attrs = {
        "pads": pads,
        "constant_value": 0.0 if value is None or value.size == 0 else float(value.reshape(-1)[0]),
        "mode": ctx.attrs.get("mode", "constant"),
    }
    return [ctx.node("Pad", [x], attrs)]


def Resize(ctx: _Ctx) -> list[Node]:
    x, out = ctx.inputs[0], ctx.outputs[0]
    rank = len(x.shape)
    roi, scales = ctx.const(1, "roi"), ctx.const(2, "scales")
    ctx.const(3, "sizes")  # only checked: the output shape inference computed from it is what counts
    axes = [_axis(a, rank) for a in ctx.attrs.get("axes", range(rank))]
    full_scales = [1.0] * rank
    if scales is not None and scales.size:
        for a, s in zip(axes, scales.reshape(-1)):
            full_scales[a] = float(s)
    else:  # sizes given: ONNX then scales by the ratio (after keep_aspect_ratio_policy, which inference applied)
        for a in axes:
            full_scales[a] = out.shape[a] / x.shape[a]
    full_roi = [0.0] * rank + [1.0] * rank
    if roi is not None and roi.size:
        for k, a in enumerate(axes):
            full_roi[a], full_roi[rank + a] = float(roi.reshape(-1)[k]), float(roi.reshape(-1)[len(axes) + k])
    attrs = _filled(
        ctx,
        {
            "mode": "nearest",
            "coordinate_transformation_mode": "half_pixel",
            "nearest_mode": "round_prefer_floor",
            "cubic_coeff_a": -0.75,
            "exclude_outside": 0,
            "extrapolation_value": 0.0,
            "antialias": 0,
        },
    )
    attrs.update(sizes=list(out.shape), scales=full_scales, roi=full_roi)
    return [ctx.node("Resize", [x], attrs)]


def Dropout(ctx: _Ctx) -> list[Node]:
    training = ctx.const(2, "training_mode")
    if training is not None and bool(training):
        raise _CannotConvert(f"Dropout node {ctx.name!r} is in training mode; export the model for inference")
    if len(ctx.outputs) > 1 and ctx.outputs[1] is not None:  # at inference the mask keeps everything
        ctx.outputs[1].const = np.ones(ctx.outputs[1].shape, dtype=bool)
    return [ctx.node("Identity", ctx.inputs[:1], {}, ctx.outputs[:1])]


def Cast(ctx: _Ctx) -> list[Node]:
    return [ctx.node("Cast", ctx.inputs[:1], {"to": ctx.outputs[0].dtype})]


def _variadic(ctx: _Ctx) -> list[Node]:
    """Sum/Max/Min/Mean of N inputs as a chain of binary Add/Max/Min (Mean then divides by N)."""
    binary = {"Sum": "Add", "Mean": "Add", "Max": "Max", "Min": "Min"}[ctx.op]
    out = ctx.outputs[0]
    args = [v for v in ctx.inputs if v is not None]
    if len(args) == 1 and ctx.op != "Mean":
        return [ctx.node("Identity", args)]
    nodes, acc = [], args[0]
    for k, v in enumerate(args[1:]):
        last = k == len(args) - 2 and ctx.op != "Mean"
        shape = np.broadcast_shapes(acc.shape, v.shape)
        res = out if last else ctx.temp(f"acc{k}", shape, out.dtype)
        nodes.append(ctx.node(binary, [acc, v], {}, [res]))
        acc = res
    if ctx.op == "Mean":
        n = ctx.constant("count", np.array(len(args), dtype=dtypes.numpy(out.dtype)))
        nodes.append(ctx.node("Div", [acc, n]))
    return nodes


def TopK(ctx: _Ctx) -> list[Node]:
    rank = len(ctx.inputs[0].shape)
    attrs = {
        "k": ctx.ints(1, "k")[0],
        "axis": _axis(ctx.attrs.get("axis", -1), rank),
        "largest": ctx.attrs.get("largest", 1),
        "sorted": ctx.attrs.get("sorted", 1),
    }
    return [ctx.node("TopK", ctx.inputs[:1], attrs, ctx.outputs)]


def GatherElements(ctx: _Ctx) -> list[Node]:
    return [ctx.node("GatherElements", ctx.inputs, {"axis": _axis(ctx.attrs.get("axis", 0), len(ctx.inputs[0].shape))})]


def GatherND(ctx: _Ctx) -> list[Node]:
    return [ctx.node("GatherND", ctx.inputs, {"batch_dims": ctx.attrs.get("batch_dims", 0)})]


def ScatterElements(ctx: _Ctx) -> list[Node]:
    rank = len(ctx.inputs[0].shape)
    attrs = {"axis": _axis(ctx.attrs.get("axis", 0), rank), "reduction": ctx.attrs.get("reduction", "none")}
    return [ctx.node("ScatterElements", ctx.inputs, attrs)]


def ScatterND(ctx: _Ctx) -> list[Node]:
    return [ctx.node("ScatterND", ctx.inputs, {"reduction": ctx.attrs.get("reduction", "none")})]


def OneHot(ctx: _Ctx) -> list[Node]:
    depth, values = ctx.const(1, "depth"), ctx.const(2, "values")
    rank = len(ctx.outputs[0].shape)
    attrs = {
        "depth": int(depth.reshape(-1)[0]),
        "axis": _axis(ctx.attrs.get("axis", -1), rank),
        "values": [v.item() for v in values.reshape(-1)[:2]],
        "dtype": dtypes.check(str(values.dtype)),
    }
    return [ctx.node("OneHot", ctx.inputs[:1], attrs)]


def Trilu(ctx: _Ctx) -> list[Node]:
    k, upper = ctx.input(1), ctx.attrs.get("upper", 1)
    if k is None or k.const is not None:
        return [ctx.node("Trilu", ctx.inputs[:1], {"k": int(k.const.reshape(-1)[0]) if k else 0, "upper": upper})]
    return [ctx.node("Trilu", ctx.inputs[:2], {"upper": upper})]  # the diagonal read at run time


def CumSum(ctx: _Ctx) -> list[Node]:
    attrs = {"axis": _axis(ctx.ints(1, "axis")[0], len(ctx.inputs[0].shape)),
             "exclusive": ctx.attrs.get("exclusive", 0), "reverse": ctx.attrs.get("reverse", 0)}  # fmt: skip
    return [ctx.node("CumSum", ctx.inputs[:1], attrs)]


def Einsum(ctx: _Ctx) -> list[Node]:
    """The equation made explicit: the output spelled out where it is implied (the letters used once, in order) and
    each ellipsis replaced by capital letters, one per axis it covers, aligned from the right across operands."""
    equation = ctx.attrs["equation"].replace(" ", "")
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    ranks = [len(v.shape) for v in ctx.inputs if v is not None]
    if len(terms) != len(ranks):
        raise _CannotConvert(f"Einsum node {ctx.name!r}: equation {equation!r} does not have one term per input")
    spans = [r - len(term.replace("...", "")) for term, r in zip(terms, ranks)]
    widest = max([s for term, s in zip(terms, spans) if "..." in term] or [0])
    ellipsis = "".join(chr(ord("A") + i) for i in range(widest))
    terms = [term.replace("...", ellipsis[widest - s :]) for term, s in zip(terms, spans)]
    if not arrow:
        letters = "".join(terms)
        out = ellipsis + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c.islower()))
    out = out.replace("...", ellipsis)
    extent: dict[str, int] = {}
    for term, v in zip(terms, (v for v in ctx.inputs if v is not None)):
        for c, n in zip(term, v.shape):
            if extent.setdefault(c, n) != n:
                raise _CannotConvert(f"Einsum node {ctx.name!r}: axes labelled {c!r} differ in size "
                                     f"({extent[c]} and {n}); broadcasting them is not supported")  # fmt: skip
    return [ctx.node("Einsum", [v for v in ctx.inputs if v is not None], {"equation": f"{','.join(terms)}->{out}"})]


def _fold_only(ctx: _Ctx) -> list[Node]:
    raise _CannotConvert(
        f"{ctx.op} node {ctx.name!r} must fold to a constant, but its inputs are only known at run time"
    )


PLAIN_OPS = [
    "MatMul", "Relu", "PRelu", "Sigmoid", "HardSwish", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Pow", "Reciprocal",
    "Neg", "Abs", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Softplus", "Softsign", "Mish", "IsNaN",
    "Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Where", "Not", "And",
    "Or", "Xor", "GlobalAveragePool", "GlobalMaxPool", "Identity",
]  # fmt: skip

# op_type -> converter returning the normalized Node(s) (with the recurrent ops of recurrent.py: ONNX_OPS)
CONVERTERS: dict[str, Callable[[_Ctx], list[Node]]] = {
    **dict.fromkeys(PLAIN_OPS, _plain),
    **dict.fromkeys(SCALAR_DEFAULTS, _with_defaults),
    "Conv": Conv,
    "ConvTranspose": ConvTranspose,
    "Gemm": Gemm,
    "BatchNormalization": BatchNormalization,
    "Clip": Clip,
    "BitShift": BitShift,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "Softmax": _softmax,
    "LogSoftmax": _softmax,
    "LayerNormalization": LayerNormalization,
    **dict.fromkeys(AXES_INPUT_FROM, _reduce),
    "Reshape": Reshape,
    "Flatten": Flatten,
    "Transpose": Transpose,
    "Concat": Concat,
    "Split": Split,
    "Slice": Slice,
    "Squeeze": Squeeze,
    "Unsqueeze": Unsqueeze,
    "Gather": Gather,
    "Expand": Expand,
    "Tile": Tile,
    "Pad": Pad,
    "Resize": Resize,
    "Dropout": Dropout,
    "Cast": Cast,
    "CastLike": Cast,
    "Sum": _variadic,
    "Mean": _variadic,
    "Max": _variadic,
    "Min": _variadic,
    "TopK": TopK,
    "GatherElements": GatherElements,
    "GatherND": GatherND,
    "ScatterElements": ScatterElements,
    "Scatter": ScatterElements,  # its deprecated name (opset 9-10)
    "ScatterND": ScatterND,
    "OneHot": OneHot,
    "Trilu": Trilu,
    "CumSum": CumSum,
    "Einsum": Einsum,
    "ArgMax": _arg_reduce,
    "ArgMin": _arg_reduce,
    **dict.fromkeys(FOLD_ONLY, _fold_only),
}
