"""Whole PyTorch models (ResNet-18, MobileNetV2, a transformer encoder) exported to ONNX with a dynamic batch axis,
compiled by tilefarm at fixed batch sizes, and compared with onnxruntime on the same ONNX file."""

from __future__ import annotations

import time
import types
import warnings

import numpy as np
import onnx
import pytest

from compiler.artifact.build import build
from compiler.artifact.runtime import Artifact
from compiler.model.onnx_import import load

try:
    import torch
    from torch import nn
except ImportError:
    # a missing extra fails every test here (see `exported`) instead of skipping them, and a stand-in base class keeps
    # collection going so the rest of the suite still runs and reports
    torch, nn = None, types.SimpleNamespace(Module=object)
NO_TORCH = "PyTorch is not installed; the whole-model tests need it: pip install -e '.[models]'"

# max |tilefarm - onnxruntime| / max |onnxruntime|: float32 kernels that sum in another order than onnxruntime's
# land near 1e-6 on these models; 1e-4 still catches a wrong index or a dropped term, which are off by O(1)
MAX_REL_ERR = 1e-4


# ---------------------------------------------------------------------------------------------- models
# torchvision's builds do not load with this torch, so the three architectures are written out here


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(*conv_bn(cin, cout, 3, stride), nn.ReLU(), *conv_bn(cout, cout, 3))
        down = stride != 1 or cin != cout
        self.skip = nn.Sequential(*conv_bn(cin, cout, 1, stride)) if down else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        layers = [*conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        return self.fc(self.features(x))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        mid = cin * expand
        pw = [*conv_bn(cin, mid, 1), nn.ReLU6()] if expand != 1 else []
        self.body = nn.Sequential(*pw, *conv_bn(mid, mid, 3, stride, groups=mid), nn.ReLU6(), *conv_bn(mid, cout, 1))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    # (expansion t, channels c, repeats n, first stride s) from the paper's Table 2
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]  # fmt: skip

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers, cin = [*conv_bn(3, 32, 3, 2), nn.ReLU6()], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [*conv_bn(cin, 1280, 1), nn.ReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x):
        return self.classifier(self.features(x))


class EncoderLayer(nn.Module):
    """Post-norm transformer encoder layer (as nn.TransformerEncoderLayer with activation="gelu"), attention written
    out so the export does not depend on which fused path nn.MultiheadAttention picks."""

    def __init__(self, d: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ffn = nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Linear(ffn, d))
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = self.norm1(x + self.out((att @ v).transpose(1, 2).reshape(b, s, d)))
        return self.norm2(x + self.ffn(x))


class Encoder(nn.Module):
    def __init__(self, layers: int = 4, d: int = 256, heads: int = 4, ffn: int = 1024):
        super().__init__()
        self.layers = nn.Sequential(*[EncoderLayer(d, heads, ffn) for _ in range(layers)])

    def forward(self, x):
        return self.layers(x)


def randomized(model: nn.Module, seed: int) -> nn.Module:
    """Seeded weights, batch-norm statistics too: the exporter folds them into the convolutions, and statistics left
    at (0, 1) would leave those weights as they were."""
    torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return model.eval()


# ---------------------------------------------------------------------------------------------- export and compare

# name -> (constructor, input shape at batch 1, opset, batches to compile, ONNX ops the export must contain)
MODELS = {
    "resnet18": (ResNet18, (1, 3, 224, 224), 17, [1], {"Conv", "MaxPool", "GlobalAveragePool", "Gemm"}),
    "mobilenet_v2": (MobileNetV2, (1, 3, 224, 224), 17, [1], {"Conv", "Clip", "Gemm"}),
    # the batch reaches the attention's Reshapes through Shape -> Gather -> Concat arithmetic the frontend must fold
    "encoder_opset17": (Encoder, (1, 64, 256), 17, [1, 2], {"Shape", "Erf", "LayerNormalization", "Softmax"}),
    "encoder_opset20": (Encoder, (1, 64, 256), 20, [1, 2], {"Shape", "Gelu", "LayerNormalization", "Softmax"}),
}


def export(name: str, path) -> onnx.ModelProto:
    make, shape, opset, _, _ = MODELS[name]
    model = randomized(make(), seed=0)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    # dynamo=False: the TorchScript exporter needs only `onnx` (the dynamo one also needs onnxscript) and still writes
    # opsets 17-20; its deprecation warning is expected
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model, (x,), str(path), input_names=["x"], output_names=["y"], opset_version=opset, dynamo=False,
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
        )  # fmt: skip
    return onnx.load(str(path))


@pytest.fixture(scope="module", params=list(MODELS))
def exported(request, tmp_path_factory):
    """(name, ONNX path, {batch: (Artifact, compile seconds)}): each model exported and compiled once per module."""
    if torch is None:
        pytest.fail(NO_TORCH)
    name = request.param
    _, shape, _, batches, must_have = MODELS[name]
    path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
    proto = export(name, path)
    # guard what this test means to cover against a changed exporter
    batch_dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param == "batch", f"{name}: the export lost its dynamic batch axis: {batch_dim}"
    missing = must_have - {n.op_type for n in proto.graph.node}
    assert not missing, f"{name}: the export no longer contains {sorted(missing)}"
    artifacts = {}
    for batch in batches:
        t0 = time.perf_counter()
        graph = load(str(path), input_shapes={"x": [batch, *shape[1:]]})
        tar = path.with_name(f"{name}_b{batch}.tar")
        build(graph, tar, name=name)
        artifacts[batch] = (Artifact.load(tar), time.perf_counter() - t0)
    return name, path, artifacts


def test_pytorch_is_installed():
    assert torch is not None, NO_TORCH


def test_matches_onnxruntime(exported):
    import onnxruntime as ort

    name, path, artifacts = exported
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, (art, seconds) in artifacts.items():
        shape = (batch, *MODELS[name][1][1:])
        x = np.random.default_rng(batch).standard_normal(shape).astype(np.float32)
        want = sess.run(None, {"x": x})[0]
        got = art.run({"x": x})["y"]
        assert got.shape == want.shape
        err = float(np.abs(got - want).max() / np.abs(want).max())
        print(f"\n{name} batch {batch}: compile {seconds:.1f} s, max rel err vs onnxruntime {err:.2e}")
        assert err < MAX_REL_ERR, f"{name} batch {batch}: max rel err {err:.2e}"
