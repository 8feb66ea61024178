"""GPU hosts in the farm, on a machine without a GPU: a fake CUDA driver (compiler.targets.cuda.fingerprint's
DeviceQueries) reports an H200 and its kin. A GPU is a host class named by its fingerprint: its queue, its worker's
row and heartbeat, the service's cuda jobs and compiles, measurement batches routed to it through real Redis and
answered by a fake GPU worker with recorded timings (the worker's own `_measure`, its builder and runner replaced),
its records keyed by it and borrowed by compile for another GPU of the architecture, and the dashboard's lines."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import numpy as np
import pytest
from sqlalchemy import select, update

from compiler.base.errors import InvalidTarget, TilefarmError
from compiler.base.target import Target
from compiler.costs.measure import BuildResult, MeasureInput, MeasureResult
from compiler.costs.records import JSONLinesDatabase, TuningRecord, as_tuples, best_replaying, target_name
from compiler.schedule.state import step_from_record
from compiler.search.evolution import SearchParams
from compiler.search.transfer import NOTHING_TO_LEARN, ModelCache, featurize_records
from compiler.targets import backend_for, host_target, parse_target
from compiler.targets.cuda import driver as cu
from compiler.tensor import te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops.linalg import matmul
from compiler.tensor.tasks import Task
from server.database import SQLDatabase, this_host
from server.db import session_scope
from server.models import Job, WorkerRow
from server.settings import Settings
from tests.browser import REPO
from tests.test_api import API, TOKEN, bearer, broker_messages
from workers import heartbeat, measuring, progress
from workers.celery_app import MEASURE_BATCH, make_celery, measure_queue


class FakeGpu:
    """DeviceQueries of one GPU (an H200 on driver 580, CUDA 13.0, unless told otherwise), and device_count."""

    def __init__(self, name="NVIDIA H200", cc=(9, 0), sms=132, version=13000, clock_khz=1_980_000):
        self.name, self._version = name, version
        self.attributes = {
            cu.ATTR_MULTIPROCESSOR_COUNT: sms,
            cu.ATTR_COMPUTE_CAPABILITY_MAJOR: cc[0],
            cu.ATTR_COMPUTE_CAPABILITY_MINOR: cc[1],
            cu.ATTR_CLOCK_RATE_KHZ: clock_khz,
            cu.ATTR_MEMORY_CLOCK_RATE_KHZ: 3_201_000,
            cu.ATTR_MEMORY_BUS_WIDTH: 6144,
            cu.ATTR_L2_CACHE_SIZE: 60 << 20,
            cu.ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232_448,
        }

    def version(self) -> int:
        return self._version

    def device_count(self) -> int:
        return 1

    def device(self, ordinal: int = 0) -> int:
        return ordinal

    def device_name(self, device: int) -> str:
        return self.name

    def attribute(self, device: int, attribute: int) -> int:
        return self.attributes[attribute]

    def total_memory(self, device: int) -> int:
        return 150_000_000_000


H200 = measuring.gpu(0, FakeGpu())
H200_DRIVER_575 = measuring.gpu(0, FakeGpu(version=12090))  # the same card, another driver: its own host class
H100 = measuring.gpu(0, FakeGpu("NVIDIA H100 80GB HBM3", sms=114, clock_khz=1_755_000))
CUDA = target_name(H200.target)


def matmul_task(n: int = 64) -> Task:
    a, b = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
    dag = ComputeDAG([a, b, matmul(a, b)])
    return Task(dag.workload_key, dag, f"matmul_{n}")


def gpu_programs(task: Task, n: int, seed: int = 0) -> list[tuple]:
    """The task's default GPU schedule and n-1 sampled GPU programs, as step tuples."""
    target = parse_target("cuda")
    backend = backend_for(target)
    space = backend.search_space(task.dag, target, SearchParams())
    rng = np.random.default_rng(seed)
    programs = [tuple(backend.default_schedule(task.dag, target).steps)]
    while len(programs) < n:
        try:
            programs.append(tuple(space.sample(0, rng)[1].steps))
        except TilefarmError:
            continue
    return programs


def record(task: Task, steps: tuple, host: measuring.MeasuringHost, seconds: float) -> TuningRecord:
    return TuningRecord(task.key, CUDA, host.fingerprint, tuple(as_tuples(s.record()) for s in steps), (seconds,))


# ---------------------------------------------------------------------------------------------- host classes


