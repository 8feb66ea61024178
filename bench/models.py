"""Whole-model benchmark: tilefarm against onnxruntime on the example models, batch 1, untuned or tuned as well.

    python -m bench.models [--threads 1,2] [--repeat 7] [--json rows.json] [--only resnet18]
    python -m bench.models --tuned [--trials 1000] [--population 512] [--records-dir DIR] [--threads 1,2] ...

Untuned (default schedules), per model: compile seconds, median latency of both systems from interleaved samples (see
bench.kernels for why), their ratio, and how far tilefarm's outputs are from onnxruntime's. With --disable-pass NAME
(repeatable) a third system, the model compiled without those optional passes (`tilefarm-untuned-without`), is timed
in the same interleaved samples, so a pass's effect is measured under the same load.

With --tuned, per model and thread count: the model's tasks tuned from scratch with a budget of --trials measurements
at that thread count (bench.tuning's `_tune`, with `tilefarm tune`'s defaults: 3x3 convs measured in both forms,
weights timed cold where they outgrow the cache; records in DIR/models-<model>-<threads>t.jsonl), then onnxruntime,
the untuned and the tuned artifact timed in one interleaved call in a fresh process (one that has just tuned times a
model up to 1.7x slow: see bench.timing). It prints the three medians, the speed ratios ort/untuned and ort/tuned
(onnxruntime's latency over tilefarm's: above 1, tilefarm is faster), the task scheduler's estimate of the model's
latency (as `tilefarm tune` prints it: the kernels' best latencies scaled by the whole-model timings taken while
tuning, docs/whole-models.md) and the tuned run's distance from it, trials and tuning seconds. JSON rows: model,
system, threads, trials, tuning_s, median_ms, estimate_ms (None where they do not apply) and, for tilefarm,
max_rel_diff.

By default the models of MODELS; --only NAME runs those whose name contains NAME, or any example by its exact name
(`--only tiny_cnn`). A model the pipeline cannot handle is reported with its error and skipped; the exit status is 1
when any model failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from bench.kernels import interleaved, ort_options
from tilefarm.examples import EXAMPLES

MODELS = ["resnet18", "mobilenetv2", "encoder", "bert"]
MIN_SAMPLE_MS = 100  # whole models run 5-500 ms; one call per sample is enough for the slow ones


class StageFailed(Exception):
    """A pipeline stage raised; carries the stage name so the report says where it broke."""

    def __init__(self, stage: str, error: BaseException):
        super().__init__(f"{stage}: {type(error).__name__}: {error}")


def _stage(stage: str, fn: Callable, *args, **kw):
    try:
        return fn(*args, **kw)
    except Exception as e:  # any compiler error becomes this model's failure, not the run's
        raise StageFailed(stage, e) from e


def _compiler():
    """The pipeline's entry points."""
    from compiler.artifact.build import build
    from compiler.artifact.runtime import Artifact
    from compiler.model.onnx_import import load

    return load, build, Artifact


