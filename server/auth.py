"""Request dependencies: the settings, a read session, and the team a bearer token belongs to, as typed
`Annotated` aliases so routes stay one line of parameters."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from server import accounts
from server.db import session_scope
from server.schemas import Unauthorized
from server.settings import Settings

bearer = HTTPBearer(auto_error=False, description="an API token: `Authorization: Bearer <token>`")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the team and the token it used."""

    team_id: int
    team: str
    token_id: int
    token_name: str
    token_prefix: str


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
        if found is None:
            raise Unauthorized("unknown or revoked API token")
        team, row = found
        who = Principal(team.id, team.name, row.id, row.name, row.prefix)
        touch = accounts.needs_touch(row)
    if touch:  # a separate writer: on SQLite a read transaction cannot become a write one
        with session_scope(settings) as session:
            accounts.authenticate(session, token)
    return who


def current_team(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Principal:
    return principal(settings, credentials.credentials if credentials else None)


def current_team_or_query(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    token: Annotated[str | None, Query(description="the API token, for clients that cannot set headers")] = None,
) -> Principal:
    """Header or `?token=`: a browser's EventSource cannot set headers. Only the event stream accepts it, since a
    token in a URL ends up in access logs."""
    return principal(settings, credentials.credentials if credentials else token)


CurrentTeam = Annotated[Principal, Depends(current_team)]
CurrentTeamOrQuery = Annotated[Principal, Depends(current_team_or_query)]
