"""The farm's Celery tasks: drive a tuning job (search), measure a batch of candidates, compile an artifact.

`celery -A workers.tasks worker` (or `tilefarm worker`) runs them. A worker process measures one batch at a time
(MEASURE_LOCK): two measurements, or a compile beside a measurement, would share the cores and spoil the timings.

When the worker stops (workers.worker), each task hands its work back rather than hold it up: a search queues its
job again as a new attempt, a measurement stops after its current candidate, stores what it measured and puts its
batch back on the queue (Reject with requeue: the same message, for any worker), and a compile or a re-measuring of
imports not started yet goes back too. A compile already building is finished."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import re
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from celery.exceptions import Reject
from celery.signals import celeryd_after_setup, worker_shutdown

from compiler.base.errors import TilefarmError
from compiler.base.target import Target
from compiler.costs.measure import (
    INSTANTIATION,
    UNKNOWN,
    Builder,
    MeasureInput,
    MeasureResult,
    Runner,
    measure,
    to_record,
)
from compiler.costs.records import COLD_WEIGHTS, FLUSHED, VERSION, TuningRecord
from compiler.schedule.state import step_from_record
from compiler.targets import host_target
from compiler.targets.cpu.runner import LocalBuilder, LocalRunner
from compiler.targets.cuda.measure import CudaBuilder, CudaRunner
from compiler.tensor import dag_json
from compiler.tensor.tasks import Task
from server import storage
from server.catalog import model_budget, records_db
from server.database import SQLDatabase
from server.models import ArtifactRow, Job
from server.settings import Settings
from server.trust import team_of
from workers import heartbeat, measuring, progress, spool
from workers.celery_app import COMPILE_ARTIFACT, MEASURE_BATCH, SEARCH_JOB, VERIFY_RECORDS, make_celery
from workers.dispatch import enqueue_job, enqueue_verify
from workers.farm import FarmBuilder, FarmRunner, JobInterrupted, RunnerOptions
from workers.outage import DATABASE_DOWN, DOWN, PatientDatabase, first_line, patiently

log = logging.getLogger("tilefarm.workers")

settings = Settings.from_env()
app = make_celery(settings)
heartbeat.install(app, settings)

MEASURE_LOCK = threading.Lock()
WAIT_FOR_WORKER_S = 1.0  # how often a job without a live measuring worker looks again

# per process, made on first use and kept: the builder's process pool and the runner's sandbox and references (a GPU
# worker's: CudaBuilder's pool, CudaRunner's references)
_builders: dict[tuple, Builder] = {}
_runners: dict[tuple, Runner] = {}


def one_line(e: BaseException) -> str:
    """What a user reads about a failure: the error's first line, never a traceback."""
    lines = str(e).strip().splitlines()
    text = lines[0] if lines else ""
    return (text if isinstance(e, TilefarmError) and text else f"{type(e).__name__}: {text}".rstrip(": "))[:1000]


def _stopping() -> bool:
    return heartbeat.SHUTTING_DOWN.is_set()


def _patiently(what: str, call):
    """A service-database or broker call of a task, waiting out an outage (workers.outage) unless the worker stops."""
    return patiently(settings, what, call, stop=_stopping)


class _QuietHandBack(logging.Filter):
    """Celery logs a rejected task at WARNING with a traceback; a hand back is said in the worker's last line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], Reject))


logging.getLogger("celery.app.trace").addFilter(_QuietHandBack())


def _hand_back(what: str, note: str) -> NoReturn:
    """The worker stops: this task's message goes back on its queue (the same message, for any worker), and the
    worker's last line says `note`."""
    heartbeat.HANDED_BACK.append(note)
    log.info("%s: %s", what, note)
    raise Reject(note, requeue=True)


# ---------------------------------------------------------------------------------------------- measure


