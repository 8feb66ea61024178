"""schemathesis hooks for tests/test_schema_fuzz.py, loaded by the `schemathesis run` process it starts (the config's
`hooks`); the service's settings come from that process's environment, as the server's do."""

from __future__ import annotations

import atexit
import itertools
import os
from pathlib import Path

import schemathesis
from sqlalchemy import select

from server.accounts import hash_token
from server.db import session_scope
from server.models import ApiToken
from server.settings import Settings

SETTINGS = Settings.from_env()
REVOKE = "DELETE /api/v1/tokens/{token_id}"
CALLS = itertools.count()  # next() is atomic under the GIL: the run's workers are threads


@schemathesis.hook
def after_call(context, case, response) -> None:
    next(CALLS)
    if case.operation.label == REVOKE and response.status_code == 204:
        restore_token()


def restore_token() -> None:
    """DELETE /tokens/{token_id} is fuzzed like every other operation, and its ids are small integers: it revokes the
    very token the run calls with sooner or later. That token is made live again, so the rest of the run stays
    authenticated (what a revoked token gets is tests/test_api.py's to check)."""
    assert SETTINGS.bootstrap_token
    with session_scope(SETTINGS) as session:
        row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(SETTINGS.bootstrap_token)))
        if row is not None:
            row.revoked_at = None


@atexit.register
def _count_calls() -> None:
    """The number of requests the run's cases made, for the test's summary (the checks' own follow-ups not counted)."""
    Path(os.environ["TILEFARM_FUZZ_CALLS_FILE"]).write_text(str(next(CALLS)))