def test_a_gpu_is_a_host_class_named_by_its_fingerprint():
    from workers.worker import default_queues

    key = H200.gpu.key()
    assert H200.kind == "gpu" and H200.target.kind == "cuda" and CUDA == "cuda -arch=sm_90"
    assert H200.fingerprint == key and H200.queue == f"measure.gpu.{key}" == measure_queue(key, "cuda")
    assert H200.target.l2_bytes == 60 << 20  # the GPU's own L2, not the architecture's guess
    assert "NVIDIA H200 (sm_90, 132 SMs" in H200.target.cpu_model
    # what a kernel's time depends on makes another host class: the driver (its JIT), the GPU model and clocks
    assert len({H200.queue, H200_DRIVER_575.queue, H100.queue}) == 3
    assert target_name(H100.target) == target_name(H200_DRIVER_575.target) == CUDA
    # an sm_86 runs sm_80 code, and is not an A100
    a10 = measuring.gpu(0, FakeGpu("NVIDIA A10", cc=(8, 6), sms=72))
    a100 = measuring.gpu(0, FakeGpu("NVIDIA A100-SXM4-80GB", cc=(8, 0), sms=108))
    assert a10.target.mcpu == a100.target.mcpu == "sm_80" and a10.fingerprint != a100.fingerprint
    with pytest.raises(InvalidTarget, match=r"NVIDIA T4 is sm_75: tilefarm generates code for sm_80\|sm_90 only"):
        measuring.gpu(0, FakeGpu("NVIDIA T4", cc=(7, 5)))
    with pytest.raises(TilefarmError, match=r"^no GPU 1: the driver reports 1 GPU\(s\), numbered from 0$"):
        measuring.gpu(1, FakeGpu())
    assert default_queues("measure", H200) == [H200.queue]
    assert default_queues("all", H200) == ["search", H200.queue]
    assert default_queues("measure") == [f"measure.cpu.{host_target().fingerprint()}"]