@app.task(name=MEASURE_BATCH, bind=True)
def measure_batch(self, payload: dict[str, Any]) -> dict[str, Any]:
    """Build and run a batch on this worker's host, commit every result as a record, return the results."""
    batch_id, node = self.request.id, self.request.hostname
    if not _patiently("taking a batch", lambda: progress.batch_taken(settings, batch_id, node)):
        return {"skipped": True}
    with MEASURE_LOCK:
        if _stopping():  # it waited for another measurement, and the worker stops meanwhile
            _hand_back_batch(batch_id, node, Stopped(0, len(payload["candidates"])))
        if not _patiently("starting a batch", lambda: progress.batch_running(settings, batch_id, node)):
            _patiently("going idle", lambda: progress.worker_idle(settings, node))
            return {"skipped": True}
        try:
            results = _measure(payload, batch_id)
        except Stopped as e:
            _hand_back_batch(batch_id, node, e)
        except BaseException:
            try:
                progress.worker_idle(settings, node)
            except DOWN as e:
                log.warning("batch %s: could not mark %s idle: %s", batch_id, node, first_line(e))
            raise
        errors: dict[str, int] = {}
        for r in results:
            if r["error"]:
                errors[r["error"]] = errors.get(r["error"], 0) + 1
        done = (batch_id, node, len(results), errors)
        _patiently("finishing a batch", lambda: progress.batch_finished(settings, *done))
    return {"results": results}


class Stopped(Exception):
    """The worker stopped in the middle of a batch: `measured` of its `size` candidates were measured and stored."""

    def __init__(self, measured: int, size: int):
        super().__init__(f"{measured} of {size} measured")
        self.measured, self.size = measured, size


def _hand_back_batch(batch_id: str, node: str, e: Stopped) -> NoReturn:
    """The batch goes back on its queue, its row as if just sent: whichever worker takes it measures it whole (the
    records stored so far are not stored twice), and its search waits for that, as for any batch."""
    try:
        progress.batch_handed_back(settings, batch_id, node)
    except DOWN as err:  # the row says its worker, which is marked stopped: its runner sends the batch again
        log.warning("batch %s: could not hand it back: %s", batch_id, first_line(err))
    note = f"batch {batch_id[:8]} back on its queue, {e.measured} of {e.size} measured and stored"
    _hand_back(f"batch {batch_id}", note)


def _measure(payload: dict[str, Any], batch_id: str | None = None) -> list[dict[str, Any]]:
    """Build and run a batch's candidates and store them as records; the results. Raises Stopped once the worker
    stops, after storing the candidates measured by then."""
    host = measuring.current().target  # this CPU, or the GPU the worker measures on
    cands = payload["candidates"]
    options = RunnerOptions(**payload.get("options", {}))
    if payload.get("host") not in (None, host.fingerprint()):
        why = f"this worker measures host class {host.fingerprint()}, the batch is for {payload['host']}"
        return [_as_json(MeasureResult((), UNKNOWN, why, 0.0, 0.0, cache=options.cache)) for _ in cands]
    key = payload["workload_key"]
    task = Task(
        key, dag_json.from_json(payload["dag"], key), payload["name"], constants=tuple(payload.get("constants", ()))
    )
    out: list[MeasureResult | None] = [None] * len(cands)
    todo: list[tuple[int, MeasureInput]] = []
    for i, c in enumerate(cands):
        try:
            todo.append((i, MeasureInput(task, tuple(step_from_record(s) for s in c["steps"]), c.get("trace"))))
        except TilefarmError as e:  # steps this version cannot read (a search worker of another version sent them)
            out[i] = MeasureResult((), INSTANTIATION, str(e), 0.0, 0.0, cache=options.cache)
    measured = _measure_until_stopped([inp for _, inp in todo], _builder(options), _runner(options))
    records = []
    for (i, inp), r in zip(todo, measured):
        out[i] = r
        records.append(to_record(inp, r, host))
    job = payload.get("job_id")
    created_by = f"job/{job}" if job is not None else None
    seconds = [(r.build_seconds, r.run_seconds) for r in measured]
    try:
        if records:
            db = records_db(settings.database_url)
            db.import_records(records, created_by=created_by, job_id=job, seconds=seconds)
    except DATABASE_DOWN as e:  # measured is measured: kept until the database answers (workers.spool)
        name = batch_id or uuid.uuid4().hex
        path = spool.keep(settings, name, records, created_by=created_by, job_id=job, seconds=seconds)
        log.warning(
            "batch %s: the database does not answer (%s): its %d records are spooled to %s, to be stored when it "
            "answers again",
            batch_id,
            first_line(e),
            len(records),
            path,
        )
    if len(measured) < len(todo):
        raise Stopped(len(measured), len(cands))
    return [_as_json(r) for r in out if r is not None]


