"""bench.profile: a compiled model's kernel calls beside onnxruntime's per-node profile of the same model."""

from __future__ import annotations

import json

from onnx import TensorProto, helper

from bench.profile import main, match_ort, profile_model


def test_every_call_is_timed_and_every_onnxruntime_node_finds_its_call(tmp_path, capsys):
    prof = profile_model("tiny_cnn", None, threads=1, repeat=3)
    calls = prof["calls"]
    assert calls and all(c["hot_s"] > 0 and c["in_run_s"] > 0 and c["tuned_s"] is None for c in calls)
    assert prof["max_rel_diff"] < 1e-4 and prof["run_s"] > 0 and prof["ort_run_s"] > 0
    # onnxruntime fuses Conv + BatchNormalization + Relu under one name: the conv's call gets its time; only its
    # own layout reorders, which the model never had, stay unmatched
    assert sum(c["ort_s"] for c in calls) > 0 and set(prof["ort_unmatched"]) <= {"ReorderInput", "ReorderOutput"}
    assert all(c["bytes"] > 0 and c["flops"] >= 0 for c in calls)
    out = tmp_path / "p.json"
    main(["tiny_cnn", "--repeat", "2", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "tiny_cnn at 1 thread(s)" in printed and "by kind" in printed
    assert json.loads(out.read_text())["model"] == "tiny_cnn"


def test_a_node_folded_away_is_matched_through_the_tensors_downstream_of_it():
    # our plan's call computes conv + add (the BatchNormalization folded into the conv); onnxruntime named its fused
    # node after the BatchNormalization, and ran a node (a reorder) the model never had
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="bn"),
        helper.make_node("Add", ["bn", "x"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], [])
    calls = [{"nodes": ["conv", "add"], "writes": ["y_nchwc"]}]
    per_call, unmatched = match_ort(helper.make_model(graph), calls, {"bn": 2.0, "ReorderOutput": 1.0, "conv": 0.5})
    assert per_call == [2.5] and unmatched == {"ReorderOutput": 1.0}
