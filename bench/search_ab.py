"""A/B of one switch of the search (a boolean SearchParams field) over several seeds, on one tuning workload.

    python -m bench.search_ab --switch register_tiles [--workload gemm_1024] [--trials 256] [--threads 1]
                              [--seeds 0,1,2] [--records-dir DIR] [--json rows.json]

One tuning run lands anywhere in a range (AVX2 GEMM 1024, 256 trials, three runs on a Zen 4: 21.2-26.2 ms), so a
change to the search is judged over seeds: for each seed it tunes from scratch with the switch off and on (in
alternating order, so neither arm always meets the host's slower minutes first). Then every run's best program is
compiled in one fresh process and timed side by side with the others and numpy/OpenBLAS (GEMMs) or onnxruntime
(interleaved samples, medians, as bench.kernels does), in three such processes: on a host whose speed moves by a
third between processes (OpenBLAS's AVX2 GEMM 1024 on an Emerald Rapids VM: 28.6-38.6 ms), runs timed in separate
processes compare the minutes they were timed in, side by side they compare the programs. It prints per run the
tuner's best, the median over the processes of its time relative to the reference, and how many of its measured
programs had a register block that does not fit in the target's vector registers, auto-unrolled tile levels included
(annotate.RegisterFile).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

from bench.kernels import ALTERNATIVE_WORKLOADS, TUNING_WORKLOADS, fair_openblas_env, onnx_session, tuning_workload
from bench.timing import best_kernel, best_record, checked, interleaved_with_probe, json_from_process
from bench.tuning import _tune
from compiler.base.arrays import aligned
from compiler.costs.records import JSONLinesDatabase
from compiler.search.evolution import SearchParams
from compiler.targets import host_target
from compiler.targets.cpu.annotate import Decisions, RegisterFile, materialize
from compiler.targets.cpu.sketch import generate_sketches
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.tasks import Task

PROCESSES = 3  # fresh timing processes
SWITCHES = tuple(f.name for f in dataclasses.fields(SearchParams) if f.type in ("bool", bool))


def over_budget(dag: ComputeDAG, path: Path) -> tuple[int, int]:
    """(measured programs of the search whose register block does not fit in this host's registers, its innermost
    tile or with the tile levels auto-unrolling adds (RegisterFile.unrolled_demand), all of them)."""
    target = host_target()
    registers = RegisterFile.of(target, dag.op(dag.outputs[0]).dtype)
    sketches = generate_sketches(dag, target)
    over = total = 0
    for r in JSONLinesDatabase(path):
        if r.trace is None:  # the default schedule
            continue
        total += 1
        sketch, d = sketches[r.trace["sketch"]], Decisions.from_json(r.trace["decisions"])
        over += not registers.fits(sketch, d.tiles) or not registers.unrolled_fits(sketch, materialize(sketch, d))
    return over, total


def time_side_by_side(name: str, records: dict[str, Path], threads: int, repeat: int) -> dict:
    """In this process: each records file's best program compiled, checked against the reference and timed in turn
    with the others and the reference (and the L3 probe); the medians, as bench.timing gives them."""
    from threadpoolctl import threadpool_limits

    w = tuning_workload(name)
    dag = ComputeDAG([*w.inputs, w.output])
    ref_arrays, arrays = w.arrays()
    ort_fn, ort_result = onnx_session(w, ref_arrays, threads)
    ref = ort_result()
    systems: dict = {}
    for label, path in records.items():
        kernel = best_kernel(dag, path, label)
        out = aligned(np.zeros(w.output.shape, np.float32))
        kernel(*arrays, out)
        checked(f"{label}'s best {name}", out, ref)
        systems[label] = lambda kernel=kernel, out=out: kernel(*arrays, out)
    if name.startswith("gemm"):
        systems["numpy-openblas"] = lambda: np.matmul(arrays[0], arrays[1])
    else:
        systems["onnxruntime"] = ort_fn
    with threadpool_limits(limits=threads, user_api="blas"):
        medians, probe_gbs = interleaved_with_probe(systems, repeat, min_ms=30)
    return {"medians_s": medians, "l3_probe_gbs": probe_gbs}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--time", metavar="WORKLOAD", help="(internal) time LABEL=RECORDS side by side in this process")
    p.add_argument("records", nargs="*", help="(with --time) LABEL=RECORDS.jsonl")
    p.add_argument("--switch", choices=SWITCHES)
    p.add_argument("--workload", default="gemm_1024")
    p.add_argument("--trials", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--population", type=int, default=512)
    p.add_argument("--repeat", type=int, default=7, help="interleaved timing samples per system")
    p.add_argument("--records-dir", default="bench/results/records-ab")
    p.add_argument("--json", help="write the rows here as a JSON list")
    args = p.parse_args(argv)
    if args.time:
        if not all("=" in r for r in args.records):
            p.error("--time takes LABEL=RECORDS.jsonl arguments")
        os.environ["TILEFARM_NUM_THREADS"] = str(args.threads)
        runs = {label: Path(path) for label, path in (r.split("=", 1) for r in args.records)}
        print(json.dumps(time_side_by_side(args.time, runs, args.threads, args.repeat)))
        return
    if args.switch is None:
        p.error("--switch is required")
    (w,) = [w for w in TUNING_WORKLOADS + ALTERNATIVE_WORKLOADS if w.name == args.workload] or [None]
    if w is None:
        p.error(f"--workload: no tuning workload named {args.workload!r}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds: {args.seeds!r} is not a comma-separated list of integers")
    records_dir = Path(args.records_dir)
    records_dir.mkdir(parents=True, exist_ok=True)
    dag = ComputeDAG([*w.inputs, w.output])
    reference = "numpy-openblas" if w.name.startswith("gemm") else "onnxruntime"
    print(f"{w.name}, {args.trials} trials, {args.threads} thread(s), {args.switch} off/on, seeds {args.seeds}")
    runs = []
    for n, seed in enumerate(seeds):
        for on in (False, True) if n % 2 == 0 else (True, False):
            path = records_dir / f"{w.name}-{args.threads}t-{args.switch}-{'on' if on else 'off'}-s{seed}.jsonl"
            params = dataclasses.replace(SearchParams(population=args.population), **{args.switch: on})
            task = Task(dag.workload_key, dag, w.name)
            sched, _ = _tune([task], args.trials, args.threads, path, args.population, False, params=params, seed=seed)
            best = best_record(dag, path)
            over, total = over_budget(dag, path)
            runs.append(
                {
                    "seed": seed,
                    "on": on,
                    "path": path,
                    "tuning_s": sched.stats.wall_s,
                    "tuner_best_ms": best.mean_cost * 1e3,
                    "over_budget": over,
                    "measured": total,
                }
            )
            print(
                f"  seed {seed} {args.switch}={on}: tuning {sched.stats.wall_s:.0f} s, tuner's best "
                f"{best.mean_cost * 1e3:.3f} ms, {over} of {total} measured programs over the register file",
                flush=True,
            )
    print("timing every run's best side by side in fresh processes:")
    labels = [f"s{r['seed']}-{'on' if r['on'] else 'off'}" for r in runs]
    cmd = [sys.executable, "-m", "bench.search_ab", "--time", w.name, "--threads", str(args.threads)]
    cmd += ["--repeat", str(args.repeat), *(f"{label}={r['path']}" for label, r in zip(labels, runs))]
    env = {**os.environ, **fair_openblas_env()}
    timed = [json_from_process(cmd, "side-by-side timing", env) for _ in range(PROCESSES)]
    rows = []
    for label, run in zip(labels, runs):
        ratios = [t["medians_s"][reference] / t["medians_s"][label] for t in timed]
        row = {
            "workload": w.name,
            "switch": args.switch,
            "on": run["on"],
            "seed": run["seed"],
            "threads": args.threads,
            "trials": args.trials,
            "tuning_s": round(run["tuning_s"], 1),
            "tuner_best_ms": round(run["tuner_best_ms"], 4),
            "median_ms": round(statistics.median(t["medians_s"][label] for t in timed) * 1e3, 4),
            f"{reference}_ms": [round(t["medians_s"][reference] * 1e3, 4) for t in timed],
            "ratio": round(statistics.median(ratios), 3),
            "ratios": [round(r, 3) for r in ratios],
            "over_budget": run["over_budget"],
            "measured": run["measured"],
        }
        rows.append(row)
        print(
            f"  seed {row['seed']} {args.switch}={row['on']}: {row['median_ms']:.3f} ms, {row['ratio']:.2f}x "
            f"{reference} (processes: {', '.join(f'{r:.2f}' for r in ratios)})",
            flush=True,
        )
    refs = ", ".join(f"{t['medians_s'][reference] * 1e3:.2f}" for t in timed)
    print(f"  {reference}: {refs} ms; L3 probe {', '.join(str(t['l3_probe_gbs']) for t in timed)} GB/s")
    for on in (False, True):
        arm = [r for r in rows if r["on"] == on]
        ratios = ", ".join(f"{r['ratio']:.2f}" for r in arm)
        print(
            f"{args.switch}={on}: ratio to {reference} median {statistics.median(r['ratio'] for r in arm):.2f}x "
            f"(runs {ratios}), tuning median {statistics.median(r['tuning_s'] for r in arm):.0f} s, programs over "
            f"the register file {sum(r['over_budget'] for r in arm)} of {sum(r['measured'] for r in arm)}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
