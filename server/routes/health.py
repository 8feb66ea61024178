"""GET /health: is the service up, and what it runs on (no token needed)."""

from __future__ import annotations

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
        raise Unavailable(f"the database does not answer: {type(e).__name__}", code="database_unavailable") from None
    return Health(
        status="ok",
        version=VERSION,
        database=engine.dialect.name,
        broker="embedded" if settings.embedded else "redis",
    )
