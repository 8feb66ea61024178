"""tilefarm's public face: re-exports only; the compiler lives in `compiler/`."""

from compiler import ops, te
from compiler.build import compile_model
from compiler.codegen import compile_funcs, emit_shared_library
from compiler.dag import ComputeDAG
from compiler.errors import TilefarmError
from compiler.lower import lower
from compiler.runtime import Artifact
from compiler.state import State, apply_steps, initial_state, step_from_record
from compiler.target import Target

__version__ = "0.1.0"
__all__ = [
    "Artifact", "ComputeDAG", "State", "Target", "TilefarmError", "apply_steps", "compile_funcs", "compile_model",
    "emit_shared_library", "initial_state", "lower", "ops", "step_from_record", "te",
]
