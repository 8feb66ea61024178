"""The dashboard's API on SQLite and on the real PostgreSQL: a job's records paged and filtered, its error breakdown and
batch timeline (on the 20,000-record job of tests/seed.py), the model x host coverage matrix, the workloads browser,
records' schedules printed as loop nests, workers' state and current job, and records that carry their job's id."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select

from compiler.base.errors import InvalidProgram
from compiler.base.target import Target
from compiler.costs.records import TuningRecord, target_name
from compiler.schedule.loopir import print_func
from compiler.schedule.lower import lower
from compiler.schedule.state import apply_steps, step_from_record
from compiler.targets import host_target
from compiler.targets.cpu.annotate import materialize, sample
from compiler.targets.cpu.sketch import generate_sketches
from server import accounts
from server.app import create_app
from server.database import SQLDatabase
from server.db import session_scope
from server.models import Job, MeasureBatch, Record, Team, UploadedModel, WorkerRow
from server.settings import Settings
from tests.conftest import fresh_schema
from tests.seed import ERROR_CYCLE, LOST_EVERY, PER_ROUND, SEED_HOST, seed_big_job, seed_tasks

TOKEN = "bootstrap-token-for-the-dashboard-api-tests"
API = "/api/v1"
RECORDS, TASKS = 20_000, 19
ROUNDS = math.ceil(RECORDS / PER_ROUND)
# the breakdown groups, written out here on purpose: the API's table (server.job_detail.ERROR_GROUPS) must agree
GROUP = {
    "build": "build",
    "instantiation": "build",
    "run": "run",
    "unknown": "run",
    "run_timeout": "timeout",
    "build_timeout": "timeout",
    "wrong_answer": "wrong_answer",
}
RECORD_FIELDS = {
    *("id", "task", "task_name", "mean_cost", "error", "group", "error_message", "timestamp", "created_by"),
    *("build_seconds", "run_seconds", "cache"),
}
SECOND_HOST = Target(kind="cpu", mcpu="icelake-server", features="+avx512f", cores=4, cpu_model="Second CPU")
WORKER_ONLY_HOST = Target(kind="cpu", mcpu="sapphirerapids", features="+amx-tile", cores=8, cpu_model="Third CPU")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_error(r, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"detail", "code"} and body["code"] == code, body
    return body["detail"]


def seeded_records() -> list[tuple[int, str | None]]:
    """(task position, error code) of every record the big seeded job wrote, in commit order (tests/seed.py)."""
    tasks = [r % TASKS for r in range(ROUNDS) for _ in range(PER_ROUND)][:RECORDS]
    return [(task, ERROR_CYCLE[i % len(ERROR_CYCLE)]) for i, task in enumerate(tasks)]


# ---------------------------------------------------------------------------------------------- the big job


@dataclasses.dataclass
class Farm:
    client: TestClient
    settings: Settings
    job: int  # the 20,000-record job
    small_job: int  # 640 records of the first 3 of the same GEMMs, measured on SECOND_HOST
    other_token: str  # a second team's


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def farm(request, tmp_path_factory):
    """One database per backend for the module, read-only for its tests: the big job and a small one of the default
    team, a measuring worker of a third host class with no records, and a lost worker of the big job's host."""
    root = tmp_path_factory.mktemp("dashboard")
    if request.param == "sqlite":
        url = f"sqlite:///{root / 'tilefarm.db'}"
    else:
        url = fresh_schema(request.getfixturevalue("pg_database"))
    env = {"TILEFARM_DATABASE_URL": url, "TILEFARM_STORAGE_DIR": str(root / "storage")}
    settings = Settings.from_env({**env, "TILEFARM_BOOTSTRAP_TOKEN": TOKEN})
    with TestClient(create_app(settings), headers=bearer(TOKEN)) as client:
        with session_scope(settings) as s:
            team = s.scalars(select(Team).where(Team.name == "default")).one()
            team_id = team.id
            _, other = accounts.create_token(s, accounts.ensure_team(s, "other"), "b")
        job = seed_big_job(settings, team_id, RECORDS, TASKS)
        small = seed_big_job(settings, team_id, records=640, tasks=3, host=SECOND_HOST, seed=1)
        now = datetime.now(UTC)
        with session_scope(settings) as s:
            for name, target, heartbeat in (
                ("measure@third", WORKER_ONLY_HOST, now),
                ("measure@seedhost", SEED_HOST, now - timedelta(hours=1)),
            ):
                fp = target.fingerprint()
                s.add(
                    WorkerRow(
                        name=name,
                        kind="cpu",
                        fingerprint=fp,
                        target=dataclasses.asdict(target),
                        queues=[f"measure.cpu.{fp}"],
                        last_heartbeat=heartbeat,
                    )  # fmt: skip
                )
        yield Farm(client, settings, job, small, other)


