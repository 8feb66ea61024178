"""Timing of tuned programs for bench.tuning, in a fresh process.

    python -m bench.timing kernel gemm_512 RECORDS.jsonl --threads 2 [--repeat 7]
    python -m bench.timing resnet18 - RECORDS.jsonl --threads 2 [--repeat 7]

A process that has just tuned holds thread pools (OpenBLAS, libgomp, xgboost) and freshly freed memory; on this
2-core host that made the same ResNet-18 artifact time 49.7 ms inside the tuning process and 29.3 ms alone. So
bench.tuning times every result here instead: the best record per task is compiled, checked against onnxruntime,
and timed next to numpy/OpenBLAS and onnxruntime (interleaved samples, medians, as bench.kernels does), in three
fresh processes in turn (`in_fresh_process`). An L3 probe (bench.kernels.l3_probe) is
timed in turn with them, to show whether other tenants were using the shared L3 meanwhile. The last stdout line is
the result as JSON: {"medians_s": {system: seconds}, "max_rel_diff": float, "l3_probe_gbs": float}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.kernels import L3_PROBE, blas_info, fair_openblas_env, interleaved, l3_probe, onnx_session, tuning_workload
from compiler.base.arrays import aligned
from compiler.costs.records import JSONLinesDatabase

MAX_REL_DIFF = 1e-4


def best_record(dag, records: Path):
    """The fastest record of the DAG's workload in a records file (of the file's target)."""
    db = JSONLinesDatabase(records)
    return db.best(dag.workload_key, next(iter(db)).target, k=1)[0]


def best_kernel(dag, records: Path, name: str):
    """The best record's program of the DAG's workload in a records file, compiled as function `name`."""
    from compiler.schedule.lower import lower
    from compiler.schedule.state import apply_steps, step_from_record
    from compiler.targets.cpu.codegen import compile_funcs

    steps = [step_from_record(s) for s in best_record(dag, records).steps]
    return compile_funcs([lower(apply_steps(dag, steps), name)])[name]


def checked(what: str, out: np.ndarray, ref: np.ndarray) -> float:
    """The largest difference of a tuned program's output from the reference's, relative to the largest result (a
    sum's rounding error scales with its terms; Winograd's transforms add some); AssertionError naming `what` above
    MAX_REL_DIFF."""
    rel = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
    if not rel < MAX_REL_DIFF:
        raise AssertionError(f"{what} is wrong: max rel diff {rel:.2e} against onnxruntime")
    return rel


def time_kernel(name: str, records: Path, threads: int, repeat: int) -> dict:
    from threadpoolctl import threadpool_limits

    from compiler.tensor.dag import ComputeDAG

    w = tuning_workload(name)
    dag = ComputeDAG([*w.inputs, w.output])
    kernel = best_kernel(dag, records, "tuned")
    ref_arrays, arrays = w.arrays()
    out = aligned(np.zeros(w.output.shape, np.float32))
    ort_fn, ort_result = onnx_session(w, ref_arrays, threads)
    kernel(*arrays, out)
    rel = checked(f"tuned {name}", out, ort_result())
    systems = {"tilefarm-tuned": lambda: kernel(*arrays, out), "onnxruntime": ort_fn}
    if name.startswith("gemm"):
        systems["numpy-openblas"] = lambda: np.matmul(arrays[0], arrays[1])
    with threadpool_limits(limits=threads, user_api="blas"):
        medians, probe_gbs = interleaved_with_probe(systems, repeat, min_ms=30)
    return {"medians_s": medians, "max_rel_diff": rel, "blas": blas_info(), "l3_probe_gbs": probe_gbs}


def time_resnet18(records: Path, threads: int, repeat: int) -> dict:
    from bench.models import batch1_inputs, difference, ort_session
    from compiler.artifact.build import build
    from compiler.artifact.runtime import Artifact
    from compiler.model.onnx_import import load
    from tilefarm.examples import EXAMPLES

    model = EXAMPLES["resnet18"](seed=0)
    feeds = batch1_inputs(model)
    graph = load(model, {k: list(v.shape) for k, v in feeds.items()})
    with tempfile.TemporaryDirectory(prefix="tilefarm-bench-") as tmp:
        arts = {}
        for label, db in (("tilefarm-tuned", JSONLinesDatabase(records)), ("tilefarm-untuned", None)):
            info = build(graph, Path(tmp) / f"{label}.tar", name="resnet18", records=db)
            arts[label] = Artifact.load(Path(tmp) / f"{label}.tar")
            if db is not None:
                forms = info.forms  # the convs the records moved to their other form
        ort_fn = ort_session(model, threads)
        _, rel = difference(arts["tilefarm-tuned"].run(feeds), ort_fn(feeds))
        systems = {k: (lambda a=a: a.run(feeds)) for k, a in arts.items()}
        systems["onnxruntime"] = lambda: ort_fn(feeds)
        medians, probe_gbs = interleaved_with_probe(systems, repeat, min_ms=100)
    return {"medians_s": medians, "max_rel_diff": rel, "l3_probe_gbs": probe_gbs, "conv_forms": forms}


def interleaved_with_probe(systems: dict, repeat: int, min_ms: float) -> tuple[dict[str, float], float]:
    """bench.kernels.interleaved with the L3 probe (bench.kernels.l3_probe) timed in turn among the systems: their
    medians, and the probe's median GB/s."""
    probe, to_gbs = l3_probe()
    medians = interleaved({**systems, L3_PROBE: probe}, repeat, min_ms)
    return medians, round(to_gbs(medians.pop(L3_PROBE)), 1)


def json_from_process(cmd: list[str], what: str, env: dict | None = None) -> dict:
    """Runs cmd and parses the last line it printed as JSON; raises RuntimeError with its stderr if it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def in_fresh_process(kind: str, name: str, records: Path, threads: int, repeat: int, processes: int = 3) -> dict:
    """Runs this module's timing in `processes` new interpreters, one after another, and gives each system the median
    of their medians (and every process's medians under "runs"); raises RuntimeError with its stderr if one fails.

    A 2-thread median moves between processes on these 2-vCPU virtual machines as a whole: the tuned GEMM 512 timed
    0.58-0.85 ms in eight fresh processes in a row on a Zen 5 host (onnxruntime 0.56-0.74 ms, OpenBLAS likewise),
    while the samples inside one process agreed within a few percent; so one process is one sample."""
    env = {**os.environ, **fair_openblas_env()}
    cmd = [sys.executable, "-m", "bench.timing", kind, name, str(records), "--threads", str(threads)]
    runs = [json_from_process([*cmd, "--repeat", str(repeat)], f"timing {name}", env) for _ in range(processes)]
    medians = {k: statistics.median(r["medians_s"][k] for r in runs) for k in runs[0]["medians_s"]}
    return {
        **runs[0],
        "medians_s": medians,
        "runs": [r["medians_s"] for r in runs],
        "l3_probe_gbs": [r["l3_probe_gbs"] for r in runs],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=["kernel", "resnet18"])
    p.add_argument("name", help="the kernel workload (gemm_512, conv2d_64x56x56_3x3, ...); '-' for resnet18")
    p.add_argument("records", type=Path)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    os.environ["TILEFARM_NUM_THREADS"] = str(args.threads)
    if args.kind == "kernel":
        result = time_kernel(args.name, args.records, args.threads, args.repeat)
    else:
        result = time_resnet18(args.records, args.threads, args.repeat)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
