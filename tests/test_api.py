"""The REST API through HTTP (FastAPI's TestClient) on a SQLite file and the embedded file-system broker: messages
really land in the broker's queue folder, and no worker runs, so jobs and compiles stay queued."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import os
import stat
import tarfile
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import onnx
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper, numpy_helper
from sqlalchemy import delete, func, select

from compiler.artifact.build import build, run_in_process
from compiler.base.target import Target
from compiler.costs.records import VERSION, TuningRecord, target_name
from compiler.model.onnx_import import load
from compiler.targets import host_target
from server import accounts
from server.app import create_app
from server.db import session_scope
from server.models import ArtifactRow, Job, JobPoint, UploadedModel, WorkerRow
from server.settings import Settings

TOKEN = "bootstrap-token-for-the-api-tests"
API = "/api/v1"
LIMIT = 1 << 20  # TILEFARM_MAX_UPLOAD_BYTES in these tests


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def settings(tmp_path, monkeypatch) -> Settings:
    for name in [k for k in os.environ if k.startswith("TILEFARM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TILEFARM_DATABASE_URL", f"sqlite:///{tmp_path / 'tilefarm.db'}")
    monkeypatch.setenv("TILEFARM_STORAGE_DIR", str(tmp_path / "storage"))
    monkeypatch.setenv("TILEFARM_MAX_UPLOAD_BYTES", str(LIMIT))
    monkeypatch.setenv("TILEFARM_BOOTSTRAP_TOKEN", TOKEN)
    return Settings.from_env()


@pytest.fixture
def client(settings):
    with TestClient(create_app(), headers=bearer(TOKEN)) as c:  # create_app() reads the environment set above
        yield c


@pytest.fixture
def other_token(settings, client) -> str:
    """A token of a second team: the one it starts with, so its admin."""
    with session_scope(settings) as session:
        _, token = accounts.create_token(session, accounts.ensure_team(session, "other"), "b", role="admin")
    return token


def upload(client: TestClient, data: bytes, filename: str = "tiny_cnn.onnx", **fields: str):
    return client.post(f"{API}/models", files={"file": (filename, data)}, data=fields)


@pytest.fixture
def model(client, tiny_cnn) -> dict:
    r = upload(client, tiny_cnn)
    assert r.status_code == 201, r.text
    return r.json()


def broker_messages(settings: Settings, queue: str) -> list[dict]:
    """The messages waiting in the embedded broker's queue folder: task name and arguments."""
    out = []
    for path in sorted((settings.storage / "broker" / "queue").glob(f"*.{queue}.msg")):
        message = json.loads(path.read_text())
        args = json.loads(base64.b64decode(message["body"]))[0]
        out.append({"task": message["headers"]["task"], "args": args})
    return out


def stored_files(settings: Settings) -> list[Path]:
    return [p for sub in ("models", "tmp") for p in (settings.storage / sub).rglob("*") if p.is_file()]


def count_models(settings: Settings) -> int:
    with session_scope(settings, write=False) as session:
        return session.scalar(select(func.count()).select_from(UploadedModel)) or 0


def assert_error(r, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"detail", "code"} and body["code"] == code, body
    assert "Traceback" not in body["detail"]
    return body["detail"]


# ---------------------------------------------------------------------------------------------- health, auth, tokens


