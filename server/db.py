"""Sessions on the service database for the API and the workers: one engine per URL and process, the schema
brought to the newest revision on first use (SQLite, and PostgreSQL too: the service owns its schema)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from server.database import create_engine_for
from server.migrate import upgrade
from server.settings import Settings


@functools.cache
def engine_for(url: str) -> Engine:
    engine = create_engine_for(url)
    upgrade(engine)
    return engine


@functools.cache
def _sessionmaker(url: str) -> sessionmaker[Session]:
    return sessionmaker(engine_for(url), expire_on_commit=False)


@contextmanager
def session_scope(settings: Settings, write: bool = True) -> Iterator[Session]:
    """A short transaction: committed when the block ends, rolled back if it raises. On SQLite a writing one takes
    the write lock up front (BEGIN IMMEDIATE, waiting for it), since WAL mode cannot upgrade a read lock later."""
    bind = engine_for(settings.database_url)
    if write and bind.dialect.name == "sqlite":
        bind = bind.execution_options(sqlite_begin="IMMEDIATE")
    with _sessionmaker(settings.database_url)(bind=bind) as session, session.begin():
        yield session
