"""The SQL records database on SQLite and on the real PostgreSQL: the Database protocol, idempotent and concurrent
commits, host isolation, migrations that agree with the models, and the CLI's --database. The `url` and `db`
fixtures (tests/conftest.py) run each case on both."""

from __future__ import annotations

import multiprocessing
from dataclasses import replace

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from compiler.costs.records import COLD_WEIGHTS, FLUSHED, WARM, JSONLinesDatabase, TuningRecord, read_records
from server.database import DatabaseError, SQLDatabase, this_host
from server.migrate import current_revision, head_revision
from server.models import Base
from server.settings import Settings, default_database_url
from tilefarm.cli import main

TARGET = "llvm -mcpu=test"


def rec(key="w1", host="h1", tile=4, costs=(1.0,), error=None, target=TARGET, trace=None) -> TuningRecord:
    return TuningRecord(key, target, host, (("SP", 0, 0, (tile,), True), ("AN", 0, 1, 3)), costs, error, trace=trace)


def test_records_round_trip_exactly(db):
    records = [
        rec(costs=(1.25e-3, 1.5e-3), trace={"sketch": 2, "decisions": [[1, 4], [0]]}),
        rec(tile=8, costs=(), error="timeout"),
        rec(tile=16, costs=(3e-4,), error="wrong_answer", trace=None),
        rec(key="w2", host="h2", costs=(0.1 + 0.2,)),
    ]
    records[1] = replace(records[1], error_message="ran past 10 s", timestamp=1.0 / 3)
    assert all(db.commit(r) for r in records)
    assert list(db) == records and len(db) == 4


def test_commit_is_idempotent(db):
    assert db.commit(rec())
    assert not db.commit(rec(costs=(2.0,)))  # the same schedule for the same workload and host: one record
    assert db.commit(rec(host="h2")) and db.commit(rec(key="w2")) and db.commit(rec(tile=8))
    assert len(db) == 4
    assert db.import_records(list(db)) == 0


def test_a_record_measured_again_keeps_both_measurements(db):
    """Database.remeasured: the stored row takes a second timing (its mean cost, and so best(), follow), or the
    second run's error (then it is no one's best); a record not stored is not added."""
    assert db.commit(rec(costs=(1.0,))) and db.commit(rec(tile=8, costs=(2.0,)))
    assert not db.remeasured(rec(host="h9")) and len(db) == 2
    assert db.remeasured(rec(costs=(4.0,)))
    assert [r.costs for r in db] == [(1.0, 4.0), (2.0,)]
    assert [r.steps[0][3] for r in db.best("w1", TARGET, "h1", k=2)] == [(8,), (4,)]  # 2.0 < mean(1.0, 4.0)
    assert db.remeasured(rec(tile=8, costs=(), error="wrong_answer"))
    [only] = db.best("w1", TARGET, "h1", k=2)
    assert only.costs == (1.0, 4.0) and [r.error for r in db] == [None, "wrong_answer"]


def test_best_is_fastest_first_without_errors(db):
    for tile, costs, error in [(2, (3.0, 3.0), None), (4, (1.0, 2.0), None), (8, (), "run"), (16, (0.5,), "build")]:
        db.commit(rec(tile=tile, costs=costs, error=error))
    db.commit(rec(tile=32, costs=(0.1,), target="llvm -mcpu=other"))
    best = db.best("w1", TARGET, "h1", k=5)
    assert [r.mean_cost for r in best] == [1.5, 3.0] and best[0].steps[0] == ("SP", 0, 0, (4,), True)
    assert db.best("w1", TARGET, "h1") == best[:1]
    assert db.best("nope", TARGET, "h1") == [] and db.best("w1", TARGET, "h9") == []


def test_records_of_takes_only_those_workloads_target_and_host(db, tmp_path):
    from compiler.costs.records import JSONLinesDatabase

    mine = [rec(), rec(tile=8, costs=(), error="run"), rec(key="w2", tile=2)]
    others = [rec(key="w3"), rec(host="h2"), rec(target="llvm -mcpu=other")]
    for r in [mine[0], *others, *mine[1:]]:
        db.commit(r)
    assert list(db.records_of(["w1", "w2"], TARGET, "h1")) == mine  # failed ones too, in commit order
    assert list(db.records_of([], TARGET, "h1")) == []
    jsonl = JSONLinesDatabase(tmp_path / "records.jsonl")
    jsonl.import_records(db)
    assert list(jsonl.records_of({"w1", "w2"}, TARGET, "h1")) == mine


def test_cache_conditions_are_kept_apart(db, tmp_path):
    warm, cold = rec(costs=(1.0,)), replace(rec(costs=(2.0,)), cache=COLD_WEIGHTS)
    assert db.commit(warm) and db.commit(cold)  # the same schedule timed in two conditions: two records
    assert not db.commit(replace(cold, costs=(3.0,)))
    slow_cold = replace(rec(tile=8, costs=(5.0,)), cache=COLD_WEIGHTS)
    flushed = replace(rec(tile=8, costs=(9.0,)), cache=FLUSHED)
    assert db.commit(slow_cold) and db.commit(flushed)
    jsonl = JSONLinesDatabase(tmp_path / "records.jsonl")
    assert jsonl.import_records(db) == 4
    for d in (db, jsonl):
        assert d.best("w1", TARGET, "h1", k=5, cache=COLD_WEIGHTS) == [cold, slow_cold]
        assert d.best("w1", TARGET, "h1", k=5, cache=WARM) == [warm]
        assert d.best("w1", TARGET, "h1", k=5) == [warm, cold, slow_cold, flushed]  # any condition when not asked
        assert list(d.records_of(["w1"], TARGET, "h1", cache=FLUSHED)) == [flushed]
        assert list(d.records_of(["w1"], TARGET, "h1")) == [warm, cold, slow_cold, flushed]
        assert d.export(tmp_path / "best.jsonl", best_only=True) == 3  # the fastest of each condition
        assert {r.cache: r.mean_cost for r in read_records(tmp_path / "best.jsonl")} == {
            WARM: 1.0,
            COLD_WEIGHTS: 2.0,
            FLUSHED: 9.0,
        }


