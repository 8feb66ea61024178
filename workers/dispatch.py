"""What the API server sends to the farm: a tuning job to the search queue, a compile to the host's queue.

Messages go by task name (`send_task`), so the API process never imports the tasks' code."""

from __future__ import annotations

import functools

from celery import Celery

from server.settings import Settings
from workers.celery_app import COMPILE_ARTIFACT, SEARCH_JOB, SEARCH_QUEUE, make_celery


@functools.cache
def _app(settings: Settings) -> Celery:
    return make_celery(settings)


def enqueue_job(settings: Settings, job_id: int, attempt: int) -> str:
    """Queue attempt `attempt` of tuning job `job_id` for a search worker; returns the message's task id."""
    return _app(settings).send_task(SEARCH_JOB, args=(job_id, attempt), queue=SEARCH_QUEUE).id


def enqueue_compile(settings: Settings, artifact_id: int, queue: str) -> str:
    """Queue the build of artifact `artifact_id` on a worker of its host class (`queue`: measure.<kind>.<fp>)."""
    return _app(settings).send_task(COMPILE_ARTIFACT, args=(artifact_id,), queue=queue).id