def test_health_needs_no_token_and_openapi_is_served(client):
    del client.headers["Authorization"]
    r = client.get(f"{API}/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "version": VERSION, "database": "sqlite", "broker": "embedded"}
    schema = client.get("/openapi.json").json()
    assert {"/api/v1/models", "/api/v1/jobs/{job_id}/events", "/api/v1/records/import"} <= set(schema["paths"])
    upload_body = schema["paths"]["/api/v1/models"]["post"]["requestBody"]["content"]
    assert "file" in upload_body["multipart/form-data"]["schema"]["properties"]


def test_missing_wrong_and_revoked_tokens_are_refused(client):
    assert client.get(f"{API}/me").json()["team"] == "default"
    r = client.post(f"{API}/tokens", json={"name": "laptop"})
    assert r.status_code == 201
    new = r.json()
    assert new["token"].startswith("tf_") and new["prefix"] == new["token"][:11]
    assert client.get(f"{API}/me", headers=bearer(new["token"])).json()["token"]["name"] == "laptop"
    assert client.delete(f"{API}/tokens/{new['id']}").status_code == 204
    assert_error(client.get(f"{API}/me", headers=bearer(new["token"])), 401, "unauthorized")
    assert_error(client.get(f"{API}/me", headers=bearer("not-a-token")), 401, "unauthorized")
    del client.headers["Authorization"]
    r = client.get(f"{API}/models")
    assert "Bearer" in assert_error(r, 401, "unauthorized") and r.headers["WWW-Authenticate"] == "Bearer"
    assert_error(client.get(f"{API}/me", params={"token": TOKEN}), 401, "unauthorized")  # never in a URL


def test_tokens_list_create_revoke(client, other_token):
    r = client.post(f"{API}/tokens", json={"name": "ci"})
    ci = r.json()
    listed = client.get(f"{API}/tokens").json()
    assert [t["name"] for t in listed] == ["bootstrap", "ci"]
    assert all("token" not in t and t["revoked_at"] is None for t in listed)
    assert client.delete(f"{API}/tokens/{ci['id']}").status_code == 204
    assert client.delete(f"{API}/tokens/{ci['id']}").status_code == 204  # revoking twice changes nothing
    assert client.get(f"{API}/tokens").json()[1]["revoked_at"] is not None
    assert_error(client.delete(f"{API}/tokens/9999"), 404, "not_found")
    # the other team neither sees nor revokes this team's tokens
    assert [t["name"] for t in client.get(f"{API}/tokens", headers=bearer(other_token)).json()] == ["b"]
    assert_error(client.delete(f"{API}/tokens/1", headers=bearer(other_token)), 404, "not_found")
    assert_error(client.post(f"{API}/tokens", json={"name": ""}), 422, "invalid_request")


# ---------------------------------------------------------------------------------------------- models


def test_upload_model_tasks_coverage_and_dedupe(client, settings, tiny_cnn, model):
    assert model["duplicate"] is False and model["name"] == "tiny_cnn"
    assert model["sha256"] == hashlib.sha256(tiny_cnn).hexdigest() and model["size_bytes"] == len(tiny_cnn)
    tasks = model["tasks"]
    assert [t["position"] for t in tasks] == list(range(len(tasks))) and tasks[0]["name"] == "fused_conv_relu"
    assert tasks[0]["flops"] > 0 and all(len(t["workload_key"]) == 32 for t in tasks)
    host = host_target()
    cover = model["coverage"]
    assert cover["host"] == host.fingerprint() and cover["target"] == target_name(host)
    assert cover["tuned_tasks"] == 0 and cover["trials_needed"] == 800 * len(tasks)
    assert [c["records"] for c in cover["tasks"]] == [0] * len(tasks)

    again = upload(client, tiny_cnn, "renamed.onnx")
    assert again.status_code == 200 and again.json()["duplicate"] is True and again.json()["id"] == model["id"]
    assert count_models(settings) == 1 and len(stored_files(settings)) == 1
    assert client.get(f"{API}/models/{model['id']}").json()["tasks"] == tasks
    listed = client.get(f"{API}/models").json()
    assert [m["id"] for m in listed] == [model["id"]] and listed[0]["coverage"] is None

    shaped = upload(client, tiny_cnn[:-1] + tiny_cnn[-1:], name="named", input_shapes='{"input": [1, 3, 32, 32]}')
    assert shaped.json()["duplicate"] is True  # same bytes: the existing model, whatever the fields say


def test_a_models_tasks_end_with_its_convs_other_forms_at_weight_0(client, settings):
    """As `tilefarm tune` does, a job tunes each conv's other form too (compile takes the faster): the model's task
    positions are the plan's tasks, then those forms; rows stored before they were listed are rewritten by the job."""
    from compiler.tensor.tasks import tuning_plan
    from server.models import ModelTask
    from tests.test_conv_forms import two_stage_model
    from workers.progress import ensure_model_tasks

    model = two_stage_model()
    plan = tuning_plan(load(model))
    r = upload(client, model.SerializeToString(), "two_stage.onnx")
    assert r.status_code == 201, r.text
    tasks = r.json()["tasks"]
    assert [t["workload_key"] for t in tasks] == [t.key for t in plan.all_tasks]
    assert [t["weight"] for t in tasks[len(plan.tasks) :]] == [0, 0] and all(t["weight"] for t in tasks[:-2])
    assert r.json()["coverage"]["trials_needed"] == 800 * len(tasks)

    def stored() -> list[tuple[int, int]]:
        with session_scope(settings, write=False) as s:
            q = select(ModelTask.position, ModelTask.weight).where(ModelTask.model_id == r.json()["id"])
            return sorted(s.execute(q).all())

    want = [(t["position"], t["weight"]) for t in tasks]
    with session_scope(settings) as s:  # as a model registered when only the plan's tasks were listed
        s.execute(delete(ModelTask).where(ModelTask.model_id == r.json()["id"], ModelTask.weight == 0))
    assert stored() == want[:-2]
    ensure_model_tasks(settings, r.json()["id"], plan.all_tasks)
    assert stored() == want
    ensure_model_tasks(settings, r.json()["id"], plan.all_tasks)  # already as given: left alone
    assert stored() == want


def test_coverage_counts_the_records_of_the_host(client, model):
    host = host_target()
    key = model["tasks"][0]["workload_key"]
    record = TuningRecord(key, target_name(host), host.fingerprint(), (), (1e-3, 3e-3), timestamp=1.0)
    known = {"added": 1, "unknown_workloads": []}  # the model's workload: its DAG is stored
    assert client.post(f"{API}/records/import", content=record.to_json() + "\n").json() == known
    cover = client.get(f"{API}/models/{model['id']}").json()["coverage"]
    assert cover["tasks"][0] == {
        "position": 0,
        "records": 1,
        "best_latency_s": pytest.approx(2e-3),
        "trials_needed": 799,
    }
    r = client.get(f"{API}/models/{model['id']}", params={"host": "0123456789abcdef"})
    assert "unknown host" in assert_error(r, 422, "unknown_host")


def test_coverage_shows_the_record_compile_would_apply(client, settings, model):
    """Of one schedule timed warm and with cold weights, the best latency is the warm one for a model whose weights
    fit the last-level cache (tiny_cnn: counted at upload), and the cold one for a model whose weights do not."""
    host = host_target()
    key = model["tasks"][0]["workload_key"]
    warm = TuningRecord(key, target_name(host), host.fingerprint(), (), (1e-3,), timestamp=1.0)
    cold = dataclasses.replace(warm, costs=(4e-3,), cache="cold-weights")
    lines = warm.to_json() + "\n" + cold.to_json() + "\n"
    assert client.post(f"{API}/records/import", content=lines).json() == {"added": 2, "unknown_workloads": []}
    with session_scope(settings, write=False) as session:
        weights = session.get_one(UploadedModel, model["id"]).weights_bytes
    assert 0 < weights < 1 << 20
    cover = client.get(f"{API}/models/{model['id']}").json()["coverage"]
    assert cover["tasks"][0]["records"] == 2 and cover["tasks"][0]["best_latency_s"] == pytest.approx(1e-3)
    with session_scope(settings) as session:
        session.get_one(UploadedModel, model["id"]).weights_bytes = 1 << 40  # larger than any last-level cache
    cover = client.get(f"{API}/models/{model['id']}").json()["coverage"]
    assert cover["tasks"][0]["best_latency_s"] == pytest.approx(4e-3)


def test_oversized_upload_is_refused_and_leaves_nothing(client, settings):
    rng = np.random.default_rng(0)
    streamed = rng.bytes(LIMIT + (LIMIT // 2))  # passes the Content-Length check, stopped while streaming
    assert "TILEFARM_MAX_UPLOAD_BYTES" in assert_error(upload(client, streamed), 413, "upload_too_large")
    declared = rng.bytes(3 * LIMIT)  # refused from its Content-Length before reading
    assert_error(upload(client, declared), 413, "upload_too_large")
    assert count_models(settings) == 0 and stored_files(settings) == []


def unsupported_op_model() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Det", ["x"], ["y"], name="det0")], "det", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_malformed_models_are_refused_and_leave_nothing(client, settings, tiny_cnn):
    garbage = np.random.default_rng(1).bytes(5000)
    assert "not an ONNX model" in assert_error(upload(client, garbage), 422, "invalid_model")
    detail = assert_error(upload(client, unsupported_op_model()), 422, "unsupported_op")
    assert "Det" in detail and "det0" in detail
    assert str(settings.storage) not in detail
    r = upload(client, tiny_cnn, input_shapes='{"input": "big"}')
    assert "input_shapes" in assert_error(r, 422, "invalid_request")
    assert_error(client.post(f"{API}/models", data={"name": "x"}), 422, "bad_upload")
    assert_error(client.post(f"{API}/models", content=tiny_cnn), 422, "bad_upload")
    assert count_models(settings) == 0 and stored_files(settings) == []
    onnx.load_from_string(unsupported_op_model())  # valid ONNX: refused for the op alone


def external_data_model(folder: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """x @ w + b saved by onnx.save_model with its weights in weights.bin beside model.onnx (external data)."""
    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    weights = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    graph = helper.make_graph(nodes, "dense", [x], [y], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir(parents=True)
    onnx.save_model(model, folder / "model.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0)
    return folder / "model.onnx", w, b


def zip_of(files: dict[str, bytes], links: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, "/etc/passwd")
    return buf.getvalue()


def tar_of(files: dict[str, bytes], gz: bool = False, links: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for name in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            t.addfile(info)
    return buf.getvalue()


def external_data_files(tmp_path: Path) -> tuple[dict[str, bytes], np.ndarray, np.ndarray]:
    path, w, b = external_data_model(tmp_path / "net")
    return {"net/model.onnx": path.read_bytes(), "net/weights.bin": (path.parent / "weights.bin").read_bytes()}, w, b


def test_an_archive_brings_a_models_external_data(client, settings, tmp_path):
    """A model whose weights are in an external data file, uploaded as a zip, a tar and a tar.gz of it and that file:
    stored unpacked (the data beside the model), so a worker loads it by its path and compiles it."""
    files, w, b = external_data_files(tmp_path)
    archives = {"zip": zip_of({**files, "net/README.txt": b"not needed"}), "tar": tar_of(files),
                "tar.gz": tar_of(files, gz=True)}  # fmt: skip
    models = {}
    for suffix, data in archives.items():
        r = upload(client, data, f"net.{suffix}")
        assert r.status_code == 201, r.text
        models[suffix] = r.json()
        assert models[suffix]["name"] == "net" and models[suffix]["size_bytes"] == len(data)
    assert len({m["id"] for m in models.values()}) == 3
    assert {json.dumps(m["tasks"]) for m in models.values()} == {json.dumps(models["zip"]["tasks"])}
    again = upload(client, archives["zip"], "renamed.zip")
    assert again.status_code == 200 and again.json()["duplicate"] is True and again.json()["id"] == models["zip"]["id"]

    with session_scope(settings, write=False) as session:
        path = Path(session.get_one(UploadedModel, models["zip"]["id"]).path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.onnx", "weights.bin"]  # the README stayed out
    x = np.random.default_rng(4).standard_normal((2, 8)).astype(np.float32)
    got = run_in_process(load(str(path)), {"x": x})["y"]  # as the compile and search workers load it
    np.testing.assert_allclose(got, x @ w + b, rtol=1e-5, atol=1e-5)
    assert [p for p in (settings.storage / "tmp").rglob("*") if p.is_file()] == []


def test_external_data_missing_from_an_upload_is_named(client, settings, tmp_path):
    files, _, _ = external_data_files(tmp_path)
    detail = assert_error(upload(client, files["net/model.onnx"], "model.onnx"), 422, "missing_external_data")
    assert "weights.bin" in detail and "archive" in detail
    detail = assert_error(upload(client, zip_of({"net/model.onnx": files["net/model.onnx"]}), "net.zip"), 422,
                          "missing_external_data")  # fmt: skip
    assert "net/weights.bin" in detail and str(settings.storage) not in detail
    assert count_models(settings) == 0 and stored_files(settings) == []


def test_unsafe_ambiguous_and_oversized_archives_are_refused(client, settings, tmp_path):
    files, _, _ = external_data_files(tmp_path)
    model = files["net/model.onnx"]
    refused = [
        (zip_of({**files, "../evil.bin": b"x"}), 422, "'..'"),
        (tar_of({**files, "net/../../evil.bin": b"x"}), 422, "'..'"),
        (tar_of({**files, "/tmp/evil.bin": b"x"}), 422, "absolute"),
        (zip_of({"net/model.onnx": model}, links=("net/weights.bin",)), 422, "link"),
        (tar_of({"net/model.onnx": model}, gz=True, links=("net/weights.bin",)), 422, "link"),
        (zip_of({**files, "other/model.onnx": model}), 422, "net/model.onnx, other/model.onnx"),
        (zip_of({"weights.bin": b"x"}), 422, "no .onnx model"),
        (zip_of({**files, "net/pad.bin": bytes(LIMIT)}), 413, "TILEFARM_MAX_UPLOAD_BYTES"),  # ~1 KiB compressed
        (tar_of({**files, "net/pad.bin": bytes(LIMIT)}, gz=True), 413, "TILEFARM_MAX_UPLOAD_BYTES"),
    ]
    for data, status, words in refused:
        assert len(data) < LIMIT
        code = "upload_too_large" if status == 413 else "bad_upload"
        assert words in assert_error(upload(client, data, "net.zip"), status, code)
    assert not (settings.storage.parent / "evil.bin").exists() and not Path("/tmp/evil.bin").exists()
    assert count_models(settings) == 0 and stored_files(settings) == []


# ---------------------------------------------------------------------------------------------- jobs


def test_job_create_cancel_resume(client, settings, model):
    r = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 50, "per_round": 8})
    assert r.status_code == 201, r.text
    job = r.json()
    host = host_target().fingerprint()
    assert job["state"] == "queued" and job["attempt"] == 1 and job["host"] == host
    assert job["model_name"] == "tiny_cnn" and job["trials"] == 50 and job["per_round"] == 8
    assert [t["name"] for t in job["tasks"]] == [t["name"] for t in model["tasks"]]
    assert broker_messages(settings, "search") == [{"task": "tilefarm.search_job", "args": [job["id"], 1]}]
    with session_scope(settings, write=False) as session:
        assert session.get_one(Job, job["id"]).queue == f"measure.cpu.{host}"

    cancelled = client.post(f"{API}/jobs/{job['id']}/cancel").json()
    assert cancelled["state"] == "cancelled" and cancelled["cancel_requested"] and cancelled["finished_at"]
    assert_error(client.post(f"{API}/jobs/{job['id']}/cancel"), 409, "job_finished")
    resumed = client.post(f"{API}/jobs/{job['id']}/resume").json()
    assert resumed["state"] == "queued" and resumed["attempt"] == 2 and not resumed["cancel_requested"]
    assert [m["args"] for m in broker_messages(settings, "search")] == [[job["id"], 1], [job["id"], 2]]
    assert_error(client.post(f"{API}/jobs/{job['id']}/resume"), 409, "job_not_resumable")

    assert [j["id"] for j in client.get(f"{API}/jobs", params={"state": "queued"}).json()] == [job["id"]]
    assert client.get(f"{API}/jobs", params={"state": "running"}).json() == []
    assert_error(client.get(f"{API}/jobs", params={"state": "bogus"}), 422, "invalid_request")


def test_job_requests_are_validated(client, model):
    detail = assert_error(
        client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 0}), 422, "invalid_request"
    )
    assert detail.startswith("trials:")
    r = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 5, "target": "opencl"})
    assert "'opencl' is not supported: use llvm" in assert_error(r, 422, "unsupported_target")
    r = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 5, "target": "cuda"})
    assert "no GPU worker for cuda -arch=sm_90 has registered" in assert_error(r, 422, "unknown_host")
    assert_error(client.post(f"{API}/jobs", json={"model_id": 999, "trials": 5}), 404, "not_found")
    assert_error(client.post(f"{API}/jobs", json={"model_id": model["id"]}), 422, "invalid_request")
    assert_error(client.post(f"{API}/jobs", content=b"{"), 422, "invalid_request")


