"""The dtypes tilefarm computes in, and their numpy / LLVM names."""

from __future__ import annotations

import numpy as np

from compiler.base.errors import UnsupportedDType

# name -> numpy dtype; the order is the promotion order within each kind
DTYPES: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32),
    "int64": np.dtype(np.int64),
    "uint64": np.dtype(np.uint64),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}
INDEX = "int64"  # loop variables and index arithmetic


def check(dtype: str) -> str:
    """Return `dtype` if tilefarm supports it, else raise UnsupportedDType naming the supported ones."""
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            # np.dtype(None) is float64: an unset dtype must not silently pass for one
            name = str(np.dtype(dtype)) if dtype is not None else "None"
        except TypeError:
            name = repr(dtype)
    if name not in DTYPES:
        raise UnsupportedDType(f"dtype {name!r} is not supported; supported dtypes: {', '.join(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype.startswith("float")


def is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def is_signed(dtype: str) -> bool:
    return dtype.startswith("int") or is_float(dtype)


def bits(dtype: str) -> int:
    return 1 if dtype == "bool" else DTYPES[dtype].itemsize * 8


def itemsize(dtype: str) -> int:
    return DTYPES[dtype].itemsize


def numpy(dtype: str) -> np.dtype:
    return DTYPES[check(dtype)]


def promote(a: str, b: str) -> str:
    """Result dtype of a binary arithmetic op, numpy-style but keeping float32 with Python scalars."""
    if a == b:
        return a
    return str(np.promote_types(DTYPES[a], DTYPES[b]))
