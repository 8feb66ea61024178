"""`tilefarm serve` (the API server and its workers on one machine, or a farm's API node) and `tilefarm demo` (the
whole service end to end on embedded defaults: upload, tune, compile, download, run).

The pieces are public for the tests and benchmarks: `prepare` (schema, team "default", its token file),
`start_workers` / `start_api` (subprocesses in their own process groups), `stop` (SIGTERM, then SIGKILL after a
grace), and `EmbeddedService`, a context manager that runs them all."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tilefarm.remote import Client, RemoteError, job_table, token_file

DEFAULT_TEAM = "default"
STOP_GRACE_S = 10.0
API_STOP_S = 3.0  # Ctrl-C or SIGTERM: how long the API waits for open requests (event streams) before it ends them


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, created with that mode (never briefly world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def prepare(environ: Mapping[str, str] = os.environ) -> tuple[str, bool]:
    """Bring the service database to the newest schema, ensure the team "default", and make sure the token file
    holds a live token of it; returns (token, created). A token file whose token the database does not know (a
    database deleted or replaced) gets a new token. With TILEFARM_BOOTSTRAP_TOKEN set, that token is the one."""
    from server.accounts import create_token, ensure_team, find_token, register_token
    from server.db import engine_for, session_scope
    from server.settings import Settings

    settings = Settings.from_env(environ)
    engine_for(settings.database_url)  # migrates
    path = token_file(environ)
    with session_scope(settings) as session:
        team = ensure_team(session, DEFAULT_TEAM)
        if settings.bootstrap_token:  # idempotent: a revoked bootstrap token stays revoked
            register_token(session, team, "bootstrap", settings.bootstrap_token)
            return settings.bootstrap_token, False
        if path.exists():
            token = path.read_text().strip()
            found = find_token(session, token)
            if found is not None and found[0].id == team.id:
                return token, False
        _, token = create_token(session, team, "serve", role="admin")  # the operator's: it manages the team
    _write_private(path, token)
    return token, True


def _spawn(cmd: list[str], environ: Mapping[str, str], log: Path | None) -> subprocess.Popen:
    """Start `cmd` in a process group of its own (Ctrl-C in the terminal reaches only `serve`, which then stops it
    in order), its output appended to `log` if given."""
    if log is None:
        return subprocess.Popen(cmd, env=dict(environ), start_new_session=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as f:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, env=dict(environ), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


SEARCH_THREADS = 4  # a search worker holds one thread per job it drives: this many jobs tune at once


def worker_specs(n: int, prefix: str) -> list[tuple[str, list[str]]]:
    """(node name, arguments) of the workers a service with `n` measuring processes runs: one search worker (it
    drives the jobs, each in a thread for its whole run, so it must not share a pool with the measurements it waits
    for) and `n` measure workers of this host's class; none at all when `n` is 0."""
    if n <= 0:
        return []
    host = socket.gethostname()
    specs = [(f"{prefix}search@{host}", ["--role", "search", "--concurrency", str(SEARCH_THREADS)])]
    return specs + [(f"{prefix}measure{i}@{host}", ["--role", "measure"]) for i in range(n)]


def start_workers(
    n: int, environ: Mapping[str, str], prefix: str = "serve-", log_dir: Path | None = None, args: Sequence[str] = ()
) -> list[subprocess.Popen]:
    """The worker_specs processes, each `python -m workers.worker` (the same code as a farm's workers)."""
    return [start_worker(spec, environ, log_dir, args) for spec in worker_specs(n, prefix)]


def start_worker(
    spec: tuple[str, list[str]], environ: Mapping[str, str], log_dir: Path | None = None, args: Sequence[str] = ()
) -> subprocess.Popen:
    name, role = spec
    log = log_dir / f"{name.split('@')[0]}.log" if log_dir else None
    return _spawn([sys.executable, "-m", "workers.worker", "--name", name, *role, *args], environ, log)


def start_api(host: str, port: int, environ: Mapping[str, str], log_dir: Path | None = None) -> subprocess.Popen:
    """uvicorn on `server.app:create_app` in a subprocess (the settings come from `environ`)."""
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "server.app:create_app", "--host", host, "--port", str(port)]
    cmd += ["--log-level", "warning", "--no-access-log"]
    return _spawn(cmd, environ, log_dir / "api.log" if log_dir else None)


