"""Artifacts end to end: ONNX -> graph -> tasks -> one shared library with an AOT entry point, run from Python
(in a fresh process) and from a C program; tampering is caught by the checksums."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.artifact.build import build
from compiler.artifact.runtime import Artifact, ArtifactError
from compiler.base.errors import UnsupportedOp
from compiler.model.onnx_import import load


def small_cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    consts = {
        "W": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
        "B": rng.standard_normal(8).astype(np.float32),
        **{n: rng.random(8).astype(np.float32) + 0.5 for n in ("sc", "sh", "me", "va")},
        "W2": rng.standard_normal((10, 128)).astype(np.float32) * 0.1,
        "B2": rng.standard_normal(10).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "sc", "sh", "me", "va"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "W2", "B2"], ["y"], transB=1),
        helper.make_node("Softmax", ["y"], ["probs"], axis=1),
        helper.make_node("Identity", ["x"], ["x_copy"]),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10]),
            helper.make_tensor_value_info("x_copy", TensorProto.FLOAT, ["N", 3, 8, 8]),
        ],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("art") / "small.tar"
    info = build(load(small_cnn(), {"x": [2, 3, 8, 8]}), path, name="small")
    assert {t.name for t in info.tasks} >= {"fused_conv_relu", "fused_softmax"}  # BN folded, relu fused
    return path


def reference(x):
    sess = ort.InferenceSession(small_cnn().SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(["probs", "x_copy"], sess.run(None, {"x": x})))


def test_artifact_matches_onnxruntime_in_a_fresh_process(artifact, tmp_path):
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = (
        "import numpy as np, sys; from compiler.artifact.runtime import Artifact;"
        f"out = Artifact.load({str(artifact)!r}).run({{'x': np.load({str(tmp_path / 'x.npy')!r})}});"
        f"np.savez({str(tmp_path / 'out.npz')!r}, **out)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    got = np.load(tmp_path / "out.npz")
    want = reference(x)
    np.testing.assert_allclose(got["probs"], want["probs"], rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(got["x_copy"], x)


def test_meta_lists_files_tasks_and_host(artifact):
    with tarfile.open(artifact) as tar:
        meta = json.load(tar.extractfile("meta.json"))
        assert set(meta["sha256"]) == {"small.so", "small.h"} and set(tar.getnames()) >= {"small.so", "small.h"}
    assert meta["inputs"] == [{"name": "x", "shape": [2, 3, 8, 8], "dtype": "float32"}]
    assert [o["name"] for o in meta["outputs"]] == ["probs", "x_copy"]
    assert (
        meta["host"] and meta["target"]["mcpu"] and all(t["flops"] > 0 for t in meta["tasks"] if "softmax" in t["name"])
    )


def test_tampered_library_is_detected(artifact, tmp_path):
    bad = tmp_path / "bad.tar"
    with tarfile.open(artifact) as src, tarfile.open(bad, "w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            if m.name == "small.so":
                data = data[:-1] + bytes([data[-1] ^ 1])
            m.size = len(data)
            dst.addfile(m, io.BytesIO(data))
    with pytest.raises(ArtifactError, match="small.so .*sha256"):
        Artifact.load(bad)


def test_wrong_inputs_are_clear_errors(artifact):
    art = Artifact.load(artifact)
    with pytest.raises(ArtifactError, match="missing input 'x'"):
        art.run({})
    with pytest.raises(ArtifactError, match=r"shape \[2, 3, 8, 8\]"):
        art.run({"x": np.zeros((1, 3, 8, 8), np.float32)})


def test_c_program_runs_the_model(artifact, tmp_path):
    with tarfile.open(artifact) as tar:
        tar.extractall(tmp_path, filter="data")
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype(np.float32)
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    (tmp_path / "main.c").write_text(
        """#include <stdio.h>
#include <stdlib.h>
#include "small.h"
int main(void) {
    static float x[2*3*8*8], probs[2*10], copy[2*3*8*8];
    FILE* f = fopen("x.bin", "rb");
    if (!f || fread(x, sizeof x, 1, f) != 1) return 2;
    fclose(f);
    void* ws = aligned_alloc(64, (tilefarm_workspace_bytes() + 63) / 64 * 64 + 64);
    void* ins[] = {x};
    void* outs[] = {probs, copy};
    tilefarm_num_threads = 1;
    if (tilefarm_run(ins, outs, ws) != 0) return 3;
    for (int i = 0; i < 20; i++) printf("%.9g\\n", probs[i]);
    free(ws);
    return 0;
}
"""
    )
    subprocess.run(["cc", "-O1", "-o", "main", "main.c", "./small.so", "-Wl,-rpath,$ORIGIN"], cwd=tmp_path, check=True)
    out = subprocess.run(["./main"], cwd=tmp_path, check=True, capture_output=True, text=True).stdout
    got = np.array([float(v) for v in out.split()], np.float32).reshape(2, 10)
    np.testing.assert_allclose(got, reference(x)["probs"], rtol=1e-4, atol=1e-6)


def test_unsupported_op_is_reported_with_node_names(tmp_path):
    node = helper.make_node("Hardmax", ["x"], ["y"], name="mix")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    with pytest.raises(UnsupportedOp, match="Hardmax.*mix"):
        build(load(model), tmp_path / "m.tar")


def test_in_process_run_matches_the_artifact(artifact):
    from compiler.artifact.build import run_in_process

    x = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)
    got = run_in_process(load(small_cnn(), {"x": [2, 3, 8, 8]}), {"x": x})
    want = Artifact.load(artifact).run({"x": x})
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7)


def test_profile_times_every_call_alone_and_in_a_run(artifact):
    art = Artifact.load(artifact)
    x = np.random.default_rng(4).standard_normal((2, 3, 8, 8)).astype(np.float32)
    rows = art.profile({"x": x}, repeat=3)
    assert [r["kernel"] for r in rows] == [c["kernel"] for c in art.meta["calls"]]
    assert all(r["seconds"] > 0 and r["in_run"] > 0 for r in rows)
    # profiling runs the kernels on a run's buffers; the artifact still answers right afterwards
    np.testing.assert_allclose(art.run({"x": x})["probs"], reference(x)["probs"], rtol=1e-4, atol=1e-5)
