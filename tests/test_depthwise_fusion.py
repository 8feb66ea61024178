"""A depthwise conv fused into the 1x1 conv that reads it (passes.fuse_depthwise_pointwise): which pairs the pass
marks, that the fused task computes the depthwise pixels inside the 1x1 conv's pixel tiles (default schedule and
every sketch), and that the numbers do not change (onnxruntime, and random programs against the default one)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact.build import run_in_process
from compiler.model.onnx_import import load
from compiler.model.passes import CONV_BLOCK
from compiler.schedule.lower import lower
from compiler.targets.cpu.annotate import materialize, sample
from compiler.targets.cpu.codegen import compile_funcs
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.targets.cpu.sketch import generate_sketches
from compiler.tensor.tasks import plan_tasks
from tests.test_winograd import _conv_node

B = CONV_BLOCK
PASS = "fuse_depthwise_pointwise"


def inverted_residual(rng, hw=14, stride=1, project_k=1, dw_read_twice=False) -> onnx.ModelProto:
    """MobileNetV2's block after a stem conv: 1x1 expand + ReLU6, 3x3 depthwise + ReLU6, 1x1 project, residual add
    (stride 1). `project_k` 3 makes the projection no 1x1 conv; `dw_read_twice` gives the depthwise result a second
    reader."""
    c, e, inits = 2 * B, 6 * B, {}
    inits["lo"], inits["hi"] = np.array(0, np.float32), np.array(6, np.float32)
    nodes = [
        _conv_node("stem", "x", "s", inits, rng, 3, c),
        _conv_node("expand", "s", "e", inits, rng, c, e, k=1),
        helper.make_node("Clip", ["e", "lo", "hi"], ["e6"]),
        _conv_node("dw", "e6", "d", inits, rng, e, e, stride=stride, group=e),
        helper.make_node("Clip", ["d", "lo", "hi"], ["d6"]),
        _conv_node("project", "d6", "p", inits, rng, e, c, k=project_k),
    ]
    last = "p"
    if stride == 1:
        nodes.append(helper.make_node("Add", ["p", "s"], ["r"]))
        last = "r"
    if dw_read_twice:
        nodes.append(helper.make_node("GlobalAveragePool", ["d6"], ["g"]))
        nodes.append(helper.make_node("Flatten", ["g"], ["gf"]))
    nodes.append(helper.make_node("GlobalAveragePool", [last], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if dw_read_twice:
        outputs.append(helper.make_tensor_value_info("gf", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        outputs,
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _fused_tasks(model: onnx.ModelProto, disabled=()):
    tasks, _, _ = plan_tasks(load(model), disabled)
    tags = [{op.tag for op in t.dag.ops} for t in tasks]
    return [t for t, tg in zip(tasks, tags) if {"depthwise_conv2d_nchwc", "conv2d_nchw_blocked"} <= tg]


def test_the_pass_fuses_a_depthwise_conv_into_the_1x1_conv_that_alone_reads_it():
    model = inverted_residual(np.random.default_rng(0))
    assert len(_fused_tasks(model)) == 1
    assert _fused_tasks(model, disabled=[PASS]) == []


@pytest.mark.parametrize(
    "why, kwargs",
    [
        ("the projection is a 3x3 conv", {"project_k": 3}),
        ("the depthwise result has a second reader", {"dw_read_twice": True}),
    ],
)
def test_the_pass_leaves_pairs_it_cannot_fuse(why, kwargs):
    assert _fused_tasks(inverted_residual(np.random.default_rng(0), **kwargs)) == [], why


@pytest.mark.parametrize("stride, hw", [(1, 14), (2, 14), (1, 7)])
def test_fused_block_matches_onnxruntime(stride, hw):
    rng = np.random.default_rng(stride * 10 + hw)
    model = inverted_residual(rng, hw=hw, stride=stride)
    assert len(_fused_tasks(model)) == 1
    x = rng.standard_normal((1, 3, hw, hw)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = run_in_process(load(model), {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


def _depthwise_tile_stage(state):
    """The stage the depthwise conv's tile writes (its ReLU6), which the 1x1 conv reads."""
    dw = next(s for s in state.stages if s.op.tag == "depthwise_conv2d_nchwc")
    return next(s for s in state.stages if s.compute_at != "inline" and dw.name in _reads(state, s))


def _reads(state, stage) -> set[str]:
    from compiler.tensor import te

    return {ld.buffer for ld in te.loads(state.resolve_inlined(stage.op.body))} if stage.op.body is not None else set()


def test_default_schedule_computes_the_depthwise_pixels_inside_the_1x1_convs_pixel_tile():
    (task,) = _fused_tasks(inverted_residual(np.random.default_rng(0)))
    s = default_schedule(task.dag)
    tile = _depthwise_tile_stage(s)
    assert tile.compute_at == "iter", "the depthwise result is computed per tile, not whole at root"
    holder, loop = tile.attach
    loops = [it.name for it in s.stage(holder).iters]
    # the output channel loop (axis 1 of N x F/b x H x W x b) runs inside the loop the pixels are computed at
    channel = s.stage(holder).op.axes[1].name
    assert loops.index(next(n for n in loops if n.split(".")[0] == channel)) > loops.index(loop)
    # the tile holds one row of pixels, every channel: a few KiB, not the whole expanded tensor
    func = lower(s)
    assert "alloc(float32[1, 6, 1" in str(func)


def test_every_sketch_of_the_fused_task_keeps_the_depthwise_tile_inside_the_1x1_conv():
    (task,) = _fused_tasks(inverted_residual(np.random.default_rng(0)))
    sketches = generate_sketches(task.dag)
    assert sketches
    for sk in sketches:
        assert any(r.startswith("at-consumer-tile(") for r in sk.rules), sk.rules
        assert _depthwise_tile_stage(sk.state).compute_at == "iter"


def test_random_programs_of_the_fused_task_compute_what_the_default_schedule_does():
    rng = np.random.default_rng(7)
    (task,) = _fused_tasks(inverted_residual(np.random.default_rng(1), stride=2))
    sketches = generate_sketches(task.dag)
    funcs = [lower(default_schedule(task.dag), name="reference")]
    for i in range(6):
        sk = sketches[i % len(sketches)]
        funcs.append(lower(materialize(sk, sample(sk, rng, 2, 16)), name=f"candidate{i}"))
    kernels = compile_funcs(funcs)
    n_in = len(task.dag.inputs)
    inputs = [rng.standard_normal(p.shape).astype(p.dtype) for p in funcs[0].params[:n_in]]
    results = []
    for f in funcs:
        out = [np.zeros(p.shape, p.dtype) for p in f.params[n_in:]]
        kernels[f.name](*inputs, *out)
        results.append(out[0])
    for f, got in zip(funcs[1:], results[1:]):
        np.testing.assert_allclose(got, results[0], rtol=1e-5, atol=1e-5, err_msg=f.name)
