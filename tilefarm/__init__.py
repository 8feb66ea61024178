"""tilefarm's public face: the compiler's entry points re-exported, tvmc's Python driver API (`load`, `tune`,
`compile`, `run`: `driver`), the command line (`cli`, started by `entry`), the service's client (`remote`) and
launcher (`serve`), and ready-made example models (`examples`); the compiler lives in `compiler/`.

The re-exports are loaded on first use (PEP 562's module `__getattr__`): `import tilefarm` and the `tilefarm`
command's first instant load nothing of the compiler, so a Ctrl-C while a command starts ends in one line
(tilefarm.entry), not an import traceback."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# each public name and the module it is defined in
_EXPORTS = {
    "compile_model": "compiler.artifact.build",
    "Artifact": "compiler.artifact.runtime",
    "TilefarmError": "compiler.base.errors",
    "Target": "compiler.base.target",
    "lower": "compiler.schedule.lower",
    **dict.fromkeys(("State", "apply_steps", "initial_state", "step_from_record"), "compiler.schedule.state"),
    **dict.fromkeys(("compile_funcs", "emit_shared_library"), "compiler.targets.cpu.codegen"),
    "ComputeDAG": "compiler.tensor.dag",
    **dict.fromkeys(
        ("Model", "Package", "Result", "TVMCModel", "TVMCPackage", "TVMCResult", "compile", "load", "run", "tune"),
        "tilefarm.driver",
    ),
}
_MODULES = {"ops": "compiler.tensor.ops", "te": "compiler.tensor.te"}  # re-exported modules

__all__ = [
    "Artifact", "ComputeDAG", "State", "Target", "TilefarmError", "apply_steps", "compile_funcs", "compile_model",
    "emit_shared_library", "initial_state", "lower", "ops", "step_from_record", "te",
    "Model", "Package", "Result", "TVMCModel", "TVMCPackage", "TVMCResult", "compile", "load", "run", "tune",
]  # fmt: skip
assert set(__all__) == {*_EXPORTS, *_MODULES}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'tilefarm' has no attribute {name!r}")
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:
    from compiler.artifact.build import compile_model
    from compiler.artifact.runtime import Artifact
    from compiler.base.errors import TilefarmError
    from compiler.base.target import Target
    from compiler.schedule.lower import lower
    from compiler.schedule.state import State, apply_steps, initial_state, step_from_record
    from compiler.targets.cpu.codegen import compile_funcs, emit_shared_library
    from compiler.tensor import ops, te
    from compiler.tensor.dag import ComputeDAG
    from tilefarm.driver import Model, Package, Result, TVMCModel, TVMCPackage, TVMCResult, compile, load, run, tune
