"""Records shared across models and teams, on SQLite and on the real PostgreSQL (the `url`/`new_url` fixtures of
tests/conftest.py): `inspect` reports what a database already covers, a model that shares workloads with a tuned
one compiles from their records and tunes only the rest, and JSON-lines export/import carries provenance, adds
nothing the second time and merges two teams' databases keeping every record and the best."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.costs.records import JSONLinesDatabase, TuningRecord, read_records, target_name
from compiler.model.onnx_import import load
from compiler.schedule.state import initial_state
from compiler.search.task_scheduler import coverage
from compiler.targets import host_target
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.tasks import Task, plan_tasks
from server.database import SQLDatabase, this_host
from tilefarm.cli import main

TARGET = "llvm -mcpu=test"
TUNE = ["--per-round", "2", "--population", "16", "--threads", "1", "--cost-model", "random", "--no-model-timing"]


def rec(key="w1", host="h1", tile=4, costs=(1.0,), error=None) -> TuningRecord:
    return TuningRecord(key, TARGET, host, (("SP", 0, 0, (tile,), True), ("AN", 0, 1, 3)), costs, error)


def mlp(widths: list[int], seed: int) -> onnx.ModelProto:
    """MatMul+Relu layers on a [4, widths[0]] input: each layer is one tiny task, keyed by its shapes alone."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        inits.append(numpy_helper.from_array(rng.standard_normal((a, b)).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        x = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, widths[0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [4, widths[-1]])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """Model A tuned (4 trials) into a SQLite database, and model B, whose first layer is A's first layer."""
    d = tmp_path_factory.mktemp("tuned")
    a, b = d / "a.onnx", d / "b.onnx"
    onnx.save(mlp([16, 16, 8], seed=0), a)
    onnx.save(mlp([16, 16, 32], seed=1), b)  # other weights: the workload key depends on shapes, not values
    url = f"sqlite:///{d / 'a.db'}"
    assert main(["tune", str(a), "--database", url, "--trials", "4", *TUNE]) == 0
    keys_a, keys_b = ([t.key for t in plan_tasks(load(str(m)))[0]] for m in (a, b))
    assert keys_a[0] == keys_b[0] and keys_a[1] != keys_b[1]
    return a, b, url, keys_b


def inspected(out: str) -> dict[str, tuple[int, int]]:
    """inspect's task rows: workload key -> (records held, trials needed)."""
    rows = [line.split() for line in out.splitlines() if line[:3].strip().isdigit()]
    return {r[1]: (int(r[4]), int(r[6])) for r in rows}


def test_a_model_sharing_workloads_with_a_tuned_one_needs_no_new_trials(tuned, url, tmp_path, capsys):
    a, b, tuned_url, (shared, only_b) = tuned
    here = host_target()
    # the team database receives A's records the way another team's arrive: exported, then imported
    export = tmp_path / "a.jsonl"
    assert main(["records", "export", "--database", tuned_url, "-o", str(export)]) == 0
    assert main(["db", "upgrade", "--database", url]) == 0
    assert main(["records", "import", str(export), "--database", url]) == 0
    assert "4 new records" in capsys.readouterr().out
    with SQLDatabase(url) as db:
        held = len(db.best(shared, target_name(here), k=100))
        shared_records = [r for r in db if r.workload_key == shared]
    assert held >= 1  # the default schedule is measured in every task's first round

    for source in (["--database", url], ["--records", str(export)]):
        assert main(["inspect", str(b), *source, "--trials-per-task", str(held)]) == 0
        out = capsys.readouterr().out
        assert inspected(out) == {shared: (held, 0), only_b: (0, held)}
        assert f"1 of 2 tasks tuned ({held} error-free records each); {held} trials still needed" in out
        assert f"--resume --trials {held}" in out
    assert main(["inspect", str(b), "--database", url]) == 0  # the default budget: 800 per task
    assert inspected(capsys.readouterr().out) == {shared: (held, 800 - held), only_b: (0, 800)}

    # compiling B applies A's best record for the shared task and the default schedule to the other
    art = tmp_path / "b.tar"
    assert main(["compile", str(b), "--database", url, "-o", str(art)]) == 0
    assert "2 tasks (1 from records)" in capsys.readouterr().out
    with tarfile.open(art) as tar:
        meta = json.load(tar.extractfile("meta.json"))
    assert {t["key"]: t["record"] for t in meta["tasks"]} == {shared: True, only_b: False}
    [used] = meta["records"]
    best = min(r.mean_cost for r in shared_records)
    assert used["workload_key"] == shared and used["host"] == here.fingerprint() and used["mean_seconds"] == best

    # tuning B from the database measures only B's own task: the shared one gets no new trial
    tune = ["tune", str(b), "--database", url, "--resume", *TUNE, "--trials", str(held), "--per-round", str(held)]
    assert main(tune) == 0
    assert f"resumed {len(shared_records)} records" in capsys.readouterr().out
    with SQLDatabase(url) as db:
        after = list(db)
    assert [r for r in after if r.workload_key == shared] == shared_records
    assert len([r for r in after if r.workload_key == only_b]) == held and len(after) == 4 + held
    assert main(["inspect", str(b), "--database", url, "--trials-per-task", str(held)]) == 0
    assert inspected(capsys.readouterr().out)[shared] == (held, 0)


