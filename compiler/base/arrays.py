"""Arrays on the alignment every buffer a kernel gets starts on: the artifact's weights, its workspace, a kernel's
scratch, the measurement sandbox's inputs and outputs. Numpy only: the sandbox and the artifact loader import it."""

from __future__ import annotations

import math

import numpy as np

# bytes: a cache line, and an AVX-512 vector
ALIGN = 64


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array starting on an ALIGN-byte boundary. numpy's own buffers start 16 bytes
    past one, so every 64-byte vector load from them spans two cache lines; the deployed kernel sees aligned weights
    and workspace, and a measurement must see the memory it will."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    buf = np.empty(nbytes + ALIGN, np.uint8)
    start = -buf.ctypes.data % ALIGN
    return buf[start : start + nbytes].view(dtype).reshape(shape)


def aligned(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `a` starting on a 64-byte boundary (aligned_empty)."""
    out = aligned_empty(a.shape, a.dtype)
    out[...] = a
    return out