def all_pages(farm: Farm, job: int, **params) -> list[dict]:
    out, offset = [], 0
    while True:
        page = farm.client.get(f"{API}/jobs/{job}/records", params={**params, "offset": offset, "limit": 500}).json()
        out += page["records"]
        offset += 500
        if offset >= page["total"]:
            return out


def test_job_records_are_paged_in_sql(farm):
    url = f"{API}/jobs/{farm.job}/records"
    first = farm.client.get(url).json()
    assert first["total"] == RECORDS and len(first["records"]) == 50
    assert all(set(r) == RECORD_FIELDS for r in first["records"])
    ids = [r["id"] for r in first["records"]]
    assert ids == sorted(ids)
    expected = seeded_records()
    names = [t.name for t in seed_tasks(TASKS)]
    for r, (task, error) in zip(first["records"], expected):
        assert (r["task"], r["task_name"], r["error"]) == (task, names[task], error)
        assert r["group"] == GROUP.get(error) and r["created_by"] == f"job/{farm.job}"
        assert (r["mean_cost"] is None) == (error is not None) and r["build_seconds"] > 0 and r["cache"] == "warm"
    last = farm.client.get(url, params={"offset": RECORDS - 10, "limit": 50}).json()
    assert last["total"] == RECORDS and len(last["records"]) == 10
    newest = farm.client.get(url, params={"order": "-id", "limit": 10}).json()["records"]
    assert [r["id"] for r in newest] == [r["id"] for r in reversed(last["records"])]
    assert farm.client.get(url, params={"offset": RECORDS}).json() == {"total": RECORDS, "records": []}
    assert len(farm.client.get(url, params={"limit": 500}).json()["records"]) == 500
    assert_error(farm.client.get(url, params={"limit": 501}), 422, "invalid_request")
    assert_error(farm.client.get(url, params={"order": "mean_cost"}), 422, "invalid_request")


def test_job_records_filters_and_latency_order(farm):
    url = f"{API}/jobs/{farm.job}/records"
    expected = seeded_records()
    for task, error in ((3, None), (None, "timeout"), (7, "run"), (0, "wrong_answer"), (None, "ok"), (None, "failed")):
        params = {k: v for k, v in (("task", task), ("error", error)) if v is not None}

        def wanted(t, e, task=task, error=error):
            in_group = {"ok": e is None, "failed": e is not None, None: True}.get(error, GROUP.get(e) == error)
            return (task is None or t == task) and in_group

        page = farm.client.get(url, params=params).json()
        assert page["total"] == sum(wanted(t, e) for t, e in expected), params
        assert page["records"] and all(wanted(r["task"], r["error"]) for r in page["records"])
    failed = all_pages(farm, farm.job, error="failed")  # four pages of 500: every failed record once
    assert len(failed) == len({r["id"] for r in failed}) == RECORDS // 10
    assert {r["error"] for r in failed} == set(GROUP)

    fastest = farm.client.get(url, params={"order": "latency", "task": 5, "limit": 500}).json()["records"]
    costs = [r["mean_cost"] for r in fastest]
    assert costs == sorted(costs) and None not in costs
    tail = farm.client.get(url, params={"order": "latency", "offset": RECORDS - 5}).json()["records"]
    assert [r["mean_cost"] for r in tail] == [None] * 5  # failed measurements sort last
    assert "no task 19" in assert_error(farm.client.get(url, params={"task": TASKS}), 422, "unknown_task")
    assert_error(farm.client.get(url, params={"error": "segfault"}), 422, "invalid_request")