def _measure_until_stopped(inputs: list[MeasureInput], builder: Builder, runner: Runner) -> list[MeasureResult]:
    """compiler.costs.measure.measure, one candidate at a time once built, stopping between candidates when the
    worker stops: the results of the first candidates, every one unless it stopped."""
    if _stopping():
        return []
    builds = builder.build(inputs)
    try:
        out: list[MeasureResult] = []
        for inp, build in zip(inputs, builds):
            if _stopping():
                break
            out += runner.run([inp], [build])
        return out
    finally:
        for b in builds:
            if b.path:
                Path(b.path).unlink(missing_ok=True)


def _as_json(r: MeasureResult) -> dict[str, Any]:
    return {
        "costs": list(r.costs),
        "error": r.error,
        "message": r.message,
        "build_seconds": r.build_seconds,
        "run_seconds": r.run_seconds,
        "timestamp": r.timestamp,
        "cache": r.cache,
    }


def _builder(o: RunnerOptions) -> Builder:
    target = measuring.current().target
    key = (target, o.build_timeout)
    if key not in _builders:
        if target.kind == "cuda":  # PTX for the GPU's architecture, assembled by ptxas
            _builders[key] = CudaBuilder(timeout=o.build_timeout, target=target)
        else:
            _builders[key] = LocalBuilder(timeout=o.build_timeout)
    return _builders[key]


def _runner(o: RunnerOptions) -> Runner:
    target = measuring.current().target
    key = (target, o.timeout, o.number, o.repeat, o.min_repeat_ms, o.cache_flush, o.threads, o.cold_constants)
    if key not in _runners:
        if target.kind == "cuda":  # timed with CUDA events on the GPU, warm (the CPU's cache options do not apply)
            _runners[key] = CudaRunner(
                target=target, timeout=o.timeout, number=o.number, repeat=o.repeat, min_repeat_ms=o.min_repeat_ms
            )
        else:
            _runners[key] = LocalRunner(
                timeout=o.timeout,
                number=o.number,
                repeat=o.repeat,
                min_repeat_ms=o.min_repeat_ms,
                cache_flush=o.cache_flush,
                threads=o.threads,
                cold_constants=o.cold_constants,
            )
    return _runners[key]


def close_measurement(**_) -> None:
    """Stop the builder pools and runner sandboxes (worker shutdown). Not while a measurement the worker left behind
    (workers.worker, Ctrl-C) still runs: its processes end with this one (a sandbox when its pipe closes)."""
    if not MEASURE_LOCK.acquire(blocking=False):
        return
    try:
        pools: list[Any] = [*_builders.values(), *_runners.values()]
        for x in pools:
            x.close()
        _builders.clear()
        _runners.clear()
    finally:
        MEASURE_LOCK.release()


worker_shutdown.connect(close_measurement)


# ---------------------------------------------------------------------------------------------- compile


