"""Ctrl-C for the service's commands (issue 48, item 2): `tilefarm worker` and `tilefarm serve` get SIGINT on their
whole process group, as a terminal sends it, and stop within seconds, in one line, with exit status 130 and none of
Celery's or uvicorn's shutdown lines; a measure worker interrupted mid-batch stores what it measured and puts the
batch back on its queue, where another worker measures it whole. Real subprocesses, on a SQLite database and the
embedded (file-system) broker in a temporary folder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from server.db import session_scope
from server.models import MeasureBatch, Record, WorkerRow
from server.settings import Settings
from tilefarm.serve import free_port
from workers.worker import STOP_WAIT_S

NOISE = ("Traceback", "Warm shutdown", "Hitting Ctrl+C", "Shutting down", "stopping the workers", "Finished server")
STARTUP_S = 90.0
SIZE = 16  # candidates in the interrupted batch, each measured in over 0.1 s


def environ(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILEFARM_")}
    env.update(
        TILEFARM_DATABASE_URL=f"sqlite:///{root / 'service.db'}",
        TILEFARM_STORAGE_DIR=str(root / "storage"),
        TILEFARM_HEARTBEAT_S="0.5",
        TILEFARM_WORKER_GRACE_S="3",
        XDG_DATA_HOME=str(root / "data"),
        XDG_CACHE_HOME=str(root / "cache"),
        PYTHONUNBUFFERED="1",
    )
    return env


class Command:
    """A `tilefarm` command in a session of its own, its output in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tilefarm", *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def interrupt(self, sig: int = signal.SIGINT) -> float:
        """Send `sig` to the whole process group; the seconds until the command exited."""
        t = time.monotonic()
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running 60 s after {signal.Signals(sig).name}:\n{self.output()}") from None
        return time.monotonic() - t

    def interrupted_line(self) -> tuple[str, str]:
        """After a Ctrl-C: the command exited 130 and said so in one line; that line and its whole output."""
        out = self.output()
        assert self.proc.returncode == 130, out
        [line] = said(out, "interrupted: ")
        return line, out

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def workers_up(settings: Settings, names: set[str], cmd: Command) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        assert cmd.proc.poll() is None, cmd.output()
        with session_scope(settings, write=False) as s:
            up = {w.name for w in s.scalars(select(WorkerRow).where(WorkerRow.stopped.is_(False)))}
        if names <= up:
            return
        time.sleep(0.1)
    raise AssertionError(f"workers {names} not up after {STARTUP_S:.0f} s:\n{cmd.output()}")


def stopped(settings: Settings, name: str) -> bool:
    with session_scope(settings, write=False) as s:
        return s.scalars(select(WorkerRow.stopped).where(WorkerRow.name == name)).one()


def said(output: str, prefix: str) -> list[str]:
    """The lines of `output` that begin with `prefix`, after asserting that it holds none of the noise."""
    for noise in NOISE:
        assert noise not in output, output[-3000:]
    return [line for line in output.splitlines() if line.startswith(prefix)]


def batch_of(n: int):
    """n distinct programs of a 64x64 matmul (random sketches and decisions), each measured in about 0.1 s."""
    from compiler.costs.cost_model import RandomModel
    from compiler.costs.measure import MeasureInput
    from compiler.search.evolution import SearchPolicy
    from compiler.tensor import ops, te
    from compiler.tensor.dag import ComputeDAG
    from compiler.tensor.tasks import Task

    a, w = te.placeholder((64, 64), name="A"), te.placeholder((64, 64), name="W")
    dag = ComputeDAG([a, w, ops.matmul(a, w, name="C")])
    task = Task(dag.workload_key, dag, "matmul64")
    return [MeasureInput(task, c.state.steps) for c in SearchPolicy(dag, RandomModel(0), seed=7).sample_initial(n)]


