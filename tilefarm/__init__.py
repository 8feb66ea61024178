"""tilefarm's public face: the compiler's entry points re-exported, tvmc's Python driver API (`load`, `tune`,
`compile`, `run`: `driver`), the command line (`cli`), the service's client (`remote`) and launcher (`serve`), and
ready-made example models (`examples`); the compiler lives in `compiler/`."""

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

__version__ = "0.1.0"
__all__ = [
    "Artifact", "ComputeDAG", "State", "Target", "TilefarmError", "apply_steps", "compile_funcs", "compile_model",
    "emit_shared_library", "initial_state", "lower", "ops", "step_from_record", "te",
    "Model", "Package", "Result", "TVMCModel", "TVMCPackage", "TVMCResult", "compile", "load", "run", "tune",
]