def test_error_breakdown_groups_codes_in_sql(farm):
    expected = seeded_records()
    body = farm.client.get(f"{API}/jobs/{farm.job}/errors").json()
    counts = {g: sum(GROUP.get(e) == g for _, e in expected) for g in ("build", "run", "timeout", "wrong_answer")}
    assert body["counts"] == counts == {"build": 800, "run": 600, "timeout": 400, "wrong_answer": 200}
    assert body["ok"] == RECORDS - sum(counts.values())
    latest = body["latest"]
    assert len(latest) == 20 and set(latest[0]) == {
        *("record_id", "task", "error", "group", "error_message", "timestamp")
    }
    newest_failed = farm.client.get(
        f"{API}/jobs/{farm.job}/records", params={"error": "failed", "order": "-id", "limit": 20}
    ).json()["records"]
    assert [e["record_id"] for e in latest] == [r["id"] for r in newest_failed]
    assert all(e["group"] == GROUP[e["error"]] and e["error_message"] for e in latest)
    assert [e["task"] for e in latest] == [r["task"] for r in newest_failed]
    assert farm.client.get(f"{API}/jobs/{farm.job}/errors", params={"latest": 0}).json()["latest"] == []


def test_batch_timeline(farm):
    body = farm.client.get(f"{API}/jobs/{farm.job}/batches").json()
    lost = ROUNDS // LOST_EVERY
    batches = body["batches"]
    assert body["total"] == len(batches) == ROUNDS + lost
    sent = [datetime.fromisoformat(b["sent_at"]) for b in batches]
    assert sent == sorted(sent)
    assert {b["worker"] for b in batches} == {"measure@seed-a", "measure@seed-b"}
    assert sum(b["size"] for b in batches if b["state"] == "done") == RECORDS
    gone = [i for i, b in enumerate(batches) if b["state"] == "lost"]
    assert len(gone) == lost and all(batches[i + 1]["try_number"] == 2 for i in gone)
    assert all(batches[i + 1]["task"] == batches[i]["task"] for i in gone)
    done = [b for b in batches if b["state"] == "done"]
    assert sum(sum(b["errors"].values()) for b in done) == RECORDS // 10
    tail = farm.client.get(f"{API}/jobs/{farm.job}/batches", params={"limit": 10}).json()
    assert tail["total"] == body["total"] and tail["batches"] == batches[-10:]


def test_another_team_gets_404_for_the_job_detail(farm):
    b = bearer(farm.other_token)
    for what in ("records", "errors", "batches"):
        assert_error(farm.client.get(f"{API}/jobs/{farm.job}/{what}", headers=b), 404, "not_found")
        assert_error(farm.client.get(f"{API}/jobs/999999/{what}"), 404, "not_found")


def test_coverage_matrix(farm):
    body = farm.client.get(f"{API}/coverage").json()
    hosts = [h["fingerprint"] for h in body["hosts"]]
    seed, second, third = (t.fingerprint() for t in (SEED_HOST, SECOND_HOST, WORKER_ONLY_HOST))
    assert hosts[0] == third and set(hosts) == {seed, second, third}  # hosts with live workers come first
    by_fp = {h["fingerprint"]: h for h in body["hosts"]}
    assert by_fp[third]["alive_workers"] == 1 and by_fp[seed]["alive_workers"] == 0  # its worker is lost
    assert by_fp[second]["cpu_model"] == "Second CPU" and by_fp[third]["cpu_model"] == "Third CPU"
    assert by_fp[seed]["target"] == "llvm -mcpu=znver4" and by_fp[third]["kind"] == "cpu"
    small, big = body["models"]  # newest first
    assert (big["name"], big["tasks"], small["tasks"]) == ("seeded_19_gemms", TASKS, 3)
    column = {fp: i for i, fp in enumerate(hosts)}
    # every task of the big job has error-free records on its host; the small job measured the first three GEMMs
    # (the same workloads) on the second host, so they count for the big model there too
    assert big["task_tuned"][column[seed]] == [True] * TASKS
    assert big["task_tuned"][column[second]] == [True] * 3 + [False] * (TASKS - 3)
    assert big["task_tuned"][column[third]] == [False] * TASKS
    assert big["tuned"] == [sum(row) for row in big["task_tuned"]]
    assert small["task_tuned"][column[seed]] == [True] * 3 and small["tuned"][column[second]] == 3

    exact = farm.client.get(f"{API}/coverage", params={"target": "llvm -mcpu=znver4"}).json()["models"][1]
    assert (
        exact["name"] == big["name"] and exact["tuned"][column[seed]] == TASKS and exact["tuned"][column[second]] == 0
    )
    assert "not supported" in assert_error(
        farm.client.get(f"{API}/coverage", params={"target": "cuda"}), 422, "unsupported_target"
    )
    theirs = farm.client.get(f"{API}/coverage", headers=bearer(farm.other_token)).json()
    assert theirs["models"] == [] and [h["fingerprint"] for h in theirs["hosts"]] == hosts


