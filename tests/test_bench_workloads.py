"""bench.kernels' workloads: every conv layer form the tuning benchmark can tune computes the conv (default schedule,
against the float64 reference), and each is found by its name."""

from __future__ import annotations

import numpy as np
import pytest

from bench.kernels import ALTERNATIVE_WORKLOADS, TUNING_WORKLOADS, to_nchwc, tuning_workload
from compiler.schedule.lower import lower
from compiler.targets.cpu.codegen import compile_funcs
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops.kernels import reference_conv2d

CONVS = [w for w in TUNING_WORKLOADS + ALTERNATIVE_WORKLOADS if w.name.startswith("conv2d_")]


@pytest.mark.parametrize("w", CONVS, ids=[w.name for w in CONVS])
def test_each_conv_form_computes_the_conv(w):
    dag = ComputeDAG([*w.inputs, w.output])
    kernel = compile_funcs([lower(default_schedule(dag), "k")])["k"]
    (x, weight), args = w.arrays(seed=1)
    out = np.zeros(w.output.shape, np.float32)
    kernel(*args, out)
    want = reference_conv2d(x, weight, 1, 1)
    want = to_nchwc(want) if w.nchwc else want
    # Winograd's transforms (coefficients up to 8 in F(4x4, 3x3)) scale the rounding error
    assert float(np.abs(out - want).max() / np.abs(want).max()) < 5e-5


def test_workloads_are_found_by_name_and_the_alternatives_are_distinct():
    names = [w.name for w in TUNING_WORKLOADS + ALTERNATIVE_WORKLOADS]
    assert len(set(names)) == len(names)
    assert tuning_workload("conv2d_512x7x7_3x3_f2").inputs[1].shape == (4, 4, 32, 512, 16)  # a x a x F/b x C x b
    assert tuning_workload("conv2d_512x7x7_3x3_direct").inputs[1].shape == (32, 512, 3, 3, 16)
