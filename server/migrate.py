"""Schema migrations: Alembic configured in code, so `tilefarm db upgrade` works from any directory and from an
installed package (the scripts are the `migrations` package next to `server`)."""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).parent
_PG_UPGRADE_LOCK = 0x7469_6C65  # "tile": one advisory lock id, so concurrent upgrades of one database serialize


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def head_revision() -> str | None:
    """The newest schema revision this tilefarm knows."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    """The database's schema revision (None for an empty database)."""
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine) -> str | None:
    """Bring the schema to the newest revision in one transaction; returns it. Safe when several processes upgrade
    the same database at once: the first does the work, the others wait for it and find nothing left to do."""
    with engine.connect() as probe:
        if current_revision(probe) == head_revision():
            return head_revision()
    # SQLite: BEGIN IMMEDIATE takes the write lock before alembic reads the version (server.database's begin hook)
    with engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_UPGRADE_LOCK})
        command.upgrade(alembic_config(conn), "head")
        return current_revision(conn)
