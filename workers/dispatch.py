"""What the API server sends to the farm: a tuning job to the search queue, a compile to the host's queue.

Messages go by task name (`send_task`), so the API process never imports the tasks' code."""

from __future__ import annotations

import functools

from celery import Celery

from server.settings import Settings
from workers.celery_app import COMPILE_ARTIFACT, SEARCH_JOB, SEARCH_QUEUE, VERIFY_RECORDS, make_celery


@functools.cache
def _app(settings: Settings) -> Celery:
    return make_celery(settings)


def enqueue_job(settings: Settings, job_id: int, attempt: int) -> str:
    """Queue attempt `attempt` of tuning job `job_id` for a search worker; returns the message's task id."""
    return _app(settings).send_task(SEARCH_JOB, args=(job_id, attempt), queue=SEARCH_QUEUE).id


def enqueue_compile(settings: Settings, artifact_id: int, queue: str) -> str:
    """Queue the build of artifact `artifact_id` on a worker of its host class (`queue`: measure.<kind>.<fp>)."""
    return _app(settings).send_task(COMPILE_ARTIFACT, args=(artifact_id,), queue=queue).id


def enqueue_verify(settings: Settings, host: str, queue: str, after: int = 0) -> str:
    """Queue the re-measuring of host class `host`'s unverified records above id `after` on its measure queue
    (`queue`: measure.<kind>.<fp>); see workers.tasks.verify_records."""
    return _app(settings).send_task(VERIFY_RECORDS, args=(host, after), queue=queue).id