def signal_groups(procs: Sequence[subprocess.Popen], sig: int) -> None:
    """Send `sig` to the process group of every process still running."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass


def stop(procs: Sequence[subprocess.Popen], grace_s: float = STOP_GRACE_S, sig: int | None = signal.SIGTERM) -> None:
    """Send `sig` to every process group (SIGTERM: Celery's warm shutdown, uvicorn's graceful one; None: sent
    already), SIGKILL what is left after `grace_s`, and reap them all."""
    if sig is not None:
        signal_groups(procs, sig)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the group: anything a worker started dies with it
        except (ProcessLookupError, PermissionError):
            pass
        p.wait()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class EmbeddedService:
    """The API server and worker processes (worker_specs) in subprocesses on a loopback port, for `demo`, tests and
    benchmarks; `with EmbeddedService(env) as svc:` gives `svc.url` and `svc.token` (of the team "default")."""

    def __init__(
        self,
        environ: Mapping[str, str],
        workers: int = 1,
        port: int = 0,
        host: str = "127.0.0.1",
        log_dir: Path | None = None,
        prefix: str = "embedded-",
        worker_args: Sequence[str] = (),
        startup_s: float = 90.0,
    ):
        self.environ, self.n_workers, self.host = dict(environ), workers, host
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.log_dir, self.prefix, self.worker_args, self.startup_s = log_dir, prefix, worker_args, startup_s
        self.token: str | None = None
        self.api: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    def __enter__(self) -> EmbeddedService:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self.token, _ = prepare(self.environ)
        self.workers = start_workers(self.n_workers, self.environ, self.prefix, self.log_dir, self.worker_args)
        self.api = start_api(self.host, self.port, self.environ, self.log_dir)
        self._wait("the API server to answer", self._healthy)
        self._wait_for_workers()

    def add_workers(self, n: int) -> None:
        """Start the workers of a service that began with none (work sent before stays queued until now)."""
        if self.workers:
            raise RuntimeError("this service's workers are running already")
        self.n_workers = n
        self.workers = start_workers(n, self.environ, self.prefix, self.log_dir, self.worker_args)
        self._wait_for_workers()

    def _wait_for_workers(self) -> None:
        if self.workers:
            names = {name for name, _ in worker_specs(self.n_workers, self.prefix)}
            self._wait("the workers to register", lambda: self._alive() >= names)

    def _healthy(self) -> bool:
        try:
            with Client(self.url, timeout=2) as c:
                return c.health().get("status") == "ok"
        except RemoteError:  # not listening yet
            return False

    def _alive(self) -> set[str]:
        with Client(self.url, self.token) as c:
            return {w["name"] for w in c.workers() if w["alive"]}

    def _wait(self, what: str, ready) -> None:
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            dead = [p for p in [self.api, *self.workers] if p is not None and p.poll() is not None]
            if dead:
                who = "the API server" if dead[0] is self.api else "a worker"
                raise RuntimeError(f"{who} (pid {dead[0].pid}) exited with code {dead[0].returncode}{self.logs()}")
            if ready():
                return
            time.sleep(0.25)
        raise RuntimeError(f"timed out after {self.startup_s:.0f} s waiting for {what}" + self.logs())

    def logs(self) -> str:
        if self.log_dir is None:
            return ""
        return "".join(f"\n--- {p.name}:\n{_tail(p)}" for p in sorted(self.log_dir.glob("*.log")))

    def close(self) -> None:
        # the API first (nothing new is queued), then the workers
        stop([self.api] if self.api else [])
        stop(self.workers)
        self.api, self.workers = None, []


# --------------------------------------------------------------------------------------------------- serve


RESTART_DELAYS_S = (1.0, 60.0)  # a dead worker's first restart, and the longest wait as restarts repeat
STEADY_S = 60.0  # a worker up this long restarts after the shortest delay again


def supervise(
    procs: list[subprocess.Popen],
    names: Sequence[str],
    respawn: Callable[[int], subprocess.Popen],
    stopping: threading.Event,
    delays: tuple[float, float] = RESTART_DELAYS_S,
) -> None:
    """Restart a worker that dies under a running server (procs[i] = respawn(i)), after a delay that doubles while it
    keeps dying (up to delays[1]; back to delays[0] once it has run STEADY_S), and say so each time: a killed or
    crashed worker does not leave the farm short, and a worker that cannot start does not spin."""
    delay = [delays[0]] * len(procs)
    since = [time.monotonic()] * len(procs)
    due: dict[int, float] = {}
    while not stopping.wait(0.2):
        now = time.monotonic()
        for i, p in enumerate(procs):
            if stopping.is_set():  # the service stops: its workers exit now, and are not restarted
                return
            if p.poll() is None:
                if now - since[i] >= STEADY_S:
                    delay[i] = delays[0]
                continue
            if i not in due:
                print(f"tilefarm serve: worker {names[i]} (pid {p.pid}) exited with code {p.returncode}; "
                      f"restarting it in {delay[i]:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
                due[i] = now + delay[i]
            elif now >= due[i]:
                del due[i]
                procs[i], since[i] = respawn(i), now
                delay[i] = min(delay[i] * 2, delays[1])
                print(f"tilefarm serve: worker {names[i]} restarted (pid {procs[i].pid})", file=sys.stderr, flush=True)


def _sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through `finally`, which stops the workers


class _QuietStop(logging.Filter):
    """Ctrl-C prints one line: uvicorn's lines about its shutdown (its INFO lines, and the ending of open requests,
    event streams mostly, after API_STOP_S) are left out once it is stopping; any other error is not."""

    def __init__(self, server):
        super().__init__()
        self.server = server

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.server.should_exit:
            return True
        return record.levelno >= logging.ERROR and not str(record.msg).startswith("Cancel %s running task")


INTERRUPT_GRACE_S = 10.0  # after Ctrl-C, a worker still running this long is killed (they stop in about 5 s)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the tilefarm service: the REST API on --host/--port and its worker processes (embedded defaults: SQLite
    and a file-system broker under ~/.local/share/tilefarm; TILEFARM_DATABASE_URL/TILEFARM_BROKER_URL for a farm).
    Ctrl-C stops the API and the workers at once (each hands its work back: workers.worker), says so in one line and
    exits 130; SIGTERM stops them the same way, the workers finishing a compile they began."""
    import uvicorn

    from server.settings import Settings

    signal.signal(signal.SIGTERM, _sigterm)  # uvicorn takes it over while it runs, and raises it again after
    settings = Settings.from_env()
    token, created = prepare()
    db = settings.database_url.split("://")[0]
    broker = "embedded (file system, one machine)" if settings.embedded else settings.broker_url.split("@")[-1]
    print(f"tilefarm serve: database {db}, broker {broker}, storage {settings.storage}", flush=True)
    if settings.bootstrap_token:
        print("team 'default' token: TILEFARM_BOOTSTRAP_TOKEN", flush=True)
    elif created:
        print(f"team 'default' token (written to {token_file()}, mode 0600):\n  {token}", flush=True)
    else:
        print(f"team 'default' token: in {token_file()}", flush=True)
    workers: list[subprocess.Popen] = []
    stopping = threading.Event()
    supervisor: threading.Thread | None = None
    received: list[tuple[int, float]] = []  # the signals that stop the service (and when), each passed to the workers

    def on_exit(sig: int) -> None:
        received.append((sig, time.monotonic()))
        stopping.set()  # before the workers exit: the supervisor restarts none of them
        signal_groups(workers, sig)  # they stop while the API does

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            on_exit(sig)
            super().handle_exit(sig, frame)

    try:
        if not args.no_workers and args.workers > 0:
            prefix = f"serve{args.port}-"
            workers = start_workers(args.workers, os.environ, prefix=prefix, args=["--supervised"])
            specs = worker_specs(args.workers, prefix)
            started = ", ".join(f"{n} (pid {p.pid})" for (n, _), p in zip(specs, workers))
            print(f"started workers: {started}", flush=True)
            names = [n for n, _ in specs]

            def respawn(i: int) -> subprocess.Popen:
                return start_worker(specs[i], os.environ, args=["--supervised"])

            supervisor = threading.Thread(target=supervise, args=(workers, names, respawn, stopping), daemon=True)
            supervisor.start()
        print(f"API on http://{args.host}:{args.port}/api/v1 (OpenAPI: /openapi.json); Ctrl-C stops", flush=True)
        config = uvicorn.Config(
            "server.app:create_app",
            factory=True,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=int(API_STOP_S),
        )
        server = Server(config)
        logging.getLogger("uvicorn.error").addFilter(_QuietStop(server))
        server.run()
        if not server.started and not received:
            return 3  # uvicorn said why (the port taken, say), as uvicorn.run exits
    except KeyboardInterrupt:  # uvicorn raises again the SIGINT it stopped on; or Ctrl-C came before it ran
        if not received:
            on_exit(signal.SIGINT)
    finally:
        # a Ctrl-C while the workers stop (a second one) is passed to them: they leave at once
        signal.signal(signal.SIGINT, lambda signum, frame: signal_groups(workers, signal.SIGINT))
        stopping.set()
        if supervisor is not None:
            supervisor.join()  # no restart after this: every worker it started is in `workers`
        if workers and not received:
            print("stopping the workers", flush=True)
        interrupted = bool(received) and received[0][0] == signal.SIGINT
        grace = min(settings.worker_grace_s, INTERRUPT_GRACE_S) if interrupted else settings.worker_grace_s
        stop(workers, grace_s=grace, sig=None if received else signal.SIGTERM)
        if received:
            what = f"the API and {len(workers)} worker{'s' if len(workers) != 1 else ''}" if workers else "the API"
            said = f"tilefarm serve stopped in {time.monotonic() - received[0][1]:.1f} s ({what})"
            print(f"interrupted: {said}" if interrupted else said, file=sys.stderr, flush=True)
    return 130 if interrupted else 0


