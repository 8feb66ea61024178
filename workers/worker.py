"""`tilefarm worker`: one Celery worker node of the farm, in this process, on the threads pool.

Roles pick the default queues: `search` drives tuning jobs, `measure` builds, runs and compiles for this host's
class (measure.cpu.<fingerprint>; with `--gpu N`, for GPU N as the CUDA driver reports it: measure.gpu.<its
fingerprint>, workers.measuring), `all` does both. A node serving search runs each job in one pool thread for the
job's whole duration, so with role all the concurrency must exceed the number of jobs it may drive at once, or
its measurements wait for another worker; `tilefarm serve` runs separate search and measure workers for this.

Stopping (Celery's own signal handlers are replaced, and its lines with them): SIGTERM is a warm shutdown (no new
task; a search hands its job back to the queue, a measurement stops after its current candidate, storing what it
measured, and its batch goes back to the queue; a compile is finished), exit status 0. Ctrl-C (SIGINT) is the same,
except that the tasks in flight get STOP_WAIT_S to hand their work back: one still running then (a compile, a
long candidate) is left behind, and the farm takes it up again as the work of a stopped worker; exit status 130. A
second Ctrl-C leaves at once. Either way one line says what happened (`--supervised`: none; serve says it)."""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

ROLES = ("all", "search", "measure")
STOP_WAIT_S = 4.0  # after Ctrl-C, how long the tasks in flight have to hand their work back


def default_queues(role: str, host=None) -> list[str]:
    """The queues of `role` for measuring host `host` (a workers.measuring.MeasuringHost; default: this CPU)."""
    from workers import measuring
    from workers.celery_app import SEARCH_QUEUE

    queues = []
    if role in ("all", "search"):
        queues.append(SEARCH_QUEUE)
    if role in ("all", "measure"):
        queues.append((host or measuring.cpu()).queue)
    return queues


@dataclass
class Stop:
    """How this worker is being stopped: by which signal, since when, and what its pool left running."""

    signal: int | None = None
    began: float = 0.0
    wait_s: float | None = None  # how long the pool waits for the tasks in flight (None: until they end)
    left: int = 0

    def line(self, name: str) -> str:
        from workers.heartbeat import HANDED_BACK

        what = list(HANDED_BACK)
        if self.left:
            what.append(
                f"left {self.left} task{'s' if self.left > 1 else ''} running after {self.wait_s:g} s, to be taken "
                "up again by the farm as a stopped worker's"
            )
        said = f"stopped in {time.monotonic() - self.began:.1f} s ({'; '.join(what) or 'nothing in flight'})"
        if self.signal == signal.SIGINT:
            return f"interrupted: tilefarm worker {name} {said}"
        return f"tilefarm worker {name} {said}"


class _QuietStop(logging.Filter):
    """kombu warns of a message that came for a consumer already cancelled (and puts it back on its queue): what
    a stopping worker's last fetch does."""

    def __init__(self, stop: Stop):
        super().__init__()
        self.stop = stop

    def filter(self, record: logging.LogRecord) -> bool:
        return self.stop.signal is None or not str(record.msg).startswith("Requeuing undeliverable message")


def _start_forkserver() -> None:
    """Start multiprocessing's forkserver (the tasks' build and feature pools fork their workers from it) now,
    with SIGINT ignored, which it and every process it forks inherit: the terminal's Ctrl-C reaches the worker's
    whole process group, but those processes are the worker's to stop, in order, without a traceback (a forkserver
    still importing) or a build failure that is not the candidate's."""
    import multiprocessing.forkserver

    from compiler.targets.cpu import runner

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        multiprocessing.get_context("forkserver").set_forkserver_preload([runner.__name__])  # as LocalBuilder's
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


