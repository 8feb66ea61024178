"""PyTorch → ONNX → Graph: an `nn.Module` (with its inputs' shapes), a `torch.export` program saved as .pt2, or a
TorchScript archive (.pt, .pth, with its inputs' shapes, as tvmc takes one) is exported to ONNX in this process and
imported by the ONNX frontend (`onnx_import.load`).

The exporter is torch.onnx's TorchScript-based one (`dynamo=False`): it needs only `onnx`, where the dynamo exporter
(torch's default since 2.9) also needs onnxscript, and it exports convnets and transformers alike at opset 17. A
torch.export program goes through its module (`ExportedProgram.module()`), traced as it stands: such a module's mode
cannot be switched (TrainingMode.PRESERVE), and it was exported for inference already.

torch is an optional extra, imported only here: without it a PyTorch model gets `MissingExtra` naming the extra. Files
are told apart by their content, never by unpickling them: a .pt2 holds `archive_format`, a TorchScript archive its
`code/`; a pickled module or state_dict (`torch.save`) is refused, as it needs its Python class to load.
"""

from __future__ import annotations

import inspect
import io
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from compiler.base.errors import InvalidModel, MissingExtra
from compiler.model.graph import Graph
from compiler.model.onnx_import import load

TORCH_EXTRA = "pip install 'tilefarm[models]'"
OPSET = 17
NO_PICKLES = (
    "a torch.save pickle (a state_dict, or a module that needs its Python class to load) is not read; build the module "
    "in Python and pass it with its input shapes (tilefarm.load(module, shape_dict=...)), or save it with "
    "torch.export.save (.pt2) or torch.jit.save (.pt)"
)

# an input: its name, shape and dtype (a torch dtype's name: float32, int64, ...)
InputSpec = tuple[str, tuple[int, ...], str]


def load_torch(source: Any, shape_dict: Any = None) -> Graph:
    """A PyTorch model (nn.Module, ExportedProgram, ScriptModule, or the path of a .pt2 or TorchScript file) as a
    Graph: exported to ONNX (to_onnx) and imported. `shape_dict`: {input name: shape} (or shape and dtype:
    {"ids": ([1, 128], "int64")}, or tvmc's list of (name, shape) pairs); a .pt2 takes its own example inputs' shapes
    when none are given."""
    return load(to_onnx(source, shape_dict))


def to_onnx(source: Any, shape_dict: Any = None, opset: int = OPSET) -> onnx.ModelProto:
    """The ONNX model torch.onnx exports of a PyTorch model (see load_torch), inputs named by `shape_dict` (a .pt2's:
    by its program) and outputs output_0, output_1, ... (as tvmc names them)."""
    torch = _torch()
    kind, model, what = _open(source, torch)
    specs = input_specs(shape_dict)
    if kind == "program":
        specs = _program_inputs(model, specs, what)
        module = model.module()
    else:
        if not specs:
            raise InvalidModel(
                f"{what} needs its inputs' names and shapes: shape_dict={{name: shape}} "
                "(--input-shapes 'x:[1,3,224,224]')"
            )
        if kind == "script":
            _check_arity(model, specs, what)
        module = model
    args = tuple(_example(torch, shape, dtype, what) for _, shape, dtype in specs)
    options: dict[str, Any] = {"input_names": [n for n, _, _ in specs], "opset_version": opset}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        options["dynamo"] = False
    if kind == "program":
        options["training"] = torch.onnx.TrainingMode.PRESERVE
    buf = io.BytesIO()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
            outputs = module(*args)
            options["output_names"] = [f"output_{i}" for i in range(len(_flat(outputs)))]
            torch.onnx.export(module, args, buf, **options)
    except Exception as e:  # noqa: BLE001 - whatever torch raised, said as the model's problem
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise InvalidModel(f"{what}: exporting it to ONNX failed: {type(e).__name__}: {first}") from None
    return onnx.load_from_string(buf.getvalue())


def input_specs(shape_dict: Any) -> list[InputSpec]:
    """(name, shape, dtype) of each input `shape_dict` gives: a mapping or a sequence of (name, shape) pairs, each
    shape a list of ints or a (shape, dtype) pair; dtype float32 by default."""
    if shape_dict is None:
        return []
    pairs = list(shape_dict.items()) if isinstance(shape_dict, Mapping) else list(shape_dict)
    specs = []
    for pair in pairs:
        name, value = pair
        if isinstance(value, Sequence) and len(value) == 2 and isinstance(value[1], str):
            shape, dtype = value
        else:
            shape, dtype = value, "float32"
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise InvalidModel(f"input {name!r}: shape {shape!r} is not a list of integers") from None
        if any(d < 0 for d in dims):
            raise InvalidModel(f"input {name!r}: shape {list(dims)} has a negative dimension")
        specs.append((str(name), dims, str(dtype)))
    return specs


