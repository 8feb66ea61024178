"""Service settings, read from the environment (`TILEFARM_*`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


def default_database_url(environ: Mapping[str, str] = os.environ) -> str:
    """A SQLite file under the user's data directory: $XDG_DATA_HOME/tilefarm, else ~/.local/share/tilefarm."""
    data_home = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return f"sqlite:///{Path(data_home) / 'tilefarm' / 'tilefarm.db'}"


@dataclass(frozen=True)
class Settings:
    database_url: str  # SQLAlchemy URL: sqlite:///path (the default) or postgresql+psycopg://user@host/db

    @staticmethod
    def from_env(environ: Mapping[str, str] = os.environ) -> Settings:
        return Settings(database_url=environ.get("TILEFARM_DATABASE_URL") or default_database_url(environ))
