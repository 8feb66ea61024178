"""TVM MetaSchedule baseline for `python -m bench.tuning --with-tvm`: one workload tuned at a given trial budget.

    .venv-tvm/bin/python bench/tvm_metaschedule.py gemm_512 --threads 2 --trials 64

TVM stays out of the project venv: it lives in its own (see INSTALL below, or any python named by
TILEFARM_TVM_PYTHON), and `tune` runs this file as a script under that python, which prints the result row as JSON
on its last stdout line. Written against apache-tvm 0.27, where MetaSchedule is `tvm.s_tir.meta_schedule` and
targets are JSON dicts (older TVM: `tvm.meta_schedule` and CLI strings like "llvm -mcpu=...").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

# The extras bring xgboost (the cost model) and cloudpickle/psutil (the builder and runner worker processes).
# apache-tvm 0.27.0.post1 is built against tvm-ffi 0.1.14; with 0.1.15 (what pip picks) save_json segfaults, and
# MetaSchedule calls it when a tuning task starts.
INSTALL = (
    "python3 -m venv .venv-tvm && .venv-tvm/bin/pip install "
    "'apache-tvm[meta-schedule,popen-pool]==0.27.0.post1' 'apache-tvm-ffi==0.1.14.post1' numpy"
)
IMPORTS = (
    "import xgboost, cloudpickle, psutil, tvm; from tvm.s_tir import meta_schedule; tvm.ir.save_json(tvm.tirx.const(0))"
)
GEMM = re.compile(r"gemm_(\d+)$")  # N x N x N float32, C = A @ B
CONV = re.compile(r"conv2d_(\d+)x(\d+)x(\d+)_3x3$")  # NCHW (1,C,H,W) x (C,C,3,3), pad 1, stride 1
REPEAT = 7  # timing samples of the best schedule; the median is reported, as in bench.kernels
MIN_SAMPLE_MS = 30  # one sample repeats the kernel until it has run this long (bench.kernels uses the same)
MAX_REL_ERR = 1e-4  # max |tvm - numpy| / max |numpy|; float32 sums reordered by tiling stay well below this


def tvm_python() -> str:
    default = Path(__file__).resolve().parents[1] / ".venv-tvm" / "bin" / "python"
    return os.environ.get("TILEFARM_TVM_PYTHON", str(default))


def available() -> str | None:
    """None when the TVM python can import MetaSchedule, else a one-line reason with the fix."""
    python = tvm_python()
    if not Path(python).exists():
        return f"no TVM python at {python}; run: {INSTALL}"
    try:
        r = subprocess.run([python, "-c", IMPORTS], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return f"{python} took over 300 s to import tvm"
    if r.returncode != 0:
        last = "crashed" if r.returncode < 0 else (r.stderr.strip().splitlines() or ["no output"])[-1]
        return f"{python} cannot run MetaSchedule ({last}); run: {INSTALL}"
    return None


def parse(workload: str) -> tuple[str, tuple[int, ...]]:
    """("gemm", (N,)) or ("conv2d", (C, H, W)); ValueError names the accepted forms."""
    if m := GEMM.match(workload):
        return "gemm", (int(m[1]),)
    if m := CONV.match(workload):
        return "conv2d", (int(m[1]), int(m[2]), int(m[3]))
    raise ValueError(f"unknown workload {workload!r}: expected gemm_<N> or conv2d_<C>x<H>x<W>_3x3")


def flops(kind: str, dims: tuple[int, ...]) -> float:
    if kind == "gemm":
        return 2.0 * dims[0] ** 3
    c, h, w = dims
    return 2.0 * c * h * w * c * 9


def tune(workload: str, threads: int, trials: int, timeout_s: float = 3600) -> dict:
    """Tune `workload` with MetaSchedule in the TVM venv; the row's "error" is None or says what went wrong."""
    row = result_row(workload, threads)
    try:
        parse(workload)
    except ValueError as e:
        return {**row, "error": str(e)}
    # -P (Python >= 3.11) keeps bench/ off sys.path, so bench's modules cannot shadow anything TVM imports.
    cmd = [tvm_python(), "-P", __file__, workload, "--threads", str(threads), "--trials", str(trials)]
    # A new session makes the script and TVM's builder/runner worker processes one group, killed together.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {**row, "error": f"timed out after {timeout_s:.0f} s"}
    lines = out.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = " | ".join(err.strip().splitlines()[-3:])
        return {**row, "error": f"script exited {proc.returncode} without a result: {tail}"}


def result_row(workload: str, threads: int) -> dict:
    return {
        "workload": workload,
        "system": "tvm-metaschedule",
        "threads": threads,
        "trials": 0,
        "tuning_s": None,
        "median_ms": None,
        "gflops": None,
        "error": None,
    }


# Everything below runs only under the TVM python.


