"""The CUDA backend: takes States and GPU loop IR, gives PTX kernels for NVIDIA GPUs (sm_80, sm_90) checked and
assembled by ptxas, built anywhere, measured and run only where the NVIDIA driver is (compiler.targets' `Backend`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from compiler.base.target import Target
from compiler.schedule import gpu_interp
from compiler.schedule.loopir import Func
from compiler.schedule.state import State
from compiler.targets.cuda import artifact, host_entry
from compiler.targets.cuda.codegen.memory import PARAM_ALIGN, split_launches
from compiler.targets.cuda.default_schedule import default_schedule
from compiler.targets.cuda.fingerprint import local_gpus
from compiler.targets.cuda.measure import CudaBuilder, CudaRunner
from compiler.targets.cuda.space import CudaSearchSpace
from compiler.targets.cuda.target import (
    L2_BYTES,
    arch_of,
    check_runs_here,
    cuda_target,
    parse_target,
    runtime_requirements,
)
from compiler.tensor.dag import ComputeDAG


class CudaBackend:
    kind = "cuda"
    alignment = max(PARAM_ALIGN, 64)  # every buffer a kernel gets on 16 bytes at least; 64 as the CPU's weights
    library_env: Mapping[str, str] = {}

    parse_target = staticmethod(parse_target)
    check_runs_here = staticmethod(check_runs_here)
    runtime_requirements = staticmethod(runtime_requirements)
    search_space = staticmethod(CudaSearchSpace)
    builder = staticmethod(CudaBuilder)
    runner = staticmethod(CudaRunner)

    def host(self) -> Target:
        """The cuda target compiled for where none is named: sm_90 (H100, H200); no GPU is needed to compile."""
        return cuda_target()

    def target_name(self, target: Target) -> str:
        """The target string as tvmc writes it, which parse_target reads back: "cuda -arch=sm_90"."""
        return f"cuda -arch={arch_of(target).name}"

    def default_schedule(self, dag: ComputeDAG, target: Target | None = None) -> State:
        return default_schedule(dag)  # GpuParams' limits hold on sm_80 and sm_90 alike

    def keeps_cached(self, nbytes: int) -> bool:
        return nbytes <= L2_BYTES

    def compile_kernels(self, funcs: Sequence[Func], target: Target | None = None) -> Mapping[str, Callable]:
        """The GPU programs run on numpy arrays by compiler.schedule's GPU interpreter (every thread of every block,
        exact and slow): the in-process path for tests on a host without a GPU."""
        return {f.name: functools.partial(gpu_interp.run, f) for f in funcs}

    def scratch_bytes(self, func: Func) -> int:
        return split_launches(func).workspace_bytes

    def link_artifact(
        self, funcs: Sequence[Func], entry_c: str, params: bytes, folder: Path, name: str, target: Target | None = None
    ) -> Path:
        """The artifact's CUDA files in `folder` (cuda/artifact.py), for `target`'s architecture (default: sm_90);
        returns the launches file. `entry_c` (the CPU's C entry, calling kernels as functions) is not used: the host
        entry finish_artifact builds launches them through the driver API instead."""
        files = artifact.write_kernels(funcs, params, folder, name, arch_of(target or cuda_target()))
        return folder / files[0]

    def finish_artifact(self, folder: Path, name: str, meta: dict, has_control_flow: bool) -> list[str]:
        """The artifact's library, `<name>.so` in `folder`: the native host entry (cuda/host_entry.py) running
        meta.json's plan through the driver API, made the library `meta` names; returns the files it adds. `meta`
        also gets "tuned_for": the GPU(s) whose timings chose its records, or untuned (artifact.tuned_for)."""
        meta["tuned_for"] = artifact.tuned_for(meta["records"], len(meta["tasks"]), local_gpus())
        library = host_entry.link_host_entry(folder, name, meta, has_control_flow)
        meta["library"] = library
        meta["errors"][str(host_entry.CUDA_ERROR_CODE)] = (
            "a CUDA driver call failed (no NVIDIA GPU or driver, or a kernel faulted)"
        )
        return [library]

    def artifact_files(self, folder: Path, name: str) -> list[str]:
        """Files link_artifact wrote into `folder` that the artifact carries besides its library and header."""
        return artifact.listed_files(folder, name)


BACKEND = CudaBackend()
