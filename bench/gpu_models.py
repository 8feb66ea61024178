"""Issue 51's tuned checks on a GPU host: GEMM 4096³ fp32 tuned by `tilefarm tune --target cuda`, and ResNet-18
batch 1 untuned and tuned, each against PyTorch on the same GPU with TF32 off.

    python -m bench.gpu_models [--out DIR] [--gemm-trials 128] [--resnet-trials 256]

GEMM: the best record's program is rebuilt (the compile path's own choice: build.schedule_tasks) and its kernels
timed between CUDA events on device buffers, against torch.matmul; the result is checked against cuBLAS's.
ResNet-18 (`tilefarm example resnet18`): the compiled artifact's run as an application calls it (input copied in,
output copied out), against PyTorch eager running the same ONNX graph through torch.nn.functional with its weights
on the GPU (`torch_module`), timed both with the input already on the GPU and with the copies an application makes.
Everything printed also goes to DIR/gpu_models.json. Runs where torch and the NVIDIA driver are (the device machine;
bench/gpu_check.sh runs it); `torch_module` itself runs anywhere (tests check it against onnxruntime on the CPU).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

GEMM_N = 4096
WARMUP, REPEAT = 3, 20


def gemm_model(n: int) -> onnx.ModelProto:
    """C = A @ B for two n x n float32 inputs."""
    ins = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in ("A", "B")]
    out = helper.make_tensor_value_info("C", TensorProto.FLOAT, [n, n])
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["C"])], "gemm", ins, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def torch_module(model: onnx.ModelProto, device: str) -> Callable:
    """The ONNX graph as a function of its input run by torch.nn.functional, weights on `device`: the ops of
    tilefarm's CNN examples (Conv, BatchNormalization, Relu, MaxPool, Add, GlobalAveragePool, Flatten, Gemm,
    Softmax)."""
    import torch
    import torch.nn.functional as F

    weights = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()).to(device) for t in model.graph.initializer}
    nodes = list(model.graph.node)

    def attr(n, name, default=None):
        for a in n.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def run(x):
        env = {model.graph.input[0].name: x, **weights}
        for n in nodes:
            a = [env[i] if i else None for i in n.input]
            if n.op_type == "Conv":
                pads = attr(n, "pads", [0, 0, 0, 0])
                if pads[:2] != pads[2:]:
                    raise ValueError(f"{n.name}: asymmetric pads {pads}")
                y = F.conv2d(a[0], a[1], a[2] if len(a) > 2 else None, attr(n, "strides", [1, 1]), pads[:2],
                             attr(n, "dilations", [1, 1]), attr(n, "group", 1))  # fmt: skip
            elif n.op_type == "BatchNormalization":
                y = F.batch_norm(a[0], a[3], a[4], a[1], a[2], False, 0.0, attr(n, "epsilon", 1e-5))
            elif n.op_type == "Relu":
                y = F.relu(a[0])
            elif n.op_type == "MaxPool":
                pads = attr(n, "pads", [0, 0, 0, 0])
                y = F.max_pool2d(a[0], attr(n, "kernel_shape"), attr(n, "strides", [1, 1]), pads[:2])
            elif n.op_type == "Add":
                y = a[0] + a[1]
            elif n.op_type == "GlobalAveragePool":
                y = a[0].mean(dim=(2, 3), keepdim=True)
            elif n.op_type == "Flatten":
                y = torch.flatten(a[0], attr(n, "axis", 1))
            elif n.op_type == "Softmax":
                y = F.softmax(a[0], dim=attr(n, "axis", -1))
            elif n.op_type == "Gemm":
                w = a[1].t() if attr(n, "transB", 0) else a[1]
                y = torch.addmm(a[2], a[0], w) if len(a) > 2 and a[2] is not None else a[0] @ w
            else:
                raise ValueError(f"{n.name}: {n.op_type} is not among the ops torch_module runs")
            env[n.output[0]] = y
        return env[model.graph.output[0].name]

    return run


def _tilefarm(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "tilefarm", *args], check=True)


def gemm_check(folder: Path, trials: int, drv, torch) -> dict:
    """The tuned GEMM's kernels against torch.matmul, both between CUDA events on device buffers."""
    from compiler.artifact.build import schedule_tasks
    from compiler.costs.records import JSONLinesDatabase
    from compiler.model.onnx_import import load
    from compiler.schedule.lower import lower
    from compiler.targets import parse_target
    from compiler.targets.cuda.codegen import compile_func
    from compiler.targets.cuda.fingerprint import tuning_target
    from compiler.targets.cuda.ptx import assemble
    from compiler.targets.cuda.target import arch_of
    from compiler.tensor.tasks import plan_tasks

    n, flop = GEMM_N, 2 * GEMM_N**3
    path, records = folder / "gemm.onnx", folder / "gemm.jsonl"
    onnx.save(gemm_model(n), path)
    t0 = time.perf_counter()
    _tilefarm("tune", str(path), "--target", "cuda", "--trials", str(trials), "-o", str(records))
    tuning_s = time.perf_counter() - t0
    target = tuning_target(parse_target("cuda"), drv)  # the GPU's own Target, as the tuning filed its records
    arch = arch_of(target)
    (task,), _, _ = plan_tasks(load(gemm_model(n)))
    (state,), used = schedule_tasks([task], JSONLinesDatabase(records), target)
    program = compile_func(lower(state, "gemm"), arch)
    launches = []
    for k in program.kernels:
        image, report = assemble(k.ptx, k.name, arch.name)
        launches.append((drv.function(drv.load_module(image), k.name), k, report))
    rng = np.random.default_rng(0)
    A, B = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    bufs = [drv.alloc(n * n * 4) for _ in range(3)]
    work = [drv.alloc(program.workspace_bytes)] if program.workspace_bytes else []
    drv.to_device(bufs[0], A)
    drv.to_device(bufs[1], B)

    def run() -> None:
        for fn, k, _ in launches:
            drv.launch(fn, k.grid, k.block, [*bufs, *(work if k.takes_workspace else [])], k.shared_bytes)

    run()
    drv.synchronize()
    C = np.empty((n, n), np.float32)
    drv.to_host(C, bufs[2])
    tA, tB = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
    reference = (tA @ tB).cpu().numpy()
    ours = events_ms(drv, run)
    cublas = events_ms(drv, lambda: torch.matmul(tA, tB))
    return {
        "n": n, "trials": trials, "tuning_s": round(tuning_s, 1), "record": used.get(task.key),
        "tilefarm_ms": ours, "tilefarm_gflops": flop / ours / 1e6, "cublas_ms": cublas,
        "cublas_gflops": flop / cublas / 1e6, "vs_cublas": cublas / ours,
        "max_rel_error": float(np.abs(C - reference).max() / np.abs(reference).max()),
        "ptxas": [str(r) for _, _, r in launches],
    }  # fmt: skip