@app.task(name=COMPILE_ARTIFACT, bind=True, ignore_result=True)  # the artifact row is the result
def compile_artifact(self, artifact_id: int) -> str:
    """Compile a model into storage/artifacts/<id>.tar with the best records of this host; state ready or failed.
    The tar is built under a hidden temporary name and renamed once whole and on disk (storage.publish), so no
    half-written artifact is ever under its final name; on a failure (a full disk: StorageFull) it is deleted.
    Each try of a build lost with its worker (workers.progress.reap_lost_builds) writes a temporary file of its
    own, and a build judged lost meanwhile publishes nothing."""
    node = self.request.hostname
    job = _patiently("taking an artifact", lambda: progress.artifact_building(settings, artifact_id, node))
    if job is None:
        return "stale"
    folder = settings.storage / "artifacts"
    path, partial = folder / f"{artifact_id}.tar", folder / f".{artifact_id}.tar.partial"
    if job.try_number > 1:  # what the lost tries left (a killed worker's file) goes; a frozen one writes no more here
        for left in folder.glob(f".{artifact_id}.tar*.partial"):
            left.unlink(missing_ok=True)
        partial = folder / f".{artifact_id}.tar.{job.try_number}.partial"
    try:
        from compiler.artifact.build import build
        from compiler.model.onnx_import import load

        here = measuring.current().target
        host = here.fingerprint()
        if job.host != host:
            raise TilefarmError(f"the artifact is for host class {job.host}, but this worker is {host}")
        folder.mkdir(parents=True, exist_ok=True)
        graph = load(job.model_path, job.input_shapes, model_budget(settings))  # as the API loaded it
        with MEASURE_LOCK:  # compiling takes the cores a measurement would be timed on
            if _stopping():  # it waited for a measurement, and the worker stops meanwhile
                _patiently(
                    "handing an artifact back", lambda: progress.artifact_handed_back(settings, artifact_id, node)
                )
                _hand_back(f"artifact {artifact_id}", f"artifact {artifact_id} queued again, not begun")
            # the best records its team may use: verified ones, and the team's own imports (server.trust)
            records = records_db(settings.database_url).trusting(team_of(settings, ArtifactRow, artifact_id))
            info = build(graph, partial, name=_c_name(job.model_name), records=records, target=here)
        if not _patiently("checking an artifact", lambda: progress.artifact_builds(settings, artifact_id, node)):
            partial.unlink(missing_ok=True)  # judged lost while it built (a frozen worker): another try owns it
            return "stale"
        storage.publish(partial, path)  # never a half-written artifact under its final name
        data = path.read_bytes()
        sha256, used = hashlib.sha256(data).hexdigest(), list(info.records_used.values())
        _patiently(
            "storing an artifact",
            lambda: progress.artifact_ready(
                settings, artifact_id, node, path=str(path), sha256=sha256, size_bytes=len(data), records_used=used
            ),
        )
        return "ready"
    except Reject:
        raise
    except Exception as e:
        partial.unlink(missing_ok=True)
        if storage.is_full(e):
            e = storage.full(path)
            log.error("artifact %d failed: %s", artifact_id, e)
        else:
            log.exception("artifact %d failed", artifact_id)
        why = one_line(e)
        _patiently("failing an artifact", lambda: progress.artifact_failed(settings, artifact_id, node, why))
        return "failed"


def _c_name(model_name: str) -> str:
    """The artifact's library and header name: a C identifier made from the model's name."""
    name = re.sub(r"\W", "_", Path(model_name).stem.lower()).strip("_")[:64] or "model"  # a file name's length
    return f"m_{name}" if name[0].isdigit() else name


# ---------------------------------------------------------------------------------------------- search


@app.task(name=SEARCH_JOB, bind=True, ignore_result=True)  # the job row is the result
def search_job(self, job_id: int, attempt: int) -> str:
    """Run attempt `attempt` of a tuning job to its end (see the module docstring of workers.farm for measuring)."""
    node = self.request.hostname
    claim = _patiently(f"job {job_id}: claiming it", lambda: progress.claim_job(settings, job_id, attempt, node))
    if claim is None:
        return "stale"
    # an end that cannot be written (the database stays away past settings.outage_s, or the worker stops) leaves the
    # job running with a lease that runs out: a reaper queues it again (workers.progress.reap_lost_jobs)
    try:
        _search(claim)
    except JobInterrupted as e:
        if e.reason == "cancelled":
            _patiently(f"job {job_id}: ending it", lambda: progress.end_job(settings, job_id, attempt, "cancelled"))
        elif e.reason == "shutdown":
            new = progress.requeue_job(settings, job_id, attempt)
            if new is not None:
                enqueue_job(settings, job_id, new)
                heartbeat.HANDED_BACK.append(f"job {job_id} queued again as attempt {new}")
        return e.reason
    except Exception as e:
        log.exception("job %d failed", job_id)
        why = one_line(e)
        _patiently(f"job {job_id}: ending it", lambda: progress.end_job(settings, job_id, attempt, "failed", why))
        return "failed"
    _patiently(f"job {job_id}: ending it", lambda: progress.end_job(settings, job_id, attempt, "succeeded"))
    return "succeeded"


