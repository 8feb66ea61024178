"""Whole-model benchmark: tilefarm (untuned, default schedules) against onnxruntime on the example models, batch 1.

    python -m bench.models [--threads 1,2] [--repeat 7] [--json rows.json] [--only resnet18]

Per model: compile seconds, median latency of both systems from interleaved samples (see bench.kernels for why),
their ratio, and how far tilefarm's outputs are from onnxruntime's. A model the pipeline cannot handle is reported
with its error and skipped; the exit status is 1 when any model failed.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from bench.kernels import interleaved, ort_options, parse_args
from tilefarm.examples import EXAMPLES

MODELS = ["resnet18", "mobilenetv2", "encoder"]
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


def compile_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], name: str, folder: Path):
    """(loaded artifact, seconds per stage) for `model` compiled with default schedules."""
    load, build, Artifact = _stage("import", _compiler)
    t0 = time.perf_counter()
    graph = _stage("onnx_frontend.load", load, model, input_shapes={k: list(v.shape) for k, v in feeds.items()})
    t1 = time.perf_counter()
    path = folder / f"{name}.tar"
    _stage("build", build, graph, path, name=name)
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


def run_model(name: str, threads: list[int], repeat: int, rows: list[dict]) -> None:
    model = EXAMPLES[name](seed=0)
    feeds = batch1_inputs(model)
    with tempfile.TemporaryDirectory(prefix="tilefarm-bench-") as tmp:
        t = time.perf_counter()
        artifact, stages = compile_model(model, feeds, name, Path(tmp))
        detail = ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
        print(f"  compile {time.perf_counter() - t:.2f} s ({detail})")
        for n in threads:
            # read by Artifact.run at every call
            os.environ["TILEFARM_NUM_THREADS"] = str(n)
            ort_fn = ort_session(model, n)
            ours = _stage("Artifact.run", artifact.run, feeds)
            abs_diff, rel_diff = _stage("compare with onnxruntime", difference, ours, ort_fn(feeds))
            medians = interleaved(_systems(artifact, ort_fn, feeds), repeat, min_ms=MIN_SAMPLE_MS)
            for system, sec in medians.items():
                rows.append({"model": name, "system": system, "threads": n, "median_ms": round(sec * 1e3, 4)})
            tf, ort_ms = medians["tilefarm-untuned"] * 1e3, medians["onnxruntime"] * 1e3
            print(
                f"  {n} thr  tilefarm-untuned {tf:9.2f} ms  onnxruntime {ort_ms:8.2f} ms  "
                f"tilefarm/ort {tf / ort_ms:6.2f}x  max abs diff {abs_diff:.2e}  max rel diff {rel_diff:.2e}"
            )


def main(argv: list[str] | None = None) -> None:
    args, threads = parse_args(argv, __doc__.splitlines()[0], "models")
    # libgomp's idle-wait settings decide multi-thread latency on a busy host; print them so runs can be compared
    waits = {k: os.environ.get(k, "(unset)") for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    print(", ".join(f"{k}={v}" for k, v in waits.items()), f"on {os.cpu_count()} cores")
    rows: list[dict] = []
    failed: dict[str, str] = {}
    for name in MODELS:
        if args.only and args.only not in name:
            continue
        print(f"{name}:")
        try:
            run_model(name, threads, args.repeat, rows)
        except StageFailed as e:
            failed[name] = str(e)
            print(f"  FAILED in {e}")
        except Exception as e:  # a bug outside the pipeline still must not hide the other models' numbers
            failed[name] = f"{type(e).__name__}: {e}"
            print(f"  FAILED: {failed[name]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if failed:
        print(f"failed: {', '.join(failed)}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
