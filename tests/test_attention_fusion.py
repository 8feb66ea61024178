"""Attention as one task (passes.fuse_attention): which chains the pass marks, that the fused task computes each
block of query rows' scores and softmax inside the ·V product's row tile (default schedule and every sketch), and
that the numbers do not change (numpy for the default schedule and random programs, onnxruntime for a masked
BERT-shaped attention with the pass on and off)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact.build import run_in_process
from compiler.model.onnx_import import load
from compiler.model.passes import ATTENTION_SCORE_BYTES
from compiler.schedule.lower import lower
from compiler.targets.cpu.annotate import materialize, sample
from compiler.targets.cpu.codegen import compile_funcs
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.targets.cpu.sketch import generate_sketches
from compiler.tensor.tasks import plan_tasks

PASS = "fuse_attention"


def attention(rng, seq=32, heads=2, dim=16, mask=False, divide=False) -> onnx.ModelProto:
    """One self-attention block as a transformer exporter writes it: Q, K, V projections, heads split by Reshape and
    Transpose (K's transposed for Q·Kᵀ), the scores scaled (Mul, or Div with `divide`) and, with `mask`, an additive
    mask input (1, 1, 1, seq) added, Softmax over the keys, the product with V, heads merged."""
    width = heads * dim
    inits = {f"w{n}": (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32) for n in "qkv"}
    inits["split"] = np.array([1, seq, heads, dim], np.int64)
    inits["merge"] = np.array([1, seq, width], np.int64)
    inits["scale"] = np.array(np.sqrt(dim) if divide else 1 / np.sqrt(dim), np.float32)
    nodes = []
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [
            helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}_p"]),
            helper.make_node("Reshape", [f"{n}_p", "split"], [f"{n}_r"]),
            helper.make_node("Transpose", [f"{n}_r"], [f"{n}_h"], perm=perm),
        ]
    nodes += [
        helper.make_node("MatMul", ["q_h", "k_h"], ["s"]),
        helper.make_node("Div" if divide else "Mul", ["s", "scale"], ["s_scaled"]),
    ]
    scores = "s_scaled"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, width])]
    if mask:
        nodes.append(helper.make_node("Add", ["s_scaled", "mask"], ["s_masked"]))
        scores = "s_masked"
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, 1, seq]))
    nodes += [
        helper.make_node("Softmax", [scores], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v_h"], ["o"]),
        helper.make_node("Transpose", ["o"], ["o_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o_t", "merge"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(rng, seq=32, heads=2, dim=16, mask=False) -> dict[str, np.ndarray]:
    feeds = {"x": rng.standard_normal((1, seq, heads * dim)).astype(np.float32)}
    if mask:  # the last quarter of the keys masked out, as padding is
        m = np.zeros((1, 1, 1, seq), np.float32)
        m[..., -seq // 4 :] = -10000.0
        feeds["mask"] = m
    return feeds


def _attention_tasks(model: onnx.ModelProto, disabled=()):
    tasks, _, _ = plan_tasks(load(model), disabled)
    return [t for t in tasks if {op.tag for op in t.dag.ops} >= {"comm_reduce", "batch_matmul"}]


def _reference(task, inputs: list[np.ndarray]) -> np.ndarray:
    """softmax(Q·Kᵀ · scale (+ mask)) · V in numpy, from the fused task's inputs (placeholders by name)."""
    by_name = dict(zip(task.dag.inputs, inputs))
    q, k, v = (by_name[n] for n in ("q_h", "k_h", "v_h"))
    scores = (q @ k) * next(a for n, a in by_name.items() if n.startswith("scale"))
    if any(n.startswith("mask") for n in by_name):
        scores = scores + next(a for n, a in by_name.items() if n.startswith("mask"))
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def test_the_pass_makes_the_attention_one_task_and_can_be_turned_off():
    for mask in (False, True):
        model = attention(np.random.default_rng(0), mask=mask)
        (task,) = _attention_tasks(model)
        assert sum(op.tag == "batch_matmul" for op in task.dag.ops) == 2, "Q·Kᵀ and ·V in one task"
        assert _attention_tasks(model, disabled=[PASS]) == []
        tasks, _, _ = plan_tasks(load(model), [PASS])
        names = [t.name for t in tasks]
        assert "fused_softmax" in names and "fused_matmul" in names


def test_the_pass_leaves_long_sequences_and_a_divided_scale_alike():
    assert len(_attention_tasks(attention(np.random.default_rng(0), divide=True))) == 1
    seq = int(np.sqrt(ATTENTION_SCORE_BYTES / 4)) + 32  # one head's scores just over the bound
    assert _attention_tasks(attention(np.random.default_rng(0), seq=seq, heads=1, dim=4)) == []


def test_the_examples_attention_is_one_task():
    from tilefarm.examples import EXAMPLES

    model = EXAMPLES["encoder"](seed=0)
    tasks, _, _ = plan_tasks(load(model, input_shapes={"x": [1, 128, 256]}))
    (task,) = [t for t in tasks if "softmax" in t.name]
    assert task.name == "fused_matmul_mul_softmax" and task.weight == 4


@pytest.mark.parametrize("disabled", [(), (PASS,)], ids=["fused", "unfused"])
def test_masked_bert_shaped_attention_matches_onnxruntime(disabled):
    rng = np.random.default_rng(3)
    shape = {"seq": 128, "heads": 12, "dim": 64}
    model = attention(rng, mask=True, **shape)
    assert len(_attention_tasks(model, disabled)) == (0 if disabled else 1)
    feeds = _feeds(rng, mask=True, **shape)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = run_in_process(load(model), feeds, disabled_passes=disabled)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


def _run(funcs, task, rng) -> tuple[list[np.ndarray], np.ndarray]:
    """Each function's result on one set of random inputs, and numpy's."""
    kernels = compile_funcs(funcs)
    n_in = len(task.dag.inputs)
    inputs = [rng.standard_normal(p.shape).astype(p.dtype) for p in funcs[0].params[:n_in]]
    for name, a in zip(task.dag.inputs, inputs):
        if name.startswith("mask"):
            a[..., -a.shape[-1] // 4 :] = -10000.0
    results = []
    for f in funcs:
        out = [np.zeros(p.shape, p.dtype) for p in f.params[n_in:]]
        kernels[f.name](*inputs, *out)
        results.append(out[0])
    return results, _reference(task, inputs)


def test_default_schedule_computes_the_scores_and_softmax_inside_the_products_row_tile():
    (task,) = _attention_tasks(attention(np.random.default_rng(0), seq=64, heads=4, mask=True))
    s = default_schedule(task.dag)
    product, pv = (s.stage(next(op.name for op in task.dag.ops if h in op.reads)) for h in ("q_h", "v_h"))
    softmax = s.stage(next(r for r in task.dag.op(pv.name).reads if r != "v_h"))
    assert product.compute_at == "iter" and softmax.compute_at == "iter"
    assert product.attach == softmax.attach, "both computed in the same row block of ·V"
    assert product.attach[0] == pv.name and s.dag.is_output(pv.name)
    # a block of rows of one head, every key of them: not the whole score matrix
    text = str(lower(s))
    for name in (product.name, softmax.name):
        rows = re.search(rf"{re.escape(name)} = alloc\(float32\[1, 1, (\d+), 64\]\)", text)
        assert rows is not None and int(rows.group(1)) < 64, text
    (got,), want = _run([lower(s, name="default")], task, np.random.default_rng(1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask", [False, True])
def test_random_programs_of_the_fused_attention_compute_what_numpy_does(mask):
    rng = np.random.default_rng(7)
    (task,) = _attention_tasks(attention(np.random.default_rng(1), seq=48, heads=3, mask=mask))
    sketches = generate_sketches(task.dag)
    assert sketches
    for sk in sketches:
        assert any(r.startswith("attention-rows(") for r in sk.rules), sk.rules
        assert any(r.startswith("scores-at-rows(") for r in sk.rules), sk.rules
    funcs = [lower(default_schedule(task.dag), name="reference")]
    for i in range(8):
        sk = sketches[i % len(sketches)]
        funcs.append(lower(materialize(sk, sample(sk, rng, 2, 16)), name=f"candidate{i}"))
    results, want = _run(funcs, task, rng)
    for f, got in zip(funcs, results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f.name)


def test_the_fused_attention_computes_right_under_gpu_schedules_too():
    """The pass runs for every target: the CUDA backend's default schedule and sampled programs of the fused task,
    run by the GPU loop-IR interpreter, compute what numpy does."""
    from compiler.schedule import gpu_interp
    from compiler.search.evolution import SearchParams
    from compiler.targets import backend_for, parse_target

    (task,) = _attention_tasks(attention(np.random.default_rng(0), seq=16, heads=2, dim=8, mask=True))
    target = parse_target("cuda")
    backend = backend_for(target)
    space = backend.search_space(task.dag, target, SearchParams())
    rng = np.random.default_rng(5)
    states = [backend.default_schedule(task.dag, target)] + [
        space.sample(k, rng)[1] for k in range(len(space.sketches))
    ]
    for state in states:
        inputs = [rng.standard_normal(task.dag.op(n).shape).astype(np.float32) for n in task.dag.inputs]
        out = np.zeros(task.dag.op(task.dag.outputs[0]).shape, np.float32)
        gpu_interp.run(lower(state), *inputs, out)
        np.testing.assert_allclose(out, _reference(task, inputs), rtol=1e-5, atol=1e-5, err_msg=str(state))
