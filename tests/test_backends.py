"""The target seam: a target kind is chosen from compiler.targets.BACKENDS by its name, and the search, the task
scheduler and the build reach the hardware only through that kind's backend. A second kind that does what the CPU's
does, noting each part asked of it, tunes and builds a model with every target-specific step going through it."""

from __future__ import annotations

import tarfile
from dataclasses import replace

import numpy as np
import pytest

from compiler.artifact.build import build
from compiler.artifact.runtime import Artifact
from compiler.base.errors import InvalidTarget
from compiler.costs.cost_model import RandomModel
from compiler.costs.records import JSONLinesDatabase
from compiler.model.onnx_import import load
from compiler.search.evolution import SearchParams
from compiler.search.task_scheduler import TaskScheduler, TuneOptions
from compiler.targets import BACKENDS, backend_for, cpu, host_target
from compiler.tensor.tasks import plan_tasks
from tilefarm.examples import tiny_cnn


class Noting:
    """A backend of kind "noting": the CPU backend's parts, each call noted by name."""

    kind = "noting"
    alignment, library_env = cpu.BACKEND.alignment, cpu.BACKEND.library_env

    def __init__(self):
        self.calls: list[str] = []

    def host(self):
        return replace(cpu.BACKEND.host(), kind=self.kind)

    def __getattr__(self, name):
        part = getattr(cpu.BACKEND, name)

        def noted(*args, **kwargs):
            self.calls.append(name)
            return part(*args, **kwargs)

        return noted


@pytest.fixture
def noting(monkeypatch):
    backend = Noting()
    monkeypatch.setitem(BACKENDS, "noting", backend)
    return backend


def test_a_kind_is_chosen_by_name_and_an_unknown_one_is_named():
    assert backend_for(host_target()) is BACKENDS["cpu"] and backend_for("cpu") is cpu.BACKEND
    with pytest.raises(InvalidTarget, match="no backend for target kind 'gpu'; the kinds are cpu"):
        backend_for(replace(host_target(), kind="gpu"))


def test_a_second_kind_tunes_and_builds_through_its_backend_alone(noting, tmp_path):
    model = tiny_cnn()
    graph = load(model)
    tasks, _, _ = plan_tasks(graph)
    target = noting.host()
    # the kind is part of the host fingerprint: records of one kind never stand for another's
    assert target.fingerprint() != host_target().fingerprint()

    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    options = TuneOptions(trials=2 * len(tasks), measures_per_round=2, params=SearchParams(population=16, num_iters=1))
    TaskScheduler(tasks, db, options, model=RandomModel(0), target=target).run()
    records = list(db)
    assert records and {r.host for r in records} == {target.fingerprint()}
    assert any(r.error is None for r in records)
    # its search space drew the candidates; its builder and runner measured them; its default schedule came first
    assert {"search_space", "builder", "runner", "default_schedule"} <= set(noting.calls)

    noting.calls.clear()
    info = build(graph, tmp_path / "m.tar", records=db, target=target)
    assert info.records_used, "the build applied the records tuned for this kind"
    assert {"scratch_bytes", "link_artifact"} <= set(noting.calls)
    with tarfile.open(tmp_path / "m.tar") as tar:
        assert {"meta.json", "model.so", "model.h"} <= set(tar.getnames())
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    name = model.graph.input[0].name
    ours = Artifact.load(tmp_path / "m.tar").run({name: x})
    reference = Artifact.load(_cpu_build(graph, tmp_path)).run({name: x})
    for k, v in reference.items():
        np.testing.assert_allclose(ours[k], v, rtol=1e-4, atol=1e-4)


def _cpu_build(graph, tmp_path):
    path = tmp_path / "cpu.tar"
    build(graph, path)
    return path
