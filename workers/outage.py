"""Outages of the service database and the farm's broker, ridden out: a worker calls again what failed because one
of them did not answer (`patiently`), for up to settings.outage_s, saying once that it waits and once that it is
back, instead of failing the job or dying. What a measure worker could not store is spooled (workers.spool)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis
import sqlalchemy.exc
from kombu.exceptions import OperationalError as KombuOperationalError
from sqlalchemy import Engine, event

from server.database import DatabaseError, SQLDatabase
from server.settings import Settings

log = logging.getLogger("tilefarm.workers")

T = TypeVar("T")
RETRY_S = 1.0  # how often a call that met an outage is tried again

# the database does not answer: refused, reset or shut down (OperationalError), a connection lost mid-call
# (InterfaceError), no pooled connection within the pool's timeout, or SQLDatabase's own "cannot open"
DATABASE_DOWN: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    DatabaseError,
)
# the broker does not answer: redis-py's errors, kombu's after its own retries, sockets refused, reset or timed out
BROKER_DOWN: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    KombuOperationalError,
    ConnectionError,
    TimeoutError,
)
DOWN = DATABASE_DOWN + BROKER_DOWN


IDLE_IN_TRANSACTION_S = 15  # a worker's PostgreSQL session idle this long inside a transaction is ended by the server


def limit_idle_transactions() -> None:
    """Have PostgreSQL end this process's sessions that sit idle inside a transaction for IDLE_IN_TRANSACTION_S: a
    worker frozen mid-transaction (SIGSTOP, a stalled VM) would otherwise hold its row locks for ever, and the API's
    cancel of its job (SELECT ... FOR UPDATE) would wait as long. The workers' transactions are short: none idles
    that long. Every engine this process opens (server.db's, the records database's) gets it."""
    event.listen(Engine, "connect", _limit_idle_transactions)


def _limit_idle_transactions(dbapi_connection, _record) -> None:
    if not type(dbapi_connection).__module__.startswith("psycopg"):
        return  # SQLite: one writer, and a frozen one's lock is the file's, which its busy timeout waits out
    with dbapi_connection.cursor() as cursor:
        cursor.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_S}s'")
    dbapi_connection.commit()


def which(e: BaseException) -> str:
    return "the database" if isinstance(e, DATABASE_DOWN) else "the broker"


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def patiently(
    settings: Settings,
    what: str,
    call: Callable[[], T],
    *,
    stop: Callable[[], bool] = lambda: False,
    on_outage: Callable[[BaseException], None] | None = None,
) -> T:
    """call(), tried again every RETRY_S while the database or the broker does not answer, for up to
    settings.outage_s (then the last error is raised), or until `stop()` says the worker is going away. `on_outage`
    hears of every failed try."""
    began: float | None = None
    while True:
        try:
            value = call()
        except DOWN as e:
            if on_outage is not None:
                on_outage(e)
            now = time.monotonic()
            if began is None:
                began = now
                log.warning(
                    "%s: %s does not answer (%s); trying again every %.0f s", what, which(e), first_line(e), RETRY_S
                )
            if now - began >= settings.outage_s or stop():
                log.error("%s: gave up after %.0f s: %s", what, now - began, first_line(e))
                raise
            time.sleep(RETRY_S)
            continue
        if began is not None:
            log.warning("%s: done after an outage of %.0f s", what, time.monotonic() - began)
        return value


class PatientDatabase(SQLDatabase):
    """The records database of a search: the writes a round makes wait out a database outage (a round's results are
    in memory, and every write is idempotent) rather than fail the job."""

    def __init__(self, url: str, settings: Settings, stop: Callable[[], bool], **kw):
        super().__init__(url, **kw)
        self.settings, self.stop = settings, stop

    def commit(self, record) -> bool:
        return patiently(
            self.settings, "storing a record", lambda: super(PatientDatabase, self).commit(record), stop=self.stop
        )

    def remeasured(self, record) -> bool:
        return patiently(
            self.settings, "adding a timing", lambda: super(PatientDatabase, self).remeasured(record), stop=self.stop
        )
