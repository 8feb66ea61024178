"""The `tilefarm` command: kernel builds, checks and times; errors are messages, not tracebacks."""

from __future__ import annotations

import ctypes
import json
import re

import numpy as np
import pytest

from compiler.costs.records import read_records
from tilefarm.cli import main


def test_kernel_hand_gemm_saves_steps_and_library(tmp_path, capsys):
    steps, lib = tmp_path / "s.json", tmp_path / "gemm.so"
    assert (
        main(
            [
                "kernel",
                "gemm",
                "--shape",
                "64,96,32",
                "--repeat",
                "2",
                "--save-steps",
                str(steps),
                "--emit-lib",
                str(lib),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "C.local" in out and "GFLOP/s" in out and "max rel error" in out
    records = json.loads(steps.read_text())
    assert records[0][0] == "CHW"
    # the emitted library runs the same kernel from plain ctypes
    so = ctypes.CDLL(str(lib))
    a, b = np.random.rand(64, 32).astype(np.float32), np.random.rand(32, 96).astype(np.float32)
    c = np.zeros((64, 96), np.float32)
    so.gemm(*(x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, c)))
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    # and the saved steps replay through --schedule
    assert main(["kernel", "gemm", "--shape", "64,96,32", "--repeat", "1", "--schedule", str(steps)]) == 0


def test_kernel_naive_of_test_table(capsys):
    assert main(["kernel", "softmax", "--schedule", "naive", "--repeat", "1", "--show", "loopir"]) == 0
    assert "def softmax(" in capsys.readouterr().out


def test_illegal_steps_file_is_a_message(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([["SP", 2, 9, [4], True]]))
    assert main(["kernel", "gemm", "--shape", "16,16,16", "--schedule", str(bad)]) == 2
    assert "error: step 0" in capsys.readouterr().err


def test_unreadable_schedule_is_a_message(tmp_path):

    for text in (None, "{not json", '{"a": 1}'):
        path = tmp_path / "s.json"
        if text is not None:
            path.write_text(text)
        with pytest.raises(SystemExit, match="error: "):
            main(["kernel", "gemm", "--shape", "16,16,16", "--schedule", str(path)])
        path.unlink(missing_ok=True)


def test_compile_inspect_run_an_onnx_model(tmp_path, capsys):
    import onnx

    from tests.test_runtime import small_cnn

    model, art, out = tmp_path / "small.onnx", tmp_path / "small.tar", tmp_path / "out.npz"
    onnx.save(small_cnn(), model)
    assert main(["inspect", str(model)]) == 0
    text = capsys.readouterr().out
    assert "fused_conv_relu" in text and "workload key" in text
    assert main(["compile", str(model), "--input-shapes", "x:[3,3,8,8]", "-o", str(art)]) == 0
    assert main(["run", str(art), "-o", str(out), "--repeat", "3", "--profile"]) == 0
    text = capsys.readouterr().out
    assert "median latency" in text and "tf_fused_conv_relu" in text and "all kernels" in text
    # each kernel names the model's nodes it computes (the conv and ReLU; the BatchNormalization was folded in)
    assert re.search(r"tf_fused_conv_relu_\w+  \(\w+, \w+\)", text), text
    assert np.load(out)["probs"].shape == (3, 10)


def test_compile_errors_are_messages(tmp_path, capsys):

    with pytest.raises(SystemExit, match="no such model"):
        main(["compile", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "m.tar")])
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["compile", str(bad), "-o", str(tmp_path / "m.tar")]) == 2
    assert "error:" in capsys.readouterr().err


def test_tune_a_model_then_compile_with_its_records(tmp_path, capsys):
    model, records = tmp_path / "m.onnx", tmp_path / "r.jsonl"
    assert main(["example", "tiny_cnn", "-o", str(model)]) == 0
    tune = ["tune", str(model), "--records", str(records), "--per-round", "2", "--population", "16", "--threads", "1"]
    assert main([*tune, "--trials", "6"]) == 0
    out = capsys.readouterr().out
    assert "estimated end-to-end latency" in out and "6 trials in" in out
    assert "kernels timed with weights warm" in out  # tiny_cnn's weights fit any last-level cache
    stored = list(read_records(records))
    assert len(stored) == 6 and all(r.costs or r.error for r in stored)
    # the fastest programs of each task were timed again at the end (--retime-best 3): their records hold it
    assert "the fastest timed" in out and any(len(r.costs) >= 3 for r in stored)
    # --resume: nothing measured twice, the budget counts new trials (every task tuned alone this time)
    assert main([*tune, "--trials", "2", "--resume", "--no-sibling-sharing", "--retime-best", "0"]) == 0
    out = capsys.readouterr().out
    assert "resumed 6 records" in out and "the fastest timed" not in out
    now = list(read_records(records))  # a program measured again would be no new record, and its costs would grow
    assert len(now) == 8 and now[:6] == stored
    # timed in another cache condition (weights flushed before each call, or every cache), the warm records are not
    # this run's measurements: nothing is resumed, and the new records say how they were timed
    for flags, cache in [(["--weights", "cold"], "cold-weights"), (["--cache-flush"], "flushed")]:
        assert main([*tune, "--trials", "2", "--resume", *flags]) == 0
        assert "resumed 0 records" in capsys.readouterr().out
        assert [r.cache for r in read_records(records)][-2:] == [cache] * 2
    with pytest.raises(SystemExit, match="--retime-best must be 0 or more"):
        main([*tune, "--trials", "2", "--retime-best", "-1"])
    assert main(["compile", str(model), "-o", str(tmp_path / "m.tar"), "--records", str(records)]) == 0
    assert "from records" in capsys.readouterr().out


