"""The tilefarm REST API: `create_app()` (uvicorn --factory server.app:create_app) mounts the routers under /api/v1
and the web dashboard under / (server/dashboard), and answers every error as `{"detail": <what to do about it>,
"code": <slug>}`."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPMethod, HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from compiler.base.errors import TilefarmError
from compiler.costs.records import VERSION
from server import accounts, auth, dashboard
from server.db import engine_for, session_scope
from server.routes import ROUTERS
from server.settings import Settings

PREFIX = "/api/v1"
BOOTSTRAP_TEAM, BOOTSTRAP_TOKEN_NAME = "default", "bootstrap"
log = logging.getLogger("tilefarm.api")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(startup, settings)
        yield

    app = FastAPI(
        title="tilefarm",
        version=VERSION,
        description="Upload ONNX models, tune them on a farm of measurement workers, download compiled artifacts.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    for router in ROUTERS:
        app.include_router(router, prefix=PREFIX)
    dashboard.mount(app)  # the web dashboard under / and /static
    auth.redact_access_log()  # no event-stream ticket (or stray token) in uvicorn's access log
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(TilefarmError, _tilefarm_error)
    for down in (OperationalError, InterfaceError, PoolTimeout):  # the database went away (docs/service.md#faults)
        app.add_exception_handler(down, _database_down)
    app.add_exception_handler(Exception, _unexpected_error)
    return app


def startup(settings: Settings) -> None:
    """Bring the schema to head, and register TILEFARM_BOOTSTRAP_TOKEN for the team "default" (idempotent)."""
    engine_for(settings.database_url)
    if settings.bootstrap_token:
        with session_scope(settings) as session:
            team = accounts.ensure_team(session, BOOTSTRAP_TEAM)
            accounts.register_token(session, team, BOOTSTRAP_TOKEN_NAME, settings.bootstrap_token)


def _error(status: int, detail: str, code: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, "code": code}, status_code=status, headers=headers)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
        # FastAPI's answer to a JSON body that is not UTF-8; malformed JSON is a 422 (_validation_error), so is this
        return _error(422, "the request body is not valid JSON: it is not UTF-8 text", "invalid_request")
    if exc.status_code == 405:
        return _error(405, "Method Not Allowed", "method_not_allowed", {"Allow": _allowed_methods(request)})
    try:
        phrase = HTTPStatus(exc.status_code).phrase
    except ValueError:  # a status code HTTP does not name
        phrase = "error"
    detail = exc.detail if isinstance(exc.detail, str) else phrase
    return _error(exc.status_code, detail, _slug(phrase), dict(exc.headers or {}))


def _allowed_methods(request: Request) -> str:
    """Every method the path answers (RFC 9110's Allow), found by asking the app's routes about each: Starlette's
    405 names only those of the first route whose path matched, so OPTIONS /jobs said `Allow: POST` of a path that
    answers GET too."""

    def answers(method: str) -> bool:
        return any(r.matches({**request.scope, "method": method})[0] == Match.FULL for r in request.app.router.routes)

    return ", ".join(m for m in HTTPMethod if answers(m))


def _field(loc: tuple) -> str:
    """('body', 'trials') -> 'trials'; ('query', 'limit') -> 'limit'; ('body',) -> 'request body'."""
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
        loc = loc[1:]
    return ".".join(str(p) for p in loc) or "request body"


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if not errors:
        return _error(422, "invalid request", "invalid_request")
    first = errors[0]
    if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
        error = first.get("ctx", {}).get("error", "")
        detail = f"the request body is not valid JSON: {error}".rstrip(": ")
    elif tuple(first.get("loc", ())) == ("body",):  # every JSON body of this API is an object
        detail = "the request body must be a JSON object, sent with Content-Type: application/json"
    else:
        detail = f"{_field(tuple(first.get('loc', ())))}: {first.get('msg', 'invalid')}"
    if len(errors) > 1:
        detail += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return _error(422, detail, "invalid_request")


async def _tilefarm_error(request: Request, exc: Exception) -> JSONResponse:
    # server.schemas.ApiError carries its status and slug; the compiler's errors (InvalidModel, UnsupportedOp, ...)
    # are about the input: 422 with the compiler's message
    status = getattr(exc, "status_code", 422)
    code = getattr(exc, "code", None) or _slug(re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__))
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return _error(status, str(exc), code, headers)


async def _database_down(request: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable on %s %s: %s", request.method, request.url.path, str(exc).splitlines()[0])
    return _error(503, "the database does not answer; try again shortly", "database_unavailable", {"Retry-After": "5"})


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return _error(500, "internal server error; the server's log has the details", "internal_error")
