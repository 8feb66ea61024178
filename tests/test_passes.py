"""Graph passes: identity removal, BatchNorm folding, Gemm canonicalization, fusion groups, memory planning."""

from __future__ import annotations

import numpy as np

from compiler.model.fusion import fuse
from compiler.model.graph import Graph, Node, TensorType, Value
from compiler.model.memory_plan import plan_memory
from compiler.model.optimize import optimize
from compiler.model.passes import (
    ANCHOR,
    CONV_BLOCK,
    block_conv_weights,
    fold_batchnorm,
    gemm_to_matmul,
    remove_identity,
)


def val(name, shape, const=None, dtype="float32"):
    return Value(name, TensorType(tuple(shape), dtype), const)


def conv_graph(rng, with_bn=True, f=4, group=1):
    x = val("x", (1, 3 * group, 8, 8))
    w = val("w", (f, 3, 3, 3), rng.standard_normal((f, 3, 3, 3)).astype(np.float32))
    b = val("b", (f,), rng.standard_normal(f).astype(np.float32))
    c, y, r = val("c", (1, f, 8, 8)), val("y", (1, f, 8, 8)), val("r", (1, f, 8, 8))
    conv_attrs = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": group, "kernel_shape": [3, 3]}
    nodes = [Node("Conv", (x, w, b), (c,), conv_attrs, "conv")]
    if with_bn:
        stats = [val(n, (4,), rng.random(4).astype(np.float32) + 0.5) for n in ("scale", "shift", "mean", "var")]
        nodes.append(Node("BatchNormalization", (c, *stats), (y,), {"epsilon": 1e-5}, "bn"))
    else:
        y = c
    nodes.append(Node("Relu", (y,), (r,), {}, "relu"))
    return Graph([x], [r], nodes)


def reference_conv(x, w, b):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((1, w.shape[0], 8, 8))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i : i + 8, j : j + 8], w[:, :, i, j])
    return out + b[None, :, None, None]


def test_fold_batchnorm_rescales_conv_and_keeps_numerics():
    rng = np.random.default_rng(0)
    g = conv_graph(rng)
    folded = fold_batchnorm(g)
    assert [n.op for n in folded.nodes] == ["Conv", "Relu"]
    conv, bn = g.nodes[0], g.nodes[1]
    x = rng.standard_normal((1, 3, 8, 8))
    scale, shift, mean, var = (v.const.astype(np.float64) for v in bn.inputs[1:])
    y = reference_conv(x, conv.inputs[1].const, conv.inputs[2].const)
    want = (y - mean[None, :, None, None]) / np.sqrt(var + 1e-5)[None, :, None, None] * scale[None, :, None, None]
    want += shift[None, :, None, None]
    new = folded.nodes[0]
    got = reference_conv(x, new.inputs[1].const, new.inputs[2].const)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert folded.outputs[0] is g.outputs[0]


def test_remove_identity_rewires_but_keeps_graph_outputs():
    x, a, b = val("x", (4,)), val("a", (4,)), val("b", (4,))
    g = Graph([x], [b], [Node("Identity", (x,), (a,)), Node("Relu", (a,), (b,))])
    out = remove_identity(g)
    assert [n.op for n in out.nodes] == ["Relu"] and out.nodes[0].inputs[0] is x
    g2 = Graph([x], [a], [Node("Identity", (x,), (a,))])
    assert [n.op for n in remove_identity(g2).nodes] == ["Identity"]


def test_gemm_with_constant_transposed_weight_becomes_matmul_add():
    rng = np.random.default_rng(0)
    x, y = val("x", (2, 5)), val("y", (2, 3))
    w = val("w", (3, 5), rng.standard_normal((3, 5)).astype(np.float32))
    c = val("c", (3,), rng.standard_normal(3).astype(np.float32))
    g = Graph([x], [y], [Node("Gemm", (x, w, c), (y,), {"alpha": 2.0, "beta": 0.5, "transA": 0, "transB": 1})])
    out = gemm_to_matmul(g)
    assert [n.op for n in out.nodes] == ["MatMul", "Add"]
    mm, add = out.nodes
    xs = rng.standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_allclose(
        xs @ mm.inputs[1].const + add.inputs[1].const, 2.0 * xs @ w.const.T + 0.5 * c.const, rtol=1e-5, atol=1e-5
    )


def test_fusion_anchor_absorbs_elementwise_chain_and_injective_chains_fuse():
    rng = np.random.default_rng(0)
    g = optimize(conv_graph(rng))
    groups = fuse(g)
    assert len(groups) == 1 and [n.op for n in groups[0].nodes] == ["Conv", "Relu"]
    assert groups[0].pattern == ANCHOR and groups[0].outputs == g.outputs
    # relu -> reshape -> transpose -> matmul: the injective chain fuses with relu; matmul stays its own anchor
    x, r, s, t, o = val("x", (2, 6)), val("r", (2, 6)), val("s", (3, 4)), val("t", (4, 3)), val("o", (4, 5))
    w = val("w", (3, 5), np.ones((3, 5), np.float32))
    nodes = [
        Node("Relu", (x,), (r,)),
        Node("Reshape", (r,), (s,), {"shape": [3, 4]}),
        Node("Transpose", (s,), (t,), {"perm": [1, 0]}),
        Node("MatMul", (t, w), (o,)),
    ]
    groups = fuse(Graph([x], [o], nodes))
    assert [[n.op for n in grp.nodes] for grp in groups] == [["Relu", "Reshape", "Transpose"], ["MatMul"]]