def test_coverage_counts_error_free_records_of_this_target_and_host(url, tmp_path):
    A, B = te.placeholder((8, 8), name="A"), te.placeholder((8, 8), name="B")
    dag = ComputeDAG([A, B, ops.matmul(A, B, name="C")])
    task, untouched = Task(dag.workload_key, dag, "matmul8"), Task("0" * 32, dag, "other")
    here = host_target()

    def record(steps, cost, error=None, host=None, target=None):
        line = {"workload_key": task.key, "target": target or target_name(here), "host": host or here.fingerprint()}
        line |= {"steps": steps, "costs": [cost] if cost else [], "error": error}
        return TuningRecord.from_json(json.dumps(line))

    default = [s.record() for s in default_schedule(dag).steps]
    naive = [s.record() for s in initial_state(dag).steps]
    records = [
        record(naive, 3e-3),
        record(default, 2e-3),
        record([["SP", 99, 0, [4], True]], 1e-3),  # fastest, but no longer replays: compile would skip it
        record([["SP", 98, 0, [4], True]], None, error="run"),
        record(default, 1e-4, host="elsewhere"),  # another machine class's timing is not valid here
        record([["SP", 97, 0, [4], True]], 1e-4, target="llvm -mcpu=other"),
    ]
    with SQLDatabase(url, upgrade_schema=True) as sql:
        sql.import_records(records)
        for db in (sql, JSONLinesDatabase(tmp_path / "records.jsonl")):
            db.import_records(records)
            got = coverage([task, untouched], db, here, trials_per_task=5)
            assert [(c.valid, c.trials_needed) for c in got] == [(3, 2), (0, 5)]
            assert got[0].best == records[1] and got[1].best is None
            got = coverage([task], db, here, trials_per_task=2)
            assert [(c.valid, c.trials_needed, c.best) for c in got] == [(2, 0, records[1])]


def test_export_carries_provenance_and_imports_exactly(new_url, tmp_path):
    here, path, again = this_host(), tmp_path / "x.jsonl", tmp_path / "y.jsonl"
    records = [rec(host=here, costs=(1e-3, 2e-3)), rec(host=here, tile=8, costs=(), error="build"), rec(host="h2")]
    with SQLDatabase(new_url(), upgrade_schema=True, created_by="ana") as src:
        src.import_records(records)
        assert src.export(path) == 3
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["provenance"]["created_by"] == "ana"
    assert lines[0]["provenance"]["host"]["cpu_model"] == host_target().cpu_model
    assert lines[0]["provenance"]["host"]["tilefarm_version"] == records[0].version
    assert "host" not in lines[1]["provenance"]  # a host's details travel once, on its first line
    assert "host" not in lines[2]["provenance"]  # nothing is known about h2 but its fingerprint
    assert list(read_records(path)) == records  # an export is a plain records file too
    with SQLDatabase(new_url(), upgrade_schema=True, created_by="bo") as dst:
        assert dst.import_file(path) == 3 and dst.import_file(path) == 0
        assert list(dst) == records
        dst.export(again)
    assert again.read_text() == path.read_text()  # who measured and where survive a second hop

    # another team's host details arrive with their records and travel on from here (what does not fit is dropped)
    host = {"cpu_model": "Team B Xeon", "cores": 64, "l2_bytes": "1M", "mcpu": "x" * 65, "not_a_column": 1}
    lines[2]["provenance"]["host"] = host
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with SQLDatabase(new_url(), upgrade_schema=True) as dst:
        assert dst.import_file(path) == 3
        dst.export(again)
    hosts = {d["host"]: d["provenance"].get("host") for d in map(json.loads, again.read_text().splitlines())}
    assert hosts["h2"] == {"cpu_model": "Team B Xeon", "cores": 64}


