"""Teams and their API tokens, as plain functions over a Session (the API and `tilefarm serve` share them).

A token is shown once: only its sha256 is stored, with its first characters as a `prefix` to tell tokens apart.
A token's role is `admin` (manages the team's tokens, imports records) or `member` (everything else); the token a
team starts with is its admin.

An event-stream ticket stands in for a token in a URL (a browser's EventSource cannot send headers, and a URL ends
up in access logs): `<token id>.<job id>.<expiry>.<mac>`, the MAC an HMAC keyed by the token's stored hash. Nothing
is stored, so any API process can check a ticket, and revoking the token ends its tickets."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.models import ApiToken, Team
from server.schemas import Conflict, Role, Unauthorized, as_utc

PREFIX_CHARS = 11
TOKEN_PREFIX = "tf_"
# last_used_at is rewritten at most this often per token: a write per request would make every read a writer
TOUCH_INTERVAL = timedelta(minutes=1)
TICKET_TTL_S = 60  # long enough to open the stream (and for EventSource's own reconnects), short in a leaked log
# compared against when no row matched, so an unknown token takes the same steps as a known one; no sha256 is this
NO_HASH = "0" * 64


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


def _store(session: Session, team: Team, name: str, token: str, role: Role) -> ApiToken:
    token_hash = hash_token(token)
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == token_hash))
    if row is None:
        row = ApiToken(team_id=team.id, name=name, token_hash=token_hash, prefix=token[:PREFIX_CHARS], role=role)
        session.add(row)
        session.flush()
    return row


def register_token(session: Session, team: Team, name: str, token: str) -> ApiToken:
    """Store a token string given from outside (TILEFARM_BOOTSTRAP_TOKEN) as an admin token: the operator's, the one
    the team starts with. Idempotent: a token already stored is left as it is, revoked included, so a restart does
    not bring back a token someone revoked."""
    return _store(session, team, name, token, "admin")


def create_token(session: Session, team: Team, name: str, role: Role = "member") -> tuple[ApiToken, str]:
    """A new random token for `team`: its row and the token string (the one time it exists in clear). Tokens start
    with TOKEN_PREFIX, so they are recognizable in logs and never begin with "-" (which `--token -x…` would take for
    an option)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return _store(session, team, name, token, role), token


def list_tokens(session: Session, team: Team) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).where(ApiToken.team_id == team.id).order_by(ApiToken.id)))


def revoke_token(session: Session, team: Team, token_id: int) -> ApiToken | None:
    """Revoke a token of `team` (None if it has no such token); revoking twice keeps the first revocation time."""
    row = session.scalar(select(ApiToken).where(ApiToken.id == token_id, ApiToken.team_id == team.id))
    if row is not None and row.revoked_at is None:
        row.revoked_at = datetime.now(UTC)
    return row


def _live(found: tuple[Team, ApiToken] | None, token_hash: str) -> tuple[Team, ApiToken] | None:
    """`found` if its stored hash is `token_hash` and it is not revoked. The comparison is constant-time and runs
    whether or not a row was found, and unknown and revoked tokens leave by the same return: a caller cannot tell
    them apart, by answer or by time."""
    matches = hmac.compare_digest(found[1].token_hash if found else NO_HASH, token_hash)
    return found if matches and found is not None and found[1].revoked_at is None else None


def find_token(session: Session, token: str) -> tuple[Team, ApiToken] | None:
    """The team and row of a live (not revoked) token, without writing anything."""
    token_hash = hash_token(token)
    # the index lookup finds the row; the constant-time comparison after it decides (a lookup is neither
    # constant-time nor, under a case-insensitive collation, exact)
    row = session.execute(
        select(Team, ApiToken).join(ApiToken, ApiToken.team_id == Team.id).where(ApiToken.token_hash == token_hash)
    ).first()
    return _live((row[0], row[1]) if row is not None else None, token_hash)


def needs_touch(row: ApiToken, now: datetime | None = None) -> bool:
    now = now or datetime.now(UTC)
    return row.last_used_at is None or now - as_utc(row.last_used_at) >= TOUCH_INTERVAL


def authenticate(session: Session, token: str) -> tuple[Team, ApiToken] | None:
    """find_token, and record the use in last_used_at (at most once per TOUCH_INTERVAL)."""
    found = find_token(session, token)
    if found is not None and needs_touch(found[1]):
        found[1].last_used_at = datetime.now(UTC)
    return found


# ---------------------------------------------------------------------------------------------- event-stream tickets


# <token id>.<job id>.<expiry>.<mac>, in ASCII digits and lowercase hex
TICKET = re.compile(r"([0-9]{1,10})\.([0-9]{1,10})\.([0-9]{1,19})\.([0-9a-f]{64})")
# token ids are an Integer column, int32 on PostgreSQL: a larger id would be a driver error, not "no such token"
ID_MAX = 2**31 - 1


def _ticket_mac(token_hash: str, token_id: int, job_id: int, expires: int) -> str:
    message = f"events-ticket.{token_id}.{job_id}.{expires}"  # the label keeps these MACs apart from any other use
    return hmac.new(token_hash.encode(), message.encode(), hashlib.sha256).hexdigest()


def issue_ticket(row: ApiToken, job_id: int, now: float | None = None) -> tuple[str, datetime]:
    """A ticket for the event stream of `job_id`, in the name of token `row`, and when it expires."""
    expires = int(now if now is not None else time.time()) + TICKET_TTL_S
    ticket = f"{row.id}.{job_id}.{expires}.{_ticket_mac(row.token_hash, row.id, job_id, expires)}"
    return ticket, datetime.fromtimestamp(expires, UTC)


def check_ticket(session: Session, ticket: str, job_id: int, now: float | None = None) -> tuple[Team, ApiToken]:
    """The team and token a ticket for the event stream of `job_id` speaks for, else Unauthorized. A malformed or
    altered ticket, one made for another job, and one of an unknown or revoked token are refused with one message,
    after the same steps; only an intact ticket is told it expired."""
    match = TICKET.fullmatch(ticket)
    token_id, for_job, expires = (int(g) for g in match.groups()[:3]) if match else (0, 0, 0)
    well_formed = match is not None and max(token_id, for_job) <= ID_MAX
    row = session.execute(
        select(Team, ApiToken)
        .join(ApiToken, ApiToken.team_id == Team.id)
        .where(ApiToken.id == (token_id if well_formed else 0))
    ).first()
    found = (row[0], row[1]) if row is not None else None
    # the MAC is of the job in the path, so a ticket for another job fails here like a forged one
    expected = _ticket_mac(found[1].token_hash if found else NO_HASH, token_id, job_id, expires)
    intact = hmac.compare_digest(expected.encode(), (match.group(4) if match else "").encode())
    if not (intact and well_formed and for_job == job_id) or found is None or found[1].revoked_at is not None:
        raise Unauthorized("invalid event-stream ticket")
    if expires < (now if now is not None else time.time()):
        raise Unauthorized(f"expired event-stream ticket: POST /jobs/{job_id}/events/ticket for a new one")
    return found
