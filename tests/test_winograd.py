"""Winograd F(m x m, 3 x 3) convolution: the transform matrices, the three-stage compute in both data layouts, the
pass that picks it, and that tuned programs of it compute the conv."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact.build import build, run_in_process
from compiler.artifact.runtime import Artifact
from compiler.base.errors import InvalidExpr, UnknownPass
from compiler.model.fusion import fuse
from compiler.model.onnx_import import load
from compiler.model.optimize import OPTIONAL_PASSES, optimize
from compiler.model.passes import CONV_BLOCK, WINOGRAD_MIN_TILES, winograd_tiles
from compiler.model.winograd import winograd_matrices, winograd_weight
from compiler.schedule.loopir import For, walk_stmts
from compiler.schedule.lower import lower
from compiler.schedule.state import initial_state
from compiler.targets import host_target
from compiler.targets.cpu.annotate import materialize, sample
from compiler.targets.cpu.codegen import compile_funcs, llvm_ir
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.targets.cpu.sketch import generate_sketches
from compiler.tensor import te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops.kernels import reference_conv2d
from compiler.tensor.ops.winograd import conv2d_winograd

B = CONV_BLOCK


def _max_rel(got: np.ndarray, want: np.ndarray) -> float:
    # the error of a sum of many terms scales with the terms, not with each result: compare against the largest
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("m", [2, 4, 6])
def test_the_matrices_compute_a_1d_convolution(m):
    at, g, bt = winograd_matrices(m)
    assert at.shape == (m, m + 2) and g.shape == (m + 2, 3) and bt.shape == (m + 2, m + 2)
    rng = np.random.default_rng(m)
    d, w = rng.standard_normal(m + 2), rng.standard_normal(3)
    direct = np.array([d[i : i + 3] @ w for i in range(m)])
    np.testing.assert_allclose(at @ ((g @ w) * (bt @ d)), direct, rtol=1e-12, atol=1e-12)


def test_f4_has_lavins_matrices():
    at, g, bt = winograd_matrices(4)
    assert bt[0].tolist() == [4, 0, -5, 0, 1, 0] and bt[5].tolist() == [0, 4, 0, -5, 0, 1]
    assert at[3].tolist() == [0, 1, -1, 8, -8, 1] and g[0].tolist() == [0.25, 0, 0]


def _blocked(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // B, B, h, w).transpose(0, 1, 3, 4, 2))


def _case(c, f, h, w, m, pads, blocked_in, blocked_out, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((f, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    data = te.placeholder((1, c // B, h, w, B) if blocked_in else (1, c, h, w), name="data")
    u = winograd_weight(wt, m, B)
    at, _, bt = winograd_matrices(m)
    U, BT, AT = (te.placeholder(t.shape, name=n) for t, n in ((u, "U"), (bt, "bt"), (at, "at")))
    out = conv2d_winograd(data, U, BT, AT, pads, name="conv", out_blocked=blocked_out)
    pt, pl, pb, pr = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    want = reference_conv2d(xp, wt.astype(np.float64), 1, 0)
    if blocked_out:
        want = _blocked(want)
    args = [_blocked(x) if blocked_in else x, u, bt.astype(np.float32), at.astype(np.float32)]
    return ComputeDAG([data, U, BT, AT, out]), args, want


@pytest.mark.parametrize(
    "c, f, h, w, m, pads, blocked_in, blocked_out",
    [
        (16, 32, 8, 8, 4, (1, 1, 1, 1), False, False),  # whole tiles, NCHW in and out
        (32, 16, 10, 7, 4, (1, 1, 1, 1), True, True),  # ragged tiles: 10 x 7 outputs in 3 x 2 tiles of 4
        (16, 16, 9, 9, 2, (0, 1, 2, 0), True, False),  # uneven padding, F(2x2, 3x3)
    ],
)
def test_the_naive_and_default_schedules_compute_the_conv(c, f, h, w, m, pads, blocked_in, blocked_out):
    dag, args, want = _case(c, f, h, w, m, pads, blocked_in, blocked_out)
    default = default_schedule(dag)
    # the transforms' one structure: the row half inside the column half, the tile loops unrolled, lanes vectorized
    assert default.stage("conv_pack_rows").attach[0] == "conv_pack"  # at co (p@co where both went parallel)
    assert default.stage("conv_inverse_rows").attach[0] == "conv_inverse"
    for name in ("conv_pack_rows", "conv_pack", "conv_inverse_rows", "conv_inverse"):
        kinds = [it.annotation for it in default.stage(name).iters]
        assert kinds[-1] == "vectorize" and kinds[-4:-1] == ["unroll"] * 3, (name, kinds)
    kernels = compile_funcs([lower(initial_state(dag), "naive"), lower(default, "default")])
    for k in ("naive", "default"):
        out = np.zeros(dag.ops[-1].shape, np.float32)
        kernels[k](*args, out)
        assert _max_rel(out, want) < 1e-5, k


def test_the_transforms_unrolled_loops_are_left_to_llvm_and_a_gemms_are_not():
    """A matrix transform's unrolled tile loops are emitted as loops LLVM must fully unroll (For.llvm_unroll), which
    halves a Winograd candidate's build with the same machine code speed; after LLVM's pipeline none is left
    rolled. The batched GEMM's unrolled register tile is replicated by codegen as before."""
    dag, args, want = _case(16, 32, 8, 8, 4, (1, 1, 1, 1), True, True)
    state = default_schedule(dag)
    state = state.annotate("conv_bgemm", state.stage("conv_bgemm").iters[-2].name, "unroll")
    func = lower(state, "k")
    unrolled = [(f.var.name, f.llvm_unroll) for f in walk_stmts(func.body) if isinstance(f, For)
                if f.kind == "unrolled"]
    by_llvm = {name for name, llvm in unrolled if llvm}
    assert by_llvm and by_llvm != {name for name, _ in unrolled}  # the GEMM's unrolled loop stays with codegen
    assert "llvm.loop.unroll.full" in llvm_ir([func], optimized=False)
    assert "llvm.loop.unroll.full" not in llvm_ir([func])  # every one of them unrolled
    out = np.zeros(dag.ops[-1].shape, np.float32)
    compile_funcs([func])["k"](*args, out)
    assert _max_rel(out, want) < 1e-5


