"""PyTorch import: a ResNet-18 and a small transformer built in code, each through the three PyTorch paths (the
nn.Module with its input shapes, a torch.export program saved as .pt2, TorchScript saved as .pt with input shapes),
exported to ONNX in-process, compiled and compared with torch's own outputs; the format told by suffix or named; a
PyTorch file without torch gets one line naming the extra; pickles are never read, here or by the service."""

from __future__ import annotations

import io
import sys
import types
import warnings
import zipfile

import numpy as np
import pytest

from compiler.artifact.build import run_in_process
from compiler.artifact.runtime import Artifact
from compiler.base.errors import InvalidModel, MissingExtra
from compiler.model import load_any
from compiler.model.frontends import format_of
from tests.test_torch_models import Encoder, ResNet18, randomized
from tilefarm.cli import main

try:
    import torch
except ImportError:
    torch = None
NO_TORCH = "PyTorch is not installed; these tests need it: pip install -e '.[models]'"
MAX_REL_ERR = 1e-4  # of the output's scale, as tests/test_torch_models.py has it

# name -> (the model, its input's shape); small inputs keep the compile and the export quick
MODELS = {
    "resnet18": (lambda: ResNet18(classes=10), (1, 3, 32, 32)),
    "transformer": (lambda: Encoder(layers=2, d=64, heads=4, ffn=128), (1, 16, 64)),
}


@pytest.fixture(scope="module", params=list(MODELS))
def saved(request, tmp_path_factory):
    """(name, module, input, torch's output, .pt2 path, .pt path): each model saved both ways once."""
    if torch is None:
        pytest.fail(NO_TORCH)
    name = request.param
    make, shape = MODELS[name]
    torch.manual_seed(0)
    module = randomized(make(), seed=0)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    folder = tmp_path_factory.mktemp(name)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = module(x).numpy()
        torch.export.save(torch.export.export(module, (x,)), folder / f"{name}.pt2")
        torch.jit.save(torch.jit.trace(module, (x,)), folder / f"{name}.pt")
    return name, module, x.numpy(), want, folder / f"{name}.pt2", folder / f"{name}.pt"


def _check(graph, x: np.ndarray, want: np.ndarray, what: str) -> None:
    assert [v.name for v in graph.inputs] == ["x"] and [v.name for v in graph.outputs] == ["output_0"], what
    got = run_in_process(graph, {"x": x})["output_0"]
    assert got.shape == want.shape, what
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err <= MAX_REL_ERR, f"{what}: max rel err {err:.2e}"


@pytest.mark.parametrize("path", ["module", "pt2", "torchscript"])
def test_each_pytorch_path_compiles_and_matches_torch(saved, path):
    name, module, x, want, pt2, pt = saved
    shapes = {"x": list(x.shape)}
    source, shape_dict = {"module": (module, shapes), "pt2": (pt2, None), "torchscript": (pt, shapes)}[path]
    _check(load_any(source, shape_dict), x, want, f"{name} through {path}")


@pytest.mark.parametrize("saved", ["transformer"], indirect=True)  # one model is enough: the fastest to compile
def test_the_command_line_compiles_a_pt2_and_torchscript_with_input_shapes(saved, tmp_path, capsys):
    _, _, x, want, pt2, pt = saved
    renamed = tmp_path / "script.bin"  # no suffix to tell by: --model-format says it
    renamed.write_bytes(pt.read_bytes())
    runs = [[str(pt2)], [str(renamed), "--model-format", "pytorch", "--input-shapes", "x:[1,16,64]"]]
    for i, args in enumerate(runs):
        tar = tmp_path / f"m{i}.tar"
        assert main(["compile", *args, "-o", str(tar)]) == 0, capsys.readouterr()
        got = Artifact.load(tar).run({"x": x})["output_0"]
        assert float(np.abs(got - want).max() / np.abs(want).max()) <= MAX_REL_ERR, args


def test_torchscript_without_shapes_says_what_to_give(saved):
    _, module, _, _, _, pt = saved
    for source in (pt, module):
        with pytest.raises(InvalidModel, match=r"needs its inputs' names and shapes: shape_dict=\{name: shape\}"):
            load_any(source)


def test_the_format_is_told_by_suffix_or_named():
    assert [format_of(p) for p in ("m.pt2", "m.PT", "m.pth", "m.onnx", "model")] == [
        "pytorch", "pytorch", "pytorch", "onnx", "onnx"
    ]  # fmt: skip
    assert format_of("m.bin", "pytorch") == "pytorch" and format_of("m.pt", "onnx") == "onnx"
    assert format_of(b"\x08\x07") == "onnx"
    with pytest.raises(InvalidModel, match="unknown model format 'tflite'; the formats are onnx, pytorch"):
        format_of("m.tflite", "tflite")
    with pytest.raises(InvalidModel, match="cannot import a dict"):
        format_of({})


def test_without_torch_a_pytorch_file_gets_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    model = tmp_path / "m.pt2"
    model.write_bytes(b"PK\x05\x06" + bytes(18))
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError, as where it is not installed
    with pytest.raises(MissingExtra) as e:
        load_any(model)
    assert str(e.value) == (
        "importing a PyTorch model needs PyTorch, which is not installed: pip install 'tilefarm[models]'"
    )
    with pytest.raises(MissingExtra):
        load_any(types.SimpleNamespace(), model_format="pytorch")
    assert main(["compile", str(model), "-o", str(tmp_path / "m.tar")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"error: {e.value}"]


def test_a_pickle_is_refused_and_never_read(saved, tmp_path, monkeypatch):
    _, module, _, _, _, _ = saved

    def never(*args, **kwargs):
        raise AssertionError("a PyTorch file was unpickled")

    state, whole = tmp_path / "state.pth", tmp_path / "legacy.pt"
    torch.save(module.state_dict(), state)  # the zip format of today
    torch.save(module.state_dict(), whole, _use_new_zipfile_serialization=False)  # a bare pickle
    monkeypatch.setattr(torch, "load", never)
    monkeypatch.setattr(torch.jit, "load", never)
    with pytest.raises(InvalidModel, match="holds neither a torch.export program nor TorchScript: a torch.save pickle"):
        load_any(state, {"x": [1, 3, 32, 32]})
    with pytest.raises(InvalidModel, match="is not a PyTorch archive .* a torch.save pickle"):
        load_any(whole, {"x": [1, 3, 32, 32]})


def test_the_service_refuses_pytorch_uploads_without_unpickling_them(tmp_path):
    from server import archive
    from server.storage import BadUpload

    pt2 = tmp_path / "upload"
    with zipfile.ZipFile(pt2, "w") as z:  # a torch.export archive's layout
        for member in ("m/archive_format", "m/models/model.json", "m/data/weights/weight_0"):
            z.writestr(member, b"{}")
    with pytest.raises(BadUpload, match="is a PyTorch file .* ONNX models only and never unpickles"):
        archive.unpack(pt2, tmp_path / "unpacked", 1 << 20)
    pickled = tmp_path / "pickled"
    buf = io.BytesIO()
    import pickle

    pickle.dump({"weight": [1.0]}, buf, protocol=2)
    pickled.write_bytes(buf.getvalue())
    with pytest.raises(InvalidModel, match="is a Python pickle .*never unpickles an upload"):
        archive.read_upload(pickled, "the upload")
