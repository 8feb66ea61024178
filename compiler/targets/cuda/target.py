"""CUDA target strings as tvmc writes them ("cuda", "cuda -arch=sm_80"), read into the Target of that GPU
architecture, and whether this host can run (measure) code built for it. Compiling needs no GPU: PTX is generated
by LLVM and checked by ptxas anywhere; running and timing it needs the NVIDIA driver (libcuda.so.1)."""

from __future__ import annotations

import re

from compiler.base.errors import InvalidTarget, TilefarmError
from compiler.base.target import Target
from compiler.targets.cuda.codegen import ARCHS, SM_90, GpuArch
from compiler.targets.cuda.codegen.emit import TRIPLE
from compiler.targets.cuda.driver import load_libcuda

KIND = "cuda"
DEFAULT_ARCH = SM_90
OPTIONS = ("arch",)
L2_BYTES = 50 << 20  # an H100's L2, which the weights of a model stay in between runs or not


def choices() -> str:
    """The architectures a target string may name, as "sm_80|sm_90"."""
    return "|".join(a.name for a in ARCHS.values())


def cuda_target(arch: GpuArch = DEFAULT_ARCH) -> Target:
    """The Target of GPUs of architecture `arch`: its name (`mcpu`, "sm_90") and PTX version (`features`) are part
    of the fingerprint its records are filed under."""
    return Target(
        kind=KIND, triple=TRIPLE, mcpu=arch.name, features=arch.features, cores=1, vector_bytes=16, cache_line=128,
        l2_bytes=L2_BYTES, l3_bytes=L2_BYTES, cpu_model=f"NVIDIA GPU {arch.name}",
    )  # fmt: skip


def arch_of(target: Target) -> GpuArch:
    """The GPU architecture a cuda Target is for; InvalidTarget if it is not one tilefarm generates code for."""
    m = re.fullmatch(r"sm_(\d+)", target.mcpu)
    if target.kind != KIND or m is None or int(m.group(1)) not in ARCHS:
        raise InvalidTarget(f"{target} is not a CUDA target tilefarm generates code for (cuda -arch={choices()})")
    return ARCHS[int(m.group(1))]


def is_cuda(text: str) -> bool:
    """Whether a target string names the CUDA kind (its first word)."""
    words = text.split()
    return bool(words) and words[0].lower() == KIND


def parse_target(text: str) -> Target:
    """The Target of a tvmc CUDA target string: `cuda` (sm_90) or `cuda -arch=sm_80|sm_90` (also `-arch sm_80`).
    Raises InvalidTarget naming what is wrong and the choices."""
    words = text.split()
    if not is_cuda(text):
        raise InvalidTarget(f"target {text!r} is not a CUDA target; write cuda or cuda -arch={choices()}")
    options: dict[str, str] = {}
    rest = iter(words[1:])
    for word in rest:
        m = re.fullmatch(r"--?([\w.-]+?)(?:=(.*))?", word)
        if m is None:
            raise InvalidTarget(f"target {text!r}: {word!r} is not an option (-arch={choices()})")
        name, value = m.group(1), m.group(2)
        if name not in OPTIONS:
            raise InvalidTarget(
                f"target {text!r}: option -{name} is not supported; a cuda target takes -arch={choices()}"
            )
        if value is None:  # "-arch sm_80"
            value = next(rest, "")
        if name in options:
            raise InvalidTarget(f"target {text!r}: -{name} is given twice")
        options[name] = value
    arch = options.get("arch", DEFAULT_ARCH.name)
    m = re.fullmatch(r"sm_(\d+)", arch)
    if m is None or int(m.group(1)) not in ARCHS:
        raise InvalidTarget(f"target {text!r}: -arch={arch or '(empty)'} is not supported; choose -arch={choices()}")
    return cuda_target(ARCHS[int(m.group(1))])


def check_runs_here(target: Target, host: Target | None = None) -> None:
    """Raise InvalidTarget unless this process can run CUDA code: the NVIDIA driver library loads. Compiling for
    `target` needs no GPU and is never refused. (`host` is the CPU backend's notion and is not consulted.)"""
    arch_of(target)
    try:
        load_libcuda()
    except TilefarmError:
        raise InvalidTarget(no_driver_message(target)) from None


def no_driver_message(target: Target) -> str:
    """Why CUDA code for `target` cannot be measured or run on a host whose libcuda.so.1 does not load."""
    return (
        f"no CUDA driver on this host: tuning for cuda -arch={target.mcpu} needs a GPU worker (a machine with an "
        "NVIDIA GPU and its driver, libcuda.so.1); compiling for cuda works here"
    )


def runtime_requirements(target: Target) -> dict:
    """What a machine must have to run `target`'s artifact, for its loader: the CUDA driver and an SM version."""
    return {"cuda_arch": arch_of(target).name}
