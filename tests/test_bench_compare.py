"""bench.compare: artifacts of one model timed side by side with onnxruntime, outputs checked first."""

from __future__ import annotations

import pytest

from bench.compare import main, time_once
from compiler.artifact.build import compile_model
from tilefarm.examples import EXAMPLES


def test_two_artifacts_are_timed_next_to_onnxruntime_and_checked(tmp_path):
    path = tmp_path / "tiny.tar"
    compile_model(EXAMPLES["tiny_cnn"](seed=0), path, {"input": [1, 3, 32, 32]})
    result = time_once("tiny_cnn", {"a": str(path), "b": str(path)}, threads=1, repeat=2)
    assert set(result["medians_s"]) == {"a", "b", "onnxruntime"}
    assert all(s > 0 for s in result["medians_s"].values())
    assert all(d < 1e-4 for d in result["max_rel_diff"].values())


def test_an_artifact_without_a_label_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["tiny_cnn", "just-a-path.tar"])
    assert "must be label=path.tar" in capsys.readouterr().err