def test_a_teams_share_of_the_farm_is_limited_and_said(client, settings, model):
    """TILEFARM_MAX_JOB_TRIALS and TILEFARM_MAX_ACTIVE_JOBS (docs/operations.md): past them a job is refused naming
    the setting, and nothing is queued."""
    app_settings = client.app.state.settings  # frozen: set as TILEFARM_MAX_* in the environment would
    object.__setattr__(app_settings, "max_job_trials", 100)
    object.__setattr__(app_settings, "max_active_jobs", 2)
    detail = assert_error(
        client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 101}), 422, "invalid_request"
    )
    assert "at most 100" in detail and "TILEFARM_MAX_JOB_TRIALS" in detail
    first = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 100}).json()
    client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 100})
    detail = assert_error(client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 5}), 429, "too_many_jobs")
    assert "2 jobs queued or running" in detail and "TILEFARM_MAX_ACTIVE_JOBS" in detail
    assert len(broker_messages(settings, "search")) == 2
    client.post(f"{API}/jobs/{first['id']}/cancel")  # one ends: a new one fits, and resuming the ended one does not
    third = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 5})
    assert third.status_code == 201, third.text
    assert_error(client.post(f"{API}/jobs/{first['id']}/resume"), 429, "too_many_jobs")


def test_a_budget_short_of_every_first_round_is_said_when_the_job_is_made(client, settings, model):
    """The job says before it starts what too few trials leave out (the scheduler's own first rounds), and a finished
    job without an estimate says why."""
    tasks = [t for t in model["tasks"] if t["weight"]]
    assert len(tasks) >= 2
    short = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 1, "per_round": 64}).json()
    assert short["note"].startswith("1 trials do not give every task its first round")
    assert "About 1 will be measured" in short["note"] and "no end-to-end estimate" in short["note"]
    enough = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 5000, "per_round": 64}).json()
    assert enough["note"] is None
    table = [{**t, "trials": 8 if i == 0 else 0, "latency_s": 1e-4 if i == 0 else None} for i, t in enumerate(tasks)]
    with session_scope(settings) as session:
        row = session.get_one(Job, short["id"])
        row.state, row.trials_done, row.tasks = "succeeded", 1, table
    done = client.get(f"{API}/jobs/{short['id']}").json()
    assert done["note"].startswith(f"no end-to-end estimate: {len(tasks) - 1} of the model's {len(tasks)} tasks")
    assert "resume it with" in done["note"]


