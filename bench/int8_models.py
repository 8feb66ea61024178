"""Quantized example models: tilefarm's int8 route against onnxruntime on the same int8 model and against tilefarm's
own fp32 model, batch 1, untuned (default schedules), timed interleaved in one process (bench.kernels).

    python -m bench.int8_models [--only resnet18] [--threads 1] [--repeat 9] [--calibration 8] [--generic]

Each example is quantized by onnxruntime's quantize_static (QDQ, per-channel int8 weights, uint8 activations: the
U8S8 form onnxruntime advises on x86 and fuses completely) on --calibration seeded standard-normal inputs. Systems:
tilefarm-int8 (the packed dot-product route: compiler/model/int8_layout.py), onnxruntime-int8, tilefarm-fp32 (the
float example), and with --generic tilefarm-int8-generic (the same int8 model with the route's passes disabled: the
generic integer loops). Before timing, tilefarm's int8 outputs are compared with onnxruntime's (the largest
difference in steps of the output's quantization scale: the outputs are dequantized int8 values) and with the
generic route's (bit for bit).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from bench.kernels import interleaved
from bench.models import batch1_inputs, ort_session
from tilefarm.examples import EXAMPLES

ROUTE = ("pack_integer_matmuls", "pack_integer_convs")
MIN_SAMPLE_MS = 100


def quantize(model: onnx.ModelProto, shape: list[int], count: int, folder: Path) -> onnx.ModelProto:
    """`model` quantized as `tilefarm quantize --per-channel` does it (QDQ, per-channel int8 weights, uint8
    activations, minmax) on `count` seeded standard-normal inputs."""
    from tilefarm.quantize import quantize as quantize_file

    rng = np.random.default_rng(1)
    src, calib, out = folder / "f.onnx", folder / "calibration.npz", folder / "q.onnx"
    onnx.save(model, str(src))
    np.savez(calib, **{model.graph.input[0].name: rng.standard_normal((count, *shape[1:])).astype(np.float32)})
    quantize_file(src, out, calib, per_channel=True)
    return onnx.load(str(out))


def compile_model(model: onnx.ModelProto, feeds: dict, path: Path, disabled: tuple[str, ...] = ()):
    from compiler.artifact.build import build
    from compiler.artifact.runtime import Artifact
    from compiler.model.onnx_import import load

    graph = load(model, {k: list(v.shape) for k, v in feeds.items()})
    build(graph, path, name=path.stem, disabled_passes=disabled)
    return Artifact.load(path)


def output_step(model: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear that makes the (first) graph output."""
    out = model.graph.output[0].name
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.output[0] == out and n.op_type == "DequantizeLinear":
            return float(inits[n.input[1]].reshape(-1)[0])
    raise ValueError(f"output {out!r} is not made by a DequantizeLinear")


def run(name: str, threads: list[int], repeat: int, calibration: int, generic: bool) -> None:
    fp32 = EXAMPLES[name](seed=0)
    feeds = batch1_inputs(fp32)
    (x,) = feeds
    with tempfile.TemporaryDirectory(prefix="tilefarm-int8-") as tmp:
        folder = Path(tmp)
        q = quantize(fp32, list(feeds[x].shape), calibration, folder)
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
            ours, theirs = artifacts["tilefarm-int8"].run(feeds), ort_int8(feeds)
            diff = max(float(np.abs(ours[k] - v).max()) for k, v in theirs.items()) / step
            equal = sum(int(np.array_equal(ours[k], v)) for k, v in theirs.items())
            print(f"  {n} thr: int8 outputs vs onnxruntime: max {diff:.0f} output steps, {equal} of {len(theirs)} "
                  f"outputs equal")  # fmt: skip
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
            base = ms["tilefarm-int8"]
            for system in (k for k in ms if k != "tilefarm-int8"):
                print(f"  {n} thr  {system} / tilefarm-int8  speed ratio {ms[system] / base:.2f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="resnet18", help="comma-separated example names")
    p.add_argument("--threads", default="1")
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--calibration", type=int, default=8, help="synthetic calibration inputs")
    p.add_argument("--generic", action="store_true", help="also time the int8 model without the packed route")
    a = p.parse_args(argv)
    import onnxruntime

    from compiler.targets import host_target

    host = host_target()
    vnni = "AVX512-VNNI" if host.has("avx512vnni") else "AVX-VNNI" if host.has("avxvnni") else "no VNNI"
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"CPU: {host.cpu_model} ({host.mcpu}, {vnni}, {host.vector_bytes * 8}-bit vectors), {os.cpu_count()} "
          f"vCPUs; onnxruntime {onnxruntime.__version__}; load average at the start {load}")  # fmt: skip
    for name in a.only.split(","):
        print(name, flush=True)
        run(name, [int(t) for t in a.threads.split(",")], a.repeat, a.calibration, a.generic)


if __name__ == "__main__":
    main()