def test_tilefarm_worker_gpu_says_what_is_wrong(monkeypatch, tmp_path, capsys):
    from workers.worker import main

    with pytest.raises(SystemExit) as e:
        main(["--gpu", "0", "--role", "search"])
    assert e.value.code == 2 and "--gpu is for a measuring worker" in capsys.readouterr().err
    monkeypatch.setenv("TILEFARM_LIBCUDA", str(tmp_path / "no-libcuda.so.1"))
    with pytest.raises(SystemExit) as e:
        main(["--gpu", "0", "--role", "measure"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--gpu 0: no CUDA driver on this host: cannot load" in err
    assert "Traceback" not in err


def test_a_gpu_workers_row_and_heartbeat_report_its_gpu(tmp_path, monkeypatch):
    """heartbeat's setup as Celery calls it, on a GPU worker: its row says kind gpu, the GPU's fingerprint, queue and
    fields; it beats; live_target (what a job's search waits on) gives its Target while it lives, none once stopped."""
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    SQLDatabase(url, upgrade_schema=True).close()
    settings = Settings.from_env(
        {"TILEFARM_DATABASE_URL": url, "TILEFARM_STORAGE_DIR": str(tmp_path / "storage"), "TILEFARM_HEARTBEAT_S": "0.1"}
    )
    app = SimpleNamespace(amqp=SimpleNamespace(queues=SimpleNamespace(consume_from={H200.queue: None})))
    monkeypatch.setattr(measuring, "_current", H200)
    monkeypatch.setattr(heartbeat, "_node", heartbeat._Node(settings, app))
    heartbeat._on_setup(sender="gpu0@box", instance=SimpleNamespace(app=app))
    try:
        with session_scope(settings, write=False) as s:
            w = s.scalars(select(WorkerRow).where(WorkerRow.name == "gpu0@box")).one()
            first_beat = w.last_heartbeat
        assert w.kind == "gpu" and w.fingerprint == H200.gpu.key() and w.queues == [H200.queue]
        assert Target(**w.target) == H200.target and Target(**w.target).fingerprint() == w.fingerprint
        assert w.device["name"] == "NVIDIA H200" and w.device["sm_count"] == 132
        assert w.device["compute_capability"] == [9, 0] and w.device["memory_bytes"] == 150_000_000_000
        assert w.device["cuda_version"] == "13.0" and w.device["sm_clock_mhz"] == 1980
        assert w.device["memory_clock_mhz"] == 3201 and w.device["key"] == w.fingerprint

        def beaten() -> bool:
            with session_scope(settings, write=False) as s:
                return s.scalars(select(WorkerRow.last_heartbeat)).one() > first_beat

        deadline = time.monotonic() + 20
        while not beaten():
            assert time.monotonic() < deadline, "the GPU worker never beat"
            time.sleep(0.1)
        assert Target(**progress.live_target(settings, H200.queue)) == H200.target
        assert progress.live_target(settings, H100.queue) is None  # no worker of that GPU: its jobs wait
    finally:
        heartbeat._on_shutdown()
    assert progress.live_target(settings, H200.queue) is None  # stopped: a job for it waits for another


# ---------------------------------------------------------------------------------------------- the service


@pytest.fixture
def service(tmp_path, monkeypatch, tiny_cnn):
    """The API (TestClient) on SQLite and the embedded broker, as tests/test_api.py runs it, with tiny_cnn uploaded:
    (settings, client, model)."""
    from fastapi.testclient import TestClient

    from server.app import create_app

    for name in [k for k in os.environ if k.startswith("TILEFARM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TILEFARM_DATABASE_URL", f"sqlite:///{tmp_path / 'tilefarm.db'}")
    monkeypatch.setenv("TILEFARM_STORAGE_DIR", str(tmp_path / "storage"))
    monkeypatch.setenv("TILEFARM_BOOTSTRAP_TOKEN", TOKEN)
    with TestClient(create_app(), headers=bearer(TOKEN)) as client:
        uploaded = client.post(f"{API}/models", files={"file": ("tiny_cnn.onnx", tiny_cnn)})
        assert uploaded.status_code == 201, uploaded.text
        yield Settings.from_env(), client, uploaded.json()


def register(settings: Settings, name: str, host: measuring.MeasuringHost) -> None:
    """A GPU worker's row, as its heartbeat writes it."""
    progress.register_worker(
        settings, name, kind=host.kind, fingerprint=host.fingerprint, target=measuring.as_fields(host),
        device=host.device(), queues=[host.queue], pid=1234, hostname=name.split("@")[1],
    )  # fmt: skip


def test_the_api_queues_cuda_jobs_and_compiles_to_the_gpu_and_refuses_what_is_wrong(service):
    settings, client, model = service

    def post(target: str, host: str | None = None):
        return client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 8, "target": target, "host": host})

    def refused(r, code: str) -> str:
        assert r.status_code == 422 and r.json()["code"] == code, r.text
        return r.json()["detail"]

    # no GPU worker ever registered: nothing to measure on, said with how to start one
    assert "no GPU worker for cuda -arch=sm_90 has registered: start `tilefarm worker --role measure --gpu 0`" in (
        refused(post("cuda"), "unknown_host")
    )
    register(settings, "gpu0@h200-box", H200)
    job = post("cuda")
    assert job.status_code == 201, job.text
    job = job.json()
    assert job["target"] == "cuda -arch=sm_90" and job["target_kind"] == "gpu" and job["host"] == H200.fingerprint
    assert broker_messages(settings, "search") == [{"task": "tilefarm.search_job", "args": [job["id"], 1]}]
    with session_scope(settings, write=False) as s:
        assert s.get_one(Job, job["id"]).queue == H200.queue == f"measure.gpu.{H200.gpu.key()}"
    assert client.get(f"{API}/jobs/{job['id']}").json()["target_kind"] == "gpu"
    cpu_job = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 8}).json()
    assert cpu_job["target_kind"] == "cpu" and cpu_job["host"] == this_host()
    r = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 8, "host": H200.fingerprint})
    assert "is a GPU host class (cuda -arch=sm_90): ask for target cuda" in refused(r, "unsupported_target")

    # what is wrong is named: the arch, an option, a CPU host class, an architecture no GPU worker has
    assert "-arch=sm_61 is not supported; choose -arch=sm_80|sm_90" in refused(
        post("cuda -arch=sm_61"), "unsupported_target"
    )
    assert "option -mcpu is not supported" in refused(post("cuda -mcpu=sm_90"), "unsupported_target")
    assert f"host '{this_host()}' is a CPU host class, not one of cuda -arch=sm_90" in (
        refused(post("cuda", this_host()), "unsupported_target")
    )
    assert "no GPU worker for cuda -arch=sm_80 has registered" in refused(post("cuda -arch=sm_80"), "unknown_host")

    # two live GPU classes of sm_90: name one; a named one is taken as is
    register(settings, "gpu0@h100-box", H100)
    detail = refused(post("cuda -arch=sm_90"), "ambiguous_host")
    assert "2 GPU host classes of cuda -arch=sm_90 have live workers" in detail and H100.fingerprint in detail
    on_h100 = post("cuda", H100.fingerprint).json()
    assert on_h100["host"] == H100.fingerprint
    with session_scope(settings) as s:
        assert s.get_one(Job, on_h100["id"]).queue == H100.queue
        s.execute(update(WorkerRow).where(WorkerRow.name == "gpu0@h100-box").values(stopped=True))
    assert post("cuda").json()["host"] == H200.fingerprint  # the one live again

    # none live: the class heard from last takes the job, which waits for a worker of it, as a CPU job does
    with session_scope(settings) as s:
        for name, hours in (("gpu0@h200-box", 1), ("gpu0@h100-box", 2)):
            old = datetime.now(UTC) - timedelta(hours=hours)
            s.execute(update(WorkerRow).where(WorkerRow.name == name).values(last_heartbeat=old))
    waiting = post("cuda").json()
    assert waiting["host"] == H200.fingerprint and waiting["state"] == "queued"
    assert progress.live_target(settings, H200.queue) is None  # what its search waits on (workers.tasks)

    # a compile for cuda goes to the GPU's queue
    artifact = client.post(f"{API}/models/{model['id']}/compile", json={"target": "cuda"})
    assert artifact.status_code == 202, artifact.text
    assert artifact.json()["target"] == "cuda -arch=sm_90" and artifact.json()["host"] == H200.fingerprint
    compile_messages = broker_messages(settings, H200.queue)
    assert compile_messages == [{"task": "tilefarm.compile_artifact", "args": [artifact.json()["id"]]}]

    # the workers list shows each GPU worker's GPU (the dashboard's Workers page reads it)
    workers = {w["name"]: w for w in client.get(f"{API}/workers").json()}
    gpu = workers["gpu0@h200-box"]["gpu"]
    assert workers["gpu0@h200-box"]["kind"] == "gpu" and workers["gpu0@h200-box"]["queues"] == [H200.queue]
    assert gpu == {
        "name": "NVIDIA H200", "sm_count": 132, "compute_capability": "9.0", "memory_bytes": 150_000_000_000,
        "cuda_version": "13.0", "driver_release": H200.gpu.driver_release, "sm_clock_mhz": 1980,
        "memory_clock_mhz": 3201,
    }  # fmt: skip
    assert workers["gpu0@h100-box"]["gpu"]["sm_count"] == 114


