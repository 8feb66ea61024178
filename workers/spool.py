"""Records a measure worker measured but could not store, because the database did not answer: kept in a file per
batch, storage/spool/<batch id>.json (written whole: a temporary name, fsync, rename), until the database answers
again; then the heartbeat of any worker imports the file and deletes it. Importing is idempotent (the records
table's unique key on workload, host, steps and cache condition), so a file imported twice, or by two workers at
once, stores each record once."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from compiler.costs.records import TuningRecord
from server import storage
from server.catalog import records_db
from server.settings import Settings

log = logging.getLogger("tilefarm.workers")

SPOOL = "spool"


def folder(settings: Settings) -> Path:
    return settings.storage / SPOOL


def keep(
    settings: Settings,
    batch_id: str,
    records: Sequence[TuningRecord],
    *,
    created_by: str | None,
    job_id: int | None,
    seconds: Sequence[tuple[float | None, float | None]],
) -> Path:
    """Spool a batch's records (with their provenance and timings) to be stored later; returns the file."""
    body = {
        "created_by": created_by,
        "job_id": job_id,
        "records": [asdict(r) for r in records],
        "seconds": [list(s) for s in seconds],
    }
    path = folder(settings) / f"{batch_id}.json"
    storage.write_whole(path, json.dumps(body, separators=(",", ":")).encode())
    return path


def pending(settings: Settings) -> list[Path]:
    d = folder(settings)
    return sorted(d.glob("*.json")) if d.is_dir() else []


def flush(settings: Settings) -> int:
    """Store every spooled batch (the database must answer: its errors are raised); returns the records added."""
    added = 0
    for path in pending(settings):
        try:
            body = json.loads(path.read_text())
            records = [TuningRecord.from_json(json.dumps(r)) for r in body["records"]]
            seconds = [(b, r) for b, r in body["seconds"]]
        except FileNotFoundError:
            continue  # another worker stored it meanwhile
        except (ValueError, KeyError, TypeError) as e:
            bad = path.with_suffix(".bad")
            path.replace(bad)  # out of the way, kept for a person to look at
            log.error("spooled batch %s cannot be read (%s): moved to %s", path.name, e, bad)
            continue
        n = records_db(settings.database_url).import_records(
            records, created_by=body.get("created_by"), job_id=body.get("job_id"), seconds=seconds
        )
        path.unlink(missing_ok=True)
        added += n
        log.warning("stored %d spooled records of batch %s (%d new)", len(records), path.stem, n)
    return added