def test_workloads_browser(farm):
    url = f"{API}/records/workloads"
    body = farm.client.get(url).json()
    tasks = seed_tasks(TASKS)
    per_task = [sum(t == i for t, _ in seeded_records()) for i in range(TASKS)]
    assert body["total"] == TASKS and len(body["workloads"]) == TASKS
    counts = [w["records"] for w in body["workloads"]]
    assert counts == sorted(counts, reverse=True)
    by_key = {w["key"]: w for w in body["workloads"]}
    seed, second = SEED_HOST.fingerprint(), SECOND_HOST.fingerprint()
    for i, t in enumerate(tasks):
        w = by_key[t.key]
        assert (w["op_tag"], w["flops"]) == (t.name, t.flop_count)
        assert w["shapes"]["outputs"] == [list(t.dag.op(t.dag.outputs[0]).shape)]
        hosts = {h["host"]: h for h in w["hosts"]}
        assert set(hosts) == ({seed, second} if i < 3 else {seed})
        assert hosts[seed]["records"] == per_task[i] and w["records"] == sum(h["records"] for h in w["hosts"])
    # each host's best is the fastest of the job's records of that task (as the job's records page orders them)
    for i in (0, 4):
        fastest = farm.client.get(
            f"{API}/jobs/{farm.job}/records", params={"task": i, "order": "latency", "limit": 1}
        ).json()["records"][0]
        best = next(h for h in by_key[tasks[i].key]["hosts"] if h["host"] == seed)
        assert (best["best_record_id"], best["best_latency_s"]) == (fastest["id"], fastest["mean_cost"])

    page = farm.client.get(url, params={"offset": 15, "limit": 5, "order": "flops"}).json()
    assert page["total"] == TASKS and len(page["workloads"]) == 4
    flops = [w["flops"] for w in farm.client.get(url, params={"order": "flops", "limit": 500}).json()["workloads"]]
    assert flops == sorted(t.flop_count for t in tasks)
    assert [w["flops"] for w in farm.client.get(url, params={"order": "-flops"}).json()["workloads"]] == flops[::-1]
    found = farm.client.get(url, params={"q": "MATMUL_64X48"}).json()
    assert found["total"] == sum(t.name.startswith("matmul_64x48") for t in tasks) > 0
    assert farm.client.get(url, params={"q": tasks[7].key[:10]}).json()["workloads"][0]["key"] == tasks[7].key
    assert farm.client.get(url, params={"q": "%"}).json()["total"] == 0  # LIKE wildcards are searched literally
    assert_error(farm.client.get(url, params={"order": "name"}), 422, "invalid_request")


def test_schedule_of_a_seeded_record(farm):
    params = {"task": 2, "error": "ok", "offset": 100, "limit": 1}  # its 100th schedule: both splits by 2 or more
    record = farm.client.get(f"{API}/jobs/{farm.job}/records", params=params).json()["records"][0]
    body = farm.client.get(f"{API}/records/{record['id']}/schedule").json()
    task = seed_tasks(TASKS)[2]
    assert (body["record_id"], body["workload_key"], body["op_tag"]) == (record["id"], task.key, task.name)
    assert body["host"] == SEED_HOST.fingerprint() and body["mean_cost"] == record["mean_cost"]
    state = apply_steps(task.dag, [step_from_record(s) for s in body["steps"]])
    assert body["loop_nest"] == print_func(lower(state))
    assert body["loop_nest"].startswith("def kernel(A: float32[64, 80], B: float32[80, 80], C: float32[64, 80]):")
    assert "for i.1 in range(" in body["loop_nest"] and "for j.1 in range(" in body["loop_nest"]


# ---------------------------------------------------------------------------------------------- schedules, workers


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings.from_env(
        {
            "TILEFARM_DATABASE_URL": f"sqlite:///{tmp_path / 'tilefarm.db'}",
            "TILEFARM_STORAGE_DIR": str(tmp_path / "storage"),
            "TILEFARM_BOOTSTRAP_TOKEN": TOKEN,
        }
    )


