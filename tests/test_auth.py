"""Who may do what: token roles (admin manages tokens and imports records, member does the rest), one answer for
unknown and revoked tokens, the event stream's short-lived tickets, and an access log that shows neither tokens nor
tickets. Through HTTP on the same app, database and fixtures as tests/test_api.py."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import UTC, datetime

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from server import accounts
from server.app import create_app
from server.db import session_scope
from server.models import ApiToken, Job, Record
from server.settings import Settings
from tests import test_api
from tests.conftest import service_environ
from tests.test_api import API, TOKEN, assert_error, bearer, parse_events, records
from tilefarm.serve import free_port, prepare

# tests/test_api.py's fixtures, by the names the tests ask for
client, model, other_token, settings = test_api.client, test_api.model, test_api.other_token, test_api.settings


def new_token(client: TestClient, name: str, role: str | None = None) -> dict:
    r = client.post(f"{API}/tokens", json={"name": name} if role is None else {"name": name, "role": role})
    assert r.status_code == 201, r.text
    return r.json()


def count_records(settings: Settings) -> int:
    with session_scope(settings, write=False) as session:
        return session.scalar(select(func.count()).select_from(Record)) or 0


def finished_job(client: TestClient, settings: Settings, model_id: int) -> int:
    """A job of the default team, marked succeeded (no worker runs here), so its event stream ends at once."""
    job = client.post(f"{API}/jobs", json={"model_id": model_id, "trials": 4}).json()
    with session_scope(settings) as session:
        session.get_one(Job, job["id"]).state = "succeeded"
    return job["id"]


def ticket_for(client: TestClient, job_id: int, token: str = TOKEN) -> str:
    r = client.post(f"{API}/jobs/{job_id}/events/ticket", headers=bearer(token))
    assert r.status_code == 200, r.text
    return r.json()["ticket"]


def stream(client: TestClient, job_id: int, **params: str) -> httpx.Response:
    """GET the event stream with no Authorization header (as EventSource sends it), read to its end."""
    return client.get(f"{API}/jobs/{job_id}/events", params=params, headers={"Authorization": ""})


# ---------------------------------------------------------------------------------------------- roles


def test_a_teams_first_token_is_admin_and_new_tokens_are_members(client, settings, tmp_path):
    me = client.get(f"{API}/me").json()  # TILEFARM_BOOTSTRAP_TOKEN: the token team "default" starts with
    assert me["token"] == {"id": me["token"]["id"], "name": "bootstrap", "prefix": TOKEN[:11], "role": "admin"}

    laptop = new_token(client, "laptop")
    assert laptop["role"] == "member"
    assert client.get(f"{API}/me", headers=bearer(laptop["token"])).json()["token"]["role"] == "member"
    ops = new_token(client, "ops", role="admin")
    assert client.get(f"{API}/me", headers=bearer(ops["token"])).json()["token"]["role"] == "admin"
    listed = {t["name"]: t["role"] for t in client.get(f"{API}/tokens").json()}
    assert listed == {"bootstrap": "admin", "laptop": "member", "ops": "admin"}
    assert_error(client.post(f"{API}/tokens", json={"name": "x", "role": "owner"}), 422, "invalid_request")

    # `tilefarm serve` makes its team's token when there is none: the operator's, an admin
    env = service_environ(tmp_path)
    token, created = prepare(env)
    with session_scope(Settings.from_env(env), write=False) as session:
        found = accounts.find_token(session, token)
    assert created and found is not None and found[1].role == "admin"


def test_a_member_cannot_manage_tokens_or_import_records_and_an_admin_can(client, settings, model):
    member = new_token(client, "laptop")
    m = bearer(member["token"])
    admin_id = client.get(f"{API}/me").json()["token"]["id"]
    lines = "".join(r.to_json() + "\n" for r in records(2))
    for r in (
        client.post(f"{API}/tokens", json={"name": "mine"}, headers=m),
        client.post(f"{API}/tokens", json={"name": "mine", "role": "admin"}, headers=m),
        client.get(f"{API}/tokens", headers=m),
        client.delete(f"{API}/tokens/{admin_id}", headers=m),
        client.delete(f"{API}/tokens/{member['id']}", headers=m),
        client.post(f"{API}/records/import", content=lines, headers=m),
    ):
        detail = assert_error(r, 403, "forbidden")
        assert "role 'admin'" in detail and "'laptop' is a member" in detail, detail
    assert count_records(settings) == 0
    assert client.get(f"{API}/me", headers=m).status_code == 200  # nothing above revoked anything

    # a member uploads, tunes, compiles and reads
    assert client.get(f"{API}/models", headers=m).json()[0]["id"] == model["id"]
    job = client.post(f"{API}/jobs", json={"model_id": model["id"], "trials": 4}, headers=m)
    assert job.status_code == 201, job.text
    assert client.post(f"{API}/models/{model['id']}/compile", headers=m).status_code == 202
    assert client.get(f"{API}/records", headers=m).json()["total"] == 0

    # the admin does what the member could not
    assert client.post(f"{API}/records/import", content=lines).json()["added"] == 2
    assert client.get(f"{API}/records", headers=m).json()["total"] == 2
    assert client.delete(f"{API}/tokens/{member['id']}").status_code == 204
    assert_error(client.get(f"{API}/me", headers=m), 401, "unauthorized")

    paths = client.get("/openapi.json").json()["paths"]
    for path, method in (
        ("/api/v1/tokens", "get"),
        ("/api/v1/tokens", "post"),
        ("/api/v1/tokens/{token_id}", "delete"),
        ("/api/v1/records/import", "post"),
    ):
        assert "403" in paths[path][method]["responses"], (path, method)
    assert "403" not in paths["/api/v1/me"]["get"]["responses"]


def test_unknown_and_revoked_tokens_get_one_answer_by_one_path(client, monkeypatch):
    laptop = new_token(client, "laptop")
    assert client.delete(f"{API}/tokens/{laptop['id']}").status_code == 204
    unknown = client.get(f"{API}/me", headers=bearer("tf_" + "x" * 43))
    revoked = client.get(f"{API}/me", headers=bearer(laptop["token"]))
    assert unknown.status_code == revoked.status_code == 401 and unknown.json() == revoked.json()

    # the stored hash is compared in constant time once per lookup, whether or not a row matched
    compared = []
    real = accounts.hmac.compare_digest
    monkeypatch.setattr(accounts.hmac, "compare_digest", lambda a, b: compared.append(1) or real(a, b))
    for token in ("tf_" + "x" * 43, laptop["token"], TOKEN):
        before = len(compared)
        client.get(f"{API}/me", headers=bearer(token))
        assert len(compared) - before == 1, token


# ---------------------------------------------------------------------------------------------- event-stream tickets


def test_a_ticket_opens_its_jobs_event_stream(client, settings, model):
    job_id = finished_job(client, settings, model["id"])
    r = client.post(f"{API}/jobs/{job_id}/events/ticket")
    assert r.status_code == 200, r.text
    body = r.json()
    left = (datetime.fromisoformat(body["expires_at"]) - datetime.now(UTC)).total_seconds()
    assert set(body) == {"ticket", "expires_at"} and 50 < left <= 61, body
    assert TOKEN not in body["ticket"] and accounts.hash_token(TOKEN) not in body["ticket"]

    r = stream(client, job_id, ticket=body["ticket"])
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    events = parse_events(r.text)
    assert [e["event"] for e in events] == ["progress", "end"]
    assert json.loads(events[1]["data"]) == {"id": job_id, "state": "succeeded"}
    # the header still works for clients that can send one (tilefarm.remote)
    with client.stream("GET", f"{API}/jobs/{job_id}/events") as r:
        assert r.status_code == 200 and [e["event"] for e in parse_events(r.read().decode())] == ["progress", "end"]


def test_tampered_expired_misdirected_and_revoked_tickets_are_refused(client, settings, model, other_token):
    job_id = finished_job(client, settings, model["id"])
    other_job = finished_job(client, settings, model["id"])
    ticket = ticket_for(client, job_id)

    def refused(**params: str) -> str:
        return assert_error(stream(client, job_id, **params), 401, "unauthorized")

    assert "invalid event-stream ticket" == refused(ticket=ticket[:-1] + ("0" if ticket[-1] != "0" else "1"))
    token_id, _, expires, mac = ticket.split(".")
    assert "invalid" in refused(ticket=f"{token_id}.{job_id}.{int(expires) + 3600}.{mac}")  # a later expiry
    assert "invalid" in assert_error(stream(client, other_job, ticket=ticket), 401, "unauthorized")
    for garbage in ("", "x", "1.2.3", f"99999999999.{job_id}.1.{mac}", f"１.{job_id}.{expires}.{mac}", "1." * 5000):
        assert "invalid" in refused(ticket=garbage), garbage

    with session_scope(settings, write=False) as session:
        row = session.scalars(select(ApiToken).where(ApiToken.name == "bootstrap")).one()
        stale, _ = accounts.issue_ticket(row, job_id, now=time.time() - accounts.TICKET_TTL_S - 1)
    assert "expired" in refused(ticket=stale)

    member = new_token(client, "laptop")
    theirs = ticket_for(client, job_id, member["token"])
    assert stream(client, job_id, ticket=theirs).status_code == 200
    assert client.delete(f"{API}/tokens/{member['id']}").status_code == 204  # revoking a token ends its tickets
    assert refused(ticket=theirs) == "invalid event-stream ticket"

    # another team gets no ticket for this job, and a token in the query opens nothing any more
    r = client.post(f"{API}/jobs/{job_id}/events/ticket", headers=bearer(other_token))
    assert_error(r, 404, "not_found")
    assert "missing credentials" in refused(token=TOKEN)
    assert "missing credentials" in refused()


# ---------------------------------------------------------------------------------------------- access log


class Lines(logging.Handler):
    """The access log lines uvicorn writes, formatted as its own access formatter does."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(uvicorn.logging.AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s'))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def access_log():
    logger = logging.getLogger("uvicorn.access")
    handler, level = Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_access_log_shows_no_token_or_ticket(client, settings, model, access_log):
    """A real uvicorn (in a thread) on the same database, its access log on: a request line keeps its path and
    says a ticket or token was there, never which."""
    job_id = finished_job(client, settings, model["id"])
    ticket = ticket_for(client, job_id)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.started
        with httpx.Client(base_url=f"http://127.0.0.1:{port}{API}") as http:
            assert http.get(f"/jobs/{job_id}/events", params={"ticket": ticket, "after": 0}).status_code == 200
            assert http.get("/me", params={"token": TOKEN}).status_code == 401
            assert http.get(f"/jobs/{job_id}/events", params={"after": 0, "TOKEN": TOKEN}).status_code == 401
    finally:
        server.should_exit = True
        thread.join(30)
    assert len(access_log) == 3, access_log
    for line in access_log:
        assert TOKEN not in line and ticket not in line and ticket.rsplit(".", 1)[1] not in line, line
    assert f"GET /api/v1/jobs/{job_id}/events?ticket=[redacted]&after=0 HTTP/1.1" in access_log[0]
    assert '"GET /api/v1/me?token=[redacted] HTTP/1.1" 401' in access_log[1]
    assert "?after=0&TOKEN=[redacted] " in access_log[2]
