"""The whole model timed during tuning (compiler.artifact.in_model): its run, and each task's calls inside it."""

from __future__ import annotations

import gc
import math

from compiler.artifact import in_model
from compiler.artifact.in_model import ModelTiming, time_in_model
from compiler.costs.records import IN_MODEL, as_tuples, read_records
from compiler.model.onnx_import import load
from compiler.targets import backend_for, host_target
from compiler.tensor.tasks import kernel_calls, plan_tasks
from tilefarm.cli import main
from tilefarm.examples import tiny_cnn


def test_every_task_of_the_plan_is_timed_inside_the_run():
    graph = load(tiny_cnn())
    tasks, calls, _ = plan_tasks(graph)
    timing = time_in_model(graph, None, threads=1, repeat=3)
    assert set(timing.per_call) == {t.key for t in tasks}
    assert timing.calls == {t.key: sum(c.task.key == t.key for c in kernel_calls(calls)) for t in tasks}
    assert timing.run_s > 0 and all(s > 0 for s in timing.per_call.values())
    assert abs(timing.overhead_s) < timing.run_s
    # and the program each task's calls ran (untuned: its default schedule), as a record would hold it
    host = host_target()
    assert timing.programs == {
        t.key: as_tuples([s.record() for s in backend_for(host).default_schedule(t.dag, host).steps]) for t in tasks
    }


def test_a_timing_of_rounds_keeps_the_fastest_and_collects_no_garbage_meanwhile(monkeypatch):
    # interference from other processes only adds time: of rounds a moment apart the fastest is the quiet host's run
    runs = iter([5.5e-3, 3.7e-3, 3.9e-3])
    collecting = []
    real_round = in_model._time_round

    def one_round(art, feeds, repeat):
        timing = real_round(art, feeds, repeat)
        collecting.append(gc.isenabled())
        return ModelTiming(next(runs), timing.per_call, timing.calls)

    monkeypatch.setattr(in_model, "_time_round", one_round)
    monkeypatch.setattr(in_model, "ROUND_GAP_S", 0.0)
    timing = time_in_model(load(tiny_cnn()), None, threads=1, repeat=2, rounds=3)
    assert timing.run_s == 3.7e-3 and collecting == [True, True, True]  # collection back on after each round

    seen = []
    monkeypatch.setattr(in_model, "_time_round", real_round)
    monkeypatch.setattr(in_model, "_sample", lambda run: seen.append(gc.isenabled()) or 1e-3)
    time_in_model(load(tiny_cnn()), None, threads=1, repeat=2)
    assert seen and not any(seen) and gc.isenabled()  # held off while the run was timed, on again after


def test_tune_times_the_compiled_model_and_its_estimate_follows_the_run(tmp_path, capsys):
    model, records = tmp_path / "m.onnx", tmp_path / "r.jsonl"
    assert main(["example", "tiny_cnn", "-o", str(model)]) == 0
    tune = ["tune", str(model), "--records", str(records), "--per-round", "2", "--population", "16", "--threads", "1"]
    assert main([*tune, "--trials", "12", "--retime-best", "0"]) == 0
    out = capsys.readouterr().out
    timed = [line for line in out.splitlines() if line.startswith("the compiled model timed after 12 trials: run ")]
    assert len(timed) == 1 and "model_timing" in out and "; untuned " in timed[0]
    # the final check judged each task's tuned program and default schedule in the run: in-model records
    judged = [r for r in read_records(records) if r.cache == IN_MODEL]
    assert judged and {r.workload_key for r in judged} == {t.key for t in plan_tasks(load(tiny_cnn()))[0]}
    estimate = float(out.split("estimated end-to-end latency: ")[1].split(" ms")[0])
    run = float(timed[0].split("run ")[1].split(" ms")[0])
    assert math.isclose(estimate, run, rel_tol=0.05)  # calibrated on that very timing
    assert main([*tune, "--trials", "2", "--resume", "--no-model-timing"]) == 0
    assert "model timed" not in capsys.readouterr().out
