#!/usr/bin/env bash
# Issue 51's check on the GPU device machine (an H200, no network), in two steps:
#
#   bench/gpu_check.sh prepare   here, on a development machine with the venv: downloads the llvmlite wheel the
#                                device's Python 3.12 lacks (tilefarm needs llvmlite 0.50 / LLVM 22) into .whl/
#                                (git-ignored through .git/info/exclude) and says how much will travel (64 MiB cap)
#   bench/gpu_check.sh run       there, through the device tool with carry [".whl"] and a timeout of ~400 s:
#                                installs the wheels, runs the CUDA tests on the GPU (the ones that need a driver
#                                run instead of skipping), then times GEMM 4096^3 fp32 kernels tilefarm's CUDA
#                                codegen builds from hand-written loop IR against PyTorch's cuBLAS with TF32 off,
#                                then bench.gpu_models: GEMM 4096^3 tuned by `tilefarm tune --target cuda` (128
#                                trials) against cuBLAS, and ResNet-18 batch 1 untuned and tuned against PyTorch eager
#
# Everything it prints also lands in $OUT (the device tool brings it back; ./gpu_check_out elsewhere):
# gpu.txt (nvidia-smi), tests.log, gemm.log and gemm.json, models.log and gpu_models.json.
set -euo pipefail
cd "$(dirname "$0")/.."

prepare() {
    local python=.venv/bin/python
    local version
    version=$($python -c 'import llvmlite; print(llvmlite.__version__)')
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    mkdir -p .whl
    rm -f .whl/llvmlite-*.whl
    $python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "llvmlite==$version"
    ls -l .whl
    # what the device tool sends: tracked files, untracked ones git does not ignore, and the carried .whl/
    local bytes
    bytes=$({ git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null; find .whl -type f -exec stat -c %s {} +; } |
        awk '{s += $1} END {print s}')
    echo "travels: $((bytes / 1048576)) MiB of the 64 MiB the device tool takes"
}

run() {
    local out=${OUT:-$PWD/gpu_check_out}
    mkdir -p "$out"
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH=/tmp/site:$PWD
    else
        echo "no .whl/ carried: using the device's own llvmlite" && export PYTHONPATH=$PWD
    fi
    export PYTHONUNBUFFERED=1
    # the device's CUDA toolkit brings ptxas and libdevice where the pip wheels are not installed
    local cuda=${CUDA_HOME:-/usr/local/cuda}
    [ -x "$cuda/bin/ptxas" ] && export TILEFARM_PTXAS=$cuda/bin/ptxas
    [ -f "$cuda/nvvm/libdevice/libdevice.10.bc" ] && export TILEFARM_LIBDEVICE=$cuda/nvvm/libdevice/libdevice.10.bc
    python3 -c 'import llvmlite, numpy, torch; print("llvmlite", llvmlite.__version__, "numpy", numpy.__version__,
        "torch", torch.__version__)'
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv |
        tee "$out/gpu.txt" || true

    echo "== CUDA tests on the GPU"
    python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda_codegen.py tests/test_cuda_driver.py 2>&1 |
        tee "$out/tests.log" || true

    echo "== GEMM 4096^3 fp32: tilefarm's CUDA kernels against cuBLAS (TF32 off)"
    OUT_DIR=$out python3 - <<'PY' 2>&1 | tee "$out/gemm.log"
import json
import os

import numpy as np
import torch

from compiler.base.errors import MissingExtra
from compiler.targets.cuda.codegen import arch_for, compile_func
from compiler.targets.cuda.driver import Driver
from compiler.targets.cuda.fingerprint import gpu_fingerprint
from compiler.targets.cuda.ptx import assemble
from bench.gpu_models import events_ms
from tests.test_cuda_codegen import gemm_func

N = 4096
FLOP = 2 * N**3
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

drv = Driver()
drv.use_primary_context(drv.device(0))  # the context PyTorch's runtime uses too
fp = gpu_fingerprint(drv)
arch = arch_for(fp.compute_capability)
print(fp)
rng = np.random.default_rng(0)
A = rng.standard_normal((N, N), dtype=np.float32)
B = rng.standard_normal((N, N), dtype=np.float32)
tA, tB = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
reference = (tA @ tB).cpu().numpy()


def median_ms(launch) -> float:
    """Median of the timings of `launch` between two CUDA events (bench.gpu_models.events_ms)."""
    return events_ms(drv, launch)


cublas_ms = median_ms(lambda: torch.matmul(tA, tB))
results = {"gpu": str(fp), "n": N, "cublas_ms": cublas_ms, "cublas_gflops": FLOP / cublas_ms / 1e6, "kernels": []}
print(f"cuBLAS (torch.matmul, TF32 off): {cublas_ms:.3f} ms, {FLOP / cublas_ms / 1e6:.0f} GFLOP/s")

bufs = [drv.alloc(N * N * 4) for _ in range(3)]
drv.to_device(bufs[0], A)
drv.to_device(bufs[1], B)
for tile, kt, reg in ((128, 8, 8), (128, 16, 8), (64, 16, 4)):
    (kernel,) = compile_func(gemm_func(N, N, N, tile=tile, kt=kt, reg=reg), arch).kernels
    try:
        image, report = assemble(kernel.ptx, kernel.name, arch.name)
    except MissingExtra as err:  # no ptxas here: the driver compiles the PTX itself
        image, report = kernel.ptx, err
    module = drv.load_module(image)
    fn = drv.function(module, kernel.name)
    drv.fill(bufs[2], 0)
    drv.launch(fn, kernel.grid, kernel.block, bufs)
    drv.synchronize()
    C = np.empty((N, N), np.float32)
    drv.to_host(C, bufs[2])
    error = float(np.abs(C - reference).max() / np.abs(reference).max())
    ms = median_ms(lambda fn=fn, k=kernel: drv.launch(fn, k.grid, k.block, bufs))
    row = {"tile": tile, "kt": kt, "reg": reg, "ms": ms, "gflops": FLOP / ms / 1e6, "vs_cublas": cublas_ms / ms,
           "max_rel_error": error, "ptxas": str(report)}
    results["kernels"].append(row)
    print(f"tile {tile}x{tile}, k-slice {kt}, {reg}x{reg} per thread: {ms:.3f} ms, {row['gflops']:.0f} GFLOP/s, "
          f"{row['vs_cublas']:.2f}x cuBLAS, max error {error:.1e} of max |C|; {report}")
    drv.unload_module(module)
for b in bufs:
    drv.free(b)
with open(os.path.join(os.environ["OUT_DIR"], "gemm.json"), "w") as f:
    json.dump(results, f, indent=1)
PY

    echo "== tuned: GEMM 4096^3 fp32 (128 trials) against cuBLAS, ResNet-18 batch 1 against PyTorch eager (TF32 off)"
    python3 -m bench.gpu_models --out "$out" --gemm-trials 128 --resnet-trials 256 2>&1 | tee "$out/models.log" || true
}

case "${1:-}" in
prepare) prepare ;;
run) run ;;
*)
    echo "usage: bench/gpu_check.sh prepare|run (see the comment at its top)" >&2
    exit 2
    ;;
esac