_renewed: dict[tuple[int, int], float] = {}  # (job, attempt) -> when its search last renewed the lease (monotonic)


def _interruption(claim: progress.Claim) -> str | None:
    """Why the search must stop, or None. A search that asks is making progress: every quarter of a lease it renews
    the job's lease too (a write; the other checks only read)."""
    if heartbeat.SHUTTING_DOWN.is_set():
        return "shutdown"
    key, now = (claim.job_id, claim.attempt), time.monotonic()
    if now - _renewed.get(key, -math.inf) < settings.job_lease_s / 4:
        return progress.interruption(settings, claim.job_id, claim.attempt)
    reason = progress.check_in(settings, claim.job_id, claim.attempt)
    _renewed[key] = now
    return reason


def _wait_for_target(claim: progress.Claim) -> Target:
    """The Target of a live worker measuring for the job's queue, waiting (and honouring a cancel) while none is."""
    while True:
        fields = _patiently(
            f"job {claim.job_id}: finding a worker", lambda: progress.live_target(settings, claim.queue)
        )
        if fields is not None:
            return Target(**fields)
        reason = _patiently(f"job {claim.job_id}: checking in", lambda: _interruption(claim))
        if reason:
            raise JobInterrupted(reason)
        time.sleep(WAIT_FOR_WORKER_S)


class _Progress:
    """The scheduler's callback: after every round, the job row, its task table and a curve point."""

    def __init__(self, claim: progress.Claim, positions: dict[str, int]):
        self.claim, self.positions = claim, positions
        self.start = time.monotonic()
        self.trials: dict[str, int] = {}  # per task, at the last report: the round's task is the one that grew
        self.errors: dict[str, int] = {}

    def __call__(self, sched) -> None:
        self.write(sched, point=True, check=True)

    def write(self, sched, point: bool, check: bool) -> None:
        c = self.claim
        before, self.trials = self.trials, {p.task.key: p.trials for p in sched.progress}
        grew = [p.task.key for p in sched.progress if p.trials != before.get(p.task.key, p.trials)]
        errors = {k: v - self.errors.get(k, 0) for k, v in sched.stats.errors.items() if v != self.errors.get(k, 0)}
        self.errors = dict(sched.stats.errors)
        trials_done = c.trials_done + sched.stats.trials
        tuning_s = c.tuning_s + time.monotonic() - self.start
        curve_point = {
            "trials": trials_done,
            "elapsed_s": tuning_s,
            "estimated_latency": progress.finite(sched.estimated_latency),
            "task": self.positions[grew[0]] if grew else None,
            "task_best": [progress.finite(p.best) for p in sched.progress],
            "errors": errors,
        }
        tasks = [_task_row(i, p, sched.calls(i)) for i, p in enumerate(sched.progress)]
        reason = _patiently(
            f"job {c.job_id}: recording a round",
            lambda: progress.record_round(
                settings,
                c.job_id,
                c.attempt,
                trials_done=trials_done,
                tuning_s=tuning_s,
                estimated_latency=sched.estimated_latency,
                tasks=tasks,
                point=curve_point if point else None,
            ),
        )
        if heartbeat.SHUTTING_DOWN.is_set():
            reason = reason or "shutdown"
        if reason and check:
            raise JobInterrupted(reason)


def _task_row(position: int, p, calls: int) -> dict[str, Any]:
    """A row of the job's task table, as `tilefarm tune` prints it: the weight is the calls the model makes of the
    task with the programs found so far (a conv's form that compile would not take is called 0 times)."""
    latency = progress.finite(p.best)
    return {
        "position": position,
        "name": p.task.name,
        "flops": p.task.flop_count,
        "weight": calls,
        "gflops": p.gflops,
        "latency_s": latency,
        "weighted_latency_s": latency * calls if latency is not None else None,
        "trials": p.trials,
        "done": p.done,
    }


