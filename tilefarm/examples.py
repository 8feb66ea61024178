"""Ready-made ONNX models built with `onnx.helper`: real architectures with seeded random weights, no download.

    from tilefarm.examples import EXAMPLES, save
    model = EXAMPLES["resnet18"](seed=0)        # an onnx.ModelProto, batch dim symbolic ("batch")
    save("encoder", "encoder.onnx", seed=1)
    save("bert", "bert.onnx", layers=2)         # BERT-base's encoder stack, 2 of its 12 layers

Weights are He-scaled and BatchNormalization statistics are random but sane, so activations stay O(1) through the
network and outputs are not degenerate: good for numerics and speed, meaningless as predictions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # the first opset with LayerNormalization
IR_VERSION = 8  # readable by every onnxruntime 1.x release
BATCH = "batch"


class _Builder:
    """Accumulates nodes and initializers with unique names; every random draw goes through one seeded Generator."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def _name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, prefix: str, array: np.ndarray) -> str:
        name = self._name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def scalar(self, value: float) -> str:
        return self.const("c", np.array(value, np.float32))

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def uniform(self, shape: tuple[int, ...], low: float, high: float) -> np.ndarray:
        return self.rng.uniform(low, high, shape).astype(np.float32)

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        out = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    # -- layers

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, gain: float = 2.0) -> str:
        """Conv without bias (a BatchNormalization follows); std sqrt(gain/fan_in) keeps the activation scale."""
        fan_in = cin // groups * k * k
        w = self.const("w", self.normal((cout, cin // groups, k, k), math.sqrt(gain / fan_in)))
        pad = k // 2
        return self.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=groups)

    def bn(self, x: str, c: int, gamma: float = 1.0) -> str:
        """BatchNormalization with random statistics close to identity; `gamma` shrinks residual branches."""
        scale = self.const("bn_scale", self.uniform((c,), 0.8, 1.2) * gamma)
        bias = self.const("bn_bias", self.normal((c,), 0.1))
        mean = self.const("bn_mean", self.normal((c,), 0.1))
        var = self.const("bn_var", self.uniform((c,), 0.5, 1.5))  # var > 0 keeps the inverse std finite
        return self.op("BatchNormalization", [x, scale, bias, mean, var], epsilon=1e-5)

    def relu6(self, x: str) -> str:
        return self.op("Clip", [x, self.scalar(0.0), self.scalar(6.0)])

    def gemm(self, x: str, cin: int, cout: int) -> str:
        """Fully connected layer with transB=1, the layout PyTorch exporters write."""
        w = self.const("fc_w", self.normal((cout, cin), math.sqrt(1.0 / cin)))
        b = self.const("fc_b", self.normal((cout,), 0.01))
        return self.op("Gemm", [x, w, b], transB=1)

    def linear(self, x: str, cin: int, cout: int) -> str:
        """MatMul with a [cin, cout] weight then a bias Add, as transformer exporters write it."""
        w = self.const("w", self.normal((cin, cout), math.sqrt(1.0 / cin)))
        b = self.const("b", self.normal((cout,), 0.01))
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def layer_norm(self, x: str, d: int) -> str:
        scale = self.const("ln_scale", self.uniform((d,), 0.8, 1.2))
        bias = self.const("ln_bias", self.normal((d,), 0.05))
        return self.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-5)

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]):
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tilefarm")
        proto.ir_version = IR_VERSION
        onnx.checker.check_model(proto)
        return proto


def _rename_output(b: _Builder, out: str, name: str) -> None:
    """Give the last node's output a stable public name."""
    node = b.nodes[-1]
    assert node.output[0] == out
    node.output[0] = name


def _image_input(channels: int = 3, size: int = 224) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH, channels, size, size])


# ---------------------------------------------------------------------------------------------- tiny CNN