def test_progress_points_and_event_stream(client, settings, model):
    job = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 16}).json()
    table = [{"position": 0, "name": "fused_conv_relu", "flops": 1, "weight": 1, "latency_s": 1e-4, "trials": 8}]
    with session_scope(settings) as session:
        row = session.get_one(Job, job["id"])
        row.state, row.trials_done, row.estimated_latency, row.tasks = "running", 16, 2e-4, table
        points = [
            JobPoint(job_id=job["id"], trials=n, elapsed_s=n / 10, estimated_latency=2e-4, task=0, task_best=[1e-4])
            for n in (8, 16)
        ]
        session.add_all(points)
        session.flush()
        first, second = points[0].id, points[1].id
    progress = client.get(f"{API}/jobs/{job['id']}/progress").json()
    assert progress["job"]["state"] == "running" and progress["job"]["estimated_latency_s"] == 2e-4
    assert progress["job"]["tasks"][0]["latency_s"] == 1e-4 and progress["job"]["tasks"][0]["done"] is False
    assert [p["trials"] for p in progress["points"]] == [8, 16]
    assert set(progress["points"][0]) == {
        *("id", "trials", "elapsed_s", "estimated_latency_s", "task", "task_best", "errors", "created_at")
    }
    later = client.get(f"{API}/jobs/{job['id']}/progress", params={"after": first}).json()
    assert [p["id"] for p in later["points"]] == [second]

    with session_scope(settings) as session:
        session.get_one(Job, job["id"]).state = "succeeded"
    # EventSource cannot set headers: a ticket, asked for with the token, comes in the query
    ticket = client.post(f"{API}/jobs/{job['id']}/events/ticket").json()["ticket"]
    del client.headers["Authorization"]
    with client.stream("GET", f"{API}/jobs/{job['id']}/events", params={"ticket": ticket}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = parse_events(r.read().decode())
    assert [e["event"] for e in events] == ["progress", "end"]
    data = json.loads(events[0]["data"])
    assert data["job"]["state"] == "succeeded" and len(data["points"]) == 2 and events[0]["id"] == str(second)
    assert json.loads(events[1]["data"])["state"] == "succeeded"


def parse_events(text: str) -> list[dict[str, str]]:
    """Server-sent events as {field: value} dicts."""
    return [dict(line.split(": ", 1) for line in block.splitlines()) for block in text.split("\n\n") if block.strip()]


# ---------------------------------------------------------------------------------------------- artifacts


def test_compile_and_download(client, settings, model):
    r = client.post(f"{API}/models/{model['id']}/compile", json={})
    assert r.status_code == 202, r.text
    artifact = r.json()
    host = host_target().fingerprint()
    assert artifact["state"] == "queued" and artifact["host"] == host and artifact["model_name"] == "tiny_cnn"
    assert broker_messages(settings, f"measure.cpu.{host}") == [
        {"task": "tilefarm.compile_artifact", "args": [artifact["id"]]}
    ]
    assert_error(client.get(f"{API}/artifacts/{artifact['id']}/download"), 409, "artifact_not_ready")

    # what a compile worker does (none runs here)
    path = settings.storage / "artifacts" / f"{artifact['id']}.tar"
    path.parent.mkdir(parents=True)
    with session_scope(settings) as session:
        row = session.get_one(ArtifactRow, artifact["id"])
        graph = load(Path(session.get_one(UploadedModel, model["id"]).path).read_bytes())
        info = build(graph, path, "tiny_cnn")
        row.state, row.path, row.size_bytes = "ready", str(path), path.stat().st_size
        row.sha256, row.records_used = hashlib.sha256(path.read_bytes()).hexdigest(), list(info.records_used.values())
    assert client.get(f"{API}/artifacts/{artifact['id']}").json()["state"] == "ready"
    r = client.get(f"{API}/artifacts/{artifact['id']}/download")
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-tar"
    assert hashlib.sha256(r.content).hexdigest() == r.headers["X-Checksum-SHA256"]
    assert r.headers["ETag"] == f'"{r.headers["X-Checksum-SHA256"]}"'
    assert f"tiny_cnn-{artifact['id']}.tar" in r.headers["content-disposition"]
    again = client.get(f"{API}/artifacts/{artifact['id']}/download", headers={"If-None-Match": r.headers["ETag"]})
    assert again.status_code == 304
    assert [a["id"] for a in client.get(f"{API}/artifacts").json()] == [artifact["id"]]


def test_another_team_sees_nothing(client, other_token, model):
    job = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 4}).json()
    artifact = client.post(f"{API}/models/{model['id']}/compile").json()
    b = bearer(other_token)
    for path in (
        f"/models/{model['id']}",
        f"/jobs/{job['id']}",
        f"/jobs/{job['id']}/progress",
        f"/jobs/{job['id']}/events",
        f"/artifacts/{artifact['id']}",
        f"/artifacts/{artifact['id']}/download",
    ):
        assert_error(client.get(API + path, headers=b), 404, "not_found")
    for path in (f"/jobs/{job['id']}/cancel", f"/jobs/{job['id']}/resume", f"/models/{model['id']}/compile"):
        assert_error(client.post(API + path, headers=b), 404, "not_found")
    assert_error(client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 4}, headers=b), 404, "not_found")
    for path in ("/models", "/jobs", "/artifacts"):
        assert client.get(API + path, headers=b).json() == []
    assert client.get(f"{API}/jobs/{job['id']}").json()["state"] == "queued"  # untouched