def _search(claim: progress.Claim) -> None:
    from compiler.costs.cost_model import XGBModel
    from compiler.model.onnx_import import load
    from compiler.search.evolution import SearchParams
    from compiler.search.task_scheduler import TaskScheduler, TuneOptions, weights_timed_cold
    from compiler.search.transfer import ModelCache
    from compiler.tensor.tasks import tuning_plan

    # the model's tasks and its convs' other forms (as catalog.register_model stored them, under the same budget: a
    # fold past it is left to run time, so another budget could make other tasks), each conv counted at the form
    # compile would take
    plan = tuning_plan(load(claim.model_path, claim.input_shapes, model_budget(settings)))
    tasks = plan.all_tasks
    positions = {t.key: i for i, t in enumerate(tasks)}
    team = team_of(settings, Job, claim.job_id)  # its own imports are trusted by its search too (server.trust)
    db = PatientDatabase(
        settings.database_url,
        settings,
        _stopping,
        created_by=f"job/{claim.job_id}",
        job_id=claim.job_id,
        team_id=team,
    )
    try:
        db.describe_workloads(tasks)
        progress.ensure_model_tasks(settings, claim.model_id, tasks)
        target = _wait_for_target(claim)
        claim = _settle_earlier_attempts(claim)
        report = _Progress(claim, positions)
        trials = claim.trials - claim.trials_done
        time_left = None if claim.time_budget_s is None else claim.time_budget_s - claim.tuning_s
        budget_left = trials > 0 and (time_left is None or time_left > 0)
        prior = None
        if budget_left:
            prior, line = ModelCache().load_or_train(db, db.identity, target)
            log.info("job %d: %s", claim.job_id, line)
        options = TuneOptions(
            trials=trials,
            measures_per_round=claim.per_round,
            time_budget=time_left,
            seed=claim.seed,
            params=SearchParams(population=settings.search_population),
        )
        # as `tilefarm tune --weights auto`: a model whose weights outgrow the measuring host's last-level cache, or
        # the part of it the host keeps for them (measured, where this host is of the measuring class: a VM reports
        # its host's whole cache), meets them cold in every run, so its kernels are timed that way
        here = target.fingerprint() == host_target().fingerprint()
        # a GPU's kernels are timed warm (CudaRunner): its records are asked for in that condition
        cold = target.kind == "cpu" and weights_timed_cold("auto", plan.calls, target.l3_bytes, probe=here)
        log.info("job %d: kernels timed with weights %s", claim.job_id, "cold" if cold else "warm")
        runner = FarmRunner(
            settings,
            app,
            job_id=claim.job_id,
            queue=claim.queue,
            host=claim.host,
            positions=positions,
            options=RunnerOptions(cold_constants=cold),
            interrupted=lambda: _interruption(claim),
            stopping=_stopping,
        )
        sched = TaskScheduler(
            tasks,
            db,
            options,
            model=XGBModel(seed=claim.seed, prior=prior),
            builder=FarmBuilder(),
            runner=runner,
            target=target,
            callback=report,
            choices=plan.choices,
        )
        sched.resume(train=budget_left)
        report.write(sched, point=False, check=True)  # what the records hold, before this attempt's first round
        if budget_left:
            sched.run()
            report.write(sched, point=False, check=False)  # end_job settles a cancel that came after the last round
    finally:
        db.close()
        _renewed.pop((claim.job_id, claim.attempt), None)


def _settle_earlier_attempts(claim: progress.Claim) -> progress.Claim:
    """Wait for the batches an earlier attempt left with live workers (progress.settle_batches; a lost search's last
    round was never reported), then count every record the job stored as done: the budget left is what the job has
    not measured, and the records it reports are the ones stored for it."""
    while _patiently(f"job {claim.job_id}: settling batches", lambda: progress.settle_batches(settings, claim.job_id)):
        reason = _patiently(f"job {claim.job_id}: checking in", lambda: _interruption(claim))
        if reason:
            raise JobInterrupted(reason)
        time.sleep(WAIT_FOR_WORKER_S)
    measured = _patiently(f"job {claim.job_id}: counting", lambda: progress.job_measured(settings, claim.job_id))
    return dataclasses.replace(claim, trials_done=max(claim.trials_done, measured))


