"""`tilefarm worker`: one Celery worker node of the farm, in this process, on the threads pool.

Roles pick the default queues: `search` drives tuning jobs, `measure` builds, runs and compiles for this host's
class (measure.cpu.<fingerprint>), `all` does both. A node serving search runs each job in one pool thread for the
job's whole duration, so with role all the concurrency must exceed the number of jobs it may drive at once, or
its measurements wait for another worker; `tilefarm serve` runs separate search and measure workers for this."""

from __future__ import annotations

import argparse
import socket
import sys

ROLES = ("all", "search", "measure")


def default_queues(role: str) -> list[str]:
    from compiler.targets import host_target
    from workers.celery_app import SEARCH_QUEUE, measure_queue

    queues = []
    if role in ("all", "search"):
        queues.append(SEARCH_QUEUE)
    if role in ("all", "measure"):
        queues.append(measure_queue(host_target().fingerprint()))
    return queues


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tilefarm worker", description=__doc__.splitlines()[0])
    p.add_argument("--queues", help="comma-separated queues to serve (default: those of the role)")
    p.add_argument("--role", choices=ROLES, default="all", help="search, measure (this host's class) or both")
    p.add_argument("--concurrency", type=int, default=2, help="tasks run at once (threads)")
    p.add_argument(
        "--name", help="node name, unique in the farm (default ROLE@HOSTNAME; a restart under the same name resumes)"
    )
    p.add_argument("--loglevel", default="warning", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)
    if args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues else default_queues(args.role)
    if not queues:
        p.error("--queues names no queue")
    name = args.name or args.role
    if "@" not in name:
        name = f"{name}@{socket.gethostname()}"

    from workers.tasks import app  # the tasks register on import, and the settings are read from the environment

    print(f"tilefarm worker {name}: queues {', '.join(queues)}, {args.concurrency} threads", file=sys.stderr)
    worker = app.Worker(
        hostname=name,
        pool_cls="threads",
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
    worker.start()
    return int(worker.exitcode or 0)


if __name__ == "__main__":
    sys.exit(main())
