"""Kernel benchmark: tilefarm (naive and hand-scheduled) against numpy/OpenBLAS and onnxruntime, in one run.

    python -m bench.kernels [--threads 1,2] [--repeat 7] [--json rows.json] [--only gemm]

Timings are interleaved (one sample of each system in turn, repeated) and medians are reported, because 1-3 ms
kernels on a shared 2-core machine swing by up to 2x between runs; compare the ratios, which come from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from compiler.base.arrays import aligned
from compiler.model.passes import CONV_BLOCK, pack_conv_weight
from compiler.schedule import hand_schedules as schedules
from compiler.schedule.lower import lower
from compiler.schedule.state import State, initial_state
from compiler.targets import host_target
from compiler.targets.cpu.codegen import compile_funcs
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG


@dataclass(frozen=True)
class Workload:
    name: str
    inputs: list[te.Tensor]
    output: te.Tensor
    hand: Callable[[ComputeDAG], State] | None
    onnx_node: Callable[[], tuple]  # -> (onnx node, input names, constant initializers)
    # the inputs' shapes in the ONNX node's layout, and the map to the kernel's layout, where they differ
    onnx_shapes: tuple[tuple[int, ...], ...] = ()
    to_kernel: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None
    flop: int | None = None  # the FLOP count GFLOP/s is quoted in, where it is not the DAG's own
    # the layer as it runs inside a model, NCHWc in and out: onnxruntime runs its NCHWc conv node alone
    nchwc: bool = False

    def flop_count(self, dag) -> int:
        return self.flop or dag.flop_count

    def arrays(self, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Random inputs in the ONNX layout (for onnxruntime and numpy) and the same values as the kernel takes them,
        64-byte aligned as an artifact's weights and workspace are (and as the tuner measured them)."""
        rng = np.random.default_rng(seed)
        ref = [rng.standard_normal(s).astype(np.float32) for s in self.onnx_shapes or [t.shape for t in self.inputs]]
        return ref, [aligned(a) for a in (self.to_kernel(ref) if self.to_kernel else ref)]


def gemm(n: int) -> Workload:
    A, B = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
    return Workload(f"gemm_{n}", [A, B], ops.matmul(A, B, name="C"), schedules.gemm, lambda: ("MatMul", {}, []))


def _conv_node() -> tuple:
    return "Conv", {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}, [1]


def conv(c: int, hw: int) -> Workload:
    data = te.placeholder((1, c, hw, hw), name="data")
    weight = te.placeholder((c, c, 3, 3), name="weight")
    out = ops.conv2d_nchw(data, weight, stride=1, padding=1, name="conv")
    return Workload(f"conv2d_{c}x{hw}x{hw}_3x3", [data, weight], out, schedules.conv2d, _conv_node)