def pytorch_kind(path: str | Path) -> str:
    """What a PyTorch file holds, read from its zip listing (no unpickling): "program" for a torch.export archive
    (.pt2), "script" for TorchScript; anything else is refused (InvalidModel) naming what it is."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile):
        raise InvalidModel(
            f"{path} is not a PyTorch archive (.pt2 and TorchScript are zip files): {NO_PICKLES}"
        ) from None
    top = {n.split("/", 1)[1] if "/" in n else n for n in names}
    if "archive_format" in top and any(n.startswith("models/") for n in top):
        return "program"
    if any(n.startswith("code/") for n in top):
        return "script"
    raise InvalidModel(f"{path} holds neither a torch.export program nor TorchScript: {NO_PICKLES}")


def _torch():
    try:
        import torch  # noqa: PLC0415 - the optional extra, imported only for a PyTorch model
    except ImportError:
        raise MissingExtra(f"importing a PyTorch model needs PyTorch, which is not installed: {TORCH_EXTRA}") from None
    return torch


def _open(source: Any, torch: Any) -> tuple[str, Any, str]:
    """(kind, model, how messages name it) of a path or a PyTorch object."""
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.exists():
            raise InvalidModel(f"no such model file: {path}")
        kind = pytorch_kind(path)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.load's: TorchScript is tvmc's format
                model = (
                    torch.export.load(str(path)) if kind == "program" else torch.jit.load(str(path), map_location="cpu")
                )
        except Exception as e:  # noqa: BLE001 - torch's reader errors, said as the file's problem
            raise InvalidModel(f"{path}: PyTorch cannot load it: {type(e).__name__}: {e}") from None
        return kind, model, str(path)
    if isinstance(source, torch.export.ExportedProgram):
        return "program", source, "the exported program"
    if isinstance(source, torch.jit.ScriptModule):
        return "script", source, f"TorchScript module {source.original_name}"
    if isinstance(source, torch.nn.Module):
        return "module", source, f"module {type(source).__name__}"
    raise InvalidModel(
        f"cannot import a {type(source).__name__} as a PyTorch model: give an nn.Module, a torch.export program "
        "(.pt2) or a TorchScript file (.pt, .pth)"
    )


def _program_inputs(program: Any, specs: list[InputSpec], what: str) -> list[InputSpec]:
    """The program's user inputs in its order, shaped by `specs` where given, else by its example inputs."""
    names = [str(n) for n in program.graph_signature.user_inputs]
    if specs:
        given = {n: (shape, dtype) for n, shape, dtype in specs}
        if set(given) != set(names):
            raise InvalidModel(f"{what} takes inputs {', '.join(names)}; the shapes given are for {', '.join(given)}")
        return [(n, *given[n]) for n in names]
    args, kwargs = getattr(program, "example_inputs", None) or ((), {})
    if kwargs or len(args) != len(names) or not all(hasattr(a, "shape") for a in args):
        raise InvalidModel(f"{what} holds no example tensor per input: give its inputs' shapes ({', '.join(names)})")
    return [(n, tuple(a.shape), str(a.dtype).removeprefix("torch.")) for n, a in zip(names, args)]


def _check_arity(script: Any, specs: list[InputSpec], what: str) -> None:
    try:
        arity = len(script.forward.schema.arguments) - 1  # less self
    except (AttributeError, RuntimeError):
        return
    if arity != len(specs):
        raise InvalidModel(f"{what} takes {arity} inputs; shapes were given for {len(specs)}")


def _example(torch: Any, shape: tuple[int, ...], dtype: str, what: str) -> Any:
    """An input to trace with: values in [0, 1) for floats (fine for log and sqrt), zeros for integers and bools."""
    kind = getattr(torch, dtype, None)
    if not isinstance(kind, torch.dtype):
        raise InvalidModel(f"{what}: {dtype!r} is not a torch dtype (float32, int64, ...)")
    if kind.is_floating_point:
        return torch.rand(shape, generator=torch.Generator().manual_seed(0)).to(kind)
    return torch.zeros(shape, dtype=kind)


def _flat(outputs: Any) -> list[Any]:
    if isinstance(outputs, list | tuple):
        return [x for o in outputs for x in _flat(o)]
    if isinstance(outputs, Mapping):
        return [x for o in outputs.values() for x in _flat(o)]
    return [outputs]