# ---------------------------------------------------------------------------------------------- records, workers


def records(n: int, key: str = "ab" * 16, host: str = "feedfacecafebeef") -> list[TuningRecord]:
    return [
        TuningRecord(
            key, "llvm -mcpu=test", host, (("SP", 0, 0, (i + 1,), True),), (1e-3 * (i + 1),), timestamp=float(i)
        )
        for i in range(n)
    ]


def test_records_import_export_round_trip(client):
    lines = "".join(r.to_json() + "\n" for r in records(2))
    unknown = ["ab" * 16]  # no uploaded model has the workload: named, its records' steps and timings not checkable
    assert client.post(f"{API}/records/import", content=lines).json() == {"added": 2, "unknown_workloads": unknown}
    assert client.post(f"{API}/records/import", content=lines).json() == {"added": 0, "unknown_workloads": unknown}
    as_file = client.post(f"{API}/records/import", files={"file": ("records.jsonl", lines.encode())})
    assert as_file.json() == {"added": 0, "unknown_workloads": unknown}
    page = client.get(f"{API}/records", params={"host": "feedfacecafebeef", "limit": 1}).json()
    assert page["total"] == 2 and len(page["records"]) == 1 and page["records"][0]["mean_cost"] == 1e-3
    assert page["records"][0]["cache"] == "warm"
    assert client.get(f"{API}/records", params={"workload": "nope"}).json() == {"total": 0, "records": []}

    r = client.get(f"{API}/records/export")
    assert r.status_code == 200
    exported = [TuningRecord.from_json(line) for line in r.text.splitlines()]
    assert exported == records(2)
    best = client.get(f"{API}/records/export", params={"best_only": True}).text.splitlines()
    assert [TuningRecord.from_json(line) for line in best] == records(1)

    # the same schedule timed with cold weights is another record, and says so
    cold = dataclasses.replace(records(1)[0], costs=(5e-3,), cache="cold-weights")
    added = {"added": 1, "unknown_workloads": unknown}
    assert client.post(f"{API}/records/import", content=cold.to_json() + "\n").json() == added
    page = client.get(f"{API}/records", params={"host": "feedfacecafebeef"}).json()
    assert [(r["mean_cost"], r["cache"]) for r in page["records"]] == [
        (1e-3, "warm"),
        (2e-3, "warm"),
        (5e-3, "cold-weights"),
    ]
    exported = [TuningRecord.from_json(line) for line in client.get(f"{API}/records/export").text.splitlines()]
    assert exported == [*records(2), cold]

    bad = records(3, key="cd" * 16)[2].to_json() + "\n" + '{"workload_key": "x"}\n'
    assert "line 2" in assert_error(client.post(f"{API}/records/import", content=bad), 422, "invalid_records")
    assert client.get(f"{API}/records").json()["total"] == 3  # the good first line was not added either


