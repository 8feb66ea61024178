"""int8 GEMM benchmark: tilefarm's int8_matmul (untuned default schedule) against onnxruntime's MatMulInteger and
QLinearMatMul and against tilefarm's own fp32 GEMM of the same shape, in one run.

    python -m bench.int8_gemm [--threads 1,2] [--repeat 7] [--json rows.json] [--only 128x]

Activations u8 with a zero point, weights s8 (symmetric, as onnxruntime's quantizer writes them) and constant: packed
at compile time, as onnxruntime's session packs its initializer. tilefarm's int8 kernel is timed twice, through
vpdpbusd and through the exact vpmaddubsw form VNNI-less hosts get (VNNI turned off in the target's features);
its result must equal onnxruntime's MatMulInteger bit for bit. Timings are interleaved medians (bench.kernels);
GOP/s counts 2*M*N*K operations for every system.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from bench.kernels import interleaved, ort_options, parse_args
from compiler.base.arrays import aligned
from compiler.base.target import Target
from compiler.model.passes import MATMUL_PANEL
from compiler.schedule.lower import lower
from compiler.targets import host_target
from compiler.targets.cpu.codegen import assembly, compile_funcs
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.tensor import te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.ops.int8_matmul import int8_matmul, pack_int8_weight
from compiler.tensor.ops.linalg import packed_matmul

SHAPES = ((512, 768, 768), (128, 768, 3072))  # M x K x N: BERT-base's projections (seq 512) and FFN (seq 128)
A_ZERO = 131


def _kernel(dag: ComputeDAG, name: str, target: Target):
    func = lower(default_schedule(dag, target), name)
    return compile_funcs([func], target)[name], assembly([func], target)


def int8_kernel(M: int, K: int, N: int, w: np.ndarray, target: Target):
    pk = pack_int8_weight(w, 0, A_ZERO)
    A = te.placeholder((M, K), "uint8", "A")
    W = te.placeholder(pk.packed.shape, "int8", "W")
    col = te.placeholder((N,), "int32", "col")
    dag = ComputeDAG([A, W, col, int8_matmul(A, W, col, n=N)])
    kernel, asm = _kernel(dag, f"int8_{M}x{K}x{N}", target)
    return kernel, [aligned(pk.packed), aligned(pk.col)], asm


def fp32_kernel(M: int, K: int, N: int, w: np.ndarray, target: Target):
    """tilefarm's fp32 GEMM as a model compiles it: the constant weight in panels (compiler.model.passes)."""
    A = te.placeholder((M, K), "float32", "A")
    W = te.placeholder((N // MATMUL_PANEL, K, MATMUL_PANEL), "float32", "W")
    dag = ComputeDAG([A, W, packed_matmul(A, W, name="C")])
    kernel, _ = _kernel(dag, f"fp32_{M}x{K}x{N}", target)
    panels = w.astype(np.float32).reshape(K, N // MATMUL_PANEL, MATMUL_PANEL).transpose(1, 0, 2)
    return kernel, aligned(np.ascontiguousarray(panels))


def ort_sessions(a: np.ndarray, w: np.ndarray, threads: int):
    """onnxruntime's MatMulInteger (int32 out) and QLinearMatMul (u8 out) of a and the constant w."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    M, N = a.shape[0], w.shape[1]
    inits = [
        numpy_helper.from_array(w, "B"),
        numpy_helper.from_array(np.array(A_ZERO, np.uint8), "a_zp"),
        numpy_helper.from_array(np.array(0, np.int8), "b_zp"),
        numpy_helper.from_array(np.array(0.02, np.float32), "a_s"),
        numpy_helper.from_array(np.array(0.01, np.float32), "b_s"),
        numpy_helper.from_array(np.array(4.0, np.float32), "y_s"),
        numpy_helper.from_array(np.array(128, np.uint8), "y_zp"),
    ]
    nodes = {
        "MatMulInteger": (helper.make_node("MatMulInteger", ["A", "B", "a_zp", "b_zp"], ["y"]), TensorProto.INT32),
        "QLinearMatMul": (
            helper.make_node("QLinearMatMul", ["A", "a_s", "a_zp", "B", "b_s", "b_zp", "y_s", "y_zp"], ["y"]),
            TensorProto.UINT8,
        ),
    }
    runs = {}
    for op, (node, out_type) in nodes.items():
        graph = helper.make_graph(
            [node],
            op,
            [helper.make_tensor_value_info("A", TensorProto.UINT8, [M, a.shape[1]])],
            [helper.make_tensor_value_info("y", out_type, [M, N])],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        so = ort_options(threads)
        so.log_severity_level = 3  # MatMulInteger's model leaves the scales unused: no warning about them
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        runs[op] = (lambda s: lambda: s.run(None, {"A": a})[0])(sess)
    return runs


def run_shape(M: int, K: int, N: int, rng, host: Target, no_vnni: Target, threads: list[int], repeat: int,
              rows: list[dict]) -> None:  # fmt: skip
    shape, ops = f"{M}x{K}x{N}", 2 * M * N * K
    a = aligned(rng.integers(0, 255, (M, K), dtype=np.uint8, endpoint=True))
    w = rng.integers(-128, 127, (K, N), dtype=np.int8, endpoint=True)
    k8, consts, asm = int8_kernel(M, K, N, w, host)
    k8n, _, asm_n = int8_kernel(M, K, N, w, no_vnni)
    k32, w32 = fp32_kernel(M, K, N, w, host)
    af = aligned(a.astype(np.float32) - A_ZERO)
    out8, out8n = aligned(np.zeros((M, N), np.int32)), aligned(np.zeros((M, N), np.int32))
    out32 = aligned(np.zeros((M, N), np.float32))
    print(f"{shape}: {ops / 1e9:.3f} GOP; int8 kernel: {asm.count('vpdpbusd')} vpdpbusd, without VNNI: "
          f"{asm_n.count('vpmaddubsw')} vpmaddubsw")  # fmt: skip
    for t in threads:
        os.environ["TILEFARM_NUM_THREADS"] = str(t)
        ort_runs = ort_sessions(a, w, t)
        want = ort_runs["MatMulInteger"]()
        k8(a, *consts, out8)
        k8n(a, *consts, out8n)
        assert np.array_equal(out8, want) and np.array_equal(out8n, want), f"{shape}: int8 result differs"
        k32(af, w32, out32)
        # fp32 sums of products up to 2^24 and beyond: rounded, so compared relative to the largest result
        assert np.abs(out32 - want).max() <= 1e-5 * np.abs(want).max(), f"{shape}: fp32 result is wrong"
        systems = {
            "tilefarm-int8": lambda: k8(a, *consts, out8),
            "tilefarm-int8-novnni": lambda: k8n(a, *consts, out8n),
            "ort-MatMulInteger": ort_runs["MatMulInteger"],
            "ort-QLinearMatMul": ort_runs["QLinearMatMul"],
            "tilefarm-fp32": lambda: k32(af, w32, out32),
        }
        medians = interleaved(systems, repeat, min_ms=30)
        for system, sec in medians.items():
            row = {"shape": shape, "system": system, "threads": t, "median_ms": round(sec * 1e3, 4),
                   "gops": round(ops / sec / 1e9, 1)}  # fmt: skip
            rows.append(row)
            print(f"  {t} thr  {system:21s} {row['median_ms']:9.3f} ms {row['gops']:8.1f} GOP/s")
        mine = medians["tilefarm-int8"]
        for ref in ("ort-MatMulInteger", "ort-QLinearMatMul", "tilefarm-fp32"):
            print(f"  {t} thr  int8 / {ref:18s} speed ratio {medians[ref] / mine:.2f}")


def main(argv: list[str] | None = None) -> None:
    import onnxruntime as ort

    args, threads = parse_args(argv, __doc__.splitlines()[0], "shapes")
    host = host_target()
    no_vnni = dataclasses.replace(host, features=host.features.replace("+avx512vnni", "-avx512vnni"))
    vnni = "AVX512-VNNI" if host.has("avx512vnni") else "AVX-VNNI" if host.has("avxvnni") else "no VNNI"
    print(f"CPU: {host.cpu_model} ({host.mcpu}, {vnni}, {host.vector_bytes * 8}-bit vectors); "
          f"onnxruntime {ort.__version__}")  # fmt: skip
    rows: list[dict] = []
    rng = np.random.default_rng(0)
    for M, K, N in SHAPES:
        if not args.only or args.only in f"{M}x{K}x{N}":
            run_shape(M, K, N, rng, host, no_vnni, threads, args.repeat, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
