"""Faults injected into a live farm, and survived with nothing lost (issue 48; docs/service.md#faults).

One farm for the module: uvicorn, a search worker and a measure worker as `tilefarm serve` runs them (serve's own
supervisor restarts a dead worker), on a PostgreSQL and a Redis of the tests' own (tests/conftest.py: PrivatePostgres,
PrivateRedis), which the tests stop, restart and pause without touching the shared servers. Each test tunes a model
of its own (a distinct workload, so its records are its own), injects one fault while a measurement batch is being
measured, and checks that the job ends (succeeded, or failed or cancelled saying why), that the records the job
reports as measured are the rows stored for it, each once, that nothing is left spooled or half-written, and that
the API answered every request of a prober that asked all along (503 from /health while the broker or the database
is down; never a hang). A table of what happened is printed at the end of the run (conftest.py).

Lease, cancel and resume rules are also tested on their own, without a farm, at the end."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from tests.test_farm import _wait as wait

httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.faults

TERMINAL = ("succeeded", "failed", "cancelled")
WORKER_ARGS = ("--loglevel", "info")  # the logs are printed when a test fails
TRIALS = 8  # one round of 8 (a warm-up round: random programs, no evolutionary search), its confirmation, a re-timing
SETTINGS = {
    "heartbeat_s": "0.5",
    "worker_grace_s": "4",
    "visibility_timeout_s": "6",  # Redis gives an unacknowledged message back after 6 s: the pause test outlasts it
    "outage_s": "300",
}


def dense_model(path: Path, n: int) -> Path:
    """y = relu(x @ w), x 4x64, w 64xn: one small task, a workload of its own for each n."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(n).standard_normal((64, n)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, n])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Relu", ["xw"], ["y"])]
    graph = helper.make_graph(nodes, "dense", [x], [y], [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


class Farm:
    """The API (uvicorn) and serve's workers (worker_specs: one search, one measure) under serve's supervisor."""

    def __init__(self, root: Path, database_url: str, broker_url: str):
        from tilefarm.serve import free_port, worker_specs

        self.root, self.logs, self.storage = root, root / "logs", root / "storage"
        self.database_url = database_url
        self.token = secrets.token_urlsafe(32)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TILEFARM_")}
        self.env.update(
            TILEFARM_DATABASE_URL=database_url,
            TILEFARM_BROKER_URL=broker_url,
            TILEFARM_STORAGE_DIR=str(self.storage),
            TILEFARM_BOOTSTRAP_TOKEN=self.token,
            TILEFARM_NUM_THREADS="1",
            XDG_CACHE_HOME=str(root / "cache"),
            PYTHONUNBUFFERED="1",
            **{f"TILEFARM_{k.upper()}": v for k, v in SETTINGS.items()},
        )
        self.port = free_port()
        self.specs = worker_specs(1, "faults-")
        self.names = [n for n, _ in self.specs]
        self.workers: list[subprocess.Popen] = []
        self.api: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.supervisor: threading.Thread | None = None
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}/api/v1",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )

    def start(self) -> None:
        from tilefarm.serve import start_worker, supervise

        self.start_api()
        self.workers = [start_worker(s, self.env, self.logs, WORKER_ARGS) for s in self.specs]
        respawn = lambda i: start_worker(self.specs[i], self.env, self.logs, WORKER_ARGS)
        args = (self.workers, self.names, respawn, self.stopping, (0.5, 2.0))
        self.supervisor = threading.Thread(target=supervise, args=args, daemon=True)
        self.supervisor.start()
        self.ready()

    def start_api(self) -> None:
        from tilefarm.serve import start_api

        self.api = start_api("127.0.0.1", self.port, self.env, self.logs)

    def ready(self) -> None:
        wait("the API", lambda: self.health() == 200, 90)
        wait("every worker alive", self.all_alive, 120)

    def health(self) -> int | None:
        try:
            return self.client.get("/health").status_code
        except httpx.HTTPError:
            return None

    def all_alive(self) -> bool:
        r = self.client.get("/workers")
        return r.status_code == 200 and {w["name"] for w in r.json() if w["alive"]} >= set(self.names)

    def worker(self, role: str) -> subprocess.Popen:
        return self.workers[next(i for i, n in enumerate(self.names) if n.startswith(f"faults-{role}"))]

    def ok(self, method: str, path: str, status: int = 200, **kw) -> dict:
        r = self.client.request(method, path, **kw)
        assert r.status_code == status, r.text
        return r.json()

    def tune(self, n: int, trials: int = TRIALS) -> int:
        """Upload model `n` and start a job on it; returns the job id."""
        with open(dense_model(self.root / f"dense{n}.onnx", n), "rb") as f:
            model = self.ok("POST", "/models", 201, files={"file": (f"dense{n}.onnx", f)})
        return self.ok("POST", "/jobs", 201, json={"model_id": model["id"], "trials": trials, "per_round": 8})["id"]

    def job(self, job_id: int) -> dict:
        return self.ok("GET", f"/jobs/{job_id}")

    def measuring(self, job_id: int, timeout: float = 120) -> dict:
        """Wait until a worker is measuring one of the job's batches; returns the batch."""

        def running():
            batches = self.ok("GET", f"/jobs/{job_id}/batches")["batches"]
            return next((b for b in batches if b["state"] == "running" and b["size"] >= 4), None)

        return wait(f"job {job_id} measuring a batch", running, timeout, every=0.1)

    def finished(self, job_id: int, timeout: float = 240) -> dict:
        def ended():
            try:
                job = self.job(job_id)
            except (httpx.HTTPError, AssertionError):  # a 503 while a service comes back
                return None
            return job if job["state"] in TERMINAL else None

        return wait(f"job {job_id} to end", ended, timeout, every=0.5)

    def stored(self, job_id: int) -> tuple[int, int]:
        """(rows stored for the job, rows sharing a workload, host and step list with another), from the database."""
        from sqlalchemy import func, select

        from server.db import engine_for
        from server.models import Record

        with engine_for(self.database_url).connect() as conn:
            rows = conn.execute(select(func.count()).where(Record.job_id == job_id)).scalar_one()
            twice = conn.execute(
                select(Record.workload_id, Record.host_id, Record.steps, func.count())
                .group_by(Record.workload_id, Record.host_id, Record.steps)
                .having(func.count() > 1)
            ).all()
        return rows, len(twice)

    def close(self) -> None:
        from tilefarm.serve import stop

        self.stopping.set()
        if self.supervisor is not None:
            self.supervisor.join()
        stop([self.api] if self.api else [], grace_s=5)
        stop(self.workers, grace_s=5)
        self.client.close()

    def print_logs(self) -> None:
        for f in sorted(self.logs.glob("*.log")):  # pytest shows them when a test fails
            print(f"----- {f.name}\n{f.read_text(errors='replace')[-8000:]}")


class Prober:
    """Asks the API for /health and the job every 0.5 s from a thread while a fault lasts, each request with a
    timeout of 20 s: what it answered and how long the slowest took."""

    def __init__(self, farm: Farm, job_id: int | None):
        self.farm, self.job_id = farm, job_id
        self.answers: dict[str, Counter] = {"health": Counter(), "job": Counter()}
        self.slowest = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Prober:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        with httpx.Client(base_url=str(self.farm.client.base_url), headers=self.farm.client.headers, timeout=20) as c:
            while True:
                paths = {"health": "/health", "job": f"/jobs/{self.job_id}" if self.job_id else "/jobs"}
                for name, path in paths.items():
                    t = time.monotonic()
                    try:
                        answer: int | str = c.get(path).status_code
                    except httpx.TimeoutException:
                        answer = "timeout"
                    except httpx.TransportError:
                        answer = "refused"  # the API process is down
                    self.answers[name][answer] += 1
                    self.slowest = max(self.slowest, time.monotonic() - t)
                if self.stop.wait(0.5):
                    return

    def says(self) -> str:
        parts = []
        for name, counts in self.answers.items():
            parts.append(f"{name} " + ", ".join(f"{k}x{n}" for k, n in sorted(counts.items(), key=str)))
        return "; ".join(parts) + f"; slowest {self.slowest:.1f} s"

    def check(self, allowed: set) -> None:
        assert "timeout" not in self.answers["health"] and "timeout" not in self.answers["job"], self.says()
        seen = set(self.answers["health"]) | set(self.answers["job"])
        assert seen <= allowed, self.says()


@pytest.fixture(scope="module")
def farm(tmp_path_factory, _private_postgres, _private_redis):
    _private_postgres.ensure_up()
    _private_redis.ensure_up()
    f = Farm(tmp_path_factory.mktemp("faults"), _private_postgres.new_database(), _private_redis.url)
    try:
        f.start()
        yield f
    finally:
        f.close()
        f.print_logs()


@pytest.fixture
def live(farm, private_postgres, private_redis):
    """The farm, with every server up and every worker alive before the test (a fault test leaves them so)."""
    farm.ready()
    return farm


def settle(farm: Farm, job_id: int, fault: str, did: str, prober: Prober, record_property) -> dict:
    """Wait for the job to end and check what every fault test checks; report the fault's row of the table."""
    job = farm.finished(job_id)
    if job["state"] != "succeeded":
        assert job["error_message"], job  # failed or cancelled: it says why
    reported = job["trials_done"]
    rows, twice = farm.stored(job_id)
    assert twice == 0, "a program stored twice"
    assert reported == rows, (reported, rows, job)
    assert sum(t["trials"] for t in job["tasks"]) == rows  # its task table too (the workload is this test's alone)
    assert not list((farm.storage / "spool").glob("*.json")), "records still spooled"
    assert not list((farm.storage / "artifacts").glob(".*.partial")) if (farm.storage / "artifacts").is_dir() else True
    row = {
        "fault": fault,
        "job": f"{job['state']} (attempt {job['attempt']}{', ' + job['error_message'] if job['error_message'] else ''})"
        + f"; {did}",
        "records": f"{reported} reported / {rows} stored, 0 twice",
        "api": prober.says(),
    }
    record_property("fault_row", row)
    print(row)
    print("created", job["created_at"], "started", job["started_at"], "finished", job["finished_at"])
    for b in farm.ok("GET", f"/jobs/{job_id}/batches")["batches"]:
        print(
            " ",
            b["size"],
            b["state"],
            b["sent_at"][11:22],
            (b["started_at"] or "")[11:22],
            (b["finished_at"] or "")[11:22],
        )
    return job


# ---------------------------------------------------------------------------------------------- processes killed


def test_kill_measure_worker_mid_batch(live, record_property):
    job_id = live.tune(64)
    with Prober(live, job_id) as prober:
        batch = live.measuring(job_id)
        victim = live.worker("measure")
        os.killpg(victim.pid, signal.SIGKILL)
        wait("serve to restart the measure worker", lambda: live.worker("measure") is not victim, 30)
        job = settle(live, job_id, "kill -9 measure worker mid-batch", "its batch sent again", prober, record_property)
    assert job["state"] == "succeeded"
    batches = live.ok("GET", f"/jobs/{job_id}/batches")["batches"]
    assert next(b for b in batches if b["id"] == batch["id"])["state"] == "lost"
    prober.check({200})


def test_kill_search_worker_mid_job(live, record_property):
    job_id = live.tune(65)
    with Prober(live, job_id) as prober:
        live.measuring(job_id)
        victim = live.worker("search")
        os.killpg(victim.pid, signal.SIGKILL)
        wait("serve to restart the search worker", lambda: live.worker("search") is not victim, 30)
        job = settle(live, job_id, "kill -9 search worker mid-job", "resumed as a new attempt", prober, record_property)
    assert job["state"] == "succeeded" and job["attempt"] >= 2
    prober.check({200})


def test_kill_api_mid_job(live, record_property):
    job_id = live.tune(66)
    with Prober(live, job_id) as prober:
        live.measuring(job_id)
        assert live.api is not None
        os.killpg(live.api.pid, signal.SIGKILL)
        live.api.wait()
        time.sleep(3)  # the workers go on without it
        live.start_api()
        wait("the API back", lambda: live.health() == 200, 60)
        job = settle(live, job_id, "kill -9 API mid-job (restarted 3 s later)", "went on", prober, record_property)
    assert job["state"] == "succeeded" and job["attempt"] == 1
    prober.check({200, "refused"})


def test_stuck_search_worker_cancel_and_resume(live, record_property):
    """The search worker frozen (SIGSTOP) mid-job: cancel ends the job at once, naming why, and resume queues it
    again; once the worker thaws, its old search finds the job moved on and stops, and the new attempt finishes."""
    job_id = live.tune(67)
    with Prober(live, job_id) as prober:
        live.measuring(job_id)
        victim = live.worker("search")
        os.killpg(victim.pid, signal.SIGSTOP)
        try:
            time.sleep(5)  # past TILEFARM_WORKER_GRACE_S: its heartbeat stopped
            cancelled = live.ok("POST", f"/jobs/{job_id}/cancel")
            assert cancelled["state"] == "cancelled", cancelled
            assert "stopped answering" in cancelled["error_message"], cancelled
            resumed = live.ok("POST", f"/jobs/{job_id}/resume")
            assert resumed["state"] == "queued" and resumed["attempt"] == 2, resumed
        finally:
            os.killpg(victim.pid, signal.SIGCONT)
        job = settle(
            live,
            job_id,
            "search worker frozen (SIGSTOP), cancel + resume",
            "cancel ended it at once; resumed",
            prober,
            record_property,
        )
    assert job["state"] == "succeeded" and job["attempt"] == 2
    prober.check({200})


# ---------------------------------------------------------------------------------------------- broker


def test_redis_stopped_and_restarted_mid_job(live, private_redis, record_property):
    job_id = live.tune(68)
    pids = [p.pid for p in live.workers]
    with Prober(live, job_id) as prober:
        live.measuring(job_id)
        private_redis.stop()  # no persistence: every queued message and result is gone with it
        time.sleep(6)
        assert live.health() == 503
        private_redis.start()
        job = settle(
            live, job_id, "Redis stopped 6 s mid-batch, restarted empty", "rode it out", prober, record_property
        )
    assert job["state"] == "succeeded" and job["attempt"] == 1
    assert [p.pid for p in live.workers] == pids, "a worker died (and serve restarted it)"
    prober.check({200, 503})


def test_redis_paused_past_the_visibility_timeout(live, private_redis, record_property):
    job_id = live.tune(69)
    pids = [p.pid for p in live.workers]
    with Prober(live, job_id) as prober:
        live.measuring(job_id)
        private_redis.pause()  # SIGSTOP: connections stay open, nothing answers
        time.sleep(8)  # past TILEFARM_VISIBILITY_TIMEOUT_S=6: unacknowledged messages are given back after it
        assert live.health() == 503
        private_redis.resume()
        job = settle(
            live, job_id, "Redis paused (SIGSTOP) 8 s > visibility timeout 6 s", "rode it out", prober, record_property
        )
    assert job["state"] == "succeeded" and job["attempt"] == 1
    assert [p.pid for p in live.workers] == pids, "a worker died (and serve restarted it)"
    # a message held past the visibility timeout came back, and its duplicate changed nothing: the job's own message
    # (held for the whole job) found the job taken
    assert "'stale'" in (live.logs / "faults-search.log").read_text()
    prober.check({200, 503})


# ---------------------------------------------------------------------------------------------- database


def test_postgresql_stopped_and_restarted_mid_job(live, private_postgres, record_property):
    job_id = live.tune(70)
    pids = [p.pid for p in live.workers]
    with Prober(live, job_id) as prober:
        live.measuring(job_id)
        private_postgres.stop()
        time.sleep(11)  # the reviewer's outage
        assert live.health() == 503
        private_postgres.start()
        job = settle(
            live, job_id, "PostgreSQL stopped 11 s mid-batch, restarted", "rode it out", prober, record_property
        )
    assert job["state"] == "succeeded" and job["attempt"] == 1
    assert [p.pid for p in live.workers] == pids, "a worker died (and serve restarted it)"
    prober.check({200, 503})


# ---------------------------------------------------------------------------------------------- full disk


def _mount_tmpfs(folder: Path, size: str) -> bool:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    return done.returncode == 0


def _fill(folder: Path, farm: Farm) -> tuple[str, Path]:
    """Make `folder` full: a 1 MiB tmpfs mounted there and filled to its last 4 KiB (we are root in CI), else (no
    mount allowed) the next artifacts' temporary files made links to /dev/full, where every write fails with ENOSPC
    from the kernel. Returns how, and the file that frees the space when deleted."""
    if _mount_tmpfs(folder, "1m"):
        filler = folder / "filler"
        with filler.open("wb") as out:
            out.write(b"\0" * max(0, shutil.disk_usage(folder).free - 4096))
        return "a 1 MiB tmpfs, filled", filler
    ids = [a["id"] for a in farm.ok("GET", "/artifacts")]
    links = [folder / f".{i}.tar.partial" for i in range(max(ids, default=0) + 1, max(ids, default=0) + 4)]
    for link in links:
        link.symlink_to("/dev/full")
    filler = folder / "filler"
    filler.write_text("\n".join(map(str, links)))
    return "no tmpfs mount allowed here: the temporary files linked to /dev/full (ENOSPC)", filler


def test_full_disk_in_the_artifact_store(live, record_property):
    """The artifact store's file system full (a 1 MiB tmpfs, filled): the build fails saying so, nothing
    half-written is left or served; with space again the same compile succeeds."""
    with open(dense_model(live.root / "dense71.onnx", 71), "rb") as f:
        model = live.ok("POST", "/models", 201, files={"file": ("dense71.onnx", f)})
    folder = live.storage / "artifacts"
    folder.mkdir(parents=True, exist_ok=True)
    how, filler = _fill(folder, live)
    try:
        with Prober(live, None) as prober:
            art = live.ok("POST", f"/models/{model['id']}/compile", 202, json={})
            art = wait(
                "the build",
                lambda: (a := live.ok("GET", f"/artifacts/{art['id']}"))["state"] in ("ready", "failed") and a,
                120,
            )
        assert art["state"] == "failed", art
        assert "no space left in the storage folder" in art["error_message"], art
        assert not (folder / f"{art['id']}.tar").exists() and not (folder / f".{art['id']}.tar.partial").exists()
        r = live.client.get(f"/artifacts/{art['id']}/download")
        assert r.status_code == 409 and "no space left" in r.json()["detail"], r.text
        for link in filler.read_text().split() if how.startswith("no tmpfs") else []:
            Path(link).unlink(missing_ok=True)
        filler.unlink()
        again = live.ok("POST", f"/models/{model['id']}/compile", 202, json={})
        again = wait(
            "the build",
            lambda: (a := live.ok("GET", f"/artifacts/{again['id']}"))["state"] in ("ready", "failed") and a,
            120,
        )
        assert again["state"] == "ready", again
        r = live.client.get(f"/artifacts/{again['id']}/download")
        assert r.status_code == 200 and r.headers["X-Checksum-SHA256"] == again["sha256"]
        assert live.ok("GET", f"/models/{model['id']}")["id"] == model["id"]  # nothing else lost
    finally:
        if how.startswith("a 1 MiB tmpfs"):
            subprocess.run(["umount", "-l", str(folder)], check=False)
    row = {
        "fault": f"artifact store full ({how})",
        "job": f"compile failed: {art['error_message'][:60]}...; with space again: ready",
        "records": "no tuning job (none lost: the database untouched)",
        "api": prober.says() + f"; download of the failed one 409, nothing half-written in {folder.name}/",
    }
    record_property("fault_row", row)
    print(row)
    prober.check({200})


# ---------------------------------------------------------------------------------------------- rules, no farm


@pytest.fixture
def jobs_db(tmp_path):
    """A service database (SQLite) with a team, a model and a live search worker "w@x"; the embedded broker."""
    from server.db import session_scope
    from server.models import Team, UploadedModel, WorkerRow
    from server.settings import Settings
    from workers import progress

    settings = Settings.from_env(
        {
            "TILEFARM_DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}",
            "TILEFARM_STORAGE_DIR": str(tmp_path / "storage"),
            "TILEFARM_JOB_LEASE_S": "60",
            "TILEFARM_JOB_REQUEUES": "2",
        }
    )
    with session_scope(settings) as s:
        team = Team(name="t")
        s.add(team)
        s.flush()
        model = UploadedModel(team_id=team.id, sha256="0" * 64, name="m", size_bytes=1, path="m.onnx")
        s.add(model)
        s.flush()
        s.add(
            WorkerRow(name="w@x", kind="search", queues=["search"], measurements_done=0, last_heartbeat=progress.now())
        )
        team_id, model_id = team.id, model.id

    def running_job(lease_s: float) -> int:
        from server.models import Job

        with session_scope(settings) as s:
            job = Job(
                team_id=team_id,
                model_id=model_id,
                state="running",
                target="llvm",
                host="h",
                queue="q",
                trials=8,
                attempt=1,
                worker="w@x",
                lease_until=progress.now() + timedelta(seconds=lease_s),
                updated_at=progress.now(),
            )
            s.add(job)
            s.flush()
            return job.id

    return settings, team_id, running_job


def _row(settings, job_id: int):
    from server.db import session_scope
    from server.models import Job

    with session_scope(settings, write=False) as s:
        return s.get_one(Job, job_id)


def test_a_lease_that_ran_out_requeues_then_fails_saying_why(jobs_db):
    from server.db import session_scope
    from server.models import Job
    from workers import progress

    settings, _, running_job = jobs_db
    job_id = running_job(-1)  # its search stopped renewing a second ago, though its worker still heartbeats
    fresh = running_job(60)
    assert progress.reap_lost_jobs(settings) == [(job_id, 2)]
    job = _row(settings, job_id)
    assert job.state == "queued" and job.lease_until is None
    assert job.error_message.startswith("queued again (1 of 2) after its search was lost: its lease ran out at")
    assert _row(settings, fresh).state == "running"  # a live lease is left alone
    for _ in range(2):  # claimed again and lost again: the note counts; past TILEFARM_JOB_REQUEUES it fails
        with session_scope(settings) as s:
            row = s.get_one(Job, job_id)
            row.state, row.worker, row.lease_until = "running", "w@x", progress.now() - timedelta(seconds=1)
        progress.reap_lost_jobs(settings)
    job = _row(settings, job_id)
    assert job.state == "failed" and job.finished_at is not None
    assert job.error_message.startswith("its search was lost 3 times in a row (last: its lease ran out"), job


def test_check_in_renews_the_lease_and_says_stale(jobs_db):
    from workers import progress

    settings, _, running_job = jobs_db
    job_id = running_job(1)
    before = _row(settings, job_id).lease_until
    assert progress.check_in(settings, job_id, 1) is None
    assert _row(settings, job_id).lease_until > before
    assert progress.check_in(settings, job_id, 2) == "stale"  # another attempt owns it


def test_cancel_ends_a_job_whose_search_was_lost_and_resume_takes_it(jobs_db):
    from server import jobs

    settings, team_id, running_job = jobs_db
    live_one, lost_one = running_job(60), running_job(-1)
    assert jobs.cancel_job(settings, team_id, live_one).state == "running"  # its search ends it after its round
    out = jobs.cancel_job(settings, team_id, lost_one)
    assert out.state == "cancelled" and out.error_message.startswith("cancelled while its lease ran out"), out
    with pytest.raises(Exception, match="only a failed or cancelled job, or a running one whose search was lost"):
        jobs.resume_job(settings, team_id, live_one)
    stuck = running_job(-1)
    resumed = jobs.resume_job(settings, team_id, stuck)  # no need to cancel first
    assert resumed.state == "queued" and resumed.attempt == 2, resumed


def test_a_queued_job_nobody_took_within_a_lease_is_sent_again(jobs_db):
    from server.db import session_scope
    from server.models import Job
    from workers import progress

    settings, _, running_job = jobs_db
    job_id = running_job(60)
    with session_scope(settings) as s:
        row = s.get_one(Job, job_id)
        row.state, row.worker, row.lease_until = "queued", None, None
        row.updated_at = progress.now() - timedelta(seconds=61)  # its message may have gone with the broker
    assert progress.reap_lost_jobs(settings) == [(job_id, 1)]  # the same attempt: a duplicate finds it taken
    assert progress.reap_lost_jobs(settings) == []  # once a lease


def test_a_full_disk_keeps_nothing_half_written(tmp_path):
    """Writes to a full storage folder (a 64 KiB tmpfs): an upload stream and a whole-file write fail with
    StorageFull (507 storage_full from the API), leaving no file behind; with room, a whole file appears at once."""
    import asyncio

    from server import storage
    from server.settings import Settings

    folder = tmp_path / "storage"
    folder.mkdir()
    if not _mount_tmpfs(folder, "64k"):
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        settings = Settings.from_env({"TILEFARM_STORAGE_DIR": str(folder)})

        async def chunks():
            for _ in range(32):
                yield b"x" * 8192

        with pytest.raises(storage.StorageFull, match="no space left in the storage folder") as e:
            asyncio.run(storage.save_stream(settings, chunks(), 1 << 20))
        assert e.value.status_code == 507 and list((folder / storage.TMP).iterdir()) == []
        with pytest.raises(storage.StorageFull):
            storage.write_whole(folder / "big.bin", b"x" * (256 << 10))
        storage.write_whole(folder / "small.bin", b"whole")
        assert sorted(p.name for p in folder.iterdir()) == ["small.bin", storage.TMP]
        assert (folder / "small.bin").read_bytes() == b"whole"
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


# ---------------------------------------------------------------------------------------------- builds, no farm


@pytest.fixture
def builds_db(jobs_db):
    """jobs_db, with a measure worker "m@x" silent past the grace, and a function making a building artifact."""
    from sqlalchemy import select

    from server.db import session_scope
    from server.models import ArtifactRow, UploadedModel, WorkerRow
    from workers import progress

    settings, team_id, _ = jobs_db
    with session_scope(settings) as s:
        model_id = s.scalars(select(UploadedModel)).one().id
        silent = progress.now() - timedelta(seconds=settings.worker_grace_s + 1)
        s.add(WorkerRow(name="m@x", kind="cpu", queues=["measure.cpu.h"], measurements_done=0, last_heartbeat=silent))

    def building(worker: str | None) -> int:
        with session_scope(settings) as s:
            a = ArtifactRow(team_id=team_id, model_id=model_id, state="building", target="llvm", host="h")
            a.worker = worker
            s.add(a)
            s.flush()
            return a.id

    return settings, building


def _artifact(settings, artifact_id: int):
    from server.db import session_scope
    from server.models import ArtifactRow

    with session_scope(settings, write=False) as s:
        return s.get_one(ArtifactRow, artifact_id)


def test_a_lost_build_is_queued_again_then_failed_saying_why(builds_db):
    """An artifact building on a worker that stopped answering is queued again (its message sent to the host class's
    measure queue), at most TILEFARM_JOB_REQUEUES times in a row, then failed saying why; one whose worker is alive
    is left building."""
    from workers import progress

    settings, building = builds_db
    lost, live = building("m@x"), building("w@x")
    assert progress.reap_lost_builds(settings) == [(lost, "measure.cpu.h")]
    a = _artifact(settings, lost)
    assert a.state == "queued" and a.worker is None
    assert a.error_message == "queued again (1 of 2) after its build was lost: its worker m@x stopped answering"
    assert _artifact(settings, live).state == "building"
    for try_number in (2, 3):  # taken by a worker that dies too (n@x never heartbeats): counted, then failed
        job = progress.artifact_building(settings, lost, "n@x")
        assert job is not None and job.try_number == try_number
        progress.reap_lost_builds(settings)
    a = _artifact(settings, lost)
    assert a.state == "failed" and a.finished_at is not None, a.error_message
    assert a.error_message == (
        "its build was lost 3 times in a row (last: its worker n@x stopped answering); compile the model again once "
        "its workers are healthy"
    )


def test_a_redelivered_compile_takes_a_lost_build_over_and_the_lost_builder_stores_nothing(builds_db):
    """A compile message given back after its worker died (Redis's visibility timeout, a requeue) takes the build
    over before any reaper saw it, counted as a lost build; a duplicate while a live worker builds is skipped; the
    lost worker's late result (a frozen worker that thaws) changes nothing. A worker restarted under the name of
    one that was building loses that build at once."""
    from workers import progress

    settings, building = builds_db
    artifact_id = building("m@x")
    job = progress.artifact_building(settings, artifact_id, "w@x")
    assert job is not None and job.try_number == 2
    assert progress.artifact_building(settings, artifact_id, "v@x") is None  # w@x is alive and builds it
    fields = {"path": "p", "sha256": "0" * 64, "size_bytes": 1, "records_used": []}
    assert not progress.artifact_ready(settings, artifact_id, "m@x", **fields)
    assert not progress.artifact_failed(settings, artifact_id, "m@x", "late")
    assert progress.artifact_ready(settings, artifact_id, "w@x", **fields)
    a = _artifact(settings, artifact_id)
    assert a.state == "ready" and a.error_message == "" and a.worker == "w@x"
    again = building("w@x")
    assert progress.reap_lost_builds(settings) == []  # w@x heartbeats
    assert progress.reap_lost_builds(settings, restarted="w@x") == [(again, "measure.cpu.h")]
    assert _artifact(settings, again).error_message.endswith("after its build was lost: its worker w@x restarted")


# ---------------------------------------------------------------------------------------------- builds, live


def test_kill_measure_worker_mid_build(live, record_property):
    """kill -9 of the measure worker while it builds an artifact (a 120-layer model: seconds of compiling): serve
    restarts it, the build is queued again (the worker back under its name, or another's reaper, whichever is first:
    the message says which), built whole, and downloads with its checksum; no temporary file is left."""
    import hashlib
    import re

    from tests.test_workers import chain_model

    model = live.ok("POST", "/models", 201, files={"file": ("chain.onnx", chain_model(120).SerializeToString())})
    with Prober(live, None) as prober:
        art = live.ok("POST", f"/models/{model['id']}/compile", 202, json={})
        path = f"/artifacts/{art['id']}"
        wait("the build", lambda: live.ok("GET", path)["state"] == "building", 60, every=0.05)
        victim = live.worker("measure")
        os.killpg(victim.pid, signal.SIGKILL)
        assert live.ok("GET", path)["state"] == "building"  # killed mid-build
        rebuilt = wait("a second build", lambda: (a := live.ok("GET", path))["error_message"] and a, 60, every=0.1)
        done = wait("the artifact", lambda: (a := live.ok("GET", path))["state"] in ("ready", "failed") and a, 120)
    lost = r"queued again \(1 of 3\) after its build was lost: "
    lost += r"its worker faults-measure0@\S+ (restarted|stopped answering)"
    assert re.fullmatch(lost, rebuilt["error_message"]), rebuilt
    assert done["state"] == "ready" and done["error_message"] == "", done
    r = live.client.get(f"{path}/download")
    assert r.status_code == 200 and hashlib.sha256(r.content).hexdigest() == r.headers["X-Checksum-SHA256"]
    assert not list((live.storage / "artifacts").glob(".*.partial"))
    row = {
        "fault": "kill -9 measure worker mid-build (compile)",
        "job": f"artifact ready after a second build ({rebuilt['error_message'].split(': ', 1)[1]})",
        "records": "no tuning job (a compile reads records only)",
        "api": prober.says(),
    }
    record_property("fault_row", row)
    print(row)
    prober.check({200})
