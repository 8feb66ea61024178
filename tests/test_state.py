"""State and steps: golden loop nests of fixed schedules, record round trips, replay determinism, typed errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.base.errors import IllegalStep
from compiler.schedule import interp
from compiler.schedule.lower import infer_bound, lower
from compiler.schedule.state import (
    STEPS,
    Annotate,
    CacheRead,
    CacheWrite,
    ComputeAt,
    ComputeInline,
    ComputeRoot,
    FollowSplit,
    Fuse,
    Pragma,
    Reorder,
    Rfactor,
    Split,
    apply_steps,
    initial_state,
    print_state,
    step_from_record,
)
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops import KERNELS
from tests.strategies import legal_steps


def matmul_dag(M=64, N=48, K=32):
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    return ComputeDAG([A, B, ops.matmul(A, B, name="C")])  # stages: 0 A, 1 B, 2 C


def conv_dag():
    data = te.placeholder((1, 4, 6, 6), name="data")
    weight = te.placeholder((8, 4, 3, 3), name="weight")
    bias = te.placeholder((8,), name="bias")
    # stages: 0 data, 1 conv2d_pad, 2 weight, 3 conv2d, 4 bias, 5 conv2d_bias, 6 conv2d_relu
    return ComputeDAG([data, weight, bias, ops.conv2d_bias_relu(data, weight, bias, padding=1)])


def softmax_dag():
    x = te.placeholder((4, 10), name="x")
    # stages: 0 x, 1 softmax_max, 2 softmax_exp, 3 softmax_sum, 4 softmax
    return ComputeDAG([x, ops.softmax(x)])


def check_numerics(dag: ComputeDAG, steps, reference) -> None:
    """The scheduled kernel, run by the interpreter, computes `reference` (float64 numpy) of random inputs."""
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(dag.op(n).shape).astype(np.float32) for n in dag.inputs]
    out = np.zeros(dag.op(dag.outputs[0]).shape, np.float32)
    interp.run(lower(apply_steps(dag, steps)), *inputs, out)
    np.testing.assert_allclose(out, reference(*(a.astype(np.float64) for a in inputs)), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- golden loop nests


NAIVE_MATMUL_NEST = """\
Placeholder: A, B
for i (0,64)
  for j (0,48)
    for k (0,32)
      C[i, j] += (A[i, k] * B[k, j])
"""


def test_golden_naive_matmul():
    assert print_state(initial_state(matmul_dag())) == NAIVE_MATMUL_NEST


# Ansor's multi-level tiling for CPU: C.local is tiled S S R S R S (i.0 j.0 i.1 j.1 k.0 i.2 j.2 k.1 i.3 j.3) and
# computed inside C's fused, parallel outer tile loop, whose inner tile copies C.local out with vector stores.
TILED_MATMUL = [
    CacheWrite(2, "local"),  # 2 C.local, 3 C
    Split(2, 0, (2, 4, 4)),
    Split(2, 4, (2, 2, 4)),
    Split(2, 8, (4,)),
    Reorder(2, (0, 4, 1, 5, 8, 2, 6, 9, 3, 7)),
    Split(3, 0, (32,)),
    Split(3, 2, (16,)),
    Reorder(3, (0, 2, 1, 3)),
    Fuse(3, (0, 1)),
    ComputeAt(2, 3, 0),
    Annotate(3, 0, "parallel"),
    Annotate(3, 2, "vectorize"),
    Annotate(2, 9, "vectorize"),
    Pragma(2, 0, "auto_unroll_max_step", 64),
]


TILED_MATMUL_NEST = """\
Placeholder: A, B
parallel i.0@j.0 (0,6)
  C.local auto_unroll: 64
  for i.0 (0,2)
    for j.0 (0,3)
      for i.1 (0,2)
        for j.1 (0,2)
          for k.0 (0,8)
            for i.2 (0,4)
              for j.2 (0,2)
                for k.1 (0,4)
                  for i.3 (0,4)
                    vectorize j.3 (0,4)
                      C.local[i, j] += (A[i, k] * B[k, j])
  for i.1 (0,32)
    vectorize j.1 (0,16)
      C[i, j] = C.local[i, j]
