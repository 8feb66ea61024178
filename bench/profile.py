"""Where a whole model loses to onnxruntime, kernel by kernel.

    python -m bench.profile mobilenetv2 [--records R.jsonl] [--threads 1] [--repeat 20] [--json rows.json]

MODEL is an example's name (`tilefarm example --list`) or an .onnx file. The model is compiled (with the best record
per task from --records, else default schedules) and every kernel call of its plan is timed three ways, beside
onnxruntime's own per-node profile (`enable_profiling`) of the same model at the same thread count:

  hot      the call repeated on its own, inputs and weights in cache: the condition a tuner times a task in
  in-run   the call inside whole runs of the plan, its memory as cold or warm as the model leaves it
  tuned    the tuner's timing of the task's schedule, from the record the build applied ("-" untuned)
  ort      onnxruntime's kernel time for the nodes the call computes, matched through the model's node names and
           tensor names (onnxruntime renames the nodes it fuses after one of them, e.g. clip_10_nchwc)

and `GB/s`, the bytes the call must move (its inputs and outputs once) over its in-run time. A call whose in-run time
is far above its hot one waits on memory the model left cold; one near the host's memory bandwidth is bound by
traffic, which only fusion (less traffic) helps. The footer compares the sum of the calls with the whole run (the
rest is call and thread overhead) and lists onnxruntime nodes no call matched (its layout reorders, for instance).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from bench.kernels import ort_options
from bench.models import batch1_inputs, difference

ORT_SUFFIXES = ("_kernel_time", "_nchwc", "_token_0")


def ort_node_times(
    model: onnx.ModelProto, feeds: dict, threads: int, repeat: int
) -> tuple[dict[str, float], float, dict[str, np.ndarray]]:
    """Median seconds per onnxruntime node (by its name in the profile) over `repeat` runs, the median run, and the
    outputs by name (the reference the compiled model is checked against)."""
    import onnxruntime as ort

    opts = ort_options(threads)
    opts.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="tilefarm-ortprof-") as tmp:
        opts.profile_file_prefix = str(Path(tmp) / "ort")
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        # warm-up runs are in the profile too: dropped below by taking the last `repeat`
        for _ in range(3):
            outputs = sess.run(None, feeds)
        for _ in range(repeat):
            outputs = sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
        reference = dict(zip([o.name for o in sess.get_outputs()], outputs))
    nodes: dict[str, list[float]] = {}
    runs = [e["dur"] * 1e-6 for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            nodes.setdefault(e["name"], []).append(e["dur"] * 1e-6)
    per_node = {_ort_base(k): statistics.median(v[-repeat:]) for k, v in nodes.items()}
    return per_node, statistics.median(runs[-repeat:]), reference


def _ort_base(name: str) -> str:
    for suffix in ORT_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def match_ort(model: onnx.ModelProto, calls: list[dict], ort_nodes: dict[str, float]) -> tuple[list[float], dict]:
    """onnxruntime's seconds per call of our plan, and its nodes matched to none. A node belongs to the call that lists
    it, else to the call that writes its output tensor (our names of a value add suffixes: `_nchwc`, `_blocked`),
    else to the first call so found downstream of it (a node our optimizer folded away, such as a BatchNormalization
    onnxruntime fused into a conv and named the fused node after)."""
    by_node = {n: k for k, c in enumerate(calls) for n in c.get("nodes", [])}
    graph_nodes = {node.name: node for node in model.graph.node}
    readers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for tensor in node.input:
            readers.setdefault(tensor, []).append(node.name)
    written = [c.get("writes", []) for c in calls]

    def owner(name: str, depth: int = 0) -> int | None:
        if name in by_node:
            return by_node[name]
        node = graph_nodes.get(name)
        if node is None or depth > 4:
            return None
        for tensor in node.output:
            k = next((i for i, w in enumerate(written) if any(v.startswith(tensor) for v in w)), None)
            if k is not None:
                return k
        for tensor in node.output:
            for reader in readers.get(tensor, []):
                if (k := owner(reader, depth + 1)) is not None:
                    return k
        return None

    per_call, unmatched = [0.0] * len(calls), {}
    for name, sec in ort_nodes.items():
        k = owner(name)
        if k is None:
            unmatched[name] = sec
        else:
            per_call[k] += sec
    return per_call, unmatched


def profile_model(name: str, records: str | None, threads: int, repeat: int, disabled: tuple[str, ...] = ()) -> dict:
    from compiler.artifact.build import build
    from compiler.artifact.runtime import Artifact
    from compiler.costs.records import JSONLinesDatabase
    from compiler.model.onnx_import import load
    from compiler.tensor.tasks import kernel_calls
    from tilefarm.examples import EXAMPLES

    model = EXAMPLES[name](seed=0) if name in EXAMPLES else onnx.load(name)
    feeds = batch1_inputs(model)
    os.environ["TILEFARM_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory(prefix="tilefarm-prof-") as tmp:
        path = Path(tmp) / "m.tar"
        info = build(
            load(model, input_shapes={k: list(v.shape) for k, v in feeds.items()}),
            path,
            name="m",
            records=JSONLinesDatabase(records) if records else None,
            disabled_passes=disabled,
        )
        art = Artifact.load(path)
        ours = art.run(feeds)
        rows = art.profile(feeds, repeat)
        whole = statistics.median(_timed(lambda: art.run(feeds)) for _ in range(repeat))
    ort_nodes, ort_run, reference = ort_node_times(model, feeds, threads, repeat)
    _, rel = difference(ours, reference)
    flat = kernel_calls(info.calls)
    plan = [{"nodes": list(c.nodes), "writes": [v.name for v in c.args[len(c.task.dag.inputs) :]]} for c in flat]
    ort_per_call, unmatched = match_ort(model, plan, ort_nodes)
    tuned = {r["workload_key"]: r["mean_seconds"] for r in info.records_used.values()}
    out = []
    for row, c, o in zip(rows, flat, ort_per_call):
        nbytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in c.args)
        out.append(
            {
                "kernel": row["kernel"],
                "task": c.task.name,
                "nodes": list(c.nodes),
                "flops": c.task.flop_count,
                "bytes": nbytes,
                "hot_s": row["seconds"],
                "in_run_s": row["in_run"],
                "tuned_s": tuned.get(c.task.key),
                "ort_s": o,
            }
        )
    return {
        "model": name,
        "threads": threads,
        "run_s": whole,
        "ort_run_s": ort_run,
        "max_rel_diff": rel,
        "calls": out,
        "ort_unmatched": unmatched,
    }


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def report(p: dict, top: int) -> None:
    ms = 1e3
    calls = p["calls"]
    print(
        f"{p['model']} at {p['threads']} thread(s): tilefarm run {p['run_s'] * ms:.3f} ms, onnxruntime run "
        f"{p['ort_run_s'] * ms:.3f} ms (ratio {p['run_s'] / p['ort_run_s']:.2f}x), max rel diff {p['max_rel_diff']:.1e}"
    )
    print(
        f"{'call':<34} {'MFLOP':>7} {'KiB':>7} {'hot':>7} {'in-run':>7} {'tuned':>7} {'ort':>7} {'loss':>7} "
        f"{'GB/s':>6}   (ms)"
    )
    order = sorted(range(len(calls)), key=lambda k: calls[k]["ort_s"] - calls[k]["in_run_s"])
    for k in order[:top]:
        c = calls[k]
        tuned = f"{c['tuned_s'] * ms:7.3f}" if c["tuned_s"] else f"{'-':>7}"
        label = f"{k:>3} {c['task']}"[:34]
        print(
            f"{label:<34} {c['flops'] / 1e6:7.1f} {c['bytes'] / 1024:7.0f} {c['hot_s'] * ms:7.3f} "
            f"{c['in_run_s'] * ms:7.3f} {tuned} {c['ort_s'] * ms:7.3f} {(c['in_run_s'] - c['ort_s']) * ms:7.3f} "
            f"{c['bytes'] / max(c['in_run_s'], 1e-9) / 1e9:6.1f}"
        )
    in_run = sum(c["in_run_s"] for c in calls)
    hot = sum(c["hot_s"] for c in calls)
    ort_sum = sum(c["ort_s"] for c in calls)
    extra = sum(p["ort_unmatched"].values())
    print(
        f"sum of {len(calls)} calls: hot {hot * ms:.3f} ms, in-run {in_run * ms:.3f} ms (the run's rest, call and "
        f"thread overhead: {(p['run_s'] - in_run) * ms:.3f} ms); onnxruntime's matched nodes {ort_sum * ms:.3f} ms, "
        f"unmatched {extra * ms:.3f} ms ({', '.join(sorted(p['ort_unmatched'])[:6]) or 'none'})"
    )
    by_task: dict[str, list[float]] = {}
    for c in calls:
        kind = c["task"].split("_", 1)[-1]
        t = by_task.setdefault(kind, [0.0, 0.0])
        t[0] += c["in_run_s"]
        t[1] += c["ort_s"]
    print(
        "by kind (in-run / ort ms): "
        + ", ".join(
            f"{k} {v[0] * ms:.2f}/{v[1] * ms:.2f}" for k, v in sorted(by_task.items(), key=lambda kv: -kv[1][0])
        )
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="an example's name or an .onnx file")
    p.add_argument("--records", help="a records file to compile with (default: untuned)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=20, help="runs per timing (medians)")
    p.add_argument("--top", type=int, default=25, help="calls to list, the largest losses first")
    p.add_argument("--json", help="write the profile here")
    p.add_argument("--disable-pass", action="append", default=[], help="compile without this optional pass")
    args = p.parse_args(argv)
    prof = profile_model(args.model, args.records, args.threads, args.repeat, tuple(args.disable_pass))
    report(prof, args.top)
    if args.json:
        Path(args.json).write_text(json.dumps(prof, indent=1))


if __name__ == "__main__":
    main()