def test_merging_two_teams_keeps_every_record_and_the_best(new_url, tmp_path, capsys):
    team_a = [rec(tile=2, costs=(2.0,)), rec(tile=8, costs=(3.0,)), rec(host="h2", costs=(5.0,))]
    team_b = [
        rec(tile=4, costs=(1.0,)),  # faster than anything team A measured on h1
        rec(tile=8, costs=(3.5,)),  # the schedule team A measured too: one record
        rec(tile=16, costs=(), error="run"),
        rec(key="w2", host="h2", costs=(4.0,)),
    ]
    urls = {}
    for team, records in (("a", team_a), ("b", team_b)):
        urls[team] = new_url()
        assert main(["db", "upgrade", "--database", urls[team]]) == 0
        with SQLDatabase(urls[team]) as db:
            db.import_records(records)
        assert main(["records", "export", "--database", urls[team], "-o", str(tmp_path / f"{team}.jsonl")]) == 0
    for _ in range(2):  # the second import adds nothing
        assert main(["records", "import", str(tmp_path / "b.jsonl"), "--database", urls["a"]]) == 0
    assert [line.split(": ")[-1] for line in capsys.readouterr().out.splitlines()[-2:]] == [
        "3 new records",
        "0 new records",
    ]
    with SQLDatabase(urls["a"]) as merged:
        assert list(merged) == team_a + [team_b[0], *team_b[2:]]
        assert [r.mean_cost for r in merged.best("w1", TARGET, "h1", k=9)] == [1.0, 2.0, 3.0]
        assert merged.best("w1", TARGET, "h2") == [team_a[2]] and merged.best("w2", TARGET, "h2") == [team_b[3]]
    best = tmp_path / "best.jsonl"
    assert main(["records", "export", "--database", urls["a"], "-o", str(best), "--best-only"]) == 0
    assert list(read_records(best)) == [team_a[2], team_b[0], team_b[3]]  # one per workload, target, host; by id
    # the other way round: the same records, the same best
    assert main(["records", "import", str(tmp_path / "a.jsonl"), "--database", urls["b"]]) == 0
    with SQLDatabase(urls["b"]) as other:
        assert {r.identity for r in other} == {r.identity for r in SQLDatabase(urls["a"])}
        assert other.best("w1", TARGET, "h1") == [team_b[0]]


def test_records_files_export_import_and_errors(tmp_path, capsys):
    src, team, best = tmp_path / "src.jsonl", tmp_path / "team.jsonl", tmp_path / "best.jsonl"
    JSONLinesDatabase(src).import_records([rec(tile=2, costs=(2.0,)), rec(tile=4, costs=(1.0,)), rec(key="w2")])
    for _ in range(2):
        assert main(["records", "import", str(src), "--records", str(team)]) == 0
    assert capsys.readouterr().out.split("\n")[:2] == [f"imported {src} into {team}: {n} new records" for n in (3, 0)]
    assert main(["records", "export", "--records", str(team), "-o", str(best), "--best-only"]) == 0
    assert [r.costs for r in read_records(best)] == [(1.0,), (1.0,)]
    with pytest.raises(SystemExit, match="no such records file"):
        main(["records", "import", str(tmp_path / "missing.jsonl"), "--records", str(team)])
    with pytest.raises(SystemExit, match="no such records file"):
        main(["records", "export", "--records", str(tmp_path / "missing.jsonl"), "-o", str(best)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(src.read_text() + '{"workload_key": "w3"}\n')
    assert main(["records", "import", str(bad), "--database", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    assert f"{bad}:4: not a tuning record" in capsys.readouterr().err