"""


def test_golden_tiled_matmul():
    state = apply_steps(matmul_dag(), TILED_MATMUL)
    # C.local's outer loops keep their pre-compute_at extents here: the printout shows steps, not inferred bounds
    assert print_state(state) == TILED_MATMUL_NEST
    # bound inference shrinks them to the one tile C needs per iteration of its outer loop
    local = infer_bound(state).stage("C.local")
    assert [(it.name, it.extent) for it in local.iters[:5]] == [
        ("i.0", 1),
        ("j.0", 1),
        ("i.1", 2),
        ("j.1", 2),
        ("k.0", 8),
    ]
    check_numerics(matmul_dag(), TILED_MATMUL, np.matmul)


CONV_FUSED = [
    ComputeInline(1),  # the pad's select moves into the conv's loads
    ComputeInline(5),  # the bias add moves into the relu
    Split(6, 1, (4,)),
    Fuse(6, (0, 1)),
    ComputeAt(3, 6, 1),  # one output channel of conv2d at a time, consumed right away by the relu
    Annotate(6, 0, "parallel"),
    Annotate(6, 3, "vectorize"),
]


CONV_FUSED_NEST = """\
Placeholder: data, weight, bias
parallel i0@i1.0 (0,2)
  for i1.1 (0,4)
    for n (0,1)
      for f (0,8)
        for y (0,6)
          for x (0,6)
            for rc (0,4)
              for ry (0,3)
                for rx (0,3)
                  conv2d[n, f, y, x] += (conv2d_pad[n, rc, (y + ry), (x + rx)] * weight[f, rc, ry, rx])
    for i2 (0,6)
      vectorize i3 (0,6)
        conv2d_relu[i0, i1, i2, i3] = max(conv2d_bias[i0, i1, i2, i3], 0.0f)
"""


def test_golden_conv2d_bias_relu():
    assert print_state(apply_steps(conv_dag(), CONV_FUSED)) == CONV_FUSED_NEST
    check_numerics(conv_dag(), CONV_FUSED, lambda d, w, b: np.maximum(_conv_ref(d, w) + b[None, :, None, None], 0))


def _conv_ref(data, weight):
    padded = np.pad(data, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # n c y x ry rx
    return np.einsum("ncyxhw,fchw->nfyx", windows, weight)


SOFTMAX_RFACTOR = [
    Split(3, 1, (4,)),  # k (10) -> k.0 (3) x k.1 (4), with a tail
    Rfactor(3, 2, 1),  # 3 softmax_sum.rf[i, k.1] sums over k.0; 4 softmax_sum sums the 4 partial sums
    Annotate(3, 1, "vectorize"),
]


SOFTMAX_RFACTOR_NEST = """\
Placeholder: x
for i (0,4)
  for k (0,10)
    softmax_max[i] max= x[i, k]
for i0 (0,4)
  for i1 (0,10)
    softmax_exp[i0, i1] = exp((x[i0, i1] - softmax_max[i0]))
for i (0,4)
  vectorize k.1 (0,4)
    for k.0 (0,3)
      softmax_sum.rf[i, k.1] += select((((k.0 * 4) + k.1) < 10), softmax_exp[i, ((k.0 * 4) + k.1)], 0.0f)
for i (0,4)
  for k.1 (0,4)
    softmax_sum[i] += softmax_sum.rf[i, k.1]
for i0 (0,4)
  for i1 (0,10)
    softmax[i0, i1] = (softmax_exp[i0, i1] / softmax_sum[i0])
