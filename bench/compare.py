"""Side-by-side timing of compiled artifacts of one example model (say, before and after a compiler change) and
onnxruntime, interleaved in one process.

    python -m bench.compare resnet18 before=old.tar after=new.tar [--threads 1] [--repeat 7] [--processes 3]

Build each artifact with the code it belongs to (`tilefarm compile MODEL --records R -o X.tar`, or
`compiler.artifact.build.build`); runtimes of different commits load side by side because an artifact is a plain shared
library. On these shared 2-vCPU hosts a model's latency drifts by a third over tens of minutes, so two tuning runs'
own end-of-run timings do not compare; samples taken in turn in one process do. Each process prints every system's
median and its ratio to onnxruntime; outputs are checked against onnxruntime first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bench.kernels import interleaved
from bench.models import batch1_inputs, difference, ort_session
from bench.timing import json_from_process
from compiler.artifact.runtime import Artifact
from tilefarm.examples import EXAMPLES


def time_once(model_name: str, artifacts: dict[str, str], threads: int, repeat: int) -> dict:
    os.environ["TILEFARM_NUM_THREADS"] = str(threads)
    model = EXAMPLES[model_name](seed=0)
    feeds = batch1_inputs(model)
    ort_fn = ort_session(model, threads)
    want = ort_fn(feeds)
    systems, diffs = {}, {}
    for label, path in artifacts.items():
        art = Artifact.load(path)
        _, diffs[label] = difference(art.run(feeds), want)
        systems[label] = lambda a=art: a.run(feeds)
    systems["onnxruntime"] = lambda: ort_fn(feeds)
    return {"medians_s": interleaved(systems, repeat, min_ms=100), "max_rel_diff": diffs}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=sorted(EXAMPLES))
    p.add_argument("artifacts", nargs="+", help="label=path.tar")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--processes", type=int, default=3, help="fresh processes, one after another")
    p.add_argument("--once", action="store_true", help=argparse.SUPPRESS)  # one process's timing, as JSON
    args = p.parse_args(argv)
    artifacts = {}
    for spec in args.artifacts:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            p.error(f"artifact {spec!r} must be label=path.tar")
        artifacts[label] = path
    if args.once:
        print(json.dumps(time_once(args.model, artifacts, args.threads, args.repeat)))
        return
    cmd = [sys.executable, "-m", "bench.compare", args.model, *args.artifacts, "--once"]
    cmd += ["--threads", str(args.threads), "--repeat", str(args.repeat)]
    for k in range(args.processes):
        try:
            result = json_from_process(cmd, f"timing {args.model}")
        except RuntimeError as e:
            sys.exit(str(e))
        med, ref = result["medians_s"], result["medians_s"]["onnxruntime"]
        print(f"process {k + 1}, {args.threads} thread(s):")
        for label, sec in med.items():
            diff = result["max_rel_diff"].get(label)
            note = f"  (max rel diff vs onnxruntime {diff:.1e})" if diff is not None else ""
            print(f"  {label:16s} {sec * 1e3:9.3f} ms  {ref / sec:5.3f}x onnxruntime{note}")


if __name__ == "__main__":
    main()
