"""Who am I, and the team's API tokens: list, create (the token is shown once), revoke."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from server import accounts
from server.auth import CurrentTeam, SessionDep, SettingsDep
from server.db import session_scope
from server.models import Team
from server.params import Id
from server.schemas import ERROR_RESPONSES, Me, NewToken, NotFound, TokenCreate, TokenOut, TokenRef, error_responses

router = APIRouter(tags=["tokens"], responses=ERROR_RESPONSES)


@router.get("/me")
def me(who: CurrentTeam) -> Me:
    return Me(team=who.team, token=TokenRef(id=who.token_id, name=who.token_name, prefix=who.token_prefix))


@router.get("/tokens")
def list_tokens(who: CurrentTeam, session: SessionDep) -> list[TokenOut]:
    rows = accounts.list_tokens(session, session.get_one(Team, who.team_id))
    return [TokenOut.model_validate(r, from_attributes=True) for r in rows]


@router.post("/tokens", status_code=status.HTTP_201_CREATED)
def create_token(body: TokenCreate, who: CurrentTeam, settings: SettingsDep) -> NewToken:
    with session_scope(settings) as session:
        row, token = accounts.create_token(session, session.get_one(Team, who.team_id), body.name)
        return NewToken(id=row.id, name=row.name, prefix=row.prefix, token=token)


@router.delete("/tokens/{token_id}", status_code=status.HTTP_204_NO_CONTENT, responses=error_responses(404))
def revoke_token(token_id: Id, who: CurrentTeam, settings: SettingsDep) -> Response:
    with session_scope(settings) as session:
        if accounts.revoke_token(session, session.get_one(Team, who.team_id), token_id) is None:
            raise NotFound(f"no token {token_id}")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