# ---------------------------------------------------------------------------------------------- batches on Redis


def _redis_url() -> str:
    from tests.test_farm import _redis_db

    return _redis_db()


def test_a_cuda_batch_reaches_its_gpus_queue_and_its_records_name_the_gpu(tmp_path, monkeypatch):
    """FarmRunner sends a cuda job's batch to measure.gpu.<key> on Redis; a fake GPU worker takes it from that queue,
    measures it with the worker's own `_measure` (its builder and runner answering with recorded timings) and
    answers through the result backend. The records it stores name the GPU; compile for another GPU of the
    architecture borrows them, the search never does."""
    import redis

    from workers import tasks as worker
    from workers.farm import FarmBuilder, FarmRunner

    broker = _redis_url()
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    SQLDatabase(url, upgrade_schema=True).close()
    settings = Settings.from_env(
        {"TILEFARM_DATABASE_URL": url, "TILEFARM_BROKER_URL": broker, "TILEFARM_STORAGE_DIR": str(tmp_path / "s")}
    )
    task = matmul_task()
    programs = gpu_programs(task, 3)
    recorded = {json.dumps(as_tuples([s.record() for s in p])): 1e-5 * (i + 2) for i, p in enumerate(programs)}

    class RecordedBuilder:
        def build(self, inputs):
            return [BuildResult(f"built-{i}", None, "", 0.01) for i, _ in enumerate(inputs)]

    class RecordedRunner:
        def run(self, inputs, builds):
            keys = [json.dumps(as_tuples([s.record() for s in i.steps])) for i in inputs]
            return [MeasureResult((recorded[k],), None, "", 0.01, 0.02) for k in keys]

    monkeypatch.setattr(worker, "settings", settings)
    monkeypatch.setattr(measuring, "_current", H200)
    monkeypatch.setattr(worker, "_builder", lambda options: RecordedBuilder())
    monkeypatch.setattr(worker, "_runner", lambda options: RecordedRunner())
    app = make_celery(settings)
    client = redis.Redis.from_url(broker)
    seen: dict = {}

    def gpu_worker() -> None:
        taken = client.brpop([H200.queue], timeout=60)
        if taken is None:
            return
        message = json.loads(taken[1])
        args, _, _ = json.loads(base64.b64decode(message["body"]))
        seen.update(queue=taken[0].decode(), task=message["headers"]["task"], payload=args[0])
        results = worker._measure(args[0], message["headers"]["id"])
        app.backend.store_result(message["headers"]["id"], {"results": results}, "SUCCESS")

    fake = threading.Thread(target=gpu_worker, daemon=True)
    fake.start()
    inputs = [MeasureInput(task, p) for p in programs]
    runner = FarmRunner(settings, app, job_id=None, queue=H200.queue, host=H200.fingerprint)
    results = runner.run(inputs, FarmBuilder().build(inputs))
    fake.join(30)
    assert seen["queue"] == H200.queue and seen["task"] == MEASURE_BATCH
    assert seen["payload"]["host"] == H200.fingerprint and len(seen["payload"]["candidates"]) == 3
    assert client.llen(measure_queue(host_target().fingerprint())) == 0  # nothing went to a CPU
    assert [r.costs for r in results] == [(1e-5 * (i + 2),) for i in range(3)]

    with SQLDatabase(url) as db:
        stored = list(db)
        assert {(r.host, r.target) for r in stored} == {(H200.gpu.key(), "cuda -arch=sm_90")} and len(stored) == 3
        [fastest] = db.best(task.key, CUDA, H200.fingerprint)
        assert fastest.costs == (2e-5,) and fastest.steps == stored[0].steps  # the default schedule: recorded fastest
        # the same GPU's records are its own; another GPU (or a laptop compiling for cuda) borrows them at compile
        found = best_replaying(task, db, H200.target)
        assert found is not None and found[0].host == H200.fingerprint
        for other in (H200_DRIVER_575.target, parse_target("cuda")):
            assert best_replaying(task, db, other) is None  # the search of another GPU starts from its own
            borrowed = best_replaying(task, db, other, others=True)
            assert borrowed is not None and borrowed[0].host == H200.fingerprint and borrowed[0].costs == (2e-5,)
        assert best_replaying(task, db, parse_target("cuda -arch=sm_80"), others=True) is None  # another arch
    # a sent batch that a worker of another GPU takes is refused, not measured as if it were its own
    monkeypatch.setattr(measuring, "_current", H100)
    refused = worker._measure(seen["payload"])
    assert all(r["error"] == "unknown" and "this worker measures host class" in r["message"] for r in refused)
    client.flushdb()


