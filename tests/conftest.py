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
_faults: list[dict] = []  # what each injected fault did (tests/test_faults.py)


def pytest_configure(config):
    config.addinivalue_line("markers", "faults: faults injected into a live farm (tests/test_faults.py); -m faults")


def pytest_runtest_logreport(report):
    row = dict(report.user_properties).get("corpus")
    if row is not None and report.when == "call":
        _corpus.append(row)
    fault = dict(report.user_properties).get("fault_row")
    if fault is not None and report.when == "call":
        _faults.append(fault)
    ops = dict(report.user_properties).get("onnx_ops")
    outcome = _outcome(report)
    if ops is None or outcome is None:
        return
    _cases[outcome] += 1
    for op in ops:
        _by_op[op][outcome] += 1


def pytest_terminal_summary(terminalreporter):
    write = terminalreporter.write_line
    if _faults:
        terminalreporter.section("faults injected (tests/test_faults.py)")
        write("fault | what the job did | records reported vs stored | API during the fault")
        for r in _faults:
            write(f"{r['fault']} | {r['job']} | {r['records']} | {r['api']}")
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


# ---------------------------------------------------------------------------------------------- private servers
# Redis and PostgreSQL instances of a test's own, on free ports, which fault tests stop, kill and pause (SIGSTOP)
# without touching the shared ones on 6379 and 5432 that other tests use at the same time.


def _wait_until(what: str, ready, seconds: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(0.05)


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` (from /proc), children first."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(entry))
    out, todo = [], list(children[pid])
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children[p])
    return out


class PrivateRedis:
    """A redis-server of its own (no persistence: a restart loses every message, as a crashed cache would)."""

    def __init__(self, root, binary: str):
        from tilefarm.serve import free_port

        self.root, self.binary, self.port = root, binary, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None

    def start(self) -> None:
        import subprocess

        import redis

        assert self.proc is None or self.proc.poll() is not None, "running already"
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115 (the process keeps its own descriptor)
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen([*argv, "--dir", str(self.root)], stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: see {self.root / 'redis.log'}")
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as r:
                    return bool(r.ping())
            except redis.RedisError:
                return False

        _wait_until(f"redis-server on port {self.port}", answers)

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL) and wait; a paused server is let go on first, so it can die."""
        import signal

        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        self.proc.send_signal(signal.SIGCONT)
        self.proc.wait(30)

    def pause(self) -> None:
        import signal

        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        import signal

        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure_up(self) -> None:
        self.resume()
        if not self.running:
            self.start()
        import redis

        with redis.Redis(port=self.port) as r:
            r.flushall()


class PrivatePostgres:
    """A PostgreSQL cluster of its own (initdb + pg_ctl), run as the `postgres` user when we are root (PostgreSQL
    refuses to run as root), in a folder that user owns."""

    def __init__(self, bindir: str):
        import pwd
        import tempfile

        from tilefarm.serve import free_port

        self.bindir, self.port = bindir, free_port()
        self.root = tempfile.mkdtemp(prefix="tilefarm-pg-")  # under /tmp: the pytest tmp folders are root's, 0700
        self.data, self.log = os.path.join(self.root, "data"), os.path.join(self.root, "postgres.log")
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")  # KeyError: no such user (the fixture skips, saying so)
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.server = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}"

    def _run(self, *argv: str, timeout: float = 60) -> None:
        import subprocess

        cmd = [*self.as_user, os.path.join(self.bindir, argv[0]), *argv[1:]]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")

    def init(self) -> None:
        self._run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        # fsync off: the machine never crashes under these tests, only the server is stopped or killed
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} -c fsync=off"
        self._run("pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", "-o", options, "start", timeout=90)

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl stop: "fast" (clients disconnected, a clean shutdown) or "immediate" (as if killed)."""
        self.resume()
        if self.running:
            self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def _pids(self) -> list[int]:
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                pid = int(f.readline())
        except (OSError, ValueError):
            return []
        return [pid, *_descendants(pid)]

    def pause(self) -> None:
        """SIGSTOP the postmaster and every backend: connections stay open and nothing answers."""
        import signal

        for pid in self._pids():
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        import signal

        for pid in self._pids():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    @property
    def running(self) -> bool:
        pids = self._pids()
        return bool(pids) and os.path.exists(f"/proc/{pids[0]}")

    def ensure_up(self) -> None:
        self.resume()
        if not self.running:
            self.start()

    def new_database(self) -> str:
        """A new empty database's SQLAlchemy URL."""
        import psycopg

        name = f"faults_{secrets.token_hex(6)}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return f"{self.server}/{name}"

    def close(self) -> None:
        import shutil

        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _postgres_bindir() -> str | None:
    import glob

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    return os.path.dirname(found[-1]) if found else None


@pytest.fixture(scope="session")
def _private_redis(tmp_path_factory):
    import shutil

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server on PATH: the fault tests need one of their own to stop and pause")
    server = PrivateRedis(tmp_path_factory.mktemp("redis"), binary)
    server.start()
    yield server
    server.stop(kill=True)


@pytest.fixture
def private_redis(_private_redis):
    """A Redis server of this test's own (`url`, `stop(kill=)`, `start()`, `pause()`, `resume()`), empty and up."""
    _private_redis.ensure_up()
    yield _private_redis
    _private_redis.ensure_up()  # whatever the test did to it, the next one finds it up and empty


@pytest.fixture(scope="session")
def _private_postgres():
    bindir = _postgres_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/pg_ctl): the fault tests need their own")
    try:
        server = PrivatePostgres(bindir)
    except KeyError:
        pytest.skip("running as root and there is no `postgres` user to run a private PostgreSQL as")
    try:
        server.init()
        server.start()
    except BaseException:
        server.close()
        raise
    yield server
    server.close()


@pytest.fixture
def private_postgres(_private_postgres):
    """A PostgreSQL cluster of this test's own (`new_database()`, `stop(mode)`, `start()`, `pause()`, `resume()`),
    up."""
    _private_postgres.ensure_up()
    yield _private_postgres
    _private_postgres.ensure_up()
