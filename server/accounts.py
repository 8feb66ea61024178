"""Teams and their API tokens, as plain functions over a Session (the API and `tilefarm serve` share them).

A token is shown once: only its sha256 is stored, with its first characters as a `prefix` to tell tokens apart."""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.models import ApiToken, Team
from server.schemas import Conflict, as_utc

PREFIX_CHARS = 11
TOKEN_PREFIX = "tf_"
# last_used_at is rewritten at most this often per token: a write per request would make every read a writer
TOUCH_INTERVAL = timedelta(minutes=1)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_team(session: Session, name: str) -> Team:
    if session.scalar(select(Team).where(Team.name == name)) is not None:
        raise Conflict(f"a team named {name!r} exists already")
    team = Team(name=name)
    session.add(team)
    session.flush()
    return team


def ensure_team(session: Session, name: str) -> Team:
    """The team called `name`, created if missing."""
    team = session.scalar(select(Team).where(Team.name == name))
    return team if team is not None else create_team(session, name)


def register_token(session: Session, team: Team, name: str, token: str) -> ApiToken:
    """Store a token string given from outside (TILEFARM_BOOTSTRAP_TOKEN). Idempotent: a token already stored is
    left as it is, revoked included, so a restart does not bring back a token someone revoked."""
    token_hash = hash_token(token)
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == token_hash))
    if row is None:
        row = ApiToken(team_id=team.id, name=name, token_hash=token_hash, prefix=token[:PREFIX_CHARS])
        session.add(row)
        session.flush()
    return row


def create_token(session: Session, team: Team, name: str) -> tuple[ApiToken, str]:
    """A new random token for `team`: its row and the token string (the one time it exists in clear). Tokens start
    with TOKEN_PREFIX, so they are recognizable in logs and never begin with "-" (which `--token -x…` would take for
    an option)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return register_token(session, team, name, token), token


def list_tokens(session: Session, team: Team) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).where(ApiToken.team_id == team.id).order_by(ApiToken.id)))


def revoke_token(session: Session, team: Team, token_id: int) -> ApiToken | None:
    """Revoke a token of `team` (None if it has no such token); revoking twice keeps the first revocation time."""
    row = session.scalar(select(ApiToken).where(ApiToken.id == token_id, ApiToken.team_id == team.id))
    if row is not None and row.revoked_at is None:
        row.revoked_at = datetime.now(UTC)
    return row


def find_token(session: Session, token: str) -> tuple[Team, ApiToken] | None:
    """The team and row of a live (not revoked) token, without writing anything."""
    found = session.execute(
        select(Team, ApiToken)
        .join(ApiToken, ApiToken.team_id == Team.id)
        .where(ApiToken.token_hash == hash_token(token), ApiToken.revoked_at.is_(None))
    ).first()
    return (found[0], found[1]) if found is not None else None


def needs_touch(row: ApiToken, now: datetime | None = None) -> bool:
    now = now or datetime.now(UTC)
    return row.last_used_at is None or now - as_utc(row.last_used_at) >= TOUCH_INTERVAL


def authenticate(session: Session, token: str) -> tuple[Team, ApiToken] | None:
    """find_token, and record the use in last_used_at (at most once per TOUCH_INTERVAL)."""
    found = find_token(session, token)
    if found is not None and needs_touch(found[1]):
        found[1].last_used_at = datetime.now(UTC)
    return found