class RecordedBuilder:
    """Builds nothing (the fake GPU worker's programs are never run)."""

    def build(self, inputs):
        return [BuildResult(f"built-{i}", None, "", 0.01) for i, _ in enumerate(inputs)]


class RecordedRunner:
    """Answers each program with its recorded time: a fixed function of its steps."""

    def run(self, inputs, builds):
        return [MeasureResult((recorded_time(i.steps),), None, "", 0.01, 0.02) for i in inputs]


def recorded_time(steps) -> float:
    digest = hashlib.sha256(json.dumps(as_tuples([s.record() for s in steps])).encode()).digest()
    return 1e-5 * (1 + int.from_bytes(digest[:2]) / 65536)


def test_a_cuda_job_is_tuned_by_a_search_worker_on_a_fake_gpu_workers_timings(tmp_path, monkeypatch, tiny_cnn):
    """The whole way: a cuda job through the API, a real search worker (a subprocess on Redis) drives the GPU search
    and sends every batch to measure.gpu.<key>, where a fake GPU worker (this process: the worker's own progress
    calls and `_measure`, answering with recorded timings) measures it. The job succeeds on the GPU's records."""
    import redis
    from fastapi.testclient import TestClient

    from server.app import create_app
    from workers import tasks as worker

    broker = _redis_url()
    env = {
        "TILEFARM_DATABASE_URL": f"sqlite:///{tmp_path / 'farm.db'}",
        "TILEFARM_BROKER_URL": broker,
        "TILEFARM_STORAGE_DIR": str(tmp_path / "storage"),
        "TILEFARM_BOOTSTRAP_TOKEN": TOKEN,
        "TILEFARM_HEARTBEAT_S": "0.5",
        "TILEFARM_WORKER_GRACE_S": "120",  # the fake GPU worker writes no heartbeat
        "TILEFARM_SEARCH_POPULATION": "64",  # the farm is tested here, not the search
    }
    for name in [k for k in os.environ if k.startswith("TILEFARM_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings.from_env()
    monkeypatch.setattr(worker, "settings", settings)
    monkeypatch.setattr(measuring, "_current", H200)
    monkeypatch.setattr(worker, "_builder", lambda options: RecordedBuilder())
    monkeypatch.setattr(worker, "_runner", lambda options: RecordedRunner())
    app = make_celery(settings)
    r = redis.Redis.from_url(broker)
    stop, batches, node = threading.Event(), [], "gpu0@fake"
    programs: set[tuple[str, str]] = set()  # (workload, steps) the fake GPU measured

    def gpu_worker() -> None:
        while not stop.is_set():
            taken = r.brpop([H200.queue], timeout=1)
            if taken is None:
                continue
            message = json.loads(taken[1])
            batch_id, (args, _, _) = message["headers"]["id"], json.loads(base64.b64decode(message["body"]))
            assert progress.batch_taken(settings, batch_id, node) and progress.batch_running(settings, batch_id, node)
            results = worker._measure(args[0], batch_id)
            progress.batch_finished(settings, batch_id, node, len(results), {})
            app.backend.store_result(batch_id, {"results": results}, "SUCCESS")
            batches.append(len(results))
            programs.update((args[0]["workload_key"], json.dumps(c["steps"])) for c in args[0]["candidates"])

    search = None
    fake = threading.Thread(target=gpu_worker, daemon=True)
    try:
        with TestClient(create_app(), headers=bearer(TOKEN)) as client:
            model = client.post(f"{API}/models", files={"file": ("tiny_cnn.onnx", tiny_cnn)}).json()
            register(settings, node, H200)
            job = client.post(
                f"{API}/jobs", json={"model_id": model["id"], "target": "cuda", "trials": 16, "per_round": 8}
            ).json()
            fake.start()
            log = (tmp_path / "search.log").open("wb")
            search = subprocess.Popen(
                [sys.executable, "-m", "workers.worker", "--role", "search", "--name", "search@test"],
                cwd=REPO, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            deadline = time.monotonic() + 300
            while (done := client.get(f"{API}/jobs/{job['id']}").json())["state"] not in ("succeeded", "failed"):
                assert time.monotonic() < deadline and search.poll() is None, (tmp_path / "search.log").read_text()
                time.sleep(0.5)
        assert done["state"] == "succeeded", (done, (tmp_path / "search.log").read_text()[-3000:])
        assert done["target_kind"] == "gpu" and done["trials_done"] >= 16
        best = [t["latency_s"] for t in done["tasks"] if t["latency_s"] is not None]
        assert best and all(1e-5 <= b < 2e-5 for b in best)  # the GPU's recorded timings, task by task
        with SQLDatabase(env["TILEFARM_DATABASE_URL"]) as db:
            stored = list(db)
        # every measurement went through the GPU's queue (the new programs, and the fastest timed again beside others):
        # one record per program it measured
        assert len(stored) == len(programs) and sum(batches) >= len(programs)
        assert {(rec.host, rec.target) for rec in stored} == {(H200.fingerprint, "cuda -arch=sm_90")}
        for rec in stored:
            assert set(rec.costs) == {recorded_time([step_from_record(x) for x in rec.steps])}
    finally:
        stop.set()
        if search is not None:
            os.killpg(search.pid, signal.SIGKILL)
            search.wait(30)
        fake.join(10)
        r.flushdb()


# ---------------------------------------------------------------------------------------------- records, transfer


def test_records_of_another_gpu_of_the_arch_stand_in_at_compile_but_never_for_a_cpu(tmp_path):
    task = matmul_task(32)
    programs = gpu_programs(task, 4, seed=1)
    db = JSONLinesDatabase(tmp_path / "records.jsonl")
    for i, p in enumerate(programs):
        db.commit(record(task, p, H100, 3e-5 - i * 1e-6))  # the last is the H100's fastest
        db.commit(record(task, p, H200, 1e-5 + i * 1e-6))  # the first is the H200's fastest
    own = best_replaying(task, db, H200.target, others=True)
    assert own is not None and own[0].host == H200.fingerprint and own[0].costs == (1e-5,)
    # another H200 driver: the GPU of the fastest record lends its whole ranking (no mixing of two GPUs' timings)
    lent = best_replaying(task, db, H200_DRIVER_575.target, others=True)
    assert lent is not None and lent[0].host == H200.fingerprint and lent[1] == own[1]
    with pytest.raises(ValueError, match="give a host or cross_host=True, not both"):
        db.best(task.key, CUDA, H200.fingerprint, cross_host=True)

    cpu = host_target()
    other_cpu = replace(cpu, cores=cpu.cores + 64)  # another CPU host class, same target string
    steps = tuple(backend_for(cpu).default_schedule(task.dag, cpu).steps)
    db.commit(
        TuningRecord(
            task.key, target_name(cpu), other_cpu.fingerprint(), tuple(as_tuples(s.record()) for s in steps), (1.0,)
        )
    )
    assert best_replaying(task, db, cpu, others=True) is None  # a CPU's records are its own host class's alone


class Source:
    """A TrainingSource over records in memory (the SQL database in the service)."""

    def __init__(self, records: list[TuningRecord], dags: dict):
        self.records, self.dags = records, dags

    def workload_dags(self):
        return self.dags

    def training_records(self, host=None, after=0):
        return ((i, r) for i, r in enumerate(self.records, 1) if i > after and (host is None or r.host == host))

    def count_records(self, host=None, after=0):
        return sum(1 for _ in self.training_records(host, after))


def test_a_new_gpu_pretrains_on_the_other_gpus_of_its_arch(tmp_path):
    task = matmul_task(32)
    programs = gpu_programs(task, 8, seed=2)
    h100 = [record(task, p, H100, 1e-5 * (1 + i % 5)) for i, p in enumerate(programs)]
    h200 = [record(task, p, H200, 2e-5 * (1 + i % 3)) for i, p in enumerate(programs)]
    source = Source(h100 + h200, {task.key: task.dag})
    cache = ModelCache(tmp_path / "cache")

    model, line = cache.load_or_train(source, "db", H200.target)  # its own records: cached
    assert model is not None and line.startswith("cost model pre-trained on 8 records of 1 workloads")
    assert cache.path_for("db", H200.target).exists()
    model, line = cache.load_or_train(source, "db", H200_DRIVER_575.target)  # none of its own: the other GPUs'
    assert model is not None and "16 records of 2 other host classes of cuda -arch=sm_90" in line
    assert (
        "none measured on this one yet; not cached" in line
        and not cache.path_for("db", H200_DRIVER_575.target).exists()
    )
    data = featurize_records(h100 + h200, {task.key: task.dag}, H200.target, by_host=True)
    assert {g.rsplit("@", 1)[1] for g in data.groups} == {H100.fingerprint, H200.fingerprint}  # normalized per GPU

    cpu = host_target()
    other_cpu_records = [replace(r, target=target_name(cpu), host="another-cpu") for r in h100]
    assert cache.load_or_train(Source(other_cpu_records, {task.key: task.dag}), "db", cpu) == (None, NOTHING_TO_LEARN)


# ---------------------------------------------------------------------------------------------- the dashboard


def test_the_dashboard_shows_a_gpu_hosts_gpu_and_a_jobs_kind():
    """The dashboard's own formatting (server/dashboard/static/js/format.js), run by Node: the Workers page's GPU
    column and the jobs pages' kind."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run the dashboard's modules")
    module = (REPO / "server/dashboard/static/js/format.js").as_uri()
    gpu = {"name": "NVIDIA H200", "sm_count": 132, "compute_capability": "9.0", "memory_bytes": 150_000_000_000}
    script = (
        f"import {{gpuLine, targetKind}} from {json.dumps(module)};"
        f"console.log(JSON.stringify([gpuLine({json.dumps(gpu)}), gpuLine(null), targetKind({{target_kind: 'gpu'}}),"
        "targetKind({target: 'cuda -arch=sm_80'}), targetKind({target: 'llvm -mcpu=znver4'})]));"
    )
    out = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["NVIDIA H200 · 132 SMs · CC 9.0 · 140 GiB", "—", "GPU", "GPU", "CPU"]
    workers_page = (REPO / "server/dashboard/static/js/pages/workers.js").read_text()
    assert 'key: "gpu", label: "GPU"' in workers_page and "gpuLine(w.gpu)" in workers_page
