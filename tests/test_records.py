"""Tuning records: the JSON-lines database, and compiling with records (best per task, fallback otherwise)."""

from __future__ import annotations

import json
import tarfile
from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact.build import build, schedule_tasks
from compiler.artifact.runtime import Artifact
from compiler.costs.records import (
    COLD_WEIGHTS,
    FLUSHED,
    WARM,
    JSONLinesDatabase,
    RecordError,
    TuningRecord,
    cache_preference,
    read_records,
    target_name,
)
from compiler.model.onnx_import import load
from compiler.targets import host_target
from compiler.tensor.tasks import constant_bytes, plan_tasks


def rec(key="w1", host="h1", steps=(("SP", 0, 0, (4,), True),), costs=(1.0,), target="llvm -mcpu=x", error=None):
    return TuningRecord(key, target, host, steps, costs, error)


def test_commit_is_idempotent_and_persists(tmp_path):
    path = tmp_path / "r.jsonl"
    db = JSONLinesDatabase(path)
    assert db.commit(rec()) and not db.commit(rec(costs=(2.0,)))  # same workload, host and steps: one record
    assert db.commit(rec(host="h2"))
    assert len(path.read_text().splitlines()) == 2
    again = JSONLinesDatabase(path)
    assert len(again) == 2 and list(again)[0] == list(db)[0]
    assert again.import_records(db) == 0  # importing what is there adds nothing


def test_a_record_measured_again_keeps_both_measurements(tmp_path):
    """Database.remeasured (a new best confirmed by a second timing): the stored record takes the second timing, or
    the second run's error; the file appends the whole record again and reads back with the later line, in the
    first one's place, everywhere a records file is read (open, import, export)."""
    path = tmp_path / "r.jsonl"
    db = JSONLinesDatabase(path)
    slow, racy = rec(steps=(("SP", 0, 0, (2,), True),), costs=(3.0,)), rec(costs=(1.0,))
    assert db.commit(slow) and db.commit(racy) and db.commit(rec(host="h2", costs=(0.5,)))
    assert not db.remeasured(rec(host="h9"))  # nothing stored with that identity
    assert db.remeasured(replace(slow, costs=(5.0,), timestamp=slow.timestamp + 9))
    assert db.remeasured(replace(racy, costs=(), error="wrong_answer", error_message="differs"))
    assert len(path.read_text().splitlines()) == 5 and len(db) == 3
    for records in (list(db), list(JSONLinesDatabase(path)), list(read_records(path))):
        assert [r.costs for r in records] == [(3.0, 5.0), (1.0,), (0.5,)]
        assert records[0].mean_cost == 4.0 and records[0].timestamp == slow.timestamp
        assert records[1].error == "wrong_answer" and records[1].error_message == "differs" and not records[1].ok
    assert JSONLinesDatabase(path).best("w1", "llvm -mcpu=x", "h1") == [list(db)[0]]
    other = JSONLinesDatabase(tmp_path / "other.jsonl")
    assert other.import_records(read_records(path)) == 3 and list(other) == list(db)
    assert db.export(tmp_path / "all.jsonl") == 3 and list(read_records(tmp_path / "all.jsonl")) == list(db)


def test_best_filters_by_target_host_and_errors(tmp_path):
    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    db.commit(rec(steps=(("SP", 0, 0, (2,), True),), costs=(3.0, 3.0)))
    db.commit(rec(steps=(("SP", 0, 0, (4,), True),), costs=(1.0, 2.0)))
    db.commit(rec(steps=(("SP", 0, 0, (8,), True),), costs=(), error="run"))
    db.commit(rec(steps=(("SP", 0, 0, (16,), True),), costs=(0.1,), target="llvm -mcpu=other"))
    best = db.best("w1", "llvm -mcpu=x", k=5)
    assert [r.mean_cost for r in best] == [1.5, 3.0]
    assert db.best("w1", "llvm -mcpu=x", host="nope") == []


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(rec().to_json() + "\n{not json\n")
    with pytest.raises(RecordError, match=r"r.jsonl:2"):
        JSONLinesDatabase(path)