def batch1_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """A seeded standard-normal array for every graph input, symbolic dims set to 1."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def ort_session(model: onnx.ModelProto, threads: int) -> Callable[[dict], list[np.ndarray]]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), ort_options(threads), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return lambda feeds: dict(zip(names, sess.run(None, feeds)))


def compile_model(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], name: str, folder: Path, records=None, disabled=()
):
    """(loaded artifact, seconds per stage) for `model` compiled with the best of `records` per task (a records
    database), else with default schedules; without the optional passes named in `disabled`."""
    load, build, Artifact = _stage("import", _compiler)
    t0 = time.perf_counter()
    graph = _stage("onnx_frontend.load", load, model, input_shapes={k: list(v.shape) for k, v in feeds.items()})
    t1 = time.perf_counter()
    path = folder / f"{name}.tar"
    _stage("build", build, graph, path, name=name, records=records, disabled_passes=disabled)
    t2 = time.perf_counter()
    artifact = _stage("Artifact.load", Artifact.load, path)
    return artifact, {"load": t1 - t0, "build": t2 - t1}


def difference(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> tuple[float, float]:
    """Max abs difference over all outputs, and the same relative to the largest reference magnitude.

    Relative to the output's scale rather than element-wise, since logits near zero make element-wise ratios blow up.
    """
    missing = set(ref) - set(ours)
    if missing:
        raise ValueError(f"tilefarm outputs {sorted(ours)} lack {sorted(missing)}")
    abs_diff = max(float(np.abs(ours[k] - r).max()) for k, r in ref.items())
    scale = max(float(np.abs(r).max()) for r in ref.values())
    return abs_diff, abs_diff / max(scale, 1e-30)


def _systems(artifact, ort_fn: Callable, feeds: dict[str, np.ndarray]) -> dict[str, Callable[[], object]]:
    return {"tilefarm-untuned": lambda: artifact.run(feeds), "onnxruntime": lambda: ort_fn(feeds)}


def run_model(name: str, threads: list[int], repeat: int, rows: list[dict], disabled: tuple[str, ...] = ()) -> None:
    model = EXAMPLES[name](seed=0)
    feeds = batch1_inputs(model)
    with tempfile.TemporaryDirectory(prefix="tilefarm-bench-") as tmp:
        t = time.perf_counter()
        artifact, stages = compile_model(model, feeds, name, Path(tmp))
        detail = ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
        print(f"  compile {time.perf_counter() - t:.2f} s ({detail})")
        without = compile_model(model, feeds, f"{name}_without", Path(tmp), disabled=disabled)[0] if disabled else None
        for n in threads:
            # read by Artifact.run at every call
            os.environ["TILEFARM_NUM_THREADS"] = str(n)
            ort_fn = ort_session(model, n)
            ref = ort_fn(feeds)
            abs_diff, rel_diff = _stage("compare with onnxruntime", difference, artifact.run(feeds), ref)
            systems = _systems(artifact, ort_fn, feeds)
            if without is not None:
                systems["tilefarm-untuned-without"] = lambda a=without: a.run(feeds)
                off_diff = _stage("compare with onnxruntime", difference, without.run(feeds), ref)[1]
            medians = interleaved(systems, repeat, min_ms=MIN_SAMPLE_MS)
            for system, sec in medians.items():
                rows.append({"model": name, "system": system, "threads": n, "median_ms": round(sec * 1e3, 4)})
            tf, ort_ms = medians["tilefarm-untuned"] * 1e3, medians["onnxruntime"] * 1e3
            print(
                f"  {n} thr  tilefarm-untuned {tf:9.2f} ms  onnxruntime {ort_ms:8.2f} ms  "
                f"tilefarm/ort {tf / ort_ms:6.2f}x  max abs diff {abs_diff:.2e}  max rel diff {rel_diff:.2e}"
            )
            if without is not None:
                off = medians["tilefarm-untuned-without"] * 1e3
                print(
                    f"  {n} thr  without {', '.join(disabled)} {off:9.2f} ms  with/without {tf / off:6.3f}x  "
                    f"max rel diff {off_diff:.2e}"
                )


# ---------------------------------------------------------------------------------------------------------- tuned


def records_path(folder: str | Path, name: str, threads: int) -> Path:
    """Where --tuned writes a model's records (apart from bench.tuning's <model>-<threads>t.jsonl)."""
    return Path(folder) / f"models-{name}-{threads}t.jsonl"


def tune_model(name: str, threads: int, trials: int, population: int, path: Path):
    """The task scheduler after tuning every task of example `name` from scratch at `threads` threads, records to
    `path`, as `tilefarm tune` would (conv forms measured, weights cold where they outgrow the cache)."""
    from compiler.model.onnx_import import load

    model = EXAMPLES[name](seed=0)
    feeds = batch1_inputs(model)
    graph = _stage("onnx_frontend.load", load, model, {k: list(v.shape) for k, v in feeds.items()})
    return tune_graph(graph, threads, trials, population, path)


def tune_graph(graph, threads: int, trials: int, population: int, path: Path):
    """The task scheduler after tuning every task of an imported `graph` (see tune_model)."""
    from bench.tuning import _report_search, _tune
    from compiler.search.budget import first_round_sizes
    from compiler.search.task_scheduler import TuneOptions, weights_timed_cold
    from compiler.targets import host_target
    from compiler.tensor.tasks import tuning_plan

    plan = _stage("tuning_plan", tuning_plan, graph)
    cold = weights_timed_cold("auto", plan.calls, host_target().l3_bytes)
    forms = f" (and {len(plan.other_forms)} of convs' other forms)" if plan.other_forms else ""
    print(f"  {threads} thr: tuning {len(plan.tasks)} tasks{forms}, {trials} trials, weights timed "
          f"{'cold' if cold else 'warm'} -> {path}", flush=True)  # fmt: skip
    sched, _ = _stage(
        "tune", _tune, plan.all_tasks, trials, threads, path, population, False, cold_constants=cold,
        choices=plan.choices, graph=graph,
    )  # fmt: skip
    print("\n".join("    " + line for line in sched.table().splitlines()))
    _report_search(sched, 0.0)
    if not math.isfinite(sched.estimated_latency):
        missing = sum(1 for q in sched.progress if q.task.weight and not math.isfinite(q.best))
        works = [q.task.weight * q.task.flop_count for q in sched.progress]
        need = sum(first_round_sizes(TuneOptions().measures_per_round, works))
        print(f"    no estimate: {missing} of the model's tasks have no measured program (they compile with default "
              f"schedules); --trials {need} or more gives every task its first round")  # fmt: skip
    return sched


def time_tuned(name: str, records: Path, threads: int, repeat: int) -> dict:
    """onnxruntime and example `name` compiled untuned and with `records`, checked against onnxruntime and timed in
    one interleaved call at `threads` threads: {"medians_s": {system: s}, "max_rel_diff": {system: diff}}."""
    from compiler.costs.records import JSONLinesDatabase

    os.environ["TILEFARM_NUM_THREADS"] = str(threads)  # read by Artifact.run at every call
    model = EXAMPLES[name](seed=0)
    feeds = batch1_inputs(model)
    ort_fn = ort_session(model, threads)
    ref = ort_fn(feeds)
    systems: dict[str, Callable[[], object]] = {"onnxruntime": lambda: ort_fn(feeds)}
    diffs = {}
    with tempfile.TemporaryDirectory(prefix="tilefarm-bench-") as tmp:
        for system, db in (("tilefarm-untuned", None), ("tilefarm-tuned", JSONLinesDatabase(records))):
            artifact, _ = compile_model(model, feeds, system.replace("-", "_"), Path(tmp), records=db)
            diffs[system] = difference(_stage("Artifact.run", artifact.run, feeds), ref)[1]
            systems[system] = lambda a=artifact: a.run(feeds)
        medians = interleaved(systems, repeat, min_ms=MIN_SAMPLE_MS)
    return {"medians_s": medians, "max_rel_diff": diffs}


def _child_env() -> dict[str, str]:
    """This environment with the repository on PYTHONPATH, so that the timing process finds `bench` from anywhere."""
    paths = [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def result_row(name: str, system: str, threads: int, median_ms: float, sched=None, est_ms: float | None = None) -> dict:
    """One JSON row: the tuning's trials, seconds and estimate where `sched` (the tuned system's scheduler) is given."""
    return {
        "model": name,
        "system": system,
        "threads": threads,
        "trials": sched.stats.trials if sched else None,
        "tuning_s": round(sched.stats.wall_s, 1) if sched else None,
        "median_ms": round(median_ms, 4),
        "estimate_ms": round(est_ms, 4) if sched and est_ms is not None else None,
    }


def run_tuned(name: str, threads: list[int], args: argparse.Namespace, rows: list[dict]) -> None:
    from bench.timing import json_from_process

    for n in threads:
        path = records_path(args.records_dir, name, n)
        sched = tune_model(name, n, args.trials, args.population, path)
        cmd = [sys.executable, "-m", "bench.models", "--time-tuned", name, str(path), "--threads", str(n),
               "--repeat", str(args.repeat)]  # fmt: skip
        timed = _stage("timing", json_from_process, cmd, f"timing {name}", _child_env())
        ms = {k: v * 1e3 for k, v in timed["medians_s"].items()}
        # none while a task has no measured program (the budget did not reach it)
        est_ms = sched.estimated_latency * 1e3 if math.isfinite(sched.estimated_latency) else None
        for system in ("onnxruntime", "tilefarm-untuned", "tilefarm-tuned"):
            tuned = system == "tilefarm-tuned"
            row = result_row(name, system, n, ms[system], sched if tuned else None, est_ms)
            if system in timed["max_rel_diff"]:
                row["max_rel_diff"] = timed["max_rel_diff"][system]
            rows.append(row)
        ort_ms, untuned, tuned_ms = ms["onnxruntime"], ms["tilefarm-untuned"], ms["tilefarm-tuned"]
        diffs = timed["max_rel_diff"]
        estimate = f"{est_ms:8.3f} ms (run {(tuned_ms - est_ms) / est_ms:+.0%})" if est_ms is not None else "none"
        print(
            f"  {n} thr  onnxruntime {ort_ms:8.3f} ms  untuned {untuned:8.3f} ms  tuned {tuned_ms:8.3f} ms  "
            f"ort/untuned {ort_ms / untuned:5.2f}x  ort/tuned {ort_ms / tuned_ms:5.2f}x  estimate {estimate}  "
            f"{sched.stats.trials} trials, {sched.stats.wall_s:.0f} s tuning  "
            f"max rel diff untuned {diffs['tilefarm-untuned']:.1e}, tuned {diffs['tilefarm-tuned']:.1e}",
            flush=True,
        )


# ---------------------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[int]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--repeat", type=int, default=7, help="interleaved samples per system")
    p.add_argument("--json", help="write the rows here as a JSON list")
    p.add_argument("--only", help="run the models whose name contains this, or the example of this exact name")
    p.add_argument("--disable-pass", action="append", default=[], help="untuned: time the models without this pass too")
    p.add_argument("--tuned", action="store_true", help="tune each model at each thread count, then time it too")
    p.add_argument("--trials", type=int, default=1000, help="--tuned: measurements per model and thread count")
    p.add_argument("--population", type=int, default=512, help="--tuned: the evolutionary search's population")
    p.add_argument("--records-dir", default="bench/results/records", help="--tuned: where the records go")
    # the timing of a tuned model, in the fresh process run_tuned starts: NAME RECORDS
    p.add_argument("--time-tuned", nargs=2, metavar=("NAME", "RECORDS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    return args, [int(t) for t in args.threads.split(",")]


def selected(only: str | None) -> list[str]:
    """The models to run: MODELS, those whose name contains `only`, or the example named `only` exactly."""
    if only in EXAMPLES:
        return [only]
    return [name for name in MODELS if not only or only in name]


def main(argv: list[str] | None = None) -> None:
    args, threads = parse_args(argv)
    if args.time_tuned:
        name, records = args.time_tuned
        print(json.dumps(time_tuned(name, Path(records), threads[0], args.repeat)))
        return
    # libgomp's idle-wait settings decide multi-thread latency on a busy host; print them so runs can be compared
    waits = {k: os.environ.get(k, "(unset)") for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    print(", ".join(f"{k}={v}" for k, v in waits.items()), f"on {os.cpu_count()} cores")
    if args.tuned:
        Path(args.records_dir).mkdir(parents=True, exist_ok=True)
        print("speed ratios: onnxruntime's latency / tilefarm's (above 1: tilefarm faster)")
    rows: list[dict] = []
    failed: dict[str, str] = {}
    for name in selected(args.only):
        print(f"{name}:")
        try:
            if args.tuned:
                run_tuned(name, threads, args, rows)
            else:
                run_model(name, threads, args.repeat, rows, tuple(args.disable_pass))
        except StageFailed as e:
            failed[name] = str(e)
            print(f"  FAILED in {e}")
        except Exception as e:  # a bug outside the pipeline still must not hide the other models' numbers
            failed[name] = f"{type(e).__name__}: {e}"
            print(f"  FAILED: {failed[name]}")
        if args.json:  # after every model, so a long run leaves its rows behind
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    if failed:
        print(f"failed: {', '.join(failed)}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
