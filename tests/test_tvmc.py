"""tvmc's command lines and Python driver API as TVM's tutorials type them, `tvmc` replaced by `tilefarm`
(docs/tvmc.md): the outputs match onnxruntime, and a tuned package lists the records it was compiled with."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tarfile

import numpy as np
import onnxruntime as ort
import pytest

from compiler.costs.records import read_records
from tilefarm import examples
from tilefarm.cli import main

# the tvmc tutorial's sequence (its ResNet-50 input is `data`, the example ResNet-18's is `input`); the budget is small
# for CI: the first tasks are measured, the rest keep their default schedules
TUTORIAL = """
tvmc compile --target "llvm" --input-shapes "input:[1,3,224,224]" --output resnet18-tvm.tar resnet18.onnx
tvmc run --inputs imagenet_cat.npz --output predictions.npz resnet18-tvm.tar
tvmc tune --target "llvm" --trials 16 --output resnet18-records.json resnet18.onnx
tvmc compile --target "llvm" --tuning-records resnet18-records.json --output resnet18-tuned.tar resnet18.onnx
tvmc run --inputs imagenet_cat.npz --output predictions.npz --print-time --repeat 100 resnet18-tuned.tar
"""

# TVM's "Getting Starting using TVMC Python" tutorial, its steps in order (the tune with a small budget for CI, as its
# "tuning a more complex model" step passes trials=)
SCRIPT = """\
from tvm.driver import tvmc

model = tvmc.load('my_model.onnx', shape_dict={'input': [1, 3, 32, 32]})  # Step 1: Load + shape_dict
model.summary()

log_file = "hello.json"
tvmc.tune(model, target="llvm", enable_autoscheduler=True, tuning_records=log_file, trials=16)

package = tvmc.compile(model, target="llvm", tuning_records=log_file, package_path="whatever")  # Step 2: Compile
result = tvmc.run(package, device="cpu")  # Step 3: Run
print(result)
result.save("predictions.npz")

new_package = tvmc.TVMCPackage(package_path="whatever")
result = tvmc.run(new_package)
"""


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """Within 1e-3 of the output's scale (Winograd convs round a little differently from onnxruntime's)."""
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-3 * np.max(np.abs(want)), np.max(np.abs(got - want))


def _meta(path) -> dict:
    with tarfile.open(path) as tar:
        return json.load(tar.extractfile("meta.json"))


def test_the_tvmc_tutorial_command_sequence(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    model = examples.save("resnet18", "resnet18.onnx")
    x = np.random.default_rng(7).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.savez("imagenet_cat.npz", input=x)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"input": x})[0]
    outs = {}
    for line in TUTORIAL.strip().splitlines():
        argv = shlex.split(line)
        assert argv[0] == "tvmc"
        assert main(argv[1:]) == 0, line
        outs[line] = capsys.readouterr().out
        if argv[1] == "run":  # tvmc's scripts read output_0; the model's own name is there too
            with np.load("predictions.npz") as got:
                _close(got["output_0"], want)
                np.testing.assert_array_equal(got["output_0"], got["output"])
    compile_, _, tune, tuned, timed = outs.values()
    assert "generate code and link:" in compile_ and "(0 from records)" in compile_  # the phases, as each ends
    # a budget too small to measure every task once is said first; the end says why there is no estimate
    assert "note: 16 trials do not give every task its first round" in tune and "round 1: " in tune
    assert "no end-to-end estimate: " in tune and "--resume --trials" in tune
    records = [json.loads(r) for r in open("resnet18-records.json")]  # JSON lines, in a .json
    assert len(records) >= 16
    meta = _meta("resnet18-tuned.tar")
    assert meta["records"] and sum(t["record"] for t in meta["tasks"]) == len(meta["records"])
    assert f"({len(meta['records'])} from records)" in tuned
    # tvmc's summary: its header, then mean, median, max, min and std in ms
    lines = timed.splitlines()
    at = lines.index("Execution time summary:")
    assert lines[at + 1].split() == ["mean", "(ms)", "median", "(ms)", "max", "(ms)", "min", "(ms)", "std", "(ms)"]
    mean, median, high, low, std = map(float, lines[at + 2].split())
    assert 0 < low <= median <= high and low <= mean <= high and std >= 0


def test_the_tvmc_python_tutorial_with_only_its_import_changed(tmp_path):
    model = examples.save("tiny_cnn", tmp_path / "my_model.onnx")
    script = SCRIPT.replace("from tvm.driver import tvmc", "import tilefarm as tvmc")
    assert [a for a, b in zip(SCRIPT.splitlines(), script.splitlines()) if a != b] == ["from tvm.driver import tvmc"]
    (tmp_path / "tutorial.py").write_text(script)  # no `if __name__ == "__main__":`, as the tutorial has none
    done = subprocess.run([sys.executable, "tutorial.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    out = done.stdout
    assert "fused_conv_relu" in out and "input: float32[1, 3, 32, 32]" in out  # the summary
    assert "Execution time summary:" in out and "Output Names:\n ['output']" in out
    # run's inputs, not given, are filled with seeded random values: onnxruntime on the same ones
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    with np.load(tmp_path / "predictions.npz") as got:
        _close(got["output"], want[0])
    meta = _meta(tmp_path / "whatever")
    assert meta["records"] and all(r["workload_key"] for r in meta["records"])  # tuned: the records it used


def test_tune_starts_from_prior_records_and_run_refuses_a_misnamed_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    examples.save("tiny_cnn", "m.onnx")
    small = ["--per-round", "4", "--population", "16", "--retime-best", "0", "--threads", "1"]
    assert main(["tune", "--target", "llvm", "--trials", "4", *small, "--output", "prior.json", "m.onnx"]) == 0
    prior = list(read_records("prior.json"))  # a program timed again is appended again: read_records keeps the last
    assert len(prior) == 4
    argv = ["tune", "--enable-autoscheduler", "--trials", "4", "--tuning-records", "prior.json", "-o", "new.json"]
    assert main([*argv, *small, "--number", "2", "--min-repeat-ms", "10", "--timeout", "5", "m.onnx"]) == 0
    out = capsys.readouterr().out
    assert "prior records prior.json: 4 new to new.json; tuning resumes from them" in out
    assert "resumed 4 records" in out
    now = list(read_records("new.json"))
    assert now[:4] == prior and len(now) == 8  # the prior's records, then 4 new ones: none measured again
    assert main(["compile", "m.onnx", "--tuning-records", "new.json", "--output", "m.tar"]) == 0
    np.savez("x.npz", data=np.zeros((1, 3, 32, 32), np.float32))  # tvmc's ResNet-50 input name, not this model's
    with pytest.raises(SystemExit, match="x.npz holds data, not inputs of the model \\(it takes input\\)"):
        main(["run", "--inputs", "x.npz", "m.tar"])
    with pytest.raises(SystemExit, match="no such records file"):
        main(["tune", "m.onnx", "--tuning-records", "missing.json", "--output", "r.json"])