def tiny_cnn(seed: int = 0, num_classes: int = 10) -> onnx.ModelProto:
    """conv-bn-relu-maxpool-gemm-softmax on [batch, 3, 32, 32]: compiles in seconds, for tests."""
    b = _Builder(seed)
    x = b.op("Relu", [b.bn(b.conv("input", 3, 8, 3), 8)])
    x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = b.op("Flatten", [x], axis=1)
    # a larger gain than 1/fan_in spreads the logits so the softmax is not close to uniform
    w = b.const("fc_w", b.normal((num_classes, 8 * 16 * 16), math.sqrt(4.0 / (8 * 16 * 16))))
    x = b.op("Gemm", [x, w, b.const("fc_b", b.normal((num_classes,), 0.1))], transB=1)
    _rename_output(b, b.op("Softmax", [x], axis=-1), "output")
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, [BATCH, num_classes])
    return b.model("tiny_cnn", [_image_input(3, 32)], [out])


# ---------------------------------------------------------------------------------------------- ResNet-18


def _basic_block(b: _Builder, x: str, cin: int, cout: int, stride: int) -> str:
    y = b.op("Relu", [b.bn(b.conv(x, cin, cout, 3, stride), cout)])
    # the branch's last BN is scaled down so the sum over eight blocks does not grow the activations 2x per block
    y = b.bn(b.conv(y, cout, cout, 3), cout, gamma=0.5)
    shortcut = x if stride == 1 and cin == cout else b.bn(b.conv(x, cin, cout, 1, stride, gain=1.0), cout)
    return b.op("Relu", [b.op("Add", [y, shortcut])])


def resnet18(seed: int = 0, num_classes: int = 1000) -> onnx.ModelProto:
    """ResNet-18 (He et al. 2015) on input [batch, 3, 224, 224] -> logits [batch, num_classes]."""
    b = _Builder(seed)
    x = b.op("Relu", [b.bn(b.conv("input", 3, 64, 7, 2), 64)])
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for i, cout in enumerate([64, 128, 256, 512]):
        for j in range(2):
            x = _basic_block(b, x, cin, cout, 2 if i > 0 and j == 0 else 1)
            cin = cout
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    _rename_output(b, b.gemm(x, 512, num_classes), "output")
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, [BATCH, num_classes])
    return b.model("resnet18", [_image_input()], [out])


# ---------------------------------------------------------------------------------------------- MobileNetV2

# (expansion t, output channels c, repeats n, first stride s), from Sandler et al. 2018, table 2
MOBILENETV2_BLOCKS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                      (6, 320, 1, 1)]  # fmt: skip


def _inverted_residual(b: _Builder, x: str, cin: int, cout: int, stride: int, t: int) -> str:
    hidden = cin * t
    y = x
    if t != 1:
        y = b.relu6(b.bn(b.conv(y, cin, hidden, 1), hidden))
    y = b.relu6(b.bn(b.conv(y, hidden, hidden, 3, stride, groups=hidden), hidden))
    residual = stride == 1 and cin == cout
    # linear bottleneck: no activation after the projection; scaled down when it is added to the input
    y = b.bn(b.conv(y, hidden, cout, 1, gain=1.0), cout, gamma=0.5 if residual else 1.0)
    return b.op("Add", [x, y]) if residual else y


def mobilenetv2(seed: int = 0, num_classes: int = 1000) -> onnx.ModelProto:
    """MobileNetV2 (width 1.0) on input [batch, 3, 224, 224] -> logits [batch, num_classes]."""
    b = _Builder(seed)
    x = b.relu6(b.bn(b.conv("input", 3, 32, 3, 2), 32))
    cin = 32
    for t, c, n, s in MOBILENETV2_BLOCKS:
        for i in range(n):
            x = _inverted_residual(b, x, cin, c, s if i == 0 else 1, t)
            cin = c
    x = b.relu6(b.bn(b.conv(x, cin, 1280, 1), 1280))
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    _rename_output(b, b.gemm(x, 1280, num_classes), "output")
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, [BATCH, num_classes])
    return b.model("mobilenetv2", [_image_input()], [out])