def events_ms(drv, launch: Callable[[], object]) -> float:
    """Median of REPEAT timings of `launch` between two CUDA events, after WARMUP untimed calls."""
    for _ in range(WARMUP):
        launch()
    start, end = drv.event(), drv.event()
    times = []
    for _ in range(REPEAT):
        drv.record(start)
        launch()
        drv.record(end)
        drv.wait(end)
        times.append(drv.elapsed_ms(start, end))
    drv.destroy_event(start)
    drv.destroy_event(end)
    return float(np.median(times))


def wall_ms(fn: Callable[[], object], sync: Callable[[], object]) -> float:
    """Median of REPEAT wall-clock timings of `fn` followed by `sync`, after WARMUP untimed calls."""
    for _ in range(WARMUP):
        fn()
    sync()
    times = []
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def resnet_check(folder: Path, trials: int, torch) -> dict:
    """ResNet-18 batch 1: tilefarm's artifact untuned and tuned against PyTorch eager on the same GPU."""
    from compiler.artifact.runtime import Artifact
    from tilefarm.examples import EXAMPLES

    model = EXAMPLES["resnet18"](seed=0)
    path, records = folder / "resnet18.onnx", folder / "resnet18.jsonl"
    onnx.save(model, path)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    eager = torch_module(model, "cuda")
    with torch.no_grad():
        tx = torch.from_numpy(x).cuda()
        reference = eager(tx).cpu().numpy()
        torch_on_device = wall_ms(lambda: eager(tx), torch.cuda.synchronize)
        torch_with_copies = wall_ms(lambda: eager(torch.from_numpy(x).cuda()).cpu(), torch.cuda.synchronize)
    out: dict = {"trials": trials, "torch_eager_ms": torch_on_device, "torch_eager_with_copies_ms": torch_with_copies}
    t0 = time.perf_counter()
    _tilefarm("tune", str(path), "--target", "cuda", "--trials", str(trials), "-o", str(records))
    out["tuning_s"] = round(time.perf_counter() - t0, 1)
    for label, extra in (("untuned", []), ("tuned", ["--records", str(records)])):
        tar = folder / f"resnet18-{label}.tar"
        _tilefarm("compile", str(path), "--target", "cuda", "-o", str(tar), *extra)
        artifact = Artifact.load(tar)
        got = next(iter(artifact.run({"input": x}).values()))
        ms = wall_ms(lambda a=artifact: a.run({"input": x}), lambda: None)
        out[label] = {
            "ms": ms, "vs_torch_eager": torch_with_copies / ms,
            "max_rel_diff": float(np.abs(got - reference).max() / np.abs(reference).max()),
        }  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu_check_out", help="where gpu_models.json goes")
    p.add_argument("--gemm-trials", type=int, default=128)
    p.add_argument("--resnet-trials", type=int, default=256)
    args = p.parse_args(argv)
    import torch

    from compiler.targets.cuda.driver import Driver

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.cuda.init()
    drv = Driver()
    drv.use_primary_context(drv.device(0))  # the context PyTorch's runtime uses too
    results = {}
    with tempfile.TemporaryDirectory(prefix="tilefarm-gpu-") as tmp:
        for name, check in (
            ("gemm", lambda: gemm_check(Path(tmp), args.gemm_trials, drv, torch)),
            ("resnet18", lambda: resnet_check(Path(tmp), args.resnet_trials, torch)),
        ):
            try:
                results[name] = check()
            except Exception as e:  # one check failing must not lose the other's figures
                results[name] = {"error": f"{type(e).__name__}: {e}"}
            print(name, json.dumps(results[name], indent=1), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_models.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