def test_tune_kernel_rejects_a_bad_budget(tmp_path, capsys):

    with pytest.raises(SystemExit):
        main(["tune-kernel", "gemm", "--shape", "32,32,32", "--trials", "0", "--records", str(tmp_path / "r")])
    assert "--trials: must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "m.tar", "--repeat", "-3"],
        ["tune", "m.onnx", "--threads", "-1"],
        ["tune", "m.onnx", "--per-round", "0"],
        ["tune", "m.onnx", "--population", "x"],
    ],
)
def test_numbers_are_range_checked_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "error: argument" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("tilefarm ")


def test_run_doors_missing_folders_npy_inputs_dtypes_and_an_onnx_file(tmp_path, capsys):
    import onnx

    from tests.test_runtime import small_cnn

    model, art = tmp_path / "small.onnx", tmp_path / "new" / "folder" / "small.tar"
    onnx.save(small_cnn(), model)
    assert main(["compile", str(model), "--input-shapes", "x:[1,3,8,8]", "-o", str(art)]) == 0  # folder made
    np.save(tmp_path / "x.npy", np.ones((1, 3, 8, 8), np.float32))
    assert main(["run", str(art), "--inputs", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o" / "y.npz")]) == 0
    assert np.load(tmp_path / "o" / "y.npz")["probs"].shape == (1, 10)
    np.save(tmp_path / "xi.npy", np.ones((1, 3, 8, 8), np.int64))
    with pytest.raises(SystemExit, match="input 'x' is int64 in .* but the model takes float32"):
        main(["run", str(art), "--inputs", str(tmp_path / "xi.npy")])
    with pytest.raises(SystemExit, match="is an ONNX model; `run` takes a compiled artifact: tilefarm compile"):
        main(["run", str(model)])
    (tmp_path / "file").write_text("")
    assert main(["compile", str(model), "-o", str(tmp_path / "file" / "m.tar")]) == 2  # a folder that is a file
    assert capsys.readouterr().err.startswith("error: ")


def test_compile_without_a_pass_says_so_in_its_artifact(tmp_path, capsys):
    import tarfile

    import onnx

    from tests.test_runtime import small_cnn

    model, art = tmp_path / "small.onnx", tmp_path / "small.tar"
    onnx.save(small_cnn(), model)
    flags = ["--disable-pass", "propagate_nchwc", "--disable-pass", "winograd_convs"]
    assert main(["inspect", str(model), *flags]) == 0
    assert main(["compile", str(model), "--input-shapes", "x:[3,3,8,8]", "-o", str(art), *flags]) == 0
    with tarfile.open(art) as tar:
        meta = json.load(tar.extractfile("meta.json"))
    assert meta["disabled_passes"] == ["propagate_nchwc", "winograd_convs"]
    capsys.readouterr()
    with pytest.raises(SystemExit):  # argparse lists the passes that can be turned off
        main(["compile", str(model), "-o", str(art), "--disable-pass", "fold_batchnorm"])
    assert "invalid choice: 'fold_batchnorm'" in capsys.readouterr().err


def test_a_script_that_tunes_without_a_main_guard_gets_one_message(tmp_path):
    import subprocess
    import sys

    import onnx

    from tests.test_runtime import small_cnn

    onnx.save(small_cnn(), tmp_path / "m.onnx")
    script = tmp_path / "noguard.py"
    script.write_text(
        "import sys\nfrom tilefarm.cli import main\n"
        f"sys.exit(main(['tune', {str(tmp_path / 'm.onnx')!r}, '--input-shapes', 'x:[1,3,8,8]', '--trials', '4', "
        f"'--per-round', '4', '--records', {str(tmp_path / 'r.jsonl')!r}]))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.count('call it under `if __name__ == "__main__":`') == 1, done.stderr[-2000:]
    assert "every one of the 4 measurements failed" in done.stderr


def test_ctrl_c_during_tune_stops_it_in_one_line_keeping_the_records(tmp_path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it: the workers print nothing, the tuner one
    line, exit 130, and the records of the rounds measured stay."""
    import os
    import signal
    import subprocess
    import sys

    import onnx

    from tests.test_runtime import small_cnn

    onnx.save(small_cnn(), tmp_path / "m.onnx")
    records = tmp_path / "r.jsonl"
    argv = [sys.executable, "-m", "tilefarm.cli", "tune", str(tmp_path / "m.onnx"), "--input-shapes", "x:[1,3,8,8]",
            "--trials", "5000", "--per-round", "8", "--records", str(records)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in proc.stdout:  # the first round's records are written
            if line.startswith("round 2:"):
                break
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "interrupted: tilefarm tune stopped" in err, err[-2000:]
    assert records.read_text().count("\n") >= 8
