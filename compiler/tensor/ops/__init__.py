"""Compute definitions of every supported graph op (TOPI's role): plain functions from tensors to tensors.

Nothing here schedules. Multi-stage ops (padded conv, softmax, layer norm, pooling) return their last stage;
the earlier stages hang off `Tensor.op.inputs`, so the scheduler sees each of them and may inline or tile it.

`OPS` maps each graph op name (ONNX's, plus tilefarm's own `Dense`) to a builder
`(inputs, attrs, name) -> outputs`: `inputs` are the node's input tensors (None for an omitted optional input),
`attrs` its normalized attributes (the contract in compiler/model/graph.py), `name` a prefix every stage it creates
is named from; the outputs come in ONNX output order. `KERNELS` pairs a few kernels at small default shapes with
float64 numpy references, for tests and the CLI.
"""

from __future__ import annotations

from collections.abc import Callable

from compiler.tensor import te
from compiler.tensor.ops.elementwise import ELEMENTWISE_OPS, ONNX_DTYPES, onnx_dtype
from compiler.tensor.ops.indexing import INDEXING_OPS
from compiler.tensor.ops.int8_matmul import INT8_OPS
from compiler.tensor.ops.kernels import KERNELS, KernelCase, reference_conv2d
from compiler.tensor.ops.linalg import LINALG_OPS, batch_matmul, dense, matmul
from compiler.tensor.ops.nn import (
    NN_OPS,
    avg_pool2d,
    bias_add_nchw,
    conv2d_bias_relu,
    conv2d_nchw,
    conv2d_nchw_blocked,
    max_pool2d,
    pad,
    relu,
    row_sum,
)
from compiler.tensor.ops.norm import NORM_OPS, layer_norm, softmax
from compiler.tensor.ops.quantized import QUANTIZED_OPS
from compiler.tensor.ops.reduce import REDUCE_OPS
from compiler.tensor.ops.transform import TRANSFORM_OPS
from compiler.tensor.ops.winograd import WINOGRAD_OPS

Builder = Callable[[list[te.Tensor | None], dict, str], list[te.Tensor]]

OPS: dict[str, Builder] = {
    **ELEMENTWISE_OPS,
    **INDEXING_OPS,
    **INT8_OPS,
    **LINALG_OPS,
    **NN_OPS,
    **NORM_OPS,
    **QUANTIZED_OPS,
    **REDUCE_OPS,
    **TRANSFORM_OPS,
    **WINOGRAD_OPS,
}

__all__ = [
    "KERNELS",
    "ONNX_DTYPES",
    "OPS",
    "Builder",
    "KernelCase",
    "avg_pool2d",
    "batch_matmul",
    "bias_add_nchw",
    "conv2d_bias_relu",
    "conv2d_nchw",
    "conv2d_nchw_blocked",
    "dense",
    "layer_norm",
    "matmul",
    "max_pool2d",
    "onnx_dtype",
    "pad",
    "reference_conv2d",
    "relu",
    "row_sum",
    "softmax",
]
