"""Every model format tilefarm imports, told apart: ONNX (onnx_import) and PyTorch (torch_import, through ONNX), by an
explicit format or else by the file's suffix (.pt2, .pt, .pth: PyTorch; anything else: ONNX) or the object given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from compiler.base.errors import InvalidModel
from compiler.model.graph import Graph
from compiler.model.onnx_import import load
from compiler.model.torch_import import input_specs, load_torch

MODEL_FORMATS = ("onnx", "pytorch")
PYTORCH_SUFFIXES = (".pt2", ".pt", ".pth")


def load_any(source: Any, shape_dict: Any = None, model_format: str | None = None) -> Graph:
    """The Graph of a model in any format: an ONNX model (path, bytes or ModelProto) or a PyTorch one (nn.Module,
    torch.export program, or a .pt2 / TorchScript .pt, .pth file); `model_format` ("onnx" or "pytorch") overrides
    format_of. `shape_dict`: {input name: shape} (a PyTorch module's or TorchScript file's are needed; see
    torch_import.load_torch)."""
    if format_of(source, model_format) == "pytorch":
        return load_torch(source, shape_dict)
    shapes = {name: list(shape) for name, shape, _ in input_specs(shape_dict)} or None
    return load(source, shapes)


def format_of(source: Any, model_format: str | None = None) -> str:
    """The model's format, "onnx" or "pytorch": `model_format` when given, else by the file's suffix or the object's
    type."""
    if model_format is not None:
        if model_format not in MODEL_FORMATS:
            raise InvalidModel(f"unknown model format {model_format!r}; the formats are {', '.join(MODEL_FORMATS)}")
        return model_format
    if isinstance(source, str | Path):
        return "pytorch" if Path(source).suffix.lower() in PYTORCH_SUFFIXES else "onnx"
    if isinstance(source, bytes | onnx.ModelProto):
        return "onnx"
    if any(c.__module__.split(".")[0] == "torch" for c in type(source).__mro__):  # torch is not imported to tell
        return "pytorch"
    raise InvalidModel(
        f"cannot import a {type(source).__name__}: give an ONNX model (path, bytes, ModelProto) or a PyTorch one "
        "(nn.Module, torch.export program, .pt2, .pt or .pth file)"
    )