# ---------------------------------------------------------------------------------------------------- demo


def _step(text: str) -> float:
    print(f"\n== {text}", flush=True)
    return time.perf_counter()


def cmd_demo(args: argparse.Namespace) -> int:
    """The service's main job on embedded defaults, no server to set up: start the API and a worker, upload an
    example model, tune it, compile it, download the artifact, check and run it, then stop everything."""
    import numpy as np

    from compiler.artifact.runtime import Artifact
    from server.settings import Settings
    from tilefarm import examples

    if args.trials <= 0:
        raise SystemExit("error: --trials must be positive")
    if args.example not in examples.EXAMPLES:
        raise SystemExit(f"error: unknown example {args.example!r}; choose from {', '.join(examples.EXAMPLES)}")
    settings = Settings.from_env()
    log_dir = settings.storage / "logs"
    print(f"tilefarm demo: database {settings.database_url}, storage {settings.storage}, logs {log_dir}")
    with tempfile.TemporaryDirectory(prefix="tilefarm-demo-") as tmp:
        t = _step("starting the API server and a worker")
        with EmbeddedService(os.environ, workers=1, port=args.port, log_dir=log_dir, prefix="demo-") as svc:
            print(f"API on {svc.url}, worker ready ({time.perf_counter() - t:.1f} s)")
            with Client(svc.url, svc.token) as c:
                try:
                    return _demo(c, args, Path(tmp), np, examples, Artifact)
                except RemoteError as e:
                    print(f"error: {e}{svc.logs()}", file=sys.stderr)
                    return 1
                finally:
                    _step("stopping the service")