def test_workers_and_the_default_host(client, settings, model):
    farm = Target(kind="cpu", mcpu="testcpu", features="+avx2,+fma", cores=4, cpu_model="Test CPU")
    now = datetime.now(UTC)
    with session_scope(settings) as session:
        for name, target, heartbeat, stopped in (
            ("measure@live", farm, now, False),
            ("measure@lost", Target(mcpu="other"), now - timedelta(hours=1), False),
            ("measure@stopped", Target(mcpu="third"), now, True),
        ):
            session.add(
                WorkerRow(
                    name=name,
                    kind="cpu",
                    fingerprint=target.fingerprint(),
                    target=dataclasses.asdict(target),
                    queues=["search", f"measure.cpu.{target.fingerprint()}"],
                    pid=1234,
                    hostname=name.split("@")[1],
                    last_heartbeat=heartbeat,
                    stopped=stopped,
                )
            )
    workers = client.get(f"{API}/workers").json()
    assert [(w["name"], w["alive"]) for w in workers] == [
        ("measure@live", True),
        ("measure@lost", False),
        ("measure@stopped", False),
    ]
    assert workers[0]["queues"][1] == f"measure.cpu.{farm.fingerprint()}"
    # the live workers all measure on one host class: jobs and coverage default to it
    job = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 4}).json()
    assert job["host"] == farm.fingerprint() and job["target"] == "llvm -mcpu=testcpu"
    cover = client.get(f"{API}/models/{model['id']}").json()["coverage"]
    assert cover["host"] == farm.fingerprint() and cover["target"] == "llvm -mcpu=testcpu"
    lost = Target(mcpu="other").fingerprint()
    explicit = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 4, "host": lost}).json()
    assert explicit["host"] == lost and explicit["target"] == "llvm -mcpu=other"