def test_random_annotations_compute_the_conv():
    # 3 sketches: the batched GEMM tiled in place, or into a cache stage at either tile level; the four transforms
    # have one structure each (compiler.schedule.matrix_transform), where they gave 27 sketches when tiled like GEMMs
    dag, args, want = _case(16, 16, 8, 8, 4, (1, 1, 1, 1), True, True, seed=3)
    sketches = generate_sketches(dag, host_target())
    assert len(sketches) == 3
    for sk in sketches:
        transforms = sorted(r for r in sk.rules if r.startswith("transform("))
        assert transforms == [f"transform(conv_{n})" for n in ("inverse", "inverse_rows", "pack", "pack_rows")]
        assert sk.state.stage("conv_pack_rows").attach == ("conv_pack", "co")
        assert sk.state.stage("conv_inverse_rows").attach == ("conv_inverse", "fo")
    rng = np.random.default_rng(0)
    lanes = max(1, host_target().vector_bytes // 4)
    picked = [sk for sk in sketches for _ in range(2)]
    states = [materialize(sk, sample(sk, rng, 2, lanes=lanes)) for sk in picked]
    kernels = compile_funcs([lower(st, f"k{i}") for i, st in enumerate(states)])
    for i, sk in enumerate(picked):
        out = np.zeros(dag.ops[-1].shape, np.float32)
        kernels[f"k{i}"](*args, out)
        assert _max_rel(out, want) < 1e-5, f"sketch {sk.rules}"


def test_bad_weights_are_named():
    with pytest.raises(InvalidExpr, match="3 x 3 weight"):
        winograd_weight(np.zeros((16, 16, 5, 5), np.float32), 4, B)
    data = te.placeholder((1, 16, 8, 8), name="data")
    bt, at = te.placeholder((6, 6), name="bt"), te.placeholder((4, 6), name="at")
    with pytest.raises(InvalidExpr, match="not the transforms of one F"):
        conv2d_winograd(data, te.placeholder((6, 6, 1, 16, B), name="U"), bt, te.placeholder((2, 4), name="at"), 1)
    with pytest.raises(InvalidExpr, match="32 input channels"):
        conv2d_winograd(data, te.placeholder((6, 6, 1, 32, B), name="U"), bt, at, 1)


def _conv_node(name, x, out, inits, rng, cin, cout, k=3, stride=1, group=1, dilation=1):
    inits[f"{name}_w"] = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    inits[f"{name}_b"] = rng.standard_normal(cout).astype(np.float32)
    p = dilation * (k // 2)
    return helper.make_node(
        "Conv",
        [x, f"{name}_w", f"{name}_b"],
        [out],
        kernel_shape=[k, k],
        pads=[p] * 4,
        strides=[stride] * 2,
        group=group,
        dilations=[dilation] * 2,
    )


def residual_block(rng, hw=16, c=B, f=2 * B) -> onnx.ModelProto:
    """conv + ReLU, conv + residual (a 1x1 shortcut) + ReLU, a strided conv: ResNet's layer pattern."""
    inits: dict = {}
    nodes = [
        _conv_node("a", "x", "a", inits, rng, c, f),
        helper.make_node("Relu", ["a"], ["a_r"]),
        _conv_node("b", "a_r", "b", inits, rng, f, f),
        _conv_node("short", "x", "sc", inits, rng, c, f, k=1),
        helper.make_node("Add", ["b", "sc"], ["s"]),
        helper.make_node("Relu", ["s"], ["s_r"]),
        _conv_node("down", "s_r", "y", inits, rng, f, f, stride=2),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, f, hw // 2, hw // 2])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_pass_takes_3x3_stride_1_convs_with_enough_tiles_and_keeps_the_layout_blocked():
    g = optimize(load(residual_block(np.random.default_rng(0))))
    ops = {n.outputs[0].name.removesuffix("_nchwc"): n for n in g.nodes}
    assert ops["a"].op == ops["b"].op == "WinogradConv"  # 16 x 16 outputs: 16 tiles of 4 x 4
    assert ops["sc"].op == ops["y"].op == "BlockedConv"  # a 1x1 and a strided conv stay direct
    assert ops["a"].attrs.get("data_layout", "NCHW") == "NCHW" and ops["b"].attrs["data_layout"] == "NCHWc"
    assert ops["a"].inputs[1].shape == (6, 6, 2, B, B) and ops["b"].attrs["out_layout"] == "NCHWc"
    assert ops["b"].inputs[2].shape == (2, B)  # the bias laid out in blocks; then B^T and A^T, shared
    assert ops["a"].inputs[3] is ops["b"].inputs[3] and [v.shape for v in ops["a"].inputs[3:]] == [(6, 6), (4, 6)]
    groups = [[n.op for n in grp.nodes] for grp in fuse(g)]
    assert ["WinogradConv", "Relu"] in groups and ["WinogradConv", "Add", "Relu"] in groups


def test_small_images_and_other_convs_stay_direct():
    g = optimize(load(residual_block(np.random.default_rng(0), hw=12)))  # 3 x 3 = 9 tiles
    assert not [n for n in g.nodes if n.op == "WinogradConv"] and WINOGRAD_MIN_TILES > 9
    rng, inits = np.random.default_rng(1), {}
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2 * B, 32, 32])
    for node, why in [
        (_conv_node("g", "x", "y", inits, rng, 2 * B, 2 * B, group=2), "two groups"),
        (_conv_node("d", "x", "y", inits, rng, 2 * B, 2 * B, dilation=2), "dilated"),
        (_conv_node("k", "x", "y", inits, rng, 2 * B, 2 * B, k=5), "5x5"),
        (_conv_node("c", "x", "y", inits, rng, 2 * B, 24), "24 output channels"),
    ]:
        graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        graph.initializer.extend(numpy_helper.from_array(inits[i], i) for i in node.input[1:])
        n = load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).nodes[0]
        assert winograd_tiles(n) == 0, why


