"""bench.int8_models: the --tuned path end to end on the tiny CNN, and the agreement it reports."""

from __future__ import annotations

import json

import numpy as np

from bench.int8_models import agreement, int8_records_path, main

KEYS = {"model", "system", "threads", "trials", "tuning_s", "median_ms", "estimate_ms"}


def test_agreement_in_output_steps_or_relative():
    ref = {"y": np.array([0.0, 0.5, -1.0], np.float32)}
    ours = {"y": np.array([0.0, 0.75, -1.0], np.float32)}
    assert agreement(ours, ref, 0.25) == {"max_steps": 1.0, "equal": 0, "outputs": 1}
    assert agreement(ours, ref, None) == {"max_rel_diff": 0.25, "equal": 0, "outputs": 1}
    assert agreement(ref, ref, 0.25)["equal"] == 1


def test_tuned_run_times_four_systems_with_int8_outputs_equal(tmp_path, capsys):
    rows_file = tmp_path / "rows.json"
    # 32 trials (the conv's and the matmul's first rounds) and a population of 32 keep the search short
    main(["--tuned", "--only", "tiny_cnn", "--trials", "32", "--population", "32", "--threads", "1",
          "--repeat", "3", "--calibration", "2", "--records-dir", str(tmp_path), "--json", str(rows_file)])  # fmt: skip
    rows = {r["system"]: r for r in json.loads(rows_file.read_text())}
    assert set(rows) == {"onnxruntime-int8", "tilefarm-int8-untuned", "tilefarm-int8-tuned", "tilefarm-fp32-untuned"}
    for r in rows.values():
        assert KEYS <= set(r), r
        assert r["model"] == "tiny_cnn" and r["threads"] == 1
        assert 0 < r["median_ms"] < 100
    tuned = rows["tilefarm-int8-tuned"]
    assert tuned["trials"] == 32 and tuned["tuning_s"] > 0
    assert rows["tilefarm-int8-untuned"]["trials"] is None
    # the tiny CNN's softmax runs in float between its Q and DQ (not folded): within one output step
    for system in ("tilefarm-int8-untuned", "tilefarm-int8-tuned"):
        assert rows[system]["max_steps"] <= 1 and rows[system]["outputs"] == 1
    assert int8_records_path(tmp_path, "tiny_cnn", 1).stat().st_size > 0
    assert (tmp_path / "int8-tiny_cnn.onnx").exists()
    printed = capsys.readouterr().out
    assert "ort-int8/int8-tuned" in printed and "tilefarm-fp32-untuned/int8-tuned" in printed
    assert "int8 tuned vs untuned outputs: bit for bit equal" in printed