def blocked_conv(c: int, hw: int) -> Workload:
    """The same layer as tilefarm compiles it inside a model, where the weight is a constant that the
    block_conv_weights pass packs at compile time."""
    data = te.placeholder((1, c, hw, hw), name="data")
    weight = te.placeholder((c // CONV_BLOCK, c, 3, 3, CONV_BLOCK), name="weight")
    out = ops.conv2d_nchw_blocked(data, weight, padding=1, name="conv")
    shapes = ((1, c, hw, hw), (c, c, 3, 3))
    pack = lambda a: [a[0], pack_conv_weight(a[1])]
    return Workload(f"conv2d_{c}x{hw}x{hw}_3x3", [data, weight], out, None, _conv_node, shapes, pack)


def winograd_conv(c: int, hw: int, m: int = 4, suffix: str = "") -> Workload:
    """The layer as Winograd F(m x m, 3 x 3), its weight transformed at compile time, NCHWc activations in and out
    (as between two convs; onnxruntime runs its NCHWc conv node the same way). With m = 4 it is the layer as
    tilefarm compiles it inside a model (the `winograd_convs` pass takes every 3x3 stride-1 conv with at least 16
    output tiles of 4x4)."""
    from compiler.model.winograd import winograd_matrices, winograd_weight
    from compiler.tensor.ops.winograd import conv2d_winograd

    a = m + 2
    b = CONV_BLOCK
    data = te.placeholder((1, c // b, hw, hw, b), name="data")
    weight = te.placeholder((a, a, c // b, c, b), name="weight")
    bt, at = te.placeholder((a, a), name="bt"), te.placeholder((m, a), name="at")
    out = conv2d_winograd(data, weight, bt, at, padding=1, name="conv", out_blocked=True)
    shapes = ((1, c, hw, hw), (c, c, 3, 3))
    mat_at, _, mat_bt = winograd_matrices(m)
    f32 = np.float32

    def to_kernel(arr):
        return [to_nchwc(arr[0]), winograd_weight(arr[1], m, b), mat_bt.astype(f32), mat_at.astype(f32)]

    flop = 2 * c * c * 9 * hw * hw  # the direct conv's count, as GFLOP/s figures for Winograd convs are quoted
    name = f"conv2d_{c}x{hw}x{hw}_3x3{suffix}"
    return Workload(name, [data, weight, bt, at], out, None, _conv_node, shapes, to_kernel, flop, nchwc=True)


def to_nchwc(x: np.ndarray, block: int = CONV_BLOCK) -> np.ndarray:
    """An N x C x H x W array laid out N x C/b x H x W x b (the blocked activations of a model's convs: b = 16)."""
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


def _direct(w: Workload) -> Workload:
    return replace(w, name=f"{w.name}_direct")


WORKLOADS = [gemm(512), gemm(1024), conv(64, 56), conv(128, 28), conv(256, 14)]
# what bench.tuning tunes: the conv layers in the form a model compiles them to, and (`_direct`) as the blocked
# direct conv the compiler used before Winograd
_LAYERS = [(64, 56), (128, 28), (256, 14)]
TUNING_WORKLOADS = [
    gemm(512),
    gemm(1024),
    *(winograd_conv(c, hw) for c, hw in _LAYERS),
    *(_direct(blocked_conv(c, hw)) for c, hw in _LAYERS),
]
# tuned only when named (`bench.tuning --only`): the layers as F(2x2, 3x3), and ResNet-18's 7x7 stage (512 channels),
# which the `winograd_convs` pass leaves direct, as that and as F(2x2, 3x3)
ALTERNATIVE_WORKLOADS = [
    *(winograd_conv(c, hw, 2, "_f2") for c, hw in [*_LAYERS, (512, 7)]),
    _direct(blocked_conv(512, 7)),
]


def tuning_workload(name: str) -> Workload:
    return next(w for w in TUNING_WORKLOADS + ALTERNATIVE_WORKLOADS if w.name == name)


def ort_options(threads: int):
    """onnxruntime's session options for a benchmark: `threads` intra-op threads and otherwise its defaults.

    Its workers keep their default spin-wait between parallel sections and runs: turning spinning off made a 2-thread
    3x3 conv (64x56x56) 2.0x slower (2.54 against 1.25 ms on a Zen 4 host), which flattered us, not it. Their
    spinning stops long before interleaved() times the next system (SETTLE_S)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    return so


def onnx_session(w: Workload, arrays: list[np.ndarray], threads: int):
    """An onnxruntime session computing the workload; weights (for conv) are initializers, as in a real model.
    Returns (run, result): `run` is what is timed, `result` runs it and gives the output as the kernel lays it out."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    op, attrs, const_ids = w.onnx_node()
    names = [t.name for t in w.inputs][: len(arrays)]  # the ONNX node's inputs: a kernel may take more constants
    feeds = [n for i, n in enumerate(names) if i not in const_ids]
    inits = [numpy_helper.from_array(arrays[i], names[i]) for i in const_ids]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], **attrs)],
        w.name,
        [
            helper.make_tensor_value_info(names[i], TensorProto.FLOAT, list(arrays[i].shape))
            for i in range(len(names))
            if i not in const_ids
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(w.output.shape))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by every onnxruntime release we support
    onnx.checker.check_model(model)
    if w.nchwc:
        return _nchwc_node(model, arrays[0], threads)
    sess = ort.InferenceSession(model.SerializeToString(), ort_options(threads), providers=["CPUExecutionProvider"])
    feed = {n: arrays[names.index(n)] for n in feeds}
    run = lambda: sess.run(None, feed)[0]  # noqa: E731
    return run, run


def _nchwc_node(model, x: np.ndarray, threads: int):
    """onnxruntime's own NCHWc conv node for a one-Conv model, run alone: its graph optimizer rewrites the model to
    ReorderInput -> NCHWc Conv -> ReorderOutput (weights reordered at load); the reorders are dropped, so the node
    takes and returns NCHWc data, as it does between two convs of a model. Its channel block is MLAS's (16 with
    AVX-512, 8 with AVX2), found by running the ReorderInput alone. Returns (run, result): `run` calls the node,
    `result` gives its output in the kernel's NCHWc order (N x C/16 x H x W x 16)."""
    import tempfile

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort_options(threads)
        so.optimized_model_filepath, so.log_severity_level = f"{tmp}/opt.onnx", 3
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        opt = onnx.load(f"{tmp}/opt.onnx")
    if [n.op_type for n in opt.graph.node] != ["ReorderInput", "Conv", "ReorderOutput"]:
        raise RuntimeError(f"onnxruntime did not make an NCHWc conv: {[n.op_type for n in opt.graph.node]}")

    def session(k: int):
        """Node k of the optimized model alone, from the model's input to its output."""
        g = onnx.ModelProto()
        g.CopyFrom(opt)
        node = onnx.NodeProto()
        node.CopyFrom(g.graph.node[k])
        node.input[0], node.output[0] = g.graph.input[0].name, g.graph.output[0].name
        g.graph.ClearField("node")
        g.graph.node.append(node)
        so = ort_options(threads)
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(g.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return lambda feed: sess.run(None, {g.graph.input[0].name: feed})[0]

    reordered = session(0)(x).ravel()
    block = next((b for b in (16, 8, 4) if np.array_equal(reordered, to_nchwc(x, b).ravel())), None)
    if block is None:
        raise RuntimeError("onnxruntime's ReorderInput is not an NCHWc blocking with 4, 8 or 16 channels")
    run_conv = session(1)
    feed = to_nchwc(x, block).reshape(x.shape)  # onnxruntime keeps NCHWc data in a 4-D shape
    n, c, h, w = x.shape

    def result() -> np.ndarray:
        y = run_conv(feed)
        f = y.shape[1]
        nchw = y.reshape(n, f // block, h, w, block).transpose(0, 1, 4, 2, 3).reshape(y.shape)
        return to_nchwc(nchw)

    return lambda: run_conv(feed), result


SETTLE_S = 0.12  # OpenBLAS workers spin ~2^28 cycles after a call; let them sleep before timing the next system


def interleaved(systems: dict[str, Callable[[], object]], repeat: int, min_ms: float) -> dict[str, float]:
    """Median seconds per call of each system, sampling them in turn; a sample is one warm-up call, then calls until
    min_ms have passed (at least one).

    A sample is bounded by time, not by a call count estimated beforehand: the estimate came from a process's first
    calls, which are slow (thread pools start, pages fault in: a 2-thread GEMM 512 ran 1-2.6 ms per call for its
    first ten calls, 0.56 ms after), and the samples it sized lasted a few milliseconds, so one slow call (the first
    after a pause takes ~2x) decided them."""
    samples: dict[str, list[float]] = {k: [] for k in systems}
    for _ in range(repeat):
        for k, fn in systems.items():
            time.sleep(SETTLE_S)
            fn()  # warm this system's caches and wake its threads
            calls, t = 0, time.perf_counter()
            while calls == 0 or time.perf_counter() - t < min_ms / 1e3:
                fn()
                calls += 1
            samples[k].append((time.perf_counter() - t) / calls)
    return {k: statistics.median(v) for k, v in samples.items()}


L3_PROBE = "l3-copy-probe"
L3_PROBE_BYTES = 8 << 20  # above any host's per-core L2 here (at most 2 MiB), a quarter of their 32 MiB L3


def l3_probe() -> tuple[Callable[[], object], Callable[[float], float]]:
    """A "system" to time among the others: copy 8 MiB (an L3-resident buffer) into another; and the map from its
    seconds per call to GB/s moved (read and write).

    On these 2-vCPU virtual machines the L3 is shared with other tenants. When they use it heavily, a kernel whose
    working set outgrows the L2 slows down while one that stays in L2 hardly moves: on a Zen 5 host a tuned Winograd
    conv (64 channels, 56x56; ~6 MB of data, weights and intermediates) took a median 0.46 ms while a 4 MiB copy
    moved 110 GB/s and 1.20 ms while it moved 65 GB/s, an L2-resident copy unchanged and a compute-bound GEMM 12%
    slower (bench/results/l3-contention-zen5-2026-11-26.txt). Timed in turn with the systems, it tells a reader
    which timings were taken in a contended period."""
    src = np.ones(L3_PROBE_BYTES // 4, np.float32)
    dst = np.empty_like(src)
    return (lambda: np.copyto(dst, src)), (lambda seconds: 2 * L3_PROBE_BYTES / seconds / 1e9)


def blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info

        blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        return ", ".join(f"{i['internal_api']} {i.get('version')} ({i.get('architecture')})" for i in blas) or "?"
    except ImportError:
        return "threadpoolctl not installed"


AVX512_OPENBLAS_CORES = ("SkylakeX", "Cooperlake", "SapphireRapids")  # OpenBLAS's core types with AVX-512 sgemm


def fair_openblas_env() -> dict[str, str]:
    """What a process that times numpy/OpenBLAS on this host needs in its environment (read when OpenBLAS loads):
    OPENBLAS_CORETYPE=SkylakeX where the host has AVX-512 but OpenBLAS runs kernels without it, else nothing.

    OpenBLAS's DYNAMIC_ARCH falls back to its AVX2 Haswell kernels on a CPU it does not know, and some machines pin
    OPENBLAS_CORETYPE=Haswell in their environment (this workplace's do). On Zen 5, with its full-width AVX-512,
    that halves the reference: sgemm 512 at 1 thread 126 GFLOP/s, 243 with the SkylakeX kernels. A reference must
    be the best the library does on the host, so the benchmarks override it and print the core type they timed."""
    from threadpoolctl import threadpool_info

    archs = {i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"}
    host = host_target()
    if archs and not archs & set(AVX512_OPENBLAS_CORES) and all(
        host.has(f) for f in ("avx512f", "avx512dq", "avx512bw", "avx512vl")
    ):
        return {"OPENBLAS_CORETYPE": "SkylakeX"}
    return {}


def run_workload(w: Workload, threads: list[int], repeat: int, rows: list[dict]) -> None:
    from threadpoolctl import threadpool_limits

    dag = ComputeDAG([*w.inputs, w.output])
    _, arrays = w.arrays()
    out = aligned(np.zeros(w.output.shape, np.float32))
    kernels = {}
    for label, state in (("naive", initial_state(dag)), ("hand", w.hand(dag))):
        func = lower(state, f"{w.name}_{label}")
        built = compile_funcs([func])
        kernels[label] = built[func.name]
        print(f"  {label:5s} JIT compile {built.compile_seconds:.3f} s")
    reference = None
    for t in threads:
        os.environ["TILEFARM_NUM_THREADS"] = str(t)
        ort_fn, ort_result = onnx_session(w, arrays, t)
        reference = ort_result()
        for label, k in kernels.items():
            out[...] = 0
            k(*arrays, out)
            np.testing.assert_allclose(out, reference, rtol=1e-3, atol=1e-3, err_msg=f"{w.name} {label} is wrong")
        systems = {
            "tilefarm-naive": lambda: kernels["naive"](*arrays, out),
            "tilefarm-hand": lambda: kernels["hand"](*arrays, out),
            "onnxruntime": ort_fn,
        }
        if w.name.startswith("gemm"):
            systems["numpy-openblas"] = lambda: np.matmul(arrays[0], arrays[1])
        naive = {"tilefarm-naive": systems.pop("tilefarm-naive")}
        with threadpool_limits(limits=t, user_api="blas"):
            medians = interleaved(systems, repeat, min_ms=30)
            medians.update(interleaved(naive, 3, min_ms=0))
        for system, sec in sorted(medians.items()):
            row = {
                "workload": w.name,
                "system": system,
                "threads": t,
                "median_ms": round(sec * 1e3, 4),
                "gflops": round(dag.flop_count / sec / 1e9, 2),
            }
            rows.append(row)
            print(f"  {t} thr  {system:15s} {row['median_ms']:10.3f} ms {row['gflops']:8.1f} GFLOP/s")
        hand = medians["tilefarm-hand"]
        for ref in ("numpy-openblas", "onnxruntime"):
            if ref in medians:
                print(f"  {t} thr  hand / {ref:15s} speed ratio {medians[ref] / hand:.2f}")


def parse_args(argv: list[str] | None, description: str, what: str) -> tuple[argparse.Namespace, list[int]]:
    """The options every benchmark takes; returns them and the thread counts."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--repeat", type=int, default=7, help="interleaved samples per system")
    p.add_argument("--json", help="write the rows here as a JSON list")
    p.add_argument("--only", help=f"run {what} whose name contains this")
    args = p.parse_args(argv)
    return args, [int(t) for t in args.threads.split(",")]


def main(argv: list[str] | None = None) -> None:
    args, threads = parse_args(argv, __doc__.splitlines()[0], "workloads")
    if env := fair_openblas_env():  # OpenBLAS reads it when it loads, so start again with it
        os.execve(sys.executable, [sys.executable, "-m", "bench.kernels", *sys.argv[1:]], {**os.environ, **env})
    print(f"BLAS: {blas_info()}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    rows: list[dict] = []
    for w in WORKLOADS:
        if args.only and args.only not in w.name:
            continue
        print(f"{w.name}: {ComputeDAG([*w.inputs, w.output]).flop_count / 1e9:.3f} GFLOP")
        run_workload(w, threads, args.repeat, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