# ---------------------------------------------------------------------------------------------- verify imports

VERIFY_BATCH = 16  # imported records one verify_records message re-measures; then it queues the next batch


@app.task(name=VERIFY_RECORDS, ignore_result=True)
def verify_records(host: str, after: int = 0) -> int:
    """Re-measure the imported (unverified) records of host class `host`, VERIFY_BATCH of them above id `after`, the
    way measure_batch measures a job's candidates: each becomes verified with the measured costs, or a failed record
    when its schedule does not replay, build or run (an "unknown" failure, the measurer's own, leaves it unverified
    for the next sweep); then the next batch is queued. Returns how many were verified."""
    here = measuring.current()
    if here.fingerprint != host:  # its timings would not be valid for `host`
        return 0
    db = records_db(settings.database_url)
    batch = db.unverified(host, VERIFY_BATCH, after)
    groups: dict[tuple[str, str], list[tuple[int, TuningRecord, str, str | None]]] = {}
    for item in batch:
        groups.setdefault((item[1].workload_key, item[1].cache), []).append(item)
    verified = 0
    with MEASURE_LOCK:
        for items in groups.values():
            if _stopping():  # what is verified stays so; the message measures the rest
                _hand_back(f"verifying {host}", f"re-measuring of imported records back on its queue ({verified} done)")
            verified += _verify_group(db, items)
    if len(batch) == VERIFY_BATCH:
        enqueue_verify(settings, host, here.queue, batch[-1][0])
    return verified


def _verify_group(db: SQLDatabase, items: list[tuple[int, TuningRecord, str, str | None]]) -> int:
    """Measure unverified records of one workload and cache condition, and store what came out."""
    _, first, dag_text, op_tag = items[0]
    try:
        dag = dag_json.from_json(dag_text, first.workload_key)
    except dag_json.DAGFormatError:  # stored by a tilefarm with other DAG rules: not measurable here
        return 0
    # which inputs are the model's weights is not stored with a workload: a cold-weights record is timed with every
    # input cold, which can only come out slower than what it claimed
    constants = tuple(range(len(dag.inputs))) if first.cache == COLD_WEIGHTS else ()
    task = Task(first.workload_key, dag, op_tag or "imported", constants=constants)
    options = RunnerOptions(cache_flush=first.cache == FLUSHED, cold_constants=first.cache == COLD_WEIGHTS)
    todo, outcomes = [], []
    for record_id, record, _, _ in items:
        try:
            todo.append((record_id, record, MeasureInput(task, tuple(step_from_record(s) for s in record.steps))))
        except (TilefarmError, ValueError, TypeError) as e:  # steps this version cannot read
            failed = MeasureResult((), INSTANTIATION, str(e), 0.0, 0.0, cache=options.cache)
            outcomes.append((record_id, record, failed))
    measured = measure([inp for _, _, inp in todo], _builder(options), _runner(options)) if todo else []
    outcomes += [(record_id, record, r) for (record_id, record, _), r in zip(todo, measured)]
    verified = 0
    for record_id, record, r in outcomes:
        if r.error == UNKNOWN:
            continue
        measured_record = replace(
            record, costs=r.costs, error=r.error, error_message=r.message, timestamp=r.timestamp, version=VERSION
        )
        verified += db.verify(record_id, measured_record, (r.build_seconds, r.run_seconds))
    return verified


def _verify_on_start(sender=None, instance=None, **_) -> None:
    """A measuring worker that comes up asks for its host class's unverified records to be re-measured: those
    imported while no worker of the class was alive, or whose workload became known since (server.trust)."""
    if instance is None or instance.app is not app:
        return
    here = measuring.current()
    if here.queue not in instance.app.amqp.queues.consume_from:
        return
    try:
        if here.fingerprint in records_db(settings.database_url).unverified_hosts():
            enqueue_verify(settings, here.fingerprint, here.queue)
    except Exception:  # the next import, upload or start asks again
        log.exception("could not queue the re-measuring of imported records")


celeryd_after_setup.connect(_verify_on_start)
