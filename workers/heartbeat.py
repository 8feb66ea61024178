"""Worker liveness: a WorkerRow registered when the Celery node starts, a heartbeat from a daemon thread, stopped
on a clean shutdown. Workers serving the search queue also reap: a running job whose search worker went silent is
queued again as a new attempt, and resumes from the records database on whichever search worker takes it."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
from typing import Any

from celery.signals import celeryd_after_setup, worker_shutdown, worker_shutting_down

from compiler.targets import host_target
from server.settings import Settings
from workers import progress
from workers.celery_app import SEARCH_QUEUE
from workers.dispatch import enqueue_job

log = logging.getLogger("tilefarm.workers")

# set when the worker begins a shutdown: a running search hands its job back instead of holding the worker up
SHUTTING_DOWN = threading.Event()


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
    host = host_target()
    progress.register_worker(
        node.settings,
        node.name,
        kind=worker_kind(queues),
        fingerprint=host.fingerprint(),
        target=dataclasses.asdict(host),
        queues=queues,
        pid=os.getpid(),
        hostname=socket.gethostname(),
    )
    # the old process under this name is gone (this one took its name): what it ran resumes now, not after the grace
    for job_id, attempt in progress.restarted(node.settings, node.name):
        log.warning("job %d ran on %s before it restarted: queued again as attempt %d", job_id, node.name, attempt)
        enqueue_job(node.settings, job_id, attempt)
    node.thread = threading.Thread(target=_beat, args=(node,), name="tilefarm-heartbeat", daemon=True)
    node.thread.start()


def _beat(node: _Node) -> None:
    assert node.name is not None
    while not node.stop.wait(node.settings.heartbeat_s):
        try:
            progress.heartbeat(node.settings, node.name)
            if node.reaps:
                for job_id, attempt in progress.reap_lost_jobs(node.settings):
                    log.warning("job %d lost its search worker: queued again as attempt %d", job_id, attempt)
                    enqueue_job(node.settings, job_id, attempt)
        except Exception:  # a database hiccup must not end the heartbeat: the next beat tries again
            log.exception("heartbeat of %s failed", node.name)


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
