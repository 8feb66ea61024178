"""Loading and running artifacts with ctypes and numpy only (no compiler, no llvmlite, no onnx needed).

An artifact is one .tar: a shared library holding every kernel, the weights and an AOT entry point that runs the
whole graph in one native call over a planned workspace; its C header; and meta.json (inputs, outputs, target,
host, records used, the kernel call plan, sha256 of every file). `compiler.artifact.build` makes them.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from compiler.base.arrays import aligned_empty
from compiler.base.errors import TilefarmError


class ArtifactError(TilefarmError):
    """An artifact that is missing a file, was tampered with, or was given the wrong inputs."""


class Artifact:
    """A compiled model: `Artifact.load(path).run({"x": array}) -> {"y": array}`."""

    def __init__(self, meta: dict, lib: ctypes.CDLL, tmpdir: tempfile.TemporaryDirectory):
        self.meta, self._lib, self._tmp = meta, lib, tmpdir
        self._lib.tilefarm_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._lib.tilefarm_run.restype = ctypes.c_int
        self._threads = ctypes.c_int.in_dll(lib, "tilefarm_num_threads")
        self._workspace = aligned_empty((max(1, meta["workspace_bytes"]),), np.uint8)

    @staticmethod
    def load(path: str | Path) -> Artifact:
        tmp = tempfile.TemporaryDirectory(prefix="tilefarm-")
        try:
            with tarfile.open(path) as tar:
                tar.extractall(tmp.name, filter="data")
        except (OSError, tarfile.TarError) as e:
            raise ArtifactError(f"cannot read artifact {path}: {e}") from None
        root = Path(tmp.name)
        try:
            meta = json.loads((root / "meta.json").read_text())
        except (OSError, ValueError) as e:
            raise ArtifactError(f"artifact {path} has no readable meta.json: {e}") from None
        for f, digest in meta["sha256"].items():
            if not (root / f).exists() or hashlib.sha256((root / f).read_bytes()).hexdigest() != digest:
                raise ArtifactError(f"artifact {path}: {f} is missing or does not match its sha256 in meta.json")
        _check_runs_here(meta, path)
        # what the target's library runs with (the CPU's: libgomp's wait policy, read once as it loads); the user's
        # own settings win
        for k, v in meta.get("environment", {}).items():
            os.environ.setdefault(k, v)
        return Artifact(meta, ctypes.CDLL(str(root / meta["library"])), tmp)

    @property
    def input_names(self) -> list[str]:
        return [i["name"] for i in self.meta["inputs"]]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = []
        for spec in self.meta["inputs"]:
            if spec["name"] not in inputs:
                raise ArtifactError(f"missing input {spec['name']!r}; the model takes {self.input_names}")
            a = np.asarray(inputs[spec["name"]], dtype=spec["dtype"], order="C")  # ascontiguousarray makes a scalar 1-D
            if list(a.shape) != spec["shape"]:
                raise ArtifactError(f"input {spec['name']!r} must have shape {spec['shape']}, got {list(a.shape)}")
            args.append(a)
        outs = [np.empty(o["shape"], o["dtype"]) for o in self.meta["outputs"]]
        self._threads.value = int(os.environ.get("TILEFARM_NUM_THREADS", "0") or 0)
        ins_p = (ctypes.c_void_p * max(1, len(args)))(*[a.ctypes.data for a in args])
        outs_p = (ctypes.c_void_p * max(1, len(outs)))(*[o.ctypes.data for o in outs])
        ws = self._workspace.ctypes.data
        rc = self._lib.tilefarm_run(ins_p, outs_p, ctypes.c_void_p(ws))
        if rc != 0:
            raise ArtifactError(self.meta.get("errors", {}).get(str(rc), f"tilefarm_run returned {rc}"))
        self._last = (args, outs, ws)
        # an output a loop's condition may end early holds as many rows as the loop ran (its shape is their bound)
        for k, o in enumerate(self.meta["outputs"]):
            if "length_at" in o:
                outs[k] = outs[k][: int(self._workspace[o["length_at"] : o["length_at"] + 8].view(np.int64)[0])]
        return {o["name"]: a for o, a in zip(self.meta["outputs"], outs)}

    def profile(self, inputs: dict[str, np.ndarray], repeat: int = 10) -> list[dict]:
        """Median seconds of each kernel call in the plan, on the buffers of a full run, two ways: `seconds`, the call
        made `repeat` times in a row (its weights and inputs hot in cache, as the tuner measures a task), and
        `in_run`, each call timed while the whole plan runs in order `repeat` times (its memory as cold or warm as a
        real run leaves it: a model whose weights outgrow the last-level cache reads them from DRAM every run)."""
        self.run(inputs)
        args, outs, ws = self._last
        params = ctypes.addressof(ctypes.c_char.in_dll(self._lib, "tilefarm_params"))
        base = {"input": [a.ctypes.data for a in args], "output": [o.ctypes.data for o in outs]}
        calls = []
        for call in self.meta["calls"]:
            ptrs = [base[k][i] if k in base else (params if k == "param" else ws) + i for k, i in call["args"]]
            fn = getattr(self._lib, call["kernel"])
            fn.restype, fn.argtypes = None, [ctypes.c_void_p] * len(ptrs)
            calls.append((fn, ptrs))
        in_run = np.array([[_seconds(fn, ptrs) for fn, ptrs in calls] for _ in range(repeat)])
        return [
            {
                "kernel": call["kernel"],
                "task": call["task"],
                "nodes": call.get("nodes", []),  # the model's nodes the call computes (artifacts since 2026-11-29)
                "seconds": float(np.median([_seconds(fn, ptrs) for _ in range(repeat)])),
                "in_run": float(np.median(in_run[:, k])),
            }
            for k, (call, (fn, ptrs)) in enumerate(zip(self.meta["calls"], calls))
        ]


def _check_runs_here(meta: dict, path: str | Path) -> None:
    """Refuse an artifact compiled for a CPU with instructions this one lacks (cross-compiled: `compile --target "llvm
    -mcpu=skylake-avx512"` on an AVX2 machine), before its code can die of an illegal instruction. The artifact names
    what it needs (meta "requires", per LLVM feature the flag /proc/cpuinfo lists); where this machine does not say
    (no /proc/cpuinfo flags: not Linux on x86), it is not checked."""
    arch = meta.get("requires", {}).get("cuda_arch")
    if arch:
        _refuse_gpu_artifact(path, arch)
    needs = meta.get("requires", {}).get("cpuinfo_flags", {})
    flags = cpuinfo_flags() if needs else None
    if not flags:
        return
    missing = [feature for feature, flag in needs.items() if flag not in flags]
    if missing:
        target = meta.get("target", {}).get("name", "another CPU")
        raise ArtifactError(
            f"artifact {path} was compiled for {target}, and this machine's CPU lacks {', '.join(missing)}: its code "
            "cannot run here. Run it on a machine that has them, or compile the model for this one (--target llvm)"
        )


def _refuse_gpu_artifact(path: str | Path, arch: str) -> None:
    """An artifact of CUDA kernels (meta "requires" names their SM version) runs only where the NVIDIA driver
    library (libcuda.so.1, or the file TILEFARM_LIBCUDA names) loads: say so in one line where it does not."""
    driver = os.environ.get("TILEFARM_LIBCUDA") or "libcuda.so.1"
    try:
        ctypes.CDLL(driver)
    except OSError:
        raise ArtifactError(
            f"artifact {path} holds CUDA kernels for {arch}: no CUDA driver on this host ({driver} does not load); "
            "run it on a machine with an NVIDIA GPU, or compile the model for this CPU (--target llvm)"
        ) from None


def cpuinfo_flags() -> frozenset[str]:
    """The instruction-set flags /proc/cpuinfo lists for this machine's first CPU (empty where it lists none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def _seconds(fn, ptrs: list[int]) -> float:
    """Wall time of one call."""
    t = time.perf_counter()
    fn(*ptrs)
    return time.perf_counter() - t