def test_errors_have_one_shape(client, settings):
    assert_error(client.get(f"{API}/nowhere"), 404, "not_found")
    assert_error(client.put(f"{API}/jobs"), 405, "method_not_allowed")
    detail = assert_error(client.get(f"{API}/jobs/abc"), 422, "invalid_request")
    assert detail.startswith("job_id:")

    app = create_app(settings)

    @app.get("/boom")
    def boom():
        raise RuntimeError("secret internals")

    with TestClient(app, raise_server_exceptions=False) as c:
        assert "secret" not in assert_error(c.get("/boom"), 500, "internal_error")


def test_bootstrap_token_is_registered_once(client, settings):
    with TestClient(create_app(settings)) as again:  # a second start on the same database
        assert again.get(f"{API}/me", headers=bearer(TOKEN)).json()["team"] == "default"
    assert [t["name"] for t in client.get(f"{API}/tokens").json()] == ["bootstrap"]


@pytest.mark.parametrize(
    "path",
    ["/api/v1/models/9223372036854775808", "/api/v1/jobs/99999999999999999999", "/api/v1/artifacts/0",
     "/api/v1/records/-1/schedule", "/api/v1/jobs/1/records?offset=9223372036854775808"],
)  # fmt: skip
def test_ids_and_offsets_past_int64_are_refused_at_the_edge(client, path):
    r = client.get(path)
    assert r.status_code == 422, (path, r.status_code, r.text)