@pytest.fixture
def client(settings):
    with TestClient(create_app(settings), headers=bearer(TOKEN)) as c:
        yield c


def searched_steps(dag, seed: int = 0) -> list:
    """The steps of a program as the search makes one: a sketch of the DAG with sampled annotations."""
    rng = np.random.default_rng(seed)
    sketches = generate_sketches(dag, host_target())
    while True:
        sketch = sketches[int(rng.integers(len(sketches)))]
        try:
            return [s.record() for s in materialize(sketch, sample(sketch, rng, cores=2)).steps]
        except InvalidProgram:
            continue


def test_schedule_of_a_searched_program_and_of_records_that_do_not_replay(client, settings, tiny_cnn):
    model = client.post(f"{API}/models", files={"file": ("tiny_cnn.onnx", tiny_cnn)}).json()
    conv = model["tasks"][0]
    assert conv["name"] == "fused_conv_relu"
    from server.catalog import workload_dag
    from server.models import Workload

    with session_scope(settings, write=False) as s:
        dag = workload_dag(conv["workload_key"], s.scalars(select(Workload.dag_json).where(
            Workload.key == conv["workload_key"])).one())  # fmt: skip
    here = host_target()
    steps = searched_steps(dag)

    def line(key: str, steps: list, cost: float) -> str:
        fields = {"workload_key": key, "target": target_name(here), "host": here.fingerprint(), "steps": steps}
        return json.dumps({**fields, "costs": [cost]}) + "\n"

    stale = line(conv["workload_key"], [["SP", 99, 0, [4], True]], 2e-4)
    r = client.post(f"{API}/records/import", content=stale)  # an import whose steps do not replay is refused ...
    assert "line 1" in r.text and "do not replay" in r.text and r.status_code == 422
    known = {"added": 1, "unknown_workloads": []}
    assert client.post(f"{API}/records/import", content=line(conv["workload_key"], steps, 1e-4)).json() == known
    with SQLDatabase(settings.database_url) as db:  # ... but a record of another tilefarm version may be stored
        assert db.commit(TuningRecord.from_json(stale))
    unknown = line("f" * 32, steps, 3e-4)  # a workload no model describes: only its key is known
    assert client.post(f"{API}/records/import", content=unknown).json() == {"added": 1, "unknown_workloads": ["f" * 32]}
    ids = [r["id"] for r in client.get(f"{API}/records", params={"limit": 3}).json()["records"]]

    got = client.get(f"{API}/records/{ids[0]}/schedule").json()
    assert got["steps"] == steps and got["op_tag"] == "fused_conv_relu" and got["mean_cost"] == 1e-4
    assert got["loop_nest"] == print_func(lower(apply_steps(dag, [step_from_record(s) for s in steps])))
    assert got["loop_nest"].startswith("def kernel(input: float32[1, 3, 32, 32]")
    assert "# parallel" in got["loop_nest"] and "relu" in got["loop_nest"]

    detail = assert_error(client.get(f"{API}/records/{ids[1]}/schedule"), 422, "schedule_does_not_replay")
    assert "step 0" in detail and conv["workload_key"] in detail
    assert "no stored DAG" in assert_error(client.get(f"{API}/records/{ids[2]}/schedule"), 422, "no_dag")
    assert_error(client.get(f"{API}/records/{ids[2] + 1}/schedule"), 404, "not_found")


