"""Tuning benchmark: the auto-scheduler against numpy/OpenBLAS and onnxruntime (and optionally TVM MetaSchedule),
measured in one run.

    python -m bench.tuning [--threads 1,2] [--trials 1000] [--model-trials 3000] [--only gemm_512] [--with-tvm]
                           [--json rows.json] [--records-dir DIR]

For each kernel (GEMM 512³ and 1024³, ResNet-18's three 3×3 conv layers) and each thread count it tunes from
scratch (records in DIR/<workload>-<threads>t.jsonl), then times the best program next to numpy and onnxruntime in
a fresh process (bench.timing: interleaved samples, medians, as bench.kernels does) and prints trials, tuning wall
time, latency and GFLOP/s, the share of tuning time spent in search, build, run and training, candidates scored per
second, and the cost model's pairwise ranking accuracy on held-out measurements of the task.
`resnet18` tunes every task of the model with the model budget and compares the compiled artifact end to end.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.kernels import ALTERNATIVE_WORKLOADS, L3_PROBE_BYTES, TUNING_WORKLOADS, Workload
from bench.timing import in_fresh_process
from compiler.costs.cost_model import XGBModel, pairwise_accuracy
from compiler.costs.features import extract
from compiler.costs.records import JSONLinesDatabase, TuningRecord
from compiler.model.passes import describe_forms
from compiler.schedule.state import apply_steps, step_from_record
from compiler.search.evolution import SearchParams
from compiler.search.task_scheduler import TaskScheduler, TuneOptions, replay_input, weights_timed_cold
from compiler.targets import host_target
from compiler.targets.cpu.runner import LocalBuilder, LocalRunner
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.tasks import CONV_FORM_MODES, WEIGHT_MODES, FormChoice, Task, constant_bytes

HELD_OUT_AFTER = 512


def _tune(
    tasks: list[Task],
    trials: int,
    threads: int,
    path: Path,
    population: int,
    resume: bool,
    cache_flush: bool = False,
    share_siblings: bool = True,
    cold_constants: bool = False,
    choices: Sequence[FormChoice] = (),
    params: SearchParams | None = None,
    seed: int = 0,
    graph=None,
) -> tuple[TaskScheduler, float]:
    """The scheduler after tuning, and the wall time of the earlier tuning it resumed (0 if none); `params` replace
    the search's defaults (population `population`), `seed` seeds the search and the cost model; with the model's
    `graph`, the model is compiled and timed while it is tuned, as `tilefarm tune` does (compiler.artifact.in_model)."""

    if not resume:
        path.unlink(missing_ok=True)
    db = JSONLinesDatabase(path)
    rounds, start = [0], time.perf_counter()

    def progress(s: TaskScheduler) -> None:
        rounds[0] += 1
        if rounds[0] % 4 == 0:
            elapsed = time.perf_counter() - start
            print(f"    {s.stats.trials} trials, {elapsed:.0f} s, est. {s.estimated_latency * 1e3:.3f} ms", flush=True)

    params = params or SearchParams(population=population)
    opts = TuneOptions(trials=trials, params=params, share_siblings=share_siblings, seed=seed)
    # with cache flushing a sample is one call, so take several; without, one sample of >= 100 ms of calls
    runner = LocalRunner(
        repeat=5 if cache_flush else 1, threads=threads, cache_flush=cache_flush, cold_constants=cold_constants
    )
    with LocalBuilder() as builder, runner:
        t0 = time.perf_counter()
        timer = None
        if graph is not None:
            from compiler.artifact.in_model import time_in_model

            def timer(rounds: int, untuned: bool = False):
                return time_in_model(graph, None if untuned else db, threads=threads, rounds=rounds)

        sched = TaskScheduler(
            tasks, db, opts, builder=builder, runner=runner, callback=progress, choices=choices, model_timer=timer
        )
        prior_s = 0.0
        if resume:
            stamps = [r.timestamp for r in db]
            prior_s = max(stamps) - min(stamps) if stamps else 0.0
            print(f"    resumed {sched.resume()} records ({prior_s:.0f} s of earlier tuning)")
        sched.run()
        # a resumed run reports the whole tuning: earlier trials and wall time (first to last record) included
        sched.stats.wall_s = time.perf_counter() - t0 + prior_s
        sched.stats.trials += sched.resumed
    return sched, prior_s


def _report_search(sched: TaskScheduler, prior_s: float) -> dict:
    st = sched.stats
    scored = sum(p.policy.stats.scored for p in sched.progress)
    twins = sum(p.policy.stats.twins for p in sched.progress)
    search_s = sum(p.policy.stats.seconds for p in sched.progress)
    this_run = max(st.wall_s - prior_s, 1e-9)  # shares of this run's time, not resumed
    shares = {k: getattr(st, f"{k}_s") / this_run for k in ("search", "build", "run", "train")}
    errors = ", ".join(f"{k} {v}" for k, v in sorted(st.errors.items())) or "none"
    print(
        f"    tuning {st.wall_s:.0f} s: search {shares['search']:.0%}, build {shares['build']:.0%}, "
        f"run {shares['run']:.0%}, train {shares['train']:.0%}; {scored / max(search_s, 1e-9):.0f} candidates "
        f"scored/s; {twins} twins of measured programs skipped; {st.confirmed} new bests timed twice; "
        f"{st.retimed} timings of the fastest at the end; errors: {errors}"
    )
    return {
        "search_share": round(shares["search"], 3),
        "scored_per_s": round(scored / max(search_s, 1e-9), 1),
        "twins_skipped": twins,
    }


def held_out_accuracy(
    task: Task, records: list[TuningRecord], first: int = HELD_OUT_AFTER, retime_threads: int | None = None
) -> dict | None:
    """Pairwise ranking accuracy of a cost model trained on `first` of the task's measurements and tested on the
    others: "later" trains on the first ones and tests on those measured after them (what the search faces: the
    later programs crowd near the best, where timing noise decides many pairs); "random" splits at random. The
    same for Ansor's regression objective under "regression_later" and "regression_random".

    With `retime_threads`, the random split's test programs are timed once more (in another order), which gives
    "repeatability", how often the second timing orders a pair as the first did; "timing_vs_truth", how often one
    timing then orders a pair as the programs' true speeds do, were each pair's two timings independent coin flips
    around the truth (r = q² + (1 - q)², so q = (1 + √(2r - 1)) / 2): about what a model that knew the true speeds
    would score against one timing's labels; and "random_two_timings", the model's accuracy against the mean of
    both timings."""
    recs = [r for r in records if r.workload_key == task.key]
    if len(recs) <= first + 16:
        return None
    xs = [extract(apply_steps(task.dag, [step_from_record(s) for s in r.steps])) for r in recs]
    costs = [r.mean_cost for r in recs]

    def scores(train: list[int], test: list[int], objective: str) -> list[float]:
        model = XGBModel(num_warmup=0, objective=objective)
        model.update([xs[i] for i in train], [costs[i] for i in train], [task.key] * len(train))
        return list(model.predict([xs[i] for i in test]))

    def accuracy(train: list[int], test: list[int], objective: str) -> float:
        test = [i for i in test if np.isfinite(costs[i])]
        return pairwise_accuracy(scores(train, test, objective), [costs[i] for i in test])

    order = np.random.default_rng(0).permutation(len(recs)).tolist()
    out = {}
    for objective, prefix in (("pairwise", ""), ("regression", "regression_")):
        out[f"{prefix}later"] = round(accuracy(list(range(first)), list(range(first, len(recs))), objective), 3)
        out[f"{prefix}random"] = round(accuracy(order[:first], order[first:], objective), 3)
    if retime_threads is not None:
        test = [i for i in order[first:] if np.isfinite(costs[i])]
        again = dict(zip(test, _time_again(task, [recs[i] for i in test], retime_threads)))
        test = [i for i in test if np.isfinite(again[i])]
        r = pairwise_accuracy([-again[i] for i in test], [costs[i] for i in test])
        out["repeatability"] = round(r, 3)
        out["timing_vs_truth"] = round((1 + math.sqrt(max(2 * r - 1, 0.0))) / 2, 3)
        two = [(costs[i] + again[i]) / 2 for i in test]
        out["random_two_timings"] = round(pairwise_accuracy(scores(order[:first], test, "pairwise"), two), 3)
    return out


def _time_again(task: Task, records: list[TuningRecord], threads: int) -> list[float]:
    """Each record's program built and timed once more as the tuner timed it, in a shuffled order: its cost in
    seconds (inf where it fails now, or where this version cannot replay it)."""
    inputs = [replay_input(task, r) for r in records]
    order = [k for k in np.random.default_rng(1).permutation(len(inputs)).tolist() if inputs[k] is not None]
    with LocalBuilder() as builder, LocalRunner(repeat=1, threads=threads) as runner:
        builds = builder.build([inputs[k] for k in order])
        results = runner.run([inputs[k] for k in order], builds)
    again = [float("inf")] * len(inputs)
    for k, res in zip(order, results):
        again[k] = res.mean_cost
    return again


def run_kernel(w: Workload, threads: int, args, rows: list[dict]) -> None:
    dag = ComputeDAG([*w.inputs, w.output])
    task = Task(dag.workload_key, dag, w.name)
    path = Path(args.records_dir) / f"{w.name}-{threads}t.jsonl"
    print(f"  {threads} thr: tuning {args.trials} trials -> {path}")
    sched, prior_s = _tune([task], args.trials, threads, path, args.population, args.resume)
    extra = _report_search(sched, prior_s)
    db = JSONLinesDatabase(path)
    acc = held_out_accuracy(task, list(db), retime_threads=threads)
    if acc is not None:
        print(
            f"    cost model pairwise accuracy, trained on {HELD_OUT_AFTER} programs, on the other "
            f"{len(db) - HELD_OUT_AFTER}: {acc['random']:.3f} (random split), {acc['later']:.3f} (measured later); "
            f"with Ansor's regression objective {acc['regression_random']:.3f}, {acc['regression_later']:.3f}\n"
            f"    the random split's programs timed again: the second timing orders {acc['repeatability']:.3f} of "
            f"their pairs as the first did, so one timing about {acc['timing_vs_truth']:.3f} as their true speeds "
            f"(what a model knowing them would score); the model {acc['random_two_timings']:.3f} against the mean "
            "of both timings"
        )
    timed = in_fresh_process("kernel", w.name, path, threads, args.repeat)
    medians = timed["medians_s"]
    if "numpy-openblas" in medians:
        print(f"    BLAS in the timing process: {timed['blas']}")
    for system, sec in sorted(medians.items()):
        tuned = system == "tilefarm-tuned"
        row = {
            "workload": w.name,
            "system": system,
            "threads": threads,
            "trials": sched.stats.trials if tuned else None,
            "tuning_s": round(sched.stats.wall_s, 1) if tuned else None,
            "median_ms": round(sec * 1e3, 4),
            "gflops": round(w.flop_count(dag) / sec / 1e9, 2),
        }
        if tuned:
            row.update(extra, pairwise_accuracy=acc, l3_probe_gbs=timed["l3_probe_gbs"])
        rows.append(row)
        gflops = f"{row['gflops']:8.1f} GFLOP/s"
        print(f"    {system:15s} {row['median_ms']:9.3f} ms {gflops}  ({_per_process(timed, system)})")
    print(_probe_line(timed))
    for ref in ("numpy-openblas", "onnxruntime"):
        if ref in medians:
            print(f"    tuned / {ref}: speed ratio {medians[ref] / medians['tilefarm-tuned']:.2f}")
    if args.with_tvm:
        _tvm(w.name, threads, args.trials, rows)


def _per_process(timed: dict, system: str) -> str:
    return "processes: " + " / ".join(f"{r[system] * 1e3:.3f}" for r in timed["runs"])


def _probe_line(timed: dict) -> str:
    """The L3 probe's GB/s in each timing process: a low figure marks a process timed while other tenants used the
    shared L3 (bench.kernels.l3_probe)."""
    rates = " / ".join(f"{g:.0f}" for g in timed["l3_probe_gbs"])
    return f"    L3 probe ({L3_PROBE_BYTES >> 20} MiB copy, timed in turn): {rates} GB/s"


def _tvm(workload: str, threads: int, trials: int, rows: list[dict]) -> None:
    from bench import tvm_metaschedule

    why = tvm_metaschedule.available()
    if why:
        print(f"    tvm-metaschedule: skipped ({why})")
        return
    row = tvm_metaschedule.tune(workload, threads, trials)
    rows.append(row)
    if row.get("error"):
        print(f"    tvm-metaschedule: failed: {row['error']}")
    else:
        print(
            f"    tvm-metaschedule {row['median_ms']:9.3f} ms {row['gflops']:8.1f} GFLOP/s "
            f"({row['trials']} trials, {row['tuning_s']:.0f} s tuning)"
        )


def run_resnet18(threads: int, args, rows: list[dict]) -> None:
    from bench.models import batch1_inputs
    from compiler.model.onnx_import import load
    from compiler.tensor.tasks import FORM_MARGIN, tuning_plan
    from tilefarm.examples import EXAMPLES

    model = EXAMPLES["resnet18"](seed=0)
    feeds = batch1_inputs(model)
    graph = load(model, {k: list(v.shape) for k, v in feeds.items()})
    plan = tuning_plan(graph, conv_forms=args.model_conv_forms)
    path = Path(args.records_dir) / f"resnet18-{threads}t.jsonl"
    print(f"  {threads} thr: tuning {len(plan.tasks)} tasks, {args.model_trials} trials -> {path}")
    if plan.choices:
        print(
            f"    and {len(plan.other_forms)} tasks of {len(plan.choices)} convs' other forms "
            f"(compile takes the other form where it is faster by more than {FORM_MARGIN:.0%})"
        )
    flush = args.model_cache_flush
    cold = weights_timed_cold(args.model_weights, plan.calls, host_target().l3_bytes)
    print(f"    weights {constant_bytes(plan.calls) / 2**20:.1f} MiB, timed {'cold' if cold else 'warm'}")
    sched, prior_s = _tune(
        plan.all_tasks,
        args.model_trials,
        threads,
        path,
        args.population,
        args.resume,
        cache_flush=flush,
        share_siblings=not args.no_sibling_sharing,
        cold_constants=cold,
        choices=plan.choices,
        graph=graph,
    )
    print("\n".join("    " + line for line in sched.table().splitlines()))
    extra = _report_search(sched, prior_s)
    timed = in_fresh_process("resnet18", "-", path, threads, args.repeat)
    medians, rel = timed["medians_s"], timed["max_rel_diff"]
    departed = describe_forms(timed["conv_forms"]) or "none"
    print(f"    convs compiled in the other form than the rule's, by the records: {departed}")
    for system, sec in sorted(medians.items()):
        tuned = system == "tilefarm-tuned"
        row = {
            "workload": "resnet18",
            "system": system,
            "threads": threads,
            "trials": sched.stats.trials if tuned else None,
            "tuning_s": round(sched.stats.wall_s, 1) if tuned else None,
            "median_ms": round(sec * 1e3, 4),
            "gflops": None,
        }
        if tuned:
            row.update(extra, l3_probe_gbs=timed["l3_probe_gbs"], conv_forms=timed["conv_forms"])
        rows.append(row)
        print(f"    {system:17s} {row['median_ms']:9.3f} ms  ({_per_process(timed, system)})")
    print(_probe_line(timed))
    print(
        f"    tuned / onnxruntime: speed ratio {medians['onnxruntime'] / medians['tilefarm-tuned']:.2f} "
        f"(max rel diff vs onnxruntime {rel:.1e})"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--trials", type=int, default=1000, help="trials per kernel")
    p.add_argument("--model-trials", type=int, default=3000, help="trials for the whole of ResNet-18")
    p.add_argument("--population", type=int, default=512)
    p.add_argument(
        "--model-cache-flush",
        action="store_true",
        help="tune ResNet-18's tasks with caches flushed before every call (its weights exceed the L3 in a run)",
    )
    p.add_argument(
        "--model-weights",
        choices=WEIGHT_MODES,
        default="auto",
        help="cold: tune ResNet-18's tasks with their weights flushed from the caches before every call (activations "
        "warm); auto (default, as tilefarm tune): cold when the model's weights exceed the last-level cache",
    )
    p.add_argument(
        "--model-conv-forms",
        choices=CONV_FORM_MODES,
        default="measure",
        help="measure (default, as tilefarm tune): tune ResNet-18's 3x3 convs in their other form too (direct or "
        "Winograd) and compile the faster; rule: only the winograd_convs pass's form",
    )
    p.add_argument("--repeat", type=int, default=7, help="interleaved timing samples per system")
    p.add_argument("--only", help="comma-separated workloads to run (gemm_512, conv2d_64x56x56_3x3, resnet18, ...)")
    p.add_argument("--with-tvm", action="store_true", help="also tune with TVM MetaSchedule at the same budget")
    p.add_argument("--records-dir", default="bench/results/records")
    p.add_argument("--resume", action="store_true", help="continue from the records in --records-dir (trials = new)")
    p.add_argument("--json", help="write the rows here as a JSON list")
    p.add_argument(
        "--no-sibling-sharing",
        action="store_true",
        help="tune every task alone (ablation of TuneOptions.share_siblings)",
    )
    args = p.parse_args(argv)
    Path(args.records_dir).mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    # by default the benchmark's workloads; with --only, those named, the alternative forms included
    kernels = (
        TUNING_WORKLOADS if only is None else [w for w in TUNING_WORKLOADS + ALTERNATIVE_WORKLOADS if w.name in only]
    )
    rows: list[dict] = []
    for threads in [int(t) for t in args.threads.split(",")]:
        for w in kernels:
            print(f"{w.name}:")
            run_kernel(w, threads, args, rows)
        if only is None or "resnet18" in only:
            print("resnet18:")
            run_resnet18(threads, args, rows)
        if args.json:  # after every thread count, so a long run leaves its rows behind
            Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
