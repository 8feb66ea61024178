"""The embedded service end to end: uvicorn and one worker process (tilefarm/serve.py's pieces) on SQLite and the
file-system broker in a temporary folder, driven through `tilefarm remote ...` and tilefarm.remote.Client: upload
tiny_cnn, tune it on the worker, follow the job, compile, download, and run the artifact against onnxruntime."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import service_environ
from tilefarm import cli, remote
from tilefarm.remote import Client, RemoteError
from tilefarm.serve import EmbeddedService, prepare

# the `remote` commands through the `tilefarm` command once cli.py wires them in, through remote.main until then
main = cli.main if "add_remote_parser" in Path(cli.__file__).read_text() else remote.main


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("service")
    with EmbeddedService(service_environ(root), workers=1, log_dir=root / "logs", prefix="test-") as svc:
        yield svc


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory) -> Path:
    from tilefarm import examples

    path = tmp_path_factory.mktemp("model") / "tiny_cnn.onnx"
    examples.save("tiny_cnn", path)
    return path


def _cli(svc: EmbeddedService, capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["remote", *argv, "--server", svc.url, f"--token={svc.token}"])
    return rc, capsys.readouterr().out


def test_prepare_writes_a_private_token_once_and_replaces_a_stale_one(tmp_path):
    env = service_environ(tmp_path)
    token, created = prepare(env)
    path = remote.token_file(env)
    assert created and path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert prepare(env) == (token, False)
    path.write_text("a-token-the-database-does-not-know\n")
    token2, created = prepare(env)
    assert created and token2 != token and path.read_text().strip() == token2


def test_upload_tune_compile_download_run(service, onnx_model, tmp_path, capsys):
    rc, out = _cli(service, capsys, "upload", str(onnx_model))
    assert rc == 0 and out.startswith("uploaded model "), out
    model_id = int(out.split()[2])
    rc, out = _cli(service, capsys, "upload", str(onnx_model))
    assert rc == 0 and out.startswith(f"already uploaded: model {model_id} "), out

    rc, out = _cli(service, capsys, "tune", str(model_id), "--trials", "16", "--per-round", "8", "--wait")
    assert rc == 0, out + service.logs()
    job_id = int(out.split("job ", 1)[1].split()[0])
    assert f"job {job_id} (tiny_cnn): succeeded" in out and "estimated end-to-end latency" in out, out

    with Client(service.url, service.token) as c:
        job = c.job(job_id)
        assert job["state"] == "succeeded" and job["trials_done"] == 16 and job["tuning_s"] > 0
        measured = [t for t in job["tasks"] if t["trials"]]
        assert measured and all(t["latency_s"] > 0 for t in measured)
        points = c.progress(job_id)["points"]
        assert points and points[-1]["trials"] == job["trials_done"]
        assert c.progress(job_id, after=points[-1]["id"])["points"] == []
    rc, out = _cli(service, capsys, "status", str(job_id))
    assert rc == 0 and "succeeded" in out and "weighted ms" in out, out
    table = out.splitlines()
    for t in job["tasks"]:  # one row per task, named as the job names it
        assert any(line.split()[:2] == [str(t["position"]), t["name"][:28]] for line in table), (t, out)
    assert f"trials: {job['trials_done']} of 16" in out

    export = tmp_path / "records.jsonl"  # the job's measurements, shared with every team
    rc, out = _cli(service, capsys, "records", "export", "-o", str(export))
    lines = export.read_text().splitlines()
    assert rc == 0 and len(lines) >= 16 and all("workload_key" in json.loads(line) for line in lines), out
    rc, out = _cli(service, capsys, "records", "import", str(export))
    assert rc == 0 and ": 0 new records" in out, out

    rc, out = _cli(service, capsys, "compile", str(model_id), "--wait")
    assert rc == 0 and ": ready for " in out, out + service.logs()
    artifact_id = int(out.split()[1])
    tar = tmp_path / "tiny_cnn.tar"
    rc, out = _cli(service, capsys, "download", str(artifact_id), "-o", str(tar))
    assert rc == 0 and tar.exists(), out

    import onnxruntime as ort

    from compiler.artifact.runtime import Artifact

    art = Artifact.load(tar)
    x = np.random.default_rng(0).standard_normal(art.meta["inputs"][0]["shape"]).astype(np.float32)
    got = art.run({"input": x})["output"]
    want = ort.InferenceSession(str(onnx_model), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_a_download_that_fails_its_checksum_is_deleted(service, onnx_model, tmp_path):
    from server.settings import Settings

    with Client(service.url, service.token) as c:
        model = c.upload(onnx_model)
        art = c.wait_artifact(c.compile(model["id"])["id"], timeout_s=120)
        assert art["state"] == "ready", art
        stored = Settings.from_env(service.environ).storage / "artifacts" / f"{art['id']}.tar"
        good = stored.read_bytes()
        stored.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one bit flipped on the server's disk
        try:
            with pytest.raises(RemoteError, match="checksum"):
                c.download(art["id"], tmp_path / "bad.tar")
        finally:
            stored.write_bytes(good)
        assert not (tmp_path / "bad.tar").exists() and not list(tmp_path.glob("*.part"))
        assert c.download(art["id"], tmp_path / "good.tar")["sha256"] == art["sha256"]


def test_cancel_and_resume(tmp_path, onnx_model):
    # the service starts without workers, so the job is still queued when it is cancelled (with a search worker
    # polling, it may have started already); the workers join before the resume
    with EmbeddedService(service_environ(tmp_path), workers=0, log_dir=tmp_path, prefix="cancel-") as svc:
        with Client(svc.url, svc.token) as c:
            model = c.upload(onnx_model)
            job = c.create_job(model["id"], trials=100_000, per_round=4)
            c.cancel(job["id"])  # queued: cancelled at once
            assert c.job(job["id"])["state"] == "cancelled"
            with pytest.raises(RemoteError, match="HTTP 409") as e:
                c.cancel(job["id"])
            assert e.value.status == 409 and e.value.code
            svc.add_workers(1)  # the first attempt's message is stale now: the search worker drops it
            resumed = c.resume(job["id"])
            assert resumed["state"] == "queued" and resumed["attempt"] == job["attempt"] + 1
            deadline = time.monotonic() + 60
            while c.job(job["id"])["state"] == "queued" and time.monotonic() < deadline:
                time.sleep(0.2)
            assert c.job(job["id"])["state"] == "running"
            assert c.cancel(job["id"])["cancel_requested"]  # running: it stops at the end of its round
            done = c.wait_job(job["id"])
            assert done["state"] == "cancelled" and done["trials_done"] < 100_000, done


def test_workers_and_tokens(service, tmp_path, capsys):
    rc, out = _cli(service, capsys, "workers")
    assert rc == 0 and "test-measure0@" in out and "test-search@" in out and " yes " in out, out

    rc, out = _cli(service, capsys, "token", "create", "ci")
    assert rc == 0, out
    ci = out.strip()
    with Client(service.url, ci) as c:
        me = c.me()
        assert me["team"] == "default" and me["token"]["name"] == "ci" and me["token"]["role"] == "member"
        with pytest.raises(RemoteError, match="role 'admin'") as refused:  # a member token manages no tokens
            c.revoke_token(me["token"]["id"])
        assert refused.value.status == 403 and refused.value.code == "forbidden"
    rc, out = _cli(service, capsys, "token", "create", "ops", "--role", "admin")
    assert rc == 0, out
    with Client(service.url, out.strip()) as admin:
        assert admin.me()["token"]["role"] == "admin"
        admin.revoke_token(me["token"]["id"])
    rc, out = _cli(service, capsys, "token", "list")
    assert rc == 0 and "ci" in out and "ops" in out and " member " in out and " admin " in out, out
    with Client(service.url, ci) as c, pytest.raises(RemoteError, match="HTTP 401") as e:
        c.me()
    assert e.value.code == "unauthorized"


def test_errors_carry_the_servers_detail(service, tmp_path, capsys):
    with Client(service.url, "not-a-token") as c, pytest.raises(RemoteError, match="token") as e:
        c.models()
    assert e.value.status == 401
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    rc = main(["remote", "upload", str(bad), "--server", service.url, "--token", service.token])
    assert rc == 2 and "HTTP 422" in capsys.readouterr().err
    with Client("http://127.0.0.1:9", service.token) as c, pytest.raises(RemoteError, match="cannot reach"):
        c.health()
