"""A model's budget (compiler.model.onnx_import.budget): what loading it may allocate, weighed before it is allocated,
in the loader (its defaults admit real models) and at the service's upload door (a tighter budget of its own, named
by its settings). The API process's memory is measured in fresh processes, from their high-water mark."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from compiler.artifact.build import build
from compiler.model.onnx_import import Budget, OverBudget, load
from compiler.model.onnx_import.budget import node_count
from server.app import create_app
from server.settings import Settings
from tests.conftest import service_environ

MiB = 1 << 20
SERVICE = Settings.from_env({})  # the service's defaults


def _model(nodes, outputs, inits=(), inputs=(), functions=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", list(inputs), outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], functions=list(functions))


def constant_of_shape(shape: list[int], dtype=np.uint8, name: str = "big", out: str = "y") -> list:
    """A ConstantOfShape node asking for `shape` of `dtype`, and its shape initializer."""
    fill = numpy_helper.from_array(np.array([1], dtype))
    node = helper.make_node("ConstantOfShape", [f"{out}_shape"], [out], name=name, value=fill)
    return [node, numpy_helper.from_array(np.array(shape, np.int64), f"{out}_shape")]


def gigabyte_bomb() -> bytes:
    """114 bytes of ONNX asking for a 1 GiB constant (uint8 [2**28, 4]) while it is folded: within the loader's
    default budget (1 GiB), past the service's (256 MiB)."""
    node, shape = constant_of_shape([2**28, 4])
    model = _model([node], [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], [shape])
    return model.SerializeToString()


# ---------------------------------------------------------------------------------------------- the loader


def test_the_default_budget_and_its_settings():
    assert Budget() == Budget(value_bytes=4 << 30, fold_bytes=1 << 30, nodes=1_000_000)
    env = {"TILEFARM_MAX_FOLD_BYTES": "1024", "TILEFARM_MAX_NODES": "7", "TILEFARM_MAX_VALUE_BYTES": ""}
    assert Budget.from_env(env) == Budget(fold_bytes=1024, nodes=7)
    assert Budget(prefix="TILEFARM_MAX_MODEL_").setting("fold_bytes") == "TILEFARM_MAX_MODEL_FOLD_BYTES"


def test_a_fold_past_the_budget_is_refused_naming_the_limit_and_its_setting():
    model = gigabyte_bomb()
    assert len(model) == 114
    with pytest.raises(OverBudget) as e:
        load(model, budget=Budget(fold_bytes=256 * MiB))
    assert str(e.value) == (
        "ConstantOfShape node 'big' would make 'y' of [268435456, 4] at compile time: 1 GiB, more than the 256 MiB "
        "constant folding may make in all (TILEFARM_MAX_FOLD_BYTES)"
    )
    service = Budget(fold_bytes=256 * MiB, prefix="TILEFARM_MAX_MODEL_")
    with pytest.raises(OverBudget, match=r"\(TILEFARM_MAX_MODEL_FOLD_BYTES\)"):
        load(model, budget=service)


def test_folded_bytes_add_up_across_values():
    """Three constants of 400 KiB each: past a 1 MiB budget together, though each is within it."""
    parts = [constant_of_shape([400 << 10], name=f"c{i}", out=f"y{i}") for i in range(3)]
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.UINT8, None) for i in range(3)]
    model = _model([p[0] for p in parts], outputs, [p[1] for p in parts])
    assert len(load(model, budget=Budget(fold_bytes=2 * MiB)).outputs) == 3
    with pytest.raises(
        OverBudget, match=r"node 'c2' .*\(with 800 KiB folded before it\): 1.2 MiB, more than the 1 MiB"
    ):
        load(model, budget=Budget(fold_bytes=MiB))


def test_a_node_whose_fold_would_pass_the_budget_is_left_to_run_time():
    """Only an op that can do nothing but fold (ConstantOfShape, Range, ...) is refused; a Mul of a constant that
    does not fit what is left is computed at run time instead, as a Mul of an input is."""
    w = numpy_helper.from_array(np.ones(1 << 18, np.float32), "w")  # 1 MiB
    nodes = [helper.make_node("Mul", ["w", "w"], ["w2"]), helper.make_node("Add", ["x", "w2"], ["y"])]
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1 << 18]) for n in "xy")
    model = _model(nodes, [y], [w], [x])
    assert [n.op for n in load(model, budget=Budget(fold_bytes=2 * MiB)).nodes] == ["Add"]
    assert [n.op for n in load(model, budget=Budget(fold_bytes=MiB // 2)).nodes] == ["Mul", "Add"]


def test_declared_dims_are_weighed_before_the_data_is_read():
    """A sparse initializer of one value declaring [2**40] would be made dense: 4 TiB."""
    values = numpy_helper.from_array(np.ones(1, np.float32), "w")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0], np.int64), "i"), [2**40])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])], "g", [], [helper.make_tensor_value_info("y", 1, [2**40])]
    )
    graph.sparse_initializer.append(sparse)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OverBudget) as e:
        load(model)
    assert str(e.value) == (
        "sparse initializer 'w' is declared [1099511627776]: 4 TiB, more than the 4 GiB one value may take "
        "(TILEFARM_MAX_VALUE_BYTES)"
    )


