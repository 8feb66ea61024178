"""Quantized example models: tilefarm's int8 route against onnxruntime on the same int8 model and against tilefarm's
own fp32 model, batch 1, untuned (default schedules) or tuned as well, timed interleaved in one process
(bench.kernels).

    python -m bench.int8_models [--only resnet18] [--threads 1] [--repeat 9] [--calibration 8] [--generic]
    python -m bench.int8_models --tuned [--trials 1000] [--population 512] [--records-dir DIR] [--threads 1,2] ...

The convolutional examples are quantized by onnxruntime's quantize_static (QDQ, per-channel int8 weights, uint8
activations: the U8S8 form onnxruntime advises on x86 and fuses completely) on --calibration seeded standard-normal
inputs; the transformers (DYNAMIC) by quantize_dynamic (DynamicQuantizeLinear + MatMulInteger, per-channel int8
weights), whose outputs are float. Systems: tilefarm-int8 (the packed dot-product route: compiler/model/int8_layout.py),
onnxruntime-int8, tilefarm-fp32 (the float example), and with --generic tilefarm-int8-generic (the same int8 model
with the route's passes disabled: the generic integer loops). Before timing, tilefarm's int8 outputs are compared with
onnxruntime's (a static model: the largest difference in steps of the output's quantization scale, the outputs being
dequantized int8 values; a dynamic one: the largest difference relative to the largest output) and with the generic
route's (bit for bit).

With --tuned, per model and thread count: the int8 model's tasks tuned from scratch with --trials measurements
(bench.models.tune_graph, as `tilefarm tune` does; records in DIR/int8-<model>-<threads>t.jsonl, the quantized
model beside them as DIR/int8-<model>.onnx), then, in a fresh process, onnxruntime int8, tilefarm int8 untuned and
tuned and tilefarm fp32 timed in one interleaved call. tilefarm fp32 is untuned (tilefarm-fp32-untuned) unless
--fp32-records-dir holds bench.models --tuned records of the model at that thread count (models-<model>-<n>t.jsonl,
tilefarm-fp32-tuned). Printed: the four medians, onnxruntime int8's latency over tilefarm int8's (above 1: tilefarm
faster), tilefarm fp32's over tilefarm int8's, the task scheduler's estimate, and the outputs' agreement; --json rows
as bench.models writes them (model, system, threads, trials, tuning_s, median_ms, estimate_ms) with, for tilefarm
int8, max_steps (static) or max_rel_diff (dynamic) against onnxruntime.
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

from bench.kernels import interleaved
from bench.models import (
    StageFailed,
    _child_env,
    _stage,
    batch1_inputs,
    ort_session,
    records_path,
    result_row,
    tune_graph,
)
from tilefarm.examples import EXAMPLES

ROUTE = ("pack_integer_matmuls", "pack_integer_convs")
DYNAMIC = ("encoder", "bert")  # quantized by quantize_dynamic; the others by quantize_static
MIN_SAMPLE_MS = 100


def quantize(model: onnx.ModelProto, shape: list[int], count: int, folder: Path, dynamic: bool = False):
    """`model` quantized as `tilefarm quantize --per-channel` does it: static (QDQ, per-channel int8 weights, uint8
    activations, minmax) on `count` seeded standard-normal inputs, or with `dynamic` as `--dynamic` does."""
    from tilefarm.quantize import quantize as quantize_file

    rng = np.random.default_rng(1)
    src, calib, out = folder / "f.onnx", folder / "calibration.npz", folder / "q.onnx"
    onnx.save(model, str(src))
    if dynamic:
        quantize_file(src, out, None, per_channel=True, dynamic=True)
    else:
        np.savez(calib, **{model.graph.input[0].name: rng.standard_normal((count, *shape[1:])).astype(np.float32)})
        quantize_file(src, out, calib, per_channel=True)
    return onnx.load(str(out))


def compile_model(model: onnx.ModelProto, feeds: dict, path: Path, disabled: tuple[str, ...] = (), records=None):
    from compiler.artifact.build import build
    from compiler.artifact.runtime import Artifact
    from compiler.model.onnx_import import load

    graph = load(model, {k: list(v.shape) for k, v in feeds.items()})
    build(graph, path, name=path.stem, disabled_passes=disabled, records=records)
    return Artifact.load(path)


def output_step(model: onnx.ModelProto) -> float | None:
    """The scale of the DequantizeLinear that makes the (first) graph output; None when another op makes it (a
    dynamically quantized model's float output)."""
    out = model.graph.output[0].name
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.output[0] == out and n.op_type == "DequantizeLinear":
            return float(inits[n.input[1]].reshape(-1)[0])
    return None


def agreement(ours: dict, theirs: dict, step: float | None) -> dict:
    """How far tilefarm's int8 outputs are from onnxruntime's: {"max_steps": the largest difference in output steps}
    with a step, else {"max_rel_diff": the largest difference over the largest output}; and "equal" outputs."""
    diff = max(float(np.abs(ours[k] - v).max()) for k, v in theirs.items())
    equal = sum(int(np.array_equal(ours[k], v)) for k, v in theirs.items())
    if step is not None:
        return {"max_steps": diff / step, "equal": equal, "outputs": len(theirs)}
    scale = max(float(np.abs(v).max()) for v in theirs.values())
    return {"max_rel_diff": diff / max(scale, 1e-30), "equal": equal, "outputs": len(theirs)}


def describe(a: dict) -> str:
    far = f"max {a['max_steps']:.0f} output steps" if "max_steps" in a else f"max rel diff {a['max_rel_diff']:.1e}"
    return f"{far}, {a['equal']} of {a['outputs']} outputs equal"


def quantized_example(name: str, folder: Path, calibration: int) -> tuple[onnx.ModelProto, onnx.ModelProto, dict]:
    """(the fp32 example, its quantized model, batch-1 inputs)."""
    fp32 = EXAMPLES[name](seed=0)
    feeds = batch1_inputs(fp32)
    (x, *_) = feeds
    return fp32, quantize(fp32, list(feeds[x].shape), calibration, folder, name in DYNAMIC), feeds


def run(name: str, threads: list[int], repeat: int, calibration: int, generic: bool, rows: list[dict]) -> None:
    with tempfile.TemporaryDirectory(prefix="tilefarm-int8-") as tmp:
        folder = Path(tmp)
        fp32, q, feeds = quantized_example(name, folder, calibration)
        builds: dict[str, tuple[onnx.ModelProto, tuple[str, ...]]] = {
            "tilefarm-int8": (q, ()),
            "tilefarm-fp32": (fp32, ()),
        }
        if generic:
            builds["tilefarm-int8-generic"] = (q, ROUTE)
        artifacts = {}
        for system, (model, disabled) in builds.items():
            t = time.perf_counter()
            artifacts[system] = compile_model(model, feeds, folder / f"{system}.tar", disabled)
            print(f"  {system}: compiled in {time.perf_counter() - t:.1f} s", flush=True)
        step = output_step(q)
        for n in threads:
            os.environ["TILEFARM_NUM_THREADS"] = str(n)  # read by Artifact.run at every call
            ort_int8 = ort_session(q, n)
            ours = artifacts["tilefarm-int8"].run(feeds)
            agree = agreement(ours, ort_int8(feeds), step)
            print(f"  {n} thr: int8 outputs vs onnxruntime: {describe(agree)}")
            if generic:
                other = artifacts["tilefarm-int8-generic"].run(feeds)
                same = all(np.array_equal(ours[k], other[k]) for k in ours)
                print(f"  {n} thr: packed route vs generic route: {'bit for bit equal' if same else 'DIFFERENT'}")
            systems: dict[str, Callable[[], object]] = {k: (lambda a=a: a.run(feeds)) for k, a in artifacts.items()}
            systems["onnxruntime-int8"] = lambda f=ort_int8: f(feeds)
            medians = interleaved(systems, repeat, MIN_SAMPLE_MS)
            ms = {k: v * 1e3 for k, v in medians.items()}
            for system, t in ms.items():
                print(f"  {n} thr  {system:22s} {t:9.2f} ms")
                row = {"model": name, "system": system, "threads": n, "median_ms": round(t, 4)}
                rows.append(row | (agree if system == "tilefarm-int8" else {}))
            base = ms["tilefarm-int8"]
            for system in (k for k in ms if k != "tilefarm-int8"):
                print(f"  {n} thr  {system} / tilefarm-int8  speed ratio {ms[system] / base:.2f}")


# ---------------------------------------------------------------------------------------------------------- tuned


def int8_records_path(folder: str | Path, name: str, threads: int) -> Path:
    return Path(folder) / f"int8-{name}-{threads}t.jsonl"


def time_tuned(name: str, model_path: Path, records: Path, threads: int, repeat: int, fp32_records: Path | None):
    """onnxruntime int8, the quantized model at `model_path` compiled untuned and with `records`, and example
    `name`'s fp32 model (untuned, or with `fp32_records`), checked and timed in one interleaved call at `threads`
    threads: {"medians_s": {system: s}, "agreement": {int8 system: agreement()}, "tuned_equals_untuned": bool}."""
    from compiler.costs.records import JSONLinesDatabase

    os.environ["TILEFARM_NUM_THREADS"] = str(threads)  # read by Artifact.run at every call
    q, fp32 = onnx.load(str(model_path)), EXAMPLES[name](seed=0)
    feeds = batch1_inputs(fp32)
    ort_int8 = ort_session(q, threads)
    ref, step = ort_int8(feeds), output_step(q)
    systems: dict[str, Callable[[], object]] = {"onnxruntime-int8": lambda: ort_int8(feeds)}
    agree, outs = {}, {}
    fp32_system = "tilefarm-fp32-tuned" if fp32_records else "tilefarm-fp32-untuned"
    builds = [("tilefarm-int8-untuned", q, None), ("tilefarm-int8-tuned", q, JSONLinesDatabase(records)),
              (fp32_system, fp32, JSONLinesDatabase(fp32_records) if fp32_records else None)]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tilefarm-int8-") as tmp:
        for system, model, db in builds:
            artifact = _stage("build", compile_model, model, feeds, Path(tmp) / f"{system}.tar", (), db)
            outs[system] = _stage("Artifact.run", artifact.run, feeds)
            if model is q:
                agree[system] = agreement(outs[system], ref, step)
            systems[system] = lambda a=artifact: a.run(feeds)
        medians = interleaved(systems, repeat, min_ms=MIN_SAMPLE_MS)
    a, b = outs["tilefarm-int8-untuned"], outs["tilefarm-int8-tuned"]
    same = all(np.array_equal(a[k], b[k]) for k in a)
    return {"medians_s": medians, "agreement": agree, "tuned_equals_untuned": same}


def run_tuned(name: str, threads: list[int], args: argparse.Namespace, rows: list[dict]) -> None:
    from bench.timing import json_from_process
    from compiler.model.onnx_import import load

    folder = Path(args.records_dir)
    with tempfile.TemporaryDirectory(prefix="tilefarm-int8-") as tmp:
        _, q, feeds = _stage("quantize", quantized_example, name, Path(tmp), args.calibration)
    model_path = folder / f"int8-{name}.onnx"
    onnx.save(q, str(model_path))
    graph = _stage("onnx_frontend.load", load, q, {k: list(v.shape) for k, v in feeds.items()})
    for n in threads:
        path = int8_records_path(folder, name, n)
        sched = tune_graph(graph, n, args.trials, args.population, path)
        cmd = [sys.executable, "-m", "bench.int8_models", "--time-tuned", name, str(model_path), str(path),
               "--threads", str(n), "--repeat", str(args.repeat)]  # fmt: skip
        fp32_records = records_path(args.fp32_records_dir, name, n) if args.fp32_records_dir else None
        if fp32_records is not None and fp32_records.exists():
            cmd += ["--fp32-records", str(fp32_records)]
        timed = _stage("timing", json_from_process, cmd, f"timing {name}", _child_env())
        ms = {k: v * 1e3 for k, v in timed["medians_s"].items()}
        est_ms = sched.estimated_latency * 1e3 if math.isfinite(sched.estimated_latency) else None
        for system, t in ms.items():
            tuned = system == "tilefarm-int8-tuned"
            row = result_row(name, system, n, t, sched if tuned else None, est_ms)
            rows.append(row | timed["agreement"].get(system, {}))
        ort_ms, untuned, tuned_ms = ms["onnxruntime-int8"], ms["tilefarm-int8-untuned"], ms["tilefarm-int8-tuned"]
        (fp32_system,) = (k for k in ms if k.startswith("tilefarm-fp32"))
        estimate = f"{est_ms:.3f} ms (run {(tuned_ms - est_ms) / est_ms:+.0%})" if est_ms is not None else "none"
        print(f"  {n} thr  onnxruntime-int8 {ort_ms:8.3f} ms  int8 untuned {untuned:8.3f} ms  int8 tuned "
              f"{tuned_ms:8.3f} ms  {fp32_system} {ms[fp32_system]:8.3f} ms", flush=True)  # fmt: skip
        print(f"  {n} thr  ort-int8/int8-untuned {ort_ms / untuned:5.2f}x  "
              f"ort-int8/int8-tuned {ort_ms / tuned_ms:5.2f}x  "
              f"{fp32_system}/int8-tuned {ms[fp32_system] / tuned_ms:5.2f}x  estimate {estimate}  "
              f"{sched.stats.trials} trials, {sched.stats.wall_s:.0f} s tuning")  # fmt: skip
        for system, a in timed["agreement"].items():
            print(f"  {n} thr  {system} vs onnxruntime-int8: {describe(a)}")
        same = "bit for bit equal" if timed["tuned_equals_untuned"] else "DIFFERENT"
        print(f"  {n} thr  int8 tuned vs untuned outputs: {same}", flush=True)


# ---------------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="resnet18", help="comma-separated example names")
    p.add_argument("--threads", default="1")
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--calibration", type=int, default=8, help="synthetic calibration inputs")
    p.add_argument("--generic", action="store_true", help="also time the int8 model without the packed route")
    p.add_argument("--json", help="write the rows here as a JSON list")
    p.add_argument("--tuned", action="store_true", help="tune each int8 model at each thread count, then time it")
    p.add_argument("--trials", type=int, default=1000, help="--tuned: measurements per model and thread count")
    p.add_argument("--population", type=int, default=512, help="--tuned: the evolutionary search's population")
    p.add_argument("--records-dir", default="bench/results/records", help="--tuned: where the records go")
    p.add_argument("--fp32-records-dir", help="--tuned: bench.models --tuned records to compile tilefarm fp32 with")
    # the timing of a tuned model, in the fresh process run_tuned starts
    p.add_argument("--time-tuned", nargs=3, metavar=("NAME", "MODEL", "RECORDS"), help=argparse.SUPPRESS)
    p.add_argument("--fp32-records", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    threads = [int(t) for t in a.threads.split(",")]
    if a.time_tuned:
        name, model, records = a.time_tuned
        fp32 = Path(a.fp32_records) if a.fp32_records else None
        print(json.dumps(time_tuned(name, Path(model), Path(records), threads[0], a.repeat, fp32)))
        return
    import onnxruntime

    from compiler.targets import host_target

    host = host_target()
    vnni = "AVX512-VNNI" if host.has("avx512vnni") else "AVX-VNNI" if host.has("avxvnni") else "no VNNI"
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"CPU: {host.cpu_model} ({host.mcpu}, {vnni}, {host.vector_bytes * 8}-bit vectors), {os.cpu_count()} "
          f"vCPUs; onnxruntime {onnxruntime.__version__}; load average at the start {load}")  # fmt: skip
    if a.tuned:
        Path(a.records_dir).mkdir(parents=True, exist_ok=True)
        print("speed ratios: the other system's latency / tilefarm int8's (above 1: tilefarm int8 faster)")
    rows: list[dict] = []
    failed: dict[str, str] = {}
    for name in a.only.split(","):
        print(name, flush=True)
        try:
            if a.tuned:
                run_tuned(name, threads, a, rows)
            else:
                run(name, threads, a.repeat, a.calibration, a.generic, rows)
        except StageFailed as e:
            failed[name] = str(e)
            print(f"  FAILED in {e}")
        if a.json:  # after every model, so a long run leaves its rows behind
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
    if failed:
        print(f"failed: {', '.join(failed)}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
