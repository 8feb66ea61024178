"""The pack rule (tilefarm's addition to Ansor's CPU sketch rules) and the placements annotation gives a copy."""

from __future__ import annotations

import numpy as np

from compiler.schedule.lower import lower
from compiler.schedule.state import initial_state
from compiler.targets.cpu.annotate import materialize, sample, space
from compiler.targets.cpu.codegen import compile_funcs
from compiler.targets.cpu.sketch import generate_sketches, packable_input
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG


def _matmul(m, k, n):
    A, B = te.placeholder((m, k), "float32", "A"), te.placeholder((k, n), "float32", "B")
    return ComputeDAG([ops.matmul(A, B, name="C")])


def test_pack_adds_packed_variants_of_the_fused_sketches_only():
    dag = _matmul(64, 64, 64)
    plain = generate_sketches(dag, pack=False)
    packed = generate_sketches(dag)
    assert len(plain) == 3 and len(packed) == 5
    with_pack = [s for s in packed if any(r.startswith("pack") for r in s.rules)]
    assert [s.rules for s in with_pack] == [
        ("cache_write(C)", "pack(B for C.local)", "tile+fuse(C.local, L1)"),
        ("cache_write(C)", "pack(B for C.local)", "tile+fuse(C.local, L2)"),
    ]
    for s in with_pack:  # the copy is read by the tiled stage and left for annotation to place
        assert "B.pack" in s.state.stage("C.local").op.reads and "B.pack" not in s.fixed


def test_only_the_input_walked_along_the_innermost_axis_is_packed():
    dag = _matmul(8, 16, 32)
    assert packable_input(initial_state(dag), "C") == "B"
    x, w = te.placeholder((1, 8, 10, 10), "float32", "x"), te.placeholder((8, 8, 3, 3), "float32", "w")
    conv = ComputeDAG([ops.conv2d_nchw(x, w, padding=1, name="conv")])
    assert packable_input(initial_state(conv), "conv") is None  # x[.., y+ry, x+rx], w[.., rx]
    assert not any(r.startswith("pack") for s in generate_sketches(conv) for r in s.rules)
    # a blocked conv walks its weight's 16-wide last dim innermost, but those rows are contiguous panels already
    wb = te.placeholder((1, 8, 3, 3, 16), "float32", "wb")
    blocked = ComputeDAG([x, wb, ops.conv2d_nchw_blocked(x, wb, padding=1, name="conv")])
    assert packable_input(initial_state(blocked), "conv") is None


def test_packed_programs_compute_the_product_wherever_the_copy_goes():
    dag = _matmul(48, 64, 32)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((48, 64)).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)
    sketches = [s for s in generate_sketches(dag) if "B.pack" in {st.name for st in s.state.stages}]
    places = dict(space(sketches[1]).locations)["B.pack"]
    assert "root" in places and "inline" not in places and "C/j.1" in places  # enclosing tile loops are offered
    seen = set()
    for k in range(16):
        sketch = sketches[k % 2]
        d = sample(sketch, rng, cores=2)
        seen.add(dict(d.locations)["B.pack"])
        out = np.full((48, 32), np.nan, np.float32)
        compile_funcs([lower(materialize(sketch, d))])["kernel"](a, b, out)
        np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert len(seen) >= 3