# ---------------------------------------------------------------------------------------------- encoder


def _gelu(b: _Builder, x: str) -> str:
    """0.5 * x * (1 + erf(x / sqrt(2))), the form exporters write below opset 20."""
    e = b.op("Erf", [b.op("Div", [x, b.scalar(math.sqrt(2.0))])])
    return b.op("Mul", [b.op("Mul", [x, b.op("Add", [e, b.scalar(1.0)])]), b.scalar(0.5)])


def _attention(b: _Builder, x: str, d: int, heads: int) -> str:
    """Multi-head self-attention on [batch, seq, d]; heads are split by Reshape/Transpose, as exporters do."""
    dh = d // heads
    split = b.const("shape", np.array([0, 0, heads, dh], np.int64))  # 0 copies batch and seq from the input

    def to_heads(t: str, perm: list[int]) -> str:
        return b.op("Transpose", [b.op("Reshape", [t, split])], perm=perm)

    q = to_heads(b.linear(x, d, d), [0, 2, 1, 3])  # [batch, heads, seq, dh]
    k = to_heads(b.linear(x, d, d), [0, 2, 3, 1])  # [batch, heads, dh, seq]: K already transposed
    v = to_heads(b.linear(x, d, d), [0, 2, 1, 3])
    scores = b.op("Mul", [b.op("MatMul", [q, k]), b.scalar(1.0 / math.sqrt(dh))])
    ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    merge = b.const("shape", np.array([0, 0, d], np.int64))
    ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge])
    return b.linear(ctx, d, d)


def _encoder_layer(b: _Builder, x: str, d: int, heads: int, ffn: int) -> str:
    """Post-norm layer (the original Transformer and BERT): x = LN(x + attn(x)); x = LN(x + ffn(x))."""
    x = b.layer_norm(b.op("Add", [x, _attention(b, x, d, heads)]), d)
    y = b.linear(_gelu(b, b.linear(x, d, d * ffn)), d * ffn, d)
    return b.layer_norm(b.op("Add", [x, y]), d)


def encoder(
    seed: int = 0, layers: int = 4, seq: int = 128, d: int = 256, heads: int = 4, ffn: int = 4, name: str = "encoder"
) -> onnx.ModelProto:
    """A transformer encoder without embeddings: x [batch, seq, d] -> [batch, seq, d]; `ffn` is the feed-forward
    width as a multiple of d."""
    b = _Builder(seed)
    x = "x"
    for _ in range(layers):
        x = _encoder_layer(b, x, d, heads, ffn)
    _rename_output(b, x, "output")
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, seq, d])
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, [BATCH, seq, d])
    return b.model(name, [inp], [out])


def bert(
    seed: int = 0, layers: int = 12, seq: int = 128, d: int = 768, heads: int = 12, ffn: int = 3072
) -> onnx.ModelProto:
    """BERT-base's encoder stack (Devlin et al. 2018), without embeddings or pooler: x [batch, seq, d] -> [batch, seq,
    d]; `ffn` is the feed-forward width (BERT-base: 3072), a multiple of d."""
    if ffn % d:
        raise ValueError(f"ffn {ffn} must be a multiple of d {d}")
    return encoder(seed, layers, seq, d, heads, ffn // d, name="bert")


EXAMPLES: dict[str, Callable[..., onnx.ModelProto]] = {
    "tiny_cnn": tiny_cnn,
    "resnet18": resnet18,
    "mobilenetv2": mobilenetv2,
    "encoder": encoder,
    "bert": bert,
}


def save(name: str, path: str | Path, **kw) -> onnx.ModelProto:
    """Build example `name` (keyword arguments go to its builder) and write it to `path`."""
    if name not in EXAMPLES:
        raise KeyError(f"unknown example {name!r}; choose from {sorted(EXAMPLES)}")
    model = EXAMPLES[name](**kw)
    onnx.save(model, str(path))
    return model
