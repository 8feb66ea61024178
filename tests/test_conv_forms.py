"""A conv's form (direct, Winograd F(4x4) or F(2x2)) chosen by measurement: the forms a conv offers, the tasks of
both, the task scheduler's objective over them, and compile taking the faster form by the records."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact.build import build, choose_forms, run_in_process
from compiler.artifact.runtime import Artifact
from compiler.costs.records import WARM, JSONLinesDatabase, TuningRecord, target_name
from compiler.model.onnx_import import load
from compiler.model.optimize import form_alternatives, optimize
from compiler.model.passes import CONV_BLOCK, DIRECT, conv_forms
from compiler.search.task_scheduler import TaskScheduler, TuneOptions
from compiler.targets import host_target
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.tensor.tasks import chosen_form, form_choices, plan_tasks, tuning_plan

B = CONV_BLOCK


def _conv(name, x, y, inits, rng, c, stride=1):
    w = (rng.standard_normal((c, c, 3, 3)) / (3 * c**0.5)).astype(np.float32)
    inits[f"{name}_w"] = w
    inits[f"{name}_b"] = (rng.standard_normal(c) / 10).astype(np.float32)
    attrs = {"pads": [1, 1, 1, 1], "strides": [stride, stride]}
    return helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], name=name, **attrs)


def two_stage_model(seed: int = 0) -> onnx.ModelProto:
    """A 3x3 conv + ReLU on a 16x16 image (16 tiles of 4x4: F(4x4) by rule, or direct), a stride-2 conv, a 3x3
    conv + ReLU on the 8x8 result (4 tiles of 4x4 but 16 of 2x2: direct by rule, or F(2x2)), a stride-2 conv."""
    rng, inits = np.random.default_rng(seed), {}
    nodes = [
        _conv("big", "x", "a", inits, rng, B),
        helper.make_node("Relu", ["a"], ["ar"], name="big_relu"),
        _conv("down", "ar", "d", inits, rng, B, stride=2),
        _conv("small", "d", "s", inits, rng, B),
        helper.make_node("Relu", ["s"], ["sr"], name="small_relu"),
        _conv("tail", "sr", "y", inits, rng, B, stride=2),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, B, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, B, 4, 4])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ops(g) -> dict[str, str]:
    return {n.name: n.op for n in g.nodes if "Conv" in n.op}


def test_each_3x3_stride_1_conv_offers_the_rule_form_and_one_other():
    graph = load(two_stage_model())
    convs = {n.name: conv_forms(n) for n in graph.nodes if n.op == "Conv"}
    assert convs == {"big": (4, DIRECT), "small": (DIRECT, 2), "down": (), "tail": ()}
    assert form_alternatives(graph) == {"big": (4, DIRECT), "small": (DIRECT, 2)}
    assert form_alternatives(graph, ("winograd_convs",)) == {}
    direct = {"down": "BlockedConv", "tail": "BlockedConv"}
    assert _ops(optimize(graph)) == {"big": "WinogradConv", "small": "BlockedConv", **direct}
    # forms by node name; a form the conv does not offer (F(2x2) for the 16x16 one, anything for the strided) is
    # ignored
    swapped = optimize(graph, forms={"big": DIRECT, "small": 2, "down": 4})
    assert _ops(swapped) == {"big": "BlockedConv", "small": "WinogradConv", **direct}
    assert _ops(optimize(graph, forms={"big": 2})) == _ops(optimize(graph))
    f2 = next(n for n in swapped.nodes if n.name == "small")
    assert f2.inputs[1].shape[:2] == (4, 4)  # the weight transformed for 4x4 input tiles: F(2x2, 3x3)


def test_a_conv_whose_form_would_move_its_neighbours_offers_no_choice():
    # at the model's output a WinogradConv's blocked result needs a conversion, and its ReLU would go with that
    model = two_stage_model()
    del model.graph.node[-1]
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("sr", TensorProto.FLOAT, [1, B, 8, 8]))
    graph = load(model)
    tasks, calls, _ = plan_tasks(graph)
    assert "small" in form_alternatives(graph)
    assert [c.node for c in form_choices(graph, tasks, calls)[1]] == ["big"]


def test_a_conv_whose_name_is_not_unique_keeps_the_rule():
    model = two_stage_model()
    for n in model.graph.node:
        if n.name == "small":
            n.name = "big"
    graph = load(model)
    assert form_alternatives(graph) == {}


def test_form_choices_name_both_tasks_and_the_plan_calls_the_others_zero_times():
    graph = load(two_stage_model())
    tasks, calls, _ = plan_tasks(graph)
    extra, choices = form_choices(graph, tasks, calls)
    assert [(c.node, c.forms) for c in choices] == [("big", (4, DIRECT)), ("small", (DIRECT, 2))]
    keys = {t.key for t in tasks}
    for c in choices:
        assert c.tasks[0].key in keys and c.tasks[1].key not in keys
    assert [t.weight for t in extra] == [0, 0] and {t.key for t in extra} == {c.tasks[1].key for c in choices}
    assert [t.name for t in extra] == ["fused_blockedconv_relu", "fused_winogradconv_relu"]
    # every call names the nodes it computes
    assert any(c.nodes == ("big", "big_relu") for c in calls)


def test_tuning_plan_lists_the_plans_tasks_then_the_other_forms():
    graph = load(two_stage_model())
    tasks, calls, _ = plan_tasks(graph)
    extra, choices = form_choices(graph, tasks, calls)
    plan = tuning_plan(graph)
    assert [t.key for t in plan.all_tasks] == [t.key for t in [*tasks, *extra]] and len(plan.calls) == len(calls)
    assert [c.node for c in plan.choices] == [c.node for c in choices]
    rule = tuning_plan(graph, conv_forms="rule")
    assert rule.other_forms == [] and rule.choices == [] and [t.key for t in rule.all_tasks] == [t.key for t in tasks]
    assert tuning_plan(graph, ("winograd_convs",)).choices == []
    with pytest.raises(ValueError, match="conv_forms: expected one of measure, rule"):
        tuning_plan(graph, conv_forms="fastest")


def _scheduler(tmp_path):
    graph = load(two_stage_model())
    tasks, calls, _ = plan_tasks(graph)
    extra, choices = form_choices(graph, tasks, calls)
    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    sched = TaskScheduler([*tasks, *extra], db, TuneOptions(trials=1), choices=choices)
    index = {p.task.key: i for i, p in enumerate(sched.progress)}
    return sched, [tuple(index[t.key] for t in c.tasks) for c in choices]


def test_the_objective_counts_a_conv_once_at_its_faster_form(tmp_path):
    sched, (big, small) = _scheduler(tmp_path)
    try:
        others = [i for i in range(len(sched.progress)) if i not in {*big, *small}]
        for i, p in enumerate(sched.progress):
            p.best, p.rounds, p.history = 1e-3 * (i + 1), 1, [1e-3 * (i + 1)]
        rest = sum(sched.progress[i].task.weight * sched.progress[i].best for i in others)
        want = rest + min(sched.progress[j].best for j in big) + min(sched.progress[j].best for j in small)
        assert math.isclose(sched.estimated_latency, want)
        for forms in (big, small):
            fast, slow = sorted(forms, key=lambda j: sched.progress[j].best)
            assert (sched.calls(fast), sched.calls(slow)) == (1, 0)
        # a form far slower than the other, whose next round cannot be expected to undercut it, lowers nothing
        rule, other = big
        sched.progress[rule].best, sched.progress[other].best = 1e-3, 1.0
        sched.progress[other].rounds, sched.progress[other].history = 5, [1.0] * 5
        assert sched._gradient(other) == 0.0 and sched._gradient(rule) < 0
        assert sched.calls(rule) == 1 and sched.calls(other) == 0
        # a round that leaves the other form within FORM_MARGIN of the rule's changes what compile takes in nothing
        sched.progress[rule].best, sched.progress[other].best = 1e-3, 0.99e-3
        sched.progress[other].rounds, sched.progress[other].history = 1000, [0.99e-3] * 5
        step = sched._step(sched.progress[other])
        assert -0.01e-3 < step < 0 and sched._gradient(other) == 0.0
        # one that takes it past the margin lowers the conv's cost from the rule's to its own
        sched.progress[other].rounds = 2
        step = sched._step(sched.progress[other])
        assert 0.99e-3 + step < 0.97e-3 and math.isclose(sched._gradient(other), 0.99e-3 + step - 1e-3)
        # one without a valid program yet leaves the conv to the other form
        sched.progress[other].best = math.inf
        assert math.isfinite(sched.estimated_latency)
    finally:
        sched.close()


def _record(task, cost: float) -> TuningRecord:
    here = host_target()
    steps = tuple(s.record() for s in default_schedule(task.dag).steps)
    return TuningRecord(task.key, target_name(here), here.fingerprint(), steps, (cost,), cache=WARM)


def test_compile_takes_the_form_whose_record_is_faster_and_computes_the_model(tmp_path):
    # the two departures between them compile every form: F(4x4) and F(2x2), and both convs direct
    model = two_stage_model(2)
    graph = load(model)
    tasks, calls, _ = plan_tasks(graph)
    _, choices = form_choices(graph, tasks, calls)
    big, small = choices
    x = np.random.default_rng(2).standard_normal((1, B, 16, 16)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    here = host_target()
    cases = [
        # (rule form's cost, other form's cost) per conv -> the forms compile departs to
        ([(1e-3, 2e-3), (1e-3, 5e-4)], {"small": 2}),
        ([(2e-3, 1e-3), (5e-4, 1e-3)], {"big": DIRECT}),
        ([(1e-3, None), (None, 1e-4)], {}),  # a form without a record: the rule
    ]
    for k, (costs, forms) in enumerate(cases):
        db = JSONLinesDatabase(tmp_path / f"r{k}.jsonl")
        for c, pair in zip((big, small), costs):
            for t, cost in zip(c.tasks, pair):
                if cost is not None:
                    db.commit(_record(t, cost))
        assert choose_forms(graph, tasks, calls, db, here) == forms
        info = build(graph, tmp_path / f"m{k}.tar", name="m", records=db)
        meta = Artifact.load(tmp_path / f"m{k}.tar").meta
        assert info.forms == forms and meta["conv_forms"] == forms
        art = Artifact.load(tmp_path / f"m{k}.tar")
        assert np.max(np.abs(art.run({"x": x})["y"] - want)) / np.max(np.abs(want)) < 1e-5
        assert np.allclose(run_in_process(graph, {"x": x}, db)["y"], art.run({"x": x})["y"], rtol=1e-6, atol=1e-6)
        # where both forms were timed, the chosen plan's conv tasks found their records
        assert k == 2 or all(t["record"] for t in meta["tasks"] if t["name"].endswith("conv_relu"))


def test_a_tie_between_forms_keeps_the_rules(tmp_path):
    graph = load(two_stage_model(2))
    tasks, calls, _ = plan_tasks(graph)
    big, small = form_choices(graph, tasks, calls)[1]
    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    # the other form 1% faster for one conv, 5% for the other: only the second is past FORM_MARGIN
    for c, (rule, other) in zip((big, small), [(1e-3, 0.99e-3), (1e-3, 0.95e-3)]):
        db.commit(_record(c.tasks[0], rule))
        db.commit(_record(c.tasks[1], other))
    assert choose_forms(graph, tasks, calls, db, host_target()) == {"small": 2}
    assert [chosen_form(c) for c in ([1.0, 0.98], [1.0, 0.9], [math.inf, 1.0], [1.0, math.inf], [math.inf] * 2)] == [
        0, 1, 1, 0, 0
    ]  # fmt: skip


def test_tilefarm_tune_measures_both_forms_and_compile_uses_them(tmp_path, capsys):
    from compiler.costs.records import read_records
    from tilefarm.cli import main

    path, records = tmp_path / "m.onnx", tmp_path / "r.jsonl"
    onnx.save(two_stage_model(3), path)
    graph = load(onnx.load(path))
    tasks, calls, _ = plan_tasks(graph)
    extra, _ = form_choices(graph, tasks, calls)
    tune = ["tune", str(path), "--records", str(records), "--per-round", "2", "--population", "16", "--threads", "1"]
    # every task's first round is 2 programs: the model's 4 tasks, then the 2 convs' other forms
    assert main([*tune, "--trials", "12", "--retime-best", "0"]) == 0
    out = capsys.readouterr().out
    assert "2 convs can be compiled in another form: 2 more tasks" in out
    tuned = {r.workload_key for r in read_records(records)}
    assert tuned == {t.key for t in [*tasks, *extra]}
    assert main(["compile", str(path), "-o", str(tmp_path / "m.tar"), "--records", str(records)]) == 0
    meta = Artifact.load(tmp_path / "m.tar").meta
    assert set(meta["conv_forms"]) <= {"big", "small"}
    assert ("in another form than the rule's" in capsys.readouterr().out) == bool(meta["conv_forms"])
    # --conv-forms rule tunes the model's own tasks only
    records.unlink()
    assert main([*tune, "--trials", "8", "--retime-best", "0", "--conv-forms", "rule"]) == 0
    assert "another form" not in capsys.readouterr().out
    assert {r.workload_key for r in read_records(records)} == {t.key for t in tasks}
