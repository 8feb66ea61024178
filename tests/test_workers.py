"""The measurement farm with real worker processes (`python -m workers.worker`) on the embedded broker and a SQLite
database: a tuning job end to end, a compile, a cancel, and workers killed while they hold a measurement batch or
drive a search. Jobs and artifacts are made with the ORM, as the API would, and sent with workers.dispatch."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from sqlalchemy import func, select

from compiler.costs.records import target_name
from compiler.search.task_scheduler import RETIME_ROUNDS
from compiler.targets import host_target
from server.db import session_scope
from server.models import ArtifactRow, Job, JobPoint, MeasureBatch, ModelTask, Record, Team, UploadedModel, WorkerRow
from server.settings import Settings
from workers.celery_app import measure_queue
from workers.dispatch import enqueue_compile, enqueue_job

REPO = Path(__file__).resolve().parents[1]
INPUT_SHAPES = {"input": [1, 3, 32, 32]}


class Farm:
    """Worker subprocesses (each in its own process group) sharing one storage folder and database."""

    def __init__(self, root: Path):
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TILEFARM_")}
        self.env.update(
            TILEFARM_STORAGE_DIR=str(root / "storage"),
            TILEFARM_DATABASE_URL=f"sqlite:///{root / 'farm.db'}",
            TILEFARM_HEARTBEAT_S="0.5",
            TILEFARM_SEARCH_POPULATION="64",  # the farm's machinery is tested here, not the search's quality
            TILEFARM_WORKER_GRACE_S="3",
            XDG_CACHE_HOME=str(root / "cache"),
            PYTHONUNBUFFERED="1",
        )
        self.settings = Settings.from_env(self.env)
        self.procs: dict[str, subprocess.Popen] = {}
        self.fingerprint = host_target().fingerprint()
        self.queue = measure_queue(self.fingerprint)

    def start(self, name: str, role: str) -> str:
        node = f"{name}@test"
        log = (self.root / f"{name}.log").open("ab")
        self.procs[node] = subprocess.Popen(
            [sys.executable, "-m", "workers.worker", "--role", role, "--name", node, "--loglevel", "info"],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return node

    def wait_ready(self, *nodes: str, timeout: float = 60) -> None:
        def ready():
            with session_scope(self.settings, write=False) as s:
                rows = {w.name: w for w in s.scalars(select(WorkerRow).where(WorkerRow.name.in_(nodes)))}
            return all(n in rows and rows[n].pid == self.procs[n].pid and not rows[n].stopped for n in nodes)

        self.wait(ready, timeout, f"workers {nodes} registered")

    def kill(self, node: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(node)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(30)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.terminate()  # a warm shutdown: the node marks itself stopped
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            try:  # whatever is left of the group (build pool, a stuck worker) goes too
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(30)
        self.procs.clear()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.root.glob("*.log"))

    def wait(self, predicate, timeout: float, what: str):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            value = predicate()
            if value:
                return value
            for node, proc in self.procs.items():
                assert proc.poll() is None, f"worker {node} exited ({proc.returncode}) while waiting for {what}\n"
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.logs()}")

    # ------------------------------------------------------------------------------------------ rows

    def job(self, job_id: int) -> Job:
        with session_scope(self.settings, write=False) as s:
            job = s.get(Job, job_id)
            assert job is not None
            return job

    def add_model(self, name: str, data: bytes, input_shapes: dict | None = None) -> int:
        """A model of the team in the storage folder, with no task rows yet (the job's search writes them)."""
        sha = hashlib.sha256(data).hexdigest()
        stored = self.settings.storage / "models" / f"{sha}.onnx"
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.write_bytes(data)
        with session_scope(self.settings) as s:
            m = UploadedModel(
                team_id=self.team_id, sha256=sha, name=name, size_bytes=len(data), path=str(stored),
                input_shapes=input_shapes,
            )  # fmt: skip
            s.add(m)
            s.flush()
            return m.id

    def new_job(self, trials: int, per_round: int = 8, model_id: int | None = None) -> int:
        with session_scope(self.settings) as s:
            job = Job(
                team_id=self.team_id,
                model_id=model_id or self.model_id,
                state="queued",
                target=target_name(host_target()),
                host=self.fingerprint,
                queue=self.queue,
                trials=trials,
                per_round=per_round,
                attempt=1,
            )
            s.add(job)
            s.flush()
            job_id = job.id
        enqueue_job(self.settings, job_id, 1)
        return job_id

    def wait_state(self, job_id: int, state: str, timeout: float = 120) -> Job:
        def reached():
            job = self.job(job_id)
            assert job.state not in {"succeeded", "failed", "cancelled"} - {state}, (job.state, job.error_message)
            return job if job.state == state else None

        return self.wait(reached, timeout, f"job {job_id} {state}")


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    from tilefarm import examples

    root = tmp_path_factory.mktemp("farm")
    f = Farm(root)
    model = root / "tiny_cnn.onnx"
    examples.save("tiny_cnn", model)
    with session_scope(f.settings) as s:
        team = Team(name="test")
        s.add(team)
        s.flush()
        f.team_id = team.id
    f.model_id = f.add_model("tiny_cnn.onnx", model.read_bytes(), INPUT_SHAPES)
    try:
        f.start("search1", "search")
        f.start("measure1", "measure")
        f.start("measure2", "measure")
        f.wait_ready("search1@test", "measure1@test", "measure2@test")
        yield f
    finally:
        f.stop_all()


def _records_of(farm: Farm, job_id: int) -> int:
    """The job's records as its measuring workers commit them: with its id, who ran them, and the build time."""
    mine = (Record.job_id == job_id, Record.created_by == f"job/{job_id}", Record.build_seconds.is_not(None))
    with session_scope(farm.settings, write=False) as s:
        return s.scalar(select(func.count()).select_from(Record).where(*mine))


def _duplicates(farm: Farm) -> int:
    with session_scope(farm.settings, write=False) as s:
        q = select(Record.workload_id, Record.host_id, Record.steps).group_by(
            Record.workload_id, Record.host_id, Record.steps
        )
        return len(s.execute(q.having(func.count() > 1)).all())


def test_job_runs_to_the_end(farm):
    job_id = farm.new_job(trials=24, per_round=8)
    job = farm.wait_state(job_id, "succeeded", timeout=150)
    assert job.trials_done == 24
    assert job.finished_at is not None and job.started_at is not None and job.error_message == ""
    assert job.worker == "search1@test" and job.tuning_s > 0
    assert job.estimated_latency is None or job.estimated_latency > 0
    tasks = job.tasks
    assert [t["position"] for t in tasks] == list(range(len(tasks)))
    assert sum(t["trials"] for t in tasks) >= 24
    assert {"name", "flops", "weight", "gflops", "latency_s", "weighted_latency_s", "done"} <= set(tasks[0])
    with session_scope(farm.settings, write=False) as s:
        points = s.scalars(select(JobPoint).where(JobPoint.job_id == job_id).order_by(JobPoint.id)).all()
        model_tasks = s.scalars(select(ModelTask).where(ModelTask.model_id == farm.model_id)).all()
        batches = s.scalars(select(MeasureBatch).where(MeasureBatch.job_id == job_id)).all()
        workers = {w.name: w for w in s.scalars(select(WorkerRow))}
    assert len(points) >= 3 and points[-1].trials == 24
    assert [p.trials for p in points] == sorted(p.trials for p in points)
    assert all(p.task is not None and len(p.task_best) == len(tasks) for p in points)
    assert len(model_tasks) == len(tasks)
    assert batches and all(b.state == "done" and b.worker in ("measure1@test", "measure2@test") for b in batches)
    assert _records_of(farm, job_id) == 24  # every measurement recorded by the worker that measured it
    # besides the 24 trials, batches of programs measured again: a new best confirmed (TuneOptions.confirm_best),
    # and each task's fastest three timed side by side when the budget is spent (retime_best). They made no record:
    # the measuring worker committed each record once, and the search worker added the later timings to it
    # (Database.remeasured)
    with session_scope(farm.settings, write=False) as s:
        timings = [len(c) for c in s.scalars(select(Record.costs).where(Record.job_id == job_id))]
    again = sum(b.size for b in batches) - 24
    assert 1 <= sum(n - 1 for n in timings if n > 1) <= again and max(timings) >= 1 + RETIME_ROUNDS
    assert _duplicates(farm) == 0
    measurers = [workers[n] for n in ("measure1@test", "measure2@test")]
    assert sum(w.measurements_done for w in measurers) >= 24
    assert all(w.current_batch is None and w.kind == "cpu" and w.fingerprint == farm.fingerprint for w in measurers)
    assert workers["search1@test"].kind == "search" and workers["search1@test"].queues == ["search"]
    assert workers["measure1@test"].queues == [farm.queue]
    assert workers["measure1@test"].target == dataclasses.asdict(host_target())


def test_a_job_tunes_each_convs_other_form_and_counts_the_one_compile_takes(farm):
    """As `tilefarm tune`: the tasks of convs' other forms are tuned beside the model's (stored at weight 0), and the
    job's table and estimate count each such conv once, at the form compile would take (the faster, unless a tie)."""
    from compiler.model.onnx_import import load
    from compiler.tensor.tasks import chosen_form, tuning_plan
    from tests.test_conv_forms import two_stage_model

    model = two_stage_model()
    plan = tuning_plan(load(model))
    job_id = farm.new_job(trials=24, per_round=4, model_id=farm.add_model("two_stage.onnx", model.SerializeToString()))
    # on Zen 5 25 s alone, ~100 s in the suite: a prior from the earlier jobs' records makes every round search, and
    # other tests share the 2 cores
    job = farm.wait_state(job_id, "succeeded", timeout=300)
    rows = job.tasks
    assert [r["name"] for r in rows] == [t.name for t in plan.all_tasks] and len(plan.other_forms) == 2
    assert all(r["trials"] > 0 for r in rows)  # the warm-up measures every task: 6 rounds of 4
    # a task whose every program timed out on a loaded host has no latency (inf to the scheduler)
    best = [r["latency_s"] if r["latency_s"] is not None else math.inf for r in rows]
    position = {t.key: i for i, t in enumerate(plan.all_tasks)}
    calls = [t.weight for t in plan.all_tasks]
    for c in plan.choices:
        forms = [position[t.key] for t in c.tasks]
        calls[forms[0]] -= 1
        calls[forms[chosen_form([best[j] for j in forms])]] += 1
    assert [r["weight"] for r in rows] == calls  # the calls of each task with the forms compile would take
    estimate = sum(n * b for n, b in zip(calls, best) if n)
    assert job.estimated_latency == (pytest.approx(estimate, rel=1e-9) if math.isfinite(estimate) else None)
    with session_scope(farm.settings, write=False) as s:
        q = select(ModelTask.weight).where(ModelTask.model_id == job.model_id).order_by(ModelTask.position)
        assert list(s.scalars(q)) == [t.weight for t in plan.all_tasks]


def queue_compile(farm, model_id: int) -> int:
    """A queued artifact of the model for this host, its compile sent to the farm; returns its id."""
    with session_scope(farm.settings) as s:
        a = ArtifactRow(
            team_id=farm.team_id, model_id=model_id, state="queued", target=target_name(host_target()),
            host=farm.fingerprint,
        )  # fmt: skip
        s.add(a)
        s.flush()
        artifact_id = a.id
    enqueue_compile(farm.settings, artifact_id, farm.queue)
    return artifact_id


def test_compile_artifact(farm):
    import onnxruntime as ort

    from compiler.artifact.runtime import Artifact

    # xdist may give this test a worker (and so a farm) where the tiny CNN was never tuned, only other models: tune
    # it briefly then, so the compile always has records of the model's own tasks to take
    with session_scope(farm.settings, write=False) as s:
        mine = (Job.model_id == farm.model_id, Job.state == "succeeded")
        tuned = s.scalar(select(func.count()).select_from(Job).where(*mine))
    if not tuned:
        farm.wait_state(farm.new_job(trials=8, per_round=8), "succeeded", timeout=150)
    artifact_id = queue_compile(farm, farm.model_id)

    def done():
        with session_scope(farm.settings, write=False) as s:
            row = s.get(ArtifactRow, artifact_id)
            assert row is not None and row.state != "failed", row.error_message if row else None
            return row if row.state == "ready" else None

    row = farm.wait(done, 90, f"artifact {artifact_id} ready")
    path = Path(row.path)
    assert path == farm.settings.storage / "artifacts" / f"{artifact_id}.tar"
    data = path.read_bytes()
    assert row.sha256 == hashlib.sha256(data).hexdigest() and row.size_bytes == len(data)
    assert isinstance(row.records_used, list) and row.finished_at is not None
    assert row.records_used  # the tuned tasks take their best record
    x = np.random.default_rng(0).standard_normal(INPUT_SHAPES["input"]).astype(np.float32)
    got = Artifact.load(path).run({"input": x})["output"]
    with session_scope(farm.settings, write=False) as s:
        model_path = s.get(UploadedModel, farm.model_id).path
    want = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_cancel_stops_a_running_job(farm):
    job_id = farm.new_job(trials=10_000, per_round=8)
    farm.wait(lambda: farm.job(job_id).trials_done > 0, 90, f"job {job_id} measured a round")
    with session_scope(farm.settings) as s:
        s.get(Job, job_id).cancel_requested = True
    job = farm.wait_state(job_id, "cancelled", timeout=60)
    assert 0 < job.trials_done < 10_000 and job.finished_at is not None

    def settled():  # the batch in flight at the cancel is still measured and recorded: wait for it
        with session_scope(farm.settings, write=False) as s:
            q = select(MeasureBatch).where(MeasureBatch.job_id == job_id, MeasureBatch.state.in_(("sent", "running")))
            return s.scalars(q).first() is None

    farm.wait(settled, 60, f"job {job_id}'s last batch measured")
    # a batch that a worker had started when the cancel came was waited for and counted, one not started was given
    # up: every record the job's workers stored is one of its trials
    assert _records_of(farm, job_id) == farm.job(job_id).trials_done


def test_killed_measure_worker_loses_no_batch(farm):
    job_id = farm.new_job(trials=24, per_round=8)

    def running_batch():
        with session_scope(farm.settings, write=False) as s:
            q = select(MeasureBatch).where(MeasureBatch.job_id == job_id, MeasureBatch.state == "running")
            return s.scalars(q).first()

    batch = farm.wait(running_batch, 90, f"a batch of job {job_id} running")
    victim = batch.worker
    farm.kill(victim)
    job = farm.wait_state(job_id, "succeeded", timeout=150)
    with session_scope(farm.settings, write=False) as s:
        lost = s.get(MeasureBatch, batch.id)
        batches = s.scalars(select(MeasureBatch).where(MeasureBatch.job_id == job_id)).all()
    assert lost.state == "lost"
    resent = [b for b in batches if b.try_number == 2 and b.task == lost.task]
    assert resent and resent[0].state == "done" and resent[0].worker != victim
    assert job.trials_done == 24 and job.attempt == 1
    assert _duplicates(farm) == 0
    farm.start(victim.split("@")[0], "measure")  # back under its name, for the tests after this one
    farm.wait_ready(victim)


def test_killed_search_worker_job_is_resumed(farm):
    other = farm.start("search2", "search")
    farm.wait_ready(other)
    job_id = farm.new_job(trials=24, per_round=8)
    job = farm.wait(lambda: (j := farm.job(job_id)).trials_done > 0 and j, 90, f"job {job_id} measured a round")
    victim, done_before = job.worker, job.trials_done
    farm.kill(victim)
    job = farm.wait_state(job_id, "succeeded", timeout=150)
    assert job.attempt == 2 and job.worker not in (None, victim)
    assert job.trials_done == 24 and done_before < 24
    assert _duplicates(farm) == 0


def chain_model(layers: int):
    """y = relu(...relu(x @ w1)... @ wn), each layer a width of its own: a model with many distinct kernels, whose
    compile takes seconds (about 4 s for 120 layers, alone on a 2-core VM) and leaves time to kill its worker."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(layers)
    nodes, weights, prev, width = [], [], "x", 64
    for i in range(layers):
        out = 65 + i
        weights.append(numpy_helper.from_array((rng.standard_normal((width, out)) * 0.1).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"]))
        prev, width = f"r{i}", out
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])
    y = helper.make_tensor_value_info(prev, TensorProto.FLOAT, [4, width])
    graph = helper.make_graph(nodes, "chain", [x], [y], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_artifact_whose_worker_dies_mid_build_is_built_again(farm):
    """kill -9 of the measure worker building an artifact: another worker's heartbeat sees it silent, queues the
    build again (saying why in the artifact's message while it builds), and the other measure worker builds it whole;
    the killed build's temporary file is gone."""
    model_id = farm.add_model("chain.onnx", chain_model(120).SerializeToString())
    artifact_id = queue_compile(farm, model_id)

    def row() -> ArtifactRow:
        with session_scope(farm.settings, write=False) as s:
            return s.get_one(ArtifactRow, artifact_id)

    victim = farm.wait(lambda: (r := row()).state == "building" and r.worker, 60, f"artifact {artifact_id} building")
    farm.kill(victim)
    assert row().state == "building"  # killed mid-build (the build takes seconds)
    rebuilt = farm.wait(lambda: (r := row()).state == "building" and r.worker != victim and r, 60, "a rebuild")
    why = f"queued again (1 of 3) after its build was lost: its worker {victim} stopped answering"
    assert rebuilt.error_message == why
    done = farm.wait(lambda: (r := row()).state in ("ready", "failed") and r, 120, f"artifact {artifact_id} built")
    assert done.state == "ready" and done.error_message == "" and done.worker == rebuilt.worker, done.error_message
    assert hashlib.sha256(Path(done.path).read_bytes()).hexdigest() == done.sha256
    assert not list((farm.settings.storage / "artifacts").glob(f".{artifact_id}.tar*.partial"))
    farm.start(victim.split("@")[0], "measure")  # back under its name, for the tests after this one
    farm.wait_ready(victim)


def test_a_broken_model_fails_its_job_with_one_line(farm):
    with session_scope(farm.settings) as s:
        m = UploadedModel(
            team_id=farm.team_id, sha256="0" * 64, name="broken.onnx", size_bytes=9,
            path=str(farm.settings.storage / "models" / "broken.onnx"),
        )  # fmt: skip
        s.add(m)
        s.flush()
        model_id = m.id
    Path(m.path).write_bytes(b"not onnx!")
    job_id = farm.new_job(trials=8, model_id=model_id)
    job = farm.wait_state(job_id, "failed", timeout=60)
    assert job.error_message and "\n" not in job.error_message and "Traceback" not in job.error_message
    assert job.finished_at is not None


def test_a_job_whose_weights_arrive_cold_has_them_flushed_on_the_measuring_worker(tmp_path, monkeypatch):
    """The search side's FarmRunner with cold_constants sends the task's constant inputs with the batch; the measuring
    worker's runner flushes them before each timed call, and its records and results say they were timed so. (The
    batch goes from FarmRunner to the worker's `_measure` in this process: an app that runs what it is sent.)"""
    from compiler.costs.measure import MeasureInput
    from compiler.costs.records import COLD_WEIGHTS
    from compiler.targets.cpu.default_schedule import default_schedule
    from compiler.tensor import ops, te
    from compiler.tensor.dag import ComputeDAG
    from compiler.tensor.tasks import Task
    from server.database import SQLDatabase
    from workers import tasks as worker
    from workers.farm import FarmRunner, RunnerOptions

    url = f"sqlite:///{tmp_path / 'farm.db'}"
    SQLDatabase(url, upgrade_schema=True).close()
    settings = Settings.from_env({"TILEFARM_DATABASE_URL": url, "TILEFARM_STORAGE_DIR": str(tmp_path / "storage")})
    monkeypatch.setattr(worker, "settings", settings)
    a, w = te.placeholder((32, 32), name="A"), te.placeholder((32, 32), name="W")
    dag = ComputeDAG([a, w, ops.matmul(a, w, name="C")])
    task = Task(dag.workload_key, dag, "matmul32", constants=(1,))  # W is the model's weight

    class RunsWhatItIsSent:
        sent: list[dict] = []

        def send_task(self, name, args, queue, task_id):
            self.sent.append(args[0])
            results = worker._measure(args[0])
            self.result = SimpleNamespace(state="SUCCESS", result={"results": results}, forget=lambda: None)

        def AsyncResult(self, task_id):  # noqa: N802 - Celery's name
            return self.result

    app = RunsWhatItIsSent()
    options = RunnerOptions(cold_constants=True, timeout=5.0)
    runner = FarmRunner(settings, app, job_id=None, queue="q", host=host_target().fingerprint(), options=options)
    [result] = runner.run([MeasureInput(task, default_schedule(dag).steps)], [])
    assert result.ok and result.cache == runner.cache == COLD_WEIGHTS, result.message
    assert app.sent[0]["constants"] == [1] and app.sent[0]["options"]["cold_constants"]
    assert "cold_constants" not in RunnerOptions().wire()  # a warm batch reads on workers that predate the option
    measuring = worker._runner(options)
    assert measuring.cold_constants and measuring._task_fields(task)["evict"] == [1]
    with SQLDatabase(url) as db:
        assert [r.cache for r in db] == [COLD_WEIGHTS]
