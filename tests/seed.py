"""A big finished tuning job written straight into the service database, for tests that need the dashboard's data at
size (paging, load time) without tuning for hours: `seed_big_job(settings, team_id)`.

What it writes looks like a real run: a model of GEMM tasks whose workloads carry real DAGs (so coverage, schedules
and compiles can rebuild them), rounds of `PER_ROUND` measurements of one task each, committed by two measuring
workers in turn, with latencies that improve as each task gets trials, errors of every kind at fixed shares
(ERROR_CYCLE), one convergence point and one measurement batch per round (a few batches lost and sent again). Every
record's steps replay on its workload's DAG. Bulk inserts: 20,000 records take a few seconds."""

from __future__ import annotations

import hashlib
import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import insert, select

from compiler.base.target import Target
from compiler.costs.records import VERSION, target_name
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.tasks import Task
from server.catalog import records_db
from server.database import steps_hash, steps_json
from server.db import session_scope
from server.models import Host, Job, JobPoint, MeasureBatch, ModelTask, Record, TargetRow, UploadedModel, Workload
from server.settings import Settings
from workers.celery_app import measure_queue

PER_ROUND = 64
WORKERS = ("measure@seed-a", "measure@seed-b")
ROUND_S = 2.0  # wall time of one round
LOST_EVERY = 50  # every this many rounds, the first try of its batch is lost and sent again
# the error code of record i is ERROR_CYCLE[i % len(ERROR_CYCLE)]: 10% of the records fail, every code represented
ERROR_CYCLE: tuple[str | None, ...] = (
    "build", "build", "build", "instantiation", "run", "run", "unknown", "run_timeout", "build_timeout",
    "wrong_answer", *([None] * 90),
)  # fmt: skip
ERROR_MESSAGES = {
    "build": "LLVM refused the module: vector width mismatch",
    "instantiation": "step 3 Split(...): refers to a stage or iterator that does not exist",
    "run": "the kernel crashed the sandbox (signal 11)",
    "unknown": "measurement batch lost 3 times (last: its worker stopped answering)",
    "run_timeout": "no answer within 10 s",
    "build_timeout": "the build took longer than 15 s",
    "wrong_answer": "outputs differ from the default schedule's (max abs error 0.5)",
}
SEED_HOST = Target(
    kind="cpu", mcpu="znver4", features="+avx2,+avx512f,+fma", cores=2, cpu_model="Seeded CPU", l1_bytes=32768
)


def seed_tasks(n: int) -> list[Task]:
    """`n` GEMM tasks of distinct shapes (each a real DAG), weights 1 to 3."""
    tasks = []
    for i in range(n):
        m, k, cols = 64, 64 + 8 * i, 48 + 16 * (i % 4)
        A, B = te.placeholder((m, k), name="A"), te.placeholder((k, cols), name="B")
        dag = ComputeDAG([A, B, ops.matmul(A, B, name="C")])
        tasks.append(Task(dag.workload_key, dag, f"matmul_{m}x{cols}x{k}", weight=1 + i % 3))
    return tasks


def _steps(n: int, job_id: int) -> list:
    """The n-th distinct schedule of a task: two splits of C's spatial loops and an unroll pragma naming the job
    (so two seeded jobs in one database never measure the same schedule)."""
    a, b = divmod(n, 40)
    return [["SP", 2, 0, [a + 1], True], ["SP", 2, 2, [b + 1], True], ["PR", 2, 0, "auto_unroll_max_step", job_id]]


def _host_id(session, host: Target) -> int:
    fingerprint = host.fingerprint()
    found = session.scalar(select(Host.id).where(Host.fingerprint == fingerprint))
    if found is not None:
        return found
    row = Host(
        fingerprint=fingerprint, kind=host.kind, cpu_model=host.cpu_model, mcpu=host.mcpu, isa_features=host.features,
        cores=host.cores, l1_bytes=host.l1_bytes, l2_bytes=host.l2_bytes, l3_bytes=host.l3_bytes,
        tilefarm_version=VERSION,
    )  # fmt: skip
    session.add(row)
    session.flush()
    return row.id


