"""A/B of one switch of the search (a boolean SearchParams field) over several seeds, on one tuning workload.

    python -m bench.search_ab --switch register_tiles [--workload gemm_1024] [--trials 256] [--threads 1]
                              [--seeds 0,1,2] [--records-dir DIR] [--json rows.json]

One tuning run lands anywhere in a range (AVX2 GEMM 1024, 256 trials, three runs on a Zen 4: 21.2-26.2 ms), so a
change to the search is judged over seeds: for each seed it tunes from scratch with the switch off and on (in
alternating order, so neither arm always meets the host's slower minutes first), then times every run's best
program in fresh processes next to numpy/OpenBLAS and onnxruntime (bench.timing, as bench.tuning does) and prints
per run the tuner's best, the fresh median, the ratio to OpenBLAS (GEMMs) or onnxruntime, and how many of its
measured programs had a register block that does not fit in the target's vector registers (annotate.RegisterFile).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from bench.kernels import ALTERNATIVE_WORKLOADS, TUNING_WORKLOADS
from bench.timing import in_fresh_process
from bench.tuning import _tune
from compiler import dtypes
from compiler.annotate import Decisions, RegisterFile
from compiler.dag import ComputeDAG
from compiler.records import JSONLinesDatabase
from compiler.search import SearchParams
from compiler.sketch import generate_sketches
from compiler.target import Target
from compiler.tasks import Task

SWITCHES = tuple(f.name for f in dataclasses.fields(SearchParams) if f.type in ("bool", bool))


def over_budget(dag: ComputeDAG, path: Path) -> tuple[int, int]:
    """(measured programs of the search whose register block does not fit in this host's registers, all of them)."""
    target = Target.host()
    lanes = target.vector_bytes // dtypes.itemsize(dag.op(dag.outputs[0]).dtype)
    registers, sketches = RegisterFile(target.vector_registers, lanes), generate_sketches(dag, target)
    over = total = 0
    for r in JSONLinesDatabase(path):
        if r.trace is None:  # the default schedule
            continue
        total += 1
        over += not registers.fits(sketches[r.trace["sketch"]], Decisions.from_json(r.trace["decisions"]).tiles)
    return over, total


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--switch", required=True, choices=SWITCHES)
    p.add_argument("--workload", default="gemm_1024")
    p.add_argument("--trials", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--population", type=int, default=512)
    p.add_argument("--repeat", type=int, default=7, help="interleaved timing samples per system")
    p.add_argument("--records-dir", default="bench/results/records-ab")
    p.add_argument("--json", help="write the rows here as a JSON list")
    args = p.parse_args(argv)
    (w,) = [w for w in TUNING_WORKLOADS + ALTERNATIVE_WORKLOADS if w.name == args.workload] or [None]
    if w is None:
        p.error(f"--workload: no tuning workload named {args.workload!r}")
    records_dir = Path(args.records_dir)
    records_dir.mkdir(parents=True, exist_ok=True)
    dag = ComputeDAG([*w.inputs, w.output])
    reference = "numpy-openblas" if w.name.startswith("gemm") else "onnxruntime"
    print(f"{w.name}, {args.trials} trials, {args.threads} thread(s), {args.switch} off/on, seeds {args.seeds}")
    runs = []
    for n, seed in enumerate(int(s) for s in args.seeds.split(",")):
        for on in (False, True) if n % 2 == 0 else (True, False):
            path = records_dir / f"{w.name}-{args.threads}t-{args.switch}-{'on' if on else 'off'}-s{seed}.jsonl"
            params = dataclasses.replace(SearchParams(population=args.population), **{args.switch: on})
            task = Task(dag.workload_key, dag, w.name)
            sched, _ = _tune([task], args.trials, args.threads, path, args.population, False, params=params, seed=seed)
            best = JSONLinesDatabase(path).best(dag.workload_key, next(iter(JSONLinesDatabase(path))).target, k=1)[0]
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
    print("timing every run's best in fresh processes:")
    rows = []
    for run in runs:
        timed = in_fresh_process("kernel", w.name, run["path"], args.threads, args.repeat)
        med = timed["medians_s"]
        ratio = med[reference] / med["tilefarm-tuned"]
        row = {
            "workload": w.name,
            "switch": args.switch,
            "on": run["on"],
            "seed": run["seed"],
            "threads": args.threads,
            "trials": args.trials,
            "tuning_s": round(run["tuning_s"], 1),
            "tuner_best_ms": round(run["tuner_best_ms"], 4),
            "median_ms": round(med["tilefarm-tuned"] * 1e3, 4),
            f"{reference}_ms": round(med[reference] * 1e3, 4),
            "ratio": round(ratio, 3),
            "over_budget": run["over_budget"],
            "measured": run["measured"],
            "l3_probe_gbs": timed["l3_probe_gbs"],
        }
        rows.append(row)
        print(
            f"  seed {row['seed']} {args.switch}={row['on']}: {row['median_ms']:.3f} ms against {reference} "
            f"{row[f'{reference}_ms']:.3f} ms: {ratio:.2f}x (L3 probe {timed['l3_probe_gbs']} GB/s)",
            flush=True,
        )
    for on in (False, True):
        arm = [r for r in rows if r["on"] == on]
        ratios = ", ".join(f"{r['ratio']:.2f}" for r in arm)
        print(
            f"{args.switch}={on}: ratio to {reference} median {statistics.median(r['ratio'] for r in arm):.2f}x "
            f"(runs {ratios}), tuning median "
            f"{statistics.median(r['tuning_s'] for r in arm):.0f} s, programs over the register file "
            f"{sum(r['over_budget'] for r in arm)} of {sum(r['measured'] for r in arm)}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