def test_nodes_are_counted_with_subgraphs_and_functions_as_inlined():
    """A function of 2 nodes called 10 times by one called 10 times inlines to 200 nodes; an If's branches count."""
    f = helper.make_function("local", "f", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["t"]),
                             helper.make_node("Neg", ["t"], ["b"])], [helper.make_opsetid("", 17)])  # fmt: skip
    calls = [helper.make_node("f", [f"v{i}"], [f"v{i + 1}"], domain="local") for i in range(10)]
    g = helper.make_function("local", "g", ["v0"], ["v10"], calls, [helper.make_opsetid("local", 1)])
    chain = [helper.make_node("g", [f"x{i}"], [f"x{i + 1}"], domain="local") for i in range(10)]
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x0", "x10"))
    model = helper.make_model(
        helper.make_graph(chain, "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
        functions=[f, g],
    )
    assert node_count(model) == 200
    assert [n.op for n in load(model, budget=Budget(nodes=200)).nodes] == ["Neg"] * 200
    with pytest.raises(OverBudget) as e:
        load(model, budget=Budget(nodes=199))
    assert str(e.value) == (
        "the model (subgraphs included, local functions as inlined) has 200 nodes, more than the 199 allowed "
        "(TILEFARM_MAX_NODES)"
    )
    branch = helper.make_graph([helper.make_node("Neg", ["x"], ["z"])], "b", [], [y])
    iff = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    assert node_count(_model([iff], [y])) == 3


def test_a_chain_of_20000_nodes_compiles_within_the_services_budget(tmp_path):
    n = 20_000
    nodes = [helper.make_node("Relu" if i % 2 else "Neg", [f"v{i}"], [f"v{i + 1}"]) for i in range(n)]
    x, y = (helper.make_tensor_value_info(f"v{i}", TensorProto.FLOAT, [1, 8]) for i in (0, n))
    graph = load(_model(nodes, [y], inputs=[x]), budget=Budget(nodes=SERVICE.max_model_nodes))
    assert len(graph.nodes) == n
    build(graph, tmp_path / "chain.tar", "chain")
    assert (tmp_path / "chain.tar").stat().st_size > 0


def test_the_callers_model_is_read_not_changed():
    """load no longer copies a ModelProto (a model's weights were held twice); it must not change it either, not even
    where it fills an output shape the exporter left unset."""
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    model = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [helper.make_tensor_value_info("y", 1, None)], [w], [x]
    )
    before = model.SerializeToString()
    assert load(model).outputs[0].type.shape == (1, 3)
    assert model.SerializeToString() == before


# ---------------------------------------------------------------------------------------------- the service


def _fresh_process(script: str, tmp_path: Path, *args: str, **settings: str) -> dict:
    """`script` run by a new Python with the embedded service's settings under `tmp_path` (and `settings`, named as
    TILEFARM_ variables without the prefix); what it prints last, as JSON."""
    env = service_environ(tmp_path) | {
        "TILEFARM_DATABASE_URL": f"sqlite:///{tmp_path / 'tilefarm.db'}",
        "TILEFARM_STORAGE_DIR": str(tmp_path / "storage"),
        "TILEFARM_BOOTSTRAP_TOKEN": "a-token-for-the-budget-tests",
    }
    env |= {f"TILEFARM_{k.upper()}": v for k, v in settings.items()}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# a fresh process's memory around one call: its high-water mark reset first (Linux's clear_refs), so what an earlier
# step peaked at does not hide what the call takes
MEASURE = """
import json, sys
from pathlib import Path

def rss_mib(field):
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1]) / 1024

def growth(call):
    Path("/proc/self/clear_refs").write_text("5")
    before = rss_mib("VmRSS")
    result = call()
    return result, rss_mib("VmHWM") - before
"""

UPLOAD = (
    MEASURE
    + """
from fastapi.testclient import TestClient
from server.app import create_app

with TestClient(create_app(), headers={"Authorization": "Bearer a-token-for-the-budget-tests"}) as client:
    def upload(path):
        with open(path, "rb") as f:
            return client.post("/api/v1/models", files={"file": ("model.onnx", f.read())})
    assert upload(sys.argv[1]).status_code == 201  # every module the checking imports, imported before measuring
    r, grew = growth(lambda: upload(sys.argv[2]))
    print(json.dumps({"status": r.status_code, "body": r.json(), "growth_mib": grew}))
"""
)