def _target_id(session, name: str) -> int:
    found = session.scalar(select(TargetRow.id).where(TargetRow.name == name))
    if found is not None:
        return found
    row = TargetRow(name=name)
    session.add(row)
    session.flush()
    return row.id


def seed_big_job(
    settings: Settings, team_id: int, records: int = 20_000, tasks: int = 19, host: Target = SEED_HOST, seed: int = 0
) -> int:
    """Write a succeeded job of the team with `records` records over `tasks` tasks (see the module docstring);
    returns its id."""
    model_tasks = seed_tasks(tasks)
    records_db(settings.database_url).describe_workloads(model_tasks)
    rounds = math.ceil(records / PER_ROUND)
    end = datetime.now(UTC)
    start = end - timedelta(seconds=rounds * ROUND_S)
    with session_scope(settings) as s:
        model = UploadedModel(
            team_id=team_id,
            sha256=hashlib.sha256(uuid.uuid4().bytes).hexdigest(),
            name=f"seeded_{tasks}_gemms",
            size_bytes=0,
            path=str(settings.storage / "models" / "seeded-model-without-a-file.onnx"),
        )
        s.add(model)
        s.flush()
        keys = [t.key for t in model_tasks]
        workload_ids = dict(s.execute(select(Workload.key, Workload.id).where(Workload.key.in_(keys))).all())
        s.add_all(
            ModelTask(model_id=model.id, position=i, workload_id=workload_ids[t.key], name=t.name, weight=t.weight)
            for i, t in enumerate(model_tasks)
        )
        job = Job(
            team_id=team_id,
            model_id=model.id,
            state="succeeded",
            target=target_name(host),
            host=host.fingerprint(),
            queue=measure_queue(host.fingerprint(), host.kind),
            trials=records,
            trials_done=records,
            tuning_s=rounds * ROUND_S,
            per_round=PER_ROUND,
            seed=seed,
            attempt=1,
            worker="search@seed",
            created_at=start,
            started_at=start,
            finished_at=end,
            updated_at=end,
        )
        s.add(job)
        s.flush()
        run = _Run(
            job.id,
            job.queue,
            model_tasks,
            [workload_ids[k] for k in keys],
            host_id=_host_id(s, host),
            target_id=_target_id(s, target_name(host)),
            rng=np.random.default_rng(seed),
        )
        for r in range(rounds):
            run.round(r, start + timedelta(seconds=r * ROUND_S), min(PER_ROUND, records - r * PER_ROUND))
        for i in range(0, len(run.records), 5000):
            s.execute(insert(Record), run.records[i : i + 5000])
        s.execute(insert(JobPoint), run.points)
        s.execute(insert(MeasureBatch), run.batches)
        job.estimated_latency = run.points[-1]["estimated_latency"] if run.points else None
        job.tasks = run.task_table()
        return job.id


