"""Service settings, read from the environment (`TILEFARM_*`): one class, shared by the API, the workers and the
migrations. With nothing set, everything lives under the user's data directory (SQLite, a file-system broker):
the embedded default. A PostgreSQL `TILEFARM_DATABASE_URL` and `TILEFARM_BROKER_URL=redis://...` make the team farm."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

PLACEHOLDER_SECRETS = {"changeme", "change-me", "secret", "token", "password", "tilefarm", ""}


def data_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """$XDG_DATA_HOME/tilefarm, else ~/.local/share/tilefarm."""
    data_home = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "tilefarm"


def default_database_url(environ: Mapping[str, str] = os.environ) -> str:
    """A SQLite file under the user's data directory."""
    return f"sqlite:///{data_dir(environ) / 'tilefarm.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TILEFARM_", frozen=True, extra="ignore")

    # SQLAlchemy URL: sqlite:///path (the default) or postgresql+psycopg://user@host/db
    database_url: str = ""
    # Celery broker: redis://host:6379/0 for a farm; empty = the embedded file-system broker under storage_dir
    broker_url: str = ""
    # where uploaded models and compiled artifacts are kept; the API and every worker must see the same folder
    storage_dir: Path | None = None
    max_upload_bytes: int = 256 << 20
    # what checking one uploaded model may make the API process allocate (catalog.model_budget; the loader's Budget;
    # the workers load it under the same one, so their tasks are the API's): the most bytes one value may take,
    # constant folding may make in all, and the most nodes. Tighter than the compiler's own defaults (4 GiB, 1 GiB,
    # 1,000,000): the API serves every team, and an upload of a few bytes can ask for gigabytes. A model past them is
    # refused with 422 (code over_budget) naming the setting to raise.
    max_model_value_bytes: int = Field(default=1 << 30, gt=0)
    max_model_fold_bytes: int = Field(default=256 << 20, gt=0)
    max_model_nodes: int = Field(default=200_000, gt=0)
    # a team's share of the farm: the most trials one job may ask for, and the most jobs it may have queued or running
    # at once (a create or resume past it answers 429 too_many_jobs); docs/operations.md lists every limit
    max_job_trials: int = Field(default=100_000, gt=0)
    max_active_jobs: int = Field(default=8, gt=0)
    # the evolutionary search's population per round of a job (compiler.search.evolution.SearchParams: 512, as in
    # MetaSchedule); the test farms set it small, as they test the farm's machinery rather than the search's quality
    search_population: int = Field(default=512, ge=64)
    # a worker heartbeats every heartbeat_s; one silent for worker_grace_s is lost (its batch is sent again)
    heartbeat_s: float = 5.0
    worker_grace_s: float = 30.0
    # Redis redelivers an unacknowledged message after this long: above the longest measurement batch
    visibility_timeout_s: int = 4 * 3600
    # how many times a measurement batch is sent before its candidates are recorded as failed
    batch_tries: int = 3
    # development or production; production refuses placeholder secrets
    environment: str = "development"
    # a token created for the team "default" when the server starts (none: `tilefarm serve` makes one and prints it)
    bootstrap_token: str | None = None
    # faults (docs/service.md#faults): a running job's search renews its lease (jobs.lease_until) while it makes
    # progress; a job whose lease ran out has no live owner and is queued again, at most job_requeues times in a row,
    # then failed saying why. A worker waits up to outage_s for a database or broker that does not answer.
    job_lease_s: float = 300.0
    job_requeues: int = 3
    outage_s: float = 900.0

    @field_validator("environment")
    @classmethod
    def _known_environment(cls, v: str) -> str:
        if v not in ("development", "production"):
            raise ValueError("TILEFARM_ENVIRONMENT must be development or production")
        return v

    @model_validator(mode="after")
    def _no_placeholder_secrets(self) -> Settings:
        if self.environment == "production" and self.bootstrap_token is not None:
            if self.bootstrap_token.lower() in PLACEHOLDER_SECRETS or len(self.bootstrap_token) < 24:
                raise ValueError(
                    "TILEFARM_BOOTSTRAP_TOKEN is a placeholder or shorter than 24 characters; in production set a "
                    "random one (python -c 'import secrets; print(secrets.token_urlsafe(32))')"
                )
        return self

    @staticmethod
    def from_env(environ: Mapping[str, str] = os.environ) -> Settings:
        """Settings from `environ` (not only os.environ: tests and subprocesses pass their own)."""
        prefix = "TILEFARM_"
        values = {k[len(prefix) :].lower(): v for k, v in environ.items() if k.startswith(prefix) and v != ""}
        known = {k: v for k, v in values.items() if k in Settings.model_fields}
        s = Settings.model_construct(**_Given.model_validate(known).model_dump())  # validated from `environ` alone
        updates: dict = {}
        if not s.database_url:
            updates["database_url"] = default_database_url(environ)
        if s.storage_dir is None:
            updates["storage_dir"] = data_dir(environ) / "storage"
        return s.model_copy(update=updates) if updates else s

    @property
    def embedded(self) -> bool:
        """No broker configured: the file-system broker, for one machine."""
        return not self.broker_url

    @property
    def storage(self) -> Path:
        assert self.storage_dir is not None  # from_env fills it
        return Path(self.storage_dir).expanduser()


class _Given(Settings):
    """Settings validated from the values given, with no environment or dotenv source behind them."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)
