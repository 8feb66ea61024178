"""GET /health: is the service up, and what it runs on (no token needed): 503 naming the database or the farm's broker
when either does not answer."""

from __future__ import annotations

import redis
from fastapi import APIRouter
from sqlalchemy import text

from compiler.costs.records import VERSION
from server.auth import SettingsDep
from server.db import engine_for
from server.schemas import ErrorBody, Health, Unavailable

router = APIRouter(tags=["health"])


@router.get("/health", responses={503: {"model": ErrorBody}})
def health(settings: SettingsDep) -> Health:
    engine = engine_for(settings.database_url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as e:
        why = _first_line(getattr(e, "orig", None) or e)  # the driver's words, without SQLAlchemy's wrapping
        raise Unavailable(f"the database does not answer: {why}", code="database_unavailable") from None
    if not settings.embedded:  # the farm's broker: jobs queue there, so a service without it cannot tune
        try:
            with redis.Redis.from_url(settings.broker_url, socket_timeout=2, socket_connect_timeout=2) as broker:
                broker.ping()
        except (redis.RedisError, OSError, ValueError) as e:
            raise Unavailable(f"the broker does not answer: {_first_line(e)}", code="broker_unavailable") from None
    return Health(
        status="ok",
        version=VERSION,
        database=engine.dialect.name,
        broker="embedded" if settings.embedded else "redis",
    )


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}"[:300] if lines else type(e).__name__