class _Run:
    """The rows a seeded job's rounds produce: records, convergence points and measurement batches."""

    def __init__(
        self,
        job_id: int,
        queue: str,
        tasks: list[Task],
        workload_ids: list[int],
        *,
        host_id: int,
        target_id: int,
        rng: np.random.Generator,
    ):
        self.job_id, self.queue, self.tasks, self.workload_ids = job_id, queue, tasks, workload_ids
        self.host_id, self.target_id, self.rng = host_id, target_id, rng
        self.floor = [2 * t.flop_count / 80e9 for t in tasks]  # a task's best latency: 80 GFLOP/s
        self.best: list[float | None] = [None] * len(tasks)
        self.trials = [0] * len(tasks)
        self.records: list[dict[str, Any]] = []
        self.points: list[dict[str, Any]] = []
        self.batches: list[dict[str, Any]] = []

    def round(self, r: int, sent: datetime, size: int) -> None:
        """Round r measures `size` candidates of task r % tasks on one worker, the workers taking turns."""
        task = r % len(self.tasks)
        if r % LOST_EVERY == LOST_EVERY - 1:  # the other worker took it first and went silent
            silent = WORKERS[(r + 1) % 2]
            self.batches.append(
                self._batch(f"{r}-lost", task, size, silent, "lost", 1, {"lost": f"its worker {silent} stopped"}, sent)
            )
            sent += timedelta(seconds=ROUND_S / 4)
        errors: dict[str, int] = {}
        for j in range(size):
            error = ERROR_CYCLE[len(self.records) % len(ERROR_CYCLE)]
            if error is not None:
                errors[error] = errors.get(error, 0) + 1
            at = sent + timedelta(seconds=(ROUND_S / 2) * (j + 1) / size)
            self.records.append(self._record(task, self.trials[task] + j, error, at))
        self.trials[task] += size
        try_number = 2 if r % LOST_EVERY == LOST_EVERY - 1 else 1
        self.batches.append(self._batch(str(r), task, size, WORKERS[r % 2], "done", try_number, errors, sent))
        known = [t.weight * b for t, b in zip(self.tasks, self.best) if b is not None]
        self.points.append(
            {
                "job_id": self.job_id,
                "trials": sum(self.trials),
                "elapsed_s": (r + 1) * ROUND_S,
                "estimated_latency": sum(known) if len(known) == len(self.tasks) else None,
                "task": task,
                "task_best": list(self.best),
                "errors": errors,
            }
        )

    def _record(self, task: int, n: int, error: str | None, at: datetime) -> dict[str, Any]:
        """The n-th measurement of a task: slow at first, approaching its floor with noise."""
        cost = None
        if error is None:
            cost = self.floor[task] * (1 + 4 * math.exp(-n / 300)) * float(self.rng.lognormal(0, 0.15))
            self.best[task] = min(cost, self.best[task] or cost)
        steps = steps_json(_steps(n, self.job_id))
        return {
            "workload_id": self.workload_ids[task],
            "target_id": self.target_id,
            "host_id": self.host_id,
            "steps": steps,
            "steps_hash": steps_hash(steps),
            "costs": [cost * 0.98, cost * 1.02] if cost is not None else [],
            "mean_cost": cost,
            "error": error,
            "error_message": ERROR_MESSAGES.get(error or "", ""),
            "build_seconds": float(self.rng.uniform(0.1, 0.6)),
            "run_seconds": float(self.rng.uniform(0.01, 0.2)) if error not in ("build", "instantiation") else None,
            "timestamp": at.timestamp(),
            "created_by": f"job/{self.job_id}",
            "version": VERSION,
            "trace": None,
            "job_id": self.job_id,
        }

    def _batch(self, name, task, size, worker, state, try_number, errors, sent: datetime) -> dict[str, Any]:
        return {
            "id": f"seed-{self.job_id}-{name}",
            "job_id": self.job_id,
            "task": task,
            "size": size,
            "queue": self.queue,
            "worker": worker,
            "state": state,
            "try_number": try_number,
            "errors": errors,
            "sent_at": sent,
            "started_at": sent + timedelta(seconds=0.05),
            "finished_at": sent + timedelta(seconds=ROUND_S * (0.2 if state == "lost" else 0.6)),
        }

    def task_table(self) -> list[dict[str, Any]]:
        """The job's per-task table, as the search writes it after its last round."""
        return [
            {
                "position": i,
                "name": t.name,
                "flops": t.flop_count,
                "weight": t.weight,
                "gflops": t.flop_count / b / 1e9 if b else None,
                "latency_s": b,
                "weighted_latency_s": b * t.weight if b is not None else None,
                "trials": self.trials[i],
                "done": False,
            }
            for i, (t, b) in enumerate(zip(self.tasks, self.best))
        ]
