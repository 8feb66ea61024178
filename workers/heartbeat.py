"""Worker liveness: a WorkerRow registered when the Celery node starts, a heartbeat from a daemon thread, stopped
on a clean shutdown. Workers serving the search queue also reap: a running job whose search was lost (its lease ran
out, its worker went silent) is queued again as a new attempt, and resumes from the records database on whichever
search worker takes it (workers.progress.reap_lost_jobs). Every worker reaps builds: an artifact building on a
worker that stopped answering is queued again (workers.progress.reap_lost_builds). The heartbeat also stores what a
measure worker spooled while the database was down (workers.spool). Through a database outage the heartbeat waits,
saying so once; for a grace period after it, its worker judges no other lost (their heartbeats and leases could not
be written either)."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from typing import Any

from celery.signals import celeryd_after_setup, worker_shutdown, worker_shutting_down

from server.settings import Settings
from workers import measuring, progress, spool
from workers.celery_app import SEARCH_QUEUE
from workers.dispatch import enqueue_compile, enqueue_job
from workers.outage import DATABASE_DOWN, DOWN, first_line, limit_idle_transactions, patiently

log = logging.getLogger("tilefarm.workers")

# set when the worker begins a shutdown: a running search hands its job back instead of holding the worker up
SHUTTING_DOWN = threading.Event()
# what this worker's tasks handed back as it stopped ("job 3 queued again as attempt 2"), for its last line
HANDED_BACK: list[str] = []


@dataclasses.dataclass
class _Node:
    settings: Settings
    app: Any  # celery.Celery
    name: str | None = None
    reaps: bool = False
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    thread: threading.Thread | None = None


_node: _Node | None = None


def install(app, settings: Settings) -> None:
    """Connect the signal handlers for this process's Celery app (once; the handlers are module functions, which
    Celery's weak references keep alive)."""
    global _node
    _node = _Node(settings, app)
    limit_idle_transactions()  # a frozen worker's row locks do not outlive it for long (workers.outage)
    # registered once the node is set up but before its consumer takes a message (worker_ready comes after): a batch
    # taken by a worker whose row is missing or stale (a restart under the same name) would be judged lost
    celeryd_after_setup.connect(_on_setup)
    worker_shutting_down.connect(_on_shutting_down)
    worker_shutdown.connect(_on_shutdown)


def node_name() -> str | None:
    return _node.name if _node else None


def worker_kind(queues: list[str]) -> str:
    """cpu/gpu/npu from the measure queue a worker serves; "search" for one that only drives jobs."""
    kinds = [q.split(".")[1] for q in queues if q.startswith("measure.") and q.count(".") >= 2]
    return kinds[0] if kinds else "search"


def _on_setup(sender=None, instance=None, **_) -> None:
    node = _node
    if node is None or instance is None or instance.app is not node.app:
        return
    node.name = str(sender)
    queues = sorted(instance.app.amqp.queues.consume_from)
    node.reaps = SEARCH_QUEUE in queues
    host = measuring.current()  # this CPU, or the GPU `tilefarm worker --gpu N` measures on
    name = node.name
    # a worker that starts while the database is down waits for it (it could not take work without its row)
    patiently(
        node.settings,
        f"registering {name}",
        lambda: progress.register_worker(
            node.settings,
            name,
            kind=worker_kind(queues),
            fingerprint=host.fingerprint,
            target=measuring.as_fields(host),
            device=host.device(),
            queues=queues,
            pid=os.getpid(),
            hostname=socket.gethostname(),
        ),
    )
    # the old process under this name is gone (this one took its name): what it ran resumes now, not after the grace
    for job_id, attempt in patiently(node.settings, "restart", lambda: progress.restarted(node.settings, name)):
        log.warning("job %d ran on %s before it restarted: queued again as attempt %d", job_id, name, attempt)
        _enqueue(node.settings, job_id, attempt)
    for artifact_id, queue in patiently(
        node.settings, "restart", lambda: progress.reap_lost_builds(node.settings, restarted=name)
    ):
        log.warning("artifact %d was building on %s before it restarted: queued again", artifact_id, name)
        _enqueue_compile(node.settings, artifact_id, queue)
    node.thread = threading.Thread(target=_beat, args=(node,), name="tilefarm-heartbeat", daemon=True)
    node.thread.start()


def _enqueue(settings: Settings, job_id: int, attempt: int) -> None:
    try:
        enqueue_job(settings, job_id, attempt)
    except DOWN as e:  # the job stays queued in the database, and is sent again after a lease (reap_lost_jobs)
        log.warning("job %d: could not queue attempt %d (%s); it is sent again later", job_id, attempt, first_line(e))


def _enqueue_compile(settings: Settings, artifact_id: int, queue: str) -> None:
    try:
        enqueue_compile(settings, artifact_id, queue)
    except DOWN as e:  # it stays queued in the database, with nothing on its way: compiling again makes another
        log.warning("artifact %d: could not queue it again (%s)", artifact_id, first_line(e))


def _beat(node: _Node) -> None:
    assert node.name is not None
    settings = node.settings
    down_since: float | None = None
    judge_after = 0.0  # monotonic time before which this worker judges no other lost (after a database outage)
    while not node.stop.wait(settings.heartbeat_s):
        try:
            progress.heartbeat(settings, node.name)
        except DATABASE_DOWN as e:
            if down_since is None:
                down_since = time.monotonic()
                log.warning(
                    "heartbeat of %s: the database does not answer (%s); waiting for it", node.name, first_line(e)
                )
            continue
        except Exception:  # anything else must not end the heartbeat either: the next beat tries again
            log.exception("heartbeat of %s failed", node.name)
            continue
        if down_since is not None:
            log.warning(
                "heartbeat of %s: the database answers again after %.0f s", node.name, time.monotonic() - down_since
            )
            down_since = None
            judge_after = time.monotonic() + settings.worker_grace_s + 2 * settings.heartbeat_s
        try:
            if spool.pending(settings):
                spool.flush(settings)
            if time.monotonic() >= judge_after:
                for artifact_id, queue in progress.reap_lost_builds(settings):
                    log.warning("artifact %d: its build was lost: queued again", artifact_id)
                    _enqueue_compile(settings, artifact_id, queue)
            if node.reaps and time.monotonic() >= judge_after:
                for job_id, attempt in progress.reap_lost_jobs(settings):
                    log.warning(
                        "job %d: its search was lost or its message not taken: queued as attempt %d", job_id, attempt
                    )
                    _enqueue(settings, job_id, attempt)
        except Exception:  # a database hiccup must not end the heartbeat: the next beat tries again
            log.exception("heartbeat of %s: storing spooled records or reaping failed", node.name)


def _on_shutting_down(**_) -> None:
    SHUTTING_DOWN.set()


def _on_shutdown(**_) -> None:
    node = _node
    if node is None or node.name is None:
        return
    node.stop.set()
    if node.thread is not None:
        node.thread.join(10)  # a beat in flight must not land after the stopped mark
    try:
        progress.worker_stopped(node.settings, node.name)
    except Exception:
        log.exception("could not mark %s stopped", node.name)
