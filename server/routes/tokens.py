"""Who am I, and the team's API tokens: list, create (the token is shown once), revoke. Managing tokens takes an
admin token; `/me` answers any token."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from server import accounts
from server.auth import AdminTeam, CurrentTeam, SessionDep, SettingsDep
from server.db import session_scope
from server.models import Team
from server.params import Id
from server.schemas import ERROR_RESPONSES, Me, NewToken, NotFound, TokenCreate, TokenOut, TokenRef, error_responses

router = APIRouter(tags=["tokens"], responses=ERROR_RESPONSES)


@router.get("/me")
def me(who: CurrentTeam) -> Me:
    token = TokenRef(id=who.token_id, name=who.token_name, prefix=who.token_prefix, role=who.role)
    return Me(team=who.team, token=token)


@router.get("/tokens", responses=error_responses(403))
def list_tokens(who: AdminTeam, session: SessionDep) -> list[TokenOut]:
    rows = accounts.list_tokens(session, session.get_one(Team, who.team_id))
    return [TokenOut.model_validate(r, from_attributes=True) for r in rows]


@router.post("/tokens", status_code=status.HTTP_201_CREATED, responses=error_responses(403))
def create_token(body: TokenCreate, who: AdminTeam, settings: SettingsDep) -> NewToken:
    """A new token of the team, `member` unless `role` says `admin`."""
    with session_scope(settings) as session:
        row, token = accounts.create_token(session, session.get_one(Team, who.team_id), body.name, body.role)
        return NewToken(id=row.id, name=row.name, prefix=row.prefix, role=body.role, token=token)


@router.delete("/tokens/{token_id}", status_code=status.HTTP_204_NO_CONTENT, responses=error_responses(403, 404))
def revoke_token(token_id: Id, who: AdminTeam, settings: SettingsDep) -> Response:
    with session_scope(settings) as session:
        if accounts.revoke_token(session, session.get_one(Team, who.team_id), token_id) is None:
            raise NotFound(f"no token {token_id}")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