"""


def test_golden_softmax_rfactor():
    state = apply_steps(softmax_dag(), SOFTMAX_RFACTOR)
    names = ["x", "softmax_max", "softmax_exp", "softmax_sum.rf", "softmax_sum", "softmax"]
    assert [s.name for s in state.stages] == names
    assert print_state(state) == SOFTMAX_RFACTOR_NEST

    def reference(x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    check_numerics(softmax_dag(), SOFTMAX_RFACTOR, reference)


# ---------------------------------------------------------------------------------------------- records


ONE_OF_EACH = [
    Split(2, 0, (2, 4), False),
    FollowSplit(2, 1, 0, 2),
    Fuse(2, (0, 1)),
    Reorder(2, (1, 0)),
    Annotate(2, 0, "unroll"),
    Pragma(2, 0, "auto_unroll_max_step", 16),
    ComputeAt(1, 2, 0),
    ComputeInline(1),
    ComputeRoot(1),
    CacheWrite(2, "local"),
    CacheRead(0, "shared", (2, 3)),
    Rfactor(2, 2, 1),
]


def test_one_of_each_covers_every_step_type():
    assert {type(s) for s in ONE_OF_EACH} == set(STEPS.values())


@pytest.mark.parametrize("step", ONE_OF_EACH, ids=lambda s: s.tag)
def test_record_json_round_trip(step):
    text = json.dumps(step.record())
    assert json.loads(text)[0] == step.tag
    assert step_from_record(json.loads(text)) == step


DAGS = {name: ComputeDAG(sum(KERNELS[name].build(), [])) for name in ("matmul", "conv2d_bias_relu", "softmax")}


@pytest.mark.parametrize("name", sorted(DAGS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_records_replay_to_the_same_state(name, data):
    dag = DAGS[name]
    steps = data.draw(legal_steps(dag))
    lines = [json.dumps(s.record()) for s in steps]  # a tuning log: one JSON record per step
    decoded = [step_from_record(json.loads(line)) for line in lines]
    assert decoded == steps
    assert print_state(apply_steps(dag, decoded)) == print_state(apply_steps(dag, steps))


@pytest.mark.parametrize("name", sorted(DAGS))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_apply_steps_is_deterministic(name, data):
    dag = DAGS[name]
    steps = data.draw(legal_steps(dag))
    a, b = apply_steps(dag, steps), apply_steps(dag, list(steps))
    assert a == b
    assert a.steps == tuple(steps)
    # replaying in two halves from an intermediate state is the same as replaying at once
    half = len(steps) // 2
    assert apply_steps(dag, steps[half:], apply_steps(dag, steps[:half])) == a


# ---------------------------------------------------------------------------------------------- illegal steps


def matmul_relu_dag():
    A = te.placeholder((8, 8), name="A")
    B = te.placeholder((8, 8), name="B")
    return ComputeDAG([A, B, ops.relu(ops.matmul(A, B, name="C"))])  # stages: 0 A, 1 B, 2 C, 3 relu


# (steps, index of the failing step, words of the reason)
ILLEGAL = {
    "split by 0": ([Split(2, 0, (0,))], 0, "positive integers"),
    "split by None": ([Split(2, 0, (None,))], 0, "list of integers"),
    "split with no lengths": ([Split(2, 0, ())], 0, "positive integers"),
    "split lengths not a list": ([Split(2, 0, 4)], 0, "list of integers"),
    "split an annotated iter": ([Annotate(2, 0, "unroll"), Split(2, 0, (2,))], 1, "annotated"),
    "fuse non-consecutive": ([Fuse(2, (0, 2))], 0, "consecutive"),
    "fuse spatial and reduce": ([Fuse(2, (1, 2))], 0, "spatial and reduction"),
    "fuse nothing": ([Fuse(2, ())], 0, "consecutive"),
    "reorder with a repeat": ([Reorder(2, (0, 0, 1))], 0, "not a permutation"),
    "reorder too short": ([Split(2, 0, (2,)), Reorder(2, (0, 1, 2))], 1, "not a permutation"),
    "parallel reduce iter": ([Annotate(2, 2, "parallel")], 0, "cannot parallel reduction iterator k"),
    "vectorize reduce iter": ([Annotate(2, 2, "vectorize")], 0, "cannot vectorize reduction iterator k"),
    "unknown annotation": ([Annotate(2, 0, "gpu")], 0, "unknown annotation"),
    "pragma other than auto_unroll": ([Pragma(2, 0, "unroll", 4)], 0, "auto_unroll_max_step"),
    "compute_at a non-consumer": ([ComputeAt(2, 2, 0)], 0, "can only be computed"),
    "compute_at an output": ([ComputeAt(3, 2, 0)], 0, "output"),
    "inline a reduction": ([ComputeInline(2)], 0, "reduction"),
    "inline an output": ([ComputeInline(3)], 0, "output"),
    "inline a placeholder": ([ComputeInline(0)], 0, "placeholder"),
    "cache_write after split": ([Split(2, 0, (2,)), CacheWrite(2, "local")], 1, "must come before"),
    "cache_write twice": ([CacheWrite(2, "local"), CacheWrite(3, "local")], 1, "already exists"),
    "cache_read for a non-reader": ([CacheRead(0, "shared", (3,))], 0, "every reader"),
    "rfactor a spatial iter": ([Rfactor(2, 0, 0)], 0, "not a reduction iterator"),
    "rfactor out of range": ([Rfactor(2, 2, 5)], 0, "factor_iter_id"),
    "stage index too large": ([Split(9, 0, (2,))], 0, "does not exist"),
    "iter index too large": ([Split(2, 3, (2,))], 0, "does not exist"),
    "negative stage index": ([Split(-1, 0, (2,))], 0, "negative"),
    "negative iter index": ([Annotate(2, -1, "unroll")], 0, "negative"),
    "negative target iter": ([ComputeAt(2, 3, -1)], 0, "negative"),
    "string iter index": ([Split(2, "0", (2,))], 0, "type int"),
    "bool split length": ([Split(2, 0, (True,))], 0, "list of integers"),
    "rfactor leaving an attachment dangling": (
        [CacheRead(0, "shared", (2,)), ComputeAt(1, 3, 2), Split(3, 2, (2,)), Rfactor(3, 2, 0)],
        3,
        "A.shared computed at loop C.k.1, which no longer exists",
    ),
    "cache_write with a stage at its reduce loop": (
        [CacheRead(0, "shared", (2,)), ComputeAt(1, 3, 2), CacheWrite(3, "local")],
        2,
        "reduction loop",
    ),
}


@pytest.mark.parametrize("case", sorted(ILLEGAL))
def test_illegal_step_raises_illegal_step_naming_index_and_reason(case):
    steps, index, words = ILLEGAL[case]
    with pytest.raises(IllegalStep) as err:
        apply_steps(matmul_relu_dag(), steps)
    assert err.value.index == index
    assert str(err.value).startswith(f"step {index} {steps[index]}:")
    assert words in err.value.why


def test_illegal_compute_at_and_inline_around_an_inlined_stage():
    dag = softmax_dag()
    with pytest.raises(
        IllegalStep, match="^step 0 .*neither softmax_sum nor a stage computed inside it reads softmax_max"
    ):
        apply_steps(dag, [ComputeAt(1, 3, 0)])  # softmax_sum reads softmax_exp, not softmax_max
    # softmax_exp inlined: softmax_max's only consumer is now softmax, so softmax_exp's loops enclose no reader
    with pytest.raises(IllegalStep, match="^step 1 .*can only be computed at a loop that encloses a consumer"):
        apply_steps(dag, [ComputeInline(2), ComputeAt(1, 2, 0)])
    with pytest.raises(IllegalStep, match="^step 1 .*other stages are computed inside softmax_exp"):
        apply_steps(dag, [ComputeAt(1, 2, 0), ComputeInline(2)])


def test_illegal_step_index_counts_steps_of_the_starting_state():
    dag = matmul_relu_dag()
    state = apply_steps(dag, [Split(2, 0, (2,)), Split(2, 0, (2,))])
    with pytest.raises(IllegalStep) as err:
        apply_steps(dag, [Fuse(2, (0, 1)), Fuse(2, (0, 3))], state)
    assert err.value.index == 3


@pytest.mark.parametrize(
    "rec",
    [
        ["XX", 1],
        [],
        None,
        "SP",
        5,
        [["SP"]],
        ["SP", 2, 0],
        ["SP", 2, 0, [2], True, 1],
        ["SP", 2, "0", [2], True],
        ["CHW", 2, 5],
        ["AN", 2, -1, "unroll"],
    ],
    ids=repr,
)
def test_bad_records_raise_illegal_step(rec):
    with pytest.raises(IllegalStep) as err:
        step_from_record(rec)
    assert err.value.index is None  # a record alone has no position; apply_steps adds it on replay
    assert err.value.why


def test_unknown_tag_message_lists_the_known_tags():
    with pytest.raises(IllegalStep, match="unknown step tag.*'CHW'.*'SP'"):
        step_from_record(["XX", 1])


def test_failed_step_leaves_the_input_state_untouched():
    dag = matmul_relu_dag()
    state = apply_steps(dag, [Split(2, 0, (4,))])
    before = print_state(state)
    with pytest.raises(IllegalStep):
        apply_steps(dag, [Fuse(2, (0, 1)), Annotate(2, 2, "parallel")], state)
    assert print_state(state) == before and len(state.steps) == 1


def test_follow_split_takes_the_source_split_lengths():
    A, B = te.placeholder((128, 64), "float32", "A"), te.placeholder((64, 32), "float32", "B")
    s = initial_state(ComputeDAG([ops.matmul(A, B)]))
    C = s.dag.outputs[0]
    s = s.cache_write(C).split(f"{C}.local", "i", [4, 2, 8])
    follow = FollowSplit(s.stage_id(C), 0, len(s.steps) - 1, 2)
    t = s.do(follow)
    assert [it.extent for it in t.stage(C).iters[:3]] == [2, 4, 16]
    # mutating the source split moves the follower on replay
    steps = list(t.steps)
    steps[-2] = Split(steps[-2].stage_id, 0, (2, 2, 8))
    u = apply_steps(t.dag, steps)
    assert [it.extent for it in u.stage(C).iters[:3]] == [4, 2, 16]
    with pytest.raises(IllegalStep, match="not an earlier Split"):
        t.do(FollowSplit(t.stage_id(C), 0, 0, 1))


def test_stage_lookups_by_name_and_attach_point_follow_each_state():
    # State keeps its stages by name and by attach point once asked (lowering asks tens of times per program):
    # every state answers for its own stages, and an unknown name is a KeyError naming it
    state = apply_steps(matmul_dag(), TILED_MATMUL)
    loop = state.stage("C").iters[0].name
    assert [s.name for s in state.attached_at("C", loop)] == ["C.local"]
    assert state.attached_at("C", "no-such-loop") == []
    assert state.stage_id("C.local") == 2 and state.stage("C").name == "C"
    with pytest.raises(KeyError, match="nothing"):
        state.stage_id("nothing")
    rooted = apply_steps(state.dag, [*TILED_MATMUL, ComputeRoot(2)])
    assert rooted.attached_at("C", loop) == [] and state.attached_at("C", loop)
    # a state built from another (with_stage) answers from its own stages; a name held twice gives the first
    swapped = state.with_stage(2, state.stage("A"))
    assert swapped.stage_id("A") == 0 and state.stage_id("C.local") == 2
    with pytest.raises(KeyError):
        swapped.stage_id("C.local")


def test_derive_is_remembered_per_relations_order_and_extents():
    """derive() memoizes by the stage's op's loops, relations, loop order and annotations, and the root extents:
    asked again it returns the same result; other extents (a region bound inference shrank) replay anew."""
    from dataclasses import replace

    from compiler.schedule.state import Stage, derive

    stage = apply_steps(matmul_dag(), TILED_MATMUL).stages[2]  # C.local: splits, a reorder, a vectorized loop
    full = derive(stage)
    assert derive(stage) is full and derive(stage, {}) is full
    part = derive(stage, {"i": 8})
    assert part is not full and part is derive(stage, {"i": 8})
    assert part.leaves[0].name == full.leaves[0].name == "i.0" and part.leaves[0].extent < full.leaves[0].extent
    unannotated = Stage(stage.op, tuple(replace(it, annotation="none") for it in stage.iters), stage.relations)
    assert derive(unannotated) is not full and all(leaf.annotation == "none" for leaf in derive(unannotated).leaves)


def test_derive_is_shared_by_replays_that_rebuild_the_op():
    """Each replay of a cache_write builds its two ops anew; the loops derived for them are remembered by the ops'
    axes, so a second replay of the same schedule (the search replays every candidate) finds them."""
    from compiler.schedule.state import derive

    a, b = apply_steps(matmul_dag(), TILED_MATMUL), apply_steps(matmul_dag(), TILED_MATMUL)
    for name in ("C.local", "C"):
        assert a.stage(name).op is not b.stage(name).op and a.stage(name).op == b.stage(name).op
        assert derive(a.stage(name)) is derive(b.stage(name))


@pytest.mark.parametrize("name", sorted(DAGS))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_steps_that_keep_loops_keep_every_loop_and_attachment(name, data):
    """apply_steps skips the attachment check after a step marked keeps_loops: such a step (Reorder, Annotate,
    Pragma) must leave every stage's loop names, where it is computed and its attach point as they were."""
    dag = DAGS[name]
    steps = data.draw(legal_steps(dag))
    state = initial_state(dag)
    for step in steps:
        after = apply_steps(dag, [step], state)
        if step.keeps_loops:
            for s, t in zip(state.stages, after.stages):
                assert sorted(it.name for it in s.iters) == sorted(it.name for it in t.iters)
                assert (s.name, s.compute_at, s.attach) == (t.name, t.compute_at, t.attach)
        state = after
    assert {cls.__name__ for cls in STEPS.values() if cls.keeps_loops} == {"Reorder", "Annotate", "Pragma"}