def test_text_with_nul_a_long_name_and_deep_json_are_refused_at_the_edge(client, tiny_cnn):
    assert upload(client, tiny_cnn, name="a\x00b").status_code == 422
    assert upload(client, tiny_cnn, name="n" * 255).status_code == 422
    assert upload(client, tiny_cnn, input_shapes="[" * 100_000 + "]" * 100_000).status_code == 422
    assert client.post(f"{API}/tokens", json={"name": "x\x00"}).status_code == 422
    r = upload(client, tiny_cnn, name="n" * 128)  # the longest name: its artifact's file names are made short
    assert r.status_code == 201, r.text
    deep = '{"workload_key": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    r = client.post(f"{API}/records/import", content=deep)
    assert r.status_code == 422 and "RecursionError" in r.text


def test_health_reports_a_broker_that_does_not_answer(settings, monkeypatch):
    """A farm's Redis broker is checked as the database is: down, /health is 503 naming it (port 1: nothing listens);
    the real one on 127.0.0.1:6379 answers."""
    for url, status, body in [
        ("redis://127.0.0.1:1/0", 503, "broker_unavailable"),
        ("redis://127.0.0.1:6379/0", 200, "redis"),
    ]:
        monkeypatch.setenv("TILEFARM_BROKER_URL", url)
        with TestClient(create_app()) as c:
            r = c.get(f"{API}/health")
        assert r.status_code == status and body in r.text, r.text