def _demo(c: Client, args: argparse.Namespace, tmp: Path, np, examples, Artifact) -> int:
    onnx_path = tmp / f"{args.example}.onnx"
    examples.save(args.example, onnx_path)
    t = _step(f"uploading {args.example}")
    m = c.upload(onnx_path)
    tasks = m["tasks"]
    print(f"model {m['id']}: {len(tasks)} tasks, {sum(x['flops'] * x['weight'] for x in tasks) / 1e6:.1f} MFLOP")

    t = _step(f"tuning: {args.trials} trials, {args.per_round} per round")
    job = c.create_job(m["id"], args.trials, per_round=args.per_round)
    shown, state = [-1], [""]

    def show(progress: dict) -> None:
        j = progress["job"]
        if j["state"] != state[0]:
            state[0] = j["state"]
            print(f"[{time.perf_counter() - t:6.1f} s] job {j['id']} {j['state']}", flush=True)
        if j.get("tasks") and j["trials_done"] and j["trials_done"] != shown[0]:
            shown[0] = j["trials_done"]
            print(f"[{time.perf_counter() - t:6.1f} s]\n{job_table(j)}", flush=True)

    job = c.wait_job(job["id"], on_progress=show)
    print(f"job {job['id']} {job['state']} in {time.perf_counter() - t:.1f} s ({job['tuning_s']:.1f} s tuning)")
    if job["state"] != "succeeded":
        print(f"error: the tuning job ended {job['state']}: {job.get('error_message')}", file=sys.stderr)
        return 1

    t = _step("compiling with the tuned records")
    art = c.wait_artifact(c.compile(m["id"])["id"])
    if art["state"] != "ready":
        print(f"error: the compile failed: {art.get('error_message')}", file=sys.stderr)
        return 1
    print(f"artifact {art['id']}: {art['size_bytes']} bytes, {len(art['records_used'])} tasks from records")
    out = Path(args.output) if args.output else tmp / f"{args.example}.tar"
    got = c.download(art["id"], out)
    assert got["sha256"] == art["sha256"]
    print(f"downloaded {out} in {time.perf_counter() - t:.1f} s, sha256 {got['sha256'][:16]}... verified")

    _step("running it")
    artifact = Artifact.load(out)
    rng = np.random.default_rng(0)
    inputs = {i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in artifact.meta["inputs"]}
    outputs = artifact.run(inputs)
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime is not installed: outputs not compared")
    else:
        sess = ort.InferenceSession(str(tmp / f"{args.example}.onnx"), providers=["CPUExecutionProvider"])
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
        for name, a in outputs.items():
            err = float(np.max(np.abs(a - want[name]))) if a.size else 0.0
            ok = np.allclose(a, want[name], rtol=1e-3, atol=1e-4)
            print(f"{name}: max |difference| vs onnxruntime {err:.2e} ({'ok' if ok else 'MISMATCH'})")
            if not ok:
                return 1
    times = []
    for _ in range(args.repeat):
        s = time.perf_counter()
        artifact.run(inputs)
        times.append(time.perf_counter() - s)
    est = job.get("estimated_latency_s")
    print(
        f"median latency {statistics.median(times) * 1e3:.3f} ms over {args.repeat} runs "
        f"(the tuner estimated {est * 1e3:.3f} ms for its kernels)"
        if est is not None
        else f"median latency {statistics.median(times) * 1e3:.3f} ms over {args.repeat} runs"
    )
    return 0


def add_serve_parser(subparsers) -> None:
    """`tilefarm serve` and `tilefarm demo`: adds the parsers; `args.func(args)` runs the command."""
    s = subparsers.add_parser("serve", help=cmd_serve.__doc__)
    s.set_defaults(func=cmd_serve)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--workers",
        type=int,
        default=1,
        help="measure worker processes to start on this machine, next to one search worker (each measures one "
        "program at a time; with more than one, measurements run concurrently here and disturb each other's timings)",
    )
    s.add_argument("--no-workers", action="store_true", help="API only: the farm's workers run elsewhere")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    d = subparsers.add_parser("demo", help=cmd_demo.__doc__)
    d.set_defaults(func=cmd_demo)
    d.add_argument("--example", default="tiny_cnn", help="the example model to tune (tilefarm example's names)")
    d.add_argument("--trials", type=int, default=64, help="measurement budget of the tuning job")
    d.add_argument("--per-round", type=int, default=16, help="programs measured per round")
    d.add_argument("--port", type=int, default=0, help="API port on 127.0.0.1 (0: a free one)")
    d.add_argument("-o", "--output", help="keep the downloaded artifact here")
    d.add_argument("--repeat", type=int, default=20, help="runs timed for the latency")