def test_a_network_with_winograd_convs_matches_onnxruntime():
    rng = np.random.default_rng(2)
    model = residual_block(rng, hw=18)  # 18 x 18 outputs: 5 x 5 tiles of 4, the last row and column ragged
    x = rng.standard_normal((1, B, 18, 18)).astype(np.float32)
    got = run_in_process(load(model), {"x": x})["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _max_rel(got, want) < 1e-5


def test_an_artifact_gives_its_winograd_kernels_scratch_in_the_workspace(tmp_path):
    rng = np.random.default_rng(3)
    model = residual_block(rng, hw=18)
    x = rng.standard_normal((1, B, 18, 18)).astype(np.float32)
    build(load(model), tmp_path / "m.tar", name="m")
    art = Artifact.load(tmp_path / "m.tar")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for _ in range(2):  # the workspace, scratch included, is reused between runs
        assert _max_rel(art.run({"x": x})["y"], want) < 1e-5
    # every Winograd kernel takes one more pointer than it has buffers: the scratch region, past the planned values
    calls = {c["kernel"]: c["args"] for c in art.meta["calls"]}
    scratch = {args[-1][1] for k, args in calls.items() if "winogradconv" in k}
    assert len(scratch) == 1 and 0 < scratch.pop() < art.meta["workspace_bytes"]
    assert all(len(args) == 4 for k, args in calls.items() if "blockedconv" in k)  # X, W, bias, Y: no scratch
    assert len(art.profile({"x": x}, repeat=2)) == len(art.meta["calls"])


def test_a_winograd_result_read_as_nchw_is_converted_by_a_task_of_its_own():
    rng, inits = np.random.default_rng(4), {}
    graph = helper.make_graph(
        [_conv_node("c", "x", "y", inits, rng, B, B)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, B, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, B, 16, 16])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g = optimize(load(model))
    assert [n.op for n in g.nodes] == ["WinogradConv", "NCHWcToNCHW"]
    assert [[n.op for n in grp.nodes] for grp in fuse(g)] == [["WinogradConv"], ["NCHWcToNCHW"]]
    x = rng.standard_normal((1, B, 16, 16)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _max_rel(run_in_process(load(model), {"x": x})["y"], want) < 1e-5


@pytest.mark.parametrize(
    "disabled",
    [("winograd_convs",), ("propagate_nchwc",), ("block_conv_weights",), OPTIONAL_PASSES],
)
def test_optional_passes_turn_off_and_the_network_still_matches_onnxruntime(tmp_path, disabled):
    rng = np.random.default_rng(4)
    model = residual_block(rng, hw=18)
    x = rng.standard_normal((1, B, 18, 18)).astype(np.float32)
    ops = {n.op for n in optimize(load(model), disabled).nodes}
    assert ("WinogradConv" in ops) == ("winograd_convs" not in disabled)
    assert ("BlockedConv" in ops) == ("block_conv_weights" not in disabled)
    build(load(model), tmp_path / "m.tar", name="m", disabled_passes=disabled)
    art = Artifact.load(tmp_path / "m.tar")
    assert art.meta["disabled_passes"] == sorted(disabled)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _max_rel(art.run({"x": x})["y"], want) < 1e-5


def test_a_pass_that_cannot_be_turned_off_is_named():
    with pytest.raises(UnknownPass, match="cannot disable 'fold_batchnorm'.*winograd_convs"):
        optimize(load(residual_block(np.random.default_rng(0))), ["fold_batchnorm"])
