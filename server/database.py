"""`SQLDatabase`: the compiler's records `Database` protocol on SQLite or PostgreSQL (SQLAlchemy Core)."""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, Engine, Integer, create_engine, event, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import OperationalError

from compiler.base.errors import TilefarmError
from compiler.costs.measure import UNKNOWN
from compiler.costs.records import VERSION, TuningRecord, merge_measurement, read_record_lines
from compiler.targets import host_target
from compiler.tensor import dag_json
from compiler.tensor.dag import ComputeDAG
from server.migrate import current_revision, head_revision, upgrade
from server.models import Host, Record, TargetRow, Workload
from server.settings import Settings

BATCH = 1000  # records per query when iterating the whole database
_RECORD_IDENTITY = ["workload_id", "host_id", "steps_hash", "cache"]  # the unique key on tuning_records
# what a stored record holds besides the TuningRecord: who measured it, for which job, and how long it took
RECORD_EXTRAS = ("created_by", "job_id", "build_seconds", "run_seconds")
Seconds = tuple[float | None, float | None]  # a measurement's (build, run) seconds, where known
# what a measurement of a stored program sets when it verifies an imported (unverified) record: the farm's timing
# replaces the claimed one
VERIFYING = ("costs", "mean_cost", "error", "error_message", "timestamp", "version", "build_seconds", "run_seconds")
# what a host row says besides its fingerprint; exports carry it, so a merged database knows where timings came from
HOST_DETAILS = (
    *("kind", "cpu_model", "mcpu", "isa_features", "cores", "l1_bytes", "l2_bytes", "l3_bytes", "gpu", "npu"),
    "tilefarm_version",
)


class DatabaseError(TilefarmError):
    """A database that cannot be reached, or whose schema is not the one this tilefarm needs."""


def create_engine_for(url: str) -> Engine:
    """An engine for a SQLAlchemy URL: postgresql:// goes through psycopg 3; a SQLite file gets its folder created,
    WAL journaling (readers never wait for the writer) and real transactions (BEGIN issued by us, see below)."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    if u.get_backend_name() != "sqlite":
        # a server that does not answer fails a connection in 10 s (libpq waits for ever), so a worker waits it out
        # in steps (workers.outage) and /health answers 503
        timeout = {} if "connect_timeout" in u.query else {"connect_timeout": 10}
        return create_engine(u, pool_pre_ping=True, connect_args=timeout)
    if u.database and u.database != ":memory:":
        Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(u, connect_args={"timeout": 60})  # seconds a writer waits for another's lock
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _sqlite_connect(dbapi_connection, _record) -> None:
    # the sqlite3 module's own transaction handling skips BEGIN before SELECT and DDL; switch it off and BEGIN in
    # _sqlite_begin instead (SQLAlchemy's documented recipe), so migrations and reads are transactional too
    dbapi_connection.isolation_level = None
    cur = dbapi_connection.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


def _sqlite_begin(conn: Connection) -> None:
    # writers BEGIN IMMEDIATE: the write lock is taken (or waited for) up front, never upgraded from a read lock
    # mid-transaction, which in WAL mode fails at once instead of waiting
    conn.exec_driver_sql(f"BEGIN {conn.get_execution_options().get('sqlite_begin', 'DEFERRED')}")


def steps_json(steps: tuple) -> str:
    """The stored form of a step list: compact JSON, as TuningRecord.identity has it."""
    return json.dumps(steps, separators=(",", ":"))


def steps_hash(steps: str) -> str:
    """The unique key's digest of a step list in its stored form (steps_json)."""
    return hashlib.sha256(steps.encode()).hexdigest()


def _measurement(record: TuningRecord) -> dict[str, Any]:
    """The columns a record's measurement fills; mean_cost is NULL exactly for a failed one (best() relies on it)."""
    return {
        "costs": [float(c) for c in record.costs],
        "mean_cost": record.mean_cost if record.ok else None,
        "error": record.error,
        "error_message": record.error_message,
    }


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v  # JSON lists back to the tuples records hold


