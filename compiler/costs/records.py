"""Tuning records and the Database protocol; `JSONLinesDatabase` keeps them in a JSON-lines file.

A record says: this step list (a schedule) for this workload ran in these times on this host for this target.
Records replay: `apply_steps(dag, record.steps)` rebuilds the State. The SQL database of the service implements
the same protocol.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

from compiler.base.errors import TilefarmError
from compiler.base.target import Target
from compiler.schedule.state import State, apply_steps, step_from_record
from compiler.tensor.tasks import Task, weights_exceed_cache

VERSION = "0.1.0"

# The cache condition a record's timings were taken in (the runners, e.g. LocalRunner): "warm", every input in cache
# from the call before; "cold-weights", the model's constants flushed before each call, as a run of a model whose
# weights exceed the last-level cache meets them; "flushed", every cache overwritten before each call. The same
# schedule times differently in each, so records are compared only within one condition. "in-model": the program's
# time per call inside runs of the whole compiled model (compiler.artifact.in_model), where the tuner's final check
# timed the programs compile would take, tuned and default (`judged_in_model`).
WARM, COLD_WEIGHTS, FLUSHED, IN_MODEL = "warm", "cold-weights", "flushed", "in-model"
KERNEL_CONDITIONS = (WARM, COLD_WEIGHTS, FLUSHED)  # those of a kernel timed alone, which compile chooses among
CACHE_CONDITIONS = (*KERNEL_CONDITIONS, IN_MODEL)


def cache_condition(cache_flush: bool, cold_constants: bool) -> str:
    """The condition a runner with these settings times in: a full flush covers the weights too."""
    return FLUSHED if cache_flush else COLD_WEIGHTS if cold_constants else WARM


def training_group(workload_key: str, cache: str) -> str:
    """The group in which a cost model normalizes a record's throughput: its workload in its cache condition, since
    timings of two conditions are not on one scale (warm records keep the bare key, as saved models have it)."""
    return workload_key if cache == WARM else f"{workload_key}@{cache}"


class RecordError(TilefarmError):
    """A record or records file that cannot be read."""


@dataclass(frozen=True)
class TuningRecord:
    workload_key: str
    target: str
    host: str
    steps: tuple  # step records, ["SP", 2, 0, [8], true], … (see compiler.schedule.state.Step.record)
    costs: tuple[float, ...] = ()  # seconds per run, one per repeat
    error: str | None = None  # error code ("build", "run", "timeout", "wrong_answer") or None
    error_message: str = ""
    timestamp: float = field(default_factory=time.time)
    version: str = VERSION
    trace: dict | None = None  # how the search made it ({"sketch": i, "decisions": …}), to evolve from on resume
    cache: str = WARM  # the cache condition it was timed in (CACHE_CONDITIONS)

    def __post_init__(self):
        if self.cache not in CACHE_CONDITIONS:
            raise RecordError(f"unknown cache condition {self.cache!r}: one of {', '.join(CACHE_CONDITIONS)}")

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.costs)

    @property
    def mean_cost(self) -> float:
        return sum(self.costs) / len(self.costs) if self.ok else float("inf")

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """What makes a record unique: the same schedule measured twice on one host in one cache condition is one
        record."""
        return self.workload_key, self.host, json.dumps(self.steps, separators=(",", ":")), self.cache

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(line: str) -> TuningRecord:
        try:
            d = json.loads(line)
            return TuningRecord(
                d["workload_key"],
                d["target"],
                d["host"],
                as_tuples(d["steps"]),
                tuple(float(c) for c in d["costs"]),
                d.get("error"),
                d.get("error_message", ""),
                float(d.get("timestamp", 0.0)),
                d.get("version", ""),
                d.get("trace"),
                d.get("cache", WARM),  # files written before records carried it were timed warm
            )
        except (ValueError, KeyError, TypeError, RecursionError) as e:  # RecursionError: JSON nested too deep
            raise RecordError(f"not a tuning record: {type(e).__name__}: {e}: {line[:120]!r}") from None


def as_tuples(v):
    """Step records (JSON lists, or a State's step.record() lists) as the nested tuples records hold."""
    return tuple(as_tuples(x) for x in v) if isinstance(v, list | tuple) else v


def read_records(path: str | Path) -> Iterator[TuningRecord]:
    """The records of a JSON-lines file, in order; a malformed line raises RecordError naming it. A record measured
    again (Database.remeasured) is a later line of the same identity: that line replaces the earlier one, in its
    place."""
    return (record for record, _ in read_record_lines(path))


def read_record_lines(path: str | Path) -> Iterator[tuple[TuningRecord, str]]:
    """read_records with each record's line, for readers of the fields a record does not hold (provenance)."""
    latest: dict[tuple[str, str, str, str], tuple[TuningRecord, str]] = {}
    with Path(path).open() as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    record = TuningRecord.from_json(line)
                except RecordError as e:
                    raise RecordError(f"{path}:{n}: {e}") from None
                latest[record.identity] = (record, line)  # a replaced key keeps its first position
    return iter(latest.values())


class Database(Protocol):
    """Where tuning records live: a file here, the team's SQL database in the service."""

    def commit(self, record: TuningRecord) -> bool:
        """Store a record; False if an identical one (same workload, host, steps and cache condition) is already
        stored."""
        ...

    def remeasured(self, record: TuningRecord) -> bool:
        """A stored program measured again: the stored record with this one's identity takes its measurement too (an
        error-free one adds its timings, a failed one its error); False if no record with that identity is stored."""
        ...

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
        """The k fastest error-free records for a workload on a target (and host, and cache condition, when given);
        `cross_host=True` (no host given) asks for those of every host class, whatever the database's default."""
        ...

    def __iter__(self) -> Iterator[TuningRecord]:
        """Every record, for training cost models and exporting."""
        ...

    def records_of(
        self, workload_keys: Iterable[str], target: str, host: str, cache: str | None = None
    ) -> Iterator[TuningRecord]:
        """Every record (failed ones too) of these workloads for `target` measured on `host` (in cache condition
        `cache`, when given), in commit order: what resuming a tuning run takes as already measured."""
        ...


def merge_measurement(stored: TuningRecord, again: TuningRecord) -> TuningRecord:
    """`stored` after a second measurement of its program (Database.remeasured): an error-free one adds its timings,
    a failed one (a race the first run got away with) makes the record a failure."""
    if again.error is not None:
        return replace(stored, error=again.error, error_message=again.error_message)
    return replace(stored, costs=stored.costs + again.costs)


class JSONLinesDatabase:
    """Records in a JSON-lines file, appended on commit; indexed in memory when opened. A record measured again
    (`remeasured`) is appended whole once more: read_records keeps the later line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._records: list[TuningRecord] = []
        self._index: dict[tuple[str, str, str, str], int] = {}  # identity -> position in _records
        if self.path.exists():
            for r in read_records(self.path):
                self._add(r)

    def _add(self, r: TuningRecord) -> bool:
        if r.identity in self._index:
            return False
        self._index[r.identity] = len(self._records)
        self._records.append(r)
        return True

    def _append(self, record: TuningRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(record.to_json() + "\n")

    def commit(self, record: TuningRecord) -> bool:
        if not self._add(record):
            return False
        self._append(record)
        return True

    def remeasured(self, record: TuningRecord) -> bool:
        i = self._index.get(record.identity)
        if i is None:
            return False
        self._records[i] = merge_measurement(self._records[i], record)
        self._append(self._records[i])
        return True

    def import_records(self, records: Iterable[TuningRecord]) -> int:
        """Commit many; returns how many were new (importing the same file twice adds nothing)."""
        return sum(self.commit(r) for r in records)

    def export(self, path: str | Path, best_only: bool = False) -> int:
        """Write the records (or only the fastest per workload, target, host and cache condition) to a JSON-lines
        file that `import_records(read_records(path))` takes back; returns how many were written."""
        records = list(self._records)
        if best_only:
            best: dict[tuple[str, str, str, str], TuningRecord] = {}
            for r in records:
                k = (r.workload_key, r.target, r.host, r.cache)
                if r.ok and (k not in best or r.mean_cost < best[k].mean_cost):
                    best[k] = r
            records = list(best.values())
        Path(path).write_text("".join(r.to_json() + "\n" for r in records))
        return len(records)

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
        if host is not None and cross_host:
            raise ValueError("best(): give a host or cross_host=True, not both")
        found = [
            r
            for r in self._records
            if r.ok
            and r.workload_key == workload_key
            and r.target == target
            and (host is None or r.host == host)
            and (cache is None or r.cache == cache)
        ]
        return sorted(found, key=lambda r: r.mean_cost)[:k]

    def __iter__(self) -> Iterator[TuningRecord]:
        return iter(list(self._records))

    def records_of(
        self, workload_keys: Iterable[str], target: str, host: str, cache: str | None = None
    ) -> Iterator[TuningRecord]:
        keys = set(workload_keys)
        return iter(
            [
                r
                for r in self._records
                if r.workload_key in keys
                and r.target == target
                and r.host == host
                and (cache is None or r.cache == cache)
            ]
        )

    def __len__(self) -> int:
        return len(self._records)


def target_name(target: Target) -> str:
    """The target string records are filed under, as tvmc writes it (compiler.targets.parse_target reads it back):
    "llvm -mcpu=znver5 [-mattr=...]" for a CPU, "cuda -arch=sm_90" for a GPU (its mcpu is the architecture)."""
    if target.kind == "cuda":
        return f"cuda -arch={target.mcpu}"
    return f"llvm -mcpu={target.mcpu}" + (f" -mattr={target.mattr}" if target.mattr else "")


REPLAY_CANDIDATES = 8  # the fastest records of a task that compile tries, in order, until one replays


def first_replaying(task: Task, records: list[TuningRecord]) -> tuple[TuningRecord, State] | None:
    """The first record (and its State) that replays on the task's DAG: one from another tilefarm version may
    no longer replay, and the next is taken."""
    for rec in records[:REPLAY_CANDIDATES]:
        try:
            return rec, apply_steps(task.dag, [step_from_record(r) for r in rec.steps])
        except TilefarmError:
            continue
    return None


def cache_preference(weights_bytes: int, target: Target) -> tuple[str, ...]:
    """The cache conditions whose records compile prefers for a model of `weights_bytes` of constants
    (`tasks.constant_bytes`), in order: first the one a run of the model meets (its weights cold when they exceed the
    last-level cache, warm otherwise), then the others."""
    first = COLD_WEIGHTS if weights_exceed_cache(weights_bytes, target.l3_bytes) else WARM
    return (first, *(c for c in KERNEL_CONDITIONS if c != first))


def best_replaying(
    task: Task, database: Database, target: Target, prefer: Sequence[str] = KERNEL_CONDITIONS, *, others: bool = False
) -> tuple[TuningRecord, State] | None:
    """The fastest record of the task measured on this host class that replays, taken from the first cache
    condition in `prefer` that has one: timings of different conditions are never compared with each other.
    `others` (what compile asks): for a target kind in SHARED_ACROSS_HOSTS whose host class has none, the records of
    another host class of the same target (other_host)."""
    for cache in prefer:
        found = database.best(task.key, target_name(target), target.fingerprint(), k=REPLAY_CANDIDATES, cache=cache)
        replayed = first_replaying(task, found)
        if replayed is not None:
            return replayed
    if not others or target.kind not in SHARED_ACROSS_HOSTS:
        return None
    for cache in prefer:
        host = other_host(task.key, database, target, cache)
        if host is not None:
            replayed = first_replaying(
                task, database.best(task.key, target_name(target), host, REPLAY_CANDIDATES, cache=cache)
            )
            if replayed is not None:
                return replayed
    return None


def judged_in_model(
    task: Task, database: Database, target: Target, found: tuple[TuningRecord, State] | None
) -> tuple[TuningRecord, State] | None:
    """What compile runs for `task` given `found`, the fastest record of a kernel timing (best_replaying): where the
    tuner's final check timed that program inside the model's run beside others (IN_MODEL records: the tuned program
    and the default schedule's), the fastest of those in the run. A tuned kernel can be faster alone and slower in
    the run (the cache state its neighbours leave); then the model keeps the default's program. A program found
    after the check (a resumed tuning) was not judged, so it stands."""
    judged = database.best(task.key, target_name(target), target.fingerprint(), k=REPLAY_CANDIDATES, cache=IN_MODEL)
    if not judged or (found is not None and all(r.steps != found[0].steps for r in judged)):
        return found
    return first_replaying(task, judged) or found


# Target kinds whose records stand in for another host class's when a host class has none: code for a GPU is built
# anywhere (no GPU is needed), for whichever GPU of its architecture runs it, so a cuda target compiled where no GPU
# of the farm's was measured takes the records of one that was. A CPU's records never do: its code is built for the
# host class that measured them.
SHARED_ACROSS_HOSTS = ("cuda",)


def other_host(workload_key: str, database: Database, target: Target, cache: str | None = None) -> str | None:
    """The host class, other than `target`'s own, whose records of the workload for `target` compile takes instead:
    the one holding the fastest (timings of two GPUs are not compared beyond choosing which GPU's to follow; the
    schedules then come from that one alone). None where no other host class has one."""
    own = target.fingerprint()
    for r in database.best(workload_key, target_name(target), k=REPLAY_CANDIDATES, cache=cache, cross_host=True):
        if r.host != own:
            return r.host
    return None
