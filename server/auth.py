"""Request dependencies: the settings, a read session, and the team a bearer token belongs to (with the token's
role), as typed `Annotated` aliases so routes stay one line of parameters.

A token only ever comes in the `Authorization` header. The one route a browser cannot send a header to, the job
event stream (EventSource), takes a short-lived ticket for that job instead (server.accounts.issue_ticket), and
`redact_access_log` keeps tickets and tokens given in a query out of uvicorn's access log."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from server import accounts
from server.db import session_scope
from server.models import ApiToken, Team
from server.params import Id
from server.schemas import Forbidden, Role, Unauthorized
from server.settings import Settings

bearer = HTTPBearer(auto_error=False, description="an API token: `Authorization: Bearer <token>`")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the team, the token it used, and that token's role."""

    team_id: int
    team: str
    token_id: int
    token_name: str
    token_prefix: str
    role: Role

    @classmethod
    def of(cls, team: Team, row: ApiToken) -> Principal:
        role: Role = "admin" if row.role == "admin" else "member"  # anything else the column holds grants nothing
        return cls(team.id, team.name, row.id, row.name, row.prefix, role)


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_session(settings: SettingsDep) -> Iterator[Session]:
    """A read transaction for the request. Writes open their own short transaction (server.jobs, ...), so they
    commit before the answer is sent and before a message is queued for the farm."""
    with session_scope(settings, write=False) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def principal(settings: Settings, token: str | None) -> Principal:
    if not token:
        raise Unauthorized("missing API token: send the header 'Authorization: Bearer <token>'")
    with session_scope(settings, write=False) as session:
        found = accounts.find_token(session, token)
        if found is None:  # unknown and revoked alike: one message, and find_token took the same steps for both
            raise Unauthorized("unknown or revoked API token")
        who = Principal.of(*found)
        touch = accounts.needs_touch(found[1])
    if touch:  # a separate writer: on SQLite a read transaction cannot become a write one
        with session_scope(settings) as session:
            accounts.authenticate(session, token)
    return who


def current_team(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Principal:
    return principal(settings, credentials.credentials if credentials else None)


CurrentTeam = Annotated[Principal, Depends(current_team)]


def require_admin(who: CurrentTeam) -> Principal:
    """The caller, if its token is an admin token; a member token gets 403 naming the role it lacks."""
    if who.role != "admin":
        raise Forbidden(f"this needs a token with the role 'admin'; token {who.token_name!r} is a {who.role}")
    return who


AdminTeam = Annotated[Principal, Depends(require_admin)]


def event_stream_team(
    job_id: Id,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ticket: Annotated[str | None, Query(description="from POST /jobs/{job_id}/events/ticket, for EventSource")] = None,
) -> Principal:
    """The bearer header, or else `?ticket=` for this job (a browser's EventSource cannot set headers). A ticket is
    checked when the stream opens, so an open stream outlives it."""
    if credentials is not None:
        return principal(settings, credentials.credentials)
    if ticket is None:
        raise Unauthorized(
            "missing credentials: send the header 'Authorization: Bearer <token>', or ?ticket= from "
            f"POST /jobs/{job_id}/events/ticket"
        )
    with session_scope(settings, write=False) as session:
        return Principal.of(*accounts.check_ticket(session, ticket, job_id))


EventStreamTeam = Annotated[Principal, Depends(event_stream_team)]

# ---------------------------------------------------------------------------------------------- access log

# a query parameter that carries a credential: its value never reaches a log line
SECRET_QUERY = re.compile(r"([?&](?:ticket|token)=)[^&\s\"]*", re.IGNORECASE)


class RedactSecrets(logging.Filter):
    """Blanks `ticket=` and `token=` values in a log record's message and arguments. uvicorn's access log line is
    `'%s - "%s %s HTTP/%s" %d'` with the path and query as one argument, so that is where they would show."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = SECRET_QUERY.sub(r"\1[redacted]", record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(SECRET_QUERY.sub(r"\1[redacted]", a) if isinstance(a, str) else a for a in record.args)
        return True


REDACT_SECRETS = RedactSecrets()  # one instance: Logger.addFilter skips a filter it holds, so adding it is idempotent


def redact_access_log() -> None:
    """Put RedactSecrets on uvicorn's access logger, however uvicorn was started (`tilefarm serve`, `uvicorn
    --factory`). Logging configuration replaces a logger's handlers but keeps its filters."""
    logging.getLogger("uvicorn.access").addFilter(REDACT_SECRETS)
