"""bench.models: which models a run takes, and the --tuned path end to end on the tiny CNN."""

from __future__ import annotations

import json

from bench.models import MODELS, main, records_path, selected

KEYS = {"model", "system", "threads", "trials", "tuning_s", "median_ms", "estimate_ms"}


def test_only_selects_by_substring_or_any_example_by_name():
    assert "bert" in MODELS
    assert selected(None) == MODELS
    assert selected("net") == ["resnet18", "mobilenetv2"]
    assert selected("tiny_cnn") == ["tiny_cnn"]  # an example outside MODELS, by its exact name
    assert selected("tiny") == []


def test_tuned_run_times_three_systems_against_the_estimate(tmp_path, capsys):
    rows_file = tmp_path / "rows.json"
    # 128 trials give each of tiny_cnn's 5 tasks its first round (64 + 4 x 16), so every task has a best and the
    # estimate is finite; a population of 64 keeps the search short
    main(["--tuned", "--only", "tiny_cnn", "--trials", "128", "--population", "64", "--threads", "1",
          "--repeat", "3", "--records-dir", str(tmp_path), "--json", str(rows_file)])  # fmt: skip
    rows = json.loads(rows_file.read_text())
    assert [r["system"] for r in rows] == ["onnxruntime", "tilefarm-untuned", "tilefarm-tuned"]
    for r in rows:
        assert KEYS <= set(r), r
        assert r["model"] == "tiny_cnn" and r["threads"] == 1
        assert 0 < r["median_ms"] < 100
    ort, untuned, tuned = rows
    for r in (ort, untuned):
        assert r["trials"] is r["tuning_s"] is r["estimate_ms"] is None
    assert tuned["trials"] == 128 and tuned["tuning_s"] > 0
    assert 0 < tuned["estimate_ms"] < 100
    assert untuned["max_rel_diff"] < 1e-4 and tuned["max_rel_diff"] < 1e-4
    assert records_path(tmp_path, "tiny_cnn", 1).stat().st_size > 0
    printed = capsys.readouterr().out
    assert "ort/untuned" in printed and "ort/tuned" in printed and "estimate" in printed
