"""A records database nobody can poison (server/trust.py, docs/records.md#verification-and-trust).

An import is checked line by line (steps that replay, a timing no faster than the hardware, a well-formed host and
target), stored unverified and trusted by the importing team alone, until a farm worker of its host class has
measured its schedule: then it carries the measured timing and every team may use it. The trust rule on SQLite and
PostgreSQL; the REST import on SQLite and the embedded broker; and the real farm (uvicorn, a worker process, Redis,
PostgreSQL), where another team's compile must not take a fast claim until the farm has measured it."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime

import onnx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from compiler.costs.measure import RUN, UNKNOWN
from compiler.costs.records import TuningRecord, target_name
from compiler.model.onnx_import import load
from compiler.targets import host_target
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.tensor.tasks import Task, plan_tasks
from server import accounts
from server.app import create_app
from server.database import SQLDatabase
from server.db import engine_for, session_scope
from server.models import Record, Team, WorkerRow
from server.settings import Settings
from server.trust import PEAK_FLOPS_PER_CORE
from tests.test_api import assert_error, bearer, broker_messages
from tests.test_farm import _free_port, _health, _ok, _redis_db, _wait
from tests.test_sharing import mlp

TOKEN = "bootstrap-token-for-the-poisoning-tests"
API = "/api/v1"
HOST = host_target()
VERIFY = "tilefarm.verify_records"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[bytes, Task]:
    """A one-layer MLP (MatMul+Relu on [4, 16] x [16, 8]): its ONNX bytes and its one task."""
    path = tmp_path_factory.mktemp("mlp") / "mlp.onnx"
    onnx.save(mlp([16, 8], seed=0), path)
    [task] = plan_tasks(load(str(path)))[0]
    return path.read_bytes(), task


def line(task_key: str, steps, cost: float | None, **fields) -> str:
    """A JSON line of an import: a record of this host class."""
    record = {"workload_key": task_key, "target": target_name(HOST), "host": HOST.fingerprint(), "steps": steps}
    record |= {"costs": [] if cost is None else [cost], **fields}
    return json.dumps(record) + "\n"


def fast_claim(task: Task, times_the_floor: float = 3.0) -> float:
    """A timing `times_the_floor` times the least the import check lets through for the task on this host class."""
    return times_the_floor * task.dag.flop_count / (HOST.cores * PEAK_FLOPS_PER_CORE)


def default_steps(task: Task) -> list:
    return json.loads(json.dumps([s.record() for s in default_schedule(task.dag).steps]))


# ---------------------------------------------------------------------------------------------- the trust rule


def _team(db: SQLDatabase, name: str) -> int:
    with db.engine.begin() as conn:
        return conn.execute(insert(Team).values(name=name).returning(Team.id)).scalar_one()


def test_an_import_is_trusted_by_its_team_alone_until_a_measurement_verifies_it(db, tmp_path):
    a, b = _team(db, "a"), _team(db, "b")
    key, steps = "ab" * 16, (("SP", 0, 0, (4,), True),)
    claim = TuningRecord(key, "llvm -mcpu=test", "feedfacecafebeef", steps, (1e-9,), timestamp=1.0)
    honest = dataclasses.replace(claim, steps=(("SP", 0, 0, (8,), True),), costs=(5e-6,))
    db.commit(honest)  # measured (a farm worker, or tune on this machine): verified
    path = tmp_path / "claim.jsonl"
    path.write_text(claim.to_json() + "\n")
    assert db.import_file(path, imported_by=a) == 1

    def best(reader: SQLDatabase) -> list[float]:
        return [r.mean_cost for r in reader.best(key, "llvm -mcpu=test", "feedfacecafebeef", k=5)]

    assert best(db.trusting(a)) == [1e-9, 5e-6]  # the importing team's own compile may use it
    assert best(db.trusting(b)) == best(db) == [5e-6]  # another team's, and the command line's, may not
    for reader, n in ((db.trusting(a), 2), (db.trusting(b), 1), (db, 1)):
        assert len(list(reader.records_of([key], "llvm -mcpu=test", "feedfacecafebeef"))) == n  # resume
        assert len(list(reader)) == n
        assert reader.export(tmp_path / "out.jsonl") == n
    assert [r.costs for _, r in db.trusting(a).training_records()] == [(5e-6,)]  # the shared pre-trained model

    # re-sending it (another team, the command line, the same team) neither flips it nor adds one
    assert db.import_file(path, imported_by=b) == 0 and db.import_file(path) == 0 and db.import_file(path, a) == 0
    with db.engine.connect() as conn:
        rows = conn.execute(select(Record.verified, Record.imported_by, Record.costs).order_by(Record.id)).all()
    assert [tuple(r) for r in rows] == [(True, None, [5e-6]), (False, a, [1e-9])]

    # a failure of the measurer's own proves nothing; a measurement of the program verifies it with its timing
    lost = dataclasses.replace(claim, costs=(), error=UNKNOWN, error_message="batch lost")
    assert not db.commit(lost) and best(db) == [5e-6]
    assert db.commit(dataclasses.replace(claim, costs=(2e-5,), timestamp=2.0))
    assert best(db) == best(db.trusting(b)) == [5e-6, 2e-5]
    assert db.commit(dataclasses.replace(claim, costs=(1e-9,))) is False  # verified now: left as it is
    with db.engine.connect() as conn:
        assert conn.execute(select(Record.verified, Record.imported_by).where(Record.id == 2)).one() == (True, a)

    # the farm's re-measuring: an unverified record of a workload whose DAG is not stored cannot be measured yet
    other = dataclasses.replace(claim, steps=(("SP", 0, 0, (2,), True),))
    path.write_text(other.to_json() + "\n")
    assert db.import_file(path, imported_by=a) == 1
    assert db.unverified("feedfacecafebeef", 10) == [] and db.unverified_hosts() == set()
    # a re-timing (retime_best) of an unverified record replaces the claim rather than averaging with it
    assert db.trusting(a).remeasured(dataclasses.replace(other, costs=(3e-5,)))
    assert best(db) == [5e-6, 2e-5, 3e-5]
    # and a measured failure makes it a failed record, verified
    third = dataclasses.replace(claim, steps=(("SP", 0, 0, (16,), True),))
    path.write_text(third.to_json() + "\n")
    assert db.import_file(path, imported_by=b) == 1
    with db.engine.connect() as conn:
        record_id = conn.execute(select(Record.id).where(Record.verified.is_(False))).scalar_one()
    assert db.verify(record_id, dataclasses.replace(third, costs=(), error=RUN, error_message="segfault"))
    assert not db.verify(record_id, third)  # once
    assert best(db.trusting(b)) == [5e-6, 2e-5, 3e-5]


# ---------------------------------------------------------------------------------------------- the REST import


@pytest.fixture
def settings(tmp_path, monkeypatch) -> Settings:
    for name in [k for k in os.environ if k.startswith("TILEFARM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TILEFARM_DATABASE_URL", f"sqlite:///{tmp_path / 'tilefarm.db'}")
    monkeypatch.setenv("TILEFARM_STORAGE_DIR", str(tmp_path / "storage"))
    monkeypatch.setenv("TILEFARM_BOOTSTRAP_TOKEN", TOKEN)
    return Settings.from_env()


@pytest.fixture
def client(settings):
    with TestClient(create_app(), headers=bearer(TOKEN)) as c:
        yield c


@pytest.fixture
def team_a(settings, client) -> tuple[int, dict[str, str]]:
    """A second team (the bootstrap token's is team B here): its id and an admin token's header."""
    with session_scope(settings) as session:
        team = accounts.ensure_team(session, "a")
        _, token = accounts.create_token(session, team, "a", role="admin")
        return team.id, bearer(token)


def upload(client: TestClient, data: bytes, headers: dict[str, str] | None = None) -> dict:
    r = client.post(f"{API}/models", files={"file": ("mlp.onnx", data)}, headers=headers)
    assert r.status_code in (200, 201), r.text
    return r.json()


def test_an_import_is_refused_whole_naming_the_line_and_the_reason(client, model):
    data, task = model
    upload(client, data)
    good = line(task.key, default_steps(task), 1e-3)
    too_fast = task.dag.flop_count / (HOST.cores * PEAK_FLOPS_PER_CORE) / 10
    cases = [
        (line(task.key, [["SP", 99, 0, [4], True]], 1e-3), "its steps do not replay on workload"),
        (line(task.key, [["XX", 1]], 1e-3), "its steps do not replay"),
        (line(task.key, default_steps(task), 1e-15), "faster than the hardware allows"),
        (line(task.key, default_steps(task), too_fast), f"{task.dag.flop_count} FLOP"),
        (line(task.key, default_steps(task), 1e-3, host="<b>feedface</b>"), "is not a host fingerprint"),
        (line(task.key, default_steps(task), 1e-3, host="FEEDFACECAFEBEEF"), "is not a host fingerprint"),
        (line(task.key, default_steps(task), 1e-3, target="llvm -mcpu=<script>"), "is not a target"),
        (line(task.key, default_steps(task), 1e-3, target="llvm -mcpu=zen\x07"), "is not a target"),
        (line(task.key, default_steps(task), 1e-3, target="llvm -mcpu=other"), "is not host class"),
        (line(task.key, default_steps(task), None, error="<i>x</i>"), "is not an error code"),
        (line("<svg onload=x>", default_steps(task), 1e-3), "is not a workload key"),
        (line("0" * 32, [["XX", 1]], 1e-3), "its steps do not replay"),  # an unknown workload's steps still parse
    ]
    for bad, why in cases:
        detail = assert_error(client.post(f"{API}/records/import", content=good + bad), 422, "invalid_records")
        assert detail.startswith("line 2: ") and why in detail, (why, detail)
    assert client.get(f"{API}/records").json()["total"] == 0  # nothing, not even the good first line
    # a failure that says its steps did not replay is no claim anyone chooses; the good line goes in
    stale = line(task.key, [["SP", 99, 0, [4], True]], None, error="instantiation")
    assert client.post(f"{API}/records/import", content=good + stale).json() == {"added": 2, "unknown_workloads": []}


def test_an_import_is_used_by_its_team_alone_and_shown_unverified(client, settings, model, team_a):
    data, task = model
    a, as_a = team_a
    model_b, model_a = upload(client, data), upload(client, data, as_a)
    claim = fast_claim(task)
    r = client.post(f"{API}/records/import", content=line(task.key, default_steps(task), claim), headers=as_a)
    assert r.json() == {"added": 1, "unknown_workloads": []}
    [record] = client.get(f"{API}/records", params={"workload": task.key}).json()["records"]
    assert record["verified"] is False and record["imported_by"] == a and record["mean_cost"] == claim

    # coverage shows the record compile would apply: team A's own import for A, nothing for B
    def task_coverage(m: dict, headers: dict[str, str] | None = None) -> dict:
        return client.get(f"{API}/models/{m['id']}", headers=headers).json()["coverage"]["tasks"][0]

    assert task_coverage(model_a, as_a)["best_latency_s"] == claim and task_coverage(model_a, as_a)["records"] == 1
    assert task_coverage(model_b)["best_latency_s"] is None and task_coverage(model_b)["records"] == 0
    assert client.get(f"{API}/coverage", headers=as_a).json()["models"][0]["tuned"] == [1]
    assert client.get(f"{API}/coverage").json()["models"][0]["tuned"] == [0]
    # the dashboard's views say so
    [workload] = client.get(f"{API}/records/workloads").json()["workloads"]
    assert workload["hosts"] == [
        {
            "host": HOST.fingerprint(),
            "records": 1,
            "unverified": 1,
            "best_latency_s": None,
            "best_record_id": None,
            "best_verified": None,
        }
    ]
    [mine] = client.get(f"{API}/records/workloads", headers=as_a).json()["workloads"]
    assert mine["hosts"][0]["best_latency_s"] == claim and mine["hosts"][0]["best_verified"] is False
    schedule = client.get(f"{API}/records/{record['id']}/schedule").json()
    assert schedule["verified"] is False and schedule["imported_by"] == a
    # an export holds what the exporting team may use
    assert client.get(f"{API}/records/export").text == ""
    assert TuningRecord.from_json(client.get(f"{API}/records/export", headers=as_a).text).costs == (claim,)
    # B re-sending A's record adds nothing and changes nothing
    r = client.post(f"{API}/records/import", content=line(task.key, default_steps(task), claim))
    assert r.json() == {"added": 0, "unknown_workloads": []}
    [again] = client.get(f"{API}/records", params={"workload": task.key}).json()["records"]
    assert again == record


def test_records_of_an_unknown_workload_are_named_and_measured_once_it_is_known(client, settings, model, monkeypatch):
    """An import may hold records of workloads no uploaded model has (their DAG is not stored): their steps are only
    parsed and their timings only checked for being finite; the response names the workloads. They are stored
    unverified, and the farm measures them once a model brings the workload: the upload asks every live measuring
    worker's host class to, and a worker of it replaces the claim with its measurement."""
    data, task = model
    claim = 1e-15  # nothing to check it against yet
    r = client.post(f"{API}/records/import", content=line(task.key, default_steps(task), claim))
    assert r.json() == {"added": 1, "unknown_workloads": [task.key]}
    queue = f"measure.cpu.{HOST.fingerprint()}"
    assert broker_messages(settings, queue) == []  # no live worker: nothing asked
    with session_scope(settings) as s:  # a live measuring worker of this host class
        s.add(
            WorkerRow(
                name="measure@here",
                kind="cpu",
                fingerprint=HOST.fingerprint(),
                target=dataclasses.asdict(HOST),
                queues=[queue],
                last_heartbeat=datetime.now(UTC),
            )
        )
    r = client.post(f"{API}/records/import", content=line(task.key, default_steps(task), claim))
    assert r.json() == {"added": 0, "unknown_workloads": [task.key]}
    assert broker_messages(settings, queue) == []  # still nothing it could measure
    upload(client, data)  # the workload is known now
    assert broker_messages(settings, queue) == [{"task": VERIFY, "args": [HOST.fingerprint(), 0]}]

    # the worker's side, in this process: the message's task re-measures it on the measuring path
    from workers import tasks as worker

    monkeypatch.setattr(worker, "settings", settings)
    assert worker.verify_records(HOST.fingerprint(), 0) == 1
    [record] = client.get(f"{API}/records", params={"workload": task.key}).json()["records"]
    assert record["verified"] is True and record["error"] is None and record["mean_cost"] > 1000 * claim
    assert worker.verify_records(HOST.fingerprint(), 0) == 0  # nothing left
    assert worker.verify_records("0123456789abcdef", 0) == 0  # another host class's is not measured here


# ---------------------------------------------------------------------------------------------- the real farm


@pytest.fixture
def service(tmp_path, pg_url):
    """The API (uvicorn) on PostgreSQL and Redis, and `start_worker(name)` for measuring workers started later."""
    broker = _redis_db()
    env = {
        **os.environ,
        "TILEFARM_DATABASE_URL": pg_url,
        "TILEFARM_BROKER_URL": broker,
        "TILEFARM_STORAGE_DIR": str(tmp_path / "storage"),
        "TILEFARM_BOOTSTRAP_TOKEN": TOKEN,
        "TILEFARM_HEARTBEAT_S": "0.5",
        "TILEFARM_WORKER_GRACE_S": "4",
        "TILEFARM_NUM_THREADS": "1",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    port = _free_port()
    procs: dict[str, subprocess.Popen] = {}
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(name: str, *argv: str) -> None:
        out = open(logs / f"{name}.log", "w")  # noqa: SIM115 (closed with the process below)
        procs[name] = subprocess.Popen(
            [sys.executable, *argv], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def start_worker(name: str) -> None:
        # one thread: the queue's messages are taken one after another, in the order they were sent
        start(name, "-m", "workers.worker", "--name", f"{name}@farm", "--concurrency", "1")

    start("api", "-m", "uvicorn", "--factory", "server.app:create_app", "--host", "127.0.0.1", "--port", str(port))
    import httpx

    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=bearer(TOKEN), timeout=60)
    try:
        _wait("the API", lambda: _health(client), 60)
        yield client, start_worker
    finally:
        client.close()
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for f in sorted(logs.iterdir()):  # shown by pytest only when the test fails
            print(f"----- {f.name}\n{f.read_text()[-4000:]}")
        import redis

        redis.Redis.from_url(broker).flushdb()


def test_another_teams_compile_takes_a_fast_claim_only_once_the_farm_has_measured_it(service, model, pg_url):
    client, start_worker = service
    data, task = model
    with Session(engine_for(pg_url)) as s, s.begin():  # team A, with an admin token (the bootstrap one is B's)
        team = accounts.ensure_team(s, "a")
        _, token = accounts.create_token(s, team, "a", role="admin")
        a = team.id
    as_a = bearer(token)

    def upload_as(headers: dict[str, str] | None = None) -> dict:
        return _ok(client.post(f"{API}/models", files={"file": ("mlp.onnx", data)}, headers=headers), 201)

    model_b, model_a = upload_as(), upload_as(as_a)
    assert model_b["tasks"][0]["workload_key"] == task.key
    claim = fast_claim(task)  # plausible by the import check, far faster than the kernel runs
    imported = client.post(f"{API}/records/import", content=line(task.key, default_steps(task), claim), headers=as_a)
    assert _ok(imported) == {"added": 1, "unknown_workloads": []}

    def the_record() -> dict:
        [record] = _ok(client.get(f"{API}/records", params={"workload": task.key}))["records"]
        return record

    assert the_record()["verified"] is False and the_record()["imported_by"] == a

    def compiled(model: dict, headers: dict[str, str] | None = None) -> int:
        return _ok(client.post(f"{API}/models/{model['id']}/compile", json={}, headers=headers), 202)["id"]

    def ready(artifact_id: int, headers: dict[str, str] | None = None) -> dict:
        def done():
            a = _ok(client.get(f"{API}/artifacts/{artifact_id}", headers=headers))
            return a["state"] in ("ready", "failed") and a

        artifact = _wait(f"artifact {artifact_id}", done, 240, every=0.5)
        assert artifact["state"] == "ready", artifact
        return artifact

    # both compiles are queued before any worker runs; the worker measures the claim only after them (its start
    # asks for that, behind them in its queue)
    b_first, a_first = compiled(model_b), compiled(model_a, as_a)
    start_worker("w1")
    assert ready(b_first)["records_used"] == []  # B: the default schedule, not A's claim
    [used] = ready(a_first, as_a)["records_used"]  # A: its own import
    assert used["workload_key"] == task.key and used["mean_seconds"] == claim

    record = _wait("the farm to measure the import", lambda: (r := the_record())["verified"] and r, 120)
    assert record["imported_by"] == a and record["error"] is None
    assert record["mean_cost"] > 10 * claim and record["costs"] != [claim]  # the true cost, measured
    [used] = ready(compiled(model_b))["records_used"]  # now B may use it, at its measured cost
    assert used["workload_key"] == task.key and used["mean_seconds"] == record["mean_cost"]
    assert _ok(client.get(f"{API}/records"))["total"] == 1  # measured in place: no second record