@pytest.fixture
def bomb(tmp_path) -> Path:
    path = tmp_path / "bomb.onnx"
    path.write_bytes(gigabyte_bomb())
    return path


@pytest.fixture
def warm(tmp_path, tiny_cnn) -> Path:
    path = tmp_path / "tiny_cnn.onnx"
    path.write_bytes(tiny_cnn)
    return path


def test_an_upload_asking_for_a_gigabyte_is_refused_without_allocating_it(tmp_path, warm, bomb):
    """422, not 413: the model is 114 bytes, well within the upload limit (413 would tell the client to send less);
    the model it holds is what the server will not process."""
    got = _fresh_process(UPLOAD, tmp_path, str(warm), str(bomb))
    print(f"refusing the bomb raised the API process's peak RSS by {got['growth_mib']:.1f} MiB")
    assert got["status"] == 422 and got["body"]["code"] == "over_budget", got
    assert got["body"]["detail"].endswith(
        "1 GiB, more than the 256 MiB constant folding may make in all (TILEFARM_MAX_MODEL_FOLD_BYTES)"
    )
    assert got["growth_mib"] < 100, got


def test_the_service_budget_is_its_settings(tmp_path, monkeypatch, tiny_cnn):
    """Each limit set by its TILEFARM_MAX_MODEL_ variable, and named by it when an upload passes it."""
    for k, v in service_environ(tmp_path).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TILEFARM_DATABASE_URL", f"sqlite:///{tmp_path / 'tilefarm.db'}")
    monkeypatch.setenv("TILEFARM_BOOTSTRAP_TOKEN", "a-token-for-the-budget-tests")
    nodes = node_count(onnx.load_from_string(tiny_cnn))
    for setting, value, message in [
        ("NODES", nodes - 1, f"has {nodes} nodes, more than the {nodes - 1} allowed (TILEFARM_MAX_MODEL_NODES)"),
        ("VALUE_BYTES", 1024, "more than the 1 KiB one value may take (TILEFARM_MAX_MODEL_VALUE_BYTES)"),
    ]:
        monkeypatch.setenv("TILEFARM_STORAGE_DIR", str(tmp_path / setting))
        monkeypatch.setenv(f"TILEFARM_MAX_MODEL_{setting}", str(value))
        with TestClient(create_app(), headers={"Authorization": "Bearer a-token-for-the-budget-tests"}) as client:
            r = client.post("/api/v1/models", files={"file": ("tiny_cnn.onnx", tiny_cnn)})
        assert r.status_code == 422 and r.json()["code"] == "over_budget", r.text
        assert message in r.json()["detail"]
        monkeypatch.delenv(f"TILEFARM_MAX_MODEL_{setting}")
    with pytest.raises(ValidationError, match="max_model_fold_bytes"):
        Settings.from_env({"TILEFARM_MAX_MODEL_FOLD_BYTES": "0"})


def test_checking_a_large_upload_holds_its_weights_about_twice(tmp_path):
    """register_model on 64 MiB of weights (a MatMul's, as a Gemm): the upload's proto and the graph's arrays at
    once, each once (the loader used to copy the proto, and onnx's checker to serialize it and parse it again)."""
    w = np.random.default_rng(0).standard_normal((4096, 4096), dtype=np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w"], ["y"])]
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4096]) for n in "xy")
    path = tmp_path / "big.onnx"
    onnx.save(_model(nodes, [y], [numpy_helper.from_array(w, "w")], [x]), path)
    del w
    size = path.stat().st_size
    got = _fresh_process(REGISTER, tmp_path, str(path), hashlib.sha256(path.read_bytes()).hexdigest())
    print(f"checking {size / MiB:.0f} MiB of weights raised the peak RSS by {got['growth_mib']:.0f} MiB")
    assert got["tasks"] == 1 and got["growth_mib"] < 2.75 * size / MiB, got


REGISTER = (
    MEASURE
    + """
import shutil
from server import accounts, catalog, storage
from server.db import engine_for, session_scope
from server.settings import Settings

settings = Settings.from_env()
engine_for(settings.database_url)
with session_scope(settings) as session:
    team = accounts.ensure_team(session, "default").id

def register(path, sha256):
    copy = storage.scratch_path(settings)  # register_model moves or deletes what it is given
    shutil.copy(path, copy)
    return catalog.register_model(settings, team, storage.StoredFile(copy, sha256, copy.stat().st_size), "m", None)

from tilefarm import examples
settings.storage.mkdir(parents=True, exist_ok=True)
examples.save("tiny_cnn", settings.storage / "tiny.onnx")
register(settings.storage / "tiny.onnx", "0" * 64)  # every module the checking imports, imported before measuring
(model, _), grew = growth(lambda: register(Path(sys.argv[1]), sys.argv[2]))
print(json.dumps({"tasks": len(model.tasks), "growth_mib": grew}))
"""
)