def dense_model():
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b"),
    ]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    g = helper.make_graph(
        nodes,
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m, inits


def test_compile_applies_the_best_record_and_lists_it(tmp_path):
    model, inits = dense_model()
    graph = load(model)
    (task,), _, _ = plan_tasks(graph)
    host = host_target()
    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    # a naive schedule (no steps) measured fast, and a record whose steps no longer replay, measured faster
    db.commit(TuningRecord(task.key, target_name(host), host.fingerprint(), (), (2e-6,)))
    db.commit(TuningRecord(task.key, target_name(host), host.fingerprint(), (("SP", 99, 0, (4,), True),), (1e-6,)))
    info = build(graph, tmp_path / "m.tar", name="m", records=db)
    assert list(info.records_used) == [task.key]
    with tarfile.open(tmp_path / "m.tar") as tar:
        meta = json.load(tar.extractfile("meta.json"))
    assert meta["records"][0]["mean_seconds"] == pytest.approx(2e-6) and meta["tasks"][0]["record"]
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    want = x @ numpy_helper.to_array(inits[0]) + numpy_helper.to_array(inits[1])
    np.testing.assert_allclose(Artifact.load(tmp_path / "m.tar").run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    # without records: the default schedule, and nothing listed
    info = build(graph, tmp_path / "d.tar", name="d")
    assert info.records_used == {}


def test_compile_takes_records_of_the_cache_condition_the_model_runs_in(tmp_path):
    from dataclasses import replace

    model, _ = dense_model()
    (task,), calls, _ = plan_tasks(load(model))
    host = host_target()
    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    warm = TuningRecord(task.key, target_name(host), host.fingerprint(), (), (1e-6,))
    assert db.commit(warm) and db.commit(replace(warm, costs=(5e-6,), cache=COLD_WEIGHTS))  # one schedule, timed twice
    # the dense model's 0.5 KB of weights stay in cache; with a last-level cache of 1 byte they would arrive cold
    assert cache_preference(constant_bytes(calls), host) == (WARM, COLD_WEIGHTS, FLUSHED)
    assert cache_preference(constant_bytes(calls), replace(host, l3_bytes=1)) == (COLD_WEIGHTS, WARM, FLUSHED)
    for prefer, seconds in [((WARM, COLD_WEIGHTS), 1e-6), ((COLD_WEIGHTS, WARM), 5e-6), ((FLUSHED, WARM), 1e-6)]:
        _, used = schedule_tasks([task], db, host, prefer)
        assert used[task.key]["mean_seconds"] == seconds, prefer  # the first condition with a record, never mixed
        assert used[task.key]["cache"] == (COLD_WEIGHTS if seconds == 5e-6 else WARM)


def test_a_record_says_how_it_was_timed(tmp_path):
    r = rec()
    assert r.cache == WARM and TuningRecord.from_json(r.to_json()) == r
    line = json.loads(r.to_json())
    del line["cache"]  # written before records carried it: timed warm
    assert TuningRecord.from_json(json.dumps(line)).cache == WARM
    with pytest.raises(RecordError, match="unknown cache condition 'lukewarm'"):
        TuningRecord.from_json(json.dumps({**line, "cache": "lukewarm"}))


def test_export_and_import_round_trip(tmp_path):
    db = JSONLinesDatabase(tmp_path / "a.jsonl")
    for cost, steps in ((2e-3, (("CI", 1),)), (1e-3, (("CR", 1),)), (5e-3, (("CI", 2),))):
        db.commit(TuningRecord("wk", "llvm", "h1", steps, (cost,)))
    db.commit(TuningRecord("wk", "llvm", "h1", (("CI", 3),), (), error="run", error_message="SIGSEGV"))
    assert db.export(tmp_path / "all.jsonl") == 4
    assert db.export(tmp_path / "best.jsonl", best_only=True) == 1
    [best] = list(read_records(tmp_path / "best.jsonl"))
    assert best.costs == (1e-3,)
    other = JSONLinesDatabase(tmp_path / "b.jsonl")
    assert other.import_records(read_records(tmp_path / "all.jsonl")) == 4
    assert other.import_records(read_records(tmp_path / "all.jsonl")) == 0  # importing twice adds nothing
    assert [r.error for r in other] == [None, None, None, "run"]
