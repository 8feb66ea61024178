"""Cost-model transfer (TenSet-style): learn from every record the team measured on this host class before a
task's first round, so a workload never tuned before is searched with a model that already knows which programs
run fast here.

`pretrain` featurizes the records of a training source (the SQL records database: it stores each workload's DAG,
so records of workloads no model at hand contains still replay) and fits an XGBModel on all of them. Tuning then
starts from that model as a prior (`XGBModel(prior=...)`): its scores guide the search from the first round, and
the task's own measurements train a correction on top of it.

`ModelCache` keeps the pre-trained model in a file per (database, target, host, feature code) and refreshes it
when enough new records arrived: only those are featurized, then the model is refit on everything.

A GPU host class with no records of its own yet (a new GPU, or a new driver: another fingerprint) learns from the
records of the other GPUs of its architecture instead (records.SHARED_ACROSS_HOSTS), each GPU's timings normalized
on their own; that model is fit afresh, not cached, until the host class has records of its own.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from compiler.base.errors import TilefarmError
from compiler.base.target import Target
from compiler.costs import features
from compiler.costs.cost_model import XGBModel
from compiler.costs.records import SHARED_ACROSS_HOSTS, VERSION, TuningRecord, target_name, training_group
from compiler.schedule.state import step_from_record
from compiler.search.evolution import featurize_programs
from compiler.targets import host_target
from compiler.tensor.dag import ComputeDAG

REFRESH_MIN = 256  # new records that make a cached model stale, at least ...
REFRESH_FRACTION = 0.1  # ... or this share of the records it was trained on, whichever is more
NOTHING_TO_LEARN = "no records measured on this host to pre-train the cost model from"


class TrainingSource(Protocol):
    """Where pre-training reads from: server.database.SQLDatabase implements it."""

    def workload_dags(self) -> dict[str, ComputeDAG]:
        """The DAG of every workload whose DAG is stored, by workload key."""
        ...

    def training_records(self, host: str | None = None, after: int = 0) -> Iterator[tuple[int, TuningRecord]]:
        """(id, record) of the records measured on `host` with id above `after`, in commit order."""
        ...

    def count_records(self, host: str | None = None, after: int = 0) -> int: ...


@dataclass
class TrainingSet:
    """Featurized records: per program its store features, mean cost (inf for a failure) and workload key."""

    xs: list[np.ndarray]
    costs: list[float]
    groups: list[str]
    skipped: int = 0  # records left out: their workload's DAG is unknown or their steps no longer replay

    def __len__(self) -> int:
        return len(self.xs)


def featurize_records(
    records: Iterable[TuningRecord],
    dags: dict[str, ComputeDAG],
    target: Target,
    exclude: Iterable[str] = (),
    by_host: bool = False,
) -> TrainingSet:
    """Features of each record's program for `target` (its own workload's DAG, its own steps), failures included
    (they teach the model what does not run); records of `exclude` workloads and of unknown workloads are left
    out, and so are step lists this tilefarm no longer replays. `by_host`: each host class's timings of a workload
    are a group of their own (records of several GPUs, whose times are not on one scale)."""
    left_out, name = set(exclude), target_name(target)
    by_workload: dict[str, list[TuningRecord]] = {}
    skipped = 0
    for r in records:
        if r.workload_key in left_out or r.workload_key not in dags or r.target != name:
            skipped += 1
            continue
        by_workload.setdefault(r.workload_key, []).append(r)
    out = TrainingSet([], [], [], skipped)
    for key, recs in by_workload.items():
        programs = []
        for r in recs:
            try:
                programs.append(tuple(step_from_record(s) for s in r.steps))
            except (TilefarmError, ValueError, TypeError, IndexError, KeyError):
                programs.append(None)
        xs = featurize_programs(dags[key], [p for p in programs if p is not None], target)
        it = iter(xs)
        for r, p in zip(recs, programs):
            x = next(it) if p is not None else None
            if x is None or not len(x):
                out.skipped += 1
                continue
            out.xs.append(x)
            out.costs.append(r.mean_cost)
            out.groups.append(training_group(key, r.cache) + (f"@{r.host}" if by_host else ""))
    return out


def pretrain(data: TrainingSet, seed: int = 43, nthread: int = 0) -> XGBModel:
    """An XGBModel fit on `data` (every program at once; all threads by default: this runs once, not per round)."""
    model = XGBModel(seed=seed, num_warmup=1, nthread=nthread or host_target().cores)
    model.update(data.xs, data.costs, data.groups)
    return model


class ModelCache:
    """Pre-trained models on disk, one per (database, target, host, feature code), refreshed as records arrive."""

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory) if directory else default_cache_dir()

    def path_for(self, database_id: str, target: Target) -> Path:
        what = json.dumps([database_id, target_name(target), target.fingerprint(), _feature_code(), VERSION])
        return self.directory / f"cost-model-{hashlib.sha256(what.encode()).hexdigest()[:24]}.npz"

    def load_or_train(
        self, source: TrainingSource, database_id: str, target: Target, exclude: Iterable[str] = ()
    ) -> tuple[XGBModel | None, str]:
        """The pre-trained model for `source` on `target`'s host (None when the source holds no usable record),
        trained now if there is none cached or enough records arrived since; and a line saying what happened.
        Workloads in `exclude` are never trained on (a fresh, uncached fit is made when any are given)."""
        exclude = set(exclude)
        host = target.fingerprint()
        path = self.path_for(database_id, target)
        meta_path = path.with_suffix(".json")
        cached, note = None, ""
        if not exclude and path.exists() and meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
                cached = (XGBModel.load(path), int(meta["last_id"]))
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
                note = f" (the cached one, {path}, was unreadable: {type(e).__name__}: {e})"
        t0 = time.perf_counter()
        if cached is not None:
            model, last_id = cached
            new = source.count_records(host, after=last_id)
            if new < max(REFRESH_MIN, math.ceil(REFRESH_FRACTION * len(model.xs))):
                return model, f"cost model pre-trained on {len(model.xs)} records (cached, {new} newer records)"
        else:
            model, last_id = None, 0
        rows = list(source.training_records(host, after=last_id))
        data = featurize_records((r for _, r in rows), source.workload_dags(), target, exclude)
        if model is not None:
            data = TrainingSet(model.xs + data.xs, model.costs + data.costs, model.groups + data.groups, data.skipped)
        if not any(math.isfinite(c) for c in data.costs):
            if target.kind in SHARED_ACROSS_HOSTS:
                return self._from_other_hosts(source, target, exclude, note)
            return None, NOTHING_TO_LEARN
        model = pretrain(data)
        took = time.perf_counter() - t0
        left_out = f" ({data.skipped} records left out)" if data.skipped else ""
        workloads = len({g.split("@")[0] for g in data.groups})  # training_group: a workload in each condition
        line = f"cost model pre-trained on {len(data)} records of {workloads} workloads in {took:.1f} s{left_out}{note}"
        if not exclude and rows:
            self.directory.mkdir(parents=True, exist_ok=True)
            model.save(path)
            meta_path.write_text(json.dumps({"last_id": rows[-1][0], "records": len(data)}))
        return model, line

    def _from_other_hosts(
        self, source: TrainingSource, target: Target, exclude: set[str], note: str
    ) -> tuple[XGBModel | None, str]:
        """A model fit on the records of `target` measured on other host classes (its own has none), not cached."""
        own, name = target.fingerprint(), target_name(target)
        t0 = time.perf_counter()
        records = [r for _, r in source.training_records(None) if r.host != own and r.target == name]
        data = featurize_records(records, source.workload_dags(), target, exclude, by_host=True)
        if not any(math.isfinite(c) for c in data.costs):
            return None, NOTHING_TO_LEARN
        model = pretrain(data)
        hosts = len({r.host for r in records})
        left_out = f" ({data.skipped} records left out)" if data.skipped else ""
        return model, (
            f"cost model pre-trained on {len(data)} records of {hosts} other host class{'es' if hosts > 1 else ''} "
            f"of {name} in {time.perf_counter() - t0:.1f} s (none measured on this one yet; not cached){left_out}{note}"
        )


def default_cache_dir() -> Path:
    import os

    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "tilefarm"


def _feature_code() -> str:
    """A digest of the feature extractor's source: a model trained on other features is not reused."""
    return hashlib.sha256(Path(features.__file__).read_bytes()).hexdigest()[:16]


__all__ = ["ModelCache", "TrainingSet", "TrainingSource", "featurize_records", "pretrain"]
