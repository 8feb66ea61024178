"""The Celery app, configured from the service settings, and the queue names hosts are addressed by.

Queues: `search` (the tasks that drive tuning jobs: CPU-light, long-lived), `measure.<kind>.<fingerprint>` (one
per host class: its workers build in parallel and run one measurement at a time), and the same queue for compiles,
since an artifact is compiled on the host class it was tuned for. Farm: Redis as broker and result backend.
Embedded (no TILEFARM_BROKER_URL): kombu's file-system transport and Celery's file result backend in the storage
folder, so `tilefarm serve` needs no server and runs the very same tasks."""

from __future__ import annotations

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES

from server.settings import Settings
from workers import fs_broker, redis_broker

SEARCH_QUEUE = "search"
SEARCH_JOB = "tilefarm.search_job"
MEASURE_BATCH = "tilefarm.measure_batch"
COMPILE_ARTIFACT = "tilefarm.compile_artifact"
BROKER_SOCKET_TIMEOUT_S = 10.0
VERIFY_RECORDS = "tilefarm.verify_records"  # re-measure imported records (server.trust)


# the hardware kind a target kind is measured on, the middle of its queue's name: a cuda target's host class is a GPU
HARDWARE = {"cpu": "cpu", "cuda": "gpu"}


def measure_queue(fingerprint: str, kind: str = "cpu") -> str:
    """The queue of host class `fingerprint`: measure.cpu.<fingerprint>, measure.gpu.<fingerprint> for a target kind
    cuda (a GPU's fingerprint: compiler.targets.cuda.fingerprint)."""
    return f"measure.{HARDWARE.get(kind, kind)}.{fingerprint}"


def make_celery(settings: Settings) -> Celery:
    app = Celery("tilefarm", set_as_current=False)
    if settings.embedded:
        root = settings.storage / "broker"
        for sub in ("queue", "processed", "results", "control"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        # kombu's file-system transport with whole-file writes (workers.fs_broker); a host named, or kombu warns on
        # every connection that it assumes one
        TRANSPORT_ALIASES.setdefault(fs_broker.SCHEME, "workers.fs_broker:Transport")
        broker = f"{fs_broker.SCHEME}://localhost//"
        transport = {
            "data_folder_in": str(root / "queue"),
            "data_folder_out": str(root / "queue"),
            "processed_folder": str(root / "processed"),
            # broadcast exchanges (remote control: revoke) are files here; kombu's default is ./control in the cwd
            "control_folder": str(root / "control"),
            "store_processed": False,
            "polling_interval": 0.2,
        }
        backend = f"file://{root / 'results'}"
    else:
        broker = settings.broker_url
        # a socket timeout on every Redis call, so a broker that stops answering (paused, a broken network) is an
        # error a worker can wait out (workers.outage), never a call that hangs for ever; above BRPOP's 1 s
        transport = {
            "visibility_timeout": settings.visibility_timeout_s,
            "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
            "socket_connect_timeout": BROKER_SOCKET_TIMEOUT_S,
            # how often a worker gives back messages unacknowledged past the visibility timeout: every half of it,
            # at most every 100 s (kombu's default sweep: 10 s x every 10th)
            "unacked_restore_interval": min(100.0, max(1.0, settings.visibility_timeout_s / 2)),
            "unacked_restore_throttle": 1,
        }
        backend = settings.broker_url
    app.conf.update(
        broker_url=broker,
        # redis://: kombu's transport with a connection-loss fix (workers.redis_broker)
        broker_transport=redis_broker.TRANSPORT if broker.startswith("redis://") else None,
        redis_socket_timeout=BROKER_SOCKET_TIMEOUT_S,
        redis_socket_connect_timeout=BROKER_SOCKET_TIMEOUT_S,
        result_backend=backend,
        broker_transport_options=transport,
        result_backend_transport_options=transport if not settings.embedded else {},
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # a message is acknowledged only once its task has finished, and a task whose worker died is given back,
        # so a lost worker loses no batch; record commits are idempotent, so running one twice is harmless
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # a search runs in a worker thread for the whole job, and rides out a broker outage (workers.outage): losing
        # the connection must not cancel it (Celery 6's default would)
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_track_started=True,  # the result shows which worker took a batch (its heartbeat tells if it died)
        result_extended=True,
        result_expires=7 * 24 * 3600,
        task_default_queue=SEARCH_QUEUE,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app