def test_value_with_two_consumers_is_not_fused_and_groups_come_in_dependency_order():
    x, a, b, c, d = (val(n, (8,)) for n in "xabcd")
    nodes = [Node("Exp", (x,), (a,)), Node("Relu", (a,), (b,)), Node("Neg", (a,), (c,)), Node("Add", (b, c), (d,))]
    groups = fuse(Graph([x], [d], nodes))
    assert [[n.op for n in grp.nodes] for grp in groups][0] == ["Exp"]
    seen = {id(x)}
    for grp in groups:
        assert all(id(v) in seen for v in grp.inputs)
        seen |= {id(o) for n in grp.nodes for o in n.outputs}


def test_memory_plan_reuses_dead_buffers():
    vals = [val(f"v{i}", (256,)) for i in range(5)]  # 1 KiB each
    nodes = [Node("Exp", (vals[i],), (vals[i + 1],)) for i in range(4)]
    g = Graph([vals[0]], [vals[4]], nodes)
    groups = [type(fuse(g)[0])([n], list(n.inputs), list(n.outputs)) for n in nodes]  # no fusion: 4 kernels
    offsets, size = plan_memory(groups, keep={id(vals[0]), id(vals[4])})
    assert set(offsets) == {id(v) for v in vals[1:4]}
    assert size == 2 * 1024  # a chain needs two live buffers at a time, not three
    assert offsets[id(vals[1])] == offsets[id(vals[3])]


def test_block_conv_weights_packs_output_channel_blocks():
    rng = np.random.default_rng(3)
    g = conv_graph(rng, with_bn=False, f=2 * CONV_BLOCK)
    blocked = block_conv_weights(g)
    conv = blocked.nodes[0]
    assert conv.op == "BlockedConv" and conv.attrs == g.nodes[0].attrs and conv.inputs[2] is g.nodes[0].inputs[2]
    w, packed = g.nodes[0].inputs[1].const, conv.inputs[1].const
    assert packed.shape == (2, 3, 3, 3, CONV_BLOCK) and packed.flags.c_contiguous
    for f in (0, 5, CONV_BLOCK + 3):  # output channel f is element f % 16 of block f // 16
        np.testing.assert_array_equal(packed[f // CONV_BLOCK, ..., f % CONV_BLOCK], w[f])
    # output channels that do not fill blocks, and grouped convs, stay Conv
    for kept in (conv_graph(rng, with_bn=False, f=CONV_BLOCK + 4), conv_graph(rng, with_bn=False, f=32, group=2)):
        assert [n.op for n in block_conv_weights(kept).nodes] == ["Conv", "Relu"]


def test_pack_matmul_weights_lays_constant_weights_out_in_panels():
    from compiler.artifact.build import run_in_process
    from compiler.model.passes import MATMUL_PANEL, pack_matmul_weights

    rng = np.random.default_rng(4)
    n = 3 * MATMUL_PANEL
    w = val("w", (64, n), rng.standard_normal((64, n)).astype(np.float32))
    x, y = val("x", (2, 5, 64)), val("y", (2, 5, n))
    g = Graph([x], [y], [Node("MatMul", (x, w), (y,), {}, "mm")])
    (mm,) = pack_matmul_weights(g).nodes
    panels = mm.inputs[1].const
    assert mm.op == "PackedMatMul" and panels.shape == (3, 64, MATMUL_PANEL) and panels.flags.c_contiguous
    for j in (0, 7, MATMUL_PANEL + 1, n - 1):  # column j is lane j % P of panel j // P
        np.testing.assert_array_equal(panels[j // MATMUL_PANEL, :, j % MATMUL_PANEL], w.const[:, j])
    a = rng.standard_normal((2, 5, 64)).astype(np.float32)
    np.testing.assert_allclose(run_in_process(g, {"x": a})["y"], a @ w.const, rtol=1e-4, atol=1e-4)
    # a one-row GEMV keeps its rows (its tile reads them in long runs); columns that fill no panels stay too
    for x_shape, cols in (((1, 64), n), ((4, 64), n + 8)):
        wk = val("w", (64, cols), rng.standard_normal((64, cols)).astype(np.float32))
        kept = Graph([val("x", x_shape)], [val("y", (x_shape[0], cols))], [])
        kept.nodes.append(Node("MatMul", (kept.inputs[0], wk), (kept.outputs[0],), {}, "mm"))
        assert [n.op for n in pack_matmul_weights(kept).nodes] == ["MatMul"]


def test_a_gelu_fuses_into_the_gemm_whose_output_it_reads_twice():
    # x * 0.5 * (1 + erf(x / sqrt 2)) after a matmul + bias: one kernel, the GEMM's tile read by both branches
    rng = np.random.default_rng(5)
    x, w = val("x", (8, 16)), val("w", (16, 32), rng.standard_normal((16, 32)).astype(np.float32))
    b = val("b", (32,), rng.standard_normal(32).astype(np.float32))
    c = {k: val(k, (), np.array(v, np.float32)) for k, v in (("s2", 2**0.5), ("one", 1.0), ("half", 0.5))}
    mm, h, d, e, p, m, y = (val(k, (8, 32)) for k in ("mm", "h", "d", "e", "p", "m", "y"))
    nodes = [
        Node("MatMul", (x, w), (mm,), {}, "mm"),
        Node("Add", (mm, b), (h,), {}, "bias"),
        Node("Div", (h, c["s2"]), (d,), {}, "div"),
        Node("Erf", (d,), (e,), {}, "erf"),
        Node("Add", (e, c["one"]), (p,), {}, "add1"),
        Node("Mul", (h, p), (m,), {}, "mul"),
        Node("Mul", (m, c["half"]), (y,), {}, "half"),
    ]
    groups = fuse(optimize(Graph([x], [y], nodes)))
    assert [[n.name for n in grp.nodes] for grp in groups] == [["mm", "bias", "div", "erf", "add1", "mul", "half"]]
