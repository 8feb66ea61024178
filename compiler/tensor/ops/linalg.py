"""Linear algebra: matmul, batch_matmul, dense, and the ONNX MatMul / Gemm builders."""

from __future__ import annotations

from collections.abc import Sequence

from compiler.base.errors import InvalidExpr
from compiler.tensor import te
from compiler.tensor.ops.checks import NUMERIC, _bcast, _broadcast_shape, _dims, _dtype_in, _input, _rank, _same_dtype

Ins = Sequence[te.Tensor | None]

def matmul(A: te.Tensor, B: te.Tensor, name: str = "matmul") -> te.Tensor:
    """C[i, j] = sum_k A[i, k] * B[k, j] for A: MxK, B: KxN."""
    _rank("matmul", A, 2, "A")
    _rank("matmul", B, 2, "B")
    _same_dtype("matmul", A, B)
    (M, K), (K2, N) = A.shape, B.shape
    if K != K2:
        raise InvalidExpr(f"matmul: A is {_dims(A)} and B is {_dims(B)}; A's columns ({K}) must equal B's rows ({K2})")
    k = te.reduce_axis(K, "k")
    return te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name=name, tag="matmul")


def batch_matmul(A: te.Tensor, B: te.Tensor, name: str = "batch_matmul") -> te.Tensor:
    """C[b, i, j] = sum_k A[b, i, k] * B[b, k, j] for A: bxMxK, B: bxKxN."""
    _rank("batch_matmul", A, 3, "A")
    _rank("batch_matmul", B, 3, "B")
    _same_dtype("batch_matmul", A, B)
    (batch, M, K), (batch2, K2, N) = A.shape, B.shape
    if batch != batch2 or K != K2:
        raise InvalidExpr(
            f"batch_matmul: A is {_dims(A)} and B is {_dims(B)}; batches must match ({batch} vs"
            f" {batch2}) and A's columns ({K}) must equal B's rows ({K2})"
        )
    k = te.reduce_axis(K, "k")
    return te.compute(
        (batch, M, N), lambda b, i, j: te.sum(A[b, i, k] * B[b, k, j], axis=k), name=name, tag="batch_matmul"
    )


def dense(X: te.Tensor, W: te.Tensor, bias: te.Tensor | None = None, name: str = "dense") -> te.Tensor:
    """Y[i, j] = sum_k X[i, k] * W[j, k] (+ bias[j]) for X: MxK, W: NxK, as ONNX Gemm with transB does."""
    _rank("dense", X, 2, "X")
    _rank("dense", W, 2, "W")
    _same_dtype("dense", X, W, *([bias] if bias is not None else []))
    (M, K), (N, K2) = X.shape, W.shape
    if K != K2:
        raise InvalidExpr(f"dense: X is {_dims(X)} and W is {_dims(W)}; both must have {K} columns (W is NxK)")
    k = te.reduce_axis(K, "k")
    out = te.compute((M, N), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name=name, tag="dense")
    if bias is None:
        return out
    if bias.shape != (N,):
        raise InvalidExpr(f"dense: bias {bias.name} must have shape ({N},), got {_dims(bias)}")
    return te.compute((M, N), lambda i, j: out[i, j] + bias[j], name=f"{name}_bias", tag="broadcast")


# ---------------------------------------------------------------------------------------------- ONNX builders


def _bcast_index(shape: tuple[int, ...], idx: tuple) -> tuple:
    """The index of a broadcast operand with batch dims `shape` for the output's batch index `idx`."""
    idx = idx[len(idx) - len(shape) :] if shape else ()
    return tuple(0 if n == 1 else i for i, n in zip(idx, shape))