def _pool_class(stop: Stop):
    from celery.concurrency.thread import TaskPool

    class Pool(TaskPool):
        """Celery's thread pool, except that its stop waits for the tasks in flight at most stop.wait_s."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.running: set[concurrent.futures.Future] = set()
            self.lock = threading.Lock()

        def on_apply(self, *args, **kwargs):
            applied = super().on_apply(*args, **kwargs)
            with self.lock:
                self.running.add(applied.f)
            applied.f.add_done_callback(self._done)
            return applied

        def _done(self, future: concurrent.futures.Future) -> None:
            with self.lock:
                self.running.discard(future)

        def on_stop(self) -> None:
            self.executor.shutdown(wait=False, cancel_futures=True)
            with self.lock:
                running = list(self.running)
            _, left = concurrent.futures.wait(running, timeout=stop.wait_s)
            stop.left = len(left)

    return Pool


def _worker_class(app, stop: Stop, quiet: bool):
    """app.Worker with this module's stop (its signal handler, installed in place of Celery's)."""
    from celery import platforms
    from celery import signals as celery_signals
    from celery.utils.log import in_sighandler
    from celery.worker import state

    from workers import fs_broker

    class Worker(app.Worker):
        def on_signal(self, signum: int, frame) -> None:
            if stop.signal is not None:
                if signum == signal.SIGINT:  # a second Ctrl-C: now, not even marked stopped
                    if not quiet:
                        print(
                            f"interrupted: tilefarm worker {self.hostname} stopped at once (a second Ctrl-C): what "
                            "it was doing is taken up again once its heartbeat is missed",
                            file=sys.__stderr__,  # not Celery's logging proxy
                            flush=True,
                        )
                    os._exit(130)
                return  # a stop is under way
            stop.signal, stop.began = signum, time.monotonic()
            exitcode = 130 if signum == signal.SIGINT else 0
            if signum == signal.SIGINT:
                stop.wait_s = STOP_WAIT_S
            try:
                with in_sighandler():
                    # what Celery's warm shutdown sends: a running search hands its job back (workers.heartbeat)
                    celery_signals.worker_shutting_down.send(
                        sender=self.hostname, sig=signal.Signals(signum).name, how="Warm", exitcode=exitcode
                    )
            finally:
                fs_broker.WAKE.set()
                state.should_stop = exitcode  # the consumer loop stops taking messages, and the worker stops

        def install_platform_tweaks(self, worker):
            super().install_platform_tweaks(worker)
            for sig in (signal.SIGTERM, signal.SIGINT):
                platforms.signals[sig.name] = self.on_signal

    return Worker


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tilefarm worker", description=__doc__.splitlines()[0])
    p.add_argument("--queues", help="comma-separated queues to serve (default: those of the role)")
    p.add_argument("--role", choices=ROLES, default="all", help="search, measure (this host's class) or both")
    p.add_argument(
        "--gpu",
        type=int,
        metavar="N",
        help="measure on GPU N (CUDA driver ordinal, from 0) instead of this CPU: serves measure.gpu.<its fingerprint>",
    )
    p.add_argument("--concurrency", type=int, default=2, help="tasks run at once (threads)")
    p.add_argument(
        "--name", help="node name, unique in the farm (default ROLE@HOSTNAME; a restart under the same name resumes)"
    )
    p.add_argument("--loglevel", default="warning", choices=["debug", "info", "warning", "error"])
    # started by `tilefarm serve`, which says in one line how it and its workers stopped
    p.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    name = args.name or args.role
    if "@" not in name:
        name = f"{name}@{socket.gethostname()}"
    host = None
    if args.gpu is not None:
        if args.role == "search":
            p.error("--gpu is for a measuring worker (--role measure or all); a search worker measures nothing")
        from compiler.base.errors import TilefarmError
        from workers import measuring

        try:
            host = measuring.gpu(args.gpu)
        except TilefarmError as e:
            p.error(f"--gpu {args.gpu}: {e}")
        measuring.use(host)
    try:
        queues = (
            [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues else default_queues(args.role, host)
        )
        if not queues:
            p.error("--queues names no queue")
        from workers.tasks import app  # the tasks register on import, and the settings are read from the environment

        on = f", measuring on {host.describe()}" if host is not None else ""
        print(f"tilefarm worker {name}: queues {', '.join(queues)}, {args.concurrency} threads{on}", file=sys.stderr)
        _start_forkserver()
        stop = Stop()
        logging.getLogger("kombu.transport.virtual.base").addFilter(_QuietStop(stop))
        worker = _worker_class(app, stop, args.supervised)(
            hostname=name,
            pool_cls=_pool_class(stop),
            concurrency=args.concurrency,
            queues=queues,
            loglevel=args.loglevel.upper(),
            quiet=True,
            # liveness is the WorkerRow heartbeat; Celery's gossip, mingle and event heartbeats would only add broker
            # traffic (each a stream of files with the embedded broker)
            without_gossip=True,
            without_mingle=True,
            without_heartbeat=True,
        )
    except KeyboardInterrupt:  # before it had a stop of its own
        if not args.supervised:
            print(f"interrupted: tilefarm worker {name} stopped while starting", file=sys.stderr)
        return 130
    for sig in (signal.SIGTERM, signal.SIGINT):  # now, not once Celery is set up: registering its row takes a while
        signal.signal(sig, worker.on_signal)
    worker.start()
    code = int(worker.exitcode or 0)
    if stop.signal is None:
        return code
    if not args.supervised:
        print(stop.line(name), file=sys.__stderr__, flush=True)  # not Celery's logging proxy
    if stop.left:  # a task thread still runs (Python would wait for it at exit): leave it, as said
        sys.stdout.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
