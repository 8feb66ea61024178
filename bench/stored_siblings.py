"""Sibling workloads across models: does a task start faster when the team database holds its sibling, tuned for
another model (TaskScheduler.seed_from_stored_siblings)?

    python -m bench.stored_siblings RECORDS.jsonl [--task 3] [--trials 64] [--seeds 0,1] [--threads 1]
                                    [--timed-as cold-weights] [--json rows.json]

RECORDS is a ResNet-18 tuning run's records file (`python -m bench.tuning --only resnet18 --records-dir D` writes
D/resnet18-1t.jsonl). For each seed, task `--task` of ResNet-18 is tuned for `--trials` trials against a fresh
SQLite team database that holds every other task's records (its own removed, so what it finds is its own work
or its siblings'), once with sibling sharing and once without. The runner times weights as `tilefarm tune --weights
auto` does on this host, and only records of that cache condition seed. Printed per run: the programs taken from
stored siblings and the task's best latency after each round.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from compiler.costs.cost_model import XGBModel
from compiler.costs.records import CACHE_CONDITIONS, read_record_lines
from compiler.model.onnx_import import load
from compiler.search.task_scheduler import TaskScheduler, TuneOptions, weights_timed_cold
from compiler.targets import host_target
from compiler.targets.cpu.runner import LocalBuilder, LocalRunner
from compiler.tensor.tasks import plan_tasks
from server.database import SQLDatabase
from tilefarm.examples import resnet18


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.stored_siblings", description=__doc__.split("\n\n")[0])
    ap.add_argument("records", help="records of a ResNet-18 tuning run (JSON lines)")
    ap.add_argument("--task", type=int, default=3, help="ResNet-18 task to tune (3: layer1's conv + add + ReLU)")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--per-round", type=int, default=16)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--timed-as",
        choices=CACHE_CONDITIONS,
        help="the cache condition of the file's records that do not name one (written before records carried it)",
    )
    ap.add_argument("--json", help="write the result rows here")
    args = ap.parse_args(argv)

    tasks, calls, _ = plan_tasks(load(resnet18()))
    task = tasks[args.task]
    cold = weights_timed_cold("auto", calls, host_target().l3_bytes)
    others = []
    for r, line in read_record_lines(args.records):
        if args.timed_as and "cache" not in json.loads(line):
            r = replace(r, cache=args.timed_as)
        if r.workload_key != task.key:
            others.append(r)
    print(
        f"task {args.task} {task.name} ({task.flop_count / 1e6:.1f} MFLOP), weights timed {'cold' if cold else 'warm'};"
    )
    print(f"the team database holds {len(others)} records of the other tasks")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, LocalBuilder() as builder:
        with LocalRunner(repeat=1, threads=args.threads, cold_constants=cold) as runner:
            for seed in [int(s) for s in args.seeds.split(",")]:
                for share in (True, False):
                    with SQLDatabase(f"sqlite:///{Path(tmp) / f'{seed}-{share}.db'}", upgrade_schema=True) as db:
                        db.describe_workloads(tasks)
                        db.import_records(others)
                        opts = TuneOptions(
                            trials=args.trials, measures_per_round=args.per_round, share_siblings=share, seed=seed
                        )
                        model = XGBModel(seed=seed)
                        sched = TaskScheduler([task], db, opts, model=model, builder=builder, runner=runner)
                        taken = sched.seed_from_stored_siblings()  # run() would do it first otherwise
                        sched.run()
                    p = sched.progress[0]
                    curve = " ".join(f"{h * 1e3:.3f}" for h in p.history)
                    label = "with siblings" if share else "alone        "
                    print(f"seed {seed} {label}: {taken} stored programs taken; best after each round (ms): {curve}")
                    rows.append(
                        {
                            "task": task.name,
                            "seed": seed,
                            "share_siblings": share,
                            "stored_taken": taken,
                            "trials": p.trials,
                            "best_ms": p.best * 1e3,
                            "history_ms": [h * 1e3 for h in p.history],
                        }
                    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