def _known_host_details(details: dict[str, Any]) -> dict[str, Any]:
    """The host columns an import file names, with values that fit the column (another team's file is input)."""

    def fits(column, v) -> bool:
        if isinstance(column.type, Integer):
            return isinstance(v, int) and not isinstance(v, bool)
        return isinstance(v, str) and (column.type.length is None or len(v) <= column.type.length)

    return {k: v for k, v in details.items() if k in HOST_DETAILS and fits(Host.__table__.c[k], v)}


def this_host() -> str:
    return host_target().fingerprint()


def trusted_by(team_id: int | None) -> ColumnElement[bool]:
    """The records team `team_id` may take schedules from: the verified ones and its own unverified imports (the
    verified ones alone for None: the command line)."""
    if team_id is None:
        return Record.verified.is_(True)
    return or_(Record.verified.is_(True), Record.imported_by == team_id)


class SQLDatabase:
    """Tuning records in a SQL database: SQLite (one file, the default) or PostgreSQL (a team's shared one).

    Commits are idempotent and safe from many processes at once. `best` answers for this machine's host
    fingerprint unless told otherwise: a timing measured on another machine class is not comparable.
    On open, the schema is upgraded to the newest revision (`upgrade_schema=None` does that for SQLite files; a
    shared PostgreSQL database is upgraded explicitly with `tilefarm db upgrade`, and opening an old one raises).

    Trust (docs/records.md#verification-and-trust): a record imported through the service is stored unverified until
    a farm worker of its host class has measured its schedule. What chooses or seeds schedules (`best`, `records_of`,
    iterating, `export`) reads the verified records and the unverified ones team `team_id` imported (none when
    `team_id` is None: the command line); what measures (`commit`, `import_records`, `remeasured`) stores verified
    records, and a measurement of an unverified record's program verifies it with the measured timing."""

    def __init__(
        self,
        url: str | None = None,
        *,
        upgrade_schema: bool | None = None,
        created_by: str | None = None,
        job_id: int | None = None,
        team_id: int | None = None,
    ):
        self.url = url or Settings.from_env().database_url
        self.engine = create_engine_for(self.url)
        self.created_by = created_by  # who measured what `commit` stores, e.g. "job/12"
        self.job_id = job_id  # the service's tuning job that measured it
        self.team_id = team_id  # the team whose unverified imports this reader trusts
        self._ids: dict[tuple[str, str], int] = {}  # (table, natural key) -> id of rows known to be committed
        if upgrade_schema is None:
            upgrade_schema = self.engine.dialect.name == "sqlite"
        try:
            if upgrade_schema:
                upgrade(self.engine)
            else:
                self._check_schema()
        except OperationalError as e:
            self.close()
            raise DatabaseError(f"cannot open the database {self}: {e.orig}") from None

    def __str__(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    @property
    def identity(self) -> str:
        """Which database this is, for caches of what was learnt from it: the URL without password, and a SQLite
        file by its absolute path."""
        u = self.engine.url
        if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
            u = u.set(database=str(Path(u.database).expanduser().resolve()))
        return u.render_as_string(hide_password=True)

    def _check_schema(self) -> None:
        with self.engine.connect() as conn:
            have = current_revision(conn)
        if have != head_revision():
            self.close()
            raise DatabaseError(
                f"the database {self} has schema revision {have or 'none (empty)'}, this tilefarm needs "
                f"{head_revision()}: run `tilefarm db upgrade --database {self}`"
            )

    def trusting(self, team_id: int | None) -> SQLDatabase:
        """This database as team `team_id` reads it (its own unverified imports trusted too), on the same engine:
        close the database itself, not the view."""
        view = copy.copy(self)
        view.team_id = team_id
        return view

    def _trusted(self) -> ColumnElement[bool]:
        return trusted_by(self.team_id)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> SQLDatabase:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ writing

    def _insert(self, model):
        return (postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert)(model)

    def _id(self, conn: Connection, model, column: str, value: str, new: dict, **details: Any) -> int:
        """The id of the row whose unique `column` is `value`, inserted (with `details`) if missing; race-safe:
        a concurrent insert of the same row makes ours a no-op, and the select then finds theirs."""
        cache_key = (model.__tablename__, value)
        if cache_key in self._ids:
            return self._ids[cache_key]
        conn.execute(self._insert(model).values({column: value, **details}).on_conflict_do_nothing())
        new[cache_key] = conn.execute(select(model.id).where(getattr(model, column) == value)).scalar_one()
        return new[cache_key]

    def _host_details(self, fingerprint: str) -> dict[str, Any]:
        """What is known about a host: everything for this machine, only the fingerprint for others."""
        if fingerprint != this_host():
            return {}
        t = host_target()
        return {
            "kind": t.kind,
            "cpu_model": t.cpu_model,
            "mcpu": t.mcpu,
            "isa_features": t.features,
            "cores": t.cores,
            "l1_bytes": t.l1_bytes,
            "l2_bytes": t.l2_bytes,
            "l3_bytes": t.l3_bytes,
            "tilefarm_version": VERSION,
        }

    def _insert_record(
        self, conn: Connection, record: TuningRecord, new: dict, host: dict[str, Any] | None, extra: dict[str, Any]
    ) -> bool:
        steps = steps_json(record.steps)
        host = _known_host_details(host or {}) or self._host_details(record.host)
        row = {
            "workload_id": self._id(conn, Workload, "key", record.workload_key, new),
            "target_id": self._id(conn, TargetRow, "name", record.target, new),
            "host_id": self._id(conn, Host, "fingerprint", record.host, new, **host),
            "steps": steps,
            "steps_hash": steps_hash(steps),
            **_measurement(record),
            "timestamp": record.timestamp,
            "version": record.version,
            "trace": record.trace,
            "cache": record.cache,
            **{column: extra.get(column) for column in RECORD_EXTRAS},
            "verified": extra.get("imported_by") is None,
            "imported_by": extra.get("imported_by"),
        }
        stmt = self._insert(Record).values(row)
        if not extra.get("imported") and record.error != UNKNOWN:
            # a measurement (not an import) of a program stored unverified verifies it with this timing; a verified
            # record is left as it is, and so is any record an import meets (an import never changes one)
            stmt = stmt.on_conflict_do_update(
                index_elements=_RECORD_IDENTITY,
                set_={**{c: stmt.excluded[c] for c in VERIFYING}, "verified": True},
                where=Record.verified.is_(False),
            )
        else:
            stmt = stmt.on_conflict_do_nothing(index_elements=_RECORD_IDENTITY)
        return conn.execute(stmt.returning(Record.id)).first() is not None  # no row back: it was there

    def _write(self, items: Iterable[tuple[TuningRecord, dict[str, Any] | None, dict[str, Any]]]) -> int:
        """Commit (record, host details, RECORD_EXTRAS columns) items, BATCH to a transaction; returns how many were
        new."""
        added, items = 0, iter(items)
        while chunk := list(itertools.islice(items, BATCH)):
            new: dict[tuple[str, str], int] = {}
            with self.engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
                added += sum(self._insert_record(conn, r, new, host, extra) for r, host, extra in chunk)
            self._ids.update(new)  # only now: a rolled-back insert must not leave a cached id behind
        return added

    def commit(self, record: TuningRecord) -> bool:
        """Store a record; False if one with the same workload, host, steps and cache condition is already stored."""
        return self._write([(record, None, {"created_by": self.created_by, "job_id": self.job_id})]) == 1

    def remeasured(self, record: TuningRecord) -> bool:
        """The stored record with this one's identity takes its measurement too (costs.records.merge_measurement;
        a new best confirmed by a second timing); False if none is stored. The row is read and written in one
        transaction holding its lock, so two measurements of one program never lose each other's timings."""
        q = (
            self._select()
            .where(
                Workload.key == record.workload_key,
                Host.fingerprint == record.host,
                Record.steps_hash == steps_hash(steps_json(record.steps)),
                Record.cache == record.cache,
            )
            .add_columns(Record.verified)
            .with_for_update(of=Record)
        )
        with self.engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
            row = conn.execute(q).first()
            if row is None:
                return False
            stored, verified = self._record(row[:-1]), row[-1]
            if verified:
                merged = merge_measurement(stored, record)
                conn.execute(update(Record).where(Record.id == row[0]).values(_measurement(merged)))
            elif record.error != UNKNOWN:  # an imported record's claimed timing is replaced, not averaged with ours
                self._verify(conn, row[0], record)
        return True

    def import_records(
        self,
        records: Iterable[TuningRecord],
        created_by: str | None = None,
        job_id: int | None = None,
        seconds: Iterable[tuple[float | None, float | None]] | None = None,
    ) -> int:
        """Commit many, measured by `created_by` for the job `job_id` (default: this database's), with each one's
        (build, run) `seconds` where known; returns how many were new (importing the same records twice adds
        nothing, and a record stored before keeps its provenance)."""
        provenance = {
            "created_by": created_by if created_by is not None else self.created_by,
            "job_id": job_id if job_id is not None else self.job_id,
        }
        if seconds is None:
            return self._write((r, None, provenance) for r in records)
        return self._write(
            (r, None, {**provenance, "build_seconds": b, "run_seconds": s})
            for r, (b, s) in zip(records, seconds, strict=True)
        )

    def import_file(self, path: str | Path, imported_by: int | None = None) -> int:
        """Commit the records of a JSON-lines file (an `export`, or a `tune --records` file) with the provenance
        they carry; returns how many were new: importing a file twice adds nothing, and importing another team's
        export keeps every distinct record (the same schedule of a workload measured on the same host class is one
        record: the one stored first, whether verified or not: an import never changes a stored record).

        `imported_by`: the team that imports through the service; its records are stored unverified, trusted by
        that team alone until the farm has measured them (`unverified`, `verify`). None (`tilefarm records import
        --database`, a file of the user's own into a database the user holds): stored verified."""

        def items():
            for record, line in read_record_lines(path):
                provenance = json.loads(line).get("provenance")
                provenance = provenance if isinstance(provenance, dict) else {}
                host = provenance.get("host")
                extra = {"created_by": provenance.get("created_by"), "imported_by": imported_by, "imported": True}
                yield record, host if isinstance(host, dict) else None, extra

        return self._write(items())

    # ------------------------------------------------------------------------------------------ verification

    def unverified(self, host: str, limit: int, after: int = 0) -> list[tuple[int, TuningRecord, str, str | None]]:
        """Up to `limit` unverified records of host class `host` above id `after`, in id order, whose workload's DAG
        is stored (the others cannot be measured yet): (id, record, the DAG as dag_json, the op tag)."""
        q = (
            self._select()
            .add_columns(Workload.dag_json, Workload.op_tag)
            .where(
                Host.fingerprint == host, Record.verified.is_(False), Record.id > after, Workload.dag_json.is_not(None)
            )
        )
        with self.engine.connect() as conn:
            rows = conn.execute(q.order_by(Record.id).limit(limit)).all()
        return [(r[0], self._record(r[:-2]), r[-2], r[-1]) for r in rows]

    def unverified_hosts(self) -> set[str]:
        """The host classes that have unverified records a worker of theirs could measure (their DAG is stored)."""
        q = (
            select(Host.fingerprint)
            .join(Record, Record.host_id == Host.id)
            .join(Workload, Workload.id == Record.workload_id)
            .where(Record.verified.is_(False), Workload.dag_json.is_not(None))
            .distinct()
        )
        with self.engine.connect() as conn:
            return set(conn.execute(q).scalars())

    def verify(self, record_id: int, measured: TuningRecord, seconds: Seconds = (None, None)) -> bool:
        """An unverified record measured by a farm worker of its host class: its costs become the measured ones (or
        it becomes a failed record) and it is verified; False if it is not stored or verified already."""
        with self.engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
            return self._verify(conn, record_id, measured, seconds)

    @staticmethod
    def _verify(conn: Connection, record_id: int, measured: TuningRecord, seconds: Seconds = (None, None)) -> bool:
        values = {
            **_measurement(measured),
            "timestamp": measured.timestamp,
            "version": measured.version,
            "verified": True,
        }
        if seconds != (None, None):
            values["build_seconds"], values["run_seconds"] = seconds
        stmt = update(Record).where(Record.id == record_id, Record.verified.is_(False)).values(values)
        return conn.execute(stmt).rowcount == 1

    def describe_workloads(self, tasks: Iterable) -> None:
        """Fill in what a workload is (canonical DAG text, op tag, FLOPs, shapes) from tensor.tasks.Task objects."""
        rows = [
            {
                "key": t.key,
                "dag_text": t.dag.canonical_text,
                "dag_json": dag_json.to_json(t.dag),
                "op_tag": t.name,
                "flops": t.dag.flop_count,
                "shapes": {
                    "inputs": [list(t.dag.op(n).shape) for n in t.dag.inputs],
                    "outputs": [list(t.dag.op(n).shape) for n in t.dag.outputs],
                },
            }
            for t in tasks
        ]
        if not rows:
            return
        stmt = self._insert(Workload).values(rows)
        cols = ("dag_text", "dag_json", "op_tag", "flops", "shapes")
        stmt = stmt.on_conflict_do_update(index_elements=["key"], set_={c: stmt.excluded[c] for c in cols})
        with self.engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
            conn.execute(stmt)

    # ------------------------------------------------------------------------------------------ reading

    def _select(self):
        return (
            select(
                Record.id,
                Workload.key,
                TargetRow.name,
                Host.fingerprint,
                Record.steps,
                Record.costs,
                Record.error,
                Record.error_message,
                Record.timestamp,
                Record.version,
                Record.trace,
                Record.cache,
            )
            .join(Workload, Record.workload_id == Workload.id)
            .join(TargetRow, Record.target_id == TargetRow.id)
            .join(Host, Record.host_id == Host.id)
        )

    @staticmethod
    def _record(row) -> TuningRecord:
        _, key, target, host, steps, costs, error, message, timestamp, version, trace, cache = row
        steps = _tuples(json.loads(steps))
        return TuningRecord(key, target, host, steps, tuple(costs), error, message, timestamp, version, trace, cache)

    def best(
        self,
        workload_key: str,
        target: str,
        host: str | None = None,
        k: int = 1,
        *,
        cache: str | None = None,
        cross_host: bool = False,
    ) -> list[TuningRecord]:
        """The k fastest error-free records this reader trusts for a workload on a target, measured on `host`
        (default: this machine; records of any host only with cross_host=True) in cache condition `cache` (any, when
        None)."""
        if host is not None and cross_host:
            raise ValueError("best(): give a host or cross_host=True, not both")
        if host is None and not cross_host:
            host = this_host()
        # mean_cost is NULL exactly for records that failed or measured nothing
        q = self._select().where(
            Workload.key == workload_key, TargetRow.name == target, Record.mean_cost.is_not(None), self._trusted()
        )
        if host is not None:
            q = q.where(Host.fingerprint == host)
        if cache is not None:
            q = q.where(Record.cache == cache)
        with self.engine.connect() as conn:
            return [self._record(r) for r in conn.execute(q.order_by(Record.mean_cost, Record.id).limit(k))]

    def __iter__(self) -> Iterator[TuningRecord]:
        """Every record this reader trusts, in commit order, read in batches (each its own short query, so no
        long-held cursor)."""
        return (record for _, record in self._batches(self._trusted()))

    def records_of(
        self, workload_keys: Iterable[str], target: str, host: str, cache: str | None = None
    ) -> Iterator[TuningRecord]:
        """Every record this reader trusts of these workloads for `target` measured on `host` (in cache condition
        `cache`, when given), in commit order (one indexed query per batch of ids: a team database holds every other
        model's records too)."""
        keys, last = sorted(set(workload_keys)), 0
        while keys:
            q = self._select().where(
                Workload.key.in_(keys),
                TargetRow.name == target,
                Host.fingerprint == host,
                Record.id > last,
                self._trusted(),
            )
            if cache is not None:
                q = q.where(Record.cache == cache)
            with self.engine.connect() as conn:
                rows = conn.execute(q.order_by(Record.id).limit(BATCH)).all()
            yield from (self._record(r) for r in rows)
            if len(rows) < BATCH:
                return
            last = rows[-1][0]

    def training_records(self, host: str | None = None, after: int = 0) -> Iterator[tuple[int, TuningRecord]]:
        """(id, record) in commit order of the verified records measured on `host` (every host when None) whose id
        is above `after`: a reader that keeps the last id it saw reads only what arrived since
        (compiler.search.transfer). Verified ones only, whoever reads: a pre-trained model is cached per database,
        for every team (an imported record verified later joins it at its next fit from scratch)."""
        return self._batches(Record.verified.is_(True), None if host is None else Host.fingerprint == host, after=after)

    def _batches(self, *where: ColumnElement[bool] | None, after: int = 0) -> Iterator[tuple[int, TuningRecord]]:
        last = after
        while True:
            q = self._select().where(Record.id > last, *(w for w in where if w is not None))
            with self.engine.connect() as conn:
                rows = conn.execute(q.order_by(Record.id).limit(BATCH)).all()
            yield from ((r[0], self._record(r)) for r in rows)
            if len(rows) < BATCH:
                return
            last = rows[-1][0]

    def count_records(self, host: str | None = None, after: int = 0) -> int:
        """How many records `training_records(host, after)` would yield."""
        q = select(func.count()).select_from(Record).where(Record.id > after, Record.verified.is_(True))
        if host is not None:
            q = q.join(Host, Record.host_id == Host.id).where(Host.fingerprint == host)
        with self.engine.connect() as conn:
            return conn.execute(q).scalar_one()

    def workload_dags(self) -> dict[str, ComputeDAG]:
        """Every workload whose DAG is stored (`describe_workloads`) and reads back as its key, by key. A DAG
        written by a tilefarm with other DAG rules does not rebuild as its key and is left out."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(Workload.key, Workload.dag_json)).all()
        dags = {}
        for key, text in rows:
            if text is None:  # a workload known only by its key (records imported before its model was seen)
                continue
            try:
                dags[key] = dag_json.from_json(text, key)
            except dag_json.DAGFormatError:
                continue
        return dags

    def __len__(self) -> int:
        with self.engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(Record)).scalar_one()

    def export(self, path: str | Path, best_only: bool = False) -> int:
        """Write every record this reader trusts (or only the fastest per workload, target, host and cache
        condition), in commit order, to a JSON-lines file that `import_file` takes back. Each line is a TuningRecord
        (a `--records` file reads it too) plus its provenance: who ran it and, on the first line of each host, that
        host's details where known (CPU model, ISA features, cores, caches, tilefarm version). Returns how many were
        written."""
        hosts = self._hosts()
        q = self._select().add_columns(Record.created_by).where(self._trusted())
        if best_only:
            rank = func.row_number().over(
                partition_by=(Record.workload_id, Record.target_id, Record.host_id, Record.cache),
                order_by=(Record.mean_cost, Record.id),
            )
            best = (
                select(Record.id, rank.label("rank")).where(Record.mean_cost.is_not(None), self._trusted()).subquery()
            )
            q = q.join(best, best.c.id == Record.id).where(best.c.rank == 1)
        n = 0
        # one streamed query, not batches: the best-only ranking would be recomputed for every batch
        with Path(path).open("w") as f, self.engine.connect() as conn:
            for row in conn.execution_options(yield_per=BATCH).execute(q.order_by(Record.id)):
                record, created_by = self._record(row[:-1]), row[-1]
                provenance = {"host": hosts.pop(record.host, None), "created_by": created_by}
                line = {**asdict(record), "provenance": {k: v for k, v in provenance.items() if v}}
                f.write(json.dumps(line, separators=(",", ":")) + "\n")
                n += 1
        return n

    def _hosts(self) -> dict[str, dict[str, Any]]:
        """Every host's known details (its columns that are not NULL), by fingerprint."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(Host.fingerprint, *(getattr(Host, c) for c in HOST_DETAILS))).all()
        return {fp: {c: v for c, v in zip(HOST_DETAILS, details) if v is not None} for fp, *details in rows}