def test_schema_upgrade_and_downgrade_keep_the_records(db):
    from alembic import command

    from server.migrate import alembic_config

    warm, flushed = rec(), replace(rec(tile=8), cache=FLUSHED)
    for r in (warm, flushed, replace(warm, costs=(2.0,), cache=COLD_WEIGHTS)):
        db.commit(r)
    with db.engine.connect() as conn, conn.begin():
        command.downgrade(alembic_config(conn), "0004")  # no cache column: one record per schedule, the first
    with db.engine.connect() as conn, conn.begin():
        command.upgrade(alembic_config(conn), "head")  # records stored without a condition were timed warm
    assert list(db) == [warm, replace(flushed, cache=WARM)]


def test_best_never_crosses_hosts_unless_asked(db):
    here = this_host()
    db.commit(rec(host="elsewhere", tile=2, costs=(0.1,)))  # faster, but measured on another machine class
    assert db.best("w1", TARGET) == []
    db.commit(rec(host=here, tile=4, costs=(1.0,)))
    assert [r.host for r in db.best("w1", TARGET, k=5)] == [here]
    assert [r.host for r in db.best("w1", TARGET, "elsewhere", k=5)] == ["elsewhere"]
    assert [r.host for r in db.best("w1", TARGET, k=5, cross_host=True)] == ["elsewhere", here]
    with pytest.raises(ValueError):
        db.best("w1", TARGET, here, cross_host=True)


def test_iteration_streams_in_batches(db, monkeypatch):
    import server.database

    monkeypatch.setattr(server.database, "BATCH", 3)
    records = [rec(tile=t) for t in range(1, 11)]
    db.import_records(records)
    assert list(db) == records


def _commit_many(url: str, worker: int, start, results) -> None:
    db = SQLDatabase(url, upgrade_schema=False)
    shared = [rec(key="shared", tile=t) for t in range(60)]
    own = [rec(key=f"own{worker}", host=f"h{worker}", tile=t) for t in range(60)]
    start.wait()
    added = [db.commit(r) for pair in zip(shared, own) for r in pair]
    results.put(sum(added))
    db.close()


def test_two_processes_commit_concurrently(db, url):
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_commit_many, args=(url, w, start, results)) for w in (1, 2)]
    for p in procs:
        p.start()
    added = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    everything = list(db)
    assert len(everything) == len(db) == 60 + 60 + 60  # the shared records once, each worker's own all
    assert sum(added) == 180  # each record reported new by exactly one of the two
    assert len({r.identity for r in everything}) == 180


def test_migrations_agree_with_the_models(db):
    with db.engine.connect() as conn:
        assert current_revision(conn) == head_revision()
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == []


def test_postgresql_is_not_migrated_behind_your_back(pg_url):
    # a shared database is upgraded on purpose, never by whoever opens it first
    with pytest.raises(DatabaseError, match="tilefarm db upgrade --database"):
        SQLDatabase(pg_url)
    assert main(["db", "upgrade", "--database", pg_url]) == 0
    with SQLDatabase(pg_url) as db:
        assert len(db) == 0


def test_cli_db_upgrade_then_tune_kernel_and_compile(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'team.db'}"
    assert main(["db", "upgrade", "--database", url]) == 0
    assert f"revision {head_revision()}" in capsys.readouterr().out
    tune = ["tune-kernel", "gemm", "--shape", "16,16,16", "--per-round", "2", "--population", "16", "--threads", "1"]
    assert main([*tune, "--trials", "4", "--database", url]) == 0
    assert "4 trials in" in capsys.readouterr().out
    with SQLDatabase(url) as db:
        records = list(db)
        assert len(records) == 4 and {r.host for r in records} == {this_host()}
        assert db.best(records[0].workload_key, records[0].target)
    assert main([*tune, "--trials", "2", "--resume", "--database", url]) == 0
    assert "resumed 4 records" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # a file or a database, not both
        main([*tune, "--trials", "2", "--database", url, "--records", str(tmp_path / "r.jsonl")])
    model = tmp_path / "m.onnx"
    assert main(["example", "tiny_cnn", "-o", str(model)]) == 0
    assert main(["compile", str(model), "-o", str(tmp_path / "m.tar"), "--database", url]) == 0
    assert "tasks (0 from records)" in capsys.readouterr().out


def test_settings_default_to_a_file_in_the_data_directory():
    assert default_database_url({"XDG_DATA_HOME": "/data"}) == "sqlite:////data/tilefarm/tilefarm.db"
    assert Settings.from_env({"TILEFARM_DATABASE_URL": "postgresql://x/y"}).database_url == "postgresql://x/y"
    assert Settings.from_env({"HOME": "/h"}).database_url.endswith("/.local/share/tilefarm/tilefarm.db")