def test_workers_state_and_current_job(client, settings, tiny_cnn):
    model = client.post(f"{API}/models", files={"file": ("tiny_cnn.onnx", tiny_cnn)}).json()
    job = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 8}).json()
    with session_scope(settings) as s:
        _, other_token = accounts.create_token(s, accounts.ensure_team(s, "other"), "b")
    theirs = client.post(
        f"{API}/models", files={"file": ("tiny_cnn.onnx", tiny_cnn)}, headers=bearer(other_token)
    ).json()
    their_job = client.post(
        f"{API}/jobs", json={"model_id": theirs["id"], "trials": 8}, headers=bearer(other_token)
    ).json()
    now = datetime.now(UTC)
    with session_scope(settings) as s:
        s.get_one(Job, job["id"]).state, s.get_one(Job, job["id"]).worker = "running", "search@a"
        for batch, job_id, task in (("b-mine", job["id"], 2), ("b-theirs", their_job["id"], 1)):
            s.add(MeasureBatch(id=batch, job_id=job_id, task=task, size=8, queue="q", state="running", sent_at=now))
        for name, heartbeat, stopped, batch in (
            ("measure@busy", now, False, "b-mine"),
            ("measure@theirs", now, False, "b-theirs"),
            ("measure@lost", now - timedelta(hours=1), False, None),
            ("measure@stopped", now, True, None),
            ("search@a", now, False, None),
        ):
            s.add(
                WorkerRow(
                    name=name,
                    kind="search" if name.startswith("search") else "cpu",
                    fingerprint="f" * 16,
                    queues=["q"],
                    last_heartbeat=heartbeat,
                    stopped=stopped,
                    current_batch=batch,
                )  # fmt: skip
            )
    workers = {w["name"]: w for w in client.get(f"{API}/workers").json()}
    assert {n: w["state"] for n, w in workers.items()} == {
        "measure@busy": "alive",
        "measure@theirs": "alive",
        "measure@lost": "lost",
        "measure@stopped": "stopped",
        "search@a": "alive",
    }
    assert [w["alive"] for w in workers.values()] == [w["state"] == "alive" for w in workers.values()]
    current = {n: (w["current_batch"], w["current_job"], w["current_task"]) for n, w in workers.items()}
    assert current["measure@busy"] == ("b-mine", job["id"], 2)
    assert current["measure@theirs"] == ("b-theirs", None, None)  # another team's job is not named
    assert current["search@a"] == (None, job["id"], None)  # the search it runs
    assert current["measure@lost"] == (None, None, None)
    seen_by_them = {w["name"]: w for w in client.get(f"{API}/workers", headers=bearer(other_token)).json()}
    assert seen_by_them["measure@theirs"]["current_job"] == their_job["id"]
    assert seen_by_them["measure@busy"]["current_job"] is None and seen_by_them["search@a"]["current_job"] is None


# ---------------------------------------------------------------------------------------------- records.job_id


def test_records_carry_their_job_until_it_is_deleted(url, tmp_path):
    settings = Settings.from_env({"TILEFARM_DATABASE_URL": url, "TILEFARM_STORAGE_DIR": str(tmp_path)})
    with session_scope(settings) as s:
        team = accounts.ensure_team(s, "t")
        s.flush()
        model = UploadedModel(team_id=team.id, sha256="0" * 64, name="m", size_bytes=0, path="m.onnx")
        s.add(model)
        s.flush()
        job = Job(team_id=team.id, model_id=model.id, target="llvm", host="h", queue="q", trials=4)
        s.add(job)
        s.flush()
        job_id = job.id

    def rec(tile: int, error: str | None = None) -> TuningRecord:
        return TuningRecord("w" * 32, "llvm", "h", (("SP", 0, 0, (tile,), True),), () if error else (1e-3,), error)

    with SQLDatabase(url, created_by=f"job/{job_id}", job_id=job_id) as db:
        # a measure batch: its records with their build and run seconds
        assert db.import_records([rec(1), rec(2, "build")], seconds=[(0.5, 0.25), (0.75, None)]) == 2
        assert db.commit(rec(3))  # what the search commits itself (a lost batch's candidates)
        assert db.import_records([rec(4)], created_by="import") == 1
        assert not db.commit(rec(4))  # already stored: keeps the provenance it came with
    with SQLDatabase(url) as db:
        db.import_records([rec(5)])
        with pytest.raises(ValueError):  # one (build, run) pair per record
            db.import_records([rec(6), rec(7)], seconds=[(0.1, 0.1)])

    def rows():
        with session_scope(settings, write=False) as s:
            q = select(Record.job_id, Record.created_by, Record.build_seconds, Record.run_seconds).order_by(Record.id)
            return [tuple(r) for r in s.execute(q)]

    assert rows()[:5] == [
        (job_id, f"job/{job_id}", 0.5, 0.25),
        (job_id, f"job/{job_id}", 0.75, None),
        (job_id, f"job/{job_id}", None, None),
        (job_id, "import", None, None),
        (None, None, None, None),
    ]
    with session_scope(settings) as s:
        s.execute(delete(Job).where(Job.id == job_id))
    assert [r[0] for r in rows()] == [None] * 5  # ON DELETE SET NULL: the records stay