def te_workload(kind: str, dims: tuple[int, ...]) -> list:
    """Inputs then output, as te tensors."""
    from tvm import te, topi

    if kind == "gemm":
        (n,) = dims
        A, B = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
        k = te.reduce_axis((0, n), name="k")
        return [A, B, te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")]
    c, h, w = dims
    X, W = te.placeholder((1, c, h, w), name="X"), te.placeholder((c, c, 3, 3), name="W")
    return [X, W, topi.nn.conv2d_nchw(X, W, stride=1, padding=1, dilation=1)]


def reference(kind: str, inputs: list[np.ndarray]) -> np.ndarray:
    if kind == "gemm":
        return inputs[0] @ inputs[1]
    x, w = inputs
    _, _, h, wd = x.shape
    xp = np.pad(x[0], ((0, 0), (1, 1), (1, 1)))
    out = sum(
        np.tensordot(w[:, :, dy, dx], xp[:, dy : dy + h, dx : dx + wd], axes=(1, 0))
        for dy in range(3)
        for dx in range(3)
    )
    return out[None]


def import_tensor_intrinsics() -> None:
    """Builder worker initializer.

    Every build starts fresh workers, and each one's first build imports `tvm.s_tir.tensor_intrin`, which takes
    10-30 s here; inside a build that counts against the 30 s timeout and fails every candidate (seen for gemm_512).
    An initializer runs before the timer starts.
    """
    import tvm.s_tir.tensor_intrin  # noqa: F401


def run(row: dict, trials: int, seed: int, work_dir: str | None = None) -> dict:
    """Fill `row` in place, so a failure late in the run keeps what was measured before it."""
    workload, threads = row["workload"], row["threads"]
    os.environ["TVM_NUM_THREADS"] = str(threads)  # read when TVM's thread pool starts: set before the import
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import codegen

    kind, dims = parse(workload)
    tensors = te_workload(kind, dims)
    func = tvm.te.create_prim_func(tensors)
    # num-cores sizes MetaSchedule's parallel rules. The search threads and the build pool keep MetaSchedule's
    # defaults (physical cores; a build killed after 30 s), as tilefarm's own tuner builds on every core.
    spec = {"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu(), "num-cores": threads}
    # the features tilefarm's side has turned off (TILEFARM_CPU_FEATURES, e.g. -avx512f), off for TVM as well
    edits = [e.strip() for e in os.environ.get("TILEFARM_CPU_FEATURES", "").split(",") if e.strip()]
    if edits:
        spec["mattr"] = edits
    target = tvm.target.Target(spec)
    with tempfile.TemporaryDirectory(prefix="tvm-ms-") as tmp:
        work_dir = work_dir or tmp
        start = time.perf_counter()
        db = ms.tir_integration.tune_tir(
            func,
            target,
            work_dir,
            max_trials_global=trials,
            num_trials_per_iter=64,
            builder=ms.builder.LocalBuilder(initializer=import_tensor_intrinsics),
            seed=seed,
        )
        row["tuning_s"] = round(time.perf_counter() - start, 2)
        row["trials"] = len(db)
        sch = ms.tir_integration.compile_tir(db, func, target)
    if sch is None:
        row["error"] = "MetaSchedule found no valid schedule"
        return row
    lib = tvm.tirx.build(sch.mod, target=target)

    dev = tvm.cpu()
    rng = np.random.default_rng(seed)
    inputs = [rng.uniform(-1, 1, [int(d) for d in t.shape]).astype("float32") for t in tensors[:-1]]
    out_shape = [int(d) for d in tensors[-1].shape]
    args = [tvm.runtime.tensor(x, dev) for x in inputs] + [tvm.runtime.empty(out_shape, "float32", dev)]
    lib["main"](*args)
    ref = reference(kind, inputs)
    rel_err = float(np.abs(args[-1].numpy() - ref).max() / np.abs(ref).max())
    if not rel_err <= MAX_REL_ERR:  # also catches NaN
        row["error"] = f"wrong result: max relative error {rel_err:.2e} > {MAX_REL_ERR:.0e}"
        return row
    timer = lib.time_evaluator("main", dev, number=1, repeat=REPEAT, min_repeat_ms=MIN_SAMPLE_MS)
    median_s = float(timer(*args).median)
    row.update(median_ms=round(median_s * 1e3, 4), gflops=round(flops(kind, dims) / median_s / 1e9, 2))
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", help="gemm_<N> or conv2d_<C>x<H>x<W>_3x3, e.g. gemm_512, conv2d_64x56x56_3x3")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--trials", type=int, default=64, help="MetaSchedule max_trials_global")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", help="keep MetaSchedule's logs and tuning records here (default: a deleted temp dir)")
    args = p.parse_args()
    row = result_row(args.workload, args.threads)
    try:
        run(row, args.trials, args.seed, args.work_dir)
    except Exception as e:  # the caller reads the error from the row instead of a traceback
        row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
