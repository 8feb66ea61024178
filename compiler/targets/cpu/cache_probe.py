"""Whether this host keeps a model's weights cached from one inference to the next, measured.

`tilefarm tune --weights auto` times a model's kernels with their weights flushed from the caches when a run of the
model would meet them so. The size of the last-level cache decides where the weights exceed it; below that size the
cache is measured too, because a virtual machine reports its host's whole cache: a 2-vCPU Granite Rapids guest sees a
480 MiB L3 "shared by 2 CPUs", yet re-reading 8-144 MiB there ran no faster than reading it from memory, and
ResNet-18's 71.6 MiB of weights, timed warm, left its 256- and 512-channel convs 1.7-2.3x slower in a run than the tuner
had timed them (its estimate 8.74 ms, the run 13.5; timed cold, 13.06 and 12.2-12.5 ms, 9-11% faster side by side).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

CACHED_RATIO = 0.6  # a re-read taking at most this share of a read from memory is served by a cache
ROUNDS = 5
# at most a core's private L2 on every host we know (Zen 2/3: 512 KiB), which CPUID reports as it is in a VM too:
# weights this small stay cached without a measurement, whose reads would last microseconds, too short to time
PRIVATE_CACHE_BYTES = 512 << 10


def reread_ratio(nbytes: int, rounds: int = ROUNDS) -> float | None:
    """Median over `rounds` of the time to read a buffer of `nbytes` right after reading it, over the time to read it
    after flushing its cache lines from every level; None where the flush cannot be built (no C compiler)."""
    from compiler.targets.cpu.runner import build_evictor
    from compiler.targets.cpu.sandbox import evictor

    buf = np.ones(max(nbytes, 64) // 8, np.uint64)
    with tempfile.TemporaryDirectory(prefix="tilefarm-probe-") as tmp:
        try:
            evict = evictor(build_evictor(Path(tmp)))
        except Exception:  # noqa: BLE001 - no compiler or linker: nothing to measure with
            return None
        ratios = []
        for _ in range(rounds):
            _read(buf)
            warm = _read(buf)
            evict(buf.ctypes.data, buf.nbytes)
            cold = _read(buf)
            ratios.append(warm / cold)
    return statistics.median(ratios)


def keeps_cached(nbytes: int) -> bool:
    """Whether `nbytes` read over and over stay in a cache on this host (`reread_ratio` below CACHED_RATIO; True where
    it cannot be measured, as the cache's size alone said before, and up to PRIVATE_CACHE_BYTES)."""
    if nbytes <= PRIVATE_CACHE_BYTES:
        return True
    ratio = reread_ratio(nbytes)
    return ratio is None or ratio < CACHED_RATIO


def _read(buf: np.ndarray) -> float:
    t = time.perf_counter()
    np.bitwise_or.reduce(buf)
    return time.perf_counter() - t