def test_ctrl_c_stops_a_measure_worker_mid_batch_in_one_line(tmp_path):
    """SIGINT while a measure worker measures a batch: it stops after the candidate it is measuring, stores what it
    measured, puts the batch back on its queue and says so in one line (exit 130); another worker takes the same
    batch (the same message, its first try) and measures it whole, and no record is stored twice. That worker,
    stopped by SIGTERM with nothing in flight, exits 0 saying so."""
    from compiler.targets import host_target
    from server.database import SQLDatabase
    from workers.celery_app import make_celery, measure_queue
    from workers.farm import FarmRunner

    env = environ(tmp_path)
    settings = Settings.from_env(env)
    SQLDatabase(settings.database_url, upgrade_schema=True).close()
    first = Command(["worker", "--role", "measure", "--name", "first@test"], env, tmp_path / "first.log")
    try:
        inputs = batch_of(SIZE)
        workers_up(settings, {"first@test"}, first)
        fingerprint = host_target().fingerprint()
        queue = measure_queue(fingerprint)
        runner = FarmRunner(settings, make_celery(settings), job_id=None, queue=queue, host=fingerprint)
        results: list = []
        waiting = threading.Thread(target=lambda: results.extend(runner.run(inputs, [])), daemon=True)
        waiting.start()
        deadline = time.monotonic() + 60
        while not sandbox_of(first.proc.pid):  # built: the candidates are being measured, one after another
            assert time.monotonic() < deadline, first.output()
            time.sleep(0.05)
        time.sleep(0.8)  # a few of them
        seconds = first.interrupt()
    finally:
        first.kill()
    line, out = first.interrupted_line()
    assert line.startswith("interrupted: tilefarm worker first@test stopped in "), line
    assert seconds < STOP_WAIT_S + 3, (seconds, out)
    kept, batch = _records(settings), _batch(settings)
    assert batch is not None and 0 < kept < SIZE, (kept, out)
    assert f"(batch {batch.id[:8]} back on its queue, {kept} of {SIZE} measured and stored)" in line, line
    assert batch.state == "sent" and batch.worker is None and stopped(settings, "first@test")

    second = Command(["worker", "--role", "measure", "--name", "second@test"], env, tmp_path / "second.log")
    try:
        waiting.join(STARTUP_S)
        assert not waiting.is_alive(), second.output()
        seconds = second.interrupt(signal.SIGTERM)
    finally:
        second.kill()
    assert len(results) == SIZE and all(r.error is None for r in results), [r.message for r in results]
    done = _batch(settings)
    assert done is not None and (done.state, done.worker, done.try_number) == ("done", "second@test", 1)
    assert _records(settings) == SIZE  # those the first stored, and the rest: each once
    out = second.output()
    assert second.proc.returncode == 0, out
    assert said(out, "tilefarm worker second@test stopped in ")[0].endswith("(nothing in flight)"), out
    assert seconds < STOP_WAIT_S + 3 and stopped(settings, "second@test"), (seconds, out)


def sandbox_of(pid: int) -> bool:
    """Whether worker `pid` runs its measuring sandbox (compiler.targets.cpu.runner: started once a batch is built)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and "sandbox.py" in (stat.parent / "cmdline").read_text():
                return True
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return False


def _batch(settings: Settings) -> MeasureBatch | None:
    with session_scope(settings, write=False) as s:
        return s.scalars(select(MeasureBatch)).first()


def _records(settings: Settings) -> int:
    with session_scope(settings, write=False) as s:
        return s.scalar(select(func.count()).select_from(Record)) or 0


def test_ctrl_c_stops_serve_and_its_workers_in_one_line(tmp_path):
    """SIGINT to `tilefarm serve`'s process group (its workers are in groups of their own, as a terminal leaves
    them): the API and the workers stop at once, the workers quietly; one line, exit 130, every worker marked
    stopped."""
    env = environ(tmp_path)
    settings = Settings.from_env(env)
    port = free_port()
    serve = Command(["serve", "--port", str(port), "--workers", "1"], env, tmp_path / "serve.log")
    try:
        names = {f"serve{port}-{role}@{socket.gethostname()}" for role in ("search", "measure0")}
        workers_up(settings, names, serve)
        seconds = serve.interrupt()
    finally:
        serve.kill()
    line, out = serve.interrupted_line()
    assert line.startswith("interrupted: tilefarm serve stopped in ") and line.endswith(" s (the API and 2 workers)")
    assert out.count(" stopped ") == 1, out  # the workers said nothing of their stop
    assert seconds < STOP_WAIT_S + 6, (seconds, out)
    assert all(stopped(settings, n) for n in names)


def test_ctrl_c_while_a_command_starts_is_one_line_too(tmp_path):
    """A Ctrl-C in the first instant of a command, while it still loads the compiler (tilefarm.entry), or a moment
    later, while it works (tilefarm.cli): one line and exit 130 either way, never an import traceback."""
    import onnx

    from tilefarm import examples

    model = tmp_path / "resnet18.onnx"
    onnx.save(examples.resnet18(), model)
    script = Path(sys.executable).with_name("tilefarm")  # the console script pip wrote: tilefarm.entry:main
    for delay in (0.1, 0.2, 0.4, 0.8, 1.5):
        argv = [str(script), "compile", str(model), "-o", str(tmp_path / "m.tar")]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, (delay, err[-2000:])
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("interrupted: tilefarm"), (delay, err[-2000:])


def test_a_ctrl_c_while_native_extensions_load_is_raised_once_they_have():
    # (tilefarm.interrupts) the handler in place before the block is back after it, and the held Ctrl-C is raised then
    from tilefarm.interrupts import held_interrupts

    before = signal.getsignal(signal.SIGINT)
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt):
        with held_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs between bytecodes: here, if it is to raise inside
            reached_the_end = True
    assert reached_the_end and signal.getsignal(signal.SIGINT) is before
    with held_interrupts():  # no Ctrl-C: nothing raised
        pass
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(held_interrupts().__enter__() is None))
    worker.start()
    worker.join()
    assert outcome == [True]  # outside the main thread it sets no handler (it could not)
