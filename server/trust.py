"""Trust in the records every team shares: the checks an imported record must pass, and the farm's re-measuring of
imported records (docs/records.md#verification-and-trust).

An import could otherwise poison another team's compiles with a schedule and a made-up timing. Three defences:
`ImportCheck` refuses a record that is malformed, does not replay or claims to beat the hardware; an imported record
is stored unverified (`SQLDatabase.import_file`) and chosen only by the importing team's compiles and tunes
(`SQLDatabase.trusting`) until a farm worker of its host class has measured its schedule (workers.tasks
.verify_records), which `request_verification` asks for after an import or an upload, and a measuring worker asks
for its own host class when it starts."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from compiler.base.errors import TilefarmError
from compiler.base.target import Target
from compiler.costs.measure import ERRORS, INSTANTIATION
from compiler.costs.records import TuningRecord, target_name
from compiler.schedule.state import apply_steps, step_from_record
from compiler.tensor.dag import ComputeDAG
from server.catalog import host_target, is_alive, records_db, workload_dag
from server.db import session_scope
from server.models import ArtifactRow, Job, WorkerRow, Workload
from server.schemas import ApiError
from server.settings import Settings
from workers.celery_app import measure_queue
from workers.dispatch import enqueue_verify

log = logging.getLogger("tilefarm.server")

HOST_FINGERPRINT = re.compile(r"[0-9a-f]{16}")  # Target.fingerprint(): 16 hex digits of a sha256
WORKLOAD_KEY = re.compile(r"[0-9a-f]{32}")  # ComputeDAG.workload_key: 32 hex digits of a sha256
TARGET = re.compile(r"llvm -mcpu=[a-z0-9][a-z0-9_.-]{0,63}")  # target_name(): LLVM's CPU names are [a-z0-9_.-]
# A timing faster than the workload's FLOPs at this rate on every core of its host is refused. About 4x the fastest
# core there is (Zen 5: 250 GFLOP/s fp32 with AVX-512 FMA), so no honest timing comes near it.
PEAK_FLOPS_PER_CORE = 1e12
MAX_CORES = 1024  # the cores counted for a host class the farm knows nothing of
# what steps that do not replay raise (workloads.record_schedule's, and what input made of any JSON may raise besides)
REPLAY_ERRORS = (TilefarmError, ValueError, TypeError, IndexError, KeyError, AttributeError, RecursionError)
TEXT_SHOWN = 40  # characters of an offending value a message repeats


def _is(pattern: re.Pattern[str], value: object) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


class ImportCheck:
    """The checks of one import's records against what the database knows: each workload's DAG and each host
    class's target are read once. `unknown` collects the keys of workloads with no stored DAG."""

    def __init__(self, session: Session, settings: Settings):
        self.session, self.settings = session, settings
        self._dags: dict[str, ComputeDAG | None] = {}
        self._hosts: dict[str, Target | None] = {}
        self.unknown: set[str] = set()

    def problem(self, r: TuningRecord) -> str | None:
        """Why `r` may not be imported, or None. A workload whose DAG is not stored is recorded in `unknown`: its
        steps are only parsed, and its timings only checked for being finite."""
        if not _is(HOST_FINGERPRINT, r.host):
            return f"host {str(r.host)[:TEXT_SHOWN]!r} is not a host fingerprint (16 lowercase hex digits)"
        if not _is(WORKLOAD_KEY, r.workload_key):
            return f"workload_key {str(r.workload_key)[:TEXT_SHOWN]!r} is not a workload key (32 lowercase hex digits)"
        if not _is(TARGET, r.target):
            return f"target {str(r.target)[:TEXT_SHOWN]!r} is not a target: 'llvm -mcpu=<LLVM CPU name>'"
        host = self._host(r.host)
        if host is not None and r.target != target_name(host):
            return f"target {r.target!r} is not host class {r.host}'s, {target_name(host)!r}"
        if r.error is not None and r.error not in ERRORS:
            return f"error {str(r.error)[:TEXT_SHOWN]!r} is not an error code ({', '.join(ERRORS)})"
        dag = self._dag(r.workload_key)
        if r.error != INSTANTIATION:  # a record that says its steps do not replay is a failure nobody chooses
            try:
                steps = [step_from_record(s) for s in r.steps]
                if dag is not None:
                    apply_steps(dag, steps)
            except REPLAY_ERRORS as e:
                return f"its steps do not replay on workload {r.workload_key}: {str(e)[:200]}"
        if r.ok and dag is not None:
            cores = min(host.cores, MAX_CORES) if host is not None else MAX_CORES
            floor = dag.flop_count / (cores * PEAK_FLOPS_PER_CORE)
            if min(r.costs) < floor:
                return (
                    f"a cost of {min(r.costs):.3g} s is faster than the hardware allows: workload {r.workload_key} "
                    f"is {dag.flop_count} FLOP, at least {floor:.3g} s at {PEAK_FLOPS_PER_CORE / 1e9:.0f} GFLOP/s "
                    f"on each of {cores} cores"
                )
        return None

    def _dag(self, key: str) -> ComputeDAG | None:
        if key not in self._dags:
            text = self.session.scalar(select(Workload.dag_json).where(Workload.key == key))
            try:
                self._dags[key] = workload_dag(key, text) if text is not None else None
            except TilefarmError:  # stored by a tilefarm with other DAG rules: it does not rebuild as its key
                self._dags[key] = None
        if self._dags[key] is None:
            self.unknown.add(key)
        return self._dags[key]

    def _host(self, fingerprint: str) -> Target | None:
        """The host class's target where the farm knows it (a worker's, this server's, a host row that hashes to the
        fingerprint: catalog.host_target), else None."""
        if fingerprint not in self._hosts:
            try:
                self._hosts[fingerprint] = host_target(self.session, self.settings, fingerprint)
            except ApiError:
                self._hosts[fingerprint] = None
        return self._hosts[fingerprint]


def request_verification(settings: Settings, hosts: Iterable[str] | None = None) -> list[str]:
    """Ask the farm to re-measure unverified records: one `verify_records` message to each host class (of `hosts`,
    when given) that has a live measuring worker and unverified records whose DAG is stored. Returns the queues sent
    to. A broker that does not answer is logged, not raised: the import is done, and the next measuring worker to
    start asks again."""
    try:
        with session_scope(settings, write=False) as s:
            workers = s.scalars(
                select(WorkerRow).where(
                    WorkerRow.stopped.is_(False), WorkerRow.fingerprint.is_not(None), WorkerRow.kind != "search"
                )
            ).all()
            queues = {
                str(w.fingerprint): measure_queue(str(w.fingerprint), w.kind) for w in workers if is_alive(w, settings)
            }
        pending = records_db(settings.database_url).unverified_hosts() & set(queues)
        if hosts is not None:
            pending &= set(hosts)
        for fingerprint in sorted(pending):
            enqueue_verify(settings, fingerprint, queues[fingerprint])
    except Exception as e:
        log.warning("could not ask the farm to re-measure imported records: %s", e)
        return []
    return [queues[fp] for fp in sorted(pending)]


def team_of(settings: Settings, table: type[Job] | type[ArtifactRow], row_id: int) -> int | None:
    """The team that owns a tuning job or an artifact: its unverified imports are trusted by that job or compile."""
    with session_scope(settings, write=False) as s:
        return s.scalar(select(table.team_id).where(table.id == row_id))
