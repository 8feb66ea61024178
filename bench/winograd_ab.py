"""Winograd A/B: ResNet-18 (random weights) built with and without the `winograd_convs` pass, untuned or from one
records file, timed interleaved in one process next to onnxruntime.

    python -m bench.winograd_ab [--threads 1] [--records R.jsonl] [--repeat 7]

Both artifacts come from this code; the B build only drops `winograd_convs` from the pass list, so the rest of the
pipeline (blocking, NCHWc layout, fusion, default schedules) is the same. With records, each build applies the best
record of its own tasks and falls back to the default schedule elsewhere. Prints each system's median latency and
its largest difference from onnxruntime, relative to onnxruntime's largest output.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from bench.kernels import interleaved, ort_options
from compiler.artifact.build import build
from compiler.artifact.runtime import Artifact
from compiler.costs.records import JSONLinesDatabase
from compiler.model.onnx_import import load
from tilefarm.examples import resnet18


def _build(model, shape: dict, path: Path, winograd: bool, records) -> Artifact:
    disabled = () if winograd else ("winograd_convs",)
    build(load(model, shape), path, name="resnet18", records=records, disabled_passes=disabled)
    return Artifact.load(path)


def main(argv: list[str] | None = None) -> None:
    import onnxruntime as ort

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--records", help="a JSON-lines records file to compile both builds with (default: untuned)")
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    os.environ["TILEFARM_NUM_THREADS"] = str(args.threads)
    model = resnet18(seed=0)
    name = model.graph.input[0].name
    shape = {name: [1, 3, 224, 224]}
    records = JSONLinesDatabase(args.records) if args.records else None
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    cpu = ["CPUExecutionProvider"]
    sess = ort.InferenceSession(model.SerializeToString(), ort_options(args.threads), providers=cpu)
    ref = sess.run(None, {name: x})[0]
    tuned = "tuned" if records else "untuned"
    with tempfile.TemporaryDirectory() as tmp:
        arts = {
            f"tilefarm-{tuned}-winograd": _build(model, shape, Path(tmp, "w.tar"), True, records),
            f"tilefarm-{tuned}-direct": _build(model, shape, Path(tmp, "d.tar"), False, records),
        }
        systems = {k: (lambda a=a: a.run({name: x})) for k, a in arts.items()}
        systems["onnxruntime"] = lambda: sess.run(None, {name: x})
        for k, a in arts.items():
            got = next(iter(a.run({name: x}).values()))
            print(f"{k}: max rel diff vs onnxruntime {float(np.abs(got - ref).max() / np.abs(ref).max()):.1e}")
        medians = interleaved(systems, args.repeat, min_ms=200)
    print(f"resnet18, {args.threads} thread(s), batch 1:")
    for k, sec in medians.items():
        print(f"  {k:28s} {sec * 1e3:8.2f} ms   onnxruntime / this: {medians['onnxruntime'] / sec:.2f}")


if __name__ == "__main__":
    main()
