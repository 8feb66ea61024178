"""Alembic environment: the URL comes from the caller's connection (server.migrate), else alembic.ini's
sqlalchemy.url, else the server's settings (TILEFARM_DATABASE_URL)."""

from alembic import context

from server.models import Base
from server.settings import Settings


def run_migrations(connection) -> None:
    # SQLite cannot ALTER most things: batch mode rebuilds the table instead
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    config = context.config
    connection = config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    from server.database import create_engine_for

    url = config.get_main_option("sqlalchemy.url") or Settings.from_env().database_url
    engine = create_engine_for(url)
    try:
        with engine.connect() as connection:
            run_migrations(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("tilefarm's migrations run against a database, not offline (--sql)")
main()
