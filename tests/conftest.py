"""Shared fixtures and the per-op report of the ONNX conformance suite.

Databases: `url` is an empty records database, once on SQLite and once on the real PostgreSQL at 127.0.0.1:5432
(skipped loudly when none is reachable, failed when .ci/run said it is up); `new_url()` makes more of the same kind.

Conformance: each conformance test (tests/test_conformance.py) records its ONNX op types with `record_property`;
user_properties travel with the report from xdist workers to the controller, so the table printed after the run is
built from reports, never from worker state."""

from __future__ import annotations

import collections
import itertools
import os
import secrets
import warnings

import pytest

PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"


@pytest.fixture(autouse=True)
def _cache_home(tmp_path_factory, monkeypatch):
    """Pre-trained cost models (search.transfer) are cached under $XDG_CACHE_HOME: the tests' go to their temporary
    directory, never to the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))


@pytest.fixture(scope="session")
def pg_database():
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    import psycopg

    try:
        admin = psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True)
    except psycopg.OperationalError as e:
        reason = f"NO POSTGRESQL at {PG_SERVER} ({e}); .ci/run starts one: the PostgreSQL cases did not run"
        if os.environ.get("TILEFARM_REQUIRE_POSTGRESQL"):  # set by .ci/run, which made sure it is up
            pytest.fail(reason)
        warnings.warn(reason, stacklevel=1)  # in the warnings summary, where -q still shows it
        pytest.skip(reason)
    name = f"tilefarm_test_{secrets.token_hex(6)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()


def service_environ(root) -> dict[str, str]:
    """This process's environment for an embedded service under `root`: no TILEFARM_ setting of the caller's leaks
    in, and its data and caches stay in `root`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILEFARM_")}
    env.update(XDG_DATA_HOME=str(root / "data"), XDG_CACHE_HOME=str(root / "cache"))
    return env


@pytest.fixture(scope="module")
def tiny_cnn(tmp_path_factory) -> bytes:
    """The tiny_cnn example model's ONNX bytes."""
    from tilefarm import examples

    path = tmp_path_factory.mktemp("models") / "tiny_cnn.onnx"
    examples.save("tiny_cnn", path)
    return path.read_bytes()


def fresh_schema(database: str) -> str:
    """The URL of a new, empty schema (search_path) in a PostgreSQL database."""
    import psycopg

    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(database.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{database}?options=-csearch_path%3D{schema}"


@pytest.fixture
def pg_url(pg_database):
    """An empty schema in the session's PostgreSQL database (for cases only PostgreSQL has)."""
    return fresh_schema(pg_database)


@pytest.fixture(params=["sqlite", "postgresql"])
def new_url(request, tmp_path):
    """Makes empty databases: each call a new SQLite file, or a new schema in the session's PostgreSQL database."""
    n = itertools.count()
    if request.param == "sqlite":
        return lambda: f"sqlite:///{tmp_path / f'records{next(n)}.db'}"
    database = request.getfixturevalue("pg_database")
    return lambda: fresh_schema(database)


@pytest.fixture
def url(new_url):
    return new_url()


@pytest.fixture
def db(url):
    from server.database import SQLDatabase

    with SQLDatabase(url, upgrade_schema=True) as d:
        yield d


OUTCOMES = ("passed", "failed", "skipped")
_by_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
_cases: collections.Counter = collections.Counter()


def _outcome(report) -> str | None:
    """The test's outcome from the one report that decides it (a setup skip or error, else the call)."""
    if report.when == "call" or (report.when == "setup" and not report.passed):
        return "failed" if report.failed else report.outcome
    return None


_corpus: list[dict] = []  # the real-model corpus' rows (tests/test_corpus.py)


def pytest_runtest_logreport(report):
    row = dict(report.user_properties).get("corpus")
    if row is not None and report.when == "call":
        _corpus.append(row)
    ops = dict(report.user_properties).get("onnx_ops")
    outcome = _outcome(report)
    if ops is None or outcome is None:
        return
    _cases[outcome] += 1
    for op in ops:
        _by_op[op][outcome] += 1


def pytest_terminal_summary(terminalreporter):
    write = terminalreporter.write_line
    if _corpus:
        terminalreporter.section("real-model corpus (tests/corpus.py)")
        for r in sorted(_corpus, key=lambda r: r["model"]):
            write(f"{r['model']:<22} {r['converter']:<22} opset {r['opset']:>2}  {r['ops']:>3} op types  {r['result']}")
    if not _cases:
        return
    terminalreporter.section("ONNX conformance per op (a case counts once for each op type in its graph)")
    width = max(len(op) for op in _by_op)
    write(f"{'op':<{width}}  " + "  ".join(f"{o:>7}" for o in OUTCOMES))
    for op in sorted(_by_op):
        write(f"{op:<{width}}  " + "  ".join(f"{_by_op[op][o]:>7}" for o in OUTCOMES))
    write(f"{'cases':<{width}}  " + "  ".join(f"{_cases[o]:>7}" for o in OUTCOMES))
