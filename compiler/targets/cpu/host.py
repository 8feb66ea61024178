"""The CPU this process runs on, as a Target (LLVM's host CPU name and features, core count, sysfs cache sizes), and
what its cores can do: vector registers and the FMAs they must keep in flight."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from compiler.base.errors import InvalidTarget
from compiler.base.target import Target

_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


# Vector FMA latency in cycles and FMAs issued per cycle on 256- and on 512-bit vectors, by LLVM CPU name (the vendors'
# optimization manuals; uops.info's measurements agree). Zen 1 splits a 256-bit FMA into two 128-bit halves, Zen 4
# a 512-bit one into two 256-bit halves; Intel's server cores since Skylake-SP issue two 512-bit FMAs per cycle.
FMA_PIPELINES: dict[str, tuple[int, int, int]] = {
    "haswell": (5, 2, 0),
    "broadwell": (5, 2, 0),
    "znver1": (5, 1, 0),
    "znver2": (5, 2, 0),
    "znver3": (4, 2, 0),
    "znver4": (4, 2, 1),
    "znver5": (4, 2, 2),
}
DEFAULT_FMA_PIPELINE = (4, 2, 2)  # Skylake and later Intel cores, client and server


def vector_registers(target: Target) -> int:
    """Architectural vector registers code may keep values in: 32 with AVX-512 (zmm0-31) and on AArch64, 16 on
    x86-64 otherwise (ymm0-15 / xmm0-15)."""
    if target.has("avx512f") or target.triple.startswith(("aarch64", "arm64")):
        return 32
    return 16

def fmas_in_flight(target: Target) -> int:
    """Independent vector FMAs the core must have in flight to keep its FMA units busy at this target's vector
    width: latency x FMAs issued per cycle (FMA_PIPELINES; the analytical model BLIS sizes its micro-kernels by).
    A register block with fewer accumulators than this waits on its own FMAs."""
    latency, per_cycle_256, per_cycle_512 = FMA_PIPELINES.get(target.mcpu, DEFAULT_FMA_PIPELINE)
    return latency * (per_cycle_512 if target.vector_bytes >= 64 else per_cycle_256)



FEATURES_ENV = "TILEFARM_CPU_FEATURES"


@functools.cache
def host() -> Target:
    """The machine this process runs on (LLVM host CPU name and features, core count, cache sizes)."""
    import llvmlite.binding as llvm  # imported here so `Target` stays usable where llvmlite is absent

    llvm.initialize_native_target()
    host_features = _sorted_features(llvm.get_host_cpu_features().flatten())
    features = _edited_features(host_features, os.environ.get(FEATURES_ENV, ""))
    caches = _cache_sizes()
    return Target(
        kind="cpu",
        triple=llvm.get_process_triple(),
        mcpu=llvm.get_host_cpu_name(),
        features=features,
        cores=os.cpu_count() or 1,
        vector_bytes=_vector_bytes(features),
        cache_line=caches.get("line", 64),
        l1_bytes=caches.get(1),
        l2_bytes=caches.get(2),
        l3_bytes=caches.get(3),
        cpu_model=_cpu_model(),
    )


def _sorted_features(flat: str) -> str:
    # sorted so the fingerprint does not depend on the order LLVM happens to list them in
    return ",".join(sorted(f for f in flat.split(",") if f))


def _edited_features(host: str, edits: str) -> str:
    """The host's features with `edits` (TILEFARM_CPU_FEATURES) applied, to generate code an older CPU of the fleet
    runs too while tuning it here: "-avx512f" turns AVX-512 off (AVX2 code on an AVX-512 host). A "-name" goes last in
    the sorted string, so LLVM applies it after the host's "+" features and turns off what depends on it as well.
    Only turning features off is possible (the code is timed on this host); the edited string is part of the
    fingerprint, so records tuned this way are kept apart from the host's own."""
    out = [f for f in host.split(",") if f]
    for edit in (e.strip() for e in edits.split(",")):
        if not edit:
            continue
        if edit[0] != "-" or len(edit) < 2:
            raise InvalidTarget(f"{FEATURES_ENV}: {edit!r} is not a feature to turn off (-name, as -avx512f)")
        name = edit[1:]
        if f"+{name}" not in out:
            raise InvalidTarget(f"{FEATURES_ENV}: {name!r} is not a feature of this host ({host[:60]}...)")
        out = [f for f in out if f != f"+{name}"] + [edit]
    return _sorted_features(",".join(out))


def _vector_bytes(features: str) -> int:
    enabled = set(features.split(","))
    if "+avx512f" in enabled:
        return 64
    if "+avx" in enabled:
        return 32
    return 16


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return m.group(1).strip() if m else ""


def _cache_sizes() -> dict:
    """Data/unified cache size per level and the line size, from sysfs; missing entries are left out."""
    out: dict = {}
    for d in sorted(_CACHE_DIR.glob("index*")):
        try:
            kind = (d / "type").read_text().strip()
            level = int((d / "level").read_text())
            size = _parse_size((d / "size").read_text().strip())
            line = int((d / "coherency_line_size").read_text())
        except (OSError, ValueError):
            continue
        if kind != "Instruction":
            out[level] = size
            out["line"] = line
    return out


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)
