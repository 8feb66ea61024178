"""Property: any legal step sequence on each kernel lowers to loop IR that computes the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from compiler.base.errors import LoweringError
from compiler.schedule import interp
from compiler.schedule.loopir import Allocate, For, IfThenElse, Seq
from compiler.schedule.lower import lower
from compiler.schedule.state import apply_steps
from compiler.targets.cpu.codegen import compile_funcs
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops import KERNELS
from tests.strategies import legal_steps

DAGS = {name: ComputeDAG(sum(case.build(), [])) for name, case in KERNELS.items()}
RNG = np.random.default_rng(0)
INPUTS = {name: case.random_inputs(RNG) for name, case in KERNELS.items()}
REFS = {name: case.reference(*INPUTS[name]) for name, case in KERNELS.items()}


def outputs_of(name: str, run) -> list[np.ndarray]:
    dag = DAGS[name]
    outs = [np.zeros(dag.op(o).shape, np.float32) for o in dag.outputs]
    run(*INPUTS[name], *outs)
    return outs


MAX_STORES = 300_000  # the interpreter runs ~1M stores/s; schedules that recompute a lot are valid but too slow
# statements LLVM sees once unrolled and vectorized loops are expanded: unrolling a fused matmul nest is valid, but
# LLVM's O3 pipeline took over 10 minutes on one such random program in a full test run, and 8 s on the 32x40 nest
# unrolled whole (2,560 statements)
MAX_EXPANDED = 1024


def lower_or_skip(name: str, steps):
    try:
        func = lower(apply_steps(DAGS[name], steps))
    except LoweringError:
        assume(False)  # a compute_at whose consumers are not all inside the loop: rejected, not a bug
    assume(store_count(func.body) <= MAX_STORES)
    return func


def expanded_size(s) -> int:
    """Statements in the code generated for a loop nest: unrolled and vectorized loops are laid out extent times."""
    if isinstance(s, For):
        return (s.extent if s.kind in ("unrolled", "vectorized") else 1) * expanded_size(s.body)
    if isinstance(s, Seq):
        return sum(expanded_size(c) for c in s.stmts)
    if isinstance(s, Allocate):
        return expanded_size(s.body)
    if isinstance(s, IfThenElse):
        return expanded_size(s.then) + (expanded_size(s.orelse) if s.orelse is not None else 0)
    return 1


def store_count(s) -> int:
    """How many stores a loop nest executes (ignoring guards)."""
    if isinstance(s, For):
        return s.extent * store_count(s.body)
    if isinstance(s, Seq):
        return sum(store_count(c) for c in s.stmts)
    if isinstance(s, (Allocate,)):
        return store_count(s.body)
    if isinstance(s, IfThenElse):
        return store_count(s.then) + (store_count(s.orelse) if s.orelse is not None else 0)
    return 1


@pytest.mark.parametrize("name", sorted(KERNELS))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_schedule_interpreter(name, data):
    steps = data.draw(legal_steps(DAGS[name]))
    func = lower_or_skip(name, steps)
    case = KERNELS[name]
    for got, want in zip(outputs_of(name, lambda *a: interp.run(func, *a)), REFS[name]):
        np.testing.assert_allclose(
            got, want, rtol=case.rtol, atol=case.atol, err_msg=str(apply_steps(DAGS[name], steps))
        )


@pytest.mark.parametrize("name", sorted(KERNELS))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_schedule_jit(name, data):
    steps = data.draw(legal_steps(DAGS[name]))
    func = lower_or_skip(name, steps)
    assume(expanded_size(func.body) <= MAX_EXPANDED)
    kernel = compile_funcs([func])[func.name]
    case = KERNELS[name]
    for got, want in zip(outputs_of(name, kernel), REFS[name]):
        np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol, err_msg=str(func))