def matmul_op(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """ONNX MatMul: numpy's matmul, with 1-D operands promoted and batch dims broadcast."""
    a, b = _input("MatMul", ins, 0, "A"), _input("MatMul", ins, 1, "B")
    _dtype_in("MatMul", a, NUMERIC)
    if a.ndim == 2 and b.ndim == 2:
        return [matmul(a, b, name=name)]
    if a.ndim == 3 and b.ndim == 3 and a.shape[0] == b.shape[0]:
        return [batch_matmul(a, b, name=name)]
    _same_dtype("MatMul", a, b)
    a_shape = (1,) + a.shape if a.ndim == 1 else a.shape
    b_shape = b.shape + (1,) if b.ndim == 1 else b.shape
    (M, K), (K2, N) = a_shape[-2:], b_shape[-2:]
    if K != K2:
        raise InvalidExpr(f"MatMul: {a.name} is {_dims(a)} and {b.name} is {_dims(b)}; inner dims {K} != {K2}")
    a_batch, b_batch = a_shape[:-2], b_shape[:-2]
    batch = _broadcast_shape("MatMul", a_batch, b_batch)
    shape = batch + ((M,) if a.ndim > 1 else ()) + ((N,) if b.ndim > 1 else ())
    k = te.reduce_axis(K, "k")

    def body(*i):
        bi, rest = i[: len(batch)], i[len(batch) :]
        ai = _bcast_index(a_batch, bi) + ((rest[0], k) if a.ndim > 1 else (k,))
        bj = _bcast_index(b_batch, bi) + ((k, rest[-1]) if b.ndim > 1 else (k,))
        return te.sum(a[ai] * b[bj], axis=k)

    return [te.compute(shape, body, name=name, tag="batch_matmul" if batch else "matmul")]


def packed_matmul(A: te.Tensor, W: te.Tensor, name: str = "matmul") -> te.Tensor:
    """C[..., i, j] = sum_k A[..., i, k] * B[k, j] with the constant B laid out in panels N/P x K x P (P = W's last
    dim), as `pack_matmul_weights` packs it at compile time: a tile of up to P columns reads its weight as one
    contiguous stream of K x P floats, where B's own rows lie N floats apart (BERT's 768 x 3072 FFN weight: 12 KiB,
    so a tile's reads of a weight that comes from memory each run span K pages). onnxruntime's MLAS packs B alike."""
    op = "packed_matmul"
    if A.ndim < 2:
        raise InvalidExpr(f"{op}: A {_dims(A)} must have at least 2 dims")
    _rank(op, W, 3, "W (panels N/P x K x P)")
    _same_dtype(op, A, W)
    (panels, K, P), K2 = W.shape, A.shape[-1]
    if K != K2:
        raise InvalidExpr(f"{op}: A is {_dims(A)} and W is {_dims(W)}; A's columns ({K2}) must equal W's rows ({K})")
    k = te.reduce_axis(K, "k")

    def body(*i):
        j = i[-1]
        return te.sum(A[(*i[:-1], k)] * W[j // P, k, j % P], axis=k)

    return te.compute((*A.shape[:-1], panels * P), body, name=name, tag="matmul")


def packed_matmul_op(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """tilefarm's PackedMatMul (made by `pack_matmul_weights` from a MatMul with a constant 2-D B)."""
    a, w = _input("PackedMatMul", ins, 0, "A"), _input("PackedMatMul", ins, 1, "W")
    _dtype_in("PackedMatMul", a, NUMERIC)
    return [packed_matmul(a, w, name=name)]


def gemm(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """ONNX Gemm: alpha * A' B' + beta * C, A' and B' optionally transposed, C broadcast to M x N."""
    a, b, c = _input("Gemm", ins, 0, "A"), _input("Gemm", ins, 1, "B"), ins[2] if len(ins) > 2 else None
    _dtype_in("Gemm", a, NUMERIC)
    _same_dtype("Gemm", a, b, *([c] if c is not None else []))
    _rank("Gemm", a, 2, "A")
    _rank("Gemm", b, 2, "B")
    ta, tb = attrs.get("transA", 0), attrs.get("transB", 0)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    (M, K), (K2, N) = a.shape[:: -1 if ta else 1], b.shape[:: -1 if tb else 1]
    if K != K2:
        raise InvalidExpr(f"Gemm: A' is {M}x{K} and B' is {K2}x{N} (transA={ta}, transB={tb}); {K} != {K2}")
    k = te.reduce_axis(K, "k")
    epilogue = alpha != 1.0 or (c is not None and beta != 0.0)
    prod = te.compute(
        (M, N),
        lambda i, j: te.sum(a[(k, i) if ta else (i, k)] * b[(j, k) if tb else (k, j)], axis=k),
        name=f"{name}_matmul" if epilogue else name,
        tag="dense" if tb and not ta else "matmul",
    )
    if not epilogue:
        return [prod]
    if c is not None:
        _broadcast_shape("Gemm", (M, N), c.shape)

    def body(i, j):
        v = prod[i, j] if alpha == 1.0 else prod[i, j] * te.const(alpha, prod.dtype)
        if c is None or beta == 0.0:
            return v
        cv = _bcast(c, (i, j))
        return v + (cv if beta == 1.0 else cv * te.const(beta, prod.dtype))

    return [te.compute((M, N), body, name=name, tag="broadcast")]


def dense_op(ins: Ins, attrs: dict, name: str) -> list[te.Tensor]:
    """tilefarm's Dense (made by passes from MatMul + Add): X (M x K), W (N x K), optional bias (N)."""
    x, w = _input("Dense", ins, 0, "X"), _input("Dense", ins, 1, "W")
    bias = ins[2] if len(ins) > 2 else None
    return [dense(x, w, bias, name=name if bias is None else f"{name}_matmul")]


LINALG_OPS = {"MatMul": matmul_op, "Gemm": gemm, "Dense": dense_op, "PackedMatMul": packed_matmul_op}
