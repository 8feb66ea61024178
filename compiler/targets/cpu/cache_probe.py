"""Whether this host keeps a model's weights cached from one inference to the next, measured.

`tilefarm tune --weights auto` times a model's kernels with their weights flushed from the caches when a run of the
model would meet them so. The size of the last-level cache decides where the weights exceed it; below that size the
cache is measured too, because a virtual machine reports its host's whole cache: a 2-vCPU Granite Rapids guest sees a
480 MiB L3 "shared by 2 CPUs", yet re-reading 8-144 MiB there ran no faster than reading it from memory, and
ResNet-18's 71.6 MiB of weights, timed warm, left its 256- and 512-channel convs 1.7-2.3x slower in a run than the tuner
had timed them (its estimate 8.74 ms, the run 13.5; timed cold, 13.06 and 12.2-12.5 ms, 9-11% faster side by side).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

CACHED_RATIO = 0.6  # a re-read taking at most this share of a read from memory is served by a cache
ROUNDS = 7
# at most a core's private L2 on every host we know (Zen 2/3: 512 KiB), which CPUID reports as it is in a VM too:
# weights this small stay cached without a measurement, whose reads would last microseconds, too short to time
PRIVATE_CACHE_BYTES = 512 << 10


def reread_ratio(nbytes: int, rounds: int = ROUNDS) -> float | None:
    """The time to read a buffer of `nbytes` right after reading it, over the time to read it after flushing its cache
    lines from every level; None where the flush cannot be built (no C compiler).

    Each is the fastest of `rounds` reads, less the fastest read of one cache line (the call's own cost): another
    process on the core only ever adds time, and on a 2-vCPU machine running the test suite beside the probe the
    median's ratio for a buffer well inside L2 drifted up to 0.62, where the fastest reads gave 0.2-0.3."""
    from compiler.targets.cpu.runner import build_evictor
    from compiler.targets.cpu.sandbox import evictor

    buf = np.ones(max(nbytes, 64) // 8, np.uint64)
    line = np.ones(8, np.uint64)
    with tempfile.TemporaryDirectory(prefix="tilefarm-probe-") as tmp:
        try:
            evict = evictor(build_evictor(Path(tmp)))
        except Exception:  # noqa: BLE001 - no compiler or linker: nothing to measure with
            return None
        warm, cold, call = [], [], []
        for _ in range(rounds):
            _read(buf)
            warm.append(_read(buf))
            evict(buf.ctypes.data, buf.nbytes)
            cold.append(_read(buf))
            call.append(_read(line))
    overhead = min(call)
    return max(min(warm) - overhead, 0.0) / max(min(cold) - overhead, 1e-9)


def keeps_cached(nbytes: int) -> bool:
    """Whether `nbytes` read over and over stay in a cache on this host (`reread_ratio` below CACHED_RATIO; True where
    it cannot be measured, as the cache's size alone said before, and up to PRIVATE_CACHE_BYTES)."""
    if nbytes <= PRIVATE_CACHE_BYTES:
        return True
    ratio = reread_ratio(nbytes)
    return ratio is None or ratio < CACHED_RATIO


def _read(buf: np.ndarray) -> float:
    """Seconds to read `buf` once. The max of 32-bit ints runs at about 100 GB/s from L2 on a Zen 5, where the
    bitwise or of 64-bit ones used before ran at 52 and bounded the re-read by the arithmetic, not the cache (its
    ratio for 256 KiB was 0.52 on an idle Zen 5, 0.62 under the test suite's load: no cache at all by the 0.6 rule)."""
    t = time.perf_counter()
    buf.view(np.int32).max()
    return time.perf_counter() - t
